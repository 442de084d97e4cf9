"""Sizes the machine cannot hold are refused up front in one line (dynlab/limits.py); long runs show a
progress bar on a terminal and nothing on stderr when piped."""
from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynlab import limits
from dynlab.engine.config import SimConfig
from dynlab.labs.scenario import cliff, run_scenario
from dynlab.sweep.grid import Axis, Grid
from helpers import dynlab_command, invoke, ok, stderr_on_a_terminal


def one_line_usage_error(result, *words):
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert result.stdout == ""


# -- the limits and their reasoning ------------------------------------------------------------------

def test_the_limits_are_the_budget_over_the_memory_per_unit():
    # 24 GiB / 3 = 8 GiB = 8,589,934,592 bytes; each limit is that over the bytes per unit, rounded
    # down to one digit: /4096 = 2,097,152; /64 = 134,217,728; /512 = 16,777,216; /256 = 33,554,432;
    # /8192 = 1,048,576.
    assert limits.BUDGET_BYTES == 8 * 2**30 == limits.MACHINE_BYTES // 3
    assert limits.MAX_WORKERS == 2_000_000
    assert limits.MAX_SEED_REQUESTS == 100_000_000
    assert limits.MAX_SEED_BLOCKS == 10_000_000
    assert limits.MAX_PROMPT_TOKENS == 100_000_000
    assert limits.MAX_DOC_READS == 30_000_000
    assert limits.MAX_GRID_CELLS == 1_000_000
    for limit, per in ((limits.MAX_WORKERS, limits.WORKER_BYTES),
                       (limits.MAX_SEED_REQUESTS, limits.SEED_REQUEST_BYTES),
                       (limits.MAX_SEED_BLOCKS, limits.SEED_BLOCK_BYTES),
                       (limits.MAX_PROMPT_TOKENS, limits.PROMPT_TOKEN_BYTES),
                       (limits.MAX_DOC_READS, limits.DOC_READ_BYTES),
                       (limits.MAX_GRID_CELLS, limits.GRID_CELL_BYTES)):
        assert limit * per <= limits.BUDGET_BYTES


@given(st.integers(1, 10**30))
def test_one_digit_rounds_down_to_one_significant_digit(n):
    r = limits._one_digit(n)
    scale = 10 ** (len(str(n)) - 1)
    assert r <= n < r + scale and r % scale == 0 and 1 <= r // scale <= 9


@pytest.mark.parametrize("fields, ok_", [
    # at a limit passes, one past it is refused; hand-made from the limits above
    ({"workers": 2_000_000}, True), ({"workers": 2_000_001}, False),
    # plen + tail = 10**8 tokens is the limit; one block of 10**8 tokens per request, 1 request
    ({"prefixes": 1, "reps": 1, "plen": 10**8, "tail": 0, "block": 10**8}, True),
    ({"prefixes": 1, "reps": 1, "plen": 10**8, "tail": 1, "block": 10**8}, False),
    # 10**8 requests of no full block (plen + tail = 0)
    ({"prefixes": 10**8, "reps": 1, "plen": 0, "tail": 0}, True),
    ({"prefixes": 10**8 + 1, "reps": 1, "plen": 0, "tail": 0}, False),
    # 10**6 x 10 requests x (16 // 16 = 1 block) = 10**7 block names; 32 tokens: 2 blocks each
    ({"prefixes": 10**6, "reps": 10, "plen": 0, "tail": 16}, True),
    ({"prefixes": 10**6, "reps": 10, "plen": 0, "tail": 32}, False),
])
def test_sim_limits_at_the_boundary(fields, ok_):
    config = SimConfig(**fields)
    if ok_:
        limits.check_sim(config)
    else:
        with pytest.raises(ValueError, match="more than dynlab allows"):
            limits.check_sim(config)


def test_a_trace_run_has_no_synthetic_workload_limits():
    limits.check_sim(SimConfig(trace="t.jsonl", prefixes=10**9, reps=10**9))  # the seed options are not used


def test_document_reads_and_grid_cells_at_the_boundary():
    limits.check_doc_reads(10**7, ["fwd"] * 3)  # 3 x 10**7 reads: the limit
    with pytest.raises(ValueError, match="30,000,001 document reads"):
        limits.check_doc_reads(30_000_001, ["fwd"])
    limits.check_grid_cells([1000, 1000])
    with pytest.raises(ValueError, match=r"1000 x 1001 values\) asks for 1,001,000 cells"):
        limits.check_grid_cells([1000, 1001])


def test_the_library_refuses_before_allocating():
    with pytest.raises(ValueError, match="--docs 100000000 x 3 passes"):
        run_scenario(docs=10**8)
    with pytest.raises(ValueError, match="document reads"):
        cliff([1, 2], docs=10**8)
    axis = Axis("seed", tuple(range(1001)), tuple(map(str, range(1001))))
    with pytest.raises(ValueError, match="1,002,001 cells"):  # 1001 x 1001
        Grid((axis, Axis("workers", axis.values, axis.labels)), {}, {}, {}).cells()
    with pytest.raises(ValueError, match="--workers"):
        SimConfig(workers=10**9).validate()


# -- the inputs, and every command alike -----------------------------------------------------

def test_sim_workers_one_billion_is_a_one_line_error():
    # the issue: a MemoryError traceback after minutes; 10**9 > 2,000,000
    one_line_usage_error(invoke("sim", "--workers", 1_000_000_000), "--workers 1000000000", "2,000,000")


def test_scenario_docs_one_hundred_million_is_a_one_line_error():
    # the issue: hung silently; 10**8 documents x 3 passes (fwd,fwd,rev) = 3 x 10**8 reads > 3 x 10**7
    one_line_usage_error(invoke("scenario", "--docs", 100_000_000), "--docs 100000000", "300,000,000",
                         "30,000,000")


@pytest.mark.parametrize("args, words", [
    (["cliff", "--docs", 100_000_000, "--gpu", "1,2"], ["--docs", "30,000,000"]),
    (["compare", "--workers", "1,1000000000"], ["--workers", "2,000,000"]),
    (["sweep", "--executor", "serial", "--grid", "workers=1,1000000000"], ["--workers", "2,000,000"]),
    (["sim", "--trace", "mooncake-conversation", "--workers", 3_000_000], ["--workers", "2,000,000"]),
    (["sim", "--timing", "--workers", 3_000_000], ["--workers", "2,000,000"]),
    (["sim", "--prefixes", 100_000, "--reps", 1000], ["--prefixes", "10,000,000"]),
    (["sim", "--plen", 1_000_000_000], ["--plen", "100,000,000"]),
    (["sweep", "--grid", "seed=" + ",".join(map(str, range(1001))),
      "--grid", "workers=" + ",".join(map(str, range(1, 1001))), "--dry-run"], ["1,001,000 cells", "1,000,000"]),
])
def test_every_command_refuses_a_size_over_its_limit(args, words):
    one_line_usage_error(invoke(*args), *words)


def test_a_huge_timed_pool_runs_in_bounded_memory():
    # --capacity 10**9 --timing used to allocate a free-queue entry per block (MemoryError). The seed
    # workload stores 72 x 7 = 504 blocks at most, so a pool of 100,000 never evicts either: the two
    # runs serve identically, and only the reported pool size differs.
    big = json.loads(ok(invoke("sim", "--timing", "--capacity", 10**9)).stdout)
    small = json.loads(ok(invoke("sim", "--timing", "--capacity", 100_000)).stdout)
    assert big["kv_blocks"] == 10**9 and big["evicted_blocks"] == 0
    for key in ("cached_blocks", "ttft_ms", "requests_per_worker", "peak_kv_blocks"):
        assert big[key] == small[key]


def test_help_states_the_limits():
    assert "2,000,000" in ok(invoke("sim", "--help")).stdout
    assert "2,000,000" in ok(invoke("compare", "--help")).stdout
    assert "1,000,000 cells" in ok(invoke("sweep", "--help")).stdout
    for command in ("scenario", "cliff"):
        assert "30,000,000" in ok(invoke(command, "--help")).stdout.replace("\n", " ")


# -- progress bars -------------------------------------------------------------------------------------

LONG_RUNS = [
    ["scenario"],
    ["cliff", "--gpu", "10000,60000"],
    ["compare", "--modes", "rr,kv", "--format", "json"],
    ["sim", "--trace", "mooncake-conversation", "--mode", "rr"],  # kv collapses: a warning on stderr (issue 43)
]


@pytest.mark.parametrize("args", LONG_RUNS + [["reproduce", "OUT", "--no-plots"]], ids=lambda a: a[0])
def test_no_progress_on_stderr_when_piped(args, tmp_path):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    proc = subprocess.run(dynlab_command() + args, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""


@pytest.mark.parametrize("args", LONG_RUNS + [["reproduce", "OUT", "--no-plots"]], ids=lambda a: a[0])
def test_a_progress_bar_on_a_terminal(args, tmp_path):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    err = stderr_on_a_terminal(args)
    assert args[0].encode() in err or b"req" in err  # the bar's label (sim's bar is labelled by its mode)


# -- a trace's output_length ---------------------------------------------------------------------------

def _trace_with_output(tmp_path, n) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]}\n'
                    f'{{"timestamp": 1, "input_length": 1024, "output_length": {n}, "hash_ids": [1, 2]}}\n')
    return str(path)


def test_output_length_limit_is_ten_million_tokens():
    # the context-window bound (10,000,000) is below the memory rule's 8 GiB / 16 B = 536,870,912 -> 500,000,000
    assert limits.OUTPUT_TOKEN_BYTES == 16
    assert limits.MAX_OUTPUT_TOKENS == 10_000_000


@pytest.mark.parametrize("extra", [[], ["--timing", "--capacity", "1000000000000"]])
def test_an_output_length_over_the_limit_is_refused_with_file_and_line(tmp_path, extra):
    path = _trace_with_output(tmp_path, 10_000_001)
    r = invoke("sim", "--trace", path, "--quiet", *extra)
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr == (f"Error: {path}:2: output_length 10,000,001 is more than dynlab allows: at most "
                        "10,000,000 tokens per request (the longest context window of a served model; "
                        "see docs/limits.md)\n")
    r = invoke("sim", "--trace", _trace_with_output(tmp_path, 10**12), "--quiet", *extra)
    assert r.exit_code == 1 and ":2: output_length 1,000,000,000,000 is more" in r.stderr


def test_an_output_length_at_the_limit_is_read(tmp_path):
    from dynlab.traces.reader import load_trace

    requests = load_trace(_trace_with_output(tmp_path, 10_000_000))
    assert [r.output_length for r in requests] == [4, 10_000_000]


# -- --spec-tokens: dynlab's limit and vLLM's budget rule ---------------------------------------------

def test_spec_tokens_limit_is_the_output_limit_below_the_memory_rule():
    # 8 GiB / 256 B = 33,554,432 -> 30,000,000 by memory; no request outputs more than 10,000,000
    assert limits.SPEC_TOKEN_BYTES == 256 and limits.MAX_SPEC_TOKENS == 10_000_000 == limits.MAX_OUTPUT_TOKENS
    with pytest.raises(ValueError, match=r"--spec-tokens 10,000,001 is more than dynlab allows: at most 10,000,000"):
        SimConfig(timing=True, spec_method="eagle", spec_tokens=10_000_001, max_num_batched_tokens=10**9).validate()


@pytest.mark.parametrize("method, why", [("eagle", "vLLM refuses a budget <= the 8 lookahead slots"),
                                         ("ngram", "drafts past the budget are never verified")])
def test_spec_tokens_below_the_step_budget(method, why):
    # a decode schedules 1 + K tokens: K = 8 needs a budget of at least 9 (vLLM 0.33: budget > lookahead)
    SimConfig(timing=True, spec_method=method, spec_tokens=8, max_num_batched_tokens=9).validate()
    with pytest.raises(ValueError, match=why):
        SimConfig(timing=True, spec_method=method, spec_tokens=8, max_num_batched_tokens=8).validate()


@pytest.mark.parametrize("cmd", [["sim"], ["compare", "--spec-tokens", "0,100000000"]])
def test_spec_tokens_over_the_limit_is_a_usage_error(cmd):
    k = [] if cmd[0] == "compare" else ["--spec-tokens", "100000000"]
    one_line_usage_error(invoke(*cmd, "--trace", "mooncake-conversation", "--timing", "--spec-method", "eagle", *k),
                         "--spec-tokens 100,000,000", "at most 10,000,000")


def test_a_duration_that_loops_a_trace_past_memory_is_refused_before_the_loop(tmp_path):
    """Two requests 1 ms apart loop with a period of 2 ms (span x n / (n - 1)): 10 s makes about
    2 x (10,000 / 2 + 1) = 10,002 requests, fine; 100,000 s about 2 x (1e8 / 2 + 1) = 100,000,002, over
    MAX_LOOPED_REQUESTS (8,000,000): refused in one line, nothing built."""
    from dynlab.limits import MAX_LOOPED_REQUESTS
    from dynlab.routing.strategy import make_request
    from dynlab.traces.rates import RateError, shape

    assert MAX_LOOPED_REQUESTS == 8_000_000
    reqs = [make_request((1,), 10, 2, timestamp=0.0, index=0), make_request((2,), 10, 2, timestamp=1.0, index=1)]
    assert len(shape(reqs, 1.0, 10.0)) == 10_000  # arrivals at 0, 1, 2, ... 9,999 ms
    with pytest.raises(RateError, match=r"^--duration 100000 s loops the trace into about 100,000,002 requests, "
                                        r"more than dynlab allows: at most 8,000,000"):
        shape(reqs, 1.0, 1e5)


# -- SGLang's scheduler caps: bounded like the sizes above ---------------------------------------------

def test_sglang_caps_are_bounded_by_the_requests_and_tokens_limits():
    # --max-running-requests: no run makes more requests than a synthetic workload or spec may have (100,000,000);
    # --chunked-prefill-size: no prompt dynlab makes is longer than 100,000,000 tokens (--plen + --tail)
    assert limits.MAX_RUNNING_REQUESTS == limits.MAX_SEED_REQUESTS == 100_000_000
    assert limits.MAX_CHUNK_TOKENS == limits.MAX_PROMPT_TOKENS == 100_000_000
    sg = {"timing": True, "engine_kind": "sglang"}
    SimConfig(**sg, max_running_requests=10**8, chunked_prefill_size=10**8).validate()
    with pytest.raises(ValueError, match=r"max_running_requests must be <= 100000000, got 100000001"):
        SimConfig(**sg, max_running_requests=10**8 + 1).validate()
    with pytest.raises(ValueError, match=r"chunked_prefill_size .*100000000.*, got 100000001"):
        SimConfig(**sg, chunked_prefill_size=10**8 + 1).validate()


@pytest.mark.parametrize("flag", ["--max-running-requests", "--chunked-prefill-size"])
@pytest.mark.parametrize("command", ["sim", "compare", "calibrate"])
def test_sglang_caps_over_their_bound_are_usage_errors_everywhere(tmp_path, command, flag):
    given = {"sim": ["sim", "--timing", "--engine", "sglang"], "compare": ["compare", "--timing", "--engine", "sglang"],
             "calibrate": ["calibrate", str(tmp_path / "points.csv"), "--engine", "sglang"]}[command]
    (tmp_path / "points.csv").write_text("model,gpu,max_concurrency\nllama-3.1-8b,h100,4\n")
    one_line_usage_error(invoke(*given, flag, 100_000_001), flag, "100000001", "100000000")
