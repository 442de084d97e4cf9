"""The hardware and model catalogue: parameter counts against published sizes, the capacity rule."""
from __future__ import annotations

import json
import math
import re

import pytest
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.disagg import cost as disagg
from dynlab.latency import hardware as hw


@pytest.mark.parametrize("name, published, rel", [
    ("llama-3.1-8b", 8.03e9, 0.005),   # meta-llama/Llama-3.1-8B model card: 8.03B
    ("llama-3-8b", 8.03e9, 0.005),
    ("qwen3-8b", 8.19e9, 0.005),       # Qwen/Qwen3-8B model card: 8.2B (8.19B on the Hub)
    ("qwen3-0.6b", 0.6e9, 0.01),       # Qwen/Qwen3-0.6B: 0.6B (0.44B without embeddings)
    ("qwen3-32b", 32.8e9, 0.005),      # Qwen/Qwen3-32B: 32.8B
    ("deepseek-v3", 671e9, 0.002),     # DeepSeek-V3: 671B total (MTP module excluded), 37B active
])
def test_parameter_counts_match_published_sizes(name, published, rel):
    spec = hw.model_spec(name)
    assert spec.params == pytest.approx(published, rel=rel)


def test_exact_counts_by_hand():
    # Llama-3.1-8B: embed + 32 x (attention + MLP + 2 norms) + final norm + untied lm_head
    h, layers, vocab = 4096, 32, 128256
    attn = h * 4096 + 2 * h * 1024 + 4096 * h
    per_layer = attn + 3 * h * 14336 + 2 * h
    assert hw.model_spec("llama-3.1-8b").params == 2 * vocab * h + layers * per_layer + h == 8_030_261_248
    # Qwen3-0.6B ties the embedding and adds q/k norms of head_dim
    assert hw.model_spec("qwen3-0.6b").params == 596_049_920
    ds = hw.model_spec("deepseek-v3")
    assert ds.active_params == pytest.approx(37e9, rel=0.02)
    assert ds.weight_bytes_per_param == 1  # fp8 quantization_config
    assert hw.model_spec("qwen3-8b").active_params == hw.model_spec("qwen3-8b").params


def test_bundled_configs_hold_the_needed_fields():
    # read from the text config (a multimodal config nests it), with the family defaults transformers
    # supplies (Gemma 3: vocab_size, tie_word_embeddings); gpt-oss names no torch_dtype (bfloat16 by its card)
    for name in hw.model_names():
        cfg = disagg.load_model_config(name)
        text = disagg.text_config_of(cfg)
        for key in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "tie_word_embeddings"):
            assert key in text or (key == "tie_word_embeddings" and "llama4" in text["model_type"]), (name, key)
        assert "torch_dtype" in cfg or "torch_dtype" in text or cfg["model_type"] == "gpt_oss", name


def test_model_spec_from_a_config_path(tmp_path):
    path = tmp_path / "Qwen3-8B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(disagg.load_model_config("qwen3-8b")))
    spec = hw.model_spec(str(path))
    assert spec.name == "Qwen3-8B" and spec.params == hw.model_spec("qwen3-8b").params


def test_unknown_names_list_what_exists():
    with pytest.raises(ValueError, match="known GPUs: h100, h200, a100-80gb, l40s, b200"):
        hw.gpu_spec("h300")
    with pytest.raises(ValueError, match="bundled models: .*llama-3.1-8b.*qwen3-8b"):
        hw.model_spec("gpt-5")


def test_unsupported_moe_is_refused():
    cfg = dict(disagg.load_model_config("qwen3-8b"), model_type="granitemoe", num_local_experts=32)
    with pytest.raises(disagg.ModelConfigError, match="not supported"):  # a bad config: exit 1 in the CLI
        hw.param_count(cfg, "x")


def test_gpu_catalogue():
    assert set(hw.GPUS) == {"h100", "h200", "a100-80gb", "l40s", "b200", "h100-pcie", "h100-nvl", "a100-40gb",
                            "a100-80gb-pcie", "a100-40gb-pcie", "b300", "gb200", "l4", "mi300x"}
    h100 = hw.gpu_spec("h100")
    assert (h100.memory_gb, h100.bf16_tflops, h100.hbm_gbps) == (80, 989.0, 3350.0)
    for g in hw.GPUS.values():
        assert g.source and g.memory_gb > 0 and g.bf16_tflops > 0 and g.hbm_gbps > 0


def test_kv_blocks_default_by_hand():
    blocks, why = hw.kv_blocks()
    weights = 8_030_261_248 * 2
    expected = math.floor((80 * 2**30 * 0.9 - weights) / (131072 * 16))
    assert blocks == expected == 29205
    assert "\n" not in why and "29205" in why and "h100" in why


def test_kv_blocks_tp_splits_weights_and_heads():
    one, _ = hw.kv_blocks("qwen3-32b", "h200", 16, tp=1)
    two, _ = hw.kv_blocks("qwen3-32b", "h200", 16, tp=2)
    spec = hw.model_spec("qwen3-32b")
    # tp divides the 8 KV heads: the rule equals floor((memory*tp*util - weights) / (kv_bytes * block))
    assert two == math.floor((141 * 2**30 * 2 * 0.9 - spec.weight_bytes) / (spec.kv_bytes_per_token * 16))
    assert two > 2 * one
    # MLA: the latent is replicated on every GPU
    ds = hw.model_spec("deepseek-v3")
    assert ds.kv_bytes_per_token_per_gpu(8) == ds.kv_bytes_per_token


def test_kv_blocks_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        hw.kv_blocks("qwen3-32b", "l40s")
    with pytest.raises(ValueError, match="block"):
        hw.kv_blocks(block=0)
    with pytest.raises(ValueError, match="tp"):
        hw.kv_blocks(tp=0)


@pytest.mark.parametrize("given", ["config.json", "./config.json", "Qwen3-8B/config.json", "llama.json"])
def test_a_bad_config_path_is_named_as_given(tmp_path, monkeypatch, given):
    # the error names the file the user typed, never its folder ('.', '' or the working directory's name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen3-8B").mkdir()
    (tmp_path / given).write_text('{"num_hidden_layers": "x"}')
    with pytest.raises(disagg.ModelConfigError, match=rf"^{re.escape(given)}: field 'num_hidden_layers' must be"):
        hw.model_spec(given)
    r = CliRunner().invoke(main, ["sim", "--timing", "--model", given])
    assert r.exit_code == 1 and r.output == (f"Error: {given}: field 'num_hidden_layers' must be a positive "
                                             "integer, got 'x'\n"), r.output


@pytest.mark.parametrize("given,name", [("config.json", "config.json"), ("./config.json", "./config.json"),
                                        ("Qwen3-8B/config.json", "Qwen3-8B")])
def test_a_config_path_names_the_model_after_its_folder_if_it_has_one(tmp_path, monkeypatch, given, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen3-8B").mkdir()
    (tmp_path / given).write_text(json.dumps(disagg.load_model_config("qwen3-8b")))
    assert hw.model_spec(given).name == name


@pytest.mark.parametrize("model, gpu, tp", [("llama-3.1-8b", "h100", 1), ("qwen3-32b", "a100-80gb", 2),
                                            ("deepseek-v3", "h200", 8), ("qwen3-8b", "l40s", 1)])
def test_the_pool_derivation_can_be_worked_by_hand(model, gpu, tp):
    """kv_blocks_source's numbers, read back from the line and worked as it says, give the pool it names
    (a user checking the line with the weights rounded to 0.01 GiB once got 29,204 for 29,205)."""
    blocks, why = hw.kv_blocks(model, gpu, 16, tp)
    m = re.fullmatch(r"floor\(\(([\d.]+) GiB x ([\d.]+) - ([\d,]+) B \([\d.]+ GiB\) weights / (\d+)\) / "
                     r"\((\d+) B/token/GPU x (\d+)\)\) = (\d+) blocks of 16 tokens \(([\d,]+) tokens\) "
                     r"per worker of (\d+) x (\S+)", why)
    assert m, why
    mem, util, weights, tp_, per_token, block, said, tokens, tp2, name = m.groups()
    free = float(mem) * 2**30 * float(util) - int(weights.replace(",", "")) / int(tp_)
    assert math.floor(free / (int(per_token) * int(block))) == int(said) == blocks
    assert int(tokens.replace(",", "")) == blocks * 16 and (int(tp2), name) == (tp, gpu)
