"""One serving engine (a worker) as vLLM v1's scheduler runs it: steps, chunked prefill, a block pool, preemption.

The engine is split along vLLM v1's seams: :mod:`dynlab.engine.request` (a request and its state),
:mod:`dynlab.engine.scheduler` (the step's ``(request, tokens)`` pairs: budget, slots, admission,
preemption, chunking), :mod:`dynlab.kv.cache_manager` (its blocks: cached prefix, slots, free, the
CPU tier, the P/D handoff), :mod:`dynlab.engine.bulk` (the step plan, bulk decode runs and their
block boundaries); :class:`EngineWorker` is the step driver wiring them.

This module has no clock and no event loop: an event loop drives each :class:`EngineWorker`
through four calls, all times in **ms** (floats)::

    w = EngineWorker(worker_id, capacity_blocks, block_tokens, latency_model)
    ok = w.submit(req, now)          # a request arrives (False: rejected, it can never fit)
    end = w.start_step(now)          # schedule the next step (or a run of decode steps) at now
    removed = w.removed              # names evicted at `now` (publish as BlockRemoved at now)
    ...                              # at `end` (or a new end after submit/interrupt):
    res = w.finish_step()            # apply it: res.stored (BlockStored at res.end),
                                     # res.first_tokens, res.finished: [(req, time ms)]

Driving rules (what makes the model vLLM's, and bulk runs equal to step-by-step ones):

- At a time ``t``, first :meth:`finish_step` the step ending at ``t``, then :meth:`submit` every
  request arriving at ``t`` (in arrival order), then, if :attr:`step_end` is ``None`` and not
  :attr:`idle`, :meth:`start_step` at ``t``: a request added at exactly a step's start joins it.
- :meth:`submit` during a step may move :attr:`step_end` EARLIER (a bulk decode run is cut at its
  first step boundary >= now, see :meth:`interrupt`): re-read :attr:`step_end` after every
  submit and reschedule the worker's step-end event. It may become equal to ``now``.
- Call :meth:`start_step` right after :meth:`finish_step` unless :attr:`idle` (the engine
  never waits with work to do). :meth:`start_step` returns ``None`` only when idle.
- A driver that sets :attr:`cross_boundaries` also calls :meth:`cross_boundary` at each
  :attr:`next_boundary` of a bulk run, in a step start's place (after the step ends and the
  arrivals at that time), re-reading :attr:`next_boundary` after each call and after every
  change of :attr:`step_end` (see **Bulk decode** below); or, when nothing reads the pool in
  between, :meth:`cross_before` of the next time something does, for all of them in one call.

The model (vLLM v1 ``Scheduler.schedule`` with prefix caching, recompute preemption):

- A request has ``num_tokens`` (prompt + tokens generated so far) and ``computed`` tokens (in
  the KV cache). A step schedules ``min(num_tokens - computed, budget)`` of its tokens and needs
  ``ceil((computed + scheduled) / block)`` blocks in all. When a step brings ``computed`` to
  ``num_tokens`` the request emits one token at the step's end (``num_tokens += 1``); the step
  computing the last prompt token emits the first one (TTFT = its end - arrival). The
  ``output_length``-th token finishes the request at that step's end; its blocks are freed.
- Each step: first the running requests in running order while token budget
  (``max_num_batched_tokens``) remains; a request that cannot get its blocks preempts the LAST
  running request, repeatedly (if it preempts itself, no further running request is scheduled).
  Then, only if nothing was preempted, waiting requests in FCFS order while budget and sequence
  slots (``max_num_seqs``) remain, each admitted if the blocks for the chunk it schedules now
  can be taken, stopping at the first that cannot.
- Admission looks up the prefix cache: the leading full prompt blocks cached, at most
  ``min(len(names), (num_tokens - 1) // block)`` blocks (vLLM recomputes the last token; for a
  fresh request that is ``(input_length - 1) // block``). Full prompt blocks are registered
  (named) when the chunk completing them is scheduled, so a request admitted later in the same
  step can hit them.
- A preempted request frees its blocks, goes to the FRONT of the waiting queue, and on
  re-admission looks up the cache again and recomputes from the hit (prompt and generated
  tokens; its recomputation chunks count as prefill). The step finishing it emits its next token.
- A request whose ``input_length + output_length - 1`` tokens exceed ``capacity * block`` is
  rejected by :meth:`submit`.
- Step duration: ``latency.step_ms(StepBatch(prefill chunks, their prior contexts, decode
  requests, summed decode contexts))``. A request is a decode in a step when it computes 1
  token, that token is its last uncomputed one and ``computed >= input_length``; its context
  is ``num_tokens`` (prompt + generated so far).
- **Bulk decode** (``bulk=True``): when a step is decode-only (every running request decodes, no
  admission, no preemption), the worker advances ``k`` such steps at once, ``k`` = steps until the
  earliest finish or the first step needing a new block; duration ``latency.decode_ms(R, ctx, k)``.
  A driver that sets :attr:`~EngineWorker.cross_boundaries` lets a run go on across block
  boundaries when nothing waits (no waiting, loading, loaded or received request) and the free
  queue can give every block the boundaries take (else the run ends before the first boundary
  it cannot serve; the step there may preempt). The driver calls :meth:`cross_boundary` at
  :attr:`next_boundary` (a step start: after the step ends and arrivals at that time) and
  publishes what it evicts (and writes to the CPU tier) as it would a new step's start: exactly
  what that step would have done, as nothing else changes in a step that only decodes.
  :meth:`submit`, :meth:`interrupt` and :meth:`finish_step` cross the boundaries before their time
  first (a driver that skipped them gets the pool right, with the evictions only in
  :attr:`StepResult.removed`).
  :meth:`submit` / :meth:`interrupt` cut a run at the first step boundary >= the time given.
  ``bulk=False`` runs one step at a time; results are the same up to float rounding (a run's
  boundaries are ``start + decode_ms(j)``, a step-by-step run's are running sums, so an arrival
  within rounding error of a boundary can fall on different sides of it).

CPU tier (``cpu_capacity > 0``; vLLM's CPU KV offloading, LMCache): the write, lookup and load rules are
those of :mod:`dynlab.kv.cache_manager` (its docstring).

Disaggregated serving (:mod:`dynlab.disagg.fleet`) drives two kinds of worker with three more calls:

- A **prefill worker** (``handoff=True``) hands a request off at its first token instead of
  decoding it (unless that token is its last: it finishes as usual): the request leaves the
  running list, appears in :attr:`StepResult.handed_off`, and its blocks stay **held** (in use)
  until :meth:`release` at the transfer's end frees them (still cached, like a finish).
- A **decode worker** takes a request whose prompt was computed elsewhere: :meth:`reserve`
  allocates the blocks for its KV plus its next token before the transfer starts (``None``,
  nothing taken, when they are not free), then :meth:`receive` at the transfer's end queues it
  with its KV present (``computed == input_length``, one token generated) in :attr:`received`;
  the scheduler admits such requests with the blocks they hold, before the waiting queue (so
  blocks held by queued requests never wait behind requests that need new ones), and they only
  decode (a preempted one joins the waiting queue and recomputes, as usual). A step whose
  running requests were all preempted admits (vLLM skips admission after a preemption; here
  nothing would run otherwise).
- While blocks are held or reserved, :meth:`start_step` may find nothing schedulable: it then
  returns ``None`` without being idle, and the driver starts it again after the next
  :meth:`release` or :meth:`receive`.

Metrics: :attr:`preemptions`, :attr:`rejected`, :attr:`steps`, :attr:`used_blocks`, :attr:`capacity`,
:attr:`peak_used_blocks`, :meth:`used_block_ms` (blocks held by requests x ms; cached free blocks never
count), :attr:`busy_ms` and :attr:`busy_block_ms` (time in steps and blocks x ms held in them); per
:class:`EngineRequest`: ``hit_tokens`` (first lookup), first scheduled/token and finish times.
LoRA adapters (``lora``, a :class:`~dynlab.engine.lora.LoraSpec`): a step's loads delay it (:mod:`dynlab.engine.lora`).
"""
from __future__ import annotations

from typing import Optional, Sequence

from dynlab.engine.bulk import StepPlan, StepResult, add_busy, cut_run, plan_step
from dynlab.engine.lora import LoraSlots
from dynlab.engine.request import DECODE_TOKENS, EngineRequest, peak_tokens
from dynlab.engine.scheduler import Scheduler
from dynlab.kv.cache_manager import CPU_WRITES
from dynlab.kv.hybrid import kv_cache_manager
from dynlab.latency.base import LatencyModel

__all__ = ["EngineRequest", "EngineWorker", "StepResult", "CPU_WRITES"]

_Step = StepPlan  # the step in progress (disagg.fleet reads EngineWorker._step.sched)


class EngineWorker:
    """One serving engine, the step driver wiring a :class:`~dynlab.engine.scheduler.Scheduler`, a
    :class:`~dynlab.kv.cache_manager.KvCacheManager` (its block pool, CPU tier and P/D handoff) and
    the step planner (:mod:`dynlab.engine.bulk`) to a latency model.

    ``capacity``: KV blocks in the pool; ``block``: tokens per block; ``latency``: the step-time model;
    ``max_num_batched_tokens``: token budget per step; ``max_num_seqs``: running requests at most; ``bulk``:
    advance runs of decode-only steps at once (same results as ``False``); ``handoff``: a prefill worker of
    a disaggregated fleet (see the module docstring); ``runs``: the pool works on the requests' runs (:class:`~dynlab.kv.run_pool.RunBlockPool`, the same behaviour: for
    names with runs longer than one, as :func:`~dynlab.engine.names.engine_block_runs` gives them).
    ``cpu_capacity`` / ``load_ms_per_block`` / ``cpu_write``: the CPU tier (see the module docstring);
    ``kv_layout``: KV cache groups (:mod:`dynlab.kv.hybrid`; a bulk run stops at each block boundary and
    window drop, never crossing one); ``spec``: speculative decoding (:mod:`dynlab.engine.spec`; ``None``:
    off; a request is rejected when ``input_length + output_length - 1 + K + lookahead`` tokens cannot
    fit), which runs one step at a time (no bulk run). ``admission``: ``full`` or ``chunk``
    (:meth:`dynlab.kv.cache_manager.KvCacheManager.admission_tokens`). ``queue_policy``: a :mod:`~dynlab.engine.queues` policy.
    Raises ``ValueError`` for a block, budget or slot count < 1, a negative load time, an unknown ``cpu_write``.

    Queues (``waiting``, ``running``, ``loading``, ``ready``, ``received``): the scheduler's; ``pool``, ``cpu``,
    ``held``, ``reserved``, the tier counters: the KV cache manager's (read-only).
    """

    def __init__(self, worker_id: int, capacity: int, block: int, latency: LatencyModel, *,
                 max_num_batched_tokens: int = 8192, max_num_seqs: int = 256, bulk: bool = True,
                 cpu_capacity: int = 0, load_ms_per_block: float = 0.0, cpu_write: str = "evict",
                 handoff: bool = False, runs: bool = False, kv_layout=None, spec=None, admission: str = "full", queue_policy=None,
                 lora=None):
        if block < 1:
            raise ValueError(f"block must be >= 1 token, got {block}")
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        self.worker_id, self.block, self.latency, self.max_num_batched_tokens = worker_id, block, latency, max_num_batched_tokens
        self.max_num_seqs, self.bulk, self.handoff, self.runs = max_num_seqs, bulk, handoff, runs
        self.kv = kv_cache_manager(capacity, block, kv_layout, max_num_batched_tokens, runs=runs, cpu_capacity=cpu_capacity,
                                   load_ms_per_block=load_ms_per_block, cpu_write=cpu_write, admission=admission)
        self._kv_groups = kv_layout is not None  # (dynlab.kv.hybrid) a bulk run never crosses a boundary
        self.spec = spec  # speculative decoding (dynlab.engine.spec.SpecDecoding) or None
        self.scheduler = Scheduler(self.kv, max_num_batched_tokens, max_num_seqs, spec, queue_policy)
        self.lora = None if lora is None else LoraSlots(lora)  # adapter slots (dynlab.engine.lora), None: not modelled
        self.scheduler.max_loras = 0 if lora is None else lora.max_loras
        self.pool, self.cpu, self.write_through = self.kv.pool, self.kv.cpu, self.kv.write_through
        self.load_ms_per_block, self.held, self.reserved = load_ms_per_block, self.kv.held, self.kv.reserved
        self.rejected = self.steps = 0
        self.busy_ms = self.busy_block_ms = 0.0  # ms in steps, blocks held x ms in them (mean_kv_usage_busy)
        self._busy_from = 0.0  # used_block_ms at the start of the step in progress
        # removed_runs: removed as (group, mask) pairs (the runs of its BlockRemoved) when the pool works on runs, else
        # None; cpu_stored / cpu_removed: names the CPU tier gained / dropped at the last start_step (medium CPU events)
        self.removed, self.removed_runs, self.cpu_stored, self.cpu_removed = (), None, (), ()
        # set by a driver that calls cross_boundary at next_boundary (TimedFleet): bulk runs may then
        # go on across block boundaries (see the module docstring)
        self.cross_boundaries = False
        #: start (ms) of the next step of the bulk decode run in progress at which running requests cross a block
        #: boundary and take a block each (``None``: none left); call :meth:`cross_boundary` then, after the step
        #: ends and arrivals at that time. Read-only for callers (a plain attribute, read at every boundary:
        #: start_step, cross_boundary, interrupt and finish_step keep it the last of the run's ``bound_at``)
        self.next_boundary: Optional[float] = None
        self._step: Optional[StepPlan] = None

    # -- reading --------------------------------------------------------------------------
    waiting = property(lambda self: self.scheduler.waiting, doc="Requests waiting for admission.")
    running = property(lambda self: self.scheduler.running, doc="Running requests, in running order.")
    loading = property(lambda self: self.scheduler.loading, doc="Admitted requests whose CPU hits are in transit.")
    ready = property(lambda self: self.scheduler.ready, doc="Requests whose CPU hits arrived, not yet scheduled.")
    received = property(lambda self: self.scheduler.received, doc="Requests whose KV arrived by a transfer.")
    preemptions = property(lambda self: self.scheduler.preemptions, doc="Preemptions so far.")
    peak_used_blocks = property(lambda self: self.kv.peak_used_blocks, doc="Most blocks used at once.")
    loaded_blocks = property(lambda self: self.kv.loaded_blocks, doc="Blocks loaded CPU -> GPU (re-admissions too).")
    offloaded_blocks = property(lambda self: self.kv.offloaded_blocks, doc="Blocks written GPU -> CPU.")
    gpu_hit_blocks = property(lambda self: self.kv.gpu_hit_blocks, doc="First admissions' GPU hits (blocks).")
    cpu_hit_blocks = property(lambda self: self.kv.cpu_hit_blocks, doc="First admissions' CPU hits (blocks).")
    capacity = property(lambda self: self.pool.capacity, doc="Blocks in the pool.")
    used_blocks = property(lambda self: self.pool.used_blocks, doc="Blocks held by requests now (never cached free blocks).")

    @property
    def idle(self) -> bool:
        """No step in progress and nothing to schedule (no running, waiting, loading or received request)."""
        sch = self.scheduler
        return (self._step is None and not sch.running and not sch.waiting and not sch.loading
                and not sch.ready and not sch.received)

    @property
    def next_ready(self) -> Optional[float]:
        """When (ms) the earliest CPU-tier load in transit arrives, ``None`` when none is."""
        loading = self.scheduler.loading
        return loading[0].ready_ms if loading else None

    @property
    def step_end(self) -> Optional[float]:
        """End (ms) of the step or bulk run in progress, ``None`` between steps."""
        return None if self._step is None else self._step.end

    def overlap(self, names: Sequence[int], cap: Optional[int] = None) -> int:
        """Leading ``names`` cached now (at most ``cap``): what a request would hit if admitted at once.

        The question every worker answers alike (the count-based :class:`~dynlab.engine.counted.Worker`
        too); a reading only, for the metrics, never for a strategy.
        """
        return self.kv.overlap(names, cap)

    def overlap_of(self, req: EngineRequest, cap: Optional[int] = None) -> int:
        """:meth:`overlap` of ``req``'s names (and runs), for a request about to be submitted here (its
        names as the pool takes them, :attr:`EngineRequest.seq`, are kept for :meth:`submit`)."""
        return self.kv.overlap_of(req, cap)

    def used_block_ms(self, now: Optional[float] = None) -> float:
        """Integral of :attr:`used_blocks` over time (blocks x ms) up to ``now`` (default: the last change)."""
        return self.kv.used_block_ms(now)

    # -- block boundaries of a bulk run -----------------------------------------------------
    def cross_boundary(self) -> tuple:
        """Take the blocks of the next block boundary of the bulk run in progress (at
        :attr:`next_boundary`); returns the names evicted (also in :attr:`removed`; publish them as
        ``BlockRemoved`` at that time, with :attr:`cpu_stored` / :attr:`cpu_removed` as a step's start).
        Raises ``RuntimeError`` when no boundary is pending."""
        st = self._step
        if st is None or not st.bound_at:
            raise RuntimeError("no block boundary pending")
        self._cross_next(st, 1)
        if self.removed and self.cpu is not None:
            self._offload(self.kv.evicted())
        return self.removed

    def cross_before(self, t: float) -> int:
        """Cross, in order, every pending block boundary of the bulk run in progress that starts before
        ``t`` (ms): what :meth:`cross_boundary` does at each, in one call and one walk of the free
        queue. :attr:`removed` (and :attr:`removed_runs`) then hold the names all of them evicted, in
        order; returns how many of the boundaries evicted (each a ``BlockRemoved`` of its own when
        crossed one at a time). Raises ``RuntimeError`` with a CPU tier (each boundary's writes to it
        are events of their own: use :meth:`cross_boundary`)."""
        if self.cpu is not None:
            raise RuntimeError("cross_before: a CPU tier's writes are published per boundary (cross_boundary)")
        st = self._step
        bound_at = st.bound_at if st is not None else ()
        n = len(bound_at)
        while n and bound_at[n - 1] < t:  # last first: the earliest at the end
            n -= 1
        if n == len(bound_at):
            self.removed, self.removed_runs = (), None
            return 0
        return self._cross_next(st, len(bound_at) - n)

    def _cross_next(self, st: StepPlan, n: int) -> int:
        """Cross the next ``n`` (>= 1) block boundaries of the run ``st``, in order
        (:meth:`KvCacheManager.take_boundaries`); :attr:`removed` / :attr:`removed_runs` hold what they
        evicted. Returns how many of them evicted."""
        evicting, st.used = self.kv.take_boundaries(st.bound_at, st.bound_reqs, n)
        bound_at = st.bound_at
        self.next_boundary = bound_at[-1] if bound_at else None
        self.cpu_stored = self.cpu_removed = ()
        self.removed, self.removed_runs = self.kv.removed()
        if self.removed:
            st.removed += self.removed
        return evicting

    def _catch_up(self, st: StepPlan, t: float) -> None:
        """Cross the pending block boundaries of the run ``st`` that start before ``t`` (ms)."""
        while st.bound_at and st.bound_at[-1] < t:
            self.cross_boundary()

    # -- driving --------------------------------------------------------------------------
    def submit(self, req: EngineRequest, now: float) -> bool:
        """Queue ``req`` at ``now`` (ms); ``False`` (and counted in :attr:`rejected`) when its
        ``input_length + output_length - 1`` tokens can never fit the pool.

        A bulk decode run in progress is cut at its first step boundary >= ``now``: re-read :attr:`step_end`.
        Raises ``ValueError`` when ``len(req.names) - out_blocks`` is not ``(input_length - lookahead) // block``
        (``lookahead``: the tokens after a block its name covers, ``spec.hash_lookahead``, 1 with EAGLE's hash
        lookahead, :func:`dynlab.engine.spec.hash_lookahead_tokens`; else 0)."""
        la = self.spec.hash_lookahead if self.spec is not None else 0  # names covering the token after them
        if (n := req.n_names - req.out_blocks) != (want := (req.input_length - la) // self.block):
            raise ValueError(f"request {req.id!r}: {n} block names for {req.input_length} tokens at block {self.block} "
                             f"(want {want})")
        if not self.kv.fits(peak_tokens(req, self.spec)):  # its whole KV, a last verify's drafts included
            req.rejected = True
            self.rejected += 1
            return False
        self.kv.sequence(req)
        self.scheduler.waiting.append(req)
        self.scheduler.arrived.append(req)
        if self._step is not None and self._step.k > 1:
            self.interrupt(now)
        return True

    def interrupt(self, t: float) -> float:
        """Cut a bulk decode run at its first step boundary >= ``t`` (the step in progress at ``t``
        finishes); returns the step end (ms), unchanged for a single step."""
        st = self._step
        if st is None:
            raise RuntimeError("no step in progress")
        if st.k == 1 or t >= st.end:
            return st.end
        if st.bound_at:
            self._catch_up(st, t)
        if cut_run(st, t, self.latency):
            self.next_boundary = None
        return st.end

    def start_step(self, now: float) -> Optional[float]:
        """Schedule the next step (or bulk decode run) starting at ``now`` (ms); returns its end
        (ms), or ``None`` when idle. Blocks evicted for it are in :attr:`removed` (at ``now``)."""
        if self._step is not None:
            raise RuntimeError("a step is already in progress")
        self.cpu_stored = self.cpu_removed = ()
        sch, kv = self.scheduler, self.kv
        if sch.loading:
            sch.promote_loaded(now)
        if not (sch.running or sch.waiting or sch.ready or sch.received):
            self.removed, self.removed_runs = (), None
            return None
        kv.begin_step(now)
        self._busy_from = kv.used_ms  # used_block_ms(now): begin_step advanced the integral to now
        sched, preempted, admitted = sch.schedule(now)
        if self.cpu is not None and (evicted := kv.evicted()):
            self._offload(evicted)
        if not sched:
            if sch.loading or sch.ready or kv.held or kv.reserved:
                # blocks are held by loads or for transfers: resume when a load arrives, or at release / receive
                self.removed, self.removed_runs = kv.removed()
                return None
            raise RuntimeError(f"worker {self.worker_id}: nothing schedulable although requests wait (bug)")
        # a bulk run may go on across block boundaries when the driver crosses them and nothing waits
        can_cross = self.cross_boundaries and not (self._kv_groups or sch.waiting or sch.loading or sch.ready or sch.received)
        if self.lora is not None and (load := self.lora.activate(sched)):  # the forward pass waits for adapter loads
            self.busy_ms += load
            now += load
        st = plan_step(sched, preempted, admitted, now, self.latency, kv, self.bulk, len(sch.running), can_cross,
                       self.spec)
        st.stored, st.stored_runs, st.removed, self.removed_runs, st.used = kv.step_events()
        self.removed = st.removed
        self._step = st
        self.next_boundary = st.bound_at[-1] if st.bound_at else None
        if st.k > 1 and sch.loading:
            self.interrupt(sch.loading[0].ready_ms)  # a load arriving mid-run joins the next step
        return st.end

    def hold_until(self, end: float) -> None:
        """End the single step in progress at ``end`` (ms, not before its own end): a rank waiting for its lockstep group."""
        self._step.end = end

    def _offload(self, removed: list) -> None:
        """Write the names the pool evicted to the CPU tier (:attr:`cpu_stored` / :attr:`cpu_removed`);
        nothing under write-through (``cpu_write="compute"``: the copy was written when computed)."""
        change = self.kv.offload(removed)
        if change is not None:
            self.cpu_stored, self.cpu_removed = change

    def finish_step(self) -> StepResult:
        """Apply the step (or bulk run) in progress at its end: computed tokens, emitted tokens,
        finishes (their blocks return to the free queue)."""
        st = self._step
        if st is None:
            raise RuntimeError("no step in progress")
        if st.bound_at:
            self._catch_up(st, st.end)
        self._step = self.next_boundary = None
        end, k = add_busy(self, st), st.k
        first_tokens, finished, handed = self.scheduler.update_from_step(st.sched, k, end, self.handoff)
        self.steps += k
        stored = st.stored + self.kv.finish_stored(st.sched if k > 1 else ()) if finished or k > 1 else st.stored
        res = StepResult(st.start, end, k, stored, st.removed, first_tokens, finished, st.preempted,
                         len(st.sched), st.prefill_tokens, st.decodes, st.used, handed, stored_runs=st.stored_runs)
        if self.write_through and stored and self.cpu is not None:
            change = self.kv.write_computed(res.stored)
            if change is not None:
                res.cpu_stored, res.cpu_removed = change
        return res

    # -- disaggregated serving --------------------------------------------------------------
    def release(self, req: EngineRequest, now: float) -> None:
        """Free the blocks of ``req``, handed off at its first token, at ``now`` (ms): its KV has been
        sent. Its full prompt blocks stay cached (free queue). Raises ``KeyError`` if not held here."""
        self.kv.release(req, now)

    def reserve(self, req: EngineRequest, now: float, prefix_cache: bool = False) -> Optional[int]:
        """Allocate, at ``now`` (ms), the blocks ``req`` needs to receive its prompt's KV and decode its
        next token (``ceil((input_length + 1) / block)``), before the transfer starts.

        With ``prefix_cache`` the leading full prompt blocks this worker caches are taken as hits
        (no need to transfer them). Returns the tokens hit (0 without ``prefix_cache``), or ``None``
        (nothing taken) when the free blocks do not suffice. Call :meth:`receive` when the KV arrived.
        With speculative decoding the ``lookahead`` slots its first step allocates are reserved too
        (vLLM allocates a remote prefill's blocks with ``num_lookahead_tokens``): without them a pool
        full of received requests could admit none of them.
        """
        h = self.kv.reserve(req, now, req.input_length + DECODE_TOKENS + self.scheduler.lookahead, prefix_cache)
        return None if h is None else h * self.block

    def receive(self, req: EngineRequest, now: float, prefix_cache: bool = False) -> None:
        """The KV of ``req`` (reserved here) arrived at ``now`` (ms): queue it to decode. With
        ``prefix_cache`` its full prompt blocks are named (cached for later requests).

        The request must have its first token (``computed == input_length``, ``generated == 1``).
        A bulk decode run in progress is cut as by :meth:`submit`: re-read :attr:`step_end`.
        Raises ``KeyError`` if ``req`` holds no reservation here, ``ValueError`` if its prompt is not
        computed or it still holds blocks elsewhere (release it on its prefill worker first).
        """
        if req.computed != req.input_length or req.generated < 1 or req.keys:
            raise ValueError(f"request {req.id!r}: its prompt is not computed here and released "
                             f"({req.computed}/{req.input_length})")
        self.kv.receive(req, prefix_cache)
        self.scheduler.received.append(req)
        if self._step is not None and self._step.k > 1:
            self.interrupt(now)

    def check(self) -> None:
        """Assert invariants (tests): used blocks == blocks held by running and loading requests
        (a loading request holds blocks in :attr:`loading`, then in :attr:`ready`), pool
        consistent, CPU tier within its capacity."""
        st, sch = self._step, self.scheduler
        assert self.next_boundary == (st.bound_at[-1] if st is not None and st.bound_at else None)
        for r in sch.running:
            assert len(r.keys) >= self.kv.blocks_needed(r.computed)
        assert all(not r.keys for r in sch.waiting)
        loading = list(sch.loading) + list(sch.ready)
        self.kv.check([r.keys for r in sch.running + loading] + [r.keys for r in sch.received])
        assert all(r.load_blocks > 0 for r in loading)

    # public hooks for the run layer
    @property
    def step_requests(self) -> list:
        """The requests scheduled in the step (or bulk decode run) in progress, in schedule order; ``[]``
        between steps. A P/D fleet reads it when a step starts (layer-pipelined transfers)."""
        st = self._step
        return [] if st is None else [req for req, _ in st.sched]
