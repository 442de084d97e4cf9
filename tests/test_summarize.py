"""dynlab.labs.summarize and ``dynlab summarize {disagg,offload}``: medians, ratios, warnings, bad lines, atomic OUT."""
from __future__ import annotations

import json
import os
from importlib import resources

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dynlab.cli import main
from dynlab.errors import DynlabError, InputError
from dynlab.labs.summarize import summarize_disagg, summarize_offload

FIXTURES = resources.files("dynlab").joinpath("data", "fixtures")
KEEP = "previous content, must survive a failed run\n"


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def fixture_lines(name: str) -> list[str]:
    return FIXTURES.joinpath(name).read_text(encoding="utf-8").splitlines(keepends=True)


def d(mode, inp, conc, rep, ms):
    return json.dumps({"mode": mode, "input": inp, "conc": conc, "rep": rep, "ttft_p50_ms": ms}) + "\n"


def o(config, pas, doc, ms, total=None):
    return json.dumps({"config": config, "pass": pas, "doc": doc, "doc_tokens": 4864, "ttft_ms": ms,
                       "total_ms": ms + 200 if total is None else total}) + "\n"


# ---------------------------------------------------------------- disagg: the sample file (seed 000 step 7)


def test_disagg_fixture_hand_checked_cells():
    out = summarize_disagg(fixture_lines("disagg.jsonl"), "disagg.jsonl")
    assert list(out) == ["1500x1", "1500x4", "3000x1", "3000x4", "6000x1", "6000x4"]
    # 1500x1 agg: 21.22 22.29 [22.46] 22.65 22.86; disagg: 153.21 159.47 [161.38] 162.25 163.19
    assert out["1500x1"] == {"agg_ms": 22.5, "disagg_ms": 161.4, "ratio": round(161.38 / 22.46, 2)}
    assert out["1500x1"]["ratio"] == 7.19
    # 3000x1 holds the runaway repetition (2316.89): the median is still 261.26 (253.09 253.68 [261.26] 269.2 ...)
    assert out["3000x1"] == {"agg_ms": 44.2, "disagg_ms": 261.3, "ratio": 5.9}
    assert all(cell["ratio"] > 1 for cell in out.values())


def test_disagg_cli_file_to_file(tmp_path):
    src = FIXTURES.joinpath("disagg.jsonl")
    dst = tmp_path / "measured.json"
    result = run("summarize", "disagg", str(src), str(dst))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""
    assert json.loads(dst.read_text()) == summarize_disagg(fixture_lines("disagg.jsonl"))


def test_disagg_stdin_to_stdout():
    result = run("summarize", "disagg", "-", "-", input=d("agg", 100, 2, 0, 10.0) + "\n" + d("disagg", 100, 2, 0, 25.0))
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"100x2": {"agg_ms": 10.0, "disagg_ms": 25.0, "ratio": 2.5}}


# ---------------------------------------------------------------- disagg: medians and ratios


def test_disagg_odd_count_takes_the_middle():
    lines = [d("agg", 1, 1, r, v) for r, v in enumerate([3.0, 1.0, 100.0])]
    lines += [d("disagg", 1, 1, r, v) for r, v in enumerate([6.0, 2.0, 4.0])]
    assert summarize_disagg(lines)["1x1"] == {"agg_ms": 3.0, "disagg_ms": 4.0, "ratio": 1.33}


def test_disagg_even_count_averages_the_middle_two():
    lines = [d("agg", 1, 1, r, v) for r, v in enumerate([4.0, 1.0, 2.0, 100.0])]
    lines += [d("disagg", 1, 1, r, v) for r, v in enumerate([1.0, 2.0])]
    assert summarize_disagg(lines)["1x1"] == {"agg_ms": 3.0, "disagg_ms": 1.5, "ratio": 0.5}


def test_disagg_ratio_below_one_and_from_unrounded_medians():
    # the ratio uses the unrounded medians: 2.04 / 1.04 = 1.96, whereas the rounded 2.0 / 1.0 would give 2.0
    lines = [d("agg", 5, 1, 0, 1.04), d("disagg", 5, 1, 0, 2.04), d("agg", 6, 1, 0, 40.0), d("disagg", 6, 1, 0, 10.0)]
    out = summarize_disagg(lines)
    assert out["5x1"] == {"agg_ms": 1.0, "disagg_ms": 2.0, "ratio": 1.96}
    assert out["6x1"]["ratio"] == 0.25


def test_disagg_one_mode_cell_is_null_with_warning(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(d("agg", 1, 1, 0, 5.0) + d("disagg", 1, 1, 0, 10.0) + d("agg", 2, 8, 0, 7.0))
    warnings = []
    out = summarize_disagg(src.read_text().splitlines(), "in.jsonl", warn=warnings.append)
    assert out["2x8"] == {"agg_ms": 7.0, "disagg_ms": None, "ratio": None}
    assert out["1x1"]["ratio"] == 2.0
    assert len(warnings) == 1 and "2x8" in warnings[0] and "disagg" in warnings[0]
    result = run("summarize", "disagg", str(src), "-")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["2x8"]["disagg_ms"] is None
    assert result.stderr.startswith("Warning: ") and "2x8" in result.stderr


reps = st.lists(st.floats(min_value=1.0, max_value=5000.0).map(lambda x: round(x, 2)), min_size=3, max_size=12)


@given(reps, reps, st.data())
def test_median_ignores_one_repetition_times_nine(agg, dis, data):
    """With >= 3 repetitions, one repetition x9 cannot drag a cell's median outside the other values,
    and if it was the cell's largest value the median does not move at all."""
    mode = data.draw(st.sampled_from(["agg", "disagg"]))
    values = agg if mode == "agg" else dis
    i = data.draw(st.integers(0, len(values) - 1))

    def lines(vals_agg, vals_dis):
        return [d("agg", 7, 2, r, v) for r, v in enumerate(vals_agg)] + \
               [d("disagg", 7, 2, r, v) for r, v in enumerate(vals_dis)]

    runaway = list(values)
    runaway[i] = values[i] * 9
    clean = summarize_disagg(lines(agg, dis))["7x2"]
    noisy = summarize_disagg(lines(runaway, dis) if mode == "agg" else lines(agg, runaway))["7x2"]
    others = values[:i] + values[i + 1:]
    key = f"{mode}_ms"
    assert round(min(others), 1) <= noisy[key] <= round(max(others), 1)
    if values[i] == max(values):
        assert noisy == clean


# ---------------------------------------------------------------- offload (seed 002 step 8)


def test_offload_fixture():
    out = summarize_offload(fixture_lines("ttft.jsonl"), "ttft.jsonl")
    assert list(out) == ["baseline", "lmcache", "ratio"]
    assert list(out["ratio"]) == ["pass1-cold", "pass2-replay", "pass3-reverse"]
    assert all(out[c][p]["n"] == 10 for c in ("baseline", "lmcache") for p in out["ratio"])
    # pass3-reverse baseline: 29.3 29.4 29.4 30.4 566.9 | 569.9 570.0 578.9 584.6 588.8 -> (566.9+569.9)/2
    assert out["baseline"]["pass3-reverse"]["p50_ms"] == 568.4
    # lmcache: 30.0 30.3 30.4 31.1 46.0 | 46.8 47.3 47.5 48.4 50.2 -> 46.4; 568.4 / 46.4 = 12.25
    assert out["lmcache"]["pass3-reverse"]["p50_ms"] == 46.4
    assert out["ratio"]["pass3-reverse"]["p50"] == 12.25
    assert out["ratio"]["pass1-cold"]["p50"] < 1 < out["ratio"]["pass2-replay"]["p50"]


def test_offload_exact_small_input_ratios_above_and_below_one():
    lines = [o("baseline", "warm", 0, 100.0), o("baseline", "warm", 1, 300.0), o("baseline", "warm", 2, 50.0),
             o("lmcache", "warm", 0, 40.0), o("lmcache", "warm", 1, 20.0),
             o("baseline", "cold", 0, 30.0), o("lmcache", "cold", 0, 60.0)]
    out = summarize_offload(lines)
    assert out["baseline"]["warm"] == {"n": 3, "p50_ms": 100.0, "mean_ms": 150.0}
    assert out["lmcache"]["warm"] == {"n": 2, "p50_ms": 30.0, "mean_ms": 30.0}
    assert out["ratio"]["warm"] == {"p50": 3.33, "mean": 5.0}
    assert out["ratio"]["cold"] == {"p50": 0.5, "mean": 0.5}
    assert list(out["ratio"]) == ["warm", "cold"]


def test_offload_pass_order_is_first_appearance():
    lines = [o("lmcache", "zeta", 0, 1.0), o("baseline", "alpha", 0, 1.0), o("baseline", "zeta", 0, 2.0),
             o("lmcache", "alpha", 0, 4.0), o("other", "middle", 0, 4.0)]
    out = summarize_offload(lines)
    assert list(out["baseline"]) == list(out["lmcache"]) == list(out["ratio"]) == ["zeta", "alpha"]


def test_offload_base_cand_rename_and_skip_warning(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(o("baseline", "p", 0, 9.0) + o("fast", "p", 0, 3.0) + o("slow", "p", 0, 12.0)
                   + o("fast", "p", 1, 5.0))
    result = run("summarize", "offload", "--base", "slow", "--cand", "fast", str(src), "-")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert list(out) == ["slow", "fast", "ratio"]
    assert out["fast"]["p"] == {"n": 2, "p50_ms": 4.0, "mean_ms": 4.0}
    assert out["ratio"]["p"] == {"p50": 3.0, "mean": 3.0}
    assert result.stderr.startswith("Warning: ") and "'baseline'" in result.stderr


def test_offload_pass_with_one_configuration_is_null_with_warning():
    warnings = []
    out = summarize_offload([o("baseline", "a", 0, 2.0), o("lmcache", "a", 0, 1.0), o("baseline", "b", 0, 5.0)],
                            warn=warnings.append)
    assert out["lmcache"]["b"] is None and out["ratio"]["b"] is None
    assert out["baseline"]["b"] == {"n": 1, "p50_ms": 5.0, "mean_ms": 5.0}
    assert len(warnings) == 1 and "'b'" in warnings[0]


def test_offload_absent_configuration_is_an_error(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(o("baseline", "p", 0, 9.0) + o("lmcache", "p", 0, 3.0))
    with pytest.raises(DynlabError, match="'lmcach'.*'baseline', 'lmcache'"):
        summarize_offload(src.read_text().splitlines(), cand="lmcach")
    out = tmp_path / "out.json"
    out.write_text(KEEP)
    result = run("summarize", "offload", "--cand", "lmcach", str(src), str(out))
    assert result.exit_code == 1 and "lmcach" in result.stderr
    assert out.read_text() == KEEP


@pytest.mark.parametrize("args", [["--base", "x", "--cand", "x"], ["--base", "ratio"], ["--cand", "ratio"]])
def test_offload_bad_names_are_usage_errors(args):
    result = run("summarize", "offload", *args, str(FIXTURES.joinpath("ttft.jsonl")), "-")
    assert result.exit_code == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr


def test_offload_library_rejects_bad_names():
    with pytest.raises(ValueError):
        summarize_offload([o("a", "p", 0, 1.0)], base="a", cand="a")
    with pytest.raises(ValueError):
        summarize_offload([o("a", "p", 0, 1.0)], base="ratio", cand="a")


# ---------------------------------------------------------------- malformed input: line numbers, OUT untouched

GOOD_D = d("agg", 1, 1, 0, 5.0)
GOOD_O = o("baseline", "p", 0, 5.0)

DISAGG_BAD = [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('"agg"', "expected a JSON object"),
    ('{"mode": "agg", "input": 1, "conc": 1, "rep": 0}', "missing field 'ttft_p50_ms'"),
    ('{"input": 1, "conc": 1, "rep": 0, "ttft_p50_ms": 5}', "missing field 'mode'"),
    ('{"mode": "agg", "conc": 1, "rep": 0, "ttft_p50_ms": 5}', "missing field 'input'"),
    ('{"mode": "agg", "input": 1, "rep": 0, "ttft_p50_ms": 5}', "missing field 'conc'"),
    ('{"mode": "agg", "input": 1, "conc": 1, "ttft_p50_ms": 5}', "missing field 'rep'"),
    ('{"mode": "agg", "input": 1, "conc": 1, "rep": 0, "ttft_p50_ms": "5"}', "'ttft_p50_ms' must be a number"),
    ('{"mode": "agg", "input": 1, "conc": 1, "rep": 0, "ttft_p50_ms": true}', "'ttft_p50_ms' must be a number"),
    ('{"mode": "agg", "input": 1, "conc": 1, "rep": 0, "ttft_p50_ms": null}', "'ttft_p50_ms' must be a number"),
    ('{"mode": "agg", "input": 1, "conc": 1, "rep": 0, "ttft_p50_ms": NaN}', "'ttft_p50_ms' must be a finite"),
    ('{"mode": "agg", "input": 1, "conc": 1, "rep": 0, "ttft_p50_ms": -1}', "'ttft_p50_ms' must not be negative"),
    ('{"mode": "agg", "input": "1", "conc": 1, "rep": 0, "ttft_p50_ms": 5}', "'input' must be a number"),
    ('{"mode": "agg", "input": 1, "conc": false, "rep": 0, "ttft_p50_ms": 5}', "'conc' must be a number"),
    ('{"mode": "agg", "input": 1.5, "conc": 1, "rep": 0, "ttft_p50_ms": 5}', "'input' must be a whole number"),
    ('{"mode": "agg", "input": 1, "conc": 1, "rep": [0], "ttft_p50_ms": 5}', "'rep' must be a number"),
    ('{"mode": "both", "input": 1, "conc": 1, "rep": 0, "ttft_p50_ms": 5}', "'mode' must be \"agg\" or \"disagg\""),
    ('{"mode": 1, "input": 1, "conc": 1, "rep": 0, "ttft_p50_ms": 5}', "'mode' must be a non-empty string"),
]

OFFLOAD_BAD = [
    ("{not json", "not JSON"),
    ("3", "expected a JSON object"),
    *[(json.dumps({k: v for k, v in json.loads(GOOD_O).items() if k != field}), f"missing field '{field}'")
      for field in ("config", "pass", "doc", "doc_tokens", "ttft_ms", "total_ms")],
    (GOOD_O.replace('"ttft_ms": 5.0', '"ttft_ms": "5.0"'), "'ttft_ms' must be a number"),
    (GOOD_O.replace('"ttft_ms": 5.0', '"ttft_ms": true'), "'ttft_ms' must be a number"),
    (GOOD_O.replace('"total_ms": 205.0', '"total_ms": null'), "'total_ms' must be a number"),
    (GOOD_O.replace('"doc_tokens": 4864', '"doc_tokens": "4864"'), "'doc_tokens' must be a number"),
    (GOOD_O.replace('"doc": 0', '"doc": false'), "'doc' must be a number"),
    (GOOD_O.replace('"pass": "p"', '"pass": 3'), "'pass' must be a non-empty string"),
    (GOOD_O.replace('"config": "baseline"', '"config": ""'), "'config' must be a non-empty string"),
]


def _check_bad(tmp_path, command, good, bad, needle):
    src = tmp_path / "in.jsonl"
    # good line 1, blank line 2, good line 3, bad line 4, good line 5: the number counts blank lines
    src.write_text(good + "\n" + good + bad.rstrip("\n") + "\n" + good)
    dst = tmp_path / "out.json"
    dst.write_text(KEEP)
    before = sorted(os.listdir(tmp_path))
    result = run("summarize", command, str(src), str(dst))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"Error: {src}:4: ")
    assert needle in result.stderr
    assert dst.read_text() == KEEP
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file left behind


@pytest.mark.parametrize("bad, needle", DISAGG_BAD)
def test_disagg_bad_line(tmp_path, bad, needle):
    _check_bad(tmp_path, "disagg", GOOD_D, bad, needle)


@pytest.mark.parametrize("bad, needle", OFFLOAD_BAD)
def test_offload_bad_line(tmp_path, bad, needle):
    _check_bad(tmp_path, "offload", GOOD_O, bad, needle)


@pytest.mark.parametrize("command, good", [("disagg", GOOD_D), ("offload", GOOD_O)])
def test_bad_line_on_stdin_is_named(command, good):
    result = run("summarize", command, "-", "-", input=good + "{oops\n")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: <stdin>:2: not JSON")


@pytest.mark.parametrize("command", ["disagg", "offload"])
@pytest.mark.parametrize("content", ["", "\n\n   \n"])
def test_empty_input_is_an_error(tmp_path, command, content):
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    dst = tmp_path / "out.json"
    dst.write_text(KEEP)
    result = run("summarize", command, str(src), str(dst))
    assert result.exit_code == 1
    assert "empty input" in result.stderr
    assert dst.read_text() == KEEP


def test_non_utf8_line_is_named(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(GOOD_D.encode() + b'{"mode": "\xff"}\n')
    result = run("summarize", "disagg", str(src), "-")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {src}:2: not UTF-8")


def test_missing_input_file_is_a_usage_error(tmp_path):
    result = run("summarize", "disagg", str(tmp_path / "nope.jsonl"), "-")
    assert result.exit_code == 2
    assert "nope.jsonl" in result.stderr


def test_successful_run_replaces_out(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(GOOD_D + d("disagg", 1, 1, 0, 15.0))
    dst = tmp_path / "out.json"
    dst.write_text(KEEP)
    assert run("summarize", "disagg", str(src), str(dst)).exit_code == 0
    assert json.loads(dst.read_text()) == {"1x1": {"agg_ms": 5.0, "disagg_ms": 15.0, "ratio": 3.0}}


def test_library_input_error_carries_path_and_line():
    with pytest.raises(InputError) as info:
        summarize_disagg(["\n", GOOD_D, "{}\n"], "m.jsonl")
    assert (info.value.path, info.value.line) == ("m.jsonl", 3)
    assert str(info.value) == "m.jsonl:3: missing field 'mode'"


# ---------------------------------------------------------------- a measured TTFT of 0 (issue 13)


def test_disagg_zero_ttft_is_flagged_with_a_key_and_a_warning():
    # cell 1x1: agg 0 and 4 (median 2.0), disagg 6 (median 6.0, ratio 6/2 = 3.0); one line (line 1) is 0 ms
    lines = [d("agg", 1, 1, 0, 0), d("agg", 1, 1, 1, 4.0), d("disagg", 1, 1, 0, 6.0), d("agg", 2, 1, 0, 5.0),
             d("disagg", 2, 1, 0, 5.0)]
    warnings = []
    out = summarize_disagg(lines, "in.jsonl", warn=warnings.append)
    assert out == {"1x1": {"agg_ms": 2.0, "disagg_ms": 6.0, "ratio": 3.0, "zero_ttft_lines": 1},
                   "2x1": {"agg_ms": 5.0, "disagg_ms": 5.0, "ratio": 1.0}}
    assert warnings == ["in.jsonl: cell 1x1: 1 line reports a TTFT of 0 ms, which is not a measurement "
                        "(first at line 1); its statistics include them (zero_ttft_lines: 1)"]


def test_offload_zero_ttft_is_flagged_per_pass(tmp_path):
    # lmcache pass "warm": 0, 0, 3 -> n 3, median 0.0, mean 1.0; lines 2 and 4 are 0 ms
    src = tmp_path / "in.jsonl"
    src.write_text(o("baseline", "warm", 0, 6.0) + o("lmcache", "warm", 0, 0) + o("lmcache", "warm", 1, 3.0)
                   + o("lmcache", "warm", 2, 0))
    result = run("summarize", "offload", str(src), "-")
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert out["lmcache"]["warm"] == {"n": 3, "p50_ms": 0.0, "mean_ms": 1.0, "zero_ttft_lines": 2}
    assert "zero_ttft_lines" not in out["baseline"]["warm"]
    assert f"{src}: configuration 'lmcache' pass 'warm': 2 lines report a TTFT of 0 ms" in result.stderr
    assert "first at line 2" in result.stderr


def test_no_zero_no_key():
    out = summarize_offload(fixture_lines("ttft.jsonl"), "ttft.jsonl")
    assert "zero_ttft_lines" not in json.dumps(out)
    assert "zero_ttft_lines" not in json.dumps(summarize_disagg(fixture_lines("disagg.jsonl")))
