"""``dynlab calibrate --tp``: given, it replaces the files' tp, as --model and --gpu replace theirs."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dynlab.calibrate.files import point_configs
from dynlab.calibrate.formats import MeasuredPoint
from dynlab.cli import main
from dynlab.engine.config import SimConfig

pytest.importorskip("scipy")


@pytest.mark.parametrize("stated, given, replayed", [(2, 4, 4), (2, None, 2), (None, 4, 4), (None, None, 1)])
def test_a_given_tp_replaces_the_files(stated, given, replayed):
    point = MeasuredPoint(source="f", model="llama-3.1-8b", gpu="h100", tp=stated, max_concurrency=1)
    (config,) = point_configs([point], SimConfig(timing=True), tp=given)
    assert config.tp == replayed


def _points(tmp_path):
    """One point stated on tp 2, its throughput for the whole server (800 tokens/s)."""
    path = tmp_path / "p.csv"
    path.write_text("model,gpu,tp,max_concurrency,num_prompts,random_input_len,random_output_len,median_ttft_ms,"
                    "median_tpot_ms,total_token_throughput\nllama-3.1-8b,h100,2,2,8,200,20,30,6,800\n")
    return str(path)


@pytest.mark.parametrize("args, tp, per_gpu", [([], 2, 400.0), (["--tp", "4"], 4, 200.0)])
def test_calibrate_profiles_the_given_tp_and_measures_per_gpu_on_it(tmp_path, args, tp, per_gpu):
    r = CliRunner().invoke(main, ["calibrate", _points(tmp_path), "--fit", "beta0", "--output-format", "json",
                                  *args])
    assert r.exit_code == 0, r.output
    profile = json.loads(r.stdout)
    assert profile["tp"] == tp
    assert profile["points"][0]["measured"]["total_token_throughput_per_gpu"] == per_gpu
