"""Fleet replay: bounded worker caches, KV events, and what the metrics must show (issue: fleet replay)."""
from __future__ import annotations

import functools
import itertools
import json
import random

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab import plugins
from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.engine.counted import Worker
from dynlab.engine.run import build_strategy, make_workers
from dynlab.sim.runner import run
from dynlab.routing.events import BlockRemoved, BlockStored
from dynlab.routing.hashing import block_hashes, overlap
from dynlab.routing.index import KvIndex
from dynlab.routing.strategy import Request, RunContext, Strategy
from dynlab.traces.reader import load_trace
from dynlab.sim.drive import replay

TRACE = "mooncake-conversation"
POLICIES = [n for n in plugins.eviction_policies().names() if n != "opt"]


@pytest.fixture(scope="module")
def head():
    """The first 1,500 requests of the bundled trace, loaded once."""
    return load_trace(TRACE)[:1500]


def sim(requests, **kw):
    return run(SimConfig(trace=TRACE, **kw), requests=requests)


def strip(result):
    """The keys every strategy reports (event-using ones add publish and the refused-event counts)."""
    return {k: v for k, v in result.items() if k not in ("mode", "publish", "predicted_blocks", "prediction_error",
                                                         "events_refused_block_size", "events_refused_parent")}


# ---- hand-made traces ---------------------------------------------------------------------------

@st.composite
def traces(draw, max_requests=30):
    """Requests whose chained block names share heads: paths over a tiny alphabet, hashed with block=1."""
    paths = draw(st.lists(st.lists(st.integers(0, 2), max_size=7), min_size=1, max_size=max_requests))
    return [Request(tuple(block_hashes(p, 1)), input_length=len(p), index=i) for i, p in enumerate(paths)]


class Recorder(Strategy):
    """Test strategy: routes by a fixed random sequence, records every KV event."""

    name = "test-recorder"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.events = []

    def route(self, request, fleet):
        return self.ctx.rng.randrange(fleet.workers)

    def on_event(self, event):
        self.events.append(event)


def held(worker):
    return set(worker.cache.keys()) if worker.bounded else set(worker.cache)


@pytest.mark.parametrize("policy", POLICIES)
@given(requests=traces(), capacity=st.integers(0, 12), n=st.integers(1, 3), seed=st.integers(0, 10))
def test_caches_stay_prefix_closed_and_events_equal_the_cache_changes(policy, requests, capacity, n, seed):
    parent = {}
    for r in requests:
        for a, b in zip(r.hashes, r.hashes[1:]):
            parent[b] = a
    cls = plugins.eviction_policies().get(policy)
    workers = [Worker(w, cls(capacity)) for w in range(n)]
    strategy = Recorder(RunContext(workers=n, rng=random.Random(seed)))
    model = KvIndex()
    seen = 0
    for r in requests:  # replay one request at a time to check the invariants after each
        replay([r], strategy, workers)
        for ev in strategy.events[seen:]:
            if isinstance(ev, BlockStored):
                model.apply_stored(ev.worker, ev.hashes)
            elif isinstance(ev, BlockRemoved):
                model.apply_removed(ev.worker, ev.hashes)
        seen = len(strategy.events)
        for wk in workers:
            blocks = held(wk)
            assert wk.size == len(blocks) == len(wk)  # what the fleet view reports as cached_blocks
            assert len(blocks) <= capacity
            for b in blocks:  # prefix-closed: a held block's parent is held
                assert b not in parent or parent[b] in blocks, (policy, b)
            assert model.blocks(wk.id) == blocks  # the events told exactly what changed


@given(requests=traces(), n=st.integers(1, 4))
def test_kv_with_unbounded_caches_equals_kv_events(requests, n):
    def go(mode):
        strategy = build_strategy(SimConfig(mode=mode, workers=n), random.Random(1))
        return replay(requests, strategy, make_workers(SimConfig(workers=n)))
    with_events = go("kv-events")
    # kv-events also reports the stored events its index refused: none, the engine's events are its own
    assert (with_events.pop("events_refused_block_size"), with_events.pop("events_refused_parent")) == (0, 0)
    assert go("kv") == with_events


@given(requests=traces(), n=st.integers(1, 4), capacity=st.one_of(st.none(), st.integers(0, 10)),
       mode=st.sampled_from(["rr", "random", "kv", "kv-events"]))
def test_no_strategy_beats_the_ideal_bound(requests, n, capacity, mode):
    cfg = SimConfig(mode=mode, workers=n, capacity=capacity)
    out = replay(requests, build_strategy(cfg, random.Random(3)), make_workers(cfg))
    assert out["cached_blocks"] <= round(out["ideal_block_hit_rate"] * out["prompt_blocks"]) + 1e-9
    assert out["block_hit_rate"] <= out["ideal_block_hit_rate"]


@given(requests=traces())
def test_one_worker_reaches_the_ideal_bound(requests):
    cfg = SimConfig(mode="kv", workers=1)
    out = replay(requests, build_strategy(cfg, random.Random(1)), make_workers(cfg))
    assert out["block_hit_rate"] == out["ideal_block_hit_rate"]


def test_hand_made_eviction_and_events():
    # capacity 3, one worker: a=[1,2,3] stored, then b=[1,4] evicts the LRU block (3, the tail)
    a, b = block_hashes([1, 2, 3], 1), block_hashes([1, 4], 1)
    strategy = Recorder(RunContext(workers=1))
    workers = [Worker(0, plugins.eviction_policies().get("lru")(3))]
    out = replay([Request(tuple(a)), Request(tuple(b))], strategy, workers)
    assert strategy.events == [BlockStored(0, tuple(a)), BlockRemoved(0, (a[2],)), BlockStored(0, (b[1],))]
    assert held(workers[0]) == {a[0], a[1], b[1]}
    assert out["cached_blocks"] == 1 and out["evicted_blocks"] == 1
    assert out["events_published"] == 3


def test_a_request_longer_than_the_cache_keeps_its_head():
    a = block_hashes(list(range(10)), 1)
    workers = [Worker(0, plugins.eviction_policies().get("lru")(4))]
    replay([Request(tuple(a))], Recorder(RunContext(workers=1)), workers)
    assert held(workers[0]) == set(a[:4])


# ---- the bundled trace: what the results must show -----------------------------------------------

def test_unbounded_kv_equals_kv_events_on_the_trace(head):
    kv = sim(head, mode="kv", workers=4)
    ev = sim(head, mode="kv-events", workers=4)
    assert strip(kv) == strip(ev)
    # every request shares block 0, so overlap-first sends everything to worker 0 ...
    assert kv["requests_per_worker"] == [len(head), 0, 0, 0]
    assert kv["load_imbalance"] == 4.0
    # ... where one worker with an unbounded cache reaches the ideal bound
    assert kv["block_hit_rate"] == kv["ideal_block_hit_rate"]


def test_publish_no_routes_exactly_as_round_robin(head):
    rr = sim(head, mode="rr", workers=8, capacity=512)
    silent = sim(head, mode="kv-events", workers=8, capacity=512, publish="no")
    assert silent["requests_per_worker"] == rr["requests_per_worker"]
    assert silent["hits"] == rr["hits"] and silent["cached_blocks"] == rr["cached_blocks"]
    assert silent["events_published"] == 0


def test_prediction_error_only_when_the_view_is_stale(head):
    kv = sim(head, mode="kv", workers=8, capacity=512)
    ev = sim(head, mode="kv-events", workers=8, capacity=512)
    assert ev["prediction_error"] == 0 and ev["predicted_blocks"] == ev["cached_blocks"]
    assert kv["prediction_error"] > 0  # kv remembers blocks the workers already evicted
    assert sim(head, mode="kv-events", workers=8, capacity=512, event_loss=0.2)["prediction_error"] > 0
    assert sim(head, mode="kv-events", workers=8, capacity=512, event_delay=2)["prediction_error"] > 0
    assert sim(head, mode="rr", workers=8, capacity=512)["prediction_error"] is None


def test_event_loss_counts_and_leaves_routing_rng_alone(head):
    lossy = sim(head, mode="kv-events", workers=4, capacity=512, event_loss=0.5, seed=7)
    assert 0 < lossy["events_dropped"] < lossy["events_published"]
    r1 = sim(head, mode="random", workers=4, capacity=512, event_loss=0.5, seed=7)
    r0 = sim(head, mode="random", workers=4, capacity=512, seed=7)
    assert r1["requests_per_worker"] == r0["requests_per_worker"]


@pytest.mark.parametrize("mode,capacity", list(itertools.product(["rr", "random", "kv", "kv-events"], [None, 64, 2048])))
def test_nothing_exceeds_the_ideal_on_the_trace(head, mode, capacity):
    out = sim(head, mode=mode, workers=4, capacity=capacity)
    assert out["block_hit_rate"] <= out["ideal_block_hit_rate"]
    assert out["ideal_block_hit_rate"] == sim(head, mode="rr", workers=1)["ideal_block_hit_rate"]


def test_whole_trace_ideal_matches_the_published_figure():
    out = run(SimConfig(trace=TRACE, mode="rr", workers=1))
    assert out["requests"] == 12031 and out["prompt_blocks"] == 288500
    assert out["ideal_block_hit_rate"] == 0.3664


# ---- the seed workload with bounded caches --------------------------------------------------------

def test_seed_workload_unbounded_keeps_the_seed_numbers_with_all_metrics():
    out = run(SimConfig(mode="rr", all_metrics=True))
    assert list(out)[:6] == ["mode", "workers", "requests", "repeat_requests", "hits", "hit_rate"]
    assert (out["hits"], out["repeat_requests"]) == (49, 60)
    assert out["requests_per_worker"] == [36, 36]


def test_seed_workload_bounded_round_robin_loses_hits_kv_keeps_them():
    unbounded = run(SimConfig(mode="rr"))["hits"]
    bounded = run(SimConfig(mode="rr", capacity=42))["hits"]
    assert bounded < unbounded
    assert run(SimConfig(mode="kv", capacity=42))["hits"] > bounded


# ---- trace readers -------------------------------------------------------------------------------

def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_token_trace_equals_hashing_the_tokens(tmp_path):
    lines = [{"tokens": list(range(40))}, {"tokens": list(range(20)) + [7] * 20, "output_length": 3}]
    path = write(tmp_path, "t.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    reqs = load_trace(path, block=16)
    assert [r.hashes for r in reqs] == [tuple(block_hashes(x["tokens"], 16)) for x in lines]
    assert reqs[1].output_length == 3 and reqs[0].input_length == 40


@pytest.mark.parametrize("text,message", [
    ('{"hash_ids": [1, 2]}\n\n{"hash_ids": [1, "x"]}\n', ":3: hash_ids[1] must be an int"),
    ('{"hash_ids": [1]}\n{oops\n', ":2: not JSON"),
    ('{"hash_ids": [1]}\n[1, 2]\n', ":2: expected a JSON object"),
    ('{"hash_ids": [1]}\n{"input_length": 3}\n', ":2: missing field 'hash_ids'"),
    ('{"hash_ids": [1], "timestamp": "soon"}\n', ":1: field 'timestamp' must be a number"),
    ('{"nothing": 1}\n', ":1: unknown trace format"),
    ('{"tokens": [1, 2.5]}\n', ":1: token at position 1 is not an int"),
])
def test_bad_trace_lines_name_file_and_line(tmp_path, text, message):
    path = write(tmp_path, "bad.jsonl", text)
    result = CliRunner().invoke(main, ["sim", "--trace", path, "--quiet"])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert f"{path}{message}" in result.output


def test_missing_trace_and_unknown_format(tmp_path):
    r = CliRunner().invoke(main, ["sim", "--trace", str(tmp_path / "none.jsonl")])
    assert r.exit_code == 2 and "no such file" in r.output  # a usage error, as tests/test_input_files.py
    r = CliRunner().invoke(main, ["sim", "--trace", TRACE, "--trace-format", "nope"])
    assert r.exit_code == 2 and "available: mooncake, tokens" in r.output


def test_trace_format_override(tmp_path):
    path = write(tmp_path, "m.jsonl", '{"hash_ids": [1, 2], "tokens": [1]}\n')
    assert load_trace(path, "mooncake")[0].hashes == (1, 2)
    assert load_trace(path, "tokens", block=1)[0].hashes == tuple(block_hashes([1], 1))


# ---- compare on a trace ------------------------------------------------------------------------------

def test_compare_table_and_json(tmp_path):
    args = ["compare", "--trace", TRACE, "--workers", "2", "--capacity", "256", "--modes", "rr,kv-events", "--quiet"]
    as_json = CliRunner().invoke(main, args + ["--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)  # (kv-events collapses here: a warning on stderr)
    assert list(data) == ["rr", "kv-events"]
    assert data["rr"] == run(SimConfig(trace=TRACE, workers=2, capacity=256, mode="rr"))
    table = CliRunner().invoke(main, args + ["--format", "table"])
    lines = table.stdout.splitlines()
    assert lines[0].split()[0] == "run" and lines[1].split()[0] == "rr" and lines[2].split()[0] == "kv-events"
    assert str(data["rr"]["block_hit_rate"]) in lines[1]


@pytest.mark.parametrize("capacity", [64, 512])
def test_opt_is_the_upper_bound_among_policies_on_one_worker(head, capacity):
    rates = {p: sim(head, mode="kv-events", workers=1, capacity=capacity, policy=p)["block_hit_rate"]
             for p in plugins.eviction_policies().names()}
    assert all(rates["opt"] >= r for r in rates.values()), rates
    assert rates["opt"] > rates["lru"]


# ---- eviction inside prefix chains (every policy) ----------------------------------------------------

def _one_worker(paths_or_ids, capacity, policy):
    requests = [Request(tuple(ids), input_length=len(ids), index=i) for i, ids in enumerate(paths_or_ids)]
    return run(SimConfig(mode="kv-events", workers=1, capacity=capacity, policy=policy, trace="hand-made"),
               requests=requests)


@pytest.mark.parametrize("policy", plugins.eviction_policies().names())
def test_a_chain_keeps_its_head_when_another_request_needs_room(policy):
    """The issue's trace, capacity 3. By hand: request 0 stores 1, 2, 3 (full). Request 1 needs room
    for 9: the only block that may go is the leaf 3 (1 and 2 are parents of held blocks), so the cache
    is {1, 2, 9}. Request 2 finds 1, 2 (2 cached blocks); to store 3 it evicts 9 (1, 2 are its own).
    cached_blocks 2, evicted_blocks 2 (3, then 9) for every policy; opt cannot do better, as
    request 1 must store 9 and so evict one of the chain's blocks."""
    r = _one_worker([[1, 2, 3], [9], [1, 2, 3]], 3, policy)
    assert (r["cached_blocks"], r["evicted_blocks"]) == (2, 2), r


@pytest.mark.parametrize("policy", plugins.eviction_policies().names())
def test_a_request_does_not_evict_its_own_cached_head(policy):
    """Capacity 4: [1, 2], then [5, 6] fill the cache; [1, 2, 3, 4] finds 1, 2 and needs room for 3, 4.
    By hand: 1 and 2 are in use by the request, so the two victims are 6 then 5 (leaf first).
    cached_blocks 2, evicted_blocks 2 -- fifo and lfu used to evict 2 and 1 too, store them again in
    the same request, and report evicted_blocks 4."""
    r = _one_worker([[1, 2], [5, 6], [1, 2, 3, 4]], 4, policy)
    assert (r["cached_blocks"], r["evicted_blocks"]) == (2, 2), r


def _exact_best(requests, capacity):
    """The most cached blocks any eviction choice gets in the model of a bounded worker (brute force
    over every choice): each missed block is stored if it fits beside the request's cached head
    (the leading capacity - cached new blocks), a victim is never a block of the request being
    served, and the cache stays prefix-closed (a victim's children are not held)."""
    parent = {b: a for r in requests for a, b in zip(r, r[1:])}

    @functools.lru_cache(maxsize=None)
    def best(i, held):
        if i == len(requests):
            return 0
        r = requests[i]
        cached = next((k for k, h in enumerate(r) if h not in held), len(r))
        new = r[cached:][:max(0, capacity - cached)]
        need = max(0, len(held) + len(new) - capacity)
        out = None
        for victims in itertools.combinations(sorted(h for h in held if h not in r), need):
            rest = held - set(victims)
            if all(h not in parent or parent[h] in rest for h in rest):
                v = best(i + 1, frozenset(rest | set(new)))
                out = v if out is None else max(out, v)
        return cached + out

    return best(0, frozenset())


@given(paths=st.lists(st.lists(st.integers(0, 2), max_size=5), min_size=1, max_size=7),
       capacity=st.integers(0, 5))
def test_opt_is_the_optimum_and_no_policy_beats_it_on_one_worker(paths, capacity):
    """opt (Belady's farthest next use among the blocks the worker may evict) equals the brute-force
    optimum of the worker model in _exact_best, so no registered policy beats it on a single worker.
    (The model has no bypass: a policy that may decline to store a block can do better.)"""
    requests = [tuple(block_hashes(p, 1)) for p in paths]
    got = {p: _one_worker(requests, capacity, p)["cached_blocks"] for p in plugins.eviction_policies().names()}
    assert got["opt"] == _exact_best(requests, capacity), got
    assert all(got["opt"] >= v for v in got.values()), got


@pytest.mark.parametrize("policy", plugins.eviction_policies().names())
@given(paths=st.lists(st.lists(st.integers(0, 2), max_size=7), min_size=1, max_size=20), capacity=st.integers(0, 8))
def test_a_served_request_holds_its_leading_blocks_and_evictions_count_blocks_that_left(policy, paths, capacity):
    """After serving, the request's first min(len, capacity) blocks are held (none of its blocks was
    evicted while it was served), and evicted_blocks counts blocks that left the cache, once each.

    Exception kept on purpose: lru's fast path (whose numbers the labs pin) counts, for a request
    longer than the whole cache, its own blocks that it evicted and stored again."""
    requests = [Request(tuple(block_hashes(p, 1)), input_length=len(p), index=i) for i, p in enumerate(paths)]
    cls = plugins.eviction_policies().get(policy)
    future = None
    if cls.needs_future:
        from dynlab.kv.policies import FutureIndex
        future = FutureIndex([h for r in requests for h in reversed(r.hashes)],
                             times=[i for i, r in enumerate(requests) for _ in r.hashes])
    (wk,) = [Worker(0, cls(capacity, future=future))]
    left = 0
    for r in requests:
        before = held(wk)
        cached = wk.overlap(r.hashes)
        stored, removed = wk.serve(r.hashes, cached)
        after = held(wk)
        assert set(r.hashes[:capacity]) <= after
        assert set(removed) == before - after
        left += len(before - after)
        if policy == "lru" and len(r.hashes) > capacity:
            left = wk.evicted_blocks
        assert wk.evicted_blocks == left


@given(st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=8, unique=True), max_size=25),
       st.sampled_from(["lru", "fifo", None]), st.integers(0, 6))
def test_a_workers_server_serves_as_serve(prompts, policy, capacity):
    # Worker.server() (the replay's per-worker function) and members() give what serve() and overlap() give
    def make():
        if policy is None:
            return Worker(0)
        return Worker(0, plugins.eviction_policies().get(policy)(capacity))

    a, b = make(), make()
    serve_b = b.server()
    for p in prompts:
        names = tuple(p)
        k = a.overlap(names)
        assert overlap(names, b.members()) == k
        assert [list(x) for x in a.serve(names, k)] == [list(x) for x in serve_b(names, k)]
        assert list(a.cache) == list(b.cache) and a.size == b.size and a.evicted_blocks == b.evicted_blocks


@given(st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=8, unique=True), max_size=40),
       st.integers(1, 4), st.integers(1, 12))
@settings(max_examples=100, deadline=None)
def test_kv_events_on_change_is_the_events(prompts, n, cap):
    """Property: count-based kv-events gives the same result when its bus hands each change to the index
    (``Strategy.on_change``) as when it makes and delivers the BlockRemoved and BlockStored events."""
    cfg = SimConfig(workers=n, capacity=cap, mode="kv-events")
    requests = [Request(tuple(p), index=i) for i, p in enumerate(prompts)]
    outs = []
    for direct in (True, False):
        strategy = build_strategy(cfg, random.Random(5))
        assert strategy.on_change is not None
        if not direct:
            strategy.on_change = None
        outs.append(replay(requests, strategy, make_workers(cfg)))
    assert outs[0] == outs[1]
