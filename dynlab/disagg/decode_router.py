"""The decode routers of a P/D fleet (``--decode-router``): ordinary :class:`~dynlab.routing.strategy.Strategy`
classes that route a prefilled request to a decode worker.

They see the decode pool's :class:`~dynlab.routing.strategy.FleetView` (built by
:class:`~dynlab.disagg.fleet.DisaggFleet`): ``requests[d]`` handed to decode worker ``d`` so far,
``active_requests[d]`` assigned and not finished (reservations waiting included), ``active_blocks[d]``
the blocks in use there (requests' and reservations', what vLLM's ``kv_cache_usage`` metric counts),
and ``ctx.pool_blocks`` each decode worker's pool (blocks). Ties go to the lowest worker id. Each picks among
``fleet.routable`` (every decode worker of a fixed pool; an elastic one's ready and not retired:
:mod:`dynlab.disagg.elastic`).
"""
from __future__ import annotations

from dynlab.routing.strategy import FleetView, Request, RunContext, Strategy


class LeastLoaded(Strategy):
    """Fewest requests assigned and not finished, then the lowest id."""

    name = "least-loaded"

    def route(self, request: Request, fleet: FleetView) -> int:
        load = fleet.active_requests
        return min(fleet.routable, key=lambda d: (load[d], d))


class RoundRobin(Strategy):
    """Decode workers in turn."""

    name = "round-robin"

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self._next = 0

    def route(self, request: Request, fleet: FleetView) -> int:
        routable = fleet.routable
        d = routable[self._next % len(routable)]
        self._next += 1
        return d


class KvUsage(Strategy):
    """Lowest share of the pool in use (``active_blocks / pool_blocks``), then fewest requests, then lowest id."""

    name = "kv-usage"

    def route(self, request: Request, fleet: FleetView) -> int:
        used, load, capacity = fleet.active_blocks, fleet.active_requests, self.ctx.pool_blocks
        return min(fleet.routable, key=lambda d: (used[d] / capacity, load[d], d))


#: ``--decode-router`` name -> its class (the names of :data:`dynlab.engine.config.DECODE_ROUTERS`)
DECODE_ROUTER_CLASSES = {cls.name: cls for cls in (LeastLoaded, RoundRobin, KvUsage)}


def decode_router(name: str, workers: int, pool_blocks: int, block: int = 16) -> Strategy:
    """The decode router ``name`` for ``workers`` decode workers of ``pool_blocks`` blocks each.
    Raises ``ValueError`` for an unknown name."""
    cls = DECODE_ROUTER_CLASSES.get(name)
    if cls is None:
        raise ValueError(f"decode_router must be one of {', '.join(DECODE_ROUTER_CLASSES)}, got {name!r}")
    return cls(RunContext(workers=workers, block=block, timed=True, pool_blocks=pool_blocks))
