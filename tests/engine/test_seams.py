"""The engine's seams (issue 23): request state, scheduler, KV cache manager, step planner, driver.

Hand cases for the rules each seam holds in one place (values derived by hand), and the import
and ownership rules between them (the scheduler never touches blocks; kv/ imports nothing from engine/).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynlab.engine import bulk, request, scheduler, worker
from dynlab.engine.request import DECODE_TOKENS, EngineRequest
from dynlab.engine.worker import EngineWorker
from dynlab.kv.cache_manager import CPU_WRITES, OUTPUT_NAMES, FullAttentionGroup, KvCacheManager
from dynlab.latency.base import LatencyModel, StepBatch

ROOT = Path(__file__).resolve().parents[2] / "dynlab"


class Flat(LatencyModel):
    """1 ms per step, whatever it computes."""

    def __init__(self):  # no hardware, no options
        pass

    def step_ms(self, batch: StepBatch) -> float:
        return 1.0


def req(rid, n_in, n_out, names=None, block=4):
    return EngineRequest(rid, 0.0, n_in, n_out, list(range(rid * 100, rid * 100 + n_in // block))
                         if names is None else names)


# -- the rules, one place each --------------------------------------------------------------
def test_decode_computes_one_token():
    assert DECODE_TOKENS == 1


@pytest.mark.parametrize("tokens, block, blocks", [(0, 16, 0), (1, 16, 1), (16, 16, 1), (17, 16, 2),
                                                   (1000, 16, 63), (1009, 16, 64), (5, 1, 5)])
def test_blocks_needed_hand_cases(tokens, block, blocks):
    assert FullAttentionGroup(block).blocks_needed(tokens) == blocks
    assert KvCacheManager(10, block).blocks_needed(tokens) == blocks


@given(st.integers(0, 10_000), st.integers(1, 600))
def test_blocks_needed_is_the_least_count_that_holds_the_tokens(tokens, block):
    n = KvCacheManager(1, block).blocks_needed(tokens)
    assert n * block >= tokens and (n - 1) * block < tokens or n == 0 == tokens


def test_admission_reserves_the_whole_sequence_or_the_chunk():
    r = req(1, 200, 5)  # 200 prompt tokens: 32 cached, a 100-token chunk now
    assert KvCacheManager(10, 4).admission_tokens(r, 32, 100) == 200  # vLLM 0.33.0's default
    assert KvCacheManager(10, 4, admission="chunk").admission_tokens(r, 32, 100) == 132
    with pytest.raises(ValueError, match="admission"):
        KvCacheManager(10, 4, admission="half")


def test_prompt_blocks_are_named_as_computed_and_generated_ones_at_release():
    kv = KvCacheManager(10, 4)
    r = req(1, 10, 5)  # 2 full prompt blocks
    assert kv.nameable(r, 7) == 1 and kv.nameable(r, 8) == 2 and kv.nameable(r, 14) == 2
    kv.sequence(r)
    r.keys = kv.allocate_new(r, 0, 13)  # 10 prompt + 3 generated tokens computed: 4 blocks, 3 full
    kv.name_blocks(r, 13)
    r.computed, r.num_tokens = 13, 14
    kv.free(r)  # the third block (tokens 8-11: 2 prompt, 2 generated) gets a name of its own
    assert len(r.names) == 3 and r.names[2] >= OUTPUT_NAMES and r.names[2] in kv.pool
    assert kv.evicted() == [] and kv.pool.stored == [r.names[0], r.names[1]]  # never published
    r.computed = 0
    kv.sequence(r)
    assert kv.find_cached_prefix(r) == (3, 0)  # on resume: (14 - 1) // 4 = 3 blocks hit


def test_find_cached_prefix_caps_at_the_last_token_and_continues_in_the_cpu_tier():
    kv = KvCacheManager(10, 4, cpu_capacity=8)
    a = req(1, 12, 1)  # 3 full blocks; the cap is (12 - 1) // 4 = 2
    kv.sequence(a)
    a.keys = kv.allocate_new(a, 0, 12)
    kv.name_blocks(a, 12)
    kv.free(a)
    b = EngineRequest(2, 0.0, 12, 1, a.names)
    kv.sequence(b)
    assert kv.find_cached_prefix(b) == (2, 0)
    kv.cpu.offload([a.names[0], a.names[1], a.names[2]])
    c = EngineRequest(3, 0.0, 13, 1, a.names)  # cap (13 - 1) // 4 = 3
    kv.sequence(c)
    assert kv.find_cached_prefix(c) == (3, 0)  # all three in the pool: no CPU hit
    d = EngineRequest(4, 0.0, 16, 1, a.names + [999])  # cap 3: the pool's 3, none left for the tier
    kv.sequence(d)
    assert kv.find_cached_prefix(d) == (3, 0)


def test_allocate_slots_takes_nothing_when_short():
    kv = KvCacheManager(3, 4)
    r = req(1, 8, 5)
    kv.sequence(r)
    assert kv.allocate_slots(r, 8) and r.keys == [-1, -1] and kv.num_free == 1
    assert not kv.allocate_slots(r, 13) and len(r.keys) == 2 and kv.num_free == 1  # needs 4
    assert kv.allocate_slots(r, 12) and len(r.keys) == 3 and kv.num_free == 0
    assert kv.free_slots(r) == 12
    kv.free(r)
    assert r.keys == [] and kv.num_free == 3 and kv.used_blocks == 0


def test_cpu_writes_are_the_two_rules():
    assert CPU_WRITES == ("evict", "compute")
    with pytest.raises(ValueError, match="cpu_write"):
        KvCacheManager(4, 4, cpu_write="both")
    with pytest.raises(ValueError, match="load_ms_per_block"):
        KvCacheManager(4, 4, load_ms_per_block=-1)


# -- the step plan --------------------------------------------------------------------------
def test_batch_of_tells_decodes_from_prefill_chunks():
    a, b, c = req(1, 8, 4), req(2, 8, 4), req(3, 8, 4)
    a.computed, a.num_tokens = 8, 9  # a decode: its 9th token, past its prompt
    b.computed = 0  # a prefill chunk of 1 token is not a decode
    c.computed = 4  # a chunk of 4
    assert bulk.batch_of([(a, 1), (b, 1), (c, 4)]) == ([1, 4], [0, 4], 1, 9)


def test_a_decode_only_run_goes_to_the_first_boundary_without_crossing():
    w = EngineWorker(0, 100, 4, Flat(), bulk=True)
    r = req(1, 8, 10)
    w.submit(r, 0.0)
    assert w.start_step(0.0) == 1.0  # the prefill: 8 tokens, 2 blocks
    w.finish_step()  # first token: 9 tokens, 8 computed
    # the step at 1 takes a third block (12 slots) for token 9: the run computes tokens 9..12, 4 steps
    assert w.start_step(1.0) == 5.0 and w._step.k == 4
    w.check()
    res = w.finish_step()
    assert (res.steps, r.computed, r.num_tokens, r.generated) == (4, 12, 13, 5)
    assert w.start_step(5.0) == 9.0  # a fourth block, tokens 13..16: 4 steps (5 tokens left)
    w.finish_step()
    assert w.start_step(9.0) == 10.0  # the 10th token, the last
    assert w.finish_step().finished == [(r, 10.0)] and w.steps == 10 and w.idle


# -- ownership and imports ------------------------------------------------------------------
def _imports(path: Path) -> set:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_scheduler_never_touches_blocks():
    src = Path(scheduler.__file__).read_text()
    assert "pool" not in src and "block_pool" not in src and "allocate(" not in src
    assert not any(m.startswith("dynlab.kv.block_pool") or m.startswith("dynlab.kv.run_pool")
                   for m in _imports(Path(scheduler.__file__)))


def test_kv_imports_nothing_from_the_engine():
    for path in (ROOT / "kv").glob("*.py"):
        assert not any(m.startswith("dynlab.engine") for m in _imports(path)), path.name


def test_the_worker_keeps_its_names():
    assert worker.EngineRequest is request.EngineRequest and worker.StepResult is bulk.StepResult
    assert worker.CPU_WRITES == CPU_WRITES and worker._Step is bulk.StepPlan
    w = EngineWorker(0, 8, 4, Flat(), cpu_capacity=2)
    assert w.pool is w.kv.pool and w.cpu is w.kv.cpu and w.held is w.kv.held and w.reserved is w.kv.reserved
    assert w.running is w.scheduler.running and w.waiting is w.scheduler.waiting
    assert (w.preemptions, w.peak_used_blocks, w.loaded_blocks, w.offloaded_blocks,
            w.gpu_hit_blocks, w.cpu_hit_blocks) == (0, 0, 0, 0, 0, 0)
