"""dynlab.disagg.cost and ``dynlab disagg`` / ``dynlab models``: seed values, units, model configs, bad input."""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dynlab.cli import main
from dynlab.disagg import cost as disagg
from dynlab.disagg.cost import (ModelConfigError, UnknownModelError, breakeven_gbps, effective_gbps, kv_bytes_per_token,
                                kv_bytes_per_token_from_config, kv_shape_from_config, mla_kv_bytes_per_token,
                                transfer_ms, ttft_disagg)

QWEN3_06B_BPT = 2 * 28 * 8 * 128 * 2  # K and V x 28 layers x 8 KV heads x 128 x bfloat16


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def one_json_line(result) -> dict:
    assert result.exit_code == 0, result.output + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def assert_usage_error(result, *needles):
    """Exit 2, one ``Error:`` line naming the problem, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    assert "Traceback" not in result.output + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0]


# ---------------------------------------------------------------- seed 000 step 6


def test_default_shape_is_qwen3_06b():
    assert kv_bytes_per_token() == QWEN3_06B_BPT == 114688


def test_seed_transfer_times():
    # 1,500 tokens x 114,688 B = 172,032,000 B; / (G x 10^9 B/s) in ms
    assert round(transfer_ms(1500, QWEN3_06B_BPT, 0.112), 1) == 1536.0
    assert round(transfer_ms(1500, QWEN3_06B_BPT, 0.608), 1) == 282.9
    assert round(transfer_ms(1500, QWEN3_06B_BPT, 13.4), 1) == 12.8


def test_cli_seed_single_line_exact():
    result = run("disagg", "--tokens", "1500", "--gbps", "0.112")
    assert result.exit_code == 0
    assert result.stdout == '{"bytes_per_token": 114688, "kv_mib": 164.1, "transfer_ms": 1536.0}\n'


def test_cli_seed_kvcost_keyed_as_written():
    out = one_json_line(run("disagg", "--tokens", "1500", "--gbps", "0.112,0.608,13.4"))
    assert list(out) == ["0.112", "0.608", "13.4"]
    assert [out[k]["transfer_ms"] for k in out] == [1536.0, 282.9, 12.8]
    for rec in out.values():
        assert rec == {"bytes_per_token": 114688, "kv_mib": 164.1, "transfer_ms": rec["transfer_ms"]}


def test_cli_keys_keep_the_spelling_and_order_given():
    out = one_json_line(run("disagg", "--tokens", "1000", "--gbps", "13.40,1e1, 0.5"))
    assert list(out) == ["13.40", "1e1", "0.5"]
    # 1000 x 114688 B at 10 GB/s = 11.4688 ms
    assert out["1e1"]["transfer_ms"] == 11.5


def test_units_are_decimal_gb_and_binary_mib():
    # 10^9 bytes at 1 GB/s is exactly one second; 2^20 bytes is one MiB
    assert transfer_ms(10**9, 1, 1.0) == 1000.0
    assert disagg.kv_mib(2**20, 1) == 1.0
    out = one_json_line(run("disagg", "--tokens", str(2**20), "--gbps", "1", "--layers", "1", "--kv-heads", "1",
                            "--head-dim", "1", "--dtype-bytes", "1"))
    assert out == {"bytes_per_token": 2, "kv_mib": 2.0, "transfer_ms": 2.1}  # 2,097,152 B / 10^9 B/s


def test_ttft_disagg_adds_prefill_transfer_and_overhead():
    t = transfer_ms(1500, QWEN3_06B_BPT, 0.608)
    assert ttft_disagg(20.0, 1500, QWEN3_06B_BPT, 0.608) == pytest.approx(20.0 + t)
    assert ttft_disagg(20.0, 1500, QWEN3_06B_BPT, 0.608, overhead_ms=5.0) == pytest.approx(25.0 + t)


def test_cli_prefill_and_saved_options():
    out = one_json_line(run("disagg", "--tokens", "1500", "--gbps", "0.608", "--prefill-ms", "20",
                            "--saved-ms", "100"))
    # 20 + 282.947 ms; 172,032,000 B in 0.1 s = 1.72032 GB/s
    assert out["ttft_disagg_ms"] == 302.9
    assert out["breakeven_gbps"] == 1.72
    out = one_json_line(run("disagg", "--tokens", "1500", "--gbps", "0.608", "--prefill-ms", "20",
                            "--overhead-ms", "7"))
    assert out["ttft_disagg_ms"] == 309.9
    assert "breakeven_gbps" not in out


def test_breakeven_keeps_small_values_visible():
    out = one_json_line(run("disagg", "--tokens", "1", "--gbps", "1", "--saved-ms", "1000"))
    # 114,688 B in one second = 0.000114688 GB/s, four significant digits
    assert out["breakeven_gbps"] == 0.0001147


# ---------------------------------------------------------------- round trips (hypothesis)

tokens_st = st.integers(min_value=1, max_value=2_000_000)
bpt_st = st.integers(min_value=1, max_value=4_000_000)
gbps_st = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)


@given(tokens_st, bpt_st, gbps_st)
def test_effective_gbps_inverts_transfer_ms(t, b, g):
    assert math.isclose(effective_gbps(t * b, transfer_ms(t, b, g)), g, rel_tol=1e-9)


@given(tokens_st, bpt_st, st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False))
def test_transfer_at_breakeven_equals_saving(t, b, s):
    assert math.isclose(transfer_ms(t, b, breakeven_gbps(t, b, s)), s, rel_tol=1e-9)


@given(tokens_st, bpt_st, gbps_st, st.floats(min_value=1.01, max_value=100))
def test_more_bandwidth_is_faster(t, b, g, factor):
    assert transfer_ms(t, b, g * factor) < transfer_ms(t, b, g)


# ---------------------------------------------------------------- argument errors (library)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: transfer_ms(10, 10, 0), "gbps"),
        (lambda: transfer_ms(10, 10, -1.0), "gbps"),
        (lambda: transfer_ms(-1, 10, 1.0), "tokens"),
        (lambda: transfer_ms(1, -10, 1.0), "bytes_per_token"),
        (lambda: transfer_ms(1, 10, float("nan")), "gbps"),
        (lambda: transfer_ms(1, 10, float("inf")), "gbps"),
        (lambda: ttft_disagg(0, 1, 1, 1), "prefill_ms"),
        (lambda: ttft_disagg(1, 1, 1, 1, overhead_ms=-1), "overhead_ms"),
        (lambda: ttft_disagg(1, 1, 1, 0), "gbps"),
        (lambda: effective_gbps(100, 0), "ms"),
        (lambda: effective_gbps(100, -5), "ms"),
        (lambda: effective_gbps(-1, 5), "nbytes"),
        (lambda: breakeven_gbps(1, 1, 0), "saved_ms"),
        (lambda: breakeven_gbps(1, 1, -2), "saved_ms"),
        (lambda: breakeven_gbps(-1, 1, 2), "tokens"),
        (lambda: kv_bytes_per_token(layers=-1), "layers"),
        (lambda: kv_bytes_per_token(kv_heads=-8), "kv_heads"),
        (lambda: kv_bytes_per_token(head_dim=-1), "head_dim"),
        (lambda: kv_bytes_per_token(dtype_bytes=-2), "dtype_bytes"),
        (lambda: mla_kv_bytes_per_token(61, -512, 64), "kv_lora_rank"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, name):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(name + " ")


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: transfer_ms(True, 10, 1.0), "tokens"),
        (lambda: transfer_ms(1, 10, "1"), "gbps"),
        (lambda: kv_bytes_per_token(layers=2.5), "layers"),
        (lambda: effective_gbps(None, 1), "nbytes"),
    ],
)
def test_non_numbers_raise_type_error_naming_them(call, name):
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value).startswith(name + " ")


# ---------------------------------------------------------------- model configs


def test_bundled_models_and_their_sizes():
    assert disagg.bundled_models() == [
        "deepseek-v3", "gemma-3-1b", "gemma-3-27b", "gpt-oss-120b", "gpt-oss-20b", "kimi-k2", "llama-3-8b",
        "llama-3.1-70b", "llama-3.1-8b", "llama-4-maverick", "llama-4-scout", "mixtral-8x7b", "nemotron-h-56b",
        "qwen3-0.6b", "qwen3-235b-a22b", "qwen3-30b-a3b", "qwen3-32b", "qwen3-8b"]
    size = {n: kv_bytes_per_token_from_config(disagg.load_model_config(n)) for n in disagg.bundled_models()}
    assert size["qwen3-0.6b"] == kv_bytes_per_token()  # the shipped default equals the function's defaults
    assert size["llama-3-8b"] == 2 * 32 * 8 * (4096 // 32) * 2  # no head_dim in its config: hidden/heads
    assert size["qwen3-32b"] == 2 * 64 * 8 * 128 * 2
    assert size["deepseek-v3"] == 61 * (512 + 64) * 2  # MLA: one latent + rotary key per layer


def test_deepseek_v3_shape_and_fp8_layout_note():
    shape = kv_shape_from_config(disagg.load_model_config("deepseek-v3"))
    assert (shape.attention, shape.layers, shape.kv_lora_rank, shape.qk_rope_head_dim) == ("mla", 61, 512, 64)
    fp8 = kv_bytes_per_token_from_config(disagg.load_model_config("deepseek-v3"), dtype_bytes=1)
    assert fp8 == 61 * 576
    # vLLM's fp8 MLA entry is larger than the uniform 1-byte layout this module computes
    assert disagg.VLLM_FP8_MLA_BYTES_PER_LAYER * 61 > fp8


def test_cli_deepseek_v3_32k_tokens():
    out = one_json_line(run("disagg", "--model", "deepseek-v3", "--tokens", "32768", "--gbps", "142.25"))
    # 32,768 x 70,272 B = 2,302,672,896 B = 2196 MiB exactly; / 142.25e9 B/s = 16.19 ms
    assert out == {"bytes_per_token": 70272, "kv_mib": 2196.0, "transfer_ms": 16.2}


@pytest.mark.parametrize("model, bpt", [("llama-3-8b", 131072), ("qwen3-32b", 262144), ("qwen3-0.6b", 114688)])
def test_cli_gqa_models(model, bpt):
    out = one_json_line(run("disagg", "--model", model, "--tokens", "32768", "--gbps", "142.25"))
    assert out["bytes_per_token"] == bpt
    assert out["kv_mib"] == 32768 * bpt / 2**20
    assert out["transfer_ms"] == round(32768 * bpt / 142.25e9 * 1e3, 1)


def test_cli_dtype_bytes_overrides_config():
    out = one_json_line(run("disagg", "--model", "llama-3-8b", "--dtype-bytes", "1", "--tokens", "1", "--gbps", "1"))
    assert out["bytes_per_token"] == 65536


def test_cli_models_lists_every_bundled_model():
    out = one_json_line(run("models"))
    assert list(out) == disagg.bundled_models()
    assert out["qwen3-0.6b"]["bytes_per_token"] == 114688
    assert out["deepseek-v3"]["attention"] == "mla"
    assert out["llama-3-8b"]["attention"] == "gqa"
    for name, row in out.items():
        assert row["bytes_per_token"] == kv_bytes_per_token_from_config(disagg.load_model_config(name))


@pytest.mark.parametrize(
    "dtype, size", [("float32", 4), ("bfloat16", 2), ("float16", 2), ("float8_e4m3fn", 1), ("float8_e5m2", 1),
                    ("torch.bfloat16", 2)])
def test_dtype_names(dtype, size):
    cfg = {"num_hidden_layers": 1, "num_key_value_heads": 1, "head_dim": 1, "torch_dtype": dtype}
    assert kv_bytes_per_token_from_config(cfg) == 2 * size
    cfg["dtype"] = cfg.pop("torch_dtype")  # newer transformers write "dtype"
    assert kv_bytes_per_token_from_config(cfg) == 2 * size


def test_fallbacks_kv_heads_and_head_dim():
    cfg = {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768, "torch_dtype": "float32"}
    shape = kv_shape_from_config(cfg)
    assert (shape.attention, shape.kv_heads, shape.head_dim) == ("mha", 12, 64)
    assert shape.bytes_per_token == 2 * 12 * 12 * 64 * 4


def test_text_config_is_read_when_nested():
    cfg = {"torch_dtype": "bfloat16",
           "text_config": {"num_hidden_layers": 4, "num_key_value_heads": 1, "head_dim": 256}}
    shape = kv_shape_from_config(cfg)
    assert shape.attention == "mqa"
    assert shape.bytes_per_token == 2 * 4 * 1 * 256 * 2


GOOD = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_size": 1024, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(
    "change, field",
    [
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"num_key_value_heads": None, "num_attention_heads": None}, "num_key_value_heads"),
        ({"head_dim": None, "hidden_size": None}, "hidden_size"),
        ({"torch_dtype": None}, "torch_dtype"),
        ({"torch_dtype": "int3"}, "torch_dtype"),
        ({"num_hidden_layers": "28"}, "num_hidden_layers"),
        ({"num_key_value_heads": 0}, "num_key_value_heads"),
        ({"head_dim": True}, "head_dim"),
        ({"kv_lora_rank": 512}, "qk_rope_head_dim"),
    ],
)
def test_config_errors_name_the_field(change, field, tmp_path):
    cfg = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(ModelConfigError) as info:
        kv_bytes_per_token_from_config(cfg, source="x.json")
    assert str(info.value).startswith("x.json: ")
    assert f"'{field}'" in str(info.value)
    # the CLI: exit 1, one line, the field named, no traceback
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    result = run("disagg", "--model-config", str(path), "--tokens", "10", "--gbps", "1")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"Error: {path}: ")
    assert f"'{field}'" in result.stderr


def test_cli_model_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GOOD))
    out = one_json_line(run("disagg", "--model-config", str(path), "--tokens", "1500", "--gbps", "0.112"))
    assert out == {"bytes_per_token": 114688, "kv_mib": 164.1, "transfer_ms": 1536.0}


def test_cli_model_config_not_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{nope")
    result = run("disagg", "--model-config", str(path), "--tokens", "1", "--gbps", "1")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {path}: not a JSON file")


def test_unknown_model_library_error_lists_names():
    with pytest.raises(UnknownModelError) as info:
        disagg.load_model_config("gpt-5")
    assert "qwen3-0.6b" in str(info.value) and "deepseek-v3" in str(info.value)


# ---------------------------------------------------------------- CLI usage errors


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--tokens", "-1", "--gbps", "1"], ["--tokens"]),
        (["--tokens", "1.5", "--gbps", "1"], ["--tokens"]),
        (["--tokens", "10", "--gbps", "0"], ["--gbps", "'0'"]),
        (["--tokens", "10", "--gbps", "-0.1"], ["--gbps"]),
        (["--tokens", "10", "--gbps", "nan"], ["--gbps"]),
        (["--tokens", "10", "--gbps", "inf"], ["--gbps"]),
        (["--tokens", "10", "--gbps", "fast"], ["--gbps", "'fast'"]),
        (["--tokens", "10", "--gbps", "1,,2"], ["--gbps"]),
        (["--tokens", "10", "--gbps", "1,2,1"], ["--gbps", "repeats"]),
        (["--tokens", "10", "--gbps", "1", "--prefill-ms", "0"], ["--prefill-ms"]),
        (["--tokens", "10", "--gbps", "1", "--saved-ms", "-3"], ["--saved-ms"]),
        (["--tokens", "10", "--gbps", "1", "--prefill-ms", "5", "--overhead-ms", "-1"], ["--overhead-ms"]),
        (["--tokens", "10", "--gbps", "1", "--overhead-ms", "1"], ["--overhead-ms", "--prefill-ms"]),
        (["--tokens", "10", "--gbps", "1", "--layers", "0"], ["--layers"]),
        (["--tokens", "10", "--gbps", "1", "--dtype-bytes", "-1"], ["--dtype-bytes"]),
        (["--tokens", "10", "--gbps", "1", "--model", "gpt-5"],
         ["--model", "deepseek-v3", "llama-3-8b", "llama-3.1-8b", "qwen3-0.6b", "qwen3-32b", "qwen3-8b"]),
        (["--tokens", "10", "--gbps", "1", "--model", "llama-3-8b", "--layers", "4"], ["--layers", "--model"]),
    ],
)
def test_cli_bad_options_are_usage_errors(args, needles):
    assert_usage_error(run("disagg", *args), *needles)


def test_cli_model_and_model_config_together(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GOOD))
    assert_usage_error(run("disagg", "--model", "qwen3-32b", "--model-config", str(path), "--tokens", "1",
                           "--gbps", "1"), "--model-config")


def test_cli_missing_required_options():
    assert_usage_error(run("disagg", "--gbps", "1"), "--tokens")
    assert_usage_error(run("disagg", "--tokens", "1"), "--gbps")


# ---------------------------------------------------------------- sliding-window models: the resident KV


MIB = 2**20


@pytest.mark.parametrize("tokens, kv_bytes", [
    # gemma-3-1b: 26 layers of 1 KV head x 256 x bf16 = 1,024 B per layer and token; every 6th layer
    # (5, 11, 17, 23) global, the other 22 a 512-token window
    (8192, 4 * 8192 * 1024 + 22 * 512 * 1024),  # 45,088,768 B = 43.0 MiB (not 26 x 8,192 = 208.0 MiB)
    (400, 26 * 400 * 1024),  # shorter than the window: every layer keeps all 400 tokens, 10.2 MiB
])
def test_gemma_3_1b_moves_the_resident_kv(tmp_path, tokens, kv_bytes):
    config = tmp_path / "gemma-3-1b.json"
    config.write_text(json.dumps(disagg.load_model_config("gemma-3-1b")))
    out = run("disagg", "--model-config", str(config), "--tokens", str(tokens), "--gbps", "25")
    assert out.exit_code == 0, out.output
    record = json.loads(out.output)
    assert record["kv_bytes"] == kv_bytes
    assert record["kv_mib"] == round(kv_bytes / MIB, 1) == {8192: 43.0, 400: 10.2}[tokens]
    assert record["bytes_per_token"] == 26 * 1024
    assert record["transfer_ms"] == round(kv_bytes / 25e9 * 1000, 1)
    window = min(tokens, 512)
    assert record["layer_groups"] == {
        "full": {"layers": 4, "tokens": tokens, "kv_bytes": 4 * tokens * 1024},
        "sliding_window": {"layers": 22, "tokens": window, "kv_bytes": 22 * window * 1024}}


@pytest.mark.parametrize("name, tokens, mib", [
    # gpt-oss-120b: 36 layers of 8 KV heads x 64 x bf16 = 2,048 B per layer and token, alternating
    # 128-token sliding-window and full layers: 18 x 8,192 x 2,048 + 18 x 128 x 2,048 = 306,708,480 B
    ("gpt-oss-120b", 8192, 292.5),  # all-full would be 576.0 MiB: ~2x overstated
    ("gpt-oss-120b", 400, 18.6),  # 18 x 400 x 2,048 + 18 x 128 x 2,048 = 19,464,192 B
    ("gpt-oss-20b", 8192, 195.0),  # 12 x 8,192 x 2,048 + 12 x 128 x 2,048 = 204,472,320 B
])
def test_gpt_oss_moves_the_resident_kv(name, tokens, mib):
    out = run("disagg", "--model", name, "--tokens", str(tokens), "--gbps", "50")
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["kv_mib"] == mib


def test_a_dense_model_keeps_its_record_unchanged():
    out = run("disagg", "--model", "llama-3.1-8b", "--tokens", "8192", "--gbps", "25")
    assert json.loads(out.output) == {"bytes_per_token": 131072, "kv_mib": 1024.0, "transfer_ms": 42.9}


def test_the_resident_kv_never_exceeds_the_full_length_kv():
    shape = kv_shape_from_config(disagg.load_model_config("gemma-3-1b"))
    for tokens in (0, 1, 511, 512, 513, 8192, 100_000):
        assert shape.resident_bytes(tokens) <= tokens * shape.bytes_per_token
