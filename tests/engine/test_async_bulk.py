"""Bulk decode under async scheduling (dynlab/engine/async_steps.py, **Bulk decode under async scheduling**):
the same run as one step at a time.

The property compares, on random token traces, a timed run whose async workers make runs of decode steps
(``bulk=True``, the default) with one whose workers go one step at a time (``bulk=False``): the whole
result dict and every per-request record must be EQUAL. The linear latency model has integer
coefficients, so every step time, boundary and usage integral is an exact float on both sides (with a
model of fractional times the two agree up to float rounding, as the synchronous bulk run does). The
hand cases pin a run's cut by an arrival and a run crossing block boundaries.
"""
from __future__ import annotations

import json

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

import dynlab.engine.serving as serving
from dynlab.engine.async_steps import AsyncEngineWorker
from dynlab.engine.config import SimConfig
from dynlab.sim.records import RequestRecorder
from dynlab.sim.runner import run
from helpers import terms_off


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps({"timestamp": t, "tokens": toks, "output_length": out}) + "\n"
                            for t, toks, out in rows))
    return str(path)


def _run(path: str, bulk: bool, counts: list = None, **kw) -> tuple[dict, list]:
    """``(result, records)`` of an async timed run, its workers built with ``bulk`` (``counts``: collects
    each finished step's ``steps``)."""
    build = serving.build_engines
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(serving, "build_engines", lambda c, own, bulk_=True: build(c, own, bulk=bulk))
        if counts is not None:
            finish = AsyncEngineWorker.finish_step

            def counting(self):
                res = finish(self)
                counts.append(res.steps)
                return res
            mp.setattr(AsyncEngineWorker, "finish_step", counting)
        rec = RequestRecorder()
        # every overhead term off: the integer step model alone keeps every time exact (module docstring)
        opts = dict(workers=1, mode="rr", latency_model="linear",
                    **terms_off("linear", {"beta0": "10", "beta1": "1", "beta2": "2"}))
        opts.update(kw)
        out = run(SimConfig(trace=path, timing=True, async_scheduling=True, **opts), recorders=[rec])
    return out, list(rec.records())


@st.composite
def traces(draw):
    rows, prefixes = [], [list(range(1000 * f, 1000 * f + 48)) for f in range(3)]
    for i in range(draw(st.integers(1, 10))):
        t = draw(st.integers(0, 400))
        shared = draw(st.integers(0, 48))
        own = draw(st.integers(1 if shared == 0 else 0, 40))
        toks = prefixes[draw(st.integers(0, 2))][:shared] + list(range(10**6 + 1000 * i, 10**6 + 1000 * i + own))
        rows.append((t, toks, draw(st.integers(1, 60))))
    rows.sort(key=lambda r: r[0])
    return rows


@settings(max_examples=150, deadline=None)
@given(traces(), st.integers(5, 14), st.sampled_from([16, 32, 8192]), st.sampled_from([2, 256]),
       st.sampled_from([1, 2]), st.sampled_from(["full", "chunk"]), st.sampled_from([0.0, 5.0]))
def test_async_bulk_equals_step_by_step(tmp_path_factory, rows, capacity, budget, seqs,
                                       workers, admission, delay):
    path = _write(tmp_path_factory.mktemp("b") / "t.jsonl", rows)
    kw = dict(capacity=capacity, max_num_batched_tokens=budget, max_num_seqs=seqs, workers=workers,
              admission=admission, event_delay_ms=delay, mode="kv-events" if delay else "rr")
    counts = []
    steps, bulk = _run(path, False, **kw), _run(path, True, counts, **kw)
    assert bulk == steps
    assert sum(counts) == steps[0]["engine_steps"]


# ---- hand cases (linear model 10 + prefill tokens + 2 x decodes ms, 16-token blocks, one worker) ---------
#
# R0 = 16 prompt + 6 output at 0, capacity 8. Idle at 0, two steps at once: A [0, 26] R0's prompt, B
# scheduled at 0 to start at 26, R0 decoding on its placeholder. After B's schedule R0 has 0 tokens back
# and 2 in flight, so 6 - 0 - 2 = 4 more to sample: B is a run of k = 5 steps, [26, 26 + 5 x 12 = 86]
# (R0 holds 2 blocks, 32 slots, 17 computed: no block boundary). One step at a time: tokens at 26, 38,
# 50, 62, 74, 86; E2E 86 either way, 6 engine steps, 2 step results with runs.

def _one(tmp_path, rows, capacity, bulk=True):
    counts = []
    out, recs = _run(_write(tmp_path / "t.jsonl", rows), bulk, counts, capacity=capacity)
    return out, recs, counts


def _spans(recs) -> list:
    return [(r["first_scheduled_ms"], r["first_token_ms"] - r["arrival_ms"], r["finish_ms"] - r["arrival_ms"])
            for r in recs]


def test_a_run_of_decode_steps(tmp_path):
    out, recs, counts = _one(tmp_path, [(0, list(range(1, 17)), 6)], 8)
    assert counts == [1, 5]
    assert _spans(recs) == [(0.0, 26.0, 86.0)]
    assert out["engine_steps"] == 6


# The same with R1 = 8 prompt + 2 output arriving at 40, during step S3 [38, 50] of the run S2..S6
# [26, 86]: the schedule at 50 (of S5) is the first to see it, so the run is cut to S2..S4 [26, 62], its
# look-ahead at 50. One step at a time: at 50 S5 is scheduled with R0's decode and R1's prompt,
# 10 + 8 + 2 = 20 -> [62, 82]; at 62 S6, both decoding their last tokens, 10 + 4 -> [82, 96]; R1's first
# token at 82 (TTFT 42), both finish at 96 (R0 E2E 96, R1 56). Step results: A, the run of 3, S5, S6.

def test_an_arrival_cuts_the_run_at_the_schedule_that_sees_it(tmp_path):
    rows = [(0, list(range(1, 17)), 6), (40, list(range(100, 108)), 2)]
    out, recs, counts = _one(tmp_path, rows, 8)
    assert counts == [1, 3, 1, 1]
    assert _spans(recs) == [(0.0, 26.0, 96.0), (62.0, 42.0, 56.0)]
    assert (out, recs) == _one(tmp_path, rows, 8, bulk=False)[:2]


# R0 = 16 prompt + 20 output alone, capacity 8: B (scheduled at 0) leaves R0 17 computed in 2 blocks; it
# has 20 - 2 = 18 tokens to sample after B, so B is a run of 19 steps [26, 26 + 19 x 12 = 254]. S(2+i)
# needs 17 + i tokens: the 3rd block for i = 16, taken when S18 is scheduled, at the start of S17:
# 26 + 15 x 12 = 206 ms (the synchronous scheduler takes it at 218). Blocks x ms: 2 from 0 to 206, 3 from
# 206 to 254: 412 + 144 = 556 over 254 ms of 8 blocks: mean KV usage 556 / 2032.

def test_a_run_takes_its_blocks_one_step_early(tmp_path):
    out, recs, counts = _one(tmp_path, [(0, list(range(1, 17)), 20)], 8)
    assert counts == [1, 19]
    assert _spans(recs) == [(0.0, 26.0, 254.0)]
    assert out["peak_kv_blocks"] == [3]
    assert out["mean_kv_usage"] == [round(556 / 2032, 4)]  # 0.2736 (the block at 218 would give 0.2677)
    assert out == _one(tmp_path, [(0, list(range(1, 17)), 20)], 8, bulk=False)[0]
