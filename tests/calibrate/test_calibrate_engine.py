"""``dynlab calibrate --engine`` (issue 38 item 4): SGLang servers' files are replayed on SGLang's scheduler,
the profile names that engine, and ``sim --engine sglang --latency-profile`` uses it without the
other-engine warning."""
from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from dynlab.calibrate.files import calibrate_files, replay_engine
from dynlab.calibrate.fit import CalibrationError
from dynlab.calibrate.formats import MeasuredPoint
from dynlab.calibrate.replay import replay
from dynlab.cli import main
from dynlab.engine.config import SimConfig

TRUTH = {"beta0": 6.0, "beta1": 0.02, "beta2": 0.05}  # ms, ms per prefill token, ms per decoding request
# an SGLang server as fidelity_real's sglang_server gives it: --max-running-requests, --chunked-prefill-size
SGLANG = {"max_running_requests": 4, "chunked_prefill_size": 512}
TRUE_SGLANG = SimConfig(timing=True, latency_model="linear", model="llama-3.1-8b", gpu="h100", engine_kind="sglang",
                        latency_opts={k: repr(v) for k, v in TRUTH.items()}, request_overhead_ms=40.0, **SGLANG)
COLUMNS = ["model", "gpu", "tp", "engine", "max_concurrency", "num_prompts", "random_input_len", "random_output_len",
           "random_range_ratio", "median_ttft_ms", "median_tpot_ms", "median_e2el_ms", "total_token_throughput",
           "per_gpu"]


N = 16  # requests a point (few: the test's runtime)


def _point(c, n_in, n_out):
    return MeasuredPoint(source=f"c{c}", max_concurrency=c, num_prompts=N, random_input_len=n_in,
                         random_output_len=n_out, random_range_ratio=0.2)


def _write_points(path, design, engine="sglang", truth=TRUE_SGLANG):
    """A points CSV (engine column ``engine``) of dynlab's own SGLang runs at :data:`TRUTH`, one row a point."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for c, n_in, n_out in design:
            got = replay(_point(c, n_in, n_out), truth)
            w.writerow(["llama-3.1-8b", "h100", 1, engine, c, N, n_in, n_out, 0.2, got["median_ttft_ms"],
                        got["median_tpot_ms"], got["median_e2el_ms"], got["total_token_throughput_per_gpu"], "true"])
    return str(path)


def test_a_profile_from_an_sglang_points_file_names_sglang_and_was_replayed_there(tmp_path):
    design = ((2, 1000, 20), (16, 1000, 20))  # 16 users > --max-running-requests 4: SGLang queues 12
    truth = replace(TRUE_SGLANG, request_overhead_ms=SimConfig().request_overhead_ms)  # calibrate's starting one
    path = _write_points(tmp_path / "sglang.csv", design, truth=truth)
    opts = {k: repr(v) for k, v in TRUTH.items()}
    profile, _ = calibrate_files([path], latency_opts=opts, fit=["beta0"], folds=2, engine=SGLANG, max_nfev=1,
                                 tp=1)
    assert profile["engine"] == "sglang"
    # replayed on SGLang with the true coefficients, the file's own figures come back: no error before the fit
    for row in profile["points"]:
        assert all(abs(e) < 0.5 for e in row["error_pct"]["before"].values()), row
    # the same points on vLLM's scheduler (its default 256 running, 8192 tokens a step) differ: the check bites
    vllm = replace(TRUE_SGLANG, engine_kind="vllm", max_running_requests=None, chunked_prefill_size=None)
    sglang_figs, vllm_figs = replay(_point(16, 1000, 20), truth), replay(_point(16, 1000, 20), vllm)
    assert abs(vllm_figs["median_ttft_ms"] / sglang_figs["median_ttft_ms"] - 1) > 0.05


@pytest.mark.parametrize("stated, given, want", [(None, None, "vllm"), ("SGLang", None, "sglang"),
                                                 (None, "sglang", "sglang"), ("vllm", "vllm", "vllm")])
def test_the_replay_engine_is_the_given_or_stated_one_else_vllm(stated, given, want):
    assert replay_engine([MeasuredPoint(source="a", engine=stated)], given) == want


def test_points_stating_several_or_an_unknown_engine_are_refused():
    with pytest.raises(CalibrationError, match="several engines"):
        replay_engine([MeasuredPoint(source="a", engine="vllm"), MeasuredPoint(source="b", engine="sglang")])
    # no dead end: --engine would then be refused for contradicting the file, so the hint is not to give it
    with pytest.raises(CalibrationError, match="'trt-llm' is not one dynlab replays .*calibrate on measurements of"):
        replay_engine([MeasuredPoint(source="a", engine="trt-llm")])


@pytest.mark.parametrize("args, words", [
    (["--engine", "vllm"], ["'sglang'", "--engine is 'vllm'"]),  # the file states sglang
    (["--max-num-seqs", "64"], ["--max-num-seqs has no effect with engine sglang", "vllm's flag"]),
])
def test_another_engine_than_the_files_or_its_flags_are_refused_in_one_line(tmp_path, args, words):
    path = tmp_path / "sglang.csv"
    path.write_text(",".join(COLUMNS) + "\nllama-3.1-8b,h100,1,sglang,4,40,1000,20,0.2,100,10,300,5000,true\n")
    out = tmp_path / "profile.json"
    r = CliRunner().invoke(main, ["calibrate", str(path), "--out", str(out), *args])
    assert r.exit_code == 2 and not out.exists()
    last = r.output.strip().splitlines()[-1]
    assert "Traceback" not in r.output and all(w in last for w in words), r.output


def test_an_sglang_flag_on_a_vllm_file_is_refused(tmp_path):
    path = tmp_path / "vllm.csv"
    path.write_text(",".join(COLUMNS) + "\nllama-3.1-8b,h100,1,vllm,4,40,1000,20,0.2,100,10,300,5000,true\n")
    r = CliRunner().invoke(main, ["calibrate", str(path), "--chunked-prefill-size", "512"])
    assert r.exit_code == 2 and "--chunked-prefill-size has no effect with engine vllm" in r.output


def test_calibrate_recovers_known_coefficients_on_sglang_and_sim_uses_the_profile_quietly(tmp_path):
    design = ((1, 1000, 20), (8, 1000, 20), (32, 2000, 30))
    path = _write_points(tmp_path / "sglang.csv", design)
    out = tmp_path / "profile.json"
    r = CliRunner().invoke(main, ["calibrate", path, "--max-running-requests", "4", "--chunked-prefill-size", "512",
                                  "--out", str(out), "--output-format", "json", "--folds", "2"])
    assert r.exit_code == 0, r.output
    profile = json.loads(out.read_text())
    assert profile["engine"] == "sglang"
    for name, value in profile["latency_opts"].items():
        assert value == pytest.approx(TRUTH[name], rel=0.02), (name, profile["latency_opts"])
    assert profile["request_overhead_ms"] == pytest.approx(40.0, rel=0.02)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 50 * i, "input_length": 600, "output_length": 10,
                                         "hash_ids": [2 * i, 2 * i + 1]}) + "\n" for i in range(4)))
    for engine, warned in (("sglang", False), ("vllm", True)):
        r = CliRunner().invoke(main, ["sim", "--timing", "--quiet", "--trace", str(trace), "--engine", engine,
                                      "--latency-profile", str(out)])
        assert r.exit_code == 0, r.output
        assert ("latency_domain" in json.loads(r.stdout)) == warned, r.stdout


def test_a_vllm_bench_result_states_its_server_with_metadata_engine(tmp_path):
    # `vllm bench serve --metadata engine=sglang` against an SGLang server: the result's top-level "engine"
    data = {"model_id": "llama-3.1-8b", "duration": 10.0, "max_concurrency": 4, "engine": "sglang",
            "total_token_throughput": 800.0}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    from dynlab.calibrate.formats import read_points

    assert replay_engine(read_points(path)) == "sglang"
    with pytest.raises(CalibrationError, match="states engine 'sglang' but --engine is 'vllm'"):
        replay_engine(read_points(path), "vllm")


def test_the_docs_sglang_points_file_is_the_real_data_s_first_three_rows():
    # docs/calibrate.md's SGLang run reads examples/measured/dsr1_sglang_points.csv: InferenceMAX's first three
    # 1k/1k rows of benchmarks/data/real/inferencemax_dsr1_sglang.csv with the points format's columns, lengths
    # rounded to whole tokens (921.6 -> 922), the p99 columns left out
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    with open(root / "benchmarks/data/real/inferencemax_dsr1_sglang.csv") as fh:
        real = list(csv.DictReader(fh))[:3]
    with open(root / "examples/measured/dsr1_sglang_points.csv") as fh:
        points = list(csv.DictReader(fh))
    assert len(points) == 3
    for want, got in zip(real, points):
        assert got["engine"] == want["engine"] == "sglang" and got["max_concurrency"] == want["max_concurrency"]
        assert int(got["random_input_len"]) == round(float(want["random_input_len"]))
        for key in ("median_ttft_ms", "median_tpot_ms", "median_e2el_ms", "total_token_throughput"):
            assert float(got[key]) == pytest.approx(float(want[key]), abs=0.006), key
        assert "p99_ttft_ms" not in got


@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_chunk_of_0_is_refused_by_calibrate_as_by_sim_saying_what_is_allowed(tmp_path, value):
    path = tmp_path / "sglang.csv"
    path.write_text(",".join(COLUMNS) + "\nllama-3.1-8b,h100,1,sglang,4,40,1000,20,0.2,100,10,300,5000,true\n")
    lines = []
    for args in (["calibrate", str(path)], ["sim", "--timing", "--engine", "sglang"]):
        r = CliRunner().invoke(main, [*args, "--chunked-prefill-size", value])
        assert r.exit_code == 2 and r.stdout == "" and "Traceback" not in r.output, r.output
        (line,) = r.stderr.splitlines()
        lines.append(line)
    assert lines[0] == lines[1] == (f"Error: Invalid value for '--chunked-prefill-size': {value} is not -1 (no "
                                    "chunking) or in the range 1<=x<=100000000.")
    with pytest.raises(ValueError, match=r"^chunked_prefill_size must be -1 \(no chunking\) or an integer from 1 to "
                                         r"100000000, got 0$"):
        SimConfig(timing=True, engine_kind="sglang", chunked_prefill_size=0).validate()


def test_the_engine_and_gpu_given_are_compared_in_lower_case_as_the_files_are(tmp_path):
    # a file's engine and GPU are the benchmark tool's spelling ("SGLang", "H100"), compared in lower case; the
    # same facts given as calibrate's flags are taken the same way: --engine SGLANG is sglang, --gpu H100 is h100
    path = tmp_path / "sglang.csv"
    path.write_text(",".join(COLUMNS) + "\nllama-3.1-8b,H100,1,SGLang,4,40,1000,20,0.2,100,10,300,5000,true\n")
    r = CliRunner().invoke(main, ["calibrate", str(path), "--engine", "SGLANG", "--max-num-seqs", "64"])
    assert r.exit_code == 2 and r.stderr.splitlines() == [
        "Error: --max-num-seqs has no effect with engine sglang (it is vllm's flag)"], r.output
    from dynlab.calibrate.files import point_configs

    (config,) = point_configs([MeasuredPoint(source="a", model="llama-3.1-8b")], SimConfig(), gpu="H100")
    assert config.gpu == "h100"
    gpu_file = str(tmp_path / "My.json")  # a GPU file's path is a path: its case is kept
    (config,) = point_configs([MeasuredPoint(source="a", model="llama-3.1-8b")], SimConfig(), gpu=gpu_file)
    assert config.gpu == gpu_file
