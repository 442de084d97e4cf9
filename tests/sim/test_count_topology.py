"""The count-based replay as a topology (dynlab issue 39 item 4): dynlab.sim.run -> serve(CountBased) is its path."""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.engine.config import SimConfig
from dynlab.engine.run import build_strategy, make_workers
from dynlab.routing.strategy import Request
from dynlab.sim import runner
from dynlab.sim.drive import CountBased, replay, serve


def _serve(config, requests, synthetic=None):
    strategy = build_strategy(config, random.Random(config.seed))
    return serve(CountBased(config, synthetic, config.block), requests, strategy, config)


def test_round_robin_by_hand():
    # rr on 2 workers: request 0 -> w0, 1 -> w1, 2 -> w0; w0 holds {1, 2} when request 2 = (1, 2, 5) comes,
    # so 2 of its 3 blocks hit. prompt blocks 2 + 3 + 3 = 8, cached 2, block hit rate 2 / 8 = 0.25
    config = SimConfig(workers=2, mode="rr")
    out = _serve(config, [Request((1, 2)), Request((1, 2, 3)), Request((1, 2, 5))])
    assert out["requests_per_worker"] == [2, 1]
    assert out["prompt_blocks"] == 8
    assert out["cached_blocks"] == 2
    assert out["block_hit_rate"] == 0.25
    # the same fleet on hand-made workers (dynlab.sim.drive.replay) gives the same figures
    again = replay([Request((1, 2)), Request((1, 2, 3)), Request((1, 2, 5))],
                   build_strategy(config, random.Random(config.seed)), make_workers(config))
    assert out == again


def test_offline_policy_reads_the_future_of_a_generator():
    # one worker of 2 blocks; requests (1), (2), (3), (1) arrive from a generator (read into a list by build()).
    # At (3) the cache {1, 2} is full: opt evicts 2 (never used again), not 1 (used by request 3), so (1) hits:
    # cached 1, evicted 1. lru evicts the oldest, 1, and (1) misses: cached 0, evicted 2 (1, then 2 at the last).
    def requests():
        return (Request((h,)) for h in (1, 2, 3, 1))

    opt = _serve(SimConfig(workers=1, mode="rr", capacity=2, policy="opt"), requests())
    lru = _serve(SimConfig(workers=1, mode="rr", capacity=2, policy="lru"), requests())
    assert (opt["cached_blocks"], opt["evicted_blocks"]) == (1, 1)
    assert (lru["cached_blocks"], lru["evicted_blocks"]) == (0, 2)


def test_run_goes_through_serve_with_the_count_based_topology(monkeypatch):
    seen = []

    def spy(topology, *args, **kwargs):
        seen.append(type(topology))
        return serve(topology, *args, **kwargs)

    monkeypatch.setattr(runner, "serve", spy)
    out = runner.run(SimConfig(mode="rr", workers=2, prefixes=3, reps=2, plen=64, tail=16, block=16,
                               all_metrics=True))
    assert seen == [CountBased]
    # 3 prefixes x 2 repeats = 6 requests; describe() gives the block size replayed (--block 16)
    assert out["requests"] == 6 and out["block_tokens"] == 16



@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=5), min_size=1, max_size=12),
       st.sampled_from(["rr", "kv", "kv-events"]), st.integers(1, 3), st.sampled_from([None, 2, 4]),
       st.integers(0, 2))
def test_topology_and_hand_made_workers_agree(prompts, mode, workers, capacity, delay):
    # the count-based topology builds the fleet replay() runs on make_workers: same figures, whatever the run
    config = SimConfig(workers=workers, mode=mode, capacity=capacity, event_delay=delay)
    requests = [Request(tuple(p)) for p in prompts]
    again = replay(requests, build_strategy(config, random.Random(config.seed)), make_workers(config),
                   event_delay=delay)
    assert _serve(config, iter(requests)) == again
