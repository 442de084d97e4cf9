"""``dynlab reproduce``: every file equals its command's output, REPORT.md's numbers equal the JSON beside it."""
from __future__ import annotations

import json
import os
import re
import sys

import pytest
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.labs import reproduce as lib

LAB000 = ["modes.json", "events.json", "kvcost.json", "disagg_measured.json", "bounded.json",
          "strategies.png", "bounded.png"]
LAB002 = ["cyclic.json", "cyclic_opt.json", "baseline.json", "cliff.json", "offload.json", "cpu_cliff.json",
          "offload_measured.json", "cliff_gpu.png", "cliff_cpu.png"]

# file -> the command whose stdout it must equal, byte for byte
COMMANDS = {
    "modes.json": ["compare", "--modes", "rr,random,kv"],
    "events.json": ["compare", "--mode", "kv-events", "--publish", "yes,no"],
    "kvcost.json": ["disagg", "--tokens", "1500", "--gbps", "0.112,0.608,13.4"],
    "cyclic.json": ["scenario", "--passes", "fwd,fwd"],
    "cyclic_opt.json": ["scenario", "--passes", "fwd,fwd", "--policy", "opt"],
    "baseline.json": ["scenario"],
    "cliff.json": ["cliff", "--gpu", "21520,30000,40000,45000,50109,50110", "--passes", "fwd,fwd"],
    "offload.json": ["scenario", "--gpu", "21520", "--cpu", "56000", "--passes", "fwd,fwd,rev"],
    "cpu_cliff.json": ["cliff", "--gpu", "21520", "--cpu", "0,20000,30000,40000,50109,50110,56000",
                       "--passes", "fwd,fwd", "--metric", "misses"],
    "disagg_measured.json": ["summarize", "disagg", lib.path_of_sample("disagg"), "-"],
    "offload_measured.json": ["summarize", "offload", lib.path_of_sample("offload"), "-"],
}


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def command_output(args) -> str:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return result.stdout


def one_error_line(result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """One full run with the sample files: (outdir, stdout)."""
    out = tmp_path_factory.mktemp("repro") / "out"
    result = cli("reproduce", out, "--with-samples")
    assert result.exit_code == 0, result.output
    return out, result.stdout


def read(out, name) -> str:
    return (out / name).read_text(encoding="utf-8")


def test_writes_every_file_and_lists_them(full):
    out, stdout = full
    expected = LAB000[:5] + LAB002[:7] + LAB000[5:] + LAB002[7:] + ["REPORT.md"]
    assert sorted(os.listdir(out)) == sorted(expected)
    assert stdout.splitlines() == [os.path.join(str(out), name) for name in expected]
    for name in expected:
        if name.endswith(".png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_json_file_is_the_commands_output(full, name):
    out, _ = full
    assert read(out, name) == command_output(COMMANDS[name])


def test_bounded_is_compare_per_capacity(full):
    out, _ = full
    expected = {}
    for cap in ("unbounded", "60", "42"):
        text = command_output(["compare", "--modes", "rr,random,kv,kv-events", "--capacity", cap, "--all-metrics"])
        expected[cap] = json.loads(text)
    assert read(out, "bounded.json") == json.dumps(expected) + "\n"
    # each entry is also `dynlab sim --capacity C --mode M --all-metrics`
    sim = json.loads(command_output(["sim", "--capacity", "60", "--mode", "rr", "--all-metrics"]))
    assert expected["60"]["rr"] == sim


# ---------------------------------------------------------------------------------------------
# REPORT.md's claims against the JSON files beside it


def num(text: str):
    text = text.replace(",", "")
    return float(text) if "." in text else int(text)


def find(pattern: str, report: str):
    match = re.search(pattern, report)
    assert match, f"no match for {pattern!r}"
    return match.groups()


def test_report_numbers_match_the_json(full):
    out, _ = full
    report = read(out, "REPORT.md")
    data = {name: json.loads(read(out, name)) for name in COMMANDS}
    bounded = json.loads(read(out, "bounded.json"))

    modes = data["modes.json"]
    hits, total = find(r"kv sends \*\*(\d+) of (\d+)\*\*", report)
    assert (num(hits), num(total)) == (modes["kv"]["hits"], modes["kv"]["repeat_requests"])
    rr_hits, rr_rate = find(r"round robin hits (\d+) \(([\d.]+)\)", report)
    assert (num(rr_hits), num(rr_rate)) == (modes["rr"]["hits"], modes["rr"]["hit_rate"])

    no = data["events.json"]["no"]
    hits, total = find(r"when they publish nothing it hits \*\*(\d+) of (\d+)\*\*", report)
    assert (num(hits), num(total)) == (no["hits"], no["repeat_requests"])
    (same,) = find(r"That is exactly round robin's (\d+)", report)
    assert num(same) == modes["rr"]["hits"] == no["hits"]

    for gbps, record in data["kvcost.json"].items():
        (ms,) = find(rf"([\d,.]+) ms at {re.escape(gbps)} GB/s", report)
        assert num(ms) == record["transfer_ms"]
    (mib,) = find(r"are ([\d.]+) MiB", report)
    assert num(mib) == data["kvcost.json"]["0.112"]["kv_mib"]
    (prefill,) = find(r"measured 1500x1 cell, ([\d.]+) ms", report)
    assert num(prefill) == data["disagg_measured.json"]["1500x1"]["agg_ms"]

    rows = dict(re.findall(r"^\| (rr|random|kv|kv-events) \| (.*) \|$", report, re.M))
    assert set(rows) == {"rr", "random", "kv", "kv-events"}
    for strategy, cells in rows.items():
        cell_hits = [num(c.split(" ")[0]) for c in cells.split(" | ")]
        assert cell_hits == [bounded[cap][strategy]["hits"] for cap in ("unbounded", "60", "42")]
    for strategy in ("rr", "kv"):
        said = re.findall(rf"^- {strategy}: (\d+) at capacity 60 \((\w+)\) and (\d+) at capacity 42 \((\w+)\)",
                          report, re.M)
        assert said, strategy
        (h60, _, h42, _), = said
        assert (num(h60), num(h42)) == (bounded["60"][strategy]["hits"], bounded["42"][strategy]["hits"])

    (docs,) = find(r"third pass \(`rev`\) hits documents \*\*\[([\d, ]+)\]\*\*", report)
    assert [int(x) for x in docs.split(", ")] == data["baseline.json"]["passes"][2]["hit_docs"] == [9, 8, 7, 6]

    (second,) = find(r"The second forward pass hits \*\*(\d+)\*\*", report)
    last = data["cyclic.json"]["passes"][-1]
    assert num(second) == last["gpu_hits"] + last["cpu_hits"]
    (opt,) = find(r"`cyclic_opt.json`\) hits \*\*(\d+)\*\*", report)
    last = data["cyclic_opt.json"]["passes"][-1]
    assert num(opt) == last["gpu_hits"] + last["cpu_hits"]

    top_hits, at = find(r"and \*\*(\d+)\*\* at ([\d,]+)\. The documents total", report)
    assert data["cliff.json"][str(num(at))] == num(top_hits)
    assert "cliff sits exactly at that total" in report and num(at) == 10 * 5011
    (none_from,) = find(r"\*\*none\*\* from ([\d,]+)", report)
    assert data["cpu_cliff.json"][str(num(none_from))] == 0
    assert data["cpu_cliff.json"]["50109"] == 10
    (overflow,) = find(r"The GPU cannot hold ([\d,]+) tokens", report)
    assert num(overflow) == 10 * 5011 - 21520

    first = data["offload_measured.json"]["ratio"]["pass1-cold"]
    p50, mean = find(r"On `pass1-cold` it is \*\*([\d.]+)\*\* \(p50\) and ([\d.]+) \(mean\), below 1", report)
    assert (num(p50), num(mean)) == (first["p50"], first["mean"]) and first["p50"] < 1


def test_report_links_every_file_and_embeds_the_plots(full):
    out, _ = full
    report = read(out, "REPORT.md")
    links = set(re.findall(r"\]\(([^)]+)\)", report))
    assert links == set(os.listdir(out)) - {"REPORT.md"}
    for png in ("strategies.png", "bounded.png", "cliff_gpu.png", "cliff_cpu.png"):
        assert f"]({png})" in report and "![" in report


def test_report_is_written_from_the_numbers():
    """Change a number in the artifacts: the report follows it (nothing is hard-coded)."""
    result = lib.build(with_plots=False)
    arts = dict(result.artifacts)
    modes = json.loads(json.dumps(arts["modes.json"].data))
    modes["kv"]["hits"] = 57
    arts["modes.json"] = lib.Artifact("modes.json", "lab000", arts["modes.json"].command, modes)
    baseline = json.loads(json.dumps(arts["baseline.json"].data))
    baseline["passes"][2]["hit_docs"] = [9, 8, 7]
    arts["baseline.json"] = lib.Artifact("baseline.json", "lab002", "dynlab scenario", baseline)
    events = json.loads(json.dumps(arts["events.json"].data))
    events["no"]["hits"] = 50
    arts["events.json"] = lib.Artifact("events.json", "lab000", "x", events)
    report = lib.render_report(arts, lib.LABS)
    assert "kv sends **57 of 60**" in report
    assert "hits documents **[9, 8, 7]**" in report and "yet the hits differ" in report
    assert "does NOT reduce to round robin" in report and "That is exactly" not in report


# ---------------------------------------------------------------------------------------------
# behaviour


def test_refuses_a_non_empty_outdir_without_force(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    line = one_error_line(cli("reproduce", tmp_path), 2)
    assert "not empty" in line and "--force" in line
    assert os.listdir(tmp_path) == ["keep.txt"]


def test_force_overwrites_and_removes_stale_own_files(tmp_path):
    out = tmp_path / "o"
    assert cli("reproduce", out, "--with-samples", "--no-plots").exit_code == 0
    (out / "keep.txt").write_text("mine")
    (out / "modes.json").write_text("stale\n")
    result = cli("reproduce", out, "--only", "lab000", "--force", "--no-plots")
    assert result.exit_code == 0, result.output
    names = set(os.listdir(out))
    assert names == {"modes.json", "events.json", "kvcost.json", "bounded.json", "REPORT.md", "keep.txt"}
    assert read(out, "modes.json") == command_output(COMMANDS["modes.json"])


def test_only_lab000(tmp_path):
    result = cli("reproduce", tmp_path / "a", "--only", "lab000", "--with-samples")
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tmp_path / "a")) == sorted(LAB000 + ["REPORT.md"])
    report = read(tmp_path / "a", "REPORT.md")
    assert "## Lab 000" in report and "Lab 002" not in report and "cliff" not in report


def test_only_lab002(tmp_path):
    result = cli("reproduce", tmp_path / "b", "--only", "lab002", "--with-samples")
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tmp_path / "b")) == sorted(LAB002 + ["REPORT.md"])
    assert "Lab 000" not in read(tmp_path / "b", "REPORT.md")


def test_only_refuses_the_other_labs_file(tmp_path):
    sample = lib.path_of_sample("disagg")
    line = one_error_line(cli("reproduce", tmp_path / "c", "--only", "lab002", "--disagg-file", sample), 2)
    assert "--disagg-file" in line
    assert not (tmp_path / "c").exists()


def test_without_measured_files_the_report_says_so(tmp_path):
    result = cli("reproduce", tmp_path / "d", "--no-plots")
    assert result.exit_code == 0, result.output
    names = set(os.listdir(tmp_path / "d"))
    assert "disagg_measured.json" not in names and "offload_measured.json" not in names
    assert not any(n.endswith(".png") for n in names)
    report = read(tmp_path / "d", "REPORT.md")
    assert "`disagg_measured.json` was not written" in report and "Plots were not drawn" in report
    assert "![" not in report
    assert "longer than any prefill of tens of milliseconds" in report


def test_given_measured_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"mode": "agg", "input": 1500, "conc": 1, "rep": 0, "ttft_p50_ms": 20.0}\n'
                    '{"mode": "disagg", "input": 1500, "conc": 1, "rep": 0, "ttft_p50_ms": 50.0}\n')
    out = tmp_path / "e"
    result = cli("reproduce", out, "--only", "lab000", "--disagg-file", path, "--no-plots")
    assert result.exit_code == 0, result.output
    assert read(out, "disagg_measured.json") == command_output(["summarize", "disagg", path, "-"])
    report = read(out, "REPORT.md")
    assert f"Summary of `{path}`." in report and "measured 1500x1 cell, 20.0 ms" in report


def test_bad_measured_file_is_the_summarize_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"mode": "agg", "input": 1500, "conc": 1, "rep": 0, "ttft_p50_ms": 20.0}\n{oops\n')
    out = tmp_path / "f"
    line = one_error_line(cli("reproduce", out, "--disagg-file", path), 1)
    expected = one_error_line(cli("summarize", "disagg", path, "-"), 1)
    assert line == expected and line.startswith(f"Error: {path}:2: ")
    assert not out.exists()


def test_outdir_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    one_error_line(cli("reproduce", path), 2)


def test_creates_missing_parents(tmp_path):
    out = tmp_path / "x" / "y"
    assert cli("reproduce", out, "--only", "lab002", "--no-plots").exit_code == 0
    assert (out / "REPORT.md").is_file()


def test_missing_matplotlib_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "g"
    line = one_error_line(cli("reproduce", out), 1)
    assert "pip install matplotlib" in line and "--no-plots" in line
    assert not out.exists()
    assert cli("reproduce", out, "--no-plots").exit_code == 0


def test_build_rejects_an_unknown_lab():
    with pytest.raises(ValueError, match="lab000"):
        lib.build(only="lab001", with_plots=False)


def test_an_interrupted_run_leaves_no_outdir(tmp_path, monkeypatch):
    # Ctrl-C while the third file is written: OUTDIR must be absent (not partial), and no staging left
    import dynlab.cli.reproduce as cmd

    real, calls = cmd.write_atomic, []

    def interrupted(path, text):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(path, text)

    monkeypatch.setattr(cmd, "write_atomic", interrupted)
    out = tmp_path / "out"
    result = cli("reproduce", out, "--no-plots")
    assert result.exit_code == 130
    assert len(calls) == 3
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(cmd, "write_atomic", real)
    assert cli("reproduce", out, "--no-plots").exit_code == 0  # no --force needed afterwards


def test_a_failing_step_into_an_empty_outdir_leaves_it_empty(tmp_path, monkeypatch):
    import dynlab.cli.reproduce as cmd

    def fail(path, text):
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(cmd, "write_atomic", fail)
    out = tmp_path / "out"
    out.mkdir()
    one_error_line(cli("reproduce", out, "--no-plots"), 1)
    assert os.listdir(tmp_path) == ["out"] and os.listdir(out) == []


def test_force_keeps_other_files_when_interrupted(tmp_path, monkeypatch):
    import dynlab.cli.reproduce as cmd

    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    monkeypatch.setattr(cmd, "write_atomic", lambda path, text: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli("reproduce", out, "--force", "--no-plots").exit_code == 130
    assert os.listdir(tmp_path) == ["o"] and os.listdir(out) == ["keep.txt"]
