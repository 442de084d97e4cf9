"""A sweep's figures: one metric over the grid's cells, as heatmaps (two numeric options varied), lines
(one) or bars (none), a panel per combination of the other varied options."""
from __future__ import annotations

import itertools
from typing import Optional, Sequence

from dynlab.report.figures import COLOURS, Figure, metric, pyplot, to_svg
from dynlab.report.runs import Run, cell_label

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


__all__ = ["sweep_figure", "sweep_metrics", "varied_axes", "cell_label"]
