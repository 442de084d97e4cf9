"""A toy topology built only through the run layer's public interface (docs/development.md, "A topology").

Two aggregated pools share one clock; arrivals alternate between them (request ``i`` goes to pool
``i % 2``), and each pool's own strategy routes within it. With one worker per pool and ``rr`` the
toy must serve every request exactly as the built-in aggregated fleet of two workers under ``rr``
does (``rr`` alternates 0, 1, 0, 1 too): the same times, hits and preemptions, request by request.
"""
from __future__ import annotations

import json
import random

from dynlab.engine.bus import EventBus
from dynlab.engine.config import SimConfig
from dynlab.engine.env import RunEnv
from dynlab.engine.loop import ARRIVAL
from dynlab.engine.metrics import RoutingMetrics
from dynlab.engine.run import build_strategy
from dynlab.engine.serving import build_engines
from dynlab.engine.timed import TimedFleet
from dynlab.sim import run
from dynlab.sim.records import RequestRecorder
from dynlab.sim.topology import Aggregated, serve


class _Alternating:
    """The toy's fleet: what :func:`dynlab.sim.topology.serve` needs (``run``, ``evicted_blocks``, ``all_engines``)."""

    def __init__(self, env, pools):
        self.env, self.pools = env, pools

    def run(self):
        loop, arrivals = self.env.loop, self.env.arrivals

        def next_arrival():
            nxt = next(arrivals, None)
            if nxt is not None:
                loop.at(nxt[1], ARRIVAL, on_arrival, nxt[0])

        def on_arrival(req):
            self.pools[req.index % len(self.pools)].arrive(req)
            next_arrival()

        next_arrival()
        loop.run()

    @property
    def evicted_blocks(self):
        return sum(p.evicted_blocks for p in self.pools)

    @property
    def all_engines(self):
        return [e for p in self.pools for e in p.all_engines]


class TwoPools:
    """A topology (the :class:`~dynlab.sim.topology.Topology` protocol): two aggregated pools of
    ``config.workers`` each; the run's strategy routes within pool 0, a second instance within pool 1."""

    def __init__(self, config: SimConfig):
        self.setup = build_engines(config, None)
        self.routed_workers = config.workers

    def build(self, strategy, env):
        s = self.setup
        other = build_strategy(s.config, random.Random(2), block_tokens=s.config.block)
        # pool 1: the same clock and recorders, its own KV-event bus (to its own strategy) and router view
        env1 = RunEnv(env.loop, EventBus(env.loop, other.on_event), None, RoutingMetrics(s.config.workers),
                      env.recorders, env.progress)
        pools = [TimedFleet(strategy, s.engines(), env, s.names_of), TimedFleet(other, s.engines(), env1, s.names_of)]
        return _Alternating(env, pools)

    def describe(self):
        return self.setup.describe()


def _trace(tmp_path):
    rows, t = [], 0
    for i in range(24):
        t += (i * 7) % 11
        prefix = i % 3
        rows.append({"tokens": [prefix] * 40 + list(range(1000 + 50 * i, 1000 + 50 * i + 5 + i % 9)),
                     "output_length": 1 + (i * 5) % 13, "timestamp": t})
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_toy_topology_serves_like_the_builtin_fleet(tmp_path):
    trace = _trace(tmp_path)
    linear = {"beta0": "10", "beta1": "1", "beta2": "2"}
    common = dict(mode="rr", trace=trace, timing=True, capacity=12, latency_model="linear", latency_opts=linear,
                  max_num_batched_tokens=32)
    builtin = RequestRecorder()
    expected = run(SimConfig(workers=2, **common), recorders=(builtin,))

    config = SimConfig(workers=1, **common)
    from dynlab.traces.reader import load_trace

    requests = load_trace(trace, None, config.block)
    toy = RequestRecorder()
    strategy = build_strategy(config, random.Random(config.seed), block_tokens=config.block)
    got = serve(TwoPools(config), requests, strategy, config, recorders=(toy,))

    a, b = list(builtin.records()), list(toy.records())
    assert len(a) == len(b) == 24
    for x, y in zip(a, b):
        assert x["worker"] == x["id"] % 2 and y["worker"] == 0  # the toy numbers workers within each pool
        assert {k: v for k, v in x.items() if k != "worker"} == {k: v for k, v in y.items() if k != "worker"}
    assert sum(r["preemptions"] for r in a) > 0  # a small pool: the case exercises preemption
    for key in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_wait_ms", "preemptions", "rejected", "engine_steps",
                "prefix_hit_rate", "peak_kv_blocks", "mean_kv_usage"):
        assert got[key] == expected[key], key


def test_builtin_aggregated_topology_through_serve_equals_run(tmp_path):
    # the run layer's two paths to one result: dynlab.sim.run and serve() on the Aggregated topology
    trace = _trace(tmp_path)
    config = SimConfig(mode="kv-events", workers=2, trace=trace, timing=True, capacity=12)
    from dynlab.traces.reader import load_trace

    requests = load_trace(trace, None, config.block)
    strategy = build_strategy(config, random.Random(config.seed), block_tokens=config.block)
    got = serve(Aggregated(build_engines(config, None)), requests, strategy, config,
                loss_rng=random.Random(f"dynlab-event-loss-{config.seed}"))
    expected = run(config)
    assert {k: v for k, v in expected.items() if k in got} == got
