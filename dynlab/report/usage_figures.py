"""The report's figure of per-worker KV usage and load over time, from the bounded series that
:class:`dynlab.sim.recorders.UsageRecorder` keeps during a timed run (``--report`` on ``sim`` and
``compare``; the run files alone do not hold it, so ``dynlab report RUN.json`` cannot draw it).

``usage`` maps a run's label to :meth:`UsageRecorder.series() <dynlab.sim.recorders.UsageRecorder.series>`:
``{"bin_ms", "origin_ms", "workers": [{"worker", "kv_usage", "load"}]}`` (KV usage a share of the pool,
0..1; load in requests in the batch; both time-weighted means per bin of ``bin_ms`` ms).
"""
from __future__ import annotations

from typing import Mapping, Optional

from dynlab.report.figures import COLOURS, Figure, pyplot, to_svg

#: runs drawn (a row of two panels each); the table lists every run
MAX_RUNS = 6
#: workers drawn as lines per panel (more: those with the highest peak KV usage)
MAX_LINES = 8


def _drawn(workers: list) -> list:
    """The workers drawn: all up to :data:`MAX_LINES`, else those with the highest peak KV usage."""
    if len(workers) <= MAX_LINES:
        return workers
    top = sorted(workers, key=lambda w: -max(w["kv_usage"], default=0.0))[:MAX_LINES]
    return sorted(top, key=lambda w: w["worker"])


def usage_over_time(usage: Mapping[str, dict]) -> Optional[Figure]:
    """KV usage (share of the pool) and load (requests in the batch) per worker over time: a row of two
    panels per run (the first :data:`MAX_RUNS`), a line per worker; the table gives every run's workers'
    mean and peak bin. ``None`` when no run has a non-empty series."""
    runs = [(label, s) for label, s in usage.items() if s.get("workers") and s["workers"][0]["kv_usage"]]
    if not runs:
        return None
    plt = pyplot()
    drawn = runs[:MAX_RUNS]
    fig, axes = plt.subplots(len(drawn), 2, figsize=(10, 2.3 * len(drawn) + 0.6), squeeze=False, sharex="col")
    rows = []
    for (label, s), (ax_kv, ax_load) in zip(drawn, axes):
        width = s["bin_ms"]
        for k, w in enumerate(_drawn(s["workers"])):
            xs = [(s["origin_ms"] + (i + 0.5) * width) / 1000 for i in range(len(w["kv_usage"]))]
            style = dict(color=COLOURS[k % len(COLOURS)], lw=1, label=f"worker {w['worker']}")
            ax_kv.plot(xs, w["kv_usage"], **style)
            ax_load.plot(xs, w["load"], **style)
        ax_kv.set_ylabel(f"{label}\nKV usage", fontsize=8)
        ax_load.set_ylabel("requests in batch", fontsize=8)
        ax_kv.set_ylim(0, 1.02)
        for ax in (ax_kv, ax_load):
            ax.grid(alpha=0.3)
    for (label, s) in runs:
        for w in s["workers"]:
            kv, load = w["kv_usage"], w["load"]
            rows.append([label, w["worker"], round(sum(kv) / len(kv), 4), max(kv), round(sum(load) / len(load), 2),
                         max(load)])
    axes[-1][0].set_xlabel("time (s)")
    axes[-1][1].set_xlabel("time (s)")
    axes[0][0].legend(fontsize=7, ncol=4, loc="upper left")
    fullest = max(rows, key=lambda row: row[3])
    caption = (f"KV usage (blocks held by running requests, share of the worker's pool) and load (requests in "
               f"its batch) of each worker over time, a row per run{'' if len(runs) <= MAX_RUNS else f' (the first {MAX_RUNS} of {len(runs)})'}"
               f"; time-weighted means over bins of {runs[0][1]['bin_ms'] / 1000:g} s. "
               f"Fullest: {fullest[0]}, worker {fullest[1]} (peak bin {fullest[3]:.0%} of its pool).")
    header = ["run", "worker", "mean KV usage", "peak KV usage (bin)", "mean requests in batch",
              "peak requests in batch (bin)"]
    return Figure("usage", "Per-worker KV usage and load over time", caption, to_svg(fig, "usage"), header, rows)
