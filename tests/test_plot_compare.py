"""`compare --plot`'s chart (dynlab.plots.plot_compare): what each panel shows."""
import pytest

from dynlab import plots


def _captured(monkeypatch, results) -> list:
    """The axes of the figure plot_compare would save (its bars' heights per axis)."""
    figs = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figs.append(fig))
    plots.plot_compare(results, "unused.png", title="t")
    (fig,) = figs
    return fig.axes


def _run(block, prefix=None, ttft=None):
    r = {"block_hit_rate": block, "ideal_block_hit_rate": 0.4}
    if prefix is not None:
        r["prefix_hit_rate"] = prefix
    if ttft is not None:
        r["ttft_ms"] = {"p50": ttft, "p90": 2 * ttft, "p99": 3 * ttft}
    return r


def test_timed_runs_show_the_engines_prefix_hit_rate_beside_the_routers(monkeypatch):
    # a CPU tier: the router's GPU-only rate falls a little, the engines' rate rises (docs/tiers.md's case)
    axes = _captured(monkeypatch, {"0": _run(0.126, 0.125, 200.0), "20000": _run(0.123, 0.160, 190.0)})
    assert len(axes) == 2  # hit rates, then TTFT
    heights = [round(b.get_height(), 3) for c in axes[0].containers for b in c]
    assert heights == [0.126, 0.123, 0.125, 0.160]
    assert [t.get_text() for t in axes[0].get_legend().get_texts()][1:] == [
        "block hit rate (router, GPU)", "prefix hit rate (engines, GPU+CPU)"]


@pytest.mark.parametrize("timed", [False, True])
def test_runs_without_prefix_hit_rate_show_one_bar_each(monkeypatch, timed):
    ttft = 100.0 if timed else None
    axes = _captured(monkeypatch, {"a": _run(0.2, ttft=ttft), "b": _run(0.3, ttft=ttft)})
    assert len(axes) == (2 if timed else 1)
    assert [round(b.get_height(), 3) for b in axes[0].containers[0]] == [0.2, 0.3]
    assert len(axes[0].containers) == 1
