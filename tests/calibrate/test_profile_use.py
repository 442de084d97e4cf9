"""--latency-profile on sim and plan: the profile's model and options, its error bands, and where it does not apply."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dynlab.cli import main

TRACE = "".join(json.dumps({"timestamp": 40 * i, "input_length": 600, "output_length": 20, "hash_ids": [i, i + 100]})
                + "\n" for i in range(6))
PROFILE = {"dynlab_calibration": 1, "model": "llama-3.1-8b", "gpu": "h100", "tp": 1, "engine": "vllm", "version": None,
           "latency_model": "linear", "latency_opts": {"beta0": 20.0, "beta1": 0.1, "beta2": 1.0},
           "fitted": ["beta0", "beta1", "beta2"], "folds": 3,
           "cv_error_pct": {"median_ttft_ms": 11.0, "p99_ttft_ms": 23.5, "median_tpot_ms": 4.0}, "points": []}


def _files(tmp_path):
    (tmp_path / "t.jsonl").write_text(TRACE)
    (tmp_path / "p.json").write_text(json.dumps(PROFILE))
    return str(tmp_path / "t.jsonl"), str(tmp_path / "p.json")


def _sim(*args):
    return CliRunner().invoke(main, ["sim", "--timing", "--quiet", *args])


def test_a_profile_runs_its_model_and_says_its_error_bands(tmp_path):
    trace, profile = _files(tmp_path)
    r = _sim("--trace", trace, "--latency-profile", profile)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    # the profile states no front end: its fit used none (profiles before 2026-12-06), so neither does the run
    by_hand = json.loads(_sim("--trace", trace, "--latency-model", "linear", "--latency-opt", "beta0=20",
                              "--latency-opt", "beta1=0.1", "--latency-opt", "beta2=1",
                              "--request-overhead-ms", "0").stdout)
    assert out["latency_model"] == "linear" and out["ttft_ms"] == by_hand["ttft_ms"]
    assert out["latency_profile"] == profile
    assert out["error_band_pct"] == {"ttft_ms.p50": 11.0, "ttft_ms.p99": 23.5, "tpot_ms.p50": 4.0}
    assert "latency_domain" not in out


def _ttft(*args):
    r = _sim(*args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["ttft_ms"]


@pytest.mark.parametrize("fitted", [False, True])
def test_a_profile_runs_with_the_front_end_its_fit_used(tmp_path, fitted):
    # the profile's front end (fitted or the one its fit was run with) unless the run gives another; a given
    # one is refused when the profile fitted it (the fitted coefficients are only right with the fitted front end)
    trace, _ = _files(tmp_path)
    profile = tmp_path / "front.json"
    names = PROFILE["fitted"] + (["request_overhead_ms"] if fitted else [])
    profile.write_text(json.dumps({**PROFILE, "request_overhead_ms": 30.0, "fitted": names}))
    model = ["--latency-model", "linear", "--latency-opt", "beta0=20", "--latency-opt", "beta1=0.1",
             "--latency-opt", "beta2=1"]
    assert _ttft("--trace", trace, "--latency-profile", str(profile)) == \
        _ttft("--trace", trace, *model, "--request-overhead-ms", "30")
    r = _sim("--trace", trace, "--latency-profile", str(profile), "--request-overhead-ms", "5")
    if fitted:
        assert r.exit_code != 0 and "--request-overhead-ms: --latency-profile" in r.output and "fits it" in r.output
        assert "Traceback" not in r.output
    else:
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["ttft_ms"] == _ttft("--trace", trace, *model, "--request-overhead-ms", "5")


def test_a_profile_without_cross_validation_says_its_figures_have_no_band(tmp_path):
    trace, _ = _files(tmp_path)
    profile = tmp_path / "two_points.json"
    profile.write_text(json.dumps({**PROFILE, "folds": 0, "cv_error_pct": {}}))  # calibrate on 2 points writes this
    r = _sim("--trace", trace, "--latency-profile", str(profile))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["error_band_pct"] == {}
    assert "has no cross-validated error (it was fitted on fewer than 3 points)" in out["latency_domain"]
    assert "its figures carry no error band" in r.stderr


def test_a_profile_on_another_gpu_has_no_band_and_says_so(tmp_path):
    trace, profile = _files(tmp_path)
    r = _sim("--trace", trace, "--latency-profile", profile, "--gpu", "h200")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["error_band_pct"] == {}
    assert "calibrated on llama-3.1-8b, 1 x h100, not on llama-3.1-8b, 1 x h200" in out["latency_domain"]
    assert "its error is unmeasured here" in r.stderr


def test_a_fitted_option_given_again_is_refused(tmp_path):
    trace, profile = _files(tmp_path)
    r = _sim("--trace", trace, "--latency-profile", profile, "--latency-opt", "beta2=3")
    assert r.exit_code != 0 and "--latency-opt beta2: --latency-profile" in r.output
    assert "Traceback" not in r.output


def test_a_bad_profile_is_one_line(tmp_path):
    trace, _ = _files(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{"dynlab_calibration": 1, "model": "m", "gpu": "h100", "tp": 1, "latency_model": "linear", '
                   '"latency_opts": {"beta0": "x"}, "cv_error_pct": {}}')
    r = _sim("--trace", trace, "--latency-profile", str(bad))
    assert r.exit_code == 1 and r.stderr.strip() == f"Error: {bad}:1: 'beta0' must be a finite number >= 0, got 'x'"


def _plan(trace, *args):
    return CliRunner().invoke(main, ["plan", "--trace", trace, "--slo-ttft-ms", "5000", "--executor", "serial",
                                     "--quiet", "--format", "table", *args])


def test_plan_prints_each_figure_with_its_band(tmp_path):
    trace, profile = _files(tmp_path)
    r = _plan(trace, "--latency-profile", profile, "--slo-percentile", "p99")
    assert r.exit_code == 0, r.output
    row = next(line for line in r.stdout.splitlines() if "h100x1" in line and "(±" in line)
    assert "(±23.5%)" in row  # TTFT p99's band; TPOT p99 has none in this profile
    assert "cross-validated median error" in r.stdout


def test_plan_warns_once_per_shape_outside_the_default_models_domain(tmp_path):
    trace, _ = _files(tmp_path)
    r = _plan(trace, "--gpu", "h100,b200")
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.stderr.splitlines() if line.startswith("Warning:")]
    assert warnings == [next(w for w in warnings if w.startswith("Warning: b200x1 kv-cost: "))]
    assert "GPU b200" in warnings[0]


def test_plan_refuses_a_missing_profile_before_any_replay(tmp_path):
    trace, _ = _files(tmp_path)
    r = _plan(trace, "--latency-profile", str(tmp_path / "nope.json"))
    assert r.exit_code == 2 and "cannot read the calibration profile" in r.output and "replay" not in r.output


def test_a_profile_matches_its_model_by_path_however_spelled(tmp_path, monkeypatch):
    import shutil

    from dynlab.models.config import _models_dir

    model = tmp_path / "m" / "config.json"
    model.parent.mkdir()
    shutil.copy(str(_models_dir().joinpath("llama-3.1-8b.json")), model)
    trace, _ = _files(tmp_path)
    profile = tmp_path / "pm.json"
    profile.write_text(json.dumps({**PROFILE, "model": str(model)}))
    monkeypatch.chdir(tmp_path)
    r = _sim("--trace", trace, "--latency-profile", str(profile), "--model", "m/config.json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["error_band_pct"] and "latency_domain" not in json.loads(r.stdout)


def test_plan_floors_use_the_profiles_step_times_and_front_end(tmp_path):
    # the profile's 600-token prefill alone: beta0 + 600 beta1 = 80 ms, plus its 100 ms front end = 180 ms,
    # above a 150 ms TTFT target at any worker count: compute-bound, said without a search to the cap
    trace, _ = _files(tmp_path)
    front = tmp_path / "front.json"
    front.write_text(json.dumps({**PROFILE, "request_overhead_ms": 100.0}))
    r = CliRunner().invoke(main, ["plan", "--trace", trace, "--slo-ttft-ms", "150", "--executor", "serial", "--quiet",
                                  "--format", "json", "--latency-profile", str(front)])
    assert r.exit_code == 3, r.output
    (shape,) = json.loads(r.stdout)["shapes"]
    assert shape["binding"] == "compute" and shape["never_share"] == 1.0
    assert "prefill takes up to 180 ms" in shape["why"]
    assert len(shape["replays"]) == 1


def test_sweep_reads_the_profile_before_any_cell_runs(tmp_path):
    """A missing or bad --latency-profile is the sweep's one-line error before any cell runs or --out is made,
    not a random cell's failure in the middle of the run (a new user found that)."""
    trace, _ = _files(tmp_path)
    out = tmp_path / "new.jsonl"
    args = ["sweep", "--trace", trace, "--timing", "--workers", "1", "--grid", "concurrency=1,2", "--requests", "4",
            "--out", str(out)]
    r = CliRunner().invoke(main, [*args, "--latency-profile", str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and "missing.json: cannot read the calibration profile" in r.output
    assert "cell" not in r.output and "Traceback" not in r.output and not out.exists()
    bad = tmp_path / "bad.json"
    bad.write_text('{"dynlab_calibration": 2}')
    r = CliRunner().invoke(main, [*args, "--latency-profile", str(bad)])
    assert r.exit_code == 1 and "bad.json:1: not a dynlab calibration profile" in r.output and not out.exists()


@pytest.mark.parametrize("key, bad, why", [
    ("engine", "", "'engine' must be a non-empty string or null, got ''"),
    ("version", "", "'version' must be a non-empty string or null, got ''"),
    ("fitted", "beta0", "'fitted' must be a list of option names, got 'beta0'"),
    ("fitted", ["beta0", 1], "'fitted' must be a list of option names, got ['beta0', 1]"),
    ("folds", "3", "'folds' must be an integer >= 0, got '3'"),
    ("folds", -1, "'folds' must be an integer >= 0, got -1"),
    ("folds", True, "'folds' must be an integer >= 0, got True"),
    ("folds", 2.5, "'folds' must be an integer >= 0, got 2.5"),
    ("points", {}, "'points' must be a list of objects, got {}"),
    ("points", [[]], "'points' must be a list of objects, got [[]]"),
])
def test_a_profile_key_of_the_wrong_type_is_refused_at_its_line(tmp_path, key, bad, why):
    from dynlab.errors import InputError
    from dynlab.latency.profile import read_profile

    path = tmp_path / "bad.json"
    text = json.dumps({**PROFILE, key: bad}, indent=2)
    path.write_text(text)
    line = next(n for n, t in enumerate(text.splitlines(), 1) if t.startswith(f'  "{key}":'))
    assert line > 1
    with pytest.raises(InputError) as err:
        read_profile(str(path))
    assert str(err.value) == f"{path}:{line}: {why}"
    trace, _ = _files(tmp_path)
    r = _sim("--trace", trace, "--latency-profile", str(path))
    assert r.exit_code == 1 and r.stderr == f"Error: {path}:{line}: {why}\n"


def test_a_profile_may_leave_out_fitted_folds_and_points(tmp_path):
    from dynlab.latency.profile import read_profile

    path = tmp_path / "p.json"
    path.write_text(json.dumps({k: v for k, v in PROFILE.items() if k not in ("fitted", "folds", "points")}))
    assert read_profile(str(path))["latency_opts"] == PROFILE["latency_opts"]


@pytest.mark.parametrize("key, bad, at, why", [
    ("tp", "x", "tp", "'tp' must be an integer, got 'x'"),
    ("model", 3, "model", "'model' must be a string, got 3"),
    ("latency_opts", [], "latency_opts", "'latency_opts' must be an object, got []"),
    ("latency_model", "nosuch", "latency_model",
     "unknown latency model 'nosuch' (available: roofline, linear, blis, aiconfigurator)"),
    ("latency_opts", {"beta0": 20.0, "nosuch": 1.0}, "nosuch",
     "latency model 'linear' has no option 'nosuch' (its options: beta0, beta1, beta2, spec_gamma, cpu_step_us, "
     "cpu_us_per_request)"),
    ("zzz", 1, "zzz", "unknown key 'zzz' (a profile has " + ", ".join(
        ["dynlab_calibration", "model", "gpu", "tp", "engine", "version", "latency_model", "latency_opts",
         "request_overhead_ms", "fitted", "on_bound", "folds", "cv_error_pct", "points"]) + ")"),
])
def test_a_bad_profile_key_names_the_file_and_the_keys_line(tmp_path, key, bad, at, why):
    """Every refusal of a profile's content is exit 1 at FILE:LINE of the key at fault (not exit 2, not line 1)."""
    path = tmp_path / "bad.json"
    text = json.dumps({**PROFILE, key: bad}, indent=2)
    path.write_text(text)
    line = next(n for n, t in enumerate(text.splitlines(), 1) if t.strip().startswith(f'"{at}":'))
    assert line > 1
    trace, _ = _files(tmp_path)
    for r in (_sim("--trace", trace, "--latency-profile", str(path)), _plan(trace, "--latency-profile", str(path))):
        assert (r.exit_code, r.stderr) == (1, f"Error: {path}:{line}: {why}\n")


def test_a_roofline_profile_option_out_of_its_range_names_its_line(tmp_path):
    path = tmp_path / "bad.json"
    text = json.dumps({**PROFILE, "latency_model": "roofline", "latency_opts": {"mbu": 0.5, "mfu": 5}}, indent=2)
    path.write_text(text)
    line = next(n for n, t in enumerate(text.splitlines(), 1) if t.strip().startswith('"mfu":'))
    trace, _ = _files(tmp_path)
    r = _sim("--trace", trace, "--latency-profile", str(path))
    assert (r.exit_code, r.stderr) == (1, f"Error: {path}:{line}: option 'mfu' must be <= 1.0, got '5'\n")
