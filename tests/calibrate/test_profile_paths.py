"""A calibration profile stores a model given as a path (and a GPU file) as an absolute path, so a run with
``--latency-profile`` from another directory compares the file the profile was fitted on; a catalogue name stays
a name."""
from __future__ import annotations

import csv
import json
import os
import shutil
from dataclasses import asdict, replace

from click.testing import CliRunner

from dynlab.calibrate.files import calibrate_files
from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.latency.profile import apply_profile, stored_path
from dynlab.models.gpus import gpu_spec

BUNDLED = os.path.join(os.path.dirname(__import__("dynlab").__file__), "data", "models", "llama-3.1-8b.json")
COLUMNS = ["gpu", "max_concurrency", "num_prompts", "random_input_len", "random_output_len", "median_ttft_ms",
           "median_tpot_ms"]


def _setup(root):
    """``root/a``: a points CSV of 3 runs, a model config.json and a GPU file, as a user keeps them."""
    a = root / "a"
    (a / "models" / "x").mkdir(parents=True)
    shutil.copy(BUNDLED, a / "models" / "x" / "config.json")
    gpu = {k: v for k, v in asdict(gpu_spec("h100")).items() if k != "name"}
    (a / "gpus").mkdir()
    (a / "gpus" / "mine.json").write_text(json.dumps(gpu))
    with (a / "points.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for c, ttft, tpot in ((1, 20, 5), (2, 22, 6), (4, 26, 8)):
            w.writerow(["h100", c, 8, 64, 8, ttft, tpot])
    return a


def _profile(root, monkeypatch, model="models/x/config.json", gpu="gpus/mine.json"):
    """The profile calibrated in ``root/a`` on ``model`` and ``gpu`` as typed there, written to ``root/a/p.json``."""
    a = _setup(root)
    monkeypatch.chdir(a)
    profile, _ = calibrate_files(["points.csv"], model=model, gpu=gpu, fit=["beta0"], folds=3, max_nfev=1)
    (a / "p.json").write_text(json.dumps(profile))
    return a, profile


def test_a_path_is_stored_absolute_and_a_catalogue_name_as_it_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    assert stored_path("llama-3.1-8b") == "llama-3.1-8b"
    assert stored_path("models/x/config.json") == str(tmp_path / "models" / "x" / "config.json")  # a path unread
    assert stored_path("config.json") == str(tmp_path / "config.json")
    assert stored_path("dir") == str(tmp_path / "dir")  # an existing directory (a Hugging Face download)
    assert stored_path("no-such-model") == "no-such-model"  # neither: left for the run to refuse as it is
    assert stored_path("/abs/config.json") == "/abs/config.json"
    assert stored_path("h100", gpu=True) == "h100" and stored_path("H100", gpu=True) == "H100"
    assert stored_path("gpus/mine.json", gpu=True) == str(tmp_path / "gpus" / "mine.json")


def test_the_profile_holds_the_absolute_paths(tmp_path, monkeypatch):
    a, profile = _profile(tmp_path, monkeypatch)
    assert profile["model"] == str(a / "models" / "x" / "config.json")
    assert profile["gpu"] == str(a / "gpus" / "mine.json")
    _, named = _profile(tmp_path / "named", monkeypatch, model="llama-3.1-8b", gpu="h100")
    assert (named["model"], named["gpu"]) == ("llama-3.1-8b", "h100")


def test_a_run_from_another_directory_gets_the_profiles_band(tmp_path, monkeypatch):
    a, profile = _profile(tmp_path, monkeypatch)
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    here = SimConfig(timing=True, model=str(a / "models" / "x" / "config.json"), gpu="../a/gpus/mine.json",
                     latency_profile=str(a / "p.json"))
    _, keys = apply_profile(here)
    assert "latency_domain" not in keys and keys["error_band_pct"], keys
    # the same relative spelling in this directory names another file: that is another model, said so
    (tmp_path / "b" / "models" / "x").mkdir(parents=True)
    shutil.copy(BUNDLED, tmp_path / "b" / "models" / "x" / "config.json")
    _, keys = apply_profile(replace(here, model="models/x/config.json"))
    assert keys["error_band_pct"] == {} and "not on models/x/config.json" in keys["latency_domain"], keys


def test_sim_from_another_directory_with_a_profile_of_a_path_model(tmp_path, monkeypatch):
    a, _ = _profile(tmp_path, monkeypatch, gpu="h100")
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    r = CliRunner().invoke(main, ["sim", "--timing", "--quiet", "--requests", "4", "--model",
                                  "../a/models/x/config.json", "--latency-profile", "../a/p.json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["error_band_pct"] and "latency_domain" not in out, out


def test_the_table_shows_the_path_as_typed_and_the_profile_holds_it_absolute(tmp_path, monkeypatch):
    a = _setup(tmp_path)
    monkeypatch.chdir(a)
    r = CliRunner().invoke(main, ["calibrate", "points.csv", "--model", "models/x/config.json", "--fit", "beta0",
                                  "--folds", "2", "--out", "p.json", "--output-format", "table"])
    assert r.exit_code == 0, r.output
    assert "fitted linear on models/x/config.json, 1 x h100: beta0=" in r.output
    assert json.loads((a / "p.json").read_text())["model"] == str(a / "models" / "x" / "config.json")
