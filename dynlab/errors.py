"""Errors that mean "the user's input is wrong", shown by the CLI as one line without a traceback."""
from __future__ import annotations


class DynlabError(Exception):
    """Base class: the CLI prints ``Error: <message>`` and exits 1."""


class InputError(DynlabError):
    """A bad line in an input file: ``str()`` is ``FILE:LINE: what is wrong``."""

    def __init__(self, path: str, line: int, message: str):
        self.path, self.line, self.message = path, line, message
        super().__init__(f"{path}:{line}: {message}")


class InputFileError(DynlabError):
    """An input file named on the command line that cannot be opened (missing, a directory, no
    permission): ``str()`` is ``PATH: why``. The CLI treats it as a usage error (exit 2), as click
    does the file arguments it checks itself; a file that opens but holds a bad line is an
    :class:`InputError` (exit 1)."""

    def __init__(self, path: str, why: str):
        self.path, self.why = path, why
        super().__init__(f"{path}: {why}")
