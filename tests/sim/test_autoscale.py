"""Autoscalers in the loop (issue 41, first part): ``static``, ``hpa``, the cold start and the scaling figures.

The step workload, on a flat linear step model (every step 100 ms: beta0 = 100, no per-token term, every overhead
off) with one request in a batch (``max_num_seqs`` 1): a request of 16 fresh tokens and 5 output tokens takes 5
steps = 500 ms (its first token at the end of the first, 100 ms after it starts), so one worker serves 2 requests/s.
Arrivals are deterministic: one a second at k + 0.1 s for k < 60, four a second (every 0.25 s from 60.1 s: x4) for
60 s, then one a second again from 120.1 s to 479.1 s. TTFT SLO 1,000 ms. HPA: period 5 s, metric queue (requests
waiting in a worker's engine) with target 1, max 4 workers, cold start 10 s; routing least-loaded.
"""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.engine.autoscale import cold_start_s
from dynlab.engine.config import SimConfig
from dynlab.engine.controller import Add, FleetState, Retire, StepSample, WorkerState
from dynlab.sim import run
from dynlab.sim.control import build_controller
from helpers import terms_off

FLAT = {"latency_model": "linear", **terms_off("linear", {"beta0": 100, "beta1": 0, "beta2": 0})}
HPA = "hpa:period=5,max=4,target=1,cold_start_s=10"


def _step_trace(path):
    times = [k + 0.1 for k in range(60)] + [60.1 + 0.25 * k for k in range(240)] + [k + 0.1 for k in range(120, 480)]
    path.write_text("".join(json.dumps({"timestamp": round(t * 1000), "output_length": 5,
                                        "tokens": list(range(100 * i + 1, 100 * i + 17))}) + "\n"
                            for i, t in enumerate(times)))
    return str(path)


def _step(tmp_path, controller=HPA, **kw):
    config = SimConfig(trace=_step_trace(tmp_path / "step.jsonl"), trace_format="tokens", timing=True,
                       controller=controller, **{"mode": "least-loaded", "capacity": 64, "workers": 1,
                                                  "max_num_seqs": 1, "slo_ttft_ms": 1000, **FLAT, **kw})
    return run(config)


def test_hpa_scales_up_for_the_step_dips_for_the_cold_start_and_comes_down_after_the_window(tmp_path):
    out = _step(tmp_path)
    # 65 s, the first call in the step: worker 0 started the step's requests at 60.1 + 0.5 j (each 0.5 s, arrivals
    # every 0.25 s): 10 started by 65 (60.1 ... 64.6), 20 arrived (60.1 ... 64.85): 10 waiting; desired =
    # ceil(1 x 10 / 1) = 10; the scale-up policy allows max(1 + 4, ceil(1 x 2)) = 5, max=4 allows 4: 3 adds, ready at
    # 65 + 10 = 75 s. Calls at 70 to 85 s keep 4 (ceil(20 / 4 x 4) and the others are above max). Worker 0's 30
    # waiting at 75 s (60 arrived by 74.85, 30 started) get no company (least-loaded sends the new ones to the three
    # idle workers) and start at 75.1 + 0.5 m: at 85 s 20 started, 10 waiting (mean 10 / 4 = 2.5: desired 10), at
    # 90 s all 30 started, none waiting (desired 0). The highest recommendation of the last 300 s stays >= 4 until
    # 85 s leaves the window (strictly after now - 300): at 385 s the fleet goes to min 1, newest first.
    assert out["scale_events"] == [[65.0, "add", 1], [65.0, "add", 2], [65.0, "add", 3],
                                   [385.0, "retire", 3], [385.0, "retire", 2], [385.0, "retire", 1]]
    assert out["workers_over_time"] == [[0.0, 1], [75.0, 2], [75.0, 3], [75.0, 4],
                                        [385.0, 3], [385.0, 2], [385.0, 1]]
    assert out["oscillations"] == 0
    # the dip, by arrival window: in [60, 65) request k (at 60.1 + 0.25 k) waits 0.25 k s, TTFT 250 k + 100 ms <=
    # 1,000 for k <= 3: 4 of 20 = 0.2; every request arriving in [65, 75) waits >= 5 s on worker 0; from 75.1 s the
    # new workers take the arrivals at once (TTFT 100 ms). The dip lasts one period (the call that sees the queue)
    # plus the cold start: 5 + 10 = 15 s.
    dip = [w for w in out["goodput_over_time"] if w[1] < 1.0]
    assert dip == [[60.0, 0.2], [65.0, 0.0], [70.0, 0.0]]
    assert out["worst_window_goodput"] == 0.0
    # GPU-hours (1 GPU per worker): worker 0 from 0 to the last finish (479.1 + 0.5 s), workers 1-3 from their add
    # at 65 s to their retirement at 385 s (idle then: they leave at once): (479.6 + 3 x 320) / 3600 h.
    assert out["gpu_hours"] == pytest.approx((479.6 + 3 * 320) / 3600, abs=1e-6)
    assert [w["left_s"] for w in out["worker_lifetimes"]] == [None, 385.0, 385.0, 385.0]


def test_without_the_stabilisation_window_hpa_flaps_and_the_reversal_is_counted(tmp_path):
    out = _step(tmp_path, controller=HPA + ",down_window=0")
    # at 90 s no request waits (above): desired 0 -> min 1, three retires at once; worker 0 alone then gets the
    # step's arrivals again: at 95 s 20 arrived since 90.1, 10 started: 10 waiting -> 3 adds (5 s after the retires,
    # within 4 periods = 20 s: one oscillation); ready at 105 s, worker 0's 30 waiting start at 105.1 + 0.5 m, all
    # by 120 s, when the step has ended: three retires again (25 s after the adds: not within 20 s).
    assert [e for e in out["scale_events"] if e[1] == "retire" and e[2] == 3] == [[90.0, "retire", 3]]
    assert sorted({e[0] for e in out["scale_events"]}) == [65.0, 90.0, 95.0, 120.0]
    assert out["oscillations"] == 1
    assert [w for w in out["goodput_over_time"] if w[1] < 1.0] == [[60.0, 0.2], [65.0, 0.0], [70.0, 0.0],
                                                                  [90.0, 0.2], [95.0, 0.0], [100.0, 0.0]]


def test_kill_on_scale_down_requeues_and_every_request_finishes(tmp_path):
    out = _step(tmp_path, controller=HPA + ",down_window=0,scale_down=kill")
    assert {w["left_by"] for w in out["worker_lifetimes"][1:]} == {"kill"}
    # 60 + 240 + 360 = 660 requests, a requeued one routed twice; each finishes once (one TTFT each)
    assert out["requeued"] > 0 and out["requests"] == 660 + out["requeued"]
    assert len(out["goodput_over_time"]) == 96  # every 5 s window of arrivals, 0 to 475 s


def test_static_gives_the_same_serving_result_as_a_fixed_fleet(tmp_path):
    fixed = _step(tmp_path, controller="none", workers=3)
    static = _step(tmp_path, controller="static", workers=3)
    assert {k: static[k] for k in fixed if k != "controller"} == {k: v for k, v in fixed.items() if k != "controller"}
    assert static["scale_events"] == [] and static["oscillations"] == 0
    # three workers from 0 s to the last finish, 479.6 s
    assert static["gpu_hours"] == pytest.approx(3 * 479.6 / 3600, abs=1e-6)


def test_the_default_cold_start_is_the_catalogue_weights_over_the_load_bandwidth_plus_start_up(tmp_path):
    # Llama-3.1-8B (the default model): 8,030,261,248 parameters x 2 B = 16,060,522,496 B; at 2 GB/s 8.030 s, plus
    # 30 s of start-up: 38.030 s; load_gbps=4, startup_s=10: 4.015 + 10 = 14.015 s
    assert cold_start_s(16_060_522_496) == pytest.approx(38.0302612, abs=1e-6)
    for spec, ready in (("hpa:period=5,max=4,target=1", 65 + 38.03), ("hpa:period=5,max=4,target=1,load_gbps=4,"
                                                                     "startup_s=10", 65 + 14.015)):
        out = _step(tmp_path, controller=spec)
        assert out["worker_lifetimes"][1]["joined_s"] == 65.0
        assert out["worker_lifetimes"][1]["ready_s"] == pytest.approx(ready, abs=1e-3)


@pytest.mark.parametrize("spec, words", [
    ("hpa:target=1", "max=N"), ("hpa:max=4", "target=X"), ("hpa:max=4,target=1,metric=gpu", "metric=gpu"),
    ("hpa:max=2,min=3,target=1", "below min"), ("hpa:max=4,target=1,scale_down=evict", "scale_down"),
    ("static:max=4", "unknown option"), ("hpa:max=4,target=1,window=3", "unknown option"),
    ("dynamo-load:sensitivity=200", "a percentage of the targets, 0 to 100"),
])
def test_bad_controller_options_are_one_line_errors(spec, words):
    with pytest.raises(ValueError, match=words):
        build_controller(spec)


def _state(now, live, starting=0, waiting=0):
    workers = [WorkerState(i, "live", 0.0, waiting if i == 0 else 0, 0, 0.0, 0) for i in range(live)]
    workers += [WorkerState(live + i, "starting", now + 10, 0, 0, 0.0, 0) for i in range(starting)]
    return FleetState(now, 15.0, tuple(workers), 0, ())


def test_hpa_rule_tolerance_and_not_ready_workers():
    hpa = build_controller("hpa:max=100,target=10,cold_start_s=0")
    # 2 live workers, 21 waiting: mean 10.5, ratio 1.05, within 0.1: nothing
    assert hpa.decide(_state(15, 2, waiting=21)) == []
    # 24 waiting: ratio 1.2 -> ceil(2 x 1.2) = 3: one add
    assert hpa.decide(_state(30, 2, waiting=24)) == [Add(0.0)]
    # 1 live + 1 starting, 30 waiting: ratio 3 (scaling up) -> the starting one at 0: 30 / (2 x 10) = 1.5 ->
    # ceil(2 x 1.5) = 3; the policy: the add at 30 s is not strictly within 15 s of 45: start 2, limit max(6, 4)
    assert hpa.decide(_state(45, 1, starting=1, waiting=30)) == [Add(0.0)]
    # 1 live + 2 starting, 11 waiting: ratio 1.1, |1.1 - 1| <= 0.1 (the tolerance's edge): nothing
    assert hpa.decide(_state(60, 1, starting=2, waiting=11)) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 3), st.integers(0, 80)), min_size=1, max_size=12),
       st.integers(1, 3), st.integers(3, 9))
def test_hpa_stays_within_its_bounds_and_its_scale_up_policy(calls, lo, hi):
    hpa = build_controller(f"hpa:min={lo},max={hi},target=2,cold_start_s=0,down_window=30")
    for k, (live, starting, waiting) in enumerate(calls):
        state = _state(15.0 * (k + 1), live, starting, waiting)
        out = hpa.decide(state)
        current = live + starting
        adds = sum(1 for d in out if type(d) is Add)
        retires = sum(1 for d in out if type(d) is Retire)
        assert adds == 0 or retires == 0
        n = current + adds - retires
        assert n == current or lo <= n <= hi  # a change lands within [min, max]
        assert adds <= max(4, current)  # the default scale-up policy: +4 pods or +100 % per 15 s
        assert retires <= current - 1  # never the last worker


# dynamo-load on a hand model: step ms = 10 + 0.5 x prefill tokens + 0.01 x KV tokens, five samples that fit it
# exactly (worker, prefill tokens, prefill requests, decode requests, KV tokens, ms): avg_isl = mean(100/1, 200/2,
# 100/1) = 100 tokens, avg_decode_len = mean(1000/10, 2000/20, 1000/10) = 100, prompt tokens per step = mean(100,
# 200, 0, 0, 100) = 80
SAMPLES = tuple(StepSample(*s) for s in ((0, 100, 1, 0, 0, 60.0), (0, 200, 2, 0, 0, 110.0), (0, 0, 0, 10, 1000, 20.0),
                                         (0, 0, 0, 20, 2000, 30.0), (0, 100, 1, 10, 1000, 70.0)))


def _load_state(queued, kv, live=1, starting=0, steps=SAMPLES):
    workers = [WorkerState(i, "live", 0.0, 0, 0, 0.0, 0, queued, kv, 100_000, 2048) for i in range(live)]
    workers += [WorkerState(live + i, "starting", 9.0, 0, 0, 0.0, 0) for i in range(starting)]
    return FleetState(5.0, 5.0, tuple(workers), 0, (), 0.0, steps)


def test_dynamo_load_regression_and_its_decisions_by_hand():
    from dynlab_builtins.dynamo_planner import fit

    assert fit(SAMPLES) == pytest.approx((10.0, 0.5, 0.01), abs=1e-6)
    # fpm=every: the five samples all feed the regression (fpm=latest would take one per worker)
    make = lambda extra="": build_controller("dynamo-load:cold_start_s=0,fpm=every" + extra)  # noqa: E731
    # one worker, 4,000 prompt tokens queued, 1,000 KV tokens: 4,000 + 100 tokens in chunks of 2,048: 2 x (10 +
    # 1,024 + 10) + (10 + 2 + 10) = 2,110 ms > 500: every worker above the TTFT target, one more
    assert make().decide(_load_state(4000, 1000)) == [Add(0.0)]
    # fewer than 5 samples, or a worker still starting: no decision
    assert make().decide(_load_state(4000, 1000, steps=SAMPLES[:4])) == ()
    assert make().decide(_load_state(4000, 1000, starting=1)) == ()
    # two idle-ish workers (nothing queued, 1,000 KV tokens), itl=100: no side says up (TTFT 10 + 50 + 10 = 70 ms,
    # ITL 10 + 40 + 0.01 x 1,100 = 61 ms); one retired, the survivor's steps carry twice the prompt tokens (160) at
    # 2,000 KV: ITL 10 + 80 + 21 = 111 >= 100 x 0.8: the decode side holds
    assert make(",itl=100").decide(_load_state(0, 1000, live=2)) == ()
    # 600 tokens queued each: TTFT 10 + 350 + 10 = 370 < 500 (no up); after consolidation 1,200 queued at 2,000 KV:
    # 1,300 tokens, 10 + 650 + 20 = 680 ms, its queue part 680 - 80 = 600 >= 336: the prefill side holds (and the
    # decode side: (1,000 + 600) x 2 = 3,200 KV, ITL 10 + 40 + 33 = 83 >= 80)
    assert make(",itl=100").decide(_load_state(600, 1000, live=2)) == ()


def test_dynamo_load_does_not_see_a_queue_of_requests_held_by_max_num_seqs(tmp_path):
    out = _step(tmp_path, controller="dynamo-load:period=5,ttft=1000,itl=150,max=4,cold_start_s=10")
    # the flat model: every step 100 ms whatever its tokens, so the fit is 100 ms flat; the TTFT estimate simulates the
    # queued prompt tokens in chunks of the token budget (8,192): at most 240 requests x 16 tokens + 16 = 3,856 tokens,
    # one chunk, 100 ms < 1,000; the ITL estimate 100 < 150. The queue here is held by max_num_seqs = 1, which Dynamo's
    # estimate does not model: no scale-up (and one worker cannot scale down), whatever the SLO windows say.
    assert out["scale_events"] == []
    assert out["worst_window_goodput"] == 0.0


# a lighter hand model: step ms = 10 + 0.01 x prefill tokens + 0.001 x KV tokens, fitted exactly by 5 samples;
# avg_isl = 100, avg_decode_len = 100, prompt tokens per step 400 / 5 = 80
LIGHT = tuple(StepSample(*s) for s in ((0, 100, 1, 0, 0, 11.0), (0, 200, 2, 0, 0, 12.0), (0, 0, 0, 10, 1000, 11.0),
                                       (0, 0, 0, 20, 2000, 12.0), (0, 100, 1, 10, 1000, 12.0)))


def test_dynamo_load_scales_down_on_the_survivors_prompt_tokens_and_up_whenever_every_estimate_misses():
    make = lambda extra="": build_controller("dynamo-load:cold_start_s=0,fpm=every" + extra)  # noqa: E731
    # two workers, nothing queued, 1,000 KV tokens each. One retired: the survivor's KV 2,000 and its steps carrying
    # twice the prompt tokens: ITL 10 + 0.01 x 160 + 0.001 x (2,000 + 100) = 13.7 ms; the TTFT side: 10 + 0.01 x 100
    # + 0.001 x 2,000 = 13 ms, no queue. itl=20: 13.7 < 16 (80 %): down, the newest
    assert make(",itl=20").decide(_load_state(0, 1000, live=2, steps=LIGHT)) == [Retire(1)]
    # itl=17: 13.7 >= 13.6: hold (the prompt tokens per step kept at 80 would give 10 + 0.8 + 2.1 = 12.9 < 13.6 and
    # retire: the 1<->2 flapping of docs/autoscaling.md's step)
    assert make(",itl=17").decide(_load_state(0, 1000, live=2, steps=LIGHT)) == ()
    # Dynamo's _scale_decision adds a worker when every estimate is above the target, whatever the worker's load:
    # the estimate of an idle worker still carries one average prompt (TTFT) and the average step (ITL). With
    # SAMPLES, nothing queued and 1,000 KV tokens: TTFT 10 + 0.5 x 100 + 0.01 x 1,000 = 70 ms > 65: up; with no KV
    # either, 10 + 50 = 60 ms > 50: up (the target is out of reach even empty; Dynamo's older Prometheus-based
    # agg_planner skipped such a target, its FPM-based load_scaling.py does not)
    assert make(",ttft=65,itl=100").decide(_load_state(0, 1000)) == [Add(0.0)]
    assert make(",ttft=50,itl=100").decide(_load_state(0, 0)) == [Add(0.0)]
    # ttft=75: 70 <= 75, and the ITL 10 + 40 + 0.01 x 1,100 = 61 <= 100: one worker cannot go down: nothing
    assert make(",ttft=75,itl=100").decide(_load_state(0, 1000)) == ()


@pytest.mark.parametrize("spec, words", [
    # every replica bound is read as max is: an integer from 1 to MAX_WORKERS (2,000,000: dynlab/limits.py)
    ("hpa:target=1,max=2.5", "max=2.5 must be an integer >= 1"),
    ("hpa:target=1,decode_max=2.5", "decode_max=2.5 must be an integer >= 1"),
    ("hpa:target=1,decode_max=4,prefill_max=2.5", "prefill_max=2.5 must be an integer >= 1"),
    ("hpa:target=1,max=1e30", "max=1e30 must be at most 2,000,000"),
    ("hpa:target=1,decode_max=1e30", "decode_max=1e30 must be at most 2,000,000"),
    ("hpa:target=1,decode_max=4,prefill_max=3e6", "prefill_max=3e6 must be at most 2,000,000"),
    ("dynamo-load:decode_min=2000001", "decode_min=2000001 must be at most 2,000,000"),
    # a bound below its lower one names the keys the user gave
    ("hpa:target=1,decode_max=4,decode_min=5", "decode_max=4 is below decode_min=5"),
    ("hpa:target=1,max=4,min=5", ": max=4 is below min=5"),
    ("hpa:target=1,decode_max=4,prefill_min=3,prefill_max=2", "prefill_max=2 is below prefill_min=3"),
])
def test_replica_bounds_are_integers_within_the_worker_limit(spec, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        build_controller(spec)


def test_the_largest_replica_bound_is_taken():
    assert build_controller("hpa:target=1,decode_max=2000000").max == 2_000_000  # MAX_WORKERS itself
    assert build_controller("hpa:target=1,max=4e0").max == 4  # an integer written as a float is one
