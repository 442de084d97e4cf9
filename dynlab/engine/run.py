"""The count-based replay: a workload's requests -> a strategy -> simulated workers -> KV events -> metrics.

:class:`CountedFleet` serves requests on count-based workers in a :class:`CountedEnv`; :func:`build_strategy`
and :func:`make_workers` build them from a :class:`SimConfig`. The fleet is run only by the run layer: the
count-based topology (:class:`dynlab.sim.drive.CountBased`) through :func:`dynlab.sim.drive.serve`, for one
configuration (:func:`dynlab.sim.run`, ``dynlab sim``) or on hand-made workers (:func:`dynlab.sim.drive.replay`).

Count-based model (no time): requests are routed one after another in workload
order. Each worker serves its request at once (stores its blocks, evicts, and
publishes the net change as ``BlockStored`` / ``BlockRemoved`` when publishing is
on). Events produced by serving request ``i`` reach the strategy just before
request ``i + 1 + event_delay`` is routed; each is dropped with probability
``event_loss`` (from its own RNG, seeded from the run's seed, so the routing RNG
is untouched).
"""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Optional, Sequence

from dynlab.engine.config import SimConfig
from dynlab.engine.counted import Worker
from dynlab.engine.bus import CountedEventBus
from dynlab.engine.metrics import RoutingMetrics, hooks
from dynlab.errors import DynlabError
from dynlab.routing.hashing import overlap
from dynlab.routing.strategy import FleetView, Request, RunContext, Strategy, StrategyOption

class StrategyError(DynlabError):
    """A strategy plugin raised an exception: the message names the strategy and the call."""


def raised_in_plugin(exc: BaseException, strategy: Strategy) -> bool:
    """Whether the traceback of ``exc`` passes through the strategy class's own source files."""
    classes = [c for s in getattr(strategy, "instances", None) or (strategy,) for c in type(s).__mro__]
    files = {getattr(c, "__module__", None) for c in classes} - {"builtins", "abc", __name__}
    files = {getattr(sys.modules.get(m), "__file__", None) for m in files} - {None}
    files.discard(getattr(sys.modules.get("dynlab.routing.strategy"), "__file__", None))
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in files:
            return True
        tb = tb.tb_next
    return False


#: the option of router replicas (``--routers N``), given with the strategy's: ``--opt shared_load=true``
SHARED_LOAD = StrategyOption("shared_load", bool, False,
                             "router replicas read the whole fleet's load, not only their own requests'")


def build_strategy(config: SimConfig, rng: random.Random, registry=None, block_tokens: Optional[int] = None,
                   pool_blocks: Optional[int] = None) -> Strategy:
    """Instantiate ``config.mode`` from the strategy registry with converted options.

    ``block_tokens``: tokens per block of the workload's names (default ``config.block``);
    ``pool_blocks``: each worker's pool in blocks (``RunContext.pool_blocks``; default ``config.capacity``).
    With ``config.routers > 1``: a :class:`~dynlab.routing.replicas.RouterReplicas` of that many
    instances, sharing the run's RNG; ``--opt shared_load=true`` shares the load view among them.

    Raises :class:`dynlab.plugins.UnknownNameError` for an unknown mode and
    ``ValueError`` for an unknown or ill-typed option, or ``shared_load`` where it has no effect
    (one router, or no ``--timing``: the load a router knows is zero without it), or an option that
    needs a CPU tier (``StrategyOption.needs_cpu_tier``) given without one.
    """
    from dynlab import plugins

    registry = registry if registry is not None else plugins.strategies()
    cls = registry.get(config.mode)
    if getattr(cls, "needs_timing", False) and not config.timing:
        raise ValueError(f"strategy {config.mode!r} has no effect without --timing: it routes by the requests in "
                         "flight, which a count-based run does not have")
    declared = {o.name: o for o in cls.options}
    values = {o.name: o.default for o in cls.options}
    opts = dict(config.opts)
    shared = False
    if SHARED_LOAD.name in opts and SHARED_LOAD.name not in declared:
        text = opts.pop(SHARED_LOAD.name)
        shared = SHARED_LOAD.convert(text) if isinstance(text, str) else bool(text)
        if config.routers == 1:
            raise ValueError("option 'shared_load' has no effect with one router (--routers 1): "
                             "it shares the load among router replicas")
        if not config.timing:
            raise ValueError("option 'shared_load' has no effect without --timing: "
                             "the load a router knows is zero there")
    tier = config.timing and (config.cpu_capacity is not None or config.cpu_memory_gb is not None)
    for name, text in opts.items():
        if name not in declared:
            known = ", ".join(declared) or "none"
            raise ValueError(f"strategy {config.mode!r} has no option {name!r} (options: {known})")
        if declared[name].needs_cpu_tier and not tier:
            raise ValueError(f"option {name!r} has no effect without a CPU tier (--timing with --cpu-capacity "
                             "or --cpu-memory-gb): it weighs blocks in the workers' CPU tiers")
        values[name] = declared[name].convert(text) if isinstance(text, str) else text
    ctx = RunContext(workers=config.fleet_workers, block=block_tokens or config.block, rng=rng, options=values,
                     publish=config.publish == "yes", timed=config.timing,
                     pool_blocks=pool_blocks if pool_blocks is not None else config.capacity,
                     max_loras=config.max_loras)
    if config.routers == 1:
        return cls(ctx)
    from dynlab.routing.replicas import RouterReplicas

    return RouterReplicas([cls(ctx) for _ in range(config.routers)], config.router_assign, shared)


def make_workers(config: SimConfig, future: Optional[list] = None) -> list[Worker]:
    """``config.workers`` workers, each with a ``config.capacity``-block cache of ``config.policy``."""
    if config.capacity is None:
        return [Worker(w) for w in range(config.workers)]
    from dynlab import plugins

    policy = plugins.eviction_policies().get(config.policy)
    return [Worker(w, policy(config.capacity, future=future)) for w in range(config.workers)]


def needs_future(config: SimConfig) -> bool:
    """Whether the run's eviction policy is offline (it must see the future accesses: ``opt``), for a bounded cache."""
    if config.capacity is None:
        return False
    from dynlab import plugins

    cls = plugins.eviction_policies().get(config.policy)
    return bool(getattr(cls, "needs_future", False))


def _on_change(strategy: Strategy):
    """The strategy's ``on_change``, while it and ``on_event`` are methods of one object (an ``on_event``
    replaced afterwards, e.g. by a wrapper, turns it off: the events go through that ``on_event``)."""
    direct = getattr(strategy, "on_change", None)
    owner = getattr(direct, "__self__", None)
    return direct if owner is not None and getattr(strategy.on_event, "__self__", None) is owner else None


@dataclass
class CountedEnv:
    """The run environment of the count-based fleet (:class:`CountedFleet`), as
    :class:`~dynlab.engine.env.RunEnv` is a timed fleet's: ``arrivals`` (the requests, in workload order, no
    times), ``bus`` (a :class:`~dynlab.engine.bus.CountedEventBus`), ``routing`` (the routing recorder),
    ``recorders`` (only their ``on_route`` is called) and ``progress`` (a tqdm bar or ``None``)."""

    arrivals: Iterable[Request]
    bus: CountedEventBus
    routing: RoutingMetrics
    recorders: list = field(default_factory=list)
    progress: Any = None

    def attach(self, fleet) -> None:
        """Nothing to attach: no closed-loop users without time (the :class:`~dynlab.engine.env.RunEnv` interface)."""

    def counts(self, evicted_blocks: int) -> dict:
        """``evicted_blocks``, ``events_published``, ``events_dropped``: the counts of the result."""
        return {"evicted_blocks": evicted_blocks, "events_published": self.bus.published,
                "events_dropped": self.bus.dropped}

    @classmethod
    def of(cls, requests: Iterable[Request], strategy: Strategy, workers: int, *, publish: bool = True,
           event_delay: int = 0, event_loss: float = 0.0, loss_rng: Optional[random.Random] = None,
           synthetic_prefix_blocks: Optional[bool] = None, recorders: Sequence = (), progress=None) -> "CountedEnv":
        """The environment of ``requests`` routed by ``strategy`` to ``workers`` workers: KV events reach the
        strategy ``event_delay`` requests later, each dropped with probability ``event_loss`` (draws from
        ``loss_rng``); ``synthetic_prefix_blocks``: ``None`` for a trace, else the synthetic workload's rule
        for repeats and hits (:class:`~dynlab.engine.metrics.RoutingMetrics`)."""
        bus = CountedEventBus(strategy.on_event, delay=event_delay, loss=event_loss, rng=loss_rng, publish=publish,
                              direct=_on_change(strategy))
        return cls(requests, bus, RoutingMetrics(workers, synthetic_prefix_blocks), list(recorders), progress)


class CountedFleet:
    """Count-based workers (:class:`~dynlab.engine.counted.Worker`) served in ``env`` (a :class:`CountedEnv`):
    the fleet of the count-based topology (:class:`dynlab.sim.drive.CountBased`), with the timed fleets'
    interface (``run()``, ``evicted_blocks``, ``all_engines``: none, no engine has serving figures)."""

    all_engines = ()

    def __init__(self, strategy: Strategy, workers: list[Worker], env: CountedEnv):
        self.strategy, self.workers, self.env = strategy, workers, env

    @property
    def evicted_blocks(self) -> int:
        return sum(wk.evicted_blocks for wk in self.workers)

    def run(self) -> None:
        """Route and serve every request of ``env.arrivals``, count-based (module docstring).

        Each request is routed, then served at once by its worker (its prompt's blocks, then the blocks of its
        reply a token trace names, ``Request.output_hashes``: the worker holds them once it has answered),
        whose net change goes to the bus. Raises :class:`StrategyError` for an exception raised inside the
        strategy's own code, :class:`~dynlab.errors.DynlabError` for a route to no worker.
        """
        strategy, workers, env = self.strategy, self.workers, self.env
        n = len(workers)
        route_hooks = hooks(env.recorders, "on_route")
        routing, bus, progress = env.routing, env.bus, env.progress
        cached_sizes = [0] * n
        fleet = FleetView(routing.counts, [0] * n, [0] * n, [0] * n, cached_sizes)
        route, on_route, change = strategy.route, routing.on_route, bus.change
        tick = bus.tick if bus.delay else None  # without a delay nothing is ever pending: no call per request
        # each worker's serve and held blocks, looked up once (Worker.server / Worker.members)
        serves, held = [wk.server() for wk in workers], [wk.members() for wk in workers]
        i = -1
        try:
            for i, req in enumerate(env.arrivals):
                if tick is not None:
                    tick(i)
                strategy.predicted = None
                w = route(req, fleet)
                if type(w) is not int or not 0 <= w < n:
                    raise DynlabError(f"strategy {strategy.name!r} returned {w!r}, not a worker in 0..{n - 1}")
                hashes = req.hashes
                actual = overlap(hashes, held[w])
                on_route(hashes, w, strategy.predicted, actual, None, req.prefix)
                if route_hooks:
                    for hook in route_hooks:
                        hook(req, w, strategy.predicted, actual, None)
                reply = req.output_hashes  # a token trace's reply blocks (output_tokens): stored at its finish
                if reply:
                    routing.saw_reply(reply)
                stored, removed = serves[w](hashes + reply if reply else hashes, actual)
                cached_sizes[w] = workers[w].size
                if stored or removed:
                    change(w, stored, removed)
                if progress is not None:
                    progress.update(1)
        except DynlabError:
            raise
        except Exception as exc:
            if raised_in_plugin(exc, strategy):
                raise StrategyError(f"strategy {strategy.name!r} failed at request {i}: "
                                    f"{type(exc).__name__}: {exc}") from exc
            raise
        bus.flush()


def config_fields() -> list[str]:
    """Names of the :class:`SimConfig` fields (the ``sim`` options, underscores for dashes)."""
    return [f.name for f in fields(SimConfig)]


__all__ = ["SimConfig", "CountedEnv", "CountedFleet", "build_strategy", "make_workers", "config_fields", "StrategyError", "needs_future",
           "raised_in_plugin"]
