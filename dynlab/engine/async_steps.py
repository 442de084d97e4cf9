"""Async scheduling: vLLM 0.33.0's ``AsyncScheduler`` as ``EngineCore.step_with_batch_queue`` runs it (queue of 2).

With async scheduling (vLLM's default on GPUs, ``SchedulerConfig.async_scheduling``) the engine
schedules step ``n + 1`` before the output of step ``n`` comes back, so the CPU prepares the next
batch while the GPU runs. In simulated time (the harness's ``benchmarks/vllm_side.py`` drives vLLM
itself this way) that gives these rules, all times in ms:

- **Decided one step ahead.** The step that starts when step ``n`` ends was scheduled when step
  ``n`` started: with the requests that had arrived by then, the blocks free then, and step ``n``'s
  tokens counted as computed (vLLM's ``_update_after_schedule`` advances ``num_computed_tokens`` at
  schedule time). A request arriving during step ``n - 1`` therefore joins step ``n + 1``, not step
  ``n``: about one step later than the synchronous scheduler (the harness measured +2.3 to 5 ms of
  mean TTFT with dynlab's default linear coefficients). Its ``first_scheduled_ms`` is the start of the step
  it joins.
- **Output placeholders.** A request whose step samples a token carries an output placeholder
  (``num_output_placeholders``) until that step's output is applied, so it decodes again in the
  step scheduled meanwhile, on the placeholder. A request whose last token is in flight is not
  scheduled again (``AsyncScheduler``'s ``num_computed_tokens + 2 - num_output_placeholders >=
  num_prompt_tokens + max_tokens`` check); it keeps its place and its blocks until the output
  finishes it, one step later than it would be freed under the synchronous scheduler.
- **Outputs at the step's end.** A step's tokens (first tokens, finishes: TTFT, E2E) are emitted
  at its end, as without async scheduling; the blocks of a finished request are freed then.
- **Empty look-ahead.** When the step scheduled ahead is empty (every running request's last
  token is in flight), the next decision waits for the step in progress to end and then schedules
  two steps at once, the first starting at once (vLLM's loop dequeues the empty batch at once).
  An idle engine woken by an arrival also schedules two steps at once.
- **Preemption in flight.** A request preempted while its step is in flight still receives that
  step's token (vLLM delivers "stale" output, ``num_stale_output_tokens``); when it is its last
  token the request finishes from the waiting queue. The blocks named when it frees them are those
  vLLM has hashed by then: a block completed by a token that was a placeholder when its step was
  scheduled is named only at the request's next schedule (:attr:`EngineRequest.safe`).

**Bulk decode under async scheduling** (``bulk=True`` and a driver that crosses block boundaries,
:attr:`~dynlab.engine.worker.EngineWorker.cross_boundaries`; the same results as one step at a time,
up to float rounding as the synchronous bulk run). When the step scheduled ahead, ``S(n+1)``,
decodes every running request (no admission, no preemption), the steps after it repeat it until
something changes, so it becomes a run of ``k`` steps ``S(n+1) .. S(n+k)`` (:func:`plan_run`):

- ``k`` is at most one more than the tokens each request still has to sample, so that no request's
  last token is sampled before ``S(n+k)`` (a request whose last token is in flight leaves the batch of
  the step scheduled next) and no output applied inside the run finishes one;
- the steps inside the run are scheduled (virtually) at the starts of their predecessors, ``S(n+1+i)``
  at ``t(n+i)``: the block a request needs for ``S(n+1+i)`` is taken at ``t(n+i)``, one step earlier
  than under the synchronous scheduler. Those are the run's block boundaries, crossed by the driver
  as the synchronous run's (:func:`~dynlab.engine.bulk.boundaries` with the slots shifted by one
  step); with a request waiting, the run ends before its first boundary, and a boundary the free
  queue cannot serve ends the run (its step is then really scheduled, and may preempt);
- the step after the run, ``S(n+k+1)``, is really scheduled at the start of the run's last step,
  ``t(n+k)``: a last, request-less "boundary" of the run (the look-ahead), where the requests' state is
  advanced in closed form (:func:`advance`) to what the ``k - 1`` virtual schedules and outputs leave;
- an arrival at ``t`` in ``(t(n+i-1), t(n+i)]`` is seen by the schedule at ``t(n+i)``: the run is cut
  to ``S(n+1) .. S(n+i)`` (:func:`cut_async_run`), its look-ahead moved to ``t(n+i)``; an arrival before
  the run starts cuts it to its first step. A run never names a block (it ends before a step that
  would register a name).

Not modelled (refused by :func:`check`): speculative decoding, a CPU tier, disaggregated
prefill/decode, KV cache groups. The blocks of a trace's ``output_tokens`` are named when their step
is scheduled (vLLM names them one step later, when their token ids are known).
"""
from __future__ import annotations

from typing import Optional

from dynlab.engine.bulk import StepPlan, StepResult, add_busy, boundaries, first_step_reaching, plan_step
from dynlab.engine.request import DECODE_TOKENS
from dynlab.engine.worker import EngineWorker
from dynlab.latency.base import StepBatch

__all__ = ["AsyncEngineWorker", "advance", "after_schedule", "apply_output", "check", "check_config",
           "cut_async_run", "plan_run"]

#: the ``bound_reqs`` entry of a run's look-ahead (the real schedule of the step after it)
LOOK_AHEAD = None


def check(spec=None, cpu_capacity: int = 0, handoff: bool = False, kv_layout=None) -> None:
    """Raise ``ValueError`` (one line) for what async scheduling does not model: speculative decoding
    (``spec``), a CPU tier (``cpu_capacity`` > 0), a P/D worker (``handoff``, and decode workers), KV
    cache groups (``kv_layout``, a model with window, chunked or state layers: not checked against vLLM)."""
    for on, what in ((spec is not None, "speculative decoding"), (cpu_capacity, "a CPU tier"),
                     (handoff, "disaggregated prefill/decode"),
                     (kv_layout is not None, "KV cache groups (a model with window, chunked or state layers)")):
        if on:
            raise ValueError(f"--async-scheduling is not modelled with {what} (docs/engine.md, Async scheduling)")


def check_config(config) -> None:
    """:func:`check` of a :class:`~dynlab.engine.config.SimConfig` with ``async_scheduling``."""
    cpu = bool(config.cpu_capacity) or bool(config.cpu_memory_gb)
    check(config.spec_method if config.spec_tokens else None, cpu, config.pd() is not None)


def after_schedule(sched: list) -> list:
    """vLLM's ``_update_after_schedule`` for the ``(request, tokens)`` pairs of a step just scheduled:
    ``computed`` advanced by the tokens; a request reaching its ``num_tokens`` samples a token: one
    more in flight (``pending``) and, unless it is its last, an output placeholder (``num_tokens + 1``).
    Records ``safe`` (tokens whose full blocks vLLM has hashed: the computed ones whose token ids are
    known, :meth:`Scheduler.preempt`). Returns the sampling requests, in schedule order."""
    sampling = []
    for req, n in sched:
        before = req.computed
        after = before + n
        known = req.input_length + req.generated  # token ids known now (the in-flight ones are not)
        req.safe = after if after <= known else (known if known > before else before)
        req.inflight += 1
        req.computed = after
        if after >= req.num_tokens:
            req.pending += 1
            sampling.append(req)
            if req.generated + req.pending < req.output_length:
                req.num_tokens += 1  # the placeholder: it decodes again in the step scheduled next
    return sampling


def apply_output(scheduler, st: StepPlan, end: float) -> tuple:
    """vLLM's ``update_from_output`` of the step ``st`` at its ``end`` (ms): each sampling request's
    token emitted (first tokens, finishes; a finished request's blocks freed, or, preempted meanwhile,
    the request leaves the waiting queue). Returns ``(first_tokens, finished)``, ``[(request, end)]``."""
    first_tokens, finished = [], []
    for req, _ in st.sched:
        req.inflight -= 1
    for req in st.sampling:
        req.pending -= 1
        req.generated += 1
        if req.generated == 1:
            req.first_token_ms = end
            first_tokens.append((req, end))
        if req.generated >= req.output_length:
            req.num_tokens += 1  # its last token had no placeholder
            req.finish_ms = end
            finished.append((req, end))
            if req.keys:
                scheduler.kv.free(req)
            else:  # preempted while this step ran: its stale output finishes it in the waiting queue
                scheduler.waiting.remove(req)
    if finished:
        scheduler.running = [r for r in scheduler.running if r.finish_ms is None]
    return first_tokens, finished


def plan_run(st: StepPlan, running: int, waiting: bool, kv, latency) -> None:
    """Make the step ``st`` just scheduled ahead (after :func:`after_schedule`) a run of ``k`` decode steps
    when it decodes every one of the ``running`` requests (no admission, no preemption): the module
    docstring's **Bulk decode under async scheduling**. ``waiting``: a request waits (the run then ends
    before its first block boundary, as nothing in the pool may change); ``kv``: the pool (free slots,
    free queue, block size); ``latency``: the step-time model. Sets ``k``, ``end`` (ms), ``bound_at`` /
    ``bound_reqs`` (LAST first, the look-ahead at ``t(n+k)`` first, :data:`LOOK_AHEAD`); ``k == 1``: no change."""
    sched = st.sched
    if st.prefill_tokens or st.preempted or st.decodes != len(sched) or len(sched) != running:
        return
    B = kv.block
    k = min(r.output_length - r.generated - r.pending for r, _ in sched) // DECODE_TOKENS + 1
    for r, _ in sched:  # no schedule inside the run registers a name (a trace-named reply, a resumed output)
        if r.nreg < r.n_names:
            k = min(k, (r.nreg + 1) * B - r.computed)
    if k < 2:
        return
    # S(n+1+i) needs computed + i tokens, its block taken at t(n+i): boundaries' step j = i
    slots = [len(r.keys) * B - r.computed + DECODE_TOKENS for r, _ in sched]
    steps, reqs = [], []
    if waiting:
        k = min(k, min(slots) // DECODE_TOKENS)
    else:
        k, steps, reqs = boundaries(sched, slots, k, kv.num_free, B)
    if k < 2:
        return
    start = st.start
    at = latency.decode_ms_at(st.decodes, st.context, [k - 1] + [j - 1 for j in steps] + [k])
    st.k, st.end = k, start + at.pop()
    st.bound_at = [start + ms for ms in at]
    st.bound_reqs = [LOOK_AHEAD] + reqs


def advance(st: StepPlan) -> None:
    """The requests of the run ``st`` (``k`` steps) at its look-ahead ``t(n+k)``: the ``k - 1`` schedules
    (``S(n+2) .. S(n+k)``) and outputs (``S(n+1) .. S(n+k-1)``) that :func:`after_schedule` and
    :func:`apply_output` would have made one step at a time, in closed form: ``computed`` and ``generated``
    up by ``k - 1``, ``pending`` and ``inflight`` unchanged, the placeholder and ``safe`` of ``S(n+k)``."""
    n = (st.k - 1) * DECODE_TOKENS
    for r, _ in st.sched:
        r.computed += n
        r.generated += n
        after = r.computed
        known = r.input_length + r.generated - DECODE_TOKENS  # token ids known when S(n+k) was scheduled
        before = after - DECODE_TOKENS
        r.safe = after if after <= known else (known if known > before else before)
        r.num_tokens = after + (DECODE_TOKENS if r.generated + r.pending < r.output_length else 0)


def cut_async_run(st: StepPlan, t: float, latency, started: bool) -> bool:
    """Cut the run ``st`` for an arrival at ``t`` (ms), seen by the first schedule at or after ``t``: before
    the run starts (``started`` false) it becomes its first step; in progress, with ``t`` in
    ``(t(n+i-1), t(n+i)]``, the run ``S(n+1) .. S(n+i)``, its look-ahead at ``t(n+i)`` (the boundaries after
    ``t`` dropped: the caller crossed those before it). Returns whether it was cut."""
    k, start = st.k, st.start
    if not started:
        st.k, st.bound_at, st.bound_reqs = 1, [], []
        st.end = start + latency.step_ms(StepBatch((), (), st.decodes, st.context))
        return True
    r, ctx = st.decodes, st.context
    lo = first_step_reaching(st, t, latency, k)  # smallest m with t(n+1+m) >= t
    if lo + 1 >= k:
        return False
    at = latency.decode_ms_at(r, ctx, [lo, lo + 1])
    st.k, st.end = lo + 1, start + at[1]
    st.bound_at, st.bound_reqs = [start + at[0]], [LOOK_AHEAD]
    return True


class AsyncEngineWorker(EngineWorker):
    """An :class:`~dynlab.engine.worker.EngineWorker` under async scheduling (the module docstring): the
    same arguments and calls; ``bulk`` (default on) makes runs of decode steps when the driver crosses
    block boundaries (:attr:`cross_boundaries`; a run's look-ahead is its last boundary, request-less).
    :attr:`ahead`: the step (or run) scheduled to start when the one in progress ends (``None``: none, it
    is empty, or the run in progress has not reached its look-ahead). Raises ``ValueError``
    (:func:`check`) with ``spec``, a CPU tier, ``handoff`` or ``kv_layout``, and as :class:`EngineWorker` does."""

    def __init__(self, worker_id: int, capacity: int, block: int, latency, **kw):
        check(kw.get("spec"), kw.get("cpu_capacity", 0), kw.get("handoff", False), kw.get("kv_layout"))
        super().__init__(worker_id, capacity, block, latency, **kw)
        self.ahead: Optional[StepPlan] = None
        self._removed, self._runs = (), ()  # what the schedules at one time evicted (names, runs)

    def receive(self, req, now: float, prefix_cache: bool = False) -> None:
        raise RuntimeError("async scheduling does not model a decode worker of a P/D fleet")

    def _plan(self, now: float, start: float, run: bool = True) -> Optional[StepPlan]:
        """Schedule, at ``now`` (ms), the step that starts at ``start`` (``run``: or a run, :func:`plan_run`);
        ``None`` when it is empty."""
        sch, kv = self.scheduler, self.kv
        kv.begin_step(now)
        sched, preempted, admitted = sch.schedule(start)
        sched = [p for p in sched if p[1]]  # a request whose last token is in flight is not scheduled
        if not sched:
            removed, runs = kv.removed()
            self._removed += removed
            if runs:
                self._runs += runs
            return None
        st = plan_step(sched, preempted, admitted, start, self.latency, kv, False, len(sch.running), False)
        st.stored, st.stored_runs, st.removed, runs, st.used = kv.step_events()
        self._removed += st.removed
        if runs:
            self._runs += runs
        st.sampling = after_schedule(sched)
        if run and self.bulk and self.cross_boundaries:
            plan_run(st, len(sch.running), bool(sch.waiting), kv, self.latency)
        return st

    def start_step(self, now: float) -> Optional[float]:
        """:meth:`EngineWorker.start_step` under async scheduling: the step scheduled ahead starts at
        ``now`` (or, with none, one is scheduled now), and the one after it is scheduled now."""
        if self._step is not None:
            raise RuntimeError("a step is already in progress")
        self.cpu_stored = self.cpu_removed = ()
        sch = self.scheduler
        self._removed, self._runs = (), ()
        self._busy_from = self.kv.used_block_ms(now)  # mean_kv_usage_busy, as EngineWorker.start_step
        cur, self.ahead = self.ahead, None
        if cur is None:
            if not (sch.running or sch.waiting):
                self.removed, self.removed_runs = (), None
                return None
            cur = self._plan(now, now, False)
            if cur is None:
                raise RuntimeError(f"worker {self.worker_id}: nothing schedulable although requests wait (bug)")
        elif cur.k == 1:  # scheduled when the step before it started, to start at its end: now
            cur.end, cur.start = now + (cur.end - cur.start), now
        if cur.k == 1:
            self.ahead = self._plan(now, cur.end)
        self.removed = self._removed
        self.removed_runs = self._runs if self.runs else None
        self._step = cur
        self.next_boundary = cur.bound_at[-1] if cur.bound_at else None  # a run: its look-ahead last
        return cur.end

    # -- a run's boundaries, look-ahead and cuts ------------------------------------------------
    def _cross_next(self, st: StepPlan, n: int) -> int:
        """:meth:`EngineWorker._cross_next`, the run's look-ahead (its last boundary, :data:`LOOK_AHEAD`)
        included: there the requests are advanced (:func:`advance`) and the step after the run is
        scheduled (:attr:`ahead`); what that evicts follows the boundaries' names in :attr:`removed`."""
        look = n == len(st.bound_at) and st.bound_reqs[0] is LOOK_AHEAD
        if not look:
            return super()._cross_next(st, n)
        evicting = super()._cross_next(st, n - 1) if n > 1 else 0
        removed, runs = (self.removed, self.removed_runs or ()) if n > 1 else ((), ())
        t = st.bound_at.pop()
        st.bound_reqs.pop()
        self.next_boundary = None
        advance(st)
        self._removed, self._runs = (), ()
        self.ahead = self._plan(t, st.end)
        self.removed = removed + self._removed
        self.removed_runs = runs + self._runs if self.runs else None
        return evicting + (1 if self._removed else 0)

    def submit(self, req, now: float) -> bool:
        """:meth:`EngineWorker.submit` under async scheduling: the boundaries and look-ahead of the run in
        progress before ``now`` crossed first (without ``req``), then the run in progress, or the one
        scheduled ahead, cut (:func:`cut_async_run`): re-read :attr:`step_end` and :attr:`next_boundary`."""
        st = self._step
        if st is not None and st.bound_at and st.bound_at[-1] < now:
            self._catch_up(st, now)
        if not super().submit(req, now):  # (a run in progress: interrupt)
            return False
        ahead = self.ahead
        if ahead is not None and ahead.k > 1:
            cut_async_run(ahead, now, self.latency, False)
        return True

    def interrupt(self, t: float) -> float:
        """Cut the run in progress for an arrival at ``t`` (ms) (:func:`cut_async_run`); returns the step end (ms)."""
        st = self._step
        if st is None:
            raise RuntimeError("no step in progress")
        if st.k > 1 and t < st.end:
            self._catch_up(st, t)
            if cut_async_run(st, t, self.latency, True):
                self.next_boundary = st.bound_at[-1]
        return st.end

    def finish_step(self) -> StepResult:
        """:meth:`EngineWorker.finish_step` under async scheduling: the step's output at its end."""
        st = self._step
        if st is None:
            raise RuntimeError("no step in progress")
        if st.bound_at:  # a run: its boundaries and look-ahead, if the driver has not crossed them
            self._catch_up(st, st.end)
        self._step = self.next_boundary = None
        end = add_busy(self, st)
        first_tokens, finished = apply_output(self.scheduler, st, end)
        self.steps += st.k
        return StepResult(st.start, end, st.k, st.stored, st.removed, first_tokens, finished, st.preempted,
                          len(st.sched), st.prefill_tokens, st.decodes, st.used, [], stored_runs=st.stored_runs)
