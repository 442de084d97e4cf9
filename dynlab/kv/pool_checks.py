"""The block pools' test-side views: the free queue's keys and the invariants (O(queue), tests and docs only).

:class:`PoolChecks` is a base of :class:`~dynlab.kv.block_pool.BlockPool` (and through it of
:class:`~dynlab.kv.run_pool.RunBlockPool`, which overrides the entry-shaped parts); nothing here runs in a
simulation. The representation it reads is described in :mod:`dynlab.kv.block_pool`.
"""
from __future__ import annotations

from dynlab.groups import GROUP_SHIFT as _SHIFT
from dynlab.groups import set_bits as _bits
from dynlab.kv.levels import _count, _once

__all__ = ["PoolChecks", "RunPoolChecks", "check_manager"]

UNNAMED = -1  # dynlab.kv.block_pool.UNNAMED (not imported: that module imports this one)


class PoolChecks:
    """Reading a pool's free queue head to tail, and asserting its invariants (tests)."""

    __slots__ = ()
    def free_keys(self) -> list:
        """The free queue's keys, head first (live entries only; O(queue), for tests); the
        unnamed blocks at its head (never used or released unnamed) are ``None``, the other unnamed
        ones :data:`UNNAMED`."""
        return [None] * self._fresh + self._live_keys()

    def _live_keys(self) -> list:
        """The keys of the queue after the never-used blocks, head first, stale entries skipped."""
        return self._queue_keys({name: 1 + self._stale_more.get(name, 0) for name in self._stale})

    def _queue_keys(self, stale: dict) -> list:
        """The keys of the queue after the never-used blocks, head first: :data:`UNNAMED` for unnamed
        blocks, the names of each named entry (:meth:`_entry_names`) but those counted in ``stale`` (name
        -> stale entries left; each one met is consumed). Tests only, O(queue)."""
        out: list = []
        for i, seg in enumerate(self._queue):
            if seg.__class__ is int:
                out += [UNNAMED] * seg
                continue
            for entry in seg[self._head:] if i == 0 else seg:
                for name in self._entry_names(entry):
                    c = stale.get(name)
                    if c:
                        stale[name] = c - 1
                    else:
                        out.append(name)
        return out

    def _named_entries(self):
        """The entries of the queue's named segments after the never-used blocks, head first (tests)."""
        for i, seg in enumerate(self._queue):
            if seg.__class__ is list:
                yield from (seg[self._head:] if i == 0 else seg)

    @staticmethod
    def _entry_names(entry) -> tuple:
        """The names of one named queue entry, in queue order (here an entry is a name)."""
        return (entry,)

    def _check_queue(self) -> None:
        """Assert the free queue's shape: no empty segment, a head offset inside a named first segment."""
        queue, head = self._queue, self._head
        assert self._fresh >= 0
        assert all(seg > 0 if seg.__class__ is int else len(seg) > 0 for seg in queue), "an empty segment"
        assert head == 0 or (queue and queue[0].__class__ is list and head < len(queue[0])), "bad head offset"

    def check(self) -> None:
        """Assert the pool's invariants (tests; O(blocks ever used))."""
        self._check_queue()
        queue = self._queue
        assert all(len(set(seg)) == len(seg) for seg in queue if seg.__class__ is list), "a name twice in a segment"
        free = self._live_keys()
        named = [k for k in free if k >= 0]
        assert len(free) == self._nfree, "live queue entries != num_free"
        assert len(set(named)) == len(named), "a block is twice in the free queue"
        assert set(named) == self._cached - self._used, "free cached blocks != named blocks in the free queue"
        assert self._used <= self._cached and self._shared.keys() <= self._used, "a reference to an uncached block"
        assert all(c >= 2 for c in self._shared.values()), "a shared count below 2"
        assert self._stale <= self._cached and self._stale_more.keys() <= self._stale, "a stale name not cached"
        assert all(c >= 1 for c in self._stale_more.values()), "a stale count is not positive"
        entries: dict = {}
        for name in self._named_entries():
            entries[name] = entries.get(name, 0) + 1
        for name, c in entries.items():  # stale entries + the live one, if free
            stale = (1 + self._stale_more.get(name, 0)) if name in self._stale else 0
            assert c == stale + (name not in self._used), f"entries of {name} in the queue"
        assert self._stale <= entries.keys(), "a stale name with no entry"
        assert self.used_blocks + self._fresh + len(free) == self.capacity
        self.copies.check(self._cached.__contains__)


class RunPoolChecks(PoolChecks):
    """:class:`PoolChecks` for :class:`~dynlab.kv.run_pool.RunBlockPool` (entries ``(group, mask, names,
    base)``, counts as levels of masks)."""

    __slots__ = ()

    def _live_keys(self) -> list:
        stale = {}
        for g, lv in self._stale.items():
            for o in _bits(_once(lv)):
                stale[(g << _SHIFT) + o] = _count(self._stale, (g << _SHIFT) + o)
        return self._queue_keys(stale)

    @staticmethod
    def _entry_names(entry) -> list:
        """The names of a queue entry ``(group, mask, names, base)``, highest first (queue order)."""
        g, mask, _, _ = entry
        return [(g << _SHIFT) + o for o in reversed(_bits(mask))]

    def check(self) -> None:
        """Assert the pool's invariants (tests; O(blocks ever used))."""
        self._check_queue()
        for counts in (self._refs, self._stale):
            for lv in counts.values():
                if lv.__class__ is int:
                    assert lv, "an empty count"
                    continue
                assert len(lv) >= 2 and lv[-1], "a list of levels with fewer than two, or an empty last one"
                assert all(lv[k] & ~lv[k - 1] == 0 for k in range(1, len(lv))), "levels not nested"
        assert all(m for m in self._cached.values()), "an empty cached mask"
        used = {(g << _SHIFT) + o for g, lv in self._refs.items() for o in _bits(_once(lv))}
        stale = {(g << _SHIFT) + o for g, lv in self._stale.items() for o in _bits(_once(lv))}
        cached = self._keys()
        free = self._live_keys()
        named = [k for k in free if k >= 0]
        assert len(free) == self._nfree, "live queue entries != num_free"
        assert len(set(named)) == len(named), "a block is twice in the free queue"
        assert set(named) == cached - used, "free cached blocks != named blocks in the free queue"
        assert used <= cached and stale <= cached, "a reference or a stale entry of an uncached block"
        entries: dict = {}
        for entry in self._named_entries():
            g, mask, names, base = entry
            assert mask, "an empty entry"
            assert all(names[base + o] == (g << _SHIFT) + o for o in _bits(mask)), "an entry's names"
            for name in self._entry_names(entry):
                entries[name] = entries.get(name, 0) + 1
        for name, c in entries.items():  # stale entries + the live one, if free
            assert c == _count(self._stale, name) + (name not in used), name
        assert stale <= entries.keys(), "a stale name with no entry"
        assert self.used_blocks + self._fresh + len(free) == self.capacity
        self.copies.check(self.__contains__)


def check_manager(kv, holders: list) -> None:
    """Assert (tests) ``kv`` (a :class:`~dynlab.kv.cache_manager.KvCacheManager`)'s pool is consistent and its
    used blocks are those of ``holders`` (key lists) plus the held and reserved ones; the CPU tier within its
    capacity."""
    pool = kv.pool
    pool.check()
    if kv.cpu is not None:
        assert len(kv.cpu) <= kv.cpu.capacity
    holders = holders + [keys for keys, _ in kv.reserved.values()] + list(kv.held.values())
    held: dict = {}
    unnamed = 0
    for keys in holders:
        for key in keys:
            if key < 0:
                unnamed += 1
            else:
                held[key] = held.get(key, 0) + 1
    assert len(held) + unnamed == pool.used_blocks, (len(held), unnamed, pool.used_blocks)
    for key, c in held.items():
        assert pool.references(key) == c
