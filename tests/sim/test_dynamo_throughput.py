"""``dynamo-throughput`` (issue 41, item 1): Dynamo Planner's throughput-based scaling on one aggregated pool. The
formula and the predictors by hand on made-up states; the replayed capacity on the flat 100 ms step model of
``tests/sim/test_autoscale.py``; statsmodels' ARIMA (the ``arima`` extra, in the ``test`` extra: these run in CI)."""
from __future__ import annotations

import sys

import pytest

from dynlab.engine.config import SimConfig
from dynlab.engine.controller import Add, FleetState, Retire, RunInfo, WorkerState
from dynlab.sim.control import build_controller
from dynlab_builtins.dynamo_throughput import Predictor, capacity, two_digits
from test_autoscale import FLAT, _step


def _state(arrivals, prompt, finished, output, live=1, period=5.0):
    workers = tuple(WorkerState(i, "live", 0.0, 0, 0, 0.0, 0) for i in range(live))
    return FleetState(10.0, period, workers, arrivals, (), 0.0, (), prompt, finished, output)


def _controller(extra="", gpus=1, per_worker=2.0):
    c = build_controller("dynamo-throughput:period=5,cold_start_s=0" + extra)
    c.bind(RunInfo(None, gpus, 1, 8192, 100_000, None))
    c.cache[(1000, 200)] = per_worker  # a worker's requests/s at the targets, as the replay would measure it
    return c


def test_the_replicas_are_the_predicted_rate_over_a_workers_capacity():
    # constant predictor: 40 arrivals in 5 s = 8/s, ISL 40,000 / 40 = 1,000, OSL 2,000 / 10 = 200; a worker serves
    # 2/s: ceil(8 / 2) = 4 replicas, 1 live: 3 adds (cold start 0)
    c = _controller()
    assert c.decide(_state(40, 40_000, 10, 2_000)) == [Add(0.0)] * 3
    assert c.last["replicas"] == 4 and c.last["rate_per_s"] == 8.0
    # the next interval: 10 arrivals = 2/s: ceil(2 / 2) = 1 replica; 4 live: retire 3, newest first
    assert [d.worker for d in c.decide(_state(10, 10_000, 10, 2_000, live=4))] == [3, 2, 1]
    # moving average over 2 intervals: (40 + 10) / 2 = 25 arrivals per 5 s = 5/s: ceil(5 / 2) = 3 replicas
    c = _controller(",predictor=average,window=2")
    c.decide(_state(40, 40_000, 10, 2_000))
    assert c.decide(_state(10, 10_000, 10, 2_000, live=4)) == [Retire(3)]
    assert c.last["replicas"] == 3
    # a GPU budget of 4 GPUs, 2 GPUs a worker (Dynamo's _apply_component_gpu_budget): at most 2 workers, not 4
    c = _controller(",gpu_budget=4", gpus=2)
    assert c.decide(_state(40, 40_000, 10, 2_000)) == [Add(0.0)]
    # no request seen finishing yet (no OSL): nothing to size by
    assert _controller().decide(_state(40, 40_000, 0, 0)) == ()


def test_the_predictors_by_hand():
    avg = Predictor("average", 3, 5)
    for v in (3, 6, 9, 30):
        avg.add(v)
    assert avg.next() == pytest.approx((6 + 9 + 30) / 3)  # the last 3
    arima = Predictor("arima", 3, 5)
    for v in (10, 20, 30, 40):
        arima.add(v)
    assert arima.next() == 40  # fewer than min_points (5): the last value, Dynamo's warm-up fallback
    for v in (50, 60, 70, 80):
        arima.add(v)
    assert arima.next() == pytest.approx(90, abs=0.5)  # a line of slope 10 goes on to 90
    flat = Predictor("arima", 3, 5)
    for v in (50,) * 8:
        flat.add(v)
    assert flat.next() == pytest.approx(50, abs=0.5)
    assert two_digits(1013) == 1000 and two_digits(196.4) == 200 and two_digits(7) == 7


def test_arima_without_statsmodels_is_a_one_line_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "statsmodels", None)  # import statsmodels raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'dynlab\[arima\]'"):
        build_controller("dynamo-throughput:predictor=arima")


def test_the_replayed_capacity_on_the_flat_step_model():
    # one request in a batch, every step 100 ms: a request of 16 prompt and 5 output tokens takes 5 steps (500 ms),
    # so a worker serves at most 2/s, and its TPOT is exactly 100 ms ((finish - first token) / 4 gaps of 100 ms)
    config = SimConfig(timing=True, max_num_seqs=1, capacity=64, **FLAT)
    # itl=99: no rate meets it: the floor, 1/64 requests/s
    assert capacity(config, 16, 5, 1000.0, 99.0, 50) == 1.0 / 64.0
    # itl=150, ttft=1,000: at 1/s (load 0.5) the mean wait of a Poisson queue of 500 ms jobs is 0.5 / (2 x 2 x 0.5) =
    # 0.25 s (M/D/1), TTFT about 350 ms: met; at 2/s or more the queue only grows: 1 <= capacity < 2
    assert 1.0 <= capacity(config, 16, 5, 1000.0, 150.0, 50) < 2.0


def test_in_the_loop_it_scales_up_for_the_step(tmp_path):
    # the step of test_autoscale.py (1/s, 4/s from 60 to 120 s, then 1/s; 500 ms a request, max_num_seqs 1), period
    # 20 s: the capacity replayed at ISL 16, OSL 5 is between 1 and 2/s (above); the call at 80 s sees 4/s: at least
    # ceil(4 / 2) = 2 workers, at most ceil(4 / 1) = 4 (max=4)
    out = _step(tmp_path, controller="dynamo-throughput:period=20,itl=150,ttft=1000,max=4,cold_start_s=10,"
                                     "replay_requests=50")
    adds = [e for e in out["scale_events"] if e[1] == "add"]
    assert adds and {e[0] for e in adds} <= {80.0} and 1 <= len(adds) <= 3
    assert out["scale_events"][-1][1] == "retire"  # back down after the step


def test_bad_options_are_refused():
    for spec, words in (("dynamo-throughput:predictor=prophet", "predictor=prophet"),
                        ("dynamo-throughput:gpu_budget=0", "gpu_budget"), ("dynamo-throughput:window=0", "window")):
        with pytest.raises(ValueError, match=words):
            build_controller(spec)
