"""KV cache groups (dynlab/kv/groups.py, dynlab/kv/hybrid.py): hand-derived pool sizes, blocks held per
request, window freeing in decode, a window-limited prefix hit, P/D of a sliding-window model.

Hand derivations use one H100 (80 GiB read as binary, x 0.9 = 77,309,411,328 B) and 16-token blocks."""
import json
import math

import pytest

from dynlab.engine.request import EngineRequest
from dynlab.kv.groups import HybridPool, SlidingWindowGroup, hybrid_kv_blocks, hybrid_pool, transfer_bytes
from dynlab.kv.hybrid import GROUP_NAME_STRIDE, HybridKvCacheManager
from dynlab.models.gpus import gpu_spec
from dynlab.models.spec import model_spec

USABLE = 77_309_411_328


def test_gemma_3_27b_pool():
    # 10 full + 52 sliding (window 1024) layers: group_size = 10 (52 >= 1.5 x 10), 1 + ceil(52/10) = 7 groups,
    # 8 padding layers; page = 16 x 2 x 16 heads x 128 x 2 B = 131,072 B per layer
    model = model_spec("gemma-3-27b")
    blocks, why, pool = hybrid_kv_blocks(model, gpu_spec("h100"), 16, 1)
    assert (pool.group_size, pool.full_groups, len(pool.groups), pool.padding) == (10, 1, 6, 8)
    assert pool.page_bytes == 131_072
    assert blocks == (USABLE - 54_018_692_608) // (131_072 * 10) == 17_769
    assert "17769 blocks of 16 tokens shared by 7 KV cache groups of 10 layers" in why


def test_gpt_oss_120b_pool():
    # 18 full + 18 sliding (window 128): group_size 18, 2 groups; page = 16 x 2 x 8 x 64 x 2 = 32,768 B
    model = model_spec("gpt-oss-120b")
    blocks, _, pool = hybrid_kv_blocks(model, gpu_spec("h100"), 16, 1)
    assert (pool.group_size, pool.full_groups, len(pool.groups), pool.padding) == (18, 1, 1, 0)
    assert blocks == (USABLE - 65_190_340_224) // (32_768 * 18) == 20_546


def test_group_size_rule_takes_the_largest_when_close():
    # vLLM: max < 1.5 x min -> group_size = max (12 sw + 13 full -> 13, one padding layer)
    from dynlab.kv.groups import _group_size
    assert _group_size([12, 13]) == 13
    assert _group_size([10, 52]) == 10
    assert _group_size([18, 18]) == 18


def _manager(name, capacity=100_000):
    layout = hybrid_pool(model_spec(name), 16, 1)
    return HybridKvCacheManager(capacity, 16, layout)


def _prefilled(kv, tokens):
    req = EngineRequest("r", 0.0, tokens, 2, list(range(tokens // 16)))
    kv.sequence(req)
    req.keys = kv.allocate_new(req, 0, tokens)
    kv.name_blocks(req, tokens)
    req.computed = req.nreg = tokens
    kv.allocate_slots(req, tokens)  # the next allocation frees what left the window
    return req


@pytest.mark.parametrize("name, tokens, held", [
    # full: ceil(T/16); window W: ceil(T/16) - max(0, T - W + 1) // 16
    ("gemma-3-27b", 8192, [512] + [512 - (8192 - 1023) // 16] * 6),   # 512 + 6 x 64 = 896
    ("gemma-3-27b", 400, [25] * 7),                                     # 400 < 1024: all kept
    ("gemma-3-1b", 8192, [512] + [512 - (8192 - 511) // 16] * 6),      # 512 + 6 x 32 = 704
    ("gemma-3-1b", 400, [25] * 7),
    ("gpt-oss-120b", 8192, [512, 512 - (8192 - 127) // 16]),          # 512 + 8 = 520
    ("gpt-oss-120b", 400, [25, 25 - (400 - 127) // 16]),              # 25 + 8 = 33
])
def test_blocks_held_after_prefill(name, tokens, held):
    kv = _manager(name)
    req = _prefilled(kv, tokens)
    assert kv.held_blocks(req) == held
    assert kv.used_blocks == sum(held)
    kv.check([req.keys])


def test_window_frees_blocks_during_decode():
    # gpt-oss (window 128): a 128-token prompt holds 8 window blocks; block 0 leaves the window once
    # 143 tokens are computed ((143 - 127) // 16 = 1), block 1 at 159
    kv = _manager("gpt-oss-20b")
    req = _prefilled(kv, 128)
    assert kv.held_blocks(req) == [8, 8]
    seen = []
    for t in range(129, 161):
        assert kv.allocate_slots(req, t)
        req.computed = t
        seen.append((t, kv.held_blocks(req)[1], kv.used_blocks))
    # allocate_slots(req, t) runs at t - 1 computed: window table ceil(t / 16), skipped (t - 1 - 127) // 16
    by_t = {t: (held, used) for t, held, used in seen}
    assert by_t[143] == (9, 18)   # 142 computed: nothing out of the window yet
    assert by_t[144] == (8, 17)   # 143 computed: block 0 freed
    assert by_t[145] == (9, 19)   # a 10th block in both groups, 9 window blocks held
    assert by_t[160] == (8, 18)   # 159 computed: blocks 0-1 freed
    kv.free(req)
    assert kv.used_blocks == 0
    kv.check([])


def test_prefix_hit_limited_by_the_window():
    # block 4 tokens, window 8: a hit of h blocks needs the window group's blocks skipped(4h) .. h-1,
    # skipped(c) = max(0, c - 7) // 4
    layout = HybridPool((SlidingWindowGroup(4, 8),), 1, 1, 1.0, {"full": 1, "sliding_window": 1}, 0)
    kv = HybridKvCacheManager(100, 4, layout)
    a = EngineRequest("a", 0.0, 25, 1, [11, 12, 13, 14, 15, 16])
    kv.sequence(a)
    a.keys = kv.allocate_new(a, 0, 25)
    kv.pool.register(a.keys, a.seq, 0, 6)                      # the full group: all 6 named
    kv.pool.register(kv.tables[a][0][1], kv.seq_of(a, 0), 0, 4)  # the window group: blocks 0-3 only
    kv.free(a)
    b = EngineRequest("b", 0.0, 25, 1, [11, 12, 13, 14, 15, 16])
    kv.sequence(b)
    # h=6 needs window blocks 4,5 (missing); h=5 needs 3,4 (4 missing); h=4 needs 2,3: cached
    assert kv.find_cached_prefix(b) == (4, 0)
    b.keys = kv.allocate_new(b, 4, 25)
    assert kv.held_blocks(b) == [7, 7 - 2]                     # window table starts at skipped(16) = 2
    kv.check([b.keys])


def test_pd_reserve_and_transfer_of_a_sliding_window_model():
    # decode side reserves what is resident after 8,192 tokens: 512 full + 8 window blocks (gpt-oss-120b)
    model = model_spec("gpt-oss-120b")
    kv = _manager("gpt-oss-120b")
    req = EngineRequest("r", 0.0, 8192, 4, list(range(512)))
    assert kv.reserve(req, 0.0, 8192) == 0
    assert kv.used_blocks == 520
    req.computed = 8192
    kv.receive(req)
    assert kv.held_blocks(req) == [512, 8]
    kv.check([req.keys])
    # bytes sent: (8192 + 128) tokens x 36,864 B (18 layers x 2,048 B) = 306,708,480 B, half of every token's KV
    assert transfer_bytes(model.kv_groups, 8192) == 8320 * 36_864 == 306_708_480
    assert 8192 * model.kv_bytes_per_token == 603_979_776
    # gemma-3-1b (issue 25's 208.0 MiB): 8192 x 4,096 + 512 x 22,528 = 45,088,768 B (43.0 MiB)
    assert transfer_bytes(model_spec("gemma-3-1b").kv_groups, 8192) == 45_088_768
    # a decode-side hit of 8,000 tokens: 192 full tokens and min(192, 128) window tokens
    assert transfer_bytes(model.kv_groups, 8192, 8000) == (192 + 128) * 36_864


def test_trace_blocks_refused_by_the_manager():
    # a pool working on runs is not modelled with KV cache groups (the engine set-up gives them the plain
    # pool on mapped names: test_kv_groups_trace_blocks.py)
    layout = hybrid_pool(model_spec("gpt-oss-20b"), 16, 1)
    with pytest.raises(ValueError, match="trace blocks"):
        HybridKvCacheManager(100, 16, layout, runs=True)


# -- properties: a worker over KV cache groups --------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dynlab.engine.worker import EngineWorker  # noqa: E402
from dynlab.kv.groups import ChunkedLocalGroup  # noqa: E402
from test_worker import Linear, run, workloads  # noqa: E402


class _OwnNames:
    """A pool whose ``cached()`` leaves out the extra groups' names (what the KV events carry)."""

    def __init__(self, pool):
        self._pool = pool

    def __getattr__(self, name):
        return getattr(self._pool, name)

    def cached(self):
        return {n for n in self._pool.cached() if n < GROUP_NAME_STRIDE}


def _layout(block, window, chunked):
    group = ChunkedLocalGroup(block, window) if chunked else SlidingWindowGroup(block, window)
    return HybridPool((group,), 1, 1, 1.0, {"full": 1, group.kind: 1}, 0)


@settings(max_examples=60)
@given(workloads(), st.integers(1, 12), st.booleans())
def test_worker_over_groups_keeps_its_invariants(wl, window, chunked):
    block, capacity, budget, seqs, betas, specs = wl
    w = EngineWorker(0, 2 * capacity, block, Linear(*betas), max_num_batched_tokens=budget, max_num_seqs=seqs,
                     kv_layout=_layout(block, window, chunked))
    w.pool = _OwnNames(w.pool)  # the KV events name the full group's blocks only
    reqs = [EngineRequest(i, float(a), inp, out, names) for i, (a, inp, out, names) in enumerate(specs)]
    results = run(w, reqs, check=True)
    finished = sorted(r.id for res in results for r, _ in res.finished)
    assert finished == sorted(r.id for r in reqs if not r.rejected)  # every admitted request finishes once
    assert w.used_blocks == 0 and w.kv.tables == {}
    for r in reqs:  # a hit never exceeds what the full group alone could give
        assert r.rejected or r.hit_tokens <= (r.input_length - 1) // block * block


def _simulate_groups(wl, window, chunked, bulk):
    block, capacity, budget, seqs, betas, specs = wl
    w = EngineWorker(0, 2 * capacity, block, Linear(*betas), max_num_batched_tokens=budget, max_num_seqs=seqs,
                     kv_layout=_layout(block, window, chunked), bulk=bulk)
    w.cross_boundaries = True  # as TimedFleet sets it: a run over KV cache groups still never crosses one
    w.pool = _OwnNames(w.pool)
    reqs = [EngineRequest(i, float(a), inp, out, names) for i, (a, inp, out, names) in enumerate(specs)]
    return w, reqs, run(w, reqs, check=True)


@settings(max_examples=80)
@given(workloads(), st.integers(1, 12), st.booleans())
def test_bulk_decode_over_groups_equals_step_by_step(wl, window, chunked):
    ws, rs, _ = _simulate_groups(wl, window, chunked, bulk=False)
    wb, rb, res = _simulate_groups(wl, window, chunked, bulk=True)
    assert (ws.preemptions, ws.rejected, ws.steps, ws.peak_used_blocks) == (wb.preemptions, wb.rejected, wb.steps,
                                                                             wb.peak_used_blocks)
    assert math.isclose(ws.used_block_ms(), wb.used_block_ms(), rel_tol=1e-9)
    for a, b in zip(rs, rb):
        assert (a.rejected, a.preemptions, a.hit_tokens) == (b.rejected, b.preemptions, b.hit_tokens)
        for x, y in ((a.first_token_ms, b.first_token_ms), (a.finish_ms, b.finish_ms)):
            assert (x is None) == (y is None) and (x is None or math.isclose(x, y, rel_tol=1e-9))


def test_a_bulk_run_stops_where_a_window_block_leaves():
    # gpt-oss-20b layout (window 128, 16-token blocks), one request decoding from 200 computed tokens:
    # its full group holds ceil(201 / 16) = 13 blocks (208 slots: 8 tokens); the window frees its next
    # block at 127 + 16 x (skipped(200) + 1) = 127 + 16 x 5 = 207, 7 tokens on: the run is 7 steps
    kv = _manager("gpt-oss-20b")
    req = _prefilled(kv, 200)
    assert kv.allocate_slots(req, 201)
    assert kv.free_slots_of([(req, 1)]) == [7]
    assert kv.extra[0].next_drop(200) == 207 and kv.extra[0].skipped(207) == kv.extra[0].skipped(200) + 1


def test_window_blocks_never_exceed_window_plus_a_block():
    # a long decode of a gpt-oss-20b layout (window 128): the window group holds at most
    # ceil(t / 16) - (t - 1 - 127) // 16 <= 9 blocks, whatever the length
    kv = _manager("gpt-oss-20b")
    req = _prefilled(kv, 2048)
    for t in range(2049, 3000):
        assert kv.allocate_slots(req, t)
        req.computed = t
        assert kv.held_blocks(req)[1] <= 9
    assert kv.held_blocks(req)[0] == -(-2999 // 16)


def test_pd_transfer_of_a_sliding_window_model_through_the_command(tmp_path):
    # gpt-oss-120b, one 8,192-token request (output 10), linear beta0=10 beta1=0.01 beta2=1, 50 GB/s:
    # the prefill 10 + 0.01 x 8192 = 91.92 ms (ttft_prefill_ms); bytes (8192 + 128) x 36,864 = 306,708,480
    # (every token's KV would be 603,979,776) in 6.1341696 ms; 9 decode steps of 11 ms, the first ending the
    # user's TTFT at 91.92 + 6.1341696 + 11 = 109.0541696 ms: E2E 197.0541696 ms. The decode side holds
    # 520 blocks on receipt (512 full + 8 window), 522 at its peak (513 full + 9: the window group's table
    # of 513 entries, 504 skipped); the prefill side 1,024 (the prompt in one chunk, before any is freed).
    # Every overhead term off: the times are the linear model's alone
    from helpers import invoke, terms_off_args

    trace = tmp_path / "one.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "tokens": list(range(8192)), "output_length": 10}) + "\n")
    result = invoke("sim", "--trace", str(trace), "--timing", "--prefill-workers", "1", "--decode-workers", "1",
                    "--model", "gpt-oss-120b", "--link-gbps", "50", "--latency-model", "linear",
                    "--latency-opt", "beta0=10", "--latency-opt", "beta1=0.01", "--latency-opt", "beta2=1",
                    *terms_off_args("linear"))
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["transfer_bytes"] == 306_708_480
    assert out["ttft_ms"]["p50"] == 109.1 and out["transfer_ms"]["p50"] == 6.1 and out["e2e_ms"]["p50"] == 197.1
    assert out["ttft_prefill_ms"]["p50"] == 91.9
    assert out["kv_blocks"] == 20_546 and out["peak_kv_blocks"] == [1024, 522]
    assert "shared by 2 KV cache groups of 18 layers" in out["kv_blocks_source"]


def test_bulk_runs_engage_over_groups():
    # one 200-token prompt decoding 100 tokens, window 128 in 16-token blocks: 100 steps, but runs stop
    # only at the full group's boundaries and the window's drops (both every 16 tokens): far fewer batches
    lat = Linear()
    w = EngineWorker(0, 1000, 16, lat, kv_layout=_layout(16, 128, False))
    w.pool = _OwnNames(w.pool)
    r = EngineRequest("r", 0.0, 200, 100, list(range(12)))
    run(w, [r], check=True)
    assert w.steps == 100 and len(lat.batches) < 30
    assert r.finish_ms == pytest.approx(10 + 0.01 * 200 + 99 * 11)
