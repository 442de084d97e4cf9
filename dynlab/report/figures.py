"""The report's figures from run results (what ``dynlab sim`` prints), drawn by matplotlib as SVG.

Each function returns a :class:`Figure` (or ``None`` when the runs lack its numbers): the SVG text to
inline, a caption that says in words what it shows, and the plotted numbers as a table, so that every
figure has an accessible text equivalent. Matplotlib is already a runtime dependency; its SVG needs no
script, is deterministic (``svg.hashsalt``, no date) and keeps text as text (``svg.fonttype: none``).
"""
from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from dynlab.report.runs import Run

PCTS = ("p50", "p90", "p99")
#: colour-blind-safe cycle (Okabe and Ito, "Color Universal Design", 2008)
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")


@dataclass
class Figure:
    """One figure: ``key`` (an HTML id), ``title``, ``caption`` (what it shows, in words), ``svg``
    (inline SVG text), ``header`` and ``rows`` (the plotted numbers as a table)."""

    key: str
    title: str
    caption: str
    svg: str
    header: list = field(default_factory=list)
    rows: list = field(default_factory=list)


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend (SVG is written by its own backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def to_svg(fig, salt: str) -> str:
    """The figure as an ``<svg>`` element (no XML prolog), with ids unique to ``salt``; closes ``fig``."""
    import matplotlib

    plt = pyplot()
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, flags=re.S)  # RDF about the file, not the figure
    return text[text.index("<svg"):]


def metric(result: dict, path: str) -> Optional[float]:
    """The number at dotted ``path`` (``ttft_ms.p99``) of a result, or ``None``."""
    value = result
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def latency_percentiles(runs: Sequence[Run]) -> Optional[Figure]:
    """TTFT and TPOT p50/p90/p99 per run (ms, log scale): grouped bars, from timed runs' summaries."""
    timed = [r for r in runs if metric(r.result, "ttft_ms.p50") is not None]
    if not timed:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / len(PCTS)
    rows = []
    for ax, name in zip(axes, ("ttft_ms", "tpot_ms")):
        for j, p in enumerate(PCTS):
            ys = [metric(r.result, f"{name}.{p}") or 0.0 for r in timed]
            ax.bar([i + (j - 1) * width for i in range(len(timed))], ys, width, label=p, color=COLOURS[j])
        ax.set_xticks(range(len(timed)), [r.label for r in timed], rotation=20, ha="right")
        values = [v for r in timed for p in PCTS if (v := metric(r.result, f"{name}.{p}"))]
        log = bool(values) and max(values) > 30 * min(values)
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(f"{name[:4].upper()} (ms{', log scale' if log else ''})")
        ax.grid(axis="y", alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), title="percentile", ncol=3, loc="lower center",
               bbox_to_anchor=(0.5, 0.98), fontsize=8)
    for r in timed:
        rows.append([r.label] + [metric(r.result, f"{n}.{p}") for n in ("ttft_ms", "tpot_ms") for p in PCTS])
    best = min(timed, key=lambda r: metric(r.result, "ttft_ms.p99") or float("inf"))
    caption = (f"Time to first token and time per output token at the 50th, 90th and 99th percentile, per run. "
               f"Shortest TTFT tail (p99): {best.label}, {metric(best.result, 'ttft_ms.p99')} ms.")
    header = ["run"] + [f"{n[:4]} {p} (ms)" for n in ("ttft", "tpot") for p in PCTS]
    return Figure("latency", "TTFT and TPOT percentiles per run", caption, to_svg(fig, "latency"), header, rows)


def hit_rates(runs: Sequence[Run]) -> Optional[Figure]:
    """Per run: the router's block hit rate, the engines' prefix hit rate split by tier (GPU, CPU; share of
    prompt blocks), and the ideal (one infinite cache) as a marker."""
    have = [r for r in runs if metric(r.result, "block_hit_rate") is not None]
    if not have:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(have) + 2), 3.6))
    rows = []
    seen: set = set()

    def once(label: str):  # a legend entry per kind, whichever run has it first
        if label in seen:
            return None
        seen.add(label)
        return label

    for i, r in enumerate(have):
        res = r.result
        block = metric(res, "block_hit_rate")
        prompt = metric(res, "prompt_blocks") or 0
        gpu, cpu = metric(res, "gpu_hit_blocks"), metric(res, "cpu_hit_blocks")
        tiers = (gpu / prompt, cpu / prompt) if prompt and gpu is not None and cpu is not None else None
        prefix = metric(res, "prefix_hit_rate")
        ax.bar(i - 0.2, block, 0.4, color=COLOURS[0], label=once("router: block hit rate"))
        if tiers is not None:
            ax.bar(i + 0.2, tiers[0], 0.4, color=COLOURS[2], label=once("engines: GPU tier"))
            ax.bar(i + 0.2, tiers[1], 0.4, bottom=tiers[0], color=COLOURS[1],
                   label=once("engines: CPU tier"))
        elif prefix is not None:
            ax.bar(i + 0.2, prefix, 0.4, color=COLOURS[2], label=once("engines: prefix hit rate"))
        ideal = metric(res, "ideal_block_hit_rate")
        if ideal is not None:
            ax.plot([i - 0.4, i + 0.4], [ideal, ideal], "k--", lw=1, label=once("ideal (one infinite cache)"))
        rows.append([r.label, block, prefix, None if tiers is None else round(tiers[0], 4),
                     None if tiers is None else round(tiers[1], 4), ideal])
    ax.set_xticks(range(len(have)), [r.label for r in have], rotation=20, ha="right")
    ax.set_ylabel("share of prompt blocks")
    ax.set_ylim(0, 1.0 if max(row[5] or row[1] or 0 for row in rows) > 0.5 else 0.5)
    fig.legend(fontsize=8, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 0.98))
    ax.grid(axis="y", alpha=0.3)
    best = max(have, key=lambda r: metric(r.result, "block_hit_rate"))
    caption = (f"Prefix hits per run: the router's block hit rate, the engines' prefix hit rate by tier, and the "
               f"ideal of one infinite cache (dashed). Most hits: {best.label} "
               f"({metric(best.result, 'block_hit_rate')}).")
    header = ["run", "block_hit_rate", "prefix_hit_rate", "GPU tier", "CPU tier", "ideal"]
    return Figure("hits", "Prefix and tier hit rates", caption, to_svg(fig, "hits"), header, rows)


def per_worker(runs: Sequence[Run]) -> Optional[Figure]:
    """Per worker and run: requests routed to it and its mean KV usage (share of its pool); a line per run."""
    have = [r for r in runs if isinstance(r.result.get("requests_per_worker"), list)]
    if not have:
        return None
    plt = pyplot()
    usage = any(isinstance(r.result.get("mean_kv_usage"), list) for r in have)
    fig, axes = plt.subplots(1, 2 if usage else 1, figsize=(10 if usage else 5.5, 3.4), squeeze=False)
    rows = []
    for k, r in enumerate(have):
        style = dict(color=COLOURS[k % len(COLOURS)], marker="o", ms=3, label=r.label)
        reqs = r.result["requests_per_worker"]
        axes[0][0].plot(range(len(reqs)), reqs, **style)
        kv = r.result.get("mean_kv_usage") or []
        if usage and kv:
            axes[0][1].plot(range(len(kv)), kv, **style)
        rows.append([r.label, metric(r.result, "load_imbalance"), min(reqs, default=None), max(reqs, default=None),
                     max(kv, default=None)])
    axes[0][0].set_xlabel("worker")
    axes[0][0].set_ylabel("requests routed")
    axes[0][0].legend(fontsize=8)
    if usage:
        axes[0][1].set_xlabel("worker")
        axes[0][1].set_ylabel("mean KV usage (share of pool)")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    worst = max(have, key=lambda r: metric(r.result, "load_imbalance") or 0)
    caption = (f"Requests routed to each worker{' and its mean KV usage' if usage else ''}, a line per run. Most "
               f"uneven: {worst.label} (imbalance {metric(worst.result, 'load_imbalance')}, busiest worker's "
               "requests over the mean).")
    header = ["run", "imbalance", "fewest requests", "most requests", "highest mean KV usage"]
    return Figure("workers", "Per-worker load", caption, to_svg(fig, "workers"), header, rows)
