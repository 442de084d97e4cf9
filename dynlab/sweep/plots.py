"""Plots of a sweep: a line per series over one numeric option, or a heatmap per series over two."""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from dynlab.sweep.grid import Axis, Grid, GridError, cell_key
from dynlab.sweep.results import metric_value


def _is_numeric_axis(axis: Axis) -> bool:
    vals = [v for v in axis.values if v is not None]
    return bool(vals) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)


def plot_layout(grid: Grid) -> tuple[list[Axis], list[Axis]]:
    """``(numeric axes, series axes)`` of a sweep plot; raises :class:`GridError` when it cannot be drawn.

    The numeric axes are the varied options whose values are all numbers (or null,
    e.g. ``capacity=unbounded``): one gives a line plot, two a heatmap. The other
    varied options (``mode``, ``policy``, ...) make the series: one line, or one
    heatmap panel, per combination.
    """
    varied = grid.varied()
    numeric = [a for a in varied if _is_numeric_axis(a)]
    if not 1 <= len(numeric) <= 2:
        names = ", ".join(a.name for a in numeric) or "none"
        raise GridError("--plot needs one or two varied numeric options (a line or a heatmap per strategy); "
                        f"varied numeric options: {names}")
    return numeric, [a for a in varied if a not in numeric]


#: the ``--metric`` of the throughput-interactivity frontier: tokens/s per GPU against tokens/s per user
FRONTIER = "frontier"
#: the two figures a frontier plots, (x, y): a closed-loop run's (dynlab.sim.benchmark)
FRONTIER_METRICS = ("interactivity.p50", "tokens_per_s_per_gpu")


def _compact(v: float) -> str:
    """A short label for a heatmap cell: three significant digits, k and M for large values."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if a >= 1e3:
        return f"{v:.0f}"
    return f"{v:.3g}"


def plot_sweep(grid: Grid, results: Mapping[str, Mapping[str, Any]], path: str, metric: str) -> None:
    """Plot ``metric`` (a dotted path into each result) over the grid, as a PNG at ``path``.

    ``results``: :func:`cell_key` -> result for the grid's cells (missing cells are
    left blank). One varied numeric option: a line per series (strategy) against it.
    ``metric`` ``frontier`` (:data:`FRONTIER`): the curve InferenceX and vendor reports draw,
    tokens per second per GPU (y: ``tokens_per_s_per_gpu``, input and output) against tokens per
    second per user (x: ``interactivity.p50``, 1000 / TPOT), a line per series through its cells in the
    numeric option's order (each point labelled with its value, e.g. the concurrency): :func:`frontier_series`, :func:`plot_frontier`.
    Two: a heatmap per series, the first option across and the second down, all
    panels on one colour scale (logarithmic when the values span more than a factor
    of 100), each cell labelled with its value. Needs matplotlib
    (matplotlib); raises :class:`GridError` when the layout cannot be drawn.
    """
    from dynlab.plots import pyplot, save

    numeric, series_axes = plot_layout(grid)
    plt = pyplot()
    series = list(itertools.product(*(range(len(a.values)) for a in series_axes)))
    labels = [_series_label(series_axes, combo) for combo in series]
    if metric == FRONTIER:
        if len(numeric) != 1:
            raise GridError("--metric frontier needs one varied numeric option (a point per value, e.g. concurrency)")
        axes = {a.name: a for a in (*numeric, *series_axes)}
        pairs = [(cell, results.get(cell_key(cell))) for cell in grid.cells()]
        curves = frontier_series(pairs, numeric[0].name, [a.name for a in series_axes],
                                 lambda name, v: axes[name].label(axes[name].values.index(v)))
        save(plot_frontier(plt, curves, numeric[0].name), path)
        return
    value_at = _metric_table(grid, results, metric, numeric, series_axes)
    if len(numeric) == 1:
        fig = _plot_lines(plt, numeric[0], series, labels, value_at, metric)
    else:
        fig = _plot_heatmaps(plt, numeric, series, labels, value_at, metric)
    save(fig, path)


def _series_label(series_axes: Sequence[Axis], combo: tuple) -> str:
    """A series' legend or panel title: its strategy, and ``name=value`` for its other options."""
    return ", ".join(a.label(i) if a.name == "mode" else f"{a.name}={a.label(i)}" for a, i in zip(series_axes, combo))


def _metric_table(grid: Grid, results: Mapping[str, Mapping[str, Any]], metric: str, numeric: Sequence[Axis],
                  series_axes: Sequence[Axis]):
    """``value_at(combo, numeric values)``: ``metric`` of the first cell of series ``combo`` (its value
    indices) at those values of the numeric axes, NaN where no result has it."""
    table: dict = {}
    for cell in grid.cells():
        r = results.get(cell_key(cell))
        v = metric_value(r, metric) if r is not None else None
        combo = tuple(a.values.index(cell[a.name]) for a in series_axes)
        table.setdefault((combo, tuple(cell[a.name] for a in numeric)), math.nan if v is None else v)

    def value_at(combo, picks: Sequence[Any]) -> float:
        return table.get((combo, tuple(picks)), math.nan)

    return value_at


#: series styles of a line plot: colour, marker and dash cycles of 10, 8 and 4 (together distinct for
#: 40 series); the dash cycle also sets the marker size and line width, largest first
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_DASHES = ("-", "--", "-.", ":")
_MARKER_SIZES = (9.5, 7.0, 5.0, 3.5)
_LINE_WIDTHS = (2.6, 1.9, 1.3, 0.9)


def series_style(k: int) -> dict:
    """The ``Axes.plot`` style of the ``k``-th series (from 0) of a line plot.

    Series whose values coincide are drawn exactly where they are (no offset) and stay visible: the
    thicker lines and larger markers of one series lie under the thinner, smaller ones of the next
    (``zorder``), in another colour, marker and dash. ``(color, marker, linestyle)`` differs for any
    two of the first 40 series.
    """
    d = k % len(_DASHES)
    return {"color": f"C{k % 10}", "marker": _MARKERS[k % len(_MARKERS)], "linestyle": _DASHES[d],
            "markersize": _MARKER_SIZES[d], "linewidth": _LINE_WIDTHS[d], "zorder": 2 + d}


def _plot_lines(plt, ax_opt: Axis, series: list, labels: list, value_at, label: str):
    """One numeric axis: a line per series against it (styles of :func:`series_style`); returns the figure."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = list(range(len(ax_opt.values)))
    for k, (combo, name) in enumerate(zip(series, labels)):
        ys = [value_at(combo, (v,)) for v in ax_opt.values]
        if name and all(math.isnan(y) for y in ys):
            name += " (no value)"  # its cells do not report the metric: say so, or the legend shows a line not drawn
        ax.plot(xs, ys, label=name or None, **series_style(k))
    ax.set_xticks(xs, [ax_opt.label(i) for i in xs])
    ax.set_xlabel(ax_opt.name)
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
    if any(labels):
        ax.legend(fontsize=8)
    ax.set_title(f"{label} by {ax_opt.name}")
    fig.tight_layout()
    return fig


def frontier_series(pairs: Iterable[tuple[Mapping[str, Any], Optional[Mapping[str, Any]]]], along: str,
                    series_names: Sequence[str],
                    text: Optional[Callable[[str, Any], str]] = None) -> list[tuple[str, list[tuple[float, float, str]]]]:
    """The frontier's curves (:func:`plot_sweep` ``--metric frontier``, and the report's figure of a closed-loop
    sweep): ``[(label, points)]``, a curve per series.

    ``pairs``: ``(cell, result)`` in the order the points are joined (``result`` ``None`` for a cell without
    one). A series is a combination of the ``series_names`` options' values, in the order first met; its
    label is each option as ``name=value`` (a ``mode`` by its value alone), joined by ", " (``""`` without
    series options). Its points are ``(x, y, text)``: ``interactivity.p50`` and ``tokens_per_s_per_gpu``
    (:data:`FRONTIER_METRICS`) of the first cell of the series at each value of the ``along`` option, and that
    value's text, in the order given; a cell without both numbers is left out (a series may have no point).
    ``text(name, value)``: an option value as shown [default: ``str``]."""
    text = text or (lambda name, value: str(value))
    curves: dict[tuple, tuple[str, dict]] = {}
    for cell, result in pairs:
        combo = tuple(repr(cell.get(n)) for n in series_names)
        if combo not in curves:
            label = ", ".join(text(n, cell.get(n)) if n == "mode" else f"{n}={text(n, cell.get(n))}"
                              for n in series_names)
            curves[combo] = (label, {})
        points = curves[combo][1]
        key = repr(cell.get(along))
        if key in points:
            continue  # the first cell of the series at this value, as the other sweep plots take it
        x, y = (metric_value(result, m) if result is not None else None for m in FRONTIER_METRICS)
        missing = x is None or y is None or math.isnan(x) or math.isnan(y)
        points[key] = None if missing else (x, y, text(along, cell.get(along)))
    return [(label, [p for p in points.values() if p is not None]) for label, points in curves.values()]


def plot_frontier(plt, curves: Sequence[tuple[str, Sequence[tuple[float, float, str]]]], along: str,
                  figsize: tuple = (7, 4.6)):
    """The frontier's figure: a line per curve of :func:`frontier_series` (styles of :func:`series_style`),
    each point labelled with its ``along`` value; returns the figure."""
    fig, ax = plt.subplots(figsize=figsize)
    for k, (name, points) in enumerate(curves):
        ax.plot([p[0] for p in points], [p[1] for p in points], label=name or None, **series_style(k))
        for x, y, text in points:
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("interactivity p50 (tokens/s per user, 1000 / TPOT)")
    ax.set_ylabel("tokens/s per GPU (input + output)")
    ax.grid(True, alpha=0.3)
    if any(name for name, _ in curves):
        ax.legend(fontsize=8)
    ax.set_title(f"throughput per GPU against interactivity, by {along}")
    fig.tight_layout()
    return fig


def _colour_norm(vmin: float, vmax: float):
    """``(norm, log)``: one colour scale for every panel, logarithmic when the values (all positive)
    span more than a factor of 100."""
    log = vmin > 0 and vmax / vmin > 100
    if log:
        from matplotlib.colors import LogNorm

        return LogNorm(vmin=vmin, vmax=vmax), True
    from matplotlib.colors import Normalize

    return Normalize(vmin=vmin, vmax=vmax), False


def _plot_heatmaps(plt, numeric: Sequence[Axis], series: list, labels: list, value_at, label: str):
    """Two numeric axes: a heatmap panel per series (the first axis across, the second down), each
    cell labelled with its value; returns the figure."""
    x_opt, y_opt = numeric
    grids = [[[value_at(combo, (xv, yv)) for xv in x_opt.values] for yv in y_opt.values] for combo in series]
    finite = [v for g in grids for row in g for v in row if not math.isnan(v)]
    vmin, vmax = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if vmin == vmax:
        vmin, vmax = vmin - 0.5, vmax + 0.5
    n = len(series)
    ncols = n if n <= 3 else math.ceil(math.sqrt(n))
    nrows = math.ceil(n / ncols)
    cw = max(2.6, 0.7 * len(x_opt.values) + 1.0)
    ch = max(2.0, 0.45 * len(y_opt.values) + 1.0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(cw * ncols + 1.4, ch * nrows + 0.7), squeeze=False,
                             constrained_layout=True)
    cmap = plt.get_cmap("viridis")
    norm, log = _colour_norm(vmin, vmax)
    image = None
    for k, (name, g) in enumerate(zip(labels, grids)):
        ax = axes[k // ncols][k % ncols]
        image = ax.imshow(g, cmap=cmap, norm=norm, aspect="auto", origin="lower")
        ax.set_xticks(range(len(x_opt.values)), [x_opt.label(i) for i in range(len(x_opt.values))], fontsize=8)
        ax.set_yticks(range(len(y_opt.values)), [y_opt.label(i) for i in range(len(y_opt.values))], fontsize=8)
        if k // ncols == nrows - 1 or k + ncols >= n:
            ax.set_xlabel(x_opt.name, fontsize=9)
        if k % ncols == 0:
            ax.set_ylabel(y_opt.name, fontsize=9)
        ax.set_title(name or label, fontsize=10)
        for yi, row in enumerate(g):
            for xi, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(xi, yi, _compact(v), ha="center", va="center", fontsize=7,
                            color="black" if float(norm(v)) > 0.6 else "white")
    for k in range(n, nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    fig.suptitle(label, fontsize=11)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.9, label=label + (" (log scale)" if log else ""))
    return fig
