"""Outputs in every command: one rule for ``-``, no special file written (or blocked on), no success
line before an error, and errors that name the path the user gave.

The rule for ``-``: standard output where the output is a stream of text (``sweep --out``/``--csv``,
``summarize ... OUT``), refused with one line where it is not (plots, ``reproduce``'s folder).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dynlab.cli import sweep as sweep_cli
from dynlab.errors import DynlabError
from helpers import invoke, lines_of, ok

FIXTURES = Path(__file__).resolve().parent.parent / "dynlab" / "data" / "fixtures"
GRID = ["sweep", "--grid", "mode=rr,kv", "--executor", "serial"]


def _refused(result, *words):
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    return result


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


# ---------------------------------------------------------------- special files


@pytest.mark.parametrize("args", [
    ["--out", "{x}"],
    ["--out", "{tmp}/ok.jsonl", "--csv", "{x}"],
    ["--out", "{tmp}/ok.jsonl", "--plot", "{x}"],
])
@pytest.mark.parametrize("special", ["/dev/full", "fifo"])
def test_sweep_refuses_a_device_or_a_fifo_up_front(tmp_path, fifo, args, special):
    x = str(fifo) if special == "fifo" else special
    args = [a.format(x=x, tmp=tmp_path) for a in args]
    r = _refused(invoke(*GRID, *args), x, "not a regular file", "a FIFO" if special == "fifo" else "a character device")
    assert r.stdout == "" and "sweep:" not in r.stderr  # no success line
    assert not (tmp_path / "ok.jsonl").exists()


def test_compare_latency_and_summarize_refuse_a_fifo(fifo):
    _refused(invoke("compare", "--modes", "rr,kv", "--plot", fifo), "a FIFO")
    _refused(invoke("latency", "--plot", fifo), "a FIFO")
    _refused(invoke("summarize", "disagg", FIXTURES / "disagg.jsonl", fifo), "a FIFO")


# ---------------------------------------------------------------- the rule for "-"


def test_sweep_out_dash_is_stdout_and_creates_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dash = ok(invoke(*GRID, "--out", "-", "--quiet")).stdout
    plain = ok(invoke(*GRID, "--quiet")).stdout
    assert dash == plain and len(lines_of(dash)) == 2
    assert not (tmp_path / "-").exists()


def test_sweep_csv_dash_is_stdout_beside_a_results_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = ok(invoke(*GRID, "--out", "r.jsonl", "--csv", "-", "--quiet"))
    rows = r.stdout.splitlines()
    assert rows[0].startswith("mode,") and [row.split(",")[0] for row in rows[1:]] == ["rr", "kv"]
    assert len(lines_of((tmp_path / "r.jsonl").read_text())) == 2
    assert not (tmp_path / "-").exists()


def test_sweep_refuses_dash_where_stdout_is_taken_or_not_a_stream(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused(invoke(*GRID, "--csv", "-"), "--csv - needs --out FILE")
    _refused(invoke(*GRID, "--out", "-", "--csv", "-"), "--csv - needs --out FILE")
    _refused(invoke(*GRID, "--out", "-", "--resume"), "--resume needs --out FILE")
    _refused(invoke(*GRID, "--out", "r.jsonl", "--plot", "-"), "'--plot'", "standard output")
    assert sorted(os.listdir(tmp_path)) == []


def test_plots_and_reproduce_refuse_dash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused(invoke("compare", "--modes", "rr,kv", "--plot", "-"), "'--plot'", "standard output")
    _refused(invoke("latency", "--plot", "-"), "'--plot'", "standard output")
    _refused(invoke("reproduce", "-", "--no-plots"), "'OUTDIR'", "standard output")
    assert sorted(os.listdir(tmp_path)) == []


def test_summarize_out_dash_is_stdout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = ok(invoke("summarize", "disagg", FIXTURES / "disagg.jsonl", "-"))
    json.loads(r.stdout)
    assert not (tmp_path / "-").exists()


# ---------------------------------------------------------------- no success line before an error


def test_sweep_prints_its_summary_line_only_after_the_csv_is_written(tmp_path, monkeypatch):
    def fail(path, text):
        raise DynlabError(f"{path}: No space left on device")

    monkeypatch.setattr(sweep_cli, "write_atomic", fail)
    r = invoke(*GRID, "--out", tmp_path / "ok.jsonl", "--csv", tmp_path / "r.csv")
    assert r.exit_code == 1
    assert r.stderr == f"Error: {tmp_path / 'r.csv'}: No space left on device\n"


def test_sweep_summary_line_after_success(tmp_path):
    r = ok(invoke(*GRID, "--out", tmp_path / "ok.jsonl", "--csv", tmp_path / "r.csv"))
    assert r.stderr.startswith("sweep: 2 cells in ") and (tmp_path / "r.csv").exists()


# ---------------------------------------------------------------- reproduce into a folder it cannot write


def _unwritable_parent(tmp_path) -> Path:
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        return ro
    return Path("/proc")  # no one, not even root, can create a folder there


def test_reproduce_into_an_unwritable_folder_names_the_folder_asked_for(tmp_path):
    parent = _unwritable_parent(tmp_path)
    target = parent / "rep"
    r = _refused(invoke("reproduce", target, "--no-plots"), f"{target}: cannot write in {parent}")
    assert ".dynlab-" not in r.stderr  # not the staging folder's name


def test_two_outputs_to_one_file_are_refused(tmp_path):
    # a fresh user's trial: --report same.html --timeline same.html wrote the timeline over the report
    from click.testing import CliRunner

    from dynlab.cli import main

    same = tmp_path / "same.html"
    same.write_text("kept")
    out = CliRunner().invoke(main, ["sim", "--timing", "--quiet", "--report", str(same), "--timeline", str(same)])
    assert out.exit_code == 2
    assert "is also given to --report: give each output its own file" in out.output
    assert same.read_text() == "kept"
    out = CliRunner().invoke(main, ["sim", "--timing", "--quiet", "--requests-out", str(tmp_path / "a.jsonl"),
                                    "--timeline", str(tmp_path / "b.json")])
    assert out.exit_code == 0, out.output


def test_an_output_naming_the_input_trace_is_refused(tmp_path):
    # a fresh user's trial: sim --trace two.jsonl --requests-out two.jsonl replaced the trace by the records
    from click.testing import CliRunner

    from dynlab.cli import main

    trace = tmp_path / "two.jsonl"
    text = '{"timestamp": 0, "input_length": 32, "output_length": 4, "hash_ids": [1, 2]}\n'
    trace.write_text(text)
    for args in (["--trace", str(trace), "--requests-out", str(trace)],   # either order on the line
                 ["--requests-out", str(trace), "--trace", str(trace)],
                 ["--trace", str(trace), "--timeline", str(trace)]):
        out = CliRunner().invoke(main, ["sim", "--timing", "--quiet", "--workers", "1", "--trace-block", "16", *args])
        assert out.exit_code == 2, out.output
        assert "an output would overwrite the input it reads" in out.output
        assert trace.read_text() == text
    out = CliRunner().invoke(main, ["plan", "--trace", str(trace), "--trace-block", "16", "--slo-ttft-ms", "1000",
                                    "--slo-tpot-ms", "100", "--log", str(trace)])
    assert out.exit_code == 2, out.output
    assert trace.read_text() == text


@pytest.mark.parametrize("args", [
    ["sweep", "--grid", "trace={in},{other}", "--csv", "{in}", "--quiet"],
    ["sweep", "--grid", "workers=1,2", "--grid", "trace={other},{in}", "--out", "{in}", "--quiet"],
    ["sweep", "--grid-file", "{grid}", "--out", "{in}", "--quiet"],  # a value the grid file gives every cell
    ["sweep", "--grid", "workload={in}", "--csv", "{in}", "--quiet"],
    ["sim", "--trace", "{other}", "--timing", "--quiet", "--spec-method", "eagle", "--spec-tokens", "2",
     "--spec-acceptance", "file:{in}", "--requests-out", "{in}"],
    ["sim", "--trace", "{other}", "--timing", "--quiet", "--requests-out", "{in}", "--spec-method", "eagle",
     "--spec-tokens", "2", "--spec-acceptance", "file:{in}"],
    ["sweep", "--trace", "{other}", "--timing", "--quiet", "--spec-method", "eagle", "--grid", "spec_tokens=2",
     "--grid", "spec-acceptance=0.7,file:{in}", "--out", "{in}"],
    ["plan", "--trace", "{other}", "--slo-ttft-ms", "1000", "--slo-tpot-ms", "100", "--spec-method", "eagle",
     "--spec-tokens", "2", "--spec-acceptance", "file:{in}", "--log", "{in}"],
    # compare's options are comma lists, checked after click parsed its outputs (a user's report replaced the trace)
    ["compare", "--trace", "{in}", "--modes", "rr,kv", "--report", "{in}", "--quiet"],
    ["compare", "--trace", "{other},{in}", "--plot", "{in}", "--quiet"],
    ["compare", "--trace", "{other}", "--timing", "--quiet", "--spec-method", "eagle", "--spec-tokens", "0,2",
     "--spec-acceptance", "file:{in}", "--report", "{in}"],
])
def test_an_output_naming_a_file_a_grid_value_or_the_acceptance_reads_is_refused(tmp_path, args):
    # the guard covered --trace and --workload only: sweep --grid trace=t3.jsonl,... --csv t3.jsonl and
    # sim --spec-acceptance file:acc.txt --requests-out acc.txt replaced the input
    from click.testing import CliRunner

    from dynlab.cli import main

    other = tmp_path / "other.jsonl"
    other.write_text('{"timestamp": 0, "input_length": 32, "output_length": 4, "hash_ids": [1, 2]}\n')
    inp = tmp_path / "in.html"  # --report writes only a .html name
    text = "2\n1\n3\n" if any("file:{in}" in a for a in args) else other.read_text()  # acceptance lengths
    inp.write_text(text)
    grid = tmp_path / "grid.toml"
    grid.write_text(f'trace = "{inp}"\nworkers = [1, 2]\n')
    args = [a.format(**{"in": inp, "other": other, "grid": grid}) for a in args]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2, out.output
    assert "an output would overwrite the input it reads" in out.output and out.output.count("\n") == 1, out.output
    assert inp.read_text() == text


@pytest.mark.parametrize("args", [
    ["sweep", "--grid-file", "{in}", "--trace", "{other}", "--csv", "{in}", "--quiet"],
    ["sweep", "--csv", "{in}", "--trace", "{other}", "--grid-file", "{in}", "--quiet"],
    ["workload", "{in}", "--out", "{in}"],
    ["workload", "--out", "{in}", "{in}"],
])
def test_an_output_naming_the_grid_file_or_the_workload_spec_is_refused(tmp_path, args):
    # sweep --grid-file g.toml --csv g.toml and workload w.json --out w.json replaced what they read
    from click.testing import CliRunner

    from dynlab.cli import main

    other = tmp_path / "other.jsonl"
    other.write_text('{"timestamp": 0, "input_length": 32, "output_length": 4, "hash_ids": [1, 2]}\n')
    inp = tmp_path / "in.toml"
    text = "workers = [1, 2]\n" if args[0] == "sweep" else '{"requests": 3}\n'
    inp.write_text(text)
    out = CliRunner().invoke(main, [a.format(**{"in": inp, "other": other}) for a in args])
    assert out.exit_code == 2, out.output
    assert "an output would overwrite the input it reads" in out.output and out.output.count("\n") == 1, out.output
    assert inp.read_text() == text


@pytest.mark.parametrize("args", [("sim", "--timing", "--timeline", ""), ("sim", "--timing", "--timeline", "  "),
                                  ("sim", "--requests-out", "")])
def test_an_empty_output_path_is_refused_in_one_line(args):
    # a fresh user's --timeline "": the cwd's realpath stood in for the empty name, a directory, and the error read
    # "is not a regular file, not a regular file"
    result = invoke(*args)
    assert result.exit_code == 2 and "an empty path; give a file" in result.stderr
    assert "not a regular file" not in result.stderr and result.stdout == ""
