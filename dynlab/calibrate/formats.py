"""Readers of the benchmark result files users already have: each turns a file into a list of
:class:`MeasuredPoint`, one measured benchmark run each.

Formats (``FORMATS``; :func:`read_points` detects one or takes its name):

``vllm-bench``
    The JSON object ``vllm bench serve --save-result [--save-detailed]`` writes (vllm-project/vllm,
    ``vllm/benchmarks/serve.py``: ``main_async`` builds ``result_json``, ``benchmark`` the result dict,
    ``process_one_metric`` the ``mean_/median_/std_/pNN_<metric>_ms`` keys). Per-request lists in
    SECONDS: ``ttfts``, ``itls`` (a list per request), ``latencies``; token counts ``input_lens``,
    ``output_lens``. Summary metrics in ms, throughputs in req/s and tokens/s, ``duration`` in s.
    Keys vLLM does not write are refused by name, except the settings keys below that
    ``--metadata KEY=VALUE`` can add (their values are strings).
``aiperf``
    NVIDIA aiperf's per-request export ``profile_export.jsonl`` (one record per line:
    ``metadata``, ``metrics`` of ``{"value": .., "unit": ..}``, ``error``; ai-dynamo/aiperf,
    ``aiperf/post_processors/record_export_results_processor.py`` and
    ``docs/tutorials/working-with-profile-exports.md``) and its summary ``profile_export_aiperf.json``
    (``aiperf/exporters/json_exporter.py``: per metric ``unit``, ``avg``, ``p50``, ``p99`` ..., under
    ``records`` in 2025-10 releases, at the top level later). Units are read from the file (ns, us,
    ms, sec). aiperf's ``inter_token_latency`` is vLLM's TPOT ((latency - TTFT)/(OSL - 1)); its
    ``inter_chunk_latency`` list is vLLM's ITL. aiperf's output lengths include reasoning tokens.
``guidellm``
    guidellm's ``benchmarks.json`` (vllm-project/guidellm, ``src/guidellm/benchmark/schemas/``): a
    ``benchmarks`` list, one point each; the strategy (``synchronous``, ``concurrent`` with
    ``streams``, ``throughput``, ``constant``/``poisson`` with ``rate``) under ``args.strategy``
    (0.3 releases) or ``config.strategy`` (later); metrics from the ``successful`` distributions:
    ``time_to_first_token_ms``, ``time_per_output_token_ms``, ``inter_token_latency_ms`` (ms),
    ``request_latency`` (s), ``requests_per_second``, ``output_tokens_per_second``,
    ``tokens_per_second`` (their ``mean`` taken as the run's rate).
``points``
    A plain CSV (header row) or a JSON list of objects, one summary point a row, with the columns
    ``POINT_COLUMNS``: ``model``, ``gpu``, ``tp``, ``ep``, ``max_concurrency``, ``request_rate``
    (req/s, ``inf``), ``arrival`` (``poisson``, the default, or ``constant``), ``num_prompts``,
    ``random_input_len``, ``random_output_len`` (tokens),
    ``random_range_ratio``, ``median_ttft_ms``, ``mean_ttft_ms``, ``p99_ttft_ms``,
    ``median_tpot_ms``, ``mean_tpot_ms``, ``p99_tpot_ms``, ``median_itl_ms``, ``mean_itl_ms``,
    ``median_e2el_ms``, ``p99_e2el_ms`` (ms), ``total_token_throughput``, ``output_throughput``
    (tokens/s), ``request_throughput`` (req/s), ``duration`` (s), ``per_gpu`` (true/false),
    ``engine``, ``version``, ``source_note``. Missing columns are allowed (an empty CSV cell or a JSON
    null is None); others are refused.

Every problem is a one-line :class:`~dynlab.errors.InputError` (``FILE:LINE: what``) or, for a
file that cannot be opened, :class:`~dynlab.errors.InputFileError`.
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

from dynlab.errors import InputError, InputFileError

__all__ = ["MeasuredPoint", "FORMATS", "POINT_COLUMNS", "detect_format", "read_points", "summarize",
           "percentile"]

_SUMMARY_KEYS = ("median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "mean_tpot_ms",
                 "p99_tpot_ms", "median_itl_ms", "mean_itl_ms", "median_e2el_ms", "p99_e2el_ms",
                 "total_token_throughput", "output_throughput", "request_throughput", "duration")


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured benchmark run. Settings and metrics are None where the file lacks them.

    Settings: ``model``, ``gpu`` (str), ``tp``, ``ep`` (int), ``max_concurrency`` (int; None = open
    loop), ``request_rate`` (req/s; ``inf`` = all at once; None = not stated), ``num_prompts`` (int),
    ``random_input_len``, ``random_output_len`` (tokens), ``random_range_ratio``, ``backend`` (the
    benchmark client's backend/endpoint type), ``engine`` and ``version`` (the serving engine, where
    stated), ``per_gpu`` (the throughputs are per GPU already), ``source`` ("FILE" or "FILE:LINE"),
    ``arrival`` (how an open-loop client spaced its requests: ``"poisson"``, ``"constant"``; None: not
    stated, replayed as Poisson).

    Per-request data (tuples, None when the format has none): ``input_lens``, ``output_lens``
    (tokens), ``ttfts_ms`` (ms), ``itls_ms`` (ms, a tuple of inter-token gaps per request). Failed
    requests are left out.

    Summary metrics with vllm bench serve's names: ``*_ms`` in ms, ``total_token_throughput`` (input
    + output tokens/s), ``output_throughput`` (tokens/s), ``request_throughput`` (req/s),
    ``duration`` (s).
    """

    source: str
    model: str | None = None
    gpu: str | None = None
    tp: int | None = None
    ep: int | None = None
    max_concurrency: int | None = None
    request_rate: float | None = None
    num_prompts: int | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_range_ratio: float | None = None
    backend: str | None = None
    engine: str | None = None
    version: str | None = None
    per_gpu: bool = False
    arrival: str | None = None
    input_lens: tuple | None = None
    output_lens: tuple | None = None
    ttfts_ms: tuple | None = None
    itls_ms: tuple | None = None
    median_ttft_ms: float | None = None
    mean_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    median_tpot_ms: float | None = None
    mean_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    median_itl_ms: float | None = None
    mean_itl_ms: float | None = None
    median_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    total_token_throughput: float | None = None
    output_throughput: float | None = None
    request_throughput: float | None = None
    duration: float | None = None

    def gpus(self) -> int:
        """The GPUs one replica of the measured server used: ``max(tp, ep, 1)`` (None counts as 1).
        A simplification: an expert-parallel deployment's attention is taken to run data-parallel
        on the same GPUs as its experts, so the count is the larger of the two degrees."""
        return max(self.tp or 1, self.ep or 1, 1)

    def total_token_throughput_per_gpu(self) -> float | None:
        """Input + output tokens/s per GPU: the file's ``total_token_throughput`` as it is when
        ``per_gpu`` is true, else divided by :meth:`gpus`. None when the throughput is unknown."""
        if self.total_token_throughput is None:
            return None
        return self.total_token_throughput if self.per_gpu else self.total_token_throughput / self.gpus()


# --- statistics, with vLLM's definitions -----------------------------------------------------------

def percentile(values, p: float) -> float:
    """The ``p``-th percentile (0-100) of ``values`` by linear interpolation between the closest
    ranks, as numpy's default (``method="linear"``). ``values`` must not be empty."""
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def summarize(input_lens, output_lens, ttfts_ms, itls_ms, e2els_ms=None, duration=None) -> dict:
    """The summary metrics vllm bench serve reports, computed from per-request data (successful
    requests only). Times in ms, ``duration`` in s. TPOT per request with more than one output token
    = (E2E - TTFT)/(output - 1); ITL = all inter-token gaps flattened; E2E defaults to TTFT + the sum
    of the request's gaps. Throughputs need ``duration``; metrics of empty lists are None."""
    if e2els_ms is None:
        e2els_ms = [t + sum(g) for t, g in zip(ttfts_ms, itls_ms)]
    tpots = [(e - t) / (n - 1) for e, t, n in zip(e2els_ms, ttfts_ms, output_lens) if n > 1]
    itls = [g for gaps in itls_ms for g in gaps]
    out: dict = {}
    for name, xs in (("ttft", ttfts_ms), ("tpot", tpots), ("itl", itls), ("e2el", e2els_ms)):
        out[f"mean_{name}_ms"] = _mean(xs)
        out[f"median_{name}_ms"] = percentile(xs, 50) if xs else None
        out[f"p99_{name}_ms"] = percentile(xs, 99) if xs else None
    for key in ("p99_itl_ms", "mean_e2el_ms"):
        out.pop(key)
    if duration:
        out["request_throughput"] = len(ttfts_ms) / duration
        out["output_throughput"] = sum(output_lens) / duration
        out["total_token_throughput"] = (sum(input_lens) + sum(output_lens)) / duration
        out["duration"] = duration
    return out


def _fill_summary(point: MeasuredPoint, computed: dict) -> MeasuredPoint:
    """``point`` with each summary metric it lacks taken from ``computed``."""
    missing = {k: v for k, v in computed.items() if getattr(point, k) is None and v is not None}
    return replace(point, **missing) if missing else point


# --- value checks ----------------------------------------------------------------------------------

#: how an open-loop client spaces its requests (a points file's ``arrival``)
ARRIVALS = ("poisson", "constant")
_INT_SETTINGS = ("tp", "ep", "max_concurrency", "num_prompts", "random_input_len", "random_output_len")
_FLOAT_SETTINGS = ("request_rate", "random_range_ratio")
_STR_SETTINGS = ("model", "gpu", "backend", "engine", "version")


def _number(value, what: str, integer: bool = False, allow_inf: bool = False):
    """``value`` (a JSON number or a string) as an int or a finite float; raises ValueError with a
    message naming ``what``."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a number, got {json.dumps(value)}")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text) if not integer or not text.lstrip("+-").isdigit() else int(text)
        except ValueError:
            raise ValueError(f"{what}: expected a number, got {value!r}") from None
    if not isinstance(value, (int, float)):
        raise ValueError(f"{what}: expected a number, got {json.dumps(value)}")
    if math.isinf(value) and allow_inf and value > 0:
        return math.inf
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: expected a finite number >= 0, got {value!r}")
    if integer:
        if value != int(value):
            raise ValueError(f"{what}: expected a whole number, got {value!r}")
        return int(value)
    return float(value)


def _bool(value, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{what}: expected true or false, got {value!r}")


def _setting(name: str, value, what: str | None = None):
    """A settings or metric value checked and converted for field ``name`` (None stays None);
    ``what`` names it in the ValueError (default ``name``)."""
    what = what or name
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    if name in _STR_SETTINGS:
        return str(value)
    if name == "per_gpu":
        return _bool(value, what)
    if name == "arrival":
        if value not in ARRIVALS:
            raise ValueError(f"{what}: expected one of {', '.join(ARRIVALS)}, got {value!r}")
        return value
    if name in _INT_SETTINGS:
        return _number(value, what, integer=True)
    return _number(value, what, allow_inf=(name == "request_rate"))


# --- file helpers ----------------------------------------------------------------------------------

def _read_text(path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, PermissionError, NotADirectoryError) as exc:
        raise InputFileError(str(path), exc.strerror or type(exc).__name__) from None
    except UnicodeDecodeError:
        raise InputError(str(path), 1, "not a UTF-8 text file") from None


def _load_json(path, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(str(path), exc.lineno, f"not valid JSON: {exc.msg}") from None


def _key_line(text: str, key: str) -> int:
    """The line where ``"key":`` first appears in ``text`` (1 if it does not)."""
    m = re.search(r'"%s"\s*:' % re.escape(key), text)
    return text.count("\n", 0, m.start()) + 1 if m else 1


def _checked(path, line: int, name: str, value, what: str | None = None):
    try:
        return _setting(name, value, what)
    except ValueError as exc:
        raise InputError(str(path), line, str(exc)) from None


def _first_json_line(text: str):
    for line in text.splitlines():
        if line.strip():
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


# --- vllm-bench ------------------------------------------------------------------------------------

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


# --- aiperf ----------------------------------------------------------------------------------------

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
        raise InputError(str(path), line_no, f"not valid JSON: {exc.msg}") from None
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


# --- guidellm --------------------------------------------------------------------------------------

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


# --- points ----------------------------------------------------------------------------------------

#: the columns a ``points`` file may have
POINT_COLUMNS = ("model", "gpu", "tp", "ep", "max_concurrency", "request_rate", "arrival", "num_prompts",
                 "random_input_len", "random_output_len", "random_range_ratio", *_SUMMARY_KEYS,
                 "per_gpu", "engine", "version", "source_note")


def _detect_points(path, head: str) -> bool:
    stripped = head.lstrip()
    if stripped.startswith("[") or str(path).lower().endswith(".csv"):
        return True
    if stripped.startswith("{"):
        return False
    header = next(csv.reader(io.StringIO(stripped.splitlines()[0] if stripped else "")), [])
    return bool(header) and all(name.strip() in POINT_COLUMNS for name in header)


def _point_from_row(path, line: int, row: dict) -> MeasuredPoint:
    values = {}
    for name, value in row.items():
        if name not in POINT_COLUMNS:
            raise InputError(str(path), line, f"unknown column {name!r} (a points file has "
                             f"{', '.join(POINT_COLUMNS)})")
        if name == "source_note":
            continue
        try:
            values[name] = _setting(name, value)
        except ValueError as exc:
            raise InputError(str(path), line, str(exc)) from None
    if values.get("per_gpu") is None:
        values.pop("per_gpu", None)
    return MeasuredPoint(source=f"{path}:{line}", **values)


def _json_object_lines(text: str):
    """The line on which each element of a top-level JSON list starts."""
    decoder, lines, pos = json.JSONDecoder(), [], text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return lines
        lines.append(text.count("\n", 0, pos) + 1)
        pos = decoder.raw_decode(text, pos)[1]


def _read_points(path, text: str) -> list:
    if text.lstrip().startswith("["):
        data = _load_json(path, text)
        lines = _json_object_lines(text)
        for line, row in zip(lines, data):
            if not isinstance(row, dict):
                raise InputError(str(path), line, "expected a JSON object (one point)")
        return [_point_from_row(path, line, row) for line, row in zip(lines, data)]
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    for name in header:
        if name not in POINT_COLUMNS:
            raise InputError(str(path), 1, f"unknown column {name!r} (a points file has "
                             f"{', '.join(POINT_COLUMNS)})")
    points = []
    for row in reader:
        if not any(cell.strip() for cell in row):
            continue
        line = reader.line_num
        if len(row) != len(header):
            raise InputError(str(path), line, f"{len(row)} cells, the header has {len(header)}")
        points.append(_point_from_row(path, line, dict(zip(header, row))))
    return points


# --- dispatch --------------------------------------------------------------------------------------

#: format name -> (detect(path, first text), read(path, text) -> list[MeasuredPoint]), in detection order
_READERS = {
    "vllm-bench": (_detect_vllm, _read_vllm),
    "aiperf": (_detect_aiperf, _read_aiperf),
    "guidellm": (_detect_guidellm, _read_guidellm),
    "points": (_detect_points, _read_points),
}
FORMATS = tuple(_READERS)
_HEAD_CHARS = 65536


def detect_format(path, text: str | None = None) -> str:
    """The name of ``path``'s format (from its first 64 KiB), or an :class:`InputError`."""
    if text is None:
        text = _read_text(path)
    head = text[:_HEAD_CHARS]
    for name, (detect, _) in _READERS.items():
        if detect(path, head):
            return name
    raise InputError(str(path), 1, f"not a benchmark result file dynlab reads (formats: {', '.join(FORMATS)})")


def read_points(path, format: str | None = None) -> list:  # noqa: A002 - the public name
    """The measured points in ``path`` (a list of :class:`MeasuredPoint`), its format detected or
    named by ``format`` (one of ``FORMATS``)."""
    if format is not None and format not in _READERS:
        raise InputError(str(path), 1, f"unknown format {format!r} (formats: {', '.join(FORMATS)})")
    text = _read_text(path)
    name = format or detect_format(path, text)
    return _READERS[name][1](path, text)


assert set(_SUMMARY_KEYS) <= {f.name for f in fields(MeasuredPoint)}
