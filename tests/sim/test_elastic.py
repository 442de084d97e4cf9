"""Elastic fleets (issue 39 item 3): ``--controller`` adds and retires workers during a timed run.

Hand cases on the linear step model 10 ms + 1 ms per prefill token + 2 ms per decode request, every overhead
term off, 16-token prompts of fresh tokens (no prefix hit): one request alone prefills in 10 + 16 = 26 ms
(its first token at the step's end) and decodes in 10 + 2 = 12 ms a token. A test controller, registered at
run time, applies a script of decisions at given times (s).
"""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynlab import hookimpl, plugins
from dynlab.engine.config import SimConfig
from dynlab.engine.controller import Add, Controller, Retire
from dynlab.engine.metrics import Recorder
from dynlab.errors import DynlabError
from dynlab.sim import run
from dynlab.sim.control import build_controller
from dynlab.sim.records import RequestRecorder
from helpers import terms_off

LINEAR = {"latency_model": "linear", **terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2})}


class Scripted(Controller):
    """Applies ``SCRIPT`` (``[(time s, decision)]``): each decision at the first call at or after its time."""

    name = "test-scripted"
    script: list = []
    seen: list = []  # every state a run's controller was given, in order

    def __init__(self, opts, spec=""):
        super().__init__(opts, spec)
        self.todo = list(self.script)

    def decide(self, state):
        Scripted.seen.append(state)
        due = [d for t, d in self.todo if state.now_s >= t - 1e-9]
        self.todo = [(t, d) for t, d in self.todo if state.now_s < t - 1e-9]
        return due


class _Plugin:
    @hookimpl
    def dynlab_register_controllers(self, register):
        register(Scripted)


@pytest.fixture(autouse=True)
def scripted():
    pm = plugins.get_plugin_manager()
    pm.register(_Plugin(), name="test-scripted-controller")
    try:
        yield Scripted
    finally:
        pm.unregister(name="test-scripted-controller")
        Scripted.script, Scripted.seen = [], []


def _row(i, t, out=4):
    return {"timestamp": t, "tokens": list(range(100 * i + 1, 100 * i + 17)), "output_length": out}


def _serve(tmp_path, rows, script, *, controller="test-scripted:period=0.05", **kw):
    """``(summary, records)`` of ``rows`` on ``workers`` (default 2) under the scripted controller."""
    Scripted.script = script
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = RequestRecorder()
    config = SimConfig(trace=str(path), trace_format="tokens", timing=True, controller=controller,
                       **{"mode": "rr", "capacity": 64, "workers": 2, **LINEAR, **kw})
    out = run(config, recorders=[records])
    return out, {r["id"]: r for r in records.records()}


def test_a_drained_worker_finishes_its_requests_and_gets_no_route_after_retirement(tmp_path):
    # rr: R0 (0 ms) -> w0, R1 (1 ms, 20 tokens) -> w1: first token 1 + 26 = 27, then 19 decode steps of 12 ms:
    # finish 27 + 228 = 255. w1 retired (drain) at the call at 100 ms; R2 (150) and R3 (160) -> w0, the only
    # routable one; w1 leaves when R1 finishes, at 255 ms.
    rows = [_row(0, 0), _row(1, 1, out=20), _row(2, 150), _row(3, 160)]
    out, recs = _serve(tmp_path, rows, [(0.1, Retire(1))])
    assert [recs[i]["worker"] for i in range(4)] == [0, 1, 0, 0]
    assert recs[1]["finish_ms"] == 255.0 and recs[1]["first_token_ms"] == 27.0
    assert out["worker_lifetimes"][1] == {"worker": 1, "joined_s": 0.0, "ready_s": 0.0, "left_s": 0.255,
                                          "left_by": "drain"}
    assert out["worker_lifetimes"][0]["left_s"] is None
    assert out["workers_over_time"] == [[0.0, 2], [0.1, 1]]
    assert (out["requeued"], out["misrouted"], out["requests_per_worker"]) == (0, 0, [3, 1])


def test_a_killed_workers_requests_are_requeued_and_served_elsewhere(tmp_path):
    # R0 (0 ms) -> w0: done at 26 + 3 x 12 = 62. R1 (1 ms, 20 tokens) -> w1, killed at 100 ms mid-decode:
    # requeued at 100 to w0 (idle), prefilled again from scratch 100-126 (w0 never held its tokens), 19 decode
    # steps: finish 126 + 228 = 354. Its TTFT counts from its first arrival: 126 - 1 = 125 ms.
    rows = [_row(0, 0), _row(1, 1, out=20)]
    out, recs = _serve(tmp_path, rows, [(0.1, Retire(1, kill=True))])
    assert out["requeued"] == 1
    assert (recs[1]["worker"], recs[1]["arrival_ms"], recs[1]["first_token_ms"], recs[1]["finish_ms"]) == \
        (0, 1.0, 126.0, 354.0)
    assert out["worker_lifetimes"][1]["left_s"] == 0.1 and out["worker_lifetimes"][1]["left_by"] == "kill"
    # the TTFTs: R0 26 ms, R1 125 ms (mean 75.5); every request served once: 2 routes + 1 requeue route
    assert out["ttft_ms"]["mean"] == 75.5 and out["requests"] == 3
    assert out["requests_per_worker"] == [2, 1]


def test_an_added_worker_is_not_routed_before_its_ready_time(tmp_path):
    # one worker; at the call at 100 ms a worker is added, ready 0.1 s later (200 ms). least-loaded: R0 (150) and
    # R1 (199) -> w0 (w1 not routable yet, although idle); R2 at 200 ms exactly -> w1 (ready before arrivals at
    # its time; w0 has two active requests, w1 none).
    rows = [_row(0, 150, out=20), _row(1, 199, out=20), _row(2, 200)]
    out, recs = _serve(tmp_path, rows, [(0.1, Add(0.1))], workers=1, mode="least-loaded")
    assert [recs[i]["worker"] for i in range(3)] == [0, 0, 1]
    assert out["worker_lifetimes"][1] == {"worker": 1, "joined_s": 0.1, "ready_s": 0.2, "left_s": None,
                                          "left_by": None}
    assert out["workers_over_time"] == [[0.0, 1], [0.2, 2]]
    # w1's usage over its own lifetime, 100 ms to the run's last finish L: R2 holds 1 block (its 16-token prompt)
    # while it prefills, 200-226, then 2 (17 to 19 tokens) over its 3 decode steps, 226-262: 26 + 72 = 98
    # block x ms over 64 blocks x (L - 100) ms; L is the first arrival (150 ms) plus the makespan
    last = 150 + out["makespan_s"] * 1000
    assert out["mean_kv_usage_alive"][1] == round(98 / (64 * (last - 100)), 4)


def test_the_controller_observes_arrivals_queues_and_ttfts(tmp_path):
    # period 0.05 s: calls at 50, 100 ms. R0 (0 ms) and R1 (1 ms) on w0 and w1: first tokens at 26 and 27 ms
    # (TTFTs 26 and 26), both in the first period; at 50 ms each worker runs one request (20 tokens).
    # KV usage at 50 ms: each request has its 16 prompt tokens and 2 decoded ones computed (decode steps 26-38,
    # 38-50) and holds ceil(17..32 / 16) = 2 blocks of its worker's 64
    rows = [_row(0, 0, out=20), _row(1, 1, out=20)]
    _serve(tmp_path, rows, [])
    first, second = Scripted.seen[:2]
    assert (first.now_s, first.period_s, first.arrivals, first.ttft_ms) == (0.05, 0.05, 2, (26.0, 26.0))
    assert [(w.id, w.state, w.running, w.waiting, w.active) for w in first.workers] == \
        [(0, "live", 1, 0, 1), (1, "live", 1, 0, 1)]
    assert [w.kv_usage for w in first.workers] == [2 / 64, 2 / 64]
    assert second.now_s == 0.1 and second.arrivals == 0 and second.ttft_ms == ()


def test_a_strategy_for_fixed_fleets_is_sent_to_a_routable_worker_and_counted(tmp_path):
    # kv on distinct prompts: no overlap, so its least-routed pick; w0 retired (drain) at 100 ms. kv's router
    # drops w0 (on_leave) and never picks it again: misrouted 0. R1, R2 -> w1.
    rows = [_row(0, 0), _row(1, 150), _row(2, 160)]
    out, recs = _serve(tmp_path, rows, [(0.1, Retire(0))], mode="kv")
    assert [recs[i]["worker"] for i in range(3)] == [0, 1, 1] and out["misrouted"] == 0


@pytest.mark.parametrize("spec, message", [
    ("test-scripted:period=0", "period=0 must be a finite number >= 0.001"),
    ("test-scripted:period=1e-300", "period=1e-300 must be a finite number >= 0.001"),
    ("test-scripted:bogus=1", "unknown option(s) bogus"),
    ("none:period=1", "none takes no options"),
    ("nope", "unknown controller 'nope'"),
])
def test_bad_controller_specs_are_one_line_errors(spec, message):
    with pytest.raises(ValueError) as err:
        build_controller(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_retiring_the_last_routable_worker_is_refused(tmp_path):
    with pytest.raises(DynlabError, match="would leave no routable worker"):
        _serve(tmp_path, [_row(0, 0, out=40)], [(0.05, Retire(0))], workers=1)


def test_none_builds_no_controller_and_the_result_is_unchanged(tmp_path):
    rows = [_row(0, 0), _row(1, 1)]
    base, _ = _serve(tmp_path, rows, [], controller="none")
    assert "worker_lifetimes" not in base and build_controller("none") is None


class _Finishes(Recorder):
    def __init__(self):
        self.finished, self.shed = [], []

    def on_finish(self, req, t):
        self.finished.append(req.id)

    def on_shed(self, req):
        self.shed.append(req.id)


@st.composite
def _scenario(draw):
    n = draw(st.integers(1, 3))
    rows = []
    t = 0
    for i in range(draw(st.integers(1, 10))):
        t += draw(st.integers(0, 60))
        rows.append(_row(i, t, out=draw(st.integers(1, 24))))  # at most 16 + 24 - 1 tokens: 3 blocks of 16
    steps = draw(st.lists(st.tuples(st.integers(1, 8), st.sampled_from(["add", "drain", "kill"]),
                                    st.integers(0, 5), st.integers(0, 3)), max_size=6))
    mode = draw(st.sampled_from(["rr", "random", "least-loaded", "power-of-two", "kv", "kv-events", "kv-cost",
                                 "cache-aware"]))
    tight = draw(st.booleans())  # a 4-block pool (preemptions) with a CPU tier, or 64 blocks without one
    return n, rows, steps, mode, {"capacity": 4, "cpu_capacity": 8} if tight else {"capacity": 64}


class _Adaptive(Controller):
    """Applies ``STEPS`` ``(call, action, worker pick, ready in 50 ms units)``, retiring only a worker that may go."""

    name = "test-adaptive"
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
                out.append(Add(ready * 0.05))
                continue
            live = [w.id for w in state.workers if w.state == "live"]
            retired = {d.worker for d in out if type(d) is Retire}
            live = [w for w in live if w not in retired]
            if len(live) > 1:
                out.append(Retire(live[pick % len(live)], kill=action == "kill"))
        return out


class _AdaptivePlugin:
    @hookimpl
    def dynlab_register_controllers(self, register):
        register(_Adaptive)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_scenario())
def test_every_request_is_served_exactly_once_whatever_the_adds_and_retires(tmp_path, scenario):
    n, rows, steps, mode, kv = scenario
    _Adaptive.steps = steps
    pm = plugins.get_plugin_manager()
    pm.register(_AdaptivePlugin(), name="test-adaptive-controller")
    try:
        path = tmp_path / "p.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        seen = _Finishes()
        out = run(SimConfig(trace=str(path), trace_format="tokens", timing=True, controller="test-adaptive:period=0.03",
                            mode=mode, workers=n, **kv, **LINEAR), recorders=[seen])
    finally:
        pm.unregister(name="test-adaptive-controller")
    assert sorted(seen.finished) == list(range(len(rows)))  # each once, none lost to a kill
    assert out["rejected"] == 0 and len(seen.shed) == 0
    # routes: each request once, plus once more per requeue
    assert out["requests"] == len(rows) + out["requeued"] and sum(out["requests_per_worker"]) == out["requests"]
    kills = [w for w in out["worker_lifetimes"] if w["left_by"] == "kill"]
    assert out["requeued"] == 0 or kills


BUILTIN_STRATEGIES = [e.name for e in plugins.strategies().entries() if e.source == "dynlab"]


@pytest.mark.parametrize("name", BUILTIN_STRATEGIES)
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 4), seed=st.integers(0, 2**16),
       ops=st.lists(st.tuples(st.sampled_from(["route", "route", "join", "leave", "stored"]), st.integers(0, 9),
                              st.text(alphabet="ab", min_size=1, max_size=4)), max_size=30))
def test_a_builtin_strategy_routes_only_to_routable_workers(name, n, seed, ops):
    """Workers join (the next id) and leave (any routable one but the last) between routes; KV events come
    only from routable workers (a retired worker's are kept from the router): the pick is always routable."""
    import random

    from dynlab.engine.run import build_strategy
    from dynlab.routing.events import BlockStored
    from dynlab.routing.strategy import FleetView, Request

    from dynlab import plugins

    timed = getattr(plugins.strategies().get(name), "needs_timing", False)  # lora-affinity: timed runs only
    strategy = build_strategy(SimConfig(mode=name, workers=n, timing=timed), random.Random(seed))
    books = [[0] * n for _ in range(6)]
    routable, adapters = list(range(n)), [{} for _ in range(n)]
    view = FleetView(*books, routable, adapters)
    for i, (op, pick, path) in enumerate(ops):
        names = tuple(path[: j + 1] for j in range(len(path)))
        if op == "join":
            for b in books:
                b.append(0)
            adapters.append({})
            view.workers += 1
            routable.append(view.workers - 1)
            strategy.on_join(view.workers - 1)
        elif op == "leave" and len(routable) > 1:
            w = routable.pop(pick % len(routable))
            strategy.on_leave(w)
        elif op == "stored":
            strategy.on_event(BlockStored(routable[pick % len(routable)], names))
        else:
            w = strategy.route(Request(names, input_length=16 * len(names), index=i), view)
            assert w in routable, (w, routable)
            books[0][w] += 1


def test_kv_router_takes_a_joining_worker_and_forgets_a_leaving_one():
    from dynlab.routing.router import KvRouter

    r = KvRouter(2, 16)
    assert r.route_hashes(("a",)) == 0  # no overlap anywhere: fewest routed (0, 0), lowest index
    assert r.route_hashes(("b",)) == 1  # counts (1, 0)
    r.add_worker(2)  # counts (1, 1, 0): the new worker is the least routed
    assert r.route_hashes(("c",)) == 2
    assert r.route_hashes(("a", "x")) == 0 and r.last_overlap == 1  # worker 0 holds "a"
    r.remove_worker(0)  # its blocks leave the index; it is never the least routed again
    assert r.route_hashes(("a", "y")) == 1 and r.last_overlap == 0  # counts (-, 1, 1): worker 1, lowest index
    assert r.route_hashes(("d",)) == 2  # counts (-, 2, 1)
    with pytest.raises(ValueError, match="already added or retired"):
        r.add_worker(0)


def test_a_controller_adding_workers_to_an_idle_fleet_does_not_keep_the_run_alive(tmp_path):
    """A fresh user's dynamo-load run never ended: a controller adding a worker at every call kept an event (its
    ready time) in the loop, so the calls never stopped. One request (16 tokens, 4 out: done at 10 + 16 = 26 ms
    plus three 12 ms decodes, 62 ms) and calls every 50 ms that each add a worker ready 1 s later: the call at
    50 ms finds work left (the request), the one at 100 ms none but the first add's ready time, so it is the last:
    two adds, and the run ends at the second worker's ready time, 1.1 s."""
    script = [(i * 0.05, Add(1.0)) for i in range(1, 1000)]
    out, records = _serve(tmp_path, [_row(0, 0)], script)
    assert records[0]["finish_ms"] == pytest.approx(62.0)
    assert [w["joined_s"] for w in out["worker_lifetimes"]] == [0, 0, 0.05, 0.1]
    assert [w["ready_s"] for w in out["worker_lifetimes"]][2:] == [1.05, 1.1]
