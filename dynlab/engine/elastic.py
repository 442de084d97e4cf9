"""Elastic fleets: workers join and leave a timed aggregated fleet during the run (``--controller``; a P/D fleet's decode
and prefill pools: :mod:`dynlab.disagg.elastic`).

:class:`Elastic` drives a :class:`~dynlab.engine.timed.TimedFleet` through its public seams
(:meth:`~dynlab.engine.timed.TimedFleet.grow`, ``routable``, ``elastic``) and observes it as a
:class:`~dynlab.engine.metrics.Recorder`. Worker ids are list positions that only grow: never reused, so every
per-worker figure (``requests_per_worker``, ``peak_kv_blocks``, ...) keeps one entry per id ever given.

- **Add** (:meth:`Elastic.add`): a new engine (the run's engine kind) gets the next id at once, in state
  ``starting``; at its ready time (``ready_in_ms`` later: where a cold start goes) it joins
  ``fleet.routable`` and the strategy's :meth:`~dynlab.routing.strategy.Strategy.on_join` is called. A
  request arriving exactly at the ready time may be routed to it (the ready event runs before arrivals).
- **Retire, draining** (:meth:`Elastic.retire`): the worker leaves ``routable`` at once (the strategy's
  ``on_leave``: an index drops its blocks), its later KV events no longer reach the strategy, it finishes what
  it holds and leaves when its engine is idle (``left_s``).
- **Retire, killing**: the worker leaves now; its engine's requests (waiting, running, loading) lose their
  blocks and go back through the router as new arrivals keeping their first arrival time (their TTFT counts
  from it), counted in ``requeued``; the gateway and the arrival recorders do not see them again, and a
  recorder with an ``on_requeue(req, t)`` method gets each one's new EngineRequest (same id; the
  ``--requests-out`` records follow it: :class:`~dynlab.sim.records.RequestRecorder`).

A strategy that returns a worker not in ``routable`` (one written for fixed fleets) has its request sent to
the routable worker with the fewest active requests (lowest id on a tie), counted in ``misrouted``.

The result gains (:meth:`Elastic.result`): ``controller``, ``requeued``, ``misrouted``, ``workers_over_time``
(``[s, routable workers]`` at the start and at each change), ``worker_lifetimes`` (per id: ``joined_s``,
``ready_s``, ``left_s``, ``None`` when still there at the end, and ``left_by``: ``drain`` or ``kill``) and
``mean_kv_usage_alive`` (per id, ``mean_kv_usage`` over the worker's own lifetime instead of the run's span).

Not modelled yet: a killed request that had its first token gets a second one on its new worker, and the
recorders see both (an admission policy that counts queued requests by their first tokens, ``queue-bound``,
counts such a request out twice).
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, Optional, Sequence

from dynlab.engine.controller import DRAINING, LIVE, STARTING, FleetState, StepSample, WorkerState
from dynlab.engine.loop import DELIVER
from dynlab.engine.metrics import Recorder, ratio
from dynlab.errors import DynlabError

GONE = "gone"


class Elastic(Recorder):
    """The joins and leaves of one timed fleet. ``build(worker_id) -> engine`` makes a new worker; ``spec``: the
    controller's (``--controller``), reported as ``controller``. Give it to the run's recorders before the fleet
    is built (its hooks are read then), then :meth:`attach` the fleet."""

    #: the pool it scales (``""``: an aggregated fleet; :class:`dynlab.disagg.elastic.DecodeElastic`: ``"decode"``)
    pool = ""

    def __init__(self, build: Callable[[int], Any], spec: str = "", weight_bytes: float = 0.0):
        self.build, self.spec, self.weight_bytes = build, spec, weight_bytes
        self.events: list = []  # (ms, "add" or "retire", worker id) of every decision applied, in order
        self.pending_ready = 0  # workers added whose ready time has not come (Control stops calling past them)
        self.pending_leave = 0  # retirements waiting for the router's discovery delay (the same)
        self._leaving: set = set()  # live workers retired whose routes go on until the router learns of it
        self.fleet = None
        self.origin: dict = {}  # request id -> the workload's Request, while in flight (a kill requeues it)
        self.state: list = []
        self.joined: list = []
        self.ready: list = []
        self.left: list = []
        self.left_by: list = []
        self.requeued = self.misrouted = 0
        self.timeline: list = []  # (ms, routable workers) at the start and at each change
        self._gone: set = set()  # retired workers, whose KV events no longer reach the strategy
        self._arrivals = 0  # in the controller's period so far
        self._prompt_tokens = self._finished = self._output_tokens = 0  # the same
        self._ttfts: list = []
        self._steps: list = []  # StepSample of the steps ended in the controller's period so far
        self._front = 0.0

    def attach(self, fleet) -> None:
        """Drive ``fleet`` (a :class:`~dynlab.engine.timed.TimedFleet`): every worker it has is live from 0 ms."""
        fleet.elastic = self
        fleet.origins = self.origin
        self.start_books(fleet)
        bus, deliver, gone = fleet.bus, fleet.bus.deliver, self._gone

        def deliver_live(event) -> None:  # a retired worker's events (even sent before) never reach the router
            if event.worker not in gone:
                deliver(event)

        bus.deliver = deliver_live

    def start_books(self, fleet) -> None:
        """Drive ``fleet`` (its ``engines``, ``routable``, ``loop``, ``env``, ``strategy``, ``active``, ``grow``): every
        worker it has is live from 0 ms."""
        self.fleet = fleet
        n = len(fleet.engines)
        self.state, self.joined, self.ready = [LIVE] * n, [0.0] * n, [0.0] * n
        self.left, self.left_by = [None] * n, [None] * n
        self.timeline = [(0.0, n)]
        serving = fleet.env.serving
        self._front = serving.front_ms + serving.token_ms  # a client TTFT: the engine's plus these

    # -- decisions ---------------------------------------------------------------------------
    def add(self, ready_in_ms: float = 0.0) -> int:
        """Add a worker now, routable ``ready_in_ms`` (>= 0) later; returns its id."""
        fleet = self.fleet
        now = fleet.loop.now
        w = fleet.grow(self.build(len(fleet.engines)))
        self.events.append((now, "add", w))
        for books, value in ((self.state, STARTING), (self.joined, now), (self.ready, now + ready_in_ms),
                             (self.left, None), (self.left_by, None)):
            books.append(value)
        fleet.loop.at(now + ready_in_ms, DELIVER, self._on_ready, w)  # before the arrivals at that time
        self.pending_ready += 1
        return w

    def _on_ready(self, w: int) -> None:
        self.pending_ready -= 1
        if self.state[w] != STARTING:
            return  # retired before it was ready
        self.state[w] = LIVE
        bisect.insort(self.fleet.routable, w)
        self.fleet.strategy.on_join(w)
        self._changed()

    def retire(self, w: int, kill: bool = False, after_ms: float = 0.0) -> None:
        """Retire worker ``w`` now: draining (default) or killing it (module docstring). With ``after_ms`` > 0 (the
        router's discovery delay, ``discovery_delay_s``) a live worker keeps receiving routes for ``after_ms`` more and
        its drain or kill starts then; a controller sees it ``draining`` at once (its pod is terminating). Raises
        :class:`~dynlab.errors.DynlabError` for a worker that is not there or already retired, or when it is
        the last routable worker."""
        fleet = self.fleet
        if (type(w) is not int or not 0 <= w < len(self.state) or self.state[w] not in (STARTING, LIVE)
                or w in self._leaving):
            raise DynlabError(f"controller {self.spec!r}: cannot retire worker {w!r}: not a starting or live worker")
        now = fleet.loop.now
        self.events.append((now, "retire", w))
        if self.state[w] == STARTING:  # never routable, holds nothing
            return self.leave(w, "drain", now)
        if len(fleet.routable) - len(self._leaving) == 1:
            raise DynlabError(f"controller {self.spec!r}: retiring worker {w} at {now / 1000:g} s would leave no "
                              f"routable worker")
        if after_ms > 0:
            self._leaving.add(w)
            self.pending_leave += 1
            fleet.loop.at(now + after_ms, DELIVER, self._unroute, w, kill)
            return
        self._unroute(w, kill, delayed=False)

    def _unroute(self, w: int, kill: bool, delayed: bool = True) -> None:
        """The router stops routing to ``w`` now; its drain or kill starts."""
        fleet = self.fleet
        if delayed:
            self.pending_leave -= 1
            self._leaving.discard(w)
        fleet.routable.remove(w)
        self._gone.add(w)
        fleet.strategy.on_leave(w)
        self._changed()
        if kill:
            return self.kill(w, fleet.loop.now)
        self.state[w] = DRAINING
        if self.can_leave(w):
            self.leave(w, "drain", fleet.loop.now)

    def can_leave(self, w: int) -> bool:
        """Whether draining worker ``w`` has finished what it holds: its engine is idle."""
        return self.fleet.engines[w].idle

    def idle(self, w: int) -> None:
        """Worker ``w``'s engine became idle (the fleet calls it): a draining worker leaves."""
        if self.state[w] == DRAINING and self.can_leave(w):
            self.leave(w, "drain", self.fleet.loop.now)

    def leave(self, w: int, how: str, now: float) -> None:
        """Worker ``w`` leaves at ``now`` (ms), by ``how`` (``drain`` or ``kill``)."""
        self.state[w] = GONE
        self.left[w], self.left_by[w] = now, how

    def kill(self, w: int, now: float) -> None:
        """Stop worker ``w``'s engine now and requeue its requests (in id order)."""
        fleet = self.fleet
        engine = fleet.engines[w]
        fleet.generation[w] += 1  # its step end and block boundaries scheduled are void: it never steps again
        sch, kv = engine.scheduler, engine.kv
        kv.accumulate(now)  # its usage integral ends now
        held = [*sch.running, *sch.loading, *sch.ready]
        for req in held:
            kv.free(req)
        reqs = sorted([*held, *sch.waiting], key=lambda r: r.id)
        sch.running = []
        while sch.waiting:
            sch.waiting.popleft()
        sch.loading.clear()
        sch.ready.clear()
        sch.arrived.clear()
        self.leave(w, "kill", now)
        for req in reqs:
            fleet._untrack(req)  # the router's view lets it go (TimedFleet's own bookkeeping)
        for req in reqs:
            self.requeued += 1
            new = fleet.enter(self.origin[req.id], req.arrival_ms, requeued=True)
            for r in fleet.env.recorders:  # a recorder keeping requests follows the new one (RequestRecorder)
                if hasattr(r, "on_requeue"):
                    r.on_requeue(new, now)

    def routable_or_else(self, w: int) -> int:
        """``w`` when routable, else (a strategy written for fixed fleets) the routable worker with the fewest
        active requests, lowest id on a tie, counted in ``misrouted``."""
        if self.state[w] == LIVE:
            return w
        self.misrouted += 1
        active = self.fleet.active
        return min(self.fleet.routable, key=lambda k: (active[k], k))

    def _changed(self) -> None:
        self.timeline.append((self.fleet.loop.now, len(self.fleet.routable)))

    # -- what a controller observes ----------------------------------------------------------
    def observe(self, period_s: float) -> FleetState:
        """The fleet now, and the arrivals and TTFTs since the last call (:class:`FleetState`)."""
        fleet = self.fleet
        workers = self.workers_now()
        out = FleetState(fleet.loop.now / 1000.0, period_s, workers, self._arrivals, tuple(self._ttfts),
                         self.weight_bytes, tuple(self._steps), self._prompt_tokens, self._finished,
                         self._output_tokens, self.pool)
        self._arrivals, self._ttfts, self._steps = 0, [], []
        self._prompt_tokens = self._finished = self._output_tokens = 0
        return out

    def workers_now(self) -> tuple:
        """Every worker not yet left, as :class:`WorkerState` now (ascending ids)."""
        fleet = self.fleet
        workers = []
        for w, state in enumerate(self.state):
            if state == GONE:
                continue
            state = DRAINING if w in self._leaving else state
            e = fleet.engines[w]
            queued = sum(r.num_tokens - r.computed for r in e.waiting)
            queued += sum(r.input_length - r.computed for r in e.running if r.computed < r.input_length)
            workers.append(WorkerState(w, state, self.ready[w] / 1000.0, len(e.waiting) + self.waiting_outside(w),
                                       len(e.running),
                                       e.used_blocks / e.capacity if e.capacity else 0.0, fleet.active[w],
                                       queued, e.used_blocks * e.block, e.capacity * e.block,
                                       e.max_num_batched_tokens, self.pool))
        return tuple(workers)

    def waiting_outside(self, w: int) -> int:
        """Requests given to worker ``w`` that wait outside its engine's waiting queue (none here; a P/D decode
        worker's: :class:`dynlab.disagg.elastic.DecodeElastic`)."""
        return 0

    def on_step(self, worker: int, result) -> None:
        block = self.fleet.engines[worker].block
        self._steps.append(StepSample(worker, result.prefill_tokens, result.batch_size - result.decode_requests,
                                      result.decode_requests, result.used_blocks * block,
                                      (result.end - result.start) / result.steps, result.end / 1000.0, result.steps))

    def on_arrival(self, req, t: float) -> None:
        self._arrivals += 1
        self._prompt_tokens += req.input_length

    def on_shed(self, req) -> None:
        self.origin.pop(req.id, None)

    def on_first_token(self, req, t: float) -> None:
        self._ttfts.append(t - req.arrival_ms + self._front)

    def on_finish(self, req, t: float) -> None:
        self.origin.pop(req.id, None)
        self._finished += 1
        self._output_tokens += req.output_length

    def on_reject(self, req) -> None:
        self.origin.pop(req.id, None)

    # -- the result ----------------------------------------------------------------------------
    def result(self, engines: Sequence) -> dict[str, Any]:
        def s(ms: Optional[float]) -> Optional[float]:
            return None if ms is None else round(ms / 1000.0, 3)

        end = self.fleet.env.serving.last_finish  # the run's last finish (ms)
        return {"controller": self.spec, "requeued": self.requeued, "misrouted": self.misrouted,
                "workers_over_time": [[s(t), n] for t, n in self.timeline],
                "worker_lifetimes": [{"worker": w, "joined_s": s(self.joined[w]), "ready_s": s(self.ready[w]),
                                      "left_s": s(self.left[w]), "left_by": self.left_by[w]}
                                     for w in range(len(self.state))],
                "mean_kv_usage_alive": [self._usage(e, w, end) for w, e in enumerate(engines)]}

    def _usage(self, engine, w: int, end: float) -> float:
        """Worker ``w``'s blocks held by requests integrated over its lifetime (joined to left, or to the run's
        last finish ``end``) over ``capacity x lifetime`` (:func:`~dynlab.engine.metrics.kv_usage`'s figure, which
        spans the whole run, for a worker that was not there all along); 0.0 for no lifetime."""
        until = self.left[w] if self.left[w] is not None else max(end, self.joined[w])
        return ratio(engine.used_block_ms(until), engine.capacity * (until - self.joined[w]))
