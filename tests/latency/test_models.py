"""Every registered latency model: positive, finite, monotone; linear, roofline and blis pinned by hand."""
from __future__ import annotations

import importlib.util
import math
import sys

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dynlab import hookimpl, plugins
from helpers import SERVER_TERMS_OFF
from dynlab.latency.base import LatencyModel, StepBatch
from dynlab.latency.grid import build_latency_model, hardware_for

HAVE_AIC = importlib.util.find_spec("aiconfigurator_core") is not None
BUILTIN = ("roofline", "linear", "blis", "aiconfigurator")
_BUILT: dict = {}


def built(name: str) -> LatencyModel:
    """One instance per model name (llama-3.1-8b on h100), built once per test session, with its server
    terms off (the hand cases below price the GPU step; tests/latency/test_overheads.py adds the terms)."""
    if name not in _BUILT:
        _BUILT[name] = build_latency_model(name, hardware_for(), SERVER_TERMS_OFF.get(name))
    return _BUILT[name]


def registered() -> list:
    params = []
    for name in plugins.latency_models().names():
        marks = [pytest.mark.skipif(not HAVE_AIC, reason="needs dynlab[aiconfigurator]")] \
            if name == "aiconfigurator" else []
        params.append(pytest.param(name, marks=marks))
    return params


def test_builtins_are_registered():
    assert set(BUILTIN) <= set(plugins.latency_models().names())
    assert all(e.source == "dynlab" for e in plugins.latency_models().entries() if e.name in BUILTIN)


chunks = st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 32768)), max_size=4)
decodes = st.tuples(st.integers(0, 512), st.integers(0, 4096))  # requests, mean context


def make(chunk_list, requests, mean_ctx):
    return StepBatch(tuple(t for t, _ in chunk_list), tuple(c for _, c in chunk_list), requests, requests * mean_ctx)


@pytest.mark.parametrize("name", registered())
@given(chunk_list=chunks, dec=decodes, extra=st.integers(1, 4096), which=st.sampled_from(
    ["prefill_tokens", "prefill_context", "new_chunk", "decode_requests", "decode_context"]))
def test_positive_finite_and_non_decreasing(name, chunk_list, dec, extra, which):
    model = built(name)
    requests, mean_ctx = dec
    base = make(chunk_list, requests, mean_ctx)
    if which == "prefill_tokens" and chunk_list:
        bigger = make([(chunk_list[0][0] + extra, chunk_list[0][1])] + chunk_list[1:], requests, mean_ctx)
    elif which == "prefill_context" and chunk_list:
        bigger = make([(chunk_list[0][0], chunk_list[0][1] + extra)] + chunk_list[1:], requests, mean_ctx)
    elif which == "decode_requests":  # one more request at the same mean context
        bigger = StepBatch(base.prefill_tokens, base.prefill_context, requests + 1, (requests + 1) * mean_ctx)
    elif which == "decode_context" and requests:
        bigger = StepBatch(base.prefill_tokens, base.prefill_context, requests, base.decode_context + extra)
    else:  # one more prefill chunk
        bigger = make(chunk_list + [(extra, 0)], requests, mean_ctx)
    small, large = model.step_ms(base), model.step_ms(bigger)
    assert 0 < small < math.inf and 0 < large < math.inf
    if name in NOT_MONOTONE:
        return
    assert large >= small * (1 - 1e-9), (base, bigger, small, large)


NOT_MONOTONE = {"aiconfigurator"}
"""Models exempt from the monotonicity check, each with a pinned counterexample below."""


@pytest.mark.skipif(not HAVE_AIC, reason="needs dynlab[aiconfigurator]")
def test_aiconfigurator_is_not_monotone_and_we_say_so():
    # aiconfigurator-core 0.12.0 sees only sums over the batch and interpolates measured tables:
    # one more cached token, one more decode, or one more short chunk can make a step cheaper.
    # If this starts failing, upstream became monotone: drop it from NOT_MONOTONE.
    model = built("aiconfigurator")
    assert model.step_ms(StepBatch((1,), (1,), 0, 0)) < model.step_ms(StepBatch((1,), (0,), 0, 0))
    assert model.step_ms(StepBatch((), (), 33, 33 * 780)) < model.step_ms(StepBatch((), (), 32, 32 * 780))


@pytest.mark.parametrize("name", registered())
@given(requests=st.integers(0, 300), mean_ctx=st.integers(0, 20000), steps=st.integers(0, 60))
def test_decode_ms_is_the_sum_of_its_steps(name, requests, mean_ctx, steps):
    model = built(name)
    context = requests * mean_ctx
    expected = sum(model.step_ms(StepBatch((), (), requests, context + k * requests)) for k in range(steps))
    assert model.decode_ms(requests, context, steps) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@given(requests=st.integers(1, 512), mean_ctx=st.integers(0, 40000), steps=st.integers(1, 400),
       mfu=st.floats(0.01, 1), mbu=st.floats(0.01, 1))
def test_roofline_closed_form_where_compute_and_memory_cross(requests, mean_ctx, steps, mfu, mbu):
    model = build_latency_model("roofline", hardware_for("qwen3-0.6b", "l40s"), {"mfu": mfu, "mbu": mbu})
    context = requests * mean_ctx
    expected = sum(model.step_ms(StepBatch((), (), requests, context + k * requests)) for k in range(steps))
    assert model.decode_ms(requests, context, steps) == pytest.approx(expected, rel=1e-9)


# ------------------------------------------------------------------ hand-computed steps

N = 8_030_261_248          # Llama-3.1-8B parameters (tests/latency/test_hardware.py)
ATTN = 4 * 32 * 32 * 128   # 4 * layers * query heads * head_dim: FLOPs per (query, key) pair
KV = 131_072               # bytes per token: 2 * 32 layers * 8 KV heads * 128 * 2 bytes
FLOPS_PER_MS = 989e12 * 0.758 / 1e3   # h100 dense bf16 x fitted MFU
BYTES_PER_MS = 3350e9 * 0.878 / 1e3   # h100 HBM x fitted MBU


def test_roofline_prefill_by_hand():
    # one 2,048-token prefill, nothing cached: compute-bound
    compute = (2 * N * 2048 + ATTN * 2048 * (0 + 1024)) / FLOPS_PER_MS   # 45.35 ms
    memory = (2 * N + 2048 * KV) / BYTES_PER_MS                           # 5.55 ms
    assert compute > memory
    assert built("roofline").step_ms(StepBatch((2048,), (0,), 0, 0)) == pytest.approx(compute + 1.30, rel=1e-12)
    assert compute + 1.30 == pytest.approx(46.65, abs=0.01)


def test_roofline_decode_and_mixed_by_hand():
    # 64 decodes at context 2,048: memory-bound (weights once + every request's KV)
    compute = (2 * N * 64 + ATTN * 64 * 2048) / FLOPS_PER_MS              # 1.46 ms
    memory = (2 * N + 64 * 2048 * KV) / BYTES_PER_MS                      # 11.30 ms
    assert built("roofline").step_ms(StepBatch((), (), 64, 64 * 2048)) == pytest.approx(memory + 1.30, rel=1e-12)
    assert memory + 1.30 == pytest.approx(12.60, abs=0.01)
    # mixed: a 512-token chunk after 1,024 cached tokens plus those decodes, one pass
    compute = (2 * N * (512 + 64) + ATTN * (512 * (1024 + 256) + 64 * 2048)) / FLOPS_PER_MS
    memory = (2 * N + (64 * 2048 + 1024 + 512) * KV) / BYTES_PER_MS
    step = built("roofline").step_ms(StepBatch((512,), (1024,), 64, 64 * 2048))
    assert step == pytest.approx(max(compute, memory) + 1.30, rel=1e-12)


def test_roofline_tp_divides_the_work_and_adds_the_all_reduce():
    one = build_latency_model("roofline", hardware_for("qwen3-32b", "h100", 1), SERVER_TERMS_OFF["roofline"])
    two = build_latency_model("roofline", hardware_for("qwen3-32b", "h100", 2), SERVER_TERMS_OFF["roofline"])
    # qwen3-32b: 64 layers, two ring all-reduces each (after attention, after the MLP) of the step's
    # tokens x 5,120 x 2 bytes; ring: 2 (tp - 1) / tp of the bytes over one direction of H100's NVLink
    # (900 / 2 = 450 GB/s) at link_util 0.4 (180 GB/s), plus 10 us per all-reduce (comm_latency_us)
    for tokens, batch in ((4096, StepBatch((4096,), (0,), 0, 0)), (128, StepBatch((), (), 128, 128 * 4096))):
        comm = 128 * (2 * (2 - 1) / 2 * tokens * 5120 * 2 / (180e9 / 1e3) + 0.010)
        assert two.step_ms(batch) - 1.30 == pytest.approx((one.step_ms(batch) - 1.30) / 2 + comm, rel=1e-12)
    assert comm == pytest.approx(2.2121, abs=1e-4)  # 128 decodes: 0.932 ms of bytes, 1.28 ms of latency


def test_linear_by_hand():
    step = built("linear").step_ms(StepBatch((100, 200), (0, 5000), 3, 9000))
    assert step == pytest.approx(3.991 + 0.02339 * 300 + 0.10746 * 3, rel=1e-12)
    assert built("linear").decode_ms(10, 999, 7) == pytest.approx(7 * (3.991 + 0.10746 * 10), rel=1e-12)


# blis (inference-sim trained physics @ f90a1e3a), llama-3.1-8b on h100 (BLIS's table: 989.5 TFLOP/s, 3.35 TB/s):
# L=32, d=4096, 32 heads -> dH=128, 8 KV heads -> dKV=1024, dff=14336; times in us.
B_FLOPS_PER_US, B_BYTES_PER_US = 989.5e6, 3.35e6
B_TOKEN = 32 * (2 * 4096 * (2 * 4096 + 2 * 1024) + 6 * 4096 * 14336)      # projections + FFN FLOPs per token
B_PAIR = 32 * 4 * 32 * 128                                               # L * 4 * heads * dH per (query, key)
B_KV = 32 * 2 * 1024 * 2                                                 # L * 2 * dKV * 2 bytes per KV token
B_WEIGHTS_US = 32 * (4096 * (2 * 4096 + 2 * 1024) + 3 * 4096 * 14336) * 2 / B_BYTES_PER_US
B_FIXED_US = 1.36252915 * B_WEIGHTS_US + 32.09546717 * 32 + 126.024825   # weights, per layer, per step


def test_blis_prefill_by_hand():
    # one 2,048-token prefill, nothing cached: BLIS charges attention t*(s + t/2) with s = the prompt (2,048)
    flops = 2048 * B_TOKEN + B_PAIR * 2048 * (2048 + 1024)
    expected = 0.152128 * flops / B_FLOPS_PER_US + B_FIXED_US + 4.41684444 * 1
    assert built("blis").step_ms(StepBatch((2048,), (0,), 0, 0)) == pytest.approx(expected / 1e3, rel=1e-12)
    assert expected / 1e3 == pytest.approx(11.74, abs=0.01)  # the research notes' re-implementation


def test_blis_decode_and_mixed_by_hand():
    # 64 decodes at context 2,048: decode compute has coefficient 0; the KV read of context + 1 per request
    expected = 1.94710771 * B_KV * (64 * 2048 + 64) / B_BYTES_PER_US + B_FIXED_US + 4.41684444 * 64
    assert built("blis").step_ms(StepBatch((), (), 64, 64 * 2048)) == pytest.approx(expected / 1e3, rel=1e-12)
    assert expected / 1e3 == pytest.approx(17.10, abs=0.01)
    # mixed: a 512-token chunk after 1,024 cached (s = 1,536) plus those decodes; prefill KV write has coefficient 0
    prefill = 0.152128 * (512 * B_TOKEN + B_PAIR * 512 * (1536 + 256)) / B_FLOPS_PER_US
    step = built("blis").step_ms(StepBatch((512,), (1024,), 64, 64 * 2048))
    assert step == pytest.approx((prefill + expected + 4.41684444) / 1e3, rel=1e-12)
    assert built("blis").step_ms(StepBatch()) == 0.001  # an empty step: 1 us, as in BLIS


def test_blis_tp_adds_the_all_reduce_and_refuses_what_it_cannot_model():
    # qwen3-32b at tp 2 on h100: the ring all-reduce is 2L units x tokens x d x 2 bytes x 2 x (1/2), at 0.752037
    one = build_latency_model("blis", hardware_for("qwen3-32b", "h100", 2))
    comm_us = 2 * 64 * 1 * 5120 * 2 * 2 * 0.5 / B_BYTES_PER_US * 0.752037   # per token
    a, b = one.step_ms(StepBatch((), (), 1, 0)), one.step_ms(StepBatch((), (), 2, 0))
    # one more decode at context 0: + per-request 4.417 us + its comm + its KV read (1 token) and compute (coef 0)
    # BLIS ignores qwen3-32b's head_dim 128: dH = 5120 / 64 = 80, so dKV / tp = 8 * 80 / 2
    kv_us = 1.94710771 * 64 * 2 * (8 * 80 / 2) * 2 / B_BYTES_PER_US
    assert (b - a) * 1e3 == pytest.approx(4.41684444 + comm_us + kv_us, rel=1e-9)
    with pytest.raises(ValueError, match="blis: deepseek-v3 is a mixture-of-experts or MLA model"):
        build_latency_model("blis", hardware_for("deepseek-v3", "h100", 8))
    with pytest.raises(ValueError, match=r"--tp 3 cannot split qwen3-32b's 64 attention heads and 8 KV heads evenly"):
        build_latency_model("blis", hardware_for("qwen3-32b", "h100", 3))


def test_blis_gpus_outside_its_table_take_the_datasheet():
    # h200 is not in BLIS's hardware table: dynlab's 989 TFLOP/s and 4.8 TB/s; one decode at context 0 is
    # weights + per layer + per step + one request + one KV token, all memory terms at 4,800 bytes/us... x1e3
    model = build_latency_model("blis", hardware_for("llama-3.1-8b", "h200"))
    weights_us = B_WEIGHTS_US * 3.35 / 4.8
    expected = 1.36252915 * weights_us + 32.09546717 * 32 + 126.024825 + 4.41684444 + 1.94710771 * B_KV / 4.8e6
    assert model.step_ms(StepBatch((), (), 1, 0)) == pytest.approx(expected / 1e3, rel=1e-12)


def test_options_are_converted_and_checked():
    hardware = hardware_for()
    model = build_latency_model("linear", hardware, {"beta0": "2", "beta1": "0", "beta2": "0.5",
                                                     **SERVER_TERMS_OFF["linear"]})
    assert model.step_ms(StepBatch((), (), 4, 0)) == 4.0
    with pytest.raises(ValueError, match="has no option 'beta3'; its options: beta0, beta1, beta2, spec_gamma, "
                                         "cpu_step_us, cpu_us_per_request$"):
        build_latency_model("linear", hardware, {"beta3": "1"})
    with pytest.raises(ValueError, match="option 'mfu' must be <= 1.0"):
        build_latency_model("roofline", hardware, {"mfu": "1.5"})
    with pytest.raises(ValueError, match="unknown latency model 'nope'; available: .*roofline"):
        build_latency_model("nope", hardware)


# ------------------------------------------------------------------ aiconfigurator


def test_aiconfigurator_without_the_extra_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)  # import fails as if not installed
    with pytest.raises(ValueError) as info:
        build_latency_model("aiconfigurator", hardware_for())
    assert str(info.value) == ('the aiconfigurator latency model needs aiconfigurator-core: '
                               'pip install "dynlab[aiconfigurator]"')


@pytest.mark.skipif(not HAVE_AIC, reason="needs dynlab[aiconfigurator]")
def test_aiconfigurator_returns_what_its_api_returns(capfd):
    from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel

    model = build_latency_model("aiconfigurator", hardware_for("qwen3-8b", "h100"))
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # its log noise stays out of dynlab's output
    import logging

    logging.getLogger("aiconfigurator_core").setLevel(logging.CRITICAL + 1)
    direct = RustForwardPassPerfModel.from_native(dict(model.config))

    def fpm(n_prefill, tokens, kv, decodes, decode_kv):
        return {"scheduled_requests": {"num_prefill_requests": n_prefill, "sum_prefill_tokens": tokens,
                                       "sum_prefill_kv_tokens": kv, "num_decode_requests": decodes,
                                       "sum_decode_kv_tokens": decode_kv}}

    cases = [(StepBatch((2048,), (0,), 0, 0), fpm(1, 2048, 0, 0, 0)),
             (StepBatch((), (), 64, 64 * 2048), fpm(0, 0, 0, 64, 64 * 2048)),
             (StepBatch((512, 256), (1024, 0), 32, 32 * 4096), fpm(2, 768, 1024, 32, 32 * 4096))]
    for batch, record in cases:
        assert model.step_ms(batch) == direct.estimate_forward_pass_time_ms(record)
    # the reference figures of the design notes: Qwen3-8B on H100, vLLM
    assert model.step_ms(cases[0][0]) == pytest.approx(44.5, abs=0.05)
    assert model.step_ms(cases[1][0]) == pytest.approx(13.4, abs=0.05)


@pytest.mark.skipif(not HAVE_AIC, reason="needs dynlab[aiconfigurator]")
def test_aiconfigurator_refuses_what_it_cannot_model():
    with pytest.raises(ValueError, match="backend must be vllm, sglang or trtllm"):
        build_latency_model("aiconfigurator", hardware_for(), {"backend": "tgi"})


# ------------------------------------------------------------------ the plugin kind


class _Const(LatencyModel):
    """Constant: every step takes 1 ms."""

    name = "throwaway-const"

    def step_ms(self, batch):
        return 1.0


class _Plugin:
    @hookimpl
    def dynlab_register_latency_models(self, register):
        register(_Const)


def test_a_third_party_latency_model_is_seen_and_removed():
    pm = plugins.get_plugin_manager()
    plugin = _Plugin()
    pm.register(plugin, name="throwaway-latency")
    try:
        assert "throwaway-const" in plugins.latency_models()
        model = build_latency_model("throwaway-const", hardware_for())
        assert model.decode_ms(5, 100, 3) == 3.0  # the base class sums step_ms
    finally:
        pm.unregister(plugin)
    assert "throwaway-const" not in plugins.latency_models()


def test_a_non_latency_class_is_refused():
    class Bad:
        name = "bad"

    class BadPlugin:
        @hookimpl
        def dynlab_register_latency_models(self, register):
            register(Bad)

    pm = plugins.get_plugin_manager()
    plugin = BadPlugin()
    pm.register(plugin, name="throwaway-bad-latency")
    try:
        with pytest.raises(plugins.RegistryError, match="not a subclass of dynlab.latency.base.LatencyModel"):
            plugins.latency_models()
    finally:
        pm.unregister(plugin)


# the roofline beyond a dense model on one GPU (experts, MLA, windows, state, communication, attention
# data parallelism): positive, finite and non-decreasing too
BEYOND = [("qwen3-30b-a3b", "h100", 2, {"ep": 2}), ("deepseek-v3", "h200", 1, {"ep": 8, "dp_attention": True}),
          ("gpt-oss-120b", "h100", 1, {}), ("nemotron-h-56b", "h100", 2, {}), ("llama-4-scout", "h100", 4, {}),
          ("llama-3.1-70b", "h100", 2, {"pp": 2})]
_BEYOND = {}


@given(hw=st.sampled_from(BEYOND), chunk_list=chunks, dec=decodes, extra=st.integers(1, 4096), which=st.sampled_from(
    ["prefill_tokens", "prefill_context", "new_chunk", "decode_requests", "decode_context"]))
# padding rows priced as decodes that read window keys / Mamba state: test_padding_rows_read_no_* below
@example(hw=("gpt-oss-120b", "h100", 1, {}), chunk_list=[(1, 0)], dec=(16, 129), extra=7, which="prefill_tokens")
@example(hw=("nemotron-h-56b", "h100", 2, {}), chunk_list=[(1, 0)], dec=(16, 129), extra=7, which="prefill_tokens")
def test_roofline_beyond_dense_is_non_decreasing(hw, chunk_list, dec, extra, which):
    name, gpu, tp, more = hw
    if hw[0] + str(more) not in _BEYOND:
        _BEYOND[hw[0] + str(more)] = build_latency_model("roofline", hardware_for(name, gpu, tp, **more))
    model = _BEYOND[hw[0] + str(more)]
    requests, mean_ctx = dec
    base = make(chunk_list, requests, mean_ctx)
    if which == "prefill_tokens" and chunk_list:
        bigger = make([(chunk_list[0][0] + extra, chunk_list[0][1])] + chunk_list[1:], requests, mean_ctx)
    elif which == "prefill_context" and chunk_list:
        bigger = make([(chunk_list[0][0], chunk_list[0][1] + extra)] + chunk_list[1:], requests, mean_ctx)
    elif which == "decode_requests":
        bigger = StepBatch(base.prefill_tokens, base.prefill_context, requests + 1, (requests + 1) * mean_ctx)
    elif which == "decode_context" and requests:
        bigger = StepBatch(base.prefill_tokens, base.prefill_context, requests, base.decode_context + extra)
    else:
        bigger = make(chunk_list + [(extra, 0)], requests, mean_ctx)
    small, large = model.step_ms(base), model.step_ms(bigger)
    assert 0 < small < math.inf and 0 < large < math.inf
    assert large >= small * (1 - 1e-9), (hw, base, bigger, small, large)


# One 1-token prefill chunk beside 16 decodes of summed context 16 x 129 = 2,064 (17 rows, run as the CUDA graph of
# 24: 7 padding rows), against the same step with an 8-token chunk (24 rows, no padding). Both steps compute 24 rows
# of linear layers, experts (the same experts touched) and collectives, and pay the CPU of 17 requests; both are
# memory-bound, so the second is longer by the KV its 7 more prompt tokens write, and by nothing else.
# H100: 3,350 GB/s x mbu 0.878 = 2.9413e9 bytes per ms.
PADDED, UNPADDED = StepBatch((1,), (0,), 16, 16 * 129), StepBatch((8,), (0,), 16, 16 * 129)
HBM_BYTES_PER_MS = 3350e9 * 0.878 / 1e3


def test_padding_rows_read_no_window_keys():
    # gpt-oss-120b: 36 layers, 18 full and 18 with a 128-token window, 8 KV heads of 64 dims in bf16:
    # 18 x 2 (K, V) x 8 x 64 x 2 B = 36,864 B per token and group. The 16 decodes read at most 16 x 128 = 2,048
    # window keys of their 2,064 (a padding row reads none: vLLM gives it slot -1); the 7 more prompt tokens
    # write 7 x 36,864 B in each of the two groups: 2 x 7 x 36,864 = 516,096 B -> 1.75465e-4 ms.
    # (Before the fix the 7 padding rows counted as decodes: min(2,064, 23 x 128) = 2,064 window keys read,
    # 16 more than 2,048, so the padded step cost (16 - 14) x 36,864 B = 2.5066e-5 ms more than the larger one.)
    model = build_latency_model("roofline", hardware_for("gpt-oss-120b", "h100", 1))
    small, large = model.step_ms(PADDED), model.step_ms(UNPADDED)
    assert large - small == pytest.approx(2 * 7 * 36_864 / HBM_BYTES_PER_MS, rel=1e-6)
    assert large - small == pytest.approx(1.75465e-4, abs=1e-9)


def test_padding_rows_read_no_state():
    # nemotron-h-56b at tp 2: 10 attention layers of 8 KV heads of 128 dims, 2 x 8 x 128 x 2 B x 10 = 40,960 B per
    # token over min(tp, KV heads) = 2 GPUs; 54 Mamba-2 layers of state, (256 heads x 64 x 256 ssm state
    # + 3 x (256 x 64 + 2 x 8 x 256) conv) x 2 B = 8,511,488 B each, 459,620,352 B per request. The 7 more
    # prompt tokens write 7 x 40,960 / 2 = 143,360 B -> 4.8740e-5 ms; a padding row reads no state (vLLM gives it
    # the null state index, which selective_state_update skips). (Before the fix each padding row read and wrote
    # a request's state: 7 x 2 x 459,620,352 / 2 B = 1.0938 ms more for the padded step.)
    model = build_latency_model("roofline", hardware_for("nemotron-h-56b", "h100", 2))
    small, large = model.step_ms(PADDED), model.step_ms(UNPADDED)
    assert large - small == pytest.approx(7 * 40_960 / 2 / HBM_BYTES_PER_MS, rel=1e-6)
    assert large - small == pytest.approx(4.8740e-5, abs=1e-9)


def test_distinct_experts_touched_by_hand():
    # qwen3-30b-a3b on one H100: 128 experts, 8 per token; one token touches 8, expected 128 (1 - (120/128)^B)
    model = build_latency_model("roofline", hardware_for("qwen3-30b-a3b", "h100", 1))
    terms = model._terms
    assert terms._miss == 1 - 8 / 128
    for b in (1, 16, 256):
        assert 128 * (1 - terms._miss ** b) == pytest.approx({1: 8.0, 16: 128 * (1 - (15 / 16) ** 16),
                                                               256: 128 * (1 - (15 / 16) ** 256)}[b])
    assert 128 * (1 - terms._miss ** 16) == pytest.approx(82.42, abs=0.005)  # 16 decodes read ~82 of 128 experts
