"""The step driver: one pool of engines stepping on the event loop, the one step loop every fleet uses.

A pool's worker ``w`` alternates step starts (``STEP_START`` events, :meth:`StepDriver._on_start`: the
engine's :meth:`~dynlab.engine.worker.EngineWorker.start_step`) and step ends (``STEP_END`` events at its
:attr:`~dynlab.engine.worker.EngineWorker.step_end`, :meth:`StepDriver._on_end`: its
:meth:`~dynlab.engine.worker.EngineWorker.finish_step`, then the pool's own bookkeeping, :meth:`StepDriver._ended`),
and starts its next step at once while it holds work. A step end superseded by a later schedule (a submit
cut a bulk decode run short) is skipped by its generation. A bulk run's block boundaries (engines whose
``cross_boundaries`` the pool set) are crossed lazily or as loop events of their own (see ``_lazy``).

Both kinds of pool are step drivers: an aggregated or prefill pool (:class:`~dynlab.engine.timed.TimedFleet`,
which publishes the KV events its steps cause and keeps the router's load view) and a P/D decode pool
(:mod:`dynlab.disagg.fleet`, which publishes nothing: no router reads a decode pool's events). The loop's
priorities (:mod:`dynlab.engine.loop`) order a step end, KV deliveries, arrivals and step starts at one time.
"""
from __future__ import annotations

import heapq
from typing import Callable, Optional, Sequence

from dynlab.engine.loop import STEP_END, STEP_START
from dynlab.engine.worker import EngineWorker
from dynlab.limits import HORIZON_MS, past_horizon
from dynlab.routing.events import MEDIUM_CPU, BlockRemoved, BlockStored


def step_past_horizon(engine: EngineWorker, who: str, now: float, end: float) -> ValueError:
    """The error for an engine step that would end past the horizon: its latency model (and the CPU
    tier loads it waits for) made it too long."""
    name = getattr(engine.latency, "name", "") or type(engine.latency).__name__
    return past_horizon(end, f"{who}'s engine step of {end - now:g} ms (latency model {name!r})",
                        "check --latency-opt (and --pcie-gbps with a CPU tier)")


class StepDriver:
    """Drives the steps of ``engines`` on ``loop``; ``ended(w, res)``: the pool's bookkeeping after worker
    ``w``'s step ended with ``res`` (a :class:`~dynlab.engine.bulk.StepResult`: its recorders, its requests'
    next stage), called right after the engine's ``finish_step`` and before the worker's next step is
    scheduled (the fleet's ``elastic``, when set, then hears of a worker gone idle).

    ``publishes``: send what steps and block boundaries evict on ``bus`` (an :class:`~dynlab.engine.bus.EventBus`)
    as ``BlockRemoved`` (and the CPU tier's changes), counted in :attr:`evicted_blocks` (``False``: a pool
    no router listens to). ``lazy``: cross bulk runs' block boundaries lazily, each worker's in one go
    before what could tell (default: when the bus neither delays nor loses events). ``who``: how errors
    name a worker. ``on_step_started(w, engine, now)``, optional: called after worker ``w`` started a step.
    """

    def __init__(self, engines: Sequence[EngineWorker], loop, bus, ended: Callable, *, publishes: bool = True,
                 lazy: Optional[bool] = None, who: str = "worker", on_step_started: Optional[Callable] = None):
        self.engines, self.loop, self.bus, self.who = engines, loop, bus, who
        self.ended, self.publishes, self.on_step_started = ended, publishes, on_step_started
        self.generation = [0] * len(engines)
        self.elastic = None  # an Elastic (dynlab.engine.elastic) when workers join and leave during the run
        self.evicted_blocks = 0
        # Bulk runs' block boundaries. Without event delay and loss they are crossed lazily, each worker's
        # in one go, before what could tell (an arrival's routing, the worker's step end): nothing reads
        # a worker's pool or the router's index in between, and events of different workers commute (the
        # index keeps each worker's blocks apart). The boundaries a worker crosses in one go reach the
        # router as one merged BlockRemoved (counted one per boundary that evicted), so the routes and
        # every count are those of a loop event per boundary. With a delay or loss (draws follow the
        # publishing order) each boundary is a loop event and an event of its own.
        self._lazy = (not bus.delay_ms and not bus.loss) if lazy is None else lazy
        self._bounds: list = []  # pending (time ms, worker, generation), earliest first (a heap)

    def wake(self, w: int) -> None:
        """Start worker ``w``'s next step at the current time (it does nothing when the worker is busy or idle)."""
        self.loop.at(self.loop.now, STEP_START, self._on_start, w)

    def resume(self, w: int, before: Optional[float]) -> None:
        """Worker ``w`` was given a request now, its :attr:`~EngineWorker.step_end` having been ``before``:
        start its step (it was between steps) or reschedule its step end (the request cut a bulk run)."""
        if before is None:
            self.loop.at(self.loop.now, STEP_START, self._on_start, w)
        elif (end := self.engines[w].step_end) != before:
            self._schedule_end(w, end)

    def _on_start(self, w: int) -> None:
        engine = self.engines[w]
        if engine.step_end is not None or engine.idle:
            return
        now = self.loop.now
        end = engine.start_step(now)  # its step_end (None: nothing started)
        if (engine.removed or engine.cpu_removed or engine.cpu_stored) and self.publishes:  # (KV cache groups:
            self._publish_removed(w, engine)  # a CPU change alone)
        if end is None and (t := engine.next_ready) is not None:  # nothing to run until a load in transit arrives
            if not t <= HORIZON_MS:
                raise past_horizon(t, f"{self.who} {w}'s load from its CPU tier", "use a larger --pcie-gbps")
            self.loop.at(t if t > now else now, STEP_START, self._on_start, w)
        self._schedule_end(w, end)
        if self.on_step_started is not None:
            self.on_step_started(w, engine, now)

    def _publish_removed(self, w: int, engine: EngineWorker) -> None:
        """Publish what a step start (or a bulk run's block boundary) evicted: GPU, then the CPU tier."""
        self.evicted_blocks += len(engine.removed)
        gpu = BlockRemoved(w, tuple(engine.removed), runs=engine.removed_runs) if engine.removed else None
        self._publish(w, gpu, engine.cpu_removed, engine.cpu_stored)

    def _publish(self, w: int, gpu_event, cpu_removed: tuple, cpu_stored: tuple) -> None:
        """Send ``gpu_event``, then the CPU tier's change (``BlockRemoved``, then ``BlockStored``, medium
        CPU) as one batch; one event alone (the common case) goes through :meth:`EventBus.send_one`."""
        if not cpu_removed and not cpu_stored:
            self.bus.send_one(gpu_event)
            return
        events = [gpu_event] if gpu_event is not None else []  # None: only the CPU tier changed
        if cpu_removed:
            events.append(BlockRemoved(w, cpu_removed, MEDIUM_CPU))
        if cpu_stored:
            events.append(BlockStored(w, cpu_stored, medium=MEDIUM_CPU))
        self.bus.send(events)

    def _schedule_end(self, w: int, end: Optional[float] = None) -> None:
        """Schedule worker ``w``'s step end (``end``: its :attr:`~EngineWorker.step_end` when the caller has
        it, else read) and its bulk run's next block boundary, superseding those scheduled before."""
        self.generation[w] += 1
        engine = self.engines[w]
        if end is None:
            end = engine.step_end
        if end is not None:
            if not end <= HORIZON_MS:
                raise step_past_horizon(engine, f"{self.who} {w}", self.loop.now, end)
            self.loop.at(end, STEP_END, self._on_end, w, self.generation[w])
            nxt = engine.next_boundary
            if nxt is None:
                return
            if self._lazy:
                heapq.heappush(self._bounds, (nxt, w, self.generation[w]))
            else:  # a bulk decode run takes blocks at its block boundaries: a step start's place
                self.loop.at(nxt, STEP_START, self._on_boundary, w, self.generation[w])

    def _on_boundary(self, w: int, generation: int) -> None:
        if generation != self.generation[w]:
            return  # superseded: a submit cut the run before this boundary
        engine = self.engines[w]
        if engine.next_boundary is None:
            return  # crossed already (a boundary at the run's very end, with zero-length steps)
        if engine.cross_boundary():
            self._publish_removed(w, engine)
        nxt = engine.next_boundary
        if nxt is not None:
            self.loop.at(nxt, STEP_START, self._on_boundary, w, generation)

    def _cross_before(self, t: float) -> None:
        """Cross every worker's pending block boundaries before ``t`` (ms) (lazily: see ``_lazy``)."""
        bounds, generation, pop, push = self._bounds, self.generation, heapq.heappop, heapq.heappush
        while bounds and bounds[0][0] < t:
            _, w, gen = pop(bounds)
            if gen == generation[w]:
                self._cross(w, t)
                nxt = self.engines[w].next_boundary
                if nxt is not None:
                    push(bounds, (nxt, w, gen))

    def _cross(self, w: int, t: float) -> None:
        """Cross worker ``w``'s pending block boundaries before ``t`` (ms), publishing what they evict."""
        engine = self.engines[w]
        if engine.cpu is not None:  # each boundary's CPU-tier writes follow its GPU event
            while engine.next_boundary is not None and engine.next_boundary < t:
                if engine.cross_boundary():
                    self._publish_removed(w, engine)
            return
        evicting = engine.cross_before(t)
        if evicting:
            self.evicted_blocks += len(engine.removed)
            self.bus.send_merged(BlockRemoved(w, engine.removed, runs=engine.removed_runs), evicting)

    def _on_end(self, w: int, generation: int) -> None:
        if generation != self.generation[w]:
            return  # superseded: a submit cut the bulk decode run short
        engine = self.engines[w]
        if self._lazy and engine.next_boundary is not None:
            self._cross(w, self.loop.now)
        self.ended(w, engine.finish_step())
        if not engine.idle:
            self.loop.at(self.loop.now, STEP_START, self._on_start, w)
        elif self.elastic is not None:
            self.elastic.idle(w)  # a draining worker leaves when it has finished what it holds
