"""Recorded KV-event streams: read vLLM's ``KVEventBatch`` frames, write them, replay them into ``KvIndex``.

Two framings (the layout inside is vLLM's, ``vllm/distributed/kv_events.py``):

- **msgpack frames**: a sequence of records, each ``seq`` (8 bytes, big-endian unsigned: the
  sequence-number frame of vLLM's ZMQ publisher), ``length`` (4 bytes, big-endian unsigned),
  then ``length`` bytes: one msgpack ``KVEventBatch`` (the payload frame), the array
  ``[ts, [event, ...], data_parallel_rank]`` (the rank may be missing or nil).
  Each event is an array tagged by its type name, fields in vLLM's order:
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, ...]``,
  ``["BlockRemoved", block_hashes, medium, ...]``, ``["AllBlocksCleared"]``; trailing fields
  may be omitted (vLLM encodes with ``omit_defaults``), later ones are ignored. Block hashes
  are ints or byte strings (vLLM's ``ExternalBlockHash``).
- **JSON lines**: one batch per line, ``{"seq": n, "ts": t, "events": [...], "dp_rank": r}``
  with the same event arrays (``seq`` and ``dp_rank`` optional; a ``"worker"`` key names
  the worker instead of ``dp_rank``, and then a ``dp_rank`` with it is the events' ``dp_rank``: the
  publishing worker's attention-DP rank, as dynlab's ``--dp-attention`` ranks write it). A file whose first
  byte is ``{`` is JSON lines. The events' ``dp_rank`` round-trips through JSON lines only (a msgpack
  frame carries vLLM's one number per batch, read as the worker).

Needs the ``msgpack`` package (``pip install 'dynlab[events]'``) for the msgpack framing only.
"""
from __future__ import annotations

import json
import struct
from typing import Iterator, Optional

from dynlab.errors import DynlabError, InputError, InputFileError
from dynlab.limits import MAX_WORKERS
from dynlab.routing.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch
from dynlab.routing.index import KvIndex

_HEADER = struct.Struct(">QI")  # seq, payload length


def _names(value, what: str) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a list of block hashes, got {value!r}")
    for h in value:
        if isinstance(h, bool) or not isinstance(h, (int, bytes)):
            raise ValueError(f"{what} holds {h!r}, not an int or bytes block hash")
    return tuple(value)


def _opt_str(value, what: str) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{what} must be a string or null, got {value!r}")
    return value


def decode_event(raw, worker: int, dp_rank: Optional[int] = None):
    """One vLLM event array (module docstring) as a :mod:`dynlab.routing.events` event of ``worker`` (and
    ``dp_rank``, its attention-DP rank; ``None``: not said).

    Raises ``ValueError`` saying what is wrong.
    """
    if not isinstance(raw, (list, tuple)) or not raw or not isinstance(raw[0], str):
        raise ValueError(f"an event must be an array tagged by its type name, got {raw!r}")
    tag, n = raw[0], len(raw)
    if tag == "BlockStored":
        if n < 5:
            raise ValueError(f"BlockStored needs block_hashes, parent_block_hash, token_ids and block_size, got {raw!r}")
        hashes = _names(raw[1], "block_hashes")
        parent = raw[2]
        if parent is not None and (isinstance(parent, bool) or not isinstance(parent, (int, bytes))):
            raise ValueError(f"parent_block_hash must be a block hash or null, got {parent!r}")
        tokens = raw[3]
        if tokens is not None and (not isinstance(tokens, (list, tuple))
                                   or any(type(t) is not int for t in tokens)):
            raise ValueError("token_ids must be a list of ints")
        size = raw[4]
        if type(size) is not int or size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {size!r}")
        medium = _opt_str(raw[6] if n > 6 else None, "medium") or "GPU"
        lora = _opt_str(raw[7] if n > 7 else None, "lora_name")
        return BlockStored(worker, hashes, parent, tuple(tokens) if tokens is not None else None, size, lora, medium,
                           dp_rank)
    if tag == "BlockRemoved":
        if n < 2:
            raise ValueError(f"BlockRemoved needs block_hashes, got {raw!r}")
        return BlockRemoved(worker, _names(raw[1], "block_hashes"), _opt_str(raw[2] if n > 2 else None, "medium") or "GPU",
                            dp_rank)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared(worker, dp_rank)
    raise ValueError(f"unknown event type {tag!r} (BlockStored, BlockRemoved, AllBlocksCleared)")


def _batch(ts, events, seq: int, rank, worker=None) -> KvEventBatch:
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise ValueError(f"ts must be a number, got {ts!r}")
    if not isinstance(events, (list, tuple)):
        raise ValueError(f"events must be a list, got {events!r}")
    for name, v in (("dp_rank", rank), ("worker", worker)):
        if v is not None and (type(v) is not int or v < 0):
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if v is not None and v >= MAX_WORKERS:  # the index keeps a bit per worker id: ids are small numbers here
            raise ValueError(f"{name} {v} is above dynlab's largest worker id ({MAX_WORKERS - 1:,}): number the "
                             "recording's workers 0, 1, ... (a Dynamo lease id is not one)")
    w = worker if worker is not None else (rank if rank is not None else 0)
    r = rank if worker is not None else None  # a worker's attention-DP rank, beside its number
    return KvEventBatch(float(ts), tuple(decode_event(e, w, r) for e in events), seq, w)


def read_batches(path: str) -> Iterator[KvEventBatch]:
    """The batches of a recorded stream (either framing), in file order; ``dp_rank`` holds the worker.

    Raises :class:`~dynlab.errors.InputFileError` for a file that cannot be opened, :class:`DynlabError`
    for a missing ``msgpack`` package and
    :class:`InputError` (``FILE:N: what is wrong``; N is the line, or the record from 1)
    for a bad record.
    """
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise InputFileError(path, f"cannot open: {exc.strerror}") from None
    with f:
        head = f.read(1)
        f.seek(0)
        if head in (b"", b"{", b"[", b" ", b"\n"):  # an empty file read as JSON lines: no msgpack needed to say so
            yield from _json_batches(path, f)
        else:
            yield from _msgpack_batches(path, f)


def _json_batches(path, f) -> Iterator[KvEventBatch]:
    for lineno, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(path, lineno, f"not JSON: {getattr(exc, 'msg', exc)}") from None
        except RecursionError:
            raise InputError(path, lineno, "not JSON a batch can be: nested too deeply") from None
        try:
            if not isinstance(rec, dict):
                raise ValueError("expected a JSON object with ts and events")
            for key in ("ts", "events"):
                if key not in rec:
                    raise ValueError(f"missing field {key!r}")
            seq = rec.get("seq", lineno - 1)
            if type(seq) is not int or seq < 0:
                raise ValueError(f"seq must be an int >= 0, got {seq!r}")
            yield _batch(rec["ts"], rec["events"], seq, rec.get("dp_rank"), rec.get("worker"))
        except ValueError as exc:
            raise InputError(path, lineno, str(exc)) from None


def _msgpack_batches(path, f) -> Iterator[KvEventBatch]:
    try:
        import msgpack
    except ImportError:
        raise DynlabError(f"{path}: reading msgpack KV-event frames needs msgpack: "
                          f"pip install 'dynlab[events]' (or record JSON lines)") from None
    record = 0
    while True:
        header = f.read(_HEADER.size)
        if not header:
            return
        record += 1
        if len(header) < _HEADER.size:
            raise InputError(path, record, f"truncated record header ({len(header)} of {_HEADER.size} bytes)")
        seq, length = _HEADER.unpack(header)
        payload = f.read(length)
        if len(payload) < length:
            raise InputError(path, record, f"truncated payload ({len(payload)} of {length} bytes)")
        try:
            batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several kinds for bad bytes
            raise InputError(path, record, f"not a msgpack object: {exc}") from None
        try:
            if not isinstance(batch, (list, tuple)) or len(batch) < 2:
                raise ValueError("expected a KVEventBatch array [ts, events, dp_rank]")
            yield _batch(batch[0], batch[1], seq, batch[2] if len(batch) > 2 else None)
        except ValueError as exc:
            raise InputError(path, record, str(exc)) from None


def encode_event(event) -> list:
    """A :mod:`dynlab.routing.events` event as vLLM's tagged array (``lora_id`` written as nil)."""
    if type(event) is BlockStored:
        return ["BlockStored", list(event.hashes), event.parent_block_hash,
                list(event.token_ids) if event.token_ids is not None else [], event.block_size,
                None, event.medium, event.lora_name]
    if type(event) is BlockRemoved:
        return ["BlockRemoved", list(event.hashes), event.medium]
    if type(event) is AllBlocksCleared:
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {event!r}")


def frame(batch: KvEventBatch) -> bytes:
    """One msgpack record of ``batch`` (header + vLLM's ``KVEventBatch`` payload; module docstring)."""
    import msgpack

    payload = msgpack.packb([batch.ts, [encode_event(e) for e in batch.events], batch.dp_rank])
    return _HEADER.pack(batch.seq, len(payload)) + payload


def json_line(batch: KvEventBatch) -> str:
    """One JSON line of ``batch`` (module docstring), without the newline. Byte-string hashes are not JSON.
    A batch whose first event carries a ``dp_rank`` (an attention-DP rank's) is written with ``"worker"``
    (that event's) and ``"dp_rank"`` (its rank), so that :func:`read_batches` gives the same events back."""
    rank = batch.events[0].dp_rank if batch.events else None
    if rank is None:
        return json.dumps({"seq": batch.seq, "ts": batch.ts, "events": [encode_event(e) for e in batch.events],
                           "dp_rank": batch.dp_rank})
    return json.dumps({"seq": batch.seq, "ts": batch.ts, "events": [encode_event(e) for e in batch.events],
                       "worker": batch.events[0].worker, "dp_rank": rank})


def replay_events(path: str, block_size: Optional[int] = None) -> dict:
    """Apply a recorded stream to one :class:`KvIndex` per worker and report what happened.

    ``block_size``: the router's tokens per block; ``None`` takes the first ``BlockStored``'s.
    Stored events of another block size, or whose parent the worker does not hold, are
    refused (:meth:`KvIndex.apply_event`). Returns ``{"file", "batches", "block_size",
    "workers": [{"worker", "stored", "removed", "cleared", "blocks", "refused_parent",
    "refused_block_size"}, ...]}`` (workers in id order; ``stored`` counts applied stored
    events; ``blocks``: distinct blocks held at the end; a worker whose events carry an attention-DP rank
    also has ``"dp_rank"`` after ``"worker"``: its last event's). Errors as :func:`read_batches`, and
    :class:`DynlabError` (``FILE: holds no KV-event batch``) for a file of no batch (empty, or blank lines only):
    a recording that saved nothing is a mistake to name, not a fleet of no worker (as a trace that holds no
    request is, ``traces/reader.py``). A batch of no event is a batch: it is counted.
    """
    if block_size is not None and (type(block_size) is not int or block_size < 1):
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    indexes: dict[int, KvIndex] = {}
    counts: dict[int, list] = {}  # worker -> [stored, removed, cleared]
    ranks: dict[int, int] = {}  # worker -> its events' dp_rank, when they carry one
    batches = 0
    for batch in read_batches(path):
        batches += 1
        for ev in batch.events:
            w = ev.worker
            index = indexes.get(w)
            if index is None:
                index = indexes[w] = KvIndex(block_size)
                counts[w] = [0, 0, 0]
            kind = type(ev)
            if kind is BlockStored and block_size is None:
                block_size = ev.block_size
                for ix in indexes.values():
                    ix.block_size = block_size
            if ev.dp_rank is not None:
                ranks[w] = ev.dp_rank
            if index.apply_event(ev):
                counts[w][0 if kind is BlockStored else 1 if kind is BlockRemoved else 2] += 1
    if not batches:
        raise DynlabError(f"{path}: holds no KV-event batch (an empty recording; docs/events.md has the framing)")
    workers = []
    for w in sorted(indexes):
        ix, (stored, removed, cleared) = indexes[w], counts[w]
        rank = {"dp_rank": ranks[w]} if w in ranks else {}
        workers.append({"worker": w, **rank, "stored": stored, "removed": removed, "cleared": cleared, "blocks": len(ix),
                        "refused_parent": ix.refused_parent, "refused_block_size": ix.refused_block_size})
    return {"file": path, "batches": batches, "block_size": block_size, "workers": workers}
