"""EngineWorker: hand-computed timings, a hand-derived preemption case, and properties over random workloads."""
from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import published
from dynlab.engine.names import engine_block_names
from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.latency.base import LatencyModel, StepBatch
from dynlab.routing.hashing import block_hashes


class Linear(LatencyModel):
    """step_ms = beta0 + beta1 * sum(prefill_tokens) + beta2 * decode_requests (a test double)."""

    name = "test-linear"

    def __init__(self, beta0=10.0, beta1=0.01, beta2=1.0):
        super().__init__(None, {})
        self.b0, self.b1, self.b2 = beta0, beta1, beta2
        self.batches = []

    def step_ms(self, batch: StepBatch) -> float:
        self.batches.append(batch)
        return self.b0 + self.b1 * sum(batch.prefill_tokens) + self.b2 * batch.decode_requests

    def decode_ms(self, requests, context, steps):
        return steps * (self.b0 + self.b2 * requests)


def run(worker, requests, check=False):
    """A minimal event loop: at each time, finish the step ending then, submit arrivals, then start a step
    (or cross the bulk run's block boundary at that time, as TimedFleet does when ``worker.cross_boundaries``).

    ``requests`` are EngineRequests in arrival order. Returns the StepResults.
    """
    results = []
    i, n = 0, len(requests)
    copies = Counter()  # name -> cached copies, as a subscriber counting the events sees them (vLLM 0.33.0)
    while True:
        end = worker.step_end
        arrival = requests[i].arrival_ms if i < n else math.inf
        if end is None and arrival == math.inf:
            break
        bound = worker.next_boundary
        if bound is not None and bound < arrival and bound < end:
            removed = worker.cross_boundary()  # in res.removed too: the model follows at the run's end
            if check:
                worker.check()
                assert set(removed) <= {name for name, c in copies.items() if c > 0}
            continue
        if end is not None and end <= arrival:
            now = end
            res = worker.finish_step()
            results.append(res)
            copies.subtract(res.removed)  # published at res.start
            copies.update(res.stored)  # published at res.end
            if check:
                worker.check()
                assert {name for name, c in copies.items() if c > 0} == published(worker.pool)
                assert worker.used_blocks + worker.pool.num_free == worker.capacity
        else:
            now = arrival
            worker.submit(requests[i], now)
            i += 1
        nxt_end = worker.step_end
        if (nxt_end is not None and nxt_end <= now) or (i < n and requests[i].arrival_ms == now):
            continue  # more events at this time first
        if worker.step_end is None and not worker.idle:
            assert worker.start_step(now) is not None
    assert worker.idle
    return results


def req(rid, arrival, input_length, output_length, names=None, block=16):
    if names is None:
        names = [rid * 100_000 + j for j in range(input_length // block)]
    return EngineRequest(rid, arrival, input_length, output_length, names)


@pytest.mark.parametrize("bulk", [True, False])
def test_single_request_ttft_e2e_tpot(bulk):
    w = EngineWorker(0, 10_000, 16, Linear(), bulk=bulk)
    r = req(0, 0.0, 1000, 10)
    run(w, [r], check=True)
    assert r.first_token_ms == pytest.approx(20.0)  # 10 + 0.01 * 1000
    assert r.finish_ms == pytest.approx(119.0)  # 20 + 9 decode steps x 11
    assert (r.finish_ms - r.first_token_ms) / 9 == pytest.approx(11.0)
    assert r.hit_tokens == 0 and r.queue_wait_ms == 0.0
    assert w.steps == 10 and w.used_blocks == 0
    assert w.peak_used_blocks == 63 + 1  # 1000 prompt + 9 computed output tokens = 1009 tokens
    if bulk:
        assert len(w.latency.batches) < 10  # decode steps were advanced in bulk


def test_chunked_prefill_three_chunks():
    lat = Linear()
    w = EngineWorker(0, 10_000, 16, lat, max_num_batched_tokens=4096)
    r = req(0, 0.0, 10_000, 1)
    results = run(w, [r], check=True)
    assert [b.prefill_tokens for b in lat.batches] == [(4096,), (4096,), (1808,)]
    assert [b.prefill_context for b in lat.batches] == [(0,), (4096,), (8192,)]
    assert r.first_token_ms == pytest.approx(130.0)  # 3 x 10 + 0.01 x 10000
    assert r.finish_ms == r.first_token_ms  # output 1: the first token finishes it
    # blocks are registered by the chunk completing them: 256, 256, then 625 - 512 = 113
    assert [len(x.stored) for x in results] == [256, 256, 113]


def token_names(n_tokens, block=16, seed=7):
    return block_hashes([seed * 10_000 + t for t in range(n_tokens)], block)


def test_same_prompt_after_finish_hits_all_but_last_block():
    lat = Linear()
    w = EngineWorker(0, 10_000, 16, lat)
    names = token_names(1008)
    a = EngineRequest("a", 0.0, 1008, 2, names)
    b = EngineRequest("b", 1000.0, 1008, 2, names)
    run(w, [a, b], check=True)
    assert a.hit_tokens == 0
    assert b.hit_tokens == 992  # 62 of 63 blocks: at most 1007 tokens can hit
    assert lat.batches[-2].prefill_tokens == (16,) and lat.batches[-2].prefill_context == (992,)
    assert b.first_token_ms - b.arrival_ms == pytest.approx(10 + 0.01 * 16)


def test_identical_prompts_in_one_step_share_blocks():
    lat = Linear()
    w = EngineWorker(0, 10_000, 16, lat)
    names = token_names(1008)
    a = EngineRequest("a", 0.0, 1008, 1, names)
    b = EngineRequest("b", 0.0, 1008, 1, names)
    results = run(w, [a, b], check=True)
    assert b.hit_tokens == 992  # the first one's blocks are registered when scheduled
    assert lat.batches[0].prefill_tokens == (1008, 16)
    # b's 63rd block is a second copy of a's: cached and stored again (vLLM 0.33.0's cache_full_blocks)
    assert results[0].stored == tuple(names) + (names[-1],)
    assert len(w.pool.copies.of[names[-1]]) == 2 and w.pool.lookup(names, 63) == 63  # both free, cached
    assert a.first_token_ms == b.first_token_ms


def test_rejected_at_submit():
    w = EngineWorker(0, 4, 4, Linear())
    assert not w.submit(req(0, 0.0, 16, 2, block=4), 0.0)  # 17 tokens > 16
    assert w.submit(req(1, 0.0, 16, 1, block=4), 0.0)  # 16 tokens fit
    assert w.rejected == 1


def test_names_must_match_length():
    w = EngineWorker(0, 10, 16, Linear())
    with pytest.raises(ValueError):
        w.submit(EngineRequest(0, 0.0, 40, 1, [1]), 0.0)
    with pytest.raises(ValueError):
        EngineRequest(0, 0.0, 40, 0, [1, 2])


@pytest.mark.parametrize("bulk", [True, False])
def test_preemption_by_hand(bulk):
    """block 4, 6 blocks; A and B: 8-token prompts (2 blocks), 9 outputs (16 tokens = 4 blocks at most).

    beta0=10, beta1=0.01, beta2=1.
    - step 1 at 0: both admitted (2 + 2 blocks), prefill 8 + 8: 10.16 ms -> first tokens at 10.16.
    - step 2: each decode needs a 3rd block (9 tokens): 6 used; 12 ms -> 22.16. Steps 3-5: no new block
      (10..12 tokens), 3 x 12 ms -> 58.16; computed 12, 5 tokens generated each.
    - step 6 at 58.16: A needs a 4th block, none free -> preempt the last running, B (its 3 blocks go
      to the free-queue tail: output block, 12, 11). A takes B's unnamed output block. Nothing is
      admitted in a step with a preemption. A decodes alone: 11 ms -> 69.16.
    - steps 7-9: B (13 tokens, hits 11 and 12 = 8 tokens) needs 2 new blocks + its 2 cached free ones,
      only 2 free: not admitted. A decodes 3 steps (11 ms each) and finishes at 102.16 (9 tokens).
    - step 10 at 102.16: B re-admitted, hits 8 tokens, recomputes 5 (prefill chunk 5 at context 8):
      10.05 ms -> 112.21, emitting its 6th token; then 3 decodes of 11 ms: finishes at 145.21.
    """
    lat = Linear()
    w = EngineWorker(0, 6, 4, lat, bulk=bulk)
    a = EngineRequest("A", 0.0, 8, 9, [1, 2])
    b = EngineRequest("B", 0.0, 8, 9, [11, 12])
    results = run(w, [a, b], check=True)
    assert a.first_token_ms == pytest.approx(10.16) and b.first_token_ms == pytest.approx(10.16)
    assert a.finish_ms == pytest.approx(102.16)
    assert b.finish_ms == pytest.approx(145.21)
    assert (a.preemptions, b.preemptions, w.preemptions) == (0, 1, 1)
    assert b.hit_tokens == 0  # the first lookup only
    assert [r.preempted for r in results].count(1) == 1
    assert StepBatch((5,), (8,), 0, 0) in lat.batches
    assert w.steps == 13


def test_bulk_run_is_interrupted_by_a_new_request():
    lat = Linear(10.0, 0.01, 1.0)
    w = EngineWorker(0, 10_000, 16, lat)
    a = req(0, 0.0, 1000, 10)
    assert w.start_step(0.0) is None
    w.submit(a, 0.0)
    assert w.start_step(0.0) == pytest.approx(20.0)
    w.finish_step()
    assert w.start_step(20.0) == pytest.approx(20.0 + 8 * 11)  # 8 decodes up to the block boundary
    b = req(1, 45.0, 100, 1)
    w.submit(b, 45.0)  # cut at the first boundary >= 45: 20 + 3 x 11 = 53
    assert w.step_end == pytest.approx(53.0)
    res = w.finish_step()
    assert res.steps == 3 and a.generated == 4
    w.start_step(53.0)
    assert lat.batches[-1] == StepBatch((100,), (0,), 1, 1004)


def _crossing_worker_after_prefill():
    """A worker whose driver crosses block boundaries, and its request (1,000 prompt tokens, 10 out) just
    prefilled: the step took 10 + 0.01 x 1000 = 20 ms (linear model)."""
    w = EngineWorker(0, 10_000, 16, Linear(10.0, 0.01, 1.0))
    w.cross_boundaries = True
    a = req(0, 0.0, 1000, 10)
    w.submit(a, 0.0)
    assert w.start_step(0.0) == pytest.approx(20.0)
    w.finish_step()
    return w, a


def test_bulk_run_goes_on_across_a_block_boundary_when_nothing_waits():
    w, a = _crossing_worker_after_prefill()
    # 9 decodes to the finish (output 10: the prefill step emitted the first token), each 10 + 1 x 1 ms;
    # the run goes on across the block boundary of step 8 (which computes token 1008 = 63 x 16: a 64th block)
    assert w.start_step(20.0) == pytest.approx(20.0 + 9 * 11)
    assert w.next_boundary == pytest.approx(20.0 + 8 * 11) and len(a.keys) == 63
    assert w.cross_boundary() == () and len(a.keys) == 64 and w.next_boundary is None
    res = w.finish_step()
    assert res.steps == 9 and a.finish_ms == pytest.approx(119.0)


def test_a_new_request_cuts_a_run_before_its_boundaries():
    w, a = _crossing_worker_after_prefill()
    w.start_step(20.0)
    b = req(1, 45.0, 100, 1)
    w.submit(b, 45.0)  # cut at the first step boundary >= 45: 20 + 3 x 11 = 53, before the block boundary
    assert w.step_end == pytest.approx(53.0) and w.next_boundary is None  # step 8 is a later run's
    res = w.finish_step()
    assert res.steps == 3 and a.generated == 4 and len(a.keys) == 63


# -- names --------------------------------------------------------------------------------

def test_names_identity_and_errors():
    assert engine_block_names([5, 6, 7], 40, 16, 16) == [5, 6]
    assert engine_block_names([5, 6, 7], 1100, 512, 16)[:2] == [5 * 1024, 5 * 1024 + 1]
    assert len(engine_block_names([5, 6, 7], 1100, 512, 16)) == 68
    with pytest.raises(ValueError):
        engine_block_names([5, 6], 1100, 512, 16)  # 1100 tokens need 3 trace blocks
    with pytest.raises(ValueError):
        engine_block_names([1], 10, 1023, 1)


@settings(max_examples=200)
@given(st.integers(1, 64), st.integers(1, 64), st.lists(st.integers(0, 2), min_size=1, max_size=12),
       st.lists(st.integers(0, 2), min_size=1, max_size=12), st.data())
def test_names_share_iff_trace_prefix_agrees(trace_block, block, path_a, path_b, data):
    # prefix-chained trace ids: the id of trace block t is the id of the path up to t
    ids = {}

    def chain(path):
        return [ids.setdefault(tuple(path[:t + 1]), len(ids)) for t in range(len(path))]

    ha, hb = chain(path_a), chain(path_b)
    la = data.draw(st.integers(0, len(ha) * trace_block))
    lb = data.draw(st.integers(0, len(hb) * trace_block))
    na = engine_block_names(ha, la, trace_block, block)
    nb = engine_block_names(hb, lb, trace_block, block)
    assert len(na) == la // block and len(nb) == lb // block
    assert len(set(na)) == len(na)
    for j in range(min(len(na), len(nb))):
        t = ((j + 1) * block - 1) // trace_block
        assert (na[j] == nb[j]) == (path_a[:t + 1] == path_b[:t + 1])


# -- properties over random workloads ------------------------------------------------------

@st.composite
def workloads(draw):
    block = draw(st.integers(1, 4))
    capacity = draw(st.integers(1, 30))
    budget = draw(st.integers(1, 40))
    seqs = draw(st.integers(1, 5))
    betas = (draw(st.sampled_from([1.0, 2.0, 8.0])), draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])),
             draw(st.sampled_from([0.0, 1.0, 2.0])))
    specs = []
    for i in range(draw(st.integers(1, 12))):
        arrival = draw(st.integers(0, 120))
        inp = draw(st.integers(1, 40))
        out = draw(st.integers(1, 12))
        family, shared = draw(st.integers(0, 2)), draw(st.integers(0, 40))
        tokens = [family * 1000 + t if t < shared else 10**6 + i * 1000 + t for t in range(inp)]
        specs.append((arrival, inp, out, tuple(block_hashes(tokens, block))))
    specs.sort(key=lambda s: s[0])
    return block, capacity, budget, seqs, betas, specs


def simulate(wl, bulk, check=False, cross=False):
    block, capacity, budget, seqs, betas, specs = wl
    lat = Linear(*betas)
    w = EngineWorker(0, capacity, block, lat, max_num_batched_tokens=budget, max_num_seqs=seqs, bulk=bulk)
    w.cross_boundaries = cross
    reqs = [EngineRequest(i, float(a), inp, out, names) for i, (a, inp, out, names) in enumerate(specs)]
    results = run(w, reqs, check=check)
    return w, reqs, results


@settings(max_examples=300)
@given(workloads(), st.booleans())
def test_step_by_step_equals_bulk(wl, cross):
    ws, rs, _ = simulate(wl, bulk=False, check=True)
    wb, rb, _ = simulate(wl, bulk=True, check=True, cross=cross)
    assert (ws.preemptions, ws.rejected) == (wb.preemptions, wb.rejected)
    assert ws.steps == wb.steps and ws.peak_used_blocks == wb.peak_used_blocks
    assert math.isclose(ws.used_block_ms(), wb.used_block_ms(), rel_tol=1e-9)
    for a, b in zip(rs, rb):
        assert (a.rejected, a.preemptions, a.hit_tokens) == (b.rejected, b.preemptions, b.hit_tokens)
        for x, y in ((a.first_token_ms, b.first_token_ms), (a.finish_ms, b.finish_ms),
                     (a.first_scheduled_ms, b.first_scheduled_ms)):
            assert (x is None) == (y is None)
            assert x is None or math.isclose(x, y, rel_tol=1e-9)


@settings(max_examples=200)
@given(workloads(), st.booleans())
def test_requests_finish_once_and_timings_are_sane(wl, bulk):
    w, reqs, results = simulate(wl, bulk, check=True, cross=bulk)
    finished = [r.id for res in results for r, _ in res.finished]
    firsts = [r.id for res in results for r, _ in res.first_tokens]
    done = sorted(r.id for r in reqs if not r.rejected)
    assert sorted(finished) == done and sorted(firsts) == done  # exactly once each
    assert w.rejected == sum(r.rejected for r in reqs)
    assert w.preemptions == sum(r.preemptions for r in reqs)
    assert sum(res.preempted for res in results) == w.preemptions
    b0, b1, _ = w.latency.b0, w.latency.b1, w.latency.b2
    for r in reqs:
        if r.rejected:
            assert r.finish_ms is None and r.first_token_ms is None
            continue
        assert r.arrival_ms <= r.first_scheduled_ms <= r.first_token_ms <= r.finish_ms
        assert r.generated == r.output_length and r.num_tokens == r.input_length + r.output_length
        assert 0 <= r.hit_tokens < r.input_length and r.hit_tokens % w.block == 0
        # its own prefill alone takes at least this long (a preempted request may later hit
        # blocks another request computed, so only the fixed step cost bounds it)
        own = b0 + (b1 * (r.input_length - r.hit_tokens) if not r.preemptions else 0.0)
        assert r.first_token_ms - r.arrival_ms >= own - 1e-9
    assert w.used_blocks == 0 and w.used_block_ms() >= 0


@settings(max_examples=50)
@given(workloads(), st.booleans())
def test_same_inputs_same_results(wl, bulk):
    _, _, r1 = simulate(wl, bulk)
    _, _, r2 = simulate(wl, bulk)
    key = lambda res: [(x.start, x.end, x.steps, x.stored, x.removed, [(r.id, t) for r, t in x.finished],
                        [(r.id, t) for r, t in x.first_tokens], x.preempted, x.used_blocks) for x in res]
    assert key(r1) == key(r2)


def test_random_workloads_do_preempt():
    # the property tests above are only as good as their cases: make sure preemption is exercised
    specs = [(0, 30, 12, tuple(range(100 * i, 100 * i + 15))) for i in range(4)]
    w, reqs, _ = simulate((2, 30, 40, 5, (1.0, 0.25, 1.0), specs), bulk=True, check=True)
    assert w.preemptions > 0 and all(r.finish_ms is not None for r in reqs)


@pytest.mark.parametrize("bulk", [True, False])
def test_no_admission_in_a_step_with_a_preemption(bulk):
    """block 4, 12 blocks, budget 8. V and A: 3-token prompts (no full block, no names), 40 outputs.

    They decode in lock step, taking a block every 4 tokens, 6 blocks each when the pool is full.
    V (first in running order) then needs a 7th block: A, the last, is preempted (frees 6, all full
    and named: generated tokens' blocks are cached, vLLM 0.33.0). V takes one: 5 free. Nothing is
    admitted in a step with a preemption; A (hitting its 5 surviving blocks, 25 tokens) re-enters in a
    later step (at the default admission, once ceil(25 / 4) = 7 blocks minus 0 in use are free: when
    V frees its blocks... or earlier, as blocks allow) with a prefill chunk.
    """
    lat = Linear()
    w = EngineWorker(0, 12, 4, lat, max_num_batched_tokens=8, bulk=bulk)
    v = EngineRequest("V", 0.0, 3, 40, [])
    a = EngineRequest("A", 0.0, 3, 40, [])
    results = run(w, [v, a], check=True)
    k = next(i for i, r in enumerate(results) if r.preempted)
    assert results[k].preempted == 1 and results[k].batch_size == 1 and results[k].decode_requests == 1
    back = next(r for r in results[k + 1:] if r.prefill_tokens)
    assert back.start > results[k].start
    assert v.preemptions == 0 and a.preemptions >= 1  # V keeps growing: A is preempted again later
    assert v.finish_ms is not None and a.finish_ms is not None
