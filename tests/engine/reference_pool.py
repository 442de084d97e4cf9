"""The engine's block pool as it was before perf4 (commit d90a0de), kept as the oracle.

``dynlab.kv.block_pool.BlockPool`` changed its representation (perf4: segments of runs in the free
queue, sets for the reference counts) and must behave exactly as this class does: same allocations,
evictions in the same order, same stored/removed names, same ``num_free``/``used_blocks`` at every
point. ``tests/engine/test_block_pool_reference.py`` drives both with the same random operation
sequences. This is the pre-perf4 representation, unchanged but for its name: every block has a
key (its name, or a fresh negative int when unnamed), ``_ref`` maps each cached name to its
reference count (0: in the free queue), and the free queue is a deque of keys with lazy removal
(``_stale``: entries left behind by hits), after ``_fresh`` never-used blocks.
"""
from __future__ import annotations

from collections import deque
from itertools import compress, count, islice, repeat, starmap
from operator import add, not_, sub
from typing import List, Sequence

__all__ = ["ReferencePool", "CopyingReferencePool", "COPY_KEYS"]


class ReferencePool:
    """``capacity`` KV blocks: a free queue (LRU of freed blocks) and a prefix cache of named blocks.

    Attributes read by the engine and metrics:

    - ``capacity``: blocks in the pool; ``num_free``: blocks in the free queue (unnamed or
      cached-evictable); ``used_blocks``: blocks held by requests (``capacity - num_free``).
    - ``stored`` / ``removed``: names registered / evicted since the caller last cleared them
      (the engine clears them per step).
    """

    __slots__ = ("capacity", "_fresh", "_queue", "_stale", "_nfree", "_ref", "_serial", "stored", "removed")

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 block, got {capacity}")
        self.capacity = capacity
        self._serial = -1  # next unnamed key counts down from here
        self._fresh = capacity  # never-used blocks, at the head of the free queue (a count, not entries)
        self._queue: deque = deque()
        self._stale: dict = {}  # name -> entries of it in _queue left behind by hits (skipped when met)
        self._nfree = 0  # live entries of _queue
        self._ref: dict = {}
        self.stored: List[int] = []
        self.removed: List[int] = []

    # -- reading --------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks in the free queue (never used, unnamed, or cached and evictable)."""
        return self._fresh + self._nfree

    @property
    def used_blocks(self) -> int:
        """Blocks held by requests (a shared block counts once); never counts cached free blocks."""
        return self.capacity - self._fresh - self._nfree

    def cached(self) -> set:
        """The names the pool holds (in use or free): what a prefix lookup can find."""
        return set(self._ref)

    def __contains__(self, name: int) -> bool:
        return name in self._ref

    def lookup(self, names: Sequence[int], max_blocks: int) -> int:
        """How many leading ``names`` (at most ``max_blocks``) are cached: a prefix hit, in blocks."""
        if max_blocks <= 0:
            return 0
        misses = compress(count(), map(not_, map(self._ref.__contains__, islice(names, max_blocks))))
        return min(next(misses, max_blocks), len(names))

    def evictable_hits(self, names: Sequence[int]) -> int:
        """How many of the cached ``names`` sit in the free queue (taking them costs free blocks)."""
        return list(map(self._ref.__getitem__, names)).count(0)

    # -- changing -------------------------------------------------------------------------
    def take_hits(self, names: Sequence[int]) -> None:
        """Take cached ``names`` for a request (reference count + 1; out of the free queue if free)."""
        if not names:
            return
        ref = self._ref
        refs = list(map(ref.__getitem__, names))
        if 0 in refs:  # free blocks leave the queue: their entries become stale (see the module docstring)
            stale = self._stale
            freed = list(compress(names, map(not_, refs)))
            stale.update(zip(freed, map(add, map(stale.get, freed, repeat(0)), repeat(1))))
            self._nfree -= len(freed)
        ref.update(zip(names, map(add, refs, repeat(1))))

    def allocate(self, n: int) -> List[int]:
        """Take ``n`` blocks from the free-queue head; returns their new (unnamed) keys.

        Cached blocks among them are evicted (their names appended to :attr:`removed`).
        Raises ``ValueError`` when fewer than ``n`` blocks are free (callers check :attr:`num_free`).
        """
        if n <= 0:
            return []
        if n > self._fresh + self._nfree:
            raise ValueError(f"cannot allocate {n} blocks: {self._fresh + self._nfree} free")
        s = self._serial
        if self._fresh:  # never-used blocks first: they are the head of the queue, and evict nothing
            fresh = min(n, self._fresh)
            self._fresh -= fresh
            self._serial = s - fresh
            if fresh == n:
                return [s] if n == 1 else list(range(s, s - n, -1))
            return list(range(s, s - fresh, -1)) + self.allocate(n - fresh)
        popleft, stale = self._queue.popleft, self._stale
        if n <= 8:  # the common case: decodes crossing a block boundary, a block each, one by one
            ref, removed = self._ref, self.removed
            for _ in range(n):
                key = popleft()
                while key >= 0 and key in stale:  # a stale entry (see the module docstring): skip it
                    c = stale[key]
                    if c == 1:
                        del stale[key]
                    else:
                        stale[key] = c - 1
                    key = popleft()
                if key >= 0:
                    del ref[key]
                    removed.append(key)
        else:
            want = n
            while want:
                named = [key for key in starmap(popleft, repeat((), want)) if key >= 0]
                want = 0
                if named and stale and not stale.keys().isdisjoint(named):
                    live = []  # drop the stale entries among them, then take as many more
                    for key in named:
                        c = stale.get(key)
                        if c is None:
                            live.append(key)
                        else:
                            want += 1
                            if c == 1:
                                del stale[key]
                            else:
                                stale[key] = c - 1
                    named = live
                if named:
                    ref = self._ref
                    for key in named:  # a plain loop: cheaper than map() through the __delitem__ slot wrapper
                        del ref[key]
                    self.removed.extend(named)
        self._nfree -= n
        self._serial = s - n
        return [s] if n == 1 else list(range(s, s - n, -1))

    def register(self, keys: list, start: int, names: Sequence[int]) -> None:
        """Name the blocks ``keys[start:start+len(names)]`` (full prompt blocks just computed).

        ``keys`` is the holder's key list (updated in place: a registered block's key becomes
        its name). Registered names are appended to :attr:`stored`. A name already cached (held
        by another block) is not registered again: that block stays unnamed. (vLLM v1 keeps
        both blocks under the hash; here a name maps to one block, so the cached set always
        equals the set built from stored/removed events.) Names within one request are
        assumed distinct (true for prefix-chained names).
        """
        if not names:
            return
        ref = self._ref
        if ref.keys().isdisjoint(names):
            keys[start:start + len(names)] = names
            ref.update(zip(names, repeat(1)))
            self.stored.extend(names)
            return
        for i, name in enumerate(names, start):  # rare: some names are already cached
            if name not in ref:
                keys[i] = name
                ref[name] = 1
                self.stored.append(name)

    def release(self, keys: Sequence[int]) -> None:
        """A holder frees its blocks (``keys`` in sequence order): its named ones go to the free-queue
        tail in reverse order, except those still held by another request; its unnamed ones to the head."""
        if not keys:
            return
        rev = keys[::-1]
        ref = self._ref
        named = [key for key in rev if key >= 0]
        if named:
            refs = list(map(ref.__getitem__, named))
            if refs.count(1) == len(refs):  # the common case: no block shared, every one becomes free
                ref.update(zip(named, repeat(0)))
            else:
                left = list(map(sub, refs, repeat(1)))
                ref.update(zip(named, left))
                if any(left):  # some blocks are shared with running requests: they stay in use
                    rev = list(compress(rev, map(not_, map(ref.get, rev))))  # unnamed: get() is None
        unnamed = sum(1 for key in rev if key < 0)
        if unnamed:  # unnamed blocks to the free-queue head (vLLM 0.33.0, PR #42656): the head's count
            self._fresh += unnamed
            rev = [key for key in rev if key >= 0]
        self._queue.extend(rev)
        self._nfree += len(rev)

    def free_keys(self) -> list:
        """The free queue's keys, head first (live entries only; O(queue), for tests); the
        never-used blocks at its head, which have no key yet, are ``None``."""
        return [None] * self._fresh + self._live_keys()

    def _live_keys(self) -> list:
        """The keys of the queue after the never-used blocks, head first, stale entries skipped."""
        stale = dict(self._stale)
        out = []
        for key in self._queue:
            c = stale.get(key) if key >= 0 else None
            if c:
                stale[key] = c - 1
            else:
                out.append(key)
        return out

    def check(self) -> None:
        """Assert the pool's invariants (tests; O(blocks ever used))."""
        free = self._live_keys()
        assert self._fresh >= 0
        assert len(free) == self._nfree, "live queue entries != num_free"
        assert len(set(free)) == len(free), "a block is twice in the free queue"
        assert all(c > 0 for c in self._stale.values()), "a stale count is not positive"
        assert all(k < 0 or self._ref.get(k) == 0 for k in free), "a free named block is not cached at 0 refs"
        assert all(r >= 0 for r in self._ref.values()), "negative reference count"
        zero = sum(1 for r in self._ref.values() if r == 0)
        assert zero == sum(1 for k in free if k >= 0), "cached blocks at 0 refs are not all free"
        assert self.used_blocks + self._fresh + len(free) == self.capacity
        assert self._fresh + len(free) <= self.capacity


#: the first key of a second copy in :class:`CopyingReferencePool` (test names stay far below it)
COPY_KEYS = 10 ** 12


class CopyingReferencePool(ReferencePool):
    """:class:`ReferencePool` with vLLM 0.33.0's duplicate copies (issue 24 item 3), added the plain way
    around its unchanged queue: registering a cached name caches the block as one more copy under a fresh
    key (:data:`COPY_KEYS` up; an ordinary named block to the pool), a lookup finds a name while any copy
    is cached, a hit takes the oldest cached copy, :attr:`stored` / :attr:`removed` carry names (one per
    copy). ``_order``: name -> its copies' keys in caching order (dead ones dropped when met)."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self._order: dict = {}
        self._name: dict = {}  # copy key -> name
        self._next = COPY_KEYS

    def _live(self, name):
        keys = [k for k in self._order.get(name, ()) if k in self._ref]
        self._order[name] = keys
        return keys

    def _oldest(self, names):
        return [(self._live(n) or [n])[0] for n in names]

    def cached(self) -> set:
        return {self._name.get(k, k) for k in self._ref}

    def lookup(self, names: Sequence[int], max_blocks: int) -> int:
        h = 0
        for name in list(names)[:max(max_blocks, 0)]:
            if not self._live(name):
                break
            h += 1
        return h

    def evictable_hits(self, names: Sequence[int]) -> int:
        return super().evictable_hits(self._oldest(names))

    def take_hits(self, names: Sequence[int]) -> list:
        """Take the oldest cached copy of each name; returns their keys."""
        keys = self._oldest(names)
        super().take_hits(keys)
        return keys

    def allocate(self, n: int) -> List[int]:
        out = super().allocate(n)
        self.removed[:] = [self._name.get(k, k) for k in self.removed]
        return out

    def register(self, keys: list, start: int, names: Sequence[int]) -> None:
        mapped = []
        for name in names:
            live = self._live(name)
            key = name
            if name in self._ref:
                key = self._next
                self._next += 1
                self._name[key] = name
            self._order[name] = live + [key]
            mapped.append(key)
        before = len(self.stored)
        super().register(keys, start, mapped)
        self.stored[before:] = list(names)

    def free_keys(self) -> list:
        return [k if k is None or k < 0 else self._name.get(k, k) for k in super().free_keys()]

    def refs(self, name) -> list:
        """The reference counts of ``name``'s cached copies, oldest first."""
        return [self._ref[k] for k in self._live(name)]
