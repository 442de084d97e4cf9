"""The SGLang differential harnesses: dynlab's radix cache against sglang 0.5.23's (benchmarks/fidelity_sglang_radix.py),
and ``--engine sglang`` against SGLang's own scheduling code, request by request (benchmarks/fidelity_sglang.py).

Skipped when sglang's ``srt`` package is not importable (it needs torch; neither is a dynlab dependency, and
CI installs neither). Marked ``sglang``: ``python -m pytest -m sglang`` runs only these. docs/fidelity.md
("SGLang") says how the environment they ran in was made.
"""
from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("sglang.srt.mem_cache.radix_cache", reason="needs sglang 0.5.23 (and torch)")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import fidelity_sglang  # noqa: E402
import fidelity_sglang_radix  # noqa: E402

pytestmark = pytest.mark.sglang


@pytest.mark.parametrize("seed", range(5))
def test_matches_and_evictions_agree_with_sglangs_radix_cache(seed):
    out = fidelity_sglang_radix.run_seed(seed, 200)
    assert out["matches"] > 0 and out["evictions"] > 0
    assert out["matches_equal"] == out["matches"]
    assert out["evictions_equal"] == out["evictions"]


CASES = {c.name: c for c in fidelity_sglang.cases(scale=0.1)}


@pytest.mark.parametrize("name", ["shared-prefix", "chunked", "max-running", "retract-decayed", "lpm-order",
                                  "dfs-weight-order", "lpm-fallback", "lof-order", "mixed-chunked", "mixed-batch-full",
                                  "mixed-decode-evict", "conv-overloaded", "conv-lpm-tight", "conv-dfs-overloaded",
                                  "conv-replies-tight", "conv-mixed-overloaded", "conv-random-overloaded",
                                  "conv-eager", "conv-max-prefill", "no-cache", "conv-no-cache-overloaded"])
def test_every_request_is_sglangs_at_dynlabs_naming_rule(name, tmp_path):
    """TTFT, E2E, retractions and hit tokens of every request as SGLang's PrefillAdder, SchedulePolicy and
    RadixCache give them (the harness's ``as-dynlab`` rule: only named tokens enter SGLang's tree)."""
    (row,) = [r for r in fidelity_sglang.run_case(CASES[name], str(tmp_path)) if r["rule"] == "as-dynlab"]
    assert row["requests"] > 0
    assert row["identical"] == row["requests"], row["first_differing"]


def test_sglangs_own_rule_caches_generated_tokens(tmp_path):
    """At SGLang's own rule (a finished request's generated tokens enter the tree too) an overloaded trace
    differs: those tokens take evictable room dynlab's tree never holds, so evictions pick other leaves."""
    rows = {r["rule"]: r for r in fidelity_sglang.run_case(CASES["conv-overloaded"], str(tmp_path))}
    assert rows["as-dynlab"]["identical"] == rows["as-dynlab"]["requests"]
    assert rows["sglang"]["identical"] < rows["sglang"]["requests"]
