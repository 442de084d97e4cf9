"""``dynlab plan --engine vllm,sglang``: the engine kind as a candidate dimension (issue 40 item 3), each shape
replayed with its own engine's scheduler options, as ``compare --engine vllm,sglang`` runs each.

The trace and step model are tests/test_plan.py's: 12 requests of 1,000 prompt tokens and 1 output token, all at
t = 0 with blocks of their own, on the linear model (1 ms per step + 0.01 ms per prefill token, overheads off).
"""
from __future__ import annotations

import json

import pytest

import dynlab
from dynlab.engine.config import SimConfig
from dynlab.plan.search import Shape

from helpers import terms_off
from test_plan import LINEAR, _json, _plan, _trace

#: SGLang's chunk: half a prompt, so each 1,000-token prompt takes two prefill passes on an SGLang worker
SGLANG_CHUNK = ["--chunked-prefill-size", 500]


@pytest.fixture
def queue_trace(tmp_path):
    return _trace(tmp_path / "q.jsonl", [(0, 1000, 1)] * 12)


def test_engines_need_different_worker_counts(queue_trace, tmp_path):
    # vLLM (step budget 1,000 tokens): a prompt is one step of 1 + 1000 x 0.01 = 11 ms, so a worker's k-th
    # request has its first token at 11 k ms. SGLang (chunk 500): two passes of 1 + 500 x 0.01 = 6 ms, the next
    # request gets no room in a pass its predecessor's chunk fills, so the k-th first token is at 12 k ms.
    # rr over N workers gives each 12 / N requests, so p99 TTFT is 11 x 12/N (vLLM) or 12 x 12/N (SGLang):
    # N = 3: 44 ms (meets 45) and 48 ms (misses); N = 4: SGLang 36 ms (meets). vLLM needs 3, SGLang 4.
    log = tmp_path / "log.jsonl"
    plan = _json("--trace", queue_trace, "--slo-ttft-ms", 45, *LINEAR, *SGLANG_CHUNK, "--engine", "vllm,sglang",
                 "--log", log)
    by = {s["shape"]: s for s in plan["shapes"]}
    vllm, sglang = by["h100x1 rr vllm"], by["h100x1 rr sglang"]
    assert (vllm["engine"], vllm["workers"], vllm["ttft_ms"]) == ("vllm", 3, 44.0)
    assert (sglang["engine"], sglang["workers"], sglang["ttft_ms"]) == ("sglang", 4, 36.0)
    assert [(r["workers"], r["meets"]) for r in sglang["replays"] if r["workers"] == 3] == [(3, False)]
    assert [s["shape"] for s in plan["shapes"]][0] == "h100x1 rr vllm"  # fewer GPUs ranks first
    # each engine's own scheduler options: vLLM's step budget on vLLM replays only, SGLang's chunk on SGLang's
    cells = [json.loads(line)["cell"] for line in log.read_text().splitlines()]
    assert {c.get("engine_kind", "vllm") for c in cells} == {"vllm", "sglang"}
    for c in cells:
        sgl = c.get("engine_kind") == "sglang"
        assert ("chunked_prefill_size" in c, "max_num_batched_tokens" in c) == (sgl, not sgl), c


def test_each_shapes_replay_is_sims(queue_trace, tmp_path):
    # the SGLang shape's replay at its answer is `sim --engine sglang` at that count, figure for figure
    log = tmp_path / "log.jsonl"
    _json("--trace", queue_trace, "--slo-ttft-ms", 45, *LINEAR, *SGLANG_CHUNK, "--engine", "vllm,sglang", "--log", log)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    (got,) = [r["result"] for r in rows if r["cell"].get("engine_kind") == "sglang" and r["cell"]["workers"] == 4]
    opts = {"beta0": "1", "beta1": "0.01", "beta2": "0"}
    sim = dynlab.run(SimConfig(trace=queue_trace, timing=True, workers=4, mode="rr", engine_kind="sglang",
                               latency_model="linear", chunked_prefill_size=500, slo_ttft_ms=45,
                               **terms_off("linear", opts)))
    assert got["ttft_ms"] == sim["ttft_ms"] == {"p50": 24.0, "p90": 36.0, "p99": 36.0, "mean": 24.0}


def test_one_engine_keeps_the_labels_and_json(queue_trace):
    # a single --engine is every replay's, as before: no engine word in the label, no engine key
    i = LINEAR.index("--max-num-batched-tokens")  # vLLM's step budget: refused with SGLang alone
    plan = _json("--trace", queue_trace, "--slo-ttft-ms", 45, *LINEAR[:i], *LINEAR[i + 2:], *SGLANG_CHUNK,
                 "--engine", "sglang")
    (shape,) = plan["shapes"]
    assert (shape["shape"], shape["workers"]) == ("h100x1 rr", 4) and "engine" not in shape


def test_shape_label_and_config():
    base = SimConfig(timing=True, max_num_batched_tokens=1000, chunked_prefill_size=500)
    vllm, sgl = Shape("llama3-8b", "h100", 1, "rr", engine="vllm"), Shape("llama3-8b", "h100", 1, "rr", engine="sglang")
    assert (vllm.label, sgl.label, Shape("llama3-8b", "h100", 1, "rr").label) == ("h100x1 rr vllm", "h100x1 rr sglang",
                                                                                 "h100x1 rr")
    v, s = vllm.config(base), sgl.config(base)
    assert (v.engine_kind, v.max_num_batched_tokens, v.chunked_prefill_size) == ("vllm", 1000, None)
    assert (s.engine_kind, s.max_num_batched_tokens, s.chunked_prefill_size) == ("sglang", 8192, 500)
    assert Shape("llama3-8b", "h100", 1, "rr", pd=True, engine="sglang").impossible().startswith("a P/D fleet")
    assert Shape("llama3-8b", "h100", 1, "rr", cpu_memory_gb=64.0, engine="sglang").impossible()
    assert not Shape("llama3-8b", "h100", 1, "rr", cpu_memory_gb=64.0, engine="vllm").impossible()


def test_sglang_shapes_without_what_sglang_lacks_are_left_out(queue_trace):
    # --split agg,auto: the SGLang P/D shape is left out (not modelled), said on stderr; the others are planned
    out = _plan("--trace", queue_trace, "--slo-ttft-ms", 45, *LINEAR, *SGLANG_CHUNK, "--engine", "vllm,sglang",
                "--split", "agg,auto", "--max-workers", 6)
    assert out.exit_code == 0, out.stderr
    assert "left out 1 candidate no worker can be: h100x1 rr sglang P/D (a P/D fleet with --engine sglang" in out.stderr
    assert sorted(s["shape"] for s in json.loads(out.stdout)["shapes"]) == ["h100x1 rr sglang", "h100x1 rr vllm",
                                                                          "h100x1 rr vllm P/D"]


@pytest.mark.parametrize("args, message", [
    # every SGLang shape left out (a CPU tier each): SGLang's options would do nothing
    (["--engine", "vllm,sglang", "--cpu-memory-gb", "64", *SGLANG_CHUNK],
     "--chunked-prefill-size has no effect without an sglang candidate left"),
    # SGLang's options with vLLM alone: sim's own rule
    (["--engine", "vllm", *SGLANG_CHUNK], "--chunked-prefill-size has no effect without --engine sglang"),
    (["--engine", "vllm,vllm"], "--engine"),
])
def test_engine_refusals(queue_trace, args, message):
    out = _plan("--trace", queue_trace, "--slo-ttft-ms", 45, *LINEAR, *args)
    assert out.exit_code == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_floors_chunk_an_sglang_prompt_at_its_chunk():
    # the prefill floor of a 1,000-token prompt alone on the linear model: vLLM's budget (1,000) makes it one
    # step of 1 + 10 = 11 ms; SGLang's chunk 500 two passes of 1 + 5 = 6 ms (12 ms); -1 (no chunking) one pass,
    # 11 ms; SGLang's default chunk on an H100 (80 GB: 8,192, below 90 GiB) one pass too
    from dynlab.latency.grid import build_latency_model, hardware_for
    from dynlab.plan.analysis import floors, prefill_chunk

    base = SimConfig(timing=True, latency_model="linear", max_num_batched_tokens=1000, mode="rr",
                     **terms_off("linear", {"beta0": "1", "beta1": "0.01", "beta2": "0"}))
    lat = build_latency_model("linear", hardware_for(base.model, base.gpu, base.tp), base.latency_opts)
    from dynlab.routing.strategy import Request

    requests = [Request((1, 2), 1000, 1, timestamp=0)]  # blocks of its own: no prefix hit
    sgl = Shape(base.model, base.gpu, 1, "rr", engine="sglang")
    cases = [(base, 1000, 11.0), (sgl.config(replace_chunk(base, 500)), 500, 12.0),
             (sgl.config(replace_chunk(base, -1)), None, 11.0), (sgl.config(base), 8192, 11.0)]
    for config, chunk, ttft in cases:
        assert chunk is None or prefill_chunk(config, lat) == chunk
        assert floors(requests, lat, config, 512).ttft == (ttft,)


def replace_chunk(config, chunk):
    from dataclasses import replace

    return replace(config, chunked_prefill_size=chunk)
