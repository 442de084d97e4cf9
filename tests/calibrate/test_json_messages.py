"""Truncated or broken JSON benchmark files: one line, FILE:LINE, the decoder's whole reason with its column, and
"not valid JSON" (not "not a benchmark result file") for a JSON file cut short before any format's keys."""
from __future__ import annotations

import json

import pytest

from dynlab.calibrate.formats import read_points
from dynlab.errors import InputError


def _error(path, **kw) -> str:
    with pytest.raises(InputError) as info:
        read_points(path, **kw)
    return str(info.value)


def test_unterminated_string_keeps_its_position(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text('{"model_id": "m",\n "median_ttft_ms": 1.0,\n  "backend": "vll')
    msg = _error(path)
    assert msg == f"{path}:3: not valid JSON: Unterminated string starting at column 14"
    assert "\n" not in msg


def test_expecting_value_names_its_column(tmp_path):
    path = tmp_path / "b.json"
    path.write_text('{"benchmarks": [\n')
    assert _error(path) == f"{path}:2: not valid JSON: Expecting value at column 1"


@pytest.mark.parametrize("text, line", [
    ('{"a": 1,\n "b": [1,2,', 2),
    ('{"a": 1,\n "b": "x', 2),
    ('{\n', 2),
])
def test_broken_json_is_not_called_an_unknown_format(tmp_path, text, line):
    path = tmp_path / "t.json"
    path.write_text(text)
    msg = _error(path)
    assert msg.startswith(f"{path}:{line}: not valid JSON: ")
    with pytest.raises(json.JSONDecodeError) as info:
        json.loads(text)
    assert info.value.msg in msg and f"column {info.value.colno}" in msg


def test_valid_json_of_no_format_is_still_an_unknown_format(tmp_path):
    path = tmp_path / "v.json"
    path.write_text('{"a": 1,\n "b": [1, 2]}\n')
    assert "not a benchmark result file dynlab reads" in _error(path)
    jsonl = tmp_path / "v.jsonl"
    jsonl.write_text('{"a": 1}\n{"b": 2}\n')  # JSON lines of no format: "Extra data" is no parse error of theirs
    assert "not a benchmark result file dynlab reads" in _error(jsonl)
