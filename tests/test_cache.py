"""LRUCache against a list model, TwoTierCache's rules, and the opt policy against brute force."""
from __future__ import annotations

import functools

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dynlab.kv.policies import FutureIndex, LRUCache
from dynlab.kv.tiers import TwoTierCache
from dynlab_builtins.policies import FIFOCache, LFUCache, OptCache

KEYS = st.integers(0, 7)


class LRUAgainstListModel(RuleBasedStateMachine):
    """The model: a list of [key, size], oldest first, with the seed lab's rules written plainly."""

    @initialize(capacity=st.integers(0, 20), track=st.booleans())
    def start(self, capacity, track):
        self.capacity = capacity
        self.cache = LRUCache(capacity)
        self.track = track  # on_evict set or not: two code paths
        self.evicted: list = []
        if track:
            self.cache.on_evict = self.evicted.append
        self.model: list[list] = []

    def model_keys(self):
        return [k for k, _ in self.model]

    @rule(key=KEYS, size=st.integers(0, 25))
    def access(self, key, size):
        self.evicted.clear()
        keys = self.model_keys()
        expected_evicted = []
        if key in keys:
            entry = self.model.pop(keys.index(key))
            self.model.append(entry)  # most recent; the stored size stays
            expected = True
        else:
            expected = False
            if size <= self.capacity:
                while sum(s for _, s in self.model) + size > self.capacity:
                    expected_evicted.append(self.model.pop(0)[0])
                self.model.append([key, size])
        assert self.cache.access(key, size) is expected
        if self.track:
            assert self.evicted == expected_evicted
        if size > self.capacity and not expected:
            assert self.evicted == []  # an oversize entry never evicts

    @rule(key=KEYS)
    def contains_changes_nothing(self, key):
        before = self.cache.keys()
        assert (key in self.cache) == (key in self.model_keys())
        assert self.cache.keys() == before

    @rule(key=KEYS)
    def remove(self, key):
        self.evicted.clear()
        keys = self.model_keys()
        was = key in keys
        if was:
            self.model.pop(keys.index(key))
        assert self.cache.remove(key) is was
        assert self.evicted == []

    @invariant()
    def used_is_sum_of_sizes_within_capacity(self):
        assert self.cache.used == sum(s for _, s in self.model) <= self.capacity

    @invariant()
    def order_oldest_first(self):
        assert self.cache.keys() == self.model_keys()
        assert len(self.cache) == len(self.model)


TestLRUAgainstListModel = LRUAgainstListModel.TestCase


def test_lru_examples_from_the_seed_rules():
    c = LRUCache(10)
    assert c.access("a", 4) is False
    assert c.access("b", 4) is False
    assert c.access("a", 4) is True  # a becomes most recent
    assert c.keys() == ["b", "a"]
    assert "b" in c and c.keys() == ["b", "a"]  # `in` does not reorder
    assert c.access("c", 4) is False  # evicts b (oldest), not a
    assert c.keys() == ["a", "c"] and c.used == 8
    assert c.access("huge", 11) is False  # oversize: not stored, nothing evicted
    assert c.keys() == ["a", "c"] and c.used == 8
    assert c.access("a", 9) is True and c.used == 8  # a hit keeps the stored size


def test_capacity_zero_and_bad_values():
    c = LRUCache(0)
    assert c.access("x", 1) is False and len(c) == 0 and c.used == 0
    assert c.access("empty", 0) is False and c.access("empty", 0) is True  # size 0 fits anywhere
    with pytest.raises(ValueError):
        LRUCache(-1)
    with pytest.raises(TypeError):
        LRUCache(2.5)
    with pytest.raises(ValueError):
        LRUCache(5).access("x", -1)
    with pytest.raises(ValueError):
        TwoTierCache(-1, 0)
    with pytest.raises(ValueError):
        TwoTierCache(1, -1)


def test_fifo_ignores_hits_and_lfu_keeps_the_frequent():
    fifo = FIFOCache(2)
    for k in "aba":
        fifo.access(k)
    fifo.access("c")
    assert fifo.keys() == ["b", "c"]  # a was stored first; its hit did not save it
    lfu = LFUCache(2)
    for k in "aab":
        lfu.access(k)
    lfu.access("c")
    assert sorted(lfu.keys()) == ["a", "c"]  # b had 1 access, a had 2
    assert lfu.keys() == ["c", "a"]  # victim first: c (1 access), then a (2)


# ---- TwoTierCache -------------------------------------------------------------------------

ACCESSES = st.lists(st.tuples(KEYS, st.integers(0, 12)), max_size=60)


@given(gpu=st.integers(0, 30), cpu=st.integers(0, 40), accesses=ACCESSES)
def test_two_tier_rules(gpu, cpu, accesses):
    cache = TwoTierCache(gpu, cpu)
    assert isinstance(cache.gpu, LRUCache) and isinstance(cache.cpu, LRUCache)
    for key, size in accesses:
        in_gpu, in_cpu = key in cache.gpu, key in cache.cpu
        cpu_before = cache.cpu.keys()
        expected_tier = "gpu" if in_gpu else "cpu" if in_cpu else None
        assert cache.tier(key) == expected_tier
        result = cache.access(key, size)
        if in_gpu:
            assert result == "gpu"
            assert cache.cpu.keys() == cpu_before  # CPU untouched
        elif in_cpu:
            assert result == "cpu"
            assert cache.cpu.keys()[-1] == key  # the CPU copy becomes most recent
            stored_size = size  # the GPU stores it with the size given now
            assert (key in cache.gpu) == (stored_size <= gpu)  # on the GPU too, if it fits
        else:
            assert result == "miss"
            assert (key in cache.gpu) == (size <= gpu)
            assert (key in cache.cpu) == (size <= cpu and cpu > 0)  # cpu=0: no CPU tier
        assert cache.gpu.used <= gpu and cache.cpu.used <= cpu


@given(gpu=st.integers(0, 30), accesses=ACCESSES)
def test_two_tier_with_no_cpu_is_a_lone_lru(gpu, accesses):
    tiered, lone = TwoTierCache(gpu, 0), LRUCache(gpu)
    for key, size in accesses:
        result = tiered.access(key, size)
        assert result != "cpu"
        assert (result == "gpu") is lone.access(key, size)
        assert tiered.gpu.keys() == lone.keys()
        assert tiered.gpu.used == lone.used


def test_two_tier_policy_and_shared_future():
    future = [1, 2, 3, 1, 2, 3]
    cache = TwoTierCache(2, 3, policy=OptCache, future=future)
    assert isinstance(cache.gpu, OptCache) and isinstance(cache.cpu, OptCache)
    assert [cache.access(k) for k in future] == ["miss", "miss", "miss", "gpu", "cpu", "gpu"]
    with pytest.raises(ValueError):
        TwoTierCache(2, 3, policy=OptCache)  # opt needs the future


@given(
    sequence=st.lists(st.integers(0, 6), max_size=50),
    gpu_slots=st.integers(0, 4),
    cpu_slots=st.integers(0, 6),
    size=st.integers(1, 3),
)
def test_two_tier_opt_gpu_tier_is_exact_belady(sequence, gpu_slots, cpu_slots, size):
    # Every access reaches the GPU tier, so its opt sees the whole future: at least LRU's GPU hits.
    opt = TwoTierCache(gpu_slots * size, cpu_slots * size, policy=OptCache, future=sequence)
    lru = TwoTierCache(gpu_slots * size, cpu_slots * size)
    opt_results = [opt.access(k, size) for k in sequence]
    lru_results = [lru.access(k, size) for k in sequence]
    assert opt_results.count("gpu") >= lru_results.count("gpu")
    assert opt_results.count("gpu") == brute_force_max_hits(tuple(sequence), gpu_slots)
    assert opt.gpu.used <= gpu_slots * size and opt.cpu.used <= cpu_slots * size
    assert opt.gpu.cursor == len(sequence) - 1 if sequence else opt.gpu.cursor == -1


# ---- opt ----------------------------------------------------------------------------------


def brute_force_max_hits(sequence, slots):
    """Most hits any demand policy (store every miss) can get with ``slots`` equal-size slots."""

    @functools.lru_cache(maxsize=None)
    def best(i, held):
        if i == len(sequence):
            return 0
        key = sequence[i]
        if key in held:
            return 1 + best(i + 1, held)
        if slots == 0:
            return best(i + 1, held)
        if len(held) < slots:
            return best(i + 1, held | {key})
        return max(best(i + 1, (held - {victim}) | {key}) for victim in held)

    return best(0, frozenset())


@given(sequence=st.lists(st.integers(0, 4), max_size=14), slots=st.integers(0, 3))
def test_opt_equals_brute_force_optimum_for_equal_sizes(sequence, slots):
    cache = OptCache(slots, future=sequence)
    hits = sum(cache.access(k) for k in sequence)
    assert hits == brute_force_max_hits(tuple(sequence), slots)


@given(sequence=st.lists(st.integers(0, 4), max_size=14), slots=st.integers(0, 3), size=st.integers(1, 3))
def test_opt_with_sizes_uses_capacity_in_units(sequence, slots, size):
    cache = OptCache(slots * size, future=sequence)
    hits = sum(cache.access(k, size) for k in sequence)
    assert hits == brute_force_max_hits(tuple(sequence), slots)


def test_opt_needs_future_and_evicts_unknown_keys_first():
    with pytest.raises(ValueError):
        OptCache(3)
    with pytest.raises(ValueError):
        OptCache(-1, future=[])
    evicted = []
    cache = OptCache(2, future=["a", "b", "a", "b"])
    cache.on_evict = evicted.append
    cache.access("a")
    cache.access("stranger")  # not in future: never used again
    assert cache.keys() == ["stranger", "a"]  # victim first
    cache.access("b")
    assert evicted == ["stranger"]
    assert cache.access("a") and cache.access("b")


def test_opt_cursor_follows_a_subsequence():
    future = ["a", "b", "a", "c", "b"]
    cache = OptCache(2, future=future)
    evicted = []
    cache.on_evict = evicted.append
    cache.access("a")
    cache.access("b")
    assert cache.cursor == 1
    # "a" at position 2 is served elsewhere; this cache next sees "c" at position 3.
    cache.access("c")
    assert cache.cursor == 3
    # a's next use was skipped: it is never used again here, so it goes, not b (next use 4).
    assert evicted == ["a"]
    assert cache.access("b") is True and cache.cursor == 4


def test_future_index():
    fi = FutureIndex("abcab")
    assert list(fi) == list("abcab") and len(fi) == 5 and fi[1] == "b"
    assert fi.next_after == [3, 4, 5, 5, 5]
    assert fi.first_after("a", -1) == 0 and fi.first_after("a", 0) == 3 and fi.first_after("a", 3) == 5
    assert fi.first_after("zzz", -1) == fi.never == 5


# ---- fifo and lfu against a plain model ------------------------------------------------------

# victim order of each online policy, over model entries {"freq", "touched", "stored"}
VICTIM_ORDER = {
    LRUCache: lambda e: e["touched"],
    FIFOCache: lambda e: e["stored"],
    LFUCache: lambda e: (e["freq"], e["touched"]),
}


@pytest.mark.parametrize("cls", list(VICTIM_ORDER), ids=lambda c: c.name)
@given(
    capacity=st.integers(0, 6),
    ops=st.lists(
        st.tuples(st.sampled_from(["access"] * 4 + ["remove"]), st.integers(0, 4), st.sampled_from([1, 1, 1, 2, 0])),
        max_size=80,
    ),
)
@example(  # lfu: remove the only least-frequent entry, hit another, then evict: the least frequent left goes
    capacity=3,
    ops=[("access", 0, 1)] * 2 + [("access", 1, 1)] * 3 + [("access", 2, 1)] * 4 + [("remove", 0, 1), ("access", 2, 1), ("access", 3, 2)],
)
@example(  # lfu: a new entry (1 access) goes before older ones with 2
    capacity=2, ops=[("access", k, 1) for k in (0, 0, 1, 1, 2, 3)]
)
def test_online_policies_against_a_model(cls, capacity, ops):
    order = VICTIM_ORDER[cls]
    cache, model = cls(capacity), {}
    evicted: list = []
    cache.on_evict = evicted.append
    for clock, (op, key, size) in enumerate(ops):
        evicted.clear()
        expected_evicted = []
        if op == "remove":
            assert cache.remove(key) is (model.pop(key, None) is not None)
        elif key in model:
            model[key]["freq"] += 1
            model[key]["touched"] = clock
            assert cache.access(key, size) is True
        else:
            if size <= capacity:
                while sum(e["size"] for e in model.values()) + size > capacity:
                    victim = min(model, key=lambda k: order(model[k]))
                    expected_evicted.append(victim)
                    del model[victim]
                model[key] = {"size": size, "freq": 1, "touched": clock, "stored": clock}
            assert cache.access(key, size) is False
        assert evicted == expected_evicted
        assert cache.keys() == sorted(model, key=lambda k: order(model[k]))
        assert cache.used == sum(e["size"] for e in model.values())
