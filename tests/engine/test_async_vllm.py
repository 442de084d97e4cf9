"""dynlab's ``--async-scheduling`` against vLLM 0.33.0's own ``AsyncScheduler``, request by request.

Marked ``vllm`` and skipped when vLLM is not importable (CI does not install it; ``python -m pytest -m
vllm`` runs these), as tests/test_fidelity_vllm.py. The harness (benchmarks/fidelity_vllm.py) drives
vLLM's AsyncScheduler with a batch queue of 2 (``EngineCore.step_with_batch_queue``) in simulated time;
every request of each case must agree on TTFT, E2E, preemptions and hit tokens. The hand cases of
tests/engine/test_async_scheduling.py are read from vLLM here too.
"""
from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("vllm", reason="needs the dynlab[vllm-oracle] extra (vLLM 0.33.0)")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))

import fidelity_vllm  # noqa: E402
import vllm_side  # noqa: E402
import vllm_traces  # noqa: E402
from vllm_dynlab_side import EngineSetup, run_dynlab  # noqa: E402

pytestmark = pytest.mark.vllm

HAND = dict(beta0=10.0, beta1=1.0, beta2=2.0)


def _ids(start: int, n: int) -> list:
    return list(range(start, start + n))


def _row(t, tokens, out) -> dict:
    return {"timestamp": t, "tokens": tokens, "output_length": out}


def _spans(records) -> list:
    return [(r["first_scheduled_ms"], r["first_token_ms"] - r["arrival_ms"], r["finish_ms"] - r["arrival_ms"])
            for r in records]


@pytest.mark.parametrize("rows, capacity, want", [
    ([_row(0, _ids(1, 16), 3), _row(5, _ids(100, 8), 2)], 8, [(0.0, 26.0, 58.0), (38.0, 53.0, 65.0)]),
    ([_row(0, _ids(1, 16), 2), _row(0, _ids(100, 8), 6), _row(1, _ids(200, 40), 1)], 4,
     [(0.0, 34.0, 48.0), (0.0, 34.0, 136.0), (60.0, 111.0, 111.0)]),
])
def test_vllm_async_gives_the_hand_cases(rows, capacity, want):
    records = vllm_side.run_vllm(EngineSetup(capacity, 8192, 256, **HAND), rows, async_scheduling=True)[0]
    assert _spans(records) == want


@pytest.mark.parametrize("name", ["step-boundary-arrivals", "overload-cascade", "max-num-seqs", "conv-tight"])
def test_dynlab_async_matches_vllm_async_per_request(tmp_path, name):
    case = {c.name: c for c in vllm_traces.hand_cases() + vllm_traces.random_cases(0.1)}[name]
    path = str(tmp_path / "t.jsonl")
    case.write(path)
    ours = run_dynlab(case.setup, path, admission="full", async_scheduling=True)[0]
    theirs = vllm_side.run_vllm(case.setup, case.rows, async_scheduling=True)[0]
    cmp = fidelity_vllm.compare(ours, theirs)
    assert cmp["identical"]["all"] == cmp["requests"], cmp["differing"]
