"""The O(1) decode step of the hybrid KV cache manager (dynlab/kv/hybrid_slots.py) against its general path.

Hand-made cases pin the groups' ``room`` and how often a gpt-oss decode leaves the fast path; hypothesis
drives two managers (fast path on, and ``fast_slots = False``: every call on the general path) with the
same random operations, and two engines with the same random workloads, and asserts equal answers, tables,
free queues and evictions at every step."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.engine.request import EngineRequest
from dynlab.engine.worker import EngineWorker
from dynlab.kv.groups import ChunkedLocalGroup, HybridPool, SlidingWindowGroup, StateGroup, hybrid_pool
from dynlab.kv.hybrid import HybridKvCacheManager
from dynlab.models.spec import model_spec
from test_kv_groups import _OwnNames
from test_worker import Linear, run, workloads


def test_room_is_the_inverse_of_blocks_needed():
    # a window or chunked table of 3 entries of 16 tokens holds 48 tokens; a state group holds any number
    # once it has its per-request blocks, none before
    assert SlidingWindowGroup(16, 128).room(3) == 48 == ChunkedLocalGroup(16, 64).room(3)
    assert StateGroup(16, 2).room(2) == math.inf and StateGroup(16, 2).room(1) == 0


@given(st.integers(1, 8), st.integers(1, 60), st.integers(0, 200), st.booleans())
def test_a_window_rule_is_constant_until_its_next_drop(block, window, c, chunked):
    g = (ChunkedLocalGroup if chunked else SlidingWindowGroup)(block, window)
    d = g.next_drop(c)
    assert d > c
    for x in range(c, d):  # what the fast path relies on (groups.py: next_drop)
        assert g.skipped(x) == g.skipped(c) and g.next_drop(x) == d
    assert chunked or g.skipped(d) == g.skipped(c) + 1
    n = c // block
    assert g.blocks_needed(g.room(n)) <= n < g.blocks_needed(g.room(n) + 1)


def _gpt_oss(capacity=100_000):
    return HybridKvCacheManager(capacity, 16, hybrid_pool(model_spec("gpt-oss-20b"), 16, 1))


def test_a_decode_takes_the_general_path_only_at_drops_and_boundaries():
    # gpt-oss-20b (window 128, 16-token blocks), a 200-token prompt computed, then 100 decode steps (computed
    # 200 .. 299, slots to computed + 1): the general path runs at the first call (no room yet), at each
    # drop (computed 207, 223, ..., 287: (c - 127) % 16 == 0) and each full block (computed 208, 224, ...,
    # 288: c + 1 > 16 x blocks held), 1 + 6 + 6 = 13 calls; the other 87 answer from the room
    for fast, general in ((True, 13), (False, 100)):
        kv = _gpt_oss()
        kv.fast_slots = fast
        req = EngineRequest("r", 0.0, 200, 200, list(range(12)))
        kv.sequence(req)
        assert kv.admit(req, 0, 200)
        kv.name_blocks(req, 200)
        req.computed = 200
        calls = []
        grow = kv.grow
        kv.grow = lambda r, t: calls.append(r.computed) or grow(r, t)
        for c in range(200, 300):
            assert kv.allocate_slots(req, c + 1)
            req.computed = c + 1
        assert len(calls) == general
        if fast:
            assert calls == [200] + [x for c in range(207, 300, 16) for x in (c, c + 1)]
        assert kv.held_blocks(req) == [19, 9]  # ceil(300 / 16); ceil(300 / 16) - (299 - 127) // 16


def test_free_slots_of_reads_the_room():
    # computed 201 after the call at 200 (room lo 200, hi next_drop(200) = 207, 13 blocks = 208 slots):
    # 207 - 201 = 6 tokens before the window drops a block, as the general answer
    kv = _gpt_oss()
    req = EngineRequest("r", 0.0, 200, 200, list(range(12)))
    kv.sequence(req)
    assert kv.admit(req, 0, 200)
    req.computed = 200
    assert kv.allocate_slots(req, 201)
    req.computed = 201
    assert kv._room[req] == (200, 207, 208, 207)
    assert kv.free_slots_of([(req, 1)]) == [6]
    for c in range(201, 208):  # to a drop: the general call at 207 sets the room (207, 223, 208, 208)
        req.computed = c
        assert kv.allocate_slots(req, c + 1)
    assert kv._room[req] == (207, 223, 208, 208)
    req.computed = 206  # rolled back below lo: the window's next drop is 207 again, not 223 (the general answer)
    assert kv.free_slots_of([(req, 1)]) == [1]
    kv.free(req)  # its tables freed: its room too
    assert req not in kv._room


def test_a_table_behind_its_window_keeps_no_room():
    # window 2, 16-token blocks: a 16-token request (1 block per group) whose computed count jumps to 64
    # without slots (no scheduler does: a guard): the call for 65 drops min(skipped(64) = 3, 1 held) = 1
    # block and grows the table to 5 entries, skip 1 < 3: no room, so the same call again drops 2 more,
    # on both paths
    answers = []
    for fast in (True, False):
        kv = HybridKvCacheManager(100, 16, HybridPool((SlidingWindowGroup(16, 2),), 1, 1, 1.0, {}, 0))
        kv.fast_slots = fast
        req = EngineRequest("r", 0.0, 16, 10, [7])
        kv.sequence(req)
        assert kv.admit(req, 0, 16)
        req.computed = 64
        assert kv.allocate_slots(req, 65)
        assert kv.tables[req][0][0] == 1 and req not in kv._room
        assert kv.allocate_slots(req, 65)
        answers.append((kv.held_blocks(req), kv.tables[req][0][0], kv.num_free))
    assert answers[0] == answers[1] == ([5, 2], 3, 93)


# -- the manager driven by random operations, fast path against general path ----------------------------------
@st.composite
def layouts(draw, block=None):
    """``(block, HybridPool)``: 1-3 extra groups (window, chunked local, state), 1-2 full groups; ``block``
    tokens per block (``None``: 1-6)."""
    block = draw(st.integers(1, 6)) if block is None else block
    groups = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["sliding_window", "chunked_local", "state"]))
        if kind == "state":
            groups.append(StateGroup(block, draw(st.integers(1, 3))))
        else:
            cls = SlidingWindowGroup if kind == "sliding_window" else ChunkedLocalGroup
            groups.append(cls(block, draw(st.integers(1, 30))))
    full = draw(st.integers(1, 2))
    return block, HybridPool(tuple(groups), full, 1, 1.0, {"full": full}, 0)


#: ``(kind, i, n, la)``: kind 0 admits the next waiting request, 1-6 a decode step (1 token) of running request
#: ``i``, 7 a step of ``n`` tokens, 8 a rollback of ``n`` computed tokens, 9 its finish; ``la`` lookahead slots
OPS = st.lists(st.tuples(st.integers(0, 9), st.integers(0, 3), st.integers(1, 9), st.integers(0, 2)),
               min_size=60, max_size=300)


def _requests(block, prompts):
    out = []
    for i, (length, family) in enumerate(prompts):
        names = [family * 1000 + j if j < 3 else 10**6 + i * 1000 + j for j in range(length // block)]
        out.append(EngineRequest(i, 0.0, length, 50, names))
    return out


def _admit(kv, req, n, la, running):
    """Admit ``req`` as the scheduler does (its cached prefix, a chunk of ``n`` tokens, ``la`` lookahead slots)."""
    kv.sequence(req)
    h, _ = kv.find_cached_prefix(req)
    computed = h * kv.block
    n = min(n, req.num_tokens - computed)
    if not kv.admit(req, h, computed + n + la, kv.admission_tokens(req, computed, n)):
        return ("refused", h)
    kv.name_blocks(req, n)
    req.computed += n
    running.append(req)
    return ("admitted", h)


def _apply(kv, op, n, la, req, running):
    """One operation on the running ``req``: a step of ``n`` tokens with ``la`` lookahead slots (preempting it
    when the pool cannot), a rollback of ``n`` computed tokens (op 8) or its finish (op 9). Returns what the
    manager answered."""
    if op == 8:
        req.computed = max(req.computed - n, req.nreg * kv.block)  # a rollback (rejected drafts)
        return ("rollback", req.computed)
    if op == 9:
        req.generated = req.output_length
        req.computed = req.num_tokens - 1
        kv.free(req)
        running.remove(req)
        req.computed = req.nreg = req.generated = 0
        req.num_tokens = req.input_length
        return ("finished",)
    n = min(n if op == 7 else 1, max(req.num_tokens - req.computed, 1))
    if not kv.allocate_slots(req, req.computed + n + la):
        kv.preempt(req)
        running.remove(req)
        req.computed = 0
        return ("preempted",)
    if req.nreg < req.n_names:
        kv.name_blocks(req, min(n, req.num_tokens - req.computed))
    req.computed += n
    if req.computed >= req.num_tokens:
        req.num_tokens = req.computed + 1
        req.generated += 1
    return ("step", n)


def _state(kv, reqs, running):
    """Everything the general path could change, and the answers a step plan reads."""
    tables = {r.id: (r.computed, tuple(r.keys), tuple((s, tuple(k)) for s, k in kv.tables[r])) for r in running}
    return (tables, kv.free_slots_of([(r, 1) for r in running]), kv.pool.num_free, kv.pool.free_keys(),
            tuple(kv.evicted()), sorted(kv.pool.cached()))


def _drive(block, layout, capacity, prompts, ops, fast):
    kv = HybridKvCacheManager(capacity, block, layout)
    kv.fast_slots = fast
    reqs = _requests(block, prompts)
    running: list = []
    trace = []
    for k, (op, i, n, la) in enumerate(ops):
        if k % 7 == 0:
            kv.begin_step(float(k))
        waiting = [r for r in reqs if r not in running]
        if waiting and (op == 0 or not running):
            answer = _admit(kv, waiting[0], n, la, running)
        else:
            answer = _apply(kv, op, n, la, running[i % len(running)], running)
        trace.append((answer, _state(kv, reqs, running)))
        kv.check([r.keys for r in running])
    return trace, kv


@settings(max_examples=150, deadline=None)
@given(layouts(), st.integers(4, 120), st.lists(st.tuples(st.integers(1, 40), st.integers(0, 1)), min_size=1,
                                                 max_size=4), OPS)
def test_fast_path_answers_as_the_general_path(layout, capacity, prompts, ops):
    block, pool = layout
    fast, kv = _drive(block, pool, capacity, prompts, ops, True)
    slow, kv_slow = _drive(block, pool, capacity, prompts, ops, False)
    for step, (a, b) in enumerate(zip(fast, slow)):
        assert a == b, f"operation {step}: {ops[step]}"
    assert kv_slow._room == {}


# -- two engines over KV cache groups, every allocation and free-slots answer recorded ------------------------
def _recorded(kv, log):
    """Wrap ``kv``'s ``allocate_slots`` and ``free_slots_of`` so that each call appends its answer and the
    request's tables and the free queue after it to ``log``."""
    alloc, slots = kv.allocate_slots, kv.free_slots_of

    def allocate_slots(req, tokens):
        ok = alloc(req, tokens)
        log.append(("a", req.id, req.computed, tokens, ok, tuple(req.keys),
                    tuple((s, tuple(k)) for s, k in kv.tables[req]), kv.pool.num_free, tuple(kv.pool.free_keys())))
        return ok

    def free_slots_of(sched):
        out = slots(sched)
        log.append(("s", [r.id for r, _ in sched], out))
        return out

    kv.allocate_slots, kv.free_slots_of = allocate_slots, free_slots_of


def _engine(wl, layout, fast, bulk):
    block, capacity, budget, seqs, betas, specs = wl
    w = EngineWorker(0, 2 * capacity, block, Linear(*betas), max_num_batched_tokens=budget, max_num_seqs=seqs,
                     kv_layout=layout, bulk=bulk)
    w.kv.fast_slots = fast
    w.pool = _OwnNames(w.pool)
    log: list = []
    _recorded(w.kv, log)
    reqs = [EngineRequest(i, float(a), inp, out, names) for i, (a, inp, out, names) in enumerate(specs)]
    results = run(w, reqs, check=True)
    events = [(r.start, r.end, tuple(r.stored), tuple(r.removed), len(r.finished)) for r in results]
    times = [(r.rejected, r.preemptions, r.hit_tokens, r.first_token_ms, r.finish_ms) for r in reqs]
    return log, events, times, (w.steps, w.preemptions, w.peak_used_blocks, w.used_block_ms())


@settings(max_examples=100, deadline=None)
@given(workloads(), st.data())
def test_an_engine_runs_the_same_with_the_fast_path(wl, data):
    _, layout = data.draw(layouts(wl[0]))
    outs = data.draw(st.lists(st.integers(1, 80), min_size=len(wl[5]), max_size=len(wl[5])))  # long decodes
    wl = wl[:5] + ([(a, inp, out, names) for (a, inp, _, names), out in zip(wl[5], outs)],)
    bulk = data.draw(st.booleans())
    fast, slow = _engine(wl, layout, True, bulk), _engine(wl, layout, False, bulk)
    assert fast[1:] == slow[1:]
    for k, (a, b) in enumerate(zip(fast[0], slow[0])):
        assert a == b, f"call {k}"
    assert len(fast[0]) == len(slow[0])


def test_an_engine_of_gpt_oss_leaves_the_general_path():
    # the differential above compares two different paths: one 200-token request, 100 output tokens step by
    # step (the first at the prefill step, admitted by admit): 99 decode allocations at computed 200 .. 298,
    # of which the fast engine sends 13 to the general path (the first, 6 drops, 6 full blocks: as above)
    counts = []
    for fast in (True, False):
        w = EngineWorker(0, 1000, 16, Linear(), kv_layout=hybrid_pool(model_spec("gpt-oss-20b"), 16, 1), bulk=False)
        w.kv.fast_slots = fast
        w.pool = _OwnNames(w.pool)
        grow, calls = w.kv.grow, []
        w.kv.grow = lambda r, t: calls.append(t) or grow(r, t)
        run(w, [EngineRequest("r", 0.0, 200, 100, list(range(12)))], check=True)
        counts.append(len(calls))
    assert counts == [13, 99]
