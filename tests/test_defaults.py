"""Defaults an issue fixes (issue 28): each pinned here, so a change to one is a visible decision."""
from __future__ import annotations

import json

from dynlab.engine.config import SimConfig
from helpers import invoke, ok

TIER = ["sim", "--timing", "--capacity", "8", "--block", "256", "--cpu-capacity", "8", "--workers", "1",
        "--prefixes", "2", "--reps", "3", "--quiet"]


def test_cpu_write_defaults_to_write_through():
    """--cpu-write is ``compute`` (write-through: vLLM's OffloadingConnector, LMCache, the cache lab's
    TwoTierCache); ``evict`` (a victim tier) stays an option."""
    assert SimConfig().cpu_write == "compute"
    default = json.loads(ok(invoke(*TIER)).stdout)
    compute = json.loads(ok(invoke(*TIER, "--cpu-write", "compute")).stdout)
    evict = json.loads(ok(invoke(*TIER, "--cpu-write", "evict")).stdout)
    assert default == compute and default["cpu_write"] == "compute"
    assert evict["cpu_write"] == "evict" and evict != default


def test_sim_help_states_the_cpu_write_default():
    text = " ".join(ok(invoke("sim", "--help")).stdout.split())
    assert "--cpu-write [evict|compute]" in text
    i = text.index("--cpu-write [evict|compute]")
    assert "[default: compute]" in text[i:i + 400]


# Two requests at t = 0 sharing their two 512-token blocks (Mooncake ids 1, 2), served in time on 2 workers.
SHARED = ('{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]}\n' * 2)


def _routed(tmp_path, *mode):
    trace = tmp_path / "two.jsonl"
    trace.write_text(SHARED)
    result = ok(invoke("sim", "--trace", trace, "--timing", "--workers", 2, "--quiet", *mode))
    return json.loads(result.stdout), result.stderr


def test_default_mode_is_kv_cost_the_load_aware_router(tmp_path):
    """--mode is ``kv-cost`` (dynlab issue 43 item 8), not the seed's ``kv``, which collapses.

    By hand: request 1 sees two empty workers: kv takes the lowest index (fewest requests, then index),
    kv-cost's costs tie and worker 0 or 1 serves it. Request 2 arrives at the same t = 0 ms: kv remembers
    it routed blocks 1, 2 to request 1's worker (overlap 2 blocks there, 0 elsewhere) and follows it:
    [2, 0]. kv-cost learns only from KV events, none yet at t = 0 (no step has ended), so its overlap is 0
    everywhere; request 1's worker carries its 1024 queued prefill tokens (64 engine blocks of 16 tokens)
    or its active blocks, the other none, so the empty worker is cheaper: [1, 1]."""
    assert SimConfig().mode == "kv-cost"
    default, default_err = _routed(tmp_path)
    kv, kv_err = _routed(tmp_path, "--mode", "kv")
    kv_cost, _ = _routed(tmp_path, "--mode", "kv-cost")
    assert kv["requests_per_worker"] == [2, 0] and "one worker took almost every request" in kv_err
    assert kv_cost["requests_per_worker"] == [1, 1]
    assert default == kv_cost and default["mode"] == "kv-cost"
    assert "one worker took" not in default_err  # a fresh user's run does not get the collapse warning


def test_sim_help_states_the_mode_default():
    text = " ".join(ok(invoke("sim", "--help")).stdout.split())
    i = text.index("--mode, --modes")
    assert "[default: kv-cost]" in text[i:i + 300]
