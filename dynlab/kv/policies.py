"""Eviction policies: the interface, the LRU cache every run defaults to, and the indexed future of offline policies.

Units: a cache's ``capacity`` and each entry's ``size`` are plain non-negative integers in
whatever unit the caller chooses: *tokens* in the document scenarios of the seed lab
(``shared/seeds/002``: a 5,011-token document in a 21,520-token GPU cache), *blocks* in the
fleet replay (each block has size 1).

- :class:`EvictionPolicy` is the interface every policy implements (the built-ins in the
  ``dynlab_builtins`` plugin, third-party ones likewise through the
  ``dynlab_register_eviction_policies`` hook). It is deliberately small and fast, because the
  fleet simulator keeps one instance per worker and calls :meth:`access` once per block.
- :class:`LRUCache` (``lru``, the two-tier KV cache lab's cache and the default everywhere) lives here because
  the core needs it (a simulated worker's cache and two-tier caches default to it); ``fifo``,
  ``lfu`` and ``opt`` (Belady's offline optimum) live in ``dynlab_builtins.policies``.
- :class:`FutureIndex`: an access sequence indexed once, shared by offline policies.

This module is core: it imports no plugin and no CLI code.
"""
from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from typing import Callable, ClassVar, Hashable, Iterator, Optional

__all__ = [
    "EvictionPolicy",
    "LRUCache",
    "FutureIndex",
]


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
    - ``protect``: ``None`` or a predicate; while it is set, a miss never evicts a key for which
      ``protect(key)`` is true: it evicts the policy's next victims among the others. If they run
      out before the new entry fits, the new entry is not stored (those evicted stay evicted). A fleet worker protects the blocks of the request it
      serves and every block whose child it holds, so that a cache of prefixes evicts a child
      before its parent (vLLM frees a request's blocks tail first for the same reason) and keeps
      everything it holds reusable. Policies that ignore ``protect`` still work with the worker,
      which then drops the orphaned descendants of an evicted parent itself.
    """

    name: ClassVar[str] = ""
    #: True for offline policies that must be given ``future`` (``opt``); callers check it before
    #: building the whole access sequence.
    needs_future: ClassVar[bool] = False

    def __init__(self, capacity: int, future: Optional[Sequence[Hashable]] = None):
        self.capacity: int = _check_capacity(capacity)
        self.on_evict: Optional[Callable[[Hashable], None]] = None
        self.protect: Optional[Callable[[Hashable], bool]] = None

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
        if used > capacity and self.protect is not None:
            return self._store_protected(key, size)
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

    def _store_protected(self, key: Hashable, size: int) -> bool:
        """Miss path with :attr:`protect` set: evict the front-most unprotected entry until ``size`` fits."""
        data, protect, on_evict = self._data, self.protect, self.on_evict
        while self._used + size > self.capacity:
            # a fresh scan for each victim: evicting a child can make its parent evictable
            victim = next((k for k in data if not protect(k)), None)
            if victim is None:
                return False  # only protected entries left: the new one is not stored
            self._used -= data.pop(victim)
            if on_evict is not None:
                on_evict(victim)
        data[key] = size
        self._used += size
        return False


class LRUCache(_OrderedDictCache):
    """Least recently used: evict the entry untouched for longest (the two-tier KV cache lab's cache, the default).

    ``LRUCache(capacity)``; ``access(key, size)`` as in :class:`EvictionPolicy`: a hit makes the
    entry most recent, a miss evicts oldest-first until the new entry fits. ``keys()`` lists keys
    oldest (next victim) first. Each access is O(1) amortised: an ``OrderedDict`` of key -> size
    and a running total for ``used``. Source: step 1 of the seed lab ``shared/seeds/002``.

    :attr:`entries` (the OrderedDict of key -> size, oldest first) is read and updated in place by the
    fleet's unit-size fast path (:mod:`dynlab.engine.counted`), which then calls :meth:`recount_units`.
    """

    name = "lru"

    @property
    def entries(self) -> OrderedDict:
        """The OrderedDict of key -> size, oldest (next victim) first, itself (not a copy)."""
        return self._data

    def recount_units(self) -> int:
        """Set ``used`` to the number of entries after an in-place update of :attr:`entries` that left every
        entry of size 1; returns it."""
        self._used = len(self._data)
        return self._used

    def access(self, key: Hashable, size: int = 1) -> bool:
        if size < 0:
            raise _negative_size(size)
        data = self._data
        if key in data:
            data.move_to_end(key)
            return True
        return self._store(key, size)


class FutureIndex(Sequence):
    """An access sequence of keys with each key's positions indexed, for offline policies (``opt``).

    Behaves as the read-only sequence it was built from. Building it costs O(n); pass one
    instance to several ``opt`` caches over the same sequence (the two tiers of a
    :class:`TwoTierCache`, the workers of a fleet) to build it once.

    ``times`` (optional, one non-decreasing int per key): when the keys are used, where several
    keys are used at once; the fleet passes each block's request number, so that an ``opt`` cache
    ranks the blocks of one request as used together (ties go to the least recently touched).
    Without it each position is its own time.
    """

    __slots__ = ("_keys", "positions", "next_after", "never", "times", "never_time")

    def __init__(self, keys: Sequence[Hashable], times: Optional[Sequence[int]] = None):
        self._keys = list(keys)
        n = len(self._keys)
        if times is not None and len(times) != n:
            raise ValueError(f"times has {len(times)} entries for {n} keys")
        #: position -> time of use (``None``: the position itself)
        self.times = None if times is None else list(times)
        #: position used for "never used again"
        self.never = n
        #: time used for "never used again", later than every time
        self.never_time = n if not self.times else max(n, self.times[-1] + 1)
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

    def time_of(self, position: int) -> int:
        """When ``position`` is used (:attr:`never_time` for :attr:`never`)."""
        if position >= self.never:
            return self.never_time
        return position if self.times is None else self.times[position]

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
