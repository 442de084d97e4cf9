"""Helpers shared by the test modules (imported as ``helpers``: pytest puts tests/ on sys.path)."""
from __future__ import annotations

import sys
from pathlib import Path

from click.testing import CliRunner

from dynlab.cli import main


def dynlab_command() -> list[str]:
    """How to run the installed ``dynlab`` console script of this interpreter (a fallback without it)."""
    bindir = Path(sys.executable).parent
    for name in ("dynlab", "dynlab.exe"):
        if (bindir / name).exists():
            return [str(bindir / name)]
    return [sys.executable, "-c", "from dynlab.cli import main; main()"]


def invoke(*args):
    """Run the CLI in-process (click's CliRunner) with every argument as a string."""
    return CliRunner().invoke(main, [str(a) for a in args])


def ok(result):
    """Assert a CliRunner result succeeded and return it."""
    assert result.exit_code == 0, (result.exit_code, result.stderr, result.exception)
    return result


def lines_of(text: str) -> list[str]:
    """The non-blank lines of ``text``."""
    return [line for line in text.splitlines() if line.strip()]
