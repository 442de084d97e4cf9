"""sweep checks every cell's run-time-checked values before any cell runs (the 2026-11-30 trial, section 3).

The values below are refused by a timed run (and so by ``compare`` before its first run): sweep refuses
the same up front, exit 2, one line naming the cell, nothing written and ``--out`` untouched.
"""
from __future__ import annotations

import json

import pytest

from helpers import invoke

# 4 Mooncake rows of 1,500 tokens (ceil(1500/512) = 3 ids each) at 0, 1, 2, 3 s
ROWS = "".join(json.dumps({"timestamp": 1000 * i, "input_length": 1500, "output_length": 4,
                           "hash_ids": [[1, 2, 3], [7, 8, 9]][i % 2]}) + "\n" for i in range(4))
BASE = ["--workers", "1", "--timing"]

# Messages derived by hand. llama-3.1-8b (the default model) stores 131,072 bytes of KV per token, so a
# 16-token block is 2,097,152 bytes: at 1e-12 GB/s it loads in 2,097,152 / (1e-12 * 1e9) * 1000 =
# 2.09715e+12 ms, past the 1e+12 ms horizon; 1e308 GB is 1e317 bytes, past a float; row 1 arrives at
# 1000 ms x 1e308 = inf (past a float too).
CASES = [
    (["--capacity", "120", "--cpu-capacity", "100"], "pcie-gbps=1,5,1e-12", '{"pcie-gbps": 1e-12,',
     "--pcie-gbps 1e-12 is too small: one block of 2,097,152 bytes would take 2.09715e+12 ms to load, past "
     "the simulated clock's horizon (1e+12 ms)"),
    (["--capacity", "120"], "cpu-memory-gb=1,1e308", '{"cpu-memory-gb": 1e+308,',
     "--cpu-memory-gb 1e+308 is too large: its bytes overflow a float"),
    # a model that does not fit its GPUs (the pool is derived from the hardware without --capacity);
    # deepseek-v3's 671e9 parameters at one byte (FP8) are 671e9 / 2^30 = 624.9 GiB on one GPU (--tp 1); an H100
    # has 80 GiB x 0.9 (--gpu-memory-utilization) = 72.0 GiB usable
    ([], "model=llama-3.1-8b,deepseek-v3", '{"model": "deepseek-v3",',
     "deepseek-v3 does not fit on 1 x h100: 624.9 GiB of weights per GPU, 72.0 GiB usable"),
    (["--capacity", "120"], "time-scale=1,1e308", '{"time-scale": 1e+308,',
     "request 1's arrival (timestamp 1000 ms x --time-scale 1e+308) would reach inf ms, past the simulated "
     "clock's horizon (1e+12 ms, 31.7 years); use a smaller --time-scale"),
    # a model with KV cache groups and expert parallelism (the engine's setup refuses it: the pool rule is
    # derived for --tp only; sweep ran the cell and failed it, exit 1). Its 512-token trace blocks at
    # --block 16 are served (tests/engine/test_kv_groups_trace_blocks.py)
    (["--model", "gpt-oss-20b", "--tp", "2"], "ep=1,2", '{"ep": 2,',
     "gpt-oss-20b has KV cache groups, which dynlab models with --tp only (not tp 2 x ep 2)"),
]


@pytest.mark.parametrize("extra, grid, cell, message", CASES)
@pytest.mark.parametrize("mode", ["new", "resume", "dry-run"])
def test_sweep_refuses_a_value_a_timed_run_refuses_before_any_cell_runs(tmp_path, extra, grid, cell, message,
                                                                        mode):
    trace = tmp_path / "evict.jsonl"
    trace.write_text(ROWS)
    out = tmp_path / "s.jsonl"
    args = ["sweep", "--trace", trace, *BASE, *extra, "--grid", grid, "--out", out, "--executor", "serial"]
    before = None
    if mode == "resume":
        before = '{"cell": {"other": 1}, "result": {}}\n'  # any content: it must stay byte for byte
        out.write_text(before)
        args.append("--resume")
    elif mode == "dry-run":
        args.append("--dry-run")
    result = invoke(*args)
    assert result.exit_code == 2, (result.stderr, result.exception)
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"Error: cell {cell}") and line.endswith(f": {message}")
    assert result.stdout == ""
    assert (out.read_text() if out.exists() else None) == before


@pytest.mark.parametrize("extra, grid, cell, message", CASES)
def test_compare_refuses_the_same_values_before_its_first_run(tmp_path, extra, grid, cell, message):
    trace = tmp_path / "evict.jsonl"
    trace.write_text(ROWS)
    name, values = grid.split("=")
    result = invoke("compare", "--trace", trace, *BASE, *extra, f"--{name}", values)
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"Error: {message}\n", "")


@pytest.mark.parametrize("command, gb", [("sim", "0.001"), ("compare", "0,0.001"), ("sweep", None)])
def test_a_cpu_memory_that_holds_no_block_is_refused(tmp_path, command, gb):
    # one block of llama-3.1-8b at --block 16 is 131,072 x 16 = 2,097,152 bytes = 0.002097152 GB: 0.001 GB
    # holds floor(1e6 / 2,097,152) = 0 blocks; the least 4-digit GB that holds one is 0.002098
    trace = tmp_path / "evict.jsonl"
    trace.write_text(ROWS)
    args = [command, "--trace", trace, *BASE, "--capacity", "120"]
    if command == "sweep":
        args += ["--grid", "cpu-memory-gb=0,0.001", "--dry-run"]
    else:
        args += ["--cpu-memory-gb", gb]
    result = invoke(*args)
    message = "--cpu-memory-gb 0.001 holds no KV block of 2,097,152 bytes: give at least 0.002098, or 0 for no tier"
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.endswith(message)


@pytest.mark.parametrize("gb, blocks", [("0", 0), ("0.002098", 1), ("0.004195", 2)])
def test_cpu_memory_of_zero_or_a_block_or_more_runs(tmp_path, gb, blocks):
    # floor(gb * 1e9 / 2,097,152): 0 -> 0 (no tier, with the tier's keys), 2,098,000 -> 1, 4,195,000 -> 2
    trace = tmp_path / "evict.jsonl"
    trace.write_text(ROWS)
    result = invoke("sim", "--trace", trace, *BASE, "--capacity", "120", "--cpu-memory-gb", gb)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["cpu_kv_blocks"] == blocks


def test_trace_block_on_a_workload_is_refused_before_any_cell_runs(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"requests": 3, "arrival": {"process": "constant", "rate": 1},
                                "input": {"dist": "constant", "value": 40},
                                "output": {"dist": "constant", "value": 2}}))
    out = tmp_path / "s.jsonl"
    result = invoke("sweep", "--workload", spec, "--timing", "--trace-block", "16", "--grid", "workers=1,2",
                    "--out", out, "--executor", "serial")
    assert result.exit_code == 2 and not out.exists()
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: cell {") and line.endswith(
        ": --trace-block has no effect: the workload's blocks are hashed at --block (16 tokens); it applies to "
        "traces that name their own blocks (mooncake)")
