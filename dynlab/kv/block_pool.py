"""The block pool of one engine: exactly ``capacity`` KV blocks, a free queue and a prefix cache.

Modelled on vLLM v1's ``BlockPool`` / ``FreeKVCacheBlockQueue`` (``vllm/v1/core``):

- Free blocks wait in a **free queue** whose head is the least recently freed. Initially all
  blocks are free and unnamed.
- :meth:`allocate` takes blocks from the head. A taken block that holds a cached (named) block
  evicts it: its name is appended to :attr:`removed` (the payload of a ``BlockRemoved``).
- :meth:`release` returns a sequence's blocks to the tail in **reverse** order (the tail of a
  sequence is evicted first), unnamed ones (output, partial, duplicate) too.
- :meth:`take_hits` takes prefix-cache hits (named blocks) out of the free queue; blocks are
  reference-counted, so a block shared by several running requests stays in use until the last
  one releases it. Blocks in use are never evicted.
- :meth:`register` names full prompt blocks (appending the names to :attr:`stored`, the payload of
  a ``BlockStored``). A name already cached is not registered twice: the second block stays
  unnamed (vLLM keeps both copies under one hash; see docs of :meth:`register`).

Invariant: ``used_blocks + num_free == capacity`` (``num_free`` counts the never-used blocks too).

Representation (no per-block Python loop on the common paths; everything runs through
C-level ``map``/``zip``/``islice``/``dict.update``):

- Every block is identified by a **key**: its name (an int >= 0) when it is named, else a
  fresh negative int (unnamed keys are never shared and never looked up).
- ``_ref``: ``dict name -> reference count`` for every cached (named) block; 0 means the block
  is in the free queue (cached but evictable). ``set(_ref)`` is the prefix cache's content.
- ``_free``: an ``OrderedDict`` of the free queue's keys, head first (O(1) removal from the
  middle for hits, ``islice`` from the head for allocation).
- ``_fresh``: how many never-used blocks wait at the head of the free queue, ahead of
  ``_free``. They are unnamed and interchangeable, so they are a count, not entries: the pool's
  memory grows with the blocks a workload touches, not with ``capacity`` (``--capacity
  1000000000 --timing`` costs nothing until used). Allocation takes them first, exactly where
  vLLM's initial free queue puts them.

A holder (a request) keeps the list of its keys in sequence order and hands it back to
:meth:`release`; the pool does not track which holder owns which unnamed block.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from itertools import compress, count, islice, repeat
from operator import add, not_, sub
from typing import List, Sequence

__all__ = ["BlockPool"]

_NONNEG = (-1).__lt__  # key >= 0: a named block


def _consume(iterator) -> None:
    deque(iterator, maxlen=0)


class BlockPool:
    """``capacity`` KV blocks: a free queue (LRU of freed blocks) and a prefix cache of named blocks.

    Attributes read by the engine and metrics:

    - ``capacity``: blocks in the pool; ``num_free``: blocks in the free queue (unnamed or
      cached-evictable); ``used_blocks``: blocks held by requests (``capacity - num_free``).
    - ``stored`` / ``removed``: names registered / evicted since the caller last cleared them
      (the engine clears them per step).
    """

    __slots__ = ("capacity", "_free", "_fresh", "_ref", "_serial", "stored", "removed")

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 block, got {capacity}")
        self.capacity = capacity
        self._serial = -1  # next unnamed key counts down from here
        self._fresh = capacity  # never-used blocks, at the head of the free queue (a count, not entries)
        self._free: OrderedDict = OrderedDict()
        self._ref: dict = {}
        self.stored: List[int] = []
        self.removed: List[int] = []

    # -- reading --------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks in the free queue (unnamed, or cached and evictable)."""
        return self._fresh + len(self._free)

    @property
    def used_blocks(self) -> int:
        """Blocks held by requests (a shared block counts once); never counts cached free blocks."""
        return self.capacity - self._fresh - len(self._free)

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
        if 0 in refs:
            _consume(map(self._free.__delitem__, compress(names, map(not_, refs))))
        ref.update(zip(names, map(add, refs, repeat(1))))

    def allocate(self, n: int) -> List[int]:
        """Take ``n`` blocks from the free-queue head; returns their new (unnamed) keys.

        Cached blocks among them are evicted (their names appended to :attr:`removed`).
        Raises ``ValueError`` when fewer than ``n`` blocks are free (callers check :attr:`num_free`).
        """
        if n <= 0:
            return []
        free = self._free
        if n > self._fresh + len(free):
            raise ValueError(f"cannot allocate {n} blocks: {self._fresh + len(free)} free")
        s = self._serial
        if self._fresh:  # never-used blocks first: they are the head of the queue, and evict nothing
            fresh = min(n, self._fresh)
            self._fresh -= fresh
            self._serial = s - fresh
            if fresh == n:
                return list(range(s, s - n, -1))
            return list(range(s, s - fresh, -1)) + self.allocate(n - fresh)
        if n == 1:  # the common case: a decode crossing a block boundary
            key = free.popitem(last=False)[0]
            if key >= 0:
                del self._ref[key]
                self.removed.append(key)
            self._serial = s - 1
            return [s]
        taken = list(islice(free, n))
        _consume(map(free.__delitem__, taken))
        named = list(filter(_NONNEG, taken))
        if named:
            _consume(map(self._ref.__delitem__, named))
            self.removed.extend(named)
        self._serial = s - n
        return list(range(s, s - n, -1))

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
        """A holder frees its blocks (``keys`` in sequence order): they go to the free-queue tail
        in reverse order, except named blocks still held by another request."""
        if not keys:
            return
        rev = keys[::-1]
        ref = self._ref
        named = list(filter(_NONNEG, rev))
        if named:
            left = list(map(sub, map(ref.__getitem__, named), repeat(1)))
            ref.update(zip(named, left))
            if any(left):  # some blocks are shared with running requests: they stay in use
                rev = list(compress(rev, map(not_, map(ref.get, rev))))  # unnamed: get() is None
        self._free.update(zip(rev, repeat(None)))

    def check(self) -> None:
        """Assert the pool's invariants (tests; O(capacity))."""
        free = self._free
        assert all(k < 0 or self._ref.get(k) == 0 for k in free), "a free named block is not cached at 0 refs"
        assert all(r >= 0 for r in self._ref.values()), "negative reference count"
        zero = sum(1 for r in self._ref.values() if r == 0)
        assert zero == sum(1 for k in free if k >= 0), "cached blocks at 0 refs are not all free"
        assert self._fresh >= 0
        assert self.used_blocks + self._fresh + len(free) == self.capacity
        assert self._fresh + len(free) <= self.capacity
