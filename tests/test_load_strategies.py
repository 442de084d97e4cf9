"""Each load-aware strategy's rule on hand-made fleets (least-loaded, power-of-two, cache-aware, kv-cost)."""
from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from dynlab import plugins
from dynlab.engine.config import SimConfig
from dynlab.sim.runner import run
from dynlab.routing.strategy import FleetView, Request, RunContext


# ---- each strategy's rule, on hand-made fleets ---------------------------------------------------------

def fleet(active=None, blocks=None, queued=None, n=4):
    active = active or [0] * n
    n = len(active)
    return FleetView([0] * n, list(active), list(blocks or [0] * n), list(queued or [0] * n), [0] * n)


def strategy(name, n=4, block=1, seed=0, **options):
    cls = plugins.strategies().get(name)
    values = {o.name: o.default for o in cls.options}
    values.update(options)
    return cls(RunContext(workers=n, block=block, rng=random.Random(seed), options=values))


@given(st.lists(st.integers(0, 9), min_size=1, max_size=8))
def test_least_loaded_never_picks_a_busier_worker(active):
    w = strategy("least-loaded", n=len(active)).route(Request(()), fleet(active))
    assert active[w] == min(active) and w == active.index(min(active))


@given(st.lists(st.integers(0, 9), min_size=2, max_size=8), st.integers(0, 99))
def test_power_of_two_takes_the_less_loaded_of_two(active, seed):
    s = strategy("power-of-two", n=len(active), seed=seed)
    w = s.route(Request(()), fleet(active))
    # replay the two draws
    rng = random.Random(seed)
    a = rng.randrange(len(active))
    b = rng.randrange(len(active) - 1)
    b += b >= a
    assert w in (a, b) and active[w] == min(active[a], active[b])


def test_cache_aware_switches_to_the_shortest_queue_exactly_at_the_thresholds():
    hashes = (1, 2, 3)
    s = strategy("cache-aware", n=2)
    s.index.apply_stored(1, hashes)  # worker 1 holds the whole prompt
    r = Request(hashes)
    # max - min must exceed 64 AND max must exceed 1.5 x min
    assert s.choose(r, fleet([0, 64]))[0] == 1  # 64 - 0 is not > 64: cache wins
    assert s.choose(r, fleet([0, 65]))[0] == 0  # 65 > 64 and 65 > 0: shortest queue
    assert s.choose(r, fleet([130, 195]))[0] == 1  # 195 is not > 1.5 x 130 = 195
    assert s.choose(r, fleet([130, 196]))[0] == 0  # 196 > 195: shortest queue


def test_cache_aware_uses_the_match_rate_threshold_and_its_fallbacks():
    s = strategy("cache-aware", n=3)
    s.index.apply_stored(2, (1, 2, 3))
    long = Request((1, 2, 3, 4, 5, 6, 7, 8, 9, 10))  # match rate 3/10 = 0.3: not above 0.3
    assert s.choose(long, fleet([5, 1, 0]))[0] == 2  # fallback least-loaded is worker 2 anyway
    assert s.choose(long, fleet([5, 0, 1]))[0] == 1  # least loaded, not the cache
    assert s.choose(Request((1, 2, 3, 4)), fleet([5, 0, 1]))[0] == 2  # 0.75 > 0.3: cache
    older = strategy("cache-aware", n=3, fallback="least-cached")
    older.route(Request((50, 51)), fleet([0, 0, 0]))  # worker 0 now caches 2 blocks
    older.route(Request((60,)), fleet([0, 0, 0]))  # least cached: worker 1
    assert [len(t) for t in older.trees] == [2, 1, 0]
    assert older.choose(Request((70,)), fleet([0, 0, 9]))[0] == 2  # least cached despite its load


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=6),
       st.integers(0, 4), st.integers(0, 100))
def test_kv_cost_at_temperature_zero_picks_a_minimum_cost_worker(loads, held, seed):
    n = len(loads)
    s = strategy("kv-cost", n=n, block=2, seed=seed)
    hashes = (11, 12, 13, 14)
    s.index.apply_stored(0, hashes[:held])
    f = fleet([0] * n, [b for _, b in loads], [q for q, _ in loads])
    w = s.route(Request(hashes), f)
    expected = [max(q / 2 + 4 - (held if i == 0 else 0), 0) + b + 4 for i, (q, b) in enumerate(loads)]
    assert expected[w] == min(expected)
    assert s.predicted == (held if w == 0 else 0)


def test_kv_cost_with_overlap_credit_zero_ignores_the_cache():
    hashes = (1, 2, 3, 4)
    f = fleet([0, 0], [3, 0], [0, 0], n=2)
    credit = strategy("kv-cost", n=2, overlap_credit=1.0)
    credit.index.apply_stored(0, hashes)
    assert credit.route(Request(hashes), f) == 0  # 0 + 3 + 4 beats 4 + 0 + 4
    blind = strategy("kv-cost", n=2, overlap_credit=0.0)
    blind.index.apply_stored(0, hashes)
    assert blind.route(Request(hashes), f) == 1  # 4 + 3 + 4 loses to 4 + 0 + 4


def test_kv_cost_temperature_samples_every_worker_sometimes():
    s = strategy("kv-cost", n=3, temperature=1.0, seed=5)
    f = fleet([0, 0, 0], [0, 2, 4], [0, 0, 0], n=3)
    picks = {s.route(Request((1,)), f) for _ in range(200)}
    assert picks == {0, 1, 2}


def test_kv_cost_without_publishing_is_blind():
    out = run(SimConfig(mode="kv-cost", publish="no", workers=2, all_metrics=True))
    assert out["predicted_blocks"] == 0 and out["events_published"] == 0
