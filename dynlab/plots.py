"""Plots (matplotlib, a dependency of dynlab), written atomically as PNG files."""
from __future__ import annotations

import os
from typing import Mapping

from dynlab.atomic import replace_file
from dynlab.errors import DynlabError


def pyplot():
    """``matplotlib.pyplot`` with the non-interactive Agg backend.

    Raises :class:`DynlabError` with the install command when matplotlib is missing (it is a
    dependency of dynlab, so only a broken installation lacks it).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DynlabError("plotting needs matplotlib, a dependency of dynlab missing from this environment: "
                          "pip install matplotlib") from None
    return plt


class PlotFormatError(DynlabError):
    """A plot path whose suffix names a format matplotlib cannot write (the CLI's usage error, exit 2)."""


def check_plot_path(path: str) -> str:
    """The plot format for ``path`` (its suffix, PNG when none); raises :class:`DynlabError`
    when matplotlib is missing, :class:`PlotFormatError` when it cannot write that format."""
    pyplot()
    from matplotlib.figure import Figure

    fmt = os.path.splitext(path)[1].lower().lstrip(".") or "png"
    supported = Figure().canvas.get_supported_filetypes()
    if fmt not in supported:
        raise PlotFormatError(f"{path}: cannot write a .{fmt} plot; use one of "
                          f"{', '.join('.' + k for k in sorted(supported))}")
    return fmt


def save(fig, path: str) -> None:
    """Save ``fig`` to ``path`` atomically, then close it. The format follows the suffix
    (``.png``, ``.pdf``, ``.svg``, ...; PNG when there is none).

    Raises :class:`DynlabError` for a suffix matplotlib cannot write, or a path that cannot be written.
    """
    plt = pyplot()
    try:
        fmt = check_plot_path(path)
        replace_file(path, lambda name: fig.savefig(name, format=fmt, dpi=110, bbox_inches="tight"),
                     suffix="." + fmt)
    finally:
        plt.close(fig)


def plot_compare(results: Mapping[str, Mapping], path: str, title: str = "") -> None:
    """Bar chart of ``block_hit_rate`` per run with the ``ideal_block_hit_rate`` bound as a line.

    ``results``: run label -> ``dynlab sim`` output. Runs without ``block_hit_rate``
    (the seed workload without ``--all-metrics``) plot ``hit_rate`` instead. With ``ttft_ms`` in the
    results (``--timing``), each run has a second bar, the engines' ``prefix_hit_rate`` (GPU and CPU
    tier hits: what a CPU tier moves, which the router's GPU-only ``block_hit_rate`` cannot), and a
    second panel shows p50/p90/p99 TTFT.
    """
    plt = pyplot()
    labels = list(results)
    metric = "block_hit_rate" if all("block_hit_rate" in r for r in results.values()) else "hit_rate"
    timing = all("ttft_ms" in r for r in results.values())
    fig, axes = plt.subplots(1, 2 if timing else 1, figsize=(10 if timing else 6, 4), squeeze=False)
    ax = axes[0][0]
    values = [results[k][metric] for k in labels]
    if timing and all("prefix_hit_rate" in r for r in results.values()):
        engine = [results[k]["prefix_hit_rate"] for k in labels]  # None: no request admitted (a "-" bar)
        xs = range(len(labels))
        bars = ax.bar([x - 0.2 for x in xs], values, 0.4, color="#4878a8", label="block hit rate (router, GPU)")
        ax.bar_label(bars, fmt="%.3f", fontsize=7)
        bars = ax.bar([x + 0.2 for x in xs], [0.0 if v is None else v for v in engine], 0.4, color="#dd8452",
                      label="prefix hit rate (engines, GPU+CPU)")
        ax.bar_label(bars, labels=["-" if v is None else f"{v:.3f}" for v in engine], fontsize=7)
        ax.set_xticks(xs, labels)
        values = values + [v for v in engine if v is not None]
        metric = "hit rate"
    else:
        bars = ax.bar(labels, values, color="#4878a8")
        ax.bar_label(bars, fmt="%.3f", fontsize=8)
    ideal = [r.get("ideal_block_hit_rate") for r in results.values()]
    if metric in ("block_hit_rate", "hit rate") and all(v is not None for v in ideal):
        ax.axhline(max(ideal), color="#c44e52", linestyle="--", label=f"ideal (one infinite cache) {max(ideal):.4f}")
    two = metric == "hit rate"
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left" if two else "lower right", fontsize=8)
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_ylim(0, max(values + [v or 0 for v in ideal] + [0.01]) * (1.5 if two else 1.15))
    ax.set_title(title or metric)
    ax.tick_params(axis="x", labelrotation=30)
    if timing:
        ax2 = axes[0][1]
        width = 0.27
        for j, p in enumerate(("p50", "p90", "p99")):
            xs = [i + (j - 1) * width for i in range(len(labels))]
            # a run with no TTFT sample (every request rejected: null) gets no bar
            ax2.bar(xs, [_or_nan(results[k]["ttft_ms"][p]) for k in labels], width, label=p)
        ax2.set_xticks(range(len(labels)), labels, rotation=30)
        ax2.set_ylabel("TTFT (ms)")
        ax2.set_yscale("log")
        ax2.set_title("time to first token")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path)


def _or_nan(value):
    """``value``, or NaN (no bar) for ``None``: a distribution with no sample."""
    return float("nan") if value is None else value
