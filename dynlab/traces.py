"""Trace formats and trace reading: JSONL request traces streamed line by line as :class:`Request` s.

Formats are plugins (hook ``dynlab_register_trace_formats``); the built-ins are
``mooncake`` (Mooncake's ``hash_ids`` of 512-token blocks, already prefix-chained)
and ``tokens`` (``{"tokens": [ints]}`` hashed with :func:`dynlab.routing.hashing.block_hashes`).
Built-in traces ship inside the package (see :data:`BUILTIN_TRACES`).
"""
from __future__ import annotations

import gzip
import io
import json
import math
import os
import sys
from abc import ABC, abstractmethod
from importlib import resources
from typing import Any, ClassVar, Iterator, Optional

from dynlab.errors import DynlabError, InputError
from dynlab.routing.strategy import Request

#: name -> (package resource under dynlab/data, number of requests). The Mooncake
#: conversation trace: kvcache-ai/Mooncake FAST25-release/traces, Apache-2.0.
BUILTIN_TRACES = {
    "mooncake-conversation": ("traces/mooncake_conversation.jsonl.gz", 12031),
}


_DECODER = json.JSONDecoder()


class TraceFormat(ABC):
    """Base class of trace readers: turns one decoded JSON line into a :class:`Request`.

    Subclasses set ``name`` (the ``--trace-format`` value) and a one-line docstring,
    implement :meth:`detect` (does a first record look like this format?) and
    :meth:`parse` (raise ``ValueError`` with a short message for a bad record; the
    reader adds ``FILE:LINE``). ``block`` is the ``--block`` option (tokens per
    block), for formats that hash tokens themselves.
    """

    name: ClassVar[str] = ""
    #: tokens per block of the names the format yields; ``None``: the ``--block`` option
    block_tokens: ClassVar[Optional[int]] = None

    def __init__(self, block: int = 16):
        self.block = block

    @classmethod
    @abstractmethod
    def detect(cls, record: Any) -> bool:
        """True when ``record`` (the first line, decoded) is in this format."""

    @abstractmethod
    def parse(self, record: Any, index: int) -> Request:
        """The request for ``record``; ``index`` is its position among the trace's requests."""


def _number(record: dict, key: str, required: bool = True, default=None):
    if key not in record:
        if required:
            raise ValueError(f"missing field {key!r}")
        return default
    v = record[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"field {key!r} must be a number, got {v!r}")
    if not math.isfinite(v):
        raise ValueError(f"field {key!r} must be a finite number, got {v!r}")
    if v < 0:
        raise ValueError(f"field {key!r} must not be negative, got {v!r}")
    return v


def _int_list(record: dict, key: str) -> list:
    if key not in record:
        raise ValueError(f"missing field {key!r}")
    v = record[key]
    if not isinstance(v, list):
        raise ValueError(f"field {key!r} must be a list of ints")
    if v and set(map(type, v)) != {int}:
        for i, h in enumerate(v):
            if type(h) is not int:
                raise ValueError(f"{key}[{i}] must be an int, got {h!r}")
    return v


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
               registry=None) -> tuple[Iterator[Request], Optional[int], int]:
    """Stream a trace as requests: ``(iterator, number of requests or None, tokens per block)``.

    ``fmt`` names a registered trace format; ``None`` detects it from the first
    non-blank line, which is read at once (so a bad first line or an unknown
    format fails here). The rest is read one line at a time as the iterator
    advances; blank lines are skipped; a bad line raises :class:`InputError`
    (``FILE:LINE: what is wrong``). Tokens per block are the format's own
    (``TraceFormat.block_tokens``, 512 for Mooncake) or ``block``.
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


def load_trace(path_or_name: str, fmt: Optional[str] = None, block: int = 16) -> TraceRequests:
    """The whole trace as a list of requests (for runs that replay it many times), with ``block_tokens``.

    Same errors as :func:`open_trace`.
    """
    requests, _, block_tokens = open_trace(path_or_name, fmt, block)
    out = TraceRequests(requests)
    out.block_tokens = block_tokens
    return out


class MooncakeTrace(TraceFormat):
    """Mooncake JSONL: timestamp (ms), input_length, output_length, prefix-chained hash_ids of 512-token blocks."""

    name = "mooncake"
    block_tokens = 512

    @classmethod
    def detect(cls, record):
        return isinstance(record, dict) and "hash_ids" in record

    def parse(self, record, index):
        hashes = _int_list(record, "hash_ids")
        get = record.get
        inp, out, ts = get("input_length", 0), get("output_length", 0), get("timestamp")
        if type(inp) is not int or type(out) is not int or (ts is not None and type(ts) is not int and (
                type(ts) is not float or not math.isfinite(ts))) or inp < 0 or out < 0 or (ts is not None and ts < 0):
            inp = _number(record, "input_length", False, 0)
            out = _number(record, "output_length", False, 0)
            ts = _number(record, "timestamp", False, None)
        return Request(tuple(hashes), inp, out, ts, index)  # positional: the replay's hot path


class TokenTrace(TraceFormat):
    """Token JSONL: {"tokens": [ints]} per line (optional timestamp, output_length), hashed at --block."""

    name = "tokens"

    @classmethod
    def detect(cls, record):
        return isinstance(record, dict) and "tokens" in record

    def parse(self, record, index):
        from dynlab.routing.hashing import block_hashes

        tokens = record.get("tokens")
        if "tokens" not in record:
            raise ValueError("missing field 'tokens'")
        if not isinstance(tokens, list):
            raise ValueError("field 'tokens' must be a list of ints")
        hashes = block_hashes(tokens, self.block)
        return Request(tuple(hashes), input_length=len(tokens),
                       output_length=_number(record, "output_length", False, 0),
                       timestamp=_number(record, "timestamp", False, None), index=index)
