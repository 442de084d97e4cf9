"""One serving engine (a worker) as vLLM v1's scheduler runs it: steps, chunked prefill, a block pool, preemption.

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

CPU tier (``cpu_capacity > 0``; vLLM's CPU KV offloading, LMCache; :mod:`dynlab.kv.cpu_tier`):

- Write rule ``cpu_write="evict"`` (the default; a victim tier): the names a step's allocation evicts
  from the pool (:attr:`removed`) are written to the CPU tier (LRU); its net change is
  :attr:`cpu_stored` / :attr:`cpu_removed` (publish as ``BlockStored`` / ``BlockRemoved`` with
  ``medium="CPU"`` at the step's start, after the GPU ``BlockRemoved``).
- Write rule ``cpu_write="compute"`` (write-through, as vLLM's ``OffloadingConnector`` and LMCache
  store KV on the way in): the full prompt blocks a step computes are written to the CPU tier at the
  step's end, unless it holds them already; a GPU eviction writes nothing (the copy is there, unless
  the tier dropped it). The net change is :attr:`StepResult.cpu_stored` / ``cpu_removed`` (publish at
  the step's end, after the GPU ``BlockStored``). The tiers are then inclusive and independent, the
  rule of the cache lab's :class:`~dynlab.kv.tiers.TwoTierCache`.
- Admission's lookup continues in the CPU tier where the GPU hits end (contiguous, within the same
  ``(num_tokens - 1) // block`` cap); the CPU hits are touched (most recent) and keep their host copy.
- **Load rule** (vLLM v1's asynchronous KV-connector loads: a request whose external blocks are in
  transit waits in ``WAITING_FOR_REMOTE_KVS`` and is skipped by the scheduler until they have
  arrived): a request with ``c`` CPU hits is admitted at ``now`` with its GPU hits taken and the blocks
  for its loads and first chunk allocated, but it is not scheduled: its load occupies the worker's
  host-to-device link from ``max(now, link free)`` for ``c * load_ms_per_block`` ms (loads queue on
  the link, FIFO), and it joins the first step that starts at or after the load's end (scheduled
  before the waiting queue, the loaded blocks named then). Other requests' steps go on meanwhile; a
  bulk decode run is cut at the load's end. Its TTFT thus includes the wait for the load plus its
  own prefill of the remaining tokens; ``first_scheduled_ms`` (queue wait) is the admission.
  Writes (GPU -> CPU) use the other direction of the link and take no step time.

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

Metrics: :attr:`preemptions`, :attr:`rejected`, :attr:`steps`, :attr:`used_blocks`,
:attr:`capacity`, :attr:`peak_used_blocks`, :meth:`used_block_ms` (integral of blocks held by
requests over time, blocks x ms; cached free blocks never count), and per request (on the
:class:`EngineRequest`): ``hit_tokens`` (prefix hit of its first admission's lookup, tokens),
``first_scheduled_ms``, ``queue_wait_ms``, ``first_token_ms``, ``finish_ms``, ``preemptions``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from dynlab.kv.block_pool import UNNAMED, BlockPool
from dynlab.kv.cpu_tier import CpuTier
from dynlab.kv.run_pool import RunBlockPool
from dynlab.latency.base import LatencyModel, StepBatch

__all__ = ["EngineRequest", "EngineWorker", "StepResult", "CPU_WRITES"]

#: when a block is written to the CPU tier: ``evict`` (when the GPU pool evicts it: a victim tier) or
#: ``compute`` (when the step computing it ends: write-through, the copy stays on both tiers)
CPU_WRITES = ("evict", "compute")


class EngineRequest:
    """A request inside an engine: its identity and lengths, its progress, its metrics.

    Given: ``id`` (any, for the caller), ``arrival_ms``, ``input_length`` (prompt tokens, >= 1),
    ``output_length`` (tokens to generate, >= 1), ``names`` (the names of its full prompt
    blocks at the engine's block size, ``input_length // block`` ints >= 0, from
    :func:`dynlab.engine.names.engine_block_names`; distinct within a request), ``runs`` (optional: the
    same names as runs ``(first name, count)``, from :func:`dynlab.engine.names.engine_block_runs`,
    which a worker with ``runs=True`` works on; ``None``: one run per name).

    Progress (read-only for callers): ``num_tokens``, ``computed``, ``generated``.
    Metrics (``None`` until known): ``hit_tokens``, ``first_scheduled_ms``, ``first_token_ms``,
    ``finish_ms``; ``preemptions`` (int); ``rejected`` (bool).
    """

    __slots__ = ("id", "arrival_ms", "input_length", "output_length", "names", "runs", "seq",
                 "num_tokens", "computed", "generated", "keys", "nreg",
                 "hit_tokens", "first_scheduled_ms", "first_token_ms", "finish_ms",
                 "preemptions", "rejected", "ready_ms", "load_blocks", "cpu_hit_blocks")

    def __init__(self, id, arrival_ms: float, input_length: int, output_length: int, names: Sequence[int],
                 runs: Optional[Sequence[tuple]] = None):
        if input_length < 1:
            raise ValueError(f"request {id!r}: input_length must be >= 1, got {input_length}")
        if output_length < 1:
            raise ValueError(f"request {id!r}: output_length must be >= 1 (a request generates a token), "
                             f"got {output_length}")
        self.id = id
        self.arrival_ms = arrival_ms
        self.input_length = input_length
        self.output_length = output_length
        self.names = names
        self.runs = runs
        self.seq = None  # names as the pool takes them (BlockPool.sequence), set by the worker
        self.num_tokens = input_length
        self.computed = 0
        self.generated = 0
        self.keys: list = []  # the pool keys of its blocks, in sequence order
        self.nreg = 0  # leading full prompt blocks already hit or registered
        self.hit_tokens: Optional[int] = None
        self.first_scheduled_ms: Optional[float] = None
        self.first_token_ms: Optional[float] = None
        self.finish_ms: Optional[float] = None
        self.preemptions = 0
        self.rejected = False
        self.ready_ms = 0.0  # while its CPU hits load: when they have arrived (ms)
        self.load_blocks = 0  # while its CPU hits load: how many
        self.cpu_hit_blocks: Optional[int] = None  # of its first admission's hit, blocks found in the CPU tier

    @property
    def queue_wait_ms(self) -> Optional[float]:
        """First scheduled minus arrival (ms), ``None`` before it is scheduled."""
        return None if self.first_scheduled_ms is None else self.first_scheduled_ms - self.arrival_ms

    def __repr__(self):
        return (f"EngineRequest({self.id!r}, arrival={self.arrival_ms}, in={self.input_length}, "
                f"out={self.output_length}, computed={self.computed}/{self.num_tokens})")


@dataclass(slots=True)
class StepResult:
    """What :meth:`EngineWorker.finish_step` reports for the step (or bulk run of ``steps``) just ended.

    - ``start``, ``end``: ms. ``steps``: engine iterations covered (> 1 for a bulk decode run).
    - ``stored``: names registered by the step, prefix order per request (publish as
      ``BlockStored`` at ``end``). ``removed``: names evicted at ``start`` (the same tuple as
      :attr:`EngineWorker.removed` after :meth:`~EngineWorker.start_step`; publish once), then
      those of a bulk run's block boundaries (published by :meth:`~EngineWorker.cross_boundary`).
    - ``first_tokens`` / ``finished``: ``[(request, time ms)]``, times == ``end``.
    - ``preempted``: requests preempted when the step was scheduled.
    - ``batch_size``: requests in the step; ``prefill_tokens``: prompt/recompute tokens computed
      (per step; 0 in a bulk run); ``decode_requests``: decodes per step.
    - ``used_blocks``: blocks held by requests during the step (a bulk run: after its last boundary).
    - ``handed_off``: ``[(request, time ms)]`` that left a ``handoff`` worker at their first
      token (its blocks held until :meth:`EngineWorker.release`).
    - ``cpu_stored`` / ``cpu_removed``: with ``cpu_write="compute"``, the CPU tier's net change from
      writing the step's ``stored`` names (publish as ``BlockStored`` / ``BlockRemoved`` with
      ``medium="CPU"`` at ``end``, after the GPU ``BlockStored``); empty otherwise.
    - ``stored_runs``: ``stored`` as ``(group, mask)`` pairs (the ``runs`` of its ``BlockStored``,
      :mod:`dynlab.routing.events`) when the pool works on runs (``runs=True``), else ``None``.
    """

    start: float
    end: float
    steps: int
    stored: tuple
    removed: tuple
    first_tokens: List[Tuple[EngineRequest, float]] = field(default_factory=list)
    finished: List[Tuple[EngineRequest, float]] = field(default_factory=list)
    preempted: int = 0
    batch_size: int = 0
    prefill_tokens: int = 0
    decode_requests: int = 0
    used_blocks: int = 0
    handed_off: List[Tuple[EngineRequest, float]] = field(default_factory=list)
    cpu_stored: tuple = ()
    cpu_removed: tuple = ()
    stored_runs: Optional[tuple] = None


class _Step:
    # bound_at / bound_reqs: a bulk run's pending block boundaries, last first: start (ms), requests taking a block
    __slots__ = ("start", "end", "k", "sched", "decodes", "context", "preempted", "stored", "removed",
                 "stored_runs", "prefill_tokens", "used", "bound_at", "bound_reqs")


class EngineWorker:
    """One serving engine: a waiting queue, running requests, a :class:`BlockPool`, a latency model.

    ``capacity``: KV blocks in the pool; ``block``: tokens per block; ``latency``: the step-time
    model; ``max_num_batched_tokens``: token budget per step; ``max_num_seqs``: running requests
    at most; ``bulk``: advance runs of decode-only steps at once (same results as ``False``);
    ``handoff``: a prefill worker of a disaggregated fleet (see the module docstring); ``runs``: the pool
    works on the requests' runs (:class:`~dynlab.kv.run_pool.RunBlockPool`, the same behaviour: for
    names with runs longer than one, as :func:`~dynlab.engine.names.engine_block_runs` gives them).
    """

    def __init__(self, worker_id: int, capacity: int, block: int, latency: LatencyModel, *,
                 max_num_batched_tokens: int = 8192, max_num_seqs: int = 256, bulk: bool = True,
                 cpu_capacity: int = 0, load_ms_per_block: float = 0.0, cpu_write: str = "evict",
                 handoff: bool = False, runs: bool = False):
        if block < 1:
            raise ValueError(f"block must be >= 1 token, got {block}")
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        self.worker_id = worker_id
        self.block = block
        self.latency = latency
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.bulk = bulk
        self.handoff = handoff
        self.held: dict = {}  # request -> its keys, handed off and not yet released
        self.reserved: dict = {}  # request -> (its keys, blocks hit): reserved, KV not yet received
        self.received: deque = deque()  # requests whose KV arrived, waiting to be admitted with their blocks
        self.runs = runs
        self.pool = RunBlockPool(capacity) if runs else BlockPool(capacity)
        self.waiting: deque = deque()
        self.running: List[EngineRequest] = []
        self.preemptions = 0
        self.rejected = 0
        self.steps = 0
        self.peak_used_blocks = 0
        self.removed: tuple = ()
        # removed as (group, mask) pairs (the runs of its BlockRemoved) when the pool works on runs, else None
        self.removed_runs: Optional[tuple] = None
        if load_ms_per_block < 0:
            raise ValueError(f"load_ms_per_block must be >= 0, got {load_ms_per_block}")
        self.cpu: Optional[CpuTier] = CpuTier(cpu_capacity) if cpu_capacity else None
        if cpu_write not in CPU_WRITES:
            raise ValueError(f"cpu_write must be one of {', '.join(CPU_WRITES)}, got {cpu_write!r}")
        self.write_through = cpu_write == "compute"
        self.load_ms_per_block = load_ms_per_block
        self.loading: deque = deque()  # admitted requests whose CPU hits are in transit, ready order
        self.ready: deque = deque()  # requests whose CPU hits have arrived, not yet scheduled
        self._link_free = 0.0  # when the host-to-device link finishes its queued loads (ms)
        self.cpu_stored: tuple = ()  # names the CPU tier gained at the last start_step (BlockStored CPU)
        self.cpu_removed: tuple = ()  # names it dropped then (BlockRemoved CPU)
        self.loaded_blocks = 0  # blocks loaded CPU -> GPU (every admission, re-admissions too)
        self.offloaded_blocks = 0  # blocks written GPU -> CPU
        self.gpu_hit_blocks = self.cpu_hit_blocks = 0  # first admissions' hits, per tier
        # set by a driver that calls cross_boundary at next_boundary (TimedFleet): bulk runs may then
        # go on across block boundaries (see the module docstring)
        self.cross_boundaries = False
        #: start (ms) of the next step of the bulk decode run in progress at which running requests cross
        #: a block boundary and take a block each (``None``: none left); call :meth:`cross_boundary` then,
        #: after the step ends and arrivals at that time. Read-only for callers (a plain attribute, read
        #: at every boundary: start_step, cross_boundary, interrupt and finish_step keep it the last of
        #: the run's ``bound_at``)
        self.next_boundary: Optional[float] = None
        self._step: Optional[_Step] = None
        self._used_ms = 0.0
        self._used_t: Optional[float] = None

    # -- reading --------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Blocks in the pool."""
        return self.pool.capacity

    @property
    def used_blocks(self) -> int:
        """Blocks held by requests now (never cached free blocks)."""
        return self.pool.used_blocks

    @property
    def idle(self) -> bool:
        """No step in progress and nothing to schedule (no running, waiting, loading or received request)."""
        return (self._step is None and not self.running and not self.waiting and not self.loading
                and not self.ready and not self.received)

    @property
    def next_ready(self) -> Optional[float]:
        """When (ms) the earliest CPU-tier load in transit arrives, ``None`` when none is."""
        return self.loading[0].ready_ms if self.loading else None

    @property
    def step_end(self) -> Optional[float]:
        """End (ms) of the step or bulk run in progress, ``None`` between steps."""
        return None if self._step is None else self._step.end

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
            self._offload(self.pool.removed)
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

    def _cross_next(self, st: _Step, n: int) -> int:
        """Cross the next ``n`` (>= 1) block boundaries of the run ``st``, in order: each request of a
        boundary takes a block, one :meth:`BlockPool.allocate_each` for all; :attr:`removed` /
        :attr:`removed_runs` hold what they evicted. Returns how many of them evicted."""
        bound_at, bound_reqs, pool = st.bound_at, st.bound_reqs, self.pool
        used, used_ms, used_t = pool.used_blocks, self._used_ms, self._used_t
        counts = []
        for _ in range(n):
            tb, reqs = bound_at.pop(), bound_reqs.pop()
            if used_t is not None:  # _accumulate(tb): the same sums in the same order
                used_ms += used * (tb - used_t)
            used_t = tb
            for req in reqs:  # in running order, as a step start takes them
                req.keys.append(UNNAMED)
            used += len(reqs)
            counts.append(len(reqs))
        self._used_ms, self._used_t = used_ms, used_t
        self.next_boundary = bound_at[-1] if bound_at else None
        self.cpu_stored = self.cpu_removed = ()
        pool.removed = []
        evicting = pool.allocate_each(counts)
        self.removed = removed = tuple(pool.removed)
        self.removed_runs = tuple(pool.removed_runs) if self.runs else None
        if removed:
            st.removed += removed
        st.used = used
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
        return evicting

    def overlap(self, names: Sequence[int], cap: Optional[int] = None) -> int:
        """Leading ``names`` cached now (at most ``cap``): what a request would hit if admitted at once.

        The question every worker answers alike (the count-based :class:`~dynlab.engine.counted.Worker`
        too); a reading only, for the metrics, never for a strategy.
        """
        return self.pool.lookup(self.pool.sequence(names, None), len(names) if cap is None else cap)

    def overlap_of(self, req: EngineRequest, cap: Optional[int] = None) -> int:
        """:meth:`overlap` of ``req``'s names (and runs), for a request about to be submitted here (its
        names as the pool takes them, :attr:`EngineRequest.seq`, are kept for :meth:`submit`)."""
        if req.seq is None:
            req.seq = self.pool.sequence(req.names, req.runs)
        return self.pool.lookup(req.seq, len(req.names) if cap is None else cap)

    def used_block_ms(self, now: Optional[float] = None) -> float:
        """Integral of :attr:`used_blocks` over time (blocks x ms) up to ``now`` (default: the last change)."""
        total = self._used_ms
        if now is not None and self._used_t is not None:
            total += self.pool.used_blocks * (now - self._used_t)
        return total

    # -- driving --------------------------------------------------------------------------
    def submit(self, req: EngineRequest, now: float) -> bool:
        """Queue ``req`` at ``now`` (ms); ``False`` (and counted in :attr:`rejected`) when its
        ``input_length + output_length - 1`` tokens can never fit the pool.

        A bulk decode run in progress is cut at its first step boundary >= ``now``: re-read
        :attr:`step_end`. Raises ``ValueError`` when ``len(req.names) != input_length // block``.
        """
        if len(req.names) != req.input_length // self.block:
            raise ValueError(f"request {req.id!r}: {len(req.names)} block names for {req.input_length} "
                             f"tokens at block {self.block} (want {req.input_length // self.block})")
        if req.input_length + req.output_length - 1 > self.pool.capacity * self.block:
            req.rejected = True
            self.rejected += 1
            return False
        if req.seq is None:
            req.seq = self.pool.sequence(req.names, req.runs)
        self.waiting.append(req)
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
        decode_ms, start, r, ctx = self.latency.decode_ms, st.start, st.decodes, st.context
        lo, hi = 1, st.k  # smallest j with start + decode_ms(j) >= t; decode_ms(k) >= t holds
        while lo < hi:
            mid = (lo + hi) // 2
            if start + decode_ms(r, ctx, mid) >= t:
                hi = mid
            else:
                lo = mid + 1
        if lo < st.k:
            st.k = lo
            st.end = start + decode_ms(r, ctx, lo)
            st.bound_at, st.bound_reqs = [], []  # those left are at steps >= lo: the next step takes their blocks
            self.next_boundary = None
        return st.end

    def start_step(self, now: float) -> Optional[float]:
        """Schedule the next step (or bulk decode run) starting at ``now`` (ms); returns its end
        (ms), or ``None`` when idle. Blocks evicted for it are in :attr:`removed` (at ``now``)."""
        if self._step is not None:
            raise RuntimeError("a step is already in progress")
        self.cpu_stored = self.cpu_removed = ()
        loading = self.loading
        while loading and loading[0].ready_ms <= now:
            self.ready.append(loading.popleft())  # scheduled before the waiting queue, in arrival order
        if not self.running and not self.waiting and not self.ready and not self.received:
            self.removed, self.removed_runs = (), None
            return None
        self._accumulate(now)
        pool = self.pool
        pool.stored, pool.removed = [], []
        sched: list = []
        budget, preempted = self._schedule_running(sched)
        admitted = 0
        if (not preempted or not sched) and (self.waiting or self.ready or self.received):
            admitted = self._admit(sched, budget, now)  # (every running request preempted: admit, or nothing runs)
        if self.cpu is not None and pool.removed:
            self._offload(pool.removed)
        if not sched:
            if loading or self.ready or self.held or self.reserved:
                # blocks are held by loads or for transfers: resume when a load arrives, or at release / receive
                self.removed = tuple(pool.removed)
                self.removed_runs = tuple(pool.removed_runs) if self.runs else None
                return None
            raise RuntimeError(f"worker {self.worker_id}: nothing schedulable although requests wait (bug)")
        st = self._plan(sched, preempted, admitted, now)
        self._step = st
        self.next_boundary = st.bound_at[-1] if st.bound_at else None
        if st.k > 1 and loading:
            self.interrupt(loading[0].ready_ms)  # a load arriving mid-run joins the next step
        return st.end

    def _schedule_running(self, sched: list) -> Tuple[int, int]:
        """Schedule the running requests, in running order, into ``sched`` (``(request, tokens)``
        pairs), taking their blocks and preempting from the back when the pool runs dry; returns
        ``(token budget left, requests preempted)``."""
        running, pool, B = self.running, self.pool, self.block
        budget = self.max_num_batched_tokens
        preempted = 0
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = req.num_tokens - req.computed
            if n > budget:
                n = budget
            need = -(-(req.computed + n) // B) - len(req.keys)
            if need > pool.num_free:
                victim = None
                while need > pool.num_free:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted += 1
                    if victim is req:
                        break
                if victim is req:
                    break
            if need > 0:
                req.keys += pool.allocate(need)
            if req.nreg < len(req.names):
                self._register(req, n)
            sched.append((req, n))
            budget -= n
            i += 1
        return budget, preempted

    def _admit(self, sched: list, budget: int, now: float) -> int:
        """Admit, while ``budget`` tokens and sequence slots remain: received requests (their KV came by
        a transfer), then those whose CPU hits have arrived, then the waiting queue in FCFS order
        (prefix lookup, CPU-tier loads), stopping at the first that cannot get its blocks. Appends
        the scheduled ``(request, tokens)`` to ``sched``; returns how many were admitted (loads too)."""
        pool, B, cpu = self.pool, self.block, self.cpu
        running, waiting = self.running, self.waiting
        admitted = 0
        max_seqs = self.max_num_seqs
        received = self.received
        while received and budget > 0 and len(running) < max_seqs:
            # its KV arrived by a transfer: admitted first, with the blocks it holds (blocks held by
            # waiting requests must not wait behind requests that need new ones)
            req = received[0]
            n = min(req.num_tokens - req.computed, budget)
            need = -(-(req.computed + n) // B) - len(req.keys)
            if need > pool.num_free:
                break
            received.popleft()
            if need > 0:
                req.keys += pool.allocate(need)
            running.append(req)
            sched.append((req, n))
            budget -= n
            admitted += 1
        ready = self.ready
        while ready and budget > 0 and len(running) < max_seqs:
            req = ready.popleft()  # its CPU hits have arrived: its blocks are held, no lookup
            n = self._admit_loaded(req, budget)
            running.append(req)
            sched.append((req, n))
            budget -= n
            admitted += 1
        while waiting and budget > 0 and len(running) < max_seqs:
            req = waiting[0]
            names = req.names
            cap = min(len(names), (req.num_tokens - 1) // B)
            h = pool.lookup(req.seq, cap)
            if cpu is not None and h < cap:
                hc = cpu.lookup(names, h, cap - h)
                if hc:
                    if not self._admit_loading(req, h, hc, budget, now):
                        break
                    admitted += 1
                    continue
            computed = h * B
            n = req.num_tokens - computed
            if n > budget:
                n = budget
            need = -(-(computed + n) // B) - h
            if need + (pool.evictable_hits(req.seq, h) if h else 0) > pool.num_free:
                break
            waiting.popleft()
            pool.take_hits(req.seq, h)
            req.keys = list(names[:h])
            if need > 0:
                req.keys += pool.allocate(need)
            req.computed = computed
            req.nreg = h
            if req.hit_tokens is None:
                req.hit_tokens = computed
                req.cpu_hit_blocks = 0
                req.first_scheduled_ms = now
                self.gpu_hit_blocks += h
            self._register(req, n)
            running.append(req)
            sched.append((req, n))
            budget -= n
            admitted += 1
        return admitted

    def _offload(self, removed: list) -> None:
        """Write the names the pool evicted to the CPU tier (:attr:`cpu_stored` / :attr:`cpu_removed`);
        nothing under write-through (``cpu_write="compute"``: the copy was written when computed)."""
        if self.write_through:
            return
        cpu = self.cpu
        self.offloaded_blocks += sum(1 for name in removed if name not in cpu)
        self.cpu_stored, self.cpu_removed = cpu.offload(removed)

    def _plan(self, sched: list, preempted: int, admitted: int, now: float) -> _Step:
        """The step (or bulk decode run) of the scheduled ``(request, tokens)`` pairs: its batch, its
        length ``k`` (steps), its end from the latency model; the pool's stored/removed names."""
        pool, B = self.pool, self.block
        prefill_tokens, prefill_context = [], []
        decodes = context = 0
        for req, n in sched:
            if n == 1 and req.num_tokens - req.computed == 1 and req.computed >= req.input_length:
                decodes += 1
                context += req.num_tokens
            else:
                prefill_tokens.append(n)
                prefill_context.append(req.computed)
        k = 1
        at = reqs = None  # a run across block boundaries: their steps, then their start times, and requests
        if self.bulk and not prefill_tokens and not preempted and not admitted and len(sched) == len(self.running):
            # every step of the run is this one again: no admission (the waiting queue's head meets
            # the same budget, slots and pool), no finish before the last step, and no new block,
            # except at block boundaries the free queue can serve when nothing waits (_boundaries)
            k = min([r.output_length - r.generated for r, _ in sched])
            kb = min([len(r.keys) * B - r.computed for r, _ in sched])
            if kb < k:
                if (self.cross_boundaries and not self.waiting and not self.loading and not self.ready
                        and not self.received):
                    k, at, reqs = self._boundaries(sched, k, pool.num_free)
                else:
                    k = kb
        st = _Step()
        st.start, st.k, st.sched, st.decodes, st.context, st.preempted = now, k, sched, decodes, context, preempted
        st.prefill_tokens = sum(prefill_tokens)
        if at:  # the boundaries' start times and the run's end (k > 1), from one call
            at.append(k)
            at = self.latency.decode_ms_at(decodes, context, at)
            st.end = now + at.pop()
            st.bound_at, st.bound_reqs = [now + ms for ms in at], reqs
        else:
            st.bound_at, st.bound_reqs = [], []
            if k > 1:
                st.end = now + self.latency.decode_ms(decodes, context, k)
            else:
                st.end = now + self.latency.step_ms(StepBatch(tuple(prefill_tokens), tuple(prefill_context),
                                                              decodes, context))
        st.stored = tuple(pool.stored)
        st.stored_runs = tuple(pool.stored_runs) if self.runs else None
        st.removed = self.removed = tuple(pool.removed)
        self.removed_runs = tuple(pool.removed_runs) if self.runs else None
        st.used = used = pool.used_blocks
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
        return st

    def finish_step(self) -> StepResult:
        """Apply the step (or bulk run) in progress at its end: computed tokens, emitted tokens,
        finishes (their blocks return to the free queue)."""
        st = self._step
        if st is None:
            raise RuntimeError("no step in progress")
        if st.bound_at:
            self._catch_up(st, st.end)
        self._step = self.next_boundary = None
        end, k = st.end, st.k
        self._accumulate(end)
        first_tokens, finished, handed = [], [], []
        for req, n in st.sched:
            if k > 1:
                req.computed += k
                req.num_tokens += k
                req.generated += k
            else:
                req.computed += n
                if req.computed != req.num_tokens:
                    continue
                req.num_tokens += 1
                req.generated += 1
                if req.generated == 1:
                    req.first_token_ms = end
                    first_tokens.append((req, end))
                    if self.handoff and req.generated < req.output_length:
                        handed.append((req, end))
                        self.held[req] = req.keys
                        req.keys = []
                        continue
            if req.generated >= req.output_length:
                req.finish_ms = end
                finished.append((req, end))
                self.pool.release(req.keys, req.seq)
                req.keys = []
        if handed:
            held = self.held
            self.running = [r for r in self.running if r.finish_ms is None and r not in held]
        elif finished:
            self.running = [r for r in self.running if r.finish_ms is None]
        self.steps += k
        res = StepResult(st.start, end, k, st.stored, st.removed, first_tokens, finished, st.preempted,
                         len(st.sched), st.prefill_tokens, st.decodes, st.used, handed, stored_runs=st.stored_runs)
        if self.write_through and st.stored and self.cpu is not None:
            self._write_through(res)
        return res

    def _write_through(self, res: StepResult) -> None:
        """Write the blocks the step computed to the CPU tier (``cpu_write="compute"``), except those it
        holds already (loaded from it, or still there from an earlier computation: not copied again)."""
        cpu = self.cpu
        new = [name for name in res.stored if name not in cpu]
        if new:
            self.offloaded_blocks += len(new)
            res.cpu_stored, res.cpu_removed = cpu.offload(new)

    # -- disaggregated serving --------------------------------------------------------------
    def release(self, req: EngineRequest, now: float) -> None:
        """Free the blocks of ``req``, handed off at its first token, at ``now`` (ms): its KV has been
        sent. Its full prompt blocks stay cached (free queue). Raises ``KeyError`` if not held here."""
        keys = self.held.pop(req)
        self._accumulate(now)
        self.pool.release(keys, req.seq)

    def reserve(self, req: EngineRequest, now: float, prefix_cache: bool = False) -> Optional[int]:
        """Allocate, at ``now`` (ms), the blocks ``req`` needs to receive its prompt's KV and decode its
        next token (``ceil((input_length + 1) / block)``), before the transfer starts.

        With ``prefix_cache`` the leading full prompt blocks this worker caches are taken as hits
        (no need to transfer them). Returns the tokens hit (0 without ``prefix_cache``), or ``None``
        (nothing taken) when the free blocks do not suffice. Call :meth:`receive` when the KV arrived.
        """
        pool, B = self.pool, self.block
        names = req.names
        if req.seq is None:
            req.seq = pool.sequence(names, req.runs)
        h = pool.lookup(req.seq, len(names)) if prefix_cache else 0
        need = -(-(req.input_length + 1) // B) - h
        if need + (pool.evictable_hits(req.seq, h) if h else 0) > pool.num_free:
            return None
        self._accumulate(now)
        pool.take_hits(req.seq, h)
        self.reserved[req] = (list(names[:h]) + pool.allocate(need), h)  # req.keys may still be its prefill worker's
        used = pool.used_blocks
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
        return h * B

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
        req.keys, req.nreg = self.reserved.pop(req)
        if prefix_cache:
            self._register(req, 0)
        req.nreg = len(req.names)
        self.received.append(req)
        if self._step is not None and self._step.k > 1:
            self.interrupt(now)

    # -- internals ------------------------------------------------------------------------
    def _admit_loading(self, req: EngineRequest, h: int, hc: int, budget: int, now: float) -> bool:
        """Admit ``req`` whose lookup found ``h`` GPU blocks then ``hc`` CPU blocks: take the GPU hits,
        allocate the blocks its loads and its first chunk need, queue the load on the link.
        ``False`` (nothing changed) when the pool cannot give the blocks."""
        pool, B = self.pool, self.block
        names = req.names
        computed = (h + hc) * B
        n = min(req.num_tokens - computed, budget)
        need = -(-(computed + n) // B) - h
        if need + (pool.evictable_hits(req.seq, h) if h else 0) > pool.num_free:
            return False
        self.waiting.popleft()
        pool.take_hits(req.seq, h)
        req.keys = list(names[:h]) + pool.allocate(need)
        self.cpu.touch(names[h:h + hc])
        req.computed = h * B
        req.nreg = h
        req.load_blocks = hc
        start = self._link_free if self._link_free > now else now
        req.ready_ms = self._link_free = start + hc * self.load_ms_per_block
        self.loaded_blocks += hc
        if req.hit_tokens is None:
            req.hit_tokens = computed
            req.cpu_hit_blocks = hc
            req.first_scheduled_ms = now
            self.gpu_hit_blocks += h
            self.cpu_hit_blocks += hc
        self.loading.append(req)
        return True

    def _admit_loaded(self, req: EngineRequest, budget: int) -> int:
        """Schedule the first chunk of ``req`` whose CPU hits have arrived: name the loaded blocks,
        and compute at most what the pool can give (never less than the blocks reserved at admission)."""
        pool, B = self.pool, self.block
        hc = req.load_blocks
        pool.register(req.keys, req.seq, req.nreg, req.nreg + hc)
        req.nreg += hc
        req.computed = req.nreg * B
        req.load_blocks = 0
        n = min(req.num_tokens - req.computed, budget)
        need = -(-(req.computed + n) // B) - len(req.keys)
        if need > pool.num_free:
            n = len(req.keys) * B - req.computed
            need = 0
        if need > 0:
            req.keys += pool.allocate(need)
        self._register(req, n)
        return n

    def _boundaries(self, sched: list, k: int, free: int) -> Tuple[int, list, list]:
        """A decode-only run of up to ``k`` steps (to the earliest finish) across block boundaries.

        Returns ``(k, steps, reqs)`` for the boundaries inside the run, LAST first (popped from the
        end): ``steps[i]`` is a boundary's step ``j`` (the caller turns it into its start time, ms),
        ``reqs[i]`` the requests taking a block at step ``j``, in running order. Taking
        a block there is all a new step would do (nothing waits to be admitted, nothing finishes
        before step ``k``), so the run goes on, unless the free queue (``free`` blocks) could not
        serve a boundary: the run then ends at that step (which may preempt).
        """
        B = self.block
        by_step: dict = {}
        for req, _ in sched:
            j = len(req.keys) * B - req.computed
            while j < k:
                lst = by_step.get(j)
                if lst is None:
                    by_step[j] = [req]
                else:
                    lst.append(req)
                j += B
        steps = sorted(by_step)
        taken = 0
        for i, j in enumerate(steps):
            taken += len(by_step[j])
            if taken > free:
                k = j
                del steps[i:]
                break
        steps.reverse()
        return k, steps, [by_step[j] for j in steps]

    def _catch_up(self, st: _Step, t: float) -> None:
        """Cross the pending block boundaries of the run ``st`` that start before ``t`` (ms)."""
        while st.bound_at and st.bound_at[-1] < t:
            self.cross_boundary()

    def _accumulate(self, t: float) -> None:
        if self._used_t is not None:
            self._used_ms += self.pool.used_blocks * (t - self._used_t)
        self._used_t = t

    def _register(self, req: EngineRequest, n: int) -> None:
        """Name the full prompt blocks the chunk of ``n`` tokens scheduled now completes."""
        full = min(req.computed + n, req.input_length) // self.block
        if full > req.nreg:
            self.pool.register(req.keys, req.seq, req.nreg, full)
            req.nreg = full

    def _preempt(self, req: EngineRequest) -> None:
        self.pool.release(req.keys, req.seq)
        req.keys = []
        req.computed = 0
        req.nreg = 0
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    def check(self) -> None:
        """Assert invariants (tests): used blocks == blocks held by running and loading requests
        (a loading request holds blocks in :attr:`loading`, then in :attr:`ready`), pool
        consistent, CPU tier within its capacity."""
        self.pool.check()
        st = self._step
        assert self.next_boundary == (st.bound_at[-1] if st is not None and st.bound_at else None)
        held = {}
        for r in self.running:
            assert len(r.keys) >= -(-r.computed // self.block)
        assert all(not r.keys for r in self.waiting)
        loading = list(self.loading) + list(self.ready)
        if self.cpu is not None:
            assert len(self.cpu) <= self.cpu.capacity
        holders = [r.keys for r in self.running + loading] + [keys for keys, _ in self.reserved.values()]
        holders += list(self.held.values()) + [r.keys for r in self.received]
        unnamed = 0
        for keys in holders:
            for key in keys:
                if key < 0:
                    unnamed += 1
                else:
                    held[key] = held.get(key, 0) + 1
        assert len(held) + unnamed == self.pool.used_blocks, (len(held), unnamed, self.pool.used_blocks)
        for key, c in held.items():
            assert self.pool.references(key) == c
        assert all(r.load_blocks > 0 for r in loading)

    # public hooks for the run layer
    @property
    def step_requests(self) -> list:
        """The requests scheduled in the step (or bulk decode run) in progress, in schedule order; ``[]``
        between steps. A P/D fleet reads it when a step starts (layer-pipelined transfers)."""
        st = self._step
        return [] if st is None else [req for req, _ in st.sched]
