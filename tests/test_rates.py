"""Rates and durations of timestamped traces (dynlab.traces.rates; --rate, --rate-scale, --duration)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, strategies as st

from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.sim.runner import run
from dynlab.routing.strategy import Request
from dynlab.traces import rates


def reqs(stamps, hashes=None):
    return [Request(tuple(hashes[i]) if hashes else (i + 1,), 512, 4, t, i) for i, t in enumerate(stamps)]


# -- hand cases ------------------------------------------------------------------------------------------
def test_mean_rate_is_gaps_over_span():
    # 5 arrivals over 2,000 ms: 4 gaps in 2 s = 2.0 requests/s
    assert rates.mean_rate([0, 500, 1000, 1500, 2000]) == 2.0
    # 3 arrivals, first at 1,000 ms: 2 gaps over 4,000 ms = 0.5 requests/s (the offset does not count)
    assert rates.mean_rate([1000, 1000, 5000]) == 0.5


@pytest.mark.parametrize("stamps", [[], [7], [3, 3, 3]])
def test_mean_rate_needs_two_distinct_arrivals(stamps):
    with pytest.raises(rates.RateError):
        rates.mean_rate(stamps)


def test_time_scale_for():
    # a 2 requests/s trace at --rate 8: timestamps x 2/8 = 0.25
    assert rates.time_scale_for(2.0, rate=8.0) == 0.25
    # --rate-scale 4 is --time-scale 1/4
    assert rates.time_scale_for(None, rate_scale=4.0) == 0.25
    # half the rate: twice as slow
    assert rates.time_scale_for(3.0, rate=1.5) == 2.0
    assert rates.time_scale_for(3.0) == 1.0
    with pytest.raises(rates.RateError, match="--rate and --rate-scale"):
        rates.time_scale_for(2.0, rate=1.0, rate_scale=2.0)
    with pytest.raises(rates.RateError, match="--rate-scale"):
        rates.time_scale_for(2.0, rate_scale=0.0)
    with pytest.raises(rates.RateError, match="mean rate"):
        rates.time_scale_for(None, rate=1.0)


def test_shape_cuts_at_the_duration():
    # arrivals 0, 100, 200, 300 ms at scale 0.5: 0, 50, 100, 150; 0.1 s keeps [0, 100): two requests
    out = rates.shape(reqs([0, 100, 200, 300]), 0.5, 0.1)
    assert [r.timestamp for r in out] == [0.0, 50.0]
    assert [r.index for r in out] == [0, 1]


def test_shape_loops_with_new_names():
    # 3 arrivals at 0, 100, 200 ms: span 200, period = 200 * 3 / 2 = 300 ms; names 1..3, stride 4
    out = rates.shape(reqs([0, 100, 200]), 1.0, 0.7)
    assert [r.timestamp for r in out] == [0, 100, 200, 300, 400, 500, 600]
    assert [r.hashes for r in out] == [(1,), (2,), (3,), (5,), (6,), (7,), (9,)]
    assert [r.index for r in out] == list(range(7))
    # the looped trace keeps its mean rate: 6 gaps over 600 ms = 10 requests/s, as the trace's 2 over 200
    assert rates.mean_rate([r.timestamp for r in out]) == rates.mean_rate([0, 100, 200]) == 10.0


def test_shape_loops_with_the_same_names():
    out = rates.shape(reqs([0, 100, 200]), 1.0, 0.7, repeat="same")
    assert [r.hashes for r in out] == [(1,), (2,), (3,)] * 2 + [(1,)]


def test_shape_refuses_to_loop_an_instant():
    with pytest.raises(rates.RateError, match="same instant"):
        rates.shape(reqs([5, 5]), 1.0, 10.0)


def test_rename_keeps_chains_apart():
    assert rates.rename((1, 2, 3), 2, 10) == (21, 22, 23)


# -- properties -----------------------------------------------------------------------------------------
stamps = st.lists(st.integers(0, 10_000), min_size=2, max_size=30).map(sorted).filter(lambda s: s[-1] > s[0])


@given(stamps, st.floats(0.1, 10.0))
def test_rate_is_met_exactly(ts, target):
    scale = rates.time_scale_for(rates.mean_rate(ts), rate=target)
    out = rates.shape(reqs(ts), scale)
    assert rates.mean_rate([r.timestamp for r in out]) == pytest.approx(target, rel=1e-9)


@given(stamps, st.floats(0.01, 50.0), st.sampled_from(rates.DURATION_REPEATS))
def test_duration_window_and_order(ts, seconds, repeat):
    out = rates.shape(reqs(ts, [[i + 1, 100 + i] for i in range(len(ts))]), 1.0, seconds, repeat)
    assert out and all(ts[0] <= r.timestamp < ts[0] + seconds * 1000 for r in out)
    assert [r.timestamp for r in out] == sorted(r.timestamp for r in out)
    if repeat == "new":  # every repeat names its own blocks: no name of one loop appears in another
        loops = {}
        for i, r in enumerate(out):
            loops.setdefault(i // len(ts), set()).update(r.hashes)
        names = [n for s in loops.values() for n in s]
        assert len(names) == len(set(names))


# -- through run() and the CLI -------------------------------------------------------------------------------
MOON = "".join(json.dumps(r) + "\n" for r in [
    {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},
    {"timestamp": 500, "input_length": 1536, "output_length": 4, "hash_ids": [1, 2, 3]},
    {"timestamp": 1000, "input_length": 600, "output_length": 4, "hash_ids": [7, 8]},
])


def test_run_reports_the_rates(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(MOON)
    out = run(SimConfig(trace=str(path), timing=True, rate=8.0, mode="rr"))
    # 2 gaps over 1 s: 2 requests/s; at --rate 8 the timestamps are x 0.25
    assert (out["trace_rate"], out["time_scale_applied"], out["arrival_rate"]) == (2.0, 0.25, 8.0)
    looped = run(SimConfig(trace=str(path), duration=3.0, mode="rr"))  # period 1.5 s: 6 requests in 3 s
    assert looped["requests"] == 6 and looped["arrival_rate"] == 2.0
    plain = run(SimConfig(trace=str(path), timing=True, mode="rr"))
    assert "trace_rate" not in plain


def test_time_scale_reports_the_rates_as_rate_scale_does(tmp_path):
    # --time-scale 0.25 is --rate-scale 4: the same replay, and the same three keys (2 requests/s x 4 = 8)
    path = tmp_path / "m.jsonl"
    path.write_text(MOON)
    by_time = run(SimConfig(trace=str(path), timing=True, time_scale=0.25, mode="rr"))
    by_rate = run(SimConfig(trace=str(path), timing=True, rate_scale=4.0, mode="rr"))
    assert (by_time["trace_rate"], by_time["time_scale_applied"], by_time["arrival_rate"]) == (2.0, 0.25, 8.0)
    assert by_time == by_rate
    assert list(by_time)[-3:] == ["trace_rate", "time_scale_applied", "arrival_rate"]


@pytest.mark.parametrize("cmd", [["sim"], ["compare", "--format", "json", "--modes", "rr,kv"],
                                 ["sweep", "--executor", "serial", "--quiet", "--grid", "workers=1,2"]])
@pytest.mark.parametrize("args, words", [
    (["--rate", "2", "--time-scale", "2"], "--rate and --time-scale"),
    (["--rate-scale", "2", "--time-scale", "2"], "--rate-scale and --time-scale"),
    (["--rate-scale", "2", "--rate", "2"], "--rate and --rate-scale"),
])
def test_two_speeds_are_refused(tmp_path, cmd, args, words):
    (tmp_path / "m.jsonl").write_text(MOON)
    res = CliRunner().invoke(main, cmd + ["--timing", "--trace", str(tmp_path / "m.jsonl"), *args])
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.splitlines() if hasattr(res, "stderr") else res.output.splitlines()
    assert words in line and line.startswith("Error: ")


def test_sweep_grid_takes_rate_scale(tmp_path):
    (tmp_path / "m.jsonl").write_text(MOON)
    res = CliRunner().invoke(main, ["sweep", "--executor", "serial", "--quiet", "--timing", "--trace",
                                    str(tmp_path / "m.jsonl"), "--grid", "rate_scale=1,4", "--out",
                                    str(tmp_path / "r.jsonl")])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in open(tmp_path / "r.jsonl")]
    assert sorted(r["result"]["arrival_rate"] for r in rows) == [2.0, 8.0]


def test_time_scale_applied_is_rounded_like_the_rates(tmp_path):
    """A fresh user's trial printed 0.49999829598253226: the factor is shown at 4 decimals as trace_rate and
    arrival_rate are (2 requests/s at --rate 6.8024: 2 / 6.8024 = 0.29401..., shown 0.294); the run itself
    uses the exact factor, so the arrivals still meet the rate asked for."""
    path = tmp_path / "m.jsonl"
    path.write_text(MOON)
    out = run(SimConfig(trace=str(path), timing=True, rate=6.8024, mode="rr"))
    assert (out["trace_rate"], out["time_scale_applied"], out["arrival_rate"]) == (2.0, 0.294, 6.8024)
    assert rates.describe(2.0, 0.49999829598253226, [0.0, 500.0])["time_scale_applied"] == 0.5
