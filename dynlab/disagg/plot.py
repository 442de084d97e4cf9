"""The plot of a split comparison (``dynlab compare --split ... --plot``): aggregated vs disaggregated."""
from __future__ import annotations

from typing import Mapping

from dynlab.plots import pyplot, save


def plot_split(results: Mapping[str, Mapping], path: str, title: str = "") -> None:
    """Four panels, one bar per split (``results``: split label -> a timed ``dynlab sim`` output):
    TTFT p50/p99 (ms, log scale), TPOT p50/p99 (ms), goodput (when SLOs were given, else the share
    of requests that finished), and output tokens/s per GPU. A P/D run's bar is hatched with its
    p50 transfer time written above the TTFT bars. Written atomically (:func:`dynlab.plots.save`)."""
    plt = pyplot()
    labels = list(results)
    xs = range(len(labels))
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.8))
    width = 0.38
    colors = ["#4878a8" if "transfer_ms" not in results[k] else "#dd8452" for k in labels]
    for ax, key, unit, log in ((axes[0], "ttft_ms", "TTFT (ms)", True), (axes[1], "tpot_ms", "TPOT (ms)", False)):
        for j, p in enumerate(("p50", "p99")):
            vals = [results[k][key][p] for k in labels]
            ax.bar([x + (j - 0.5) * width for x in xs], vals, width, color=colors, alpha=1.0 if j == 0 else 0.55,
                   edgecolor="black", linewidth=0.4, label=p)
        ax.set_xticks(list(xs), labels)
        ax.set_ylabel(unit)
        if log:
            ax.set_yscale("log")
        ax.set_title(f"{unit.split()[0]} p50 (solid) / p99 (light)", fontsize=9)
    for k, x in zip(labels, xs):
        if "transfer_ms" in results[k]:
            axes[0].annotate(f"xfer {results[k]['transfer_ms']['p50']} ms", (x, results[k]["ttft_ms"]["p99"]),
                             ha="center", va="bottom", fontsize=7)
    if all("goodput" in r for r in results.values()):
        good, name = [results[k]["goodput"] for k in labels], "goodput (TTFT and TPOT SLOs met)"
    else:
        good, name = [1 - results[k]["rejected"] / max(results[k]["requests"], 1) for k in labels], "served share"
    bars = axes[2].bar(list(xs), good, color=colors)
    axes[2].bar_label(bars, fmt="%.3f", fontsize=8)
    axes[2].set_ylim(0, 1.1)
    axes[2].set_title(name, fontsize=9)
    axes[2].set_xticks(list(xs), labels)
    tput = [results[k].get("output_tokens_per_s_per_gpu", 0.0) for k in labels]
    bars = axes[3].bar(list(xs), tput, color=colors)
    axes[3].bar_label(bars, fmt="%.0f", fontsize=8)
    axes[3].set_title("output tokens/s per GPU", fontsize=9)
    axes[3].set_xticks(list(xs), labels)
    for ax in axes:
        ax.set_xlabel("split P:D (blue aggregated, orange disaggregated)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)
