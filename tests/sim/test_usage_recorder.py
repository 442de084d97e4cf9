"""The report's per-worker KV usage and load over time (dynlab.sim.recorders.UsageRecorder) and its figure."""
from __future__ import annotations

import re
from types import SimpleNamespace

from click.testing import CliRunner
from hypothesis import given, strategies as st

from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.report import Run, build_report
from dynlab.report.html import IN_DOMAIN, config_rows
from dynlab.sim import run
from dynlab.sim.records import RequestRecorder
from dynlab.sim.recorders import FIRST_BIN_MS, MAX_BINS, UsageRecorder


def step(start, end, used, batch=1):
    return SimpleNamespace(start=start, end=end, used_blocks=used, batch_size=batch)


def engines(*caps):
    return [SimpleNamespace(capacity=c) for c in caps]


def test_a_hand_case_of_two_workers():
    rec = UsageRecorder()
    rec.on_arrival(None, 1000.0)  # the first arrival is the origin
    rec.on_step(0, step(1000.0, 1050.0, 10, 2))  # first half of bin 0: 10 blocks, 2 requests
    rec.on_step(0, step(1050.0, 1150.0, 20, 4))  # second half of bin 0 and first half of bin 1
    rec.on_step(1, step(1100.0, 1200.0, 5))  # bin 1 of worker 1
    rec.result(engines(100, 50))
    s = rec.series()
    assert s["bin_ms"] == FIRST_BIN_MS == 100.0 and s["origin_ms"] == 1000.0
    w0, w1 = s["workers"]
    # bin 0: (10 x 50 + 20 x 50) / (100 blocks x 100 ms) = 0.15; bin 1: 20 x 50 / 10,000 = 0.1
    assert w0 == {"worker": 0, "kv_usage": [0.15, 0.1], "load": [3.0, 2.0]}
    # worker 1: idle in bin 0; bin 1: 5 x 100 / (50 x 100) = 0.1
    assert w1 == {"worker": 1, "kv_usage": [0.0, 0.1], "load": [0.0, 1.0]}


def test_a_worker_that_never_stepped_has_a_zero_series():
    rec = UsageRecorder()
    rec.on_step(1, step(0.0, 100.0, 4))
    rec.result(engines(8, 8, 8))
    assert [w["kv_usage"] for w in rec.series()["workers"]] == [[0.0], [0.5], [0.0]]


@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1e6), st.floats(0, 5e4), st.integers(0, 1000)),
                max_size=60))
def test_bins_are_bounded_and_keep_every_block_ms(steps):
    rec = UsageRecorder()
    rec.on_arrival(None, 0.0)
    total = [0.0] * 4
    for worker, start, dur, used in steps:
        rec.on_step(worker, step(start, start + dur, used))
        total[worker] += used * dur
    rec.result(engines(1000, 1000, 1000, 1000))
    s = rec.series()
    assert len(s["workers"]) == 4
    for w in s["workers"]:
        assert len(w["kv_usage"]) <= MAX_BINS
        kept = sum(u * 1000 * s["bin_ms"] for u in w["kv_usage"])  # rounded to 4 digits per bin
        assert abs(kept - total[w["worker"]]) <= 0.5e-4 * 1000 * s["bin_ms"] * len(w["kv_usage"]) + 1e-6


def test_a_real_run_agrees_with_its_mean_kv_usage():
    usage, per_request = UsageRecorder(), RequestRecorder()
    res = run(SimConfig(timing=True, workers=3, mode="kv-cost"), recorders=[per_request, usage])
    recs = list(per_request.records())
    span = max(r["finish_ms"] for r in recs) - min(r["arrival_ms"] for r in recs)  # mean_kv_usage's span
    s = usage.series()
    assert len(s["workers"]) == 3 and s["origin_ms"] == min(r["arrival_ms"] for r in recs)
    for w, mean in zip(s["workers"], res["mean_kv_usage"]):
        area = sum(w["kv_usage"]) * s["bin_ms"]  # share x ms
        assert abs(area - mean * span) <= 0.5e-4 * s["bin_ms"] * len(w["kv_usage"]) + 0.5e-4 * span


def test_the_report_of_a_timed_compare_draws_usage_and_names_the_latency_domain(tmp_path):
    out = tmp_path / "r.html"
    plain = CliRunner().invoke(main, ["compare", "--timing", "--modes", "rr,kv", "--workers", "2", "--quiet",
                                      "--format", "json"])
    res = CliRunner().invoke(main, ["compare", "--timing", "--modes", "rr,kv", "--workers", "2", "--quiet",
                                    "--format", "json", "--report", str(out)])
    assert res.exit_code == 0 and res.stdout == plain.stdout  # the run's JSON is unchanged
    page = out.read_text()
    assert 'id="usage"' in page and "Per-worker KV usage and load over time" in page
    assert re.search(r"<th scope=\"row\" class=l>kv</th><td>1</td>", page)  # a table row per run and worker
    assert f"<td class=l>{IN_DOMAIN}</td>" in page  # the latency model and its domain
    # a count-based compare has no clock: no usage figure
    CliRunner().invoke(main, ["compare", "--modes", "rr,kv", "--quiet", "--format", "json", "--report", str(out)])
    assert 'id="usage"' not in out.read_text()


def test_the_latency_domain_row():
    timed = {"requests": 1, "latency_model": "roofline"}
    outside = dict(timed, latency_domain="GPU b200 outside the fit")
    assert ["latency model's domain", IN_DOMAIN] in config_rows([Run("a", timed)], {})
    assert ["latency model's domain", "GPU b200 outside the fit"] in config_rows([Run("a", outside)], {})
    assert not any(r[0] == "latency model's domain" for r in config_rows([Run("a", {"requests": 1})], {}))


def test_build_report_takes_usage_series():
    rec = UsageRecorder()
    rec.on_step(0, step(0.0, 100.0, 4, 2))
    rec.result(engines(8))
    page = build_report([Run("kv", {"requests": 1})], usage={"kv": rec.series()})
    assert 'id="usage"' in page and "worker 0 (peak bin 50% of its pool)" in page
    assert 'id="usage"' not in build_report([Run("kv", {"requests": 1})], usage={"kv": UsageRecorder().series()})
