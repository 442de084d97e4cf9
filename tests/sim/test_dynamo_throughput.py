"""``dynamo-throughput`` (issue 41, item 1): Dynamo Planner's throughput-based scaling on one aggregated pool. The
formula and the predictors by hand on made-up states; the replayed capacity on the flat 100 ms step model of
``tests/sim/test_autoscale.py``; statsmodels' ARIMA (the ``arima`` extra, in the ``test`` extra: these run in CI); a
P/D fleet's two pool formulas and their step-model capacities (``dynamo_pd_capacity``) by hand on a made-up model, and
the decode batch's maximality as a property."""
from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynlab.engine.config import SimConfig
from dynlab.engine.controller import Add, FleetState, Retire, RunInfo, WorkerState
from dynlab.latency.base import StepBatch
from dynlab.sim.control import build_controller
from dynlab_builtins.dynamo_pd_capacity import decode_batch, decode_tokens_per_ms, prefill_ms, prefill_tokens_per_ms
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


# ----------------------------------------------------------------------------- P/D pools (dynamo_pd_capacity)
class _Lines:
    """A made-up step model: 10 ms + 0.01 ms a prompt token + 1 ms a decoding request + 0.0001 ms a decode context
    token (non-decreasing in every field, as the LatencyModel contract asks)."""

    def step_ms(self, batch):
        return 10.0 + 0.01 * sum(batch.prefill_tokens) + 1.0 * batch.decode_requests + 0.0001 * batch.decode_context


def test_a_prefill_workers_capacity_is_the_prompt_over_its_chunked_prefill():
    # ISL 1,000 in chunks of 512: 512 then 488 tokens, (10 + 5.12) + (10 + 4.88) = 30 ms: 1,000 / 30 tokens per ms
    assert prefill_ms(_Lines(), 1000, 512) == pytest.approx(30.0)
    assert prefill_tokens_per_ms(_Lines(), 1000, 512) == pytest.approx(1000 / 30)
    # one chunk (budget 8,192): 10 + 10 = 20 ms: 50 tokens per ms
    assert prefill_tokens_per_ms(_Lines(), 1000, 8192) == pytest.approx(50.0)


def test_a_decode_workers_capacity_is_the_largest_batch_within_the_itl_target():
    # context ISL + OSL / 2 = 1,000 + 100 = 1,100 tokens; step(B) = 10 + B + 0.0001 x 1,100 B = 10 + 1.11 B ms;
    # within 50 ms: B <= 40 / 1.11 = 36.04, so B = 36, a step of 10 + 39.96 = 49.96 ms: 36 / 49.96 tokens per ms
    assert decode_batch(_Lines(), 1100, 50.0, 256, 1_000_000) == (36, pytest.approx(49.96))
    assert decode_tokens_per_ms(_Lines(), 1000, 200, 50.0, 256, 1_000_000) == pytest.approx(36 / 49.96)
    # a KV pool of 22,000 tokens holds 22,000 // 1,100 = 20 such requests: B = 20, 10 + 22.2 = 32.2 ms
    assert decode_tokens_per_ms(_Lines(), 1000, 200, 50.0, 256, 22_000) == pytest.approx(20 / 32.2)
    # max_num_seqs 8 caps it first: 10 + 8.88 = 18.88 ms
    assert decode_batch(_Lines(), 1100, 50.0, 8, 1_000_000) == (8, pytest.approx(18.88))
    # a target below one request's step (10 + 1.11 = 11.11 ms): B = 1 (Dynamo's lowest-load figure)
    assert decode_batch(_Lines(), 1100, 5.0, 256, 1_000_000) == (1, pytest.approx(11.11))


def _pd(extra, pool, arrivals, live=1):
    workers = tuple(WorkerState(i, "live", 0.0, 0, 0, 0.0, 0, pool=pool) for i in range(live))
    # 5 s periods; ISL 1,000 a request, OSL 200 (20 finished, 4,000 output tokens)
    return FleetState(10.0, 5.0, workers, arrivals, (), 0.0, (), arrivals * 1000, 20, 4000, pool)


def test_a_pd_fleets_pools_are_sized_by_dynamos_two_formulas():
    c = build_controller("dynamo-throughput:period=5,cold_start_s=0,itl=50,decode_max=20,prefill_max=4,gpu_budget=64")
    c.bind(RunInfo(_Lines(), 1, 256, 512, 1_000_000, None))
    # 200 arrivals in 5 s = 40 requests/s = 0.04 per ms. Prefill: 0.04 x 1,000 = 40 prompt tokens per ms over a
    # worker's 1,000 / 30 (above): ceil(1.2) = 2 prefill workers, 1 live: one add to the prefill pool
    assert c.decide(_pd("", "prefill", 200)) == [Add(0.0, "prefill")]
    assert c.last["replicas"] == 2 and c.last["worker_tokens_per_s"] == pytest.approx(1000 / 30 * 1000)
    # decode: 0.04 x 200 = 8 output tokens per ms over 36 / 49.96 = 0.7206: ceil(11.10) = 12 decode workers, 3 live
    assert c.decide(_pd("", "decode", 200, live=3)) == [Add(0.0, "decode")] * 9
    # the period was observed once (on the prefill pool's call), not once per pool
    assert c.num_req.values == [200.0]
    # decode_max=20 bounds it: 600 arrivals = 0.12 per ms, 24 tokens per ms / 0.7206 = 33.3 -> 20
    c.decide(_pd("", "prefill", 600, live=2))
    assert c.decide(_pd("", "decode", 600, live=12)) == [Add(0.0, "decode")] * 8
    # the default GPU budget (8 GPUs, 1 a worker) bounds each pool at 8 workers: 12 wanted, 3 live: 5 adds
    c = build_controller("dynamo-throughput:period=5,cold_start_s=0,itl=50,decode_max=20")
    c.bind(RunInfo(_Lines(), 1, 256, 512, 1_000_000, None))
    assert c.decide(_pd("", "decode", 200, live=3)) == [Add(0.0, "decode")] * 5


def test_without_prefill_bounds_only_the_decode_pool_is_sized_and_observes():
    c = build_controller("dynamo-throughput:period=5,cold_start_s=0,itl=50,decode_max=20")
    c.bind(RunInfo(_Lines(), 1, 256, 512, 1_000_000, None))
    assert not c.scales_prefill
    # 40 arrivals = 8/s: 0.008 x 200 = 1.6 tokens per ms / 0.7206 = 2.22 -> 3 decode workers; 5 live: retire 2
    assert [d.worker for d in c.decide(_pd("", "decode", 40, live=5))] == [4, 3]
    assert c.num_req.values == [40.0]


class _Affine:
    def __init__(self, base, per_request, per_token):
        self.base, self.per_request, self.per_token = base, per_request, per_token

    def step_ms(self, batch):
        return self.base + self.per_request * batch.decode_requests + self.per_token * batch.decode_context


@given(st.floats(1, 20), st.floats(0.01, 2), st.floats(0, 0.001), st.floats(1, 100), st.integers(1, 512),
       st.integers(100, 4000), st.integers(1_000, 2_000_000))
def test_the_decode_batch_is_the_largest_within_the_target(base, per_request, per_token, itl, seqs, context, kv):
    model = _Affine(base, per_request, per_token)
    b, ms = decode_batch(model, context, itl, seqs, kv)
    cap = max(min(seqs, kv // context), 1)
    step = lambda n: model.step_ms(StepBatch((), (), n, n * context))  # noqa: E731
    assert 1 <= b <= cap and ms == step(b)
    if step(1) <= itl:  # within the target, and one more request would miss it or break a cap
        assert ms <= itl and (b == cap or step(b + 1) > itl)
