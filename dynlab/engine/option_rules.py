"""The option rules of :class:`~dynlab.engine.config.SimConfig`: which options would have no effect in a
configuration (and are refused: :func:`check_effective`), sim's output options (:func:`check_outputs`), and the
alignment of compared P/D splits and speculation baselines (:func:`align_split`).

It reads a configuration by its fields and never imports :mod:`dynlab.engine.config`, which imports it.
"""
from __future__ import annotations

from dataclasses import fields, replace
from functools import lru_cache
from typing import AbstractSet, Optional

from dynlab.engine.arrival_options import workload_rules
from dynlab.engine.class_metrics import parse_class_slos
from dynlab.engine.gateway import parse_policy
from dynlab.engine.option_spec import with_rule
from dynlab.engine.options import BY_NAME, FIELD_ORDER, OPTIONS
from dynlab.engine.spec import no_effect_rules as _spec_rules


@lru_cache(maxsize=None)
def defaults_of(cls) -> dict:
    """Every field's default of the dataclass ``cls`` (a :class:`~dynlab.engine.config.SimConfig`; default
    factories as empty mappings): what "not given" means in the option rules."""
    out = {f.name: f.default for f in fields(cls)}
    out["opts"] = out["latency_opts"] = {}  # default factories: empty mappings
    return out


#: options of the timed engine: set without ``timing`` they would silently do nothing, so they are refused (the
#: declarations' rule ``timed``, :data:`dynlab.engine.options.OPTIONS`, in the configuration's field order)
TIME_MODEL_FIELDS = with_rule(OPTIONS, "timed", FIELD_ORDER)
#: the worker's parallelism and KV dtype (models helper, issue 25): timed-engine settings too (rule ``parallel``)
PARALLEL_FIELDS = with_rule(OPTIONS, "parallel", FIELD_ORDER)
#: SGLang's options (``--engine sglang``, :mod:`dynlab.engine.sglang`): refused with any other engine kind (``sglang``)
SGLANG_FIELDS = with_rule(OPTIONS, "sglang", FIELD_ORDER)
#: vLLM's options (and what dynlab's SGLang worker does not model), each refused with ``--engine sglang``
VLLM_ONLY = (
    ("max_num_seqs", "vLLM's running cap; SGLang's is --max-running-requests"),
    ("max_num_batched_tokens", "vLLM's step budget; SGLang's are --chunked-prefill-size and --max-prefill-tokens"),
    ("gpu_memory_utilization", "vLLM's share of GPU memory; SGLang's is --mem-fraction-static"),
    ("admission", "vLLM's admission rule; SGLang admits by its new-token ratio (PrefillAdder)"),
    ("queue_policy", "vLLM's waiting order; SGLang's is --schedule-policy"),
    ("async_scheduling", "vLLM's AsyncScheduler; SGLang's overlap scheduler is not modelled"),
    ("cpu_capacity", "dynlab does not model SGLang's CPU tier (HiCache)"),
    ("cpu_memory_gb", "dynlab does not model SGLang's CPU tier (HiCache)"),
    ("spec_tokens", "dynlab does not model SGLang's speculative decoding"),
    ("spec_method", "dynlab does not model SGLang's speculative decoding"),
    ("max_loras", "dynlab models LoRA adapters on vLLM workers only"),
    ("controller", "workers join and leave a fleet of vLLM workers only, for now"),
)
#: options of a disaggregated fleet only (refused for an aggregated one; rule ``pd``)
PD_FIELDS = with_rule(OPTIONS, "pd", FIELD_ORDER)

_WITHOUT_TIMING = "without --timing (it is a setting of the timed engine)"

#: the synthetic workload's options: they shape the seed workload only, never a trace (rule ``synthetic``)
WORKLOAD_FIELDS = with_rule(OPTIONS, "synthetic", FIELD_ORDER)

def _flag(name: str) -> str:
    """A field's flag as its declaration names it (``--requests`` for ``num_requests``); sim's output options
    (``timeline``...) by their names."""
    return BY_NAME[name].flag if name in BY_NAME else "--" + name.replace("_", "-")


def _no_effect_rules(config, own_block_tokens: Optional[int]):
    """``(field, why it has no effect)`` for each option that would do nothing in ``config``.

    The one table of the combinations where an option is refused (each reason completes "``--NAME`` has no
    effect ..."); a new option with such a combination gets a row here (engine kinds': ``_engine_rules``)."""
    if config.pools:  # --pool (dynlab.engine.pools): what it replaces, what it does not model
        from dynlab.engine.pools import pool_rules

        yield from pool_rules(config)
    for name in WORKLOAD_FIELDS:
        if config.trace is not None:
            yield name, "with --trace: it shapes the synthetic workload only"
        elif config.workload is not None:
            yield name, "with --workload: it shapes the built-in synthetic workload only (the spec shapes yours)"
    if config.trace is not None:
        yield "all_metrics", "with --trace: a trace run prints the fleet metrics already"
    elif config.workload is not None:
        yield "all_metrics", "with --workload: a workload run prints the fleet metrics already"
    else:
        yield "trace_format", "without --trace"
        yield "tokenizer", "without --trace (it turns the text of a trace into tokens)"
        yield "trace_block", "without --trace (the block size of a trace that names its own blocks)"
    yield from (*workload_rules(config, _WITHOUT_TIMING), *_spec_rules(config, SPEC_FIELDS, _WITHOUT_TIMING),
                *_gateway_rules(config), *_engine_rules(config))  # workloads', spec's, the gateway's, the engine kinds'
    if config.trace is not None and own_block_tokens is not None and not config.timing:
        yield "block", (f"on this trace: its ids already name {own_block_tokens}-token blocks, and the "
                        "count-based replay never hashes tokens (with --timing it is the engine's block)")
    if config.timing:
        yield "policy", "with --timing: the engine evicts from vLLM's free-block queue"
        yield "event_delay", "with --timing: it counts requests; use --event-delay-ms"
        if config.capacity is None:  # --capacity unbounded: the same run as without it
            yield "capacity", ("as unbounded with --timing: the timed engine's KV pool is finite (give a number of "
                               "blocks, or leave --capacity out: the GPU's memory sizes it)")
    elif config.capacity is None:
        yield "policy", "without --capacity: an unbounded cache never evicts"
    if config.publish == "no":
        for name in ("event_delay", "event_loss", "event_delay_ms"):
            yield name, "with --publish no: no KV event is published"
    if config.routers == 1:
        yield "router_assign", "with one router (--routers 1): there is no replica to choose"
    yield from _tier_and_lora_rules(config)
    if not config.timing:
        for name in TIME_MODEL_FIELDS + PARALLEL_FIELDS:  # the parallel ones: the models helper's (issue 25)
            yield name, _WITHOUT_TIMING
    if not _aggregated(config):
        for name in ("cpu_capacity", "cpu_memory_gb"):
            yield name, "with a P/D split: the disaggregated fleet's workers have no CPU tier"
    if _aggregated(config):
        for name in PD_FIELDS:
            yield name, ("without a P/D split (--prefill-workers and --decode-workers, or --split P:D "
                         "with D >= 1)")
    if config.split is not None:
        for name in ("prefill_workers", "decode_workers", "workers"):
            yield name, "with --split (it sets the fleet: P:D prefill and decode workers, P:0 aggregated)"
    elif config.prefill_workers is not None or config.decode_workers is not None:
        yield "workers", "with --prefill-workers/--decode-workers (they size the disaggregated fleet)"
    if config.ep == 1:
        yield "dp_attention", "without --ep > 1 (attention replicas share the expert-parallel GPUs)"
    elif config.ep == config.tp:
        yield "dp_attention", "with --ep equal to --tp: one attention replica (--ep / --tp replicas)"


def _cost_rules(config):
    """``--price`` and ``--spot-discount`` (:mod:`dynlab.models.prices`): a cost is a timed run's GPU-hours times
    prices; a discount of 0 alone asks for nothing; a price of a catalogue GPU the run does not use does nothing."""
    if not config.timing:
        for name in ("price", "spot_discount"):
            yield name, "without --timing (a cost is a timed run's GPU-hours times prices)"
        return
    if config.price is None and config.spot_discount == 0:
        yield "spot_discount", "at 0 without --price (on-demand costs: --price table)"
    if config.price is not None:
        from dynlab.engine.pools import run_gpus
        from dynlab.models.gpus import GPUS
        from dynlab.models.prices import gpu_name, run_prices

        used = run_gpus(config)
        gpus = [gpu_name(g) for g in used]
        for name in run_prices(config.price, used):
            if name in GPUS and name not in gpus:
                yield "price", f"for {name}: the run's GPUs are {', '.join(gpus)}"


def _gateway_rules(config):
    """The admission policy's own rule in a timed run: the reason its class's
    :meth:`~dynlab.engine.gateway.AdmissionPolicy.no_effect` gives, if any (``slo-shed``'s: no class TTFT SLO)."""
    if not config.timing:
        return
    from dynlab.plugins import admission_policies

    try:
        name, opts = parse_policy(config.admission_policy)
        slos = parse_class_slos(config.slo_classes)
    except ValueError:
        return  # refused by their own checks
    registry = admission_policies()
    why = registry.get(name).no_effect(opts, slos) if name in registry else None  # unknown: a usage error
    if why:
        yield "admission_policy", why


def _controller_rules(config):
    """``--controller``'s rules, after :func:`_no_effect_rules`' (:func:`check_effective` reads both): elastic fleets
    are timed fleets of one router, for now (issue 39 item 3); in a P/D fleet the decode pool scales
    (:mod:`dynlab.disagg.elastic`), and a controller says what it cannot do there (``Controller.no_effect``)."""
    try:
        name, opts = parse_policy(config.controller)
    except ValueError:
        return  # refused by its own check
    from dynlab.plugins import controllers

    registry = controllers()
    why = registry.get(name).no_effect(opts, not _aggregated(config)) if name in registry else None
    if why:
        yield "controller", why
    if config.routers > 1:
        yield "controller", "with --routers > 1: only one router follows the workers joining and leaving (for now)"
    if config.async_scheduling:
        yield "controller", "with --async-scheduling: a killed worker's requests in flight are not modelled (for now)"


def _tier_and_lora_rules(config):
    """:func:`_no_effect_rules`' rows of the CPU tier's and the LoRA adapters' options (both cross PCIe)."""
    if config.cpu_capacity is not None:
        yield "cpu_memory_gb", "with --cpu-capacity: the CPU tier is sized in blocks already"
    elif config.cpu_memory_gb is None:
        if config.max_loras is None:  # (adapters cross PCIe too: dynlab.engine.lora)
            yield "pcie_gbps", "without a CPU tier (--cpu-capacity or --cpu-memory-gb) or --max-loras"
        yield "cpu_write", "without a CPU tier (--cpu-capacity or --cpu-memory-gb)"
    if config.max_loras is None:
        for name in LORA_FIELDS:
            yield name, "without --max-loras (the workers model LoRA adapters only with it)"


#: the LoRA adapters' options beside --max-loras, which turns them on (issue 42, dynlab.engine.lora; rule ``lora``)
LORA_FIELDS = with_rule(OPTIONS, "lora", FIELD_ORDER)


def _engine_rules(config):
    """The engine kinds' rules: SGLang's options without ``--engine sglang``, vLLM's with it (and what the
    SGLang worker does not model), and SGLang's options that do nothing in some combination."""
    if config.engine_kind != "sglang":
        for name in SGLANG_FIELDS:
            yield name, "without --engine sglang (an option of SGLang's scheduler)"
        return
    for name, why in VLLM_ONLY:
        yield name, f"with --engine sglang ({why})"
    if not _aggregated(config):
        for name in ("split", "prefill_workers", "decode_workers"):
            yield name, "with --engine sglang (dynlab does not model SGLang's P/D disaggregation yet)"
    if config.chunked_prefill_size == -1:
        yield "enable_mixed_chunk", "with --chunked-prefill-size -1 (SGLang mixes decodes only into chunked prefills)"
    if config.disable_radix_cache and config.schedule_policy in ("lpm", "dfs-weight"):
        yield "schedule_policy", (f"as {config.schedule_policy} with --disable-radix-cache (no prefix is cached: "
                                  "SGLang runs it as fcfs)")


#: speculative decoding's options (spec helper, issue 26); spec_tokens is the one that turns it on (rule ``spec``)
SPEC_FIELDS = with_rule(OPTIONS, "spec", FIELD_ORDER)


def _aggregated(config) -> bool:
    try:
        return config.pd() is None
    except ValueError:
        return False  # a bad split is reported by validate


def align_split(configs: list, given: AbstractSet[str] = frozenset()) -> list[tuple]:
    """Configurations that compare splits (``compare --split``, a sweep's ``split`` axis): when at least
    one is disaggregated, the aggregated ones (``split`` ``P:0``) drop the P/D options, which apply to
    the others. Returns ``(configuration to check and run, given fields to check it with)`` each.
    Raises ``ValueError`` for a file of acceptance lengths that does not fit the largest K compared."""
    from dynlab.engine.spec import align_rates, spec_baseline

    configs = align_rates(configs)
    if len({c.engine_kind for c in configs}) > 1:  # compare --engine vllm,sglang: each engine's own options
        return [(c, g & given) for c, g in _align_engines(configs, given)]
    if any(c.spec_tokens for c in configs) and any(not c.spec_tokens for c in configs):
        # compare --spec-tokens 0,2,4: the K = 0 run is the baseline, without the other spec options
        configs = [c if c.spec_tokens else spec_baseline(c, {f: defaults_of(type(c))[f] for f in SPEC_FIELDS}) for c in configs]
        off = set(SPEC_FIELDS) | {"spec_tokens"} | {"latency_opts"}  # given back below while some remain
        return [(c, g if c.spec_tokens else g - off | ({"latency_opts"} & g if c.latency_opts else set()))
                for c, g in _align_pd(configs, given)]
    return _align_pd(configs, given)


#: vLLM's scheduler options that an SGLang run of an engine comparison leaves out (SGLang's own: SGLANG_FIELDS)
VLLM_SCHEDULER_FIELDS = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "admission",
                         "queue_policy", "async_scheduling")


def _align_engines(configs: list, given: AbstractSet[str]) -> list[tuple]:
    """:func:`align_split`'s engine part, when the configurations compare engine kinds: each run keeps only
    its own engine's scheduler options (SGLang's names for ``sglang``, vLLM's for the others), as a P/D
    fleet's options apply only to its disaggregated runs; every other option applies to all (and is refused
    where it has no effect). Then the P/D part."""
    out = []
    for c in configs:
        other = VLLM_SCHEDULER_FIELDS if c.engine_kind == "sglang" else SGLANG_FIELDS
        out.append(replace(c, **{f: defaults_of(type(c))[f] for f in other}))
    pairs = _align_pd(out, given)
    return [(c, g - set(VLLM_SCHEDULER_FIELDS if c.engine_kind == "sglang" else SGLANG_FIELDS)) for c, g in pairs]


def _align_pd(configs: list, given: AbstractSet[str]) -> list[tuple]:
    """:func:`align_split`'s P/D part."""
    if not any(c.split is not None and not _aggregated(c) for c in configs):
        return [(c, set(given)) for c in configs]
    return [(replace(c, **{f: defaults_of(type(c))[f] for f in PD_FIELDS}), set(given) - set(PD_FIELDS))
            if c.split is not None and _aggregated(c) else (c, set(given)) for c in configs]


def _output_rules(timing: bool, given: AbstractSet[str]):
    """``(option name, why it has no effect)`` for ``sim``'s outputs that are not :class:`SimConfig` fields
    (the timeline: :mod:`dynlab.sim.timeline`); ``given``: the option names the user wrote."""
    if not timing:
        yield "timeline", "without --timing (a count-based run has no clock: no steps, no times)"
    if "timeline" not in given:
        yield "timeline_max_requests", "without --timeline (it bounds the timeline's requests)"


def check_outputs(timing: bool, given: AbstractSet[str]) -> None:
    """Raise ``ValueError`` (``--NAME has no effect WHY``) for the first output option in ``given`` (the
    option names the user wrote) that would do nothing (:func:`_output_rules`)."""
    for name, why in _output_rules(timing, given):
        if name in given:
            raise ValueError(f"{_flag(name)} has no effect {why}")


def check_effective(config, given: AbstractSet[str] = frozenset(),
                    own_block_tokens: Optional[int] = None) -> None:
    """Raise ``ValueError`` naming the first option set in ``config`` that would have no effect.

    An option is *set* when it differs from its default, or when its field name is in ``given``
    (what the user wrote, even at the default value: ``dynlab sim --trace T --block 16``).
    ``own_block_tokens``: the block size a trace's format names its blocks at (512 for Mooncake,
    :func:`dynlab.traces.reader.own_block_tokens`), ``None`` when unknown or when the format
    hashes tokens at ``block``. Message: ``--NAME has no effect WHY`` (the time-model options:
    ``--NAME has no effect without --timing (it is a setting of the timed engine)``).
    """
    for name, why in (*_no_effect_rules(config, own_block_tokens), *_controller_rules(config), *_cost_rules(config)):
        if name in given or getattr(config, name) != defaults_of(type(config))[name]:
            raise ValueError(f"{_flag(name)} has no effect {why}")

