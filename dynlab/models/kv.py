"""KV-cache bytes per token of a model: the MHA/GQA/MQA and MLA formulas and the shape a ``config.json`` gives.

Sizes are **bytes** per token (all layers of one model unless said otherwise).

* **MHA / GQA / MQA** (Llama, Qwen, ...): every layer stores a key and a value vector for each KV head,
  ``2 * num_hidden_layers * num_key_value_heads * head_dim * dtype_bytes`` bytes per token.
* **MLA** (multi-head latent attention, DeepSeek-V2/V3): every layer stores one compressed latent of
  ``kv_lora_rank`` elements plus the shared rotary key of ``qk_rope_head_dim`` elements, once, not as
  separate K and V: ``num_hidden_layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from dynlab.models.checks import count as _count
from dynlab.models.config import (ModelConfigError, bundled_models, config_int, dtype_from_config, head_dim_of,
                                  kv_heads_of, load_model_config, present, text_config_of)
from dynlab.models.layout import ATTENTION_KINDS, STATE_KINDS, KvGroup, kv_groups, layer_kinds

DEFAULT_MODEL = "qwen3-0.6b"
"""The bundled model whose shape is the default of :func:`kv_bytes_per_token`."""

VLLM_FP8_MLA_BYTES_PER_LAYER = 656
"""vLLM's fp8 MLA cache entry for DeepSeek-V3, per layer and token: 512 fp8 latent bytes, four
float32 scales (16 bytes) and the 64-element rotary key kept in 16 bits (128 bytes). The uniform
formula of this module gives 576 for the same shape at ``dtype_bytes=1``."""


def kv_bytes_per_token(layers: int = 28, kv_heads: int = 8, head_dim: int = 128, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token takes in a model with MHA/GQA attention.

    ``2 * layers * kv_heads * head_dim * dtype_bytes``: a key and a value vector of ``head_dim``
    elements per KV head and per layer, each element ``dtype_bytes`` bytes.

    The defaults are Qwen3-0.6B's ``config.json`` (28 layers, 8 KV heads, head size 128, bfloat16 = 2
    bytes), giving 114,688 bytes. For MLA models use :func:`mla_kv_bytes_per_token`.

    Raises ``TypeError`` for a non-integer and ``ValueError`` for a negative argument.
    """
    layers = _count("layers", layers)
    kv_heads = _count("kv_heads", kv_heads)
    head_dim = _count("head_dim", head_dim)
    dtype_bytes = _count("dtype_bytes", dtype_bytes)
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def mla_kv_bytes_per_token(layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token takes in a model with multi-head latent attention (MLA).

    ``layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes``: one compressed KV latent and one
    rotary key shared by all heads, stored once per layer (not as a separate K and V).
    DeepSeek-V3 (61 layers, rank 512, rotary 64) at bfloat16: 70,272 bytes.

    Layout assumed: every element ``dtype_bytes`` bytes, no scales. With ``dtype_bytes=1`` this gives
    576 bytes per layer for DeepSeek-V3, whereas vLLM's fp8 MLA cache stores 656 bytes per layer and
    token (:data:`VLLM_FP8_MLA_BYTES_PER_LAYER`: the rotary part stays in 16 bits and scales are
    added), so for that engine multiply ``layers`` by 656 instead.

    Raises ``TypeError`` for a non-integer and ``ValueError`` for a negative argument.
    """
    layers = _count("layers", layers)
    kv_lora_rank = _count("kv_lora_rank", kv_lora_rank)
    qk_rope_head_dim = _count("qk_rope_head_dim", qk_rope_head_dim)
    dtype_bytes = _count("dtype_bytes", dtype_bytes)
    return layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes


@dataclass(frozen=True)
class KvShape:
    """What decides a model's KV bytes per token.

    ``attention`` is ``"mha"`` (as many KV heads as attention heads), ``"gqa"``, ``"mqa"`` (one KV
    head) or ``"mla"``; MHA/GQA/MQA use ``kv_heads`` and ``head_dim``, MLA uses ``kv_lora_rank`` and
    ``qk_rope_head_dim``.
    """

    attention: str
    layers: int
    dtype_bytes: int
    kv_heads: int | None = None
    head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    groups: tuple[KvGroup, ...] = ()

    @property
    def uniform(self) -> bool:
        """Whether every layer keeps every token (one full or MLA group, no state): ``resident_bytes(T)`` is
        ``T * bytes_per_token``."""
        return len(self.groups) <= 1 and all(g.kind in ("full", "mla") for g in self.groups)

    def resident_bytes(self, tokens: int) -> int:
        """Bytes a request of ``tokens`` tokens keeps in the KV cache over all layers (a window layer its
        window, a chunked layer its current chunk, a state layer its state): what a P/D transfer sends."""
        if self.uniform:
            return tokens * self.bytes_per_token
        return sum(g.resident_bytes(tokens) for g in self.groups)

    @property
    def bytes_per_token(self) -> int:
        """Bytes per token by the formula of this shape's attention kind (see the module docstring)."""
        if self.attention == "mla":
            return mla_kv_bytes_per_token(self.layers, self.kv_lora_rank, self.qk_rope_head_dim, self.dtype_bytes)
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.dtype_bytes)

    def as_dict(self) -> dict:
        """The shape's fields that apply to its attention kind, plus ``bytes_per_token``."""
        out = {"attention": self.attention, "layers": self.layers}
        if self.attention == "mla":
            out.update(kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.qk_rope_head_dim)
        else:
            out.update(kv_heads=self.kv_heads, head_dim=self.head_dim)
        out.update(dtype_bytes=self.dtype_bytes, bytes_per_token=self.bytes_per_token)
        if not self.uniform:
            out["layer_groups"] = {g.kind: g.as_dict() for g in self.groups}
        return out


def kv_shape_from_config(config: Mapping, dtype_bytes: int | None = None, source: str = "config") -> KvShape:
    """Read the KV shape from a Hugging Face ``config.json`` (already parsed).

    Fields read: ``num_hidden_layers``; for MLA (``kv_lora_rank`` present) ``kv_lora_rank`` and
    ``qk_rope_head_dim``; otherwise ``num_key_value_heads`` (falling back to ``num_attention_heads``)
    and ``head_dim`` (falling back to ``hidden_size / num_attention_heads``); the element size from
    ``torch_dtype`` or ``dtype`` (see :func:`dtype_bytes_of`) unless ``dtype_bytes`` overrides it
    (for an fp8 KV cache on a bfloat16 model). Multimodal configs that nest these under
    ``text_config`` are read from there. The layers are read by kind (:func:`dynlab.models.layout.kv_groups`:
    full, sliding-window, chunked-local, MLA, Mamba / linear-attention state); ``layers`` and
    ``bytes_per_token`` count the attention layers, each token at full length, and ``groups`` holds
    what each kind keeps (:meth:`KvShape.resident_bytes`). DeepSeek's extra multi-token-prediction
    layer is not counted (vLLM serves it only with speculative decoding).

    Every integer field follows :func:`config_int` (a JSON integer, ``32.0`` refused), the rule
    :func:`dynlab.models.params.param_count` reads its fields by too.

    Raises :class:`ModelConfigError` (one line, ``source: ...``, naming the field) when a needed field
    is missing or not a positive integer, or the dtype is unknown; ``ValueError``/``TypeError``
    for a bad ``dtype_bytes``.
    """
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"{source}: expected a JSON object, got {type(config).__name__}")
    outer = config
    config = text_config_of(config)

    config_int(config, "num_hidden_layers", source)
    if present(config, "kv_lora_rank"):
        rank = config_int(config, "kv_lora_rank", source)
        rope = config_int(config, "qk_rope_head_dim", source, " (needed with 'kv_lora_rank')")
        dtype = dtype_from_config(config, outer, dtype_bytes, source)
        groups, layers = _groups(config, outer, dtype, source)
        return KvShape(attention="mla", layers=layers, dtype_bytes=dtype, kv_lora_rank=rank, qk_rope_head_dim=rope,
                       groups=groups)
    kv_heads = kv_heads_of(config, source)
    head_dim = (config_int(config, "attention_head_dim", source) if present(config, "attention_head_dim")
                else head_dim_of(config, source))
    dtype = dtype_from_config(config, outer, dtype_bytes, source)
    heads = config_int(config, "num_attention_heads", source, default=0)  # 0: absent
    if kv_heads == 1:
        attention = "mqa"
    elif heads == kv_heads:
        attention = "mha"
    else:
        attention = "gqa"
    groups, layers = _groups(config, outer, dtype, source)
    return KvShape(attention=attention, layers=layers, dtype_bytes=dtype, kv_heads=kv_heads, head_dim=head_dim,
                   groups=groups)


def _groups(config: Mapping, outer: Mapping, dtype: int, source: str) -> tuple[tuple[KvGroup, ...], int]:
    """The layer groups (KV at ``dtype`` bytes, state at the model's dtype) and the attention layers' count."""
    stateful = any(kind in STATE_KINDS for kind in layer_kinds(config, source))
    state_dtype = dtype_from_config(config, outer, None, source) if stateful else dtype
    groups = kv_groups(config, dtype, source, state_dtype=state_dtype)
    layers = sum(g.layers for g in groups if g.kind in ATTENTION_KINDS)
    if not layers:
        raise ModelConfigError(f"{source}: no attention layer: dynlab needs at least one layer that keeps KV")
    return groups, layers


def kv_bytes_per_token_from_config(config: Mapping, dtype_bytes: int | None = None, source: str = "config") -> int:
    """KV bytes per token of the model a ``config.json`` describes: ``kv_shape_from_config(...).bytes_per_token``.

    MHA/GQA: ``2 * num_hidden_layers * num_key_value_heads * head_dim * dtype_bytes``; MLA:
    ``num_hidden_layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes`` (uniform element size;
    vLLM's fp8 MLA layout is 656 bytes per layer for DeepSeek-V3, not the 576 this gives at
    ``dtype_bytes=1``). Raises :class:`ModelConfigError` naming a missing or bad field.
    """
    return kv_shape_from_config(config, dtype_bytes, source).bytes_per_token


def model_table() -> dict:
    """``{name: KvShape.as_dict()}`` for every bundled model, in name order (``dynlab models``)."""
    return {name: kv_shape_from_config(load_model_config(name), source=name).as_dict() for name in bundled_models()}
