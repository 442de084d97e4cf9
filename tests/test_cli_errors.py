"""Bad input anywhere gives one line, the right exit code, and no traceback."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dynlab import hookimpl, plugins
from dynlab.cli import main
from dynlab.routing.strategy import Strategy


def one_line_error(args, code, needle, **kw):
    r = CliRunner().invoke(main, args, **kw)
    assert r.exit_code == code, r.output
    assert r.output.count("\n") == 1 and "Traceback" not in r.output, r.output
    assert needle in r.output, r.output
    return r


@pytest.mark.parametrize("args,needle", [
    (["sim", "--event-loss", "nan"], "not a finite number"),
    (["sim", "--timing", "--time-scale", "inf"], "not a finite number"),
    (["sim", "--timing", "--time-scale", "1e-320"], "vanishingly small"),
    (["sim", "--time-scale", "0.5"], "--time-scale has no effect without --timing"),
    (["compare", "--rate", "2"], "--rate has no effect without --timing"),
    (["compare", "--modes", "rr,rr"], "'rr' repeats 'rr'"),
    (["compare", "--workers", "2,0"], "--workers"),
    # the option named as sim names it, whichever alias was typed (it said "--mode", unquoted)
    (["compare", "--modes", "rr,nosuch"], "Invalid value for '--mode' / '--modes': unknown strategy 'nosuch'"),
    (["sim", "--modes", "nosuch"], "Invalid value for '--mode' / '--modes': unknown strategy 'nosuch'"),
    (["sim", "--opt", "a=1", "--opt", "a=2"], "given twice"),
    (["sim", "--timing", "--capacity", "0"], "capacity must be >= 1 block, got 0"),  # count-based: a cache of 0
    (["sim", "--mode", "kv-cost", "--opt", "temperature=inf"], "finite number"),
    (["sim", "--mode", "kv-cost", "--opt", "prefill_load_scale=-1"], "must be >= 0"),
    (["sim", "--mode", "cache-aware", "--opt", "cache_threshold=2"], "must be <= 1"),
])
def test_usage_errors(args, needle):
    one_line_error(args, 2, needle)


@pytest.mark.parametrize("line,needle", [
    ('{"hash_ids": [1], "timestamp": NaN}', "finite"),
    ('{"hash_ids": [1], "input_length": 1e400}', "finite"),
])
def test_non_finite_trace_values_are_refused(tmp_path, line, needle):
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    one_line_error(["sim", "--trace", str(path), "--timing"], 1, f"{path}:1:")


def test_trace_from_stdin():
    lines = '{"hash_ids": [1, 2]}\n{"hash_ids": [1, 3]}\n'
    r = CliRunner().invoke(main, ["sim", "--trace", "-", "--mode", "kv", "--workers", "1"], input=lines)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["requests"] == 2 and out["cached_blocks"] == 1


class Boom(Strategy):
    """Raises on every request (a broken plugin)."""

    name = "test-boom"

    def route(self, request, fleet):
        raise ZeroDivisionError("oops")


class BoomPlugin:
    @hookimpl
    def dynlab_register_strategies(self, register):
        register(Boom)


def test_a_failing_strategy_is_named_in_one_line():
    pm = plugins.get_plugin_manager()
    pm.register(BoomPlugin(), name="test-boom-plugin")
    try:
        one_line_error(["sim", "--mode", "test-boom"], 1, "strategy 'test-boom' failed at request 0: ZeroDivisionError")
    finally:
        pm.unregister(name="test-boom-plugin")


def test_no_subcommand_prints_help_without_error_prefix():
    r = subprocess.run([sys.executable, "-c", "from dynlab.cli import main; main()"], capture_output=True, text=True)
    assert r.returncode == 2 and "Usage:" in r.stderr and "Error" not in r.stderr


def _help(*command):
    from helpers import invoke as _invoke

    result = _invoke(*command, "--help")
    assert result.exit_code == 0
    return " ".join(result.output.split())


def test_compare_help_shows_each_options_type_and_default():
    from dynlab.cli.routing import SIM_OPTIONS

    from dynlab.engine.options import BY_NAME

    text = _help("compare")
    for flags, field, _, default, _ in SIM_OPTIONS:
        many = " V " if BY_NAME[field].own_commas else " V[,V...]"  # one value of an option with commas of its own
        i = text.index(flags[0] + many) if flags[0] != "--mode" else text.index("--modes V[,V...]")
        entry = text[i:text.index("]", text.index("[type:", i)) + 1]
        # a None default is said as sim --help says it (a few by hand here), never as a raw None
        shown = {"capacity": "unbounded; with --timing derived from the GPU memory", "trace": "the synthetic workload",
                 "trace_format": "detected from the first line", "cpu_capacity": "no tier", "cpu_memory_gb": "no tier",
                 "rate": "the trace's own rate; 4 for Poisson arrivals", "rate_scale": "1",
                 "duration": "the whole trace", "workload": "none",
                 "tokenizer": "an approximation, see docs/workloads.md",
                 "num_requests": "all", "spec_method": "off", "price": "no cost", "slo_ttft_ms": "no SLO",
                 "chunked_prefill_size": "by the GPU's memory, 8192 on an H100"}
        expected = shown.get(field, BY_NAME[field].default_text() if default is None else default)
        assert f"default: {expected}]" in entry and "default: None]" not in entry, entry
    assert "[type: integer >= 1; default: 2]" in text  # --workers, by hand from SIM_OPTIONS
    assert "[type: number 0.0 to 1.0; default: 0.0]" in text  # --event-loss


@pytest.mark.parametrize("kind, fields", [
    ("disagg", ["mode", "input", "conc", "rep", "ttft_p50_ms"]),
    ("offload", ["config", "pass", "doc", "doc_tokens", "ttft_ms", "total_ms"]),
])
def test_summarize_help_describes_the_input_line(kind, fields):
    text = _help("summarize", kind)
    assert "Each line of IN is one JSON object" in text
    for field in fields:
        assert f'"{field}":' in text and f"{field}:" in text


def test_quiet_says_what_it_silences_in_each_command():
    texts = {c: _help(c).split("--quiet ")[1].split(" --")[0] for c in ("sim", "compare", "sweep")}
    assert "summary line" in texts["sweep"] and "summary" not in texts["sim"] + texts["compare"]
    assert "per run" in texts["compare"]


@pytest.mark.parametrize("args", [
    ["sim", "--trace", "{deep}"],
    ["events", "replay", "{deep}"],
    ["summarize", "disagg", "{deep}", "-"],
    ["disagg", "--model-config", "{deep}", "--tokens", "10", "--gbps", "1"],
])
def test_json_nested_beyond_the_decoder_is_one_line(tmp_path, args):
    # 100,000 nested lists: Python's JSON decoder raises RecursionError; the file and line are named
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    one_line_error([a.replace("{deep}", str(deep)) for a in args], 1, "nested too deeply")


def test_tensor_parallelism_must_split_the_heads():
    # Llama-3.1-8B: 32 attention heads, 8 KV heads; 3 divides neither (vLLM refuses it)
    one_line_error(["sim", "--timing", "--tp", "3"], 2, "--tp 3 cannot split")
    one_line_error(["latency", "--tp", "3"], 2, "--tp 3 cannot split")


def test_capacity_0_without_timing_is_a_cache_that_holds_nothing():
    # --help and docs/limits.md say so: every lookup misses, nothing is cached or evicted
    r = CliRunner().invoke(main, ["sim", "--capacity", "0", "--mode", "kv-events", "--workers", "2",
                                  "--all-metrics"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["cached_blocks"] == 0 and out["hits"] == 0 and out["repeat_requests"] > 0
    assert out["prompt_blocks"] > 0 and out["evicted_blocks"] == 0
