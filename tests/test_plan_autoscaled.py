"""``dynlab plan --controller``: each shape's static answer against the same traffic replayed with an autoscaler
bounded at the answer N (dynlab issue 41 item 5), on a hand trace whose figures are derived here.

The trace (as tests/test_plan.py's): twelve 1,000-token prompts at t = 0 and one more at t = 3,600 s, each with one
output token and blocks of its own; the linear model (``beta0`` = 1 ms per step, ``beta1`` = 0.01 ms per prefill
token, every overhead off) with a 1,000-token step budget makes each prompt one 11 ms step that also gives its only
token, so a worker holding k of the burst finishes them at 11, 22, ..., 11 k ms.
"""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.plan.autoscaled import bounded, figures, lines
from dynlab.plan.search import Shape
from dynlab.plan.target import Target

from helpers import terms_off_args

LINEAR = ["--latency-model", "linear", "--latency-opt", "beta0=1", "--latency-opt", "beta1=0.01",
          "--latency-opt", "beta2=0", *terms_off_args("linear"), "--max-num-batched-tokens", "1000", "--modes", "rr",
          "--executor", "serial", "--format", "json", "--quiet"]


@pytest.fixture
def day_trace(tmp_path):
    path = tmp_path / "burst.jsonl"
    rows = [(0, 1000, 1)] * 12 + [(3_600_000, 1000, 1)]
    ids = iter(range(1, 10**6))
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o,
                                        "hash_ids": [next(ids), next(ids)]}) + "\n" for t, n, o in rows))
    return str(path)


def _plan(*args, code=0):
    out = CliRunner().invoke(main, ["plan", *map(str, args)])
    assert out.exit_code == code, out.output
    return out


def test_static_controller_reproduces_the_static_answer(day_trace):
    # N: rr spreads the burst 12/N per worker; TTFT p99 of the 13 values is 11 x 12/N ms: 132 at 1, 66 at 2, 44 at 3
    # (the lone request: 11 ms), so N = 3 against 50 ms. static starts at N = 3 and never moves: it holds 3 workers
    # from 0 s to the last finish, 3,600 s + 11 ms, which is also the answer's makespan (first arrival at 0):
    # 3 x 3,600.011 / 3,600 = 3.000009 GPU-hours, priced at 2 USD: 6.000018
    plan = json.loads(_plan("--trace", day_trace, "--slo-ttft-ms", 50, "--price", "h100=2",
                            "--controller", "static", *LINEAR).stdout)
    (shape,) = plan["shapes"]
    a = shape["autoscaled"]
    assert (shape["workers"], a["static_workers"], a["start_workers"], a["peak_workers"]) == (3, 3, 3, 3)
    assert a["static_gpu_hours"] == a["gpu_hours"] == round(3 * 3600.011 / 3600, 6) == 3.000009
    assert a["static_cost_usd"] == a["cost_usd"] == round(3.000009 * 2, 6)
    assert (a["saved_pct"], a["meets"], a["misses"], a["price_source"]) == (0.0, True, [], "--price")


def test_hpa_uses_fewer_gpu_hours_and_misses_the_burst(day_trace):
    # hpa from 1 worker, max 3: its first call is at 15 s, after the burst (done by 132 ms on one worker); nothing
    # runs then, so desired = ceil(1 x 0 / 32) = 0, held at min 1: one worker for the whole run,
    # 1 x 3,600.011 / 3,600 = 1.000003 GPU-hours (66.7 % fewer than 3.000009). The burst on one worker: TTFTs
    # 11, 22, ..., 132 ms, four within 50 ms, plus the lone request's 11 ms: goodput 5/13 = 0.3846; p99 131.1 ms
    # (inclusive quantile of 13 values: 121 + 0.99 x 12 - 11 = 0.88 of the way from 121 to 132, 130.68 rounded
    # as the run rounds it: read back below)
    plan = json.loads(_plan("--trace", day_trace, "--slo-ttft-ms", 50, "--price", "h100=2",
                            "--controller", "hpa:metric=running,target=32", *LINEAR).stdout)
    a = plan["shapes"][0]["autoscaled"]
    assert a["controller"] == "hpa:metric=running,target=32,max=3"
    assert (a["start_workers"], a["max_workers"], a["peak_workers"], a["scale_events"]) == (1, 3, 1, 0)
    assert a["gpu_hours"] == round(3600.011 / 3600, 6) == 1.000003
    assert a["cost_usd"] == round(1.000003 * 2, 6)
    assert a["saved_pct"] == round(100 * (3.000009 - 1.000003) / 3.000009, 1) == 66.7
    assert a["goodput"] == round(5 / 13, 4)
    assert not a["meets"] and a["misses"] == [f"TTFT p99 {a['ttft_ms']:g} ms > 50 ms"] and 121 < a["ttft_ms"] < 132


def test_max_workers_bounds_the_controller_and_the_table_says_it(day_trace):
    out = _plan("--trace", day_trace, "--slo-ttft-ms", 50, "--controller", "hpa:metric=running,target=32,min=2",
                "--max-workers", 5, *LINEAR[:-3], "--format", "table", "--quiet").stdout
    # min=2: two workers all along, 2 x 3,600.011 / 3,600 = 2.000006 GPU-hours against 3.000009 (-33.3 %)
    assert ("- h100x1 rr: static 3 workers 3.000009 GPU-h $" in out
            and "hpa:metric=running,target=32,min=2,max=5 from 2 (peak 2) 2.000006 GPU-h $" in out), out
    assert "(-33.3%)" in out and "misses: TTFT p99" in out


def test_without_the_option_no_key(day_trace):
    plan = json.loads(_plan("--trace", day_trace, "--slo-ttft-ms", 50, *LINEAR).stdout)
    assert "autoscaled" not in plan["shapes"][0]


@pytest.mark.parametrize("spec, words", [
    ("none", "no controller to compare"),
    ("hpa:target=3,max=4", "max is plan's to set"),
    ("hpa:metric=queue", "target"),
    ("no-such", "unknown controller"),
    ("static:min=1", "unknown option"),
])
def test_bad_controller_is_a_usage_error(day_trace, spec, words):
    out = _plan("--trace", day_trace, "--slo-ttft-ms", 50, "--controller", spec, *LINEAR, code=2)
    assert words in out.output and "Traceback" not in out.output


@pytest.mark.parametrize("spec, words", [
    # sim's advice (--split P:D) is not plan's: plan compares aggregated fleets, its --split is agg|auto
    ("dynamo-load:ttft=500,prefill_max=3", "prefill_max= bound a P/D fleet's pools, but plan --controller compares "
                                           "autoscaled aggregated fleets only: give min= instead"),
    ("hpa:target=1,decode_min=1,decode_max=3", "decode_min= and decode_max= bound a P/D fleet's pools"),
    # the spec quoted as typed, not with plan's max=N added
    ("dynamo-load:fpm=sometimes", "controller 'dynamo-load:fpm=sometimes': fpm=sometimes must be one of"),
])
def test_a_controller_refused_by_plan_says_what_plan_takes(day_trace, spec, words):
    out = _plan("--trace", day_trace, "--slo-ttft-ms", 50, "--controller", spec, *LINEAR, code=2)
    (line,) = out.stderr.splitlines()
    assert words in line and "--split P:D" not in line and not re.search(r"[:,]max=\d", line), line


def test_a_pd_candidate_refuses_it(day_trace):
    out = _plan("--trace", day_trace, "--slo-ttft-ms", 50, "--controller", "static", "--split", "auto", *LINEAR,
                code=2)
    assert "--controller has no effect with a P/D split" in out.output


def test_an_attention_dp_candidate_refuses_it_before_any_replay(day_trace, tmp_path):
    log = tmp_path / "log.jsonl"
    out = _plan("--trace", day_trace, "--slo-ttft-ms", 50, "--controller", "static", "--model", "qwen3-30b-a3b",
                "--ep", "2", "--dp-attention", "--log", str(log), *LINEAR, code=2)
    assert "--controller with --dp-attention is not modelled" in out.output
    assert not log.exists() or not log.read_text().strip()  # refused before the first replay


# ------------------------------------------------------------------------------ the figures, by hand
def test_bounded_adds_max_or_starts_at_the_cap():
    assert bounded("hpa:target=32", 4) == ("hpa:target=32,max=4", 1)
    assert bounded("dynamo-load", 6) == ("dynamo-load:max=6", 1)
    assert bounded("dynamo-load:min=2", 6) == ("dynamo-load:min=2,max=6", 2)
    assert bounded("static", 4) == ("static", 4)
    with pytest.raises(ValueError, match=r"'hpa:target=32,min=5': min=5 is above the most workers plan replays \(4"):
        bounded("hpa:target=32,min=5", 4)  # (the spec as typed: no max=4 the user never gave)


def test_figures_by_hand():
    # 4 workers of TP 2 for a makespan of 900 s: 4 x 2 x 900 / 3,600 = 2.0 GPU-hours; at 2.5 USD: 5.0. The
    # autoscaled run's 1.2 GPU-hours: 3.0 USD, 40 % fewer; its peak is the largest count over time
    shape = Shape("llama-3.1-8b", "h100", 2, "rr")
    search = SimpleNamespace(tested={4: (True, {"makespan_s": 900.0})})
    o = SimpleNamespace(shape=shape, workers=4, search=search, floor=None)
    result = {"gpu_hours": 1.2, "goodput": 0.99, "ttft_ms": {"p99": 400.0}, "tpot_ms": {"p99": 10.0},
              "workers_over_time": [[0, 1], [60, 3], [600, 2]], "scale_events": [[15, "add", 1]] * 3,
              "oscillations": 0}
    f = figures(o, "hpa:target=1,max=4", 1, 4, result, Target(500, None, "p99", None), {"h100": 2.5})
    assert (f["static_gpu_hours"], f["static_cost_usd"], f["gpu_hours"], f["cost_usd"]) == (2.0, 5.0, 1.2, 3.0)
    assert (f["saved_pct"], f["peak_workers"], f["scale_events"], f["meets"]) == (40.0, 3, 3, True)
    # a TTFT of 600 ms misses the 500 ms target, said in the target's words
    f = figures(o, "x", 1, 4, {**result, "ttft_ms": {"p99": 600.0}}, Target(500, None, "p99", None), {})
    assert f["misses"] == ["TTFT p99 600 ms > 500 ms"] and f["price_source"] is not None  # the table's h100 price


def test_lines_only_with_the_option():
    assert lines({"shapes": [{"shape": "a"}]}) == []
    assert lines({"shapes": [{"shape": "a", "autoscaled": None}]}) == [
        "autoscaled: no shape has an answer to compare with"]


@given(cap=st.integers(1, 64), low=st.integers(1, 64))
@settings(max_examples=30, deadline=None)
def test_bounded_keeps_min_and_sets_max(cap, low):
    # an Autoscaler's bounds: the spec replayed gets max = cap and starts at its own min; a min above cap is refused
    if low > cap:
        with pytest.raises(ValueError):
            bounded(f"hpa:target=4,min={low}", cap)
        return
    assert bounded(f"hpa:target=4,min={low}", cap) == (f"hpa:target=4,min={low},max={cap}", low)
    assert bounded("static", cap) == ("static", cap)  # no bounds: it starts at the cap and holds it
