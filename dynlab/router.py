"""Chained block hashes, prefix overlap, and the seed's KV-aware router ``KvRouter``.

Reproduces lab 000 steps 1-5 (``block_hashes``, ``overlap``, ``KvRouter`` with
``use_events``); the router's index is a :class:`dynlab.index.KvIndex`.
"""
from __future__ import annotations

import hashlib
import heapq
import struct
from typing import Hashable, Iterable, Sequence

from dynlab.index import KvIndex

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_ROOT = b"dynlab-block-hash-v1"


def _check_tokens(tokens: Sequence) -> None:
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not hasattr(t, "__index__"):
            raise ValueError(f"token at position {i} is not an int: {t!r}")
        v = t.__index__()
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise ValueError(f"token at position {i} is outside the signed 64-bit range: {v}")


def block_hashes(tokens: Sequence[int], block: int = 16) -> list[int]:
    """Name each full block of ``block`` tokens; the name of block i identifies blocks 0..i.

    Each token is serialised as 8 little-endian signed bytes (so ``[1, 23]`` and
    ``[12, 3]`` differ), and block i's name is the first 8 bytes of
    ``blake2b(name(i-1) || tokens of block i)`` as an unsigned int (block 0 uses a
    fixed root instead of a parent): a hash chain, as vLLM's prefix caching and
    Dynamo's sequence hashes do. Two sequences share their i-th name exactly when
    their first i+1 blocks are equal (up to 64-bit collisions). A trailing partial
    block gets no name. Deterministic across processes (hashlib, never ``hash()``).

    Returns a list of ``len(tokens) // block`` ints.
    Raises ``ValueError`` for ``block < 1`` or a token that is not an int in the
    signed 64-bit range (naming its position).
    """
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an int >= 1, got {block!r}")
    n_full = len(tokens) // block
    if any(t.__class__ is bool for t in tokens):
        _check_tokens(tokens)
    try:
        data = struct.pack(f"<{len(tokens)}q", *tokens)
    except (struct.error, TypeError):
        _check_tokens(tokens)
        raise
    out = []
    parent = _ROOT
    step = 8 * block
    blake2b = hashlib.blake2b
    for i in range(n_full):
        parent = blake2b(parent + data[i * step : (i + 1) * step], digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


def overlap(hashes: Sequence[Hashable], cached) -> int:
    """How many leading names of ``hashes`` are in ``cached``, stopping at the first missing one.

    ``cached`` is a set (anything supporting ``in``); neither argument is mutated.
    The result is between 0 and ``len(hashes)``.
    """
    n = 0
    for h in hashes:
        if h not in cached:
            break
        n += 1
    return n


class KvRouter:
    """The seed's KV-aware router over ``n_workers`` workers (lab 000 steps 3 and 5).

    ``route`` picks the worker with (1) the largest overlap with the request's
    blocks, then (2) the fewest requests routed to it so far, then (3) the lowest
    index: ``min(workers, key=(-overlap, count, index))``. It then counts the
    request and, unless ``use_events``, records all the request's blocks as held by
    that worker. With ``use_events=True`` the index grows only through
    :meth:`on_event` (the workers' ``BlockStored`` events).

    Per-request cost does not grow with the number of workers: overlaps come from
    :meth:`KvIndex.find_matches`, and the least-loaded worker among those with no
    overlap comes from a heap of ``(count, index)``.

    Raises ``ValueError`` for ``n_workers < 1``, ``block < 1`` or a bad worker index.
    """

    def __init__(self, n_workers: int, block: int = 16, use_events: bool = False):
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
            raise ValueError(f"n_workers must be an int >= 1, got {n_workers!r}")
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be an int >= 1, got {block!r}")
        self.n_workers = n_workers
        self.block = block
        self.use_events = use_events
        self.index = KvIndex()
        self.counts = [0] * n_workers
        self._heap = [(0, w) for w in range(n_workers)]  # (count, worker), one per worker; see _least_loaded
        self.last_overlap = 0

    def route(self, tokens: Sequence[int]) -> int:
        """Pick a worker for a prompt of ``tokens`` (ints); see the class docstring for the rules."""
        return self.route_hashes(block_hashes(tokens, self.block))

    def _least_loaded(self) -> int:
        """The worker with the fewest routed requests, lowest index first.

        The heap holds one ``(count, worker)`` entry per worker whose count may lag
        behind (counts only grow): a stale top is refreshed in place until the top is
        current, which makes it the true minimum. Routing itself never touches the heap.
        """
        heap, counts = self._heap, self.counts
        while True:
            c, w = heap[0]
            current = counts[w]
            if c == current:
                return w
            heapq.heapreplace(heap, (current, w))

    def route_hashes(self, hashes: Sequence[Hashable]) -> int:
        """Like :meth:`route` for precomputed block names (a trace's ``hash_ids``)."""
        counts = self.counts
        matches = self.index.find_matches(hashes) if hashes else None
        if matches:
            best = max(matches.values())
            w = min((counts[k], k) for k, d in matches.items() if d == best)[1] if len(matches) > 1 else \
                next(iter(matches))
            self.last_overlap = best
        else:
            w = self._least_loaded()
            self.last_overlap = 0
        counts[w] += 1
        if not self.use_events:
            self.index.apply_stored(w, hashes)
        return w

    def _check_worker(self, worker: int) -> None:
        if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < self.n_workers:
            raise ValueError(f"worker must be an int in 0..{self.n_workers - 1}, got {worker!r}")

    def on_event(self, worker: int, hashes: Iterable[Hashable]) -> None:
        """A worker reports that it holds ``hashes`` (a ``BlockStored`` event)."""
        self._check_worker(worker)
        self.index.apply_stored(worker, hashes)

    def on_removed(self, worker: int, hashes: Iterable[Hashable]) -> None:
        """A worker reports that it evicted ``hashes`` (a ``BlockRemoved`` event)."""
        self._check_worker(worker)
        self.index.apply_removed(worker, hashes)

    def on_cleared(self, worker: int) -> None:
        """A worker reports that it dropped every block (``AllBlocksCleared``)."""
        self._check_worker(worker)
        self.index.clear(worker)
