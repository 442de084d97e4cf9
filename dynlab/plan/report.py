"""A plan's report: the ranked table, the JSON object and the Pareto plot."""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from dynlab.plan.autoscaled import lines as autoscaled_lines
from dynlab.plan.planner import Outcome
from dynlab.plan.target import measured


def gpus(o: Outcome) -> Optional[int]:
    """GPUs of the shape's shown fleet: workers x TP (x the attention ranks ``ep / tp`` with ``--dp-attention``:
    a worker's GPUs, :attr:`dynlab.models.parallel.Parallelism.gpus` at ``pp`` 1)."""
    return None if o.shown is None else o.shown * o.shape.worker_gpus


def usd_per_hour(o: Outcome, prices: Mapping[str, float]) -> Optional[float]:
    """$/h of the shown fleet: GPUs x ``prices[gpu]`` (USD per GPU-hour); ``None`` without a price."""
    n = gpus(o)
    return None if n is None or o.shape.gpu not in prices else round(n * prices[o.shape.gpu], 2)


def ranked(outcomes: Sequence[Outcome], prices: Mapping[str, float]) -> list[Outcome]:
    """Shapes meeting the target first, cheapest first ($/h when every shape has a price, else GPUs),
    more headroom first among equals; then the others in the order given."""
    priced = bool(prices) and all(o.shape.gpu in prices for o in outcomes)
    met = [o for o in outcomes if o.workers is not None]
    key = (lambda o: (usd_per_hour(o, prices), -(o.search.target.headroom(o.shown_result()) or 0))) if priced \
        else (lambda o: (gpus(o), -(o.search.target.headroom(o.shown_result()) or 0)))
    return sorted(met, key=key) + [o for o in outcomes if o.workers is None]


def as_json(outcomes: Sequence[Outcome], prices: Mapping[str, float], header: Mapping) -> dict:
    """The plan as one JSON object: ``header`` (target, arrivals) and ``shapes``, ranked, each with its
    answer, figures at the shown count, binding constraint and every replay (workers, met, misses)."""
    shapes = []
    for o in ranked(outcomes, prices):
        r, t = o.shown_result(), o.search.target
        domain = r.get("latency_domain") or o.domain  # the replay's (profile, drafter), else the latency model's
        replays = [{"workers": n, "meets": ok, "misses": t.misses(res), "search": "answer"}
                   for n, (ok, res) in sorted(o.search.tested.items())]
        if o.floor is not None:
            replays += [{"workers": n, "meets": ok, "misses": o.floor.target.misses(res), "search": "floor"}
                        for n, (ok, res) in sorted(o.floor.tested.items())]
        shapes.append({
            "shape": o.shape.label, "model": o.shape.model, "gpu": o.shape.gpu, "tp": o.shape.tp,
            "mode": o.shape.mode, "cpu_memory_gb": o.shape.cpu_memory_gb, "ep": o.shape.ep,
            "spec_tokens": o.shape.spec_tokens, "pd": o.shape.pd,
            **({"dp_attention": True} if o.shape.dp_attention else {}),
            **({"engine": o.shape.engine} if o.shape.engine else {}),  # plan --engine vllm,sglang only
            "meets": o.workers is not None, "workers": o.workers, "shown_workers": o.shown,
            "split": o.shown_split() or None, "gpus": gpus(o),
            "usd_per_hour": usd_per_hour(o, prices), "goodput": r.get("goodput"),
            "ttft_ms": measured(r, "ttft_ms", t.percentile), "tpot_ms": measured(r, "tpot_ms", t.percentile),
            "headroom": t.headroom(r) if r else None, "preemptions": r.get("preemptions"),
            "error_band_pct": r.get("error_band_pct"), "latency_domain": domain,
            "extrapolated": domain is not None,
            "binding": o.kind, "why": o.why, "never_share": round(o.never_share, 6), "slo_floors": o.slo_floors,
            "lower_bound_workers": o.lower, "replays": replays, "binding_class": o.binding_class,
            "by_class": class_rows(t, r), "class_floors": o.class_floors})
    out = {**header, "shapes": shapes}
    if header.get("objective") == "cost":
        out["cheapest"] = cheapest(out)
    return out


def cheapest(plan: Mapping) -> Optional[dict]:
    """``--objective cost``'s answer: the first ranked shape meeting the target (the cheapest in $/h, more headroom
    first among equals) with its workers, GPUs, $/h, binding constraint and its GPU's price source; ``None`` when
    no shape meets the target."""
    for s in plan["shapes"]:
        if s["meets"]:
            return {"shape": s["shape"], "workers": s["workers"], "gpus": s["gpus"], "usd_per_hour": s["usd_per_hour"],
                    "binding": s["binding"], "why": s["why"], "price_source": plan["price_source"][s["gpu"]]}
    return None


def class_rows(target, result: Mapping) -> dict:
    """Each class of the target's ``--slo`` at a replay: its TTFT and TPOT at the percentile, goodput, headroom
    against its own SLOs and whether it meets them (``{}`` without per-class SLOs or a replay)."""
    from dynlab.plan.target import Target, class_figures

    out = {}
    for name, ttft, tpot in target.classes if result else ():
        f = class_figures(result, name) or {}
        own = Target(ttft, tpot, target.percentile, target.goodput)
        out[name] = {"ttft_ms": measured(f, "ttft_ms", target.percentile),
                     "tpot_ms": measured(f, "tpot_ms", target.percentile), "goodput": f.get("goodput"),
                     "headroom": own.headroom(f), "meets": not own.misses(f)}
    return out


def _cell(v, fmt="{}") -> str:
    return "-" if v is None else fmt.format(v)


def _banded(s: Mapping, key: str, pct: str) -> str:
    """A figure of shape ``s`` with its calibration profile's cross-validated error, ``3202.2 (±11.0%)``."""
    band = (s.get("error_band_pct") or {}).get(f"{key}.{pct}")
    return _cell(s[key]) + (f" (±{band:.1f}%)" if band is not None and s[key] is not None else "")


def table(plan: Mapping) -> str:
    """The ranked table of :func:`as_json`'s object, then each shape's binding constraint in words."""
    pct = plan["percentile"]
    cols = ["rank", "shape", "workers", "gpus", "$/h", "goodput", f"ttft_{pct}_ms", f"tpot_{pct}_ms",
            "headroom", "binding"]
    rows = [cols]
    for i, s in enumerate(plan["shapes"], 1):
        workers = str(s["workers"]) if s["meets"] else (f"({s['shown_workers']})" if s["shown_workers"] else "-")
        if s["split"] and s["shown_workers"]:
            workers += f" [{s['split']}]"
        rows.append([str(i) if s["meets"] else "-", s["shape"] + (f" {EXTRAPOLATED}" if s.get("extrapolated") else ""), workers, _cell(s["gpus"]) if s["meets"] else "-",
                     _cell(s["usd_per_hour"], "{:.2f}") if s["meets"] else "-", _cell(s["goodput"]),
                     _banded(s, "ttft_ms", pct), _banded(s, "tpot_ms", pct), _cell(s["headroom"], "{:.1%}"),
                     s["binding"] + (f" ({s['binding_class']})" if s.get("binding_class") else "")])
    mix = (plan.get("mix") or {}).get("answer")
    if mix:  # --mix: its row among the shapes meeting the target, by $/h (cheaper than all of them)
        rows.insert(1, ["mix", mix["shape"], str(mix["workers"]), str(mix["gpus"]), f"{mix['usd_per_hour']:.2f}",
                        _cell(mix["goodput"]), _cell(mix["ttft_ms"]), _cell(mix["tpot_ms"]),
                        _cell(mix["headroom"], "{:.1%}"), mix["binding"]])
    widths = [max(len(r[j]) for r in rows) for j in range(len(cols))]
    lines = ["  ".join(c.ljust(widths[j]) if j in (1, 9) else c.rjust(widths[j]) for j, c in enumerate(r)).rstrip()
             for r in rows]
    lines.append("")
    lines.append(f"target: {plan['target']}; arrivals: {plan['arrivals']}")
    lines += cost_lines(plan)
    lines += autoscaled_lines(plan)
    if not all(s["meets"] for s in plan["shapes"]):
        lines.append("workers in parentheses: the shape misses the target; figures at that count (see below)")
    if any(s["split"] for s in plan["shapes"]):
        lines.append("[P:D]: a P/D shape's prefill and decode workers")
    for s in plan["shapes"]:
        lines.append(f"- {s['shape']}: {s['why']}")
    if any(s.get("error_band_pct") for s in plan["shapes"]):
        lines.append("(±x%): the calibration profile's cross-validated median error of that figure")
    lines += extrapolated_lines(plan["shapes"])
    return "\n".join(lines)


def cost_lines(plan: Mapping) -> list[str]:
    """``--objective cost``'s lines under the table: the cheapest shape meeting the target, its $/h and binding
    constraint, and where each candidate GPU's price came from (none for an objective of GPUs)."""
    if plan.get("objective") != "cost":
        return []
    c = plan.get("cheapest")
    out = [f"cheapest meeting the target: {c['shape']}, {c['workers']} worker{'' if c['workers'] == 1 else 's'} "
           f"({c['gpus']} GPU{'' if c['gpus'] == 1 else 's'}), "
           f"${c['usd_per_hour']:.2f}/h; binding: {c['binding']}" if c else
           "cheapest meeting the target: none (no shape meets it)"]
    out += mix_lines(plan.get("mix"))
    out += [f"price of {gpu}: {source}" for gpu, source in plan["price_source"].items()]
    return out


def mix_lines(mix: Optional[Mapping]) -> list[str]:
    """``--mix``'s lines: the two-pool fleet found (its $/h, binding constraint and replay) or that none cheaper than
    every shape was, and how many mixed replays it took of the most allowed (none without ``--mix``)."""
    if mix is None:
        return []
    n = f"{len(mix['replays'])} mixed replay{'' if len(mix['replays']) == 1 else 's'} (at most {mix['max_replays']})"
    a = mix["answer"]
    if a is None:
        return [f"mixed pools: none cheaper than every shape meeting the target ({n})"]
    return [f"mixed pools (row mix): {a['shape']} ({n}), as sim --pool {' --pool '.join(a['pools'])}",
            f"- {a['shape']}: {a['why']}"]


#: the table's mark of a shape whose latency model answers outside its validated domain
EXTRAPOLATED = "*"


def extrapolated_lines(shapes: Sequence[Mapping]) -> list[str]:
    """The table's note on the shapes marked :data:`EXTRAPOLATED` (their ``latency_domain``), one line each
    under a heading; none when every shape is inside its latency model's validated domain."""
    out = [f"  {s['shape']}: {s['latency_domain']}" for s in shapes if s.get("extrapolated")]
    if not out:
        return []
    return [f"{EXTRAPOLATED}: extrapolated: the latency model is outside its validated domain for the shape, so its "
            "figures, and its rank, rest on an extrapolation:"] + out


def plot(plan: Mapping, path: str) -> None:
    """Write :func:`pareto_figure` to ``path`` (the format from its suffix)."""
    from dynlab.plots import save

    save(pareto_figure(plan), path)


def pareto_figure(plan: Mapping):
    """A Pareto plot (a matplotlib figure): every replay's TTFT (or TPOT, without a TTFT SLO) at the percentile against GPUs
    (or $/h when every shape has a price), a line per shape, the SLO as a dashed line, the answers
    marked and the cheapest answers' Pareto front drawn. ``plan``: :func:`as_json`'s object with
    ``_results`` (shape label -> {workers: result}) attached."""
    from dynlab.plots import pyplot

    plt = pyplot()
    key, slo = ("ttft_ms", plan["slo_ttft_ms"]) if plan["slo_ttft_ms"] is not None else ("tpot_ms", plan["slo_tpot_ms"])
    priced = all(s["usd_per_hour"] is not None or not s["meets"] for s in plan["shapes"]) and plan["prices"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    front = []
    for s in plan["shapes"]:
        runs = sorted(plan["_results"][s["shape"]].items())
        scale = plan["prices"].get(s["gpu"], 0) if priced else 1
        xs = [n * s["tp"] * scale for n, _ in runs]
        ys = [measured(r, key, plan["percentile"]) for _, r in runs]
        line, = ax.plot(xs, ys, marker=".", label=s["shape"])
        if s["meets"]:
            x = s["gpus"] * scale
            ax.plot([x], [s[key]], marker="*", markersize=14, color=line.get_color())
            front.append((x, s[key]))
    if slo is not None:
        ax.axhline(slo, linestyle="--", color="black", linewidth=1, label=f"SLO {slo:g} ms")
    front.sort()
    pareto, best = [], float("inf")
    for x, y in front:
        if y < best:
            pareto.append((x, y))
            best = y
    if len(pareto) > 1:
        ax.plot(*zip(*pareto), color="gray", linewidth=3, alpha=0.4, label="Pareto front")
    ax.set_xlabel("$/h" if priced else "GPUs")
    ax.set_ylabel(f"{key.split('_')[0].upper()} {plan['percentile']} (ms)")
    ax.set_yscale("log")
    ax.set_title(f"dynlab plan: {plan['target']}", fontsize=9)
    ax.legend(fontsize=7)
    return fig
