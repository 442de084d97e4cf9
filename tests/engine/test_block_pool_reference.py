"""BlockPool (segments, sets) against ReferencePool (the pre-perf4 representation, its oracle).

Both pools get the same random operation sequences, the way the engine drives a pool: admissions
(lookup, evictable_hits, take_hits, allocate, register, some of them over requests sharing a
prefix with running ones: shared hits), chunked registration (so two running requests can compute
the same block: duplicate registrations leave unnamed blocks between named ones), growth by a few
blocks (a decode's boundary), releases in any order, bare allocations that run the pool dry.
After every operation every observable must agree: return values, ``stored`` and ``removed`` in
order, ``num_free``, ``used_blocks``, ``cached()``, the free queue head to tail. Keys may differ
only where the block is unnamed (fresh negative ints there, ``UNNAMED`` here).
"""
from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dynlab.kv.block_pool import UNNAMED, BlockPool
from reference_pool import ReferencePool


def same_keys(old, new):
    """The reference's keys as this pool's: an unnamed block's key is UNNAMED."""
    return [k if k >= 0 else UNNAMED for k in old] == new


class Holder:
    """A request: its names (distinct), its keys in both pools, how many names are registered."""

    def __init__(self, names, old, new, nreg):
        self.names, self.old, self.new, self.nreg = names, old, new, nreg


class BothPools(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.cap = 16
        self.old, self.new = ReferencePool(self.cap), BlockPool(self.cap)
        self.holders: list = []
        self.released: list = []  # names of released requests (their blocks may still be cached)

    def both(self, method, *args):
        a, b = getattr(self.old, method)(*args), getattr(self.new, method)(*args)
        return a, b

    @rule(family=st.integers(0, 3), length=st.integers(0, 8), branch=st.integers(0, 3),
          extra=st.integers(0, 3), reg=st.integers(0, 8), cap=st.integers(0, 9))
    def admit(self, family, length, branch, extra, reg, cap):
        # prefix-chained names: families (no shared block) whose requests branch after 2 or 4 blocks
        names = [family * 1000 + (i if i < 2 + 2 * (branch % 2) else 100 * branch + i) for i in range(length)]
        self.admit_names(names, cap, extra, reg)

    def admit_names(self, names, cap, extra, reg):
        length = len(names)
        h, h2 = self.both("lookup", names, cap)
        assert h == h2
        hit = names[:h]
        ev, ev2 = self.both("evictable_hits", hit)
        assert ev == ev2
        need = length - h + extra
        if need + ev > self.old.num_free:
            return
        self.both("take_hits", hit)
        old, new = list(hit), list(hit)
        a, b = self.both("allocate", need)
        assert same_keys(a, b)
        old += a
        new += b
        holder = Holder(names, old, new, h)
        self.holders.append(holder)
        self.register(holder, reg)

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), extra=st.integers(0, 2), reg=st.integers(0, 8), times=st.integers(1, 3))
    def share(self, data, extra, reg, times):
        # requests with a running request's names: shared hits (a block held by up to 4 requests)
        names = data.draw(st.sampled_from(self.holders)).names
        for _ in range(times):
            self.admit_names(names, len(names), extra, reg)

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), extra=st.integers(0, 2), reg=st.integers(0, 8))
    def share_middle(self, data, extra, reg):
        # names that are not prefix-chained (the pool does not rely on it): another request's middle
        holder = data.draw(st.sampled_from([h for h in self.holders if h.nreg > 1] or self.holders))
        i = data.draw(st.integers(1, max(1, holder.nreg - 1)))
        self.admit_names(holder.names[i:], len(holder.names), extra, reg)

    @precondition(lambda self: self.released)
    @rule(data=st.data(), times=st.integers(1, 4))
    def hit_and_release(self, data, times):
        # hits on free blocks, released at once, again and again: several stale entries per name
        names = data.draw(st.sampled_from(self.released))
        for _ in range(times):
            h = self.new.lookup(names, len(names))
            if self.new.evictable_hits(names[:h]) > self.new.num_free:
                return
            self.both("take_hits", names[:h])
            self.both("release", names[:h])

    def register(self, holder, m):
        m = min(m, len(holder.names) - holder.nreg)
        if m > 0:
            part = holder.names[holder.nreg:holder.nreg + m]
            self.old.register(holder.old, holder.nreg, part)
            self.new.register(holder.new, holder.nreg, part)
            holder.nreg += m
        assert same_keys(holder.old, holder.new)

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), m=st.integers(1, 8))
    def register_more(self, data, m):
        self.register(data.draw(st.sampled_from(self.holders)), m)

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), n=st.integers(0, 4))
    def grow(self, data, n):
        holder = data.draw(st.sampled_from(self.holders))
        if n <= self.old.num_free:
            a, b = self.both("allocate", n)
            assert same_keys(a, b)
            holder.old += a
            holder.new += b

    @rule(all_free=st.booleans(), n=st.integers(1, 6))
    def allocate_bare(self, all_free, n):
        # a holder without names (output blocks only); all_free: the pool runs dry
        n = self.old.num_free if all_free else min(n, self.old.num_free)
        a, b = self.both("allocate", n)
        assert same_keys(a, b)
        if n:
            self.holders.append(Holder([], a, b, 0))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data):
        holder = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1)))
        self.old.release(holder.old)
        self.new.release(holder.new)
        self.released.append(holder.names)

    @rule(names=st.lists(st.integers(0, 3500), max_size=6), cap=st.integers(-1, 7))
    def lookup(self, names, cap):
        a, b = self.both("lookup", names, cap)
        assert a == b

    @rule()
    def too_many(self):
        for pool in (self.old, self.new):
            try:
                pool.allocate(pool.num_free + 1)
            except ValueError:
                pass
            else:
                raise AssertionError("allocated more blocks than free")

    @invariant()
    def same_observables(self):
        old, new = self.old, self.new
        new.check()
        old.check()
        assert new.stored == old.stored and new.removed == old.removed
        del old.stored[:], old.removed[:], new.stored[:], new.removed[:]
        assert new.num_free == old.num_free and new.used_blocks == old.used_blocks
        assert new.cached() == old.cached()
        assert [k if k is None or k >= 0 else UNNAMED for k in old.free_keys()] == new.free_keys()
        for name in new.cached():
            assert new.references(name) == old._ref[name]


BothPools.TestCase.settings = settings(max_examples=300, stateful_step_count=60)
TestBothPools = BothPools.TestCase
