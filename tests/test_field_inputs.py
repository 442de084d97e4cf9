"""Issue 43 (what the field found), items 4, 7 and 8: BurstGPT's failed rows, Azure offsets, unbounded
durations, CSV headers that match no format, the count-based collapse warning, Mooncake traces at
16-token blocks, TPOT p99 in compare's table, the Poisson rate a run used, ShareGPT's ``id``.

Every figure is derived by hand in its test. Timed cases use the linear step model of the issue,
10 ms + 1 ms per prefill token + 2 ms per decode (``beta0=10 beta1=1 beta2=2``), with every overhead
term off (:func:`helpers.terms_off_args`)."""
from __future__ import annotations

import json

from helpers import invoke, ok, terms_off_args

LINEAR = ["--latency-model", "linear", "--latency-opt", "beta0=10", "--latency-opt", "beta1=1",
          "--latency-opt", "beta2=2", *terms_off_args("linear")]


def _tokens(path, rows):
    """A token trace of ``(timestamp or None, first token id, prompt tokens, output tokens)`` rows."""
    lines = []
    for t, first, n, out in rows:
        row = {"tokens": list(range(first, first + n)), "output_length": out}
        if t is not None:
            row = {"timestamp": t, **row}
        lines.append(json.dumps(row) + "\n")
    path.write_text("".join(lines))
    return path


# ------------------------------------------------------------------ item 8: TPOT p99 in the tables
def test_compare_table_has_tpot_p99(tmp_path):
    """Two requests at t = 0 on one worker: R0 (10 tokens, 3 out), R1 (10 tokens, 5 out). Step 1 prefills both:
    10 + 20 = 30 ms, the first tokens at 30. Both decode: 10 + 2 x 2 = 14 ms a step, tokens at 44 and 58 (R0 done:
    TPOT (58 - 30) / 2 = 14.0). R1 alone: 10 + 2 = 12 ms a step, tokens at 70 and 82: TPOT (82 - 30) / 4 = 13.0.
    Inclusive quantiles of [13, 14]: p50 13.5, p99 13 + 0.99 = 13.99 -> 14.0."""
    trace = _tokens(tmp_path / "t.jsonl", [(0, 1, 10, 3), (0, 100, 10, 5)])
    r = ok(invoke("compare", "--trace", trace, "--timing", "--workers", "1", "--modes", "rr", "--format", "table",
                  "--block", "4", "--quiet", *LINEAR))
    header, row = r.stdout.splitlines()[:2]
    got = dict(zip(header.split(), row.split()))
    assert (got["ttft_p50_ms"], got["tpot_p50_ms"], got["tpot_p99_ms"]) == ("30.0", "13.5", "14.0")
    assert header.split().index("tpot_p99_ms") == header.split().index("tpot_p50_ms") + 1


# ------------------------------------------------------------------ item 4: Azure offsets
def test_azure_offsets_subtract_whole_seconds_first(tmp_path):
    """Rows 1 ms, 1 s + 0.1 us and 59.9999999 s after the first: whole seconds are subtracted before the 7-digit
    fractions are added, so the offsets are 1.0, 1000.0001 and 59999.9999 ms exactly (the epoch's 1.7e9 s in a
    float read the first as 1.0001659)."""
    from dynlab.traces.reader import load_trace

    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,32,1\n"
                    "2023-11-16 18:15:46.6815900,32,1\n2023-11-16 18:15:47.6805901,32,1\n"
                    "2023-11-16 18:16:46.6805899,32,1\n")
    assert [r.timestamp for r in load_trace(str(path))] == [0.0, 1.0, 1000.0001, 59999.9999]


# ------------------------------------------------------------------ item 8: ShareGPT's id
def test_sharegpt_id_is_a_known_field(tmp_path):
    """ShareGPT's standard ``id`` draws no warning; another field still does."""
    import warnings

    from dynlab.traces.reader import TraceWarning, load_trace

    conv = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    for extra, warned in (({"id": "x1"}, []), ({"id": "x1", "lang": "en"}, ["lang"])):
        path = tmp_path / "s.json"
        path.write_text(json.dumps([{**extra, **conv}]))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_trace(str(path))
        got = [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]
        assert got == [f"{path}: sharegpt fields not used by dynlab: {', '.join(warned)}"] if warned else got == []


# ------------------------------------------------------------------ item 7: --duration past the horizon
def test_duration_past_the_horizon_is_refused(tmp_path):
    """--duration S keeps arrivals up to S x 1000 ms after the first: 1e13 s is 1e16 ms and 1e300 s 1e303 ms, past
    the clock's 1e12 ms horizon, refused in one line (exit 2) with or without --timing; 1e9 s (1e12 ms) is at the
    horizon and 0.06 s a normal run (checked on its count: requests at 0 and 50 ms of the 3, not 90)."""
    trace = _tokens(tmp_path / "t.jsonl", [(0, 1, 8, 2), (50, 100, 8, 2), (90, 200, 8, 2)])
    for timing in ([], ["--timing"]):
        for value, reach in (("1e13", "1e+16"), ("1e300", "1e+303")):
            r = invoke("sim", "--trace", trace, "--duration", value, *timing)
            assert r.exit_code == 2 and r.stdout == "", r.output
            (line,) = r.stderr.splitlines()
            assert line == (f"Error: --duration {float(value):g} s of arrivals would reach {reach} ms, past the "
                            "simulated clock's horizon (1e+12 ms, 31.7 years); use a shorter --duration")
        assert json.loads(ok(invoke("sim", "--trace", trace, "--duration", "0.06", *timing)).stdout)["requests"] == 2
    from dynlab.engine.config import SimConfig

    SimConfig(trace=str(trace), duration=1e9).validate()  # at the horizon: accepted


# ------------------------------------------------------------------ item 7: a CSV header of no format
def test_a_csv_header_that_matches_no_format_names_the_missing_columns(tmp_path):
    """BurstGPT's header with ``Time`` for ``Timestamp``: burstgpt lacks Timestamp, azure all three of its columns;
    named with --trace-format, only that format's. A JSON format named on it still says "not JSON"."""
    path = tmp_path / "b.csv"
    path.write_text("Time,Request tokens,Response tokens\n1,10,2\n")
    want = {(): "the header is no known trace format's: burstgpt needs Timestamp; azure needs TIMESTAMP, "
                "ContextTokens, GeneratedTokens",
            ("--trace-format", "azure"): "the header lacks column(s) TIMESTAMP, ContextTokens, GeneratedTokens of "
                                         "the azure format",
            ("--trace-format", "burstgpt"): "the header lacks column(s) Timestamp of the burstgpt format",
            ("--trace-format", "mooncake"): "not JSON: Expecting value"}
    for args, message in want.items():
        r = invoke("sim", "--trace", path, *args)
        assert r.exit_code == 1 and r.stderr.splitlines() == [f"Error: {path}:1: {message}"], r.output


# ------------------------------------------------------------------ item 7: Mooncake at 16-token blocks
def test_count_based_replay_takes_a_mooncake_trace_at_16_token_blocks(tmp_path):
    """Two 40-token prompts recorded at 16-token blocks: hash_ids [1, 2, 3] and [1, 2, 4] (ceil(40 / 16) = 3 ids
    each). kv sends the second to the first's worker, where its leading ids 1 and 2 hit: 2 of 6 prompt blocks,
    block_hit_rate 0.3333, block_tokens 16. At the format's 512 the same file is refused (it needs 1 id a row)."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]}\n'
                    '{"timestamp": 10, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 4]}\n')
    got = json.loads(ok(invoke("sim", "--trace", path, "--trace-block", "16")).stdout)
    assert (got["block_tokens"], got["prompt_blocks"], got["cached_blocks"], got["block_hit_rate"]) == (16, 6, 2, 0.3333)
    r = invoke("sim", "--trace", path)
    assert r.exit_code == 1 and "hash_ids holds 3 ids, but input_length 40 needs ceil(40/512) = 1" in r.stderr


# ------------------------------------------------------------------ item 7: the collapse warning, count-based
def test_count_based_collapse_gets_the_warning(tmp_path):
    """Ten requests, each served before the next is routed: least-loaded sees no load on either of 2 workers
    and keeps the first (10 of 10, 100 %, imbalance 10 / 5 = 2.0); rr alternates (5 and 5) and is not flagged."""
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 1024, "output_length": 4,
                                        "hash_ids": [1, 100 + i]}) + "\n" for i in range(10)))
    r = ok(invoke("sim", "--trace", path, "--mode", "least-loaded"))
    assert json.loads(r.stdout)["requests_per_worker"] == [10, 0]
    (line,) = r.stderr.splitlines()
    assert line.startswith("Warning: one worker took almost every request (least-loaded: 10 of 10 requests on one "
                           "of 2 workers (100%, imbalance 2.0)): ") and "add --timing" in line
    assert ok(invoke("sim", "--trace", path, "--mode", "rr")).stderr == ""


# ------------------------------------------------------------------ item 8: the Poisson rate in the result
def test_a_trace_without_timestamps_says_its_poisson_rate(tmp_path):
    """Without timestamps a timed run's requests arrive as a Poisson process: 4 requests/s by default, or --rate's;
    the result says which and whose. A trace with timestamps keeps its own times and has neither key."""
    bare = _tokens(tmp_path / "bare.jsonl", [(None, 1, 8, 2), (None, 100, 8, 2)])
    stamped = _tokens(tmp_path / "stamped.jsonl", [(0, 1, 8, 2), (50, 100, 8, 2)])
    run = lambda *a: json.loads(ok(invoke("sim", "--timing", "--quiet", *a)).stdout)  # noqa: E731
    got = run("--trace", bare)
    assert (got["poisson_rate"], got["poisson_rate_from"]) == (4.0, "default: the workload has no timestamps")
    got = run("--trace", bare, "--rate", "7")
    assert (got["poisson_rate"], got["poisson_rate_from"]) == (7.0, "--rate")
    assert "poisson_rate" not in run("--trace", stamped) and "poisson_rate_from" not in run("--trace", stamped)


# ------------------------------------------------------------------ item 4: BurstGPT's failed rows
FAILED_CSV = "Timestamp,Request tokens,Response tokens\n0,1000,0\n0.001,32,2\n"


def test_burstgpt_failed_rows_are_skipped_and_counted(tmp_path):
    """A failed 1,000-token row at 0 and a real 32-token request (2 out) at 1 ms, one worker. Skipped (the
    default): the real request is alone, prefill 10 + 32 = 42 ms (TTFT 42.0), one decode 10 + 2 = 12 ms (TPOT 12.0);
    one stderr line counts the skipped row."""
    path = tmp_path / "b.csv"
    path.write_text(FAILED_CSV)
    r = ok(invoke("sim", "--trace", path, "--timing", "--workers", "1", "--quiet", *LINEAR))
    got = json.loads(r.stdout)
    assert (got["requests"], got["ttft_ms"]["p50"], got["tpot_ms"]["p50"]) == (1, 42.0, 12.0)
    assert "failed_requests" not in got
    assert r.stderr.splitlines() == [f"Warning: {path}: skipped 1 failed request(s) (burstgpt rows that got no answer, "
                                     "as vLLM's loader drops them); --keep-failed replays them as prompts without an "
                                     "answer"]


def test_keep_failed_prefills_them_without_an_answer(tmp_path):
    """--keep-failed: the failed row is prefilled (10 + 1,000 = 1,010 ms, its one sampled token not counted) and
    finishes then; the real request, queued from 1 ms, prefills 1,010-1,052 (TTFT 1,051.0, queue wait 1,009.0) and
    decodes to 1,064 (TPOT 12.0). Counted: requests 2, failed_requests 1, output tokens 2 (the real one's) over the
    span 0-1,064 ms: 1.9 tokens/s; goodput at TTFT <= 2,000 ms covers the answered request only: 1.0. Count-based,
    the failed row is one more request (2 against 1)."""
    path = tmp_path / "b.csv"
    path.write_text(FAILED_CSV)
    r = ok(invoke("sim", "--trace", path, "--timing", "--workers", "1", "--quiet", "--keep-failed",
                  "--slo-ttft-ms", "2000", *LINEAR))
    got = json.loads(r.stdout)
    assert (got["requests"], got["failed_requests"], got["ttft_ms"]["p50"], got["queue_wait_ms"]["p50"],
            got["tpot_ms"]["p50"], got["makespan_s"], got["output_tokens_per_s"], got["goodput"]) == (
        2, 1, 1051.0, 1009.0, 12.0, 1.064, 1.9, 1.0)
    assert "skipped" not in r.stderr
    counted = [json.loads(ok(invoke("sim", "--trace", path, *k)).stdout)["requests"] for k in ([], ["--keep-failed"])]
    assert counted == [1, 2]


def test_keep_failed_is_refused_where_it_does_nothing(tmp_path):
    """An Azure trace records no failed request; a BurstGPT trace without a Response tokens 0 row holds none;
    without --trace there is no trace: each is one line, exit 2."""
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,32,0\n")
    answered = tmp_path / "b.csv"
    answered.write_text("Timestamp,Request tokens,Response tokens\n0,32,2\n")
    for args, message in (
            (["--trace", azure], "--keep-failed has no effect on azure traces: they record no failed request "
                                 "(burstgpt's rows with Response tokens 0 are)"),
            (["--trace", answered], f"--keep-failed has no effect: {answered} holds no failed request"),
            ([], "--keep-failed has no effect without --trace (it keeps the failed requests a BurstGPT trace "
                 "records)")):
        r = invoke("sim", *args, "--keep-failed")
        assert r.exit_code == 2 and r.stderr.splitlines() == [f"Error: {message}"], r.output
