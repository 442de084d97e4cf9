"""Attention data-parallel ranks in lockstep (``--dp-attention``): :class:`LockstepFleet`.

A worker of ``dp`` attention-DP ranks (:mod:`dynlab.models.parallel`) is ``dp`` engines, each with its own
scheduler, KV pool and prefix cache (:meth:`dynlab.engine.serving.TimedSetup.engines`); rank ``r`` of worker
``w`` is the fleet's engine and routing target ``w * dp + r``. The ranks share the worker's expert layers,
whose all-to-all dispatch and combine join every rank's forward pass, so the ranks step together:

- a worker's step starts when none of its ranks is in a step, and starts every rank that has work then
  (a rank whose request arrives mid-step waits for the next one);
- each rank's batch is priced alone by the run's latency model (the engines' model is built for one rank,
  :func:`dynlab.engine.serving.build_engines`), and every rank of the step ends together
  (:meth:`~dynlab.engine.worker.EngineWorker.hold_until`): a rank with less work, or none, waits at the expert
  layers' collectives, as an idle rank runs an empty batch to join them;
- the step's length: when the worker's latency model separates attention from the expert layers
  (:meth:`~dynlab.latency.base.LatencyModel.lockstep_step_ms`; the roofline does), the step of the ranks'
  batches as one: the busiest rank's attention on its own batch plus the expert layers on the tokens of every
  rank (the MoE layers are one all-to-all over all of them), and at least each rank's own step; otherwise
  (a model that does not separate them) the slowest rank's own step.

Sources: SGLang's DP attention (``python/sglang/srt/managers/scheduler_dp_attn_mixin.py``,
``prepare_mlp_sync_batch_raw``: every DP rank gathers the others' batch sizes before each forward pass, and
an idle rank runs an idle batch so that the MoE collectives match); vLLM's data-parallel engine cores (``vllm/v1/engine/core.py``,
``DPEngineCoreProc``: each rank has its own scheduler and KV cache, the ranks of an MoE model step in
lockstep and an idle one runs a dummy batch, ``execute_dummy_batch``).

A rank's KV events carry its rank (``dp_rank``, :mod:`dynlab.routing.events`), as vLLM's and SGLang's do
(ai-dynamo/dynamo PR #3597); their ``worker`` is the routing target, which the router indexes.

Sources of the composition: SGLang's DP attention (``python/sglang/srt/layers/dp_attention.py``: the ranks'
hidden states are gathered for the MoE layers and scattered back) and DeepEP-style dispatch (each rank's tokens
sent to the expert GPUs of the whole EP group); vLLM's DP + EP (``vllm/model_executor/layers/fused_moe``: the
all-to-all of every DP rank's tokens).

Not modelled: bulk decode runs (a lockstep worker runs one step at a time: the same results, more events).
"""
from __future__ import annotations

from dataclasses import replace

from dynlab.engine.config import SimConfig
from dynlab.engine.loop import STEP_START
from dynlab.engine.timed import TimedFleet
from dynlab.latency.base import LatencyModel


class _Priced:
    """A rank's latency model that keeps the last :class:`~dynlab.latency.base.StepBatch` it priced (``batch``);
    every other attribute is the model's."""

    __slots__ = ("model", "batch")

    def __init__(self, model):
        self.model = model
        self.batch = None

    def step_ms(self, batch) -> float:
        self.batch = batch
        return self.model.step_ms(batch)

    def __getattr__(self, name):
        return getattr(self.model, name)


class LockstepFleet(TimedFleet):
    """A :class:`~dynlab.engine.timed.TimedFleet` whose engines are ``dp`` consecutive ranks per worker, stepping
    in lockstep (module docstring). ``dp``: ranks per worker (>= 2); every other argument is TimedFleet's."""

    def __init__(self, *args, dp: int, worker_latency=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.dp = dp
        #: the worker's latency model (``Hardware.dp_attention``): composes a step from the ranks' batches
        self.worker_latency = worker_latency
        if worker_latency is not None and type(worker_latency).lockstep_step_ms is not LatencyModel.lockstep_step_ms:
            for engine in self.engines:
                engine.latency = _Priced(engine.latency)  # keeps the batch each rank's step was priced on

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
        if started:
            end = self._step_end(started)
            for r in started:
                if engines[r].step_end != end:
                    engines[r].hold_until(end)
                    self._schedule_end(r, end)  # supersedes the end scheduled at its own step's end

    def _step_end(self, started: list) -> float:
        """The end (ms) of the worker's step that ``started`` (its ranks with work) began now: the slowest rank's
        own end, or later the worker model's lockstep step of their batches (module docstring)."""
        engines = self.engines
        end = max(engines[r].step_end for r in started)
        if isinstance(engines[started[0]].latency, _Priced):
            composed = self.worker_latency.lockstep_step_ms([engines[r].latency.batch for r in started])
            if composed is not None:
                end = max(end, self.loop.now + composed)
        return end

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
    from dynlab.engine.kinds import run_latency_model

    return run_latency_model(config, replace(hardware, dp_attention=False))


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
