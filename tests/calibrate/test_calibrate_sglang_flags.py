"""``dynlab calibrate``'s SGLang server flags beyond ``--max-running-requests`` and ``--chunked-prefill-size``:
``--max-prefill-tokens`` and ``--mem-fraction-static`` reach the replayed SimConfig and change a replay;
``--disable-radix-cache`` is refused, since no replay depends on it; each engine's flags are refused with the
other engine's (one line, exit 2)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from dynlab.calibrate.formats import MeasuredPoint
from dynlab.calibrate.replay import ReplayError, replay
from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.engine.options import BY_NAME

POINTS = ("model,gpu,max_concurrency,num_prompts,random_input_len,random_output_len,median_ttft_ms,median_tpot_ms\n"
          "llama-3.1-8b,h100,2,8,64,8,15,6\nllama-3.1-8b,h100,4,8,64,8,25,8\n")
BASE = SimConfig(timing=True, latency_model="linear", model="llama-3.1-8b", gpu="h100", engine_kind="sglang")
# 16 users of ~1,000-token prompts: 16,000 tokens in flight
BUSY = MeasuredPoint(source="busy", max_concurrency=16, num_prompts=32, random_input_len=1000, random_output_len=20,
                     random_range_ratio=0.2)


class _Stop(Exception):
    pass


def _configs(tmp_path, monkeypatch, *args) -> list:
    """The SimConfigs ``dynlab calibrate POINTS *args`` hands the fit (the fit itself not run)."""
    seen = []

    def fit(points, configs, *rest):
        seen.extend(configs)
        raise _Stop

    monkeypatch.setattr("dynlab.calibrate.files.calibrate", fit)
    path = tmp_path / "points.csv"
    path.write_text(POINTS)
    r = CliRunner().invoke(main, ["calibrate", str(path), *args])
    assert isinstance(r.exception, _Stop), r.output
    return seen


def test_the_sglang_flags_reach_every_replayed_config(tmp_path, monkeypatch):
    configs = _configs(tmp_path, monkeypatch, "--engine", "sglang", "--max-prefill-tokens", "1000",
                       "--mem-fraction-static", "0.5", "--max-running-requests", "3", "--chunked-prefill-size", "-1")
    assert len(configs) == 2
    for c in configs:
        assert (c.engine_kind, c.max_prefill_tokens, c.mem_fraction_static) == ("sglang", 1000, 0.5)
        assert (c.max_running_requests, c.chunked_prefill_size) == (3, -1)


def test_left_out_they_are_sims_defaults(tmp_path, monkeypatch):
    (c, _) = _configs(tmp_path, monkeypatch, "--engine", "sglang")
    assert c.max_prefill_tokens == BY_NAME["max_prefill_tokens"].default == 16384  # SGLang's own default
    assert c.mem_fraction_static is BY_NAME["mem_fraction_static"].default is None  # sim's rule sizes the pool
    assert c.disable_radix_cache is False


def test_a_small_mem_fraction_static_shrinks_the_pool_and_requests_queue():
    # 0.2 x 80 GiB less llama-3.1-8b's 15 GiB of weights leaves ~8,500 tokens of KV: about half the users wait
    roomy, tight = replay(BUSY, BASE), replay(BUSY, replace(BASE, mem_fraction_static=0.2))
    assert tight["median_ttft_ms"] > 1.2 * roomy["median_ttft_ms"], (roomy, tight)
    assert tight["total_token_throughput_per_gpu"] < roomy["total_token_throughput_per_gpu"]


def test_max_prefill_tokens_changes_the_replay():
    # 1,000 tokens a prefill pass: one ~1,000-token prompt a step, not the 16 at once the default 16384 admits
    default, one = replay(BUSY, BASE), replay(BUSY, replace(BASE, max_prefill_tokens=1000))
    assert default != one
    assert one["median_tpot_ms"] > default["median_tpot_ms"]  # the prefills spread over more decode steps


def test_the_radix_cache_changes_no_replay_even_on_a_tight_pool():
    """Why --disable-radix-cache is refused: a replay's prompts share no prefix. If this fails (replays gained
    shared prefixes), the flag changes replays: take it (dynlab/calibrate/files.py, NO_EFFECT)."""
    tight = replace(BASE, mem_fraction_static=0.2)
    for point in (BUSY, replace(BUSY, max_concurrency=64, num_prompts=128, random_output_len=300)):
        assert replay(point, tight) == replay(point, replace(tight, disable_radix_cache=True))


def test_a_pool_that_holds_no_request_is_one_line_not_a_traceback(tmp_path):
    with pytest.raises(ReplayError, match=r"^busy: the replayed server refused all 32 requests .*mem-fraction-static"):
        replay(BUSY, replace(BASE, mem_fraction_static=0.187))  # 1 block of 16 tokens: no prompt fits
    path = tmp_path / "points.csv"
    path.write_text(POINTS)
    r = CliRunner().invoke(main, ["calibrate", str(path), "--engine", "sglang", "--mem-fraction-static", "0.187"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1].startswith(f"Error: {path}:2: the replayed server refused all 8")


def _refused(tmp_path, *args) -> str:
    path = tmp_path / "points.csv"
    path.write_text(POINTS)
    out = tmp_path / "profile.json"
    r = CliRunner().invoke(main, ["calibrate", str(path), "--out", str(out), *args])
    assert r.exit_code == 2 and not out.exists() and "Traceback" not in r.output, r.output
    (line,) = r.output.strip().splitlines()
    return line


@pytest.mark.parametrize("flag, value", [("--max-prefill-tokens", "1000"), ("--mem-fraction-static", "0.5"),
                                         ("--disable-radix-cache", None)])
@pytest.mark.parametrize("engine", [["--engine", "vllm"], []])  # given, or the default: vLLM
def test_sglangs_flags_are_refused_on_vllm(tmp_path, flag, value, engine):
    line = _refused(tmp_path, *engine, flag, *([value] if value else []))
    assert line == f"Error: {flag} has no effect with engine vllm (it is sglang's flag)"


@pytest.mark.parametrize("flag", ["--max-num-seqs", "--max-num-batched-tokens"])
def test_vllms_flags_are_refused_on_sglang(tmp_path, flag):
    assert _refused(tmp_path, "--engine", "sglang", flag, "64") == \
        f"Error: {flag} has no effect with engine sglang (it is vllm's flag)"


def test_disable_radix_cache_is_refused_on_sglang_saying_why(tmp_path):
    assert _refused(tmp_path, "--engine", "sglang", "--disable-radix-cache") == (
        "Error: --disable-radix-cache has no effect on dynlab calibrate's replays (their prompts share no prefix, "
        "so SGLang's radix cache never matches one): leave it out")


@pytest.mark.parametrize("flag, value, said", [
    ("--max-prefill-tokens", "0", "0 is not in the range x>=1"),
    ("--mem-fraction-static", "0", "0 is not in the range 0.0<x<=1.0"),
    ("--mem-fraction-static", "1.5", "1.5 is not in the range 0.0<x<=1.0"),
    ("--mem-fraction-static", "nan", "'nan' is not a finite number")])
def test_their_ranges_are_sims(tmp_path, flag, value, said):
    path = tmp_path / "points.csv"
    path.write_text(POINTS)
    for command in (["calibrate", str(path), "--engine", "sglang"], ["sim", "--timing", "--engine", "sglang"]):
        r = CliRunner().invoke(main, [*command, flag, value])
        assert r.exit_code == 2 and said in r.output, (command, r.output)
