"""Trace reading: JSONL request traces streamed line by line as :class:`Request` s.

Formats are plugins (hook ``dynlab_register_trace_formats``, interface
:class:`dynlab.traces.format.TraceFormat`); the built-ins, in ``dynlab_builtins.trace_formats``, are
``mooncake`` (Mooncake's ``hash_ids`` of 512-token blocks, already prefix-chained)
and ``tokens`` (``{"tokens": [ints]}`` hashed with :func:`dynlab.routing.hashing.block_hashes`).
Built-in traces ship inside the package (see :data:`BUILTIN_TRACES`); :mod:`dynlab.traces.sources` opens a
trace's bytes (a built-in name, a file, stdin).
"""
from __future__ import annotations

import gzip
import json
import zlib
from typing import Iterator, Optional

from dynlab.limits import HORIZON_MS, MAX_OUTPUT_TOKENS, output_too_long
from dynlab.errors import DynlabError, InputError
from dynlab.routing.strategy import NO_ATTRS, Request
from dynlab.slots import quick_replacer
from dynlab.traces.bundled import BUILTIN_TRACES  # noqa: F401  (its public name here: dynlab.traces, tests)
from dynlab.traces.format import TraceFormat
from dynlab.traces.sources import keep_stdin, open_source  # noqa: F401  (keep_stdin: the CLI's)



_DECODER = json.JSONDecoder()
#: ``dataclasses.replace(request, attrs=)``, faster
_with_attrs = quick_replacer(Request, ("attrs",))
#: the message for a line nested deeper than Python's JSON decoder can follow
NESTED = "not JSON a request can be: nested too deeply"


def _decoded(lines, name: str):
    """``(line number, bytes)`` -> ``(line number, str)``; a line that is not UTF-8 raises ``FILE:LINE``."""
    for lineno, raw in lines:
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(name, lineno, "not UTF-8 text") from None


class TraceRequests(list):
    """A loaded trace: a list of :class:`Request` plus ``block_tokens`` (tokens per block of its names)."""

    block_tokens: int = 16
    #: the format's own block size (``TraceFormat.block_tokens``), ``None`` when it hashes at ``--block``
    own_block_tokens: Optional[int] = None
    #: a workload spec's closed-loop ``(users, think time ms)`` (:attr:`dynlab.traces.workload.Workload.closed`)
    closed: Optional[tuple] = None
    #: a workload spec's closed session turns ``{index: (previous index, think ms)}``
    #: (:attr:`dynlab.traces.workload.Workload.follows`)
    follows: Optional[dict] = None


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
    An unknown source, or a file that cannot be opened, raises :class:`~dynlab.errors.InputFileError`.

    Time order is checked as the lines stream (a streaming reader cannot sort): every
    request has a timestamp or none does, and timestamps never decrease; otherwise
    :class:`InputError` names the first offending line. So it does for a timestamp past the simulated
    clock's horizon (:data:`~dynlab.limits.HORIZON_MS`, 10^12 ms) and for a request whose
    ``input_length`` / ``output_length`` is not an int >= 0 (whatever the format), or whose
    ``output_length`` is over :data:`~dynlab.limits.MAX_OUTPUT_TOKENS` (10,000,000 tokens).
    """
    requests, total, reader = open_reader(path_or_name, fmt, block, registry, scheme)
    return requests, total, reader.block_tokens or block


def open_reader(path_or_name: str, fmt: Optional[str] = None, block: int = 16,
                registry=None, scheme: str = "dynlab",
                trace_block: Optional[int] = None,
                tokenizer: Optional[str] = None,
                hash_lookahead: int = 0, keep_failed: bool = False) -> tuple[Iterator[Request], Optional[int], TraceFormat]:
    """:func:`open_trace`, returning the format's reader (its ``name`` and ``block_tokens``) last.

    ``trace_block``: tokens per block of a trace that names its own blocks (``--trace-block``;
    ``None``: the format's, 512 for Mooncake); ``ValueError`` for a format that hashes tokens.
    ``tokenizer``: a ``tokenizer.json`` for formats whose rows carry text (``--tokenizer``;
    :mod:`dynlab.traces.text`); ``ValueError`` for a format without text. Formats that read their
    file whole (``TraceFormat.whole_file``: CSV, JSON arrays, sessions) read it here, at once.
    ``hash_lookahead``: tokens after each block its name covers (vLLM's EAGLE hash lookahead,
    :func:`dynlab.engine.spec.hash_lookahead_tokens`), set on formats that hash tokens.
    ``keep_failed``: replay the failed requests a format records (``--keep-failed``,
    :attr:`TraceFormat.records_failed`); ``ValueError`` for a format that records none, or a trace without one.
    """
    from dynlab import plugins

    registry = registry if registry is not None else plugins.trace_formats()
    if fmt is not None:
        registry.get(fmt)  # unknown names fail before any reading
    stream, name, total = open_source(path_or_name)
    try:
        lines, (lineno, record), reader, numbered = _first(stream, name, fmt, block, registry)
        if scheme != "dynlab":
            if not reader.hashes_tokens:
                raise ValueError(f"--hash has no effect on {reader.name} traces: they carry their own block names "
                                 f"(--hash {scheme} names blocks of hashed tokens); leave it at dynlab")
            reader.hash_scheme = scheme
        if hash_lookahead and reader.hashes_tokens:
            reader.hash_lookahead = hash_lookahead
        if trace_block is not None:
            if reader.block_tokens is None:
                raise ValueError(f"--trace-block has no effect: {reader.name} traces are hashed at --block; "
                                 f"it applies to traces that name their own blocks (mooncake)")
            reader.block_tokens = trace_block
        if tokenizer is not None:
            if not reader.reads_text:
                raise ValueError(f"--tokenizer has no effect on {reader.name} traces: they carry no text")
            reader.tokenizer = tokenizer
        if keep_failed:
            if not reader.records_failed:
                raise ValueError(f"--keep-failed has no effect on {reader.name} traces: they record no failed "
                                 "request (burstgpt's rows with Response tokens 0 are)")
            reader.keep_failed = True
        if reader.whole_file:
            with stream:
                requests = _whole(reader, (lineno, record), lines, name)
            return iter(requests), len(requests), reader
        _unknown_fields(reader, record, name, lineno)
    except BaseException:
        stream.close()
        raise
    return _requests(stream, numbered, name, reader, lineno, record), total, reader


class TraceWarning(UserWarning):
    """A trace held fields its format does not use (one warning per trace, naming them)."""


def _unknown_fields(reader: TraceFormat, record, name: str, lineno: int) -> None:
    """One :class:`TraceWarning` ``FILE:LINE: FORMAT fields not used by dynlab: ...`` when the first record
    of a streamed format holds fields outside its ``fields`` and ``attributes`` (a typo'd name, or a field
    the format ignores, such as ``output_tokens`` on a Mooncake row), as :func:`_whole` warns for the formats read whole. Only
    the first record is checked: the rows of a trace share their fields, and the replay's loop stays as it is."""
    known = reader.fields
    if known is None or type(record) is not dict or record.keys() <= known:
        return
    known = known | reader.attributes  # carried as request attributes: used
    if record.keys() <= known:
        return
    import warnings

    extra = ", ".join(sorted(set(record) - known))
    warnings.warn(TraceWarning(f"{name}:{lineno}: {reader.name} fields not used by dynlab: {extra} (the format "
                               f"reads {', '.join(sorted(known))})"), stacklevel=4)


def _whole(reader: TraceFormat, first: tuple, lines, name: str) -> list:
    """The requests of a format that reads its file whole (:meth:`TraceFormat.read_all`), checked as
    :func:`open_trace` checks streamed ones (lengths, time order, the horizon), with one
    :class:`TraceWarning` naming the fields the format did not use."""
    import warnings

    with _read_errors(name):
        requests = reader.read_all(first, lines, name)
    if reader.keep_failed and not reader.failed:
        raise ValueError(f"--keep-failed has no effect: {name} holds no failed request")
    if reader.failed and not reader.keep_failed:
        warnings.warn(TraceWarning(f"{name}: skipped {reader.failed:,} failed request(s) ({reader.name} rows that "
                                   "got no answer, as vLLM's loader drops them); --keep-failed replays them as "
                                   "prompts without an answer"), stacklevel=3)
    last = 0.0
    for req in requests:
        if type(req.input_length) is not int or type(req.output_length) is not int or \
                req.input_length < 0 or req.output_length < 0:
            raise DynlabError(f"{name}: request {req.index}: {_bad_lengths(req)}")
        ts = req.timestamp
        if ts is not None:
            if ts < last:
                raise DynlabError(f"{name}: request {req.index} arrives before the previous one: a format's "
                                  "read_all must return requests in time order")
            if not ts <= HORIZON_MS:
                raise DynlabError(f"{name}: request {req.index}'s timestamp {ts:g} ms is past the simulated "
                                  f"clock's horizon ({HORIZON_MS:g} ms, 31.7 years)")
            last = ts
    if not requests:
        raise DynlabError(f"{name}: the trace holds no request")
    if (requests[0].timestamp is None) != (requests[-1].timestamp is None):
        raise DynlabError(f"{name}: some requests have a timestamp and others none")
    if reader.unused:
        warnings.warn(TraceWarning(f"{name}: {reader.name} fields not used by dynlab: "
                                   f"{', '.join(sorted(reader.unused))}"), stacklevel=3)
    return requests


def _first(stream, name, fmt, block, registry):
    """Read up to the first non-blank line: ``(remaining lines, (its number, its record), reader, numbered)``;
    ``numbered``: the ``(line number, bytes)`` iterator under the remaining (decoded) lines, at the same place."""
    numbered = enumerate(stream, 1)
    lines = _decoded(numbered, name)
    with _read_errors(name):
        for lineno, line in lines:
            if line.strip():
                break
        else:
            raise DynlabError(f"{name}: the trace holds no request")
    text_format = _text_format(line, fmt, registry)
    if text_format is not None:  # a whole-file format whose first line is not a JSON record (CSV, a JSON array)
        return lines, (lineno, line), text_format(block), numbered
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(name, lineno, _header_mismatch(line, fmt, registry) or f"not JSON: {exc.msg}") from None
    except RecursionError:
        raise InputError(name, lineno, NESTED) from None
    return lines, (lineno, record), _reader(record, name, lineno, fmt, block, registry), numbered


def _header_mismatch(line: str, fmt, registry) -> Optional[str]:
    """What a first line that is not JSON lacks to be a header (:meth:`TraceFormat.header_mismatch`): of the
    format ``fmt`` when given, else of every format that answers; ``None`` when none does."""
    if fmt is not None:
        why = registry.get(fmt).header_mismatch(line)
        return None if why is None else f"the header lacks column(s) {why} of the {fmt} format"
    whys = [f"{e.name} needs {why}" for e in registry.entries() if (why := e.cls.header_mismatch(line)) is not None]
    return f"the header is no known trace format's: {'; '.join(whys)}" if whys else None


class _read_errors:
    """Turn decompression and decoding failures into a one-line :class:`DynlabError`."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, (EOFError, gzip.BadGzipFile, zlib.error)):
            raise DynlabError(f"{self.name}: cannot read: {exc}") from None
        return False


def _requests(stream, numbered, name, reader, lineno, record) -> Iterator[Request]:
    """Parse the first record, then read, decode and parse line by line (the replay's hot path);
    ``numbered``: the ``(line number, bytes)`` lines after the first record's (decoded here, as
    :func:`_decoded` does, without a generator between)."""
    parse = reader.parse
    attrs_of = reader.attrs_of
    attributes = reader.attributes or None  # fields carried as Request.attrs (TraceFormat.attributes)
    raw_decode = _DECODER.raw_decode  # json.loads minus two wrapper layers; the line's end is checked below
    index = 0
    timed = None  # whether the trace's requests carry timestamps (decided by the first)
    last = 0.0
    with stream, _read_errors(name):
        while True:
            if type(record) is not dict:
                raise InputError(name, lineno, "expected a JSON object")
            try:
                req = parse(record, index)
                if attributes is not None and not attributes.isdisjoint(record) and req.attrs is NO_ATTRS:
                    attrs = attrs_of(record)
                    if attrs:
                        req = _with_attrs(req, attrs)
            except ValueError as exc:
                raise InputError(name, lineno, str(exc)) from None
            if type(req.input_length) is not int or type(req.output_length) is not int or \
                    req.input_length < 0 or req.output_length < 0:
                raise InputError(name, lineno, _bad_lengths(req))
            if req.output_length > MAX_OUTPUT_TOKENS:
                raise InputError(name, lineno, output_too_long(req.output_length))
            ts = req.timestamp
            if timed is None:
                timed = ts is not None
            elif (ts is not None) != timed:
                raise InputError(name, lineno, _mixed_timestamps(timed))
            if ts is not None:
                if ts < last or not ts <= HORIZON_MS:
                    raise InputError(name, lineno, _bad_timestamp(ts, last))
                last = ts
            yield req
            index += 1
            for lineno, line in numbered:
                try:  # the fast path: one JSON value, then at most the line's end
                    line = line.decode("utf-8")
                    record, end = raw_decode(line)
                    if end == len(line) - 1 or end == len(line) or line[end:].isspace():
                        break
                except (json.JSONDecodeError, RecursionError, UnicodeDecodeError):
                    pass
                record = _slow_record(line, name, lineno)
                if record is not _BLANK:
                    break
            else:
                return


#: what :func:`_slow_record` returns for a blank line (skipped)
_BLANK = object()


def _slow_record(line, name: str, lineno: int):
    """The record of a line the fast path of :func:`_requests` did not read (``line``: its text, or its bytes
    when they are not UTF-8), or :data:`_BLANK` for a blank line. Leading whitespace is fine (as for
    ``json.loads``); raises :class:`InputError` for bytes that are not UTF-8, a line that is not one JSON
    value (trailing data among them: ``json`` says what is wrong) or one nested too deeply."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(name, lineno, "not UTF-8 text") from None
    if not line.strip():
        return _BLANK
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(name, lineno, f"not JSON: {exc.msg}") from None
    except RecursionError:
        raise InputError(name, lineno, NESTED) from None


def _mixed_timestamps(timed: bool) -> str:
    """The error for a request whose timestamp is there when the first request's is not, or the reverse
    (``timed``: whether the first request has one)."""
    return ("this request has no timestamp but the first has one; " if timed else
            "this request has a timestamp but the first has none; ") + \
        "a trace gives every request a timestamp or none"


def _bad_timestamp(ts: float, last: float) -> str:
    """The error for a timestamp (ms) earlier than the previous request's ``last``, or past the clock's horizon."""
    if ts < last:
        return (f"timestamp {ts} is earlier than the previous request's {last}; the trace must be in time "
                "order (sort it by timestamp)")
    return f"timestamp {ts:g} ms is past the simulated clock's horizon ({HORIZON_MS:g} ms, 31.7 years)"


def _bad_lengths(req: Request) -> str:
    """What is wrong with a parsed request's token counts (a format plugin's, or a built-in's)."""
    for key in ("input_length", "output_length"):
        v = getattr(req, key)
        if type(v) is not int:
            return f"{key} must be an integer, got {v!r}"
        if v < 0:
            return f"{key} must not be negative, got {v!r}"
    return ""


def _text_format(line: str, fmt, registry):
    """The whole-file format class whose :meth:`~TraceFormat.detect_text` claims ``line`` (the named
    ``fmt`` only, when given), else ``None``."""
    if fmt is not None:
        cls = registry.get(fmt)
        return cls if cls.whole_file and cls.detect_text(line) else None
    for entry in registry.entries():
        if entry.cls.whole_file and entry.cls.detect_text(line):
            return entry.cls
    return None


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
               scheme: str = "dynlab", trace_block: Optional[int] = None,
               tokenizer: Optional[str] = None, hash_lookahead: int = 0, keep_failed: bool = False) -> TraceRequests:
    """The whole trace as a list of requests (for runs that replay it many times), with ``block_tokens``.

    Same arguments (``scheme``: the hash scheme; ``tokenizer``: a tokenizer.json for text;
    ``hash_lookahead``: EAGLE's hash lookahead; ``keep_failed``: a trace's failed requests) and errors as
    :func:`open_reader`.
    """
    if path_or_name == "-":
        keep_stdin()  # loaded whole anyway; a second configuration (another block, hash or lookahead) reads it again
    requests, _, reader = open_reader(path_or_name, fmt, block, scheme=scheme, trace_block=trace_block,
                                      tokenizer=tokenizer, hash_lookahead=hash_lookahead, keep_failed=keep_failed)
    out = TraceRequests(requests)
    out.block_tokens = reader.block_tokens or block
    out.own_block_tokens = reader.block_tokens
    return out


def own_block_tokens(path_or_name: str, fmt: Optional[str] = None, block: int = 16) -> Optional[int]:
    """The block size the trace's format names its blocks at (512 for Mooncake), or ``None`` when the
    format hashes tokens at ``--block`` (or the source is stdin, which cannot be read twice).

    Reads only the first request's line (to detect the format when ``fmt`` is ``None``); raises
    what :func:`open_trace` raises for that line.
    """
    from dynlab import plugins

    registry = plugins.trace_formats()
    if fmt is not None:
        return registry.get(fmt).block_tokens
    if path_or_name == "-":
        return None
    stream, name, _ = open_source(path_or_name)
    with stream:
        _, _, reader, _ = _first(stream, name, fmt, block, registry)
    return reader.block_tokens
