"""The layers of a model by attention type (vLLM's KV cache groups), and the KV or state bytes each keeps.

A Hugging Face ``config.json`` names, directly or by a pattern, what each of its
``num_hidden_layers`` layers is. :func:`layer_kinds` reads it into one kind per layer and
:func:`kv_groups` sums the layers of each kind into a :class:`KvGroup` (vLLM 0.33's hybrid KV cache
manager keeps one KV cache group per attention type, ``vllm/v1/core/kv_cache_coordinator.py``):

=================  ===========================================================  ==========================
kind               what a layer keeps for a request of ``T`` tokens              read from
=================  ===========================================================  ==========================
``full``           ``T`` tokens' K and V                                         every attention layer
``sliding_window`` the last ``min(T, W)`` tokens (``W`` = ``sliding_window``)    ``layer_types``
                                                                                 (``sliding_attention``),
                                                                                 ``sliding_window_pattern``
                                                                                 (Gemma 3: every N-th layer
                                                                                 global), Mistral's all-
                                                                                 layer ``sliding_window``,
                                                                                 Qwen's ``use_sliding_window``
                                                                                 with ``max_window_layers``
``chunked_local``  the tokens of the current chunk, ``(T - 1) % C + 1``          Llama 4:
                   (``C`` = ``attention_chunk_size``)                            ``attention_chunk_size``
                                                                                 with ``no_rope_layers``
``mla``            ``T`` compressed latents (DeepSeek-V2/V3, Kimi-K2)            ``kv_lora_rank``
``mamba``          a fixed state per request (conv + SSM state)                  Nemotron-H's
                                                                                 ``hybrid_override_pattern``
``linear_attention`` a fixed state per request (conv + recurrent state)          ``layer_types``
                                                                                 (``linear_attention``)
=================  ===========================================================  ==========================

Bytes: an attention layer keeps ``2 * num_key_value_heads * head_dim * dtype`` bytes per token (K
and V), an MLA layer ``(kv_lora_rank + qk_rope_head_dim) * dtype``; ``dtype`` is the model's
``torch_dtype`` or the ``kv_dtype_bytes`` given (``--kv-cache-dtype fp8``: 1). A Mamba-2 layer keeps
``(conv_kernel - 1) * (heads * head_dim + 2 * n_groups * ssm_state_size)`` conv elements plus
``heads * head_dim * ssm_state_size`` SSM elements per request (vLLM's ``MambaStateShapeCalculator``
``mamba2_state_shape``), a gated-DeltaNet linear-attention layer (Qwen3-Next)
``(linear_conv_kernel_dim - 1) * (2 * key_heads * key_dim + value_heads * value_dim)`` conv plus
``value_heads * key_dim * value_dim`` recurrent elements (``gated_delta_net_state_shape``), all at
the model dtype (vLLM's ``mamba_ssm_cache_dtype=auto``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from dynlab.models.config import ModelConfigError, config_int, head_dim_of, kv_heads_of, present

ATTENTION_KINDS = ("full", "sliding_window", "chunked_local", "mla")
"""Kinds whose layers keep per-token KV."""
STATE_KINDS = ("mamba", "linear_attention")
"""Kinds whose layers keep one fixed-size state per request."""

_LAYER_TYPE_NAMES = {"full_attention": "full", "sliding_attention": "sliding_window",
                     "chunked_attention": "chunked_local", "linear_attention": "linear_attention"}

LLAMA4_NO_ROPE_INTERVAL = 4
"""Llama 4's default: every 4th layer is a global NoPE layer, the others chunked local
(transformers' ``Llama4TextConfig``, ``no_rope_layer_interval=4``) when ``no_rope_layers`` is absent."""


@dataclass(frozen=True)
class KvGroup:
    """The layers of one kind: ``layers`` of them, ``bytes_per_token`` summed over them (attention kinds,
    bytes), ``window`` tokens (``sliding_window`` / ``chunked_local``; 0 otherwise), ``state_bytes`` per
    request summed over them (state kinds, bytes)."""

    kind: str
    layers: int
    bytes_per_token: int = 0
    window: int = 0
    state_bytes: int = 0

    def resident_tokens(self, tokens: int) -> int:
        """Tokens of a ``tokens``-token request whose KV the group keeps (0 for a state group)."""
        if self.kind in STATE_KINDS or tokens <= 0:
            return 0
        if self.kind == "sliding_window":
            return min(tokens, self.window)
        if self.kind == "chunked_local":
            return (tokens - 1) % self.window + 1
        return tokens

    def resident_bytes(self, tokens: int) -> int:
        """Bytes the group keeps for a request of ``tokens`` tokens (its state once ``tokens > 0``)."""
        if self.kind in STATE_KINDS:
            return self.state_bytes if tokens > 0 else 0
        return self.resident_tokens(tokens) * self.bytes_per_token

    def as_dict(self) -> dict:
        out = {"layers": self.layers}
        if self.kind in STATE_KINDS:
            out["state_bytes"] = self.state_bytes
        else:
            out["bytes_per_token"] = self.bytes_per_token
            if self.window:
                out["window"] = self.window
        return out


def _pattern_kinds(c: Mapping, layers: int, source: str) -> list[str] | None:
    """Kinds from an explicit per-layer list or pattern, or ``None`` when the config has none."""
    if present(c, "layer_types"):
        types = c["layer_types"]
        if not isinstance(types, list) or len(types) != layers:
            raise ModelConfigError(f"{source}: field 'layer_types' must list one type for each of the "
                                   f"{layers} layers ('num_hidden_layers')")
        bad = next((t for t in types if t not in _LAYER_TYPE_NAMES), None)
        if bad is not None:
            raise ModelConfigError(f"{source}: field 'layer_types' holds {bad!r}, a layer type dynlab cannot read "
                                   f"(it reads {', '.join(_LAYER_TYPE_NAMES)})")
        return [_LAYER_TYPE_NAMES[t] for t in types]
    if present(c, "hybrid_override_pattern"):
        pattern = c["hybrid_override_pattern"]
        if not isinstance(pattern, str) or len(pattern) != layers or set(pattern) - set("M*-E"):
            raise ModelConfigError(f"{source}: field 'hybrid_override_pattern' must be {layers} characters of "
                                   "M (Mamba), * (attention), - (MLP), E (experts)")
        return [{"M": "mamba", "*": "full"}.get(ch, "mlp") for ch in pattern]
    if present(c, "sliding_window_pattern"):
        every = config_int(c, "sliding_window_pattern", source)
        return ["full" if (i + 1) % every == 0 else "sliding_window" for i in range(layers)]
    return None


UNREAD_LAYOUT_FIELDS = {
    "num_kv_shared_layers": "layers sharing another layer's KV (Gemma 3n/4)",
    "global_head_dim": "a head size of its own for global layers (Gemma 4)",
    "num_global_key_value_heads": "KV heads of their own for global layers (Gemma 4)",
    "index_head_dim": "the sparse-attention indexer's cache (DeepSeek-V3.2)",
    "full_attention_interval": "a linear/full attention interleave without 'layer_types' (Qwen3-Next)",
    "attn_layer_period": "an attention/Mamba interleave (Jamba)",
    "attn_layer_offset": "an attention/Mamba interleave (Jamba)",
    "layers_block_type": "a per-layer block type list (Jamba, Granite 4)",
    "expert_layer_period": "an expert-layer interleave (Jamba)",
    "swa_layers": "a sliding-window layer list",
}
"""Fields that change a model's KV or state layout and that dynlab does not read: a config holding one
(with a value other than ``null``, ``0`` or ``[]``) is refused naming the field, never read and ignored."""

_EXPERT_FIELDS_READ = {"num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
                       "experts_per_token", "n_shared_experts", "moe_intermediate_size",
                       "shared_expert_intermediate_size", "interleave_moe_layer_step", "moe_layer_freq",
                       "first_k_dense_replace", "decoder_sparse_step", "mlp_only_layers", "moe_layers"}
_EXPERT_FIELDS_NO_SIZE = {"output_router_logits", "router_aux_loss_coef", "norm_topk_prob", "routed_scaling_factor",
                          "n_group", "topk_group", "topk_method", "scoring_func", "aux_loss_alpha", "seq_aux",
                          "ep_size", "router_jitter_noise", "router_z_loss_coef"}
"""Expert fields that decide routing, not sizes (read by nothing here, and that changes no count)."""


def check_layout_fields(c: Mapping, source: str = "config") -> None:
    """Refuse a config holding a layout field dynlab does not read (:data:`UNREAD_LAYOUT_FIELDS`), or an
    expert field (``*expert*``, ``*moe*``) it neither reads nor knows to change no size. One line,
    naming the field; :class:`ModelConfigError`."""
    model_type = c.get("model_type", "")
    for key, what in UNREAD_LAYOUT_FIELDS.items():
        if key in c and c[key] not in (None, 0, [], False):
            if key == "full_attention_interval" and present(c, "layer_types"):
                continue
            raise ModelConfigError(f"{source}: field '{key}' ({what}) is not read by dynlab "
                                   f"(model_type {model_type!r}); it would change the KV or state layout")
    for key in c:
        if ("expert" in key or "moe" in key) and key not in _EXPERT_FIELDS_READ | _EXPERT_FIELDS_NO_SIZE \
                and c[key] not in (None, 0, [], False):
            raise ModelConfigError(f"{source}: field '{key}' is an expert setting dynlab does not read "
                                   f"(model_type {model_type!r})")


def layer_kinds(c: Mapping, source: str = "config") -> list[str]:
    """One kind per layer (:data:`ATTENTION_KINDS`, :data:`STATE_KINDS`, or ``"mlp"`` for a Nemotron-H layer
    with no attention or state) of the text config ``c``. Raises :class:`ModelConfigError` naming the field
    (:func:`check_layout_fields` first)."""
    check_layout_fields(c, source)
    layers = config_int(c, "num_hidden_layers", source)
    kinds = _pattern_kinds(c, layers, source)
    if kinds is None:
        if present(c, "attention_chunk_size"):
            nope = c.get("no_rope_layers")
            if nope is None:
                nope = [int((i + 1) % LLAMA4_NO_ROPE_INTERVAL != 0) for i in range(layers)]
            if not isinstance(nope, list) or len(nope) != layers:
                raise ModelConfigError(f"{source}: field 'no_rope_layers' must hold one 0/1 for each of the {layers} layers")
            kinds = ["chunked_local" if flag else "full" for flag in nope]
        elif present(c, "sliding_window") and _window_on_every_layer(c, source):
            start = config_int(c, "max_window_layers", source, default=0, minimum=0) if c.get("use_sliding_window") else 0
            kinds = ["sliding_window" if i >= start else "full" for i in range(layers)]
        else:
            kinds = ["full"] * layers
    if present(c, "kv_lora_rank"):
        kinds = ["mla" if k == "full" else k for k in kinds]
    return kinds


def _window_on_every_layer(c: Mapping, source: str) -> bool:
    """Whether a bare ``sliding_window`` applies: Qwen-style configs say so with ``use_sliding_window``;
    Mistral-style ones (no such field) apply it to every layer."""
    if "use_sliding_window" in c:
        return bool(c["use_sliding_window"])
    return True


def _attention_bytes(c: Mapping, dtype: int, source: str) -> int:
    if present(c, "kv_lora_rank"):
        rank = config_int(c, "kv_lora_rank", source)
        return (rank + config_int(c, "qk_rope_head_dim", source, " (needed with 'kv_lora_rank')")) * dtype
    head_dim = config_int(c, "attention_head_dim", source) if present(c, "attention_head_dim") else head_dim_of(c, source)
    return 2 * kv_heads_of(c, source) * head_dim * dtype


def mamba_state_elements(c: Mapping, source: str = "config") -> int:
    """Elements of one Mamba-2 layer's state per request: conv + SSM (module docstring)."""
    heads, head_dim = config_int(c, "mamba_num_heads", source), config_int(c, "mamba_head_dim", source)
    groups, state = config_int(c, "n_groups", source), config_int(c, "ssm_state_size", source)
    kernel = config_int(c, "conv_kernel", source)
    return (kernel - 1) * (heads * head_dim + 2 * groups * state) + heads * head_dim * state


def linear_attention_state_elements(c: Mapping, source: str = "config") -> int:
    """Elements of one gated-DeltaNet layer's state per request: conv + recurrent (module docstring)."""
    kh, kd = config_int(c, "linear_num_key_heads", source), config_int(c, "linear_key_head_dim", source)
    vh, vd = config_int(c, "linear_num_value_heads", source), config_int(c, "linear_value_head_dim", source)
    kernel = config_int(c, "linear_conv_kernel_dim", source)
    return (kernel - 1) * (2 * kh * kd + vh * vd) + vh * kd * vd


def kv_groups(c: Mapping, dtype: int, source: str = "config", state_dtype: int | None = None) -> tuple[KvGroup, ...]:
    """The :class:`KvGroup` of each kind present in text config ``c``, in :data:`ATTENTION_KINDS` then
    :data:`STATE_KINDS` order. ``dtype``: bytes per KV element; ``state_dtype``: per state element
    (default ``dtype``). Raises :class:`ModelConfigError` naming a missing or bad field."""
    kinds = layer_kinds(c, source)
    state_dtype = dtype if state_dtype is None else state_dtype
    out = []
    for kind in ATTENTION_KINDS + STATE_KINDS:
        n = kinds.count(kind)
        if not n:
            continue
        if kind == "mamba":
            out.append(KvGroup(kind, n, state_bytes=n * mamba_state_elements(c, source) * state_dtype))
        elif kind == "linear_attention":
            out.append(KvGroup(kind, n, state_bytes=n * linear_attention_state_elements(c, source) * state_dtype))
        else:
            window = 0
            if kind == "sliding_window":
                window = config_int(c, "sliding_window", source, " (needed by its sliding-window layers)")
            elif kind == "chunked_local":
                window = config_int(c, "attention_chunk_size", source)
            out.append(KvGroup(kind, n, n * _attention_bytes(c, dtype, source), window))
    return tuple(out)


def resident_kv_bytes(groups, tokens: int) -> int:
    """Bytes all ``groups`` keep for one request of ``tokens`` tokens: what a P/D transfer sends."""
    return sum(g.resident_bytes(tokens) for g in groups)
