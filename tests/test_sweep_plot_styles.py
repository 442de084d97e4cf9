"""``dynlab sweep --plot`` line plots: series whose values coincide stay visible, at their exact values."""
from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

import dynlab.sweep.plots as sweep_plots  # noqa: E402
from dynlab.sweep import Axis, Grid, cell_key  # noqa: E402

MODES = ("rr", "kv", "least-loaded", "random", "kv-cost")
WORKERS = (1, 2, 4, 8)
# kv, least-loaded and kv-cost coincide at every point (as on a workload every KV-aware strategy routes
# alike); rr and random differ; every series meets the others at workers=1
VALUES = {"rr": (1.0, 0.8167, 0.5167, 0.2833), "kv": (1.0, 1.0, 1.0, 1.0), "least-loaded": (1.0, 1.0, 1.0, 1.0),
          "random": (1.0, 0.8, 0.55, 0.3), "kv-cost": (1.0, 1.0, 1.0, 1.0)}


def _line_figure(monkeypatch):
    grid = Grid((Axis("mode", MODES, MODES), Axis("workers", WORKERS)))
    results = {cell_key(c): {"hit_rate": VALUES[c["mode"]][WORKERS.index(c["workers"])]} for c in grid.cells()}
    figures = []
    monkeypatch.setattr("dynlab.plots.save", lambda fig, path: figures.append(fig))
    sweep_plots.plot_sweep(grid, results, "unused.png", "hit_rate")
    (fig,) = figures
    return fig


def test_every_series_is_in_the_legend_with_its_own_style_at_its_exact_values(monkeypatch):
    fig = _line_figure(monkeypatch)
    try:
        (ax,) = fig.axes
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == list(MODES)
        assert [t.get_text() for t in ax.get_legend().get_texts()] == list(MODES)
        styles = [(line.get_color(), line.get_marker(), line.get_linestyle()) for line in lines]
        assert len(set(styles)) == len(MODES), styles
        # colour alone does not tell two lines apart where one hides the other: each has its own marker
        assert len({line.get_marker() for line in lines}) == len(MODES), styles
        for line, mode in zip(lines, MODES):
            assert list(line.get_xdata()) == [0, 1, 2, 3]
            assert tuple(line.get_ydata()) == VALUES[mode]  # exact: no offset to pull coinciding series apart
        # the coinciding kv, least-loaded and kv-cost: each one higher in the drawing order has a smaller
        # marker and a thinner line than those beneath, so the ones beneath still show around it
        by_mode = dict(zip(MODES, lines))
        stack = sorted((by_mode[m] for m in ("kv", "least-loaded", "kv-cost")), key=lambda line: line.get_zorder())
        for under, over in zip(stack, stack[1:]):
            assert over.get_zorder() > under.get_zorder()
            assert over.get_markersize() < under.get_markersize() and over.get_linewidth() < under.get_linewidth()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_series_styles_are_distinct_and_smaller_on_top():
    styles = [sweep_plots.series_style(k) for k in range(40)]
    assert len({(s["color"], s["marker"], s["linestyle"]) for s in styles}) == 40
    # within each cycle of four dashes: later series on top, with smaller markers and thinner lines
    for k in range(39):
        a, b = styles[k], styles[k + 1]
        if (k + 1) % 4:
            assert b["zorder"] > a["zorder"] and b["markersize"] < a["markersize"] and b["linewidth"] < a["linewidth"]


def test_a_series_whose_cells_lack_the_metric_says_so_in_the_legend(monkeypatch):
    # prediction_error is null for rr (no index) and a number for kv: rr's line has no point to draw
    grid = Grid((Axis("mode", ("rr", "kv"), ("rr", "kv")), Axis("workers", (1, 2))))
    results = {cell_key(c): {"prediction_error": None if c["mode"] == "rr" else c["workers"]} for c in grid.cells()}
    figures = []
    monkeypatch.setattr("dynlab.plots.save", lambda fig, path: figures.append(fig))
    sweep_plots.plot_sweep(grid, results, "unused.png", "prediction_error")
    (fig,) = figures
    try:
        (ax,) = fig.axes
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["rr (no value)", "kv"]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
