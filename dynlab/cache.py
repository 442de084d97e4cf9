"""KV cache models: the eviction-policy interface, the built-in policies and a two-tier (GPU + CPU) cache.

Units: a cache's ``capacity`` and each entry's ``size`` are plain non-negative integers in
whatever unit the caller chooses: *tokens* in the document scenarios of the seed lab
(``shared/seeds/002``: a 5,011-token document in a 21,520-token GPU cache), *blocks* in the
fleet replay (each block has size 1).

- :class:`EvictionPolicy` is the interface every policy implements (built-ins here, third-party
  ones through the ``dynlab_register_eviction_policies`` hook). It is deliberately small and
  fast, because the fleet simulator keeps one instance per worker and calls :meth:`access`
  once per block.
- :class:`LRUCache` (``lru``, the seed lab's cache and the default everywhere),
  :class:`FIFOCache` (``fifo``), :class:`LFUCache` (``lfu``) and :class:`OptCache` (``opt``,
  Belady's offline optimum, the upper bound for any policy on a known access sequence).
- :class:`TwoTierCache` puts a CPU tier behind the GPU tier, as LMCache and vLLM's CPU KV
  offloading do: what falls out of the GPU can be loaded back from CPU memory instead of being
  recomputed.

This module is core: it imports no plugin and no CLI code.
"""
from __future__ import annotations

import heapq
import operator
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from typing import Callable, ClassVar, Hashable, Iterator, Optional

__all__ = [
    "EvictionPolicy",
    "LRUCache",
    "FIFOCache",
    "LFUCache",
    "OptCache",
    "FutureIndex",
    "TwoTierCache",
    "TIER_RESULTS",
]

#: The three results of :meth:`TwoTierCache.access`.
TIER_RESULTS = ("gpu", "cpu", "miss")


def _check_capacity(capacity) -> int:
    try:
        value = operator.index(capacity)
    except TypeError:
        raise TypeError(f"capacity must be an integer, got {capacity!r}") from None
    if value < 0:
        raise ValueError(f"capacity must be >= 0, got {value}")
    return value


def _negative_size(size) -> ValueError:
    return ValueError(f"size must be >= 0, got {size}")


class EvictionPolicy(ABC):
    """Interface of a bounded cache of sized entries with one eviction policy.

    Subclasses set the class attribute ``name`` (the ``--policy`` value) and a docstring whose
    first line is shown by ``dynlab policies``.

    Contract (tested for every registered policy):

    - ``__init__(capacity, future=None)``: ``capacity`` is a non-negative int (0 is valid and
      stores only size-0 entries); negative -> ``ValueError``, not an integer -> ``TypeError``.
      ``future`` is the whole access sequence of keys, for offline policies (``opt``, which set
      ``needs_future = True`` and raise ``ValueError`` without it); online policies ignore it.
    - ``access(key, size=1) -> bool``: a hit returns True and updates the policy's state (the
      stored size stays the size given when the key was stored); a miss returns False, evicts
      entries as the policy chooses until the new one fits, then stores it. An entry larger than
      the whole capacity is neither stored nor allowed to evict anything. Negative ``size`` ->
      ``ValueError``.
    - ``on_evict``: ``None`` or a callable called with each evicted key, after it left.
    - ``key in cache``, ``len(cache)``, ``cache.used`` (sum of stored sizes, always
      ``<= capacity``) and ``cache.keys()`` (stored keys, next eviction victim first where the
      policy has an order) never change the cache's state.
    - ``remove(key) -> bool`` drops a key without counting it as an eviction (``on_evict`` is
      not called); True if it was stored.
    """

    name: ClassVar[str] = ""
    #: True for offline policies that must be given ``future`` (``opt``); callers check it before
    #: building the whole access sequence.
    needs_future: ClassVar[bool] = False

    def __init__(self, capacity: int, future: Optional[Sequence[Hashable]] = None):
        self.capacity: int = _check_capacity(capacity)
        self.on_evict: Optional[Callable[[Hashable], None]] = None

    @abstractmethod
    def access(self, key: Hashable, size: int = 1) -> bool:
        """Touch ``key`` (of ``size`` units); True on a hit, False on a miss (then stored if it fits)."""

    @abstractmethod
    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is stored; never changes the cache's state."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of stored entries."""

    @property
    @abstractmethod
    def used(self) -> int:
        """Sum of the stored entries' sizes (same unit as ``capacity``)."""

    @abstractmethod
    def keys(self) -> list:
        """Stored keys, next eviction victim first where the policy has an order."""

    @abstractmethod
    def remove(self, key: Hashable) -> bool:
        """Drop ``key`` without calling ``on_evict``; True if it was stored."""

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} used={self.used}/{self.capacity} entries={len(self)}>"


class _OrderedDictCache(EvictionPolicy):
    """Shared storage for the policies that evict from the front of an OrderedDict (key -> size)."""

    def __init__(self, capacity: int, future: Optional[Sequence[Hashable]] = None):
        super().__init__(capacity, future)
        self._data: OrderedDict = OrderedDict()
        self._used = 0

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    @property
    def used(self) -> int:
        return self._used

    def keys(self) -> list:
        return list(self._data)

    def remove(self, key: Hashable) -> bool:
        size = self._data.pop(key, None)
        if size is None:
            return False
        self._used -= size
        return True

    def _store(self, key: Hashable, size: int) -> bool:
        """Miss path: evict from the front until ``size`` fits, then store at the back; always False."""
        if size < 0:
            raise _negative_size(size)
        capacity = self.capacity
        if size > capacity:
            return False  # oversize: neither stored nor allowed to evict
        data = self._data
        used = self._used + size  # what is stored once the new entry is in
        if used > capacity:
            popitem = data.popitem
            on_evict = self.on_evict
            if on_evict is None:
                while used > capacity:
                    used -= popitem(False)[1]
            else:
                while used > capacity:
                    old, old_size = popitem(False)
                    used -= old_size
                    self._used = used - size  # consistent while the callback runs
                    on_evict(old)
        data[key] = size
        self._used = used
        return False


class LRUCache(_OrderedDictCache):
    """Least recently used: evict the entry untouched for longest (the seed lab's cache, the default).

    ``LRUCache(capacity)``; ``access(key, size)`` as in :class:`EvictionPolicy`: a hit makes the
    entry most recent, a miss evicts oldest-first until the new entry fits. ``keys()`` lists keys
    oldest (next victim) first. Each access is O(1) amortised: an ``OrderedDict`` of key -> size
    and a running total for ``used``. Source: step 1 of the seed lab ``shared/seeds/002``.

    ``_data`` (the OrderedDict of key -> size, oldest first) and ``_used`` are read and updated
    directly by the fleet's unit-size fast path (:mod:`dynlab.fleet`): keep their meaning.
    """

    name = "lru"

    def access(self, key: Hashable, size: int = 1) -> bool:
        if size < 0:
            raise _negative_size(size)
        data = self._data
        if key in data:
            data.move_to_end(key)
            return True
        return self._store(key, size)


class FIFOCache(_OrderedDictCache):
    """First in, first out: evict the entry stored longest ago; hits do not change the order.

    The LRU variant one gets by forgetting ``move_to_end`` on a hit (the seed lab's warning).
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
        while self._used + size > capacity:
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


class FutureIndex(Sequence):
    """An access sequence of keys with each key's positions indexed, for :class:`OptCache`.

    Behaves as the read-only sequence it was built from. Building it costs O(n); pass one
    instance to several ``opt`` caches over the same sequence (the two tiers of a
    :class:`TwoTierCache`, the workers of a fleet) to build it once.
    """

    __slots__ = ("_keys", "positions", "next_after", "never")

    def __init__(self, keys: Sequence[Hashable]):
        self._keys = list(keys)
        n = len(self._keys)
        #: position used for "never used again"
        self.never = n
        #: key -> sorted positions where it occurs
        self.positions: dict = {}
        #: next_after[i] = next position of ``keys[i]`` after i, or ``never``
        self.next_after = [n] * n
        last: dict = {}
        for i, key in enumerate(self._keys):
            j = last.get(key)
            if j is not None:
                self.next_after[j] = i
            last[key] = i
            self.positions.setdefault(key, []).append(i)

    def first_after(self, key: Hashable, position: int) -> int:
        """The first position of ``key`` strictly after ``position``, or :attr:`never`."""
        pos = self.positions.get(key)
        if not pos:
            return self.never
        i = bisect_right(pos, position)
        return pos[i] if i < len(pos) else self.never

    def __getitem__(self, i):
        return self._keys[i]

    def __len__(self) -> int:
        return len(self._keys)


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
    """

    name = "opt"
    needs_future = True

    def __init__(self, capacity: int, future: Optional[Sequence[Hashable]] = None):
        super().__init__(capacity, future)
        if future is None:
            raise ValueError("the opt policy needs the whole access sequence (future=...)")
        self._future = future if isinstance(future, FutureIndex) else FutureIndex(future)
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
        heapq.heappush(heap, (-next_use, seq, key))
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
        on_evict = self.on_evict
        heap, stamp = self._heap, self._stamp
        while self._used + size > capacity:
            _, seq, old = heapq.heappop(heap)
            if stamp.get(old) != seq:
                continue  # stale entry
            del stamp[old], self._next[old]
            self._used -= self._size.pop(old)
            if on_evict is not None:
                on_evict(old)
        self._size[key] = size
        self._used += size
        self._push(key, next_use)
        return False


class TwoTierCache:
    """A GPU tier backed by a CPU tier, each an eviction-policy cache (LRU by default).

    ``TwoTierCache(gpu_capacity, cpu_capacity, policy=LRUCache, future=None)``: ``gpu`` and
    ``cpu`` are ``policy(capacity, future=future)`` instances (``future`` is needed only by
    offline policies such as :class:`OptCache`; it is indexed once and shared by both tiers).
    Capacities and sizes are in the caller's unit (tokens in the seed lab). Errors are those of
    the policy (negative capacity or size -> ``ValueError``).

    ``access(key, size)`` returns:

    1. ``"gpu"``: GPU hit; the CPU tier is not touched.
    2. ``"cpu"``: GPU miss, CPU hit; the CPU copy is touched (most recent under LRU) and the
       entry is also stored on the GPU (if it fits there).
    3. ``"miss"``: both miss; the entry is stored on both tiers (each where it fits).

    The tiers are inclusive and independent: what the GPU evicts is not written to the CPU then,
    because the CPU already received a copy when the entry was first computed (LMCache's and
    vLLM's CPU offloading store on the way in). ``cpu_capacity=0`` means no CPU tier: nothing is
    stored there (not even size-0 entries), so the cache behaves exactly as a lone GPU cache.
    Source: steps 5-6 of the seed lab ``shared/seeds/002``.
    """

    def __init__(
        self,
        gpu_capacity: int,
        cpu_capacity: int,
        policy: type[EvictionPolicy] = LRUCache,
        future: Optional[Sequence[Hashable]] = None,
    ):
        if future is not None and not isinstance(future, FutureIndex):
            future = FutureIndex(future)
        self.gpu: EvictionPolicy = policy(gpu_capacity, future=future)
        self.cpu: EvictionPolicy = policy(cpu_capacity, future=future)

    def access(self, key: Hashable, size: int = 1) -> str:
        gpu, cpu = self.gpu, self.cpu
        if key in gpu:
            gpu.access(key, size)
            return "gpu"
        if key in cpu:
            cpu.access(key, size)
            gpu.access(key, size)
            return "cpu"
        gpu.access(key, size)
        if cpu.capacity:  # capacity 0 means no CPU tier, not even for size-0 entries
            cpu.access(key, size)
        return "miss"

    def tier(self, key: Hashable) -> Optional[str]:
        """``"gpu"``, ``"cpu"`` or ``None``: where ``access(key)`` would find ``key``; changes nothing."""
        if key in self.gpu:
            return "gpu"
        if key in self.cpu:
            return "cpu"
        return None

    def __contains__(self, key: object) -> bool:
        return key in self.gpu or key in self.cpu

    def __repr__(self) -> str:
        return f"<TwoTierCache gpu={self.gpu!r} cpu={self.cpu!r}>"
