"""``KvIndex``: the router's view of which worker holds which blocks.

The index maps each block name to the set of workers that hold it (learned from
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` KV events, or recorded by
a router that remembers where it sent requests). :meth:`KvIndex.find_matches`
answers Dynamo's ``find_matches`` question: for each worker, how many *leading*
blocks of a request it holds.
"""
from __future__ import annotations

from functools import reduce
from itertools import compress, repeat
from operator import and_, or_
from typing import Hashable, Iterable, Optional, Sequence

from dynlab.routing.events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored


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

    Events (:meth:`apply_event`) are checked as Dynamo's indexer checks them: a
    ``BlockStored`` hashed at another ``block_size`` than the index's, or whose
    ``parent_block_hash`` the worker does not hold, is refused (counted in
    :attr:`refused_block_size` / :attr:`refused_parent`, not applied). Copies are
    counted: vLLM's block pool may hold two physical blocks with the same hash (each
    stored and removed by its own event), so a duplicate ``BlockStored`` adds a copy and
    a ``BlockRemoved`` forgets a block only with its last copy. (:meth:`apply_stored` and
    :meth:`apply_removed` keep set semantics: the simulator's workers hold one copy per
    name, so their stored/removed events alternate per name and a set is exact.)

    ``block_size``: tokens per block of the names this index holds (``None``: unchecked).

    Tiers: events whose ``medium`` is not ``"GPU"`` (a worker's CPU tier, vLLM's ``medium``) are kept
    apart, per medium (set semantics, no parent check: a CPU block's parent may sit on the GPU);
    :meth:`find_matches` and :meth:`blocks` read the GPU holdings only, :meth:`find_matches_tiers`
    adds each worker's lower-tier continuation, :meth:`tier_blocks` lists a tier's holdings.
    """

    __slots__ = ("_holders", "_copies", "block_size", "refused_block_size", "refused_parent",
                 "stored_events", "_tiers")

    def __init__(self, block_size: Optional[int] = None) -> None:
        self._holders: dict[Hashable, int] = {}
        self._copies: dict = {}  # (worker, name) -> copies beyond the first (apply_event only)
        self.block_size = block_size
        self.refused_block_size = 0
        self.refused_parent = 0
        self.stored_events = 0  # BlockStored events seen by apply_event, refused or not
        self._tiers: dict = {}  # medium other than GPU -> {name: worker bitmask}

    @staticmethod
    def _bit(worker: int) -> int:
        if type(worker) is not int or worker < 0:
            raise ValueError(f"worker must be an int >= 0, got {worker!r}")
        return 1 << worker

    def apply_stored(self, worker: int, hashes: Iterable[Hashable]) -> None:
        """Record that ``worker`` now holds each block in ``hashes`` (a ``BlockStored`` event)."""
        bit = self._bit(worker)
        holders = self._holders
        # one C-level pass (dict.update pulls each pair, so a repeated name sees its first update)
        holders.update(zip(hashes, map(or_, map(holders.get, hashes, repeat(0)), repeat(bit))))

    def apply_removed(self, worker: int, hashes: Iterable[Hashable]) -> None:
        """Record that ``worker`` no longer holds the blocks in ``hashes`` (a ``BlockRemoved`` event).

        Blocks the index does not credit to ``worker`` are ignored (events may arrive late or twice).
        """
        _remove(self._holders, ~self._bit(worker), hashes)

    def refusals(self) -> dict:
        """Stored events refused so far: ``{"block_size": n, "parent": m, "stored": events seen}``
        (the shape of :meth:`dynlab.routing.strategy.Strategy.refused_events`)."""
        return {"block_size": self.refused_block_size, "parent": self.refused_parent, "stored": self.stored_events}

    def apply_event(self, event) -> bool:
        """Apply one KV event (:mod:`dynlab.routing.events`); False when it was refused.

        A ``BlockStored`` is refused when its ``block_size`` is set and differs from the
        index's (both set), or when its ``parent_block_hash`` is set and not held by the
        event's worker (Dynamo's rule: the stored blocks would hang from nothing). Stored
        names already held by the worker add a copy; a removal drops one copy, and the
        block when it was the last (see the class docstring). Raises ``ValueError`` for a
        bad worker id and ``TypeError`` for anything that is not a KV event.
        """
        kind = type(event)
        if kind is BlockStored:
            if event.medium != MEDIUM_GPU:
                return self._apply_tier(event)
            # _sized inlined (a replay's hot path: one event per request served)
            self.stored_events += 1
            bs = event.block_size
            if bs is not None and self.block_size is not None and bs != self.block_size:
                self.refused_block_size += 1
                return False
            return self._store_names(event.worker, event.hashes, event.parent_block_hash)
        if kind is BlockRemoved:
            if event.medium != MEDIUM_GPU:
                return self._apply_tier(event)
            self._apply_removed(event.worker, event.hashes)
            return True
        if kind is not AllBlocksCleared and event.medium != MEDIUM_GPU:
            return self._apply_tier(event)
        if kind is AllBlocksCleared:
            self.clear(event.worker)
            return True
        raise TypeError(f"not a KV event: {event!r}")

    def _sized(self, event: BlockStored) -> bool:
        """Count a ``BlockStored`` in :attr:`stored_events`; ``False`` (counted in :attr:`refused_block_size`)
        when its ``block_size`` and the index's are both set and differ (the first check of every store)."""
        self.stored_events += 1
        bs = event.block_size
        if bs is not None and self.block_size is not None and bs != self.block_size:
            self.refused_block_size += 1
            return False
        return True

    def apply_change(self, worker: int, stored: Sequence[Hashable], removed: Sequence[Hashable]) -> None:
        """A worker's net change for one served request, as :meth:`apply_event` of
        ``BlockRemoved(worker, tuple(removed))`` (when ``removed``), then of ``BlockStored(worker, tuple(stored))``
        (when ``stored``): the same index and counters, without making either event. ``stored`` and
        ``removed`` (block names, prefix order; lists or tuples) are read, not kept. The count-based
        replay's bus calls it (:attr:`dynlab.routing.strategy.Strategy.on_change`)."""
        if removed:
            self._apply_removed(worker, removed)
        if stored:
            self.stored_events += 1  # a BlockStored without block_size or parent: no refusal
            self._store_names(worker, stored, None)

    def _store_names(self, w, hashes: Sequence[Hashable], parent) -> bool:
        """:meth:`apply_event` of a GPU ``BlockStored`` (worker ``w``, names ``hashes``, parent name ``parent``)
        after the block-size check (:meth:`_sized`): the parent check, then the names (copies counted)."""
        if type(w) is not int or w < 0:
            self._bit(w)  # raises ValueError
        bit = 1 << w
        holders = self._holders
        if parent is not None and not holders.get(parent, 0) & bit:
            self.refused_parent += 1
            return False
        get = holders.get
        if len(hashes) > 1:
            if holders.keys().isdisjoint(hashes):
                # the most common case (~92 % of the bundled timed run's stored names): no name held by
                # any worker yet; the index grows by one entry a name unless a name is given twice
                n0 = len(holders)
                holders.update(zip(hashes, repeat(bit)))
                if len(holders) - n0 == len(hashes):
                    return True
                for h in hashes:  # a name given twice: back to the state before (all absent), then below
                    holders.pop(h, None)
            else:
                masks = list(map(get, hashes, repeat(0)))
                if not reduce(or_, masks) & bit and len(set(hashes)) == len(hashes):
                    # the next common case: no name held by this worker already, none twice: no copy
                    holders.update(zip(hashes, map(or_, masks, repeat(bit))))
                    return True
        for h in hashes:
            m = get(h, 0)
            if m & bit:
                key = (w, h)
                self._copies[key] = self._copies.get(key, 0) + 1
            else:
                holders[h] = m | bit
        return True

    def _apply_removed(self, w, hashes: Sequence[Hashable]) -> None:
        """:meth:`apply_event` of a GPU ``BlockRemoved`` (worker ``w``, names ``hashes``): a copy goes first,
        the block with its last one."""
        copies = self._copies
        if copies:
            left = []
            for h in hashes:
                n = copies.get((w, h))
                if n is None:
                    left.append(h)
                elif n > 1:
                    copies[(w, h)] = n - 1
                else:
                    del copies[(w, h)]
            self.apply_removed(w, left)
        elif type(w) is int and w >= 0:  # apply_removed inlined
            if type(hashes) is tuple and len(hashes) == 1:  # a decode's block boundary (one name)
                h = hashes[0]
                holders = self._holders
                m = holders.pop(h, 0) & ~(1 << w)
                if m:
                    holders[h] = m
            else:
                _remove(self._holders, ~(1 << w), hashes)
        else:
            self.apply_removed(w, hashes)

    def _apply_tier(self, event) -> bool:
        bit = self._bit(event.worker)
        holders = self._tiers.setdefault(event.medium, {})
        if type(event) is BlockStored:
            if not self._sized(event):
                return False
            hashes = event.hashes
            holders.update(zip(hashes, map(or_, map(holders.get, hashes, repeat(0)), repeat(bit))))
            return True
        if type(event) is BlockRemoved:
            _remove(holders, ~bit, event.hashes)
            return True
        raise TypeError(f"not a KV event: {event!r}")

    @property
    def tiered(self) -> bool:
        """Whether a lower-tier (not GPU) event was ever applied: :meth:`find_matches_tiers` can differ."""
        return bool(self._tiers)

    def tier_blocks(self, worker: int, medium: str = MEDIUM_GPU) -> frozenset:
        """The blocks ``worker`` holds in ``medium`` (``"GPU"``, ``"CPU"``, ...) according to the index."""
        if medium == MEDIUM_GPU:
            return self.blocks(worker)
        bit = self._bit(worker)
        return frozenset(h for h, m in self._tiers.get(medium, {}).items() if m & bit)

    def find_matches_tiers(self, hashes: Sequence[Hashable], medium: str = "CPU",
                           runs: Optional[Sequence[tuple]] = None) -> dict:
        """Worker -> ``(gpu, lower)``: its leading GPU overlap (:meth:`find_matches`, ``runs`` as there),
        then how many of the following blocks it holds in ``medium``, contiguously (where an engine's
        lookup continues into its CPU tier). Workers with ``gpu + lower == 0`` are omitted."""
        return self._with_tier(self.find_matches(hashes, runs), hashes, medium)

    def _with_tier(self, gpu: dict, hashes: Sequence[Hashable], medium: str) -> dict:
        """:meth:`find_matches_tiers` given the GPU overlaps ``gpu`` (:meth:`find_matches` of ``hashes``)."""
        tier = self._tiers.get(medium)
        if not tier:
            return {w: (d, 0) for w, d in gpu.items()}
        n = len(hashes)
        get = tier.get
        first = get(hashes[0], 0) if n else 0
        out = {}
        for w in set(gpu) | set(_workers(first)):
            d = gpu.get(w, 0)
            bit = 1 << w
            c = 0
            while d + c < n and get(hashes[d + c], 0) & bit:
                c += 1
            out[w] = (d, c)
        return out

    def clear(self, worker: int) -> None:
        """Forget every block of ``worker`` in every tier (an ``AllBlocksCleared`` event)."""
        bit = self._bit(worker)
        for tier in self._tiers.values():
            for h in [h for h, m in tier.items() if m & bit]:
                m = tier[h] & ~bit
                if m:
                    tier[h] = m
                else:
                    del tier[h]
        if self._copies:
            self._copies = {k: n for k, n in self._copies.items() if k[0] != worker}
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

    def find_matches(self, hashes: Sequence[Hashable], runs: Optional[Sequence[tuple]] = None) -> dict:
        """Worker -> number of leading blocks of ``hashes`` it holds (contiguous from block 0).

        Workers that hold no leading block are omitted. ``hashes`` is a list of
        block names in prompt order. ``runs``: the same names as ``(first name, count)`` runs
        (``Request.runs``), read by :class:`~dynlab.routing.run_index.RunIndex` instead of the names
        (the same answer); a KvIndex reads the names.
        """
        if not hashes:
            return {}
        get = self._holders.get
        active = get(hashes[0], 0)
        if not active:
            return {}
        if not active & (active - 1):
            # one worker holds the first block (the common case): its match ends at its first miss
            depth, n = 1, len(hashes)
            while depth < n and get(hashes[depth], 0) & active:
                depth += 1
            return {active.bit_length() - 1: depth}
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


def _remove(holders: dict, keep: int, hashes: Iterable[Hashable]) -> None:
    """Clear the bits outside ``keep`` of each of ``hashes`` in ``holders`` (name -> worker mask),
    dropping names left with no worker; names absent are ignored."""
    if type(hashes) is not tuple and type(hashes) is not list:
        hashes = list(hashes)
    if len(hashes) == 1:  # the common case: a decode's block boundary evicts one block
        h = hashes[0]
        m = holders.pop(h, 0) & keep
        if m:
            holders[h] = m
        return
    popped = list(map(holders.pop, hashes, repeat(0)))
    if popped.count(~keep) == len(popped):  # the common case: every name was held by the removed workers only
        return
    left = list(map(and_, popped, repeat(keep)))
    if any(left):  # names other workers still hold go back (a name given twice: its first place)
        holders.update(compress(zip(hashes, left), left))


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
