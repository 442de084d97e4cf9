"""``KvIndex.find_matches`` against a brute-force model (worker -> set of blocks) under any event sequence."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dynlab.routing.index import KvIndex

# Mostly a few small ids (so workers share blocks), sometimes ids past a 64-bit word.
WORKERS = st.one_of(st.integers(0, 4), st.sampled_from([63, 64, 65, 511]))

# Block names from a tiny alphabet: lists that repeat names, skip blocks, share blocks out of order.
FLAT = st.lists(st.sampled_from("abcd"), max_size=6)


def chain(path: str) -> list[str]:
    """Chained names of a path over a tiny alphabet, as a hash chain would give: 'aba' -> ['a', 'ab', 'aba']."""
    return [path[: i + 1] for i in range(len(path))]


CHAINS = st.text(alphabet="ab", max_size=5).map(chain)
HASHES = st.one_of(FLAT, CHAINS)

# Fixed probes checked after every step: every chain up to depth 4 and a few flat lists.
PROBES = [chain(format(i, "b")[1:].replace("0", "a").replace("1", "b")) for i in range(1, 32)]
PROBES += [list("abcd"), list("aabb"), list("ba"), list("dcba"), ["ab", "a"], ["a", "ab", "b"], []]


def model_matches(model: dict, hashes) -> dict:
    """Worker -> leading blocks of ``hashes`` it holds, positive ones only."""
    out = {}
    for w, held in model.items():
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        if n:
            out[w] = n
    return out


def positive(matches: dict) -> dict:
    for w, n in matches.items():
        assert isinstance(n, int) and n >= 0, (w, n)
    return {w: n for w, n in matches.items() if n}


class IndexMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.index = KvIndex()
        self.model: dict[int, set] = {}

    @rule(worker=WORKERS, hashes=HASHES)
    def stored(self, worker, hashes):
        self.index.apply_stored(worker, hashes)
        self.model.setdefault(worker, set()).update(hashes)

    @rule(worker=WORKERS, hashes=HASHES)
    def removed(self, worker, hashes):
        """Removals of anything, including blocks the worker never held (late or repeated events)."""
        self.index.apply_removed(worker, hashes)
        self.model.get(worker, set()).difference_update(hashes)

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def removed_held(self, data):
        """Removal of some blocks the worker does hold (the interesting case)."""
        worker = data.draw(st.sampled_from(sorted(w for w, s in self.model.items() if s)), label="worker")
        gone = data.draw(st.lists(st.sampled_from(sorted(self.model[worker])), min_size=1, max_size=4),
                         label="gone")
        self.index.apply_removed(worker, gone)
        self.model[worker].difference_update(gone)

    @rule(worker=WORKERS)
    def cleared(self, worker):
        self.index.clear(worker)
        self.model.pop(worker, None)

    @rule(hashes=HASHES, as_tuple=st.booleans())
    def find(self, hashes, as_tuple):
        query = tuple(hashes) if as_tuple else list(hashes)
        before = list(query)
        got = self.index.find_matches(query)
        assert list(query) == before  # the query is not mutated
        assert positive(got) == model_matches(self.model, hashes)

    @invariant()
    def probes_match_model(self):
        for probe in PROBES:
            assert positive(self.index.find_matches(probe)) == model_matches(self.model, probe), probe

    @invariant()
    def each_workers_own_blocks_match(self):
        """Querying a worker's held chains gives that worker at least their full depth."""
        for w, held in self.model.items():
            for probe in PROBES:
                if probe and all(h in held for h in probe):
                    assert self.index.find_matches(probe).get(w) == len(probe)


TestKvIndexAgainstModel = IndexMachine.TestCase


@given(stored=st.lists(st.tuples(WORKERS, HASHES), max_size=12), query=HASHES)
def test_find_matches_after_stores_only(stored, query):
    """The same check without the state machine: a batch of stores, then one query."""
    index, model = KvIndex(), {}
    for w, hashes in stored:
        index.apply_stored(w, hashes)
        model.setdefault(w, set()).update(hashes)
    assert positive(index.find_matches(query)) == model_matches(model, query)


def test_empty_index_and_empty_query():
    index = KvIndex()
    assert positive(index.find_matches(["a", "ab"])) == {}
    index.apply_stored(0, ["a", "ab"])
    assert positive(index.find_matches([])) == {}
    assert positive(index.find_matches(["b"])) == {}


def test_matches_stop_at_first_gap_per_worker():
    index = KvIndex()
    index.apply_stored(0, ["a", "ab", "abc"])
    index.apply_stored(1, ["a", "abc"])  # holds block 2 but not block 1
    index.apply_stored(2, ["ab", "abc"])  # no block 0
    index.apply_stored(3, ["a", "ab", "abc", "abca"])
    assert positive(index.find_matches(["a", "ab", "abc"])) == {0: 3, 1: 1, 3: 3}
    index.apply_removed(3, ["ab"])
    index.clear(0)
    assert positive(index.find_matches(["a", "ab", "abc"])) == {1: 1, 3: 1}
