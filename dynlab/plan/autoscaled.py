"""``dynlab plan --controller NAME[:KEY=VALUE,...]``: each shape's static answer against the same traffic replayed
with an autoscaler (dynlab issue 41 item 5), in GPU-hours and dollars.

For a shape whose answer is N workers (:mod:`dynlab.plan.planner`), the autoscaled replay is the shape's own
replay configuration with ``controller`` set and the fleet bounded: it starts at the controller's ``min`` (1
unless given) and may grow to ``max`` = N (or ``--max-workers`` when given); a controller that takes no bounds
(``static``, or a plugin not built on :class:`dynlab.engine.autoscale.Autoscaler`) starts at N. The figures:

- static GPU-hours: N x GPUs per worker x the answer's ``makespan_s`` (first arrival to last finish) / 3600, to 6
  decimals: what ``dynlab sim --price`` bills a fixed fleet (:func:`dynlab.sim.cost.with_cost`);
- the autoscaled run's ``gpu_hours``: each worker from its add (0 s for the first ones) to its leave or the last
  finish (:mod:`dynlab.engine.scaling_metrics`), so ``static`` at N differs from the static figure only by the
  first arrival's time;
- dollars: either figure x the GPU's price (``--price``'s, else the bundled table's,
  :func:`dynlab.models.prices.cost`), ``None`` when the GPU has no price;
- ``meets``: the autoscaled replay against the plan's own target (:meth:`dynlab.plan.target.Target.misses`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, Mapping, Optional, Sequence

from dynlab.plan.target import measured


def bounded(spec: str, cap: int) -> tuple[str, int]:
    """``(the spec replayed, workers at the start)`` for ``spec`` bounded at ``cap`` workers: ``max=cap`` added
    when the controller takes bounds (start: its ``min``, 1 unless given), else ``spec`` as it is (start:
    ``cap``). Raises ``ValueError`` (one line, quoting ``spec`` as given) for ``none`` (no controller), a ``max``
    in ``spec`` (plan sets it), a P/D pool's bound (plan compares aggregated fleets), an unknown controller or
    option, or a ``min`` above ``cap``."""
    from dynlab.engine.autoscale import Autoscaler
    from dynlab.engine.gateway import parse_policy
    from dynlab.limits import MAX_WORKERS
    from dynlab.plugins import controllers
    from dynlab.sim.control import build_controller

    name, opts = parse_policy(spec, "controller")
    if "max" in opts:
        raise ValueError(f"controller {spec!r}: max is plan's to set (the static answer N, or --max-workers)")
    if name == "none":
        raise ValueError("controller none: no controller to compare (give static, hpa:..., dynamo-load:..., ...)")
    registry = controllers()
    if name in registry and not issubclass(registry.get(name), Autoscaler):
        build_controller(spec)  # its own options checked
        return spec, cap  # no bounds: it keeps (or moves) the N it starts with
    pools = [k for k in ("decode_min", "decode_max", "prefill_min", "prefill_max") if k in opts]
    if pools:  # sim's advice (a P/D split) is not plan's: plan --split is agg|auto, and a P/D shape is refused
        raise ValueError(f"controller {spec!r}: {'= and '.join(pools)}= bound a P/D fleet's pools, but plan "
                         "--controller compares autoscaled aggregated fleets only: give min= instead (plan sets max=)")
    sep = "," if opts else ":"
    # its own options checked at the widest max (its errors quoting the spec the user gave), then its min against cap
    start = int(build_controller(f"{spec}{sep}max={MAX_WORKERS}", shown=spec).min)
    with_max = f"{spec}{sep}max={cap}"
    if start > cap:
        raise ValueError(f"controller {spec!r}: min={start} is above the most workers plan replays ({cap}: the "
                         "static answer N, or --max-workers)")
    return with_max, start


def check(spec: str, cap: int, shapes: Sequence, base, own_block: Optional[int] = None) -> None:
    """``spec`` checked before any replay: :func:`bounded` at ``cap``, then each shape's replay with it by sim's
    rules (:func:`dynlab.engine.option_rules.check_effective`: a P/D split, ``--routers`` > 1 and
    ``--async-scheduling`` refuse a controller; attention-DP ranks too). ``base``: the plan's timed configuration; raises ``ValueError``."""
    from dynlab.engine.option_rules import check_effective

    text, start = bounded(spec, cap)
    top_k = max(s.spec_tokens for s in shapes)
    for shape in shapes:
        if shape.pd:  # sim --controller scales a P/D fleet's decode pool; plan's comparison is of aggregated fleets
            raise ValueError(f"{shape.label}: --controller has no effect with a P/D split in plan (it compares "
                             "autoscaled aggregated fleets only, for now)")
        if shape.dp_attention:  # attention-DP ranks refuse a controller when their engines are built: say it now
            raise ValueError(f"{shape.label}: --controller with --dp-attention is not modelled (attention-DP ranks "
                             "are modelled in a fixed fleet)")
        try:
            check_effective(replace(shape.config(base, top_k), workers=start, controller=text), {"controller"},
                            own_block)
        except ValueError as exc:
            raise ValueError(f"{shape.label}: {exc}" if len(shapes) > 1 else str(exc)) from None


def attach(out: dict, outcomes: Sequence, spec: str, cap: Optional[int], target, prices: Mapping[str, float],
           run_batch: Callable[[list], Iterable]) -> None:
    """Add ``autoscaled`` to each shape of ``out`` (:func:`dynlab.plan.report.as_json`'s object; ``None`` for a
    shape without an answer): the replays of ``spec`` bounded at ``cap`` (``None``: each shape's answer N) run
    through ``run_batch(configs)`` (yielding ``(index, result)``), and :func:`figures` of each."""
    todo = [o for o in outcomes if o.workers is not None and not o.shape.pd]
    runs = []
    for o in todo:
        text, start = bounded(spec, cap or o.workers)
        runs.append((o, text, start, cap or o.workers))
    configs = [replace(o.search.config, workers=start, controller=text) for o, text, start, _ in runs]
    results = dict(run_batch(configs))
    by_label = {o.shape.label: figures(o, text, start, top, results[i], target, prices)
                for i, (o, text, start, top) in enumerate(runs)}
    for shape in out["shapes"]:
        shape["autoscaled"] = by_label.get(shape["shape"])


def _bill(gpu: str, hours: float, prices: Mapping[str, float]) -> tuple:
    """``(cost_usd, price_source)`` of ``hours`` GPU-hours of ``gpu`` (a --gpu candidate as written); ``(None,
    None)`` without a price."""
    from dynlab.models.prices import cost, gpu_name

    try:
        name = gpu_name(gpu)
        bill = cost({name: hours}, {name: prices[gpu]} if gpu in prices else {})
    except ValueError:
        return None, None
    return bill["cost_usd"], bill["price_source"][name]


def figures(o, spec: str, start: int, top: int, result: Mapping, target, prices: Mapping[str, float]) -> dict:
    """One shape's comparison: its static answer (``o``: a planner Outcome) against ``result``, the replay of
    ``spec`` from ``start`` workers to at most ``top`` (module docstring: each figure's rule)."""
    answer = next(s.tested[o.workers][1] for s in (o.search, o.floor) if s is not None and o.workers in s.tested)
    static_hours = round(o.workers * o.shape.worker_gpus * answer["makespan_s"] / 3600.0, 6)
    static_usd, source = _bill(o.shape.gpu, static_hours, prices)
    hours = result.get("gpu_hours")
    usd, _ = _bill(o.shape.gpu, hours, prices) if hours is not None else (None, None)
    counts = [n for _, n in result.get("workers_over_time") or [[0, start]]]
    misses = target.misses(result)
    return {"controller": spec, "start_workers": start, "max_workers": top, "static_workers": o.workers,
            "static_gpu_hours": static_hours, "static_cost_usd": static_usd, "gpu_hours": hours, "cost_usd": usd,
            "price_source": source,
            "saved_pct": None if not (hours is not None and static_hours) else
            round(100.0 * (static_hours - hours) / static_hours, 1) + 0.0,  # + 0.0: no -0.0 for a tiny difference
            "goodput": result.get("goodput"), "ttft_ms": measured(result, "ttft_ms", target.percentile),
            "tpot_ms": measured(result, "tpot_ms", target.percentile), "meets": not misses, "misses": misses,
            "peak_workers": max(counts), "scale_events": len(result.get("scale_events") or ()),
            "oscillations": result.get("oscillations")}


def lines(plan: Mapping) -> list[str]:
    """The table's lines on ``--controller``'s comparison (none without it): per answered shape, static GPU-hours
    and $ beside the autoscaled run's, its goodput and whether it meets the target."""
    rows = [s for s in plan["shapes"] if s.get("autoscaled")]
    if not rows:
        return ["autoscaled: no shape has an answer to compare with"] if any("autoscaled" in s
                                                                             for s in plan["shapes"]) else []
    out = [f"autoscaled ({rows[0]['autoscaled']['controller'].split(':')[0]}) against the static answer, "
           "same traffic:"]
    for s in rows:
        a = s["autoscaled"]
        usd = (lambda v: "" if v is None else f" ${v:,.2f}")
        verdict = "meets the target" if a["meets"] else "misses: " + "; ".join(a["misses"])
        saved = "" if a["saved_pct"] is None else f" ({0.0 - a['saved_pct']:+g}%)"
        out.append(f"- {s['shape']}: static {a['static_workers']} worker{'' if a['static_workers'] == 1 else 's'} {a['static_gpu_hours']} GPU-h"
                   f"{usd(a['static_cost_usd'])}; {a['controller']} from {a['start_workers']} (peak "
                   f"{a['peak_workers']}) {a['gpu_hours']} GPU-h{usd(a['cost_usd'])}{saved}, goodput "
                   f"{a['goodput']}, {verdict}")
    return out
