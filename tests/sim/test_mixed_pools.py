"""Mixed GPU pools in one fleet (``--pool GPU:tpN:COUNT``, dynlab.engine.pools; issue 41 item 5)."""
from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from click.testing import CliRunner

from dynlab import SimConfig, run
from dynlab.cli import main
from dynlab.engine.pools import Pool, parse_pool, pool_of_worker
from dynlab.routing.strategy import FleetView, Request, RunContext
from dynlab_builtins.scorers import KvUsageScorer


def _trace(path, n: int, gap_ms: float, input_length: int = 2048, output_length: int = 64) -> str:
    """``n`` Mooncake rows ``gap_ms`` apart, no block shared between requests (512-token blocks: 4 ids of 2,048)."""
    rows = [{"timestamp": gap_ms * i, "input_length": input_length, "output_length": output_length,
             "hash_ids": [100 * i + k for k in range(-(-input_length // 512))]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_parse_pool_reads_gpu_tp_count_from_the_right():
    assert parse_pool("h100:tp1:4") == Pool("h100", 1, 4)
    assert parse_pool("h200:tp2:2").text == "h200:tp2:2"
    assert parse_pool("/a:b/gpu.json:tp8:1") == Pool("/a:b/gpu.json", 8, 1)  # a file path may hold ':'
    for bad in ("h100", "h100:1:4", "h100:tp1", ":tp1:2", "h100:tpx:2", "h100:tp0:2", "h100:tp1:0"):
        with pytest.raises(ValueError, match="--pool"):
            parse_pool(bad)
    assert parse_pool("decode:h200:tp2:2") == Pool("h200", 2, 2, "decode")
    assert parse_pool("prefill:h100:tp1:3").text == "prefill:h100:tp1:3"
    # 4 workers of pool 0 then 2 of pool 1: ids 0..3 and 4..5
    assert pool_of_worker([Pool("h100", 1, 4), Pool("h200", 2, 2)]) == [0, 0, 0, 0, 1, 1]


def test_one_pool_is_the_same_run_as_workers_gpu_tp(tmp_path):
    trace = _trace(tmp_path / "t.jsonl", 12, 40.0)
    pooled = run(SimConfig(trace=trace, timing=True, mode="kv-cost", pools=("h200:tp2:3",)))
    plain = run(SimConfig(trace=trace, timing=True, mode="kv-cost", workers=3, gpu="h200", tp=2))
    added = {k: pooled.pop(k) for k in ("gpus", "pools", "gpu_hours_by_gpu")}
    assert json.dumps(pooled) == json.dumps(plain)  # every figure and key, in order
    assert added["gpus"] == 6  # 3 workers x tp 2
    (pool,) = added["pools"]
    assert (pool["gpu"], pool["tp"], pool["workers"], pool["worker_ids"]) == ("h200", 2, 3, [0, 2])
    assert pool["kv_blocks"] == plain["kv_blocks"] and pool["requests"] == 12
    assert pool["ttft_ms"] == {"p50": plain["ttft_ms"]["p50"], "p99": plain["ttft_ms"]["p99"]}
    assert pool["tpot_ms"] == {"p50": plain["tpot_ms"]["p50"]}


def test_mixed_pools_each_have_their_own_pool_and_figures(tmp_path):
    trace = _trace(tmp_path / "t.jsonl", 10, 30.0)
    r = run(SimConfig(trace=trace, timing=True, mode="rr", pools=("h100:tp1:2", "h200:tp2:1")))
    h100 = run(SimConfig(trace=trace, timing=True, mode="rr", workers=2, gpu="h100", tp=1, num_requests=1))
    h200 = run(SimConfig(trace=trace, timing=True, mode="rr", workers=1, gpu="h200", tp=2, num_requests=1))
    a, b = r["pools"]
    assert r["workers"] == 3 and r["gpus"] == 2 * 1 + 1 * 2
    assert (a["worker_ids"], b["worker_ids"]) == ([0, 1], [2, 2])
    # each pool's KV pool is the homogeneous run's of its GPU and tp (dynlab.models.capacity)
    assert (a["kv_blocks"], b["kv_blocks"]) == (h100["kv_blocks"], h200["kv_blocks"])
    assert "gpu" not in r and "kv_blocks" not in r  # they differ per pool: in the pools section only
    # round robin over 3 workers, 10 requests: workers 0, 1, 2 get 4, 3, 3; pool 0 holds workers 0 and 1
    assert r["requests_per_worker"] == [4, 3, 3] and (a["requests"], b["requests"]) == (7, 3)
    # gpu_hours: GPUs held from 0 ms to the last finish; the first arrival is at 0, so last finish = makespan
    hours = r["makespan_s"] * 1000.0 / 3.6e6
    assert a["gpu_hours"] == pytest.approx(2 * hours, abs=1e-6) and b["gpu_hours"] == pytest.approx(2 * hours, abs=1e-6)
    assert r["gpu_hours_by_gpu"] == {"h100": a["gpu_hours"], "h200": b["gpu_hours"]}
    # the run's per-GPU throughput divides by the 4 GPUs of both pools
    assert r["output_tokens_per_s_per_gpu"] == round(r["output_tokens_per_s"] / 4, 1)


def test_kv_cost_sends_more_requests_to_the_faster_pool(tmp_path):
    # One request alone (2,048 prompt tokens, 64 out): its E2E on each GPU (llama-3.1-8b, roofline).
    solo = _trace(tmp_path / "one.jsonl", 1, 0.0)
    fast = run(SimConfig(trace=solo, timing=True, pools=("h100:tp1:1",)))["e2e_ms"]["p50"]
    slow = run(SimConfig(trace=solo, timing=True, pools=("l4:tp1:1",)))["e2e_ms"]["p50"]
    gap, n = 700.0, 6
    # The arithmetic the outcome rests on: the H100 ends a request before the next arrives (fast < gap),
    # the L4 holds one past the last arrival ((n - 1) x gap = 3,500 ms < slow).
    assert fast < gap and slow > (n - 1) * gap
    trace = _trace(tmp_path / "t.jsonl", n, gap)
    # kv-cost (no block shared): an idle worker costs 2 x 4 blocks; a worker holding a request costs more. At
    # each arrival the H100 is idle; while both are, the tie is drawn; once the L4 holds a request it keeps it
    # past the last arrival, so every later request goes to the H100: the L4 gets at most one of the six.
    for pools, fast_id in ((("h100:tp1:1", "l4:tp1:1"), 0), (("l4:tp1:1", "h100:tp1:1"), 1)):
        r = run(SimConfig(trace=trace, timing=True, mode="kv-cost", pools=pools))
        assert r["requests_per_worker"][fast_id] >= n - 1
        assert r["pools"][fast_id]["requests"] >= n - 1 and r["pools"][fast_id]["gpu"] == "h100"
    # round robin ignores speed: 3 and 3
    assert run(SimConfig(trace=trace, timing=True, mode="rr", pools=("h100:tp1:1", "l4:tp1:1")))[
        "requests_per_worker"] == [3, 3]


def test_pools_of_one_gpu_and_tp_are_the_plain_runs(tmp_path):
    # pools that differ in nothing give the run of the same fleet without --pool, P/D pools too (any order)
    trace = _trace(tmp_path / "t.jsonl", 8, 40.0)
    for pools, plain in ((("h100:tp1:1", "h100:tp1:2"), dict(workers=3)),
                         (("prefill:h100:tp1:1", "decode:h100:tp1:1"), dict(split="1:1")),
                         (("decode:h100:tp1:2", "prefill:h100:tp1:1"), dict(prefill_workers=1, decode_workers=2))):
        a = run(SimConfig(trace=trace, timing=True, mode="kv-cost", pools=pools))
        b = run(SimConfig(trace=trace, timing=True, mode="kv-cost", **plain))
        for key in ("gpus", "pools", "gpu_hours_by_gpu"):
            a.pop(key)
        assert json.dumps(a) == json.dumps(b), pools


def test_pd_pools_put_prefill_and_decode_on_their_own_gpus(tmp_path):
    trace = _trace(tmp_path / "t.jsonl", 6, 200.0)
    mixed = run(SimConfig(trace=trace, timing=True, pools=("prefill:h100:tp1:1", "decode:h200:tp2:1")))
    same = run(SimConfig(trace=trace, timing=True, split="1:1"))  # both on one H100 each
    h200 = run(SimConfig(trace=trace, timing=True, gpu="h200", tp=2, split="1:1"))
    pre, dec = mixed["pools"]
    assert (mixed["prefill_workers"], mixed["decode_workers"]) == (1, 1) and mixed["gpus"] == 1 * 1 + 1 * 2
    assert (pre["role"], pre["gpu"], pre["worker_ids"]) == ("prefill", "h100", [0, 0])
    assert (dec["role"], dec["gpu"], dec["worker_ids"]) == ("decode", "h200", [1, 1])
    assert dec["kv_blocks"] == h200["kv_blocks"] and pre["kv_blocks"] == same["kv_blocks"]
    assert pre["requests"] == dec["requests"] == 6  # every request prefilled on one pool, decoded on the other
    # the prefill is the H100's as in the plain split: the same prompt time; decoding on two H200s (2 x 4.8 TB/s
    # against 3.35 TB/s, the weights read per step split in two) makes every output token faster
    assert mixed["ttft_prefill_ms"] == same["ttft_prefill_ms"]
    assert mixed["tpot_ms"]["p50"] < same["tpot_ms"]["p50"]
    assert mixed["tpot_ms"]["p50"] == h200["tpot_ms"]["p50"]


def test_kv_usage_scorer_weighs_each_workers_own_pool():
    # mixed pools: no single pool size (ctx.pool_blocks None); worker 0 holds 50 of 100 blocks, worker 1 50 of 400
    view = FleetView([0, 0], [1, 1], [50, 50], [0, 0], [0, 0])
    view.set_hardware([0, 1], ["h100", "h200"], [100, 400])
    scorer = KvUsageScorer(RunContext(workers=2, timed=True, rng=random.Random(0)))
    assert scorer.score(Request((1,)), view, None) == [1 - 50 / 100, 1 - 50 / 400]  # 0.5 and 0.875
    assert (list(view.pool), list(view.gpu), list(view.kv_blocks)) == ([0, 1], ["h100", "h200"], [100, 400])
    # one pool size (a homogeneous fleet): the configured pool, as before
    same = KvUsageScorer(RunContext(workers=2, timed=True, pool_blocks=200))
    assert same.score(Request((1,)), view, None) == [0.75, 0.75]


def test_kv_usage_routes_by_each_pools_share_in_a_run(tmp_path):
    # six requests at 0 ms, 2,048 + 64 tokens = 132 blocks of 16 each (the router's estimate); an H100 worker
    # (29,205 blocks) and two L4 workers (3,400 each). kv-usage scores 1 - blocks / pool, ties to the fewest
    # requests in flight, then the lowest id. r0: all 1.0 -> w0; r1: w0 1 - 132/29205 = 0.9955, w1 = w2 = 1.0 ->
    # w1; r2: w2 (1.0); r3..r5: w0 (0.9955, 0.9910, 0.9864, each above w1/w2's 1 - 132/3400 = 0.9612): [4, 1, 1]
    trace = _trace(tmp_path / "t.jsonl", 6, 0.0)
    config = SimConfig(trace=trace, timing=True, pools=("h100:tp1:1", "l4:tp1:2"), mode="weighted",
                       opts={"scorers": "kv-usage:1"})
    r = run(config)
    alone = [run(SimConfig(trace=trace, timing=True, gpu=g, workers=1, num_requests=1))["kv_blocks"] for g in ("h100", "l4")]
    assert [p["kv_blocks"] for p in r["pools"]] == alone == [29205, 3400]  # the pools the arithmetic above uses
    assert r["requests_per_worker"] == [4, 1, 1]
    # two router replicas (rr: r0, r2, r4 to replica 0), each seeing only its own requests' blocks but every
    # worker's pool: replica 0 sends r0 -> w0, r2 -> w1 (w0 0.9955 < 1.0), r4 -> w2; replica 1 the same: [2, 2, 2]
    assert run(replace(config, routers=2))["requests_per_worker"] == [2, 2, 2]


@pytest.mark.parametrize("args, flag", [
    (["--pool", "h100:tp1:2"], "--pool"),  # without --timing
    (["--timing", "--pool", "h100:tp1:2", "--workers", "2"], "--workers"),  # --workers written, even at its default
    (["--timing", "--pool", "h100:tp1:2", "--tp", "2"], "--tp"),
    (["--timing", "--pool", "h100:tp1:2", "--split", "1:1"], "--pool"),
    (["--timing", "--pool", "h100:tp1:2", "--controller", "static"], "--pool"),
    (["--timing", "--pool", "h100:1:2"], "--pool"),
    (["--timing", "--pool", "prefill:h100:tp1:1", "--pool", "h200:tp1:1"], "--pool"),  # roles on all or none
    (["--timing", "--pool", "prefill:h100:tp1:1", "--pool", "prefill:h200:tp1:1"], "--pool"),  # one of each
    (["--timing", "--pool", "prefill:h100:tp1:1", "--pool", "decode:h200:tp1:1", "--decode-workers", "1"],
     "--decode-workers"),
    (["--timing", "--pool", "prefill:h100:tp1:1", "--pool", "decode:h200:tp1:1", "--cpu-capacity", "8"],
     "--cpu-capacity"),  # a P/D fleet's workers have no CPU tier
])
def test_refused_in_one_line(tmp_path, args, flag):
    trace = _trace(tmp_path / "t.jsonl", 2, 10.0)
    for cmd in (["sim"], ["compare", "--format", "json"]):
        out = CliRunner().invoke(main, [*cmd, "--trace", trace, *args])
        assert out.exit_code == 2, out.output
        (line,) = out.stderr.splitlines() if hasattr(out, "stderr") else out.output.splitlines()
        assert line.startswith("Error: ") and flag in line
