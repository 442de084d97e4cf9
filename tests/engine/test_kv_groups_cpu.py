"""A CPU tier behind KV cache groups (dynlab/kv/hybrid.py): each group's blocks stored under its own
names, a window group's only while in its window (write-through), lookups that respect each group's
rule, one load of every group's missing blocks. Hand cases first, then invariants (hypothesis)."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.engine.request import EngineRequest
from dynlab.engine.worker import EngineWorker
from dynlab.kv.groups import HybridPool, SlidingWindowGroup, hybrid_pool
from dynlab.kv.hybrid import GROUP_NAME_STRIDE as S, HybridKvCacheManager
from dynlab.models.spec import model_spec
from dynlab.routing.index import KvIndex
from dynlab.routing.strategy import Request
from test_tiers import Flat, serve

B, W = 4, 8  # tokens per block, window tokens


def _layout():
    """One full-attention group and one sliding-window group of W = 8 tokens, blocks of B = 4 tokens."""
    return HybridPool((SlidingWindowGroup(B, W),), 1, 1, 1.0, {"full": 1, "sliding_window": 1}, 0)


def _prefill(kv, req):
    """Admit ``req`` with no hit, compute its prompt in one chunk, end the step (write-through)."""
    kv.begin_step(0.0)
    kv.sequence(req)
    req.keys = kv.allocate_new(req, 0, req.input_length)
    kv.name_blocks(req, req.input_length)
    req.computed = req.nreg = req.input_length
    return kv.write_computed(tuple(req.names))


def test_write_through_stores_each_groups_resident_blocks_and_a_later_prompt_loads_them():
    # A: 20 tokens, names 0..4, computed in one chunk. At 20 tokens the window (tokens 13..20) needs
    # blocks skipped(20) = (20 - 8 + 1) // 4 = 3 onwards: blocks 3 and 4. The tier gets the 5 full
    # blocks and the window group's 3, 4 (names 3 + 2^64, 4 + 2^64), 7 blocks; the CPU events name the
    # full group's 5 only.
    kv = HybridKvCacheManager(12, B, _layout(), cpu_capacity=100, load_ms_per_block=1.0, cpu_write="compute")
    a = EngineRequest("a", 0.0, 20, 1, list(range(5)))
    stored, removed = _prefill(kv, a)
    assert kv.cpu.names() == {0, 1, 2, 3, 4, 3 + S, 4 + S}
    assert (stored, removed) == ((0, 1, 2, 3, 4), ())
    kv.free(a)
    # C: 24 distinct tokens (names 100..105) takes 6 + 6 blocks of the 12: every cached block of A evicted
    c = EngineRequest("c", 0.0, 24, 1, list(range(100, 106)))
    kv.begin_step(0.0)
    kv.sequence(c)
    c.keys = kv.allocate_new(c, 0, 24)
    assert kv.pool.cached() == set()
    kv.free(c)
    # B: A's prompt plus 8 tokens (28 tokens, names 0..6). Lookup cap (28 - 1) // 4 = 6; GPU 0; CPU 0..4
    # (names 5, 6 were never written): H = 5, whose window needs blocks skipped(20) = 3 and 4, both in
    # the CPU tier. Loads: 5 full + 2 window blocks = 7 x 1 ms, ready at 7 ms.
    b = EngineRequest("b", 0.0, 28, 1, list(range(7)))
    kv.sequence(b)
    assert kv.find_cached_prefix(b) == (0, 5)
    assert kv.start_load(b, 0, 5, 8, 0.0)
    assert (b.ready_ms, kv.loaded_blocks) == (7.0, 7)
    kv.load_arrived(b)
    assert (b.computed, b.nreg) == (20, 5)
    # slots for 28 tokens: 7 full blocks, the window table 7 long with its first 3 skipped: 4 held
    assert kv.held_blocks(b) == [7, 4]
    assert {0, 1, 2, 3, 4, 3 + S, 4 + S} <= kv.pool.cached()
    kv.check([b.keys])


def test_a_missing_window_block_cuts_the_hit_to_what_every_group_has():
    # as above, but the tier lost block 4 of the window group: H = 5 needs window blocks 3, 4 -> miss at 4;
    # H = 4 needs skipped(16) = 2, 3: block 2 never written -> miss at 2; H = 2 needs skipped(8) = 0, 1:
    # missing -> no hit at all, though the full group has all 5 blocks in the tier
    kv = HybridKvCacheManager(12, B, _layout(), cpu_capacity=100, load_ms_per_block=1.0, cpu_write="compute")
    a = EngineRequest("a", 0.0, 20, 1, list(range(5)))
    _prefill(kv, a)
    kv.free(a)
    kv.cpu._lru.pop(4 + S)
    kv.pool = type(kv.pool)(12)  # an empty GPU pool
    b = EngineRequest("b", 0.0, 28, 1, list(range(7)))
    kv.sequence(b)
    assert kv.find_cached_prefix(b) == (0, 0)


def test_a_recomputed_copy_keeps_a_prompt_on_the_gpu_so_the_tier_finds_nothing_to_load():
    # The copies rule (dynlab/kv/copies.py, vLLM 0.33.0) with KV cache groups: why the Gemma-3-27B
    # window-chat run of docs/tiers.md lost its CPU hits (189 blocks before the rule, 0 since) while its
    # GPU hits grew. A and A2, the same 20-token prompt (names 0..4), are admitted together with no hit:
    # each takes 5 full + 5 window blocks (at computed 0 nothing has left the window), 20 blocks, the
    # whole pool. A names its blocks first (names 0..4, 0 + S..4 + S); A2's are then second copies,
    # cached under aliases (before the rule they stayed unnamed, so the names left the GPU with A's
    # blocks). Write-through stores the full group's 0..4 and the window blocks still in the window at
    # 20 tokens, from skipped(20) = (20 - 8 + 1) // 4 = 3 on: 3 + S, 4 + S.
    kv = HybridKvCacheManager(20, B, _layout(), cpu_capacity=100, load_ms_per_block=1.0, cpu_write="compute")
    a, a2 = (EngineRequest(r, 0.0, 20, 1, list(range(5))) for r in ("a", "a2"))
    kv.begin_step(0.0)
    for r in (a, a2):
        kv.sequence(r)
        r.keys = kv.allocate_new(r, 0, 20)
    for r in (a, a2):
        kv.name_blocks(r, 20)
        r.computed = r.nreg = 20
    kv.write_computed(tuple(a.names) + tuple(a2.names))
    assert kv.cpu.names() == {0, 1, 2, 3, 4, 3 + S, 4 + S}
    aliases = list(a2.keys)
    assert kv.pool.used_blocks == 20 and not set(aliases) & set(range(5))  # A2 holds aliases of 0..4
    kv.free(a)  # the free queue: A's 10 blocks; A2 still runs
    # C: 20 distinct tokens (names 100..104) takes 5 + 5 blocks, all from the queue: A's 10, every block
    # keyed 0..4 or 0 + S..4 + S, evicted. A2's copies stay (in use), then A2 finishes: they are free, cached.
    c = EngineRequest("c", 0.0, 20, 1, list(range(100, 105)))
    kv.begin_step(0.0)
    kv.sequence(c)
    c.keys = kv.allocate_new(c, 0, 20)
    assert not {0, 1, 2, 3, 4, 3 + S, 4 + S} & set(kv.pool._cached)  # no block keyed by a name of A's prompt
    kv.free(a2)
    kv.free(c)
    # B: A's prompt plus 8 tokens (names 0..6), cap (28 - 1) // 4 = 6. The full group finds 0..4 through
    # A2's copies, g0 = 5; H = 5's window needs skipped(20) = 3, 4: A2's copies of 3 + S, 4 + S. So all 5
    # blocks are GPU hits: (5, 0), nothing to load. Before the rule A2's blocks were unnamed: GPU 0, the
    # tier 0..4 and 3 + S, 4 + S, a hit of (0, 5) loading 7 blocks.
    b = EngineRequest("b", 0.0, 28, 1, list(range(7)))
    kv.sequence(b)
    assert kv.find_cached_prefix(b) == (5, 0)
    kv.begin_step(0.0)
    b.keys = kv.allocate_new(b, 5, 28)
    assert b.keys[:5] == aliases and kv.loaded_blocks == 0
    kv.check([b.keys])


def test_a_state_group_gets_no_cpu_hit():
    layout = hybrid_pool(model_spec("nemotron-h-56b"), 16, 1)
    kv = HybridKvCacheManager(1000, 16, layout, cpu_capacity=100, cpu_write="compute")
    kv.cpu.offload(list(range(10)))
    req = EngineRequest("r", 0.0, 200, 1, list(range(12)))
    kv.sequence(req)
    assert kv.find_cached_prefix(req) == (0, 0)


def test_gemma_3_1b_runs_with_a_cpu_tier_through_the_command(tmp_path):
    # gemma-3-1b at tp 1, 16-token blocks: 4 full + 22 sliding layers -> group_size 4; a page is
    # 16 tokens x 2 x 1 head x 256 x 2 B = 16,384 B per layer: one block of one group 4 x 16,384 = 65,536 B.
    # --cpu-memory-gb 1: floor(10^9 / 65,536) = 15,258 blocks.
    from helpers import invoke

    trace = tmp_path / "two.jsonl"
    tokens = list(range(3000))
    trace.write_text("".join(json.dumps({"timestamp": t, "tokens": tokens, "output_length": 4}) + "\n" for t in (0, 5000)))
    result = invoke("sim", "--trace", str(trace), "--timing", "--model", "gemma-3-1b", "--cpu-memory-gb", "1",
                    "--capacity", "400", "--cpu-write", "compute")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["kv_bytes_per_block"] == 65_536 and out["cpu_kv_blocks"] == 15_258
    assert out["cpu_kv_blocks_source"].startswith("floor(1 x 10^9 B / 65,536 B per block of 16 tokens of one KV "
                                                  "cache group of 4 layers) = 15258 blocks per worker")


# -- invariants: a worker over KV cache groups with a CPU tier --------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6), st.integers(1, 40), st.integers(1, 6),
                          st.integers(0, 30)), min_size=1, max_size=20),
       st.integers(10, 30), st.integers(0, 24), st.sampled_from([0.0, 0.5, 7.0]),
       st.sampled_from(["evict", "compute"]), st.integers(1, 12))
def test_blocks_move_between_tiers_over_groups(rows, capacity, cpu, load_ms, cpu_write, window):
    reqs, t = [], 0.0
    for i, (prefix, nblocks, extra, out_len, gap) in enumerate(rows):
        t += gap
        tokens = nblocks * B + extra % B + 1
        reqs.append(Request(tuple(prefix * 100 + j for j in range(tokens // B)), tokens, out_len, timestamp=t, index=i))
    layout = HybridPool((SlidingWindowGroup(B, window),), 1, 1, 1.0, {"full": 1, "sliding_window": 1}, 0)
    engine = EngineWorker(0, capacity, B, Flat(3.0), max_num_batched_tokens=16, cpu_capacity=cpu,
                          load_ms_per_block=load_ms, cpu_write=cpu_write, kv_layout=layout)
    out, strategy = serve(engine, reqs)
    assert out["requests"] == len(reqs)
    assert not engine.loading and not engine.ready and engine.used_blocks == 0 and engine.kv.tables == {}
    engine.kv.check([])
    index = KvIndex()
    for ev in strategy.events:
        index.apply_event(ev)
    own = {n for n in engine.pool.cached() if n < S}
    assert index.blocks(0) == own
    held = engine.cpu.names() if engine.cpu is not None else set()
    assert index.tier_blocks(0, "CPU") == {n for n in held if n < S}
    assert not out["cpu_hit_blocks"] or engine.loaded_blocks  # a CPU hit is loaded
