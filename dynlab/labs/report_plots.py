"""The plots of ``dynlab reproduce``: capacity cliffs, the strategy comparison, bounded vs unbounded hits.

Each function takes the JSON objects exactly as the commands print them and writes one PNG through
:func:`dynlab.plots.save` (a temporary file renamed into place). They need matplotlib (a dependency);
without it :func:`dynlab.plots.pyplot` raises :class:`~dynlab.errors.DynlabError`.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from dynlab.plots import pyplot, save

__all__ = ["plot_cliff", "plot_strategies", "plot_bounded"]

_BLUE = "#4878a8"
_RED = "#c44e52"
_GREEN = "#55a868"
_GREY = "#8c8c8c"
_ORANGE = "#dd8452"


def plot_cliff(
    sweep: Mapping[str, int],
    path: str,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    mark: Optional[int] = None,
    mark_label: str = "",
    fixed_note: str = "",
) -> None:
    """Line of one number of the last pass against a swept capacity (``dynlab cliff`` output).

    ``sweep``: ``{"capacity as written": value}``; the keys are read as integers (tokens).
    ``mark``: a capacity drawn as a dashed vertical line (the documents' total size), labelled
    ``mark_label``. ``fixed_note``: a line of text under the title (the other tier's capacity).
    """
    plt = pyplot()
    xs = [int(k) for k in sweep]
    ys = [sweep[k] for k in sweep]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot(xs, ys, color=_BLUE, marker="o", linewidth=1.6)
    for x, y, label in zip(xs, ys, sweep):
        ax.annotate(f"{label}: {y}", (x, y), textcoords="offset points", xytext=(4, 6), fontsize=7,
                    rotation=30, color="#333333")
    if mark is not None:
        ax.axvline(mark, color=_RED, linestyle="--", linewidth=1.2, label=mark_label or str(mark))
        ax.legend(loc="center left", fontsize=8)
    top = max(ys + [1])
    ax.set_ylim(-0.5, top * 1.3 + 0.5)
    ax.set_xlim(min(xs + [0]) - 1000, max(xs + [mark or 0]) * 1.12)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title + (f"\n{fixed_note}" if fixed_note else ""), fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, path)


def _bar_labels(ax, bars, values: Sequence[int], total: int) -> None:
    for bar, value in zip(bars, values):
        ax.annotate(f"{value}/{total}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7)


def plot_strategies(modes: Mapping[str, Mapping], events: Mapping[str, Mapping], path: str) -> None:
    """Bars of hits (of the repeat requests) per strategy: ``modes`` then kv-events per ``publish``.

    ``modes``: ``dynlab compare --modes ...`` output; ``events``: ``dynlab compare --mode kv-events
    --publish yes,no`` output. A dashed line marks the number of repeat requests (every repeat hit).
    """
    plt = pyplot()
    labels, values, colors = [], [], []
    for name, result in modes.items():
        labels.append(name)
        values.append(result["hits"])
        colors.append(_BLUE)
    for publish, result in events.items():
        labels.append(f"kv-events\npublish {publish}")
        values.append(result["hits"])
        colors.append(_GREEN if publish == "yes" else _ORANGE)
    totals = [r["repeat_requests"] for r in list(modes.values()) + list(events.values())]
    total = max(totals) if totals else 0
    fig, ax = plt.subplots(figsize=(7, 3.8))
    bars = ax.bar(labels, values, color=colors)
    _bar_labels(ax, bars, values, total)
    ax.axhline(total, color=_GREY, linestyle="--", linewidth=1, label=f"every repeat request ({total})")
    ax.set_ylim(0, total * 1.18 if total else 1)
    ax.set_ylabel("hits (repeat requests sent to a worker holding the prefix)", fontsize=8)
    ax.set_title("Lab 000 workload, unbounded worker caches: hits per strategy", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    save(fig, path)


def plot_bounded(
    bounded: Mapping[str, Mapping[str, Mapping]],
    path: str,
    bands: Optional[Mapping[str, tuple[int, int]]] = None,
) -> None:
    """Grouped bars of hits per strategy, one bar per worker capacity (``bounded.json``).

    ``bounded``: ``{capacity label: dynlab compare output keyed by strategy}``. ``bands``:
    ``{strategy: (low, high)}`` measured ranges drawn as shaded horizontal bands for reference.
    """
    plt = pyplot()
    capacities = list(bounded)
    strategies: list[str] = []
    for runs in bounded.values():
        strategies.extend(s for s in runs if s not in strategies)
    total = max((r["repeat_requests"] for runs in bounded.values() for r in runs.values()), default=0)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    band_colors = {"rr": _BLUE, "kv": _GREEN}
    for name, (low, high) in (bands or {}).items():
        ax.axhspan(low, high, color=band_colors.get(name, _GREY), alpha=0.15, zorder=0,
                   label=f"lab-measured {name}: {low}-{high} of {total}")
    width = 0.8 / max(len(capacities), 1)
    palette = ["#4c4c4c", _BLUE, "#9ecae1", _ORANGE, _GREEN]
    for j, cap in enumerate(capacities):
        xs = [i + (j - (len(capacities) - 1) / 2) * width for i in range(len(strategies))]
        values = [bounded[cap].get(s, {}).get("hits", 0) for s in strategies]
        label = "unbounded" if cap == "unbounded" else f"capacity {cap} blocks/worker"
        bars = ax.bar(xs, values, width, label=label, color=palette[j % len(palette)], zorder=2)
        _bar_labels(ax, bars, values, total)
    ax.set_xticks(range(len(strategies)), strategies)
    ax.set_ylim(0, total * 1.2 if total else 1)
    ax.set_ylabel("hits of the repeat requests")
    ax.set_title("Lab 000 workload: bounded (LRU) vs unbounded worker caches", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    fig.tight_layout()
    save(fig, path)
