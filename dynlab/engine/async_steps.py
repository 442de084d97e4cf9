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

Not modelled (refused by :func:`check`): speculative decoding, a CPU tier, disaggregated
prefill/decode, KV cache groups. Bulk decode runs are off (one step at a time). The blocks of a
trace's ``output_tokens`` are named when their step is scheduled (vLLM names them one step later,
when their token ids are known).
"""
from __future__ import annotations

from typing import Optional

from dynlab.engine.bulk import StepPlan, StepResult, plan_step
from dynlab.engine.worker import EngineWorker

__all__ = ["AsyncEngineWorker", "after_schedule", "apply_output", "check", "check_config"]


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


class AsyncEngineWorker(EngineWorker):
    """An :class:`~dynlab.engine.worker.EngineWorker` under async scheduling (the module docstring): the
    same arguments and calls, one step at a time (``bulk`` is off). :attr:`ahead`: the step scheduled
    to start when the one in progress ends (``None``: none, or it is empty). Raises ``ValueError``
    (:func:`check`) with ``spec``, a CPU tier, ``handoff`` or ``kv_layout``, and as :class:`EngineWorker` does."""

    def __init__(self, worker_id: int, capacity: int, block: int, latency, **kw):
        check(kw.get("spec"), kw.get("cpu_capacity", 0), kw.get("handoff", False), kw.get("kv_layout"))
        kw["bulk"] = False
        super().__init__(worker_id, capacity, block, latency, **kw)
        self.ahead: Optional[StepPlan] = None
        self._removed, self._runs = (), ()  # what the schedules at one time evicted (names, runs)

    def receive(self, req, now: float, prefix_cache: bool = False) -> None:
        raise RuntimeError("async scheduling does not model a decode worker of a P/D fleet")

    def _plan(self, now: float, start: float) -> Optional[StepPlan]:
        """Schedule, at ``now`` (ms), the step that starts at ``start``; ``None`` when it is empty."""
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
            cur = self._plan(now, now)
            if cur is None:
                raise RuntimeError(f"worker {self.worker_id}: nothing schedulable although requests wait (bug)")
        else:  # scheduled when the step before it started, to start at its end: now
            cur.end, cur.start = now + (cur.end - cur.start), now
        self.ahead = self._plan(now, cur.end)
        self.removed = self._removed
        self.removed_runs = self._runs if self.runs else None
        self._step = cur
        return cur.end

    def finish_step(self) -> StepResult:
        """:meth:`EngineWorker.finish_step` under async scheduling: the step's output at its end."""
        st = self._step
        if st is None:
            raise RuntimeError("no step in progress")
        self._step = None
        end = st.end
        self.kv.accumulate(end)
        self.busy_ms += end - st.start
        self.busy_block_ms += self.kv.used_block_ms() - self._busy_from
        first_tokens, finished = apply_output(self.scheduler, st, end)
        self.steps += 1
        return StepResult(st.start, end, 1, st.stored, st.removed, first_tokens, finished, st.preempted,
                          len(st.sched), st.prefill_tokens, st.decodes, st.used, [], stored_runs=st.stored_runs)
