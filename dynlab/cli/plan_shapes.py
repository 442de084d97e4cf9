"""``dynlab plan``'s candidate shapes: the cross product of the candidate lists (:data:`CANDIDATES`, --split),
and every shape's replay options checked as ``sim`` checks them, before any replay."""
from __future__ import annotations

import random

import click

from dynlab import plugins
from dynlab.cli.common import refuse_repeats, split_list
from dynlab.cli.sim_options import SIM_OPTIONS
from dynlab.engine.config import SimConfig
from dynlab.plan import Shape

BY_FIELD = {field: (flags, ptype, default, help_) for flags, field, ptype, default, help_ in SIM_OPTIONS}
#: sim options plan takes as comma lists of candidates (the shapes are their cross product, with --split's)
CANDIDATES = ("model", "gpu", "tp", "mode", "cpu_memory_gb", "ep", "spec_tokens", "engine_kind")
#: values of plan's --split: an aggregated fleet, or a P/D one whose split is searched
SPLITS = ("agg", "auto")


def candidates(ctx, options: dict) -> list[Shape]:
    """The shapes: the cross product of the candidate lists, each item converted by sim's option type. One
    --engine: ``options["engine_kind"]`` (every replay's); several (``vllm,sglang``): each shape's own
    (:attr:`Shape.engine`), as ``compare --engine`` runs each."""
    lists = {}
    for field in CANDIDATES:
        flags, ptype, _, _ = BY_FIELD[field]
        items = split_list(options.pop(field), flags[-1])
        try:
            values = [ptype.convert(v, None, ctx) for v in items]
        except click.BadParameter as exc:
            exc.param_hint = f"'{flags[-1]}'"
            raise
        refuse_repeats(items, values, flags[-1])
        lists[field] = values
    items = split_list(options.pop("split"), "--split")
    bad = [v for v in items if v not in SPLITS]
    if bad:
        raise click.BadParameter(f"{bad[0]!r} is not agg or auto (a P/D candidate's split is searched)",
                                 param_hint="'--split'")
    refuse_repeats(items, items, "--split")
    cpu = [v if v else None for v in lists["cpu_memory_gb"]]  # 0: no CPU tier
    dpa = options.pop("dp_attention")  # attention ranks: the shapes whose --ep exceeds their --tp
    if dpa and not any(ep > t for ep in lists["ep"] for t in lists["tp"]):
        raise click.UsageError("--dp-attention has no effect: no --ep candidate exceeds a --tp candidate "
                               "(attention ranks per worker are --ep / --tp)")
    engines = lists["engine_kind"]
    if len(engines) == 1:  # one engine: every replay's, as sim's --engine (labels and JSON as without the list)
        options["engine_kind"], engines = engines[0], [None]
    shapes = [Shape(m, g, t, mode, c, ep, k, pd == "auto", dpa and ep > t, e) for m in lists["model"]
              for g in lists["gpu"] for t in lists["tp"] for ep in lists["ep"] for mode in lists["mode"] for e in engines
              for c in cpu for k in lists["spec_tokens"] for pd in items]
    kept = [s for s in shapes if not s.impossible()]
    left = [f"{s.label} ({s.impossible()})" for s in shapes if s.impossible()]
    if not kept:
        raise click.UsageError(f"no candidate shape is possible: {left[0]}")
    if left:
        click.echo(f"plan: left out {len(left)} candidate{'' if len(left) == 1 else 's'} no worker can be: "
                   + "; ".join(left), err=True)
    return kept


def check_shapes(shapes, base: SimConfig, given: set, requests) -> None:
    """Every shape's replay options, checked as sim checks them, before any replay."""
    from dynlab.engine.option_rules import PD_FIELDS, SPEC_FIELDS, check_effective
    from dynlab.engine.run import build_strategy
    from dynlab.engine.serving import check_timed
    from dynlab.plan.planner import latency_for

    from dynlab.engine.serving import build_engines
    from dynlab.plan.search import CPU_TIER_FIELDS

    _check_candidate_options(shapes, base, given)
    own_block = getattr(requests, "own_block_tokens", None)
    top_k = max(s.spec_tokens for s in shapes)
    for shape in shapes:
        config = shape.config(base, top_k)
        own = (given - {"dp_attention"}) | ({"cpu_memory_gb"} if shape.cpu_memory_gb else set())
        if not shape.pd:  # its P/D options are the P/D candidates' (as compare --split aligns them)
            own -= set(PD_FIELDS)
        if not shape.spec_tokens and any(s.spec_tokens for s in shapes):  # the K = 0 baseline: the others'
            own -= set(SPEC_FIELDS)
        if not shape.cpu_memory_gb:  # the CPU tier's options are the tiered candidates'
            own -= set(CPU_TIER_FIELDS)
        own -= set(shape.other_engine_fields())  # --engine vllm,sglang: the other engine's options
        try:
            config.validate()
            check_effective(config, own, own_block)
            check_timed(config, requests)
            build_engines(config, own_block)  # --trace-block on a workload, block ratios, KV cache groups
            build_strategy(config, random.Random(0))
            latency_for(config)
        except (ValueError, plugins.UnknownNameError) as exc:
            raise click.UsageError(f"{shape.label}: {exc}" if len(shapes) > 1 else str(exc)) from None


def _candidate_rules(shapes):
    """``(field, why it has no effect)`` for the options that apply to some kinds of candidate only, in plan's
    own words (sim's rules name sim's options: --cpu-capacity, --prefill-workers)."""
    from dynlab.engine.option_rules import PD_FIELDS, SGLANG_FIELDS
    from dynlab.plan.search import CPU_TIER_FIELDS

    if any(s.engine for s in shapes) and not any(s.engine == "sglang" for s in shapes):
        for name in SGLANG_FIELDS:
            yield name, "without an sglang candidate left (--engine; see the shapes left out)"
    if not any(s.cpu_memory_gb for s in shapes):
        for name in CPU_TIER_FIELDS:
            yield name, "without a CPU tier candidate (an aggregated one, --split agg, with --cpu-memory-gb above 0)"
    if not any(s.pd for s in shapes):
        for name in PD_FIELDS:
            yield name, "without a P/D candidate (--split auto)"


def _check_candidate_options(shapes, base: SimConfig, given: set) -> None:
    """Usage error for the first option given (or set off its default) that no candidate shape uses."""
    from dynlab.engine.config import DEFAULTS

    for name, why in _candidate_rules(shapes):
        if name in given or getattr(base, name) != DEFAULTS[name]:
            raise click.UsageError(f"--{name.replace('_', '-')} has no effect {why}")
