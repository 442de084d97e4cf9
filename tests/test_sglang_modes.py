"""``--engine sglang`` with the closed loop (``--concurrency``) and calibration profiles (issue 40 item 3): a
closed-loop SGLang run, sim's and plan's, derived by hand; a profile names its engine, and one calibrated on
another engine is used with a warning (its error band is not claimed), never refused.

The step model is tests/test_plan.py's linear one (1 ms per step + 0.01 ms per prefill token, overheads off) with
SGLang's chunk at 500 tokens: a 1,000-token prompt takes two passes of 6 ms, 12 ms in all.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import dynlab
from dynlab.latency.profile import other_engines
from dynlab.cli import main
from dynlab.engine.config import SimConfig

from helpers import terms_off, terms_off_args
from test_plan import LINEAR, _json, _trace

HAND = {"latency_model": "linear", "chunked_prefill_size": 500,
        **terms_off("linear", {"beta0": "1", "beta1": "0.01", "beta2": "0"})}


@pytest.fixture
def four(tmp_path):
    """4 requests of 1,000 prompt tokens and 1 output token, blocks of their own."""
    return _trace(tmp_path / "four.jsonl", [(0, 1000, 1)] * 4)


@pytest.mark.parametrize("users, ttfts_ms", [
    (1, [12.0] * 4),  # one user: each request starts when the one before it ends, alone on the worker: 12 ms each
    (4, [12.0, 24.0, 36.0, 48.0]),  # four users at t = 0: queued one behind another, 12 ms apart
])
def test_closed_loop_on_sglang_by_hand(four, users, ttfts_ms):
    out = dynlab.run(SimConfig(trace=four, timing=True, workers=1, engine_kind="sglang", concurrency=users,
                               think_time_ms=0, **HAND))
    assert out["concurrency"] == users and out["requests"] == 4
    # p99 of 4 values: the third plus 0.97 of the step to the fourth (inclusive quantiles), to 0.1 ms
    p99 = ttfts_ms[2] + 0.97 * (ttfts_ms[3] - ttfts_ms[2])
    assert out["ttft_ms"]["mean"] == sum(ttfts_ms) / 4 and out["ttft_ms"]["p99"] == round(p99, 1)


def test_plan_closed_loop_compares_engines(tmp_path):
    # 12 users and 12 requests: every user's first request at t = 0, as tests/test_plan_engines.py's open trace,
    # so the answers are the same: vLLM 11 ms per prompt needs 3 workers (p99 44 ms <= 45), SGLang 12 ms needs 4
    # (48 ms at 3 misses; 36 ms at 4)
    trace = _trace(tmp_path / "q.jsonl", [(0, 1000, 1)] * 12)
    plan = _json("--trace", trace, "--slo-ttft-ms", 45, *LINEAR, "--chunked-prefill-size", 500,
                 "--engine", "vllm,sglang", "--concurrency", 12, "--think-time-ms", 0)
    assert "closed loop: 12 users" in plan["arrivals"]
    assert {s["shape"]: s["workers"] for s in plan["shapes"]} == {"h100x1 rr vllm": 3, "h100x1 rr sglang": 4}


# --------------------------------------------------------------------------- profiles name their engine
PROFILE = {"dynlab_calibration": 1, "model": "llama-3.1-8b", "gpu": "h100", "tp": 1, "engine": "vllm", "version": None,
           "latency_model": "linear", "latency_opts": {"beta0": 1.0, "beta1": 0.01, "beta2": 0.0},
           "fitted": ["beta0", "beta1", "beta2"], "folds": 3,
           "cv_error_pct": {"median_ttft_ms": 11.0, "p99_ttft_ms": 23.5}, "points": []}


def _sim_with(tmp_path, four, engine_stated, *args):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**PROFILE, "engine": engine_stated}))
    r = CliRunner().invoke(main, ["sim", "--timing", "--quiet", "--trace", four, "--latency-profile", str(path),
                                  "--workers", "1", *terms_off_args("linear"), *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), r.stderr


def test_a_vllm_profile_on_sglang_warns_and_claims_no_band(tmp_path, four):
    out, err = _sim_with(tmp_path, four, "vllm", "--engine", "sglang", "--chunked-prefill-size", "500")
    # the profile's step times are used: 4 prompts at t = 0 on one SGLang worker, 12 ms apart (mean 30 ms)
    assert out["ttft_ms"]["mean"] == 30.0
    assert out["error_band_pct"] == {}
    assert out["latency_domain"].endswith("was calibrated with vllm, not sglang: its error is unmeasured here")
    assert "Warning:" in err and "calibrated with vllm, not sglang" in err


@pytest.mark.parametrize("stated, engine", [("sglang", "sglang"), ("SGLang", "sglang"), ("vllm", "vllm"),
                                            (None, "sglang"), ("sglang,vllm", "vllm")])
def test_a_profile_of_the_runs_engine_keeps_its_band(tmp_path, four, stated, engine):
    # the engine it states is the run's (in any case, or among several), or it states none: the band is claimed
    out, err = _sim_with(tmp_path, four, stated, "--engine", engine)
    assert out["error_band_pct"] == {"ttft_ms.p50": 11.0, "ttft_ms.p99": 23.5}
    assert "latency_domain" not in out and "Warning" not in err


def test_other_engines():
    assert (other_engines("vllm", "sglang"), other_engines("vLLM", "vllm"), other_engines(None, "sglang"),
            other_engines("", "vllm"), other_engines("sglang, trt", "vllm")) == ("vllm", "", "", "", "sglang, trt")


def test_plan_with_a_vllm_profile_on_sglang_shapes_warns_for_those_only(tmp_path):
    trace = _trace(tmp_path / "q.jsonl", [(0, 1000, 1)] * 12)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROFILE))
    i = LINEAR.index("--latency-model")  # the profile gives the model and its options
    r = CliRunner().invoke(main, ["plan", "--trace", trace, "--slo-ttft-ms", "45", *map(str, LINEAR[i + 8:]),
                                  "--latency-profile", str(path),
                                  "--engine", "vllm,sglang", "--chunked-prefill-size", "500"])
    assert r.exit_code == 0, r.output
    shapes = {s["shape"]: s for s in json.loads(r.stdout)["shapes"]}
    assert shapes["h100x1 rr sglang"]["extrapolated"] and not shapes["h100x1 rr vllm"]["extrapolated"]
    assert "Warning: h100x1 rr sglang:" in r.stderr and "Warning: h100x1 rr vllm" not in r.stderr
    assert {k: s["workers"] for k, s in shapes.items()} == {"h100x1 rr vllm": 3, "h100x1 rr sglang": 4}
