"""A waiting request keeps its block names only as runs (issue 28: memory of waiting requests):
:meth:`EngineRequest.drop_names` and :meth:`Runs.drop_names`; read again, the names are the same."""
from __future__ import annotations

from hypothesis import given, strategies as st

from dynlab.engine.names import engine_block_runs
from dynlab.engine.request import EngineRequest
from dynlab.kv.run_pool import RunBlockPool, Runs


def test_names_come_back_from_the_runs_by_hand():
    # trace block 512, engine block 16: 1100 tokens -> 68 full blocks, 32 + 32 of ids 7 and 9, 4 of id 11
    names, runs = engine_block_runs([7, 9, 11], 1100, 512, 16)
    assert runs == [(7 * 1024, 32), (9 * 1024, 32), (11 * 1024, 4)]
    req = EngineRequest(0, 0.0, 1100, 2, list(names), runs)
    req.seq = RunBlockPool.sequence(req.names, req.runs)
    req.drop_names()
    assert req._names is None and req.seq._names is None
    assert req.names == names and req.seq.names == names and len(req.names) == 68


def test_without_runs_the_names_stay():
    req = EngineRequest(0, 0.0, 32, 1, [5, 6])
    req.drop_names()
    assert req.names == [5, 6]


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=12, unique=True), st.integers(0, 6000))
def test_dropped_names_read_back_the_same(ids, tokens):
    tokens = min(tokens, len(ids) * 512)
    names, runs = engine_block_runs(ids, tokens, 512, 16)
    seq = Runs(list(names), runs)
    before = (list(seq.names), list(seq.ends))
    seq.drop_names()
    assert (seq.names, seq.ends) == before
