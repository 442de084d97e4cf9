"""The ``guidellm`` format of :mod:`dynlab.calibrate.formats`: guidellm's ``benchmarks.json``, one
measured point per benchmark (its keys, units and sources: that module's docstring).
"""
from __future__ import annotations

import json
import math
import re

from dynlab.calibrate.measured import _checked, _key_line, _load_json, MeasuredPoint
from dynlab.errors import InputError


_GUIDELLM_METRICS = {  # MeasuredPoint field: (guidellm metric, distribution stat, scale to ms)
    "median_ttft_ms": ("time_to_first_token_ms", "median", 1.0),
    "mean_ttft_ms": ("time_to_first_token_ms", "mean", 1.0),
    "p99_ttft_ms": ("time_to_first_token_ms", "p99", 1.0),
    "median_tpot_ms": ("time_per_output_token_ms", "median", 1.0),
    "mean_tpot_ms": ("time_per_output_token_ms", "mean", 1.0),
    "p99_tpot_ms": ("time_per_output_token_ms", "p99", 1.0),
    "median_itl_ms": ("inter_token_latency_ms", "median", 1.0),
    "mean_itl_ms": ("inter_token_latency_ms", "mean", 1.0),
    "median_e2el_ms": ("request_latency", "median", 1000.0),
    "p99_e2el_ms": ("request_latency", "p99", 1000.0),
    "total_token_throughput": ("tokens_per_second", "mean", 1.0),
    "output_throughput": ("output_tokens_per_second", "mean", 1.0),
    "request_throughput": ("requests_per_second", "mean", 1.0),
}


def _detect_guidellm(path, head: str) -> bool:
    return head.lstrip().startswith("{") and '"benchmarks"' in head


def _guidellm_strategy(bench: dict) -> dict:
    """``max_concurrency`` and ``request_rate`` of a benchmark's scheduling strategy."""
    strategy = ((bench.get("config") or {}).get("strategy") or (bench.get("args") or {}).get("strategy")
                or {})
    kind = strategy.get("type_")
    if kind == "synchronous":
        return {"max_concurrency": 1, "request_rate": None}
    if kind == "concurrent":
        return {"max_concurrency": strategy.get("streams"), "request_rate": None}
    if kind == "throughput":
        return {"max_concurrency": strategy.get("max_concurrency"), "request_rate": math.inf}
    return {"max_concurrency": strategy.get("max_concurrency"), "request_rate": strategy.get("rate")}


def _guidellm_lengths(bench: dict) -> dict:
    """Synthetic-data ``prompt_tokens``/``output_tokens`` from the data spec string, where stated."""
    spec = json.dumps([(bench.get("request_loader") or {}).get("data"),
                       ((bench.get("config") or {}).get("requests") or {}).get("data")])
    out = {}
    for key, name in (("prompt_tokens", "random_input_len"), ("output_tokens", "random_output_len")):
        m = re.search(r'%s["\']?\s*[=:]\s*"?(\d+)' % key, spec)
        out[name] = int(m.group(1)) if m else None
    return out


def _guidellm_model(bench: dict):
    worker = bench.get("worker") or {}
    backend = (bench.get("config") or {}).get("backend") or {}
    return worker.get("backend_model") or backend.get("model")


def _guidellm_point(path, text: str, index: int, bench: dict) -> MeasuredPoint:
    if not isinstance(bench, dict) or not isinstance(bench.get("metrics"), dict):
        raise InputError(str(path), 1, f"benchmarks[{index}]: expected an object with 'metrics'")
    metrics, values = bench["metrics"], {}
    for field_name, (metric, stat, scale) in _GUIDELLM_METRICS.items():
        dist = (metrics.get(metric) or {}).get("successful") or {}
        raw = dist.get(stat, (dist.get("percentiles") or {}).get(stat))
        values[field_name] = _checked(path, _key_line(text, metric), field_name, raw,
                                      f"benchmarks[{index}].{metric}.{stat}")
        if values[field_name] is not None:
            values[field_name] *= scale
    duration = bench.get("duration")
    settings = {**_guidellm_strategy(bench), **_guidellm_lengths(bench), "model": _guidellm_model(bench)}
    settings = {k: _checked(path, 1, k, v, f"benchmarks[{index}].{k}") for k, v in settings.items()}
    totals = bench.get("request_totals") or (metrics.get("request_totals") or {})
    return MeasuredPoint(source=f"{path}", num_prompts=totals.get("total"), **settings, **values,
                         duration=_checked(path, 1, "duration", duration, f"benchmarks[{index}].duration"),
                         backend="guidellm")


def _read_guidellm(path, text: str) -> list:
    data = _load_json(path, text)
    benches = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benches, list) or not benches:
        raise InputError(str(path), 1, "a guidellm report has a non-empty 'benchmarks' list")
    return [_guidellm_point(path, text, i, b) for i, b in enumerate(benches)]
