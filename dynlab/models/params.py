"""Parameter counts of the model a Hugging Face ``config.json`` describes (all experts, and per token)."""
from __future__ import annotations

from typing import Mapping

from dynlab.models import config as cfg
from dynlab.models.config import ModelConfigError


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

    Fields are read as the KV shape reads them (:func:`dynlab.models.config.config_int`: integers must be
    JSON integers; ``num_key_value_heads`` falls back to ``num_attention_heads``, ``head_dim`` to
    ``hidden_size / num_attention_heads``; a nested ``text_config`` is read when the top has no
    ``num_hidden_layers``).

    Raises :class:`~dynlab.models.config.ModelConfigError` for a missing or bad field, and
    :class:`UnsupportedModelError` (one) for another MoE layout.
    """
    if not isinstance(config, Mapping):
        raise UnsupportedModelError(f"{source}: expected a JSON object")
    c = cfg.text_config_of(config)
    h = _get(c, "hidden_size", source)
    layers = _get(c, "num_hidden_layers", source)
    vocab = _get(c, "vocab_size", source)
    heads = _get(c, "num_attention_heads", source)
    model_type = str(c.get("model_type", ""))

    if c.get("kv_lora_rank") is not None:
        attn = _mla_attention_params(c, source)
    else:
        kv_heads = cfg.kv_heads_of(c, source)
        d = cfg.head_dim_of(c, source)
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
