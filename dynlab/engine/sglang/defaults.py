"""The SGLang options' defaults as sglang 0.5.23 resolves them, and one worker built from a run's setup.

- ``--chunked-prefill-size`` (``None``: by the GPU's memory, ``arg_groups/memory_hook.py``
  ``_handle_gpu_memory_settings``): 2,048 below 20 GiB, 4,096 below 60 GiB, 8,192 below 160 GiB, else
  16,384; ``-1`` turns chunking off.
- ``--max-running-requests`` (``None``: ``mem_cache/kv_cache_configurator.py`` ``resolve_max_num_reqs``):
  ``min(max(min(int(pool tokens / context length x 512), 4096), 2048), pool tokens // 2)``, the context
  length being the model's ``max_position_embeddings`` (2,048 requests when its config has none); a
  value given is capped at ``pool tokens // 2`` too.
- ``--max-prefill-tokens`` 16,384, ``--schedule-policy`` fcfs, ``--page-size`` 1, ``--schedule-conservativeness``
  1.0 (``arg_groups/fields/schedule.py``); ``--init-new-token-ratio`` 0.7 and ``--new-token-ratio-decay-steps``
  600 (``environ.py``: ``SGLANG_INIT_NEW_TOKEN_RATIO``, ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``).
- ``--mem-fraction-static`` (``None``: the pool vLLM's rule gives at ``--gpu-memory-utilization``'s default,
  0.9): the share of GPU memory for weights and KV pool, sizing the pool as ``--gpu-memory-utilization``
  does for vLLM (:func:`dynlab.models.capacity.kv_blocks`). SGLang's own default derives it from the GPU's
  memory less an activation and CUDA-graph estimate (``memory_hook.py``), which dynlab does not model.

Its server terms, the latency model's defaults on an SGLang engine (:func:`server_terms`; why each:
:mod:`dynlab.latency.overheads`): no step CPU time (the overlap scheduler hides it), SGLang's CUDA-graph rule
(``cuda_graphs=sglang``), the decode graph's largest batch ``cuda_graph_max`` by the GPU's memory and tp
(``handle_gpu_memory_settings``, :func:`cuda_graph_max_bs_default`; capped at ``--max-running-requests`` when
given) and the prefill graph's largest pass ``cuda_graph_prefill_max`` in tokens: the chunk
(``--chunked-prefill-size`` as resolved above), at most 8,192 for an MLA model (SGLang's ``use_mla_backend``
cap) and 4,096 for a Llama-2 one, 0 (no graph: an empty capture list) with chunking off.
"""
from __future__ import annotations

from typing import Optional

__all__ = ["chunked_prefill_default", "cuda_graph_max_bs_default", "max_running_default", "server_terms",
           "sglang_worker", "describe"]

GIB_MIB = 1024


def chunked_prefill_default(gpu_memory_gib: float) -> int:
    """``_handle_gpu_memory_settings``' chunk for a GPU of ``gpu_memory_gib`` GiB (SGLang compares MiB)."""
    mib = gpu_memory_gib * GIB_MIB
    for below, chunk in ((20, 2048), (35, 4096), (60, 4096), (90, 8192), (160, 8192)):
        if mib < below * GIB_MIB:
            return chunk
    return 16384


def cuda_graph_max_bs_default(gpu_memory_gib: float, tp: int) -> int:
    """``handle_gpu_memory_settings``' decode CUDA-graph batch for a GPU of ``gpu_memory_gib`` GiB at ``tp`` GPUs:
    8 below 20 GiB; below 35, 48 (160 at tp >= 4); below 60, 32 (160); below 160, 256 (512); else 512."""
    mib = gpu_memory_gib * GIB_MIB
    for below, small, large in ((20, 8, 8), (35, 48, 160), (60, 32, 160), (90, 256, 512), (160, 256, 512)):
        if mib < below * GIB_MIB:
            return small if tp < 4 else large
    return 512


def server_terms(config, hardware) -> dict:
    """The latency options' defaults of an SGLang engine on ``hardware`` (the module docstring): ``config`` (a
    ``SimConfig``, or ``None`` for SGLang's own defaults) gives ``--chunked-prefill-size`` and
    ``--max-running-requests`` when set."""
    from dynlab.latency.overheads import SGLANG

    chunk = None if config is None else config.chunked_prefill_size
    if chunk is None:
        chunk = chunked_prefill_default(hardware.gpu.memory_gb)
    prefill = 0 if chunk == -1 else chunk
    if hardware.model.attention == "mla":
        prefill = min(prefill, 8192)
    if "llama-2" in hardware.model.name.lower():
        prefill = min(prefill, 4096)
    decode = cuda_graph_max_bs_default(hardware.gpu.memory_gb, hardware.tp)
    given = None if config is None else config.max_running_requests
    if given is not None:
        decode = min(decode, given)
    return {"cpu_step_us": 0.0, "cpu_us_per_request": 0.0, "cuda_graphs": SGLANG, "cuda_graph_max": decode,
            "cuda_graph_prefill_max": prefill}


def max_running_default(pool_tokens: int, context_len: Optional[int], given: Optional[int] = None) -> int:
    """``resolve_max_num_reqs`` for a pool of ``pool_tokens`` tokens (see the module docstring)."""
    if given is not None:
        return max(1, min(given, pool_tokens // 2))
    estimated = int(pool_tokens / context_len * 512) if context_len else 2048
    return max(1, min(max(min(estimated, 4096), 2048), pool_tokens // 2))


def resolved(setup) -> dict:
    """The worker options of ``setup`` (a :class:`~dynlab.engine.serving.TimedSetup`), defaults resolved."""
    c = setup.config
    chunk = c.chunked_prefill_size
    if chunk is None:
        chunk = chunked_prefill_default(setup.latency.hardware.gpu.memory_gb)
    if chunk != -1 and chunk % c.page_size:
        raise ValueError(f"--chunked-prefill-size {chunk} must be a multiple of --page-size {c.page_size} (SGLang's rule)")
    context = setup.latency.hardware.model.config.get("max_position_embeddings")
    return dict(max_running_requests=max_running_default(setup.capacity * c.block, context, c.max_running_requests),
                chunked_prefill_size=None if chunk == -1 else chunk, max_prefill_tokens=c.max_prefill_tokens,
                schedule_policy=c.schedule_policy, page_size=c.page_size, disable_radix_cache=c.disable_radix_cache,
                enable_mixed_chunk=c.enable_mixed_chunk, init_new_token_ratio=c.init_new_token_ratio,
                schedule_conservativeness=c.schedule_conservativeness,
                new_token_ratio_decay_steps=c.new_token_ratio_decay_steps)


def sglang_worker(setup, worker_id: int, handoff: bool = False, decode: bool = False):
    """Worker ``worker_id`` of ``setup``: an :class:`~dynlab.engine.sglang.worker.SglangWorker`. Raises
    ``ValueError`` (one line) for what this first version does not model: a P/D role, a CPU tier, KV cache groups."""
    from dynlab.engine.sglang.worker import SglangWorker

    if handoff or decode:
        raise ValueError("--engine sglang: dynlab does not model SGLang's P/D disaggregation yet (no --split P:D)")
    if setup.kv_layout is not None:
        raise ValueError("--engine sglang: models with window, chunked or state layers (KV cache groups) are not "
                         "modelled for SGLang; use a model whose layers all keep every token")
    c = setup.config
    return SglangWorker(worker_id, setup.capacity, c.block, setup.latency, seed=c.seed, **resolved(setup))


def describe(setup) -> dict:
    """The keys a run adds to say how its SGLang workers were set (the resolved defaults among them)."""
    opts = resolved(setup)
    return {f"sglang_{k}": v for k, v in opts.items()}
