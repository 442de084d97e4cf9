"""A trace's bytes: a built-in trace name, a file path (``.gz`` decompressed) or ``-`` (standard input, kept
in memory by :func:`keep_stdin` when a command reads it more than once), opened as a binary stream for
:mod:`dynlab.traces.reader`, which decodes and parses it line by line.
"""
from __future__ import annotations

import gzip
import io
import os
import sys
from importlib import resources
from typing import Optional

from dynlab.errors import InputFileError
from dynlab.traces.bundled import BUILTIN_TRACES


def open_source(path_or_name: str) -> tuple[io.BufferedIOBase, str, Optional[int]]:
    """Open a built-in trace name, a file path (``.gz`` decompressed) or ``-`` (stdin) as bytes.

    Returns ``(binary stream, display name, number of requests or None)``; lines are decoded
    (UTF-8) one by one by the reader, so a bad byte is reported as ``FILE:LINE``.
    Raises :class:`~dynlab.errors.InputFileError` when it is neither a built-in name nor a file that opens.
    """
    if path_or_name == "-":
        kept = _kept_stdin()
        return (sys.stdin.buffer if kept is None else io.BytesIO(kept)), "<stdin>", None
    if path_or_name in BUILTIN_TRACES:
        resource, total = BUILTIN_TRACES[path_or_name]
        raw = resources.files("dynlab").joinpath("data", resource).open("rb")
        return _buffered(gzip.GzipFile(fileobj=raw)), path_or_name, total
    if not os.path.exists(path_or_name):
        known = ", ".join(BUILTIN_TRACES)
        raise InputFileError(path_or_name, f"no such file, and not a built-in trace ({known})")
    try:
        if path_or_name.endswith(".gz"):
            return _buffered(gzip.open(path_or_name, "rb")), path_or_name, None
        return open(path_or_name, "rb"), path_or_name, None
    except OSError as exc:  # a directory, no permission
        raise InputFileError(path_or_name, exc.strerror or str(exc)) from None


#: ``(the standard input stream, the process that read it, its bytes)`` once :func:`keep_stdin` has read it
_STDIN: Optional[tuple] = None


def keep_stdin() -> None:
    """Read standard input to its end (once per stream) and keep its bytes, so ``-`` opens again: every
    later :func:`open_source` of ``-`` reads that copy. For runs that read one piped trace several times
    (compare, sweep and plan configurations naming its blocks differently); a single streamed run
    does not call it, so its memory stays one request at a time."""
    global _STDIN
    if _kept_stdin() is None:
        stream = sys.stdin.buffer
        _STDIN = (stream, os.getpid(), stream.read())


def _kept_stdin() -> Optional[bytes]:
    """The bytes :func:`keep_stdin` kept of the current standard input, else ``None``. A forked child
    (a sweep's pool worker, whose stdin multiprocessing replaces with /dev/null) uses its parent's copy:
    ``-`` is the stdin the command was given."""
    if _STDIN is None:
        return None
    stream, pid, data = _STDIN
    return data if stream is sys.stdin.buffer or pid != os.getpid() else None


def _buffered(stream: gzip.GzipFile) -> io.BufferedReader:
    """A gzip stream behind a C-level line buffer: its lines are read without a Python call each
    (``GzipFile.readline`` is Python code); the decompression errors are the same, raised a chunk
    (64 KiB) ahead."""
    return io.BufferedReader(stream, 1 << 16)
