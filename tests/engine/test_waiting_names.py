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


def test_read_back_the_request_and_its_pool_sequence_share_one_list():
    # one expansion for both (and the same int objects the pool registers), whichever is read first
    names, runs = engine_block_runs([7, 9], 1024, 512, 16)
    for first in ("req", "seq"):
        req = EngineRequest(0, 0.0, 1024, 2, list(names), runs)
        req.seq = RunBlockPool.sequence(req.names, req.runs)
        req.drop_names()
        if first == "seq":
            assert req.seq.names == names
        assert req.names is req.seq.names and req.names == names


def test_only_a_request_left_waiting_by_a_step_start_drops_its_names(tmp_path, monkeypatch):
    # 1 worker, linear model, max_num_seqs 2: request 0 arrives at an idle worker and starts at once;
    # request 1 arrives at 5 ms, inside request 0's prefill step (10 + 0.01 x 1024 = 20.24 ms), and is
    # admitted at the next step's start (20.24 ms): it never waited a step, so neither drops its names;
    # request 2 arrives at 6 ms too and finds no sequence slot at 20.24 ms: it waits, names as runs only
    import json

    from dynlab.engine.config import SimConfig
    from dynlab.sim.runner import run

    dropped = []
    monkeypatch.setattr(EngineRequest, "drop_names",
                        lambda self: dropped.append((self.id, self.first_scheduled_ms)))
    rows = [{"timestamp": t, "input_length": 1024, "output_length": 4, "hash_ids": [2 * i + 1, 2 * i + 2]}
            for i, t in enumerate([0, 5, 6])]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run(SimConfig(trace=str(path), timing=True, workers=1, mode="rr", latency_model="linear",
                        latency_opts={"beta0": "10", "beta1": "0.01", "beta2": "1"}, max_num_seqs=2))
    assert out["requests"] == 3
    assert dropped == [(2, None)]
