"""A reply's blocks named by the trace (``output_tokens``, issue 24 item 2) inside one engine: registered as
computed, published as ``BlockStored``, hit by a later prompt that quotes the reply; the same with and
without bulk decode runs."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_worker import Linear, run
from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.traces.replies import reply_names


def _ereq(i, arrival, prompt, reply, block, given=True):
    """An engine request of ``prompt`` generating ``len(reply)`` tokens; its reply's names when ``given``."""
    names, out = reply_names(prompt, reply, block)
    r = EngineRequest(i, float(arrival), len(prompt), len(reply), list(names) + (list(out) if given else []))
    r.out_blocks = len(out) if given else 0
    return r


P, R, NEW = list(range(1, 33)), list(range(101, 133)), list(range(201, 217))


@pytest.mark.parametrize("bulk", [True, False])
@pytest.mark.parametrize("given_ids, hit", [(True, 48), (False, 32)])
def test_next_turn_hits_the_reply_by_hand(bulk, given_ids, hit):
    # turn 1: 32 prompt tokens, 32 generated; its last token's KV is never computed, so 32 + 31 = 63 tokens
    # have KV: full blocks 0-1 (prompt) and 2 (tokens 32-47, the reply's first 16). Turn 2 at 1000 ms:
    # prompt = turn 1's prompt + reply + 16 new = 80 tokens, 5 full blocks, lookup capped at (80-1)//16 = 4.
    # With the reply's ids its blocks 0-2 are cached: 48 tokens; without, the reply block has a name of
    # turn 1's own: blocks 0-1, 32 tokens.
    lat = Linear(10.0, 1.0, 2.0)
    w = EngineWorker(0, 64, 16, lat, bulk=bulk)
    t1 = _ereq(0, 0, P, R, 16, given_ids)
    t2 = _ereq(1, 1000, P + R + NEW, [7, 8, 9, 10], 16, given_ids)
    results = run(w, [t1, t2], check=True)  # check: the published events are the pool's named blocks
    assert t2.hit_tokens == hit
    # turn 1: prefill 10 + 32 = 42 ms, 31 decodes of 10 + 2 = 12 ms -> 414; turn 2: prefill 80 - hit tokens
    assert (t1.first_token_ms, t1.finish_ms) == (42.0, 414.0)
    assert t2.first_token_ms == 1000 + 10 + (80 - hit)
    stored = [n for res in results if res.end < 1000 for n in res.stored]  # turn 1's events
    name = reply_names(P, R, 16)[1][0]
    assert stored.count(name) == (1 if given_ids else 0)  # the reply's block published as BlockStored, once


def test_reply_of_33_tokens_gives_a_fourth_block():
    # 32 + 33 - 1 = 64 tokens with KV: 4 full blocks; turn 2 = prompt + reply (33) + 15 new = 80 tokens,
    # cap 4 blocks: all 4 hit (64 tokens) with the ids, 2 (the prompt's) without
    reply, new = list(range(101, 134)), list(range(201, 216))
    for given_ids, hit in ((True, 64), (False, 32)):
        w = EngineWorker(0, 64, 16, Linear(10.0, 1.0, 2.0))
        t2 = _ereq(1, 1000, P + reply + new, [1], 16, given_ids)
        run(w, [_ereq(0, 0, P, reply, 16, given_ids), t2], check=True)
        assert t2.hit_tokens == hit


@st.composite
def conversations(draw):
    """Requests over a few token streams: a request's prompt is a stream's first ``inp`` tokens and its
    reply the next ``out``, so a longer prompt of the same stream quotes a shorter one's reply."""
    block = draw(st.integers(1, 4))
    capacity, budget, seqs = draw(st.integers(4, 30)), draw(st.integers(1, 40)), draw(st.integers(1, 4))
    specs = []
    for i in range(draw(st.integers(1, 10))):
        arrival, stream = draw(st.integers(0, 150)), draw(st.integers(0, 2))
        inp, out = draw(st.integers(1, 40)), draw(st.integers(1, 12))
        tokens = [stream * 1000 + t for t in range(inp + out)]
        specs.append((arrival, tokens[:inp], tokens[inp:]))
    specs.sort(key=lambda s: s[0])
    return block, capacity, budget, seqs, specs


def _simulate(wl, bulk, cross=False):
    block, capacity, budget, seqs, specs = wl
    w = EngineWorker(0, capacity, block, Linear(2.0, 0.5, 1.0), max_num_batched_tokens=budget, max_num_seqs=seqs,
                     bulk=bulk)
    w.cross_boundaries = cross
    reqs = [_ereq(i, a, p, r, block) for i, (a, p, r) in enumerate(specs)]
    run(w, reqs, check=True)
    return w, reqs


@settings(max_examples=150, deadline=None)
@given(conversations(), st.booleans())
def test_reply_names_step_by_step_equals_bulk(wl, cross):
    # the events stay the pool's named blocks at every step (run's check), and a bulk decode run (whose
    # reply blocks are registered at its end) changes nothing a request sees
    ws, rs = _simulate(wl, bulk=False)
    wb, rb = _simulate(wl, bulk=True, cross=cross)
    assert (ws.preemptions, ws.rejected, ws.steps) == (wb.preemptions, wb.rejected, wb.steps)
    for a, b in zip(rs, rb):
        assert (a.rejected, a.preemptions, a.hit_tokens) == (b.rejected, b.preemptions, b.hit_tokens)
        assert (a.finish_ms is None) == (b.finish_ms is None)
        assert a.finish_ms is None or math.isclose(a.finish_ms, b.finish_ms, rel_tol=1e-9)
