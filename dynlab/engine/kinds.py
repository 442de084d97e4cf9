"""Engine kinds: what each worker of a timed fleet is (``--engine NAME``, a plugin kind).

An engine kind (:func:`dynlab.plugins.engine_kinds`) is an :class:`EngineKind` subclass with a class attribute
``name`` and one method, :meth:`EngineKind.build`: one worker of a run from its
:class:`~dynlab.engine.serving.TimedSetup` (the configuration, the latency model, the pool size, the KV
layout). A worker exposes the step interface the fleets drive, :class:`~dynlab.engine.worker.EngineWorker`'s
(``submit``, ``start_step``, ``finish_step``, ``step_end``, ``idle``, its KV events: ``removed``, ...); a
kind that subclasses it, or wraps its parts, inherits that interface.

``vllm`` (:class:`Vllm`, the default) is vLLM 0.33's engine: :class:`~dynlab.engine.worker.EngineWorker`, or
with ``--async-scheduling`` :class:`~dynlab.engine.async_steps.AsyncEngineWorker` (vLLM's ``AsyncScheduler``:
an option of this kind, not a kind of its own). ``sglang`` (:class:`Sglang`) is SGLang 0.5.23's scheduler and
radix cache (:mod:`dynlab.engine.sglang`). The built-in plugin (``dynlab_builtins.engines``) registers both.
"""
from __future__ import annotations

__all__ = ["EngineKind", "Sglang", "Vllm", "run_latency_model"]


class EngineKind:
    """Base class of engine kinds; subclasses set ``name`` (the ``--engine`` value) and implement :meth:`build`,
    and may override :meth:`latency_defaults`."""

    name: str = ""

    def latency_defaults(self, config, hardware) -> dict:
        """The defaults this engine gives the latency model's options (typed values: its server terms,
        :mod:`dynlab.latency.overheads`) for a run of ``config`` (a :class:`~dynlab.engine.config.SimConfig`, or
        ``None``: the engine's own defaults, as ``dynlab latency --engine`` shows) on ``hardware``; an option
        the run's model does not declare is ignored, and ``--latency-opt`` wins over each. Default: ``{}``
        (the latency model's declared defaults, vLLM's)."""
        return {}

    def build(self, setup, worker_id: int, *, handoff: bool = False, decode: bool = False):
        """Worker ``worker_id`` of the run ``setup`` (a :class:`~dynlab.engine.serving.TimedSetup`: ``config``,
        ``latency``, ``capacity`` blocks, ``kv_layout``, ...). ``handoff``: a P/D fleet's prefill worker (its
        requests leave at their first token, blocks held); ``decode``: a P/D fleet's decode worker. Raises
        ``ValueError`` (one line) for a setting the kind cannot model."""
        raise NotImplementedError


class Vllm(EngineKind):
    """vLLM 0.33's v1 engine: its scheduler, KV cache manager and block pool (--async-scheduling: AsyncScheduler)."""

    name = "vllm"

    def build(self, setup, worker_id: int, *, handoff: bool = False, decode: bool = False):
        from dynlab.engine.worker import EngineWorker

        c = setup.config
        common = dict(max_num_batched_tokens=c.max_num_batched_tokens, max_num_seqs=c.max_num_seqs, bulk=setup.bulk,
                      kv_layout=setup.kv_layout, admission=c.admission, queue_policy=setup.queue_policy)
        if handoff or decode:  # a P/D pool: no CPU tier, no runs; speculation on the decode pool only
            return EngineWorker(worker_id, setup.capacity, c.block, setup.latency, handoff=handoff,
                                spec=None if handoff else setup.spec_decoding(), **common)
        worker = EngineWorker
        if c.async_scheduling:  # vLLM's AsyncScheduler (dynlab.engine.async_steps)
            from dynlab.engine.async_steps import AsyncEngineWorker as worker
        return worker(worker_id, setup.capacity, c.block, setup.latency, cpu_capacity=setup.cpu_capacity or 0,
                      load_ms_per_block=setup.load_ms_per_block, cpu_write=c.cpu_write, runs=setup.runs_of is not None,
                      spec=setup.spec_decoding(), lora=setup.lora, **common)


class Sglang(EngineKind):
    """SGLang 0.5.23: separate prefill and decode passes, new-token-ratio admission, retraction, a radix cache."""

    name = "sglang"

    def build(self, setup, worker_id: int, *, handoff: bool = False, decode: bool = False):
        from dynlab.engine.sglang.defaults import sglang_worker

        return sglang_worker(setup, worker_id, handoff, decode)

    def latency_defaults(self, config, hardware) -> dict:
        """SGLang's server terms (:func:`dynlab.engine.sglang.defaults.server_terms`)."""
        from dynlab.engine.sglang.defaults import server_terms

        return server_terms(config, hardware)


def run_latency_model(config, hardware):
    """The latency model of a run of ``config`` on ``hardware``: ``config.latency_model`` with
    ``config.latency_opts`` over its engine kind's :meth:`~EngineKind.latency_defaults`. Raises ``ValueError`` as
    :func:`dynlab.latency.grid.build_latency_model` and for an unknown engine kind."""
    from dynlab.latency.grid import build_latency_model, engine_defaults
    from dynlab.plugins import UnknownNameError

    try:
        defaults = engine_defaults(config.engine_kind, config, hardware)
    except UnknownNameError as exc:
        raise ValueError(str(exc)) from None
    return build_latency_model(config.latency_model, hardware, config.latency_opts, defaults=defaults)
