"""SGLang's radix cache, queue order and KV events (dynlab.engine.sglang, sglang 0.5.23): hand cases and properties."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.engine.config import SimConfig
from dynlab.engine.sglang.radix_cache import RadixCache
from dynlab.engine.sglang.schedule_policy import WAITING_QUEUE_PREFIX_MATCH_MAX, SchedulePolicy
from dynlab.engine.sglang.scheduler import SgReq, TokenPool
from dynlab.engine.sglang.worker import SglangWorker

from helpers import terms_off
from sglang_helpers import linear, req, serve


# -- radix_cache.py -----------------------------------------------------------------------------
def test_lru_evicts_unlocked_leaves_oldest_first():
    """radix_cache.py RadixCache.evict: the least recently used leaf node first, whole; a parent once its last child
    is gone. [1, 2, 3] is one node until [1, 2, 4] splits it into [1, 2] -> [3] and [4] (_split_node)."""
    c = RadixCache(16)
    c.insert([1, 2, 3])  # time 1
    c.insert([1, 2, 4])  # time 2: 1 and 2 touched
    c.insert([5])  # time 3
    assert c.match_prefix([1, 2, 3, 9]) == (3, c.root.children[1].children[2].children[3])  # time 4: 1, 2, 3
    assert c.total_size == 5 * 16
    # leaves: 3 (time 4), 4 (time 2), 5 (time 3): 16 tokens evict 4
    assert c.evict(16) == [4]
    # then 5 (3) and 3 (4); [1, 2] (time 4) becomes a leaf, one node: both its blocks go at once
    assert c.evict(17) == [5, 3]
    assert c.evict(1) == [2, 1] and c.total_size == 0


def test_locked_paths_are_never_evicted():
    """radix_cache.py inc_lock_ref / dec_lock_ref: a request's path is protected until it unlocks it."""
    c = RadixCache(16)
    _, node = c.insert([1, 2, 3])
    c.insert([1, 7])
    c.lock(node)
    assert (c.protected_size, c.evictable_size) == (48, 16)
    assert c.evict(1000) == [7]  # 1, 2, 3 locked
    c.unlock(node)
    assert c.evict(16) == [3, 2]  # [1, 7] split [1, 2, 3] into [1] -> [2, 3]: a whole node for 16 tokens
    assert c.evict(1) == [1]
    c.check()


def test_hits_are_whole_blocks_below_the_last_token():
    """schedule_batch.py _compute_max_prefix_len: at most fill - 1 tokens are matched (here in whole blocks)."""
    c = RadixCache(16)
    c.insert([1, 2, 3])
    r = SgReq(req(0, 48, 4, names=[1, 2, 3]), c.root)
    r.match(c)
    assert r.prefix_tokens == 32  # (48 - 1) // 16 = 2 blocks; SGLang at page 1 would match 47 tokens
    r = SgReq(req(0, 49, 4, names=[1, 2, 3]), c.root)
    r.match(c)
    assert r.prefix_tokens == 48


def test_pages_round_a_requests_own_tokens_up():
    """allocator: a request holds whole pages of ``--page-size`` tokens; its cached blocks are the cache's."""
    c = RadixCache(16)
    pool = TokenPool(160, c, 4)
    r = SgReq(req(0, 50, 4), c.root)
    pool.settle(r, 50)
    assert (r.private, pool.available) == (52, 108)  # 13 pages of 4
    _, node = c.insert(r.req.names[:3])  # its 3 full blocks cached (48 tokens), locked by it
    c.lock(node)
    r.tree_blocks = 3
    pool.settle(r, 51)
    assert (r.private, pool.available) == (4, 108)  # 52 - 48: one page of its own


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["insert", "lock", "unlock", "evict", "match"]),
                          st.lists(st.integers(0, 3), min_size=1, max_size=5), st.integers(0, 80)), max_size=40))
def test_cache_counters_and_matches_hold(ops):
    """Whatever is done, the counters match the tree, eviction never takes a locked node and frees what it says,
    and a match is a contiguous prefix of the names asked (each one a child of the one before)."""
    c = RadixCache(16)
    locks = []
    for op, digits, n in ops:
        names = [tuple(digits[:i + 1]) for i in range(len(digits))]  # a chain: each name its whole prefix
        if op == "insert":
            c.insert(names)
        elif op == "lock":
            k, node = c.match_prefix(names)
            c.lock(node)
            locks.append(node)
        elif op == "unlock" and locks:
            c.unlock(locks.pop(0))
        elif op == "evict":
            before, protected = c.total_size, c.protected_size
            removed = c.evict(n)
            assert c.total_size == before - 16 * len(removed) and c.protected_size == protected
            assert len(removed) * 16 >= min(n, before - protected) or not removed and before == protected
        k, node = c.match_prefix(names, touch=False)
        walk = c.root
        for name in names[:k]:
            walk = walk.children[name]
        assert walk is node and (k == len(names) or names[k] not in node.children)
        c.check()


# -- worker-level properties ------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 6), st.integers(0, 3), st.integers(1, 40)),
                min_size=1, max_size=12),
       st.integers(8, 30), st.sampled_from(["fcfs", "lpm", "dfs-weight", "lof", "random"]), st.sampled_from([1, 4, 16]),
       st.booleans())
def test_every_request_finishes_within_the_pool(rows, capacity, policy, page, mixed):
    """Random requests on a small pool: the pool never holds more than its tokens, the cache's events equal its
    content, every admitted request finishes with its tokens, hits are whole cached blocks at most fill - 1."""
    w = SglangWorker(0, capacity, 16, linear(), schedule_policy=policy, page_size=page, chunked_prefill_size=64,
                     enable_mixed_chunk=mixed)
    arrivals, held = [], set()
    for i, (at, blocks, family, out) in enumerate(rows):
        names = [family * 100 + j for j in range(blocks)]  # requests of a family share prefixes
        arrivals.append((float(at), req(i, 16 * blocks + 5, out, names=names, at=float(at))))

    def check(worker, res):
        worker.check()
        held.difference_update(res.removed)
        held.update(res.stored)

    def removed_at_start(worker):
        held.difference_update(worker.removed)

    w.start_step = _wrap(w.start_step, lambda: removed_at_start(w))
    serve(w, arrivals, check)
    assert held == w.cache.cached_names()
    for _, r in arrivals:
        assert r.rejected or (r.finish_ms is not None and r.generated == r.output_length)
        assert r.rejected or r.hit_tokens % 16 == 0 and r.hit_tokens <= r.input_length - 1


def _wrap(start_step, after):
    def wrapped(now):
        end = start_step(now)
        after()
        return end
    return wrapped


# -- schedule_policy.py --------------------------------------------------------------------------
def _waiting(cache, rows):
    return [SgReq(req(i, 16 * len(names) + 1, out, names=names), cache.root) for i, (names, out) in enumerate(rows)]


def test_lpm_orders_by_cached_prefix_and_turns_fcfs_above_128():
    """schedule_policy.py calc_priority / _determine_active_policy (WAITING_QUEUE_PREFIX_MATCH_MAX = 128)."""
    c = RadixCache(16)
    c.insert([1, 2, 3, 4])
    waiting = _waiting(c, [([9, 10], 5), ([1, 2, 20], 5), ([1, 2, 3, 4], 5)])
    SchedulePolicy("lpm", c).calc_priority(waiting)
    assert [r.req.id for r in waiting] == [2, 1, 0]  # 64, 32 and 0 cached tokens
    many = _waiting(c, [([500 + i], 5) for i in range(WAITING_QUEUE_PREFIX_MATCH_MAX - 2)]
                    + [([9, 10], 5), ([1, 2, 20], 5), ([1, 2, 3, 4], 5)])
    ids = [r.req.id for r in many]
    SchedulePolicy("lpm", c).calc_priority(many)  # 129 waiting: FCFS
    assert [r.req.id for r in many] == ids
    fewer = many[1:]
    SchedulePolicy("lpm", c).calc_priority(fewer)  # 128: sorted again
    assert [r.req.id for r in fewer[:3]] == [128, 127, 1]


def test_lpm_puts_a_second_request_sharing_an_uncached_prefix_last():
    """schedule_policy.py _compute_prefix_matches: in-batch prefix caching (32 tokens both thresholds)."""
    c = RadixCache(16)
    waiting = _waiting(c, [([7, 8, 9], 5), ([7, 8, 30], 5), ([40], 5)])
    SchedulePolicy("lpm", c).calc_priority(waiting)
    assert [r.req.id for r in waiting] == [0, 2, 1]  # 1 shares 2 blocks (32 tokens) with 0, which will cache them


def test_lof_and_random_and_disabled_cache():
    c = RadixCache(16)
    waiting = _waiting(c, [([1], 5), ([2], 50), ([3], 9)])
    SchedulePolicy("lof", c).calc_priority(waiting)
    assert [r.req.id for r in waiting] == [1, 2, 0]
    SchedulePolicy("random", c, random.Random(3)).calc_priority(waiting)
    assert sorted(r.req.id for r in waiting) == [0, 1, 2]
    assert SchedulePolicy("lpm", RadixCache(16, disable=True)).policy == "fcfs"  # _validate_and_adjust_policy
    assert SchedulePolicy("dfs-weight", RadixCache(16, disable=True)).policy == "fcfs"
    with pytest.raises(ValueError, match="schedule_policy"):
        SchedulePolicy("hrrn", c)  # not modelled


# -- KV events: what the routers see ---------------------------------------------------------------
def test_events_publish_the_cached_blocks():
    """A prefill's blocks are published when its pass ends (cache_unfinished_req), evictions at the pass's start."""
    w = SglangWorker(0, 6, 16, linear())
    a = req(1, 64, 2)  # 4 blocks, 1000..1003
    w.submit(a, 0.0)
    w.start_step(0.0)
    res = w.finish_step()
    assert res.stored == (1000, 1001, 1002, 1003) and res.removed == ()
    serve(w, [])
    b = req(2, 48, 2)
    w.submit(b, 100.0)
    w.start_step(100.0)
    # 96 tokens: A's 4 blocks stay cached (64 tokens, unlocked) and 32 are free; B (48 + 2 + 1 = 51 < 96) takes
    # 48 slots: 16 short, so the least recently used leaf goes: A's 4 blocks, one SGLang node (inserted together),
    # whole
    assert w.removed == (1003, 1002, 1001, 1000)


def test_a_kv_events_router_sees_sglang_workers_exactly():
    """With events on time the kv-events router's picture of SGLang's radix caches is exact, evictions included."""
    from dynlab.sim import run

    config = SimConfig(mode="kv-events", timing=True, engine_kind="sglang", capacity=24, workers=2,
                       latency_model="linear", **terms_off("linear"))
    out = run(config)
    assert out["evicted_blocks"] > 0 and out["prediction_error"] == 0
    # the pool: 24 blocks of 16 = 384 tokens, so at most 384 // 2 = 192 running requests (resolve_max_num_reqs)
    assert out["engine"] == "sglang" and out["sglang_max_running_requests"] == 192


def test_lpm_weighs_a_whole_cached_prompt():
    """schedule_policy.py _compute_prefix_matches: match_kv_cache(r, tree_cache, prefix_ids) with no
    max_prefix_len, so a block-aligned prompt the tree holds whole weighs all of it (admission later matches at
    most fill - 1 tokens, _compute_max_prefix_len)."""
    c = RadixCache(16)
    c.insert([1, 2, 3, 4])
    x = SgReq(req(0, 64, 5, names=[1, 2, 3, 4]), c.root)  # 64 tokens, all 4 blocks cached
    y = SgReq(req(1, 81, 5, names=[1, 2, 3, 4, 50]), c.root)  # 81 tokens, 4 of its 5 blocks cached
    waiting = [x, y]
    SchedulePolicy("lpm", c).calc_priority(waiting)
    # both weigh 64 cached tokens: a tie, so the stable sort keeps arrival order (capped at 63 tokens, x would
    # weigh 3 blocks, 48 tokens, and y would go first)
    assert (x.matched_tokens, y.matched_tokens) == (64, 64)
    assert [r.req.id for r in waiting] == [0, 1]
    x.match(c)  # what admission matches: at most 63 tokens, 3 whole blocks
    assert x.prefix_tokens == 48


def test_dfs_weight_walks_the_tree_heaviest_subtree_first():
    """schedule_policy.py _sort_by_dfs_weight (mem_cache/base_prefix_cache.py _dfs_weight_order): depth first from
    the root, the child whose subtree holds more waiting requests' matches first, a node's own requests after
    its children's."""
    c = RadixCache(16)
    c.insert([1, 2, 3])
    c.insert([1, 2, 7])  # branches after block 2
    c.insert([9])
    waiting = _waiting(c, [([9, 90], 5), ([1, 2, 3, 30], 5), ([1, 2, 7, 70], 5), ([1, 2, 3, 31], 5), ([80], 5)])
    SchedulePolicy("dfs-weight", c).calc_priority(waiting)
    # matches end at: 0 -> block 9, 1 and 3 -> block 3, 2 -> block 7, 4 -> the root. Weights: block 3: 2,
    # block 7: 1, blocks 1 and 2: 3, block 9: 1. From the root: block 1 (3) before block 9 (1); under block 2,
    # block 3 (2) before block 7 (1); the root's own request (4) last
    assert [r.req.id for r in waiting] == [1, 3, 2, 0, 4]
    lpm = _waiting(c, [([9, 90], 5), ([1, 2, 3, 30], 5), ([1, 2, 7, 70], 5), ([1, 2, 3, 31], 5), ([80], 5)])
    SchedulePolicy("lpm", c).calc_priority(lpm)
    assert [r.req.id for r in lpm] == [1, 2, 3, 0, 4]  # lpm: 48, 48, 48 cached tokens keep arrival order
    # never turns FCFS (only lpm and hrrn do above 128 waiting, _determine_active_policy)
    many = _waiting(c, [([500 + i], 5) for i in range(WAITING_QUEUE_PREFIX_MATCH_MAX)] + [([1, 2, 3, 30], 5)])
    SchedulePolicy("dfs-weight", c).calc_priority(many)
    assert many[0].req.id == WAITING_QUEUE_PREFIX_MATCH_MAX


def test_fcfs_refreshes_the_waiting_prefixes_every_32nd_call():
    """schedule_policy.py _touch_waiting_prefixes (SGLANG_ENABLE_WAITING_PREFIX_REFRESH on,
    WAITING_PREFIX_REFRESH_INTERVAL = 32): a cache-agnostic order touches the waiting requests' cached prefixes
    on its 1st, 33rd, ... call, so the radix cache's LRU evicts them last."""
    c = RadixCache(16)
    c.insert([1, 2])  # older
    c.insert([3, 4])
    waiting = [SgReq(req(0, 49, 5, names=[1, 2, 9]), c.root)]  # its prefix is [1, 2]
    policy = SchedulePolicy("fcfs", c)
    policy.calc_priority(waiting)  # call 1: refreshes [1, 2], now newer than [3, 4]
    assert c.evict(32) == [4, 3]
    c.insert([3, 4])  # now the newest
    for _ in range(31):  # calls 2-32: no refresh
        policy.calc_priority(waiting)
    assert c.evict(32) == [2, 1]
    c.insert([1, 2])
    c.insert([3, 4])
    policy.calc_priority(waiting)  # call 33: refreshes again
    assert c.evict(32) == [4, 3]
