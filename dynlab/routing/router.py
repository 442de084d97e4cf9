"""The seed's KV-aware router ``KvRouter``.

Reproduces lab 000 steps 3-5 (``KvRouter`` with ``use_events``); block names come
from :func:`dynlab.routing.hashing.block_hashes`, and the router's index is a
:class:`dynlab.routing.index.KvIndex`.
"""
from __future__ import annotations

import heapq
from typing import Hashable, Iterable, Optional, Sequence

from dynlab.routing.events import AllBlocksCleared, BlockRemoved, BlockStored
from dynlab.routing.hashing import HASH_SCHEMES, block_hashes
from dynlab.routing.index import KvIndex


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

    ``scheme`` names blocks in :meth:`route` (:data:`dynlab.routing.hashing.HASH_SCHEMES`:
    ``dynlab``, or ``dynamo`` for NVIDIA Dynamo's hashes). The index holds names of
    ``block`` tokens: a ``BlockStored`` event hashed at another ``block_size`` is refused
    and counted (:attr:`refused`), as is one whose parent the worker does not hold.
    ``index``: the index to keep (default a new :class:`KvIndex` of ``block``); a
    :class:`~dynlab.routing.run_index.RunIndex` (the same answers) works per run when events and
    requests carry runs (:meth:`route_hashes`).

    Raises ``ValueError`` for ``n_workers < 1``, ``block < 1``, an unknown scheme, an ``index`` of
    another block size or a bad worker index.
    """

    def __init__(self, n_workers: int, block: int = 16, use_events: bool = False, scheme: str = "dynlab",
                 index: Optional[KvIndex] = None):
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
            raise ValueError(f"n_workers must be an int >= 1, got {n_workers!r}")
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be an int >= 1, got {block!r}")
        if scheme not in HASH_SCHEMES:
            raise ValueError(f"unknown hash scheme {scheme!r} (schemes: {', '.join(HASH_SCHEMES)})")
        self.n_workers = n_workers
        self.block = block
        self.use_events = use_events
        self.scheme = scheme
        if index is not None and index.block_size != block:
            raise ValueError(f"the index holds blocks of {index.block_size} tokens, the router {block}")
        self.index = KvIndex(block) if index is None else index
        self.counts = [0] * n_workers
        self._heap = [(0, w) for w in range(n_workers)]  # (count, worker), one per worker; see _least_loaded
        self._gone: set = set()  # retired workers (remove_worker): never routed again, their heap entries dropped
        self.last_overlap = 0

    def add_worker(self, worker: int) -> None:
        """Worker ``worker`` joins (an elastic fleet; ids are never reused, ``worker >= n_workers`` grows the
        router to ``worker + 1`` workers, those in between not routable until added). Raises ``ValueError`` for
        a worker already added or retired."""
        if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0 or worker in self._gone or (
                worker < self.n_workers and any(w == worker for _, w in self._heap)):
            raise ValueError(f"worker {worker!r} cannot join: already added or retired")
        if worker >= self.n_workers:
            self.counts.extend([0] * (worker + 1 - self.n_workers))
            self.n_workers = worker + 1
        heapq.heappush(self._heap, (self.counts[worker], worker))

    def remove_worker(self, worker: int) -> None:
        """Worker ``worker`` leaves for good: its blocks leave the index and it is never routed to again."""
        self._check_worker(worker)
        self._gone.add(worker)
        self.index.clear(worker)

    def route(self, tokens: Sequence[int], *, lora_name: Optional[str] = None,
              cache_salt: Optional[str] = None) -> int:
        """Pick a worker for a prompt of ``tokens`` (ints); see the class docstring for the rules.

        ``lora_name`` / ``cache_salt``: vLLM's extra keys (:func:`dynlab.routing.hashing.block_hashes`).
        """
        return self.route_hashes(block_hashes(tokens, self.block, scheme=self.scheme,
                                              lora_name=lora_name, cache_salt=cache_salt))

    def _least_loaded(self) -> int:
        """The worker with the fewest routed requests, lowest index first.

        The heap holds one ``(count, worker)`` entry per worker whose count may lag
        behind (counts only grow): a stale top is refreshed in place until the top is
        current, which makes it the true minimum. Routing itself never touches the heap.
        """
        heap, counts, gone = self._heap, self.counts, self._gone
        while True:
            c, w = heap[0]
            if gone and w in gone:
                heapq.heappop(heap)  # a retired worker's entry (an elastic fleet keeps one routable worker)
                continue
            current = counts[w]
            if c == current:
                return w
            heapq.heapreplace(heap, (current, w))

    def route_hashes(self, hashes: Sequence[Hashable], runs: Optional[Sequence[tuple]] = None) -> int:
        """Like :meth:`route` for precomputed block names (a trace's ``hash_ids``). ``runs``: the same
        names as ``(first name, count)`` runs (``Request.runs``), which a ``RunIndex`` reads instead of
        the names (the same answer); a :class:`KvIndex` reads the names."""
        counts = self.counts
        matches = self.index.find_matches(hashes, runs) if hashes else None
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

    @property
    def refused(self) -> dict:
        """Stored events refused so far: ``{"block_size": n, "parent": m, "stored": events seen}``."""
        return self.index.refusals()

    def on_event(self, worker, hashes: Optional[Iterable[Hashable]] = None) -> bool:
        """Apply a KV event: ``on_event(BlockStored(...))`` (or ``BlockRemoved``, ``AllBlocksCleared``),
        or the lab's short form ``on_event(worker, hashes)`` (stored, unchecked).

        Returns False when the event was refused (:meth:`KvIndex.apply_event`: another block
        size, or a parent the worker does not hold).
        """
        if hashes is None and type(worker) in (BlockStored, BlockRemoved, AllBlocksCleared):
            self._check_worker(worker.worker)
            return self.index.apply_event(worker)
        self._check_worker(worker)
        self.index.apply_stored(worker, hashes)
        return True

    def on_removed(self, worker: int, hashes: Iterable[Hashable]) -> None:
        """A worker reports that it evicted ``hashes`` (a ``BlockRemoved`` event)."""
        self._check_worker(worker)
        self.index.apply_removed(worker, hashes)

    def on_cleared(self, worker: int) -> None:
        """A worker reports that it dropped every block (``AllBlocksCleared``)."""
        self._check_worker(worker)
        self.index.clear(worker)
