"""The block arithmetic, written once (dynlab.kv.blocks), and the KV cache manager's token-level answers to the
scheduler (issue 39 item 2): hand cases with the arithmetic in comments, and properties (hypothesis)."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dynlab.engine.request import EngineRequest
from dynlab.kv.blocks import FullAttentionGroup
from dynlab.kv.cache_manager import KvCacheManager


def test_blocks_needed_and_the_last_token_cap_by_hand():
    g = FullAttentionGroup(16)
    # ceil(t / 16): 0 -> 0, 1..16 -> 1, 17 -> 2, 33 -> 3
    assert [g.blocks_needed(t) for t in (0, 1, 16, 17, 33)] == [0, 1, 1, 2, 3]
    # (t - 1) // 16: a 16-token prompt hits nothing (its one block holds the last token, recomputed);
    # 17 tokens may hit 1 block, 33 tokens 2
    assert [g.hit_cap(t) for t in (1, 16, 17, 32, 33)] == [0, 0, 1, 1, 2]


@given(st.integers(1, 100_000), st.integers(1, 512))
def test_the_cap_leaves_the_last_token_to_compute(tokens, block):
    g = FullAttentionGroup(block)
    cap = g.hit_cap(tokens)
    assert cap * block < tokens <= g.blocks_needed(tokens) * block  # the hit never covers the last token
    assert cap <= tokens // block  # only full blocks are hit
    assert (cap + 1) * block >= tokens  # and every full block before the last token's may be


def request(i, tokens, names):
    return EngineRequest(i, 0.0, tokens, 1, names)


def test_admit_holds_the_hit_and_counts_it_on_the_first_admission_only():
    kv = KvCacheManager(8, 4)
    a = request(1, 9, [1, 2])
    kv.sequence(a)
    assert kv.admit(a, 0, 9)  # ceil(9 / 4) = 3 new blocks, nothing hit
    assert (len(a.keys), a.computed, a.nreg, kv.gpu_hit_blocks) == (3, 0, 0, 0)
    kv.name_blocks(a, 9)  # its 9 tokens computed: min(9 // 4, 2 names) = 2 blocks named
    a.computed = 9
    kv.free(a)  # blocks 1, 2 stay cached
    b = request(2, 9, [1, 2])
    kv.sequence(b)
    h, hc = kv.find_cached_prefix(b)  # cap min(2 names, (9 - 1) // 4 = 2): both hit
    assert (h, hc, kv.hit_tokens(h)) == (2, 0, 8)  # 2 blocks x 4 tokens
    assert kv.admit(b, h, 9)  # 2 hits + ceil(9 / 4) - 2 = 1 new block
    assert (len(b.keys), b.computed, b.nreg, kv.gpu_hit_blocks) == (3, 8, 2, 2)
    b.hit_tokens = 8  # (the scheduler marks its first admission)
    kv.preempt(b)
    assert (b.keys, b.nreg) == ([], 0)
    assert kv.admit(b, 2, 9)  # a re-admission hits again, but counts nothing more
    assert kv.gpu_hit_blocks == 2


def test_admit_takes_nothing_when_the_pool_cannot_give_the_blocks():
    kv = KvCacheManager(2, 4)
    a = request(1, 9, [1, 2])  # ceil(9 / 4) = 3 blocks > 2 free
    kv.sequence(a)
    assert not kv.admit(a, 0, 9)
    assert (kv.pool.num_free, a.computed) == (2, 0)


def test_drop_held_keeps_the_others_in_order():
    kv = KvCacheManager(8, 4)
    reqs = [request(i, 4, [i]) for i in range(3)]
    for r in reqs:
        kv.sequence(r)
        assert kv.admit(r, 0, 4)
    kv.hold(reqs[1])  # handed off: its blocks held for the transfer
    assert kv.drop_held(reqs) == [reqs[0], reqs[2]]
