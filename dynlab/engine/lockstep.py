"""Attention data-parallel ranks in lockstep (``--dp-attention``): :class:`LockstepFleet`.

A worker of ``dp`` attention-DP ranks (:mod:`dynlab.models.parallel`) is ``dp`` engines, each with its own
scheduler, KV pool and prefix cache (:meth:`dynlab.engine.serving.TimedSetup.engines`); rank ``r`` of worker
``w`` is the fleet's engine and routing target ``w * dp + r``. The ranks share the worker's expert layers,
whose all-to-all dispatch and combine join every rank's forward pass, so the ranks step together:

- a worker's step starts when none of its ranks is in a step, and starts every rank that has work then
  (a rank whose request arrives mid-step waits for the next one);
- each rank's batch is priced alone by the run's latency model (its own attention on its own tokens: the
  engines' model is built for one rank, :func:`dynlab.engine.serving.build_engines`), and every rank of the
  step ends with the slowest one (:meth:`~dynlab.engine.worker.EngineWorker.hold_until`): a rank with less
  work, or none, waits at the expert layers' collectives, as an idle rank runs an empty batch to join them.

Sources: SGLang's DP attention (``python/sglang/srt/managers/scheduler_dp_attn_mixin.py``,
``prepare_mlp_sync_batch_raw``: every DP rank gathers the others' batch sizes before each forward pass, and
an idle rank runs an idle batch so that the MoE collectives match); vLLM's data-parallel engine cores (``vllm/v1/engine/core.py``,
``DPEngineCoreProc``: each rank has its own scheduler and KV cache, the ranks of an MoE model step in
lockstep and an idle one runs a dummy batch, ``execute_dummy_batch``).

A rank's KV events carry its rank (``dp_rank``, :mod:`dynlab.routing.events`), as vLLM's and SGLang's do
(ai-dynamo/dynamo PR #3597); their ``worker`` is the routing target, which the router indexes.

Not modelled: the expert layers' extra work for the other ranks' tokens (a rank's expert time is priced on its
own tokens); bulk decode runs (a lockstep worker runs one step at a time: the same results, more events).
"""
from __future__ import annotations

from dataclasses import replace

from dynlab.engine.config import SimConfig
from dynlab.engine.loop import STEP_START
from dynlab.engine.timed import TimedFleet


class LockstepFleet(TimedFleet):
    """A :class:`~dynlab.engine.timed.TimedFleet` whose engines are ``dp`` consecutive ranks per worker, stepping
    in lockstep (module docstring). ``dp``: ranks per worker (>= 2); every other argument is TimedFleet's."""

    def __init__(self, *args, dp: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.dp = dp

    def _group(self, w: int) -> range:
        """The engines of target ``w``'s worker: its ``dp`` ranks."""
        first = w - w % self.dp
        return range(first, first + self.dp)

    def _on_start(self, w: int) -> None:
        engines = self.engines
        group = self._group(w)
        if any(engines[r].step_end is not None for r in group):
            return  # the worker's step is in progress: its end starts the next one
        started = []
        for r in group:
            super()._on_start(r)  # starts rank r if it has work, its end scheduled at its own step's end
            if engines[r].step_end is not None:
                started.append(r)
        if len(started) > 1:
            end = max(engines[r].step_end for r in started)
            for r in started:
                if engines[r].step_end != end:
                    engines[r].hold_until(end)
                    self._schedule_end(r, end)  # supersedes the end scheduled at its own step's end

    def _publish(self, w: int, gpu_event, cpu_removed: tuple, cpu_stored: tuple) -> None:
        """:meth:`StepDriver._publish <dynlab.engine.steps.StepDriver._publish>` with the rank (``w % dp``) on the
        event (the only publishing path of a lockstep fleet: no CPU tier, no bulk runs' boundaries)."""
        if gpu_event is not None:
            gpu_event = replace(gpu_event, dp_rank=w % self.dp)
        super()._publish(w, gpu_event, cpu_removed, cpu_stored)

    def _on_end(self, w: int, generation: int) -> None:
        if generation != self.generation[w]:
            return  # superseded (held to the group's end)
        super()._on_end(w, generation)  # a rank with work left asks for the next step
        if self.engines[w].idle and any(not self.engines[r].idle for r in self._group(w)):
            self.loop.at(self.loop.now, STEP_START, self._on_start, w)


def rank_latency(config: SimConfig, hardware):
    """The latency model of one attention-DP rank of ``hardware``: the run's model on the same GPUs and degrees
    without ``dp_attention`` (each rank's batch is priced alone; :mod:`dynlab.engine.lockstep` composes the
    worker's step), so a dp-aware model (the roofline's busiest-replica split) does not split it again."""
    from dynlab.latency.grid import build_latency_model

    return build_latency_model(config.latency_model, replace(hardware, dp_attention=False), config.latency_opts)


def dp_rank_of(target: int, dp: int) -> tuple[int, int]:
    """``(worker, rank)`` of routing target ``target`` in a fleet of ``dp`` attention-DP ranks per worker:
    ``divmod(target, dp)``. The ranks of a worker are consecutive targets, as Dynamo keys its router's
    workers by ``(worker_id, dp_rank)`` (its KV events carry ``dp_rank``: ai-dynamo/dynamo PR #3597)."""
    return divmod(target, dp)


def check_dp_ranks(config: SimConfig) -> None:
    """Raise the one-line ``ValueError`` for what attention-DP ranks (``--dp-attention``) are not modelled
    with: a P/D split, a controller (workers joining and leaving), async scheduling (its look-ahead steps
    in lockstep) and a CPU tier (each its own rank layout to decide; refused rather than run as one pool
    per worker)."""
    what = ("a P/D split" if config.pd() is not None else "--controller" if config.controller != "none"
            else "--async-scheduling" if config.async_scheduling
            else "a CPU tier (--cpu-capacity, --cpu-memory-gb)"
            if config.cpu_capacity is not None or config.cpu_memory_gb is not None else None)
    if what is not None:
        raise ValueError(f"--dp-attention with {what} is not modelled (attention-DP ranks, each with its own KV "
                         "pool, are modelled in an aggregated fleet without a CPU tier, controller or async scheduling)")
