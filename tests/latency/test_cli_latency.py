"""``dynlab latency``: the grid as JSON or a table, side-by-side models, options, errors, the plot."""
from __future__ import annotations

import json

import pytest
from helpers import invoke, ok

from dynlab.latency.grid import latency_grid


def test_json_by_default_off_a_terminal_and_keys():
    out = json.loads(ok(invoke("latency")).stdout)
    assert (out["model"], out["gpu"], out["tp"]) == ("llama-3.1-8b", "h100", 1)
    row = out["latency_models"]["roofline"]
    assert list(row["prefill_ms"]) == ["512", "2048", "8192"]
    assert list(row["decode_ms"]) == ["2048", "16384"]
    assert list(row["decode_ms"]["2048"]) == ["1", "16", "64", "256"]
    assert out == latency_grid()  # the command prints the library's result


def test_several_models_side_by_side_with_options():
    out = json.loads(ok(invoke("latency", "--latency-model", "roofline,linear", "--latency-opt", "beta0=2",
                               "--latency-opt", "beta1=0", "--latency-opt", "beta2=0", "--model", "qwen3-8b",
                               "--gpu", "h200", "--tp", "2")).stdout)
    assert list(out["latency_models"]) == ["roofline", "linear"]
    # beta0 2 ms plus the server CPU of a one-request step: 126.02 + 4.42 us = 0.130 ms -> 2.13
    assert set(out["latency_models"]["linear"]["prefill_ms"].values()) == {2.13}
    assert out["tp"] == 2 and out["gpu"] == "h200"


def test_table():
    text = ok(invoke("latency", "--format", "table", "--latency-model", "roofline,linear")).stdout
    lines = text.splitlines()
    assert lines[0] == "llama-3.1-8b on 1 x h100"
    assert lines[1].split() == ["step", "roofline", "ms", "linear", "ms"]
    assert len(lines) == 2 + 3 + 8 + 3  # head, 3 prefills, 8 decodes, then the terms of each model and the run's
    assert lines[-3].startswith("roofline includes server CPU 126 us per step + 4.42 us per request; steps of <= 512")
    assert lines[-2] == "linear includes server CPU 126 us per step + 4.42 us per request"
    assert lines[-1] == ("not in a step (a run's defaults): front end 15.56 ms per request (--request-overhead-ms), "
                         "detokenisation 45.9 us per output token (--detok-us-per-token)")


def test_list():
    out = json.loads(ok(invoke("latency", "--list")).stdout)
    assert list(out["gpus"])[:5] == ["h100", "h200", "a100-80gb", "l40s", "b200"]  # the first five, then the rest
    assert {"a100-40gb", "h100-pcie", "h100-nvl", "b300", "gb200", "l4", "mi300x"} <= set(out["gpus"])
    assert {"roofline", "linear", "blis", "aiconfigurator"} <= set(out["latency_models"])
    assert out["latency_models"]["blis"]["options"] == {}
    assert out["latency_models"]["roofline"]["options"] == {"mfu": 0.758, "mbu": 0.878, "overhead_ms": 1.30,
                                                            "moe_mfu": 0.3, "link_util": 0.4, "layer_us": 40.0,
                                                            "mla_layer_us": 90.0, "fp8_gemm_us": 59.0,
                                                            "comm_latency_us": 10.0, "cpu_step_us": 126.024825,
                                                            "cpu_us_per_request": 4.41684444, "cuda_graph_max": 512,
                                                            "cuda_graphs": "vllm", "cuda_graph_prefill_max": 0}


@pytest.mark.parametrize("args, needle", [
    (["--gpu", "h300"], "unknown GPU 'h300'; known GPUs: h100"),
    (["--model", "gpt-5"], "unknown model 'gpt-5'; bundled models:"),
    (["--latency-model", "nope"], "unknown latency model 'nope'; available: roofline"),
    (["--latency-model", "roofline,roofline"], "listed twice"),
    (["--latency-model", "roofline,"], "empty value"),
    (["--latency-opt", "mfu"], "expected NAME=VALUE"),
    (["--latency-opt", "beta0=1"], "no listed latency model (roofline) has an option 'beta0'"),
    (["--latency-opt", "mfu=2"], "option 'mfu' must be <= 1.0"),
    (["--latency-opt", "mfu=0.5", "--latency-opt", "mfu=0.6"], "given twice"),
    (["--tp", "0"], "--tp"),
    (["--list", "--gpu", "h200"], "--list cannot be combined with --gpu"),
    (["--model", "qwen3-32b", "--gpu", "l40s", "--latency-model", "linear", "--latency-opt", "beta0=0"],
     "beta0 must be positive"),
])
def test_bad_input_is_a_one_line_usage_error(args, needle):
    result = invoke("latency", *args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "lat.png"
    ok(invoke("latency", "--latency-model", "roofline,linear", "--plot", str(path)))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_plot_suffix_leaves_nothing(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "lat.xyz"
    result = invoke("latency", "--plot", str(path))
    assert result.exit_code != 0 and not path.exists()


def test_spec_gamma_is_refused_by_the_grid():
    # linear's drafter term prices a speculative step; the grid has none, so the option would do nothing
    from click.testing import CliRunner

    from dynlab.cli import main

    out = CliRunner().invoke(main, ["latency", "--latency-model", "linear", "--latency-opt", "spec_gamma=1"])
    assert out.exit_code == 2
    assert "spec_gamma has no effect here" in out.output.strip().splitlines()[-1]
