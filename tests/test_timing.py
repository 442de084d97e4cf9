"""The time model (--timing) and the load-aware strategies (issue: time and load)."""
from __future__ import annotations

import random

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dynlab import plugins
from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.engine.run import TIMED_KEYS, build_strategy, make_workers, replay, run
from dynlab.engine.timing import PinnedLRUWorker, TimeModel
from dynlab.routing.events import BlockRemoved, BlockStored
from dynlab.routing.hashing import block_hashes
from dynlab.routing.index import KvIndex
from dynlab.routing.strategy import FleetView, Request, RunContext, Strategy
from dynlab.traces.reader import load_trace

TRACE = "mooncake-conversation"


def req(tokens, ts=None, out=0, block=4, i=0):
    return Request(tuple(block_hashes(tokens, block)), input_length=len(tokens), output_length=out,
                   timestamp=ts, index=i)


def timed(requests, mode="rr", workers=1, capacity=None, block=4, **model):
    cfg = SimConfig(mode=mode, workers=workers, capacity=capacity, timing=True)
    return replay(requests, build_strategy(cfg, random.Random(1), block_tokens=block), make_workers(cfg),
                  time_model=TimeModel(**model), block_tokens=block)


# ---- the queueing model, by hand ------------------------------------------------------------------

def test_ttft_is_queue_wait_plus_uncached_prefill():
    # one worker at 1,000 tokens/s: request 0 (8 tokens) at t=0 ends at 8 ms; request 1 arrives at 2 ms,
    # shares the first block (4 tokens cached), waits 6 ms, computes 4 tokens (4 ms): TTFT 10 ms.
    a = req(list(range(8)), ts=0)
    b = req(list(range(4)) + [90, 91, 92, 93], ts=2)
    out = timed([a, b], prefill_tps=1000.0)
    assert out["cached_blocks"] == 1
    assert out["queue_wait_ms"]["mean"] == 3.0  # (0 + 6) / 2
    assert out["ttft_ms"]["p50"] == 9.0  # median of 8 and 10
    assert out["ttft_ms"]["mean"] == 9.0


def test_prefills_are_first_come_first_served_per_worker():
    reqs = [req([i * 10 + j for j in range(4)], ts=0) for i in range(3)]
    out = timed(reqs, prefill_tps=1000.0)  # 4 ms each, one at a time: TTFT 4, 8, 12
    assert out["ttft_ms"]["mean"] == 8.0 and out["queue_wait_ms"]["mean"] == 4.0
    out2 = timed(reqs, workers=3, prefill_tps=1000.0)  # round robin over 3 workers: no wait
    assert out2["ttft_ms"]["mean"] == 4.0 and out2["queue_wait_ms"]["p99"] == 0.0


def test_decode_keeps_requests_active_and_sets_the_makespan():
    reqs = [req(list(range(4)), ts=0, out=10), req([7, 7, 7, 7], ts=1, out=10)]
    out = timed(reqs, prefill_tps=1000.0, decode_tps=100.0)  # decode 100 ms each
    assert out["peak_active_requests"] == [2]
    assert out["makespan_s"] == round((8 + 100) / 1000, 3)


def test_time_scale_compresses_arrivals():
    reqs = [req([i] * 4, ts=1000 * i, out=0) for i in range(3)]
    slow = timed(reqs, prefill_tps=1.0)  # 4 s prefills every 1 s: a growing queue
    fast = timed(reqs, prefill_tps=1.0, time_scale=0.5)
    assert fast["queue_wait_ms"]["mean"] > slow["queue_wait_ms"]["mean"]
    assert fast["makespan_s"] == slow["makespan_s"] == 12.0  # saturated: the server works throughout
    idle = timed(reqs, prefill_tps=1000.0)  # arrival-bound: 2 s of arrivals + 4 ms
    assert idle["makespan_s"] == 2.004
    assert timed(reqs, prefill_tps=1000.0, time_scale=0.5)["makespan_s"] == 1.004


def test_poisson_arrivals_without_timestamps_are_seeded():
    reqs = [req([i] * 4) for i in range(20)]
    a, b = timed(reqs, rate=50.0), timed(reqs, rate=50.0)
    assert a == b
    assert timed(reqs, rate=5.0)["makespan_s"] > a["makespan_s"]


def test_active_blocks_are_never_evicted_and_overflow_is_reported():
    w = PinnedLRUWorker(0, capacity=2)
    a = tuple(block_hashes(list(range(12)), 4))  # 3 blocks > capacity
    stored, removed = w.serve(a, 0)
    assert stored == a and removed == [] and len(w) == 3 and w.overflow_peak == 1
    removed = w.release(a)
    assert removed == [a[2]]  # back under capacity: the tail goes first
    assert set(w.keys()) == {a[0], a[1]}
    b = tuple(block_hashes([0, 1, 2, 3, 9, 9, 9, 9], 4))
    assert w.overlap(b) == 1
    stored, removed = w.serve(b, 1)
    assert stored == b[1:] and removed == [a[1]]  # a[0] is pinned by b now, a[1] is the LRU block


@given(st.lists(st.tuples(st.lists(st.integers(0, 2), max_size=6), st.integers(0, 50), st.integers(0, 40)),
                max_size=25), st.integers(0, 8), st.integers(1, 3))
def test_timed_caches_stay_prefix_closed_and_events_match(spec, capacity, n):
    requests, t = [], 0
    for i, (path, gap, out) in enumerate(spec):
        t += gap
        requests.append(Request(tuple(block_hashes(path, 1)), input_length=len(path), output_length=out,
                                timestamp=t, index=i))
    parent = {b: a for r in requests for a, b in zip(r.hashes, r.hashes[1:])}

    class Recorder(Strategy):
        name = "test-timed-recorder"

        def __init__(self, ctx):
            super().__init__(ctx)
            self.index = KvIndex()

        def route(self, request, fleet):
            return self.ctx.rng.randrange(fleet.workers)

        def on_event(self, event):
            if isinstance(event, BlockStored):
                self.index.apply_stored(event.worker, event.hashes)
            elif isinstance(event, BlockRemoved):
                self.index.apply_removed(event.worker, event.hashes)

    strategy = Recorder(RunContext(workers=n, block=1, rng=random.Random(0)))
    workers = [PinnedLRUWorker(w, capacity) for w in range(n)]
    out = replay(requests, strategy, workers, time_model=TimeModel(prefill_tps=50.0, decode_tps=10.0),
                 block_tokens=1)
    for wk in workers:
        held = set(wk.keys())
        assert wk.size == len(held)
        assert len(held) <= capacity + out["overflow_blocks"]
        assert all(b not in parent or parent[b] in held for b in held)
        assert strategy.index.blocks(wk.id) == held
        assert not wk.pins  # everything finished


# ---- outputs ------------------------------------------------------------------------------------------

def test_without_timing_the_outputs_keep_their_keys():
    plain = run(SimConfig(mode="kv"))
    assert list(plain) == ["mode", "workers", "requests", "repeat_requests", "hits", "hit_rate"]
    timed_out = run(SimConfig(mode="kv", timing=True))
    assert list(timed_out)[:6] == list(plain) and list(timed_out)[6:] == list(TIMED_KEYS)
    assert set(timed_out["ttft_ms"]) == {"p50", "p90", "p99", "mean"}


@pytest.mark.parametrize("args,message", [
    (["--timing", "--prefill-tps", "0"], "--prefill-tps"),
    (["--timing", "--time-scale", "-1"], "--time-scale"),
    (["--timing", "--capacity", "10", "--policy", "fifo"], "not supported"),
    (["--mode", "kv-cost", "--opt", "temperature=hot"], "takes a float"),
    (["--mode", "kv-cost", "--opt", "nope=1"], "has no option 'nope'"),
    (["--mode", "cache-aware", "--opt", "fallback=random"], "least-loaded or least-cached"),
])
def test_bad_timing_and_option_values_are_usage_errors(args, message):
    r = CliRunner().invoke(main, ["sim", *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and r.output.count("\n") == 1


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


# ---- what the results must show, on the bundled trace ------------------------------------------------

@pytest.fixture(scope="module")
def trace():
    return load_trace(TRACE)


@pytest.fixture(scope="module")
def main_example(trace):
    """README's main example: 8 workers, 4,096 blocks each, timestamps at half scale (twice the rate)."""
    return {m: run(SimConfig(mode=m, trace=TRACE, workers=8, capacity=4096, timing=True, time_scale=0.5),
                   requests=trace) for m in ("rr", "kv", "kv-cost")}


def test_round_robin_has_a_long_tail_at_this_load(main_example):
    rr = main_example["rr"]["ttft_ms"]
    assert rr["p99"] > 5 * rr["p50"]


def test_kv_cost_beats_kv_and_rr_on_p99_ttft_with_balanced_load_and_more_hits(main_example):
    kv_cost, kv, rr = main_example["kv-cost"], main_example["kv"], main_example["rr"]
    assert kv_cost["ttft_ms"]["p99"] < rr["ttft_ms"]["p99"]
    assert kv_cost["ttft_ms"]["p99"] < kv["ttft_ms"]["p99"]
    assert kv_cost["load_imbalance"] < 1.5
    assert kv_cost["block_hit_rate"] > rr["block_hit_rate"]
    assert kv["load_imbalance"] == 8.0  # overlap-first collapses onto one worker
