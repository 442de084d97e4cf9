"""A LoRA adapter's size from the served model's shapes: the bytes a worker loads per adapter (``--max-lora-rank``).

An adapter of rank ``r`` adds, to each target linear layer of input size ``d_in`` and output size ``d_out``,
two matrices ``A`` (``r x d_in``) and ``B`` (``d_out x r``): ``r * (d_in + d_out)`` parameters (Hu et al.,
"LoRA: Low-Rank Adaptation of Large Language Models", 2021, section 4.1). vLLM 0.33.0 applies an adapter to
every linear layer of a decoder layer it supports when ``--lora-target-modules`` is not given
(``vllm/config/lora.py``, ``LoRAConfig.target_modules``: "If None, all supported LoRA modules are used"); for
a dense decoder those are the attention projections ``q``, ``k``, ``v``, ``o`` (packed by vLLM as
``qkv_proj``, one ``A``/``B`` pair per slice) and the MLP's ``gate``, ``up``, ``down`` (``gate_up_proj``,
``down_proj``). Per decoder layer, with ``h`` = ``hidden_size``, ``q`` = ``num_attention_heads * head_dim``,
``kv`` = ``num_key_value_heads * head_dim``, ``i`` = ``intermediate_size``::

    q_proj (h -> q) + k_proj (h -> kv) + v_proj (h -> kv) + o_proj (q -> h)
      + gate_proj (h -> i) + up_proj (h -> i) + down_proj (i -> h)
    = r * (7h + 2q + 2kv + 3i) parameters

times ``num_hidden_layers`` layers, at the model's ``torch_dtype`` bytes (vLLM's ``lora_dtype="auto"``: the
base model's dtype). Llama-3.1-8B at rank 16: ``16 * (7*4096 + 2*4096 + 2*1024 + 3*14336) * 32`` =
41,943,040 parameters, 83,886,080 bytes in bfloat16 (the 84 MB of a PEFT adapter of that rank on all
linear layers). Mixture-of-experts models (experts' adapters) and MLA attention are not modelled: refused.
"""
from __future__ import annotations

from dynlab.models import config as cfg

__all__ = ["VLLM_LORA_RANKS", "adapter_bytes"]

#: the ranks vLLM 0.33.0 accepts for ``--max-lora-rank`` (``vllm/config/lora.py``: ``MaxLoRARanks``)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def adapter_bytes(model, rank: int) -> tuple[int, str]:
    """``(bytes of one adapter of rank ``rank``, its derivation)`` for ``model`` (a
    :class:`~dynlab.models.spec.ModelSpec`), by the rule of the module docstring (an int: exact).

    Raises ``ValueError`` (one line) for a mixture-of-experts or MLA model, or a rank < 1.
    """
    if rank < 1:
        raise ValueError(f"max_lora_rank must be >= 1, got {rank}")
    if model.experts or model.attention == "mla":
        raise ValueError(f"--max-loras: dynlab sizes LoRA adapters of dense models with standard attention "
                         f"only; {model.name} has {'experts' if model.experts else 'MLA attention'}")
    c = cfg.text_config_of(model.config)
    h = model.hidden_size
    i = cfg.config_int(c, "intermediate_size", model.name, " (the MLP's size, for a LoRA adapter's bytes)")
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    layers = model.num_layers or model.layers
    per_layer = rank * (7 * h + 2 * q + 2 * kv + 3 * i)
    total = per_layer * layers * model.dtype_bytes
    how = (f"rank {rank} x (7 x {h} + 2 x {q} + 2 x {kv} + 3 x {i}) x {layers} layers x {model.dtype_bytes} B "
           f"= {total:,} B (q, k, v, o, gate, up, down of every layer)")
    return total, how
