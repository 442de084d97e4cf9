"""The hardware and model catalogue: GPU datasheet figures, model shapes and parameter counts, KV capacity.

GPUs (:data:`GPUS`, one :class:`GpuSpec` each; dense = without 2:4 sparsity, which the datasheets
quote doubled):

=========  ======  ===============  ==========  ====================================================
name       memory  bf16 TFLOP/s     HBM GB/s    source
=========  ======  ===============  ==========  ====================================================
h100       80 GB   989 (dense)      3,350       NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column
                                                 (BF16 1,979 TFLOPS "with sparsity"; HBM3 3.35 TB/s)
h200       141 GB  989 (dense)      4,800       NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column
                                                 (BF16 1,979 TFLOPS with sparsity; HBM3e 4.8 TB/s)
a100-80gb  80 GB   312 (dense)      2,039       NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM
                                                 (BF16 312 / 624 sparse TFLOPS; HBM2e 2,039 GB/s)
l40s       48 GB   362 (dense)      864         NVIDIA L40S datasheet (BF16 362.05 / 733 sparse
                                                 TFLOPS; GDDR6 864 GB/s)
b200       180 GB  2,250 (dense)    8,000       NVIDIA HGX B200 datasheet (8 GPUs: FP16/BF16 36 PFLOPS
                                                 sparse = 2.25 PFLOPS dense per GPU; 1,440 GB HBM3e =
                                                 180 GB and 8 TB/s per GPU)
=========  ======  ===============  ==========  ====================================================

Models (:func:`model_spec`): a bundled config (``dynlab/data/models/NAME.json``, fields copied from
each model's public Hugging Face ``config.json``) or any ``config.json``: a path, or a model directory
holding one. The parameter count is computed from the config (:func:`param_count`) and pinned by
tests against the published sizes.

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
import os
from dataclasses import dataclass, field
from typing import Mapping

from dynlab.disagg import cost as disagg

GIB = 2**30

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "h100"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet figures: memory (GB, read as GiB), dense bf16 TFLOP/s, HBM GB/s (10^9 B/s)."""

    name: str
    memory_gb: float
    bf16_tflops: float
    hbm_gbps: float
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GIB)

    def as_dict(self) -> dict:
        return {"memory_gb": self.memory_gb, "bf16_tflops": self.bf16_tflops, "hbm_gbps": self.hbm_gbps,
                "source": self.source}


GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("h100", 80, 989.0, 3350.0, "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM)"),
    GpuSpec("h200", 141, 989.0, 4800.0, "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)"),
    GpuSpec("a100-80gb", 80, 312.0, 2039.0, "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM)"),
    GpuSpec("l40s", 48, 362.05, 864.0, "NVIDIA L40S datasheet"),
    GpuSpec("b200", 180, 2250.0, 8000.0, "NVIDIA HGX B200 datasheet (per GPU: 1/8 of the 8-GPU board)"),
)}


def gpu_spec(name: str) -> GpuSpec:
    """The catalogue entry ``name``; ``ValueError`` listing the known GPUs otherwise."""
    try:
        return GPUS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}") from None


# --------------------------------------------------------------------------------------------
# parameter counts


class UnsupportedModelError(disagg.ModelConfigError):
    """A config whose architecture the parameter count does not cover (one line, naming why).

    A :class:`dynlab.disagg.cost.ModelConfigError`: like any bad config that opened, the CLI prints it
    and exits 1.
    """


def _get(config: Mapping, key: str, source: str, **kw) -> int:
    # the one rule for a config's integer fields, shared with the KV shape (dynlab.disagg.cost.config_int)
    return disagg.config_int(config, key, source, **kw)


def _mla_attention_params(c: Mapping, source: str) -> int:
    """DeepSeek-V2/V3 multi-head latent attention: low-rank q (or a plain q), the kv latent, up-projections, o."""
    h = _get(c, "hidden_size", source)
    heads = _get(c, "num_attention_heads", source)
    nope, rope = _get(c, "qk_nope_head_dim", source), _get(c, "qk_rope_head_dim", source)
    v = _get(c, "v_head_dim", source)
    rank = _get(c, "kv_lora_rank", source)
    q_rank = _get(c, "q_lora_rank", source, default=0, minimum=0)  # null or absent: a plain q projection
    if q_rank:
        q = h * q_rank + q_rank + q_rank * heads * (nope + rope)  # q_a_proj, q_a_layernorm, q_b_proj
    else:
        q = h * heads * (nope + rope)
    kv = h * (rank + rope) + rank + rank * heads * (nope + v)  # kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
    return q + kv + heads * v * h  # + o_proj


def param_count(config: Mapping, source: str = "config") -> tuple[int, int]:
    """``(total, active)`` parameters of the model a Hugging Face ``config.json`` describes.

    Counted: token embedding ``V*h``; per layer the attention projections (q, k, v, o, with biases
    when ``attention_bias`` is true or the model is Qwen2; Qwen3's per-head q/k RMSNorms), the MLP
    (gate, up, down: ``3*h*I``), two RMSNorms; the final norm; ``lm_head`` (``V*h``) unless
    ``tie_word_embeddings``. Mixture of experts: DeepSeek-V2/V3 (``n_routed_experts``: the first
    ``first_k_dense_replace`` layers dense, the others routed experts of ``moe_intermediate_size``
    plus shared experts and the router; multi-token-prediction layers are not counted, as in the
    published 671B) and Mixtral (``num_local_experts``). ``active`` counts only
    ``num_experts_per_tok`` routed experts per MoE layer (``== total`` for dense models).

    Fields are read as the KV shape reads them (:func:`dynlab.disagg.cost.config_int`: integers must be
    JSON integers; ``num_key_value_heads`` falls back to ``num_attention_heads``, ``head_dim`` to
    ``hidden_size / num_attention_heads``; a nested ``text_config`` is read when the top has no
    ``num_hidden_layers``).

    Raises :class:`~dynlab.disagg.cost.ModelConfigError` for a missing or bad field, and
    :class:`UnsupportedModelError` (one) for another MoE layout.
    """
    if not isinstance(config, Mapping):
        raise UnsupportedModelError(f"{source}: expected a JSON object")
    c = disagg.text_config_of(config)
    h = _get(c, "hidden_size", source)
    layers = _get(c, "num_hidden_layers", source)
    vocab = _get(c, "vocab_size", source)
    heads = _get(c, "num_attention_heads", source)
    model_type = str(c.get("model_type", ""))

    if c.get("kv_lora_rank") is not None:
        attn = _mla_attention_params(c, source)
    else:
        kv_heads = disagg.kv_heads_of(c, source)
        d = disagg.head_dim_of(c, source)
        attn = h * heads * d + 2 * h * kv_heads * d + heads * d * h
        if c.get("attention_bias") or model_type == "qwen2":
            attn += heads * d + 2 * kv_heads * d
        if model_type in ("qwen3", "qwen3_moe"):
            attn += 2 * d  # q_norm, k_norm over the head dimension
    norms = 2 * h

    moe_markers = [k for k in ("n_routed_experts", "num_local_experts", "num_experts") if c.get(k)]
    if not moe_markers:
        mlp = 3 * h * _get(c, "intermediate_size", source)
        total = active = layers * (attn + mlp + norms)
    elif moe_markers[0] == "n_routed_experts" and model_type in ("deepseek_v2", "deepseek_v3"):
        experts = _get(c, "n_routed_experts", source)
        per_tok = _get(c, "num_experts_per_tok", source)
        expert = 3 * h * _get(c, "moe_intermediate_size", source)
        shared = _get(c, "n_shared_experts", source, default=0, minimum=0) * expert
        router = experts * h + (experts if model_type == "deepseek_v3" else 0)  # + e_score_correction_bias
        dense_layers = min(_get(c, "first_k_dense_replace", source, default=0, minimum=0), layers)
        freq = _get(c, "moe_layer_freq", source, default=1)
        moe_layers = sum(1 for i in range(dense_layers, layers) if i % freq == 0)
        dense_layers = layers - moe_layers
        dense = 3 * h * _get(c, "intermediate_size", source)
        base = layers * (attn + norms) + dense_layers * dense + moe_layers * (shared + router)
        total = base + moe_layers * experts * expert
        active = base + moe_layers * per_tok * expert
    elif moe_markers[0] == "num_local_experts" and model_type == "mixtral":
        experts = _get(c, "num_local_experts", source)
        per_tok = _get(c, "num_experts_per_tok", source)
        expert = 3 * h * _get(c, "intermediate_size", source)
        base = layers * (attn + norms + experts * h)
        total = base + layers * experts * expert
        active = base + layers * per_tok * expert
    else:
        raise UnsupportedModelError(
            f"{source}: mixture-of-experts layout of model_type {model_type!r} is not supported "
            "(supported MoE: deepseek_v2, deepseek_v3, mixtral)")
    embed = vocab * h
    head = 0 if c.get("tie_word_embeddings") else vocab * h
    return total + embed + h + head, active + embed + h + head


# --------------------------------------------------------------------------------------------
# model specs


@dataclass(frozen=True)
class ModelSpec:
    """A served model's shape as latency models and the capacity rule need it.

    ``params``/``active_params``: total / per-token parameters (:func:`param_count`);
    ``weight_bytes_per_param``: 1 for an fp8 ``quantization_config``, else the ``torch_dtype`` size;
    ``dtype_bytes``: activation and KV element size (``torch_dtype``); ``head_dim``/``v_head_dim``:
    query-key and value head sizes (MLA: ``qk_nope + qk_rope`` and ``v_head_dim``);
    ``kv_bytes_per_token``: :func:`dynlab.disagg.cost.kv_bytes_per_token_from_config`.
    """

    name: str
    params: int
    active_params: int
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    attention: str
    dtype_bytes: int
    weight_bytes_per_param: int
    kv_bytes_per_token: int
    config: Mapping = field(repr=False, compare=False, default_factory=dict)

    @property
    def weight_bytes(self) -> int:
        return self.params * self.weight_bytes_per_param

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of attention for one (query token, key token) pair over all layers: QK^T and PV.

        ``2 * layers * heads * (head_dim + v_head_dim)``; ``4 * L * n_q * d`` for MHA/GQA.
        """
        return 2 * self.layers * self.heads * (self.head_dim + self.v_head_dim)

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """KV bytes one token takes on each of ``tp`` GPUs (heads split, an MLA latent replicated)."""
        if self.attention == "mla":
            return float(self.kv_bytes_per_token)
        return self.kv_bytes_per_token / min(tp, self.kv_heads)

    def as_dict(self) -> dict:
        return {"params": self.params, "active_params": self.active_params, "layers": self.layers,
                "hidden_size": self.hidden_size, "heads": self.heads, "kv_heads": self.kv_heads,
                "head_dim": self.head_dim, "attention": self.attention, "dtype_bytes": self.dtype_bytes,
                "weight_bytes_per_param": self.weight_bytes_per_param, "kv_bytes_per_token": self.kv_bytes_per_token}


def model_spec_from_config(config: Mapping, name: str = "config", source: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` named ``name`` from a ``config.json`` mapping.

    Raises :class:`dynlab.disagg.cost.ModelConfigError` (one line) on a bad config, starting ``SOURCE:``
    (``source``, default ``name``: the file the user gave, or the bundled model's name).
    """
    source = name if source is None else source
    shape = disagg.kv_shape_from_config(config, source=source)
    params, active = param_count(config, source)
    c = disagg.text_config_of(config)
    heads = _get(c, "num_attention_heads", source)
    if shape.attention == "mla":
        head_dim = _get(c, "qk_nope_head_dim", source) + _get(c, "qk_rope_head_dim", source)
        v_head_dim = _get(c, "v_head_dim", source)
        kv_heads = heads
    else:
        head_dim = v_head_dim = shape.head_dim
        kv_heads = shape.kv_heads
    quant = c.get("quantization_config") or config.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower() if isinstance(quant, Mapping) else ""
    weight_bytes = 1 if method in ("fp8", "float8") else shape.dtype_bytes
    return ModelSpec(name=name, params=params, active_params=active, layers=shape.layers,
                     hidden_size=_get(c, "hidden_size", source), heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim, v_head_dim=v_head_dim, attention=shape.attention,
                     dtype_bytes=shape.dtype_bytes, weight_bytes_per_param=weight_bytes,
                     kv_bytes_per_token=shape.bytes_per_token, config=dict(config))


def model_names() -> list[str]:
    """The bundled model names."""
    return disagg.bundled_models()


def model_spec(name_or_path: str) -> ModelSpec:
    """A bundled model by name, else the ``config.json`` at a path, or in a directory (a Hugging Face
    download: ``Qwen3-8B/`` reads ``Qwen3-8B/config.json``; :func:`dynlab.disagg.cost.config_file`).

    A bundled name wins over a folder of the same name (``./qwen3-8b`` reads the folder). Anything else
    containing ``/``, ending ``.json`` or naming an existing file or directory is a path. Its model is
    named after its folder (``models/Qwen3-8B/config.json`` and ``models/Qwen3-8B/`` -> ``Qwen3-8B``),
    else the path as given (``config.json``, ``./config.json``, ``llama.json``). Errors in the file name
    the file read, as given (``Qwen3-8B/config.json: ...``).

    Raises ``ValueError`` listing the bundled models for an unknown name;
    :class:`dynlab.errors.InputFileError` starting ``PATH:`` for a file that cannot be opened or a
    directory with no ``config.json`` (a usage error, exit 2 in the CLI);
    :class:`dynlab.disagg.cost.ModelConfigError` starting ``PATH:`` for a file that holds a bad config
    (not JSON, a missing or bad field: a bad input file, exit 1).
    """
    names = model_names()
    if name_or_path in names:
        return model_spec_from_config(disagg.load_model_config(name_or_path), name_or_path)
    if os.sep in name_or_path or name_or_path.endswith(".json") or os.path.lexists(name_or_path):
        path = disagg.config_file(name_or_path)
        config = disagg.read_model_config(path)
        name = name_or_path
        if os.path.basename(path) == "config.json":
            folder = os.path.basename(os.path.dirname(os.path.normpath(path)))
            if folder not in ("", ".", ".."):
                name = folder
        return model_spec_from_config(config, name, source=path)
    raise ValueError(f"unknown model {name_or_path!r}; bundled models: {', '.join(names)} "
                     "(or a config.json, or a directory holding one)")


# --------------------------------------------------------------------------------------------
# capacity


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
