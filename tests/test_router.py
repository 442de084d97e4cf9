"""Properties of ``dynlab.routing.hashing`` and ``dynlab.routing.router``: the block-hash chain, ``overlap`` and ``KvRouter`` (lab 000 steps 1-3, 5)."""
from __future__ import annotations

import copy
import json
import os
import random
import re
import subprocess
import sys

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dynlab.routing.hashing import block_hashes, overlap
from helpers import HANG
from dynlab.routing.index import KvIndex
from dynlab.routing.router import KvRouter

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Small alphabets make equal prefixes (and equal blocks under different prefixes) common.
SMALL_TOKENS = st.lists(st.integers(0, 2), max_size=14)
# Tokens whose decimal digits run together ([1, 23] vs [12, 3]) and the int64 edges.
TRICKY = st.sampled_from([0, 1, 2, 3, 12, 23, 123, -1, -12, 10**6, INT64_MAX, INT64_MIN, INT64_MAX - 1])
BLOCKS = st.integers(1, 4)


def brute_overlap(hashes, cached) -> int:
    """Leading names of ``hashes`` that are in ``cached`` (the definition, written plainly)."""
    for i, h in enumerate(hashes):
        if h not in cached:
            return i
    return len(hashes)


@st.composite
def related_sequences(draw, tokens=st.integers(0, 2), max_len=14):
    """A few token lists that share heads: each is a random cut of an earlier one plus a random tail."""
    base = draw(st.lists(tokens, max_size=max_len))
    seqs = [base]
    for _ in range(draw(st.integers(1, 5))):
        parent = draw(st.sampled_from(seqs))
        cut = draw(st.integers(0, len(parent)))
        seqs.append(parent[:cut] + draw(st.lists(tokens, max_size=max_len - cut)))
    return seqs


# ---------------------------------------------------------------- block_hashes: the chain


@given(seqs=st.one_of(related_sequences(), related_sequences(TRICKY, 10)), block=BLOCKS)
def test_names_identify_whole_prefixes(seqs, block):
    """Across all blocks of all sequences: two names are equal exactly when their whole prefixes are equal.

    In particular the i-th names of two sequences are equal iff their first i+1 blocks
    are, a block with the same content under another prefix gets another name, and
    names at different depths differ.
    """
    name_of_prefix: dict = {}
    prefix_of_name: dict = {}
    for tokens in seqs:
        names = block_hashes(tokens, block)
        for i, name in enumerate(names):
            prefix = tuple(tokens[: (i + 1) * block])
            assert name_of_prefix.setdefault(prefix, name) == name
            assert prefix_of_name.setdefault(name, prefix) == prefix


@given(a=SMALL_TOKENS, b=SMALL_TOKENS, block=BLOCKS)
def test_ith_names_equal_iff_first_blocks_equal(a, b, block):
    ha, hb = block_hashes(a, block), block_hashes(b, block)
    for i in range(min(len(ha), len(hb))):
        assert (ha[i] == hb[i]) == (a[: (i + 1) * block] == b[: (i + 1) * block])


@given(a=st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=1, max_size=12),
       b=st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=1, max_size=12), block=BLOCKS)
def test_full_range_tokens_chain(a, b, block):
    """Any two sequences over the whole int64 range: names equal iff prefixes equal (same check, wide tokens)."""
    b = a[: len(b) // 2] + b  # share a head half of the time
    ha, hb = block_hashes(a, block), block_hashes(b, block)
    for i in range(min(len(ha), len(hb))):
        assert (ha[i] == hb[i]) == (a[: (i + 1) * block] == b[: (i + 1) * block])


@pytest.mark.parametrize("block", [1, 2, 3, 16])
def test_same_block_content_under_different_prefix_differs(block):
    """Lab 000's common mistake 1: hashing only a block's own tokens."""
    x = list(range(100, 100 + block))
    one = [1] * block + x
    two = [2] * block + x
    assert block_hashes(one, block)[1] != block_hashes(two, block)[1]
    # ... and a block equal to its parent still gets a new name.
    assert len(set(block_hashes(x * 3, block))) == 3


@given(tokens=st.lists(st.integers(-5, 5), max_size=40), block=st.integers(1, 7))
def test_partial_block_is_dropped(tokens, block):
    names = block_hashes(tokens, block)
    assert len(names) == len(tokens) // block
    full = len(tokens) // block * block
    assert block_hashes(tokens[:full], block) == names
    # A prefix's names are the head of the whole sequence's names.
    for k in range(len(names) + 1):
        assert block_hashes(tokens[: k * block], block) == names[:k]


@given(tokens=st.lists(st.integers(-5, 5), max_size=20), block=st.integers(1, 5))
def test_names_are_str_or_int_and_inputs_untouched(tokens, block):
    before = list(tokens)
    names = block_hashes(tokens, block)
    assert isinstance(names, list)
    assert all(type(n) in (str, int) for n in names)
    assert tokens == before
    assert block_hashes(tuple(tokens), block) == names  # any sequence of ints


def test_default_block_is_16():
    tokens = list(range(40))
    assert block_hashes(tokens) == block_hashes(tokens, 16)
    assert len(block_hashes(tokens)) == 2


@pytest.mark.parametrize("block", [1, 2])
def test_serialisation_is_unambiguous(block):
    """[1, 23] and [12, 3] must not serialise to the same bytes (e.g. by joining digits)."""
    a, b = block_hashes([1, 23], block), block_hashes([12, 3], block)
    assert len(a) == len(b) == 2 // block
    assert a != b
    assert a[-1] != b[-1]


@pytest.mark.parametrize("a, b", [
    ([1, 23], [12, 3]), ([1, 2, 3], [12, 3, 0]), ([-1, 2], [1, -2]), ([0, 0], [0, 1]),
    ([INT64_MAX, 0], [INT64_MIN, 0]), ([-1, -1], [INT64_MAX, INT64_MAX]), ([10, 0], [1, 0]),
])
def test_distinct_blocks_get_distinct_names(a, b):
    assert block_hashes(a, len(a)) != block_hashes(b, len(b))


_SUBPROCESS_CODE = """
import json, sys
from dynlab.routing.hashing import block_hashes
cases = json.load(sys.stdin)
print(json.dumps([block_hashes(tokens, block) for tokens, block in cases]))
"""


def _names_in_subprocess(cases, hashseed: str):
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    proc = subprocess.run([sys.executable, "-c", _SUBPROCESS_CODE], input=json.dumps(cases),
                          capture_output=True, text=True, env=env, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_names_are_the_same_in_other_processes():
    """Another process with another PYTHONHASHSEED computes the same names (no built-in hash())."""
    rnd = random.Random(20261007)
    cases = []
    for _ in range(60):
        block = rnd.choice([1, 2, 3, 16])
        n = rnd.randrange(0, 70)
        pool = rnd.choice([[0, 1], list(range(-3, 4)), [INT64_MIN, INT64_MAX, 0, 12, 3, 1, 23]])
        cases.append([[rnd.choice(pool) for _ in range(n)], block])
    cases.append([[1, 23], 1])
    cases.append([[12, 3], 2])
    here = json.loads(json.dumps([block_hashes(t, b) for t, b in cases]))
    assert any(here), "the cases must produce names"
    assert _names_in_subprocess(cases, "0") == here
    assert _names_in_subprocess(cases, "4242") == here


# ---------------------------------------------------------------- block_hashes: bad input

BAD_TOKENS = st.sampled_from([1.0, 2.5, float("nan"), "7", "x", True, False, None, 2**63, -(2**63) - 1,
                              2**70, [1], b"\x01"])


@given(good=st.lists(st.integers(0, 9), max_size=45), data=st.data(), bad=BAD_TOKENS, block=BLOCKS)
def test_bad_token_raises_value_error_naming_position(good, data, bad, block):
    pos = data.draw(st.integers(0, len(good)), label="position")
    assume(str(pos) not in repr(bad))  # so the position can only come from the message itself
    tokens = good[:pos] + [bad] + good[pos:]
    with pytest.raises(ValueError) as info:
        block_hashes(tokens, block)
    assert re.search(rf"(?<!\d){pos}(?!\d)", str(info.value)), str(info.value)


@pytest.mark.parametrize("edge", [INT64_MAX, INT64_MIN])
def test_int64_edges_are_valid_tokens(edge):
    assert len(block_hashes([edge, 0, edge], 1)) == 3


@pytest.mark.parametrize("block", [0, -1, -16])
def test_block_below_one_raises(block):
    with pytest.raises(ValueError, match="block"):
        block_hashes([1, 2, 3, 4], block)
    with pytest.raises(ValueError, match="block"):
        block_hashes([], block)


# ---------------------------------------------------------------- overlap

NAMES = st.integers(0, 5)


@given(hashes=st.lists(NAMES, max_size=10), cached=st.sets(NAMES, max_size=6))
def test_overlap_counts_the_contiguous_head_only(hashes, cached):
    hashes_before, cached_before = copy.copy(hashes), copy.copy(cached)
    n = overlap(hashes, cached)
    assert n == brute_overlap(hashes, cached)
    assert 0 <= n <= len(hashes)
    assert all(h in cached for h in hashes[:n])
    if n < len(hashes):
        assert hashes[n] not in cached
    assert hashes == hashes_before and cached == cached_before


@given(hashes=st.lists(NAMES, max_size=10), cached=st.sets(NAMES, max_size=6))
def test_overlap_accepts_tuples_and_frozensets(hashes, cached):
    assert overlap(tuple(hashes), frozenset(cached)) == brute_overlap(hashes, cached)


def test_overlap_stops_at_first_missing_block():
    """Lab 000's common mistake 2: a worker holding blocks 1..3 but not block 0 has overlap 0."""
    names = block_hashes(list(range(64)), 16)
    assert overlap(names, set(names[1:])) == 0
    assert overlap(names, {names[0], names[2], names[3]}) == 1
    assert overlap(names, set(names)) == 4
    assert overlap([], set(names)) == 0


# ---------------------------------------------------------------- KvRouter against a brute-force model

# A workload step: route a prompt, or (for the router's on_event) a worker reports a prompt's blocks.
PROMPTS = st.lists(st.integers(0, 2), max_size=12)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("route"), PROMPTS),
        st.tuples(st.just("event"), PROMPTS, st.integers(0, 7)),
    ),
    max_size=30,
)


def _run_against_model(n_workers, block, use_events, steps):
    router = KvRouter(n_workers, block=block, use_events=use_events)
    sets = [set() for _ in range(n_workers)]
    counts = [0] * n_workers
    for step in steps:
        hashes = block_hashes(step[1], block)
        if step[0] == "event":
            w = step[2] % n_workers
            router.on_event(w, hashes)
            sets[w].update(hashes)
            continue
        expected = min(range(n_workers), key=lambda w: (-brute_overlap(hashes, sets[w]), counts[w], w))
        got = router.route(step[1])
        assert got == expected
        counts[got] += 1
        if not use_events:
            sets[got].update(hashes)
    return router, sets


@given(n_workers=st.integers(1, 5), block=st.integers(1, 3), steps=STEPS)
def test_route_equals_brute_force(n_workers, block, steps):
    """Without events: route == min(workers, key=(-overlap, count, index)), remembering where it routed."""
    _run_against_model(n_workers, block, False, steps)


@given(n_workers=st.integers(1, 5), block=st.integers(1, 3), steps=STEPS)
def test_route_equals_brute_force_in_events_mode(n_workers, block, steps):
    """With use_events=True the model's sets grow only from on_event, and route still agrees."""
    router, sets = _run_against_model(n_workers, block, True, steps)
    for w in range(n_workers):
        assert router.index.blocks(w) == frozenset(sets[w])


@given(n_workers=st.integers(1, 6), block=st.integers(1, 3),
       prompts=st.lists(st.lists(st.integers(0, 1), max_size=8), max_size=25))
def test_events_mode_without_events_only_alternates(n_workers, block, prompts):
    """No events: the index stays empty, every overlap is 0, so the tie rules alone cycle through the workers."""
    router = KvRouter(n_workers, block=block, use_events=True)
    got = [router.route(p) for p in prompts]
    assert got == [i % n_workers for i in range(len(prompts))]
    assert len(router.index) == 0
    for p in prompts:
        assert not any(router.index.find_matches(block_hashes(p, block)).values())


def test_events_mode_learns_from_on_event_only():
    prompt = list(range(48))
    router = KvRouter(3, block=16, use_events=True)
    assert router.route(prompt) == 0
    assert router.route(prompt) == 1  # worker 0 never reported: no overlap anywhere
    router.on_event(2, block_hashes(prompt, 16))
    assert router.route(prompt) == 2
    assert router.route(prompt) == 2  # overlap beats the request count


def test_route_prefers_overlap_then_count_then_index():
    a = list(range(32))
    b = list(range(1000, 1032))
    router = KvRouter(3, block=16)
    assert [router.route(a), router.route(b)] == [0, 1]  # empty index: fewest requests, lowest index
    assert router.route(a + [7] * 16) == 0  # overlap 2 on worker 0
    assert router.route(list(range(5))) == 2  # shorter than a block: no names, least loaded
    assert router.route(b) == 1


def test_router_uses_kv_index():
    assert isinstance(KvRouter(2).index, KvIndex)


def test_route_default_block_is_16():
    router = KvRouter(2)
    prompt = list(range(40))
    router.route(prompt)
    assert router.index.find_matches(block_hashes(prompt, 16)) == {0: 2}


@pytest.mark.parametrize("n_workers", [0, -1, -5, 1.5, "2", None])
def test_bad_n_workers(n_workers):
    with pytest.raises(ValueError):
        KvRouter(n_workers)


@pytest.mark.parametrize("block", [0, -1, 2.0, None])
def test_bad_block(block):
    with pytest.raises(ValueError):
        KvRouter(2, block=block)


@pytest.mark.parametrize("worker", [-1, 3, 4, 100, 1.0, "0", None])
def test_bad_worker_index_in_on_event(worker):
    router = KvRouter(3, block=2, use_events=True)
    with pytest.raises(ValueError):
        router.on_event(worker, block_hashes([1, 2, 3, 4], 2))
    assert len(router.index) == 0  # nothing was recorded


def test_route_rejects_bad_tokens():
    router = KvRouter(2, block=2)
    with pytest.raises(ValueError, match="3"):
        router.route([1, 2, 3, "x"])
    # The failed request was neither counted nor recorded: the next one goes to worker 0.
    assert router.route([1, 2, 3, 4]) == 0
    assert router.route([1, 2, 3, 4]) == 0
