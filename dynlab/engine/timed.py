"""The timed replay (``--timing``): requests arrive in time at a fleet of serving engines.

Data flows one way: an arrival is routed by the strategy (which sees only the router's own
load view and the KV events that reached it), submitted to the chosen worker's engine
(:class:`~dynlab.engine.worker.EngineWorker`: vLLM v1's scheduler, block pool, preemption),
whose steps publish KV events through the :class:`~dynlab.engine.bus.EventBus`; the
recorders (:mod:`dynlab.engine.metrics`) observe routes, first tokens, finishes and steps.

The router's load view (:class:`~dynlab.routing.strategy.FleetView`) is what a real router
knows, never the engines' state: per worker, the requests it routed and has not seen finish
(it proxies the responses, so it sees first tokens and finishes at once), its estimate of
their KV blocks (``ceil((input + output) / block)`` each) and of their prompt tokens still
to prefill (``input_length - block * predicted overlap`` until the first token), and
``cached_blocks`` 0 (a router cannot see engine caches), and ``waiting_requests``: those without a
first token yet. The request a strategy routes carries the simulated arrival time (ms) as its
``timestamp``. With router replicas (:class:`~dynlab.routing.replicas.RouterReplicas`), each
replica's own view holds only the requests it routed, unless they share the load.

Arrivals (:func:`dynlab.engine.env.arrival_times`, re-exported here): trace timestamps (ms) times
``time_scale``; a workload without timestamps arrives as a Poisson process of ``rate`` requests/s
from its own RNG. Timestamps must not go backwards (the trace readers refuse such traces). The
fleet runs in a :class:`~dynlab.engine.env.RunEnv`; the run layer (:mod:`dynlab.sim`) builds both.
"""
from __future__ import annotations

import heapq
import random
from typing import Callable, Iterable, Iterator, Optional, Sequence

from dynlab.engine.env import RunEnv, arrival_times, check_arrivals  # noqa: F401 (re-exported)
from dynlab.engine.lora import AdaptersInFlight
from dynlab.engine.loop import ARRIVAL, STEP_END, STEP_START
from dynlab.engine.metrics import fleet_result, hooks
from dynlab.engine.tier_metrics import TierRecorder
from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.errors import DynlabError
from dynlab.limits import HORIZON_MS, past_horizon
from dynlab.routing.events import MEDIUM_CPU, BlockRemoved, BlockStored
from dynlab.routing.replicas import RouterReplicas
from dynlab.routing.strategy import FleetView, Request, Strategy, reroute


def step_past_horizon(engine: EngineWorker, who: str, now: float, end: float) -> ValueError:
    """The error for an engine step that would end past the horizon: its latency model (and the CPU
    tier loads it waits for) made it too long."""
    name = getattr(engine.latency, "name", "") or type(engine.latency).__name__
    return past_horizon(end, f"{who}'s engine step of {end - now:g} ms (latency model {name!r})",
                        "check --latency-opt (and --pcie-gbps with a CPU tier)")


class TimedFleet:
    """Drives ``engines`` in ``env`` (a :class:`~dynlab.engine.env.RunEnv`: loop, bus, arrivals, recorders,
    progress): arrivals, steps, KV events, the router's view.

    ``names_of(request) -> list[int]``: the request's full prompt block names at the engine's
    block size. ``runs_of(request) -> (names, runs)`` (optional, used instead of ``names_of`` when given): the
    names and their runs (:func:`dynlab.engine.names.engine_block_runs`), which the routing recorder
    takes in place of the names and the engines' requests carry (an engine built with ``runs=True``
    works on them: :class:`~dynlab.kv.run_pool.RunBlockPool`).

    The public hooks of a topology built on it (each optional, called in this order within a time):
    ``on_step_started(w, engine, now)`` after worker ``w`` started a step (or bulk run);
    ``on_step_ended(w, result)`` right after its :meth:`~dynlab.engine.worker.EngineWorker.finish_step`,
    before anything is published or recorded; ``on_handed_off(w, ereq, now)`` for each request an engine
    built with ``handoff=True`` handed off at its first token (the router's view has let it go);
    ``admits(ereq)``, asked for each routed request before its engine's
    :meth:`~dynlab.engine.worker.EngineWorker.submit`: ``False`` rejects it as an engine that can never
    hold it does (``ereq.rejected``, ``on_reject``; nothing is submitted, the engine's ``rejected`` is not counted).
    :meth:`wake` starts an idle worker's next step at the current time. With a gateway (``env.gate``, a
    :class:`~dynlab.engine.holding.Gateway`) :meth:`arrive` asks it, and it calls :meth:`enter` or :meth:`shed`. ``lazy``: cross bulk runs' block
    boundaries lazily (default: when the bus neither delays nor loses events; see below); a topology
    that touches a worker's pool between arrivals passes ``False``.
    """

    def __init__(self, strategy: Strategy, engines: Sequence[EngineWorker], env, names_of: Callable[[Request], list],
                 runs_of: Optional[Callable] = None, *, lazy: Optional[bool] = None,
                 on_step_started: Optional[Callable] = None, on_step_ended: Optional[Callable] = None,
                 on_handed_off: Optional[Callable] = None, admits: Optional[Callable] = None):
        n = len(engines)
        self.env = env
        self.runs_of = runs_of
        self.strategy, self.engines, self.bus, self.loop = strategy, engines, env.bus, env.loop
        self.names_of, self.routing, self.progress = names_of, env.routing, env.progress
        recorders = env.recorders
        self._h_route, self._h_arrival = hooks(recorders, "on_route"), hooks(recorders, "on_arrival")
        self._h_reject, self._h_first = hooks(recorders, "on_reject"), hooks(recorders, "on_first_token")
        self._h_finish, self._h_step = hooks(recorders, "on_finish"), hooks(recorders, "on_step")
        self._h_shed, self.gate = hooks(recorders, "on_shed"), env.gate
        self.on_step_started, self.on_step_ended, self.on_handed_off = on_step_started, on_step_ended, on_handed_off
        self.admits = admits
        routing = env.routing
        self.block = engines[0].block if n else 1
        self.active, self.active_blocks, self.queued = [0] * n, [0] * n, [0] * n
        self.waiting, self.cached, self.routable = [0] * n, [0] * n, list(range(n))
        # the view's request counts are the recorder's (requests routed to each worker so far)
        self.adapters = AdaptersInFlight(n)  # per worker: LoRA adapter -> its requests in flight
        self.fleet = FleetView(routing.counts, self.active, self.active_blocks, self.queued, self.cached, self.waiting,
                               self.routable, self.adapters.per_worker)
        self.elastic = None  # an Elastic (dynlab.engine.elastic) when workers join and leave during the run
        # router replicas that each know only their own load: their books follow each request
        self.replicas = strategy if isinstance(strategy, RouterReplicas) and not strategy.shared_load else None
        if self.replicas is not None:  # adapters in flight: a metric every replica scrapes alike (FleetView)
            for book in self.replicas.books:
                book.view.lora_adapters = self.fleet.lora_adapters
        self.generation = [0] * n
        for engine in engines:
            engine.cross_boundaries = True  # this driver calls cross_boundary at next_boundary (_on_boundary)
        self.evicted_blocks = 0
        # Bulk runs' block boundaries. Without event delay and loss they are crossed lazily, each worker's
        # in one go, before what could tell (an arrival's routing, the worker's step end): nothing reads
        # a worker's pool or the router's index in between, and events of different workers commute (the
        # index keeps each worker's blocks apart). The boundaries a worker crosses in one go reach the
        # router as one merged BlockRemoved (counted one per boundary that evicted), so the routes and
        # every count are those of a loop event per boundary. With a delay or loss (draws follow the
        # publishing order) each boundary is a loop event and an event of its own.
        self._lazy = (not self.bus.delay_ms and not self.bus.loss) if lazy is None else lazy
        self._bounds: list = []  # pending (time ms, worker, generation), earliest first (a heap)
        # request id -> (worker, blocks, prefill tokens still expected, waiting for a first token, replica)
        self._estimate: dict = {}
        self._arrivals: Optional[Iterator] = None
        if self.gate is not None:  # the gateway (dynlab.engine.holding) routes through enter, sheds through shed
            self.gate.attach(self.fleet, self.enter, self.shed, engines[0] if n else None)

    # -- the run ---------------------------------------------------------------------------
    def run(self, arrivals: Optional[Iterator[tuple[Request, float]]] = None) -> None:
        """Replay every ``(request, arrival ms)`` (default: the environment's arrivals) until the last
        request finishes."""
        self._arrivals = arrivals if arrivals is not None else self.env.arrivals
        self._next_arrival()
        self.loop.run()
        while self.gate is not None and self.gate.drain():  # requests held when nothing was left to run: shed
            self.loop.run()

    @property
    def all_engines(self) -> Sequence[EngineWorker]:
        """Every engine of the fleet, in the order a result lists them."""
        return self.engines

    @property
    def serving(self):
        """The environment's serving recorder."""
        return self.env.serving

    def wake(self, w: int) -> None:
        """Start worker ``w``'s next step at the current time (it does nothing when the worker is busy or idle)."""
        self.loop.at(self.loop.now, STEP_START, self._on_start, w)

    def grow(self, engine: EngineWorker) -> int:
        """Give ``engine`` the next worker id (``len(engines)``; ids are never reused) and a place in every
        per-worker list; it is not routable until :mod:`dynlab.engine.elastic` makes it so. Returns its id."""
        w = len(self.engines)
        self.engines.append(engine)
        engine.cross_boundaries = True
        for books in (self.active, self.active_blocks, self.queued, self.waiting, self.cached, self.generation,
                      self.routing.counts):
            books.append(0)
        self.adapters.add_worker()
        self.fleet.workers = w + 1
        return w

    def _next_arrival(self) -> None:
        nxt = next(self._arrivals, None)
        if nxt is not None:
            self.loop.at(nxt[1], ARRIVAL, self._on_arrival, nxt[0])

    # -- arrivals --------------------------------------------------------------------------
    def _on_arrival(self, req: Request) -> None:
        self.arrive(req)
        self._next_arrival()

    def arrive(self, req: Request) -> None:
        """The workload's request ``req`` arrives now: through the gateway if any, else routed at once."""
        if self.gate is not None:
            return self.gate.arrive(req, self.loop.now)
        self.enter(req, self.loop.now)

    def enter(self, req: Request, arrival: float, requeued: bool = False) -> EngineRequest:
        """Route and submit ``req`` now; its :class:`EngineRequest`. ``arrival`` (ms): when it reached the
        gateway (the loop's time unless the gateway held it, or its first arrival for a request ``requeued``
        from a killed worker, :mod:`dynlab.engine.elastic`), its engine request's ``arrival_ms``. A requeued
        request skips ``on_arrival`` and the progress bar: they saw it already."""
        t = self.loop.now
        if self.elastic is not None and not requeued:
            self.elastic.origin[req.index] = req
        bounds = self._bounds
        if bounds and bounds[0][0] < t:
            self._cross_before(t)
        if self.runs_of is not None:
            names, runs = self.runs_of(req)
        else:
            names, runs = self.names_of(req), None
        routed = reroute(req, tuple(names), t, runs)  # every other field (attrs among them) the workload's
        w = self._route(routed)
        engine = self.engines[w]
        reply = req.output_hashes if runs is None else None  # a token trace's reply names (output_tokens)
        ereq = EngineRequest(req.index, arrival, max(req.input_length, 1), max(req.output_length, 1),
                             names + list(reply) if reply else names, runs)
        if reply:
            ereq.out_blocks = len(reply)
        ereq.attrs = req.attrs
        cap = (ereq.input_length - 1) // self.block
        actual = engine.overlap_of(ereq, cap)
        predicted = self.strategy.predicted
        self.routing.on_route(routed.hashes, w, predicted, actual, cap, runs=runs)
        if reply:
            self.routing.saw_reply(reply)
        for hook in self._h_route:
            hook(routed, w, predicted, actual, cap)
        for hook in self._h_arrival if not requeued else ():
            hook(ereq, arrival)
        self._track(ereq, w, predicted)
        before = engine.step_end
        if not (self.admits is None or self.admits(ereq)) or not engine.submit(ereq, t):
            ereq.rejected = True
            for hook in self._h_reject:
                hook(ereq)
            self._untrack(ereq)
        else:
            if before is None:
                self.loop.at(t, STEP_START, self._on_start, w)
            elif (end := engine.step_end) != before:
                self._schedule_end(w, end)
        if self.progress is not None and not requeued:
            self.progress.update(1)
        return ereq

    def shed(self, req: Request, t: float) -> None:
        """The gateway shed ``req``, arrived at ``t``: never routed; its recorders learn it (``on_arrival``, ``on_shed``)."""
        ereq = EngineRequest(req.index, t, max(req.input_length, 1), max(req.output_length, 1), ())
        ereq.attrs = req.attrs
        for hook in self._h_arrival:
            hook(ereq, t)
        for hook in self._h_shed:
            hook(ereq)
        if self.progress is not None:
            self.progress.update(1)

    def _route(self, req: Request) -> int:
        strategy = self.strategy
        strategy.predicted = None
        w = strategy.route(req, self.fleet)
        n = len(self.engines)
        if type(w) is not int or not 0 <= w < n:
            raise DynlabError(f"strategy {strategy.name!r} returned {w!r}, not a worker in 0..{n - 1}")
        if self.elastic is not None:
            return self.elastic.routable_or_else(w)
        return w

    # -- the router's load view -------------------------------------------------------------
    def _track(self, ereq: EngineRequest, w: int, predicted: Optional[int]) -> None:
        blocks = -(-(ereq.input_length + ereq.output_length) // self.block)
        prefill = max(ereq.input_length - self.block * (predicted or 0), 0)
        r = None
        if self.replicas is not None:
            r = self.replicas.last
            self.replicas.books[r].add(w, blocks, prefill)
        self._estimate[ereq.id] = (w, blocks, prefill, True, r)
        self.adapters.add(ereq.attrs, w)
        self.active[w] += 1
        self.active_blocks[w] += blocks
        self.queued[w] += prefill
        self.waiting[w] += 1

    def _first_token(self, ereq: EngineRequest) -> None:
        w, blocks, prefill, _, r = self._estimate[ereq.id]
        self.queued[w] -= prefill
        self.waiting[w] -= 1
        if r is not None:
            self.replicas.books[r].first_token(w, prefill)
        self._estimate[ereq.id] = (w, blocks, 0, False, r)

    def _untrack(self, ereq: EngineRequest) -> None:
        w, blocks, prefill, waiting, r = self._estimate.pop(ereq.id)
        self.adapters.remove(ereq.attrs, w)
        self.active[w] -= 1
        self.active_blocks[w] -= blocks
        self.queued[w] -= prefill
        if waiting:
            self.waiting[w] -= 1
        if r is not None:
            self.replicas.books[r].remove(w, blocks, prefill, waiting)

    # -- steps -----------------------------------------------------------------------------
    def _on_start(self, w: int) -> None:
        engine = self.engines[w]
        if engine.step_end is not None or engine.idle:
            return
        now = self.loop.now
        end = engine.start_step(now)  # its step_end (None: nothing started)
        if engine.removed or engine.cpu_removed or engine.cpu_stored:  # (KV cache groups: a CPU change alone)
            self._publish_removed(w, engine)
        if end is None and (t := engine.next_ready) is not None:  # nothing to run until a load in transit arrives
            if not t <= HORIZON_MS:
                raise past_horizon(t, f"worker {w}'s load from its CPU tier", "use a larger --pcie-gbps")
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
                raise step_past_horizon(engine, f"worker {w}", self.loop.now, end)
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
        res = engine.finish_step()
        if self.on_step_ended is not None:
            self.on_step_ended(w, res)
        if res.stored:  # with write-through (--cpu-write compute) the CPU tier's change follows at the step's end
            self._publish(w, BlockStored(w, tuple(res.stored), block_size=self.block, runs=res.stored_runs),
                          res.cpu_removed,
                          res.cpu_stored)
        for hook in self._h_step:
            hook(w, res)
        for ereq, t in res.first_tokens:
            self._first_token(ereq)
            for hook in self._h_first:
                hook(ereq, t)
        for ereq, t in res.finished:
            self._untrack(ereq)
            for hook in self._h_finish:
                hook(ereq, t)
        if res.handed_off:
            now = self.loop.now
            for ereq, _ in res.handed_off:
                self._untrack(ereq)  # the router's view: the request left this worker
                if self.on_handed_off is not None:
                    self.on_handed_off(w, ereq, now)
        if not engine.idle:
            self.loop.at(self.loop.now, STEP_START, self._on_start, w)
        elif self.elastic is not None:
            self.elastic.idle(w)  # a draining worker leaves when it has finished what it holds


def replay_timed(requests: Iterable[Request], strategy: Strategy, engines: Sequence[EngineWorker], *,
                 names_of: Callable[[Request], list], env=None, runs_of: Optional[Callable] = None,
                 kv_bytes_per_block: Optional[float] = None) -> dict:
    """Serve ``requests`` on ``engines`` in time; return the routing and serving metrics (without ``mode``)
    of :func:`~dynlab.engine.metrics.fleet_result`.

    ``env``: a :class:`~dynlab.engine.env.RunEnv` (default :meth:`RunEnv.timed <dynlab.engine.env.RunEnv.timed>`
    of ``requests``, the default sections). ``kv_bytes_per_block``: given (the engines have a CPU tier
    setting, even 0 blocks), the result also has the tier keys of :class:`~dynlab.engine.tier_metrics.TierRecorder`.
    ``runs_of``: see :class:`TimedFleet` (the same result, less work). See the module docstring for the
    model. Raises ``ValueError`` when timestamps go backwards.
    """
    if env is None:
        env = RunEnv.timed(requests, strategy, len(engines), arrival_rng=random.Random(0))
    if kv_bytes_per_block is not None:
        env.recorders.append(TierRecorder(kv_bytes_per_block))
    fleet = TimedFleet(strategy, engines, env, names_of, runs_of)
    fleet.run()
    return fleet_result(env.routing, env.counts(fleet.evicted_blocks), strategy, env.recorders, engines)
