"""Speculative decoding: the method, ``K`` draft tokens per step, and the acceptance model.

Modelled on vLLM 0.33's ``SpeculativeConfig`` (``vllm/config/speculative.py``) and the v1
scheduler (``vllm/v1/core/sched/scheduler.py``): a decoding request carries ``K`` draft tokens
(``spec_token_ids``) proposed after its previous step, so a step schedules ``1 + K`` of its tokens
(the last sampled one and the drafts) against ``max_num_batched_tokens``; the KV cache manager
allocates slots for ``num_lookahead_tokens`` more (``K`` for methods whose drafter runs its own
forward over the target's positions: ``eagle``, ``eagle3``, ``mtp``, ``draft``; ``0`` for
``ngram``, vLLM's ``VllmConfig.num_lookahead_tokens``); ``update_from_output`` keeps the ``a``
accepted drafts plus the bonus token (``1 + a`` tokens emitted) and rolls ``num_computed_tokens``
back by the ``s - a`` rejected ones, whose slots the next step overwrites.

The acceptance model (:class:`Acceptance`) gives ``a`` for a step that verified ``s`` drafts:

- per-position rates ``r_1 >= r_2 >= ... >= r_K`` (``--spec-acceptance 0.8,0.6,0.4``), the
  shape vLLM reports (``spec_decode`` metrics: accepted at position ``i`` / drafts): position
  ``i`` is accepted with probability ``r_i`` (a draft's tokens are accepted as a prefix, so
  ``P(a >= i) = r_i``);
- a constant rate ``alpha`` (one number): each draft token accepted with probability ``alpha``
  given the previous one was, ``r_i = alpha ** i``;
- measured acceptance lengths (``file:PATH``; whitespace-separated integers ``1 + a``, what vLLM's
  ``mean_acceptance_length`` averages): ``r_i`` = the fraction of lengths ``> i``.

Draws: ``seeded`` (one uniform ``u`` per verify step from a per-request generator seeded by the
run's seed and the request id, ``a = #{i <= s: u < r_i}``: runs are deterministic and independent
of routing) or ``expected`` (no randomness: a request accumulates ``E[a] = sum r_i`` and emits
the integer part's increments, so a sweep over rates is smooth).
"""
from __future__ import annotations

import dataclasses
import random
from typing import Optional, Sequence, Tuple

__all__ = ["SPEC_METHODS", "SPEC_DRAWS", "SPEC_HASH_RULES", "lookahead_tokens", "hash_lookahead_tokens", "drops_last_block",
           "parse_acceptance", "Acceptance", "SpecDecoding"]

#: the methods of ``--spec-method`` (vLLM's ``SpeculativeConfig.method``; ``draft`` is ``draft_model``)
SPEC_METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft")
#: the methods whose block names cover the token after the block (:func:`hash_lookahead_tokens`)
HASH_LOOKAHEAD_METHODS = ("eagle", "eagle3", "mtp")
#: how accepted lengths are drawn: ``seeded`` (random, per request) or ``expected`` (expected value)
SPEC_DRAWS = ("seeded", "expected")
#: how an EAGLE-family drafter keeps prefix caching exact (``--spec-hash-rule``, vLLM 0.33's
#: ``SpeculativeConfig.disable_lookahead_block_hashes``): ``lookahead`` (a block's name covers the token after
#: it, :func:`hash_lookahead_tokens`) or ``drop`` (plain names; a prefix hit drops its last block,
#: :func:`drops_last_block`)
SPEC_HASH_RULES = ("lookahead", "drop")

#: per-position acceptance when ``--spec-acceptance`` is not given, per method: EAGLE-3's published
#: acceptance on MT-Bench (Li et al. 2025, "EAGLE-3", Table 1: mean acceptance length ~6 at K = 7
#: for LLaMA-3.1-8B) is higher than what a served conversation trace sees; dynlab's default is a
#: conservative per-token rate ``alpha`` (project choice, documented in docs/engine.md).
DEFAULT_ALPHA = {"ngram": 0.5, "eagle": 0.7, "eagle3": 0.8, "mtp": 0.8, "draft": 0.7}


def lookahead_tokens(method: str, k: int) -> int:
    """KV slots reserved past a step's scheduled tokens (vLLM's ``num_lookahead_tokens``): ``k`` for a
    drafter with its own forward (``eagle``, ``eagle3``, ``mtp``, ``draft``), ``0`` for ``ngram``."""
    return 0 if method == "ngram" else k


def hash_lookahead_tokens(config) -> int:
    """Tokens after each block that its name covers in a timed run of ``config`` (a ``SimConfig``):
    1 for ``eagle``, ``eagle3``, ``mtp`` with ``--spec-tokens K`` > 0, else 0. vLLM 0.33's
    ``VllmConfig.num_hash_lookahead_tokens``: an EAGLE-style drafter's KV at a block's last position
    depends on the next token, so with prefix caching on a block's hash covers it (its
    ``num_prefill_lookahead_tokens``, 1 for a one-module head: dynlab's MTP is one module), and a
    block is cached only once that token exists; ``ngram`` and ``draft`` keep the plain hashes, and so
    does a P/D fleet (vLLM: an engine with a KV connector keeps them)."""
    if not getattr(config, "timing", False) or not getattr(config, "spec_tokens", 0) or config.pd() is not None:
        return 0
    if getattr(config, "spec_hash_rule", "lookahead") != "lookahead":
        return 0
    return 1 if config.spec_method in HASH_LOOKAHEAD_METHODS else 0


def drops_last_block(config) -> bool:
    """Whether a timed run of ``config`` drops a prefix hit's last block: ``--spec-hash-rule drop`` with
    ``eagle``, ``eagle3`` or ``mtp`` and ``--spec-tokens K`` > 0 (vLLM 0.33's ``use_eagle_block_drop`` with
    ``disable_lookahead_block_hashes``: the drafter's KV at a block's last position depends on the next
    token, so a hit recomputes its last block; ``KvCacheManager.find_cached_prefix`` applies it)."""
    return (bool(getattr(config, "timing", False)) and bool(getattr(config, "spec_tokens", 0))
            and getattr(config, "spec_hash_rule", "lookahead") == "drop" and config.spec_method in HASH_LOOKAHEAD_METHODS)


def parse_acceptance(text: str, k: int) -> Tuple[float, ...]:
    """Per-position rates ``(r_1, ..., r_k)`` from ``--spec-acceptance`` text: ``"0.8,0.6,0.4"``
    (given rates; fewer than ``k`` positions repeat the last one's conditional ratio),
    ``"0.7"`` (constant rate ``alpha``: ``alpha ** i``) or ``"file:PATH"`` (acceptance lengths).

    Raises ``ValueError`` (one line; ``PATH:LINE`` for a file) for a rate outside [0, 1], rates that
    increase, more rates than ``k`` positions, or a length outside 1..k+1 in a file.
    """
    text = text.strip()
    if text.startswith("file:"):
        return _from_lengths(text[5:], k)
    try:
        rates = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--spec-acceptance: {text!r} is not a rate list like 0.8,0.6,0.4, a rate or file:PATH") from None
    if any(not 0.0 <= r <= 1.0 for r in rates):
        raise ValueError(f"--spec-acceptance: rates must lie in [0, 1], got {text}")
    if any(b > a for a, b in zip(rates, rates[1:])):
        raise ValueError(f"--spec-acceptance: per-position rates cannot increase (a draft is accepted as a prefix), got {text}")
    if len(rates) > k:
        raise ValueError(f"--spec-acceptance: {len(rates)} per-position rates for --spec-tokens {k}; "
                         f"give at most {k} (one rate per draft position)")
    if len(rates) == 1:
        return tuple(rates[0] ** i for i in range(1, k + 1))
    while len(rates) < k:
        ratio = rates[-1] / rates[-2] if rates[-2] > 0 else 0.0
        rates.append(rates[-1] * ratio)
    return tuple(rates)


def _from_lengths(path: str, k: int) -> Tuple[float, ...]:
    """Rates from a file of acceptance lengths ``1 + a`` (integers, whitespace-separated)."""
    lengths = []
    try:
        with open(path) as f:
            for line_no, line in enumerate(f, 1):
                for tok in line.split():
                    try:
                        n = int(tok)
                    except ValueError:
                        raise ValueError(f"{path}:{line_no}: {tok!r} is not an acceptance length (an integer)") from None
                    if not 1 <= n <= k + 1:
                        raise ValueError(f"{path}:{line_no}: acceptance length {n} outside 1..{k + 1} (K = {k})")
                    lengths.append(n)
    except OSError as e:
        raise ValueError(f"--spec-acceptance: cannot read {path}: {e.strerror}") from None
    if not lengths:
        raise ValueError(f"{path}:1: no acceptance lengths")
    total = len(lengths)
    return tuple(sum(1 for n in lengths if n > i) / total for i in range(1, k + 1))


class Acceptance:
    """Accepted drafts per verify step. ``rates``: per-position ``(r_1..r_K)``, non-increasing;
    ``draws``: ``seeded`` or ``expected``; ``seed``: the run's seed (seeded draws)."""

    def __init__(self, rates: Sequence[float], draws: str = "seeded", seed: int = 0):
        if draws not in SPEC_DRAWS:
            raise ValueError(f"unknown spec draws {draws!r} (choose from {', '.join(SPEC_DRAWS)})")
        self.rates = tuple(rates)
        self.draws = draws
        self.seed = seed
        self._cum = [0.0]
        for r in self.rates:
            self._cum.append(self._cum[-1] + r)

    def accepted(self, req, s: int) -> int:
        """Drafts accepted (``0..s``) of the ``s`` (``<= K``) verified for ``req`` in this step; draws
        keep their state on ``req.spec_state``."""
        if s <= 0:
            return 0
        if self.draws == "expected":
            acc = (req.spec_state or 0.0)
            new = acc + self._cum[s]
            req.spec_state = new
            return min(s, int(new + 1e-9) - int(acc + 1e-9))
        rng = req.spec_state
        if rng is None:
            rng = req.spec_state = random.Random(f"dynlab-spec-{self.seed}-{req.id}")
        u = rng.random()
        rates = self.rates
        a = 0
        while a < s and u < rates[a]:
            a += 1
        return a


class SpecDecoding:
    """A worker's speculative decoding: ``method``, ``k`` (drafts per step, >= 1), ``acceptance``,
    and the counters vLLM's ``SpecDecodingStats`` keeps: ``num_drafts`` (verify steps),
    ``draft_tokens``, ``accepted_tokens``, ``accepted_per_pos`` (accepted at position ``i``).
    ``lookahead``: KV slots reserved past the scheduled tokens (:func:`lookahead_tokens`);
    ``hash_lookahead``: tokens after a block that its name covers, 0 here; a timed run's
    :func:`dynlab.engine.serving.spec_decoding` sets it by the one rule, :func:`hash_lookahead_tokens`."""

    def __init__(self, method: str, k: int, acceptance: Acceptance):
        if method not in SPEC_METHODS:
            raise ValueError(f"unknown spec method {method!r} (choose from {', '.join(SPEC_METHODS)})")
        if k < 1:
            raise ValueError(f"spec tokens must be >= 1, got {k}")
        self.method = method
        self.k = k
        self.lookahead = lookahead_tokens(method, k)
        self.hash_lookahead = 0  # tokens after a block its name covers: a run's rule, hash_lookahead_tokens(config)
        self.drop_last = False  # a prefix hit drops its last block: a run's rule, drops_last_block(config)
        self.acceptance = acceptance
        self.num_drafts = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_per_pos = [0] * k
        self.draft_latency = None  # the draft model's LatencyModel (--spec-model), priced in drafter_ms

    def verify(self, req, s: int) -> int:
        """Verify ``s`` drafts of ``req``: the accepted count (counted in the stats)."""
        a = self.acceptance.accepted(req, s)
        self.num_drafts += 1
        self.draft_tokens += s
        self.accepted_tokens += a
        for i in range(a):
            self.accepted_per_pos[i] += 1
        return a


def spec_metrics(specs: Sequence[Optional[SpecDecoding]]) -> dict:
    """The fleet's ``spec_*`` metrics summed over workers' :class:`SpecDecoding` (``None`` entries
    skipped): ``spec_draft_tokens``, ``spec_accepted_tokens``, ``mean_acceptance_length``
    (``1 + accepted / drafts``, vLLM's, 4 decimals; ``None`` with no draft) and
    ``spec_acceptance_per_position`` (accepted at position ``i`` / drafts, 4 decimals)."""
    specs = [s for s in specs if s is not None]
    drafts = sum(s.num_drafts for s in specs)
    k = max((s.k for s in specs), default=0)
    per_pos = [sum(s.accepted_per_pos[i] for s in specs if i < s.k) for i in range(k)]
    accepted = sum(s.accepted_tokens for s in specs)
    return {
        "spec_draft_tokens": sum(s.draft_tokens for s in specs),
        "spec_accepted_tokens": accepted,
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
        "spec_acceptance_per_position": [round(n / drafts, 4) for n in per_pos] if drafts else [],
    }


def verify_batch(sched: list):
    """``(StepBatch, decodes, summed decode context, drafts verified)`` of a speculative step's
    ``(request, tokens)`` pairs. A request verifying drafts (past its prompt, its ``n`` tokens
    reaching ``num_tokens``) is a decode of its context ``num_tokens`` plus, for its ``s = n - 1``
    drafts, a chunk of ``s`` tokens over that context: the verify forward over ``1 + s`` tokens as
    every latency model can price it (weights read once per step, the drafts' FLOPs and attention
    added). Other requests are prefill chunks as without speculation."""
    from dynlab.latency.base import StepBatch

    chunks, ctxs = [], []
    decodes = context = drafts = 0
    for req, n in sched:
        if req.computed >= req.input_length and req.computed + n >= req.num_tokens:
            decodes += 1
            context += req.num_tokens
            if n > 1:
                chunks.append(n - 1)
                ctxs.append(req.num_tokens)
                drafts += n - 1
        else:
            chunks.append(n)
            ctxs.append(req.computed)
    return StepBatch(tuple(chunks), tuple(ctxs), decodes, context), decodes, context, drafts


def drafter_ms(latency, method: str, k: int, decodes: int, context: int, draft=None) -> float:
    """The drafter's time (ms) in a step with ``decodes`` decoding requests (summed context
    ``context`` tokens), per method: ``ngram`` 0 (a CPU lookup, overlapped); a latency model's own
    :meth:`~dynlab.latency.base.LatencyModel.drafter_ms` when it has one (``linear`` with
    ``spec_gamma``); else ``eagle``/``eagle3``/
    ``mtp`` ``k`` forwards of one decoder layer (an EAGLE head or DeepSeek's MTP module: Li et al.
    2024, DeepSeek-V3 report Sec. 2.2), priced as ``k`` decode steps of the target divided by its
    layers; ``draft`` ``k`` decode steps of ``draft`` (the ``--spec-model``'s own latency model, the
    roofline over its config, at the same batch and context) or, without one, ``k`` decode steps of
    the target divided by 10 (a draft model ~1/10 of the target, project default)."""
    if method == "ngram" or decodes == 0:
        return 0.0
    own = latency.drafter_ms(method, k, decodes, context) if hasattr(latency, "drafter_ms") else None
    if own is not None:
        return own  # the model's own drafter term (linear's spec_gamma)
    from dynlab.latency.base import StepBatch

    if method == "draft" and draft is not None:
        return k * draft.step_ms(StepBatch((), (), decodes, context))
    one = latency.step_ms(StepBatch((), (), decodes, context))
    if method == "draft":
        return k * one / 10.0
    model = getattr(getattr(latency, "hardware", None), "model", None)
    layers = (getattr(model, "num_layers", 0) or getattr(model, "layers", 0)) if model is not None else 0
    return k * one / (layers or 32)


def spec_baseline(config, defaults: dict):
    """``config`` as the K = 0 baseline of a comparison over ``spec_tokens``: ``defaults`` (the spec options'
    defaults) and no ``spec_gamma`` latency option (linear's drafter price: nothing to price at K = 0)."""
    opts = {k: v for k, v in config.latency_opts.items() if k != "spec_gamma"}
    return dataclasses.replace(config, **defaults, latency_opts=opts)


def align_rates(configs: list) -> list:
    """``compare --spec-tokens 2,4 --spec-acceptance 0.8,0.6,0.5,0.4``: per-position rates are the drafter's,
    K how many of them a run uses, so a run with fewer positions than rates takes the first K (the rates
    may not outnumber the largest K compared: a single run refuses more rates than its K).

    ``file:PATH`` (acceptance lengths ``1 + a``, measured with some K): the same, read at the largest K
    compared: a run of a smaller K takes the first K of those rates, which is the file with each length
    capped at ``K + 1`` (a measured length past it means every one of the K drafts was accepted).

    Raises ``ValueError`` (``PATH:LINE``, the limit of the largest K) for a file that does not fit the
    largest K: each run of a smaller K would refuse it with its own, smaller limit."""
    ks = {c.spec_tokens for c in configs}
    texts = {c.spec_acceptance for c in configs}
    if len(ks) < 2 or len(texts) != 1 or None in texts:
        return configs
    text = next(iter(texts)).strip()
    if text.startswith("file:"):
        rates = [repr(r) for r in parse_acceptance(text, max(ks))]
    else:
        rates = text.split(",")
    if len(rates) > max(ks):
        return configs  # each run with fewer positions than rates refuses them (parse_acceptance)
    return [dataclasses.replace(c, spec_acceptance=",".join(rates[:c.spec_tokens]))
            if 0 < c.spec_tokens < len(rates) else c for c in configs]


def no_effect_rules(config, fields: Sequence[str], without_timing: str):
    """The rows ``(field, why)`` of :func:`dynlab.engine.option_rules._no_effect_rules` for speculative decoding:
    ``fields`` (the spec options other than ``spec_tokens``) need ``--timing`` and ``--spec-tokens K``,
    ``spec_tokens`` a method, ``spec_model`` the ``draft`` method and no P/D split, ``spec_hash_rule drop`` an
    EAGLE-family method and no P/D split, linear's ``spec_gamma`` a drafter (with
    ``--spec-model`` too: spec_gamma prices the drafter's steps, the draft model still sizes the pool)."""
    if not config.timing:
        for name in tuple(fields) + ("spec_tokens",):
            yield name, without_timing
    if config.spec_tokens == 0:
        for name in fields:
            yield name, "with --spec-tokens 0 (no draft token: speculation is off)"
    if config.spec_method is None:
        yield "spec_tokens", "without --spec-method (ngram, eagle, eagle3, mtp or draft)"
    if config.spec_model is not None and _disaggregated(config):
        yield "spec_model", ("with a P/D split: a draft model in a disaggregated fleet is not modelled (its prefill "
                             "workers would not load it, its decode workers would need the draft's KV of the prompt)")
    if config.spec_model is not None and config.spec_method != "draft":
        yield "spec_model", "without --spec-method draft (the other drafters are the target's own layers or a lookup)"
    if config.spec_hash_rule != "lookahead" and config.spec_method not in HASH_LOOKAHEAD_METHODS:
        yield "spec_hash_rule", "without --spec-method eagle, eagle3 or mtp (ngram and draft name blocks plainly, drop none)"
    if config.spec_hash_rule != "lookahead" and _disaggregated(config):
        yield "spec_hash_rule", "with a P/D split (its decode pool keeps plain names: the block drop there is not modelled)"
    if "spec_gamma" in config.latency_opts and (config.spec_tokens == 0 or config.spec_method in (None, "ngram")):
        yield "latency_opts", ("as spec_gamma without a drafter to price (--spec-method eagle|eagle3|mtp|draft, "
                               "--spec-tokens K)")


def _disaggregated(config) -> bool:
    """Whether ``config`` serves on a P/D fleet (``False`` for a bad split, which validation reports)."""
    try:
        return config.pd() is not None
    except ValueError:
        return False
