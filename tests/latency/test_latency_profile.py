"""``dynlab latency --latency-profile``: the profile applied and checked as sim applies and checks it."""
from __future__ import annotations

import json

import pytest
from helpers import invoke, ok

#: a profile fitted on DeepSeek-V3, 8 x H200 under SGLang, with its own front end (9.89 ms)
DEEPSEEK = {"dynlab_calibration": 1, "model": "deepseek-v3", "gpu": "h200", "tp": 8, "engine": "sglang",
            "version": None, "latency_model": "linear", "latency_opts": {"beta0": 20.0, "beta1": 0.1, "beta2": 1.0},
            "request_overhead_ms": 9.89, "fitted": ["beta0", "beta1", "beta2", "request_overhead_ms"], "folds": 3,
            "cv_error_pct": {"median_ttft_ms": 5.0}, "points": []}
#: the same fit stated for the command's defaults: llama-3.1-8b on 1 x h100 under vLLM
LLAMA = {**DEEPSEEK, "model": "llama-3.1-8b", "gpu": "h100", "tp": 1, "engine": "vllm"}


def _profile(tmp_path, data):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_profile_of_another_shape_warns_as_sim_does(tmp_path):
    path = _profile(tmp_path, DEEPSEEK)
    r = ok(invoke("latency", "--latency-profile", path))
    assert json.loads(r.stdout)["latency_models"].keys() == {"linear"}
    assert r.stderr.splitlines() == [
        f"Warning: latency model linear: --latency-profile {path} was calibrated on deepseek-v3, 8 x h200, not on "
        "llama-3.1-8b, 1 x h100 and with sglang, not vllm: its error is unmeasured here"]


def test_the_warning_is_the_one_sim_gives(tmp_path):
    from dynlab.engine.config import SimConfig
    from dynlab.latency.profile import apply_profile

    path = _profile(tmp_path, DEEPSEEK)
    _, keys = apply_profile(SimConfig(latency_profile=path, timing=True))
    r = ok(invoke("latency", "--latency-profile", path))
    assert r.stderr == f"Warning: latency model linear: {keys['latency_domain']}\n"


def test_a_profile_of_the_commands_shape_says_nothing(tmp_path):
    r = ok(invoke("latency", "--latency-profile", _profile(tmp_path, LLAMA)))
    assert r.stderr == ""
    r = ok(invoke("latency", "--latency-profile", _profile(tmp_path, DEEPSEEK), "--model", "deepseek-v3",
                  "--gpu", "h200", "--tp", "8", "--engine", "sglang"))
    assert "calibrated on" not in r.stderr


@pytest.mark.parametrize("name", ["roofline", "linear", "roofline,linear"])
def test_a_latency_model_beside_a_profile_is_refused_as_sim_does(tmp_path, name):
    r = invoke("latency", "--latency-profile", _profile(tmp_path, LLAMA), "--latency-model", name)
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == ("Error: --latency-model has no effect with --latency-profile "
                                                 "(the profile names its latency model)")


def test_the_footer_gives_the_profiles_front_end(tmp_path):
    path = _profile(tmp_path, LLAMA)
    out = json.loads(ok(invoke("latency", "--latency-profile", path)).stdout)
    assert out["client_terms"]["request_overhead_ms"] == 9.89 and out["latency_profile"] == path
    text = ok(invoke("latency", "--latency-profile", path, "--format", "table")).stdout
    assert text.splitlines()[-1].startswith(f"not in a step (a run's defaults): front end 9.89 ms per request "
                                            f"(--latency-profile {path}), detokenisation 45.9 us")
    plain = ok(invoke("latency", "--format", "table")).stdout.splitlines()[-1]
    assert "front end 15.56 ms per request (--request-overhead-ms)" in plain


def test_the_models_own_word_and_the_profiles_share_one_line_as_in_sim(tmp_path):
    roofline = {**LLAMA, "latency_model": "roofline", "latency_opts": {"mfu": 0.5},
                "fitted": ["mfu", "request_overhead_ms"]}
    path = _profile(tmp_path, roofline)
    r = ok(invoke("latency", "--latency-profile", path, "--gpu", "b200"))
    assert r.stderr.splitlines() == [
        "Warning: latency model roofline: outside its fit (dense full-attention bf16 models on h100/h200 at tp 1-2): "
        f"GPU b200 (see docs/latency.md); --latency-profile {path} was calibrated on llama-3.1-8b, 1 x h100, not on "
        "llama-3.1-8b, 1 x b200: its error is unmeasured here"]
