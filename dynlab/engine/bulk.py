"""The step plan: a scheduled step's batch and duration, the bulk-decode planner and lazy block-boundary crossing.

A step of ``(request, tokens)`` pairs (from :class:`~dynlab.engine.scheduler.Scheduler`) becomes
a :class:`StepPlan`: its batch (prefill chunks, decodes; :func:`batch_of`), its length ``k``
(engine iterations) and its end (ms) from the latency model. A decode-only step repeats itself
until the earliest finish or the first step needing a new block, so :func:`plan_step` advances
``k`` such steps at once (``latency.decode_ms(R, ctx, k)``), and, when the driver crosses block
boundaries lazily and nothing waits, goes on across the boundaries the free queue can serve
(:func:`boundaries`; the driver takes their blocks at their times,
:meth:`~dynlab.kv.cache_manager.KvCacheManager.take_boundaries`). :func:`cut_run` ends a run at
its first step boundary at or after a time (an arrival). The rules are the
:mod:`dynlab.engine.worker` docstring's **Bulk decode**. Steps and tokens: a decode step computes
:data:`~dynlab.engine.request.DECODE_TOKENS` tokens per request.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from dynlab.engine.request import DECODE_TOKENS, EngineRequest
from dynlab.latency.base import LatencyModel, StepBatch

__all__ = ["StepPlan", "StepResult", "add_busy", "batch_of", "plan_step", "boundaries", "cut_run"]


class StepPlan:
    """A step (``k == 1``) or bulk decode run (``k`` steps) in progress.

    ``start`` / ``end`` (ms), ``k``, ``sched`` (``(request, tokens)`` pairs), ``decodes`` (decode
    requests per step), ``context`` (their summed contexts, tokens), ``preempted``,
    ``prefill_tokens``, ``stored`` / ``stored_runs`` / ``removed`` (the pool's events), ``used``
    (blocks used), ``bound_at`` / ``bound_reqs``: a bulk run's pending block boundaries, LAST first:
    start (ms) and the requests taking a block there (under async scheduling the first, latest, entry of a
    run is its look-ahead, requests ``None``); ``sampling``: under async scheduling, the requests that
    sample a token (:mod:`dynlab.engine.async_steps`).
    """

    __slots__ = ("start", "end", "k", "sched", "decodes", "context", "preempted", "stored", "removed",
                 "stored_runs", "prefill_tokens", "used", "bound_at", "bound_reqs", "sampling")


def add_busy(worker, st: StepPlan) -> float:
    """``st.end`` (ms), after advancing ``worker.kv``'s usage integral to it and adding ``st``'s time (ms) and
    blocks x ms to ``worker.busy_ms`` / ``worker.busy_block_ms`` (``mean_kv_usage_busy``): the step-end sums
    of :meth:`~dynlab.engine.worker.EngineWorker.finish_step`, the async worker's too."""
    kv, end = worker.kv, st.end
    kv.accumulate(end)
    worker.busy_ms += end - st.start
    worker.busy_block_ms += kv.used_ms - worker._busy_from  # used_block_ms() after accumulate(end)
    return end



@dataclass(slots=True)
class StepResult:
    """What :meth:`~dynlab.engine.worker.EngineWorker.finish_step` reports for the step (or bulk run of
    ``steps``) just ended.

    - ``start``, ``end``: ms. ``steps``: engine iterations covered (> 1 for a bulk decode run).
    - ``stored``: names registered by the step, prefix order per request (publish as
      ``BlockStored`` at ``end``). ``removed``: names evicted at ``start`` (the same tuple as
      :attr:`~dynlab.engine.worker.EngineWorker.removed` after
      :meth:`~dynlab.engine.worker.EngineWorker.start_step`; publish once), then
      those of a bulk run's block boundaries (published by :meth:`~dynlab.engine.worker.EngineWorker.cross_boundary`).
    - ``first_tokens`` / ``finished``: ``[(request, time ms)]``, times == ``end``.
    - ``preempted``: requests preempted when the step was scheduled.
    - ``batch_size``: requests in the step; ``prefill_tokens``: prompt/recompute tokens computed
      (per step; 0 in a bulk run); ``decode_requests``: decodes per step.
    - ``used_blocks``: blocks held by requests during the step (a bulk run: after its last boundary).
    - ``handed_off``: ``[(request, time ms)]`` that left a ``handoff`` worker at their first
      token (its blocks held until :meth:`~dynlab.engine.worker.EngineWorker.release`).
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


def batch_of(sched: list) -> Tuple[list, list, int, int]:
    """``(prefill tokens, their prior contexts, decodes, summed decode context)`` of a step's
    ``(request, tokens)`` pairs. A request decodes when it computes :data:`DECODE_TOKENS`, its last
    uncomputed ones, past its prompt; its context is ``num_tokens`` (prompt + generated so far)."""
    prefill_tokens, prefill_context = [], []
    decodes = context = 0
    for req, n in sched:
        if n == DECODE_TOKENS and req.num_tokens - req.computed == DECODE_TOKENS and req.computed >= req.input_length:
            decodes += 1
            context += req.num_tokens
        else:
            prefill_tokens.append(n)
            prefill_context.append(req.computed)
    return prefill_tokens, prefill_context, decodes, context


def plan_step(sched: list, preempted: int, admitted: int, now: float, latency: LatencyModel, kv,
              bulk: bool, running: int, can_cross: bool, spec=None) -> StepPlan:
    """The plan of the step scheduled at ``now`` (ms): its batch, length ``k`` and end.

    ``bulk``: advance a decode-only step (every one of the ``running`` requests decodes, nothing
    admitted or preempted) ``k`` steps at once, to the earliest finish, or to the first block
    boundary unless ``can_cross`` (the driver crosses boundaries and nothing waits): then across
    those the free queue of ``kv`` can serve. The pool's events and usage are the caller's to fill.
    A run also ends before the step that completes a block of a reply the trace names (its
    registration, at that step's schedule, may let a waiting request hit it).
    ``spec``: speculative decoding (:class:`~dynlab.engine.spec.SpecDecoding`): one step (no bulk
    run), a verify step plus the drafter's time (:func:`~dynlab.engine.spec.verify_batch`).
    """
    if spec is not None:
        return _plan_spec_step(sched, preempted, now, latency, spec)
    prefill_tokens, prefill_context, decodes, context = batch_of(sched)
    k = 1
    at = reqs = None  # a run across block boundaries: their steps, then their start times, and requests
    if bulk and not prefill_tokens and not preempted and not admitted and len(sched) == running:
        # every step of the run is this one again: no admission (the waiting queue's head meets
        # the same budget, slots and pool), no finish before the last step, and no new block,
        # except at block boundaries the free queue can serve when nothing waits (boundaries)
        k = min([r.output_length - r.generated for r, _ in sched]) // DECODE_TOKENS
        for r, _ in sched:  # a trace-named reply block (output_tokens) is named when its step is scheduled
            if r.out_blocks and r.nreg < len(r.names):
                k = min(k, max((r.nreg + 1) * kv.block - 1 - r.computed, 1))
        slots = kv.free_slots_of(sched)
        kb = min(slots) // DECODE_TOKENS
        if kb < k:
            if can_cross:
                k, at, reqs = boundaries(sched, slots, k, kv.num_free, kv.block)
            else:
                k = kb
    st = StepPlan()
    st.start, st.k, st.sched, st.decodes, st.context, st.preempted = now, k, sched, decodes, context, preempted
    st.prefill_tokens = sum(prefill_tokens)
    if at:  # the boundaries' start times and the run's end (k > 1), from one call
        at.append(k)
        at = latency.decode_ms_at(decodes, context, at)
        st.end = now + at.pop()
        st.bound_at, st.bound_reqs = [now + ms for ms in at], reqs
    else:
        st.bound_at, st.bound_reqs = [], []
        if k > 1:
            st.end = now + latency.decode_ms(decodes, context, k)
        else:
            st.end = now + latency.step_ms(StepBatch(tuple(prefill_tokens), tuple(prefill_context),
                                                     decodes, context))
    return st


def _plan_spec_step(sched: list, preempted: int, now: float, latency: LatencyModel, spec) -> StepPlan:
    """:func:`plan_step` with speculative decoding: one verify step, ``k == 1``."""
    from dynlab.engine.spec import drafter_ms, verify_batch

    batch, decodes, context, drafts = verify_batch(sched)
    st = StepPlan()
    st.start, st.k, st.sched, st.decodes, st.context, st.preempted = now, 1, sched, decodes, context, preempted
    st.prefill_tokens = sum(batch.prefill_tokens) - drafts
    st.bound_at, st.bound_reqs = [], []
    st.end = now + latency.step_ms(batch) + drafter_ms(latency, spec.method, spec.k, decodes, context,
                                                          spec.draft_latency)
    return st


def boundaries(sched: list, slots: list, k: int, free: int, block: int) -> Tuple[int, list, list]:
    """A decode-only run of up to ``k`` steps (to the earliest finish) across block boundaries.

    Returns ``(k, steps, reqs)`` for the boundaries inside the run, LAST first (popped from the
    end): ``steps[i]`` is a boundary's step ``j`` (the caller turns it into its start time, ms),
    ``reqs[i]`` the requests taking a block at step ``j``, in running order. Taking a block there
    is all a new step would do (nothing waits to be admitted, nothing finishes before step ``k``),
    so the run goes on, unless the free queue (``free`` blocks) could not serve a boundary: the run
    then ends at that step (which may preempt). ``slots``: each request's free slots (tokens its
    blocks still hold, :meth:`~dynlab.kv.cache_manager.KvCacheManager.free_slots_of`); a block holds
    ``block`` tokens.
    """
    step = block // DECODE_TOKENS  # steps between a request's boundaries
    by_step: dict = {}
    for (req, _), free_slots in zip(sched, slots):
        j = free_slots // DECODE_TOKENS
        while j < k:
            lst = by_step.get(j)
            if lst is None:
                by_step[j] = [req]
            else:
                lst.append(req)
            j += step
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


def first_step_reaching(st: StepPlan, t: float, latency: LatencyModel, k: int) -> int:
    """The smallest ``j`` in ``1..k`` with ``st.start + decode_ms(j) >= t`` (ms), by bisection (``k`` when
    none before it): the step of the run ``st`` in progress at ``t``, whose end is the first boundary >= ``t``."""
    decode_ms, start, r, ctx = latency.decode_ms, st.start, st.decodes, st.context
    lo, hi = 1, k
    while lo < hi:
        mid = (lo + hi) // 2
        if start + decode_ms(r, ctx, mid) >= t:
            hi = mid
        else:
            lo = mid + 1
    return lo


def cut_run(st: StepPlan, t: float, latency: LatencyModel) -> bool:
    """Cut the bulk run ``st`` (``k > 1``, ``t < end``) at its first step boundary >= ``t`` (ms): the
    step in progress at ``t`` finishes. Returns whether it was cut (its pending block boundaries are
    then dropped: those left are at steps the next step takes blocks for)."""
    decode_ms, start, r, ctx = latency.decode_ms, st.start, st.decodes, st.context
    lo = first_step_reaching(st, t, latency, st.k)
    if lo < st.k:
        st.k = lo
        st.end = start + decode_ms(r, ctx, lo)
        st.bound_at, st.bound_reqs = [], []
        return True
    return False
