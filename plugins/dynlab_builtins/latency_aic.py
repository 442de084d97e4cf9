"""The ``aiconfigurator`` latency model: NVIDIA aiconfigurator-core's forward-pass estimator.

Needs the optional extra ``pip install "dynlab[aiconfigurator]"`` (PyPI ``aiconfigurator-core``,
Apache-2.0, Python 3.11+); the package is imported only when the model is constructed, so
registering it costs nothing and choosing it without the extra is a one-line error.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import warnings

from dynlab.latency.base import LatencyModel, StepBatch
from dynlab.routing.strategy import StrategyOption

INSTALL_HINT = 'the aiconfigurator latency model needs aiconfigurator-core: pip install "dynlab[aiconfigurator]"'

# dynlab's bundled model names -> the Hugging Face ids aiconfigurator-core ships configs for.
# llama-3-8b has the same shapes as Llama-3.1-8B (they differ in RoPE scaling and training only).
HF_IDS = {
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
    "llama-3-8b": "meta-llama/Meta-Llama-3.1-8B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    # the bundled models aiconfigurator-core 0.12.0's vLLM support matrix passes on h100_sxm / h200_sxm
    "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "llama-4-scout": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "llama-4-maverick": "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
}
# dynlab's GPU names -> aiconfigurator's system names
SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "a100-80gb": "a100_sxm", "l40s": "l40s", "b200": "b200_sxm",
           "b300": "b300_sxm", "gb200": "gb200", "h100-pcie": "h100_pcie", "a100-80gb-pcie": "a100_pcie", "l4": "l4"}


@contextlib.contextmanager
def _quiet():
    """Silence aiconfigurator's logging, Python warnings and anything written to fds 1 and 2."""
    logging.getLogger("aiconfigurator_core").setLevel(logging.CRITICAL + 1)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = []
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            saved.append((fd, os.dup(fd)))
            os.dup2(devnull, fd)
        os.close(devnull)
    except OSError:  # no real file descriptors (an embedding host): logging is still silenced
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


class AIConfigurator(LatencyModel):
    """aiconfigurator: NVIDIA's per-op database of measured kernels (needs dynlab[aiconfigurator]).

    Wraps aiconfigurator-core's ``RustForwardPassPerfModel.from_native`` (``sdk.rust_engine_step``):
    one step becomes one forward-pass metrics record, ``num_prefill_requests`` = prefill chunks,
    ``sum_prefill_tokens``, ``sum_prefill_kv_tokens`` = their cached context, ``num_decode_requests``,
    ``sum_decode_kv_tokens`` = the decodes' summed context, and its estimate in ms is returned.
    The estimator sees only these sums (not each request's length). An empty step, which it
    prices at 0, costs the cheaper of one decode at context 1 and a one-token prefill.
    **Not monotone**: its step time can fall when the batch grows (one more cached token, one
    more decode, or a short extra chunk that lowers the batch's mean prefix: up to -35% in random
    mixed batches for llama-3.1-8b on h100), so it breaks the interface's non-decreasing promise.
    ``backend``: ``vllm``, ``sglang`` or ``trtllm`` (its database version: the latest shipped for
    the GPU, or ``backend_version``); ``tp`` is the worker's ``--tp``, ``--pp`` its ``pp_size``, ``--ep`` its
    ``moe_ep_size`` (experts whole; otherwise ``moe_tp_size = tp``) and ``--dp-attention`` its
    ``attention_dp_size`` (``ep / tp``). Results are kept in an LRU
    cache of 2^16 steps (a query costs tens of µs, a repeated one a few µs). Its logging is
    silenced, and construction runs with stdout and stderr sent to /dev/null.
    """

    name = "aiconfigurator"
    options = (
        StrategyOption("backend", str, "vllm", "serving framework whose kernels are modelled: vllm, sglang, trtllm"),
        StrategyOption("backend_version", str, "", "database version of the backend [default: the latest shipped]"),
    )

    def __init__(self, hardware, options):
        super().__init__(hardware, options)
        backend = self.opts["backend"]
        if backend not in ("vllm", "sglang", "trtllm"):
            raise ValueError(f"aiconfigurator: backend must be vllm, sglang or trtllm, got {backend!r}")
        try:
            import aiconfigurator_core  # noqa: F401
        except ImportError:
            raise ValueError(INSTALL_HINT) from None
        model, gpu = hardware.model, hardware.gpu
        if model.name not in HF_IDS:
            raise ValueError(f"aiconfigurator: no aiconfigurator model for {model.name!r}; "
                             f"known: {', '.join(HF_IDS)}")
        if gpu.name not in SYSTEMS:
            raise ValueError(f"aiconfigurator: no aiconfigurator system for {gpu.name!r}; known: {', '.join(SYSTEMS)}")
        system = SYSTEMS[gpu.name]
        with _quiet():
            from aiconfigurator_core.sdk.perf_database import get_latest_database_version
            from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel

            version = self.opts["backend_version"] or get_latest_database_version(system, backend)
            config = {"schema_version": 1, "model_name": HF_IDS[model.name], "system_name": system,
                      "backend": backend, "backend_version": version, "tp_size": hardware.tp, "pp_size": 1}
            if hardware.pp != 1:
                config["pp_size"] = hardware.pp
            if model.active_params != model.params and hardware.ep > 1:  # experts whole, divided over ep GPUs
                config.update(moe_tp_size=1, moe_ep_size=hardware.ep)
                if hardware.dp_attention:
                    config["attention_dp_size"] = hardware.ep // hardware.tp
            elif model.active_params != model.params:  # MoE: experts split over the same GPUs (tensor parallel)
                config.update(moe_tp_size=hardware.tp, moe_ep_size=1)
            error = None
            if not version:
                error = f"no {backend} database for {system}"
            else:
                try:
                    self._aic = RustForwardPassPerfModel.from_native(config)
                except Exception as exc:  # the estimator's own errors are plain Exceptions
                    error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if error is not None:
            raise ValueError(f"aiconfigurator: {model.name} on {hardware.tp} x {gpu.name} ({backend}): {error}")
        self.config = config
        self._query = functools.lru_cache(maxsize=1 << 16)(self._estimate)
        self._floor = min(self._estimate(0, 0, 0, 1, 1), self._estimate(1, 1, 0, 0, 0))

    def _estimate(self, n_prefill: int, prefill_tokens: int, prefill_kv: int, decodes: int, decode_kv: int) -> float:
        record = {"scheduled_requests": {
            "num_prefill_requests": n_prefill, "sum_prefill_tokens": prefill_tokens,
            "sum_prefill_kv_tokens": prefill_kv, "num_decode_requests": decodes, "sum_decode_kv_tokens": decode_kv}}
        value = self._aic.estimate_forward_pass_time_ms(record)
        if value is None:
            raise ValueError(f"aiconfigurator: no estimate for {record['scheduled_requests']}")
        return float(value)

    def step_ms(self, batch: StepBatch) -> float:
        tokens = sum(batch.prefill_tokens)
        if tokens == 0 and batch.decode_requests == 0:
            return self._floor
        n_prefill = sum(1 for t in batch.prefill_tokens if t > 0)
        kv = sum(c for t, c in zip(batch.prefill_tokens, batch.prefill_context) if t > 0)
        return self._query(n_prefill, tokens, kv, batch.decode_requests,
                           batch.decode_context if batch.decode_requests else 0)
