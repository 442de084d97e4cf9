"""The report's figures from per-request records (``sim --requests-out``, see :mod:`dynlab.report.runs`):
TTFT and TPOT CDFs, per-worker load over time, preemptions and rejections over time, the P/D transfer
timeline. ``records`` maps a label (a run) to its list of records; times are ms."""
from __future__ import annotations

import bisect
from typing import Mapping, Optional, Sequence

from dynlab.report.figures import COLOURS, Figure, pyplot, to_svg

#: points drawn per CDF and per time series (the table gives exact percentiles)
POINTS = 400
TABLE_PCTS = (50, 90, 99, 99.9)
#: workers drawn as separate lines of the load figure (more: the busiest ones)
MAX_WORKER_LINES = 8


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted values, linearly interpolated (numpy's default, type 7)."""
    if not sorted_values:
        raise ValueError("no values")
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def ttft_values(records: Sequence[dict]) -> list[float]:
    """TTFT (ms) of every served request: ``first_token_ms - arrival_ms``, sorted (engine times: no front end,
    no detokenisation; :class:`dynlab.engine.metrics.ServingMetrics` adds them to the run's ``ttft_ms``)."""
    return sorted(r["first_token_ms"] - r["arrival_ms"] for r in records
                  if not r["rejected"] and r["first_token_ms"] is not None and r["arrival_ms"] is not None)


def tpot_values(records: Sequence[dict]) -> list[float]:
    """TPOT (ms) of every served request with 2+ output tokens: ``(finish - first token) / (output - 1)``, sorted."""
    return sorted((r["finish_ms"] - r["first_token_ms"]) / (r["output_length"] - 1) for r in records
                  if not r["rejected"] and r["output_length"] > 1 and r["finish_ms"] is not None
                  and r["first_token_ms"] is not None)


def cdfs(records: Mapping[str, Sequence[dict]]) -> Optional[Figure]:
    """TTFT and TPOT CDFs, a line per run (x in ms, log scale)."""
    series = {label: (ttft_values(recs), tpot_values(recs)) for label, recs in records.items()}
    if not any(t for t, _ in series.values()):
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    rows = []
    for k, (label, pair) in enumerate(series.items()):
        for ax, values in zip(axes, pair):
            if values:
                n = len(values)
                qs = [i / (POINTS - 1) for i in range(POINTS)] if n > POINTS else [(i + 1) / n for i in range(n)]
                xs = [quantile(values, q) for q in qs] if n > POINTS else values
                ax.step([max(x, 1e-3) for x in xs], qs, where="post", color=COLOURS[k % len(COLOURS)], label=label)
        for name, values in zip(("TTFT", "TPOT"), pair):
            rows.append([label, name, len(values)] + [round(quantile(values, p / 100), 1) if values else None
                                                      for p in TABLE_PCTS])
    for ax, name in zip(axes, ("TTFT (ms, log scale)", "TPOT (ms, log scale)")):
        ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    caption = ("Cumulative distributions of time to first token and time per output token over every served "
               "request, a line per run; the table gives the percentiles. Engine times, as the --requests-out "
               "records give them: without the server's front end and detokenisation (--request-overhead-ms, "
               "--detok-us-per-token), which the run's own TTFT and TPOT figures include.")
    header = ["run", "metric", "requests"] + [f"p{p:g} (ms)" for p in TABLE_PCTS]
    return Figure("cdf", "TTFT and TPOT distributions (CDF)", caption, to_svg(fig, "cdf"), header, rows)


def _grid(records: Sequence[dict]) -> list[float]:
    ends = [r["finish_ms"] for r in records if r["finish_ms"] is not None]
    start = min(r["arrival_ms"] for r in records)
    end = max(ends + [start + 1.0])
    return [start + (end - start) * i / (POINTS - 1) for i in range(POINTS)]


def in_flight(starts: Sequence[float], ends: Sequence[float], times: Sequence[float]) -> list[int]:
    """How many spans ``[start, end)`` contain each time: ``#starts <= t - #ends <= t``."""
    s, e = sorted(starts), sorted(ends)
    return [bisect.bisect_right(s, t) - bisect.bisect_right(e, t) for t in times]


def worker_load(records: Mapping[str, Sequence[dict]]) -> Optional[Figure]:
    """Requests in flight (arrived, not finished) per worker over time, for the first run with records
    (the busiest :data:`MAX_WORKER_LINES` workers when there are more)."""
    label, recs = next(iter(records.items()))
    served = [r for r in recs if not r["rejected"] and r["finish_ms"] is not None]
    if not served:
        return None
    times = _grid(served)
    workers: dict = {}
    for r in served:
        workers.setdefault(r["worker"], []).append(r)
    load = {w: in_flight([r["arrival_ms"] for r in rs], [r["finish_ms"] for r in rs], times)
            for w, rs in workers.items()}
    shown = sorted(load, key=lambda w: -max(load[w]))[:MAX_WORKER_LINES]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.4))
    secs = [t / 1000 for t in times]
    for k, w in enumerate(sorted(shown, key=str)):
        ax.plot(secs, load[w], color=COLOURS[k % len(COLOURS)], lw=1, label=f"worker {w}")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests in flight")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=4)
    rows = [[w, len(workers[w]), max(load[w]), round(sum(load[w]) / len(times), 2)] for w in sorted(load, key=str)]
    caption = (f"Requests in flight on each worker over time ({label}; {len(shown)} of {len(load)} workers drawn, "
               "the busiest); the table lists every worker.")
    return Figure("load", "Per-worker load over time", caption, to_svg(fig, "load"),
                  ["worker", "requests", "peak in flight", "mean in flight"], rows)


def trouble(records: Mapping[str, Sequence[dict]]) -> Optional[Figure]:
    """Cumulative preemptions (counted at each request's finish) and rejections (at arrival) over time."""
    rows, curves = [], []
    for label, recs in records.items():
        pre = sorted((r["finish_ms"], r["preemptions"]) for r in recs if r["preemptions"] and r["finish_ms"] is not None)
        rej = sorted(r["arrival_ms"] for r in recs if r["rejected"])
        rows.append([label, sum(p for _, p in pre), len(rej)])
        curves.append((label, pre, rej))
    if not any(row[1] or row[2] for row in rows):
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for k, (label, pre, rej) in enumerate(curves):
        colour = COLOURS[k % len(COLOURS)]
        if pre:
            total, xs, ys = 0, [], []
            for t, p in pre:
                total += p
                xs.append(t / 1000)
                ys.append(total)
            ax.step(xs, ys, where="post", color=colour, label=f"{label}: preemptions")
        if rej:
            ax.step([t / 1000 for t in rej], range(1, len(rej) + 1), where="post", color=colour, ls="--",
                    label=f"{label}: rejections")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("cumulative count")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    caption = "Preemptions (at the preempted request's finish) and rejected requests (at arrival), cumulative."
    return Figure("trouble", "Preemptions and rejections over time", caption, to_svg(fig, "trouble"),
                  ["run", "preemptions", "rejections"], rows)


def transfers(records: Mapping[str, Sequence[dict]]) -> Optional[Figure]:
    """P/D: KV transfers in flight over time, and each transfer's duration against its start (ms)."""
    label, recs = next(((lb, rs) for lb, rs in records.items()
                        if any(r.get("transfer_start_ms") is not None for r in rs)), (None, None))
    if label is None:
        return None
    spans = sorted((r["transfer_start_ms"], r["transfer_end_ms"]) for r in recs
                   if r.get("transfer_start_ms") is not None and r.get("transfer_end_ms") is not None)
    times = [spans[0][0] + (spans[-1][1] - spans[0][0]) * i / (POINTS - 1) for i in range(POINTS)]
    flight = in_flight([s for s, _ in spans], [e for _, e in spans], times)
    durations = sorted(e - s for s, e in spans)
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    a.plot([t / 1000 for t in times], flight, color=COLOURS[0], lw=1)
    a.set_xlabel("time (s)")
    a.set_ylabel("transfers in flight")
    step = max(1, len(spans) // 2000)
    b.scatter([s / 1000 for s, _ in spans[::step]], [e - s for s, e in spans[::step]], s=3, color=COLOURS[3])
    b.set_xlabel("transfer start (s)")
    b.set_ylabel("transfer duration (ms)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    rows = [[label, len(spans), max(flight)] + [round(quantile(durations, p / 100), 1) for p in TABLE_PCTS]]
    caption = (f"The KV transfers from prefill to decode workers ({label}): how many are in flight over time, "
               "and each one's duration by its start time.")
    return Figure("transfers", "P/D transfer timeline", caption, to_svg(fig, "transfers"),
                  ["run", "transfers", "peak in flight"] + [f"duration p{p:g} (ms)" for p in TABLE_PCTS], rows)


def record_figures(records: Mapping[str, Sequence[dict]]) -> list[Figure]:
    """Every figure the records allow, in report order."""
    if not records:
        return []
    return [f for f in (cdfs(records), worker_load(records), trouble(records), transfers(records)) if f]
