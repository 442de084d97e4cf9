"""The model catalogue's families: layer kinds, KV groups, parameter counts and weight bytes, by hand."""
from __future__ import annotations

import json

import pytest

from dynlab.models import config as cfg
from dynlab.models.config import ModelConfigError
from dynlab.models.kv import kv_shape_from_config
from dynlab.models.layout import kv_groups, layer_kinds
from dynlab.models.params import UnsupportedModelError, param_count
from dynlab.models.spec import model_names, model_spec


def _text(name):
    return cfg.text_config_of(cfg.load_model_config(name))


def test_gemma_3_every_sixth_layer_is_global():
    kinds = layer_kinds(_text("gemma-3-1b"))
    assert [i for i, k in enumerate(kinds) if k == "full"] == [5, 11, 17, 23]
    assert kinds.count("sliding_window") == 22
    # gemma-3-27b's config names no sliding_window_pattern: transformers' default 6 applies
    assert layer_kinds(_text("gemma-3-27b")).count("full") == 10  # layers 5, 11, ..., 59 of 62


def test_gemma_3_1b_parameters_by_hand():
    h, d, inter, vocab = 1152, 256, 6912, 262144
    attn = h * 4 * d + 2 * h * 1 * d + 4 * d * h + 2 * d  # q, k, v, o, q/k norms
    per_layer = attn + 3 * h * inter + 4 * h  # gated MLP, four norms
    total = 26 * per_layer + h + vocab * h  # final norm, tied embedding
    assert param_count(cfg.load_model_config("gemma-3-1b")) == (total, total) == (999_885_952, 999_885_952)


def test_gpt_oss_120b_groups_and_mxfp4_weights_by_hand():
    spec = model_spec("gpt-oss-120b")
    assert [(g.kind, g.layers, g.bytes_per_token, g.window) for g in spec.kv_groups] == [
        ("full", 18, 18 * 2 * 8 * 64 * 2, 0), ("sliding_window", 18, 18 * 2 * 8 * 64 * 2, 128)]
    h, inter, experts = 2880, 2880, 128
    expert = 3 * h * inter + 2 * inter + h  # gate_up and down, with biases
    routed = 36 * experts * expert
    assert routed == 114_701_598_720
    # experts at 17/32 byte (MXFP4: 4-bit elements + an 8-bit scale per 32), the rest bfloat16
    assert spec.quantization == "mxfp4"
    assert spec.weight_bytes == -(-routed * 17 // 32) + (spec.params - routed) * 2 == 60_935_224_320 + 2_127_557_952 * 2 == 65_190_340_224
    assert spec.params == pytest.approx(116.8e9, rel=0.001)  # OpenAI's model card: 116.8B total


@pytest.mark.parametrize("name, total, active, rel", [
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.02), ("qwen3-235b-a22b", 235e9, 22e9, 0.02),
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.01), ("kimi-k2", 1.04e12, 32e9, 0.03),
    ("llama-4-scout", 109e9, 17e9, 0.02),  # 109B counts the vision tower, not counted here
    ("llama-4-maverick", 400e9, 17e9, 0.02), ("gpt-oss-20b", 20.9e9, None, 0.01),
    ("nemotron-h-56b", 56e9, 56e9, 0.01), ("gemma-3-27b", 27e9, 27e9, 0.01), ("llama-3.1-70b", 70.6e9, 70.6e9, 0.01),
])
def test_published_sizes(name, total, active, rel):
    spec = model_spec(name)
    assert spec.params == pytest.approx(total, rel=rel)
    if active is not None:
        assert spec.active_params == pytest.approx(active, rel=rel)


def test_qwen3_30b_a3b_by_hand():
    h, layers, vocab, d = 2048, 48, 151936, 128
    attn = h * 32 * d + 2 * h * 4 * d + 32 * d * h + 2 * d
    expert = 3 * h * 768
    base = layers * (attn + 2 * h + 128 * h) + h + 2 * vocab * h  # + router, norms, untied head
    assert param_count(cfg.load_model_config("qwen3-30b-a3b")) == (base + layers * 128 * expert,
                                                                  base + layers * 8 * expert)


def test_llama_4_chunked_local_layers():
    groups = kv_groups(_text("llama-4-scout"), 2)
    assert [(g.kind, g.layers, g.window) for g in groups] == [("full", 12, 0), ("chunked_local", 36, 8192)]
    chunked = groups[1]
    assert chunked.resident_tokens(8192) == 8192 and chunked.resident_tokens(8193) == 1
    assert chunked.resident_tokens(10_000) == 10_000 - 8192


def test_nemotron_h_mamba_state_by_hand():
    spec = model_spec("nemotron-h-56b")
    attention, mamba = spec.kv_groups
    assert (attention.kind, attention.layers, mamba.kind, mamba.layers) == ("full", 10, "mamba", 54)
    conv = (4 - 1) * (256 * 64 + 2 * 8 * 256)  # (conv_kernel - 1) x (heads x head_dim + 2 x groups x state)
    ssm = 256 * 64 * 256  # heads x head_dim x ssm_state_size
    assert mamba.state_bytes == 54 * (conv + ssm) * 2 == 459_620_352
    assert spec.kv_bytes_per_token == 10 * 2 * 8 * 128 * 2  # only the attention layers keep tokens
    assert spec.resident_kv_bytes(1000) == 1000 * spec.kv_bytes_per_token + mamba.state_bytes


def test_kv_cache_dtype_fp8_halves_a_bf16_cache():
    assert model_spec("llama-3.1-8b", kv_cache_dtype="fp8").kv_bytes_per_token == 32 * 2 * 8 * 128 * 1
    assert model_spec("llama-3.1-8b").kv_bytes_per_token == 32 * 2 * 8 * 128 * 2
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        model_spec("llama-3.1-8b", kv_cache_dtype="int4")


@pytest.mark.parametrize("field, value, named", [
    ("num_kv_shared_layers", 12, "num_kv_shared_layers"),
    ("attn_layer_period", 8, "attn_layer_period"),
    ("expert_layer_period", 2, "expert_layer_period"),
    ("layer_types", ["full_attention"] * 35 + ["mystery_attention"], "layer_types"),
    ("layer_types", ["full_attention"] * 3, "layer_types"),
])
def test_a_layout_dynlab_cannot_read_is_refused_by_name(field, value, named):
    config = dict(cfg.load_model_config("qwen3-8b"), **{field: value})
    with pytest.raises(ModelConfigError, match=rf"^x: field '{named}'"):
        model_spec_from(config)


def test_an_unknown_quantization_is_refused_by_name():
    config = dict(cfg.load_model_config("qwen3-8b"), quantization_config={"quant_method": "awq"})
    with pytest.raises(ModelConfigError, match=r"^x: field 'quantization_config.quant_method' 'awq'"):
        model_spec_from(config)


def test_linear_attention_keeps_a_state_but_its_parameters_are_refused():
    config = dict(cfg.load_model_config("qwen3-8b"), layer_types=["linear_attention", "linear_attention",
                                                                  "linear_attention", "full_attention"] * 9,
                  linear_num_key_heads=16, linear_key_head_dim=128, linear_num_value_heads=32,
                  linear_value_head_dim=128, linear_conv_kernel_dim=4)
    groups = kv_shape_from_config(config).groups
    state = (4 - 1) * (2 * 16 * 128 + 32 * 128) + 32 * 128 * 128  # conv + recurrent state
    assert [(g.kind, g.layers, g.state_bytes) for g in groups] == [
        ("full", 9, 0), ("linear_attention", 27, 27 * state * 2)]
    with pytest.raises(UnsupportedModelError, match="linear-attention"):
        param_count(config, "x")


def test_every_bundled_model_reads():
    for name in model_names():
        spec = model_spec(name)
        assert spec.params >= spec.active_params > 0 and spec.kv_bytes_per_token > 0
        json.dumps(spec.as_dict())


def model_spec_from(config):
    from dynlab.models.spec import model_spec_from_config

    return model_spec_from_config(config, "x")


# ---------------------------------------------------------------- GPUs

from dynlab.models.gpus import GPU_ALIASES, GPUS, gpu_spec  # noqa: E402


@pytest.mark.parametrize("name, memory, bf16, fp8, fp4, hbm, link, link_gbps", [
    # datasheet figures, dense (the "with sparsity" peaks halved)
    ("h100", 80, 989.0, 1979.0, 0.0, 3350.0, "nvlink", 900.0),
    ("h100-pcie", 80, 756.0, 1513.0, 0.0, 2000.0, "pcie", 128.0),
    ("h100-nvl", 94, 835.0, 1671.0, 0.0, 3900.0, "nvlink", 600.0),
    ("h200", 141, 989.0, 1979.0, 0.0, 4800.0, "nvlink", 900.0),
    ("a100-40gb", 40, 312.0, 0.0, 0.0, 1555.0, "nvlink", 600.0),
    ("a100-80gb-pcie", 80, 312.0, 0.0, 0.0, 1935.0, "pcie", 64.0),
    ("b200", 180, 2250.0, 4500.0, 9000.0, 8000.0, "nvlink", 1800.0),
    ("b300", 288, 2250.0, 4500.0, 13500.0, 8000.0, "nvlink", 1800.0),
    ("gb200", 186, 2500.0, 5000.0, 10000.0, 8000.0, "nvlink", 1800.0),
    ("l40s", 48, 362.05, 733.0, 0.0, 864.0, "pcie", 64.0),
    ("l4", 24, 121.0, 242.5, 0.0, 300.0, "pcie", 64.0),
    ("mi300x", 192, 1307.4, 2614.9, 0.0, 5300.0, "infinity-fabric", 896.0),
])
def test_gpu_datasheet_figures(name, memory, bf16, fp8, fp4, hbm, link, link_gbps):
    g = gpu_spec(name)
    assert (g.memory_gb, g.bf16_tflops, g.fp8_tflops, g.fp4_tflops, g.hbm_gbps, g.link, g.link_gbps) == (
        memory, bf16, fp8, fp4, hbm, link, link_gbps)
    assert "datasheet" in g.source or "data sheet" in g.source


def test_a100_is_an_alias_of_the_80gb_sxm():
    assert gpu_spec("a100") is GPUS["a100-80gb"] and gpu_spec("h100-sxm") is GPUS["h100"]
    assert all(target in GPUS for target in GPU_ALIASES.values())
    with pytest.raises(ValueError, match="unknown GPU 'a200'; known GPUs: h100, "):
        gpu_spec("a200")
