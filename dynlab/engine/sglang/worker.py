"""One SGLang worker (sglang 0.5.23) behind :class:`~dynlab.engine.worker.EngineWorker`'s step interface.

The fleets (:class:`~dynlab.engine.timed.TimedFleet`) drive it as they drive a vLLM worker: ``submit``,
``start_step`` (its evictions in ``removed``, published as ``BlockRemoved`` at the step's start),
``finish_step`` (a :class:`~dynlab.engine.bulk.StepResult`: ``stored`` names, published as ``BlockStored`` at
its end; first tokens, finishes), ``step_end``, ``idle``. It runs one forward pass at a time (no bulk decode
runs, so no block boundaries: ``next_boundary`` is always ``None``), has no CPU tier and no P/D role.

A pass is timed by the run's latency model as one step: a prefill pass as ``StepBatch(its chunks, their
cached prefixes)`` (plus the running requests' decodes when ``--enable-mixed-chunk`` mixes them in), a decode
pass as ``StepBatch(decode_requests=R, decode_context=their tokens)``. So where vLLM runs one step of
chunks and decodes together, SGLang (unmixed) runs two passes, each paying the step's fixed cost.

Figures as :class:`~dynlab.engine.worker.EngineWorker`'s: ``preemptions`` counts retractions; ``used_blocks``
is ``ceil(tokens held by requests / block)`` (their own tokens and the cached ones they lock; cached free
tokens never count); ``capacity`` the pool in blocks (``size = capacity x block`` tokens).
"""
from __future__ import annotations

import random
from typing import Optional, Sequence

from dynlab.engine.bulk import StepResult
from dynlab.engine.request import EngineRequest
from dynlab.engine.sglang.radix_cache import RadixCache
from dynlab.engine.sglang.schedule_policy import NewTokenRatio, SchedulePolicy
from dynlab.engine.sglang.scheduler import SglangScheduler, SgReq, Step, TokenPool
from dynlab.latency.base import LatencyModel, StepBatch

__all__ = ["SglangWorker"]


class SglangWorker:
    """An SGLang engine of ``capacity`` blocks of ``block`` tokens, timed by ``latency``.

    ``max_running_requests``, ``chunked_prefill_size`` (``None``: no chunking), ``max_prefill_tokens``,
    ``schedule_policy``, ``page_size`` (tokens, dividing ``block``), ``disable_radix_cache``,
    ``enable_mixed_chunk``, ``init_new_token_ratio`` x ``schedule_conservativeness`` and
    ``new_token_ratio_decay_steps``: SGLang's options of the same names (:mod:`dynlab.engine.sglang`).
    ``seed``: the ``random`` policy's generator. Raises ``ValueError`` for a page that does not divide the block.
    """

    cpu = None
    spec = None
    removed_runs = None
    next_boundary = None
    next_ready = None
    cpu_stored = cpu_removed = ()

    def __init__(self, worker_id: int, capacity: int, block: int, latency: LatencyModel, *,
                 max_running_requests: int = 2048, chunked_prefill_size: Optional[int] = 8192,
                 max_prefill_tokens: int = 16384, schedule_policy: str = "fcfs", page_size: int = 1,
                 disable_radix_cache: bool = False, enable_mixed_chunk: bool = False,
                 init_new_token_ratio: float = 0.7, schedule_conservativeness: float = 1.0,
                 new_token_ratio_decay_steps: int = 600, seed: int = 0):
        if block < 1 or page_size < 1 or block % page_size:
            raise ValueError(f"--page-size {page_size} must divide --block {block} (dynlab names KV per block)")
        if max_running_requests < 1 or max_prefill_tokens < 1 or new_token_ratio_decay_steps < 1:
            raise ValueError("max_running_requests, max_prefill_tokens and new_token_ratio_decay_steps must be >= 1")
        self.worker_id, self.block, self.latency = worker_id, block, latency
        self.cache = RadixCache(block, disable_radix_cache)
        self.pool = TokenPool(capacity * block, self.cache, page_size)
        policy = SchedulePolicy(schedule_policy, self.cache, random.Random(seed * 1_000_003 + worker_id))
        self.ratio = NewTokenRatio(init_new_token_ratio, schedule_conservativeness, new_token_ratio_decay_steps)
        self.scheduler = SglangScheduler(self.pool, policy, self.ratio, max_running_requests, max_prefill_tokens,
                                         chunked_prefill_size, enable_mixed_chunk)
        self.capacity = capacity
        self.cross_boundaries = False  # set by the fleet; nothing to cross here
        self.rejected = self.steps = self.peak_used_blocks = 0
        self.busy_ms = self.busy_block_ms = 0.0
        self.removed: tuple = ()
        self._step: Optional[tuple] = None  # (Step, start ms, end ms)
        self._used_ms = 0.0  # blocks held x ms up to _used_at
        self._used_at = 0.0

    # -- reading --------------------------------------------------------------------------
    waiting = property(lambda self: [r.req for r in self.scheduler.waiting], doc="Requests waiting for admission.")
    running = property(lambda self: [r.req for r in self.scheduler.running], doc="The running batch.")
    preemptions = property(lambda self: self.scheduler.retractions, doc="Retractions so far.")

    @property
    def used_blocks(self) -> int:
        """Blocks' worth of tokens held by requests now (``ceil(tokens / block)``)."""
        return -(-self.pool.used // self.block)

    @property
    def idle(self) -> bool:
        sch = self.scheduler
        return self._step is None and not sch.running and not sch.waiting and sch.chunked is None

    @property
    def step_end(self) -> Optional[float]:
        return None if self._step is None else self._step[2]

    def overlap(self, names: Sequence[int], cap: Optional[int] = None) -> int:
        """Leading ``names`` the radix cache holds now (at most ``cap``), without touching their LRU times."""
        return self.cache.match_prefix(names, cap, touch=False)[0]

    def overlap_of(self, req: EngineRequest, cap: Optional[int] = None) -> int:
        return self.overlap(req.names, cap)

    def used_block_ms(self, now: Optional[float] = None) -> float:
        """Integral of :attr:`used_blocks` over time (blocks x ms) up to ``now`` (default: the last change)."""
        if now is None or now <= self._used_at:
            return self._used_ms
        return self._used_ms + self.used_blocks * (now - self._used_at)

    def _account(self, t: float) -> None:
        self._used_ms = self.used_block_ms(t)
        self._used_at = max(t, self._used_at)

    def cross_boundary(self) -> tuple:
        raise RuntimeError("no block boundary pending")

    def cross_before(self, t: float) -> int:
        self.removed = ()
        return 0

    # -- driving --------------------------------------------------------------------------
    def submit(self, req: EngineRequest, now: float) -> bool:
        """Queue ``req`` at ``now`` (ms); ``False`` (counted in :attr:`rejected`) when this engine, empty, could
        not always admit it: ``input_length + output_length + page_size`` tokens not below the pool (what
        ``PrefillAdder.add_one_req`` asks of a prompt and its tokens to come, at any point of its life; SGLang
        itself clips ``max_new_tokens`` to its ``max_req_len`` instead)."""
        if not req.input_length + req.output_length + self.pool.page < self.pool.size:
            req.rejected = True
            self.rejected += 1
            return False
        self.scheduler.waiting.append(SgReq(req, self.cache.root))
        return True

    def start_step(self, now: float) -> Optional[float]:
        """Form the next pass at ``now`` (ms); returns its end (ms), ``None`` when there is nothing to run
        (the new-token ratio then resets, ``Scheduler.on_idle``). Evicted names are in :attr:`removed`."""
        if self._step is not None:
            raise RuntimeError("a step is already in progress")
        self._account(now)
        step = self.scheduler.schedule()
        self.removed, self.pool.removed = tuple(self.pool.removed), []
        if step is None:
            if not self.idle:
                raise RuntimeError(f"worker {self.worker_id}: nothing schedulable although requests wait (bug)")
            self.ratio.reset()
            return None
        for r, _, _ in step.prefill:
            if r.req.first_scheduled_ms is None:
                r.req.first_scheduled_ms = now
                r.req.hit_tokens = r.matched_tokens
        self.peak_used_blocks = max(self.peak_used_blocks, self.used_blocks)
        end = now + self.latency.step_ms(_batch(step))
        self._step = (step, now, end)
        return end

    def hold_until(self, end: float) -> None:
        """End the pass in progress at ``end`` (ms, not before its own end): a rank waiting for its lockstep group."""
        step, start, _ = self._step
        self._step = (step, start, end)

    def finish_step(self) -> StepResult:
        """Apply the pass in progress at its end: computed tokens, emitted tokens, cached blocks, finishes."""
        if self._step is None:
            raise RuntimeError("no step in progress")
        step, start, end = self._step
        used = self.used_blocks
        self.busy_ms += end - start
        self.busy_block_ms += used * (end - start)
        self._account(end)
        self._step = None
        self.steps += 1
        sch = self.scheduler
        stored, first, finished = [], [], []
        mixed = bool(step.prefill) and bool(step.decodes)
        if mixed:
            sch.end_mixed()
        for r, prefix, extend in step.prefill:
            r.req.computed = prefix + extend
            stored += sch.cache_computed(r)
            if r is not sch.chunked and r.req.computed == r.req.num_tokens:
                self._emit(r, end, first, finished, stored, True)
        for r in step.decodes:
            r.req.computed += 1
            self._emit(r, end, first, finished, stored, mixed)
        if finished:
            done = {id(req) for req, _ in finished}
            sch.running = [r for r in sch.running if id(r.req) not in done]
            sch.batch_is_full = False  # a request left the batch (filter_batch)
        if self.idle:  # nothing left to run: Scheduler.on_idle resets the ratio
            self.ratio.reset()
        prefill_tokens = sum(n for _, _, n in step.prefill)
        return StepResult(start, end, 1, tuple(stored), self.removed, first, finished, len(step.retracted),
                          len(step.prefill) + len(step.decodes), prefill_tokens, len(step.decodes), used)

    def _emit(self, r: SgReq, end: float, first: list, finished: list, stored: list, join: bool) -> None:
        """``r`` computed its last token: it emits the next one; a prefill joins the running batch, the
        last token finishes it (its blocks cached, the rest freed)."""
        req = r.req
        req.generated += 1
        req.num_tokens += 1
        if req.generated == 1:
            req.first_token_ms = end
            first.append((req, end))
        if req.generated >= req.output_length:
            req.finish_ms = end
            finished.append((req, end))
            stored += self.scheduler.finish(r)
        elif join:  # its prefill ended: it joins the running batch (merge_batch)
            self.scheduler.running.append(r)

    def check(self) -> None:
        """Assert invariants (tests): the pool within its size, every request's tokens accounted."""
        sch, pool = self.scheduler, self.pool
        self.cache.check()
        holders = sch.running + ([sch.chunked] if sch.chunked is not None else [])
        assert pool.private == sum(r.private for r in holders), (pool.private, [r.private for r in holders])
        assert all(r.private == 0 and r.alloc == 0 for r in sch.waiting)
        assert 0 <= pool.available <= pool.size
        assert self.cache.total_size + pool.private <= pool.size


def _batch(step: Step) -> StepBatch:
    """The latency model's view of a pass: its prefill chunks (after their prefixes) and its decodes."""
    decodes = step.decodes
    return StepBatch(tuple(n for _, _, n in step.prefill), tuple(p for _, p, _ in step.prefill),
                     len(decodes), sum(r.req.num_tokens for r in decodes))
