"""Elastic P/D fleets, the prefill side (issue 41 item 1, "separate prefill/decode pools"): a controller given
``scales_prefill`` (an autoscaler's ``prefill_min=`` / ``prefill_max=``) scales the prefill pool of a ``--split P:D``
fleet too (dynlab.disagg.elastic.PrefillElastic).

Hand cases on the flat step model of the P/D hand cases (helpers.PD_FLAT, helpers.run_pd): every step 100 ms,
one request in a batch (``max_num_seqs`` 1), 16-token prompts of fresh tokens, 5 output tokens: a prefill worker takes one step (100 ms) and
hands the request off; its KV is 16 x 131,072 B = 2,097,152 B (Llama-3.1-8B); the decode worker computes the 4 tokens
left in 4 steps (400 ms), the user's first token at the end of the first. At the default 50 GB/s the transfer takes
0.042 ms; at ``SLOW`` GB/s (2,097,152 B / 1e8) it takes 2,097,152 / 20,971.52 B/ms = 100 ms.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynlab import hookimpl, plugins
from dynlab.engine.config import SimConfig
from dynlab.engine.controller import Add, Controller, FleetState, Retire, WorkerState
from dynlab.engine.metrics import Recorder
from dynlab.sim import run
from dynlab.sim.control import build_controller
from helpers import terms_off
from helpers import pd_trace as _trace, run_pd as _pd

KV_BYTES = 16 * 131_072  # one request's KV: 2,097,152 B
SLOW = KV_BYTES / 1e8  # GB/s: one request's KV in 100 ms


class BothScripted(Controller):
    """Applies ``script`` (``[(time s, decision)]``): each decision at the first call for its pool at or after its
    time; it scales the prefill pool too."""

    name = "test-pd-both-scripted"
    scales_prefill = True
    script: list = []
    pools: list = []

    def __init__(self, opts, spec=""):
        super().__init__(opts, spec)
        self.todo = list(self.script)

    def decide(self, state):
        BothScripted.pools.append(state.pool)
        due = [d for t, d in self.todo if state.now_s >= t - 1e-9 and d.pool == state.pool]
        self.todo = [(t, d) for t, d in self.todo if not (state.now_s >= t - 1e-9 and d.pool == state.pool)]
        return due


class _Plugin:
    @hookimpl
    def dynlab_register_controllers(self, register):
        register(BothScripted)


@pytest.fixture(autouse=True)
def scripted():
    pm = plugins.get_plugin_manager()
    pm.register(_Plugin(), name="test-pd-both-scripted-controller")
    BothScripted.script, BothScripted.pools = [], []
    try:
        yield BothScripted
    finally:
        pm.unregister(name="test-pd-both-scripted-controller")


# ----------------------------------------------------------------------------- adds
def test_an_added_prefill_worker_takes_routes_and_the_next_worker_id(tmp_path, scripted):
    # A arrives at 0 ms, B at 60. The call at 50 ms adds prefill worker 1, routable at once. B finds prefill worker 0
    # holding A (handed off at 100) and worker 1 empty: the prefill router (least-loaded) sends it to worker 1, which
    # prefills it in [60, 160] (with one prefill worker it would wait until 100). A decodes on decode worker 0 in
    # [100, 500], B on decode worker 1 in [160, 560]: both TTFTs 200 ms (one prefill, one decode step), E2Es 500 ms.
    scripted.script = [(0.05, Add(0.0, pool="prefill"))]
    out = _pd(tmp_path, [0, 0.06], "test-pd-both-scripted:period=0.05")
    assert scripted.pools[:2] == ["prefill", "decode"]  # each call: the prefill pool first
    assert out["ttft_ms"]["mean"] == pytest.approx(200, abs=0.2)
    assert out["e2e_ms"]["mean"] == pytest.approx(500, abs=0.2)
    assert out["requests_per_worker"] == [1, 1]  # the prefill router's view: one route each
    assert out["scale_events"] == [[0.05, "add", 1, "prefill"]]
    assert out["workers_over_time"] == [[0.0, 3], [0.05, 4]]  # 1 + 2 workers, then 2 + 2
    assert out["elastic_pool"] == "prefill+decode"
    assert [(w["pool"], w["worker"], w["joined_s"]) for w in out["worker_lifetimes"]] == [
        ("prefill", 0, 0.0), ("prefill", 1, 0.05), ("decode", 0, 0.0), ("decode", 1, 0.0)]
    # the recorders' ids: 0 (prefill 0), 1 and 2 (decode 0 and 1), 3 (the new prefill worker): each pool's figures
    # gather its own; the prefill pool's two steps of 100 ms over 2 workers x the span 560 ms: 200 / 1,120
    assert out["prefill_pool"]["workers"] == 2 and out["decode_pool"]["workers"] == 2
    assert out["prefill_pool"]["utilization"] == pytest.approx(200 / 1120, abs=1e-4)
    # decode: 4 steps each on 2 workers: 800 / 1,120
    assert out["decode_pool"]["utilization"] == pytest.approx(800 / 1120, abs=1e-4)
    # GPU-hours to the last finish (560 ms), 1 GPU a worker: prefill 560 + 510 ms, decode 2 x 560 ms
    assert out["gpu_hours_per_pool"] == {"prefill": round(1070 / 3.6e6, 6), "decode": round(1120 / 3.6e6, 6)}
    assert out["gpu_hours"] == round(2190 / 3.6e6, 6)


# ----------------------------------------------------------------------------- kills and drains
def test_killing_a_prefill_worker_requeues_its_request_whose_kv_was_on_the_link(tmp_path, scripted):
    # A and B arrive at 0 ms: A to prefill worker 0, B to 1 (least-loaded, lowest id first), both prefilled in
    # [0, 100]; A's KV crosses worker 0's link in [100, 200] to decode worker 0, B's worker 1's to decode worker 1.
    # The kill of prefill worker 0 at 150 ms loses A's KV (not arrived): decode worker 0 gives back its reservation and
    # A goes back through the prefill router (requeued 1, its arrival kept at 0 ms) to worker 1, the one left:
    # prefill [150, 250], link [250, 350] to decode worker 0 (no load), decode [350, 750]: TTFT 450, E2E 750 ms.
    # B's KV, sent by the live worker, is not touched: decode [200, 600], TTFT 300, E2E 600 ms.
    scripted.script = [(0.15, Retire(0, kill=True, pool="prefill"))]
    out = _pd(tmp_path, [0, 0], "test-pd-both-scripted:period=0.05", split="2:2", link_gbps=SLOW)
    assert out["requeued"] == 1 and out["requests"] == 3  # A routed twice by the prefill router
    assert out["transfers"] == 2 and out["transfer_bytes"] == 2 * KV_BYTES  # the cut transfer is not counted
    assert out["ttft_ms"]["mean"] == pytest.approx((450 + 300) / 2, abs=0.2)
    assert out["e2e_ms"]["mean"] == pytest.approx((750 + 600) / 2, abs=0.2)
    prefill0 = out["worker_lifetimes"][0]
    assert (prefill0["pool"], prefill0["left_s"], prefill0["left_by"]) == ("prefill", 0.15, "kill")
    assert out["workers_over_time"] == [[0.0, 4], [0.15, 3]]


def test_killing_a_prefill_worker_mid_prefill_gives_back_an_overlapped_reservation(tmp_path, scripted):
    # With overlap_transfer A's transfer is asked for when its prefill is first scheduled (0 ms): the only decode
    # worker reserves its 2 blocks (capacity 2 blocks: one request's 16 + 5 - 1 = 20 tokens). The kill of prefill
    # worker 0 at 50 ms, mid-prefill, gives that reservation back (else the requeued A could never reserve there and
    # the run would not end) and A is prefilled again on worker 1 in [50, 150], its KV streamed with it (link
    # [50, 150]), decode [150, 550]: TTFT 250 ms, E2E 550 ms.
    scripted.script = [(0.05, Retire(0, kill=True, pool="prefill"))]
    out = _pd(tmp_path, [0], "test-pd-both-scripted:period=0.05", split="2:1", link_gbps=SLOW,
              overlap_transfer=True, capacity=2)
    assert out["requeued"] == 1 and out["transfers"] == 1
    assert out["ttft_ms"]["mean"] == pytest.approx(250, abs=0.2)
    assert out["e2e_ms"]["mean"] == pytest.approx(550, abs=0.2)


def test_a_draining_prefill_worker_leaves_when_its_kv_has_been_sent(tmp_path, scripted):
    # A alone: prefill worker 0 prefills it in [0, 100] and its engine is idle from then on, but A's KV is on its link
    # until 200 ms. Retired at 150 ms (drain), the worker stops taking routes and leaves at 200, when the KV arrived
    # (left_s 0.2); A decodes in [200, 600]: TTFT 300 ms, nothing requeued.
    scripted.script = [(0.15, Retire(0, pool="prefill"))]
    out = _pd(tmp_path, [0], "test-pd-both-scripted:period=0.05", split="2:1", link_gbps=SLOW)
    prefill0 = out["worker_lifetimes"][0]
    assert (prefill0["left_s"], prefill0["left_by"]) == (0.2, "drain")
    assert out["requeued"] == 0 and out["ttft_ms"]["mean"] == pytest.approx(300, abs=0.2)


def test_a_retired_prefill_worker_gets_no_more_routes(tmp_path, scripted):
    # Prefill worker 0 is drained at 50 ms (idle: it leaves at once); B and C arriving at 100 and 200 ms both go to
    # worker 1, although least-loaded would pick worker 0 (lowest id) for each: the router saw it leave.
    scripted.script = [(0.05, Retire(0, pool="prefill"))]
    out = _pd(tmp_path, [0.1, 0.2], "test-pd-both-scripted:period=0.05", split="2:1")
    assert out["requests_per_worker"] == [0, 2] and out["misrouted"] == 0


# ----------------------------------------------------------------------------- the built-in controllers
def _w(i, queued, waiting=0, pool="prefill"):
    return WorkerState(i, "live", 0.0, waiting, 0, 0.0, 0, queued, 0, 1000, 2048, pool)


def _state(now, workers, ttft_ms=(), arrivals=0, prompt_tokens=0, pool="prefill"):
    return FleetState(now, 5.0, tuple(workers), arrivals, tuple(ttft_ms), 0.0, (), prompt_tokens, 0, 0, pool)


def test_hpa_keeps_each_pools_history_apart():
    # period 15 s. Prefill: 2 live workers each with 3 waiting against target 1: ratio 3, desired ceil(2 x 3) = 6,
    # the scale-up policy allows max(2 + 4, ceil(2 x 2)) = 6, prefill_max 3 bounds it: one Add to the prefill pool.
    hpa = build_controller("hpa:target=1,decode_max=4,prefill_max=3,cold_start_s=0")
    out = list(hpa.decide(_state(15.0, [_w(0, 0, 3), _w(1, 0, 3)])))
    assert out == [Add(0.0, "prefill")]
    # Decode, the same call: 1 live worker with nothing waiting: desired 0, bounded to decode_min 1: nothing. Had the
    # prefill pool's 6 been in the decode pool's stabilisation window (300 s), it would have asked for 4.
    assert list(hpa.decide(_state(15.0, [_w(0, 0, 0, "decode")], pool="decode"))) == []


def test_dynamo_load_follows_dynamos_prefill_planner():
    # Points on TTFT = 50 + 0.2 x, x = mean queued prompt tokens + the period's prompt length (1,200 tokens): the
    # TTFT target 450 ms is met at x = (450 - 50) / 0.2 = 2,000, a target of 2,000 - 1,200 = 800 queued tokens a
    # worker. Four periods of two workers queueing q (x = q + 1,200): no decision before 5 points.
    def period(now, queued):
        x = sum(queued) / len(queued) + 1200
        return _state(now, [_w(i, q) for i, q in enumerate(queued)], ttft_ms=(50 + 0.2 * x,), arrivals=1,
                      prompt_tokens=1200)

    def planner():
        c = build_controller("dynamo-load:ttft=450,prefill_max=4,cold_start_s=0")
        for k, q in enumerate([0, 100, 200, 300]):
            assert list(c.decide(period(5.0 * (k + 1), [q, q]))) == []
        return c

    # the fifth: both workers queue more than 800 (900, 850): up by one
    assert list(planner().decide(period(25.0, [900, 850]))) == [Add(0.0, "prefill")]
    # both below 800 x (2 - 1) / 2 x 0.8 (sensitivity) = 320: down by one, the newest live worker (1) retired
    assert list(planner().decide(period(25.0, [300, 200]))) == [Retire(1, False, "prefill")]
    # one at 330, above 320: nothing
    assert list(planner().decide(period(25.0, [300, 330]))) == []


# ----------------------------------------------------------------------------- the property: each request served once
class _Finishes(Recorder):
    def __init__(self):
        self.finished, self.handoffs = [], []

    def on_finish(self, req, t):
        self.finished.append(req.id)

    def on_handoff(self, record):
        self.handoffs.append(record)


class BothAdaptive(Controller):
    """Applies ``steps`` ``(call, pool, action, worker pick, ready in 50 ms units)`` to either pool, retiring only a
    worker that may go (never the last routable one)."""

    name = "test-pd-both-adaptive"
    scales_prefill = True
    steps: list = []

    def __init__(self, opts, spec=""):
        super().__init__(opts, spec)
        self.calls = {"prefill": 0, "decode": 0}

    def decide(self, state):
        self.calls[state.pool] += 1
        out = []
        for call, pool, action, pick, ready in self.steps:
            if call != self.calls[state.pool] or pool != state.pool:
                continue
            if action == "add":
                out.append(Add(ready * 0.05, pool=pool))
                continue
            retired = {d.worker for d in out if type(d) is Retire}
            live = [w.id for w in state.workers if w.state == "live" and w.id not in retired]
            if len(live) > 1:
                out.append(Retire(live[pick % len(live)], kill=action == "kill", pool=pool))
        return out


class _AdaptivePlugin:
    @hookimpl
    def dynlab_register_controllers(self, register):
        register(BothAdaptive)


@st.composite
def _scenario(draw):
    times, outs = [], []
    t = 0
    for _ in range(draw(st.integers(1, 10))):
        t += draw(st.integers(0, 80))
        times.append(t / 1000.0)
        outs.append(draw(st.integers(1, 24)))  # at most 16 + 24 - 1 tokens: 3 blocks of 16
    steps = draw(st.lists(st.tuples(st.integers(1, 10), st.sampled_from(["prefill", "decode"]),
                                    st.sampled_from(["add", "drain", "kill"]), st.integers(0, 5), st.integers(0, 3)),
                          max_size=8))
    kw = {"split": f"{draw(st.integers(1, 3))}:{draw(st.integers(1, 3))}",
          "decode_router": draw(st.sampled_from(["least-loaded", "round-robin", "kv-usage"])),
          "overlap_transfer": draw(st.booleans()),
          "link_gbps": draw(st.sampled_from([50.0, KV_BYTES / 2e7])),  # 0.042 ms, or 100 ms a request's KV
          "capacity": draw(st.sampled_from([4, 64])), "max_num_seqs": draw(st.sampled_from([1, 4])),
          "mode": draw(st.sampled_from(["least-loaded", "kv", "rr"]))}
    delays = (draw(st.sampled_from([0.0, 0.02, 0.07])), draw(st.sampled_from([0.0, 0.02, 0.07])))
    return times, outs, steps, kw, delays


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_scenario())
def test_every_request_is_served_once_whatever_both_pools_do(tmp_path, scenario):
    times, outs, steps, kw, (scrape, discovery) = scenario
    BothAdaptive.steps = steps
    BothAdaptive.scrape_delay_s, BothAdaptive.discovery_delay_s = scrape, discovery  # s: metrics' age, router's lag
    pm = plugins.get_plugin_manager()
    pm.register(_AdaptivePlugin(), name="test-pd-both-adaptive-controller")
    try:
        seen = _Finishes()
        config = SimConfig(trace=_trace(tmp_path / "p.jsonl", times, outs), trace_format="tokens", timing=True,
                           controller="test-pd-both-adaptive:period=0.03",
                           **{"latency_model": "linear", **terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2}),
                              **kw})
        out = run(config, recorders=[seen])
    finally:
        pm.unregister(name="test-pd-both-adaptive-controller")
    assert sorted(seen.finished) == list(range(len(times)))  # each once, none lost to a kill
    assert out["rejected"] == 0
    # prefill routes: each request once, plus once per requeue; transfers that arrived: every request with something
    # to decode has one; a second only after a kill requeued it (a transfer cut by a kill never arrives: not counted)
    assert out["requests"] == len(times) + out["requeued"]
    arrived = [r.request.id for r in seen.handoffs if r.arrived is not None]
    assert set(arrived) == {i for i, o in enumerate(outs) if o > 1}
    assert out["transfers"] == len(arrived) <= len(set(arrived)) + out["requeued"]
    kills = [w for w in out["worker_lifetimes"] if w["left_by"] == "kill"]
    assert out["requeued"] == 0 or kills
    # every worker ever given an id is in its pool's figures and in the lifetimes, once
    pools = [w["pool"] for w in out["worker_lifetimes"]]
    assert pools.count("prefill") == out["prefill_pool"]["workers"]
    assert pools.count("decode") == out["decode_pool"]["workers"]
