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
    """Block name -> the workers holding it, kept as a bitmask (bit ``w`` set: worker ``w`` holds it).

    Worker ids are ints ``>= 0`` (the simulator's ``0..n-1``). Names are the chained
    block hashes of :func:`dynlab.routing.hashing.block_hashes` or a trace's ``hash_ids``.

    Cost: :meth:`find_matches` walks the request's blocks while some worker still
    matches, AND-ing the still-matching mask with each block's mask (one machine
    word per 64 workers), so the work grows with the blocks matched and the
    workers reported, not with workers x blocks. ``apply_stored`` and
    ``apply_removed`` cost ``O(len(hashes))``; :meth:`clear` (rare: a worker
    restarting) scans the whole index.
    """

    __slots__ = ("_holders",)

    def __init__(self) -> None:
        self._holders: dict[Hashable, int] = {}

    @staticmethod
    def _bit(worker: int) -> int:
        if type(worker) is not int or worker < 0:
            raise ValueError(f"worker must be an int >= 0, got {worker!r}")
        return 1 << worker

    def apply_stored(self, worker: int, hashes: Iterable[Hashable]) -> None:
        """Record that ``worker`` now holds each block in ``hashes`` (a ``BlockStored`` event)."""
        bit = self._bit(worker)
        holders = self._holders
        get = holders.get
        for h in hashes:
            holders[h] = get(h, 0) | bit

    def apply_removed(self, worker: int, hashes: Iterable[Hashable]) -> None:
        """Record that ``worker`` no longer holds the blocks in ``hashes`` (a ``BlockRemoved`` event).

        Blocks the index does not credit to ``worker`` are ignored (events may arrive late or twice).
        """
        keep = ~self._bit(worker)
        holders = self._holders
        pop = holders.pop
        for h in hashes:
            m = pop(h, 0) & keep
            if m:
                holders[h] = m

    def clear(self, worker: int) -> None:
        """Forget every block of ``worker`` (an ``AllBlocksCleared`` event)."""
        bit = self._bit(worker)
        holders = self._holders
        for h in [h for h, m in holders.items() if m & bit]:
            m = holders[h] & ~bit
            if m:
                holders[h] = m
            else:
                del holders[h]

    def holders(self, block: Hashable) -> frozenset:
        """The workers holding ``block`` (empty when none)."""
        return frozenset(_workers(self._holders.get(block, 0)))

    def blocks(self, worker: int) -> frozenset:
        """The blocks ``worker`` holds according to the index (scans the index)."""
        bit = self._bit(worker)
        return frozenset(h for h, m in self._holders.items() if m & bit)

    def __len__(self) -> int:
        """Number of distinct blocks held by at least one worker."""
        return len(self._holders)

    def find_matches(self, hashes: Sequence[Hashable]) -> dict:
        """Worker -> number of leading blocks of ``hashes`` it holds (contiguous from block 0).

        Workers that hold no leading block are omitted. ``hashes`` is a list of
        block names in prompt order.
        """
        if not hashes:
            return {}
        get = self._holders.get
        active = get(hashes[0], 0)
        if not active:
            return {}
        scores: dict = {}
        depth = 1
        for depth in range(1, len(hashes)):
            nxt = active & get(hashes[depth], 0)
            if nxt != active:
                # every still-matching worker gets this depth; those that go on matching are
                # overwritten with their larger depth later (listing ``active`` reuses a memoised
                # tuple: the holders of a popular prefix recur across queries)
                if scores:
                    scores.update(dict.fromkeys(_workers(active), depth))
                else:
                    scores = dict.fromkeys(_workers(active), depth)
                if not nxt:
                    return scores
                active = nxt
        else:
            depth = len(hashes)
        if scores:
            scores.update(dict.fromkeys(_workers(active), depth))
            return scores
        return dict.fromkeys(_workers(active), depth)


_BITS_CACHE: dict = {}


def _workers(mask: int) -> tuple:
    """The set bits of ``mask`` as worker ids, lowest first.

    A mask with many bits (a popular prefix held by most of a large fleet) recurs
    across queries, so its listing is memoised (a bounded dict, cleared when full).
    """
    if not mask & (mask - 1):
        return (mask.bit_length() - 1,) if mask else ()
    out = _BITS_CACHE.get(mask)
    if out is None:
        bits = []
        m = mask
        while m:
            low = m & -m
            bits.append(low.bit_length() - 1)
            m ^= low
        out = tuple(bits)
        if len(_BITS_CACHE) >= 4096:
            _BITS_CACHE.clear()
        _BITS_CACHE[mask] = out
    return out
