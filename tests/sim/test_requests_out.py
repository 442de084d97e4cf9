"""``dynlab sim --requests-out FILE``: one JSON line per trace request (dynlab.sim.records), pinned by hand.

The hand cases use the linear latency model with beta0=10, beta1=1, beta2=2 (a step takes
``10 + 1 x prefill tokens + 2 x decode requests`` ms), 16-token blocks and an ample pool.
"""
from __future__ import annotations

import json
import statistics

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.sim import run
from dynlab.latency.overheads import DETOK_US_PER_TOKEN, FRONT_END_MS
from dynlab.sim.records import KEYS, PD_KEYS, RequestRecorder
from helpers import terms_off_args

# the hand model with every overhead term off (server CPU time, front end, detokenisation): the hand cases'
# times are its steps' alone
LINEAR = ["--timing", "--latency-model", "linear", "--latency-opt", "beta0=10", "--latency-opt", "beta1=1",
          "--latency-opt", "beta2=2", *terms_off_args("linear")]
#: two identical 32-token prompts (two full 16-token blocks), at 0 ms (3 output tokens) and 100 ms (2)
TWO = [{"tokens": list(range(32)), "output_length": 3, "timestamp": 0},
       {"tokens": list(range(32)), "output_length": 2, "timestamp": 100}]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _sim(tmp_path, rows, *args):
    """Run ``sim`` with ``--requests-out r.jsonl``: ``(result, records)``."""
    trace = _write(tmp_path / "t.jsonl", rows)
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(main, ["sim", "--trace", trace, *args, "--requests-out", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), [json.loads(line) for line in out.read_text().splitlines()]


def test_timed_records_by_hand(tmp_path):
    # R0: prefill 32 tokens, 10 + 32 = 42 ms -> first token at 42; two decodes of 10 + 2 = 12 ms -> 54, 66.
    # R1 at 100: its two blocks are cached, the hit capped at (32 - 1) // 16 = 1 block = 16 tokens;
    # prefill 16 tokens, 10 + 16 = 26 ms -> first token at 126; one decode, 12 ms -> 138.
    _, recs = _sim(tmp_path, TWO, "--workers", "1", "--capacity", "64", *LINEAR)
    assert recs == [
        {"id": 0, "worker": 0, "arrival_ms": 0.0, "first_scheduled_ms": 0.0, "first_token_ms": 42.0,
         "finish_ms": 66.0, "input_length": 32, "output_length": 3, "hit_tokens": 0, "preemptions": 0,
         "rejected": False},
        {"id": 1, "worker": 0, "arrival_ms": 100.0, "first_scheduled_ms": 100.0, "first_token_ms": 126.0,
         "finish_ms": 138.0, "input_length": 32, "output_length": 2, "hit_tokens": 16, "preemptions": 0,
         "rejected": False}]
    assert list(recs[0]) == list(KEYS)  # the keys, exactly, in this order


def test_pd_records_by_hand(tmp_path):
    # prefill as above (the prefill worker's first token at 42, handed off); the decode worker reserves at
    # once: the transfer of 32 tokens x 131,072 B (llama-3.1-8b) = 4,194,304 B at 1 GB/s takes 4.194304 ms
    # -> arrives 46.194304; two decodes of 12 ms there: the first ends at 58.194304, the user's first token
    # (first_token_ms, issue 24), the second at 70.194304 (finish).
    out, (rec,) = _sim(tmp_path, TWO[:1], "--split", "1:1", "--link-gbps", "1", "--capacity", "64", *LINEAR)
    assert list(rec) == list(KEYS) + list(PD_KEYS)
    assert rec["prefill_token_ms"] == 42.0 and rec["transfer_start_ms"] == 42.0
    assert abs(rec["first_token_ms"] - 58.194304) < 1e-9
    assert out["ttft_ms"]["mean"] == 58.2 and out["ttft_prefill_ms"]["mean"] == 42.0
    assert abs(rec["transfer_end_ms"] - 46.194304) < 1e-9 and abs(rec["finish_ms"] - 70.194304) < 1e-9
    assert (rec["worker"], rec["prefill_worker"], rec["decode_worker"]) == (0, 0, 0)


def test_pd_one_token_request_never_reaches_a_decode_worker(tmp_path):
    rows = [{"tokens": list(range(32)), "output_length": 1, "timestamp": 0}]
    _, (rec,) = _sim(tmp_path, rows, "--split", "1:1", "--capacity", "64", *LINEAR)
    assert rec["finish_ms"] == rec["first_token_ms"] == rec["prefill_token_ms"] == 42.0
    assert (rec["decode_worker"], rec["transfer_start_ms"], rec["transfer_end_ms"]) == (None, None, None)


def test_rejected_request_record(tmp_path):
    # a 64-token prompt needs 4 blocks (+1 for its next token) of a 2-block pool: refused at arrival
    rows = [{"tokens": list(range(64)), "output_length": 3, "timestamp": 0},
            {"tokens": list(range(100, 116)), "output_length": 1, "timestamp": 5}]
    result, recs = _sim(tmp_path, rows, "--workers", "1", "--capacity", "2", *LINEAR)
    assert recs[0] == {"id": 0, "worker": 0, "arrival_ms": 0.0, "first_scheduled_ms": None, "first_token_ms": None,
                       "finish_ms": None, "input_length": 64, "output_length": 3, "hit_tokens": None,
                       "preemptions": 0, "rejected": True}
    assert recs[1]["first_token_ms"] == recs[1]["finish_ms"] == 5.0 + 10 + 16  # 16-token prefill
    assert result["rejected"] == 1


def test_count_based_records_have_no_times(tmp_path):
    # count-based: the second request's worker held both blocks when it was routed: 2 x 16 = 32 hit tokens
    _, recs = _sim(tmp_path, TWO, "--workers", "1")
    assert recs == [
        {"id": 0, "worker": 0, "arrival_ms": None, "first_scheduled_ms": None, "first_token_ms": None,
         "finish_ms": None, "input_length": 32, "output_length": 3, "hit_tokens": 0, "preemptions": 0,
         "rejected": False},
        {"id": 1, "worker": 0, "arrival_ms": None, "first_scheduled_ms": None, "first_token_ms": None,
         "finish_ms": None, "input_length": 32, "output_length": 2, "hit_tokens": 32, "preemptions": 0,
         "rejected": False}]


def test_count_based_hit_tokens_are_capped_at_the_prompt(tmp_path):
    # a Mooncake row names 512-token blocks; 600 tokens span 2 ids: a full hit is 600 tokens, not 1,024
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [7, 8]}] * 2
    _, recs = _sim(tmp_path, rows, "--workers", "1")
    assert [r["hit_tokens"] for r in recs] == [0, 600]


def test_dash_writes_records_to_stdout_and_the_result_to_stderr(tmp_path):
    trace = _write(tmp_path / "t.jsonl", TWO)
    res = CliRunner().invoke(main, ["sim", "--trace", trace, "--workers", "1", "--requests-out", "-"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert [json.loads(x)["id"] for x in lines] == [0, 1]
    assert json.loads(res.stderr)["requests"] == 2


def test_failed_run_leaves_an_existing_file_as_it_was(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text("old\n")
    trace = _write(tmp_path / "t.jsonl", [{"tokens": [1, 2], "timestamp": 5}, {"tokens": [1], "timestamp": 1}])
    res = CliRunner().invoke(main, ["sim", "--trace", trace, "--timing", "--requests-out", str(out)])
    assert res.exit_code != 0
    assert out.read_text() == "old\n"


rows_st = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 30), st.integers(0, 40)),
                   min_size=1, max_size=12)


@settings(max_examples=30, deadline=None)
@given(rows_st, st.sampled_from([None, "1:1", "1:2"]), st.sampled_from([6, 12, 64]))
def test_records_agree_with_the_run_result(rows, split, capacity):
    # invariants: one record per request in trace order; preemptions, rejections, transfers and the TTFT
    # mean of the records are the run's own figures. The overhead terms are on (the defaults): the records
    # are the engine's times, the run's TTFT the user's, which adds the front end and one token's
    # detokenisation (ServingMetrics); ttft_prefill_ms is the engine's (the prefill worker's first token)
    import tempfile

    t, trace = 0, []
    for prefix, tail, out, gap in rows:
        t += gap
        trace.append({"tokens": [prefix] * 20 + list(range(1000 + t, 1000 + t + tail)), "output_length": out,
                      "timestamp": t})
    with tempfile.TemporaryDirectory() as d:
        path = _write(__import__("pathlib").Path(d) / "t.jsonl", trace)
        cfg = SimConfig(trace=path, timing=True, capacity=capacity, latency_model="linear", split=split,
                        latency_opts={"beta0": "10", "beta1": "1", "beta2": "2"}, max_num_batched_tokens=32,
                        workers=1 if split is None else SimConfig.workers)
        rec = RequestRecorder()
        result = run(cfg, recorders=(rec,))
    recs = list(rec.records())
    assert [r["id"] for r in recs] == list(range(len(trace)))
    assert sum(r["preemptions"] for r in recs) == result["preemptions"]
    assert sum(r["rejected"] for r in recs) == result["rejected"]
    token = DETOK_US_PER_TOKEN / 1000.0  # --detok-us-per-token's default, us -> ms
    ttft = [r["first_token_ms"] - r["arrival_ms"] + FRONT_END_MS + token for r in recs if not r["rejected"]]
    if ttft:
        assert round(statistics.fmean(ttft), 1) == result["ttft_ms"]["mean"]
    for r in recs:
        if not r["rejected"]:
            assert r["arrival_ms"] <= r["first_scheduled_ms"] <= r["first_token_ms"] <= r["finish_ms"]
    if split is not None:
        moved = [r for r in recs if r["transfer_end_ms"] is not None]
        assert len(moved) == result["transfers"]
        for r in moved:
            assert r["first_scheduled_ms"] <= r["transfer_start_ms"] <= r["transfer_end_ms"] <= r["finish_ms"]
            # the user's first token: the decode worker's first step, after the KV arrived (issue 24)
            assert r["prefill_token_ms"] <= r["transfer_end_ms"] < r["first_token_ms"] <= r["finish_ms"]
        ttft_prefill = [r["prefill_token_ms"] - r["arrival_ms"] for r in recs if not r["rejected"]]
        if ttft_prefill:
            assert round(statistics.fmean(ttft_prefill), 1) == result["ttft_prefill_ms"]["mean"]
    else:
        # aggregated, no CPU tier: nothing is held between steps, so the busy mean is the span mean's
        # block-time over less time (issue 24)
        for span, busy in zip(result["mean_kv_usage"], result["mean_kv_usage_busy"]):
            assert span <= busy <= 1.0


def test_report_gets_the_records_when_both_are_given(tmp_path):
    # sim --report draws the per-request figures from the records --requests-out writes
    trace = _write(tmp_path / "t.jsonl", TWO)
    base = ["sim", "--trace", trace, "--workers", "1", "--timing", "--quiet"]
    runner = CliRunner()
    assert runner.invoke(main, base + ["--report", str(tmp_path / "a.html")]).exit_code == 0
    res = runner.invoke(main, base + ["--report", str(tmp_path / "b.html"), "--requests-out", str(tmp_path / "r.jsonl")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "a.html").read_text() != (tmp_path / "b.html").read_text()
