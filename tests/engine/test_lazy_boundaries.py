"""Bulk runs' block boundaries crossed lazily (no event delay, no loss) against one loop event each.

Without delay or loss, :class:`~dynlab.engine.timed.TimedFleet` crosses each worker's pending block
boundaries in one go before an arrival is routed or the worker's step ends, and publishes what they
evicted as one merged ``BlockRemoved`` counted once per boundary that evicted. Every observable must
be what crossing each boundary at its time gives: the routes (and every pool as it stood at each
routing decision), first tokens and finishes, each worker's events as the names they store and
remove in order, the counts, the pools' figures. Both pools and both indexes are covered: names
hashed at the engine block (``BlockPool``, ``KvIndex``) and a trace that names its own blocks, four
engine blocks each (``RunBlockPool``, and ``RunIndex`` under kv-cost).
"""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import published
from dynlab.engine.bus import EventBus
from dynlab.engine.config import SimConfig
from dynlab.engine.loop import EventLoop
from dynlab.engine.env import RunEnv
from dynlab.engine.metrics import RoutingMetrics, ServingMetrics
from dynlab.engine.run import build_strategy
from dynlab.engine.serving import build_engines
from dynlab.engine.timed import TimedFleet, arrival_times
from dynlab.routing.hashing import block_hashes
from dynlab.routing.strategy import Request

# whole-ms step times (1 ms per prefill token), so arrivals fall on block boundaries too
LINEAR = {"beta0": "10", "beta1": "1", "beta2": "1"}

rows_st = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 40), st.integers(0, 20)),
                   min_size=1, max_size=20)


def _requests(rows, block):
    """Requests whose names are their tokens' chained hashes at ``block`` tokens, the last partial block
    too (a trace that names its own blocks names every block it has, as Mooncake's hash_ids do)."""
    out, t = [], 0
    for i, (prefix, tail, output, gap) in enumerate(rows):
        t += gap
        tokens = [prefix] * 20 + list(range(1000 + i * 100, 1000 + i * 100 + tail))
        padded = tokens + [-1 - i] * (-len(tokens) % block)
        out.append(Request(tuple(block_hashes(padded, block)), len(tokens), output, float(t), i))
    return out


class Recording(ServingMetrics):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def on_first_token(self, req, t):
        super().on_first_token(req, t)
        self.seen.append(("first", req.id, t))

    def on_finish(self, req, t):
        super().on_finish(req, t)
        self.seen.append(("finish", req.id, t))


def _observed(rows, mode, workers, capacity, block, own, cpu, lazy):
    """Every observable of a timed fleet run, its block boundaries crossed lazily or one loop event each."""
    cfg = SimConfig(mode=mode, workers=workers, capacity=capacity, block=block, timing=True,
                    latency_model="linear", latency_opts=LINEAR, max_num_batched_tokens=32, cpu_capacity=cpu)
    setup = build_engines(cfg, block * own if own else None)
    strategy = build_strategy(cfg, random.Random(1), block_tokens=block)
    engines = setup.engines()
    loop = EventLoop()
    names: list = [[] for _ in engines]  # per worker, in publishing order: (kind, medium, name)

    def on_event(ev):
        names[ev.worker].extend((type(ev).__name__, ev.medium, h) for h in ev.hashes)
        strategy.on_event(ev)

    routes: list = []

    class Fleet(TimedFleet):
        def _route(self, req):
            w = super()._route(req)
            pools = [(sorted(published(e.pool)), e.used_blocks) for e in self.engines]
            routes.append((req.index, w, self.strategy.predicted, pools))
            return w

    seen: list = []
    bus = EventBus(loop, on_event)
    fleet = Fleet(strategy, engines, RunEnv(loop, bus, None, RoutingMetrics(workers), [Recording(seen)]),
                  setup.names_of, runs_of=setup.runs_of)
    assert fleet._lazy  # no delay, no loss
    fleet._lazy = lazy
    fleet.run(arrival_times(_requests(rows, block * (own or 1)), 1.0, 1.0, random.Random(0)))
    stats = [(e.peak_used_blocks, e.used_block_ms(), e.preemptions, e.steps) for e in engines]
    return routes, seen, names, stats, bus.published, fleet.evicted_blocks


@settings(max_examples=80, deadline=None)
@given(rows_st, st.sampled_from(["kv-cost", "kv-events", "least-loaded"]), st.integers(1, 3),
       st.integers(8, 64), st.sampled_from([2, 4]), st.sampled_from([None, 4]), st.sampled_from([None, 6]))
def test_lazy_block_boundaries_equal_one_loop_event_each(rows, mode, workers, capacity, block, own, cpu):
    if own and capacity < 4 * 20:
        capacity *= 4  # a trace block is four engine blocks: room for a few prompts
    args = (rows, mode, workers, capacity, block, own, cpu)
    assert _observed(*args, lazy=True) == _observed(*args, lazy=False)


def test_lazy_boundaries_are_crossed_in_one_go_and_merged():
    # the property above is only as good as its cases: long decodes on a small pool cross several
    # boundaries per call, some evicting, published as fewer events than they count
    crossed = []
    cross = TimedFleet._cross

    def counting(self, w, t):
        st_ = self.engines[w]._step
        before = st_.bound_at[:] if st_ is not None else []
        cross(self, w, t)
        crossed.append((sum(1 for b in before if b < t), len(self.engines[w].removed)))

    rows = [(0, 5, 40, 0), (1, 5, 40, 5), (2, 5, 40, 50), (3, 30, 40, 60)]
    TimedFleet._cross = counting
    try:
        lazy = _observed(rows, "kv-cost", 1, 64, 2, 4, None, lazy=True)
    finally:
        TimedFleet._cross = cross
    assert any(n > 1 and removed for n, removed in crossed)
    removals = sum(1 for kind, _, _ in lazy[2][0] if kind == "BlockRemoved")
    assert lazy[5] == removals > 0  # evicted blocks, all published
    assert lazy == _observed(rows, "kv-cost", 1, 64, 2, 4, None, lazy=False)
