"""The SGLang differential harness (benchmarks/fidelity_sglang.py): dynlab's radix cache against sglang 0.5.23's.

Skipped when sglang's ``srt`` package is not importable (it needs torch; neither is a dynlab dependency, and
CI installs neither). docs/engine.md ("SGLang") says how the environment it ran in was made.
"""
from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("sglang.srt.mem_cache.radix_cache", reason="needs sglang 0.5.23 (and torch)")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import fidelity_sglang  # noqa: E402


@pytest.mark.parametrize("seed", range(5))
def test_matches_and_evictions_agree_with_sglangs_radix_cache(seed):
    out = fidelity_sglang.run_seed(seed, 200)
    assert out["matches"] > 0 and out["evictions"] > 0
    assert out["matches_equal"] == out["matches"]
    assert out["evictions_equal"] == out["evictions"]
