"""RunIndex against KvIndex (the oracle): the same answers for the same events, with or without runs.

Names are drawn from a few groups (``group * 1024 + offset``) with offsets crowded at 0..40 (Mooncake-like
runs of 32) and at both ends of 0..1023; events carry their names as runs ``(group, mask)`` (as the engine
makes them, or one pair per name) or carry none; a few names are not ints (a token-hashed feed), which sends
the index back to name mode. Events include holes, repeated stores (copies), names given twice in one event,
removals of what a worker holds (its eviction order), parents (refusals), block sizes, lower-tier events,
clears and the set-semantics calls. After every step: each worker's holdings, ``len``, the copies, the
refusal counters and ``find_matches`` (with and without the queries' runs) must equal KvIndex's.
"""
from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from dynlab.engine.config import SimConfig
from dynlab.engine.run import build_strategy
from dynlab.engine.serving import build_engines
from dynlab.sim.topology import Aggregated, serve
from dynlab.routing.events import MEDIUM_CPU, AllBlocksCleared, BlockRemoved, BlockStored
from dynlab.routing.index import KvIndex
from dynlab.routing.run_index import RunIndex
from dynlab.traces.reader import load_trace
from dynlab_builtins.strategies import KvCost

GROUPS = [0, 1, 7, 12345, 2**40 + 3]
WORKERS = range(5)
offsets = st.one_of(st.integers(0, 40), st.integers(1015, 1023), st.integers(0, 1023))
name = st.builds(lambda g, o: g * 1024 + o, st.sampled_from(GROUPS), offsets)
workers = st.sampled_from(list(WORKERS))


@st.composite
def run(draw):
    """Consecutive names inside one group (ascending, or descending as evictions go), or a scatter."""
    g, o, c = draw(st.sampled_from(GROUPS)), draw(offsets), draw(st.integers(1, 40))
    names = [g * 1024 + k for k in range(o, min(o + c, 1024))]
    how = draw(st.sampled_from(["asc", "desc", "scatter", "text"]))
    if how == "desc":
        names.reverse()
    elif how == "scatter":
        names = draw(st.lists(name, min_size=1, max_size=6))
    elif how == "text" and draw(st.integers(0, 9)) == 0:  # rare: a feed of names that are not ints
        names = [f"t{names[0]}"]
    return names


names_list = st.lists(run(), min_size=1, max_size=4).map(lambda rs: [x for r in rs for x in r])


def pairs(names, merge=True):
    """``names`` as ``(group, mask)`` pairs covering them exactly (a new pair where the group changes
    or a name repeats: the engine's shape when ``merge``; one pair per name otherwise); None when a
    name is not an int (no producer makes runs of those)."""
    if not all(isinstance(h, int) for h in names):
        return None
    out = []
    for h in names:
        g, b = h >> 10, 1 << (h & 1023)
        if merge and out and out[-1][0] == g and not out[-1][1] & b:
            out[-1] = (g, out[-1][1] | b)
        else:
            out.append((g, b))
    return tuple(out)


def asc_runs(names):
    """``names`` as ``(first, count)`` runs of consecutive ascending ints in one group (Request.runs)."""
    out = []
    for h in names:
        if out and out[-1][0] + out[-1][1] == h and h & 1023:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((h, 1))
    return out


def carry(data, names):
    """The runs an event carries: the engine's pairs, one per name, or none."""
    how = data.draw(st.sampled_from(["merged", "merged", "single", "none"]))
    return None if how == "none" else pairs(names, how == "merged")


def check_groups(ri: RunIndex) -> None:
    """Run mode's invariants: no empty mask or group; ``-1`` holds exactly the K-full workers, when any."""
    for g, offs in (ri._groups or {}).items():
        masks = {w: m for w, m in offs.items() if w >= 0}
        assert masks and all(masks.values()), g
        full = sum(1 << w for w, m in masks.items() if m & ri._km == ri._km)
        assert offs.get(-1, 0) == full and offs.get(-1) != 0, (g, offs)
    if ri._groups is not None:  # _copied: (worker, group) -> the offsets of the names with copies
        copied: dict = {}
        for w, h in ri._copies:
            copied[(w, h >> 10)] = copied.get((w, h >> 10), 0) | 1 << (h & 1023)
        assert ri._copied == copied


def check_same(kv: KvIndex, ri: RunIndex, queries) -> None:
    check_groups(ri)
    for w in WORKERS:
        assert ri.blocks(w) == kv.blocks(w)
    assert len(ri) == len(kv)
    assert ri._copies == kv._copies
    assert ri.refusals() == kv.refusals()
    assert ri.tier_blocks(0, MEDIUM_CPU) == kv.tier_blocks(0, MEDIUM_CPU)
    held = sorted((h for w in WORKERS for h in kv.blocks(w)), key=repr)
    for h in held[:5]:
        assert ri.holders(h) == kv.holders(h)
    for q in list(queries) + [sorted(kv.blocks(w), key=repr) for w in WORKERS]:
        want = kv.find_matches(q)
        assert ri.find_matches(q) == want
        if all(isinstance(h, int) for h in q):
            assert ri.find_matches(q, asc_runs(q)) == want
            assert ri.find_matches_tiers(q, runs=asc_runs(q)) == kv.find_matches_tiers(q)
        assert ri.find_matches_tiers(q) == kv.find_matches_tiers(q)


def step(data, kv: KvIndex, ri: RunIndex) -> None:
    """One random event (or set-semantics call), applied to both."""
    w = data.draw(workers)
    held = sorted(kv.blocks(w), key=repr)
    kind = data.draw(st.sampled_from(["store", "store", "parent", "remove", "one", "tail", "slice",
                                      "restore", "clear", "cpu", "size", "set"]))
    if kind in ("tail", "slice", "one") and not held:
        kind = "store"
    if kind == "store":
        h = data.draw(names_list)
        ev = BlockStored(w, tuple(h), runs=carry(data, h))
    elif kind == "parent":
        h = data.draw(names_list)
        p = data.draw(st.one_of(name, st.sampled_from(held or [0])))
        ev = BlockStored(w, tuple(h), parent_block_hash=p, runs=carry(data, h))
    elif kind == "size":
        h = data.draw(names_list)
        ev = BlockStored(w, tuple(h), block_size=data.draw(st.sampled_from([16, 32])), runs=carry(data, h))
    elif kind == "remove":
        h = data.draw(names_list)
        ev = BlockRemoved(w, tuple(h), runs=carry(data, h))
    elif kind == "one":
        h = [data.draw(st.sampled_from(held))]
        ev = BlockRemoved(w, tuple(h), runs=carry(data, h))
    elif kind == "tail":  # eviction order: a held tail, highest first
        h = held[::-1][:data.draw(st.integers(1, len(held)))]
        ev = BlockRemoved(w, tuple(h), runs=carry(data, h))
    elif kind == "slice":
        a = data.draw(st.integers(0, len(held) - 1))
        h = held[a:data.draw(st.integers(a + 1, len(held)))]
        ev = BlockRemoved(w, tuple(h), runs=carry(data, h))
    elif kind == "restore":  # stores around a held name: copies and filled holes
        x = data.draw(st.sampled_from(held)) if held and isinstance(held[0], int) else 5
        h = list(range(x - data.draw(st.integers(0, 3)), x + 3))
        ev = BlockStored(w, tuple(h), runs=carry(data, h))
    elif kind == "clear":
        ev = AllBlocksCleared(w)
    elif kind == "cpu":
        h = tuple(data.draw(names_list))
        ev = data.draw(st.sampled_from([BlockStored(w, h, medium=MEDIUM_CPU), BlockRemoved(w, h, MEDIUM_CPU)]))
    else:
        h = data.draw(names_list)
        if data.draw(st.booleans()):
            kv.apply_stored(w, h)
            ri.apply_stored(w, h)
        else:
            kv.apply_removed(w, h)
            ri.apply_removed(w, h)
        return
    assert ri.apply_event(ev) == kv.apply_event(ev)


@settings(max_examples=300)
@given(st.data())
def test_same_answers_as_kvindex(data):
    kv, ri = KvIndex(16), RunIndex(16, k=data.draw(st.sampled_from([2, 32])))
    queries = data.draw(st.lists(names_list, min_size=1, max_size=3))
    for _ in range(data.draw(st.integers(1, 25))):
        step(data, kv, ri)
        check_same(kv, ri, queries)


def test_switches_to_runs_at_the_first_event_with_runs():
    # hand-made: names 1024..1026 are offsets 0..2 of group 1 (1024 = 1 << 10); worker 2 stores them
    # as one pair (1, 0b111), then drops offset 1 (a hole): worker 2 holds 1024 only, leading 1
    ri = RunIndex()
    assert ri.apply_event(BlockStored(2, (1024,)))  # no runs: still a KvIndex
    assert ri._groups is None
    assert ri.apply_event(BlockStored(2, (1024, 1025, 1026), runs=((1, 0b111),)))
    assert ri._groups == {1: {2: 0b111}}
    assert ri._copies == {(2, 1024): 1}  # 1024 was held already: a copy, as KvIndex counts it
    ri.apply_event(BlockRemoved(2, (1025,), runs=((1, 0b10),)))
    assert ri.find_matches([1024, 1025, 1026], [(1024, 3)]) == {2: 1}
    ri.apply_event(BlockStored(3, ("text",)))  # a name that is not an int: back to name mode
    assert ri._groups is None
    assert ri.blocks(2) == {1024, 1026} and ri.find_matches([1024, 1025]) == {2: 1}


def test_k_full_passes_whole_runs():
    # hand-made, k=4: workers 0 and 1 hold offsets 0..3 of group 5 (K-full), worker 2 offsets 0..1;
    # a query of those 4 names then 2 of group 6 (held by worker 1 only): worker 0 scores 4, worker 1
    # 4 + 2 = 6, worker 2 its 2 leading names
    ri = RunIndex(k=4)
    for w, mask in ((0, 0b1111), (1, 0b1111), (2, 0b11)):
        ri.apply_event(BlockStored(w, tuple(5 * 1024 + o for o in range(mask.bit_length())), runs=((5, mask),)))
    ri.apply_event(BlockStored(1, (6 * 1024, 6 * 1024 + 1), runs=((6, 0b11),)))
    assert ri._groups[5][-1] == 0b011
    q = [5 * 1024 + o for o in range(4)] + [6 * 1024, 6 * 1024 + 1]
    assert ri.find_matches(q, [(5 * 1024, 4), (6 * 1024, 2)]) == {0: 4, 1: 6, 2: 2}


class _Checked(KvCost):
    """kv-cost, checking in a timed replay: each GPU event's runs name exactly its hashes, and the
    RunIndex answers as a KvIndex fed the same events (``shadow``)."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.shadow = KvIndex(ctx.block)
        self.on_event = self._on_event
        self.with_runs = 0

    def _on_event(self, ev):
        if getattr(ev, "runs", None) is not None:
            self.with_runs += 1
            expanded = [(g << 10) + o for g, m in ev.runs for o in range(1024) if m >> o & 1]
            assert sorted(expanded) == sorted(ev.hashes)
        assert self.index.apply_event(ev) == self.shadow.apply_event(ev)

    def costs(self, request, fleet):
        out, matches = super().costs(request, fleet)
        assert matches == self.shadow.find_matches(request.hashes)
        return out, matches


def test_timed_engine_events_carry_exact_runs():
    # 400 requests of the bundled trace on 2 workers of 400 blocks: evictions, boundaries, preemptions
    requests = load_trace("mooncake-conversation", block=16)
    config = SimConfig(mode="kv-cost", workers=2, trace="mooncake-conversation", timing=True, capacity=400)
    config.validate()
    setup = build_engines(config, requests.own_block_tokens)
    strategy = build_strategy(config, random.Random(0), registry={"kv-cost": _Checked}, block_tokens=config.block)
    out = serve(Aggregated(setup), requests[:400], strategy, config, loss_rng=random.Random(1))
    assert out["evicted_blocks"] > 0 and strategy.with_runs > 0 and strategy.index._groups is not None
    for w in range(2):
        assert strategy.index.blocks(w) == strategy.shadow.blocks(w)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_kv_router_routes_alike_on_either_index(data):
    # kv-events' router keeps a RunIndex and hands it the requests' runs: the same routes and overlaps as
    # the seed's router on a KvIndex, for the same stored and removed events
    from dynlab.routing.router import KvRouter

    plain, runs = KvRouter(5, 16, use_events=True), KvRouter(5, 16, use_events=True, index=RunIndex(16))
    for _ in range(data.draw(st.integers(1, 12))):
        names = [h for h in data.draw(names_list) if isinstance(h, int)]
        if data.draw(st.booleans()):
            w = data.draw(workers)
            kind = data.draw(st.sampled_from([BlockStored, BlockRemoved]))
            ev = kind(w, tuple(dict.fromkeys(names)), runs=pairs(list(dict.fromkeys(names))))
            assert plain.on_event(ev) == runs.on_event(ev)
        else:
            names = list(dict.fromkeys(names))
            assert plain.route_hashes(names) == runs.route_hashes(names, asc_runs(names))
            assert plain.last_overlap == runs.last_overlap
    assert plain.counts == runs.counts


def test_kv_router_refuses_an_index_of_another_block_size():
    from dynlab.routing.router import KvRouter

    try:
        KvRouter(2, 16, index=RunIndex(32))
    except ValueError as exc:
        assert "32" in str(exc) and "16" in str(exc)
    else:
        raise AssertionError("an index of 32-token blocks was accepted by a 16-token router")
