"""The one path of every run: :func:`serve` of a topology, and the count-based topology (:class:`CountBased`).

A topology (the :class:`Topology` protocol) answers four things:

- ``routed_workers``: how many workers the run's strategy routes to (its ``RunContext.workers``
  and the routing recorder's size);
- ``environment(requests, strategy, config, *, loss_rng, recorders, progress) -> env`` (optional): the
  environment the fleet runs in; a topology without it runs in the timed one (:func:`timed_environment`);
- ``build(strategy, env) -> fleet``: a fresh fleet driven in ``env``; the fleet has ``run()``,
  ``evicted_blocks`` and ``all_engines`` (every engine, in the order the result lists them), and may add
  its own recorders to ``env.recorders``;
- ``describe() -> dict``: the keys that say what the run used.

:func:`serve` runs any topology and builds its result with the one result builder,
:func:`dynlab.engine.metrics.fleet_result`. :func:`dynlab.sim.run` takes :class:`CountBased` without
``--timing``, else :func:`dynlab.sim.topology.topology_for` (aggregated or P/D). This module imports no timed
engine module at start-up (the count-based command's start-up stays as short as it was).
"""
from __future__ import annotations

import random
from typing import Any, Iterable, Optional, Protocol, Sequence

from dynlab.engine.config import SimConfig
from dynlab.engine.metrics import Recorder, fleet_result
from dynlab.engine.run import CountedEnv, CountedFleet, make_workers, needs_future
from dynlab.routing.strategy import Strategy


class Topology(Protocol):
    """What the run layer needs of a topology (module docstring)."""

    routed_workers: int

    def build(self, strategy: Strategy, env: Any) -> Any:
        ...

    def describe(self) -> dict:
        ...


class CountBased:
    """The count-based replay (no ``--timing``, :mod:`dynlab.engine.run`): ``config.workers`` workers, each a
    ``config.capacity``-block cache of ``config.policy`` (:func:`~dynlab.engine.run.make_workers`), serving
    each request at once in workload order. ``synthetic_prefix_blocks``: ``None`` for a trace, else the
    synthetic workload's rule for repeats and hits; ``block_tokens``: tokens per block of the names replayed.
    ``workers``: hand-made :class:`~dynlab.engine.counted.Worker` s (tests, studies; :func:`replay`) served
    instead of fresh ones: they keep what they hold from one ``build`` to the next, and ``config.workers``,
    ``capacity`` and ``policy`` are not read."""

    def __init__(self, config: SimConfig, synthetic_prefix_blocks: Optional[bool], block_tokens: int,
                 workers: Optional[list] = None):
        self.config = config
        self.synthetic = synthetic_prefix_blocks
        self.block_tokens = block_tokens
        self.workers = workers
        self.routed_workers = config.workers if workers is None else len(workers)

    def environment(self, requests: Iterable, strategy: Strategy, config: SimConfig, *,
                    loss_rng: Optional[random.Random] = None, recorders: Sequence[Recorder] = (),
                    progress=None) -> CountedEnv:
        """A :class:`~dynlab.engine.run.CountedEnv` from ``config``'s events section (``publish``, ``event_delay``
        in requests, ``event_loss`` drawn from ``loss_rng``)."""
        return CountedEnv.of(requests, strategy, self.routed_workers, publish=config.publish == "yes",
                             event_delay=config.event_delay, event_loss=config.event_loss, loss_rng=loss_rng,
                             synthetic_prefix_blocks=self.synthetic, recorders=recorders, progress=progress)

    def build(self, strategy: Strategy, env: CountedEnv) -> CountedFleet:
        """Fresh workers in a :class:`~dynlab.engine.run.CountedFleet`; an offline eviction policy (``opt``)
        gets the future of ``env.arrivals`` (read into a list here), a block's time its request's number.
        Hand-made ``workers``, when given, are the fleet's as they are."""
        if self.workers is not None:
            return CountedFleet(strategy, self.workers, env)
        future = None
        if needs_future(self.config):
            from dynlab.kv.policies import FutureIndex

            env.arrivals = requests = list(env.arrivals)
            # indexed once, shared; opt ranks a request's blocks together
            future = FutureIndex([h for r in requests for h in reversed(r.hashes)],
                                 times=[i for i, r in enumerate(requests) for _ in r.hashes])
        return CountedFleet(strategy, make_workers(self.config, future), env)

    def describe(self) -> dict:
        return {"block_tokens": self.block_tokens}


def serve(topology: Topology, requests: Iterable, strategy: Strategy, config: SimConfig, *,
          loss_rng: Optional[random.Random] = None, recorders: Sequence[Recorder] = (), progress=None) -> dict:
    """Serve ``requests`` on a fresh ``topology``; the fleet metrics of
    :func:`~dynlab.engine.metrics.fleet_result` (without ``mode`` and the describing keys).

    The environment is the topology's (``environment``), else the timed one from ``config``'s traffic, events
    and SLO sections (:func:`timed_environment`); ``recorders`` observe the run after the serving recorder
    (timed) and before the topology's own. Raises ``ValueError`` when timestamps go backwards (timed).
    """
    make = getattr(topology, "environment", None)
    if make is None:
        env = timed_environment(topology, requests, strategy, config, loss_rng=loss_rng, recorders=recorders,
                                progress=progress)
    else:
        env = make(requests, strategy, config, loss_rng=loss_rng, recorders=recorders, progress=progress)
    fleet = topology.build(strategy, env)
    env.attach(fleet)
    fleet.run()
    return fleet_result(env.routing, env.counts(fleet.evicted_blocks), strategy, env.recorders, fleet.all_engines)


def replay(requests: Iterable, strategy: Strategy, workers: list, *, publish: bool = True, event_delay: int = 0,
           event_loss: float = 0.0, loss_rng: Optional[random.Random] = None,
           synthetic_prefix_blocks: Optional[bool] = None, progress=None, recorders: Sequence[Recorder] = ()) -> dict:
    """:func:`serve` of the count-based topology on hand-made ``workers`` (for tests and studies that build
    workers by hand; a run of a configuration is :func:`dynlab.sim.run`): the fleet metrics, without ``mode``.
    ``publish``: the workers' KV events reach ``strategy`` (``--publish``); ``event_delay`` (requests) and
    ``event_loss`` (probability, drawn from ``loss_rng``) as ``--event-delay``, ``--event-loss``;
    ``recorders``: more :class:`~dynlab.engine.metrics.Recorder` (only their ``on_route`` is called, ``cap``
    ``None``; results of no engines). The workers keep what they hold when it returns."""
    config = SimConfig(workers=len(workers), publish="yes" if publish else "no", event_delay=event_delay,
                       event_loss=event_loss)
    topology = CountBased(config, synthetic_prefix_blocks, config.block, workers=workers)
    return serve(topology, requests, strategy, config, loss_rng=loss_rng, recorders=recorders, progress=progress)


def timed_environment(topology: Topology, requests: Iterable, strategy: Strategy, config: SimConfig, *,
                      loss_rng: Optional[random.Random] = None, recorders: Sequence[Recorder] = (),
                      progress=None):
    """The timed environment (:meth:`RunEnv.timed <dynlab.engine.env.RunEnv.timed>`) of ``topology``'s
    routed workers, from ``config``'s traffic, events and SLO sections and its admission policy."""
    from dynlab.engine.env import RunEnv

    return RunEnv.timed(requests, strategy, topology.routed_workers, traffic=config.traffic,
                        events=config.events, slo=config.slo, loss_rng=loss_rng, recorders=recorders,
                        progress=progress, front_ms=config.request_overhead_ms,
                        token_ms=config.detok_ms, gate=build_policy(config.admission_policy, config.warmup))


def build_policy(spec: str, warmup: int = 0):
    """The admission policy of ``spec`` (``--admission-policy``, :class:`~dynlab.engine.gateway.AdmissionPolicy`),
    ``None`` for ``always`` without options (no gateway). Raises ``ValueError`` (one line) for an unknown
    name or a bad option."""
    from dynlab.engine.gateway import Always, parse_policy
    from dynlab.plugins import admission_policies

    name, opts = parse_policy(spec)
    registry = admission_policies()
    if name not in registry:
        raise ValueError(f"unknown admission policy {name!r}; available: {', '.join(registry.names())}")
    policy = registry.get(name)(opts, spec, warmup)
    return None if type(policy) is Always else policy


__all__ = ["Topology", "CountBased", "serve", "replay", "timed_environment", "build_policy"]
