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
        opts = dict(workers=1, mode="rr", latency_model="linear",
                    latency_opts={"beta0": "10", "beta1": "1", "beta2": "2"})
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


@settings(max_examples=60, deadline=None)
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
