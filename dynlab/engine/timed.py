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

from typing import Callable, Iterator, Optional, Sequence

from dynlab.engine.env import RunEnv, arrival_times, check_arrivals  # noqa: F401 (re-exported)
from dynlab.engine.lora import AdaptersInFlight
from dynlab.engine.loop import ARRIVAL
from dynlab.engine.metrics import hooks
from dynlab.engine.steps import StepDriver
from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.errors import DynlabError
from dynlab.kv.blocks import FullAttentionGroup
from dynlab.routing.events import BlockStored
from dynlab.routing.replicas import RouterReplicas
from dynlab.routing.strategy import FleetView, Request, Strategy, reroute


def _gpu_name(engine) -> Optional[str]:
    """The name of ``engine``'s GPU (its latency model's hardware; ``None`` for a model without one)."""
    gpu = getattr(getattr(engine.latency, "hardware", None), "gpu", None)
    return getattr(gpu, "name", None)


class TimedFleet(StepDriver):
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
    that touches a worker's pool between arrivals passes ``False``. Its steps are those of every pool
    (:class:`~dynlab.engine.steps.StepDriver`).
    """

    def __init__(self, strategy: Strategy, engines: Sequence[EngineWorker], env, names_of: Callable[[Request], list],
                 runs_of: Optional[Callable] = None, *, lazy: Optional[bool] = None,
                 on_step_started: Optional[Callable] = None, on_step_ended: Optional[Callable] = None,
                 on_handed_off: Optional[Callable] = None, admits: Optional[Callable] = None):
        n = len(engines)
        StepDriver.__init__(self, engines, env.loop, env.bus, self._step_ended, lazy=lazy,
                            on_step_started=on_step_started)
        self.env = env
        self.runs_of = runs_of
        self.strategy = strategy
        self.names_of, self.routing, self.progress = names_of, env.routing, env.progress
        recorders = env.recorders
        self._h_route, self._h_arrival = hooks(recorders, "on_route"), hooks(recorders, "on_arrival")
        self._h_reject, self._h_first = hooks(recorders, "on_reject"), hooks(recorders, "on_first_token")
        self._h_finish, self._h_step = hooks(recorders, "on_finish"), hooks(recorders, "on_step")
        self._h_shed, self.gate = hooks(recorders, "on_shed"), env.gate
        self.on_step_ended, self.on_handed_off = on_step_ended, on_handed_off
        self.admits = admits
        self.origins: Optional[dict] = None  # request id -> the workload's Request, kept when a kill may requeue it
        #: the recorders' id of each worker in ``on_step`` when it is not its position (a P/D fleet whose pools grow,
        #: :class:`dynlab.disagg.fleet.DisaggFleet`); ``None``: its position
        self.step_ids: Optional[list] = None
        routing = env.routing
        self.block = engines[0].block if n else 1
        group = FullAttentionGroup(self.block)  # the block arithmetic: the engines' (dynlab.kv.blocks)
        self._hit_cap, self._blocks_needed = group.hit_cap, group.blocks_needed
        self.active, self.active_blocks, self.queued = [0] * n, [0] * n, [0] * n
        self.waiting, self.cached, self.routable = [0] * n, [0] * n, list(range(n))
        # the view's request counts are the recorder's (requests routed to each worker so far)
        self.adapters = AdaptersInFlight(n)  # per worker: LoRA adapter -> its requests in flight
        self.fleet = FleetView(routing.counts, self.active, self.active_blocks, self.queued, self.cached, self.waiting,
                               self.routable, self.adapters.per_worker)
        # what the deployment configures per worker (FleetView.pool, gpu, kv_blocks); --pool sets the pools
        self.pools = [0] * n
        self.gpus, self.kv_blocks = [_gpu_name(e) for e in engines], [getattr(e, "capacity", None) for e in engines]
        self.fleet.set_hardware(self.pools, self.gpus, self.kv_blocks)
        # router replicas that each know only their own load: their books follow each request
        self.replicas = strategy if isinstance(strategy, RouterReplicas) and not strategy.shared_load else None
        for engine in engines:
            engine.cross_boundaries = True  # this driver calls cross_boundary at next_boundary (_on_boundary)
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
        self.pools.append(0)
        self.gpus.append(_gpu_name(engine))
        self.kv_blocks.append(getattr(engine, "capacity", None))
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
        if self.origins is not None and not requeued:
            self.origins[req.index] = req
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
        cap = self._hit_cap(ereq.input_length)
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
            self.resume(w, before)
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
        blocks = self._blocks_needed(ereq.input_length + ereq.output_length)
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

    # -- steps (dynlab.engine.steps; this is the driver's ``ended``) ---------------------------------
    def _step_ended(self, w: int, res) -> None:
        """After worker ``w``'s step (:meth:`StepDriver._on_end`): the hooks, the KV events its step stored,
        the recorders, and the router's view of its first tokens, finishes and hand-offs."""
        if self.on_step_ended is not None:
            self.on_step_ended(w, res)
        if res.stored:  # with write-through (--cpu-write compute) the CPU tier's change follows at the step's end
            self._publish(w, BlockStored(w, tuple(res.stored), block_size=self.block, runs=res.stored_runs),
                          res.cpu_removed,
                          res.cpu_stored)
        sid = w if self.step_ids is None else self.step_ids[w]
        for hook in self._h_step:
            hook(sid, res)
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

