"""Inputs so large or small that a result would be infinite or NaN: one line naming the option, exit 2.

The simulated clock stops at ``HORIZON_MS`` (10^12 ms); every producer of times (arrivals, engine
steps, CPU-tier loads, KV transfers) refuses to pass it, and ``dynlab disagg``'s arithmetic
refuses a result that overflows a float.
"""
from __future__ import annotations

import json
import random

import click
import pytest
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.cli.common import echo_json
from dynlab.disagg import cost
from dynlab.limits import HORIZON_MS
from dynlab.engine.timed import arrival_times
from dynlab.kv.cpu_tier import cpu_blocks
from dynlab.routing.strategy import Request


def one_line_usage_error(args, needle):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and "Traceback" not in r.output, r.output
    assert needle in r.output, r.output
    return r


@pytest.fixture
def trace(tmp_path):
    """Two Mooncake rows 5 ms apart, two 512-token blocks each, 4 output tokens (so a P/D run transfers KV)."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 5, "input_length": 1024, "output_length": 4, "hash_ids": [1, 3]}\n')
    return str(path)


def test_horizon_is_pinned():
    assert HORIZON_MS == 1e12


def test_arrival_on_the_horizon_passes_and_past_it_is_refused():
    # timestamp 1 ms x 1e12 = 1e12 ms: exactly the horizon, accepted; 2 ms x 1e12 = 2e12 ms: past it
    reqs = [Request((1,), 16, 1, 1.0, 0), Request((2,), 16, 1, 2.0, 1)]
    times = arrival_times(reqs, 1e12, 4.0, random.Random(0))
    assert next(times)[1] == 1e12
    with pytest.raises(ValueError, match=r"request 1's arrival .*--time-scale 1e\+12\) would reach 2e\+12 ms"):
        next(times)


def test_time_scale_that_overflows_is_a_usage_error(trace, tmp_path):
    # the fresh-user case: 5 ms x 1e308 overflows to inf; nothing is printed to stdout
    r = one_line_usage_error(["sim", "--timing", "--trace", trace, "--time-scale", "1e308"],
                             "use a smaller --time-scale")
    assert "would reach inf ms" in r.output


def test_rate_so_small_that_arrivals_pass_the_horizon_is_a_usage_error():
    # a mean gap of 1/1e-305 s = 1e308 ms: the first arrival is far past 1e12 ms
    one_line_usage_error(["sim", "--timing", "--prefixes", "1", "--reps", "1", "--rate", "1e-305"],
                         "use a larger --rate")


def test_latency_option_that_makes_steps_endless_is_a_usage_error():
    # linear model: a step takes at least beta0 = 1e308 ms
    one_line_usage_error(["sim", "--timing", "--prefixes", "1", "--reps", "1", "--latency-model", "linear",
                          "--latency-opt", "beta0=1e308"], "check --latency-opt")


@pytest.mark.parametrize("option,value", [("--link-gbps", "1e-300"), ("--link-latency-ms", "1e308")])
def test_kv_transfer_past_the_horizon_is_a_usage_error(trace, option, value):
    # 1024 tokens x 131072 B (llama-3.1-8b) = 134,217,728 bytes at 1e-300 GB/s: ~1.3e302 ms
    r = one_line_usage_error(["sim", "--timing", "--trace", trace, "--split", "1:1", option, value],
                             "use a larger --link-gbps or a smaller --link-latency-ms")
    assert "134,217,728 bytes" in r.output


def test_pcie_so_slow_a_load_passes_the_horizon_is_a_usage_error():
    # one 16-token block of llama-3.1-8b is 16 x 131072 = 2,097,152 bytes; at 5e-324 GB/s: inf ms
    r = one_line_usage_error(["sim", "--timing", "--prefixes", "1", "--reps", "1", "--capacity", "1",
                              "--cpu-capacity", "1", "--pcie-gbps", "5e-324"], "--pcie-gbps")
    assert "2,097,152 bytes" in r.output


def test_cpu_memory_that_overflows_is_refused():
    # 1e308 GB x 1e9 B/GB overflows; 1 GB of 1e6-byte blocks is 1000 blocks
    assert cpu_blocks(1.0, 1e6) == 1000
    with pytest.raises(ValueError, match="--cpu-memory-gb 1e\\+308 is too large"):
        cpu_blocks(1e308, 2_097_152)
    one_line_usage_error(["sim", "--timing", "--prefixes", "1", "--reps", "1", "--cpu-memory-gb", "1e308"],
                         "--cpu-memory-gb 1e+308 is too large")


@pytest.mark.parametrize("args,needle", [
    # 1e14 tokens x 114,688 B = 1.14688e19 B over 5e-300 GB/s: ~2.3e312 ms, past a float's 1.8e308
    (["--tokens", "100000000000000", "--gbps", "5e-300"], "gbps 5e-300 is too small for about 10^19 bytes"),
    # 1e308 + 1.1 + 1e308 overflows
    (["--tokens", "10", "--gbps", "1", "--prefill-ms", "1e308", "--overhead-ms", "1e308"], "overflows a float"),
    # 5e-324 ms / 1000 underflows to 0 s: the bandwidth would divide by zero
    (["--tokens", "10", "--gbps", "1", "--saved-ms", "5e-324"], "saved_ms 5e-324 is too small"),
    # 2 x 10^310 layers x 8 x 128 x 2 = 4.096e313 bytes per token: no float holds it
    (["--tokens", "1", "--gbps", "1", "--layers", "1" + "0" * 310], "about 10^313 bytes overflows a float"),
])
def test_disagg_results_that_overflow_are_usage_errors(args, needle):
    one_line_usage_error(["disagg", *args], needle)


def test_disagg_functions_keep_finite_results():
    # the docstring's example: 1500 x 114688 B / (0.112e9 B/s) = 1.536 s
    assert round(cost.transfer_ms(1500, 114688, 0.112), 1) == 1536.0
    with pytest.raises(ValueError, match="^gbps 1e-320 is too small for 15.0 bytes"):
        cost.transfer_ms(1.5, 10.0, 1e-320)


def test_echo_json_names_the_non_finite_key(capsys):
    echo_json({"a": 1.5})
    assert json.loads(capsys.readouterr().out) == {"a": 1.5}
    with pytest.raises(click.UsageError, match=r"the result 'a\.b\[1\]' is not a finite number"):
        echo_json({"a": {"b": [1.0, float("inf")]}})
    assert capsys.readouterr().out == ""
