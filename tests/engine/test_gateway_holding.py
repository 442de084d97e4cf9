"""The rest of admission at the gateway (issue 42 item 3): ``slo-shed`` and holding requests (``hold=true``).

Hand cases on the linear step model 10 ms + 1 ms per prefill token + 2 ms per decode request, every overhead
term off, one worker, prompts of fresh tokens (no prefix hit); figures derived in the comments.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dynlab import hookimpl, plugins
from dynlab.engine.config import SimConfig
from dynlab.engine.gateway import WAIT, AdmissionPolicy, GatewayContext
from dynlab.engine.metrics import Recorder
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.routing.strategy import FleetView
from dynlab.sim import run
from dynlab.sim.records import RequestRecorder
from dynlab.sim import drive
from dynlab.sim.drive import build_policy
from helpers import invoke, terms_off

LINEAR = {"latency_model": "linear", **terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2})}


def _row(i, t, n=16, out=4, **attrs):
    return {"timestamp": t, "tokens": list(range(1000 * i + 1, 1000 * i + 1 + n)), "output_length": out, **attrs}


def _serve(tmp_path, rows, policy, recorders=(), **kw):
    """``(summary, records)`` of ``rows`` on one worker (a 64-block pool of 16 tokens) behind ``policy``."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = RequestRecorder()
    config = SimConfig(trace=str(path), trace_format="tokens", timing=True, mode="rr",
                       admission_policy=policy, **{"capacity": 64, "workers": 1, **LINEAR, **kw})
    out = run(config, recorders=[records, *recorders])
    return out, list(records.records())


def _shed(recs):
    return [r.get("shed", False) for r in recs]


# --- slo-shed -----------------------------------------------------------------------------------------------
# chat's TTFT SLO 150 ms; the gateway's view: Q prompt tokens routed without a first token, D decoding.
# R0 chat, 100 tokens at 0: Q=0, D=0 -> 10 + (0 + 100) = 110 <= 150: admitted.
# R1 chat, 30 tokens at 1: R0 has no first token yet (Q=100) -> 10 + (100 + 30) = 140 <= 150: admitted.
# R2 chat, 50 tokens at 2: Q=130 -> 10 + 180 = 190 > 150: shed.
# R3 batch, 500 tokens at 3: batch has no TTFT SLO: never shed (its prediction, 10 + 630 = 640, is not asked).
SLO_ROWS = [_row(0, 0, 100, **{"class": "chat"}), _row(1, 1, 30, **{"class": "chat"}),
            _row(2, 2, 50, **{"class": "chat"}), _row(3, 3, 500, **{"class": "batch"})]
SLOS = "chat:ttft_ms=150;batch:tpot_ms=1000"


def test_slo_shed_sheds_the_request_predicted_over_its_class_slo(tmp_path):
    out, recs = _serve(tmp_path, SLO_ROWS, "slo-shed", slo_classes=SLOS, capacity=256)
    assert _shed(recs) == [False, False, True, False]
    assert (out["admission_policy"], out["shed"]) == ("slo-shed", 1)
    assert out["by_class"]["chat"]["shed"] == 1 and out["by_class"]["batch"]["shed"] == 0
    assert "held" not in out  # nothing was held: no holding keys


def test_slo_shed_margin_sheds_earlier(tmp_path):
    """margin=1.1: R1's 1.1 x 140 = 154 > 150: shed; then R2 sees Q=100 only: 1.1 x (10 + 150) = 176 > 150: shed."""
    out, recs = _serve(tmp_path, SLO_ROWS, "slo-shed:margin=1.1", slo_classes=SLOS, capacity=256)
    assert _shed(recs) == [False, True, True, False]


def test_a_class_without_a_ttft_slo_is_never_shed(tmp_path):
    """Only batch has a TTFT SLO (1 ms, which every request would miss): the chat requests all enter (R2's 190 ms
    among them), batch's R3 (10 + 630 = 640 > 1) is shed."""
    out, recs = _serve(tmp_path, SLO_ROWS, "slo-shed", slo_classes="batch:ttft_ms=1", capacity=256)
    assert out["shed"] == 1 and _shed(recs) == [False, False, False, True]


def test_the_prediction_chunks_by_the_budget_beside_the_decodes():
    """Q=300 queued, 3 requests in flight of which 1 without a first token (D=2 decoding), budget 100, L=50:
    350 tokens in chunks of 100 - 2 = 98: three full chunks of 10 + 98 + 2 x 2 = 112 ms, and 56 left: 10 + 56 + 4
    = 70 ms; 3 x 112 + 70 = 406 ms. An idle worker: one 50-token step, 10 + 50 = 60 ms."""
    policy = build_policy("slo-shed")
    view = FleetView([0, 0], [3, 0], [0, 0], [300, 0], [0, 0], [1, 0])
    latency = build_latency_model("linear", hardware_for(), LINEAR["latency_opts"])
    policy.bind(GatewayContext(view, latency, 100, {"chat": (400.0, None)}))
    assert policy.predicted_ttft(50, 0) == 406.0 and policy.predicted_ttft(50, 1) == 60.0


def test_slo_shed_predicts_on_routable_workers_only():
    """An elastic fleet (--controller): worker 1 is idle but retired, so only worker 0 (406 ms, as above) can
    serve the request; over a 400 ms SLO it is shed. With both routable the idle one (60 ms) admits it."""
    from dynlab.routing.strategy import Request

    latency = build_latency_model("linear", hardware_for(), LINEAR["latency_opts"])
    request = Request((), input_length=50, attrs={"class": "chat"})
    for routable, admitted in (([0], False), ([0, 1], True)):
        policy = build_policy("slo-shed")
        view = FleetView([0, 0], [3, 0], [0, 0], [300, 0], [0, 0], [1, 0], routable)
        policy.bind(GatewayContext(view, latency, 100, {"chat": (400.0, None)}))
        assert policy.admit(request, 0.0) is admitted


def test_slo_shed_without_a_class_ttft_slo_is_refused():
    res = invoke("sim", "--timing", "--admission-policy", "slo-shed", "--slo", "chat:tpot_ms=50")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "--admission-policy has no effect as slo-shed without a class TTFT SLO" in line
    with pytest.raises(ValueError, match="give one with --slo CLASS:ttft_ms=X"):
        build_policy("slo-shed").bind(GatewayContext(None, None, 1, {}))  # a library caller's run


def test_slo_shed_answers_its_own_option_rule():
    """The core asks the named policy (AdmissionPolicy.no_effect) and names none itself: slo-shed has no
    effect without a class TTFT SLO (none, or a TPOT one only), and may act with one; the base class never objects."""
    cls = type(build_policy("slo-shed"))
    assert "without a class TTFT SLO" in cls.no_effect({}, {})
    assert "without a class TTFT SLO" in cls.no_effect({}, {"chat": (None, 50.0)})
    assert cls.no_effect({"margin": "2"}, {"chat": (400.0, None), "batch": (None, None)}) is None
    assert AdmissionPolicy.no_effect({}, {}) is None


class _NeedsHold(AdmissionPolicy):
    """A third-party policy with an option rule of its own: without hold=true it would do nothing."""

    name = "needs-hold"

    def __init__(self, opts, spec="", warmup=0):
        super().__init__(opts, spec, warmup)

    @classmethod
    def no_effect(cls, opts, class_slos):
        return None if opts.get("hold") == "true" else "as needs-hold without hold=true (a toy rule)"

    def admit(self, request, now):
        return True


class _NeedsHoldPlugin:
    @hookimpl
    def dynlab_register_admission_policies(self, register):
        register(_NeedsHold)


def test_the_option_rules_ask_whichever_policy_is_named():
    """A policy registered at run time refuses itself through its own hook, with its own reason, in a timed
    run only (a count-based run refuses --admission-policy for its own reason: no gateway there)."""
    pm = plugins.get_plugin_manager()
    plugin = _NeedsHoldPlugin()
    pm.register(plugin, name="needs-hold-test")
    try:
        with pytest.raises(ValueError, match="--admission-policy has no effect as needs-hold without hold=true"):
            SimConfig(timing=True, admission_policy="needs-hold").validate()
        SimConfig(timing=True, admission_policy="needs-hold:hold=true").validate()  # its rule passes: no error
    finally:
        pm.unregister(plugin)


# --- holding ------------------------------------------------------------------------------------------------
# queue-bound:limit=1,hold=true; 16-token prompts, 4 output tokens. R0 chat at 0: admitted, prefilled 0-26
# (10 + 16). R1 chat at 1: chat has 1 queued: held. R2 batch at 2: its own queue is empty: admitted, waits for
# the engine's next step. At 26 R0's first token frees chat's slot: R1 is routed at 26 and joins that step:
# R0's decode + R2's and R1's prefills, 10 + 32 + 2 = 44 -> first tokens at 70. R1: TTFT 70 - 1 = 69 (25 ms
# held). R3 chat at 30: R1 is queued (no first token until 70): held; routed at 70 into the step of three
# decodes and its prefill, 10 + 16 + 3 x 2 = 32 -> first token 102, TTFT 102 - 30 = 72 (40 ms held).
HOLD_ROWS = [_row(0, 0, **{"class": "chat"}), _row(1, 1, **{"class": "chat"}), _row(2, 2, **{"class": "batch"}),
             _row(3, 30, **{"class": "chat"})]


def test_a_held_request_enters_when_its_class_frees_a_slot_and_its_ttft_counts_the_wait(tmp_path):
    out, recs = _serve(tmp_path, HOLD_ROWS, "queue-bound:limit=1,hold=true")
    assert out["shed"] == 0 and _shed(recs) == [False] * 4
    assert [r["first_token_ms"] for r in recs] == [26.0, 70.0, 70.0, 102.0]
    assert [r["arrival_ms"] for r in recs] == [0.0, 1.0, 2.0, 30.0]  # the gateway's arrival, wait included
    assert (out["held"], out["held_shed"]) == (2, 0)
    # waits 25 and 40 ms: inclusive quantiles of two, p = 25 + p x 15: p50 32.5, p90 38.5, p99 39.85 -> 39.9
    assert out["gateway_wait_ms"] == {"p50": 32.5, "p90": 38.5, "p99": 39.9, "mean": 32.5}
    # TTFTs 26, 69, 68, 72 -> mean 58.75; without holding R1 is shed and R3 enters at 30 (see test_admission_policies)
    assert out["ttft_ms"]["mean"] == 58.8
    assert list(out)[list(out).index("shed") + 1] == "held"  # under the admission keys


def test_max_wait_ms_sheds_a_request_held_too_long(tmp_path):
    """max_wait_ms=20: R1 (held at 1) is shed at 21, before R0's first token at 26; R3 at 30 finds chat's queue
    empty (R0 has its first token) and enters at once."""
    out, recs = _serve(tmp_path, HOLD_ROWS, "queue-bound:limit=1,hold=true,max_wait_ms=20")
    assert _shed(recs) == [False, True, False, False]
    assert (out["shed"], out["held"], out["held_shed"]) == (1, 1, 1)
    assert out["gateway_wait_ms"]["p50"] == 20.0
    assert recs[1]["worker"] is None and recs[1]["arrival_ms"] == 1.0


def test_a_closed_loop_waits_behind_a_holding_gateway(tmp_path):
    """Two users, six requests, one queued request at most, held instead of shed: every request is served
    (none shed), where the shedding gateway sheds some (test_admission_policies)."""
    rows = [_row(i, 0) for i in range(6)]
    out, recs = _serve(tmp_path, rows, "queue-bound:limit=1,hold=true", concurrency=2)
    assert out["shed"] == 0 and all(r["finish_ms"] is not None for r in recs) and len(recs) == 6
    assert out["held"] >= 1


def test_a_pd_fleet_holds_at_its_gateway_too(tmp_path):
    """The prefill pool's first tokens free chat's slot: R1 and R3 are held, then served; none shed."""
    out, recs = _serve(tmp_path, HOLD_ROWS, "queue-bound:limit=1,hold=true", split="1:1", workers=2)
    assert (out["shed"], out["held"]) == (0, 2) and all(r["finish_ms"] is not None for r in recs)
    assert recs[1]["first_token_ms"] > recs[0]["first_token_ms"]  # entered after R0's first token


class _HoldsOne(AdmissionPolicy):
    """Holds request 1 for ever, admits the others."""

    name = "holds-one"

    def admit(self, request, now):
        return WAIT if request.index == 1 else True


def test_a_request_never_released_is_shed_when_nothing_is_left_to_run(tmp_path, monkeypatch):
    """R1 (chat) is held at 1 and never released; R3 (chat, at 30) joins chat's FIFO behind it unasked (no
    overtaking). R0 prefills 0-26; R2 (batch) prefills beside R0's decode 26-54 (10 + 16 + 2); both decode in
    14 ms steps (10 + 2 x 2): R0's 4th token at 82 (26, 54, 68, 82), then R2 alone in a 12 ms step: finish 94.
    No step and no arrival is left: R1 and R3 are shed at 94, held 93 and 64 ms."""
    monkeypatch.setattr(drive, "build_policy", lambda spec, warmup=0: _HoldsOne({}, "holds-one"))
    out, recs = _serve(tmp_path, HOLD_ROWS, "queue-bound:limit=1")
    assert _shed(recs) == [False, True, False, True]
    assert [r["finish_ms"] for r in recs] == [82.0, None, 94.0, None]
    assert (out["shed"], out["held"], out["held_shed"]) == (2, 2, 2)
    assert (out["gateway_wait_ms"]["p50"], out["gateway_wait_ms"]["mean"]) == (78.5, 78.5)  # (93 + 64) / 2


class _Outcomes(Recorder):
    """Counts, per request, its routes, finishes, rejections and sheds."""

    def __init__(self):
        self.seen = Counter()

    def on_route(self, request, worker, predicted, actual, cap):
        self.seen[request.index, "route"] += 1

    def on_finish(self, req, t):
        self.seen[req.id, "finish"] += 1

    def on_reject(self, req):
        self.seen[req.id, "reject"] += 1

    def on_shed(self, req):
        self.seen[req.id, "shed"] += 1


POLICIES = st.one_of(
    st.builds(lambda lim, hold, wait: f"queue-bound:limit={lim}" + (",hold=true" if hold else "")
              + (f",max_wait_ms={wait}" if hold and wait is not None else ""),
              st.integers(1, 3), st.booleans(), st.none() | st.sampled_from([0, 5, 40])),
    st.sampled_from(["slo-shed", "slo-shed:margin=0.5", "slo-shed:margin=2", "token-bucket:rate=50,burst=2"]))


@pytest.mark.filterwarnings("ignore:--slo names")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=POLICIES, closed=st.booleans(),
       rows=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 80), st.integers(1, 6),
                               st.sampled_from(["chat", "batch", None])), min_size=1, max_size=10))
def test_every_request_is_served_once_or_shed_once(tmp_path, policy, closed, rows):
    rows = sorted(rows, key=lambda r: r[0])  # a trace in time order
    trace = [_row(i, t, n, out, **({"class": c} if c else {})) for i, (t, n, out, c) in enumerate(rows)]
    outcomes = _Outcomes()
    kw = {"concurrency": 2} if closed else {}
    out, recs = _serve(tmp_path, trace, policy, recorders=(outcomes,), slo_classes="chat:ttft_ms=60", **kw)
    for i in range(len(trace)):
        got = {k: outcomes.seen[i, k] for k in ("route", "finish", "reject", "shed")}
        assert got in ({"route": 1, "finish": 1, "reject": 0, "shed": 0}, {"route": 1, "finish": 0, "reject": 1, "shed": 0},
                       {"route": 0, "finish": 0, "reject": 0, "shed": 1}), (i, got)
    assert out["shed"] == sum(outcomes.seen[i, "shed"] for i in range(len(trace)))
    assert out.get("held_shed", 0) <= out.get("held", 0) and len(recs) == len(trace)
