"""The served model as latency models and the capacity rule read it: a bundled config (``dynlab/data/models/NAME.json``, fields copied from
each model's public Hugging Face ``config.json``) or any ``config.json``: a path, or a model directory
holding one. The parameter count is computed from the config (:func:`param_count`) and pinned by
tests against the published sizes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from dynlab.models import config as cfg
from dynlab.models.kv import kv_shape_from_config
from dynlab.models.params import _get, param_count, param_parts
from dynlab.models.quant import expert_weight_bytes, quant_scheme, quantization_of, weight_bytes

DEFAULT_MODEL = "llama-3.1-8b"
"""The default served model of the latency models and the engine."""


@dataclass(frozen=True)
class ModelSpec:
    """A served model's shape as latency models and the capacity rule need it.

    ``params``/``active_params``: total / per-token parameters (:func:`param_count`);
    ``weight_bytes_per_param``: 1 for an fp8 ``quantization_config``, else the ``torch_dtype`` size;
    ``dtype_bytes``: activation and KV element size (``torch_dtype``); ``head_dim``/``v_head_dim``:
    query-key and value head sizes (MLA: ``qk_nope + qk_rope`` and ``v_head_dim``);
    ``kv_bytes_per_token``: :func:`dynlab.models.kv.kv_bytes_per_token_from_config` (the attention
    layers, each token at full length; ``layers`` counts those layers, ``num_layers`` all of them);
    ``kv_groups``: the :class:`~dynlab.models.layout.KvGroup` of each layer kind; ``quantization``
    (``""``, ``fp8``, ``mxfp4``, ``nvfp4``) and ``quantized_weight_bytes`` / ``expert_weight_bytes``
    (bytes, :mod:`dynlab.models.quant`); ``experts`` routed experts per MoE layer, ``experts_per_tok``,
    ``expert_params`` (one expert's parameters), ``moe_layers``; ``kv_cache_dtype`` (``auto``/``fp8``).
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
    kv_groups: tuple = ()
    quantization: str = ""
    quantized_weight_bytes: int = 0
    experts: int = 0
    experts_per_tok: int = 0
    expert_params: int = 0
    moe_layers: int = 0
    kv_cache_dtype: str = "auto"
    expert_weight_bytes: int = 0
    num_layers: int = 0

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights, every expert resident (:func:`dynlab.models.quant.weight_bytes`)."""
        return self.quantized_weight_bytes or self.params * self.weight_bytes_per_param

    @property
    def uniform_kv(self) -> bool:
        """Whether every layer keeps every token's KV (no window, chunk or state layers)."""
        return len(self.kv_groups) <= 1 and all(g.kind in ("full", "mla") for g in self.kv_groups)

    def resident_kv_bytes(self, tokens: int) -> int:
        """Bytes of KV (and state) one request of ``tokens`` tokens keeps, over all layers and GPUs: the
        global layers' ``tokens``, a window layer's window, a state layer's state (what a P/D connector sends)."""
        if self.uniform_kv:
            return tokens * self.kv_bytes_per_token
        return sum(g.resident_bytes(tokens) for g in self.kv_groups)

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
                "weight_bytes_per_param": self.weight_bytes_per_param, "kv_bytes_per_token": self.kv_bytes_per_token,
                **self._extra_dict()}

    def _extra_dict(self) -> dict:
        out = {}
        if self.quantization:
            out.update(quantization=self.quantization, weight_bytes=self.weight_bytes)
        if self.experts:
            out.update(experts=self.experts, experts_per_tok=self.experts_per_tok, moe_layers=self.moe_layers)
        if not self.uniform_kv:
            out["layer_groups"] = {g.kind: g.as_dict() for g in self.kv_groups}
        if self.kv_cache_dtype != "auto":
            out["kv_cache_dtype"] = self.kv_cache_dtype
        return out


KV_CACHE_DTYPES = {"auto": None, "fp8": 1}
"""``--kv-cache-dtype`` (vLLM's ``kv_cache_dtype``): ``auto`` keeps the model's dtype, ``fp8`` stores
one byte per element (``fp8_e4m3``/``fp8_e5m2`` alike; MLA at a uniform byte, not vLLM's 656-byte
``fp8_ds_mla`` entry)."""


def model_spec_from_config(config: Mapping, name: str = "config", source: str | None = None,
                           kv_cache_dtype: str = "auto") -> ModelSpec:
    """A :class:`ModelSpec` named ``name`` from a ``config.json`` mapping, its KV at ``kv_cache_dtype``
    (:data:`KV_CACHE_DTYPES`).

    Raises :class:`dynlab.models.config.ModelConfigError` (one line) on a bad config, starting ``SOURCE:``
    (``source``, default ``name``: the file the user gave, or the bundled model's name); ``ValueError``
    for an unknown ``kv_cache_dtype``.
    """
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    source = name if source is None else source
    shape = kv_shape_from_config(config, KV_CACHE_DTYPES[kv_cache_dtype], source=source)
    parts = param_parts(config, source)
    params, active = param_count(config, source)
    c = cfg.text_config_of(config)
    heads = _get(c, "num_attention_heads", source)
    if shape.attention == "mla":
        head_dim = _get(c, "qk_nope_head_dim", source) + _get(c, "qk_rope_head_dim", source)
        v_head_dim = _get(c, "v_head_dim", source)
        kv_heads = heads
    else:
        head_dim = v_head_dim = shape.head_dim
        kv_heads = shape.kv_heads
    dtype = cfg.dtype_from_config(c, config, None, source)
    scheme = quant_scheme(quantization_of(config, c), source)
    moe = parts["moe"] or {}
    return ModelSpec(name=name, params=params, active_params=active, layers=shape.layers,
                     hidden_size=_get(c, "hidden_size", source), heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim, v_head_dim=v_head_dim, attention=shape.attention,
                     dtype_bytes=dtype, weight_bytes_per_param=1 if scheme == "fp8" else dtype,
                     kv_bytes_per_token=shape.bytes_per_token, config=dict(config), kv_groups=shape.groups,
                     quantization=scheme, quantized_weight_bytes=weight_bytes(parts, scheme, dtype),
                     experts=moe.get("experts", 0), experts_per_tok=moe.get("per_tok", 0),
                     expert_params=moe.get("expert", 0), moe_layers=moe.get("moe_layers", 0),
                     kv_cache_dtype=kv_cache_dtype, expert_weight_bytes=expert_weight_bytes(parts, scheme, dtype),
                     num_layers=_get(c, "num_hidden_layers", source))


def model_names() -> list[str]:
    """The bundled model names."""
    return cfg.bundled_models()


def model_spec(name_or_path: str, kv_cache_dtype: str = "auto") -> ModelSpec:
    """A bundled model by name (its KV at ``kv_cache_dtype``, :data:`KV_CACHE_DTYPES`), else the ``config.json`` at a path, or in a directory (a Hugging Face
    download: ``Qwen3-8B/`` reads ``Qwen3-8B/config.json``; :func:`dynlab.models.config.config_file`).

    A bundled name wins over a folder of the same name (``./qwen3-8b`` reads the folder). Anything else
    containing ``/``, ending ``.json`` or naming an existing file or directory is a path. Its model is
    named after its folder (``models/Qwen3-8B/config.json`` and ``models/Qwen3-8B/`` -> ``Qwen3-8B``),
    else the path as given (``config.json``, ``./config.json``, ``llama.json``). Errors in the file name
    the file read, as given (``Qwen3-8B/config.json: ...``).

    Raises ``ValueError`` listing the bundled models for an unknown name;
    :class:`dynlab.errors.InputFileError` starting ``PATH:`` for a file that cannot be opened or a
    directory with no ``config.json`` (a usage error, exit 2 in the CLI);
    :class:`dynlab.models.config.ModelConfigError` starting ``PATH:`` for a file that holds a bad config
    (not JSON, a missing or bad field: a bad input file, exit 1).
    """
    names = model_names()
    if name_or_path in names:
        return model_spec_from_config(cfg.load_model_config(name_or_path), name_or_path, kv_cache_dtype=kv_cache_dtype)
    if os.sep in name_or_path or name_or_path.endswith(".json") or os.path.lexists(name_or_path):
        path = cfg.config_file(name_or_path)
        config = cfg.read_model_config(path)
        name = name_or_path
        if os.path.basename(path) == "config.json":
            folder = os.path.basename(os.path.dirname(os.path.normpath(path)))
            if folder not in ("", ".", ".."):
                name = folder
        return model_spec_from_config(config, name, source=path, kv_cache_dtype=kv_cache_dtype)
    raise ValueError(f"unknown model {name_or_path!r}; bundled models: {', '.join(names)} "
                     "(or a config.json, or a directory holding one)")
