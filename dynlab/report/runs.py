"""The inputs of a report: runs (what ``sim``, ``compare`` and ``sweep`` print) and per-request records.

A :class:`Run` is one simulation's result dict (exactly what ``dynlab sim`` prints) with a label and,
for a sweep cell, the cell's options. :func:`runs_from_json` recognises the three outputs:

- ``sim``: one JSON object with ``requests`` (and ``mode``): one run, labelled by its strategy;
- ``compare --format json``: an object of such objects, keyed by the compared value: one run per key;
- ``sweep`` (``--out`` or stdout): JSON lines ``{"cell": {...}, "result": {...}}``: one run per cell.

A per-request record is one line of ``sim --requests-out`` (issue 24): ``id``, ``worker``,
``arrival_ms``, ``first_scheduled_ms``, ``first_token_ms``, ``finish_ms``, ``input_length``,
``output_length`` (tokens), ``hit_tokens``, ``preemptions``, ``rejected``; a P/D run adds
``prefill_worker``, ``decode_worker``, ``transfer_start_ms``, ``transfer_end_ms``. Times are ms from
the start of the run; a rejected request's times may be ``null``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from dynlab.errors import DynlabError, InputFileError

#: the keys every per-request record must have (``sim --requests-out``)
RECORD_KEYS = ("id", "worker", "arrival_ms", "first_scheduled_ms", "first_token_ms", "finish_ms",
               "input_length", "output_length", "hit_tokens", "preemptions", "rejected")
#: the keys a P/D run's records add
PD_KEYS = ("prefill_worker", "decode_worker", "transfer_start_ms", "transfer_end_ms")
#: a controller run's over-time keys (``dynlab.engine.scaling_metrics``, ``dynlab.engine.elastic``): each a list of
#: ``[s, number]`` pairs, numbers >= 0 (live workers, a whole number; goodput; mean requests waiting), drawn by
#: ``dynlab.report.scaling_figures``; the value is what the messages call it
OVER_TIME_KEYS = {"workers_over_time": "live workers", "goodput_over_time": "goodput",
                  "queue_over_time": "mean requests waiting"}


@dataclass
class Run:
    """One simulation: ``label`` (a strategy, a compared value or a sweep cell), ``result`` (what
    ``dynlab sim`` prints), ``cell`` (a sweep cell's options, else ``None``), ``source`` (the file)."""

    label: str
    result: dict
    cell: Optional[dict] = None
    source: Optional[str] = None
    extra: dict = field(default_factory=dict)


def _is_result(obj: Any) -> bool:
    return isinstance(obj, Mapping) and "requests" in obj and isinstance(obj.get("requests"), int)


def cell_label(cell: Mapping[str, Any]) -> str:
    """``mode=rr workers=2``: a sweep cell's options as one label."""
    return " ".join(f"{k}={v}" for k, v in cell.items())


def runs_from_json(obj: Any, source: str = "<runs>") -> list[Run]:
    """The runs of one parsed ``sim`` or ``compare`` output (see the module docstring).

    Raises :class:`DynlabError` (``SOURCE: what is wrong``) for anything else."""
    if _is_result(obj):
        return [Run(str(obj.get("mode", source)), dict(obj), source=source)]
    # a sweep line before a compare output: a cell with a ``requests`` option (a closed-loop sweep's
    # --requests N) is itself an object with an integer ``requests``, so the line would read as a compare
    # of two runs named "cell" and "result"
    if isinstance(obj, Mapping) and {"cell", "result"} <= set(obj) and isinstance(obj["cell"], Mapping) \
            and _is_result(obj["result"]):
        return [Run(cell_label(obj["cell"]), dict(obj["result"]), cell=dict(obj["cell"]), source=source)]
    if isinstance(obj, Mapping) and obj and all(_is_result(v) for v in obj.values()):
        return [Run(str(k), dict(v), source=source) for k, v in obj.items()]
    raise DynlabError(f"{source}: not a sim, compare or sweep output (expected an object with 'requests', "
                      "an object of them, or JSON lines of {\"cell\", \"result\"})")


def _parse_json(text: str, source: str, line: int = 1) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DynlabError(f"{source}:{line + exc.lineno - 1}: not JSON: {exc.msg}") from None


def read_runs(path: str) -> list[Run]:
    """The runs in the file ``path``: one JSON document (``sim``, ``compare``) or JSON lines (``sweep``).

    Raises :class:`DynlabError` with ``FILE:LINE`` for a line that is not JSON or not a run."""
    text = _read_text(path)
    if not text.strip():
        raise DynlabError(f"{path}: empty file")
    try:
        return check_over_time(runs_from_json(json.loads(text), path), path)
    except json.JSONDecodeError as exc:
        whole = exc  # several documents (JSON lines), or one document with an error
    first = next(line for line in text.splitlines() if line.strip())
    try:
        json.loads(first)
    except json.JSONDecodeError:  # not JSON lines either: say where the document goes wrong
        raise DynlabError(f"{path}:{whole.lineno}: not JSON: {whole.msg}") from None
    runs: list[Run] = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                found = runs_from_json(_parse_json(line, path, n), path)
            except DynlabError as exc:
                if str(exc).startswith(f"{path}:{n}"):
                    raise
                raise DynlabError(f"{path}:{n}: not a sim, compare or sweep output") from None
            runs += check_over_time(found, f"{path}:{n}")
    return runs


def check_over_time(runs: list[Run], where: str) -> list[Run]:
    """``runs`` when each result's :data:`OVER_TIME_KEYS` (absent or ``null`` allowed) is a list of ``[s, number]``
    pairs of finite numbers >= 0, the live workers of ``workers_over_time`` whole (``2.0`` is 2); raises
    :class:`DynlabError` naming ``where`` (the file, ``FILE:LINE`` for a sweep's line), the run and the key, since
    a result file is the user's input: ``[[0, -1]]`` workers would draw a fleet below zero."""
    for run in runs:
        for key, what in OVER_TIME_KEYS.items():
            points = run.result.get(key)
            if points is None:
                continue
            whole = key == "workers_over_time"
            bad = [points] if not isinstance(points, list) else [p for p in points if not _pair(p, whole)][:1]
            if bad:
                rule = ", the workers whole" if whole else ""
                raise DynlabError(f"{where}: run {run.label!r}: {key} must be a list of [s, {what}] pairs, numbers "
                                  f">= 0{rule}, got {_short(bad[0])}")
    return runs


def _pair(p: Any, whole: bool) -> bool:
    """``[s, value]``: two finite numbers >= 0, the value a whole number when ``whole``."""
    return (isinstance(p, list) and len(p) == 2 and all(_number(v) and v >= 0 for v in p)
            and (not whole or float(p[1]).is_integer()))


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except UnicodeDecodeError:
        raise DynlabError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise InputFileError(path, exc.strerror or str(exc)) from None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_record(rec: Any, where: str) -> dict:
    """``rec`` when it is a per-request record (the keys above; times finite numbers or ``null``);
    raises :class:`DynlabError` naming ``where`` (``FILE:LINE``) and the first problem."""
    if not isinstance(rec, dict):
        raise DynlabError(f"{where}: a record must be a JSON object")
    missing = [k for k in RECORD_KEYS if k not in rec]
    if missing:
        raise DynlabError(f"{where}: missing key(s) {', '.join(missing)}")
    for k, v in rec.items():
        if k.endswith("_ms") and v is not None and not _number(v):
            raise DynlabError(f"{where}: {k} must be a finite number of ms or null, got {v!r}")
    for k in ("input_length", "output_length", "hit_tokens", "preemptions"):
        if not isinstance(rec[k], int) or isinstance(rec[k], bool) or rec[k] < 0:
            raise DynlabError(f"{where}: {k} must be an integer >= 0, got {rec[k]!r}")
    if not isinstance(rec["rejected"], bool):
        raise DynlabError(f"{where}: rejected must be true or false, got {rec['rejected']!r}")
    return rec


def read_records(path: str) -> list[dict]:
    """The per-request records of a ``sim --requests-out`` file (JSON lines, see the module docstring).

    Raises :class:`DynlabError` ``FILE:LINE: what is wrong`` for a bad line, or for a file without any."""
    records = []
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if line.strip():
            records.append(check_record(_parse_json(line, path, n), f"{path}:{n}"))
    if not records:
        raise DynlabError(f"{path}: no records")
    return records


def shared_and_varied(cells: list[Mapping[str, Any]]) -> tuple[dict, list[str]]:
    """``(shared, varied)`` of sweep cells: the options with one value in every cell (name -> value), and
    the names of those that differ, in the order the cells name them."""
    names = list(dict.fromkeys(k for c in cells for k in c))
    varied = [n for n in names if len({repr(c.get(n)) for c in cells}) > 1 or any(n not in c for c in cells)]
    return {n: cells[0][n] for n in names if n not in varied}, varied


def short_labels(runs: list[Run]) -> list[Run]:
    """The runs, each sweep cell labelled by the options that vary between the cells (``mode=rr workers=4``
    rather than with the trace every cell shares); other runs as they are."""
    from dataclasses import replace

    cells = [r.cell for r in runs if r.cell is not None]
    if len(cells) < 2:
        return list(runs)
    _, varied = shared_and_varied(cells)
    return [replace(r, label=cell_label({k: r.cell[k] for k in varied if k in r.cell}) or r.label)
            if r.cell is not None else r for r in runs]
