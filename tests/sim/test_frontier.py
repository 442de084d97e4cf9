"""sweep --plot over --concurrency: the throughput-per-GPU against interactivity frontier."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.cli.sweep import _plot_metric

pytest.importorskip("matplotlib")

SPEC = {"seed": 1, "requests": 64, "arrival": {"process": "poisson", "rate": 5},
        "input": {"dist": "uniform", "min": 100, "max": 300}, "output": {"dist": "uniform", "min": 10, "max": 30}}


def _sweep(tmp_path, *args):
    spec = tmp_path / "w.json"
    spec.write_text(json.dumps(SPEC))
    return CliRunner().invoke(main, ["sweep", "--timing", "--workload", str(spec), "--executor", "serial", "--quiet",
                                     "--out", str(tmp_path / "r.jsonl"), *args])


def test_a_concurrency_sweep_plots_the_frontier_by_default(tmp_path):
    r = _sweep(tmp_path, "--grid", "concurrency=1,4,16", "--plot", str(tmp_path / "f.png"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = {i: json.loads(line)["result"] for i, line in enumerate((tmp_path / "r.jsonl").read_text().splitlines())}
    assert _plot_metric(results, None) == "frontier"
    by_c = sorted((r["concurrency"], r["interactivity"]["p50"], r["tokens_per_s_per_gpu"]) for r in results.values())
    # more users: more tokens per GPU, fewer per user (the frontier's trade)
    assert [t for _, _, t in by_c] == sorted(t for _, _, t in by_c)
    assert [i for _, i, _ in by_c] == sorted((i for _, i, _ in by_c), reverse=True)


def test_the_frontier_of_an_open_loop_sweep_is_refused(tmp_path):
    r = _sweep(tmp_path, "--grid", "workers=1,2", "--plot", str(tmp_path / "f.png"), "--metric", "frontier")
    assert r.exit_code == 2 and "--metric frontier needs --timing and --concurrency" in r.output
    assert not (tmp_path / "f.png").exists()


def _point(x, y):
    return {"requests": 8, "interactivity": {"p50": x}, "tokens_per_s_per_gpu": y}


def test_the_frontier_series_of_a_hand_made_sweep():
    from dynlab.sweep.plots import frontier_series

    pairs = [({"concurrency": 1, "mode": "rr", "workers": 2}, _point(150.0, 800.0)),
             ({"concurrency": 1, "mode": "kv", "workers": 2}, _point(140.0, 700.0)),
             ({"concurrency": 4, "mode": "rr", "workers": 2}, _point(100.0, 2000.0)),
             ({"concurrency": 4, "mode": "kv", "workers": 2}, None),  # not run: no point
             ({"concurrency": 8, "mode": "rr", "workers": 2}, {"requests": 8, "tokens_per_s_per_gpu": 3.0}),  # no x
             ({"concurrency": 4, "mode": "rr", "workers": 2}, _point(1.0, 1.0)),  # a repeat: the first is kept
             ({"concurrency": 16, "mode": "kv", "workers": 2}, _point(50.0, 4000.0)),
             ({"concurrency": 1, "mode": "sticky", "workers": 2}, None)]  # a series without any point
    # a series per mode (first met first, the mode alone as its label), points in the order given
    assert frontier_series(pairs, "concurrency", ["mode"]) == [
        ("rr", [(150.0, 800.0, "1"), (100.0, 2000.0, "4")]),
        ("kv", [(140.0, 700.0, "1"), (50.0, 4000.0, "16")]),
        ("sticky", [])]
    # other options are name=value; the text of a value is the caller's (the sweep: as written)
    assert frontier_series(pairs[:3], "concurrency", ["workers", "mode"], lambda n, v: f"<{v}>") == [
        ("workers=<2>, <rr>", [(150.0, 800.0, "<1>"), (100.0, 2000.0, "<4>")]),
        ("workers=<2>, <kv>", [(140.0, 700.0, "<1>")])]
    # no series option: one curve without a label
    assert frontier_series(pairs[:1], "concurrency", []) == [("", [(150.0, 800.0, "1")])]
