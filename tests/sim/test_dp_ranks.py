"""Attention data-parallel ranks (``--dp-attention``, dynlab issue 43 item 1): each rank of a worker is an engine
of its own (its scheduler, KV pool and prefix cache) and a routing target of its own.

Hand cases on Qwen3-30B-A3B, ``--tp 1 --ep 2 --dp-attention`` (2 GPUs, 2 ranks per worker), the linear step
model 10 ms + 1 ms per prefill token + 2 ms per decode request with every overhead term off, 16-token blocks.
"""
from __future__ import annotations

import json
import math

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.engine.metrics import Recorder
from dynlab.engine.serving import dp_rank_of
from dynlab.sim import run
from helpers import terms_off, terms_off_args

DP = ["--model", "qwen3-30b-a3b", "--tp", "1", "--ep", "2", "--dp-attention"]
LINEAR = ["--timing", "--latency-model", "linear", "--latency-opt", "beta0=10", "--latency-opt", "beta1=1",
          "--latency-opt", "beta2=2", *terms_off_args("linear")]


def _sim(tmp_path, rows, *args):
    """``dynlab sim`` of ``rows`` with ``--requests-out``: ``(result, records)``."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(main, ["sim", "--trace", str(trace), "--quiet", *args, "--requests-out", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), [json.loads(line) for line in out.read_text().splitlines()]


def _rank_blocks_at_041() -> int:
    # Per GPU of an H100 at --gpu-memory-utilization 0.41: 80 GiB x 0.41 = 35,218,731,827.2 B usable; weights
    # 3,082,186,752 B non-expert (tp 1) + 57,982,058,496 B experts / ep 2 = 32,073,216,000 B; free
    # 3,145,515,827.2 B; a 16-token block is 16 x 98,304 B/token (48 layers x 4 KV heads x 128 x 2 x 2 B) =
    # 1,572,864 B -> floor(1999.87) = 1999 blocks per GPU. The worker's two ranks each hold their own: 3,998
    # blocks per worker, 1,999 per rank.
    free = 80 * 2**30 * 0.41 - (3_082_186_752 + 57_982_058_496 / 2)
    return math.floor(free / (16 * 98_304))


def test_a_rank_pool_rejects_a_prompt_the_worker_pool_would_hold(tmp_path):
    per_rank = _rank_blocks_at_041()
    assert per_rank == 1999
    # a 48,000-token prompt needs ceil(48,001 / 16) = 3,001 blocks: more than a rank's 1,999 (fewer than the
    # worker's 3,998 that one shared pool had), so its rank can never hold it: rejected
    assert math.ceil(48_001 / 16) == 3001 and per_rank < 3001 < 2 * per_rank
    big = [{"tokens": list(range(48_000)), "output_length": 2, "timestamp": 0}]
    out, (rec,) = _sim(tmp_path, big, *DP, "--gpu-memory-utilization", "0.41", *LINEAR)
    assert (out["kv_blocks"], out["dp_ranks"], out["rejected"]) == (1999, 2, 1) and rec["rejected"]
    assert out["kv_blocks_source"].endswith("/ 2 attention-DP ranks = 1999 blocks per rank")
    # a 31,000-token prompt needs ceil(31,001 / 16) = 1,938 <= 1,999 blocks: its rank serves it
    ok = [{"tokens": list(range(31_000)), "output_length": 1, "timestamp": 0}]
    out, (rec,) = _sim(tmp_path, ok, *DP, "--gpu-memory-utilization", "0.41", *LINEAR)
    assert out["rejected"] == 0 and not rec["rejected"]


def test_identical_prompts_at_once_land_on_two_ranks_and_neither_hits(tmp_path):
    # two identical 64-token prompts (4 full blocks) at t = 0 on one worker of 2 ranks, routed by kv-cost (a load
    # term): the first goes to one rank; its blocks are not stored until its step ends, so the router sees no
    # overlap anywhere and the other rank, idle, costs less. Each rank's own prefix cache is empty: neither hits (one
    # shared pool gave the second 48 tokens: 3 blocks, the last capped one below the prompt's end).
    # Each rank prefills its own 64 tokens in one step: 10 + 64 = 74 ms to its first token (one batch of both
    # ranks' tokens priced serially was 10 + 64 + 16 = 90).
    two = [{"tokens": list(range(64)), "output_length": 1, "timestamp": 0}] * 2
    out, recs = _sim(tmp_path, two, *DP, "--workers", "1", "--mode", "kv-cost", *LINEAR)
    # (which rank the first takes is the strategy's tie-break between two idle ranks; the second takes the other)
    assert sorted((r["worker"], r["dp_rank"], r["hit_tokens"], r["first_token_ms"]) for r in recs) == [
        (0, 0, 0, 74.0), (0, 1, 0, 74.0)]
    assert list(recs[0])[:3] == ["id", "worker", "dp_rank"]
    assert out["workers"] == 1 and out["requests_per_worker"] == [1, 1] and out["hits"] == 0
    # the GPUs stay per worker: 1 worker x tp 1 x 2 ranks = 2 GPUs; 2 output tokens in 74 ms = 27.03/s -> 13.5/GPU
    assert out["output_tokens_per_s_per_gpu"] == round(2 / 0.074 / 2, 1)


def test_ranks_step_in_lockstep(tmp_path):
    # rr on one worker of 2 ranks: requests alternate rank 0, 1, 0, 1 (distinct tokens: no hit anywhere)
    rows = [{"tokens": list(range(16)), "output_length": 3, "timestamp": 0},  # R0 -> rank 0
            {"tokens": list(range(100, 164)), "output_length": 1, "timestamp": 0},  # R1 -> rank 1
            {"tokens": list(range(1000, 1032)), "output_length": 1, "timestamp": 30},  # R2 -> rank 0
            {"tokens": list(range(2000, 2016)), "output_length": 1, "timestamp": 80}]  # R3 -> rank 1
    # step 1 at 0: rank 0 prefills R0 (10 + 16 = 26 ms), rank 1 R1 (10 + 64 = 74 ms); both end with the slower
    #   at 74: R0's first token at 74 (26 alone), R1's (its only token) at 74.
    # R2 arrives at 30 on rank 0, in the worker's step: it waits for it.
    # step 2 at 74: rank 0 decodes R0 and prefills R2, 10 + 32 + 2 = 44 ms -> 118 (R0's 2nd token, R2 done);
    #   rank 1 is idle. R3 arrives at 80 on idle rank 1: it waits for the worker's step to end at 118.
    # step 3 at 118: rank 0 decodes R0, 10 + 2 = 12 ms; rank 1 prefills R3, 10 + 16 = 26 ms; both end at 144:
    #   R0's 3rd (last) token at 144 (130 alone), R3's at 144.
    _, recs = _sim(tmp_path, rows, *DP, "--workers", "1", "--mode", "rr", *LINEAR)
    assert [(r["dp_rank"], r["first_scheduled_ms"], r["first_token_ms"], r["finish_ms"]) for r in recs] == [
        (0, 0.0, 74.0, 144.0), (1, 0.0, 74.0, 74.0), (0, 74.0, 118.0, 118.0), (1, 118.0, 144.0, 144.0)]


def test_without_dp_attention_records_have_no_rank(tmp_path):
    one = [{"tokens": list(range(64)), "output_length": 1, "timestamp": 0}]
    out, (rec,) = _sim(tmp_path, one, "--model", "qwen3-30b-a3b", *LINEAR)
    assert "dp_rank" not in rec and "dp_ranks" not in out


def test_dp_ranks_refused_where_not_modelled(tmp_path):
    one = tmp_path / "t.jsonl"
    one.write_text(json.dumps({"tokens": list(range(64)), "output_length": 1, "timestamp": 0}) + "\n")
    for extra, what in ((["--split", "1:1"], "a P/D split"), (["--async-scheduling"], "--async-scheduling"),
                        (["--cpu-capacity", "100"], "a CPU tier (--cpu-capacity, --cpu-memory-gb)")):
        res = CliRunner().invoke(main, ["sim", "--trace", str(one), "--quiet", *DP, *LINEAR, *extra])
        assert res.exit_code != 0 and f"--dp-attention with {what} is not modelled" in res.output
        assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    # --capacity is the worker's, split over its ranks: 1 block cannot give each of 2 ranks one
    res = CliRunner().invoke(main, ["sim", "--trace", str(one), "--quiet", *DP, *LINEAR, "--capacity", "1"])
    assert res.exit_code != 0 and res.output.strip() == ("Error: a worker's 1 KV blocks cannot give each of its 2 "
                                                         "attention-DP ranks one")


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(0, 10_000))
def test_dp_rank_of_inverts_the_target_layout(dp, target):
    # target = worker x dp + rank, rank in 0..dp-1: divmod gives both back
    w, r = dp_rank_of(target, dp)
    assert 0 <= r < dp and w * dp + r == target


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 40)), min_size=1, max_size=6), st.integers(1, 2))
def test_every_request_goes_to_a_rank_of_a_worker(tmp_path, rows, workers):
    # any prompts (of a few shared 16-token blocks) on `workers` workers of 2 ranks: each record names a worker
    # below `workers` and a rank below 2, and the per-target lists have workers x 2 entries
    trace = [{"tokens": list(range(16 * blocks)), "output_length": 2, "timestamp": t} for blocks, t in
             sorted(rows, key=lambda r: r[1])]
    out, recs = _sim(tmp_path, trace, *DP, "--mode", "kv-cost", "--workers", str(workers), *LINEAR)
    assert all(0 <= r["worker"] < workers and 0 <= r["dp_rank"] < 2 for r in recs)
    assert len(out["requests_per_worker"]) == 2 * workers and sum(out["requests_per_worker"]) == len(trace)


class _Steps(Recorder):
    """Every engine step as ``(target, start ms, end ms)``."""

    def __init__(self):
        self.steps = []

    def on_step(self, worker, result):
        self.steps.append((worker, result.start, result.end))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 4), st.integers(0, 300)), min_size=1, max_size=8),
       st.sampled_from(["vllm", "sglang"]))
def test_steps_of_one_worker_never_partly_overlap(tmp_path, rows, engine):
    # lockstep: any two steps of ranks of one worker (2 ranks, 2 workers) are either the same interval (one
    # step of the worker) or disjoint; every step of a rank is one engine iteration
    trace = tmp_path / "t.jsonl"
    rows = sorted(rows, key=lambda r: r[2])
    trace.write_text("".join(json.dumps({"tokens": list(range(i * 1000, i * 1000 + 16 * b)), "output_length": n,
                                         "timestamp": t}) + "\n" for i, (b, n, t) in enumerate(rows)))
    rec = _Steps()
    run(SimConfig(trace=str(trace), timing=True, model="qwen3-30b-a3b", ep=2, dp_attention=True, workers=2,
                  mode="kv-cost", engine_kind=engine, latency_model="linear",
                  **terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2})), recorders=(rec,))
    for a in rec.steps:
        for b in rec.steps:
            if a[0] // 2 == b[0] // 2 and a[1:] != b[1:]:
                assert a[2] <= b[1] or b[2] <= a[1], (a, b)
