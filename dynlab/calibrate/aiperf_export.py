"""The ``aiperf`` format of :mod:`dynlab.calibrate.formats`: NVIDIA aiperf's per-request export
``profile_export.jsonl`` and its summary ``profile_export_aiperf.json`` (their keys, units and sources:
that module's docstring).
"""
from __future__ import annotations

import json
from pathlib import Path

from dynlab.calibrate.measured import (
    _checked, _fill_summary, _first_json_line, json_reason, _key_line, _load_json, MeasuredPoint, _number,
    _read_text, summarize,
)
from dynlab.errors import InputError


_TIME_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "sec": 1000.0, "s": 1000.0}
_AIPERF_RECORD_KEYS = frozenset({"metadata", "metrics", "error"})
_AIPERF_TTFT = ("time_to_first_token", "ttft")


def _detect_aiperf(path, head: str) -> bool:
    first = _first_json_line(head) if "\n" in head.strip() or str(path).endswith(".jsonl") else None
    if isinstance(first, dict) and "metrics" in first and "metadata" in first:
        return True
    return head.lstrip().startswith("{") and ('"input_config"' in head or (
        '"records"' in head and '"unit"' in head and '"avg"' in head))


def _aiperf_value(path, line: int, metrics: dict, names, time: bool = False):
    """The value of the first of ``names`` in a record's ``metrics`` (ms for a time), or None."""
    for name in names:
        if name in metrics:
            entry = metrics[name]
            if not isinstance(entry, dict) or "value" not in entry:
                raise InputError(str(path), line, f"metrics.{name}: expected {{\"value\": .., \"unit\": ..}}")
            unit, value = entry.get("unit"), entry["value"]
            scale = 1.0
            if time:
                if unit not in _TIME_UNITS_MS:
                    raise InputError(str(path), line, f"metrics.{name}: unknown time unit {unit!r} "
                                     f"(known: {', '.join(_TIME_UNITS_MS)})")
                scale = _TIME_UNITS_MS[unit]
            try:
                if isinstance(value, list):
                    return tuple(_number(v, f"metrics.{name}") * scale for v in value)
                return _number(value, f"metrics.{name}") * scale
            except ValueError as exc:
                raise InputError(str(path), line, str(exc)) from None
    return None


def _aiperf_record(path, line_no: int, line: str):
    """One jsonl line: None for a failed request, else ``(isl, osl, ttft, itls, e2e, start, end)``
    (times in ms, start/end in ns, either None when absent)."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(str(path), line_no, json_reason(exc)) from None
    if not isinstance(rec, dict):
        raise InputError(str(path), line_no, "expected a JSON object (an aiperf per-request record)")
    for key in rec:
        if key not in _AIPERF_RECORD_KEYS:
            raise InputError(str(path), line_no, f"unknown key {key!r} (an aiperf record has "
                             "'metadata', 'metrics' and 'error')")
    if rec.get("error") is not None:
        return None
    m = rec.get("metrics") or {}
    get = lambda names, time=False: _aiperf_value(path, line_no, m, names, time)  # noqa: E731
    isl, osl = get(("input_sequence_length",)), get(("output_sequence_length",))
    ttft, e2e = get(_AIPERF_TTFT, True), get(("request_latency",), True)
    if None in (isl, osl, ttft, e2e):
        raise InputError(str(path), line_no, "a successful record needs input_sequence_length, "
                         "output_sequence_length, time_to_first_token and request_latency")
    itls = get(("inter_chunk_latency",), True) or ()
    meta = rec.get("metadata") or {}
    start = get(("min_request_timestamp",)) or meta.get("request_start_ns") or meta.get("timestamp_ns")
    end = get(("max_response_timestamp",)) or meta.get("request_end_ns")
    return int(isl), int(osl), ttft, tuple(itls), e2e, start, end


def _read_aiperf_jsonl(path, text: str) -> list:
    recs, total = [], 0
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            total += 1
            rec = _aiperf_record(path, line_no, line)
            if rec is not None:
                recs.append(rec)
    if not recs:
        raise InputError(str(path), 1, "no successful request in this aiperf export")
    ins, outs, ttfts, itls, e2e, starts, ends = (list(col) for col in zip(*recs))
    duration = None
    if all(s is not None for s in starts) and all(e is not None for e in ends):
        duration = (max(ends) - min(starts)) / 1e9
    point = MeasuredPoint(source=str(path), num_prompts=total, input_lens=tuple(ins),
                          output_lens=tuple(outs), ttfts_ms=tuple(ttfts), itls_ms=tuple(itls),
                          **_aiperf_sibling_settings(path))
    return [_fill_summary(point, summarize(ins, outs, ttfts, itls, e2e, duration))]


#: the summary aiperf writes beside its per-request export, in the same artifact directory
AIPERF_SUMMARY_NAME = "profile_export_aiperf.json"


def _aiperf_sibling_settings(path) -> dict:
    """The model, concurrency and request rate of the summary beside an aiperf per-request export
    (:data:`AIPERF_SUMMARY_NAME`; the export itself names none), ``{}`` when there is none."""
    sibling = Path(path).with_name(AIPERF_SUMMARY_NAME)
    if not sibling.is_file():
        return {}
    text = _read_text(sibling)
    data = _load_json(sibling, text)
    cfg = data.get("input_config") if isinstance(data, dict) else None
    settings = _aiperf_summary_settings(cfg or {})
    line = _key_line(text, "input_config")
    return {k: _checked(sibling, line, k, settings[k]) for k in ("model", "max_concurrency", "request_rate")}


def _aiperf_stat(path, text, metrics: dict, names, stat: str, time: bool = False):
    for name in names:
        entry = metrics.get(name)
        if isinstance(entry, dict) and entry.get(stat) is not None:
            scale = _TIME_UNITS_MS.get(entry.get("unit"), None) if time else 1.0
            if scale is None:
                raise InputError(str(path), _key_line(text, name),
                                 f"{name}: unknown time unit {entry.get('unit')!r}")
            return _checked(path, _key_line(text, name), "duration", entry[stat], f"{name}.{stat}") * scale
    return None


def _aiperf_summary_settings(cfg: dict) -> dict:
    endpoint, loadgen = cfg.get("endpoint") or {}, cfg.get("loadgen") or {}
    prompt = (cfg.get("input") or {}).get("prompt") or {}
    names = endpoint.get("model_names") or [None]
    return {"model": names[0], "max_concurrency": loadgen.get("concurrency"),
            "request_rate": loadgen.get("request_rate"), "num_prompts": loadgen.get("request_count"),
            "random_input_len": (prompt.get("input_tokens") or {}).get("mean"),
            "random_output_len": (prompt.get("output_tokens") or {}).get("mean")}


def _read_aiperf_summary(path, text: str) -> list:
    data = _load_json(path, text)
    metrics = data.get("records") if isinstance(data.get("records"), dict) else data
    stat = lambda names, s, time=True: _aiperf_stat(path, text, metrics, names, s, time)  # noqa: E731
    values = {
        "median_ttft_ms": stat(_AIPERF_TTFT, "p50"), "mean_ttft_ms": stat(_AIPERF_TTFT, "avg"),
        "p99_ttft_ms": stat(_AIPERF_TTFT, "p99"),
        "median_tpot_ms": stat(("inter_token_latency",), "p50"),
        "mean_tpot_ms": stat(("inter_token_latency",), "avg"),
        "p99_tpot_ms": stat(("inter_token_latency",), "p99"),
        "median_itl_ms": stat(("inter_chunk_latency",), "p50"),
        "mean_itl_ms": stat(("inter_chunk_latency",), "avg"),
        "median_e2el_ms": stat(("request_latency",), "p50"), "p99_e2el_ms": stat(("request_latency",), "p99"),
        "output_throughput": stat(("output_token_throughput",), "avg", False),
        "request_throughput": stat(("request_throughput",), "avg", False),
        "duration": stat(("benchmark_duration",), "avg") and stat(("benchmark_duration",), "avg") / 1000.0,
    }
    isl, osl = stat(("total_isl",), "avg", False), stat(("total_osl",), "avg", False)
    if None not in (isl, osl, values["duration"]) and values["duration"] > 0:
        values["total_token_throughput"] = (isl + osl) / values["duration"]
    line = _key_line(text, "input_config")
    settings = {k: _checked(path, line, k, v)
                for k, v in _aiperf_summary_settings(data.get("input_config") or {}).items()}
    return [MeasuredPoint(source=str(path), **settings, **values)]


def _read_aiperf(path, text: str) -> list:
    first = _first_json_line(text)
    if isinstance(first, dict) and "metrics" in first and "metadata" in first:
        return _read_aiperf_jsonl(path, text)
    return _read_aiperf_summary(path, text)
