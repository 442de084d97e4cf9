"""How a worker spreads a model over its GPUs: tensor, expert, pipeline and attention-data parallelism.

A worker (one serving engine) runs on ``gpus = tp * dp * pp`` GPUs (vLLM's layout):

- ``tp``: attention heads, dense MLPs and (without ``ep``) each expert split over ``tp`` GPUs;
- ``ep``: the routed experts divided among ``ep`` GPUs, whole (vLLM's ``enable_expert_parallel``:
  the expert-parallel group is the ``tp * dp`` GPUs of a stage, so ``ep`` is ``tp``, or ``tp * dp`` with
  ``dp_attention``);
- ``dp_attention``: attention data-parallel, as DeepSeek-style deployments run: ``dp = ep / tp``
  attention replicas, each with its own requests and KV, sharing the ``ep`` expert GPUs;
- ``pp``: the layers cut into ``pp`` consecutive stages (the embedding and ``lm_head`` spread with
  them, an even split assumed).

Memory per GPU: ``(weights - experts) / (tp * pp) + experts / (ep * pp)`` bytes (``ep = 1``: experts
split like the rest, ``/ (tp * pp)``); KV per token and GPU ``kv_bytes_per_token / pp / min(tp,
kv_heads)`` (an MLA latent is replicated over ``tp``); the pool of a worker is ``dp`` times one
replica's. The refusals (:func:`check_parallelism`) name which degree does not divide what.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Parallelism:
    """Degrees of one worker: ``tp``, ``ep``, ``pp`` (positive integers) and ``dp_attention``."""

    tp: int = 1
    ep: int = 1
    pp: int = 1
    dp_attention: bool = False

    @property
    def dp(self) -> int:
        """Attention replicas per stage: ``ep / tp`` with ``dp_attention``, else 1."""
        return self.ep // self.tp if self.dp_attention else 1

    @property
    def gpus(self) -> int:
        """GPUs of one worker: ``tp * dp * pp``."""
        return self.tp * self.dp * self.pp

    @property
    def plain(self) -> bool:
        """Tensor parallelism only (``ep = pp = 1``): the capacity and latency formulas of a TP worker."""
        return self.ep == 1 and self.pp == 1 and not self.dp_attention

    def describe(self) -> str:
        """``"tp 2"``, ``"tp 2 x ep 8 (dp-attention 4) x pp 2"``: the degrees that are not 1."""
        text = f"tp {self.tp}"
        if self.ep > 1:
            text += f" x ep {self.ep}" + (f" (dp-attention {self.dp})" if self.dp_attention else "")
        if self.pp > 1:
            text += f" x pp {self.pp}"
        return text


def check_parallelism(model, par: Parallelism) -> None:
    """Raise ``ValueError`` (one line, naming the degree and what it does not divide) when ``par`` cannot
    serve ``model`` (a :class:`~dynlab.models.spec.ModelSpec`): ``tp`` not splitting the heads (vLLM's
    rule: query heads split evenly, KV heads split or replicate evenly), ``ep`` on a model without experts or not
    dividing its experts, ``ep`` other than ``tp`` without ``dp_attention`` (or not a multiple of it with),
    ``dp_attention`` without ``ep``, ``pp`` not dividing the layers."""
    for name in ("tp", "ep", "pp"):
        value = getattr(par, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if model.heads % par.tp or (model.attention != "mla" and model.kv_heads % par.tp and par.tp % model.kv_heads):
        raise ValueError(f"--tp {par.tp} cannot split {model.name}'s {model.heads} attention heads and "
                         f"{model.kv_heads} KV heads evenly (vLLM requires it)")
    if par.ep > 1 and not model.experts:
        raise ValueError(f"--ep {par.ep}: {model.name} has no experts to divide")
    if par.ep > 1 and model.experts % par.ep:
        raise ValueError(f"--ep {par.ep} does not divide {model.name}'s {model.experts} experts")
    if par.dp_attention and par.ep == 1:
        raise ValueError("--dp-attention needs --ep > 1 (attention replicas share the expert-parallel GPUs)")
    if par.dp_attention and par.ep % par.tp:
        raise ValueError(f"--ep {par.ep} is not a multiple of --tp {par.tp} (with --dp-attention, "
                         "ep = tp x attention replicas)")
    if par.ep > 1 and not par.dp_attention and par.ep != par.tp:
        raise ValueError(f"--ep {par.ep} must equal --tp {par.tp}: experts are divided over the worker's "
                         "tensor-parallel GPUs (or add --dp-attention for ep = tp x replicas)")
    layers = model.num_layers or model.layers
    if layers % par.pp:
        raise ValueError(f"--pp {par.pp} does not divide {model.name}'s {layers} layers")
