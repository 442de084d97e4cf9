"""The step-latency interface: how long one engine step takes for its batch.

A :class:`LatencyModel` is a plugin kind (hook ``dynlab_register_latency_models``),
chosen with ``--latency-model NAME`` and configured with ``--latency-opt NAME=VALUE``.
The engine (``dynlab.engine``) asks it for the duration of every step, and for the
total duration of a run of consecutive decode-only steps (bulk decode).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

# StrategyOption (dynlab.routing.strategy) is reused for declared
# options: name, type, default, help, min, max. Build a model by name with dynlab.latency.grid.build_latency_model.


@dataclass(frozen=True, slots=True)
class StepBatch:
    """One engine step's work (tokens; contexts in tokens).

    - ``prefill_tokens[i]``: prompt tokens computed in this step for prefilling request i (its chunk).
    - ``prefill_context[i]``: tokens of request i already in the KV cache before this chunk
      (prefix-cache hits plus earlier chunks); same length as ``prefill_tokens``.
    - ``decode_requests``: requests generating one token in this step.
    - ``decode_context``: sum over those requests of their context length (prompt + tokens generated so far).
    """

    prefill_tokens: tuple = ()
    prefill_context: tuple = ()
    decode_requests: int = 0
    decode_context: int = 0


@dataclass(frozen=True)
class Hardware:
    """What a latency model may read: the served model, the GPU, the worker's parallelism.

    ``model``: a ``ModelSpec`` (name, parameters, layers, heads, head_dim, dtype bytes,
    kv bytes per token, experts, KV groups, the raw HF config; :mod:`dynlab.models.spec`); ``gpu``: a
    ``GpuSpec`` (name, memory GB, dense bf16/fp8/fp4 TFLOP/s, HBM GB/s, link, source;
    :mod:`dynlab.models.gpus`); ``tp``: tensor-parallel GPUs; ``ep``, ``pp``, ``dp_attention``: expert
    and pipeline parallelism, attention data parallelism (:mod:`dynlab.models.parallel`).
    """

    model: Any
    gpu: Any
    tp: int = 1
    ep: int = 1
    pp: int = 1
    dp_attention: bool = False

    @property
    def parallel(self):
        """The worker's :class:`dynlab.models.parallel.Parallelism`."""
        from dynlab.models.parallel import Parallelism

        return Parallelism(self.tp, self.ep, self.pp, self.dp_attention)


class LatencyModel(ABC):
    """Base class of step-latency models. The first docstring line is shown by ``dynlab plugins``.

    Subclasses set ``name`` and ``options`` and implement :meth:`step_ms`. Construction
    gets the :class:`Hardware` and the converted option values (defaults filled in);
    raise ``ValueError`` with one line for an unsupported model/GPU/option combination.
    """

    name: ClassVar[str] = ""
    options: ClassVar[Sequence[Any]] = ()

    def __init__(self, hardware: Hardware, options: Mapping[str, Any]):
        self.hardware = hardware
        self.opts = dict(options)

    @abstractmethod
    def step_ms(self, batch: StepBatch) -> float:
        """Duration of one step in ms (> 0, finite), non-decreasing in every batch field."""

    def decode_ms(self, requests: int, context: int, steps: int) -> float:
        """Total ms of ``steps`` consecutive decode-only steps of ``requests`` requests.

        ``context`` is the summed context at the first step; it grows by ``requests``
        each step. Default: the sum of :meth:`step_ms`; models override with a closed form.
        """
        total = 0.0
        for k in range(steps):
            total += self.step_ms(StepBatch((), (), requests, context + k * requests))
        return total

    def drafter_ms(self, method: str, k: int, decodes: int, context: int) -> float | None:
        """The speculative drafter's time (ms) in a step: ``k`` draft tokens (``--spec-tokens``) proposed by
        ``method`` (``--spec-method``) for each of ``decodes`` decoding requests of summed context
        ``context`` tokens. ``None`` (the default): the model has no drafter term of its own and the
        engine prices the drafter by dynlab's rule (:func:`dynlab.engine.spec.drafter_ms`)."""
        return None

    def lockstep_step_ms(self, batches: Sequence[StepBatch]) -> float | None:
        """One step (ms) of a worker whose attention-DP ranks (``--dp-attention``) run ``batches`` (one per rank
        that has work, in rank order) in lockstep, when this is the worker's model (``Hardware.dp_attention``):
        each rank's attention and other per-rank layers on its own batch, the expert layers on every rank's
        tokens (one all-to-all dispatch over the expert GPUs: SGLang's DP attention, vLLM's DP + EP). ``None``
        (the default): the model does not separate the two; :mod:`dynlab.engine.lockstep` then ends the step
        with its slowest rank's own step."""
        return None

    def domain(self) -> str | None:
        """``None`` when this model answers within what it was fitted or measured on for its
        :class:`Hardware`, else one line saying how the hardware lies outside it (shown on stderr and as
        a run's ``latency_domain``). Default: ``None`` (a model that declares no domain)."""
        return None

    def describe_hardware(self) -> dict:
        """The keys a run adds about its hardware: ``ep``, ``pp``, ``dp_attention``, ``kv_cache_dtype`` when
        not their defaults, and ``latency_domain`` (:meth:`domain`) when the model answers outside it."""
        hw, out = self.hardware, {}
        if hw.ep != 1:
            out["ep"] = hw.ep
        if hw.pp != 1:
            out["pp"] = hw.pp
        if hw.dp_attention:
            out["dp_attention"] = True
        kv_dtype = getattr(hw.model, "kv_cache_dtype", "auto")
        if kv_dtype != "auto":
            out["kv_cache_dtype"] = kv_dtype
        domain = self.domain()
        if domain is not None:
            out["latency_domain"] = domain
        return out

    def decode_ms_at(self, requests: int, context: int, steps: Sequence[int]) -> list[float]:
        """``[decode_ms(requests, context, j) for j in steps]``: the same floats, each ms from the first
        step's start to the start of step ``j`` (a bulk decode run's block boundaries and its end).
        Models override it to share the work that does not depend on ``j``."""
        decode_ms = self.decode_ms
        return [decode_ms(requests, context, j) for j in steps]
