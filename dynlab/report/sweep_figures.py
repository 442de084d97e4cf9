"""A sweep's figures: one metric over the grid's cells, as heatmaps (two numeric options varied), lines
(one) or bars (none), a panel per combination of the other varied options; and, for a closed-loop sweep
(cells with a ``concurrency``), the throughput-per-GPU against interactivity frontier (:func:`frontier_figure`)."""
from __future__ import annotations

import itertools
from typing import Optional, Sequence

from dynlab.report.figures import COLOURS, Figure, metric, pyplot, to_svg
from dynlab.report.runs import Run, cell_label, shared_and_varied

MAX_PANELS = 6


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def varied_axes(cells: Sequence[dict]) -> tuple[list[str], list[str]]:
    """``(numeric, other)``: the option names whose value differs between cells, numbers first."""
    names = list(dict.fromkeys(k for c in cells for k in c))
    varied = [n for n in names if len({repr(c.get(n)) for c in cells}) > 1]
    numeric = [n for n in varied if all(_is_number(c.get(n)) for c in cells)]
    return numeric, [n for n in varied if n not in numeric]


def sweep_metrics(runs: Sequence[Run]) -> list[str]:
    """The metrics a sweep report draws: the hit rate (``block_hit_rate``, else ``hit_rate``) and, for timed
    cells, ``ttft_ms.p99``."""
    hit = "block_hit_rate" if any(metric(r.result, "block_hit_rate") is not None for r in runs) else "hit_rate"
    return [hit] + (["ttft_ms.p99"] if any(metric(r.result, "ttft_ms.p99") is not None for r in runs) else [])


def sweep_figure(runs: Sequence[Run], name: str) -> Optional[Figure]:
    """``name`` (a dotted metric path) over the sweep's cells; ``None`` without cells or values."""
    cells = [r for r in runs if r.cell is not None and metric(r.result, name) is not None]
    if len(cells) < 2:
        return None
    numeric, other = varied_axes([r.cell for r in cells])
    xy = numeric[:2]
    series_axes = other + numeric[2:]
    combos = list(dict.fromkeys(tuple(repr(r.cell.get(a)) for a in series_axes) for r in cells))[:MAX_PANELS]
    groups = [[r for r in cells if tuple(repr(r.cell.get(a)) for a in series_axes) == c] for c in combos]
    labels = [" ".join(f"{a}={r[0].cell.get(a)}" for a in series_axes) or name for r in groups]
    plt = pyplot()
    if len(xy) == 2:
        fig = _heatmaps(plt, groups, labels, xy, name)
        shape = f"a heatmap of {xy[0]} by {xy[1]}"
    elif len(xy) == 1:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for k, (g, label) in enumerate(zip(groups, labels)):
            g = sorted(g, key=lambda r: r.cell[xy[0]])
            ax.plot([r.cell[xy[0]] for r in g], [metric(r.result, name) for r in g], marker="o",
                    color=COLOURS[k % len(COLOURS)], label=label)
        ax.set_xlabel(xy[0])
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        shape = f"a line over {xy[0]}"
    else:
        fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(cells) + 2), 3.6))
        ax.bar(range(len(cells)), [metric(r.result, name) for r in cells], color=COLOURS[0])
        ax.set_xticks(range(len(cells)), [r.label for r in cells], rotation=30, ha="right")
        ax.set_ylabel(name)
        shape = "a bar per cell"
    best = (min if name.startswith(("ttft", "tpot", "e2e")) else max)(cells, key=lambda r: metric(r.result, name))
    caption = (f"{name} over the sweep's {len(cells)} cells, {shape}"
               f"{', a panel per ' + ', '.join(series_axes) if series_axes and len(xy) == 2 else ''}. "
               f"Best cell: {best.label} ({metric(best.result, name)}).")
    rows = [[r.label, metric(r.result, name)] for r in cells]
    key = "sweep-" + name.replace(".", "-").replace("_", "-")
    return Figure(key, f"Sweep: {name}", caption, to_svg(fig, key), ["cell", name], rows)


#: the option along a frontier's lines: a closed-loop sweep's users (``--concurrency``)
ALONG = "concurrency"


def frontier_figure(runs: Sequence[Run]) -> Optional[Figure]:
    """A closed-loop sweep's frontier, as ``sweep --plot`` draws it (:func:`dynlab.sweep.plots.frontier_series`):
    tokens/s per GPU against interactivity p50, a line per combination of the other varied options through its
    cells in the order of their concurrency, each point labelled with it. ``None`` unless at least two cells
    with a ``concurrency`` option have both numbers (an open-loop sweep has none)."""
    from dynlab.sweep.plots import FRONTIER_METRICS, frontier_series, plot_frontier

    closed = [r for r in runs if r.cell is not None and r.cell.get(ALONG) is not None]
    if sum(all(metric(r.result, m) is not None for m in FRONTIER_METRICS) for r in closed) < 2:
        return None
    _, varied = shared_and_varied([r.cell for r in closed])
    series_names = [n for n in varied if n != ALONG]
    ordered = sorted(closed, key=lambda r: (not _is_number(r.cell[ALONG]), r.cell[ALONG] if _is_number(r.cell[ALONG])
                                            else 0, repr(r.cell[ALONG])))
    curves = frontier_series([(r.cell, r.result) for r in ordered], ALONG, series_names)
    plt = pyplot()
    fig = plot_frontier(plt, curves, ALONG, figsize=(6.4, 4.2))
    rows = [[label or "-", c, x, y] for label, points in curves for x, y, c in points]
    best = max(rows, key=lambda row: row[3])
    fastest = max(rows, key=lambda row: row[2])
    series = ("one line" if not series_names else f"a line per {series_names[0]}" if len(series_names) == 1
              else f"a line per combination of {', '.join(series_names[:-1])} and {series_names[-1]}")
    caption = (f"Tokens per second per GPU (input and output) against interactivity p50 (tokens per second per user, "
               f"1000 / TPOT) over the sweep's {len(rows)} closed-loop cells, {series} through its cells "
               f"in the order of their concurrency (each point labelled with it). Most tokens/s per GPU: "
               f"{_where(best, series_names)} ({best[3]}); most tokens/s per user: {_where(fastest, series_names)} "
               f"({fastest[2]}).")
    header = ["series", ALONG, "interactivity p50 (tokens/s per user)", "tokens/s per GPU"]
    return Figure("sweep-frontier", "Sweep: throughput per GPU against interactivity", caption,
                  to_svg(fig, "sweep-frontier"), header, rows)


def _where(row, series_names) -> str:
    return f"{row[0]} at {ALONG} {row[1]}" if series_names else f"{ALONG} {row[1]}"


def _heatmaps(plt, groups, labels, xy, name):
    xs = sorted({r.cell[xy[0]] for g in groups for r in g})
    ys = sorted({r.cell[xy[1]] for g in groups for r in g})
    values = [metric(r.result, name) for g in groups for r in g]
    lo, hi = min(values), max(values)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.8 * len(groups) + 1, 3.4), squeeze=False,
                             layout="constrained")
    image = None
    for ax, g, label in zip(axes[0], groups, labels):
        grid = [[float("nan")] * len(xs) for _ in ys]
        for r in g:
            grid[ys.index(r.cell[xy[1]])][xs.index(r.cell[xy[0]])] = metric(r.result, name)
        image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis", vmin=lo, vmax=hi if hi > lo else lo + 1)
        for (j, i) in itertools.product(range(len(ys)), range(len(xs))):
            v = grid[j][i]
            if v == v:
                ax.text(i, j, f"{v:.4g}", ha="center", va="center", fontsize=7,
                        color="white" if hi > lo and v < (lo + hi) / 2 else "black")
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.set_yticks(range(len(ys)), [str(y) for y in ys])
        ax.set_xlabel(xy[0])
        ax.set_ylabel(xy[1])
        ax.set_title(label, fontsize=9)
    fig.colorbar(image, ax=list(axes[0]), label=name)
    return fig


__all__ = ["frontier_figure", "sweep_figure", "sweep_metrics", "varied_axes", "cell_label"]
