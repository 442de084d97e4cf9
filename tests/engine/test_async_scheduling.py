"""Async scheduling (``--async-scheduling``, vLLM 0.33.0's AsyncScheduler with a batch queue of 2): hand cases.

Every expected value is derived by hand below (the linear model ``10 + prefill tokens + 2 x decode
requests`` ms, 16-token blocks, one worker, full admission) and was also read from vLLM 0.33.0's own
``AsyncScheduler`` driven by ``benchmarks/fidelity_vllm.py`` (docs/fidelity.md). The rules:
dynlab/engine/async_steps.py. Only the library API is used (``run`` with a ``RequestRecorder``).
"""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.engine.async_steps import AsyncEngineWorker
from dynlab.engine.config import SimConfig
from dynlab.engine.request import EngineRequest
from dynlab.latency.base import LatencyModel, StepBatch
from dynlab.sim.records import RequestRecorder
from dynlab.sim.runner import run
from helpers import terms_off

HAND = {"beta0": "10", "beta1": "1", "beta2": "2"}  # ms per step, per prefill token, per decode request


def _records(tmp_path, rows, capacity: int, budget: int = 8192, **kw) -> tuple[dict, list]:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "tokens": toks, "output_length": out}) + "\n"
                            for t, toks, out in rows))
    rec = RequestRecorder()
    # every overhead term off: the hand cases price steps by HAND alone
    out = run(SimConfig(trace=str(path), timing=True, workers=1, mode="rr", latency_model="linear",
                        **terms_off("linear", HAND), capacity=capacity, max_num_batched_tokens=budget, **kw),
              recorders=[rec])
    return out, list(rec.records())


def _spans(records) -> list:
    return [(r["first_scheduled_ms"], r["first_token_ms"] - r["arrival_ms"], r["finish_ms"] - r["arrival_ms"])
            for r in records]


def _ids(start: int, n: int) -> list:
    return list(range(start, start + n))


# ---- a request arriving during a step joins the step after next ------------------------------------------
#
# R0 = 16 prompt + 3 output at 0, R1 = 8 prompt + 2 output at 5; capacity 8 (no memory pressure).
# Sync: step 1 [0, 26] R0's prompt (10 + 16); step 2 [26, 46] R0 decodes, R1's prompt (10 + 8 + 2);
#   step 3 [46, 60] both decode (10 + 4): R0 ends at 60 (TTFT 26, E2E 60), R1 at 60 (TTFT 46 - 5 = 41, E2E 55).
# Async: idle at 0, two steps scheduled at once: A [0, 26] R0's prompt, B [26, 38] R0 decoding on its
#   placeholder (R1 has not arrived). At 26 (A's output: R0's first token) C is scheduled to start at 38:
#   R0 decodes, R1's prompt: 10 + 8 + 2 = 20 -> [38, 58]. At 38 D is scheduled: R0 is skipped (its last
#   token is in C), R1 decodes on its placeholder: [58, 70]. At 58 R0 finishes (E2E 58) and R1 has its
#   first token (TTFT 53); the step scheduled at 58 is empty (R1's last token is in D); R1 ends at 70 (E2E 65).
#   R1 was first scheduled in C, which starts at 38.

def _arrival(tmp_path, **kw):
    return _records(tmp_path, [(0, _ids(1, 16), 3), (5, _ids(100, 8), 2)], 8, **kw)


def test_sync_hand_case(tmp_path):
    out, recs = _arrival(tmp_path)
    assert _spans(recs) == [(0.0, 26.0, 60.0), (26.0, 41.0, 55.0)]


def test_async_arrival_joins_the_step_after_next(tmp_path):
    out, recs = _arrival(tmp_path, async_scheduling=True)
    assert _spans(recs) == [(0.0, 26.0, 58.0), (38.0, 53.0, 65.0)]
    assert out["ttft_ms"]["mean"] == 39.5  # (26 + 53) / 2
    assert out["e2e_ms"]["mean"] == 61.5  # (58 + 65) / 2


def test_async_busy_usage_counts_its_steps(tmp_path):
    # the four steps above run back to back, [0, 26], [26, 38], [38, 58], [58, 70]: the worker is in a step
    # for the whole span from the first arrival (0) to the last finish (70), so the busy-step mean equals
    # the span mean (it was 0.0: the async step driver did not count its steps)
    out, _ = _arrival(tmp_path, async_scheduling=True)
    assert out["mean_kv_usage"][0] > 0
    assert out["mean_kv_usage_busy"] == out["mean_kv_usage"]


# ---- a finished request frees its blocks a step later ---------------------------------------------------
#
# capacity 4 blocks; R0 = 16 + 2 at 0, R2 = 8 + 6 at 0, R1 = 40 + 1 at 1 (its prompt needs 3 free blocks).
# Sync: [0, 34] both prompts (10 + 24); [34, 48] both decode (R0 takes its 2nd block: 3 used, R1 waits);
#   R0 ends at 48 and frees 2 blocks; [48, 100] R2 decodes, R1's prompt (10 + 40 + 2): R1 ends at 100
#   (TTFT = E2E = 99); R2 decodes alone, 12 ms a step: 112, 124, 136 (E2E 136).
# Async: A [0, 34] both prompts, B [34, 48] both decode (scheduled at 0). At 34 C is scheduled for 48: R0 is
#   skipped (its last token is in B) but still holds its 2 blocks, so R1 (arrived at 1) cannot be admitted:
#   C = R2 alone [48, 60]. At 48 R0 finishes, its blocks free; D, scheduled at 48 to start at 60, admits R1:
#   10 + 40 + 2 -> [60, 112]. R1 finishes at 112 (TTFT = E2E = 111, one step later than sync); R2 decodes in
#   E [112, 124] (scheduled at 60, R1 skipped) and F [124, 136]; its last token at 136, as in sync.

def _late_free(tmp_path, **kw):
    return _records(tmp_path, [(0, _ids(1, 16), 2), (0, _ids(100, 8), 6), (1, _ids(200, 40), 1)], 4, **kw)


def test_sync_late_free_hand_case(tmp_path):
    out, recs = _late_free(tmp_path)
    assert _spans(recs) == [(0.0, 34.0, 48.0), (0.0, 34.0, 136.0), (48.0, 99.0, 99.0)]


def test_async_finished_request_frees_its_blocks_a_step_later(tmp_path):
    out, recs = _late_free(tmp_path, async_scheduling=True)
    assert _spans(recs) == [(0.0, 34.0, 48.0), (0.0, 34.0, 136.0), (60.0, 111.0, 111.0)]
    assert out["preemptions"] == 0


def test_async_is_off_by_default():
    assert SimConfig().async_scheduling is False
    assert SimConfig().engine.async_scheduling is False


@pytest.mark.parametrize("kw, what", [
    ({"spec_method": "eagle", "spec_tokens": 2}, "speculative decoding"),
    ({"cpu_capacity": 8}, "a CPU tier"),
    ({"prefill_workers": 1, "decode_workers": 1}, "disaggregated prefill/decode"),
])
def test_async_refuses_what_it_does_not_model(kw, what):
    cfg = SimConfig(timing=True, async_scheduling=True, **kw)
    with pytest.raises(ValueError, match=f"not modelled with {what}"):
        cfg.validate()


def test_async_refuses_kv_cache_groups(tmp_path):
    with pytest.raises(ValueError, match="not modelled with KV cache groups"):
        _records(tmp_path, [(0, _ids(1, 16), 3)], None, async_scheduling=True, model="gemma-3-1b")


def test_async_refused_without_timing():
    with pytest.raises(ValueError, match="--async-scheduling"):
        SimConfig(async_scheduling=True).validate()


# ---- invariants: every request finishes, no earlier than one decode per token after its first step ------

@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=6),
       st.integers(4, 12), st.sampled_from([16, 32, 8192]))
def test_async_invariants(tmp_path_factory, reqs, capacity, budget):
    tmp = tmp_path_factory.mktemp("a")
    rows, start = [], 1
    for t, n, out in sorted(reqs):
        rows.append((t, _ids(start, n), out))
        start += n
    if any(len(toks) + out - 1 > capacity * 16 for _, toks, out in rows):
        return  # rejected requests: not this test's subject
    res, recs = _records(tmp, rows, capacity, budget, async_scheduling=True)
    for r in recs:
        assert r["first_scheduled_ms"] >= r["arrival_ms"]
        assert r["first_token_ms"] > r["first_scheduled_ms"]
        # each later token costs at least a decode step (10 + 2 ms)
        assert r["finish_ms"] - r["first_token_ms"] >= 12 * (r["output_length"] - 1) - 1e-9


# ---- the worker's invariants after every call (EngineWorker.check), with preemptions -------------------

class _Linear(LatencyModel):
    """10 + prefill tokens + 2 x decodes ms (a test double)."""

    name = "test-linear-async"

    def __init__(self):
        super().__init__(None, {})

    def step_ms(self, batch: StepBatch) -> float:
        return 10.0 + sum(batch.prefill_tokens) + 2.0 * batch.decode_requests


def _drive(worker, reqs) -> int:
    """Arrivals, step ends and step starts in time order (the worker module's driving rules), with
    ``worker.check()`` after each; returns the steps run."""
    i, steps = 0, 0
    while True:
        end, arrival = worker.step_end, (reqs[i].arrival_ms if i < len(reqs) else math.inf)
        if end is None and arrival == math.inf:
            return steps
        if end is not None and end <= arrival:
            now = end
            worker.finish_step()
            steps += 1
        else:
            now = arrival
            assert worker.submit(reqs[i], now)
            i += 1
        worker.check()
        if (i < len(reqs) and reqs[i].arrival_ms == now) or (worker.step_end is not None and worker.step_end <= now):
            continue
        if worker.step_end is None and not worker.idle:
            assert worker.start_step(now) is not None
            worker.check()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 80), st.integers(1, 50), st.integers(1, 15)), min_size=1, max_size=8),
       st.integers(5, 10), st.sampled_from([16, 24, 8192]), st.sampled_from(["full", "chunk"]))
def test_async_worker_invariants(reqs, capacity, budget, admission):
    rows = sorted(reqs)
    worker = AsyncEngineWorker(0, capacity, 16, _Linear(), max_num_batched_tokens=budget, admission=admission)
    ereqs, name = [], 1
    for k, (t, n, out) in enumerate(rows):
        ereqs.append(EngineRequest(k, float(t), n, out, list(range(name, name + n // 16))))
        name += 1000
    _drive(worker, ereqs)
    assert worker.idle and worker.used_blocks == 0
    for r in ereqs:  # every request served whole, its tokens after its first scheduled step
        assert r.generated == r.output_length and r.pending == 0 and r.inflight == 0
        assert r.finish_ms >= r.first_token_ms > r.first_scheduled_ms >= r.arrival_ms
