"""sweep --plot --metric: a metric no cell will report is refused before any cell runs (dynlab.sweep.probe)."""
from __future__ import annotations

import json

import pytest

from dynlab.engine.config import SimConfig
from dynlab.sweep import probe
from helpers import invoke

# 4 Mooncake rows of 1,500 tokens (ceil(1500/512) = 3 ids each) at 0, 1, 2, 3 s; one output token each
ROWS = "".join(json.dumps({"timestamp": 1000 * i, "input_length": 1500, "output_length": 1,
                           "hash_ids": [[1, 2, 3], [7, 8, 9]][i % 2]}) + "\n" for i in range(4))


def _sweep(tmp_path, *args):
    trace = tmp_path / "t.jsonl"
    trace.write_text(ROWS)
    out, png = tmp_path / "r.jsonl", tmp_path / "p.png"
    result = invoke("sweep", "--trace", trace, "--workers", "1", "--out", out, "--plot", png, "--executor",
                    "serial", "--quiet", *args)
    return result, out, png


def test_a_misspelt_metric_is_refused_before_any_cell_runs(tmp_path):
    result, out, png = _sweep(tmp_path, "--timing", "--grid", "capacity=200,300",
                              "--metric", "ttft_ms.p999")
    assert result.exit_code == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: --metric ttft_ms.p999: no cell reports this number; available: ")
    assert "ttft_ms.p99" in line and "block_hit_rate" in line
    assert not out.exists() and not png.exists()


def test_a_metric_of_some_cells_only_is_plotted(tmp_path):
    # a CPU tier's keys exist only in the cells that have one (--cpu-capacity 0 is none)
    result, out, png = _sweep(tmp_path, "--timing", "--capacity", "200", "--grid", "cpu-capacity=0,100",
                              "--metric", "cpu_kv_blocks")
    assert result.exit_code == 0, result.stderr
    assert png.exists() and len(out.read_text().splitlines()) == 2


def test_a_figure_a_probe_leaves_empty_is_not_refused(tmp_path):
    # rr predicts no overlap: predicted_blocks is null in its probe, as it may be in a short run of a strategy
    # that does; the probe cannot tell, so the cells run, and the check after them answers (exit 1)
    csv = tmp_path / "r.csv"
    csv.write_text("ORIG")  # a failing sweep leaves an existing --csv as it was
    result, out, png = _sweep(tmp_path, "--mode", "rr", "--timing", "--grid", "capacity=200,300",
                              "--metric", "predicted_blocks", "--csv", csv)
    assert result.exit_code == 1 and "no result has this number" in result.stderr
    assert len(out.read_text().splitlines()) == 2 and not png.exists()  # the results are kept
    assert csv.read_text() == "ORIG"


def test_an_out_file_that_is_not_empty_is_refused_whatever_it_holds(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(ROWS)
    out = tmp_path / "r.jsonl"
    out.write_text("ORIG")  # not a sweep's results
    result = invoke("sweep", "--trace", trace, "--grid", "workers=1,2", "--out", out, "--executor", "serial")
    assert result.exit_code == 2
    assert result.stderr == (f"Error: {out} is not empty: add --resume to run only the cells its results lack, "
                             "or choose another file\n")
    assert out.read_text() == "ORIG"


@pytest.mark.parametrize("paths, metric, reports", [
    ({"a": 1.5}, "a", True),
    ({"a.b": 2}, "a.b", True),
    ({"a.b": 2}, "a", False),  # a prefix of a path is not a number
    ({"a": None}, "a.b", True),  # empty here, maybe a dict of numbers in the full run
    ({"a.b": None}, "a.b", True),
    ({"a": [1, 2]}, "a", False),  # a list is not plotted
    ({"a": True}, "a", False),
    ({"a": 1}, "a.b", False),  # a number has no fields
    ({"a": 1}, "b", False),
])
def test_which_paths_can_hold_the_metric(paths, metric, reports):
    assert probe._reports(paths, metric) is reports


def test_identical_cells_are_probed_once_and_a_failing_probe_defers_to_the_run(monkeypatch):
    calls = []

    def fake(config, trace):
        calls.append(config.workers)
        if config.workers == 3:
            raise ValueError("the cell will say it")
        return {"hits": 1}

    monkeypatch.setattr(probe, "probe_paths", fake)
    configs = [SimConfig(workers=2), SimConfig(workers=2), SimConfig(workers=4)]
    assert probe.metric_problem(configs, "nosuch", lambda c: None) == \
        "--metric nosuch: no cell reports this number; available: hits"
    assert calls == [2, 4]
    calls.clear()
    assert probe.metric_problem([SimConfig(workers=2), SimConfig(workers=2)], "hits", lambda c: None) is None
    assert calls == [2]  # stops at the first configuration that reports it
    assert probe.metric_problem([SimConfig(workers=3), SimConfig(workers=4)], "nosuch", lambda c: None) is None


def test_a_probe_has_the_keys_of_the_full_run(tmp_path):
    from dynlab.sim.runner import run
    from dynlab.sweep.results import flatten
    from dynlab.traces.reader import load_trace

    trace = tmp_path / "t.jsonl"
    trace.write_text(ROWS)
    for config in (SimConfig(trace=str(trace), mode="kv", workers=2),
                   SimConfig(trace=str(trace), mode="kv-cost", workers=2, timing=True, capacity=200,
                             cpu_capacity=50),
                   SimConfig(mode="kv", workers=2)):
        full = flatten(run(config))
        small = probe.probe_paths(config, load_trace(str(trace)) if config.trace else None)
        assert list(small) == list(full)
