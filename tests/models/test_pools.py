"""KV pools per worker, derived by hand (the numbers in the comments), and every bundled model served."""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.latency.base import StepBatch
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.models.capacity import kv_blocks
from dynlab.models.parallel import Parallelism
from dynlab.models.spec import model_names, model_spec

H100_USABLE = 80 * 2**30 * 0.9  # 77,309,411,328 B at the default utilization


def test_qwen3_32b_params_by_hand():
    h, d, inter, vocab = 5120, 128, 25600, 151936
    attn = 2 * h * 64 * d + 2 * h * 8 * d + 2 * d  # q and o; k and v (8 KV heads); q/k norms
    per_layer = attn + 3 * h * inter + 2 * h
    assert model_spec("qwen3-32b").params == 64 * per_layer + 2 * vocab * h + h == 32_762_123_264


@pytest.mark.parametrize("tp, per_token, blocks", [
    # weights 65,524,246,528 B (bf16) / tp; KV 2 x 64 layers x 8 heads x 128 x 2 = 262,144 B per token,
    # split over min(tp, 8) GPUs (at tp 16 the 8 KV heads are replicated, two GPUs each)
    (1, 262144, 2809),     # (77,309,411,328 - 65,524,246,528) / (262,144 x 16) = 2,809.8
    (4, 65536, 58105),     # (77,309,411,328 - 16,381,061,632) / (65,536 x 16) = 58,105.8
    (8, 32768, 131833),    # (77,309,411,328 - 8,190,530,816) / (32,768 x 16) = 131,833.6
    (16, 32768, 139644),   # (77,309,411,328 - 4,095,265,408) / (32,768 x 16) = 139,644.9
])
def test_qwen3_32b_pool_at_tp(tp, per_token, blocks):
    got, why = kv_blocks("qwen3-32b", "h100", 16, tp)
    assert got == blocks == math.floor((H100_USABLE - 65_524_246_528 / tp) / (per_token * 16))
    assert f"({per_token} B/token/GPU x 16)" in why


def test_mixtral_at_tp_2():
    # 46,702,792,704 parameters x 2 B = 93,405,585,408 B, half per GPU; KV 131,072 B per token, 65,536 per GPU
    assert kv_blocks("mixtral-8x7b", "h100", 16, 2)[0] == 29188  # (77,309,411,328 - 46,702,792,704) / 1,048,576


def test_qwen3_30b_a3b_on_one_h100():
    # every one of the 128 experts resident: 30,532,122,624 x 2 = 61,064,245,248 B; KV 2 x 48 x 4 x 128 x 2
    assert kv_blocks("qwen3-30b-a3b", "h100", 16, 1)[0] == 10328  # 16,245,166,080 / (98,304 x 16) = 10,328.4


def test_expert_parallelism_moves_only_the_experts():
    spec = model_spec("deepseek-v3")
    # 8 x H200 with attention data-parallel: each GPU keeps all non-expert weights and 1/8 of the experts,
    # and its own requests' full MLA latent; the worker's pool is the 8 replicas'
    par = Parallelism(tp=1, ep=8, dp_attention=True)
    weights = (spec.weight_bytes - spec.expert_weight_bytes) + spec.expert_weight_bytes / 8
    per_gpu = math.floor((141 * 2**30 * 0.9 - weights) / (spec.kv_bytes_per_token * 16))
    blocks, why = kv_blocks(spec, "h200", 16, parallel=par)
    assert blocks == 8 * per_gpu and why.startswith("8 x floor(") and "(tp 1 x ep 8 (dp-attention 8))" in why
    # ep = tp: the same bytes per GPU as tensor parallelism, so the same pool
    assert kv_blocks("qwen3-30b-a3b", "h100", 16, parallel=Parallelism(2, 2))[0] == kv_blocks(
        "qwen3-30b-a3b", "h100", 16, 2)[0]


def test_pipeline_stages_split_weights_and_kv():
    spec = model_spec("llama-3.1-70b")
    blocks, why = kv_blocks(spec, "h100", 16, parallel=Parallelism(tp=2, pp=2))
    # 4 GPUs: weights / 4 each; KV of 40 layers per stage, 8 KV heads / 2
    assert blocks == math.floor((H100_USABLE - spec.weight_bytes / 4) / (spec.kv_bytes_per_token / 2 / 2 * 16))
    assert "per worker of 4 x h100 (tp 2 x pp 2)" in why


@pytest.mark.parametrize("degrees, message", [
    (dict(tp=1, ep=3), "--ep 3 does not divide qwen3-30b-a3b's 128 experts"),
    (dict(tp=2, ep=4), "--ep 4 must equal --tp 2"),
    (dict(tp=1, pp=5), "--pp 5 does not divide qwen3-30b-a3b's 48 layers"),
    (dict(tp=3), "--tp 3 cannot split qwen3-30b-a3b's 32 attention heads"),
    (dict(tp=4, ep=2, dp_attention=True), "--ep 2 is not a multiple of --tp 4"),
])
def test_refusals_name_the_degree_and_what_it_does_not_divide(degrees, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        hardware_for("qwen3-30b-a3b", "h100", degrees.pop("tp"), **degrees)
    with pytest.raises(ValueError, match="--ep 2: llama-3.1-8b has no experts to divide"):
        hardware_for("llama-3.1-8b", "h100", 2, ep=2)


#: a GPU and parallelism that fit each bundled model (weights well under 90 % of memory)
FITS = {
    "deepseek-v3": ("h200", 8, {"ep": 8}), "gemma-3-1b": ("h100", 1, {}), "gemma-3-27b": ("h100", 1, {}),
    "gpt-oss-120b": ("h100", 1, {}), "gpt-oss-20b": ("h100", 1, {}), "kimi-k2": ("h200", 8, {}),
    "llama-3-8b": ("h100", 1, {}), "llama-3.1-70b": ("h100", 4, {}), "llama-3.1-8b": ("h100", 1, {}),
    "llama-4-maverick": ("h200", 8, {"ep": 8}), "llama-4-scout": ("h100", 4, {}),
    "mixtral-8x7b": ("h100", 2, {}), "nemotron-h-56b": ("h100", 2, {}), "qwen3-0.6b": ("h100", 1, {}),
    "qwen3-235b-a22b": ("h100", 8, {"ep": 8}), "qwen3-30b-a3b": ("h100", 1, {}), "qwen3-32b": ("h100", 1, {}),
    "qwen3-8b": ("h100", 1, {}),
}


def test_every_bundled_model_has_a_fit():
    assert set(FITS) == set(model_names())


@pytest.mark.parametrize("name", sorted(FITS))
def test_every_bundled_model_is_served_with_a_pool_and_a_domain(name):
    gpu, tp, extra = FITS[name]
    hardware = hardware_for(name, gpu, tp, **extra)
    blocks, _ = kv_blocks(hardware.model, hardware.gpu, 16, tp, parallel=hardware.parallel)
    assert blocks > 0
    roofline = build_latency_model("roofline", hardware)
    for batch in (StepBatch((2048,), (0,), 0, 0), StepBatch((), (), 64, 64 * 4096)):
        assert 0 < roofline.step_ms(batch) < math.inf
    dense_fit = name in ("llama-3-8b", "llama-3.1-8b", "qwen3-0.6b", "qwen3-8b", "qwen3-32b")
    assert (roofline.domain() is None) == dense_fit


@pytest.mark.parametrize("name", ["gpt-oss-120b", "nemotron-h-56b", "deepseek-v3"])
def test_sim_timing_runs_and_says_its_domain(name):
    gpu, tp, extra = FITS[name]
    args = ["sim", "--timing", "--quiet", "--model", name, "--gpu", gpu, "--tp", str(tp), "--reps", "2"]
    for key, value in extra.items():
        args += [f"--{key}", str(value)]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["kv_blocks"] > 0 and result["latency_domain"].startswith("outside its fit")
    assert out.stderr.startswith(f"Warning: latency model roofline: outside its fit") and out.stderr.count("\n") == 1


# qwen3-8b target: 16,381,470,720 B of weights, KV 2 x 36 layers x 8 heads x 128 x 2 = 147,456 B per token;
# qwen3-0.6b draft: 1,192,099,840 B, KV 2 x 28 x 8 x 128 x 2 = 114,688 B per token; both split over tp (<= 8 heads)
@pytest.mark.parametrize("tp, blocks", [
    (1, 14242),  # (77,309,411,328 - 17,573,570,560) / ((147,456 + 114,688) x 16) = 59,735,840,768 / 4,194,304 = 14,242.1
    (2, 32674),  # (77,309,411,328 - 8,786,785,280) / ((73,728 + 57,344) x 16) = 68,522,626,048 / 2,097,152 = 32,674.1
])
def test_a_draft_model_takes_weights_and_kv_from_the_pool(tp, blocks):
    """vLLM loads the draft model before it profiles the KV memory, and gives the draft's layers KV in the same
    block table: the draft's weights (split over tp) leave the pool, and each block holds both models' KV."""
    got, why = kv_blocks("qwen3-8b", "h100", 16, tp, draft=model_spec("qwen3-0.6b"))
    assert got == blocks
    assert "1,192,099,840 B draft qwen3-0.6b weights" in why and f"= {blocks} blocks" in why
    assert kv_blocks("qwen3-8b", "h100", 16, tp)[0] > blocks  # without the draft: 25,824 at tp 1


def test_a_draft_model_that_does_not_fit_is_one_line(tmp_path):
    """llama-3.1-8b (16,060,522,496 B) + a llama-3.1-70b draft (141,107,412,992 B): 146.4 GiB of weights against 72.0 GiB usable on one H100."""
    r = CliRunner().invoke(main, ["sim", "--timing", "--spec-method", "draft", "--spec-tokens", "2",
                                  "--spec-model", "llama-3.1-70b", "--quiet"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("Error: llama-3.1-8b with draft llama-3.1-70b does not fit on 1 x h100: ")
    assert line.endswith("GiB of weights per GPU, 72.0 GiB usable")


def test_a_draft_run_reports_the_smaller_pool():
    """sim --timing with a draft: kv_blocks is the pool of the test above, and its source names the draft."""
    args = ["sim", "--timing", "--model", "qwen3-8b", "--spec-method", "draft", "--spec-tokens", "2"]
    r = json.loads(CliRunner().invoke(main, args + ["--spec-model", "qwen3-0.6b"]).stdout.splitlines()[0])
    assert r["kv_blocks"] == 14242 and "draft qwen3-0.6b" in r["kv_blocks_source"]
    plain = json.loads(CliRunner().invoke(main, args).stdout.splitlines()[0])  # the /10 rule: no draft model
    assert plain["kv_blocks"] == 25824


def test_a_draft_model_with_pipeline_parallelism_is_refused():
    """The draft is sized with --tp only: a layout dynlab does not size it in is refused, not silently ignored."""
    with pytest.raises(ValueError, match=r"^--spec-model: dynlab sizes a draft model beside the target with --tp only"):
        kv_blocks("qwen3-8b", "h100", 16, draft=model_spec("qwen3-0.6b"), parallel=Parallelism(tp=2, pp=2))
