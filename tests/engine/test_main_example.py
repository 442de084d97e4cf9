"""The claims docs/engine.md makes about the timed main example hold (the bundled trace, 8 workers, defaults)."""
from __future__ import annotations

import pytest

from dynlab.engine.config import SimConfig
from dynlab.sim.runner import run
from dynlab.traces.reader import load_trace

TRACE = "mooncake-conversation"


@pytest.fixture(scope="module")
def main_example():
    trace = load_trace(TRACE)
    return {m: run(SimConfig(mode=m, trace=TRACE, workers=8, timing=True), requests=trace)
            for m in ("rr", "kv", "kv-events", "kv-cost")}


def test_the_pool_is_derived_from_the_hardware(main_example):
    out = main_example["rr"]
    assert (out["block"], out["trace_block"], out["kv_blocks"]) == (16, 512, 29205)
    assert "80 GiB x 0.9" in out["kv_blocks_source"] and out["latency_model"] == "roofline"
    assert all(peak <= 29205 for peak in out["peak_kv_blocks"])


def test_overlap_first_collapses_only_without_events(main_example):
    kv, events = main_example["kv"], main_example["kv-events"]
    assert kv["load_imbalance"] == 8.0 and kv["preemptions"] > 0
    assert kv["ttft_ms"]["p50"] > 100 * events["ttft_ms"]["p50"]
    assert events["load_imbalance"] < 1.01


def test_kv_events_hits_most_and_kv_cost_has_the_shortest_tail(main_example):
    rr, events, cost = main_example["rr"], main_example["kv-events"], main_example["kv-cost"]
    assert events["block_hit_rate"] > cost["block_hit_rate"] > rr["block_hit_rate"]
    assert cost["ttft_ms"]["p99"] < min(rr["ttft_ms"]["p99"], events["ttft_ms"]["p99"])
    assert cost["load_imbalance"] < 1.1


def test_every_request_is_served(main_example):
    for out in main_example.values():
        assert out["requests"] == 12031 and out["rejected"] == 0
