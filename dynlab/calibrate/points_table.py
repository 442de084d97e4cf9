"""The ``points`` format of :mod:`dynlab.calibrate.formats`: a plain CSV (header row) or JSON list of
objects, one summary point a row, with the columns :data:`POINT_COLUMNS` (their units: that module's
docstring).
"""
from __future__ import annotations

import csv
import io
import json

from dynlab.calibrate.measured import _load_json, MeasuredPoint, _setting, _SUMMARY_KEYS
from dynlab.errors import InputError


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
