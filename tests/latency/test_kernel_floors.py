"""The roofline's kernel floors (dynlab_builtins.latency_roofline.kernel_floors): MLA layers and block-fp8
GEMMs, each figure derived by hand from the model's config and the documented defaults."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynlab.latency.base import StepBatch
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.latency.hardware import model_spec
from dynlab_builtins.latency_roofline import (FP8_GEMM_US, LAYER_US, MLA_LAYER_US, SHARED_EXPERTS_STREAM_TOKENS,
                                              block_fp8, kernel_floors)
from helpers import SERVER_TERMS_OFF

NO_FLOORS = {"mla_layer_us": 0.0, "fp8_gemm_us": 0.0}


def roofline(name, tp, **opts):
    return build_latency_model("roofline", hardware_for(name, "h200", tp), {**SERVER_TERMS_OFF["roofline"], **opts})


def test_defaults_are_the_documented_ones():
    assert (MLA_LAYER_US, FP8_GEMM_US, LAYER_US, SHARED_EXPERTS_STREAM_TOKENS) == (90.0, 59.0, 40.0, 256)


def test_which_models_have_block_fp8_weights():
    # DeepSeek-V3 and Kimi-K2 ship quant_method fp8 with weight_block_size [128, 128]; gpt-oss is mxfp4, Qwen3 bf16
    assert block_fp8(model_spec("deepseek-v3")) and block_fp8(model_spec("kimi-k2"))
    assert not any(block_fp8(model_spec(n)) for n in ("gpt-oss-120b", "qwen3-235b-a22b", "qwen3-8b"))


def test_deepseek_v3_floors_by_hand():
    # DeepSeek-V3: 61 layers, all MLA; first_k_dense_replace 3, so 3 dense MLP layers and 58 MoE layers, each
    # with one shared expert. Per step, in us:
    #   MLA: 61 x 90 = 5,490; dense MLPs' block-fp8 GEMMs: 3 layers x 2 x 59 = 354
    #   shared experts: 2 x 59 = 118 per MoE layer; beside the router and routed experts (<= 256 tokens)
    #   only 118 - 40 (layer_us) = 78 shows: 58 x 78 = 4,524; above 256 tokens all of it: 58 x 118 = 6,844
    small, big = kernel_floors(model_spec("deepseek-v3"), LAYER_US, MLA_LAYER_US, FP8_GEMM_US)
    assert small == pytest.approx((5490 + 354 + 4524) / 1e3)  # 10.368 ms
    assert big == pytest.approx((5490 + 354 + 6844) / 1e3)  # 12.688 ms


def test_kimi_k2_floors_by_hand():
    # Kimi-K2: 61 MLA layers, first_k_dense_replace 1 (1 dense, 60 MoE layers, one shared expert each):
    #   5,490 + 1 x 2 x 59 = 118, + 60 x 78 = 4,680 (small) or 60 x 118 = 7,080 (large)
    small, big = kernel_floors(model_spec("kimi-k2"), LAYER_US, MLA_LAYER_US, FP8_GEMM_US)
    assert small == pytest.approx((5490 + 118 + 4680) / 1e3)  # 10.288 ms
    assert big == pytest.approx((5490 + 118 + 7080) / 1e3)  # 12.688 ms


def test_a_long_router_chain_hides_the_shared_experts_in_a_small_step():
    # layer_us 200 > the shared experts' 118: a small step adds only MLA and the dense MLPs, 5,490 + 354 us
    small, big = kernel_floors(model_spec("deepseek-v3"), 200.0, MLA_LAYER_US, FP8_GEMM_US)
    assert small == pytest.approx(5.844)
    assert big == pytest.approx(5.844 + 58 * 0.118)


def test_models_without_mla_or_block_fp8_have_no_floor_and_ignore_the_options():
    for name in ("qwen3-235b-a22b", "gpt-oss-120b", "llama-3.1-70b"):
        assert kernel_floors(model_spec(name), LAYER_US, MLA_LAYER_US, FP8_GEMM_US) is None
    batch = StepBatch((300,), (100,), 7, 7 * 900)
    plain = roofline("qwen3-235b-a22b", 8)
    changed = roofline("qwen3-235b-a22b", 8, mla_layer_us=500.0, fp8_gemm_us=500.0)
    assert changed.step_ms(batch) == plain.step_ms(batch)  # the same float: the floors are not reached


@pytest.mark.parametrize("tokens, added_ms", [
    (1, 10.368), (SHARED_EXPERTS_STREAM_TOKENS, 10.368),  # the shared experts on their own stream
    (SHARED_EXPERTS_STREAM_TOKENS + 1, 12.688), (4096, 12.688),  # after the router and routed experts
])
def test_deepseek_v3_step_adds_the_floors_outside_the_max(tokens, added_ms):
    # the floors are added with the communication, after max(compute, memory): a decode-only step and a
    # prefill step of the same tokens gain exactly the figures of test_deepseek_v3_floors_by_hand
    with_floors, without = roofline("deepseek-v3", 8), roofline("deepseek-v3", 8, **NO_FLOORS)
    for batch in (StepBatch((), (), tokens, tokens * 2048), StepBatch((tokens,), (0,), 0, 0)):
        assert with_floors.step_ms(batch) - without.step_ms(batch) == pytest.approx(added_ms, abs=1e-9)


def test_an_empty_step_has_no_floor():
    # no token, no kernel: the roofline's empty step (its overhead alone) is unchanged
    with_floors, without = roofline("deepseek-v3", 8), roofline("deepseek-v3", 8, **NO_FLOORS)
    assert with_floors.step_ms(StepBatch()) == without.step_ms(StepBatch())


@given(mla=st.floats(0, 500), fp8=st.floats(0, 500), layer=st.floats(0, 500))
def test_floors_are_non_negative_and_a_large_step_pays_at_least_a_small_one(mla, fp8, layer):
    small, big = kernel_floors(model_spec("deepseek-v3"), layer, mla, fp8) or (0.0, 0.0)
    assert 0.0 <= small <= big
    # each option only adds: raising one never lowers either floor
    small2, big2 = kernel_floors(model_spec("deepseek-v3"), layer, mla + 1.0, fp8 + 1.0) or (0.0, 0.0)
    assert small2 >= small and big2 >= big
