"""Speculative decoding on a model with KV cache groups (issue 43 item 2), by hand: the lookahead slots in
every group, the window's blocks of generated tokens, a window group's admission cap (its window tail plus
the tokens in flight, plus one block) and a sliding-window prefix hit under EAGLE's hash lookahead.

Each rule was confirmed against vLLM 0.33.0's own ``Scheduler`` over a ``HybridKVCacheCoordinator``
(``benchmarks/fidelity_spec.py``, its ``hybrid_cases()``: every request identical). Blocks of 16 tokens;
the linear step model beta0 = 10, beta1 = 1 (per prefill or draft token), beta2 = 2 (per decode) ms;
expected acceptance draws at 0.7 per token (a first verify of 2 drafts accepts int(0.7 + 0.49) = 1).
"""
from __future__ import annotations

import json

import pytest

from dynlab.engine.spec import Acceptance, SpecDecoding, parse_acceptance
from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.kv.groups import ChunkedLocalGroup, HybridPool, SlidingWindowGroup
from dynlab.kv.hybrid import HybridKvCacheManager
from tests.engine.test_kv_groups import _OwnNames
from tests.engine.test_worker import Linear, run


def _spec(method="eagle", k=2):
    return SpecDecoding(method, k, Acceptance(parse_acceptance("0.7", k), "expected"))


def _layout(window, chunked=False):
    group = ChunkedLocalGroup(16, window) if chunked else SlidingWindowGroup(16, window)
    return HybridPool((group,), 1, 1, 1.0, {"full": 1, group.kind: 1}, 0)


def _first_step_held(spec):
    w = EngineWorker(0, 64, 16, Linear(10, 1, 2), kv_layout=_layout(16), spec=spec)
    req = EngineRequest(0, 0.0, 31, 20, [1])
    w.submit(req, 0.0)
    w.start_step(0.0)
    return w, req, w.kv.held_blocks(req)


def test_the_lookahead_slots_are_taken_in_every_group():
    # window 16, EAGLE K = 2 (2 lookahead slots). A 31-token prompt's prefill allocates 31 + 2 = 33 slots:
    # ceil(33 / 16) = 3 blocks in the full group AND in the window group (nothing has left the window
    # before any token is computed); without speculation 31 slots: 2 blocks in each
    w, req, held = _first_step_held(_spec())
    assert held == [-(-(31 + 2) // 16)] * 2 == [3, 3]
    assert _first_step_held(None)[2] == [-(-31 // 16)] * 2 == [2, 2]
    # the verify step at 10 + 31 = 41 ms: computed 31, 1 sampled + 2 drafts = 3 tokens, slots to 31 + 3 + 2 = 36
    # (3 blocks); the window first frees what left it at computed 31: max(0, 31 - 16 + 1) // 16 = 1 block
    w.finish_step()
    w.start_step(41.0)
    assert w.kv.held_blocks(req) == [3, 3 - 1]
    assert w.used_blocks == 5


def test_the_window_drops_with_the_rejected_drafts_rolled_back():
    # window 32, EAGLE K = 2, a 40-token prompt (2 named blocks), 20 tokens out, one request: each verify
    # (3 tokens) frees the blocks that left the window at the computed count the last verify left, after
    # vLLM's roll-back of the rejected drafts; the window group never holds more than
    # ceil((computed + 3 + 2) / 16) - (computed - 31) // 16 blocks
    w = EngineWorker(0, 64, 16, Linear(10, 1, 2), kv_layout=_layout(32), spec=_spec())
    req = EngineRequest(0, 0.0, 40, 20, [1, 2])
    w.submit(req, 0.0)
    now = 0.0
    seen = []
    while not req.finish_ms:
        w.start_step(now)
        c = req.computed
        full, window = w.kv.held_blocks(req)
        seen.append((c, full, window))
        now = w.finish_step().end
    for c, full, window in seen[1:]:  # each verify: slots to c + 3 + 2
        assert full == -(-(c + 5) // 16)
        assert window == full - max(0, c - 31) // 16
    assert seen[1] == (40, 3, 3 - 0)  # (40 - 31) // 16 = 0: nothing left the window yet
    assert any(window < full for _, full, window in seen)  # the window did free blocks
    assert w.used_blocks == 0


def test_a_window_groups_admission_cap_is_its_tail_plus_the_tokens_in_flight_plus_one_block():
    # vLLM 0.33 SlidingWindowSpec.max_admission_blocks_per_request: ceil((W - 1 + in flight) / B) + 1,
    # the +1 for a window that starts inside a block (W = 4, B = 4: [xxCD][EF] holds the window CDEF)
    assert SlidingWindowGroup(16, 128).admission_cap(8192) == -(-(127 + 8192) // 16) + 1 == 521
    assert SlidingWindowGroup(4, 4).admission_cap(2) == -(-(3 + 2) // 4) + 1 == 3
    assert ChunkedLocalGroup(16, 8192).admission_cap(8192) == (8192 + 8192) // 16 == 1024  # no +1
    assert SlidingWindowGroup(16, 32).admission_cap(None) == float("inf")


@pytest.mark.parametrize("in_flight, admitted", [(16, True), (None, False)])
def test_the_whole_sequence_check_counts_a_window_group_up_to_its_cap(in_flight, admitted):
    # window 32, 16 tokens in flight: cap = ceil((31 + 16) / 16) + 1 = 4 blocks. 14 blocks, 4 held by
    # another request: 10 free. A 96-token prompt (6 blocks) admitted with a 15-token chunk needs, for its
    # whole sequence, 6 full + min(6, 4) window = 10 blocks: admitted; uncapped 6 + 6 = 12 > 10: waits
    kv = HybridKvCacheManager(14, 16, _layout(32), in_flight)
    other = EngineRequest(0, 0.0, 32, 1, [1, 2])
    kv.sequence(other)
    other.keys = kv.allocate_new(other, 0, 32)
    assert kv.used_blocks == 4 and kv.num_free == 10
    req = EngineRequest(1, 0.0, 96, 1, list(range(10, 16)))
    kv.sequence(req)
    keys = kv.allocate_new(req, 0, 15, reserve=96)
    assert (keys is not None) == admitted
    if admitted:  # only the chunk's blocks are taken: ceil(15 / 16) = 1 in each group
        req.keys = keys
        assert kv.held_blocks(req) == [1, 1] and kv.num_free == 8


def test_the_cap_admits_a_long_prompt_in_the_engine():
    # the same through the engine, budget 16 (the cap's tokens in flight), no speculation: A (16 + 20)
    # prefills at 0 (1 block each group), ends at 10 + 16 = 26; B (96 + 1) arrived at 1. At 26 A decodes
    # (17 slots: 2 blocks each group, 4 held, 10 free) and B is admitted with 15 tokens (whole sequence:
    # 6 + min(6, 4) = 10 blocks <= 10); uncapped it would wait for A's 20 tokens
    w = EngineWorker(0, 14, 16, Linear(10, 1, 2), max_num_batched_tokens=16, kv_layout=_layout(32))
    w.pool = _OwnNames(w.pool)  # the KV events name the full group's blocks only
    reqs = [EngineRequest(0, 0.0, 16, 20, [1]), EngineRequest(1, 1.0, 96, 1, list(range(10, 16)))]
    run(w, reqs, check=True)
    assert reqs[1].first_scheduled_ms == 26


def test_a_finished_requests_window_blocks_of_generated_tokens_go_to_the_tail():
    # window 16, 8 blocks, no speculation. A (32 + 18) holds 2 blocks per group after its prefill; its window
    # drops named block w0 at computed 32 ((32 - 15) // 16 = 1) and w1 at 47, to the tail: queue [w0 w1].
    # A finishes with 49 tokens computed: full blocks 0-2 (f0 f1 named, f2 of generated tokens), f3 partial;
    # its window holds w2 (generated tokens) and w3 (partial). vLLM hashed f2 and w2: they go to the tail
    # (unnamed here: no one can hit them), the partial f3 and w3 to the head:
    # queue [f3 w3 | w0 w1 f2 f1 f0 w2]. B (32 + 1) takes 2 blocks per group, 4 from the head: f3, w3,
    # then w0 and w1 are evicted. C (A's 32 prompt tokens + 16) finds f0 f1 in the full group, but a
    # 2-block hit needs w1 in the window ((32 - 15) // 16 = 1 .. 1), a 1-block hit w0: no hit at all.
    # (With w2 at the head, B would have taken f3 w2 w3 w0 and left w1: C would hit 32 tokens.)
    w = EngineWorker(0, 8, 16, Linear(10, 1, 2), kv_layout=_layout(16))
    w.pool = _OwnNames(w.pool)
    reqs = [EngineRequest(0, 0.0, 32, 18, [1, 2]), EngineRequest(1, 1000.0, 32, 1, [7, 8]),
            EngineRequest(2, 2000.0, 48, 1, [1, 2, 3])]
    run(w, reqs, check=True)
    assert [r.hit_tokens for r in reqs] == [0, 0, 0]


def _cached_then_evicted(kv):
    """A (96 tokens, names 1-6) prefilled in one chunk on ``kv`` (window 32: c = ceil(31 / 16) = 2 blocks before
    a hit), its window dropping blocks 0-3 at its next allocation ((96 - 31) // 16 = 4), then freed; then 3
    blocks allocated from the queue's head, which evicts window block 3 only. Returns ``kv``."""
    a = EngineRequest(0, 0.0, 96, 1, [1, 2, 3, 4, 5, 6])
    kv.sequence(a)
    a.keys = kv.allocate_new(a, 0, 96)
    kv.name_blocks(a, 96)
    a.computed = a.nreg = 96
    assert kv.allocate_slots(a, 97)  # queue: [w3 w2 w1 w0] (named, reversed); 7 full + 3 window blocks held
    kv.free(a)  # queue: [f6 w6 (unnamed, head) | w3 w2 w1 w0 | f5 .. f0 | w5 w4]
    assert kv.used_blocks == 0
    kv.pool.allocate(3)  # f6, w6, then w3: evicted
    return kv


@pytest.mark.parametrize("drop, hit", [(False, 6), (True, 2)])
def test_a_dropped_hit_needs_the_windows_tail_plus_one_block(drop, hit):
    # B: A's 96 tokens + 16 (112 tokens, 7 names). Without the drop: the cap is (112 - 1) // 16 = 6 blocks,
    # all cached in the full group, and the window's blocks before token 96, (96 - 31) // 16 = 4 .. 5: hit 6.
    # With it (vLLM's hybrid coordinator, use_eagle_block_drop): the full group matches up to B's whole
    # blocks, 112 // 16 = 7, finds 6 and drops one: 5; the window needs its tail before block h AND block
    # h (the tail + 1 rule, vLLM PR #44082): h = 5 needs window blocks 3-5 (3 evicted), h = 4 needs 2-4,
    # h = 3 needs 1-3, h = 2 needs 0-2: hit 2 blocks. (The tail alone would give 3: blocks 1-2.)
    kv = _cached_then_evicted(HybridKvCacheManager(14, 16, _layout(32), 16))
    kv.drop_last = drop
    b = EngineRequest(1, 0.0, 112, 1, [1, 2, 3, 4, 5, 6, 7])
    kv.sequence(b)
    assert kv.find_cached_prefix(b) == (hit, 0)


@pytest.mark.parametrize("tokens, names, one_group, groups", [(112, 7, 5, 5), (96, 6, 4, 5)])
def test_the_drop_in_one_group_and_over_groups(tokens, names, one_group, groups):
    # A's 6 blocks cached (nothing evicted in the window: capacity 28). One group (vLLM's unitary coordinator):
    # the usual cap (tokens - 1) // 16 blocks, the last dropped: 112 tokens: 6 - 1 = 5; 96 tokens (A's prompt
    # again): 95 // 16 = 5 - 1 = 4. Over groups the full group matches up to the request's whole blocks,
    # tokens // 16 (one block past the cap, its EAGLE margin), then drops: 6 - 1 = 5 both times; the window's
    # blocks 3-5 are cached
    from dynlab.kv.cache_manager import KvCacheManager

    for kv, want in ((KvCacheManager(28, 16), one_group), (HybridKvCacheManager(28, 16, _layout(32), 16), groups)):
        a = EngineRequest(0, 0.0, 96, 1, [1, 2, 3, 4, 5, 6])
        kv.sequence(a)
        a.keys = kv.allocate_new(a, 0, 96)
        kv.name_blocks(a, 96)
        a.computed = a.nreg = 96
        kv.free(a)
        kv.drop_last = True
        b = EngineRequest(1, 0.0, tokens, 1, list(range(1, names + 1)))
        kv.sequence(b)
        assert kv.find_cached_prefix(b) == (want, 0)


def _trace(tmp_path, rows):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _sim(tmp_path, trace, method, model):
    from click.testing import CliRunner

    from dynlab.cli import main

    out = tmp_path / f"{method}.jsonl"
    r = CliRunner().invoke(main, ["sim", "--timing", "--workers", "1", "--mode", "rr", "--trace", trace,
                                  "--trace-format", "tokens", "--block", "16", "--capacity", "256", "--model", model,
                                  "--latency-model", "linear", "--latency-opt", "beta0=10", "--latency-opt",
                                  "beta1=1", "--latency-opt", "beta2=2", "--spec-method", method,
                                  "--spec-tokens", "3", "--spec-acceptance", "0.7", "--spec-draws", "expected",
                                  "--requests-out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("method, hit", [("eagle3", 272), ("ngram", 288)])
def test_a_window_models_prefix_hit_under_the_hash_lookahead(tmp_path, method, hit):
    # gpt-oss-120b (window 128): a 288-token prompt (18 whole blocks), then the same 288 tokens + 16 more.
    # ngram names the first request's 18 blocks: the second hits 18 blocks (its cap is (304 - 1) // 16 = 18)
    # in the full group, and the window group has the 8 blocks before token 288, (288 - 127) // 16 = 10
    # .. 17 (blocks 0-9 left the window after the prefill, named: still cached): 288 tokens.
    # eagle3 names a block with the token after it: block 17 of the first request would need its token
    # 288, which that prompt lacks, so 17 blocks are named (the second request's block 17 covers token
    # 288 = 500): 17 blocks, the window's 9 .. 16 cached: 272 tokens
    shared = list(range(1, 289))
    rows = [{"timestamp": 0, "tokens": shared, "output_length": 3},
            {"timestamp": 1000, "tokens": shared + list(range(500, 516)), "output_length": 2}]
    recs = _sim(tmp_path, _trace(tmp_path, rows), method, "gpt-oss-120b")
    assert [r["hit_tokens"] for r in recs] == [0, hit]


@pytest.mark.parametrize("extra, says", [
    (["--cpu-capacity", "100"], "not modelled with a CPU tier"),
    (["--model", "llama-4-scout", "--tp", "4"], "vLLM 0.33 does not drop a hit's last block"),  # chunked local
])
def test_the_drop_is_refused_where_it_is_not_modelled(tmp_path, extra, says):
    from click.testing import CliRunner

    from dynlab.cli import main

    trace = _trace(tmp_path, [{"timestamp": 0, "tokens": list(range(1, 40)), "output_length": 4}])
    r = CliRunner().invoke(main, ["sim", "--timing", "--workers", "1", "--trace", trace, "--trace-format", "tokens",
                                  "--capacity", "1000", "--spec-method", "eagle", "--spec-tokens", "2",
                                  "--spec-hash-rule", "drop", "--quiet", *extra])
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output


# -- properties: speculation over KV cache groups -----------------------------------------------

from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.engine.test_worker import workloads  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(workloads(), st.integers(1, 12), st.booleans(), st.integers(1, 3), st.booleans())
def test_speculation_over_groups_keeps_the_workers_invariants(wl, window, chunked, k, drop):
    # any workload, window or chunk, K and hash rule: the pool stays consistent at every step (run's check:
    # every held key counted, the events as published), every admitted request finishes once, the pool
    # ends empty, and a hit is never longer than the full group alone allows (one block less with the drop)
    block, capacity, budget, seqs, betas, specs = wl
    assume(budget > k)
    spec = _spec("eagle", k)
    spec.drop_last = drop
    group = ChunkedLocalGroup(block, window) if chunked else SlidingWindowGroup(block, window)
    layout = HybridPool((group,), 1, 1, 1.0, {"full": 1, group.kind: 1}, 0)
    w = EngineWorker(0, 2 * capacity, block, Linear(*betas), max_num_batched_tokens=budget, max_num_seqs=seqs,
                     kv_layout=layout, spec=spec)
    w.pool = _OwnNames(w.pool)
    reqs = [EngineRequest(i, float(a), inp, out, names) for i, (a, inp, out, names) in enumerate(specs)]
    results = run(w, reqs, check=True)
    finished = sorted(r.id for res in results for r, _ in res.finished)
    assert finished == sorted(r.id for r in reqs if not r.rejected)
    assert w.used_blocks == 0 and w.kv.tables == {}
    for r in reqs:  # without the drop: (input - 1) // block blocks; with it: the whole blocks less the dropped one
        top = max(r.input_length // block - 1, 0) if drop else (r.input_length - 1) // block
        assert r.rejected or r.hit_tokens <= top * block
