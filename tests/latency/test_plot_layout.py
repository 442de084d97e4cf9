"""``dynlab latency --plot``: no axis label runs into tick labels, and the two panels keep apart."""
from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

import dynlab.latency.plot as latency_plot  # noqa: E402
from dynlab.latency.grid import latency_grid  # noqa: E402


def _drawn_figure(monkeypatch, models, **hardware):
    """The figure ``plot_latency_grid`` saves, drawn at the dpi :func:`dynlab.plots.save` writes (110)."""
    figures = []
    monkeypatch.setattr(latency_plot, "save", lambda fig, path: figures.append(fig))
    latency_plot.plot_latency_grid(latency_grid(models, **hardware), "unused.png")
    (fig,) = figures
    fig.set_dpi(110)
    fig.canvas.draw()
    return fig, fig.canvas.get_renderer()


def _tick_labels(axis, renderer):
    """``(text, window extent)`` of the tick labels drawn: in the axis's view, with text."""
    lo, hi = sorted(axis.get_view_interval())
    out = []
    for tick in axis.get_major_ticks() + axis.get_minor_ticks():
        label = tick.label1
        if label.get_visible() and label.get_text() and lo <= tick.get_loc() <= hi:
            out.append((label.get_text(), label.get_window_extent(renderer)))
    return out


@pytest.mark.parametrize("models, hardware", [
    (["roofline"], {}),
    (["roofline", "linear"], {}),
    (["roofline"], {"model": "deepseek-v3", "gpu": "h200", "tp": 8}),
    (["roofline"], {"model": "qwen3-0.6b"}),
])
def test_axis_labels_clear_the_tick_labels_and_the_panels_keep_apart(monkeypatch, models, hardware):
    fig, renderer = _drawn_figure(monkeypatch, models, **hardware)
    try:
        dec, pre = fig.axes[:2]
        ticks = [t for ax in (dec, pre) for axis in (ax.xaxis, ax.yaxis) for t in _tick_labels(axis, renderer)]
        assert ticks
        for ax in (dec, pre):
            for label in (ax.xaxis.label, ax.yaxis.label):
                box = label.get_window_extent(renderer)
                hits = [text for text, tick in ticks if tick.overlaps(box)]
                assert not hits, (label.get_text(), hits)
        # everything the decode panel draws (ticks, labels, legend) ends left of where the prefill panel's begins
        assert dec.get_tightbbox(renderer).x1 < pre.get_tightbbox(renderer).x0
    finally:
        latency_plot.pyplot().close(fig)


def test_ticks_are_the_grids_sizes_as_plain_numbers(monkeypatch):
    fig, renderer = _drawn_figure(monkeypatch, ["roofline"])
    try:
        dec, pre = fig.axes[:2]
        # latency_grid's sizes: 1, 16, 64, 256 decodes; prefills of 512, 2,048, 8,192 tokens
        assert [t for t, _ in _tick_labels(dec.xaxis, renderer)] == ["1", "16", "64", "256"]
        assert [t for t, _ in _tick_labels(pre.xaxis, renderer)] == ["512", "2,048", "8,192"]
        for ax in (dec, pre):
            texts = [t for t, _ in _tick_labels(ax.yaxis, renderer)]
            assert texts and all(t.replace(",", "").replace(".", "").isdigit() for t in texts), texts
    finally:
        latency_plot.pyplot().close(fig)
