"""Parameter counts of the model a Hugging Face ``config.json`` describes (all experts, and per token).

:func:`param_parts` counts each part of the model (embeddings, attention or state mixers, dense MLPs,
routed experts, shared experts and routers, norms); :func:`param_count` sums them into ``(total,
active)``. Families read (by ``model_type`` and the fields that mark a layout):

- dense decoders (Llama, Qwen2/3, Mistral, Gemma 3, ...): q, k, v, o (biases with
  ``attention_bias`` or Qwen2), gated MLP ``3*h*I``; Qwen3 and Gemma 3 add per-head q/k RMSNorms;
  Gemma 3 four norms per layer and a tied embedding by default (transformers' ``Gemma3TextConfig``);
- MLA attention (``kv_lora_rank``: DeepSeek-V2/V3, Kimi-K2);
- mixture of experts: DeepSeek-V2/V3 and Kimi-K2 (``n_routed_experts``, shared experts,
  ``first_k_dense_replace`` dense layers, ``moe_layer_freq``; multi-token-prediction layers are not
  counted, as in the published 671B), Mixtral (``num_local_experts``), Qwen2/3-MoE (``num_experts``,
  ``decoder_sparse_step``, ``mlp_only_layers``, ``shared_expert_intermediate_size``), gpt-oss (experts
  with biases, router bias, attention sinks), Llama 4 (``interleave_moe_layer_step``: MoE layers with
  one shared expert, dense layers of ``intermediate_size_mlp``; the vision tower is not counted);
- Nemotron-H hybrids (``hybrid_override_pattern``): Mamba-2 mixers, attention, squared-ReLU MLPs
  (``up`` and ``down``: ``2*h*I``), one norm per layer.

``active`` counts only ``num_experts_per_tok`` routed experts per MoE layer (``== total`` for dense
models). Another MoE layout, or a linear-attention layer, is refused (:class:`UnsupportedModelError`).
"""
from __future__ import annotations

from typing import Mapping

from dynlab.models import config as cfg
from dynlab.models.config import ModelConfigError
from dynlab.models.layout import layer_kinds


class UnsupportedModelError(ModelConfigError):
    """A config whose architecture the parameter count does not cover (one line, naming why).

    A :class:`dynlab.models.config.ModelConfigError`: like any bad config that opened, the CLI prints it
    and exits 1.
    """


def _get(config: Mapping, key: str, source: str, **kw) -> int:
    # the one rule for a config's integer fields, shared with the KV shape (dynlab.models.config.config_int)
    return cfg.config_int(config, key, source, **kw)


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


def _attention_params(c: Mapping, source: str, model_type: str) -> int:
    """One attention layer's q, k, v, o (and biases, q/k norms, sinks) by family."""
    if c.get("kv_lora_rank") is not None:
        return _mla_attention_params(c, source)
    h, heads = _get(c, "hidden_size", source), _get(c, "num_attention_heads", source)
    kv_heads = cfg.kv_heads_of(c, source)
    d = _get(c, "attention_head_dim", source) if c.get("attention_head_dim") is not None else cfg.head_dim_of(c, source)
    attn = h * heads * d + 2 * h * kv_heads * d + heads * d * h
    if c.get("attention_bias") or model_type == "qwen2":
        attn += heads * d + 2 * kv_heads * d
    if model_type == "gpt_oss":
        attn += h + heads  # o_proj bias, one attention sink per head
    if model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"):
        attn += 2 * d  # q_norm, k_norm over the head dimension
    return attn


def _mamba_params(c: Mapping, source: str) -> int:
    """One Mamba-2 mixer (Nemotron-H): in_proj, depthwise conv (with bias), dt_bias, A_log, D, gated norm, out_proj."""
    h = _get(c, "hidden_size", source)
    heads, head_dim = _get(c, "mamba_num_heads", source), _get(c, "mamba_head_dim", source)
    groups, state, kernel = _get(c, "n_groups", source), _get(c, "ssm_state_size", source), _get(c, "conv_kernel", source)
    inner = heads * head_dim
    conv = inner + 2 * groups * state
    return h * (2 * inner + 2 * groups * state + heads) + conv * kernel + conv + 3 * heads + inner + inner * h


_MOE_TYPES = {"n_routed_experts": ("deepseek_v2", "deepseek_v3", "kimi_k2"),
              "num_local_experts": ("mixtral", "gpt_oss", "llama4", "llama4_text"),
              "num_experts": ("qwen2_moe", "qwen3_moe")}
"""The model types whose experts are counted, by the field that names their expert count."""


def _moe(c: Mapping, source: str, model_type: str, layers: int) -> dict | None:
    """``{"moe_layers", "experts", "per_tok", "expert", "shared", "dense_layers", "dense"}`` of an MoE config,
    or ``None`` for a dense one. ``expert``/``shared``/``dense``: parameters of one routed expert, of one
    layer's shared experts and router, of one dense MLP."""
    h = _get(c, "hidden_size", source)
    markers = [k for k in ("n_routed_experts", "num_local_experts", "num_experts") if c.get(k)]
    if not markers:
        return None
    if model_type not in _MOE_TYPES[markers[0]]:
        raise UnsupportedModelError(
            f"{source}: mixture-of-experts layout of model_type {model_type!r} is not supported "
            f"(supported MoE: {', '.join(t for types in _MOE_TYPES.values() for t in types)})")
    per_tok = _get(c, "num_experts_per_tok", source)
    if markers[0] == "n_routed_experts":
        experts = _get(c, "n_routed_experts", source)
        expert = 3 * h * _get(c, "moe_intermediate_size", source)
        shared = _get(c, "n_shared_experts", source, default=0, minimum=0) * expert
        router = experts * h + (experts if model_type != "deepseek_v2" else 0)  # + e_score_correction_bias
        first = min(_get(c, "first_k_dense_replace", source, default=0, minimum=0), layers)
        freq = _get(c, "moe_layer_freq", source, default=1)
        moe_layers = [i for i in range(first, layers) if i % freq == 0]
        dense = 3 * h * _get(c, "intermediate_size", source)
    elif model_type == "mixtral":
        experts, expert = _get(c, "num_local_experts", source), 3 * h * _get(c, "intermediate_size", source)
        router, shared, dense, moe_layers = experts * h, 0, 0, list(range(layers))
    elif model_type == "gpt_oss":
        experts, inter = _get(c, "num_local_experts", source), _get(c, "intermediate_size", source)
        if c.get("experts_per_token") not in (None, per_tok):
            raise ModelConfigError(f"{source}: fields 'experts_per_token' and 'num_experts_per_tok' disagree")
        expert = 3 * h * inter + 2 * inter + h  # gate_up (with bias), down (with bias)
        router, shared, dense, moe_layers = experts * h + experts, 0, 0, list(range(layers))
    elif model_type in ("llama4", "llama4_text"):
        experts, inter = _get(c, "num_local_experts", source), _get(c, "intermediate_size", source)
        expert = 3 * h * inter
        router, shared = experts * h, expert  # one shared expert of the same size
        step = _get(c, "interleave_moe_layer_step", source, default=1)
        moe_layers = c.get("moe_layers") or list(range(step - 1, layers, step))  # transformers' default
        dense = 3 * h * cfg.config_int(c, "intermediate_size_mlp", source, " (Llama 4's dense layers)") if len(moe_layers) < layers else 0
    else:  # qwen2_moe, qwen3_moe
        experts, expert = _get(c, "num_experts", source), 3 * h * _get(c, "moe_intermediate_size", source)
        shared_inter = _get(c, "shared_expert_intermediate_size", source, default=0, minimum=0)
        router, shared = experts * h, (3 * h * shared_inter + h if shared_inter else 0)  # + shared_expert_gate
        step = _get(c, "decoder_sparse_step", source, default=1)
        only = set(c.get("mlp_only_layers") or ())
        moe_layers = [i for i in range(layers) if i not in only and (i + 1) % step == 0]
        dense = 3 * h * _get(c, "intermediate_size", source) if len(moe_layers) < layers else 0
    return {"moe_layers": len(moe_layers), "experts": experts, "per_tok": per_tok, "expert": expert,
            "shared": shared + router, "dense_layers": layers - len(moe_layers), "dense": dense}


def param_parts(config: Mapping, source: str = "config") -> dict:
    """Parameters by part: ``embed`` (token embedding + untied ``lm_head``), ``mixers`` (attention and
    Mamba layers), ``dense_mlp``, ``experts`` (all routed experts), ``experts_active`` (``per_tok`` of them
    per MoE layer), ``shared`` (shared experts and routers), ``norms``; plus ``moe`` (:func:`_moe`'s dict or
    ``None``). Raises :class:`ModelConfigError` / :class:`UnsupportedModelError` (one line)."""
    if not isinstance(config, Mapping):
        raise UnsupportedModelError(f"{source}: expected a JSON object")
    c = cfg.text_config_of(config)
    h = _get(c, "hidden_size", source)
    layers = _get(c, "num_hidden_layers", source)
    vocab = _get(c, "vocab_size", source)
    _get(c, "num_attention_heads", source)
    model_type = str(c.get("model_type", ""))
    kinds = layer_kinds(c, source)
    if "linear_attention" in kinds:
        raise UnsupportedModelError(f"{source}: the parameters of linear-attention layers ('layer_types') "
                                    f"of model_type {model_type!r} are not counted")
    attn = _attention_params(c, source, model_type)
    mixers = sum(attn for k in kinds if k not in ("mamba", "mlp"))
    if "mamba" in kinds:
        mixers += kinds.count("mamba") * _mamba_params(c, source)
    moe = _moe(c, source, model_type, layers)
    tied = c.get("tie_word_embeddings", model_type.startswith("gemma"))
    parts = {"embed": vocab * h * (1 if tied else 2), "mixers": mixers, "moe": moe}
    if "hybrid_override_pattern" in c:  # Nemotron-H: MLP layers are their own layers ('-'), squared ReLU
        if "E" in c["hybrid_override_pattern"]:
            raise UnsupportedModelError(f"{source}: expert layers ('E' in 'hybrid_override_pattern') are not counted")
        parts.update(dense_mlp=kinds.count("mlp") * 2 * h * _get(c, "intermediate_size", source),
                     experts=0, experts_active=0, shared=0, norms=layers * h + h)
        return parts
    if moe is None:
        dense_mlp, experts = layers * 3 * h * _get(c, "intermediate_size", source), 0
        experts_active = shared = 0
    else:
        dense_mlp = moe["dense_layers"] * moe["dense"]
        experts = moe["moe_layers"] * moe["experts"] * moe["expert"]
        experts_active = moe["moe_layers"] * moe["per_tok"] * moe["expert"]
        shared = moe["moe_layers"] * moe["shared"]
    norms_per_layer = 4 if model_type.startswith("gemma") else 2
    parts.update(dense_mlp=dense_mlp, experts=experts, experts_active=experts_active, shared=shared,
                 norms=layers * norms_per_layer * h + h)
    return parts


def param_count(config: Mapping, source: str = "config") -> tuple[int, int]:
    """``(total, active)`` parameters of the model a Hugging Face ``config.json`` describes.

    Counted (module docstring): token embedding ``V*h``; per layer the attention (or Mamba) mixer, the
    MLP or experts, the norms; the final norm; ``lm_head`` (``V*h``) unless tied. ``active`` counts
    ``num_experts_per_tok`` routed experts per MoE layer.

    Fields are read by :func:`dynlab.models.config.config_int` (integers must be JSON integers;
    ``num_key_value_heads`` falls back to ``num_attention_heads``, ``head_dim`` to
    ``hidden_size / num_attention_heads``; a nested ``text_config`` is read when the top has no
    ``num_hidden_layers``).

    Raises :class:`~dynlab.models.config.ModelConfigError` for a missing or bad field, and
    :class:`UnsupportedModelError` (one) for another MoE layout.
    """
    p = param_parts(config, source)
    base = p["embed"] + p["mixers"] + p["dense_mlp"] + p["shared"] + p["norms"]
    return base + p["experts"], base + p["experts_active"]
