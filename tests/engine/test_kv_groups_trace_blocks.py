"""KV cache groups on trace blocks of several engine blocks (issue 43 item 3): a Mooncake-style trace's ids
mapped onto 16-token engine blocks (dynlab/engine/names.py) name every group's blocks, as for full attention.

Hand cases: a full-attention group and a sliding-window group of W = 32 tokens, engine blocks of B = 16
tokens, trace blocks of T = 64 tokens (4 engine blocks each). The window group's rule
(dynlab/kv/groups.py): ``skipped(c) = max(0, c - W + 1) // B = max(0, c - 31) // 16`` leading blocks are out
of the window once ``c`` tokens are computed; a hit of ``h`` blocks needs the window's blocks
``skipped(16 h) .. h - 1`` cached. Then the command: gpt-oss-20b on a Mooncake trace at --block 16 and at
--block 512."""
import json

import pytest

from dynlab.engine.names import engine_block_names
from dynlab.engine.request import EngineRequest
from dynlab.kv.groups import MAPPED_NAME_STRIDE as S, HybridPool, SlidingWindowGroup
from dynlab.kv.hybrid import HybridKvCacheManager

B, W, T = 16, 32, 64


def _manager(capacity):
    """One full group and one window group (W = 32) of B = 16-token blocks, named as mapped names are."""
    layout = HybridPool((SlidingWindowGroup(B, W),), 1, 1, 1.0, {"full": 1, "sliding_window": 1}, 0, S)
    return HybridKvCacheManager(capacity, B, layout)


def _request(rid, hash_ids, tokens):
    return EngineRequest(rid, 0.0, tokens, 2, engine_block_names(hash_ids, tokens, T, B))


def _prefill(kv, req):
    """Admit ``req`` with no hit, compute its prompt in one chunk, then take the next decode slot (which
    first frees the window's leavers, as vLLM's remove_skipped_blocks does)."""
    kv.sequence(req)
    req.keys = kv.allocate_new(req, 0, req.input_length)
    kv.name_blocks(req, req.input_length)
    req.computed = req.nreg = req.input_length
    assert kv.allocate_slots(req, req.input_length + 1)


def test_each_group_is_named_from_the_trace_row():
    # Row hash_ids [5, 9], 100 tokens: 100 // 16 = 6 full engine blocks. Engine block j's last token is
    # 16 j + 15, in trace block (16 j + 15) // 64: j = 0..3 in trace block 0 (id 5), j = 4, 5 in trace
    # block 1 (id 9). Name = id x 1024 + offset among the engine blocks of that trace block:
    # 5120, 5121, 5122, 5123, 9216, 9217. The window group's names are the same plus S = 2^74.
    kv = _manager(100)
    a = _request("a", [5, 9], 100)
    assert a.names == [5120, 5121, 5122, 5123, 9216, 9217]
    kv.sequence(a)
    assert kv.seq_of(a, 0) == [S + 5120, S + 5121, S + 5122, S + 5123, S + 9216, S + 9217]
    _prefill(kv, a)
    # Tables for 101 tokens: ceil(101 / 16) = 7 blocks each. After the prompt (100 computed) the window
    # group freed skipped(100) = (100 - 31) // 16 = 4 blocks (0..3): it holds 7 - 4 = 3.
    assert kv.held_blocks(a) == [7, 3]
    # Cached: the 6 full names, and all 6 window names (named in the prompt's chunk, before blocks 0..3
    # left the window: freed, still cached, evictable)
    assert kv.pool.cached() == {*a.names, *kv.seq_of(a, 0)}
    # the KV events carry the full group's names only
    stored = kv.step_events()[0]
    assert sorted(stored) == a.names
    kv.check([a.keys])


def _a_then_filler(filler_blocks):
    """Capacity 20: prefill A ([5, 9], 100 tokens) and free it, then hold ``filler_blocks`` unnamed blocks.

    Free queue after A, head first: the 20 - 14 = 6 never-used blocks and A's two unnamed last blocks
    (one per group; unnamed blocks go to the head), then the named ones in the order they were freed,
    each release reversed: the window's leavers S+5123, S+5122, S+5121, S+5120 (freed at the decode
    slot), the full group's 9217, 9216, 5123, 5122, 5121, 5120, the window's S+9217, S+9216."""
    kv = _manager(20)
    a = _request("a", [5, 9], 100)
    _prefill(kv, a)
    kv.free(a)
    return kv, kv.pool.allocate(filler_blocks)


def _b():
    # Row hash_ids [5, 11], 100 tokens: it shares trace block 0 (id 5) with A, so engine blocks 0..3:
    # names 5120..5123, then 11264, 11265 of its own.
    return _request("b", [5, 11], 100)


def test_a_second_request_sharing_a_prefix_hits_it_in_both_groups():
    # No eviction (the filler takes nothing). Full group: 5120..5123 cached, 9216 is not B's (11264):
    # 4 blocks. Window group at h = 4: skipped(64) = (64 - 31) // 16 = 2, so it needs S+5122, S+5123:
    # cached. Hit: 4 blocks = 64 tokens in both groups.
    kv, _ = _a_then_filler(0)
    b = _b()
    kv.sequence(b)
    assert b.names == [5120, 5121, 5122, 5123, 11264, 11265]
    assert kv.find_cached_prefix(b) == (4, 0)
    b.keys = kv.allocate_new(b, 4, 100)
    # full group: the 4 hits + 3 new (ceil(100 / 16) = 7); window group: its table starts at skipped(64) = 2,
    # the hits S+5122, S+5123 then 3 new blocks: 5 held
    assert b.keys[:4] == [5120, 5121, 5122, 5123]
    assert kv.held_blocks(b) == [7, 5]
    assert kv.tables[b][0][0] == 2 and kv.tables[b][0][1][:2] == [S + 5122, S + 5123]


@pytest.mark.parametrize("filler, evicted, hit", [
    # 8 blocks: the 8 unnamed ones at the head, nothing named evicted: the hit of 4 blocks stays
    (8, [], 4),
    # 10 blocks: the 8 unnamed and the window's S+5123, S+5122. Full group still caches 5120..5123.
    # h = 4 needs window blocks 2, 3 (S+5122 missing); h = 3: skipped(48) = (48 - 31) // 16 = 1, needs
    # 1, 2 (S+5122 missing); h = 2: skipped(32) = (32 - 31) // 16 = 0, needs S+5120, S+5121: cached.
    # Hit 2 blocks (32 tokens), though the full group alone would give 4.
    (10, [S + 5123, S + 5122], 2),
    # 12 blocks: all four window leavers evicted: h = 1 needs S+5120 (missing), no hit at all
    (12, [S + 5123, S + 5122, S + 5121, S + 5120], 0),
])
def test_the_window_group_limits_the_hit_when_its_blocks_were_evicted(filler, evicted, hit):
    kv, _ = _a_then_filler(filler)
    assert kv.pool.removed == evicted
    assert kv.removed() == ((), None)  # (the router never hears of the window group's names)
    b = _b()
    kv.sequence(b)
    assert kv.pool.lookup(b.seq, 6) == 4  # the full group's cached prefix, whatever the window's
    assert kv.find_cached_prefix(b) == (hit, 0)


# -- through the command: gpt-oss-20b (window 128) on a Mooncake trace of 512-token blocks -------------

ROWS = [  # (ms, input tokens, hash_ids); 2 output tokens each, each request long finished before the next
    (0, 1000, [1, 2]), (10_000, 1000, [1, 3]), (20_000, 512, [1]),
]


@pytest.mark.parametrize("block, hits, peak", [
    # --block 16 (vLLM's): A's 1000 tokens are 62 full engine blocks (1024..1055 from id 1, 2048..2077 from
    # id 2). B shares id 1: engine blocks 0..31 (tokens 0..511); at h = 32 the window (128) needs blocks
    # skipped(512) = (512 - 127) // 16 = 24 .. 31, cached from A's prompt: 512 tokens. C (512 tokens, [1])
    # may hit at most (512 - 1) // 16 = 31 blocks (vLLM recomputes the last token): the window needs
    # skipped(496) = (496 - 127) // 16 = 23 .. 30, cached: 31 x 16 = 496 tokens. Peak: A's prompt in one
    # chunk holds ceil(1000 / 16) = 63 blocks in each group, 126, before the window frees any.
    (16, [0, 512, 496], 126),
    # --block 512 (the trace's): one engine block per id. B hits block 0 (the window's skipped(512) =
    # (512 - 127) // 512 = 0 .. 0 is cached): 512 tokens; C may hit at most (512 - 1) // 512 = 0 blocks:
    # nothing. Peak: ceil(1000 / 512) = 2 blocks per group, 4.
    (512, [0, 512, 0], 4),
])
def test_a_mooncake_trace_on_a_sliding_window_model_at_either_block_size(tmp_path, block, hits, peak):
    from helpers import invoke

    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 2, "hash_ids": ids}) + "\n"
                             for t, n, ids in ROWS))
    records = tmp_path / "requests.jsonl"
    result = invoke("sim", "--trace", trace, "--timing", "--workers", "1", "--model", "gpt-oss-20b", "--block", block,
                    "--mode", "kv-events", "--requests-out", records)
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert (out["block"], out["trace_block"], out["peak_kv_blocks"]) == (block, 512, [peak])
    assert [json.loads(line)["hit_tokens"] for line in records.read_text().splitlines()] == hits
    # the router's picture, from the KV events (full group's names only), is exact
    assert out["prediction_error"] == 0
