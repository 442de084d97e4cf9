"""A timed run's speculative decoding, from its configuration (``--spec-method``, ``--spec-tokens``,
``--spec-acceptance``, ``--spec-model``, ``--spec-hash-rule``): the workers' :class:`~dynlab.engine.spec.SpecDecoding`
and the keys a speculative run's result describes it by."""
from __future__ import annotations

from dynlab.engine.config import SimConfig
from dynlab.engine.spec import drops_last_block, hash_lookahead_tokens
from dynlab.latency.base import LatencyModel


def spec_decoding(c: SimConfig):
    """A worker's :class:`~dynlab.engine.spec.SpecDecoding` for ``c`` (``None``: ``spec_tokens`` 0).
    Raises ``ValueError`` for a bad ``spec_acceptance``."""
    if not c.spec_tokens or c.spec_method is None:
        return None
    from dynlab.engine.spec import DEFAULT_ALPHA, Acceptance, SpecDecoding, parse_acceptance

    text = c.spec_acceptance if c.spec_acceptance is not None else str(DEFAULT_ALPHA[c.spec_method])
    rates = parse_acceptance(text, c.spec_tokens)
    spec = SpecDecoding(c.spec_method, c.spec_tokens, Acceptance(rates, c.spec_draws, c.seed))
    spec.hash_lookahead = hash_lookahead_tokens(c)  # (none in a P/D fleet: vLLM's KV connectors keep plain hashes)
    spec.drop_last = drops_last_block(c)
    if spec.drop_last and (c.cpu_capacity or c.cpu_memory_gb):
        raise ValueError("--spec-hash-rule drop is not modelled with a CPU tier (--cpu-capacity, --cpu-memory-gb)")
    if c.spec_model is not None and c.spec_method == "draft" and "spec_gamma" not in c.latency_opts:
        from dynlab.latency.grid import build_latency_model, hardware_for

        # the draft model on the target's GPUs, priced by the roofline (the model that reads a config);
        # with linear's spec_gamma that term prices the drafter instead (the draft model sizes the pool only)
        spec.draft_latency = build_latency_model("roofline", hardware_for(c.spec_model, c.gpu, c.tp))
    return spec


#: the latency models whose verify steps and drafter the spec helper checked (docs/engine.md)
SPEC_PRICED = ("roofline", "linear")


def spec_describe(c: SimConfig, latency: LatencyModel) -> dict:
    """A speculative run's keys: method, K, lookahead slots, per-position rates; and, for a latency
    model that cannot price drafts itself, a ``latency_domain`` line saying so."""
    from dynlab.engine.spec import lookahead_tokens

    spec = spec_decoding(c)
    out: dict = {"spec_method": c.spec_method, "spec_tokens": c.spec_tokens,
                 "spec_lookahead_tokens": lookahead_tokens(c.spec_method, c.spec_tokens),
                 "spec_rates": [round(r, 4) for r in spec.acceptance.rates], "spec_draws": c.spec_draws}
    if spec.drop_last:
        out["spec_hash_rule"] = c.spec_hash_rule
    if c.spec_model is not None:
        out["spec_model"] = c.spec_model
    why = None
    if c.latency_model not in SPEC_PRICED:
        why = (f"speculative decoding: {c.latency_model} has no verify-step or drafter data; its steps are "
               "priced as decodes plus each request's drafts as a chunk, the drafter by dynlab's rule")
    elif c.spec_model is not None and c.latency_model != "roofline" and "spec_gamma" not in c.latency_opts:
        why = (f"speculative decoding: {c.latency_model} cannot read a draft model's config; the draft's steps "
               f"(--spec-model {c.spec_model}) are priced by the roofline, the target's by {c.latency_model}")
    if why is not None:
        prior = latency.describe_hardware().get("latency_domain")
        out["latency_domain"] = f"{prior}; {why}" if prior else why
    return out
