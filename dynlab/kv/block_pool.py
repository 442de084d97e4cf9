"""The block pool of one engine: exactly ``capacity`` KV blocks, a free queue and a prefix cache.

Modelled on vLLM v1's ``BlockPool`` / ``FreeKVCacheBlockQueue`` (``vllm/v1/core``):

- Free blocks wait in a **free queue** whose head is the least recently freed; initially all, unnamed.
- :meth:`allocate` takes blocks from the head; a taken cached (named) block is evicted, its name
  appended to :attr:`removed` (the payload of a ``BlockRemoved``).
- :meth:`release` returns a sequence's named blocks to the tail in **reverse** order (its tail is
  evicted first), its unnamed ones (a partial last block) to the **head** (vLLM 0.33.0, PR #42656).
- :meth:`take_hits` takes prefix-cache hits out of the free queue; reference counts keep a block
  shared by running requests in use until the last one releases it (never evicted while in use).
- :meth:`register` names full blocks (appended to :attr:`stored`, a ``BlockStored``'s payload). A name
  already cached is cached again, a second copy under an alias key (:mod:`dynlab.kv.copies`, vLLM 0.33.0):
  the name stays findable while any copy is cached, and a hit takes the oldest copy.

Invariant: ``used_blocks + num_free == capacity`` (``num_free`` counts the never-used blocks too).

A request's names reach the pool as its **sequence** (:meth:`sequence`): here the names themselves;
:class:`~dynlab.kv.run_pool.RunBlockPool` (keyed by runs of names) takes them with their runs.
Methods take the sequence and positions in it, so the engine drives both alike.

Representation. Blocks move in runs (a prompt's hundreds of blocks), so every operation works on whole
runs in a few C-level passes (slices, set operations, ``filter``), with no Python step per block but in
rare cases (a block held by several requests, a duplicate registration); a named block costs about
six set operations in its life (~20-50 ns each, measured in the 8-worker replay of the bundled trace):

- A holder (a request) keeps the list of its **keys** in sequence order and hands it back to
  :meth:`release`: a named block's key is its name (an int >= 0), an unnamed block's ``-1``
  (:data:`UNNAMED`: interchangeable). The pool does not track which holder owns which block.
- ``_cached``: the set of cached (named) names, in use or free: the prefix cache's content.
  ``_used``: the cached names held by at least one request; ``_shared``: ``name -> reference
  count`` for those held by two or more (a hit on a running request's block). A cached name not
  in ``_used`` is free (in the free queue, evictable).
- ``_queue``: the free queue after the never-used blocks, head first, as a ``deque`` of
  **segments**: an ``int`` is that many unnamed blocks, a ``list`` is named blocks in queue order
  (one release's named blocks, reversed). ``_head`` entries of the first segment are already
  taken (lists only; an int segment just shrinks). A release appends at most a count and a list
  (more only when unnamed blocks sit between named ones, a duplicate registration); an
  allocation takes slices.
- **Lazy removal**: a hit on a free block does not search the queue, it leaves a stale entry
  (``_stale``: the names with stale entries; ``_stale_more``: ``name -> stale entries beyond the
  first``). A stale entry always precedes the block's live entry (a block re-enters the queue
  only at the tail), so an entry met at the head is stale exactly when its name is in
  ``_stale``: :meth:`allocate` skips (drops) it. A segment never holds a name twice (a request's
  names are distinct), so a slice's stale entries are found with one set test each. ``_nfree``
  counts the live entries.
- ``_fresh``: the unnamed blocks (never used, or released unnamed: :meth:`_push_unnamed`) at the head of
  the free queue, ahead of ``_queue``: interchangeable, a count, not entries, so memory grows with the
  blocks a workload touches, not ``capacity``. Allocation takes them first, as vLLM's free queue does.
"""
from __future__ import annotations

from collections import deque
from itertools import compress, count, filterfalse, islice, repeat
from operator import add, not_
from typing import List, Optional, Sequence

from dynlab.kv.copies import Copies
from dynlab.kv.pool_checks import PoolChecks

__all__ = ["BlockPool", "UNNAMED"]

#: the key of every unnamed block in a holder's key list (names are ints >= 0)
UNNAMED = -1


class BlockPool(PoolChecks):
    """``capacity`` KV blocks: a free queue (LRU of freed blocks) and a prefix cache of named blocks.

    Attributes read by the engine and metrics:

    - ``capacity``: blocks in the pool; ``num_free``: blocks in the free queue (unnamed or
      cached-evictable); ``used_blocks``: blocks held by requests (``capacity - num_free``).
    - ``stored`` / ``removed``: names registered / evicted since the caller last cleared them
      (the engine clears them per step, :meth:`clear_events`; read as plain lists, no property).
    """

    __slots__ = ("capacity", "_fresh", "_queue", "_head", "_nfree", "_cached", "_used", "_shared",
                 "_stale", "_stale_more", "stored", "removed", "copies")

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 block, got {capacity}")
        self.capacity = capacity
        self._fresh = capacity  # never-used blocks, at the head of the free queue (a count, not entries)
        self._queue: deque = deque()  # segments: int (unnamed blocks) or list (named, queue order)
        self._head = 0  # entries of the first (list) segment already taken
        self._nfree = 0  # live entries of _queue
        self._cached: set = set()
        self._used: set = set()  # cached names held by >= 1 request
        self._shared: dict = {}  # name -> reference count, for names held by >= 2 requests
        self._stale: set = set()  # names with entries in _queue left behind by hits (skipped when met)
        self._stale_more: dict = {}  # name -> stale entries beyond the first
        self.stored: List[int] = []
        self.removed: List[int] = []
        self.copies = Copies()  # names with a second cached copy (dynlab.kv.copies)

    # -- reading --------------------------------------------------------------------------
    @staticmethod
    def sequence(names: Sequence[int], runs=None) -> Sequence[int]:
        """What this pool takes for a request's names (``runs``: their runs, not needed here): the names."""
        return names

    @property
    def num_free(self) -> int:
        """Blocks in the free queue (never used, unnamed, or cached and evictable)."""
        return self._fresh + self._nfree

    @property
    def used_blocks(self) -> int:
        """Blocks held by requests (a shared block counts once); never counts cached free blocks."""
        return self.capacity - self._fresh - self._nfree

    def cached(self) -> set:
        """The names the pool holds (in use or free; a copy's alias as its name): what a prefix lookup can find
        (a new set; both pools, from :meth:`_keys`)."""
        alias = self.copies.name
        keys = self._keys()
        return {alias.get(k, k) for k in keys} if alias else keys

    def _keys(self) -> set:
        """The cached keys (aliases as themselves): a new set."""
        return set(self._cached)

    def __contains__(self, name: int) -> bool:
        return name in self._cached

    def references(self, name: int) -> int:
        """Requests holding the cached block ``name`` (0: it is free). ``KeyError`` if not cached."""
        if name not in self._cached:
            raise KeyError(name)
        return self._shared.get(name) or (1 if name in self._used else 0)

    def lookup(self, names: Sequence[int], max_blocks: int) -> int:
        """How many leading ``names`` (at most ``max_blocks``) are cached: a prefix hit, in blocks."""
        if max_blocks <= 0:
            return 0
        contains = self._cached.__contains__
        misses = compress(count(), map(not_, map(contains, islice(names, max_blocks))))
        n = min(max_blocks, len(names))
        h = min(next(misses, max_blocks), n)
        if self.copies.of:  # names cached only under an alias continue the hit (as RunBlockPool.lookup)
            h = self.copies.extend_hit(names, h, n, contains)
        return h

    def evictable_hits(self, names: Sequence[int], h: int) -> int:
        """How many of the (cached) first ``h`` ``names`` sit in the free queue (taking them costs free blocks;
        a name's oldest copy is the one taken, :mod:`dynlab.kv.copies`)."""
        return list(map(self._used.__contains__, self._hit_keys(names, h))).count(False)

    def _hit_keys(self, names: Sequence[int], h: int) -> List[int]:
        """The keys a hit on the (cached) first ``h`` ``names`` takes, a new list: the names, but a name with
        copies gives its oldest cached copy's (:meth:`Copies.pick <dynlab.kv.copies.Copies.pick>`)."""
        keys = names[:h]
        if keys.__class__ is not list:
            keys = list(keys)
        if self.copies.of:
            self.copies.pick(keys, self._cached.__contains__)
        return keys

    # -- changing -------------------------------------------------------------------------
    def take_hits(self, names: Sequence[int], h: int) -> List[int]:
        """Take the (cached) first ``h`` ``names`` for a request (reference count + 1; out of the free
        queue if free); returns their keys (a new list, the holder's first ``h``): the names, but a name
        with copies gives its oldest cached copy's (:mod:`dynlab.kv.copies`)."""
        if h <= 0:
            return []
        names = keys = self._hit_keys(names, h)
        used = self._used
        held = used.intersection(names)
        if held:  # blocks other requests hold: one more reference each
            shared = self._shared
            shared.update(zip(held, map(add, map(shared.get, held, repeat(1)), repeat(1))))
            if len(held) == len(names):
                return keys
            names = list(filterfalse(held.__contains__, names))
        stale = self._stale  # free blocks leave the queue: their entries become stale (module docstring)
        if stale and not stale.isdisjoint(names):
            more = self._stale_more
            again = stale.intersection(names)
            more.update(zip(again, map(add, map(more.get, again, repeat(0)), repeat(1))))
        stale.update(names)
        used.update(names)
        self._nfree -= len(names)
        return keys

    def clear_events(self, stored: bool = True) -> None:
        """Empty :attr:`removed` (and :attr:`stored`, unless ``stored`` is false): new lists, the old ones
        stay with whoever holds them. The one way to clear them (a pool keyed by runs clears their runs too)."""
        if stored:
            self.stored = []
        self.removed = []

    def allocate(self, n: int) -> List[int]:
        """Take ``n`` blocks from the free-queue head; returns their keys (``n`` times :data:`UNNAMED`).

        Cached blocks among them are evicted (their names appended to :attr:`removed`).
        Raises ``ValueError`` when fewer than ``n`` blocks are free (callers check :attr:`num_free`).
        """
        if n <= 0:
            return []
        fresh = self._fresh
        if n > fresh + self._nfree:
            raise ValueError(f"cannot allocate {n} blocks: {fresh + self._nfree} free")
        if fresh >= n:  # never-used blocks first: they are the head of the queue, and evict nothing
            self._fresh = fresh - n
        else:
            if fresh:
                self._fresh = 0
            self._take(n - fresh)
        return [UNNAMED] * n

    def allocate_each(self, counts: Sequence[int], hidden: Optional[int] = None) -> int:
        """Take ``counts[0]``, then ``counts[1]``, ... blocks: what as many :meth:`allocate` calls
        take and evict, in the same order (names appended to :attr:`removed`), in one walk of the
        free queue. Returns how many of those allocations evicted a cached block (each would have
        had a ``BlockRemoved`` of its own; with ``hidden``, evicting only names ``>= hidden``, which are
        not published, does not count). Keys are not returned: all :data:`UNNAMED`. Raises
        ``ValueError`` when fewer than ``sum(counts)`` blocks are free."""
        n = sum(counts)
        fresh = self._fresh
        if n > fresh + self._nfree:
            raise ValueError(f"cannot allocate {n} blocks: {fresh + self._nfree} free")
        if fresh >= n:
            self._fresh = fresh - n
            return 0
        self._fresh = 0
        spans: list = []
        first = len(self.removed)
        self._take(n - fresh, spans)
        # eviction spans as [first, last + 1) positions among the n blocks taken (fresh ones first)
        spans = [(n - before, n - before + evicted) for before, evicted in spans]
        if hidden is not None and len(self.removed) > first and max(self.removed[first:]) >= hidden:
            where = [p for a, b in spans for p in range(a, b)]  # one position per evicted name, in order
            spans = [(p, p + 1) for p, name in zip(where, self.removed[first:]) if name < hidden]
        evicting, i, start = 0, 0, 0
        for c in counts:  # allocation [start, start + c) evicted when an eviction span meets it
            end = start + c
            while i < len(spans) and spans[i][1] <= start:
                i += 1
            if c and i < len(spans) and spans[i][0] < end:
                evicting += 1
            start = end
        return evicting

    def _take(self, want: int, spans: Optional[list] = None) -> None:
        """Take ``want`` live entries from the head of ``_queue``, evicting the named ones; ``spans``
        (given): each eviction appends ``(entries still wanted before it, entries evicted)``."""
        self._nfree -= want
        queue, stale = self._queue, self._stale
        while want:
            seg = queue[0]
            if seg.__class__ is int:
                if seg > want:
                    queue[0] = seg - want
                    return
                queue.popleft()
                want -= seg
                continue
            start = self._head
            end = start + want
            whole = end >= len(seg)
            if whole:
                queue.popleft()
                self._head = 0
            else:
                self._head = end
            if want == 1:  # most calls (a decode's block boundary): one entry, no slice
                name = seg[start]
                if name in stale:
                    self._drop_stale_one(name)
                    continue
                self._cached.remove(name)
                self.removed.append(name)
                if spans is not None:
                    spans.append((1, 1))
                return
            chunk = seg if whole and not start else seg[start:end]
            if stale and not stale.isdisjoint(chunk):
                chunk = self._drop_stale(chunk)
            if chunk:
                self._cached.difference_update(chunk)
                self.removed.extend(chunk)
                if spans is not None:
                    spans.append((want, len(chunk)))
                want -= len(chunk)

    def _drop_stale_one(self, name: int) -> None:
        """Consume one stale entry of ``name``."""
        more = self._stale_more
        c = more.get(name)
        if c is None:
            self._stale.remove(name)
        elif c == 1:
            del more[name]
        else:
            more[name] = c - 1

    def _drop_stale(self, chunk: list) -> list:
        """The live entries of ``chunk`` (a slice of one segment: distinct names); its stale
        entries are consumed (a name's stale count drops by one)."""
        stale, more = self._stale, self._stale_more
        gone = list(filter(stale.__contains__, chunk))
        live = list(filterfalse(stale.__contains__, chunk))
        if more and not more.keys().isdisjoint(gone):
            again = [name for name in gone if name in more]  # more than one stale entry: one fewer
            _count_down(more, again, 1)
            gone = list(filterfalse(set(again).__contains__, gone))
        stale.difference_update(gone)
        return live

    def register(self, keys: list, names: Sequence[int], start: int, end: int) -> None:
        """Name the blocks ``keys[start:end]`` with ``names[start:end]`` (full prompt blocks just computed).

        ``keys`` is the holder's key list (updated in place: a registered block's key becomes
        its name). Registered names are appended to :attr:`stored`. A name already cached (another
        block holds it) is cached again, as vLLM 0.33.0's ``cache_full_blocks`` does: that block is
        one more copy, keyed by an alias (:meth:`Copies.add <dynlab.kv.copies.Copies.add>`), its name
        stored again (a second ``BlockStored``). Names within one request are assumed distinct (true
        for prefix-chained names).
        """
        if end <= start:
            return
        names = names[start:end]
        cached, used, copies = self._cached, self._used, self.copies
        if cached.isdisjoint(names) and (not copies.of or copies.of.keys().isdisjoint(names)):
            keys[start:start + len(names)] = names
            cached.update(names)
            used.update(names)
            self.stored.extend(names)
            return
        contains = cached.__contains__
        for i, name in enumerate(names, start):  # rare: some names have a cached copy already
            key = copies.key_for(name, contains)
            keys[i] = key
            cached.add(key)
            used.add(key)
            self.stored.append(name)

    def release(self, keys: Sequence[int], names: Sequence[int] = (), out_at: int = 0, out: int = 0) -> None:
        """A holder frees its blocks (``keys`` in sequence order) to the free-queue tail, reversed, but named
        ones another request holds (``names``: the sequence, read by :class:`~dynlab.kv.run_pool.RunBlockPool`).
        ``out``: the unnamed ``keys[out_at:out_at + out]``, a finished request's generated-token blocks, take
        a named block's tail place (vLLM hashes them) as unnamed blocks: never hit, evicted unpublished."""
        if not keys:
            return
        n = self._release_out(keys, out_at, out) if out else len(keys)
        if not n:
            return
        try:
            p = keys.index(UNNAMED, 0, n)
        except ValueError:
            p = n
        if p == n or keys[p:n].count(UNNAMED) == n - p:  # the common case: named blocks, then unnamed ones
            if p < n:
                self._push_unnamed(n - p)
            freed = self._unref(keys[p - 1::-1]) if p else ()  # reversed: the queue's order
            if freed:
                self._queue.append(freed)
                self._nfree += len(freed)
            return
        rev = keys[n - 1::-1]  # unnamed blocks between named ones (a duplicate registration)
        freed = set(self._unref([key for key in rev if key >= 0]))
        run: list = []
        for key in rev:
            if key < 0:
                if run:
                    self._queue.append(run)
                    run = []
                self._push_unnamed(1)
            elif key in freed:
                run.append(key)
                self._nfree += 1
        if run:
            self._queue.append(run)

    def _release_out(self, keys: Sequence[int], out_at: int, out: int) -> int:
        """:meth:`release`'s ``out`` blocks to the tail, the blocks after them (a partial one) to the head;
        returns ``out_at``, the keys left to release."""
        after = len(keys) - out_at - out
        self._push_unnamed(after)
        self._queue.append(out)
        self._nfree += out
        return out_at

    def _unref(self, named: list) -> list:
        """Drop one reference to each of the (distinct) ``named`` blocks (a new list, reversed or not);
        returns those now free, in the same order."""
        shared = self._shared
        if shared:
            held = shared.keys() & named
            if held:  # blocks other requests still hold: one reference fewer, they stay in use
                _count_down(shared, held, 2)
                k = len(held)
                if held.issuperset(named[-k:]):  # usually the hits: a sequence's first blocks, last here
                    named = named[:-k]
                else:
                    named = list(filterfalse(held.__contains__, named))
        self._used.difference_update(named)
        return named

    def _push_unnamed(self, n: int) -> None:
        """Return ``n`` released unnamed blocks to the free-queue HEAD (counted here, not in ``_nfree``):
        THE rule for unnamed blocks, both pools (vLLM 0.33.0's ``free_blocks``, PR #42656; earlier vLLM
        appended them to the tail). Interchangeable, they join the head's count :attr:`_fresh`."""
        self._fresh += n


def _count_down(counts: dict, names, last: int) -> None:
    """Lower ``counts[name]`` by one for each of ``names``; a count at ``last`` leaves the dict instead
    (the extra stale entries of a name: ``last`` 1; the holders of a shared block: ``last`` 2)."""
    for name in names:
        c = counts[name]
        if c == last:
            del counts[name]
        else:
            counts[name] = c - 1
