"""A fit that ends with an option on its bound says so (Calibration.on_bound, one line of calibrate's table): the
model cannot explain the data with the option inside its range."""
from __future__ import annotations

from dataclasses import replace

import pytest

from dynlab.calibrate.fit import calibrate
from dynlab.calibrate.formats import MeasuredPoint
from dynlab.calibrate.replay import replay
from dynlab.cli.calibrate import _table
from dynlab.engine.config import SimConfig

pytest.importorskip("scipy")

CONFIG = SimConfig(timing=True, latency_model="roofline", model="llama-3.1-8b", gpu="h100",
                   latency_opts={"mbu": "0.8", "overhead_ms": "0.1"})
POINT = MeasuredPoint(source="c4", max_concurrency=4, num_prompts=8, random_input_len=2000, random_output_len=20)


def _measured_at(mfu: float) -> MeasuredPoint:
    got = replay(POINT, replace(CONFIG, latency_opts={**CONFIG.latency_opts, "mfu": repr(mfu)}))
    return replace(POINT, median_ttft_ms=got["median_ttft_ms"], median_e2el_ms=got["median_e2el_ms"])


def test_a_fit_inside_its_range_is_on_no_bound():
    cal = calibrate([_measured_at(0.3)], [CONFIG], fit=["mfu"], max_nfev=20)
    assert cal.opts["mfu"] == pytest.approx(0.3, rel=0.05)
    assert cal.on_bound == {}


def test_a_fit_faster_than_the_gpu_can_ends_on_mfus_upper_bound_and_the_table_says_so():
    point = _measured_at(0.9)
    point = replace(point, median_ttft_ms=point.median_ttft_ms / 50)  # 50 times faster than mfu 0.9 prefills
    cal = calibrate([point], [CONFIG], fit=["mfu"], max_nfev=20)
    assert cal.on_bound == {"mfu": 1.0} and cal.opts["mfu"] == pytest.approx(1.0)
    profile = {"points": [], "folds": 0, "latency_model": "roofline", "latency_opts": {"mfu": 1.0},
               "request_overhead_ms": 10.0, "model": "llama-3.1-8b", "gpu": "h100", "tp": 1}
    lines = _table(profile, cal.on_bound).splitlines()
    assert lines[-1] == ("mfu ended on its bound 1: the model cannot explain these measurements with it inside its "
                         "range (a fit not to trust: measure more points, or fit fewer options)")
    assert _table(profile, {}).splitlines()[-1].startswith("no cross-validation")


def test_the_profile_keeps_the_bounds_so_json_output_and_later_runs_see_them(tmp_path):
    from dynlab.errors import InputError
    from dynlab.latency.profile import profile_json, read_profile

    point = _measured_at(0.9)
    point = replace(point, median_ttft_ms=point.median_ttft_ms / 50)
    cal = calibrate([point], [CONFIG], fit=["mfu"], max_nfev=20)
    profile = profile_json(cal, [point], [CONFIG])
    assert profile["on_bound"] == {"mfu": 1.0}
    inside = profile_json(calibrate([_measured_at(0.3)], [CONFIG], fit=["mfu"], max_nfev=20), [POINT], [CONFIG])
    assert inside["on_bound"] == {}
    path = tmp_path / "p.json"
    import json

    path.write_text(json.dumps(profile, indent=2))
    assert read_profile(str(path))["on_bound"] == {"mfu": 1.0}
    text = json.dumps(dict(profile, on_bound=["mfu"]), indent=2)
    path.write_text(text)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if '"on_bound"' in s)
    with pytest.raises(InputError, match=f"p.json:{line}: 'on_bound' must be an object of option -> bound"):
        read_profile(str(path))
