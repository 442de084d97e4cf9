"""``kv_bytes_per_block`` is a whole number of bytes, and a run prints it as a JSON integer."""
from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynlab.engine.config import SimConfig
from dynlab.engine.serving import cpu_tier_size
from dynlab.latency.grid import hardware_for
from dynlab.latency.hardware import GPUS, model_names, model_spec, model_spec_from_config


def _exact(model, tp: int, block: int) -> Fraction:
    """The formula of ``cpu_tier_size``'s docstring in exact rationals: a GPU's share of a token's KV
    (the whole MLA latent, or ``kv_bytes_per_token / min(tp, kv_heads)``) x ``tp`` x ``block``."""
    share = Fraction(model.kv_bytes_per_token, 1 if model.attention == "mla" else min(tp, model.kv_heads))
    return share * tp * block


def _valid_tps(name: str) -> list[int]:
    out = []
    for tp in range(1, 257):
        try:
            hardware_for(name, "h100", tp)
        except ValueError:
            continue
        out.append(tp)
    return out


@pytest.mark.parametrize("name", model_names())
@pytest.mark.parametrize("block", [1, 16, 512])
def test_every_bundled_model_and_tp_gives_whole_bytes_per_block(name, block):
    model = model_spec(name)
    tps = _valid_tps(name)
    assert tps  # tp 1 at least
    for tp in tps:
        exact = _exact(model, tp, block)
        assert exact.denominator == 1, (name, tp, block)
        per_block = cpu_tier_size(SimConfig(tp=tp, block=block), model)[1]
        assert type(per_block) is int and per_block == exact, (name, tp, block)


def test_the_gpu_does_not_enter_bytes_per_block():
    # the bytes per block depend on the model, tp and block only; every catalogue GPU gives the same
    model = model_spec("llama-3.1-8b")
    assert len({cpu_tier_size(SimConfig(gpu=g, tp=2), hardware_for("llama-3.1-8b", g, 2).model)[1]
                for g in GPUS}) == 1
    assert cpu_tier_size(SimConfig(tp=2), model)[1] == 131072 * 16  # tp 2 splits 8 KV heads: no replica


@given(layers=st.integers(1, 200), kv_heads=st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
       head_dim=st.sampled_from([64, 80, 96, 128, 256]), dtype=st.sampled_from(["bfloat16", "float32", "float8_e4m3fn"]),
       tp_exp=st.integers(0, 8), block=st.integers(1, 4096))
def test_a_config_json_model_gives_whole_bytes_per_block(layers, kv_heads, head_dim, dtype, tp_exp, block):
    # any MHA/GQA config.json whose heads a tp splits (tp | kv_heads) or replicates (kv_heads | tp),
    # vLLM's rule that hardware_for enforces: the per-block bytes are the exact formula, an int
    tp = 2 ** tp_exp
    heads = max(kv_heads, tp) * 2
    model = model_spec_from_config({"num_hidden_layers": layers, "num_attention_heads": heads,
                                    "num_key_value_heads": kv_heads, "head_dim": head_dim,
                                    "hidden_size": heads * head_dim, "intermediate_size": 4 * heads * head_dim,
                                    "vocab_size": 1000, "torch_dtype": dtype})
    per_block = cpu_tier_size(SimConfig(tp=tp, block=block), model)[1]
    exact = _exact(model, tp, block)
    assert exact.denominator == 1
    assert type(per_block) is int and per_block == exact


def test_the_run_json_prints_kv_bytes_per_block_as_an_integer():
    from helpers import invoke, ok

    stdout = ok(invoke("sim", "--timing", "--prefixes", "2", "--reps", "2", "--mode", "rr",
                       "--cpu-memory-gb", "64")).stdout
    # llama-3.1-8b: 2 x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B a token; x 16 tokens = 2,097,152
    assert '"kv_bytes_per_block": 2097152,' in stdout
    assert type(json.loads(stdout)["kv_bytes_per_block"]) is int
