"""One rule for an input file that cannot be opened, in every command and option that takes one.

The path names no file, or a directory, or a file this user may not read: a usage error (exit 2, as
click's own checks of file arguments give), one line on stderr naming the path, no traceback,
nothing written. A file that opens but holds a bad line is another matter (``FILE:LINE``, exit 1).
"""
from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from dynlab.cli import main

# every command and option that reads a file the user names; {f} is the path, {out} an output dir
TAKES_A_FILE = [
    ["sim", "--trace", "{f}"],
    ["sim", "--timing", "--model", "{f}"],
    ["compare", "--modes", "kv,rr", "--trace", "{f}"],
    ["compare", "--modes", "kv,rr", "--timing", "--model", "{f}"],
    ["compare", "--trace", "{f},mooncake-conversation"],
    ["sweep", "--grid", "mode=kv,rr", "--trace", "{f}"],
    ["sweep", "--grid", "trace={f},mooncake-conversation"],
    ["sweep", "--grid", "mode=kv,rr", "--timing", "--model", "{f}"],
    ["sweep", "--grid-file", "{f}"],
    ["latency", "--model", "{f}"],
    ["disagg", "--tokens", "1500", "--gbps", "1", "--model-config", "{f}"],
    ["summarize", "disagg", "{f}", "{out}/summary.json"],
    ["summarize", "offload", "{f}", "{out}/summary.json"],
    ["events", "replay", "{f}"],
    ["reproduce", "{out}/labs", "--disagg-file", "{f}"],
    ["reproduce", "{out}/labs", "--offload-file", "{f}"],
]


def _deny_root(monkeypatch, path: str) -> None:
    """Root reads a file of mode 000: make ``open`` and ``os.access`` answer for ``path`` as they do
    for any other user (``PermissionError``; not readable)."""
    import builtins

    real_open, real_access = builtins.open, os.access

    def open_(file, *args, **kw):
        if isinstance(file, (str, os.PathLike)) and os.fspath(file) == path:
            raise PermissionError(13, "Permission denied", path)
        return real_open(file, *args, **kw)

    def access(p, mode, *args, **kw):
        if isinstance(p, (str, os.PathLike)) and os.fspath(p) == path and mode & os.R_OK:
            return False
        return real_access(p, mode, *args, **kw)

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "access", access)


def _path(tmp_path, kind: str, monkeypatch) -> str:
    if kind == "missing":
        return str(tmp_path / "missing.jsonl")
    if kind == "directory":
        (tmp_path / "a-dir").mkdir()
        return str(tmp_path / "a-dir")
    unreadable = tmp_path / "unreadable.jsonl"
    unreadable.write_text("{}\n")
    unreadable.chmod(0)
    if os.geteuid() == 0:
        _deny_root(monkeypatch, str(unreadable))
    return str(unreadable)


@pytest.mark.parametrize("kind", ["missing", "directory", "unreadable"])
@pytest.mark.parametrize("template", TAKES_A_FILE, ids=lambda t: " ".join(t).replace("{f}", "F"))
def test_an_input_file_that_cannot_be_opened_is_a_usage_error(tmp_path, template, kind, monkeypatch):
    path = _path(tmp_path, kind, monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    args = [a.replace("{f}", path).replace("{out}", str(out)) for a in template]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("Error: ") and "Traceback" not in r.stderr, r.stderr
    assert path in r.stderr, r.stderr
    assert r.stdout == ""
    assert list(out.iterdir()) == []  # nothing written


def test_a_bad_line_in_a_file_that_opens_stays_exit_1(tmp_path):
    # the other half of the rule: the file opened, its content is wrong
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    r = CliRunner().invoke(main, ["sim", "--trace", str(bad)])
    assert r.exit_code == 1 and r.stderr.startswith(f"Error: {bad}:1: "), r.output
