"""Usage errors the 2026-11-30 trial found reported as run-time errors or without their file (section 10)."""
from __future__ import annotations

import pytest

from helpers import invoke

pytest.importorskip("matplotlib")


@pytest.mark.parametrize("args", [["compare", "--modes", "rr,kv"], ["sweep", "--grid", "workers=1,2"],
                                  ["latency"]])
def test_a_plot_suffix_matplotlib_cannot_write_is_a_usage_error(tmp_path, args):
    # .txt is no matplotlib format: the same exit (2) as an unwritable --plot, before any work, nothing written
    path = tmp_path / "p.txt"
    result = invoke(*args, "--plot", path)
    assert result.exit_code == 2, (result.stderr, result.exception)
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"Error: Invalid value for '--plot': {path}: cannot write a .txt plot; use one of ")
    assert ".png" in line
    assert not path.exists()


@pytest.mark.parametrize("text, message", [
    # the trial's file: the second value is no --cpu-write choice
    ('cpu_write = ["evict", "bogus"]\n', "cpu_write: 'bogus' is not one of 'evict', 'compute'."),
    ("workers = [1, 0]\n", "workers: 0 is not in the range x>=1."),
    ("bogus = [1, 2]\n", "unknown option 'bogus' in the grid; options: "),
])
def test_a_bad_value_in_a_grid_file_names_the_file(tmp_path, text, message):
    grid = tmp_path / "g2.toml"
    grid.write_text(text)
    result = invoke("sweep", "--timing", "--cpu-capacity", "10", "--grid-file", grid, "--dry-run")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"Error: {grid}: {message}")


def test_a_bad_value_on_the_command_line_keeps_its_grid_hint():
    result = invoke("sweep", "--timing", "--cpu-capacity", "10", "--grid", "cpu-write=evict,bogus", "--dry-run")
    assert (result.exit_code, result.stderr) == (
        2, "Error: Invalid value for --grid cpu-write: 'bogus' is not one of 'evict', 'compute'.\n")
