"""Elastic P/D fleets (issue 41 item 1, "separate prefill/decode pools"): a controller scales the decode pool of a
``--split P:D`` fleet (dynlab.disagg.elastic); the prefill pool keeps its P workers unless the controller scales it
(tests/sim/test_pd_prefill_elastic.py).

Hand cases on a flat linear step model (every step 100 ms: beta0 = 100, no per-token term, every overhead off) with one
request in a batch (``max_num_seqs`` 1) on every worker, 16-token prompts of fresh tokens and 5 output tokens: a prefill
worker takes one step (100 ms) and hands the request off at its first token; its KV (16 tokens x 131,072 B per token of
Llama-3.1-8B's KV: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 2,097,152 B) crosses the prefill worker's link;
the decode worker then computes the 4 tokens left in 4 steps (400 ms), the user's first token at the end of the
first. At the default 50 GB/s the transfer takes 2,097,152 / 5e7 B/ms = 0.042 ms (times below are within 0.1 ms).
"""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynlab import hookimpl, plugins
from dynlab.engine.config import SimConfig
from dynlab.engine.controller import Add, Controller, FleetState, Retire, StepSample, WorkerState
from dynlab.engine.metrics import Recorder
from dynlab.engine.option_rules import check_effective
from dynlab.errors import DynlabError
from dynlab.sim import run
from dynlab.sim.control import build_controller
from helpers import terms_off
from helpers import run_pd as _pd

KV_BYTES = 16 * 131_072  # one request's KV: 2,097,152 B


class PdScripted(Controller):
    """Applies ``script`` (``[(time s, decision)]``): each decision at the first call at or after its time."""

    name = "test-pd-scripted"
    script: list = []
    seen: list = []

    def __init__(self, opts, spec=""):
        super().__init__(opts, spec)
        self.todo = list(self.script)

    def decide(self, state):
        PdScripted.seen.append(state)
        due = [d for t, d in self.todo if state.now_s >= t - 1e-9]
        self.todo = [(t, d) for t, d in self.todo if state.now_s < t - 1e-9]
        return due


class _Plugin:
    @hookimpl
    def dynlab_register_controllers(self, register):
        register(PdScripted)


@pytest.fixture(autouse=True)
def scripted():
    pm = plugins.get_plugin_manager()
    pm.register(_Plugin(), name="test-pd-scripted-controller")
    PdScripted.seen, PdScripted.script = [], []
    try:
        yield PdScripted
    finally:
        pm.unregister(name="test-pd-scripted-controller")


# ----------------------------------------------------------------------------- kills on the decode pool
def test_killing_a_decode_worker_requeues_its_decoding_request_through_the_prefill_router(tmp_path, scripted):
    # A and B arrive at 0 ms. The prefill worker prefills A in [0, 100] and B in [100, 200] (one at a time); the decode
    # router (least-loaded) sends A to decode worker 0 (both idle: lowest id) and B to decode worker 1 (worker 0 holds
    # A). A decodes in [100, 500]; B in [200, 600], its first decode step ending at 300 ms (+ the 0.042 ms transfer).
    # The kill of decode worker 1 at 300 ms (the call at 3 x 100 ms, before that step's end) loses B's KV: B goes back
    # through the prefill router (requeued 1) keeping its arrival (0 ms), is prefilled again in [300, 400], and the
    # only decode worker left, 0, busy with A until 500, decodes it in [500, 900]: TTFT 600 ms (end of its first
    # decode step), E2E 900 ms; A's TTFT 200, E2E 500.
    scripted.script = [(0.3, Retire(1, kill=True, pool="decode"))]
    out = _pd(tmp_path, [0, 0], "test-pd-scripted:period=0.1")
    assert out["requeued"] == 1 and out["elastic_pool"] == "decode"
    assert out["requests"] == 3  # two requests, B routed twice by the prefill router
    assert out["worker_lifetimes"][1]["left_by"] == "kill" and out["worker_lifetimes"][1]["left_s"] == 0.3
    assert out["ttft_ms"]["mean"] == pytest.approx((200 + 600) / 2, abs=0.2)
    assert out["e2e_ms"]["mean"] == pytest.approx((500 + 900) / 2, abs=0.2)
    assert out["scale_events"] == [[0.3, "retire", 1, "decode"]]
    assert out["workers_over_time"] == [[0.0, 2], [0.3, 1]]


def test_killing_a_decode_worker_sends_a_transfer_in_flight_to_another(tmp_path, scripted):
    # A link of 0.02097152 GB/s moves one request's 2,097,152 B in 100 ms. A: prefill [0, 100], link [100, 200], decode
    # worker 0 from 200; B: prefill [100, 200], the link after A's: [200, 300], for decode worker 1. The kill of worker
    # 1 at 250 ms finds B's KV on the link, still held by its prefill worker: B is not requeued but sent again, to
    # worker 0 (the one routable), on the link after the lost transfer: [300, 400]. Worker 0 decodes A in [200, 600]
    # and B in [600, 1000]: TTFTs 300 and 700 ms, E2Es 600 and 1,000 ms; two transfers arrived, each 2,097,152 B.
    scripted.script = [(0.25, Retire(1, kill=True, pool="decode"))]
    out = _pd(tmp_path, [0, 0], "test-pd-scripted:period=0.05", link_gbps=KV_BYTES / 1e8)
    assert out["requeued"] == 0 and out["requests"] == 2
    assert out["transfers"] == 2 and out["transfer_bytes"] == 2 * KV_BYTES
    assert out["ttft_ms"]["mean"] == pytest.approx((300 + 700) / 2, abs=0.2)
    assert out["e2e_ms"]["mean"] == pytest.approx((600 + 1000) / 2, abs=0.2)


def test_a_draining_decode_worker_leaves_when_its_transfer_has_arrived_and_decoded(tmp_path, scripted):
    # As above without the kill: retiring worker 1 at 250 ms drains it: B's KV arrives there at 300, B decodes in
    # [300, 700], and worker 1 leaves then (idle, nothing assigned): left_s 0.7.
    scripted.script = [(0.25, Retire(1, pool="decode"))]
    out = _pd(tmp_path, [0, 0], "test-pd-scripted:period=0.05", link_gbps=KV_BYTES / 1e8)
    assert out["worker_lifetimes"][1]["left_by"] == "drain"
    assert out["worker_lifetimes"][1]["left_s"] == pytest.approx(0.7, abs=1e-3)
    assert out["ttft_ms"]["mean"] == pytest.approx((300 + 400) / 2, abs=0.2)


def test_an_added_decode_worker_takes_requests_once_ready(tmp_path, scripted):
    # One decode worker; a second added at 0.1 s, ready 0.2 s later (0.3 s). Requests at 0, 0.4 s: A goes to worker 0
    # ([100, 500]); B, prefilled in [400, 500], finds worker 1 ready and idle and worker 0 still holding A: worker 1.
    scripted.script = [(0.1, Add(0.2, pool="decode"))]
    out = _pd(tmp_path, [0, 0.4], "test-pd-scripted:period=0.1", split="1:1")
    assert out["worker_lifetimes"][1]["ready_s"] == pytest.approx(0.3)
    assert out["decode_pool"]["workers"] == 2
    # B's decode on worker 1 from 500: its E2E 900 - 400 = 500 ms, A's 500 ms
    assert out["e2e_ms"]["mean"] == pytest.approx(500, abs=0.2)
    assert out["scale_events"] == [[0.1, "add", 1, "decode"]]


def test_a_decision_naming_the_prefill_pool_is_refused_when_it_does_not_scale(tmp_path, scripted):
    scripted.script = [(0.1, Add(0.0, pool="prefill"))]
    with pytest.raises(DynlabError, match="the prefill pool keeps --split's P workers unless the controller scales"):
        _pd(tmp_path, [0, 0.4], "test-pd-scripted:period=0.1")


def test_the_controller_sees_the_decode_pool(tmp_path, scripted):
    _pd(tmp_path, [0, 0], "test-pd-scripted:period=0.15")
    # the call at 150 ms: A (prefilled in [0, 100]) decodes on worker 0; B is being prefilled, nothing on worker 1
    state = scripted.seen[0]
    assert state.pool == "decode" and [w.id for w in state.workers] == [0, 1]
    assert [(w.running, w.active, w.pool) for w in state.workers] == [(1, 1, "decode"), (0, 0, "decode")]
    # the decode steps observed: one, worker 0's [100, 200] step is still running: none ended yet (the prefill
    # worker's step [0, 100] is not the pool's)
    assert state.steps == ()


# ----------------------------------------------------------------------------- hpa on the decode pool, a step of load
def _step_times():
    return [k + 0.1 for k in range(60)] + [60.1 + 0.25 * k for k in range(240)] + [k + 0.1 for k in range(120, 480)]


def test_hpa_scales_the_decode_pool_for_a_step_and_back(tmp_path):
    # The step workload: one request a second at k + 0.1 s, four a second (every 0.25 s from 60.1 s) for 60 s, then one
    # a second. The prefill worker (100 ms each) keeps up; one decode worker takes 400 ms a request (2.5/s): step
    # request j reaches decode worker 0 at 60.2 + 0.25 j s (+ 0.042 ms) and starts at 60.2 + 0.4 j.
    # HPA (period 5 s, metric queue: requests waiting on a decode worker, target 1, decode_max 4, cold start 10 s):
    # at 65 s 20 have reached worker 0 (j <= 19), 12 started (j <= 11; j = 12 starts a hair after 65 s): 8 wait;
    # desired ceil(1 x 8 / 1) = 8, the scale-up policy allows max(1 + 4, 2) = 5, decode_max 4: three adds, ready at
    # 75 s. At 70 s the starting workers count 0: (15 + 0) / 4 = 3.75, desired 15 > 4: no change. From 75 s the
    # least-loaded decode router sends new requests to workers 1-3; worker 0's 23 waiting start by 83.8 s (j = 59):
    # at 80 s 10 wait (desired 10), at 85 s none, nor later (four workers, a request every 0.25 s taking 0.4 s).
    # The highest desired of the last 300 s stays >= 4 until 80 s leaves the window: at 380 s the pool goes to 1.
    out = _pd(tmp_path, _step_times(), "hpa:period=5,decode_max=4,target=1,cold_start_s=10", split="1:1",
              slo_ttft_ms=1000)
    assert out["scale_events"] == [[65.0, "add", 1, "decode"], [65.0, "add", 2, "decode"], [65.0, "add", 3, "decode"],
                                   [380.0, "retire", 3, "decode"], [380.0, "retire", 2, "decode"],
                                   [380.0, "retire", 1, "decode"]]
    assert out["workers_over_time"] == [[0.0, 1], [75.0, 2], [75.0, 3], [75.0, 4], [380.0, 3], [380.0, 2],
                                        [380.0, 1]]
    assert out["oscillations"] == 0
    # the dip: request j of [60, 65) gets its first token at 60.3 + 0.4 j, TTFT 0.2 + 0.15 j s <= 1 for j <= 5: 6 of
    # 20; the arrivals of [65, 75) wait >= 3.2 s; from 75 s the new workers serve at once (TTFT 200 ms)
    assert [w for w in out["goodput_over_time"] if w[1] < 1.0] == [[60.0, 0.3], [65.0, 0.0], [70.0, 0.0]]
    # GPU-hours (1 GPU a worker): the prefill worker and decode worker 0 from 0 to the last finish (479.1 + 0.1 s of
    # prefill + 0.4 s of decode = 479.6 s), decode workers 1-3 from 65 to 380 s
    assert out["gpu_hours_per_pool"] == {"prefill": pytest.approx(479.6 / 3600, abs=1e-6),
                                         "decode": pytest.approx((479.6 + 3 * 315) / 3600, abs=1e-6)}
    assert out["gpu_hours"] == pytest.approx((2 * 479.6 + 3 * 315) / 3600, abs=1e-6)


def test_dynamo_throughput_sizes_the_decode_pool_for_the_step(tmp_path):
    # dynamo-throughput (period 20 s, itl 150 ms, constant predictor) on the step above, one prefill and one decode
    # worker. A decode worker (flat 100 ms steps, max_num_seqs 1) holds one request within 150 ms: 1 / 100 ms = 10
    # output tokens/s. Each call sees the last 20 s: at 20-60 s 20 arrivals (1/s) of 5 output tokens: 5 tokens/s,
    # ceil(5 / 10) = 1 worker. At 80 s the arrivals of [60, 80) are 60.1 + 0.25 k, k = 0..79: 80 (4/s), 20 tokens/s,
    # ceil(20 / 10) = 2: one add, ready at 90 s (cold start 10). At 100 and 120 s again 80 arrivals: 2 (the starting
    # or live worker counts). At 140 s the arrivals of [120, 140) are one a second: 20, back to 1: retire, newest.
    out = _pd(tmp_path, _step_times(), "dynamo-throughput:period=20,itl=150,decode_max=4,cold_start_s=10", split="1:1",
              slo_ttft_ms=1000)
    assert out["scale_events"] == [[80.0, "add", 1, "decode"], [140.0, "retire", 1, "decode"]]
    assert out["workers_over_time"] == [[0.0, 1], [90.0, 2], [140.0, 1]]
    # GPU-hours: the prefill worker and decode worker 0 to the last finish (479.6 s, as above), decode worker 1 from
    # its add (80 s) to its retirement (140 s; idle then, it leaves at once)
    assert out["gpu_hours_per_pool"] == {"prefill": pytest.approx(479.6 / 3600, abs=1e-6),
                                         "decode": pytest.approx((479.6 + 60) / 3600, abs=1e-6)}


def test_static_on_a_pd_fleet_gives_the_fixed_fleets_serving_result(tmp_path):
    times = [0.1 * k for k in range(40)]
    fixed = _pd(tmp_path, times, "none")
    static = _pd(tmp_path, times, "static")
    assert {k: static[k] for k in fixed} == fixed
    # the first arrival at 0 ms: one prefill worker held from 0 to the last finish is the makespan
    assert static["scale_events"] == []
    assert static["gpu_hours_per_pool"]["prefill"] == pytest.approx(fixed["makespan_s"] / 3600, abs=1e-6)


def test_hpa_kill_on_the_decode_pool_serves_every_request_once(tmp_path):
    out = _pd(tmp_path, _step_times(), "hpa:period=5,decode_max=4,target=1,cold_start_s=10,down_window=0,"
              "scale_down=kill", split="1:1", slo_ttft_ms=1000)
    assert {w["left_by"] for w in out["worker_lifetimes"][1:]} <= {"kill", None}
    assert out["requests"] == 660 + out["requeued"]  # each request finishes once; a requeued one is routed twice
    assert out["transfers"] == 660 + out["requeued"]


# ----------------------------------------------------------------------------- dynamo-load's decode rule, by hand
def _decode_state(kv_tokens, steps=(), now=10.0):
    workers = tuple(WorkerState(i, "live", 0.0, 0, 1, 0.1, 1, 0, kv, 100_000, 8192, pool="decode")
                    for i, kv in enumerate(kv_tokens))
    return FleetState(now, 5.0, workers, 0, (), 0.0, tuple(steps), pool="decode")


def test_dynamo_load_scales_the_decode_pool_by_dynamos_decode_planner():
    # decode steps on the line ms = 10 + 0.001 x kv: (1,000, 11), (3,000, 13), (5,000, 15), (7,000, 17), (9,000, 19);
    # the ITL target 20 ms: x_sla = (20 - 10) / 0.001 = 10,000 tokens a worker may hold
    steps = [StepSample(0, 0, 0, 4, kv, 10 + 0.001 * kv) for kv in (1000, 3000, 5000, 7000, 9000)]
    up = build_controller("dynamo-load:itl=20,decode_max=5,cold_start_s=7")
    # every worker above 10,000: one more (2 -> 3), ready after the cold start, in the decode pool
    assert list(up.decide(_decode_state([12_000, 11_000], steps))) == [Add(7.0, "decode")]
    # three workers: down when all hold less than 10,000 x 2/3 x 0.8 (sensitivity 80 %) = 5,333.3 tokens
    down = build_controller("dynamo-load:itl=20,decode_max=5")
    assert list(down.decide(_decode_state([5000, 4000, 1000], steps))) == [Retire(2, False, "decode")]
    keep = build_controller("dynamo-load:itl=20,decode_max=5")
    assert list(keep.decide(_decode_state([5400, 4000, 1000], steps))) == []
    # an ITL target below the line's intercept (10 ms): out of reach, no decision
    low = build_controller("dynamo-load:itl=5,decode_max=5")
    assert list(low.decide(_decode_state([12_000, 11_000], steps))) == []
    # fewer samples than min_observations (5): no decision
    few = build_controller("dynamo-load:itl=20,decode_max=5")
    assert list(few.decide(_decode_state([12_000, 11_000], steps[:4]))) == []


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("split, spec, words", [
    ("1:1", "hpa:target=1,max=4", "as max= with a P/D split: name the pool"),
    ("1:1", "hpa:target=1,decode_max=4,min=2", "as min= with a P/D split"),
    (None, "hpa:target=1,decode_max=4", "as decode_max= without a P/D split"),
    (None, "hpa:target=1,max=4,prefill_max=2", "as prefill_max= without a P/D split"),
    ("1:1", "dynamo-throughput:max=4", "as max= with a P/D split"),
])
def test_pool_bounds_are_named_by_the_pool_they_bound(split, spec, words):
    config = SimConfig(timing=True, split=split, controller=spec)
    with pytest.raises(ValueError, match=words):
        check_effective(config, {"controller"})


def test_the_prefill_pool_bounds_make_the_prefill_pool_scale():
    c = build_controller("hpa:target=1,decode_max=4,prefill_max=2")
    assert c.scales_prefill and c.bounded(5, "prefill") == 2 and c.bounded(5, "decode") == 4
    assert c.bounded(0, "prefill") == 1  # prefill_min's default
    assert not build_controller("hpa:target=1,decode_max=4").scales_prefill
    with pytest.raises(ValueError, match="prefill_max=N .* is required"):  # as max= is for hpa
        build_controller("hpa:target=1,decode_max=4,prefill_min=2")
    with pytest.raises(ValueError, match="prefill_max=1 is below prefill_min=2"):
        build_controller("dynamo-load:prefill_min=2,prefill_max=1")


# ----------------------------------------------------------------------------- the property: each request served once
class _Finishes(Recorder):
    def __init__(self):
        self.finished = []

    def on_finish(self, req, t):
        self.finished.append(req.id)


class PdAdaptive(Controller):
    """Applies ``steps`` ``(call, action, worker pick, ready in 50 ms units)`` to the decode pool, retiring only a
    worker that may go (never the last routable one)."""

    name = "test-pd-adaptive"
    steps: list = []

    def __init__(self, opts, spec=""):
        super().__init__(opts, spec)
        self.calls = 0

    def decide(self, state):
        self.calls += 1
        out = []
        for call, action, pick, ready in self.steps:
            if call != self.calls:
                continue
            if action == "add":
                out.append(Add(ready * 0.05, pool="decode"))
                continue
            retired = {d.worker for d in out if type(d) is Retire}
            live = [w.id for w in state.workers if w.state == "live" and w.id not in retired]
            if len(live) > 1:
                out.append(Retire(live[pick % len(live)], kill=action == "kill", pool="decode"))
        return out


class _AdaptivePlugin:
    @hookimpl
    def dynlab_register_controllers(self, register):
        register(PdAdaptive)


@st.composite
def _pd_scenario(draw):
    times, outs = [], []
    t = 0
    for _ in range(draw(st.integers(1, 10))):
        t += draw(st.integers(0, 80))
        times.append(t / 1000.0)
        outs.append(draw(st.integers(1, 24)))  # at most 16 + 24 - 1 tokens: 3 blocks of 16
    steps = draw(st.lists(st.tuples(st.integers(1, 10), st.sampled_from(["add", "drain", "kill"]),
                                    st.integers(0, 5), st.integers(0, 3)), max_size=6))
    kw = {"split": f"{draw(st.integers(1, 2))}:{draw(st.integers(1, 3))}",
          "decode_router": draw(st.sampled_from(["least-loaded", "round-robin", "kv-usage"])),
          "overlap_transfer": draw(st.booleans()),
          "link_gbps": draw(st.sampled_from([50.0, KV_BYTES / 2e7])),  # 0.042 ms, or 500 ms a request's KV
          "capacity": draw(st.sampled_from([4, 64])), "max_num_seqs": draw(st.sampled_from([1, 4]))}
    return times, outs, steps, kw


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_pd_scenario())
def test_every_request_is_served_once_whatever_the_decode_pool_does(tmp_path, scenario):
    times, outs, steps, kw = scenario
    PdAdaptive.steps = steps
    pm = plugins.get_plugin_manager()
    pm.register(_AdaptivePlugin(), name="test-pd-adaptive-controller")
    try:
        path = tmp_path / "p.jsonl"
        path.write_text("".join(json.dumps({"timestamp": round(t * 1000), "output_length": o,
                                            "tokens": list(range(100 * i + 1, 100 * i + 17))}) + "\n"
                                for i, (t, o) in enumerate(zip(times, outs))))
        seen = _Finishes()
        config = SimConfig(trace=str(path), trace_format="tokens", timing=True, mode="least-loaded",
                           controller="test-pd-adaptive:period=0.03",
                           **{"latency_model": "linear", **terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2}),
                              **kw})
        out = run(config, recorders=[seen])
    finally:
        pm.unregister(name="test-pd-adaptive-controller")
    assert sorted(seen.finished) == list(range(len(times)))  # each once, none lost to a kill
    assert out["rejected"] == 0
    # prefill routes: each request once, plus once more per requeue; transfers that arrived: each request with
    # something to decode once, plus once per requeue (a transfer re-sent after a kill arrives once)
    assert out["requests"] == len(times) + out["requeued"]
    assert out["transfers"] == sum(1 for o in outs if o > 1) + out["requeued"]
    kills = [w for w in out["worker_lifetimes"] if w["left_by"] == "kill"]
    assert out["requeued"] == 0 or kills
