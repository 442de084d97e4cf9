"""BlockPool (segments, sets) and RunBlockPool (group masks) against ReferencePool (the pre-perf4
representation, their oracle).

Both pools get the same random operation sequences, the way the engine drives a pool: admissions
(lookup, evictable_hits, take_hits, allocate, register, some of them over requests sharing a
prefix with running ones: shared hits), chunked registration (so two running requests can compute
the same block: a duplicate registration caches a second copy under the name), growth by a few
blocks (a decode's boundary), several such growths in one call (a bulk run's boundaries crossed in one
go: :meth:`~dynlab.kv.block_pool.BlockPool.allocate_each`), releases in any order, bare allocations that run the pool dry.
After every operation every observable must agree: return values, ``stored`` and ``removed`` in
order, ``num_free``, ``used_blocks``, ``cached()``, the free queue head to tail, each name's copies'
reference counts. Keys may differ only where the block is unnamed (fresh negative ints there, ``UNNAMED``
here) or a second copy (compared by name). The oracle (with copies: ``CopyingReferencePool``) takes
names; the pool under test takes its ``sequence`` of the same names and their runs (consecutive
names within a group of 1024, cut every 1-3 names in some requests: runs need not be maximal).
"""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dynlab.kv.block_pool import UNNAMED, BlockPool
from dynlab.kv.run_pool import RunBlockPool
from pool_runs import runs_of
from reference_pool import COPY_KEYS, CopyingReferencePool


def same_keys(old, new, machine):
    """The reference's keys as this pool's, each block by its name: an unnamed block's key is UNNAMED, a
    copy's key (the reference's :data:`COPY_KEYS` up, the pool's aliases) its name."""
    ref, alias = machine.old._name, machine.new.copies.name
    return [ref.get(k, k) if k >= 0 else UNNAMED for k in old] == [alias.get(k, k) for k in new]


def copy_refs(pool, name):
    """The reference counts of ``name``'s cached copies in the pool under test, oldest first."""
    contains = pool.__contains__ if isinstance(pool, RunBlockPool) else pool._cached.__contains__
    keys = pool.copies.of.get(name, [name])
    return [pool.references(k) for k in keys if contains(k)]


class Holder:
    """A request: its names (distinct), its keys in both pools, how many names are registered, its
    sequence for the pool under test."""

    def __init__(self, names, old, new, nreg, seq):
        self.names, self.old, self.new, self.nreg, self.seq = names, old, new, nreg, seq


class BothPools(RuleBasedStateMachine):
    make = BlockPool  # the pool under test

    def __init__(self):
        super().__init__()
        self.cap = 16
        self.old, self.new = CopyingReferencePool(self.cap), self.make(self.cap)
        self.holders: list = []
        self.released: list = []  # names of released requests (their blocks may still be cached)

    def both(self, method, *args):
        a, b = getattr(self.old, method)(*args), getattr(self.new, method)(*args)
        return a, b

    def seq(self, names, split=0):
        return self.new.sequence(names, runs_of(names, split))

    @rule(family=st.integers(0, 3), length=st.integers(0, 8), branch=st.integers(0, 3),
          extra=st.integers(0, 3), reg=st.integers(0, 8), cap=st.integers(0, 9), split=st.integers(0, 3))
    def admit(self, family, length, branch, extra, reg, cap, split):
        # prefix-chained names: families (no shared block) whose requests branch after 2 or 4 blocks;
        # family 1's names cross the group boundary 1024 (two runs)
        names = [family * 1020 + (i if i < 2 + 2 * (branch % 2) else 100 * branch + i) for i in range(length)]
        self.admit_names(names, cap, extra, reg, split)

    def admit_names(self, names, cap, extra, reg, split=0):
        length = len(names)
        seq = self.seq(names, split)
        h, h2 = self.old.lookup(names, cap), self.new.lookup(seq, cap)
        assert h == h2
        hit = names[:h]
        ev, ev2 = self.old.evictable_hits(hit), self.new.evictable_hits(seq, h)
        assert ev == ev2
        need = length - h + extra
        if need + ev > self.old.num_free:
            return
        old, new = self.old.take_hits(hit), self.new.take_hits(seq, h)
        assert same_keys(old, new, self)
        a, b = self.both("allocate", need)
        assert same_keys(a, b, self)
        old += a
        new += b
        holder = Holder(names, old, new, h, seq)
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
    @rule(data=st.data(), extra=st.integers(0, 2))
    def hit_middle(self, data, extra):
        # free blocks taken from the middle of a released request's run: the free queue's entry of
        # that run is left with a hole (taken by an allocation that stops inside it: its highest names)
        names = data.draw(st.sampled_from(self.released))
        i = data.draw(st.integers(0, len(names)))
        j = data.draw(st.integers(i, len(names)))
        self.admit_names(names[i:j], j - i, extra, 0)

    @precondition(lambda self: self.released)
    @rule(data=st.data(), times=st.integers(1, 4))
    def hit_and_release(self, data, times):
        # hits on free blocks, released at once, again and again: several stale entries per name
        names = data.draw(st.sampled_from(self.released))
        seq = self.seq(names)
        for _ in range(times):
            h = self.new.lookup(seq, len(names))
            if self.new.evictable_hits(seq, h) > self.new.num_free:
                return
            old, new = self.old.take_hits(names[:h]), self.new.take_hits(seq, h)
            self.old.release(old)
            self.new.release(new, seq)

    def register(self, holder, m):
        m = min(m, len(holder.names) - holder.nreg)
        if m > 0:
            part = holder.names[holder.nreg:holder.nreg + m]
            self.old.register(holder.old, holder.nreg, part)
            self.new.register(holder.new, holder.seq, holder.nreg, holder.nreg + m)
            holder.nreg += m
        assert same_keys(holder.old, holder.new, self)

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
            assert same_keys(a, b, self)
            holder.old += a
            holder.new += b

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), counts=st.lists(st.integers(0, 3), max_size=6))
    def grow_each(self, data, counts):
        # a bulk run's block boundaries crossed in one go: allocate_each against one allocate each
        # (the reference), the same evictions in the same order; it says how many allocations evicted
        while sum(counts) > self.old.num_free:
            counts.pop()
        evicting = 0
        for c in counts:
            before = len(self.old.removed)
            holder = data.draw(st.sampled_from(self.holders))
            holder.old += self.old.allocate(c)
            holder.new += [UNNAMED] * c
            evicting += len(self.old.removed) > before
        assert self.new.allocate_each(counts) == evicting

    @rule(all_free=st.booleans(), n=st.integers(1, 6))
    def allocate_bare(self, all_free, n):
        # a holder without names (output blocks only); all_free: the pool runs dry
        n = self.old.num_free if all_free else min(n, self.old.num_free)
        a, b = self.both("allocate", n)
        assert same_keys(a, b, self)
        if n:
            self.holders.append(Holder([], a, b, 0, self.seq([])))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data):
        holder = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1)))
        self.old.release(holder.old)
        self.new.release(holder.new, holder.seq)
        self.released.append(holder.names)

    @rule(names=st.lists(st.integers(0, 3500), max_size=6), cap=st.integers(-1, 7))
    def lookup(self, names, cap):
        assert self.old.lookup(names, cap) == self.new.lookup(self.seq(names), cap)

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
        new.copies.translate(new.removed, getattr(new, "removed_runs", None))
        assert new.stored == old.stored and new.removed == old.removed
        del old.stored[:], old.removed[:], new.stored[:], new.removed[:]
        assert new.num_free == old.num_free and new.used_blocks == old.used_blocks
        assert new.cached() == old.cached()
        alias = new.copies.name
        assert [k if k is None or k >= 0 else UNNAMED for k in old.free_keys()] == \
            [k if k is None or k < 0 else alias.get(k, k) for k in new.free_keys()]
        for name in new.cached():
            assert copy_refs(new, name) == old.refs(name)


BothPools.TestCase.settings = settings(max_examples=300, stateful_step_count=60)
TestBothPools = BothPools.TestCase


class RunPoolAndReference(BothPools):
    make = RunBlockPool

    @invariant()
    def same_observables(self):
        # the (group, mask) pairs name exactly stored and removed (as multisets: what KV events carry)
        new = self.new
        new.copies.translate(new.removed, new.removed_runs)
        for names, pairs in ((new.stored, new.stored_runs), (new.removed, new.removed_runs)):
            assert sorted(names) == sorted((g << 10) + o for g, m in pairs for o in range(1024) if m >> o & 1)
            del pairs[:]
        super().same_observables()


RunPoolAndReference.TestCase.settings = settings(max_examples=300, stateful_step_count=60)
TestRunPoolAndReference = RunPoolAndReference.TestCase


@pytest.mark.parametrize("make", [BlockPool, RunBlockPool])
@pytest.mark.parametrize("counts, evicting", [
    ([1, 1, 1, 1], 2),  # the two unnamed blocks evict nothing, then named 11, named 10
    ([2, 2], 1),  # both names in the second allocation
    ([1, 0, 2, 1], 2),  # an empty allocation evicts nothing, even inside an eviction
    ([3, 1], 2),  # the two unnamed blocks and the first name, then the last name: both evict
])
def test_allocate_each_counts_the_allocations_that_evict(make, counts, evicting):
    # a free queue of two unnamed blocks (released to the head, vLLM 0.33.0) then two named ones
    # (released as 11, 10), no never-used block left
    pool = make(4)
    seq = pool.sequence([10, 11], [(10, 2)])
    keys = pool.allocate(2)
    pool.register(keys, seq, 0, 2)
    bare = pool.allocate(2)
    pool.release(keys, seq)
    pool.release(bare, pool.sequence([], []))
    pool.clear_events(stored=False)
    assert pool.allocate_each(counts) == evicting
    assert pool.removed == [11, 10][:max(0, sum(counts) - 2)]
    assert pool.num_free == 4 - sum(counts)
