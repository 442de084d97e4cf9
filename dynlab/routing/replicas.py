"""Router replicas: several independent instances of one strategy in front of one fleet.

A production router runs as several replicas (NVIDIA Dynamo's frontends, llm-d's endpoint
pickers); each keeps its own index and its own view of the load, and sees only the requests
that reach it. :class:`RouterReplicas` models that: ``N`` instances of the strategy, each built
from the run's context (so each has its own index and memory), one :class:`LoadBook` per replica.

- **Assignment** (``assign``): ``rr`` sends request ``i`` (arrival order) to replica ``i % N``;
  ``hash`` sends it to ``blake2b(repr(first block name)) % N``, the session key a sticky load
  balancer would use (a request with no full block hashes its index).
- **KV events** reach every replica (as Dynamo's replicas each consume the workers' events).
- **Load**: a replica's view holds only the requests it routed itself (per worker: requests
  routed, in flight, their estimated blocks and prompt tokens still to prefill, waiting for a
  first token), unless ``shared_load``: then every replica reads the whole fleet's view (Dynamo's
  replica sync of active blocks). Without ``--timing`` the load is zero, so replicas differ only by
  what each remembers of its own routing (and by its own per-worker request counts).

The RNG is the run's, shared: every decision still draws from it in request order, so with
``shared_load`` and an index learnt only from KV events (``kv-cost``, ``kv-events``), ``N``
replicas decide exactly as one router.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from dynlab.routing.strategy import FleetView, Request, Strategy

ASSIGNMENTS = ("rr", "hash")


class LoadBook:
    """One router's own load arrays, per worker, and the :class:`FleetView` over them.

    ``requests``: requests this router sent to each worker; ``active``: those in flight;
    ``active_blocks``: their estimated KV blocks; ``queued``: their prompt tokens still to prefill;
    ``waiting``: those without a first token yet. The timed fleet calls :meth:`add`,
    :meth:`first_token` and :meth:`remove` with the same estimates it keeps for the whole fleet.
    """

    __slots__ = ("requests", "active", "active_blocks", "queued", "waiting", "view")

    def __init__(self, workers: int, cached_blocks: Sequence = ()):
        self.requests = [0] * workers
        self.active, self.active_blocks = [0] * workers, [0] * workers
        self.queued, self.waiting = [0] * workers, [0] * workers
        cached = cached_blocks if len(cached_blocks) == workers else [0] * workers
        self.view = FleetView(self.requests, self.active, self.active_blocks, self.queued, cached, self.waiting)

    def add(self, w: int, blocks: int, prefill: int) -> None:
        self.active[w] += 1
        self.active_blocks[w] += blocks
        self.queued[w] += prefill
        self.waiting[w] += 1

    def first_token(self, w: int, prefill: int) -> None:
        self.queued[w] -= prefill
        self.waiting[w] -= 1

    def remove(self, w: int, blocks: int, prefill: int, waiting: bool) -> None:
        self.active[w] -= 1
        self.active_blocks[w] -= blocks
        self.queued[w] -= prefill
        if waiting:
            self.waiting[w] -= 1


def _session_hash(key) -> int:
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


class RouterReplicas(Strategy):
    """``N`` independent instances of one strategy; see the module docstring for the model.

    ``instances``: the replicas (at least one, all of one strategy); ``assign``: ``rr`` or
    ``hash``; ``shared_load``: every replica reads the fleet's load view instead of its own.
    After :meth:`route`, :attr:`last` is the replica that decided. Raises ``ValueError`` for no
    instance or an unknown assignment.
    """

    def __init__(self, instances: Sequence[Strategy], assign: str = "rr", shared_load: bool = False):
        if not instances:
            raise ValueError("router replicas need at least one strategy instance")
        if assign not in ASSIGNMENTS:
            raise ValueError(f"router assignment must be one of {', '.join(ASSIGNMENTS)}, got {assign!r}")
        first = instances[0]
        super().__init__(first.ctx)
        self.name = first.name
        self.uses_events = first.uses_events
        self.instances = list(instances)
        self.assign = assign
        self.shared_load = shared_load
        self.books: list[LoadBook] = []
        self.routed = [0] * len(self.instances)  # requests per replica
        self.last = 0
        self._i = 0
        self._deliver = [s.on_event for s in self.instances]

    def pick(self, request: Request) -> int:
        """The replica that receives ``request`` (advances the round-robin counter)."""
        n = len(self.instances)
        if self.assign == "rr":
            r = self._i % n
            self._i += 1
            return r
        key = request.hashes[0] if request.hashes else ("index", request.index)
        return _session_hash(key) % n

    def route(self, request: Request, fleet: FleetView) -> int:
        if not self.books:  # built on first use: the own views share the fleet's cached_blocks
            self.books = [LoadBook(fleet.workers, fleet.cached_blocks) for _ in self.instances]
            for book in self.books:  # each worker's pool, GPU and KV pool: configuration every replica knows alike
                book.view.set_hardware(fleet.pool, fleet.gpu, fleet.kv_blocks)
                book.view.lora_adapters = fleet.lora_adapters  # adapters in flight: a metric every replica scrapes
        r = self.pick(request)
        inner = self.instances[r]
        inner.predicted = None
        book = self.books[r]
        w = inner.route(request, fleet if self.shared_load else book.view)
        self.predicted = inner.predicted
        self.last = r
        self.routed[r] += 1
        if type(w) is int and 0 <= w < fleet.workers:
            book.requests[w] += 1
        return w

    def on_event(self, event) -> None:
        for deliver in self._deliver:
            deliver(event)

    def refused_events(self):
        """Replica 0's refusals: every replica receives the same events, so each counts the same."""
        return self.instances[0].refused_events()
