"""The ``vllm-bench`` format of :mod:`dynlab.calibrate.formats`: the JSON object ``vllm bench serve
--save-result [--save-detailed]`` writes (its keys, units and sources: that module's docstring).
"""
from __future__ import annotations

import re
from dataclasses import replace

from dynlab.calibrate.measured import (
    _checked, _fill_summary, _key_line, _load_json, MeasuredPoint, _number, summarize, _SUMMARY_KEYS,
)
from dynlab.errors import InputError


#: keys vllm bench serve writes besides the ``<stat>_<metric>_ms`` ones (vllm/benchmarks/serve.py)
VLLM_KEYS = frozenset({
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "ramp_up_strategy", "ramp_up_start_rps",
    "ramp_up_end_rps", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "request_goodput:", "output_throughput",
    "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
    "queue_times", "generated_texts", "errors", "max_output_tokens_per_s", "max_concurrent_requests",
    "rtfx", "total_input_sequences", "input_sequence_throughput", "rps_change_events",
    "probe_completed", "probe_failed", "probe_median_e2el_ms", "probe_p99_e2el_ms", "probe_max_e2el_ms",
    "spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
    "spec_decode_draft_tokens", "spec_decode_accepted_tokens",
    "spec_decode_per_position_acceptance_rates", "diffusion_committed_throughput",
    "diffusion_steps_per_canvas", "diffusion_committed_per_step", "diffusion_committed_tokens",
    "diffusion_denoising_steps", "diffusion_canvas_positions",
})
_VLLM_STAT_KEY = re.compile(r"(mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el|client_queue_time|"
                            r"e2el_including_client_queue)_ms$")
#: settings ``--metadata KEY=VALUE`` may add (plus ``input_len``/``output_len``, read as the random lengths)
VLLM_METADATA_KEYS = frozenset({"model", "gpu", "tp", "ep", "engine", "version", "per_gpu",
                                "random_input_len", "random_output_len", "random_range_ratio",
                                "input_len", "output_len"})


def _detect_vllm(path, head: str) -> bool:
    return head.lstrip().startswith("{") and '"model_id"' in head and (
        '"median_ttft_ms"' in head or '"total_token_throughput"' in head or '"ttfts"' in head
        or '"duration"' in head)


def _vllm_settings(path, text: str, data: dict) -> dict:
    aliases = {"input_len": "random_input_len", "output_len": "random_output_len"}
    out = {"model": data.get("model_id"), "backend": data.get("backend") or data.get("endpoint_type")}
    for key in ("num_prompts", "max_concurrency", "request_rate"):
        out[key] = data.get(key)
    for key in VLLM_METADATA_KEYS:
        if key in data:
            out[aliases.get(key, key)] = data[key]
    return {k: _checked(path, _key_line(text, k), k, v) for k, v in out.items()}


def _vllm_per_request(path, text: str, data: dict):
    """``(input_lens, output_lens, ttfts_ms, itls_ms, e2els_ms)`` of the successful requests, or
    None when the file has no per-request lists."""
    if "ttfts" not in data or "itls" not in data:
        return None
    n = len(data["ttfts"])
    lists = {k: data.get(k) for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "errors")}
    for key, value in lists.items():
        if value is not None and (not isinstance(value, list) or len(value) != n):
            raise InputError(str(path), _key_line(text, key),
                             f"{key}: expected a list of {n} values (one per request, as 'ttfts')")
    errors = lists["errors"] or [""] * n
    keep = [i for i in range(n) if not errors[i]]
    line = _key_line(text, "itls")
    try:
        ins = tuple(_number(lists["input_lens"][i], "input_lens", integer=True) for i in keep)
        outs = tuple(_number(lists["output_lens"][i], "output_lens", integer=True) for i in keep)
        ttfts = tuple(_number(lists["ttfts"][i], "ttfts") * 1000.0 for i in keep)
        itls = tuple(tuple(_number(g, "itls") * 1000.0 for g in lists["itls"][i]) for i in keep)
        e2e = None if lists["latencies"] is None else [
            _number(lists["latencies"][i], "latencies") * 1000.0 for i in keep]
    except (ValueError, TypeError) as exc:
        raise InputError(str(path), line, str(exc)) from None
    return ins, outs, ttfts, itls, e2e


def _read_vllm(path, text: str) -> list:
    data = _load_json(path, text)
    if not isinstance(data, dict):
        raise InputError(str(path), 1, "a vllm bench serve result is one JSON object")
    for key in data:
        if key not in VLLM_KEYS and key not in VLLM_METADATA_KEYS and not _VLLM_STAT_KEY.match(key):
            raise InputError(str(path), _key_line(text, key),
                             f"unknown key {key!r} (a vllm bench serve result has the keys of "
                             "vllm/benchmarks/serve.py and the --metadata settings "
                             f"{', '.join(sorted(VLLM_METADATA_KEYS))})")
    summary = {k: _checked(path, _key_line(text, k), k, data.get(k)) for k in _SUMMARY_KEYS}
    point = MeasuredPoint(source=str(path), **_vllm_settings(path, text, data), **summary)
    per = _vllm_per_request(path, text, data)
    if per is None:
        return [point]
    ins, outs, ttfts, itls, e2e = per
    point = replace(point, input_lens=ins, output_lens=outs, ttfts_ms=ttfts, itls_ms=itls)
    return [_fill_summary(point, summarize(ins, outs, ttfts, itls, e2e, point.duration))]
