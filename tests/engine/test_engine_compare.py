"""``compare --engine vllm,sglang``: each run keeps its own engine's scheduler options (a fresh user's
``--schedule-policy lpm`` was refused for the vLLM run), every other option applies to both."""
import json

from helpers import invoke

BASE = ["compare", "--trace", "mooncake-conversation", "--timing", "--engine", "vllm,sglang", "--requests", "60",
        "--mode", "kv-cost", "--format", "json", "--quiet"]


def test_each_engine_takes_its_own_scheduler_options():
    res = invoke(*BASE, "--schedule-policy", "lof", "--max-num-seqs", "1")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["sglang"]["sglang_schedule_policy"] == "lof"
    assert not any(k.startswith("sglang_") for k in out["vllm"])
    alone = json.loads(invoke(*BASE).stdout)
    # --max-num-seqs 1 serialises vLLM's requests (its TTFT grows), and leaves SGLang's run as it was
    assert out["vllm"]["ttft_ms"]["p50"] > alone["vllm"]["ttft_ms"]["p50"]
    assert out["sglang"]["ttft_ms"] == json.loads(invoke(*BASE, "--schedule-policy", "lof").stdout)["sglang"]["ttft_ms"]


def test_an_option_neither_engine_scheduler_owns_is_still_refused_where_it_does_nothing():
    res = invoke(*BASE, "--cpu-capacity", "64")
    assert res.exit_code == 2 and "--cpu-capacity has no effect with --engine sglang" in res.stderr


def test_sim_given_a_list_of_engines_points_to_compare():
    res = invoke("sim", "--timing", "--engine", "vllm,sglang")
    assert res.exit_code == 2
    (line,) = res.stderr.strip().splitlines()
    assert "unknown engine kind 'vllm,sglang'" in line and "a comma list compares them: dynlab compare" in line
    assert "compares them" not in invoke("sim", "--timing", "--engine", "vllm,nope").stderr  # not a list of names


def test_compare_table_shows_held_requests_and_gpu_hours_when_a_run_has_them():
    """A fresh user's compare behind a holding gateway, or with an autoscaler, showed neither figure."""
    from dynlab.cli.routing import _format_table

    header, a, b = _format_table({"a": {"requests": 3, "shed": 0, "held": 2, "gpu_hours": 0.5},
                                  "b": {"requests": 3, "shed": 1}}).splitlines()
    cols = header.split()
    assert cols == ["run", "requests", "shed", "held", "gpu_hours"]
    assert a.split() == ["a", "3", "0", "2", "0.5"] and b.split() == ["b", "3", "1", "-", "-"]
    assert "held" not in _format_table({"c": {"requests": 3, "shed": 0}}).split()
