"""Built-in eviction policies, registered through the ``dynlab`` entry-point group.

``lru`` lives in :mod:`dynlab.kv.policies` (the core needs it); ``fifo``, ``lfu`` and ``opt``
(Belady's offline optimum, the upper bound for any policy on a known access sequence) live
here. This plugin registers them all, exactly as a third-party package would register its own.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from typing import Hashable, Optional

from dynlab import hookimpl
from dynlab.kv.policies import EvictionPolicy, FutureIndex, LRUCache, _negative_size, _OrderedDictCache


class FIFOCache(_OrderedDictCache):
    """First in, first out: evict the entry stored longest ago; hits do not change the order.

    The LRU variant one gets by forgetting ``move_to_end`` on a hit (the two-tier KV cache lab's warning).
    ``keys()`` lists keys in the order they were stored (next victim first).
    """

    name = "fifo"

    def access(self, key: Hashable, size: int = 1) -> bool:
        if size < 0:
            raise _negative_size(size)
        if key in self._data:
            return True
        return self._store(key, size)


class LFUCache(EvictionPolicy):
    """Least frequently used: evict the entry with the fewest accesses since stored (ties: least recent).

    Frequencies count the accesses since the entry was last stored (an evicted entry starts again
    at 1), so a document read often long ago does not stay forever. ``keys()`` lists keys by
    (frequency, recency), next victim first. O(1) amortised per access (buckets of keys per
    frequency).
    """

    name = "lfu"

    def __init__(self, capacity: int, future: Optional[Sequence[Hashable]] = None):
        super().__init__(capacity, future)
        self._size: dict = {}
        self._freq: dict = {}
        self._buckets: dict[int, OrderedDict] = {}
        self._min = 1
        self._used = 0

    def __contains__(self, key: object) -> bool:
        return key in self._size

    def __len__(self) -> int:
        return len(self._size)

    @property
    def used(self) -> int:
        return self._used

    def keys(self) -> list:
        return [k for f in sorted(self._buckets) for k in self._buckets[f]]

    def _unlink(self, key: Hashable, freq: int) -> None:
        bucket = self._buckets[freq]
        del bucket[key]
        if not bucket:
            del self._buckets[freq]

    def remove(self, key: Hashable) -> bool:
        size = self._size.pop(key, None)
        if size is None:
            return False
        self._unlink(key, self._freq.pop(key))
        self._used -= size
        return True  # self._min may now name a missing bucket: fixed lazily on eviction

    def access(self, key: Hashable, size: int = 1) -> bool:
        if size < 0:
            raise _negative_size(size)
        freq = self._freq
        buckets = self._buckets
        f = freq.get(key)
        if f is not None:
            self._unlink(key, f)
            f += 1
            freq[key] = f
            bucket = buckets.get(f)
            if bucket is None:
                bucket = buckets[f] = OrderedDict()
            bucket[key] = None
            return True  # self._min stays <= every frequency; eviction skips past emptied buckets
        capacity = self.capacity
        if size > capacity:
            return False
        on_evict = self.on_evict
        protect = self.protect
        while self._used + size > capacity:
            if protect is not None:
                old = next((k for f in sorted(buckets) for k in buckets[f] if not protect(k)), None)
                if old is None:
                    return False  # only protected entries left: not stored
                self._unlink(old, freq.pop(old))
                self._used -= self._size.pop(old)
                if on_evict is not None:
                    on_evict(old)
                continue
            if self._min not in buckets:
                self._min = min(buckets)
            bucket = buckets[self._min]
            old, _ = bucket.popitem(last=False)
            if not bucket:
                del buckets[self._min]
            del freq[old]
            self._used -= self._size.pop(old)
            if on_evict is not None:
                on_evict(old)
        self._size[key] = size
        freq[key] = 1
        bucket = buckets.get(1)
        if bucket is None:
            bucket = buckets[1] = OrderedDict()
        bucket[key] = None
        self._min = 1
        self._used += size
        return False


class OptCache(EvictionPolicy):
    """Belady's offline optimum: evict the entry whose next use is farthest away (needs the future).

    ``OptCache(capacity, future)``: ``future`` is the whole access sequence of keys (a sequence
    or a :class:`FutureIndex`); without it -> ``ValueError``. On a miss it evicts the stored
    entry whose next occurrence in ``future`` is farthest (entries never used again first; ties
    broken least-recently-touched first) until the new entry fits, then stores the new entry.
    With equal sizes this is Belady's MIN, the most hits any policy that stores every missed
    entry can get; with variable sizes it is the standard approximation (the exact optimum is
    NP-hard), still the usual reference bound. ``keys()`` lists keys farthest next use first.

    Position in ``future``: the cache keeps a cursor, the position of its latest access. Each
    access moves the cursor to the accessed key's first occurrence after the cursor, so a cache
    that sees only a subsequence of ``future`` (the CPU tier of a :class:`TwoTierCache` sees only
    GPU misses; a fleet worker sees only its own requests) stays in step with it: the
    occurrences it skipped are treated as served elsewhere. This is an approximation: if the
    cache sees key k at position p but k also occurred, unseen by it, between the cursor and p,
    the cursor stops at that earlier occurrence; the next accesses then catch up. An access to a
    key that does not occur after the cursor (or is not in ``future`` at all) leaves the cursor
    where it is, and that key counts as never used again. O(log n) per access plus, over the
    cache's lifetime, one step per position of ``future`` skipped.

    With ``future`` a :class:`FutureIndex` that has ``times`` (the fleet's: a block's time is its
    request's number), "farthest" compares the times of next use, so the blocks of one request
    rank as used together and ties go to the least recently touched. The fleet worker touches a
    request's blocks tail first and protects parents (``protect``), so within a prefix chain the
    child goes first; the bound this gives there is stated in :mod:`dynlab.engine.counted`.
    """

    name = "opt"
    needs_future = True

    def __init__(self, capacity: int, future: Optional[Sequence[Hashable]] = None):
        super().__init__(capacity, future)
        if future is None:
            raise ValueError("the opt policy needs the whole access sequence (future=...)")
        self._future = future if isinstance(future, FutureIndex) else FutureIndex(future)
        self._times = self._future.times
        self._cursor = -1
        self._size: dict = {}
        self._next: dict = {}  # stored key -> its first position in future after the cursor
        self._stamp: dict = {}  # stored key -> seq of its live heap entry
        self._heap: list = []  # (-next_use, seq, key); stale entries skipped lazily
        self._seq = 0
        self._used = 0

    def __contains__(self, key: object) -> bool:
        return key in self._size

    def __len__(self) -> int:
        return len(self._size)

    @property
    def used(self) -> int:
        return self._used

    @property
    def cursor(self) -> int:
        """Position in ``future`` of the latest access this cache has seen (-1 before any)."""
        return self._cursor

    def keys(self) -> list:
        return sorted(self._size, key=lambda k: (-self._next[k], self._stamp[k]))

    def remove(self, key: Hashable) -> bool:
        size = self._size.pop(key, None)
        if size is None:
            return False
        del self._next[key], self._stamp[key]
        self._used -= size
        return True

    def _push(self, key: Hashable, next_use: int) -> None:
        seq = self._seq
        self._seq = seq + 1
        self._next[key] = next_use
        self._stamp[key] = seq
        heap = self._heap
        rank = next_use if self._times is None else self._future.time_of(next_use)
        heapq.heappush(heap, (-rank, seq, key))
        if len(heap) > 2 * len(self._size) + 64:
            live = self._stamp
            self._heap = [e for e in heap if live.get(e[2]) == e[1]]
            heapq.heapify(self._heap)

    def _advance(self, position: int) -> None:
        """Move the cursor to ``position``, updating stored keys whose occurrences were skipped."""
        fi = self._future
        keys, next_after, stored = fi._keys, fi.next_after, self._size
        for j in range(self._cursor + 1, position):
            k = keys[j]
            if k in stored:
                self._push(k, next_after[j])
        self._cursor = position

    def access(self, key: Hashable, size: int = 1) -> bool:
        if size < 0:
            raise _negative_size(size)
        fi = self._future
        hit = key in self._size
        position = self._next[key] if hit else fi.first_after(key, self._cursor)
        if position != fi.never:
            self._advance(position)
            next_use = fi.next_after[position]
        else:
            next_use = fi.never
        if hit:
            self._push(key, next_use)
            return True
        capacity = self.capacity
        if size > capacity:
            return False
        on_evict, protect = self.on_evict, self.protect
        heap, stamp = self._heap, self._stamp
        kept = []  # live entries of protected keys, pushed back after
        while self._used + size > capacity:
            if not heap:
                for entry in kept:
                    heapq.heappush(heap, entry)
                return False  # only protected entries left: not stored
            entry = heapq.heappop(heap)
            _, seq, old = entry
            if stamp.get(old) != seq:
                continue  # stale entry
            if protect is not None and protect(old):
                kept.append(entry)
                continue
            del stamp[old], self._next[old]
            self._used -= self._size.pop(old)
            if on_evict is not None:
                on_evict(old)
        for entry in kept:
            heapq.heappush(heap, entry)
        self._size[key] = size
        self._used += size
        self._push(key, next_use)
        return False


@hookimpl
def dynlab_register_eviction_policies(register):
    for cls in (LRUCache, FIFOCache, LFUCache, OptCache):
        register(cls)
