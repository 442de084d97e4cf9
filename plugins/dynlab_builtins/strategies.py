"""Built-in routing strategies, registered through the ``dynlab`` entry-point group.

``rr``, ``random``, ``kv`` and ``kv-events`` reproduce lab 000 (steps 4-5).
"""
from __future__ import annotations

from dynlab import hookimpl
from dynlab.router import KvRouter
from dynlab.strategy import AllBlocksCleared, BlockRemoved, BlockStored, Strategy


class RoundRobin(Strategy):
    """Round robin: request i goes to worker i % workers."""

    name = "rr"

    def __init__(self, ctx):
        super().__init__(ctx)
        self._i = 0

    def route(self, request, fleet):
        w = self._i % fleet.workers
        self._i += 1
        return w


class RandomChoice(Strategy):
    """Uniform random worker: one rng.randrange(workers) per request, from the run's RNG."""

    name = "random"

    def route(self, request, fleet):
        return self.ctx.rng.randrange(fleet.workers)


class KvAware(Strategy):
    """Largest prefix overlap, then fewest requests, then lowest index; remembers where it routed."""

    name = "kv"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.router = KvRouter(ctx.workers, ctx.block)

    def route(self, request, fleet):
        w = self.router.route_hashes(request.hashes)
        self.predicted = self.router.last_overlap
        return w


class KvEvents(KvAware):
    """As kv, but the index grows only from the workers' KV events (BlockStored/BlockRemoved)."""

    name = "kv-events"
    uses_events = True

    def __init__(self, ctx):
        Strategy.__init__(self, ctx)
        self.router = KvRouter(ctx.workers, ctx.block, use_events=True)

    def on_event(self, event):
        index = self.router.index
        if type(event) is BlockStored:
            index.apply_stored(event.worker, event.hashes)
        elif type(event) is BlockRemoved:
            index.apply_removed(event.worker, event.hashes)
        elif type(event) is AllBlocksCleared:
            index.clear(event.worker)


@hookimpl
def dynlab_register_strategies(register):
    for cls in (RoundRobin, RandomChoice, KvAware, KvEvents):
        register(cls)
