"""The block pool keyed by runs of names: :class:`BlockPool`'s behaviour, one step per run instead of per name.

An engine's block names from a trace that names its own blocks (Mooncake: one id per 512 tokens) are
``trace id * 1024 + offset`` (:mod:`dynlab.engine.names`): the 32 engine blocks of a trace block are
one **run** ``(first name, count)``, registered, hit, released and mostly evicted together.
:class:`RunBlockPool` behaves exactly as :class:`~dynlab.kv.block_pool.BlockPool` (same evictions in
the same order, same stored/removed names in the same order, same counts and answers; a hypothesis
state machine compares both with the older pool kept as an oracle) but keys its state by **group**
``name >> 10`` with one bitmask of offsets (``name & 1023``) per group, so an operation on a run is a
few int operations on one dict entry instead of a set operation per name. The engine hands it each
request's runs (:meth:`sequence`); any names work (a run of one name is a group of one bit), but
names with no runs longer than one gain nothing: :class:`BlockPool` is kept for them.

Representation (the free queue and the never-used blocks as in :class:`BlockPool`):

- A run never crosses a group boundary (``offset + count <= 1024``; engine runs never do, and a
  run of one name cannot). A group's **mask** of names ``M`` has bit ``o`` set for name
  ``(group << 10) + o``.
- ``_cached``: group -> mask of the cached names (in use or free).
- ``_refs``: group -> the **levels** of its names' reference counts: ``[L1, L2, ...]``, ``Lk`` the
  mask of names held by at least ``k`` requests (``L1``: the names in use), or, when no name of the
  group is held twice (most groups), the mask ``L1`` alone, an int (no list to allocate: fewer
  objects for the garbage collector to track). Taking a hit counts the run's names once more, a
  release once less, a few bitwise operations per level (:mod:`dynlab.kv.levels`); a
  name released from ``L1`` alone becomes free.
- ``_stale``: group -> the levels of its names' **stale entries** (a hit on a free block leaves its
  queue entry behind, removed lazily when met at the head; a name can have several), the same way.
- The free queue's named segments are lists of **entries** ``(group, mask, names, base)``: one
  release's names, in queue order: entries in list order, each entry's names from the highest
  offset down (a release reverses its sequence, and a run ascends). ``names[base + o]`` is the name
  of offset ``o``: the holder's list of names, so that :attr:`removed` hands on the same int objects
  as :attr:`stored` did (a dict keyed by them, the router's index, finds an identical key faster
  than an equal one). A group's stale entries always precede its live one, so the names of an entry
  met at the head that are counted in ``_stale`` are stale (dropped, counted once less); the rest
  are evicted. An allocation that stops inside an entry takes its highest live names and leaves
  the rest in its place.
- A holder's keys are as in :class:`BlockPool` (names in sequence order, :data:`UNNAMED` for
  unnamed blocks). As :meth:`allocate`, :meth:`take_hits` and :meth:`register` build them, they are
  a named prefix then unnamed blocks, unless :meth:`register` left a block unnamed between named
  ones (a duplicate): ``_mixed`` keeps those lists (by ``id``, holding them so that the id stays
  theirs) until their :meth:`release`, which then goes name by name. Any other list's named prefix
  is found by a binary search comparing keys with :data:`UNNAMED` by identity, reading no name's
  int object (a scan compares each of a prompt's ~750 names, a cache miss each), and its runs are
  read from the holder's :class:`Runs`.

What changed, as runs: :attr:`RunBlockPool.stored_runs` and :attr:`RunBlockPool.removed_runs` hold the
names of :attr:`~BlockPool.stored` and :attr:`~BlockPool.removed` as ``(group, mask)`` pairs, appended
as the names are (one pair per registered run or evicted entry, no per-name work); assigning
``stored`` or ``removed`` (the engine does, per step) empties its pairs too. They are what the engine's
KV events carry as ``runs`` (:mod:`dynlab.routing.events`).
"""
from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import Optional, Sequence

from dynlab.groups import GROUP_LOW, GROUP_SHIFT
from dynlab.groups import set_bits as _bits
from dynlab.kv.block_pool import UNNAMED, BlockPool
from dynlab.kv.copies import key_runs
from dynlab.kv.levels import _count, _count_in, _count_out, _once, _top
from dynlab.kv.pool_checks import RunPoolChecks

__all__ = ["RunBlockPool", "Runs", "expand"]


def expand(runs: Sequence[tuple]) -> list:
    """The names of ``runs`` (``(first name, count)`` pairs), in order: a new list of ints (one
    ``extend`` of a range per run, not a step per name)."""
    names: list = []
    extend = names.extend
    for first, c in runs:
        extend(range(first, first + c))
    return names

_SHIFT, _LOW = GROUP_SHIFT, GROUP_LOW  # a group holds the names (group << 10) + 0 .. 1023


class Runs:
    """A request's block names and the same names as runs, for :class:`RunBlockPool`.

    ``names``: the names in sequence order; ``runs``: ``(first name, count)`` covering them in
    order (names ``first ... first + count - 1``), none crossing a group of 1024 names;
    ``ends``: the names up to the end of each run.
    """

    __slots__ = ("_names", "runs", "ends")

    def __init__(self, names: Sequence[int], runs: Optional[Sequence[tuple]]):
        """``runs``: as the attribute (``None``: one run per name). Raises ``ValueError`` when they
        do not add up to ``names`` or one crosses a group."""
        if runs is None:
            runs = [(name, 1) for name in names]
        self._names, self.runs = names, runs
        self.ends = ends = list(accumulate([c for _, c in runs]))
        if (ends[-1] if ends else 0) != len(names):
            raise ValueError(f"runs of {ends[-1] if ends else 0} names for {len(names)} names")
        if any((first & _LOW) + c > _LOW + 1 for first, c in runs):
            raise ValueError("a run crosses a group of 1024 names")

    @property
    def names(self) -> Sequence[int]:
        """The names in sequence order (expanded from :attr:`runs` again after :meth:`drop_names`)."""
        names = self._names
        if names is None:
            names = self._names = expand(self.runs)
        return names

    def drop_names(self) -> None:
        """Keep the names only as :attr:`runs` until next read (a waiting request's memory)."""
        self._names = None

    def span(self, start: int, end: int) -> list:
        """The runs of names ``[start, end)``, the first and last clipped to them."""
        if end <= start:
            return []
        ends, runs = self.ends, self.runs
        a, k = bisect_right(ends, start), bisect_right(ends, end - 1)
        out = runs[a:k + 1]
        if ends[k] > end:
            first, c = out[-1]
            out[-1] = (first, c - ends[k] + end)
        skip = start - ends[a] + runs[a][1]
        if skip:
            first, c = out[0]
            out[0] = (first + skip, c - skip)
        return out


class RunBlockPool(RunPoolChecks, BlockPool):
    """:class:`BlockPool` keyed by runs (module docstring); takes :class:`Runs` where it takes names.

    Reuses :class:`BlockPool`'s never-used blocks, counts and allocation; ``_cached`` and ``_stale``
    hold group masks here, ``_refs`` replaces ``_used``/``_shared``/``_stale_more``.
    """

    __slots__ = ("_refs", "_mixed", "stored_runs", "removed_runs")

    def __init__(self, capacity: int):
        self.stored_runs: list = []  # (group, mask) pairs of the names of stored, in order
        self.removed_runs: list = []  # and of removed
        super().__init__(capacity)
        self._cached: dict = {}  # group -> mask of cached names
        self._stale: dict = {}  # group -> levels of stale entries
        self._refs: dict = {}  # group -> levels of holders
        self._mixed: dict = {}  # id(keys) -> keys: key lists with a block left unnamed by register

    def clear_events(self, stored: bool = True) -> None:
        """:meth:`BlockPool.clear_events`, and the runs of the names emptied with them (:attr:`removed_runs`,
        :attr:`stored_runs`)."""
        if stored:
            self.stored, self.stored_runs = [], []
        self.removed, self.removed_runs = [], []

    # -- reading --------------------------------------------------------------------------
    @staticmethod
    def sequence(names: Sequence[int], runs: Optional[Sequence[tuple]]) -> Runs:
        """What this pool takes for a request's names: its :class:`Runs`."""
        return Runs(names, runs)

    def _keys(self) -> set:
        """The cached keys (aliases as themselves)."""
        return {(g << _SHIFT) + o for g, m in self._cached.items() for o in _bits(m)}

    def __contains__(self, name: int) -> bool:
        return self._cached.get(name >> _SHIFT, 0) >> (name & _LOW) & 1 == 1

    def references(self, name: int) -> int:
        if name not in self:
            raise KeyError(name)
        return _count(self._refs, name)

    def lookup(self, seq: Runs, max_blocks: int) -> int:
        """How many leading names of ``seq`` (at most ``max_blocks``) are cached: a prefix hit, in blocks
        (a name cached only under an alias, :mod:`dynlab.kv.copies`, counts too)."""
        h = self._lookup(seq, max_blocks)
        if self.copies.of and h < max_blocks:
            h = self.copies.extend_hit(seq.names, h, max_blocks, self.__contains__)
        return h

    def _lookup(self, seq: Runs, max_blocks: int) -> int:
        """:meth:`lookup` under the names' own keys only."""
        ends = seq.ends
        n = min(max_blocks, ends[-1] if ends else 0)
        if n <= 0:
            return 0
        cached, got = self._cached, 0
        for first, c in seq.runs:
            m = cached.get(first >> _SHIFT, 0) >> (first & _LOW)
            ones = (m ^ (m + 1)).bit_length() - 1  # leading names of the run cached
            if ones < c:
                return min(got + ones, n)
            got += c
            if got >= n:
                return n
        return n

    def evictable_hits(self, seq: Runs, h: int) -> int:
        """How many of the (cached) first ``h`` names of ``seq`` sit in the free queue (of a name's copies,
        the oldest: the one a hit takes)."""
        if self.copies.of and h > 0:
            seq = self._hit_keys(seq, h)[1]
        refs, free = self._refs, 0
        for first, c in seq.span(0, h):
            bits = ((1 << c) - 1) << (first & _LOW)
            free += (bits & ~_once(refs.get(first >> _SHIFT, 0))).bit_count()
        return free

    def _hit_keys(self, seq: Runs, h: int) -> tuple:
        """``(keys, runs)`` of a hit on the (cached) first ``h`` names of ``seq``: the keys as
        :meth:`BlockPool._hit_keys`, and their :class:`Runs`: ``seq`` itself unless a key is a copy's."""
        keys = list(seq.names[:h])
        if self.copies.of and self.copies.pick(keys, self.__contains__):
            return keys, Runs(keys, key_runs(keys))
        return keys, seq

    # -- changing -------------------------------------------------------------------------
    def take_hits(self, seq: Runs, h: int) -> list:
        """Take the (cached) first ``h`` names of ``seq`` for a request (one more reference each;
        out of the free queue if free: their queue entries become stale); returns their keys (a new
        list: :meth:`BlockPool.take_hits`; one holding an alias is released name by name, ``_mixed``, so the
        holder must keep this list object, growing it in place)."""
        if h <= 0:
            return []
        keys, runs = self._hit_keys(seq, h)
        if runs is not seq:
            self._mixed[id(keys)] = keys
            seq = runs
        refs, stale = self._refs, self._stale
        for first, c in seq.span(0, h):
            g = first >> _SHIFT
            bits = ((1 << c) - 1) << (first & _LOW)
            free = bits & ~_once(refs.get(g, 0))
            _count_in(refs, g, bits)
            if free:
                self._nfree -= free.bit_count()
                _count_in(stale, g, free)
        return keys

    def register(self, keys: list, seq: Runs, start: int, end: int) -> None:
        """Name the blocks ``keys[start:end]`` with the names ``seq.names[start:end]`` (as
        :meth:`BlockPool.register`: a name already cached is cached again, a copy under an alias)."""
        of = self.copies.of
        if of and not of.keys().isdisjoint(seq.names[start:end]):  # rare: names with copies
            self._register_copies(keys, seq.names, range(start, end))
            return
        cached, refs = self._cached, self._refs
        dups = []  # names already cached (another block holds them; a request's names are distinct)
        for first, c in seq.span(start, end):
            g = first >> _SHIFT
            bits = ((1 << c) - 1) << (first & _LOW)
            m = cached.get(g, 0)
            new = bits & ~m
            if new != bits:  # rare: some names of the run are already cached
                base = g << _SHIFT
                dups += [base + o for o in _bits(bits & m)]
            if not new:
                continue
            cached[g] = m | new
            _count_in(refs, g, new)
            self.stored_runs.append((g, new))
        names = seq.names
        keys[start:end] = names[start:end]
        if not dups:
            self.stored.extend(names[start:end])
            return
        dup, stored = set(dups), self.stored
        for i in range(start, end):  # in order, as BlockPool stores them
            if names[i] in dup:
                self._register_copies(keys, names, (i,))
            else:
                stored.append(names[i])

    def _register_copies(self, keys: list, names: Sequence[int], where) -> None:
        """Register ``names[i]`` into ``keys[i]`` for each position ``i`` of ``where``, name by name: a name
        with a cached copy as one more copy (:meth:`Copies.add <dynlab.kv.copies.Copies.add>`)."""
        copies, contains, cached, refs = self.copies, self.__contains__, self._cached, self._refs
        for i in where:
            name = names[i]
            key = copies.key_for(name, contains)
            if key != name:
                self._mixed[id(keys)] = keys
            keys[i] = key
            g, bit = key >> _SHIFT, 1 << (key & _LOW)
            cached[g] = cached.get(g, 0) | bit
            _count_in(refs, g, bit)
            self.stored.append(name)
            self.stored_runs.append((name >> _SHIFT, 1 << (name & _LOW)))

    def release(self, keys: Sequence[int], seq: Runs, out_at: int = 0, out: int = 0) -> None:
        """A holder frees its blocks (``keys`` in sequence order, named by ``seq``'s names): to the
        free-queue tail in reverse order, except names still held by another request (``out_at``,
        ``out``: as :meth:`BlockPool.release`)."""
        n = self._release_out(keys, out_at, out) if out else len(keys)
        if self._mixed.pop(id(keys), None) is not None:
            self._release_mixed(keys, seq.names, n)
            return
        p, hi = 0, n  # the named prefix: a binary search by identity (no name's int object read)
        while p < hi:
            mid = (p + hi) // 2
            if keys[mid] is UNNAMED:
                hi = mid
            else:
                p = mid + 1
        if p < n:
            self._push_unnamed(n - p)
        if not p:
            return
        refs, entries, names, i = self._refs, [], seq.names, p
        for first, c in reversed(seq.span(0, p)):
            i -= c
            g, off = first >> _SHIFT, first & _LOW
            free = _count_out(refs, g, ((1 << c) - 1) << off)
            if free:
                entries.append((g, free, names, i - off))
                self._nfree += free.bit_count()
        if entries:
            self._queue.append(entries)

    def _release_mixed(self, keys: Sequence[int], names: Sequence[int], n: int) -> None:
        """:meth:`release` of ``keys[:n]`` holding aliases (a copy's key, :mod:`dynlab.kv.copies`) or unnamed
        blocks between named ones, name by name: each run of named keys between unnamed ones is a segment of
        one-name entries."""
        refs, run, keys = self._refs, [], list(keys)  # an entry names its keys (aliases too): a copy of them
        for i in range(n - 1, -1, -1):
            key = keys[i]
            if key < 0:
                if run:
                    self._queue.append(run)
                    run = []
                self._push_unnamed(1)
                continue
            g, o = key >> _SHIFT, key & _LOW
            if _count_out(refs, g, 1 << o):
                run.append((g, 1 << o, keys, i - o))
                self._nfree += 1
        if run:
            self._queue.append(run)

    def _take(self, want: int, spans: Optional[list] = None) -> None:
        """Take ``want`` live entries from the head of ``_queue``, evicting the named ones (``spans``:
        as :meth:`BlockPool._take`)."""
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
            i, end = self._head, len(seg)
            while i < end:  # the segment's entries, head first
                g, mask, names, base = seg[i]
                if g in stale:
                    gone = mask & _once(stale[g])
                    if gone:
                        mask ^= gone
                        _count_out(stale, g, gone)
                n = mask.bit_count()
                if n > want == 1:  # most calls (a decode's block boundary): the entry's highest name goes
                    o = mask.bit_length() - 1
                    seg[i] = (g, mask ^ (1 << o), names, base)
                    self._head = i
                    self._cached[g] ^= 1 << o  # its other names stay cached
                    self.removed.append(names[base + o])
                    self.removed_runs.append((g, 1 << o))
                    if spans is not None:
                        spans.append((1, 1))
                    return
                if n > want:  # the allocation stops inside this entry: its highest names go
                    take = _top(mask, want)
                    seg[i] = (g, mask ^ take, names, base)
                    self._head = i
                    self._evict(g, take, names, base)
                    if spans is not None:
                        spans.append((want, want))
                    return
                i += 1
                if n:
                    self._evict(g, mask, names, base)
                    if spans is not None:
                        spans.append((want, n))
                    want -= n
                    if not want:
                        break
            if i == end:
                queue.popleft()
                self._head = 0
            else:
                self._head = i

    def _evict(self, g: int, bits: int, names: Sequence[int], base: int) -> None:
        """Drop the (free, cached) names ``bits`` of group ``g`` from the cache; append them to
        :attr:`removed`, highest first (queue order), as the int objects of ``names`` (offset ``o``
        is ``names[base + o]``: the objects the KV events carried when they were stored)."""
        m = self._cached[g] ^ bits
        if m:
            self._cached[g] = m
        else:
            del self._cached[g]
        self.removed_runs.append((g, bits))
        lo = (bits & -bits).bit_length() - 1
        hi = bits.bit_length()
        if hi - lo == 1:  # one name (a decode's block boundary)
            self.removed.append(names[base + lo])
        elif bits >> lo == (1 << (hi - lo)) - 1:  # contiguous: one slice
            self.removed.extend(reversed(names[base + lo:base + hi]))
        else:
            self.removed.extend([names[base + o] for o in reversed(_bits(bits))])
