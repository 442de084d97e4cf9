"""SGLang's scheduler (dynlab.engine.sglang, sglang 0.5.23) by hand, at a linear step model.

Every case drives one worker with the linear model ``beta0 + beta1 x prefill tokens + beta2 x decodes`` (ms;
server terms off), beta0 = 10, beta1 = 0.01, beta2 = 1, and derives the times in its comments.
"""
from __future__ import annotations

import pytest

from dynlab.engine.sglang.schedule_policy import NewTokenRatio
from dynlab.engine.sglang.worker import SglangWorker
from dynlab.engine.worker import EngineWorker

from sglang_helpers import linear, req, serve


def sglang(capacity, **kw):
    return SglangWorker(0, capacity, 16, linear(), **kw)


def test_prefill_and_decode_are_separate_passes():
    """scheduler.py get_next_batch_to_run: a prefill batch runs alone, the running batch waits for the next pass."""
    a, b = req(1, 160, 3), req(2, 320, 2, at=5.0)
    times = serve(sglang(1000), [(0.0, a), (5.0, b)])
    # A's prefill: 10 + 160 x 0.01 = 11.6 ms; B (arrived at 5) prefills alone: 10 + 3.2 = 13.2 -> 24.8, A does
    # not decode meanwhile; then one decode pass of both: 10 + 2 = 12 -> 36.8 (A's 2nd token, B's 2nd and last);
    # A alone: 10 + 1 -> 47.8, its 3rd token
    assert times[1] == pytest.approx((11.6, 47.8))
    assert times[2] == pytest.approx((24.8, 36.8))
    # vLLM (scheduler.py schedule): B's prefill and A's decode in one step: 10 + 3.2 + 1 = 14.2 -> 25.8; then both
    # decode: 12 -> 37.8 (A's 3rd token, B's 2nd)
    a, b = req(1, 160, 3), req(2, 320, 2, at=5.0)
    vllm = serve(EngineWorker(0, 1000, 16, linear()), [(0.0, a), (5.0, b)])
    assert vllm[1] == pytest.approx((11.6, 37.8)) and vllm[2] == pytest.approx((25.8, 37.8))


def test_mixed_chunk_decodes_inside_the_prefill_pass():
    """scheduler.py _get_new_batch_prefill_raw (is_mixed_chunk): the running requests decode in the prefill pass."""
    a, b = req(1, 160, 3), req(2, 320, 2, at=5.0)
    times = serve(sglang(1000, enable_mixed_chunk=True), [(0.0, a), (5.0, b)])
    # as vLLM: A prefills (11.6); B's 320 tokens and A's decode: 10 + 3.2 + 1 = 14.2 -> 25.8; both decode -> 37.8
    assert times[1] == pytest.approx((11.6, 37.8)) and times[2] == pytest.approx((25.8, 37.8))


def test_new_token_ratio_refuses_what_vllm_admits():
    """schedule_policy.py PrefillAdder.add_one_req: prompt + max_new + a page must fit below free + evictable less
    each running request's (max_new - generated) x new_token_ratio."""
    # 20 blocks of 16 = 320 tokens. A: 100 in, 150 out at 0; B: 110 in, 10 out at 1.
    a, b = req(1, 100, 150), req(2, 110, 10, at=1.0)
    w = sglang(20)
    times = serve(w, [(0.0, a), (1.0, b)])
    # at 11 (A's prefill: 10 + 1 = 11) A holds 100 tokens (6 cached blocks it locks + 4 own): 220 free, none
    # evictable; A reserves (150 - 1) x 0.7 = 104.3: 115.7 left, and B needs 110 + 10 + 1 = 121: refused
    # (batch_is_full). Each decode pass A grows a token while its reserve falls by 0.7 + 149 x decay (~0.85) at
    # most, so B waits for A's 149 decode passes of 11 ms: A ends at 11 + 149 x 11 = 1650; B prefills then
    # (10 + 1.1 -> 1661.1) and decodes 9 passes of 11 ms -> 1760.1
    assert times[1] == pytest.approx((11.0, 1650.0))
    assert times[2] == pytest.approx((1661.1, 1760.1))
    assert w.preemptions == 0
    # vLLM 0.33 (full admission): B's 7 blocks are free next to A's 7, so it prefills with A's decode at 11:
    # 10 + 1.1 + 1 = 12.1 -> 23.1
    a, b = req(1, 100, 150), req(2, 110, 10, at=1.0)
    vllm = serve(EngineWorker(0, 20, 16, linear()), [(0.0, a), (1.0, b)])
    assert vllm[2][0] == pytest.approx(23.1)


def test_retraction_raises_the_ratio_and_recomputes():
    """schedule_batch.py retract_decode and new_token_ratio_tracker.py: when a decode pass does not fit, the request
    with the fewest generated tokens (ties: the later one) is retracted, the ratio rises to
    (decoded + 20 x left) / (max_new + 1) over those left, and then decays each decode pass."""
    # 10 blocks = 160 tokens; ratio starts at 0.05 (floor 0.007, decay 0.043 / 600 per decode pass).
    ratios = []
    w = sglang(10, init_new_token_ratio=0.05)
    a, b = req(1, 48, 60), req(2, 48, 60, at=1.0)
    times = serve(w, [(0.0, a), (1.0, b)], check=lambda w, res: ratios.append((res.preempted, w.ratio.current)))
    # A prefills (10 + 0.48 -> 10.48). B: 48 + 60 + 1 = 109 < 160 - 48 (A's) - 59 x 0.05 = 109.05: admitted,
    # prefills alone -> 20.96. Both decode: 64 tokens free, 2 a pass: 32 passes of 12 ms -> 404.96. The 33rd finds
    # none free: B (33 generated, as A; the later) is retracted and A decodes alone (11 ms) -> 415.96
    (retract,) = [i for i, (n, _) in enumerate(ratios) if n]
    assert ratios[retract][0] == 1 and retract == 2 + 32
    # the ratio over A alone: (33 generated + 20) / (60 + 1); one decode pass later it decayed once
    assert ratios[retract][1] == pytest.approx(53 / 61)
    assert ratios[retract + 1][1] == pytest.approx(53 / 61 - (0.05 - 0.05 * 0.14) / 600)
    # B cannot come back while A runs: 33 to recompute + 27 + 1 = 61 > 31 free - 26 x ratio (~22.6). A's last 26
    # passes: 415.96 + 26 x 11 = 701.96. B recomputes its 33 uncached tokens (its 3 blocks still cached): 10 +
    # 0.33 -> 712.29, emits its 34th token, and decodes 26 passes -> 998.29
    assert times[1] == pytest.approx((10.48, 701.96))
    assert times[2] == pytest.approx((20.96, 998.29))
    assert w.preemptions == 1 and b.preemptions == 1 and b.hit_tokens == 0
    assert w.ratio.current == 0.05  # idle again: Scheduler.on_idle reset it


def test_a_request_the_empty_engine_could_not_always_admit_is_rejected():
    """PrefillAdder.add_one_req asks prompt + tokens to come + a page below the pool: 160 tokens here."""
    w = sglang(10)
    assert not w.submit(req(1, 100, 59), 0.0) and w.rejected == 1  # 100 + 59 + 1 = 160, not below 160
    assert w.submit(req(2, 100, 58), 0.0)  # 159


def test_ratio_decays_to_its_floor_and_resets_when_idle():
    """new_token_ratio_tracker.py: init min(0.7 x conservativeness, 1), floor init x 0.14, decay (init - floor) / steps."""
    r = NewTokenRatio(0.7, 2.0, 4)
    assert r.init == 1.0 and r.min == pytest.approx(0.14)
    for _ in range(3):
        r.decay_step()
    assert r.current == pytest.approx(1.0 - 3 * 0.86 / 4)
    r.decay_step(), r.decay_step()
    assert r.current == pytest.approx(0.14)
    r.reset()
    assert r.current == 1.0


def test_chunked_prefill_reserves_no_output_until_the_last_chunk():
    """schedule_policy.py add_one_req / add_chunked_req: a prompt over --chunked-prefill-size runs in chunks."""
    a = req(1, 300, 2)
    times = serve(sglang(1000, chunked_prefill_size=128), [(0.0, a)])
    # chunks of 128, 128, 44: 11.28 + 11.28 + 10.44 = 33.0 (first token), a decode pass: 11 -> 44.0
    assert times[1] == pytest.approx((33.0, 44.0))


def test_max_running_requests_caps_the_batch():
    """scheduler.py get_num_allocatable_reqs: no more than --max-running-requests requests hold a request slot."""
    a, b = req(1, 32, 2), req(2, 32, 2)
    times = serve(sglang(1000, max_running_requests=1), [(0.0, a), (0.0, b)])
    # A prefills (10.32), decodes (11 -> 21.32); B then (-> 31.64, 42.64)
    assert times[1] == pytest.approx((10.32, 21.32)) and times[2] == pytest.approx((31.64, 42.64))


def test_a_timed_run_through_the_fleet(tmp_path):
    """The same rule end to end (TimedFleet, --engine sglang, --latency-model linear with every overhead term off)."""
    import json

    from dynlab.engine.config import SimConfig
    from dynlab.sim import run

    from helpers import terms_off

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in [
        {"timestamp": 0, "input_length": 1024, "output_length": 3, "hash_ids": [1, 2]},
        {"timestamp": 5, "input_length": 512, "output_length": 2, "hash_ids": [9]}]))
    out = run(SimConfig(trace=str(trace), timing=True, workers=1, engine_kind="sglang", latency_model="linear",
                        **terms_off("linear", {"beta0": 10, "beta1": 0.01, "beta2": 1})))
    # A prefills 1,024 tokens: 10 + 10.24 = 20.24; B (at 5) prefills alone: 10 + 5.12 -> 35.36; both decode:
    # 12 -> 47.36 (B's last); A: 11 -> 58.36. TTFT 20.24 and 30.36 (mean 25.3), E2E 58.36 and 42.36 (mean 50.36)
    assert out["ttft_ms"]["mean"] == pytest.approx(25.3) and out["e2e_ms"]["mean"] == pytest.approx(50.36, abs=0.05)  # (rounded to 0.1)
    assert out["engine_steps"] == 4 and out["preemptions"] == 0


@pytest.mark.parametrize("page, a_hit", [(16, 0), (1, 48)])
def test_a_paged_extend_evicts_a_page_more_per_request(page, a_hit):
    """mem_cache/allocation.py alloc_paged_token_slots_extend: above page 1 a prefill batch first evicts for its
    extend tokens plus a page per request ("assume each request needs a new page"); alloc_token_slots (page 1)
    evicts for the extend tokens alone."""
    # 10 blocks of 16 = 160 tokens. A (64 tokens, 4 blocks) at 0 and B (32, 2) at 100 finish in their prefill
    # pass (1 token out): both cached, 96 tokens, A's the least recently used; 64 free.
    a, b, c = req(1, 64, 1), req(2, 32, 1, at=100.0), req(3, 64, 1, at=200.0)
    again = req(4, 64, 1, names=a.names, at=300.0)
    w = sglang(10, page_size=page)
    serve(w, [(0.0, a), (100.0, b), (200.0, c), (300.0, again)])
    # C (64 new tokens; admitted: 64 + 1 + a page < 64 free + 96 evictable) takes 64 slots. At page 16 the
    # batch evicts for 64 + 16 = 80 > 64 free: the LRU leaf, A's 4 blocks, goes, and A's prompt sent again
    # hits nothing. At page 1 it evicts for 64 <= 64 free: nothing goes, and the prompt hits 3 blocks (48
    # tokens: at most 64 - 1 tokens match, _compute_max_prefix_len).
    assert again.hit_tokens == a_hit
    assert b.hit_tokens == c.hit_tokens == 0


def test_a_mixed_pass_clears_batch_is_full_and_puts_its_prefills_first():
    """scheduler.py _get_new_batch_prefill_raw (is_mixed_chunk): mix_with_running leaves an empty running batch, and
    get_next_batch_to_run makes the mixed batch (its prefills, then the decodes: ScheduleBatch.merge_batch) the
    running batch, whose batch_is_full is False (ScheduleBatch's default): the next round tries the waiting
    requests again, where an unmixed engine waits for a request to leave."""
    # 40 blocks = 640 tokens, page 1. A: 160 in, 50 out at 0; B: 320 in, 60 out at 5; C: 48 in, 20 out at 6.
    a, b, c = req(1, 160, 50), req(2, 320, 60, at=5.0), req(3, 48, 20, at=6.0)
    orders = []
    w = sglang(40, enable_mixed_chunk=True)
    times = serve(w, [(0.0, a), (5.0, b), (6.0, c)], check=lambda w, res: orders.append([r.id for r in w.running]))
    # A prefills alone: 10 + 1.6 -> 11.6 (its 160 tokens cached, locked: 480 free). At 11.6 the adder starts from
    # 1 (A's mixed decode) + (50 - 1) x 0.7 = 35.3. B: 320 + 60 + 1 = 381 < 480 - 35.3: admitted, charging
    # 320 + 1 + 60 -> 416.3. C: 48 + 20 + 1 = 69 not < 480 - 416.3 = 63.7: NO_TOKEN, batch_is_full.
    # B's prefill with A's decode: 10 + 3.2 + 1 = 14.2 -> 25.8 (B's first token, A's 2nd)
    assert times[2][0] == pytest.approx(25.8)
    # at 25.8 batch_is_full is False again; the ratio did not decay (no decode-only pass). Free: 640 - 480 cached -
    # A's 1 decode slot = 159; the adder starts from 2 + (60 - 1) x 0.7 + (50 - 2) x 0.7 = 76.9: C's 69 <
    # 82.1, admitted. C's prefill with B's and A's decodes: 10 + 0.48 + 2 = 12.48 -> 38.28
    assert times[3][0] == pytest.approx(38.28)
    assert orders[2] == [3, 2, 1]  # C (the pass's prefill), then B and A, the batch B's pass left
    # three decode a pass (13 ms): C's 19 more -> 38.28 + 247 = 285.28; A's 28 more at 12 ms -> 621.28; B's
    # last 11 alone at 11 ms -> 742.28
    assert times[3][1] == pytest.approx(285.28)
    assert times[1][1] == pytest.approx(621.28) and times[2][1] == pytest.approx(742.28)
    assert w.preemptions == 0
    # unmixed, C waits for A to leave (batch_is_full until then): A decodes 48 passes after B's prefill
    a, b, c = req(1, 160, 50), req(2, 320, 60, at=5.0), req(3, 48, 20, at=6.0)
    unmixed = serve(sglang(40), [(0.0, a), (5.0, b), (6.0, c)])
    assert unmixed[3][0] > unmixed[1][1]


@pytest.mark.parametrize("mixed, a_hit", [(True, 0), (False, 48)])
def test_a_mixed_pass_evicts_a_page_per_decoding_request(mixed, a_hit):
    """mem_cache/allocation.py alloc_paged_token_slots_decode: prepare_for_decode evicts a page per running request
    before their slots are taken, in a mixed pass too (after the prefill's own eviction and slots)."""
    # 14 blocks = 224 tokens, page 16. A (64 tokens, 1 out) at 0 ends in its prefill pass: 4 blocks cached, evictable.
    a = req(1, 64, 1)
    r1, r2 = req(2, 40, 5, at=100.0), req(3, 40, 5, at=100.0)
    x, again = req(4, 33, 1, at=105.0), req(5, 64, 1, names=a.names, at=300.0)
    w = sglang(14, page_size=16, enable_mixed_chunk=mixed)
    serve(w, [(0.0, a), (100.0, r1), (100.0, r2), (105.0, x), (300.0, again)])
    # R1 and R2 prefill together (10 + 0.8 -> 110.8; 80 + 2 pages = 112 <= 160 free: nothing evicted), each
    # holding 3 pages, 2 of them cached: 224 - 64 (A) - 64 - 32 = 64 free. X (33 + 1 + 16 = 50 < 64 + 64
    # evictable - 2 - 2 x 4 x 0.7 = 120.4) is admitted; its extend evicts for 33 + 16 = 49 <= 64: nothing, and
    # takes 3 pages: 16 free. R1 and R2 (40 tokens: no new page needed) fit. Mixed, their decode evicts for
    # 2 x 16 = 32 > 16: A's leaf goes, and A's prompt sent again hits nothing. Unmixed, X's pass ends first
    # (X finishes, 32 free) and the decode passes evict nothing: the prompt hits 3 blocks (at most 63 tokens)
    assert again.hit_tokens == a_hit
    assert x.hit_tokens == 0 and r1.preemptions == r2.preemptions == 0
