"""Traces that are inconsistent are refused with FILE:LINE (issue 13, part 4).

Every expected line number below is the 1-based line of the first offending row in the hand-written file.
"""
from __future__ import annotations

import gzip
import json
import math
from importlib import resources

import pytest

from helpers import invoke

from dynlab.errors import InputError
from dynlab.traces.reader import BUILTIN_TRACES, load_trace


def _write(tmp_path, text: str | bytes, name: str = "t.jsonl"):
    path = tmp_path / name
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    return str(path)


def _row(ts, n, ids, **extra):
    row = {"input_length": n, "output_length": 1, "hash_ids": ids, **extra}
    if ts is not None:
        row["timestamp"] = ts
    return json.dumps(row)


@pytest.mark.parametrize("lines, line, words", [
    # [5, 5]: the second id repeats the first, on row 1
    ([_row(0, 600, [5, 5])], 1, "hash_ids[1] repeats hash_ids[0]"),
    # 200 tokens need ceil(200/512) = 1 block, the row names 4 (the 64-token example)
    ([_row(0, 200, [1, 2, 3, 4])], 1, "ceil(200/512) = 1"),
    # 1025 tokens need ceil(1025/512) = 3 blocks; row 2 names 2
    ([_row(0, 512, [1]), _row(1, 1025, [1, 2])], 2, "ceil(1025/512) = 3"),
    # row 3 is stamped 5 ms after a row stamped 10 ms
    ([_row(0, 512, [1]), _row(10, 512, [2]), _row(5, 512, [3])], 3, "earlier than the previous"),
    # row 2 has no timestamp, row 1 has one
    ([_row(0, 512, [1]), _row(None, 512, [2])], 2, "has no timestamp"),
    # row 2 has a timestamp, row 1 has none
    ([_row(None, 512, [1]), _row(3, 512, [2])], 2, "has a timestamp but the first has none"),
    # row 2 names no block: a request with no prompt (input_length 0 needs ceil(0/512) = 0 ids)
    ([_row(0, 512, [1]), _row(1, 0, [])], 2, "hash_ids is empty: a request needs a prompt"),
    (['{"hash_ids": []}'], 1, "hash_ids is empty"),
    # token rows: row 2 has no prompt token
    (['{"tokens": [1, 2, 3]}', '{"tokens": []}'], 2, "field 'tokens' is empty: a request needs a prompt"),
])
def test_inconsistent_rows_are_refused_with_file_and_line(tmp_path, lines, line, words):
    path = _write(tmp_path, "\n".join(lines) + "\n")
    result = invoke("sim", "--trace", path)
    assert result.exit_code == 1
    (message,) = result.stderr.splitlines()
    assert message.startswith(f"Error: {path}:{line}: ")
    assert words in message
    with pytest.raises(InputError) as info:
        load_trace(path)
    assert info.value.line == line


def test_equal_timestamps_are_in_order(tmp_path):
    # non-decreasing is time order: two rows at 0 ms are fine
    path = _write(tmp_path, _row(0, 512, [1]) + "\n" + _row(0, 512, [1]) + "\n")
    assert len(load_trace(path)) == 2


def test_a_row_without_input_length_is_not_checked_against_it(tmp_path):
    # the length rule needs input_length; a row without it keeps its ids as given
    path = _write(tmp_path, '{"hash_ids": [1, 2]}\n{"hash_ids": [1, 3]}\n')
    assert [r.hashes for r in load_trace(path)] == [(1, 2), (1, 3)]


@pytest.mark.parametrize("gz", [False, True])
def test_a_non_utf8_line_is_reported_with_its_line(tmp_path, gz):
    # row 2 holds the byte 0xff, which no UTF-8 text contains
    data = (_row(0, 512, [1]) + "\n").encode() + b'{"hash_ids": [1], "x": "\xff"}\n'
    path = _write(tmp_path, gzip.compress(data) if gz else data, "t.jsonl.gz" if gz else "t.jsonl")
    result = invoke("sim", "--trace", path)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {path}:2: not UTF-8 text\n"


def test_blank_lines_and_leading_whitespace_are_read_past(tmp_path):
    # line 2 is empty, line 3 starts with a tab, line 4 is only spaces: the requests of lines 1, 3 and 5
    text = "\n".join([_row(0, 512, [1]), "", "\t" + _row(1, 512, [2]), "   ", _row(2, 512, [3])]) + "\n"
    assert [r.timestamp for r in load_trace(_write(tmp_path, text))] == [0, 1, 2]


@pytest.mark.parametrize("bad, words", [
    # two JSON values on one line: json names the extra data after the first
    ('{"hash_ids": [1]} {"hash_ids": [2]}', "not JSON: Extra data"),
    # a key without quotes
    ("{hash_ids: [1]}", "not JSON: Expecting property name enclosed in double quotes"),
    # 100000 nested lists: deeper than Python's JSON decoder recurses
    ("[" * 100000 + "]" * 100000, "not JSON a request can be: nested too deeply"),
])
def test_a_later_line_that_is_not_one_json_value_is_refused_with_its_line(tmp_path, bad, words):
    path = _write(tmp_path, _row(0, 512, [1]) + "\n\n" + bad + "\n")  # the bad line is line 3
    with pytest.raises(InputError) as err:
        load_trace(path)
    assert (err.value.line, err.value.message.split(":")[0]) == (3, words.split(":")[0])
    assert err.value.message.startswith(words)


def test_the_bundled_trace_obeys_the_rules():
    # the rules were set by this data: no repeated id, len(hash_ids) == ceil(input_length / 512), time order
    resource, total = BUILTIN_TRACES["mooncake-conversation"]
    with resources.files("dynlab").joinpath("data", resource).open("rb") as raw, gzip.open(raw, "rt") as fh:
        rows = [json.loads(line) for line in fh]
    assert len(rows) == total
    for r in rows:
        assert len(set(r["hash_ids"])) == len(r["hash_ids"])
        assert len(r["hash_ids"]) == math.ceil(r["input_length"] / 512)
    assert all(a["timestamp"] <= b["timestamp"] for a, b in zip(rows, rows[1:]))
    assert len(load_trace("mooncake-conversation")) == total


@pytest.mark.parametrize("command", [["sim"], ["compare"], ["sweep"]])
def test_help_says_out_of_order_traces_are_refused(command):
    text = " ".join(invoke(*command, "--help").output.split())
    assert "timestamps go backwards" in text and "refused with FILE:LINE" in text
    for name in BUILTIN_TRACES:
        assert name in text


def _lengths(inp, out):
    # one Mooncake row of 3 hash_ids; 1200 tokens need ceil(1200/512) = 3 ids, so only the lengths can be wrong
    return f'{{"timestamp": 0, "input_length": {inp}, "output_length": {out}, "hash_ids": [1, 2, 3]}}\n'


@pytest.mark.parametrize("row, words", [
    # the trial's rows: JSON 1200.0 and 100.5 are floats, not token counts (both give ceil(x/512) = 3 or 1 ids)
    (_lengths("1200.0", 4), "field 'input_length' must be an integer, got 1200.0"),
    (_lengths("1200", "4.5"), "field 'output_length' must be an integer, got 4.5"),
    (_lengths("1200", "1e308"), "field 'output_length' must be an integer, got 1e+308"),
    # a bool is not a count, though Python's True == 1
    (_lengths("1200", "true"), "field 'output_length' must be an integer, got True"),
    (_lengths("1200", "-1"), "field 'output_length' must be >= 0, got -1"),
    # an explicit input_length 0 is a request with no prompt
    ('{"input_length": 0, "output_length": 1, "hash_ids": [1]}\n', "field 'input_length' must be >= 1, got 0"),
    ('{"tokens": [1, 2], "output_length": 2.0}\n', "field 'output_length' must be an integer, got 2.0"),
    # 1e308 ms is past the clock's horizon of 10^12 ms: the row is wrong whatever --time-scale is
    ('{"timestamp": 1e308, "input_length": 1200, "hash_ids": [1, 2, 3]}\n',
     "timestamp 1e+308 ms is past the simulated clock's horizon (1e+12 ms, 31.7 years)"),
])
@pytest.mark.parametrize("timing", [[], ["--timing"]])
def test_token_counts_and_timestamps_out_of_range_are_refused_with_file_and_line(tmp_path, row, words, timing):
    path = _write(tmp_path, row)
    result = invoke("sim", "--trace", path, "--workers", "1", *timing)
    assert (result.exit_code, result.stderr) == (1, f"Error: {path}:1: {words}\n")


def test_a_timed_run_of_a_bad_length_writes_nothing(tmp_path):
    # the trial's sweep left an empty --out behind after a traceback; the trace is read before any cell runs
    path = _write(tmp_path, _lengths("1200.0", 4))
    out = tmp_path / "s.jsonl"
    result = invoke("sweep", "--trace", path, "--workers", "1", "--timing", "--grid", "cpu-capacity=0,10",
                    "--out", str(out))
    assert (result.exit_code, result.stderr) == (
        1, f"Error: {path}:1: field 'input_length' must be an integer, got 1200.0\n")
    assert not out.exists()


def test_output_length_zero_or_absent_means_unknown_and_runs_as_one_token(tmp_path):
    # 0 is kept (the synthetic workload's and an absent field's value): the timed engine generates one token,
    # so each run is the same one-step run (the step that prefills the prompt emits its only token) whether
    # the row says 0, 1 or nothing
    rows = [_lengths(1200, 0), _lengths(1200, 1), '{"timestamp": 0, "input_length": 1200, "hash_ids": [1, 2, 3]}\n']
    outs = []
    for i, row in enumerate(rows):
        path = _write(tmp_path, row, f"t{i}.jsonl")
        assert [r.output_length for r in load_trace(path)] == [[0, 1, 0][i]]
        result = invoke("sim", "--trace", path, "--workers", "1", "--timing")
        assert result.exit_code == 0, result.output
        outs.append(json.loads(result.stdout))
    assert outs[0]["engine_steps"] == 1
    assert outs[0] == outs[1] == outs[2]


def test_a_truncated_gzip_trace_is_one_line(tmp_path):
    # 3,000 rows compressed, the last 20 bytes cut (the gzip trailer and some data): the reader (behind its
    # 64 KiB line buffer) says it cannot read the file, in one line, and the run fails
    data = "".join(_row(i, 512, [i]) + "\n" for i in range(3000)).encode()
    path = _write(tmp_path, gzip.compress(data)[:-20], "t.jsonl.gz")
    result = invoke("sim", "--trace", path)
    assert result.exit_code == 1
    (message,) = result.stderr.splitlines()
    assert message.startswith(f"Error: {path}: cannot read: ")


@pytest.mark.parametrize("hash_ids, words", [
    ('[1, "2"]', "hash_ids[1] must be an int, got '2'"),
    ('[1, 2.0]', "hash_ids[1] must be an int, got 2.0"),
    ('"12"', "field 'hash_ids' must be a list of ints"),
    ('null', "field 'hash_ids' must be a list of ints"),
])
def test_bad_hash_ids_on_a_later_row_are_refused_with_its_line(tmp_path, hash_ids, words):
    # the Mooncake parser checks a list of ints inline and falls back to the full check: the same messages
    path = _write(tmp_path, _row(0, 512, [1]) + "\n" + f'{{"hash_ids": {hash_ids}}}\n')
    result = invoke("sim", "--trace", path)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {path}:2: {words}\n"
    path = _write(tmp_path, _row(0, 512, [1]) + '\n{"input_length": 512}\n', "missing.jsonl")
    assert invoke("sim", "--trace", path).stderr == f"Error: {path}:2: missing field 'hash_ids'\n"


# -- fields a streamed format does not read: one warning naming the field and the line ----------------

@pytest.mark.parametrize("rows, fmt, extra", [
    # a typo: output_lenght for output_length (the run goes on with output_length 0, unknown)
    ([{"timestamp": 0, "input_length": 100, "output_lenght": 5, "hash_ids": [1]}], "mooncake", "output_lenght"),
    # a field Mooncake rows do not carry: the tokens format's reply ids
    ([{"input_length": 100, "hash_ids": [1], "output_tokens": [4, 5]}], "mooncake", "output_tokens"),
    ([{"tokens": [1, 2, 3], "output_tokns": [4]}], "tokens", "output_tokns"),
])
def test_a_field_the_format_does_not_read_is_warned_once_with_its_line(tmp_path, rows, fmt, extra):
    path = _write(tmp_path, "\n" + "".join(json.dumps(r) + "\n" for r in rows * 3))  # first record on line 2
    res = invoke("sim", "--trace", path, "--quiet")
    assert res.exit_code == 0, res.stderr
    (line,) = [x for x in res.stderr.splitlines() if "not used by dynlab" in x]
    assert line.startswith(f"Warning: {path}:2: {fmt} fields not used by dynlab: {extra} (the format reads ")
    assert json.loads(res.stdout)["requests"] == 3


def test_known_fields_warn_nothing(tmp_path):
    from dynlab.traces.reader import TraceWarning
    import warnings

    rows = [{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1], "lora_name": "a",
             "cache_salt": "s"}, {"tokens": [1, 2], "timestamp": 1, "output_length": 1, "output_tokens": [3],
                                  "lora_name": "a", "cache_salt": "s"}]
    for i, row in enumerate(rows):
        with warnings.catch_warnings():
            warnings.simplefilter("error", TraceWarning)
            load_trace(_write(tmp_path, json.dumps(row) + "\n", f"{i}.jsonl"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        load_trace("mooncake-conversation")
