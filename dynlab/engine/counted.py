"""Simulated workers: each holds a KV cache of blocks, serves requests, and publishes KV events.

A worker with ``capacity=None`` remembers every block forever (the seed's model);
otherwise it keeps at most ``capacity`` blocks (size 1 each) under an eviction
policy (:class:`dynlab.kv.policies.EvictionPolicy`).

Serving a request of blocks ``h[0..n-1]`` whose first ``k`` blocks are held, an
LRU cache (the default) goes through three steps:

1. the ``k`` cached blocks are touched (so the new blocks cannot evict them unless
   the request alone exceeds the capacity),
2. the ``n-k`` new blocks are stored tail-first,
3. the cached blocks are touched again tail-first,

so a parent is always more recent than its children (vLLM frees a request's
blocks in reverse order for the same reason) and the cache stays *prefix-closed*:
if a block is held, so is its parent.

Other policies (fifo, lfu, opt, third-party ones) see one access per block, tail
first (the order in which the future of an offline policy such as ``opt`` is laid
out), with the policy's ``protect`` predicate set to refuse two kinds of victim:
the blocks of the request being served (a request's blocks are never evicted
while it uses them, so its cached head is neither evicted nor counted twice) and
every block whose child is held (a child goes before its parent, as from vLLM's
free-block queue). So eviction keeps what the cache holds reusable. When the
request's new blocks do not all fit beside its cached head, the leading ones that
fit are stored (``capacity - cached``), never a tail without its head. A policy
that ignores ``protect`` still works: evicting a parent then also drops its held
descendants (reported as removed, counted as evicted).

The bound ``opt`` gives here: on one worker, ``opt`` (farthest next use by request
number among the blocks that may go) gets the most cached blocks of any eviction
choice in this model -- every missed block that fits beside the request's cached
head is stored (no bypass), victims are never blocks of the request being served,
and the cache stays prefix-closed. tests/test_fleet.py checks this against a
brute-force optimum on small traces; a policy allowed to decline storing a block
could do better. lru keeps its fast path, whose numbers the labs pin: a request
longer than the whole cache there keeps its leading blocks but counts its own
blocks evicted and stored again.

The worker then reports the net change as KV events: ``BlockRemoved`` for blocks
it held before and not after, ``BlockStored`` for blocks it holds now and did not
before (prefix order).
"""
from __future__ import annotations

from collections import deque
from itertools import islice, repeat
from typing import Hashable, Optional, Sequence

from dynlab.kv.policies import EvictionPolicy, LRUCache
from dynlab.routing.hashing import overlap

_consume = deque(maxlen=0).extend  # run an iterator at C speed, keeping nothing


class Worker:
    """One serving engine's KV cache. ``cache`` is a set (unbounded) or an :class:`EvictionPolicy`."""

    __slots__ = ("id", "cache", "bounded", "evicted_blocks", "size", "_evicted", "_kids", "_parent", "_pinned",
                 "_lru", "_members")

    def __init__(self, worker_id: int, cache: Optional[EvictionPolicy] = None):
        self.id = worker_id
        self.bounded = cache is not None
        self.cache = cache if cache is not None else set()
        self.evicted_blocks = 0
        self.size = 0  # blocks held, kept current by serve()
        self._evicted: list = []
        self._lru = type(cache) is LRUCache
        # membership tests go straight to the LRU's OrderedDict (no Python-level __contains__)
        self._members = cache.entries if self._lru else self.cache
        self._kids: dict = {}  # held block -> its held children (non-empty sets only); generic path
        self._parent: dict = {}  # held block -> the parent it was stored under; generic path
        self._pinned = ()  # the blocks of the request being served
        if cache is not None:
            if self._lru:
                cache.on_evict = self._evicted.append
            else:
                cache.on_evict = self._on_evict
                cache.protect = self._protected

    def __contains__(self, block: Hashable) -> bool:
        return block in self.cache

    def __len__(self) -> int:
        return len(self.cache)

    def overlap(self, hashes: Sequence[Hashable]) -> int:
        """Leading blocks of ``hashes`` held now (contiguous from block 0)."""
        return overlap(hashes, self._members)

    def members(self):
        """What :meth:`overlap` reads: the held blocks as a container (``in``), live; not to be modified."""
        return self._members

    def server(self):
        """:meth:`serve` as the function this worker's cache takes (the LRU's own path when it has one),
        for a loop that serves many requests: the same results, one dispatch less per call."""
        return self._serve_lru if self.bounded and self._lru else self.serve

    def serve(self, hashes: Sequence[Hashable], cached: int) -> tuple[Sequence, Sequence]:
        """Store the request's blocks; ``cached`` is :meth:`overlap` on arrival.

        Returns ``(stored, removed)``: blocks newly held (prefix order) and blocks
        held before and not any more (the payloads of ``BlockStored`` / ``BlockRemoved``);
        either may be a list or a tuple, and must not be modified.
        """
        if not self.bounded:
            new = hashes[cached:]
            self.cache.update(new)
            self.size = len(self.cache)
            return new, ()
        if self._lru:
            return self._serve_lru(hashes, cached)
        cache = self.cache
        evicted = self._evicted
        access = cache.access
        n = len(hashes)
        # the most new blocks that fit beside the pinned head: every other held block can be freed,
        # leaves first (a block outside this request has no descendant inside it)
        end = cached + min(n - cached, max(0, cache.capacity - cached))
        parent, kids = self._parent, self._kids
        self._pinned = set(hashes)
        try:
            for i in range(end - 1, -1, -1):  # one tail-first pass: the order an opt future is built in
                h = hashes[i]
                if i < cached or h in cache:
                    access(h)
                    continue
                access(h)
                if i and h in cache:  # newly stored: its parent now has a held child
                    p = hashes[i - 1]
                    parent[h] = p
                    s = kids.get(p)
                    if s is None:
                        kids[p] = {h}
                    else:
                        s.add(h)
        finally:
            self._pinned = ()
        if evicted:
            self._drop_orphans()
        self.size = len(cache)
        stored = [h for h in hashes[cached:] if h in cache]
        if not evicted:
            return stored, []
        new_set = set(hashes[cached:])
        left = [h for h in dict.fromkeys(evicted) if h not in cache]
        removed = [h for h in left if h not in new_set]
        self.evicted_blocks += len(left)  # blocks that left the cache, each once
        evicted.clear()
        return stored, removed

    def _protected(self, block: Hashable) -> bool:
        # the policies' ``protect``: a block of the request being served, or a held block's parent
        return block in self._pinned or block in self._kids

    def _on_evict(self, block: Hashable) -> None:
        self._evicted.append(block)
        p = self._parent.pop(block, None)
        if p is not None:
            s = self._kids.get(p)
            if s is not None:
                s.discard(block)
                if not s:
                    del self._kids[p]

    def _serve_lru(self, hashes: Sequence[Hashable], cached: int) -> tuple[list, list]:
        """:meth:`serve` for an :class:`LRUCache` of unit-size blocks, on its OrderedDict directly.

        Same three phases as the generic path; in a prefix-closed cache every block after
        the ``cached`` head is a miss, so the new blocks are stored without lookups.
        """
        cache = self.cache
        od = cache.entries
        cap = cache.capacity
        n = len(hashes)
        new_count = n - cached
        mte = od.move_to_end
        popitem = od.popitem
        evicted = []
        if new_count:
            room = cap - len(od)
            if cached and new_count > room:
                _consume(map(mte, hashes[:cached]))
            if new_count <= cap:
                # evict the oldest first, then store the new blocks tail-first in one call
                if new_count > room:
                    evicted = list(islice(od, new_count - room))
                    _consume(map(od.__delitem__, evicted))
                od.update(zip(reversed(hashes[cached:]), repeat(1)))
            else:  # the request alone exceeds the cache: its own tail goes first
                for i in range(n - 1, cached - 1, -1):
                    if len(od) >= cap:
                        if cap == 0:
                            break
                        evicted.append(popitem(False)[0])
                    od[hashes[i]] = 1
        if n <= cap:  # the cached head is still held (touched before any eviction): touch it, tail first
            if cached:
                _consume(map(mte, hashes[cached - 1::-1]))
        else:
            for i in range(cached - 1, -1, -1):
                h = hashes[i]
                if h in od:
                    mte(h)
                elif cap:  # evicted by this request's own new blocks (request longer than the cache)
                    if len(od) >= cap:
                        evicted.append(popitem(False)[0])
                    od[h] = 1
        self.size = cache.recount_units()
        if new_count <= cap and (n <= cap or not evicted):
            # every new block went in; evictions (if any) took only blocks outside this request, once each
            self.evicted_blocks += len(evicted)
            return hashes[cached:], evicted
        stored = [h for h in hashes[cached:] if h in od]
        new_set = set(hashes[cached:])
        removed = [h for h in dict.fromkeys(evicted) if h not in od and h not in new_set]
        self.evicted_blocks += len(evicted)
        return stored, removed

    def _drop_orphans(self) -> None:
        """Safety net for a policy that ignores ``protect``: evicting a block drops its held descendants."""
        cache, kids, evicted = self.cache, self._kids, self._evicted
        stack = [x for x in evicted if x not in cache]  # evicted and not stored again since
        while stack:
            x = stack.pop()
            for c in kids.pop(x, ()):
                if c in cache:
                    cache.remove(c)
                    self._parent.pop(c, None)
                    evicted.append(c)
                    stack.append(c)
