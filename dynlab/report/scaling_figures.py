"""The report's figure of an autoscaled fleet over time (issue 41): workers (per pool when the fleet has pools),
arrival rate, SLO attainment and queueing per window, and scale events, for runs with a controller
(``--controller``; :mod:`dynlab.engine.scaling_metrics` keys).

It reads the run's result only: ``workers_over_time`` (``[s, live workers]`` at each change, a worker counted
from when it is ready), ``worker_lifetimes`` (per worker ``ready_s`` and ``left_s``, and ``pool`` when the run's
workers belong to named pools: :func:`replicas_per_pool`), ``scale_events`` (``[s, "add" | "retire", worker]``,
the decisions; a P/D fleet's name the pool after the worker), ``goodput_over_time`` (``[window start s, goodput]`` per controller period, only with an SLO),
``queue_over_time`` (``[window start s, mean requests waiting]`` per controller period) and, when the report has
the run's per-request records (``--requests-out``), the arrival rate per window of the same width.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from dynlab.report.figures import COLOURS, Figure, pyplot, to_svg
from dynlab.report.runs import Run

#: runs drawn (a column of panels each); the table lists every run
MAX_RUNS = 4


def scaled(runs: Sequence[Run]) -> list[Run]:
    """The runs whose result has a controller's figures (``workers_over_time``)."""
    return [r for r in runs if isinstance(r.result.get("workers_over_time"), list) and r.result["workers_over_time"]]


def window_s(result: Mapping) -> Optional[float]:
    """The controller period in seconds, read from ``goodput_over_time``'s window starts (``None`` with fewer than
    two windows)."""
    starts = [w[0] for w in result.get("goodput_over_time") or []]
    gaps = [b - a for a, b in zip(starts, starts[1:]) if b > a]
    return min(gaps) if gaps else None


def arrivals_per_s(records: Sequence[dict], width_s: float) -> list[list]:
    """``[[window start s, requests/s]]`` of the records' arrivals in windows of ``width_s`` seconds (> 0), from the
    first window with an arrival to the last."""
    counts: dict = {}
    for rec in records:
        if rec.get("arrival_ms") is not None:
            k = int(rec["arrival_ms"] / 1000.0 // width_s)
            counts[k] = counts.get(k, 0) + 1
    if not counts:
        return []
    return [[round(k * width_s, 3), round(counts.get(k, 0) / width_s, 3)] for k in range(min(counts), max(counts) + 1)]


def replicas_per_pool(result: Mapping) -> dict:
    """``{pool: [[s, serving workers], ...]}`` from ``worker_lifetimes``: each worker counts in its ``pool`` (``""``
    when the result names none: one fleet) from its ``ready_s`` to its ``left_s`` (a draining worker still serves
    what it holds; one retired before it was ready never counts); a point at 0 s and at each change, changes at one
    time summed (a leave before a join). ``{}`` without lifetimes."""
    deltas: dict = {}
    for w in result.get("worker_lifetimes") or []:
        ready, left = w.get("ready_s"), w.get("left_s")
        if ready is None or (left is not None and left <= ready):
            continue
        pool = deltas.setdefault(str(w.get("pool") or ""), {})
        pool[ready] = pool.get(ready, 0) + 1
        if left is not None:
            pool[left] = pool.get(left, 0) - 1
    out = {}
    for name, changes in sorted(deltas.items()):
        n, points = 0, [] if 0 in changes else [[0, 0]]
        for t in sorted(changes):
            n += changes[t]
            points.append([t, n])
        out[name] = points
    return out


def _steps(points: Sequence[Sequence], end: float) -> tuple[list, list]:
    """A step line's x and y through ``points`` (``[x, y]`` at each change, in order) up to ``end``; of equal x the
    last y holds."""
    xs, ys = [], []
    for x, y in points:
        if xs and xs[-1] == x:
            ys[-1] = y
            continue
        xs.append(x)
        ys.append(y)
    xs.append(max(end, xs[-1]))
    ys.append(ys[-1])
    return xs, ys


def _draw(axes, r: Run, records: Optional[Sequence[dict]], colour: str) -> list:
    """One run's panels (workers, per pool when named; goodput and arrival rate; requests waiting); returns its
    table row."""
    res = r.result
    good = res.get("goodput_over_time") or []
    queue = res.get("queue_over_time") or []
    end = max([w[0] for w in good + queue] + [e[0] for e in res.get("scale_events") or []]
              + [res["workers_over_time"][-1][0]])
    xs, ys = _steps(res["workers_over_time"], end)
    ax_w, ax_g, ax_q = axes
    pool = res.get("elastic_pool")  # a P/D fleet's scaled pool (dynlab.disagg.elastic)
    ax_w.step(xs, ys, where="post", color=colour, lw=1.5, label=f"live {pool} workers" if pool else "live workers")
    pools = replicas_per_pool(res)
    if len(pools) > 1:
        for k, (name, points) in enumerate(pools.items()):
            px, py = _steps(points, end)
            ax_w.step(px, py, where="post", color=COLOURS[(k + 1) % len(COLOURS)], lw=1, ls="--", label=name)
        ax_w.legend(fontsize=7)
    for t, kind, *_ in res.get("scale_events") or []:
        ax_w.axvline(t, color="#009E73" if kind == "add" else "#D55E00", lw=0.6, alpha=0.6)
    ax_w.set_ylabel(f"{r.label}\nworkers", fontsize=8)
    ax_w.set_ylim(0, max(ys) + 1)
    if good:
        ax_g.plot([w[0] for w in good], [w[1] for w in good], color=colour, lw=1, marker=".", ms=3, label="goodput")
        ax_g.set_ylim(-0.02, 1.02)
    ax_g.set_ylabel("goodput per window", fontsize=8)
    width = window_s(res)
    if records and width:
        rates = arrivals_per_s(records, width)
        twin = ax_g.twinx()
        twin.plot([w[0] for w in rates], [w[1] for w in rates], color="#999999", lw=1, label="arrivals/s")
        twin.set_ylabel("arrivals (requests/s)", fontsize=8)
    if queue:
        ax_q.step([w[0] for w in queue], [w[1] for w in queue], where="post", color=colour, lw=1)
    ax_q.set_title("requests waiting (mean per window)", fontsize=8)  # a y label would meet the arrivals' axis
    for ax in axes:
        ax.grid(alpha=0.3)
    return _row(r)


def _row(r: Run) -> list:
    """The table row of an autoscaled run."""
    res = r.result
    events = res.get("scale_events") or []
    adds = sum(1 for e in events if e[1] == "add")
    queue = [w[1] for w in res.get("queue_over_time") or []]
    return [r.label, max(w[1] for w in res["workers_over_time"]), adds, len(events) - adds, res.get("oscillations"),
            res.get("gpu_hours"), res.get("worst_window_goodput"), max(queue) if queue else None]


def fleet_over_time(runs: Sequence[Run], records: Optional[Mapping[str, Sequence[dict]]] = None) -> Optional[Figure]:
    """Live workers (a step line, per pool dashed when the workers name pools; scale decisions as vertical lines:
    green add, red retire), goodput per controller window (with the arrival rate per window when the run's records
    are given) and the requests waiting per window, a row per autoscaled
    run (the first :data:`MAX_RUNS`); the table gives every such run's peak workers, adds, retires, oscillations,
    GPU-hours, worst window and its window with the most requests waiting. ``None`` when no run has a controller's
    figures."""
    have = scaled(runs)
    if not have:
        return None
    plt = pyplot()
    drawn = have[:MAX_RUNS]
    fig, axes = plt.subplots(len(drawn), 3, figsize=(14, 2.3 * len(drawn) + 0.6), squeeze=False, sharex="row")
    rows = [_draw(ax_row, r, (records or {}).get(r.label), COLOURS[k % len(COLOURS)])
            for k, (r, ax_row) in enumerate(zip(drawn, axes))]
    rows += [_row(r) for r in have[MAX_RUNS:]]
    for ax in axes[-1]:
        ax.set_xlabel("time (s)")
    worst = min(have, key=lambda r: 1.0 if r.result.get("worst_window_goodput") is None
                else r.result["worst_window_goodput"])
    caption = ("Workers over time in each autoscaled run (a worker counts from when it is ready; per pool, dashed, "
               "when the fleet has pools; green lines mark add decisions, red retire decisions), the share of each "
               "controller window's requests that met the SLOs" + (" beside the arrival rate" if records else "")
               + ", and the mean number of requests waiting for their first scheduled step in each window. Worst "
               "window: "
               f"{worst.label} ({worst.result.get('worst_window_goodput')}).")
    header = ["run", "peak workers", "adds", "retires", "oscillations", "gpu_hours", "worst_window_goodput",
              "most requests waiting"]
    return Figure("scaling", "The fleet over time", caption, to_svg(fig, "scaling"), header, rows)
