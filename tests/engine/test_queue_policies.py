"""Queue policies (issue 39 item 2, issue 42 item 1): ``--queue-policy fcfs|priority|priority-displace``.

Hand cases on the linear step model 10 ms + 1 ms per prefill token + 2 ms per decode request, every overhead
term off, 16-token blocks; their figures derived in the comments. vLLM's own scheduler gives the same on
every case of ``benchmarks/vllm_traces.priority_cases`` (``benchmarks/fidelity_vllm.py``, docs/fidelity.md).
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab import plugins
from dynlab.engine.config import SimConfig
from dynlab.engine.queues import Fcfs, FcfsQueue, QueuePolicy
from dynlab.sim import run
from dynlab.sim.records import RequestRecorder
from helpers import invoke, terms_off, terms_off_args

LINEAR = {"latency_model": "linear", **terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2})}
POLICIES = plugins.queue_policies().names()


def _serve(tmp_path, rows, policy, **kw):
    """Per-request records of ``rows`` (token-trace dicts) on one worker under ``policy``."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = RequestRecorder()
    config = SimConfig(trace=str(path), trace_format="tokens", timing=True, workers=1, mode="rr",
                       queue_policy=policy, **{"capacity": 64, **LINEAR, **kw})
    run(config, recorders=[records])
    return list(records.records())


def _row(t, first, n, out, priority=None):
    row = {"timestamp": t, "tokens": list(range(first, first + n)), "output_length": out}
    if priority is not None:
        row["priority"] = priority
    return row


# vllm-project/vllm #40004, --max-num-seqs 1: L (priority 1; 16 + 10) at 0, H (priority 0; 16 + 2) at 30.
# L: prefill 0-26 (10 + 16), then a decode per 12 ms (10 + 2): its 10th token at 26 + 9 x 12 = 134.
# fcfs and priority (vLLM 0.33 stops its waiting loop at max_num_seqs): H waits for L, prefills 134-160:
#   TTFT 160 - 30 = 130; its 2nd token at 172.
# priority-displace: at the step of 38 L's decode is scheduled, then H displaces it (L's tokens given back):
#   H alone prefills 38-64 (TTFT 34), decodes 64-76; L resumes at 76 with its 16-token block cached
#   (hit 16 of its 18 tokens: 10 + 2 = 12 ms, to 88), then 7 decodes: 88 + 84 = 172.
MAX_SEQS = [_row(0, 1, 16, 10, 1), _row(30, 100, 16, 2, 0)]


@pytest.mark.parametrize("policy, h_ttft, l_finish, l_preempted", [
    ("fcfs", 130.0, 134.0, 0), ("priority", 130.0, 134.0, 0), ("priority-displace", 34.0, 172.0, 1)])
def test_a_more_important_request_at_max_num_seqs(tmp_path, policy, h_ttft, l_finish, l_preempted):
    low, high = _serve(tmp_path, MAX_SEQS, policy, max_num_seqs=1)
    assert high["first_token_ms"] - high["arrival_ms"] == h_ttft
    assert (low["finish_ms"], low["preemptions"], high["preemptions"]) == (l_finish, l_preempted, 0)


# 3 blocks: A (priority 1; 16 + 20) at 0, B (priority 0; 16 + 20) at 1. A prefills 0-26 (1 block). At 26 A
# takes its 2nd block, B its 1st: A's decode + B's prefill, 10 + 16 + 2 = 28 ms, to 54. At 54 A (decode
# scheduled first) holds 2, B needs a 2nd and none is free.
# fcfs: the newest runner, B itself, is preempted; A finishes its 18 tokens left: 54 + 18 x 12 = 270.
# priority: the least important runner, A, is preempted, its scheduled decode given back: B decodes alone,
#   19 tokens left: 54 + 19 x 12 = 282. A waits (B grows to 3 blocks), recomputes 18 tokens at 282 (its
#   cached block evicted: hit 0): 282 + 28 = 310, then 17 decodes: 310 + 204 = 514.
KV_FULL = [_row(0, 1, 16, 20, 1), _row(1, 100, 16, 20, 0)]


@pytest.mark.parametrize("policy, finishes, preemptions", [
    ("fcfs", (270.0, 513.0), (0, 1)), ("priority", (514.0, 282.0), (1, 0)),
    ("priority-displace", (514.0, 282.0), (1, 0))])
def test_kv_pressure_preempts_the_least_important(tmp_path, policy, finishes, preemptions):
    recs = _serve(tmp_path, KV_FULL, policy, capacity=3)
    assert tuple(r["finish_ms"] for r in recs) == finishes
    assert tuple(r["preemptions"] for r in recs) == preemptions


def test_displacement_needs_a_strictly_higher_priority(tmp_path):
    """Equal priorities never displace (PR #54530's priority-only comparison: no ping-pong): as priority."""
    rows = [_row(0, 1, 16, 10, 0), _row(30, 100, 16, 2, 0)]
    assert _serve(tmp_path, rows, "priority-displace", max_num_seqs=1) == \
        _serve(tmp_path, rows, "priority", max_num_seqs=1)


def test_priority_orders_the_waiting_queue_by_priority_then_arrival(tmp_path):
    """--max-num-seqs 1: R0 (priority 0) runs 0-26 and finishes at 26 + 12 = 38 (2 tokens); at 38 three wait:
    R1 (priority 2, at 1), R2 (priority 1, at 2), R3 (priority 1, at 3). fcfs takes them in arrival order;
    priority takes R2, R3 (equal priority: arrival), then R1. Each serves 26 + 12 = 38 ms."""
    rows = [_row(0, 1, 16, 2, 0), _row(1, 100, 16, 2, 2), _row(2, 200, 16, 2, 1), _row(3, 300, 16, 2, 1)]
    starts = {p: [r["first_scheduled_ms"] for r in _serve(tmp_path, rows, p, max_num_seqs=1)]
              for p in ("fcfs", "priority")}
    assert starts == {"fcfs": [0.0, 38.0, 76.0, 114.0], "priority": [0.0, 114.0, 38.0, 76.0]}


def test_a_request_without_priority_counts_as_priority_0(tmp_path):
    """vLLM's default priority is 0: a row without one goes before a row of priority 1 that came earlier."""
    rows = [_row(0, 1, 16, 2, 0), _row(1, 100, 16, 2, 1), _row(2, 200, 16, 2)]
    recs = _serve(tmp_path, rows, "priority", max_num_seqs=1)
    assert [r["first_scheduled_ms"] for r in recs] == [0.0, 76.0, 38.0]


def test_fcfs_is_the_default_and_ignores_priorities(tmp_path):
    rows = [_row(0, 1, 40, 20), _row(1, 100, 40, 20), _row(2, 200, 30, 25), _row(3, 300, 20, 30)]
    assert SimConfig().queue_policy == "fcfs"
    keys = ("first_scheduled_ms", "first_token_ms", "finish_ms", "hit_tokens", "preemptions")
    plain = _serve(tmp_path, rows, "fcfs", capacity=6)
    assert sum(r["preemptions"] for r in plain) > 0  # the case preempts: fcfs's victim matters
    with_priorities = _serve(tmp_path, [dict(r, priority=3 - i) for i, r in enumerate(rows)], "fcfs", capacity=6)
    assert [[r[k] for k in keys] for r in plain] == [[r[k] for k in keys] for r in with_priorities]


# ------------------------------------------------------------- every registered policy: shared properties
ROWS = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 48), st.integers(1, 24), st.integers(0, 3)),
                min_size=1, max_size=8)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=25, deadline=None)
@given(rows=ROWS, capacity=st.integers(4, 8), seqs=st.integers(1, 4), asyn=st.booleans())
def test_every_policy_serves_every_request_in_full(tmp_path_factory, policy, rows, capacity, seqs, asyn):
    """Whatever the order and the victims, every request that fits is served: first token after arrival,
    finish after it, and no request starves (a finite trace ends); with async scheduling too (a request
    preempted while its step is in flight may finish in the waiting queue: the queue gives it up)."""
    t, first, trace = 0, 1, []
    for gap, n, out, prio in rows:
        t += gap
        trace.append(_row(t, first, n, out, prio))
        first += n
    recs = _serve(tmp_path_factory.mktemp("q"), trace, policy, capacity=capacity, max_num_seqs=seqs,
                  async_scheduling=asyn)
    for r in recs:
        if r["input_length"] + r["output_length"] - 1 > capacity * 16:
            assert r["rejected"]
            continue
        assert not r["rejected"]
        assert r["arrival_ms"] <= r["first_scheduled_ms"] < r["first_token_ms"] <= r["finish_ms"]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_is_a_queue_policy_with_a_fresh_queue_per_engine(policy):
    cls = plugins.queue_policies().get(policy)
    assert issubclass(cls, QueuePolicy) and cls.name == policy
    p = cls()
    a, b = p.waiting_queue(), p.waiting_queue()
    assert a is not b and len(a) == 0


def test_fcfs_queue_puts_a_preempted_request_first():
    q = Fcfs().waiting_queue()
    assert isinstance(q, FcfsQueue)
    q.append("a"), q.append("b"), q.appendleft("p")
    assert [q[0], len(q)] == ["p", 3] and list(q) == ["p", "a", "b"]
    assert Fcfs().victim(["x", "y", "z"]) == 2 and Fcfs().victim(["x"], waiting="w") is None


# ------------------------------------------------------------------------------------------- the CLI
def test_cli_takes_the_policy_and_says_it_in_the_summary(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MAX_SEQS))
    res = invoke("sim", "--timing", "--workers", "1", "--trace", str(path), "--trace-format", "tokens",
                 "--max-num-seqs", "1", "--queue-policy", "priority-displace", "--latency-model", "linear",
                 "--latency-opt", "beta0=10", "--latency-opt", "beta1=1", "--latency-opt", "beta2=2",
                 *terms_off_args("linear"))
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["queue_policy"] == "priority-displace"


def test_cli_refuses_an_unknown_policy_listing_the_known():
    res = invoke("sim", "--timing", "--queue-policy", "lifo")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert "unknown queue policy 'lifo'; available: fcfs, priority, priority-displace" in res.stderr


def test_cli_refuses_the_policy_without_timing():
    res = invoke("sim", "--queue-policy", "priority")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert "--queue-policy" in res.stderr and "--timing" in res.stderr


EXPECTED_STALE = [(104.0, 238.0, 0), (104.0, 158.0, 2), (104.0, 122.0, 0), (104.0, 214.0, 0)]


def test_async_scheduling_gives_up_a_request_its_stale_output_finished(tmp_path):
    """Async scheduling, priority: a request preempted while its last step is in flight finishes in the
    waiting queue, which must give it up (the priority heap's ``remove``). The case is the vLLM harness's
    ``priority-async-stale``: vLLM 0.33.0's AsyncScheduler gives every one of these times, and 2 preemptions."""
    first, rows = 1, []
    for n, out, prio in ((31, 10, 1), (38, 3, 2), (12, 2, 1), (13, 8, 0)):
        rows.append(_row(0, first, n, out, prio))
        first += n
    recs = _serve(tmp_path, rows, "priority", capacity=7, max_num_seqs=4, max_num_batched_tokens=256,
                  async_scheduling=True)
    assert [(r["first_token_ms"], r["finish_ms"], r["preemptions"]) for r in recs] == EXPECTED_STALE
