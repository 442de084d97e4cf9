"""SGLang's own server terms (issue 38 item 3): on an ``--engine sglang`` run the latency model's step CPU time
and CUDA-graph padding default to SGLang's (dynlab.latency.overheads, dynlab.engine.sglang.defaults), each
pinned by hand from sglang 0.5.23's sources; a value given still wins, 0 still switches a term off, and a vLLM
run keeps vLLM's."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.engine.kinds import run_latency_model
from dynlab.engine.sglang.defaults import cuda_graph_max_bs_default, server_terms
from dynlab.latency.base import StepBatch
from dynlab.latency.grid import build_latency_model, hardware_for, latency_grid
from dynlab.latency.overheads import (CPU_STEP_US, CPU_US_PER_REQUEST, ServerTerms, sglang_decode_sizes,
                                      sglang_prefill_sizes)

HW = hardware_for("llama-3.1-8b", "h100", 1)
#: SGLang's rule on, no CPU time: the padding alone
SG = {"cpu_step_us": 0.0, "cpu_us_per_request": 0.0, "cuda_graphs": "sglang", "cuda_graph_max": 256,
      "cuda_graph_prefill_max": 8192}
OFF = {**SG, "cuda_graph_max": 0, "cuda_graph_prefill_max": 0}


def test_decode_ladder_is_sglangs():
    # generate_decode_cuda_graph_batch_sizes: [1, 2, 4, 8, 12] + range(16, 257, 8) + range(272, 512, 16)
    # + range(512, max_bs + 1, 32), max_bs appended when off the ladder
    sizes = sglang_decode_sizes(256)
    assert sizes[:8] == (1, 2, 4, 8, 12, 16, 24, 32)
    assert sizes[-1] == 256 and len(sizes) == 5 + 31
    big = sglang_decode_sizes(640)
    assert big[36:39] == (272, 288, 304) and big[-6:] == (496, 512, 544, 576, 608, 640)
    assert sglang_decode_sizes(100)[-3:] == (88, 96, 100)  # the largest itself is captured
    assert sglang_decode_sizes(0) == ()


def test_prefill_ladder_is_sglangs():
    # generate_prefill_cuda_graph_batch_sizes: steps of 4, 16, 32, 64, 256, 512 tokens
    sizes = sglang_prefill_sizes(8192)
    assert sizes[:9] == (4, 8, 12, 16, 20, 24, 28, 32, 48)
    assert sizes[21:24] == (256, 288, 320) and sizes[29:32] == (512, 576, 640)
    assert sizes[37:39] == (1024, 1280) and sizes[49:52] == (4096, 4608, 5120)
    assert sizes[-1] == 8192 and len(sizes) == 8 + 14 + 8 + 8 + 12 + 8
    assert sglang_prefill_sizes(5000)[-1] == 4608  # not appended when off the ladder
    assert sglang_prefill_sizes(3) == () and sglang_prefill_sizes(0) == ()


@pytest.mark.parametrize("gib,tp,max_bs", [(16, 1, 8), (16, 8, 8), (24, 1, 48), (24, 4, 160), (40, 2, 32),
                                           (40, 4, 160), (80, 1, 256), (80, 8, 512), (141, 3, 256), (141, 8, 512),
                                           (180, 1, 512), (288, 8, 512)])
def test_decode_graph_max_by_gpu_memory_and_tp(gib, tp, max_bs):
    # sglang 0.5.23 arg_groups/memory_hook.py handle_gpu_memory_settings
    assert cuda_graph_max_bs_default(gib, tp) == max_bs


def test_sglang_defaults_by_hand():
    assert server_terms(None, HW) == SG  # H100 (80 GiB) at tp 1: decode 256, prefill = the chunk 8,192
    dsv3 = hardware_for("deepseek-v3", "h200", 8)  # MLA: the prefill graph at most 8,192 tokens
    big_chunk = SimConfig(engine_kind="sglang", chunked_prefill_size=32768, max_running_requests=256)
    assert server_terms(big_chunk, dsv3) == {**SG, "cuda_graph_max": 256, "cuda_graph_prefill_max": 8192}
    assert server_terms(None, dsv3)["cuda_graph_max"] == 512  # tp >= 4
    no_chunk = SimConfig(engine_kind="sglang", chunked_prefill_size=-1, max_running_requests=64)
    assert server_terms(no_chunk, HW) == {**SG, "cuda_graph_max": 64, "cuda_graph_prefill_max": 0}
    assert server_terms(None, hardware_for("llama-3.1-8b", "a100-40gb", 1))["cuda_graph_prefill_max"] == 4096


def test_an_sglang_run_takes_them_and_a_given_value_wins():
    vllm = run_latency_model(SimConfig(timing=True), HW)
    assert (vllm.opts["cpu_step_us"], vllm.opts["cpu_us_per_request"], vllm.opts["cuda_graph_max"],
            vllm.opts["cuda_graphs"]) == (CPU_STEP_US, CPU_US_PER_REQUEST, 512, "vllm")
    sg = run_latency_model(SimConfig(timing=True, engine_kind="sglang"), HW)
    assert {k: sg.opts[k] for k in SG} == SG
    given_ = SimConfig(timing=True, engine_kind="sglang",
                       latency_opts={"cpu_step_us": "126.5", "cuda_graph_max": "0", "cuda_graphs": "vllm"})
    mine = run_latency_model(given_, HW)
    assert (mine.opts["cpu_step_us"], mine.opts["cuda_graph_max"], mine.opts["cuda_graphs"]) == (126.5, 0, "vllm")
    assert mine.opts["cpu_us_per_request"] == 0.0  # the others stay SGLang's
    lin = run_latency_model(SimConfig(timing=True, engine_kind="sglang", latency_model="linear"), HW)
    assert (lin.opts["cpu_step_us"], lin.opts["cpu_us_per_request"]) == (0.0, 0.0)  # no graph options: ignored


@pytest.mark.parametrize("decodes,padded_to", [(3, 4), (5, 8), (9, 12), (13, 16), (250, 256)])
def test_a_decode_pass_costs_sglangs_capture_size(decodes, padded_to):
    on, off = build_latency_model("roofline", HW, SG), build_latency_model("roofline", HW, OFF)
    context = 1000 * decodes
    assert on.step_ms(StepBatch((), (), decodes, context)) == off.step_ms(StepBatch((), (), padded_to, context))


def test_decode_above_the_largest_runs_eagerly():
    on, off = build_latency_model("roofline", HW, SG), build_latency_model("roofline", HW, OFF)
    batch = StepBatch((), (), 257, 257_000)  # above 256: no graph
    assert on.step_ms(batch) == off.step_ms(batch)


@pytest.mark.parametrize("tokens,decodes,pad", [(100, 0, 12), (100, 5, 7), (2, 0, 2), (1, 0, 0), (3, 0, 1),
                                                (600, 0, 40), (5000, 0, 120), (8192, 0, 0), (8193, 0, 0)])
def test_prefill_passes_pad_their_input_ids(tokens, decodes, pad):
    """A pass of ``tokens`` prefill tokens plus ``decodes`` mixed-in decodes runs the breakable prefill graph of
    the next size; 1 token would run the graph of 4 (more than twice it): eager. Its GPU time is that of ``pad``
    more rows of no KV (decodes of context 0), its chunk's attention unchanged."""
    terms = ServerTerms(SG)
    assert terms.step_pad(StepBatch((tokens,), (0,), decodes, 10 * decodes)) == pad
    on, off = build_latency_model("roofline", HW, SG), build_latency_model("roofline", HW, OFF)
    batch = StepBatch((tokens,), (0,), decodes, 10 * decodes)
    assert on.step_ms(batch) == pytest.approx(off.step_ms(StepBatch((tokens,), (0,), decodes + pad, 10 * decodes)),
                                              rel=1e-12)


def test_vllms_rule_is_unchanged():
    vllm = ServerTerms({"cuda_graph_max": 512})  # a model's options without cuda_graphs: vLLM's
    assert vllm.step_pad(StepBatch((100,), (0,), 0, 0)) == 4  # 100 -> 104, vLLM's ladder of 8
    assert vllm.step_pad(StepBatch((), (), 9, 900)) == 7  # 9 -> 16
    with pytest.raises(ValueError, match="cuda_graphs"):
        ServerTerms({"cuda_graphs": "trtllm"})


batches = st.builds(lambda chunks, decodes: StepBatch(tuple(t for t, _ in chunks), tuple(c for _, c in chunks),
                                                      decodes, 700 * decodes),
                    st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 5000)), max_size=3), st.integers(0, 600))


@given(batch=batches, decode_max=st.sampled_from([0, 8, 256, 512]), prefill_max=st.sampled_from([0, 2048, 8192]))
def test_padding_never_shortens_a_step_and_pads_only_graphed_passes(batch, decode_max, prefill_max):
    opts = {**SG, "cuda_graph_max": decode_max, "cuda_graph_prefill_max": prefill_max}
    terms = ServerTerms(opts)
    pad = terms.step_pad(batch)
    tokens = sum(batch.prefill_tokens)
    if tokens > 0:  # a prefill (extend or mixed) pass: its input ids on the prefill graphs, within twice its size
        n = tokens + batch.decode_requests
        assert pad == 0 or (n <= prefill_max and n + pad in sglang_prefill_sizes(prefill_max) and pad <= n)
    else:  # a decode pass: its requests on the decode graphs
        n = batch.decode_requests
        assert pad == 0 or (n <= decode_max and n + pad in sglang_decode_sizes(decode_max))
    on, off = build_latency_model("roofline", HW, opts), build_latency_model("roofline", HW, OFF)
    assert on.step_ms(batch) >= off.step_ms(batch)


@given(requests=st.integers(1, 600), context=st.integers(1, 50_000), steps=st.integers(0, 200))
def test_closed_form_decode_is_the_sum_of_its_steps_under_sglangs_rule(requests, context, steps):
    model = build_latency_model("roofline", HW, {**SG, "cpu_step_us": 50.0, "cpu_us_per_request": 2.0})
    summed = sum(model.step_ms(StepBatch((), (), requests, context + k * requests)) for k in range(steps))
    assert model.decode_ms(requests, context, steps) == pytest.approx(summed, rel=1e-9, abs=1e-9)


def test_dynlab_latency_shows_sglangs_terms():
    grid = latency_grid(("roofline", "linear"), engine="sglang")
    assert grid["engine"] == "sglang"
    assert grid["latency_models"]["roofline"]["server_terms"] == SG
    assert grid["latency_models"]["linear"]["server_terms"] == {"cpu_step_us": 0.0, "cpu_us_per_request": 0.0}
    vllm = latency_grid(("roofline",))
    assert "engine" not in vllm and set(vllm["latency_models"]["roofline"]["server_terms"]) == {
        "cpu_step_us", "cpu_us_per_request", "cuda_graph_max"}
    out = CliRunner().invoke(main, ["latency", "--engine", "sglang", "--format", "table"])
    assert out.exit_code == 0, out.output
    assert "llama-3.1-8b on 1 x h100 (sglang)" in out.output
    assert ("roofline includes server CPU 0 us per step + 0 us per request; decode passes of <= 256 requests and "
            "prefill passes of <= 8,192 tokens padded to SGLang's CUDA-graph sizes") in out.output
    given_ = CliRunner().invoke(main, ["latency", "--engine", "sglang", "--latency-opt", "cpu_step_us=7",
                                       "--format", "json"])
    assert json.loads(given_.output)["latency_models"]["roofline"]["server_terms"]["cpu_step_us"] == 7.0
    bad = CliRunner().invoke(main, ["latency", "--engine", "nope"])
    assert bad.exit_code == 2 and "unknown engine kind 'nope'" in bad.output
