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

import json

from dynlab.calibrate.aiperf_export import _detect_aiperf, _read_aiperf
from dynlab.calibrate.guidellm_json import _detect_guidellm, _read_guidellm
from dynlab.calibrate.measured import MeasuredPoint, json_reason, percentile, _read_text, summarize
from dynlab.calibrate.points_table import POINT_COLUMNS, _detect_points, _read_points
from dynlab.calibrate.vllm_bench import _detect_vllm, _read_vllm
from dynlab.errors import InputError

__all__ = ["MeasuredPoint", "FORMATS", "POINT_COLUMNS", "detect_format", "read_points", "summarize",
           "percentile"]

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
    _refuse_broken_json(path, text)
    raise InputError(str(path), 1, f"not a benchmark result file dynlab reads (formats: {', '.join(FORMATS)})")


def _refuse_broken_json(path, text: str) -> None:
    """A file that opens as a JSON object but does not parse (cut short, such as ``{"a": 1,\n "b": [1,2,``) is
    refused as not valid JSON at the decoder's line, not as an unknown format: a truncated file may end before
    the keys that detect its format. Data after a whole value (``Extra data``: JSON lines) is left to the
    unknown-format message."""
    if not text.lstrip().startswith("{"):
        return
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        if not exc.msg.startswith("Extra data"):
            raise InputError(str(path), exc.lineno, json_reason(exc)) from None


def read_points(path, format: str | None = None) -> list:  # noqa: A002 - the public name
    """The measured points in ``path`` (a list of :class:`MeasuredPoint`), its format detected or
    named by ``format`` (one of ``FORMATS``)."""
    if format is not None and format not in _READERS:
        raise InputError(str(path), 1, f"unknown format {format!r} (formats: {', '.join(FORMATS)})")
    text = _read_text(path)
    name = format or detect_format(path, text)
    return _READERS[name][1](path, text)

