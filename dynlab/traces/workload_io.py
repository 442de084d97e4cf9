"""Workload specs served or written: the rows of the registered workload a spec names turned into
requests (``sim --workload SPEC``) or written as a token or Mooncake trace (``dynlab workload SPEC
--out FILE``). The interface (:class:`~dynlab.traces.workload.Workload`) and the spec reader are in
:mod:`dynlab.traces.workload`.
"""
from __future__ import annotations

import json
from typing import Iterable, Iterator

from dynlab.traces.format import ATTRIBUTES
from dynlab.traces.workload import SpecError, Workload, load_spec

#: ``--format`` values of ``dynlab workload``: a token trace, or a Mooncake trace of 512-token blocks
WRITE_FORMATS = ("token", "mooncake")
#: tokens per ``hash_id`` of a written Mooncake trace (Mooncake's own)
MOONCAKE_BLOCK = 512


def open_workload(path: str, registry=None) -> Workload:
    """The workload of the spec file ``path``, checked (:func:`load_spec`; the ``generator`` looked up
    in the ``workload`` registry, default ``synthetic``). Raises :class:`SpecError` for a bad spec or
    an unknown generator, :class:`~dynlab.errors.InputFileError` for a file that cannot be opened."""
    from dynlab import plugins

    spec = load_spec(path)
    registry = registry if registry is not None else plugins.workloads()
    name = spec.get("generator", "synthetic")
    if not isinstance(name, str) or name not in registry:
        raise SpecError(path, "generator", f"unknown workload {name!r}; available: {', '.join(registry.names())}")
    return registry.get(name)(spec, path)


def workload_requests(path: str, block: int = 16, scheme: str = "dynlab", lookahead: int = 0):
    """The requests of the spec ``path`` (a :class:`~dynlab.traces.reader.TraceRequests`): each row's
    tokens hashed at ``block`` tokens per block with ``scheme``, as a ``tokens`` trace of the same
    rows is (a row's ``output_tokens`` too: :func:`dynlab.traces.replies.reply_names`; its standard request
    attributes, ``priority``, ``tenant``, ``user``, ``lora_name``, ``session_id``, ``class``, as ``Request.attrs``,
    :data:`dynlab.traces.format.ATTRIBUTES`), each name covering the
    ``lookahead`` tokens after its block (:func:`dynlab.routing.hashing.lookahead_names`); its ``closed``
    and ``follows`` are the workload's (:attr:`dynlab.traces.workload.Workload.closed`). Raises what :func:`open_workload` raises."""
    from dynlab.routing.strategy import NO_ATTRS, Request
    from dynlab.traces.reader import TraceRequests
    from dynlab.traces.replies import request_names

    out = TraceRequests()
    workload = open_workload(path)
    for i, row in enumerate(workload.rows()):
        toks = row["tokens"]
        attrs = _attrs(row, path, i) if not _STANDARD.isdisjoint(row) else NO_ATTRS
        names, replied = request_names(toks, row.get("output_tokens"), block, scheme=scheme, lookahead=lookahead,
                                       lora_name=attrs.get("lora_name"))  # (vLLM's extra key, as a tokens trace's)
        out.append(Request(names, len(toks), row["output_length"], row["timestamp"], i, output_hashes=replied,
                           attrs=attrs))
    out.block_tokens, out.own_block_tokens = block, None
    out.closed, out.follows = workload.closed, workload.follows
    return out


#: the standard request attributes a workload's rows may give
_STANDARD = frozenset(ATTRIBUTES)


def _attrs(row: dict, path: str, i: int):
    """A workload row's standard attributes, checked (:func:`dynlab.traces.format.check_attribute`), read-only;
    :class:`SpecError` naming the row for a wrong type."""
    from types import MappingProxyType

    from dynlab.traces.format import check_attribute

    try:
        found = {k: check_attribute(k, v) for k, v in row.items() if k in _STANDARD and v is not None}
    except ValueError as exc:
        raise SpecError(path, "generator", f"row {i}: {exc}") from None
    from dynlab.routing.strategy import NO_ATTRS

    return MappingProxyType(found) if found else NO_ATTRS


def mooncake_rows(rows: Iterable[dict], block: int = MOONCAKE_BLOCK) -> Iterator[dict]:
    """Token rows as Mooncake rows: ``timestamp``, ``input_length``, ``output_length`` and ``hash_ids``
    (a row's ``output_tokens`` are dropped: Mooncake rows have no field for them),
    one id per ``block``-token block (the last one partial), chained: two rows share id ``i`` exactly
    when they share every token up to the end of block ``i``. Ids count from 0 in order of first use."""
    ids: dict = {}
    for row in rows:
        toks, parent, hashes = row["tokens"], -1, []
        for s in range(0, len(toks), block):
            key = (parent, tuple(toks[s:s + block]))
            parent = ids.setdefault(key, len(ids))
            hashes.append(parent)
        yield {"timestamp": row["timestamp"], "input_length": len(toks), "output_length": row["output_length"],
               "hash_ids": hashes}


def write_workload(spec_path: str, out: str, fmt: str = "token") -> int:
    """Generate the spec ``spec_path`` and write it to ``out`` as a ``token`` or ``mooncake`` trace
    (JSON lines), atomically (:func:`dynlab.atomic.replace_file`: a failure leaves ``out`` as it was).
    Returns the number of requests written. Raises what :func:`open_workload` raises (and
    :class:`SpecError` for closed-loop arrivals or closed session turns, which a trace cannot express),
    ``ValueError`` for an unknown ``fmt``."""
    from dynlab.atomic import replace_file

    if fmt not in WRITE_FORMATS:
        raise ValueError(f"format must be one of {', '.join(WRITE_FORMATS)}, got {fmt!r}")
    workload = open_workload(spec_path)
    rows = list(workload.rows())  # generated (and checked) before anything is written
    if workload.closed is not None or workload.follows:  # a trace's timestamps cannot say "after the answer"
        key = "arrival" if workload.closed is not None else "sessions.closed"
        raise SpecError(spec_path, key, "a trace has no field for requests sent after an answer; replay the "
                                        "spec itself (dynlab sim --timing --workload SPEC)")
    if fmt == "mooncake":
        rows = list(mooncake_rows(rows))

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, separators=(", ", ": ")) + "\n")

    replace_file(out, write)
    return len(rows)


__all__ = ["open_workload", "workload_requests", "mooncake_rows", "write_workload", "WRITE_FORMATS",
           "MOONCAKE_BLOCK"]
