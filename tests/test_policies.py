"""Properties every registered eviction policy must keep (third-party ones included), and opt's bound."""
from __future__ import annotations

import json
from collections import OrderedDict

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dynlab import hookimpl
from dynlab.cli import main
from dynlab.kv.policies import EvictionPolicy
from dynlab.plugins import eviction_policies, get_plugin_manager
from dynlab_builtins.policies import OptCache

ENTRIES = eviction_policies().entries()
IDS = [e.name for e in ENTRIES]

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("access"), st.integers(0, 9), st.integers(0, 8)),
        st.tuples(st.just("remove"), st.integers(0, 9), st.just(0)),
        st.tuples(st.just("contains"), st.integers(0, 9), st.just(0)),
    ),
    max_size=80,
)


def check_policy_contract(cls, capacity, ops):
    """Run ``ops`` through ``cls(capacity, future=<the accessed keys>)``, checking the contract at every step."""
    future = [key for op, key, _ in ops if op == "access"]
    cache = cls(capacity, future=future)
    assert cache.capacity == capacity and cache.on_evict is None
    evicted: list = []
    sizes: dict = {}  # key -> size it was stored with

    def on_evict(key):
        # called after the key left, with the cache consistent
        assert key not in cache and key not in cache.keys()
        assert cache.used == sum(sizes[k] for k in cache.keys())
        evicted.append(key)

    cache.on_evict = on_evict
    for op, key, size in ops:
        before = cache.keys()
        assert len(before) == len(set(before)) == len(cache)
        evicted.clear()
        if op == "contains":
            assert (key in cache) == (key in before)
            assert cache.keys() == before  # asking changes nothing
        elif op == "remove":
            assert cache.remove(key) is (key in before)
            assert evicted == []  # not an eviction
            assert key not in cache
            sizes.pop(key, None)
        else:
            hit = cache.access(key, size)
            after = cache.keys()
            assert hit is (key in before)
            assert len(evicted) == len(set(evicted))
            assert set(evicted) == set(before) - set(after)  # on_evict names exactly the keys that left
            if hit:
                assert evicted == [] and key in cache
            elif size > capacity:
                assert evicted == [] and key not in cache  # oversize: not stored, evicts nothing
            else:
                assert key in cache  # a miss that fits is stored
                sizes[key] = size
            assert set(after) <= set(before) | {key}
            for gone in evicted:
                sizes.pop(gone)
        assert set(cache.keys()) == set(sizes)
        assert cache.used == sum(sizes.values()) <= capacity


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
@given(capacity=st.integers(0, 24), ops=OPS)
def test_every_policy_keeps_the_contract(entry, capacity, ops):
    check_policy_contract(entry.cls, capacity, ops)


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_every_policy_rejects_bad_values(entry):
    assert issubclass(entry.cls, EvictionPolicy) and entry.description
    if entry.cls.needs_future:
        with pytest.raises(ValueError):
            entry.cls(4)
    else:
        assert len(entry.cls(4)) == 0  # online policies need no future
    with pytest.raises(ValueError):
        entry.cls(-1, future=[])
    cache = entry.cls(4, future=["a"])
    with pytest.raises(ValueError):
        cache.access("a", -1)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.name != "opt"], ids=[n for n in IDS if n != "opt"])
@given(
    sequence=st.lists(st.integers(0, 9), max_size=80),
    slots=st.integers(0, 6),
    size=st.integers(1, 4),
)
def test_opt_hits_at_least_as_many_as_any_policy(entry, sequence, slots, size):
    other = entry.cls(slots * size, future=sequence)
    opt = OptCache(slots * size, future=sequence)
    other_hits = sum(other.access(k, size) for k in sequence)
    opt_hits = sum(opt.access(k, size) for k in sequence)
    assert opt_hits >= other_hits


# ---- a third-party policy, registered at run time like an installed plugin -----------------


class MRUCache(EvictionPolicy):
    """Most recently used (a throwaway test plugin): evict the entry touched last."""

    name = "test-mru"

    def __init__(self, capacity, future=None):
        super().__init__(capacity, future)
        self._data = OrderedDict()

    def access(self, key, size=1):
        if size < 0:
            raise ValueError("negative size")
        if key in self._data:
            self._data.move_to_end(key)
            return True
        if size <= self.capacity:
            while self.used + size > self.capacity:
                old, _ = self._data.popitem(last=True)
                if self.on_evict:
                    self.on_evict(old)
            self._data[key] = size
        return False

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)

    @property
    def used(self):
        return sum(self._data.values())

    def keys(self):
        return list(reversed(self._data))

    def remove(self, key):
        return self._data.pop(key, None) is not None


class _ThrowawayPlugin:
    @hookimpl
    def dynlab_register_eviction_policies(self, register):
        register(MRUCache)


@pytest.fixture
def mru_plugin():
    pm = get_plugin_manager()
    plugin = _ThrowawayPlugin()
    pm.register(plugin, name="test-mru-plugin")
    try:
        yield
    finally:
        pm.unregister(plugin)


def test_third_party_policy_is_listed_and_usable(mru_plugin):
    registry = eviction_policies()
    assert {"lru", "fifo", "lfu", "opt"} <= set(registry)
    assert registry.get("test-mru") is MRUCache
    runner = CliRunner()
    listed = runner.invoke(main, ["policies"])
    assert listed.exit_code == 0
    assert any(line.startswith("test-mru ") and "Most recently used" in line for line in listed.output.splitlines())
    run = runner.invoke(main, ["scenario", "--policy", "test-mru", "--passes", "fwd,fwd"])
    assert run.exit_code == 0, run.output
    # MRU on a cyclic read keeps the first documents (here as good as opt): the opposite of LRU's zero.
    assert run.stdout.count("\n") == 1
    assert json.loads(run.stdout)["passes"][1]["hit_docs"] == [0, 1, 2, 9]


@given(capacity=st.integers(0, 24), ops=OPS)
def test_third_party_policy_keeps_the_contract(capacity, ops):
    check_policy_contract(MRUCache, capacity, ops)


def test_throwaway_plugin_is_gone_after_the_test():
    assert "test-mru" not in eviction_policies()
