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
