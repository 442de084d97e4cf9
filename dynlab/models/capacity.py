"""KV-cache capacity of a worker: blocks that fit beside the weights.

Capacity (:func:`kv_blocks`), per GPU of a worker of ``tp`` GPUs::

    blocks = floor((memory * utilization - weight_bytes / tp) / (kv_bytes_per_token_per_gpu * block))

``memory`` is the datasheet capacity read as GiB (an "80 GB" H100 reports 81,559 MiB to CUDA, so
the datasheet figure is binary); weights split evenly over the ``tp`` GPUs; KV heads split over
them too (``kv_bytes_per_token / min(tp, kv_heads)``: with more GPUs than KV heads, heads are
replicated), while an MLA latent is replicated on every GPU (vLLM). A block spans all ``tp`` GPUs,
so the per-GPU count is the worker's count. When ``tp`` divides the KV heads this is exactly
``floor((memory * tp * utilization - weight_bytes) / (kv_bytes_per_token * block))``. Activations,
CUDA graphs and the allocator's slack are not subtracted (vLLM profiles them), so this is an upper bound.

A draft model (``--spec-method draft --spec-model``, ``draft`` below) is loaded on the same GPUs before the
pool is sized (vLLM: ``GPUModelRunner.load_model`` loads the drafter, then ``Worker.determine_available_memory``
profiles what is left), sharded by the same ``tp``; its layers get KV in the same block table, so a block
holds the target's and the draft's KV::

    blocks = floor((memory * utilization - (weight_bytes + draft_weight_bytes) / tp)
                   / ((kv_bytes_per_token_per_gpu + draft_kv_bytes_per_token_per_gpu) * block))

(EAGLE/MTP heads: dynlab has no figure for their weights, so they subtract nothing.)
"""
from __future__ import annotations

import math

from dynlab.models.gpus import DEFAULT_GPU, GIB, GpuSpec, gpu_spec
from dynlab.models.parallel import Parallelism, check_parallelism
from dynlab.models.spec import DEFAULT_MODEL, ModelSpec, model_spec


def kv_blocks(model: ModelSpec | str = DEFAULT_MODEL, gpu: GpuSpec | str = DEFAULT_GPU, block: int = 16,
              tp: int = 1, gpu_memory_utilization: float = 0.9, parallel: Parallelism | None = None,
              draft: ModelSpec | None = None) -> tuple[int, str]:
    """KV-cache blocks of ``block`` tokens a worker of ``tp`` GPUs holds, and a one-line derivation.

    ``floor((memory_per_gpu * utilization - weight_bytes / tp) / (kv_bytes_per_token_per_gpu * block))``
    (the rule in the module docstring). With a ``parallel`` layout other than tensor parallelism alone
    (``ep``, ``pp``, ``dp_attention``; its ``tp`` replaces ``tp``), :func:`kv_blocks_parallel`. Raises
    ``ValueError`` when the weights do not fit or an argument is out of range. ``draft``: a draft model's
    ``ModelSpec`` on the same GPUs (module docstring: its weights and KV per token are added; plain ``tp`` only).
    """
    if draft is not None and parallel is not None and not parallel.plain:
        raise ValueError(f"--spec-model: dynlab sizes a draft model beside the target with --tp only (not {parallel.describe()})")
    if parallel is not None and not parallel.plain:
        return kv_blocks_parallel(model, gpu, block, parallel, gpu_memory_utilization)
    if parallel is not None:
        tp = parallel.tp
    model = model_spec(model) if isinstance(model, str) else model
    gpu = gpu_spec(gpu) if isinstance(gpu, str) else gpu
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    if not (0 < gpu_memory_utilization <= 1):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    usable = gpu.memory_bytes * gpu_memory_utilization
    total = model.weight_bytes + (draft.weight_bytes if draft is not None else 0)
    weights = total / tp
    free = usable - weights
    name = model.name if draft is None else f"{model.name} with draft {draft.name}"
    if free <= 0:
        raise ValueError(
            f"{name} does not fit on {tp} x {gpu.name}: {weights / GIB:.1f} GiB of weights per GPU, "
            f"{usable / GIB:.1f} GiB usable")
    per_token = model.kv_bytes_per_token_per_gpu(tp)
    if draft is not None:
        per_token += draft.kv_bytes_per_token_per_gpu(tp)
    blocks = math.floor(free / (per_token * block))
    # the weights in bytes, exactly, so that the line can be worked by hand (in GiB only for reading)
    why = (f"floor(({gpu.memory_gb} GiB x {gpu_memory_utilization} - {_weights_text(model, draft)} / {tp}) "
           f"/ ({_kv_text(model, draft, tp)} B/token/GPU x {block})) "
           f"= {blocks} blocks of {block} tokens "
           f"({blocks * block:,} tokens) per worker of {tp} x {gpu.name}")
    return blocks, why


def _weights_text(model: ModelSpec, draft: ModelSpec | None) -> str:
    """The weights term of :func:`kv_blocks`'s derivation (exact bytes; GiB for reading)."""
    if draft is None:
        return f"{model.weight_bytes:,.0f} B ({model.weight_bytes / GIB:.2f} GiB) weights"
    total = model.weight_bytes + draft.weight_bytes
    return (f"({model.weight_bytes:,.0f} B weights + {draft.weight_bytes:,.0f} B draft {draft.name} weights "
            f"= {total / GIB:.2f} GiB)")


def _kv_text(model: ModelSpec, draft: ModelSpec | None, tp: int) -> str:
    """The KV bytes per token per GPU of :func:`kv_blocks`'s derivation: the target's, or ``(target + draft)``."""
    if draft is None:
        return f"{model.kv_bytes_per_token_per_gpu(tp):g}"
    return f"({model.kv_bytes_per_token_per_gpu(tp):g} + {draft.kv_bytes_per_token_per_gpu(tp):g} draft)"


def kv_blocks_parallel(model: ModelSpec | str, gpu: GpuSpec | str, block: int, parallel: Parallelism,
                       gpu_memory_utilization: float = 0.9) -> tuple[int, str]:
    """KV blocks of a worker of ``parallel.gpus`` GPUs (:mod:`dynlab.models.parallel`), and its derivation.

    Per GPU: ``usable = memory * utilization``; weights ``(W - X) / (tp * pp) + X / (e * pp)`` with ``W``
    all weight bytes, ``X`` the routed experts' (``e = ep``, or ``tp`` without expert parallelism);
    KV ``kv_bytes_per_token / pp / s`` bytes per token (``s = min(tp, kv_heads)``, 1 for MLA);
    ``blocks = dp * floor((usable - weights) / (kv per token * block))``: every GPU of a replica holds
    the same blocks (its layers' and heads' share), and the ``dp`` attention replicas each hold their own.
    Raises ``ValueError`` (:func:`~dynlab.models.parallel.check_parallelism`, or weights that do not fit).
    """
    model = model_spec(model) if isinstance(model, str) else model
    gpu = gpu_spec(gpu) if isinstance(gpu, str) else gpu
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    if not (0 < gpu_memory_utilization <= 1):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    check_parallelism(model, parallel)
    tp, pp, dp = parallel.tp, parallel.pp, parallel.dp
    experts = model.expert_weight_bytes
    spread = parallel.ep if parallel.ep > 1 else tp
    weights = (model.weight_bytes - experts) / (tp * pp) + experts / (spread * pp)
    usable = gpu.memory_bytes * gpu_memory_utilization
    free = usable - weights
    layout = parallel.describe()
    if free <= 0:
        raise ValueError(f"{model.name} does not fit on {parallel.gpus} x {gpu.name} ({layout}): "
                         f"{weights / GIB:.1f} GiB of weights per GPU, {usable / GIB:.1f} GiB usable")
    per_token = model.kv_bytes_per_token_per_gpu(tp) / pp
    blocks = dp * math.floor(free / (per_token * block))
    why = (f"{dp} x floor(({gpu.memory_gb} GiB x {gpu_memory_utilization} - ({model.weight_bytes - experts:,} B "
           f"/ ({tp} x {pp}) + {experts:,} B experts / ({spread} x {pp})) weights) / ({per_token:g} B/token/GPU "
           f"x {block})) = {blocks} blocks of {block} tokens ({blocks * block:,} tokens) per worker of "
           f"{parallel.gpus} x {gpu.name} ({layout})")
    return blocks, why
