"""BlockPool against a per-block reference model (vLLM v1's BlockPool, written the slow, obvious way)."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dynlab.kv.block_pool import BlockPool
from dynlab.kv.run_pool import RunBlockPool
from pool_runs import runs_of

#: both pools must behave the same: the per-name one and the one keyed by runs
POOLS = [BlockPool, RunBlockPool]


class ModelPool:
    """Physical blocks 0..capacity-1, a free list (head first), ref counts, and a name -> blocks map: every
    cached copy of a name in caching order (vLLM 0.33.0's ``cached_block_hash_to_block``; a hit takes the
    first, an eviction drops its block from the name's list)."""

    def __init__(self, capacity):
        self.name = [None] * capacity
        self.ref = [0] * capacity
        self.free = list(range(capacity))
        self.where = {}
        self.stored, self.removed = [], []

    def lookup(self, names, max_blocks):
        h = 0
        for name in names[:max_blocks]:
            if name not in self.where:
                break
            h += 1
        return h

    def admit(self, names, h, extra):
        """Hit names[:h], allocate the rest + extra, register names[h:]; None if it does not fit."""
        hits = [self.where[n][0] for n in names[:h]]
        need = len(names) - h + extra
        if need + sum(1 for b in hits if self.ref[b] == 0) > len(self.free):
            return None
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        new = []
        for _ in range(need):
            b = self.free.pop(0)
            if self.name[b] is not None:
                copies = self.where[self.name[b]]
                copies.remove(b)
                if not copies:
                    del self.where[self.name[b]]
                self.removed.append(self.name[b])
                self.name[b] = None
            self.ref[b] = 1
            new.append(b)
        for b, n in zip(new, names[h:]):  # a name already cached: one more copy (vLLM 0.33.0)
            self.where.setdefault(n, []).append(b)
            self.name[b] = n
            self.stored.append(n)
        return hits + new

    def release(self, blocks):
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.name[b] is None:  # unnamed: to the head (vLLM 0.33.0, PR #42656)
                    self.free.insert(0, b)
                else:
                    self.free.append(b)

    def free_names(self):
        return [self.name[b] for b in self.free]


def pool_admit(pool, names, extra, cap=None):
    seq = pool.sequence(names, runs_of(names))
    h = pool.lookup(seq, len(names) if cap is None else cap)
    need = len(names) - h + extra
    if need + pool.evictable_hits(seq, h) > pool.num_free:
        return h, None
    keys = pool.take_hits(seq, h)
    keys += pool.allocate(need)  # in place: the list take_hits returned is the holder's (RunBlockPool tracks it)
    pool.register(keys, seq, h, len(names))
    return h, (keys, seq)


class PoolMachine(RuleBasedStateMachine):
    make = BlockPool

    def __init__(self):
        super().__init__()
        self.cap = 12
        self.pool = self.make(self.cap)
        self.model = ModelPool(self.cap)
        self.holders = []  # (pool keys, model blocks)
        self.from_events = Counter()  # name -> copies, as a subscriber counting BlockStored/BlockRemoved sees them

    def apply_events(self):
        # an admission evicts (allocate) before it registers: removed first, then stored
        self.from_events.subtract(self.pool.removed)
        self.from_events.update(self.pool.stored)
        del self.pool.removed[:], self.pool.stored[:], self.model.removed[:], self.model.stored[:]

    @rule(prefix=st.integers(0, 3), length=st.integers(0, 6), branch=st.integers(0, 2), extra=st.integers(0, 2))
    def admit(self, prefix, length, branch, extra):
        # chained names: a tree of prefixes (prefix family, branch point)
        names = [prefix * 100 + (i if i < 2 else 10 * branch + i) for i in range(length)]
        h, keys = pool_admit(self.pool, names, extra)
        assert h == self.model.lookup(names, len(names))
        blocks = self.model.admit(names, h, extra)
        assert (keys is None) == (blocks is None)
        if keys is not None:
            self.holders.append((keys, blocks))
        self.pool.copies.translate(self.pool.removed, getattr(self.pool, "removed_runs", None))
        assert self.pool.stored == self.model.stored and self.pool.removed == self.model.removed
        self.apply_events()

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), cap=st.integers(0, 5), extra=st.integers(0, 2))
    def admit_again(self, data, cap, extra):
        # a running request's names again, its lookup capped at ``cap`` blocks (the last prompt token is
        # recomputed; two requests admitted in one step): the blocks after the cap are computed again,
        # second copies of cached names
        keys, _ = data.draw(st.sampled_from(self.holders))[0]
        names = [self.pool.copies.name.get(k, k) for k in keys if k >= 0]
        h, got = pool_admit(self.pool, names, extra, cap)
        assert h == self.model.lookup(names, cap)
        blocks = self.model.admit(names, h, extra)
        assert (got is None) == (blocks is None)
        if got is not None:
            self.holders.append((got, blocks))
        self.pool.copies.translate(self.pool.removed, getattr(self.pool, "removed_runs", None))
        assert self.pool.stored == self.model.stored and self.pool.removed == self.model.removed
        self.apply_events()

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data):
        i = data.draw(st.integers(0, len(self.holders) - 1))
        (keys, seq), blocks = self.holders.pop(i)
        self.pool.release(keys, seq)
        self.model.release(blocks)

    @invariant()
    def same_state(self):
        pool, model = self.pool, self.model
        pool.check()
        assert pool.num_free == len(model.free)
        assert pool.used_blocks + pool.num_free == self.cap
        assert pool.cached() == set(model.where)
        # the never-used blocks are a count at the queue's head (None: no key yet), then the queue's entries
        alias = pool.copies.name
        assert [alias.get(k, k) if k is not None and k >= 0 else None for k in pool.free_keys()] == model.free_names()
        # the cache as a subscriber counting its events' copies sees it: a name is findable (a lookup hits it)
        # exactly while some copy is cached, and the events count the copies
        assert {n for n, c in self.from_events.items() if c > 0} == pool.cached()
        assert all(c >= 0 for c in self.from_events.values())
        assert +self.from_events == Counter({n: len(b) for n, b in model.where.items()})
        for name in pool.cached():
            assert pool.lookup(pool.sequence([name], [(name, 1)]), 1) == 1


TestPoolMachine = PoolMachine.TestCase


class RunPoolMachine(PoolMachine):
    make = RunBlockPool


TestRunPoolMachine = RunPoolMachine.TestCase


def seq(pool, names):
    return pool.sequence(names, runs_of(names))


@pytest.mark.parametrize("Pool", POOLS)
def test_free_queue_order_and_eviction(Pool):
    pool = Pool(4)
    a = pool.allocate(3)
    s = seq(pool, [10, 11, 12])
    pool.register(a, s, 0, 3)
    assert pool.stored == [10, 11, 12] and pool.used_blocks == 3
    pool.release(a, s)  # tail gets 12, 11, 10 after the never-used block
    assert pool.num_free == 4 and pool.cached() == {10, 11, 12}
    b = pool.allocate(2)  # the never-used block, then 12 (tail of the sequence first)
    assert pool.removed == [12] and pool.cached() == {10, 11}
    assert pool.lookup(s, 3) == 2
    assert pool.lookup(s, 1) == 1
    assert pool.evictable_hits(s, 2) == 2
    pool.take_hits(s, 2)
    assert pool.num_free == 0 and pool.used_blocks == 4
    with pytest.raises(ValueError):
        pool.allocate(1)
    pool.release(b, seq(pool, []))
    pool.release([10, 11], s)
    assert pool.num_free == 4


@pytest.mark.parametrize("Pool", POOLS)
def test_shared_block_stays_in_use_until_last_release(Pool):
    pool = Pool(3)
    a = pool.allocate(2)
    s = seq(pool, [1, 2])
    pool.register(a, s, 0, 2)
    pool.take_hits(s, 1)  # a second request shares block 1
    pool.release(a, s)  # block 2 is free, block 1 still held
    assert pool.num_free == 2 and pool.evictable_hits(s, 2) == 1
    pool.allocate(2)  # the never-used block and 2; never 1
    assert pool.removed == [2] and 1 in pool
    pool.release([1], s)
    assert pool.evictable_hits(s, 1) == 1


@pytest.mark.parametrize("Pool", POOLS)
def test_a_duplicate_is_a_second_copy_under_the_name(Pool):
    # vLLM 0.33.0's BlockPool (cached_block_hash_to_block), by hand. Capacity 4: a computes 5; b computes 5
    # again (a second copy, cached: its key is an alias, a BlockStored of 5 again) and 6.
    pool = Pool(4)
    s5, s56 = seq(pool, [5]), seq(pool, [5, 6])
    a = pool.allocate(1)
    pool.register(a, s5, 0, 1)
    b = pool.allocate(2)
    pool.register(b, s56, 0, 2)
    alias = b[0]
    assert a == [5] and alias not in (5, 6) and alias >= 0 and b[1] == 6 and pool.stored == [5, 5, 6]
    assert pool.cached() == {5, 6} and pool.used_blocks == 3
    # a hit takes the oldest copy (a's block, in use: shared), not the free-or-not younger one
    hit = pool.take_hits(s5, 1)
    assert hit == [5] and pool.references(5) == 2 and pool.references(alias) == 1
    pool.release(a, s5)
    pool.release(hit, s5)
    pool.release(b, s56)  # the queue: 1 never used, then 5 (a's copy), 6, the alias (b's copy of 5)
    assert pool.num_free == 4 and pool.used_blocks == 0
    pool.clear_events(stored=False)
    pool.allocate(2)  # the never-used block and a's copy: one BlockRemoved of 5
    pool.copies.translate(pool.removed, getattr(pool, "removed_runs", None))
    assert pool.removed == [5]
    # the name stays findable while b's copy is cached: a lookup hits it, a hit takes that copy
    assert pool.cached() == {5, 6} and pool.lookup(s56, 2) == 2 and pool.evictable_hits(s56, 2) == 2
    assert pool.take_hits(s56, 2) == [alias, 6] and pool.num_free == 0
    pool.check()


@pytest.mark.parametrize("Pool", POOLS)
def test_a_huge_pool_costs_nothing_until_used(Pool):
    # --capacity 10**9 --timing: the never-used blocks are a count, so construction allocates no
    # entry per block; taking 3 blocks (all never used) leaves 10**9 - 3 free and evicts nothing.
    pool = Pool(10**9)
    assert pool.num_free == 10**9 and pool._nfree == 0
    keys = pool.allocate(3)
    # unnamed blocks need no identity: every one's key is UNNAMED (-1)
    assert keys == [-1, -1, -1] and pool.num_free == 10**9 - 3 and pool.removed == []
    pool.release(keys, seq(pool, []))  # released unnamed: back to the head's count (vLLM 0.33.0)
    assert pool.num_free == 10**9 and pool._nfree == 0
    pool.check()


@pytest.mark.parametrize("Pool", POOLS)
def test_a_duplicate_between_named_blocks_keeps_its_place_in_the_free_queue(Pool):
    # By hand: A names 3 blocks; B hits A's first (shared) and computes 11 again (already cached: a
    # second copy, keyed by an alias, vLLM 0.33.0), 21, 22. A's release frees 12, 11 (reversed; 10 is
    # still B's); B's frees 22, 21, its copy of 11, 10 to the tail, after the two never-used blocks.
    pool = Pool(8)
    a = pool.allocate(3)
    sa, sb = seq(pool, [10, 11, 12]), seq(pool, [10, 11, 21, 22])
    pool.register(a, sa, 0, 3)
    b = pool.take_hits(sb, 1)
    b += pool.allocate(3)
    pool.register(b, sb, 1, 4)
    alias = b[1]
    assert b == [10, alias, 21, 22] and alias >= 0 and pool.stored == [10, 11, 12, 11, 21, 22]
    pool.release(a, sa)
    pool.release(b, sb)
    assert pool.free_keys() == [None, None, 12, 11, 22, 21, alias, 10]
    pool.allocate(5)  # the two never-used blocks, then 12, 11 (A's copy), 22
    pool.copies.translate(pool.removed, getattr(pool, "removed_runs", None))
    assert pool.removed == [12, 11, 22] and pool.num_free == 3
    assert pool.cached() == {10, 11, 21} and pool.lookup(sb, 4) == 3  # 11: B's copy
    pool.check()


@pytest.mark.parametrize("Pool", POOLS)
def test_an_allocation_stopping_inside_a_run_with_a_hole_takes_its_head_of_queue(Pool):
    # By hand: a request computes 10..13 (one run) and leaves: the queue is 13, 12, 11, 10. Another
    # hits 12 alone (the run's free entry keeps a stale 12: a hole). Taking 2 blocks evicts 13, skips
    # the stale 12, evicts 11: 10 stays free and cached, 12 stays in use.
    pool = Pool(4)
    a = pool.allocate(4)
    s = seq(pool, [10, 11, 12, 13])
    pool.register(a, s, 0, 4)
    pool.release(a, s)
    pool.take_hits(seq(pool, [12]), 1)
    assert pool.num_free == 3
    pool.allocate(2)
    assert pool.removed == [13, 11] and pool.free_keys() == [10] and pool.cached() == {10, 12}
    assert pool.references(12) == 1
    pool.check()
