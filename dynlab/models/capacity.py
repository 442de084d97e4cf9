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
"""
from __future__ import annotations

import math

from dynlab.models.gpus import DEFAULT_GPU, GIB, GpuSpec, gpu_spec
from dynlab.models.spec import DEFAULT_MODEL, ModelSpec, model_spec


def kv_blocks(model: ModelSpec | str = DEFAULT_MODEL, gpu: GpuSpec | str = DEFAULT_GPU, block: int = 16,
              tp: int = 1, gpu_memory_utilization: float = 0.9) -> tuple[int, str]:
    """KV-cache blocks of ``block`` tokens a worker of ``tp`` GPUs holds, and a one-line derivation.

    ``floor((memory_per_gpu * utilization - weight_bytes / tp) / (kv_bytes_per_token_per_gpu * block))``
    (the rule in the module docstring). Raises ``ValueError`` when the weights do not fit or an
    argument is out of range.
    """
    model = model_spec(model) if isinstance(model, str) else model
    gpu = gpu_spec(gpu) if isinstance(gpu, str) else gpu
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    if not (0 < gpu_memory_utilization <= 1):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    usable = gpu.memory_bytes * gpu_memory_utilization
    weights = model.weight_bytes / tp
    free = usable - weights
    if free <= 0:
        raise ValueError(
            f"{model.name} does not fit on {tp} x {gpu.name}: {weights / GIB:.1f} GiB of weights per GPU, "
            f"{usable / GIB:.1f} GiB usable")
    per_token = model.kv_bytes_per_token_per_gpu(tp)
    blocks = math.floor(free / (per_token * block))
    # the weights in bytes, exactly, so that the line can be worked by hand (in GiB only for reading)
    why = (f"floor(({gpu.memory_gb} GiB x {gpu_memory_utilization} - {model.weight_bytes:,.0f} B "
           f"({model.weight_bytes / GIB:.2f} GiB) weights / {tp}) / ({per_token:g} B/token/GPU x {block})) "
           f"= {blocks} blocks of {block} tokens "
           f"({blocks * block:,} tokens) per worker of {tp} x {gpu.name}")
    return blocks, why
