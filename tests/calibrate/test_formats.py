"""dynlab.calibrate.formats: the sample files in tests/data/bench (see its README for which are real
outputs) read into the expected points; detection; refusals name the key/column and line."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

from dynlab.calibrate.formats import FORMATS, MeasuredPoint, detect_format, percentile, read_points, summarize
from dynlab.errors import DynlabError, InputError, InputFileError

DATA = Path(__file__).resolve().parent.parent / "data" / "bench"


@pytest.mark.parametrize("name, fmt", [
    ("vllm_bench_serve_detailed.json", "vllm-bench"),
    ("aiperf_profile_export.jsonl", "aiperf"),
    ("aiperf_profile_export_aiperf.json", "aiperf"),
    ("guidellm_benchmarks_stripped.json", "guidellm"),
    ("points_summary.csv", "points"),
    ("points_summary.json", "points"),
])
def test_detection_picks_the_format(name, fmt):
    assert detect_format(DATA / name) == fmt
    assert read_points(DATA / name, format=fmt) == read_points(DATA / name)


def test_formats_lists_the_names():
    assert FORMATS == ("vllm-bench", "aiperf", "guidellm", "points")


def test_vllm_detailed_per_request_and_computed_summary():
    [p] = read_points(DATA / "vllm_bench_serve_detailed.json")
    assert (p.model, p.gpu, p.tp, p.max_concurrency, p.num_prompts) == (
        "meta-llama/Llama-3.1-8B-Instruct", "H100", 2, 2, 4)
    assert p.request_rate == math.inf and p.backend == "vllm"
    # the failed request (errors[3]) is left out; seconds become ms
    assert p.ttfts_ms == (100.0, 200.0, 400.0) and p.output_lens == (4, 3, 2)
    assert p.itls_ms == ((10.0, 20.0, 30.0), (20.0, 20.0), (50.0,))
    # by hand: TPOT = (latency - ttft)/(out - 1) = 60/3, 40/2, 50/1 ms
    assert p.median_tpot_ms == pytest.approx(20.0) and p.mean_tpot_ms == pytest.approx(30.0)
    assert p.median_ttft_ms == 200.0 and p.p99_ttft_ms == pytest.approx(396.0)  # 200 + 0.98 * 200
    assert p.median_itl_ms == 20.0 and p.mean_itl_ms == pytest.approx(25.0)
    assert p.median_e2el_ms == pytest.approx(240.0)
    # summary values the file has are kept, not recomputed
    assert p.total_token_throughput == 154.5 and p.duration == 2.0
    assert p.total_token_throughput_per_gpu() == pytest.approx(154.5 / 2)


def test_aiperf_jsonl_real_sample():
    [p] = read_points(DATA / "aiperf_profile_export.jsonl")
    assert p.num_prompts == 16 and len(p.ttfts_ms) == 5       # 11 cancelled requests dropped
    assert p.ttfts_ms[0] == pytest.approx(1680.543782) and p.input_lens[0] == 550
    assert p.output_lens[0] == 193 and len(p.itls_ms[0]) == 192
    # our TPOT of request 1 = (7936.968269 - 1680.543782)/192, aiperf's own inter_token_latency
    tpot_first = (7936.968269 - 1680.543782) / 192
    assert tpot_first == pytest.approx(32.585544203124996)
    assert p.median_ttft_ms == pytest.approx(float(np.median(p.ttfts_ms)))
    assert p.duration is not None and 8 < p.duration < 10


def test_aiperf_summary_real_sample():
    [p] = read_points(DATA / "aiperf_profile_export_aiperf.json")
    assert (p.model, p.max_concurrency, p.num_prompts, p.random_output_len) == ("openai/gpt-oss-20b", 100, 100, 250)
    assert p.median_ttft_ms == pytest.approx(2369.317693) and p.p99_ttft_ms == pytest.approx(3833.3894000399996)
    assert p.median_tpot_ms == pytest.approx(27.615130366666666)   # aiperf's inter_token_latency p50
    assert p.median_e2el_ms == pytest.approx(9097.345014999999)
    assert p.duration == pytest.approx(9.317788951)
    assert p.total_token_throughput == pytest.approx((48950 + 21624) / 9.317788951)
    assert p.ttfts_ms is None


def test_guidellm_real_sample():
    [p] = read_points(DATA / "guidellm_benchmarks_stripped.json")
    assert p.max_concurrency == 1 and p.request_rate is None           # synchronous
    assert (p.random_input_len, p.random_output_len, p.num_prompts) == (256, 128, 47)
    assert p.median_ttft_ms == pytest.approx(16.38054847717285)
    assert p.p99_ttft_ms == pytest.approx(21.281957626342773)
    assert p.median_e2el_ms == pytest.approx(642.4565315246582)         # request_latency is in s
    assert p.request_throughput == pytest.approx(1.5481806532737452)


def test_guidellm_strategies(tmp_path):
    doc = json.loads((DATA / "guidellm_benchmarks_stripped.json").read_text())
    bench = doc["benchmarks"][0]
    variants = [{"type_": "concurrent", "streams": 8}, {"type_": "constant", "rate": 2.5},
                {"type_": "poisson", "rate": 3.0}, {"type_": "throughput", "max_concurrency": None}]
    doc["benchmarks"] = [dict(bench, args=dict(bench["args"], strategy=s)) for s in variants]
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    got = [(p.max_concurrency, p.request_rate) for p in read_points(path)]
    assert got == [(8, None), (None, 2.5), (None, 3.0), (None, math.inf)]


def test_points_csv_and_json():
    first, second = read_points(DATA / "points_summary.csv")
    assert first.source.endswith("points_summary.csv:2") and (first.tp, first.ep) == (2, 4)
    assert first.request_rate == math.inf and first.total_token_throughput_per_gpu() == pytest.approx(18240 / 4)
    assert second.max_concurrency is None and second.p99_ttft_ms is None and second.request_rate == 4.5
    a, b = read_points(DATA / "points_summary.json")
    assert a.source.endswith(":2") and b.source.endswith(":5")
    assert b.per_gpu and b.total_token_throughput_per_gpu() == 30500.0
    assert a.total_token_throughput_per_gpu() == 10500.0


def _error(path, **kw) -> str:
    with pytest.raises(DynlabError) as info:
        read_points(path, **kw)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_vllm_unknown_key_refused_with_its_line(tmp_path):
    data = json.loads((DATA / "vllm_bench_serve_detailed.json").read_text())
    path = tmp_path / "r.json"
    path.write_text(json.dumps(dict(data, foo=1), indent=1))
    msg = _error(path)
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if '"foo"' in t)
    assert msg.startswith(f"{path}:{line}: unknown key 'foo' (a vllm bench serve result has")


def test_vllm_metadata_settings_and_stat_keys_accepted(tmp_path):
    data = {"model_id": "m", "duration": 10.0, "p99.9_ttft_ms": 5.0, "std_e2el_ms": 1.0,
            "engine": "vllm", "version": "0.9.1", "ep": "8", "per_gpu": "true", "input_len": "512",
            "total_token_throughput": 800.0}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    [p] = read_points(path)
    assert (p.engine, p.version, p.ep, p.per_gpu, p.random_input_len) == ("vllm", "0.9.1", 8, True, 512)
    assert p.total_token_throughput_per_gpu() == 800.0


def test_vllm_bad_number_names_file_and_line(tmp_path):
    text = (DATA / "vllm_bench_serve_detailed.json").read_text().replace('"duration": 2.0', '"duration": "soon"')
    path = tmp_path / "r.json"
    path.write_text(text)
    assert _error(path) == f"{path}:1: duration: expected a number, got 'soon'"


def test_points_unknown_column_and_bad_value(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("model,tp,colour\nm,1,red\n")
    assert _error(path, format="points").startswith(f"{path}:1: unknown column 'colour' (a points file has model, gpu,")
    assert _error(path).startswith(f"{path}:1: unknown column 'colour'")     # a .csv is a points file
    path.write_text("model,tp,median_ttft_ms\nm,1,5\nm,two,5\n")
    assert _error(path) == f"{path}:3: tp: expected a number, got 'two'"
    path.write_text("model,tp\nm,1.5\n")
    assert _error(path) == f"{path}:2: tp: expected a whole number, got 1.5"
    js = tmp_path / "p.json"
    js.write_text('[\n {"model": "m"},\n {"model": "m",\n  "median_ttft_ms": -3}\n]\n')
    assert _error(js) == f"{js}:3: median_ttft_ms: expected a finite number >= 0, got -3"
    js.write_text('[{"model": "m", "shape": 1}]')
    assert _error(js).startswith(f"{js}:1: unknown column 'shape'")


def test_aiperf_errors_carry_the_line(tmp_path):
    lines = (DATA / "aiperf_profile_export.jsonl").read_text().splitlines()
    path = tmp_path / "profile_export.jsonl"
    path.write_text("\n".join(lines[:12] + ["{not json"] + lines[12:]) + "\n")
    assert _error(path).startswith(f"{path}:13: not valid JSON")
    rec = json.loads(lines[11])
    rec["metrics"]["time_to_first_token"] = rec["metrics"].pop("ttft")
    rec["metrics"]["time_to_first_token"]["unit"] = "fortnights"
    path.write_text("\n".join(lines[:11] + [json.dumps(rec)]) + "\n")
    assert _error(path).startswith(f"{path}:12: metrics.time_to_first_token: unknown time unit 'fortnights'")
    path.write_text("\n".join(lines[:2] + [json.dumps(dict(rec, extra=1))]) + "\n")
    assert _error(path).startswith(f"{path}:3: unknown key 'extra'")


def test_aiperf_units_converted(tmp_path):
    rec = {"metadata": {}, "error": None, "metrics": {
        "input_sequence_length": {"value": 10, "unit": "tokens"},
        "output_sequence_length": {"value": 3, "unit": "tokens"},
        "time_to_first_token": {"value": 0.5, "unit": "sec"},
        "request_latency": {"value": 700000000, "unit": "ns"},
        "inter_chunk_latency": {"value": [100.0, 100.0], "unit": "ms"}}}
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    [p] = read_points(path)
    assert p.ttfts_ms == (500.0,) and p.median_tpot_ms == pytest.approx(100.0)
    assert p.duration is None and p.total_token_throughput is None


def test_unknown_file_and_format(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("hello\n")
    assert _error(path) == f"{path}:1: not a benchmark result file dynlab reads (formats: vllm-bench, aiperf, guidellm, points)"
    assert "unknown format 'csv'" in _error(path, format="csv")
    with pytest.raises(InputFileError):
        read_points(tmp_path / "missing.json")
    bad = tmp_path / "b.json"
    bad.write_text('{"benchmarks": [\n')
    with pytest.raises(InputError) as info:
        read_points(bad)
    assert str(info.value).startswith(f"{bad}:2: not valid JSON")


def test_summarize_by_hand():
    s = summarize([10, 20], [3, 1], [100.0, 300.0], [[40.0, 60.0], []], duration=4.0)
    assert s["mean_tpot_ms"] == 50.0                  # (200 - 100)/2; the 1-token request has none
    assert s["median_ttft_ms"] == 200.0 and s["median_itl_ms"] == 50.0
    assert s["median_e2el_ms"] == 250.0               # e2e = ttft + gaps: 200, 300
    assert s["total_token_throughput"] == (30 + 4) / 4.0 and s["request_throughput"] == 0.5


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=40), st.floats(0, 100))
def test_percentile_matches_numpy(xs, p):
    assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)), rel=1e-9, abs=1e-9)


@given(st.lists(st.floats(1.0, 1000.0), min_size=3, max_size=30), st.floats(1e4, 1e6), st.floats(1e4, 1e6))
def test_median_unmoved_by_an_outlier_moving_on_its_side(xs, high, other_high):
    ttfts = [*xs, high]
    moved = [*xs, other_high]
    gaps = [[] for _ in ttfts]
    a = summarize([1] * len(ttfts), [1] * len(ttfts), ttfts, gaps)
    b = summarize([1] * len(ttfts), [1] * len(ttfts), moved, gaps)
    assert a["median_ttft_ms"] == b["median_ttft_ms"]


def test_measured_point_is_frozen():
    p = MeasuredPoint(source="x", tp=4, ep=8, total_token_throughput=800.0)
    with pytest.raises(Exception):
        p.tp = 2  # type: ignore[misc]
    assert p.gpus() == 8 and p.total_token_throughput_per_gpu() == 100.0
    assert MeasuredPoint(source="x").total_token_throughput_per_gpu() is None
