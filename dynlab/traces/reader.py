"""Trace reading: JSONL request traces streamed line by line as :class:`Request` s.

Formats are plugins (hook ``dynlab_register_trace_formats``, interface
:class:`dynlab.traces.format.TraceFormat`); the built-ins, in ``dynlab_builtins.trace_formats``, are
``mooncake`` (Mooncake's ``hash_ids`` of 512-token blocks, already prefix-chained)
and ``tokens`` (``{"tokens": [ints]}`` hashed with :func:`dynlab.routing.hashing.block_hashes`).
Built-in traces ship inside the package (see :data:`BUILTIN_TRACES`).
"""
from __future__ import annotations

import gzip
import io
import json
import os
import sys
from importlib import resources
from typing import Iterator, Optional

from dynlab.errors import DynlabError, InputError
from dynlab.routing.strategy import Request
from dynlab.traces.format import TraceFormat

#: name -> (package resource under dynlab/data, number of requests). The Mooncake
#: conversation trace: kvcache-ai/Mooncake FAST25-release/traces, Apache-2.0.
BUILTIN_TRACES = {
    "mooncake-conversation": ("traces/mooncake_conversation.jsonl.gz", 12031),
}


_DECODER = json.JSONDecoder()


def open_source(path_or_name: str) -> tuple[io.TextIOBase, str, Optional[int]]:
    """Open a built-in trace name, a file path (``.gz`` decompressed) or ``-`` (stdin) as text.

    Returns ``(stream, display name, number of requests or None)``.
    Raises :class:`DynlabError` when it is neither a built-in name nor a readable file.
    """
    if path_or_name == "-":
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8"), "<stdin>", None
    if path_or_name in BUILTIN_TRACES:
        resource, total = BUILTIN_TRACES[path_or_name]
        raw = resources.files("dynlab").joinpath("data", resource).open("rb")
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8"), path_or_name, total
    if not os.path.exists(path_or_name):
        known = ", ".join(BUILTIN_TRACES)
        raise DynlabError(f"{path_or_name}: no such file, and not a built-in trace ({known})")
    if path_or_name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path_or_name, "rb"), encoding="utf-8"), path_or_name, None
    return open(path_or_name, encoding="utf-8"), path_or_name, None


class TraceRequests(list):
    """A loaded trace: a list of :class:`Request` plus ``block_tokens`` (tokens per block of its names)."""

    block_tokens: int = 16


def open_trace(path_or_name: str, fmt: Optional[str] = None, block: int = 16,
               registry=None, scheme: str = "dynlab") -> tuple[Iterator[Request], Optional[int], int]:
    """Stream a trace as requests: ``(iterator, number of requests or None, tokens per block)``.

    ``fmt`` names a registered trace format; ``None`` detects it from the first
    non-blank line, which is read at once (so a bad first line or an unknown
    format fails here). The rest is read one line at a time as the iterator
    advances; blank lines are skipped; a bad line raises :class:`InputError`
    (``FILE:LINE: what is wrong``). Tokens per block are the format's own
    (``TraceFormat.block_tokens``, 512 for Mooncake) or ``block``. ``scheme``: the hash
    scheme (``--hash``) of formats that hash tokens (``TraceFormat.hashes_tokens``); any
    other than ``dynlab`` on a format that reads its names from the trace raises ``ValueError``.
    An unknown source raises :class:`DynlabError`.
    """
    from dynlab import plugins

    registry = registry if registry is not None else plugins.trace_formats()
    if fmt is not None:
        registry.get(fmt)  # unknown names fail before any reading
    stream, name, total = open_source(path_or_name)
    try:
        lines = enumerate(stream, 1)
        with _read_errors(name):
            for lineno, line in lines:
                if line.strip():
                    break
            else:
                raise DynlabError(f"{name}: the trace holds no request")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(name, lineno, f"not JSON: {exc.msg}") from None
        reader = _reader(record, name, lineno, fmt, block, registry)
        if scheme != "dynlab":
            if not reader.hashes_tokens:
                raise ValueError(f"--hash {scheme} names blocks of tokens, but {reader.name} traces carry "
                                 f"their own block names; use --hash dynlab")
            reader.hash_scheme = scheme
    except BaseException:
        stream.close()
        raise
    return _requests(stream, lines, name, reader, lineno, record), total, reader.block_tokens or block


class _read_errors:
    """Turn decompression and decoding failures into a one-line :class:`DynlabError`."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, (UnicodeDecodeError, EOFError, gzip.BadGzipFile)):
            raise DynlabError(f"{self.name}: cannot read: {exc}") from None
        return False


def _requests(stream, lines, name, reader, lineno, record) -> Iterator[Request]:
    """Parse the first record, then read, decode and parse line by line (the replay's hot path)."""
    parse = reader.parse
    raw_decode = _DECODER.raw_decode  # json.loads minus two wrapper layers; the line's end is checked below
    index = 0
    with stream, _read_errors(name):
        while True:
            if type(record) is not dict:
                raise InputError(name, lineno, "expected a JSON object")
            try:
                yield parse(record, index)
            except ValueError as exc:
                raise InputError(name, lineno, str(exc)) from None
            index += 1
            for lineno, line in lines:
                try:
                    record, end = raw_decode(line)
                    if end == len(line) - 1 or end == len(line) or line[end:].isspace():
                        break
                    record = json.loads(line)  # trailing data: let json say what is wrong
                    break
                except json.JSONDecodeError:
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)  # leading whitespace is fine for json.loads
                        break
                    except json.JSONDecodeError as exc:
                        raise InputError(name, lineno, f"not JSON: {exc.msg}") from None
            else:
                return


def _reader(record, name, lineno, fmt, block, registry) -> TraceFormat:
    if fmt is None:
        for entry in registry.entries():
            if entry.cls.detect(record):
                fmt = entry.name
                break
        else:
            raise InputError(name, lineno, "unknown trace format (formats: "
                             f"{', '.join(registry.names())}); give --trace-format")
    return registry.get(fmt)(block)


def load_trace(path_or_name: str, fmt: Optional[str] = None, block: int = 16,
               scheme: str = "dynlab") -> TraceRequests:
    """The whole trace as a list of requests (for runs that replay it many times), with ``block_tokens``.

    Same arguments (``scheme``: the hash scheme) and errors as :func:`open_trace`.
    """
    requests, _, block_tokens = open_trace(path_or_name, fmt, block, scheme=scheme)
    out = TraceRequests(requests)
    out.block_tokens = block_tokens
    return out
