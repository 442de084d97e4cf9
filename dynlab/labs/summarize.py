"""Summaries of measured JSON-lines files: disaggregated vs aggregated TTFT, and KV offload TTFT.

Both readers take an iterable of lines (``str`` or UTF-8 ``bytes``, e.g. an open file) and a ``name``
used in error messages. Blank lines are skipped. The first bad line stops the run with
:class:`~dynlab.errors.InputError` (``NAME:LINE: what is wrong``): not UTF-8, not JSON, not an object,
a missing field, or a non-number (``bool`` and ``null`` included) where a number belongs. An input
without any record is a :class:`~dynlab.errors.DynlabError`, never ``{}``.

Statistics are :func:`statistics.median` (an even count averages the middle two) and
:func:`statistics.mean`. Milliseconds are rounded to one decimal; every ratio is computed from the
unrounded statistics and rounded to two decimals.

Warnings (a cell or pass with one side missing, skipped configurations) go to the ``warn`` callback,
one line each; by default they are discarded.

A measured TTFT of exactly 0 ms is not a measurement (no prefill takes no time: a broken client or
a failed request). Such lines are kept, but the cell or pass whose statistics include them gains the
key :data:`ZERO_KEY` (``"zero_ttft_lines"``: how many of its lines report 0 ms), present only then,
and ``warn`` gets one line per cell or pass naming the first such line.
"""
from __future__ import annotations

import json
import math
import statistics
from typing import Callable, Iterable

from dynlab.errors import DynlabError, InputError

Warn = Callable[[str], None]


def _ignore(message: str) -> None:
    pass


def _records(lines: Iterable[str | bytes], name: str, fields: dict[str, str]):
    """Yield ``(line_number, record)`` for every non-blank line, checking ``fields`` (field -> kind).

    Kinds: ``"number"`` (finite int or float, not bool), ``"ms"`` (a number >= 0), ``"whole"`` (an
    integral number, returned as int) and ``"text"`` (a non-empty string).
    """
    seen = False
    for number, line in enumerate(lines, start=1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(name, number, "not UTF-8 text") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(name, number, f"not JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise InputError(name, number, "not JSON a measurement can be: nested too deeply") from None
        if not isinstance(record, dict):
            raise InputError(name, number, f"expected a JSON object, got {_kind(record)}")
        for field, kind in fields.items():
            if field not in record:
                raise InputError(name, number, f"missing field '{field}'")
            record[field] = _check(record[field], kind, name, number, field)
        seen = True
        yield number, record
    if not seen:
        raise DynlabError(f"{name}: empty input (no records)")


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _check(value, kind: str, name: str, number: int, field: str):
    if kind == "text":
        if not isinstance(value, str) or not value:
            got = "an empty string" if value == "" else f"{_kind(value)} {json.dumps(value)}"
            raise InputError(name, number, f"field '{field}' must be a non-empty string, got {got}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(name, number, f"field '{field}' must be a number, got {_kind(value)} {json.dumps(value)}")
    if not math.isfinite(value):
        raise InputError(name, number, f"field '{field}' must be a finite number, got {value}")
    if kind == "ms" and value < 0:
        raise InputError(name, number, f"field '{field}' must not be negative, got {value}")
    if kind == "whole":
        if isinstance(value, float) and not value.is_integer():
            raise InputError(name, number, f"field '{field}' must be a whole number, got {value}")
        return int(value)
    return value


def _ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator == 0 else round(float(numerator / denominator), 2)


#: the key added to a cell (disagg) or a pass entry (offload) with lines that report a TTFT of 0 ms
ZERO_KEY = "zero_ttft_lines"


def _zero_warning(name: str, what: str, lines: list[int]) -> str:
    count = "1 line reports" if len(lines) == 1 else f"{len(lines)} lines report"
    return (f"{name}: {what}: {count} a TTFT of 0 ms, which is not a measurement (first at line "
            f"{lines[0]}); its statistics include them ({ZERO_KEY}: {len(lines)})")


DISAGG_FIELDS = {"mode": "text", "input": "whole", "conc": "whole", "rep": "number", "ttft_p50_ms": "ms"}
OFFLOAD_FIELDS = {"config": "text", "pass": "text", "doc": "number", "doc_tokens": "number",
                  "ttft_ms": "ms", "total_ms": "ms"}
MODES = ("agg", "disagg")


def summarize_disagg(lines: Iterable[str | bytes], name: str = "<input>", warn: Warn = _ignore) -> dict:
    """Median TTFT per cell, aggregated vs disaggregated, and their ratio (seed 000 step 7).

    Input lines: ``{"mode": "agg"|"disagg", "input": tokens, "conc": concurrency, "rep": n,
    "ttft_p50_ms": ms}``. Output, cells in order of first appearance:
    ``{"<input>x<conc>": {"agg_ms", "disagg_ms", "ratio"}}`` (plus ``"zero_ttft_lines"`` when some of the
    cell's lines report 0 ms, see the module doc) where each ``_ms`` is the median of the
    cell's ``ttft_p50_ms`` over its repetitions (one decimal) and ``ratio`` = disagg median / agg
    median (unrounded medians, two decimals; > 1 means disaggregation was slower).

    A cell with only one mode gets ``null`` for the other side and the ratio, with a warning; so does
    the ratio of a cell whose agg median is 0. Raises :class:`InputError` for a bad line (including a
    ``mode`` other than agg/disagg) and :class:`DynlabError` for an empty input.
    """
    cells: dict[str, dict[str, list[float]]] = {}
    zeros: dict[str, list[int]] = {}
    for number, rec in _records(lines, name, DISAGG_FIELDS):
        if rec["mode"] not in MODES:
            raise InputError(name, number, f"field 'mode' must be \"agg\" or \"disagg\", got {json.dumps(rec['mode'])}")
        key = f"{rec['input']}x{rec['conc']}"
        cell = cells.setdefault(key, {m: [] for m in MODES})
        cell[rec["mode"]].append(rec["ttft_p50_ms"])
        if rec["ttft_p50_ms"] == 0:
            zeros.setdefault(key, []).append(number)

    out = {}
    for key, by_mode in cells.items():
        med = {m: statistics.median(v) if v else None for m, v in by_mode.items()}
        ratio = None
        missing = [m for m in MODES if med[m] is None]
        if missing:
            warn(f"{name}: cell {key} has no {missing[0]} lines; its {missing[0]}_ms and ratio are null")
        else:
            ratio = _ratio(med["disagg"], med["agg"])
            if ratio is None:
                warn(f"{name}: cell {key} has an agg median of 0; its ratio is null")
        out[key] = {
            "agg_ms": None if med["agg"] is None else round(float(med["agg"]), 1),
            "disagg_ms": None if med["disagg"] is None else round(float(med["disagg"]), 1),
            "ratio": ratio,
        }
        if key in zeros:
            out[key][ZERO_KEY] = len(zeros[key])
            warn(_zero_warning(name, f"cell {key}", zeros[key]))
    return out


def summarize_offload(
    lines: Iterable[str | bytes],
    name: str = "<input>",
    base: str = "baseline",
    cand: str = "lmcache",
    warn: Warn = _ignore,
) -> dict:
    """TTFT per pass for two configurations and their ratio (seed 002 step 8).

    Input lines: ``{"config", "pass", "doc", "doc_tokens", "ttft_ms", "total_ms"}``. Output:
    ``{base: {pass: {"n", "p50_ms", "mean_ms"}}, cand: {...}, "ratio": {pass: {"p50", "mean"}}}``
    (a pass entry gains ``"zero_ttft_lines"`` when some of its lines report 0 ms, see the module doc)
    over ``ttft_ms``: ``n`` lines, median and mean in ms (one decimal); ``ratio`` = base / cand of the
    unrounded statistics (two decimals; > 1 means the candidate was faster). Passes keep the names of
    the input, in order of first appearance among the two configurations' lines.

    Lines of other configurations are checked, then skipped with one warning per configuration. A
    pass that only one of the two configurations has gets ``null`` for the other and for the ratio,
    with a warning; so does a ratio whose denominator is 0.

    Raises ``ValueError`` if ``base`` and ``cand`` are equal or one is ``"ratio"``,
    :class:`InputError` for a bad line, and :class:`DynlabError` for an empty input or when ``base``
    or ``cand`` has no line at all (the message lists the configurations present).
    """
    if base == cand:
        raise ValueError(f"base and cand must differ, both are {base!r}")
    if "ratio" in (base, cand):
        raise ValueError("'ratio' is the output's ratio key; it cannot name a configuration")
    values, passes, zeros = _offload_values(lines, name, base, cand, warn)
    out: dict[str, dict] = {base: {}, cand: {}, "ratio": {}}
    for p in passes:
        stats = {}
        for config in (base, cand):
            stats[config], out[config][p] = _offload_pass(values[config].get(p), zeros.get((config, p)), name,
                                                          f"configuration {config!r} pass {p!r}", warn)
        out["ratio"][p] = _offload_ratio(stats, base, cand, p, name, warn)
    return out


def _offload_values(lines, name: str, base: str, cand: str, warn: Warn) -> tuple:
    """``(values, passes, zeros)`` of :func:`summarize_offload`'s input: ``values[config][pass]`` the
    ``ttft_ms`` (ms) of ``base``'s and ``cand``'s lines, ``passes`` the pass names in order of first
    appearance, ``zeros[(config, pass)]`` the line numbers reporting 0 ms. Lines of other configurations are
    counted and skipped with one warning per configuration; raises :class:`DynlabError` when ``base`` or
    ``cand`` has no line."""
    values: dict[str, dict[str, list[float]]] = {base: {}, cand: {}}
    passes: dict[str, None] = {}
    skipped: dict[str, int] = {}
    zeros: dict[tuple[str, str], list[int]] = {}
    for number, rec in _records(lines, name, OFFLOAD_FIELDS):
        config = rec["config"]
        if config not in values:
            skipped[config] = skipped.get(config, 0) + 1
            continue
        passes.setdefault(rec["pass"])
        values[config].setdefault(rec["pass"], []).append(rec["ttft_ms"])
        if rec["ttft_ms"] == 0:
            zeros.setdefault((config, rec["pass"]), []).append(number)
    absent = [c for c in (base, cand) if not values[c]]
    if absent:
        present = sorted(set(values) - set(absent) | set(skipped))
        raise DynlabError(
            f"{name}: no lines with config {absent[0]!r}; configurations present: {', '.join(map(repr, present)) or 'none'}")
    for config, count in skipped.items():
        warn(f"{name}: skipped {count} line{'s' if count != 1 else ''} of configuration {config!r}")
    return values, passes, zeros


def _offload_pass(v, zero_lines, name: str, what: str, warn: Warn) -> tuple:
    """``(stats, entry)`` of one configuration's pass (``what`` names it in a warning): ``stats`` =
    ``(median, mean, n)`` of its ``ttft_ms`` values ``v`` (ms, unrounded), ``entry`` its output
    ``{"n", "p50_ms", "mean_ms"}`` (one decimal) with ``"zero_ttft_lines"`` and a warning when
    ``zero_lines`` (line numbers reporting 0 ms) are given; ``(None, None)`` when it has no line."""
    if not v:
        return None, None
    stats = (statistics.median(v), statistics.mean(v), len(v))
    entry = {"n": len(v), "p50_ms": round(float(stats[0]), 1), "mean_ms": round(float(stats[1]), 1)}
    if zero_lines:
        entry[ZERO_KEY] = len(zero_lines)
        warn(_zero_warning(name, what, zero_lines))
    return stats, entry


def _offload_ratio(stats: dict, base: str, cand: str, p: str, name: str, warn: Warn):
    """``{"p50", "mean"}``: base / cand of pass ``p``'s statistics (:func:`_ratio`), or ``None`` with a
    warning when one configuration lacks the pass; a ratio over a 0 statistic is ``None``, with a warning."""
    if stats[base] is None or stats[cand] is None:
        lacking = base if stats[base] is None else cand
        warn(f"{name}: pass {p!r} has no {lacking!r} lines; its {lacking} entry and ratio are null")
        return None
    p50, mean = _ratio(stats[base][0], stats[cand][0]), _ratio(stats[base][1], stats[cand][1])
    if p50 is None or mean is None:
        warn(f"{name}: pass {p!r} has a {cand!r} statistic of 0; that ratio is null")
    return {"p50": p50, "mean": mean}
