"""The report's figure of an autoscaled fleet over time (dynlab.report.scaling_figures): hand-made results."""
import json

import pytest

from dynlab.report.html import build_report
from dynlab.report.runs import Run
from dynlab.report.scaling_figures import _steps, arrivals_per_s, fleet_over_time, replicas_per_pool, window_s

HPA = {"requests": 10, "mode": "least-loaded", "gpu_hours": 0.5, "oscillations": 0, "worst_window_goodput": 0.25,
       "scale_events": [[15, "add", 1], [15, "add", 2], [45, "retire", 2]],
       "workers_over_time": [[0, 1], [53, 2], [53, 3], [60, 2]],
       "goodput_over_time": [[0, 1.0], [15, 0.25], [30, 0.5], [45, 1.0]]}


def test_arrivals_per_window_counted_by_hand():
    # windows of 15 s: arrivals at 1 s, 2 s (window 0), none in window 1, 31 s (window 2) -> 2/15, 0, 1/15
    recs = [{"arrival_ms": 1000.0}, {"arrival_ms": 2000.0}, {"arrival_ms": 31000.0}, {"arrival_ms": None}]
    assert arrivals_per_s(recs, 15.0) == [[0.0, 0.133], [15.0, 0.0], [30.0, 0.067]]
    assert arrivals_per_s([], 15.0) == []


def test_window_is_the_controller_period():
    assert window_s(HPA) == 15
    assert window_s({"goodput_over_time": [[0, 1.0]]}) is None


def test_steps_keep_the_last_value_of_equal_times_and_run_to_the_end():
    # two workers become ready at 53 s: one step from 1 to 3, held to the end at 90 s
    assert _steps([[0, 1], [53, 2], [53, 3]], 90) == ([0, 53, 90], [1, 3, 3])


def test_figure_rows_say_peak_adds_retires_and_worst_window():
    fig = fleet_over_time([Run("hpa", HPA), Run("fixed", {"requests": 10, "mode": "rr"})])
    assert fig is not None and fig.key == "scaling"
    # peak 3 live workers; 2 adds, 1 retire; the rest read from the result
    assert fig.rows == [["hpa", 3, 2, 1, 0, 0.5, 0.25, None]]  # no queue_over_time in this result
    assert "hpa (0.25)" in fig.caption and "<svg" in fig.svg


def test_no_figure_without_a_controller():
    assert fleet_over_time([Run("rr", {"requests": 10, "mode": "rr"})]) is None


def test_report_holds_the_figure_only_for_autoscaled_runs():
    assert 'id="scaling"' in build_report([Run("hpa", HPA)])
    assert 'id="scaling"' not in build_report([Run("rr", {"requests": 10, "mode": "rr", "hit_rate": 0.5})])


def test_a_pd_fleets_events_name_their_pool_and_draw_the_same():
    # a P/D run's scale_events carry the pool after the worker (dynlab.disagg.elastic): 2 adds, 1 retire, peak 3
    pd = {**HPA, "elastic_pool": "decode",
          "scale_events": [[15, "add", 1, "decode"], [15, "add", 2, "decode"], [45, "retire", 2, "decode"]]}
    fig = fleet_over_time([Run("pd", pd)])
    assert fig.rows == [["pd", 3, 2, 1, 0, 0.5, 0.25, None]] and "<svg" in fig.svg


def test_replicas_per_pool_from_the_worker_lifetimes_by_hand():
    res = {"worker_lifetimes": [
        {"worker": 0, "pool": "prefill", "ready_s": 0, "left_s": None},
        {"worker": 1, "pool": "decode", "ready_s": 0, "left_s": 70.0},
        {"worker": 2, "pool": "decode", "ready_s": 53.0, "left_s": None},
        {"worker": 3, "pool": "prefill", "ready_s": 53.0, "left_s": 40.0},  # retired while starting: never serves
        {"worker": 4, "pool": "prefill", "ready_s": 70.0, "left_s": 90.0}]}
    # decode: 1 from 0 s, 2 from 53 s (worker 2 ready), 1 from 70 s (worker 1 left);
    # prefill: 1 from 0 s, 2 from 70 s (worker 4), 1 from 90 s
    assert replicas_per_pool(res) == {"decode": [[0, 1], [53.0, 2], [70.0, 1]],
                                      "prefill": [[0, 1], [70.0, 2], [90.0, 1]]}
    # no pool named: one fleet; a worker leaving at 60 s as another becomes ready then: 1 -> 1 (one point)
    one = {"worker_lifetimes": [{"worker": 0, "ready_s": 0, "left_s": 60.0}, {"worker": 1, "ready_s": 60.0}]}
    assert replicas_per_pool(one) == {"": [[0, 1], [60.0, 1]]}
    # a first worker ready after 0 s starts the line at 0 workers
    assert replicas_per_pool({"worker_lifetimes": [{"worker": 0, "ready_s": 38.03}]}) == {"": [[0, 0], [38.03, 1]]}
    assert replicas_per_pool(HPA) == {}


def test_figure_draws_pools_and_the_queue_and_its_row_gives_the_most_waiting():
    res = dict(HPA, queue_over_time=[[0, 0.0], [15, 2.5], [30, 0.75], [45, 0.0]],
               worker_lifetimes=[{"worker": 0, "pool": "h100", "ready_s": 0}, {"worker": 1, "pool": "h200", "ready_s": 53}])
    fig = fleet_over_time([Run("mixed", res)])
    assert fig.rows == [["mixed", 3, 2, 1, 0, 0.5, 0.25, 2.5]]
    assert "h100" in fig.svg and "h200" in fig.svg and "requests waiting" in fig.svg


@pytest.mark.parametrize("key, bad, shown", [
    ("queue_over_time", "x", '"x"'), ("queue_over_time", [[0]], "[0]"), ("goodput_over_time", [[0, "a"]], '[0, "a"]'),
    ("workers_over_time", [[0, 1], None], "null"), ("workers_over_time", 3, "3")])
def test_a_malformed_over_time_key_is_refused_in_one_line(tmp_path, key, bad, shown):
    from click.testing import CliRunner

    from dynlab.cli import main

    for name, text in (("s.json", json.dumps({**HPA, key: bad})),  # one sim result; a sweep's line 2
                       ("w.jsonl", json.dumps({"cell": {"workers": 1}, "result": HPA}) + "\n"
                        + json.dumps({"cell": {"workers": 2}, "result": {**HPA, key: bad}}) + "\n")):
        (tmp_path / name).write_text(text)
        (tmp_path / "r.html").write_text("old")
        res = CliRunner().invoke(main, ["report", str(tmp_path / name), "--out", str(tmp_path / "r.html")])
        assert res.exit_code == 1, res.output
        (line,) = res.stderr.splitlines()
        where = f"{name}:2" if name.endswith("jsonl") else name
        assert line.startswith("Error: ") and f"{where}: run " in line and key in line and f"got {shown}" in line
        assert (tmp_path / "r.html").read_text() == "old"


@pytest.mark.parametrize("key, bad, shown, said", [
    ("workers_over_time", [[0, 1], [5, -1]], "[5, -1]", "[s, live workers] pairs, numbers >= 0, the workers whole"),
    ("workers_over_time", [[0, 1.5]], "[0, 1.5]", "[s, live workers] pairs, numbers >= 0, the workers whole"),
    ("workers_over_time", [[-3, 1]], "[-3, 1]", "[s, live workers] pairs"),
    ("goodput_over_time", [[0, -0.5]], "[0, -0.5]", "[s, goodput] pairs, numbers >= 0"),
    ("queue_over_time", [[0, -2]], "[0, -2]", "[s, mean requests waiting] pairs, numbers >= 0")])
def test_a_negative_or_fractional_count_over_time_is_refused_naming_the_key(tmp_path, key, bad, shown, said):
    from click.testing import CliRunner

    from dynlab.cli import main

    (tmp_path / "s.json").write_text(json.dumps({**HPA, key: bad}))
    res = CliRunner().invoke(main, ["report", str(tmp_path / "s.json"), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 1 and not (tmp_path / "r.html").exists(), res.output
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"Error: {tmp_path / 's.json'}: run 'least-loaded': {key} must be a list of {said}")
    assert line.endswith(f"got {shown}"), line


def test_whole_float_workers_and_zero_counts_over_time_are_read(tmp_path):
    from dynlab.report.runs import read_runs

    res = {**HPA, "workers_over_time": [[0.0, 2.0], [5.5, 0]], "queue_over_time": [[0, 0.0]]}
    (tmp_path / "s.json").write_text(json.dumps(res))
    (run,) = read_runs(str(tmp_path / "s.json"))
    assert run.result["workers_over_time"] == [[0.0, 2.0], [5.5, 0]]
