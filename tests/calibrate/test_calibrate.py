"""dynlab calibrate: known coefficients recovered from files dynlab wrote in every format, the profile,
the cross-validation, and one-line refusals."""
from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from dynlab.calibrate.fit import CalibrationError, calibrate, cross_validate, cv_errors
from dynlab.calibrate.formats import MeasuredPoint
from dynlab.latency.profile import PROFILE_KEYS, read_profile
from dynlab.calibrate.replay import lengths, replay, simulate
from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.errors import InputError
from helpers import terms_off

pytest.importorskip("scipy")

TRUTH = {"beta0": 6.0, "beta1": 0.04, "beta2": 0.25}
#: (users, mean input tokens, mean output tokens): points that tell the three coefficients apart
DESIGN = ((1, 1000, 100), (4, 1000, 100), (16, 1000, 100), (32, 2000, 120), (8, 4000, 100))
TRUTH_FRONT_MS = 40.0  # the server's front end per request (--request-overhead-ms)
TRUE_CONFIG = SimConfig(timing=True, latency_model="linear", model="llama-3.1-8b", gpu="h100",
                        latency_opts={k: repr(v) for k, v in TRUTH.items()}, request_overhead_ms=TRUTH_FRONT_MS)


def _point(c, n_in, n_out, ratio=0.2):
    return MeasuredPoint(source=f"c{c}", max_concurrency=c, num_prompts=40, random_input_len=n_in,
                         random_output_len=n_out, random_range_ratio=ratio)


def _write_vllm(tmp_path, i, c, n_in, n_out):
    """A `vllm bench serve --save-result --save-detailed` file of dynlab's own run (seconds, vLLM's keys)."""
    point = _point(c, n_in, n_out)
    run = simulate(point, TRUE_CONFIG)
    data = {"model_id": "llama-3.1-8b", "backend": "vllm", "num_prompts": len(run.rows), "max_concurrency": c,
            "request_rate": "inf", "duration": run.span_ms / 1000.0, "completed": len(run.rows),
            "input_lens": [r[0] for r in run.rows], "output_lens": [r[1] for r in run.rows],
            "ttfts": [r[2] / 1000.0 for r in run.rows],
            "itls": [[(r[3] - r[2]) / (r[1] - 1) / 1000.0] * (r[1] - 1) for r in run.rows],
            "latencies": [r[3] / 1000.0 for r in run.rows], "gpu": "h100"}
    path = tmp_path / f"vllm_{i}.json"
    path.write_text(json.dumps(data))
    return [str(path)]


def _write_aiperf(tmp_path, i, c, n_in, n_out):
    """aiperf's profile_export.jsonl of dynlab's own run (ms; no concurrency in the file)."""
    run = simulate(_point(c, n_in, n_out), TRUE_CONFIG)
    lines = []
    for n, (isl, osl, ttft, e2e) in enumerate(run.rows):
        gap = (e2e - ttft) / (osl - 1)
        metrics = {"input_sequence_length": {"value": isl, "unit": "tokens"},
                   "output_sequence_length": {"value": osl, "unit": "tokens"},
                   "time_to_first_token": {"value": ttft, "unit": "ms"},
                   "request_latency": {"value": e2e, "unit": "ms"},
                   "inter_chunk_latency": {"value": [gap] * (osl - 1), "unit": "ms"}}
        lines.append(json.dumps({"metadata": {"turn_index": 0}, "metrics": metrics, "error": None}))
    run_dir = tmp_path / f"aiperf_{i}"  # one artifact directory per run, as aiperf writes them
    run_dir.mkdir()
    path = run_dir / "profile_export.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (run_dir / "profile_export_aiperf.json").write_text(json.dumps(
        {"records": {}, "input_config": {"endpoint": {"model_names": ["llama-3.1-8b"]}, "loadgen": {"concurrency": c}}}))
    return [str(path)]


def _figures(c, n_in, n_out, ratio=0.2):
    point = _point(c, n_in, n_out, ratio)
    return point, replay(point, TRUE_CONFIG)


def _write_points(tmp_path, i, c, n_in, n_out):
    """One row of a points CSV (summary figures only: the replay redraws vLLM's random dataset)."""
    point, got = _figures(c, n_in, n_out)
    path = tmp_path / f"points_{i}.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["model", "gpu", "tp", "max_concurrency", "num_prompts", "random_input_len", "random_output_len",
                    "random_range_ratio", "median_ttft_ms", "median_tpot_ms", "median_e2el_ms",
                    "total_token_throughput", "per_gpu"])
        w.writerow(["llama-3.1-8b", "h100", 1, c, 40, n_in, n_out, 0.2, got["median_ttft_ms"], got["median_tpot_ms"],
                    got["median_e2el_ms"], got["total_token_throughput_per_gpu"], "true"])
    return [str(path)]


def _write_guidellm(tmp_path, i, c, n_in, n_out):
    """guidellm's benchmarks JSON of dynlab's own run: a concurrent strategy, fixed synthetic lengths."""
    point, got = _figures(c, n_in, n_out, ratio=0.0)
    dist = lambda v: {"successful": {"median": v, "mean": v}}  # noqa: E731
    bench = {"config": {"strategy": {"type_": "concurrent", "streams": c},
                        "requests": {"data": f"prompt_tokens={n_in},output_tokens={n_out}"},
                        "backend": {"model": "llama-3.1-8b"}},
             "request_totals": {"total": 40}, "duration": 1.0,
             "metrics": {"time_to_first_token_ms": dist(got["median_ttft_ms"]),
                         "time_per_output_token_ms": dist(got["median_tpot_ms"]),
                         "request_latency": dist(got["median_e2el_ms"] / 1000.0),
                         "tokens_per_second": dist(got["total_token_throughput_per_gpu"])}}
    path = tmp_path / f"guidellm_{i}.json"
    path.write_text(json.dumps({"benchmarks": [bench]}))
    return [str(path)]


WRITERS = {"vllm-bench": _write_vllm, "aiperf": _write_aiperf, "points": _write_points, "guidellm": _write_guidellm}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_calibrate_recovers_known_coefficients_from_files_dynlab_wrote(tmp_path, fmt):
    files = [path for i, design in enumerate(DESIGN) for path in WRITERS[fmt](tmp_path, i, *design)]
    out = tmp_path / "profile.json"
    args = ["calibrate", *files, "--model", "llama-3.1-8b", "--gpu", "h100", "--out", str(out),
            "--output-format", "json", "--folds", "2"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    profile = json.loads(out.read_text())
    assert list(profile) == list(PROFILE_KEYS)
    assert json.loads(r.stdout) == profile
    for name, value in profile["latency_opts"].items():
        assert value == pytest.approx(TRUTH[name], rel=0.02), (name, profile["latency_opts"])
    assert profile["request_overhead_ms"] == pytest.approx(TRUTH_FRONT_MS, rel=0.02)
    for row in profile["points"]:
        assert all(abs(e) < 1.0 for e in row["error_pct"]["after"].values()), row


def test_cross_validation_holds_out_each_point_once_and_reports_medians():
    rows = [{"error_pct": {"median_ttft_ms": e}} for e in (-3.0, 10.0, 1.0, 50.0, -2.0)]
    assert cv_errors(rows) == {"median_ttft_ms": 3.0}
    rows[3]["error_pct"]["median_ttft_ms"] = 5000.0  # one outlier does not move the median
    assert cv_errors(rows) == {"median_ttft_ms": 3.0}


def test_cross_validate_alone_gives_calibrates_held_out_rows():
    # three points, 3 folds (leave one out: point i held out by the fit on the other two), one least_squares
    # evaluation per start: cross_validate's rows are calibrate's cv_points, fit for fit, without its fit on all
    points = [replace(_point(c, 200, 20), median_ttft_ms=50.0 * c, median_tpot_ms=8.0 + c) for c in (1, 2, 4)]
    configs = [replace(TRUE_CONFIG, latency_opts={})] * 3
    whole = calibrate(points, configs, folds=3, max_nfev=1)
    alone = cross_validate(points, configs, folds=3, max_nfev=1)
    assert whole.folds == 3 and [r["source"] for r in alone] == ["c1", "c2", "c4"]
    assert alone == whole.cv_points
    with pytest.raises(CalibrationError, match="needs 3 points and 2 folds"):
        cross_validate(points[:2], configs[:2], folds=2, max_nfev=1)


def test_lengths_follow_the_file_or_redraw_vllms_random_dataset():
    p = _point(4, 1000, 100, ratio=0.5)
    pairs = lengths(p)
    assert len(pairs) == 40 and all(500 <= a <= 1500 and 50 <= b <= 150 for a, b in pairs)
    assert lengths(p) == pairs  # seeded
    q = replace(p, input_lens=(7, 8), output_lens=(2, 3))
    assert lengths(q) == [(7, 2), (8, 3)]


def test_a_closed_loop_replay_at_double_coefficients_doubles_its_times():
    p = _point(8, 1000, 100)  # the front end doubled too: in closed loop it is each user's pause as well
    # the model's coefficients and the front end alone: every other overhead term off (the rule is theirs)
    config = replace(TRUE_CONFIG, **{**terms_off("linear", TRUE_CONFIG.latency_opts),
                                     "request_overhead_ms": TRUTH_FRONT_MS})
    base, double = replay(p, config), replay(p, replace(config, latency_opts={
        **config.latency_opts, **{k: repr(2 * v) for k, v in TRUTH.items()}}, request_overhead_ms=2 * TRUTH_FRONT_MS))
    for m in ("median_ttft_ms", "median_tpot_ms", "median_e2el_ms"):
        assert double[m] == pytest.approx(2 * base[m], rel=1e-9)
    assert double["total_token_throughput_per_gpu"] == pytest.approx(base["total_token_throughput_per_gpu"] / 2)


@pytest.mark.parametrize("args, message", [
    (["--fit", "nope"], "--fit nope: not a number option of latency model linear"),
    (["--concurrency", "4"], "--concurrency has no effect"),
    (["--latency-model", "roofline", "--fit", "beta0"], "--fit beta0: not a number option of latency model roofline"),
])
def test_bad_options_are_one_line(tmp_path, args, message):
    files = _write_points(tmp_path, 0, *DESIGN[0])
    r = CliRunner().invoke(main, ["calibrate", *files, "--model", "llama-3.1-8b", "--gpu", "h100", *args])
    assert r.exit_code != 0
    assert message in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_a_file_without_points_is_refused_by_name(tmp_path):
    files = _write_points(tmp_path, 0, *DESIGN[0])
    empty = tmp_path / "empty.csv"
    empty.write_text("model,gpu,max_concurrency,median_ttft_ms\n")
    r = CliRunner().invoke(main, ["calibrate", *files, str(empty), "--model", "llama-3.1-8b", "--gpu", "h100"])
    assert r.exit_code == 2 and r.output.strip() == f"Error: {empty}: no measured point in the file"


def test_a_point_without_a_known_model_asks_for_model(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("model,gpu,max_concurrency,random_input_len,random_output_len,median_ttft_ms\n"
                    "meta-llama/Llama-3.2-3B-Instruct,h100,4,100,10,20\n")
    r = CliRunner().invoke(main, ["calibrate", str(path)])
    assert r.exit_code == 2 and "is not one dynlab bundles: give --model" in r.output


def test_a_failed_calibration_leaves_the_profile_as_it_was(tmp_path):
    out = tmp_path / "profile.json"
    out.write_text("old")
    path = tmp_path / "p.csv"
    path.write_text("model,gpu,random_input_len,random_output_len,median_ttft_ms\nllama-3.1-8b,h100,100,10,20\n")
    r = CliRunner().invoke(main, ["calibrate", str(path), "--out", str(out)])
    assert r.exit_code == 1 and "neither max_concurrency nor a finite request_rate" in r.output
    assert out.read_text() == "old"


def test_read_profile_refuses_what_is_not_a_profile(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"dynlab_calibration": 1, "model": "m", "gpu": "h100", "tp": 1, "latency_model": "linear",'
                    ' "latency_opts": {"beta0": -1}, "cv_error_pct": {}}')
    with pytest.raises(InputError, match="'beta0' must be a finite number >= 0"):
        read_profile(str(path))
    path.write_text('{"a": 1}')
    with pytest.raises(InputError, match="not a dynlab calibration profile"):
        read_profile(str(path))
    # a fresh user's cases: an engine that is not a string crashed later (other_engines split it), tp 0 was
    # taken, and every error said line 1; a pretty-printed profile names the key's own line
    good = {"dynlab_calibration": 1, "model": "m", "gpu": "h100", "tp": 1, "engine": "vllm",
            "latency_model": "linear", "latency_opts": {"beta0": 1.0}, "cv_error_pct": {}}
    for key, value, why in (("engine", 5, "'engine' must be a non-empty string or null, got 5"),
                            ("engine", ["vllm"], "'engine' must be a non-empty string or null"),
                            ("tp", 0, "'tp' must be at least 1, got 0"),
                            ("latency_opts", {"beta0": "x"}, "'beta0' must be a finite number >= 0")):
        path.write_text(json.dumps({**good, key: value}, indent=1))
        line = 1 + next(i for i, text in enumerate(path.read_text().splitlines()) if '"beta0"' in text or
                        f'"{key}"' in text and key != "latency_opts")
        with pytest.raises(InputError, match=f"x.json:{line}: {why}"):
            read_profile(str(path))
    path.write_text(json.dumps({**good, "engine": None}))
    assert read_profile(str(path))["engine"] is None


def test_a_constant_rate_client_is_replayed_evenly_spaced():
    # one short request every 2 s: each is served alone, so every TTFT is the same; Poisson bunches some
    p = MeasuredPoint(source="r", request_rate=0.5, num_prompts=30, input_lens=(200,) * 30, output_lens=(20,) * 30)
    constant = simulate(replace(p, arrival="constant"), TRUE_CONFIG)
    ttfts = {round(r[2], 9) for r in constant.rows}
    # the engine's span leaves out what the client adds to the last E2E: the front end and 20 tokens' detokenisation
    client_ms = TRUTH_FRONT_MS + 20 * TRUE_CONFIG.detok_us_per_token / 1000.0
    assert len(ttfts) == 1 and constant.span_ms == pytest.approx(29 * 2000.0 + constant.rows[-1][3] - client_ms)
    poisson = simulate(p, TRUE_CONFIG)
    assert poisson.span_ms != constant.span_ms


def test_vllm_bench_defaults_send_every_request_at_once():
    p = MeasuredPoint(source="r", request_rate=float("inf"), input_lens=(100,) * 5, output_lens=(10,) * 5)
    run = simulate(p, replace(TRUE_CONFIG, request_overhead_ms=0.0, detok_us_per_token=0.0))  # E2E: the engine's
    assert [r[3] for r in run.rows] == sorted(r[3] for r in run.rows)  # one batch: all arrive together
    assert run.span_ms == pytest.approx(max(r[3] for r in run.rows))  # from time 0


@pytest.mark.parametrize("name", ["nosuch", "LINEAR"])
def test_an_unknown_latency_model_is_refused_by_calibrate_as_by_sim(tmp_path, name):
    # calibrate said "latency model nosuch has no default options to fit: name them with --fit", a dead end; it now
    # refuses the name where it is parsed, listing the registered models, in sim's words
    files = _write_points(tmp_path, 0, *DESIGN[0])
    lines = []
    for args in (["calibrate", *files, "--fit", "beta0"], ["sim", "--timing"]):
        r = CliRunner().invoke(main, [*args, "--latency-model", name])
        assert r.exit_code == 2 and r.stdout == "", r.output
        (line,) = r.stderr.splitlines()
        lines.append(line)
    assert lines[0] == lines[1]
    assert lines[0].startswith(f"Error: Invalid value for '--latency-model': unknown latency model {name!r}; "
                               "available: roofline, linear, ")
