"""``KvIndex``: the router's view of which worker holds which blocks.

The index maps each block name to the set of workers that hold it (learned from
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` KV events, or recorded by
a router that remembers where it sent requests). :meth:`KvIndex.find_matches`
answers Dynamo's ``find_matches`` question: for each worker, how many *leading*
blocks of a request it holds.
"""
from __future__ import annotations

from typing import Hashable, Iterable, Sequence


class KvIndex:
    """Block name -> set of workers, plus worker -> set of block names (for ``clear``).

    Worker ids are any hashable (the simulator uses ints ``0..n-1``). Names are the
    chained block hashes of :func:`dynlab.router.block_hashes` or a trace's ``hash_ids``.

    Cost: :meth:`find_matches` walks the request's blocks while the set of
    still-matching workers is non-empty, intersecting it with each block's holders;
    each step costs ``O(min(|still matching|, |holders|))`` set operations, so the
    work grows with the blocks matched, not with workers x blocks. ``apply_*`` cost
    ``O(len(hashes))``; :meth:`clear` costs ``O(blocks the worker holds)``.
    """

    __slots__ = ("_holders", "_blocks")

    def __init__(self) -> None:
        self._holders: dict[Hashable, set] = {}
        self._blocks: dict[Hashable, set] = {}

    def apply_stored(self, worker: Hashable, hashes: Iterable[Hashable]) -> None:
        """Record that ``worker`` now holds each block in ``hashes`` (a ``BlockStored`` event)."""
        holders = self._holders
        mine = self._blocks.get(worker)
        if mine is None:
            mine = self._blocks[worker] = set()
        for h in hashes:
            s = holders.get(h)
            if s is None:
                holders[h] = {worker}
            else:
                s.add(worker)
            mine.add(h)

    def apply_removed(self, worker: Hashable, hashes: Iterable[Hashable]) -> None:
        """Record that ``worker`` no longer holds the blocks in ``hashes`` (a ``BlockRemoved`` event).

        Unknown blocks are ignored (events may arrive late or twice).
        """
        holders = self._holders
        mine = self._blocks.get(worker)
        if mine is None:
            return
        for h in hashes:
            if h in mine:
                mine.discard(h)
                s = holders[h]
                s.discard(worker)
                if not s:
                    del holders[h]

    def clear(self, worker: Hashable) -> None:
        """Forget every block of ``worker`` (an ``AllBlocksCleared`` event)."""
        holders = self._holders
        for h in self._blocks.pop(worker, ()):
            s = holders[h]
            s.discard(worker)
            if not s:
                del holders[h]

    def holders(self, block: Hashable) -> frozenset:
        """The workers holding ``block`` (empty when none)."""
        return frozenset(self._holders.get(block, ()))

    def blocks(self, worker: Hashable) -> frozenset:
        """The blocks ``worker`` holds according to the index."""
        return frozenset(self._blocks.get(worker, ()))

    def __len__(self) -> int:
        """Number of distinct blocks held by at least one worker."""
        return len(self._holders)

    def find_matches(self, hashes: Sequence[Hashable]) -> dict:
        """Worker -> number of leading blocks of ``hashes`` it holds (contiguous from block 0).

        Workers that hold no leading block are omitted. ``hashes`` is a list of
        block names in prompt order.
        """
        holders = self._holders
        if not hashes:
            return {}
        active = holders.get(hashes[0])
        if not active:
            return {}
        scores: dict = {}
        depth = 1
        n = len(hashes)
        while depth < n:
            s = holders.get(hashes[depth])
            if s is None:
                break
            if s is not active:
                nxt = active & s
                if len(nxt) != len(active):
                    for w in active:
                        if w not in nxt:
                            scores[w] = depth
                    if not nxt:
                        return scores
                active = nxt
            depth += 1
        for w in active:
            scores[w] = depth
        return scores
