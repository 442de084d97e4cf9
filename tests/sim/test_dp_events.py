"""Attention-DP ranks' KV events carry the rank (``dp_rank``; dynlab issue 43 item 1, ai-dynamo/dynamo PR #3597):
the events a rank publishes, the recorded-stream round trip (dynlab.routing.events_io) and the timeline.

Runs on Qwen3-30B-A3B, ``--tp 1 --ep 2 --dp-attention`` (2 ranks per worker), the linear step model, 16-token blocks.
"""
from __future__ import annotations

import json

from click.testing import CliRunner

from dynlab.cli import main
from dynlab.engine.bus import EventBus
from dynlab.engine.config import SimConfig
from dynlab.routing.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch
from dynlab.routing.events_io import json_line, read_batches, replay_events
from dynlab.sim import run
from helpers import terms_off, terms_off_args

LINEAR = terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2})
# two distinct 64-token prompts (4 full blocks each) at t = 0, then nothing
ROWS = [{"tokens": list(range(i * 1000, i * 1000 + 64)), "output_length": 1, "timestamp": 0} for i in range(2)]


def _published(monkeypatch, tmp_path, **opts) -> list:
    """Every KV event the engines publish on the bus in a run of :data:`ROWS` (``send_one``: one event a batch)."""
    seen = []
    original = EventBus.send_one

    def send_one(self, event):
        seen.append(event)
        original(self, event)

    monkeypatch.setattr(EventBus, "send_one", send_one)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    run(SimConfig(trace=str(trace), timing=True, model="qwen3-30b-a3b", latency_model="linear", mode="rr",
                  **opts, **LINEAR))
    return seen


def test_a_ranks_events_carry_its_rank(monkeypatch, tmp_path):
    # rr on one worker of 2 ranks: prompt 0 on target 0 (rank 0), prompt 1 on target 1 (rank 1); each rank's step
    # stores its prompt's 4 blocks: one BlockStored per rank, worker = the routing target, dp_rank = target % 2
    events = _published(monkeypatch, tmp_path, ep=2, dp_attention=True, workers=1)
    assert sorted((type(e).__name__, e.worker, e.dp_rank, len(e.hashes)) for e in events) == [
        ("BlockStored", 0, 0, 4), ("BlockStored", 1, 1, 4)]


def test_without_dp_attention_events_say_no_rank(monkeypatch, tmp_path):
    # the same two prompts on 2 plain workers: the same two stores, no rank
    events = _published(monkeypatch, tmp_path, workers=2)
    assert sorted((e.worker, e.dp_rank, len(e.hashes)) for e in events) == [(0, None, 4), (1, None, 4)]


def test_events_with_a_rank_round_trip_through_json_lines(tmp_path):
    # worker 3 = worker id 1, rank 1 of a 2-rank fleet: its three kinds of event, written and read back equal
    evs = (BlockStored(3, (7, 8), None, (), 16, dp_rank=1), BlockRemoved(3, (7,), dp_rank=1),
           AllBlocksCleared(3, dp_rank=1))
    path = tmp_path / "e.jsonl"
    path.write_text(json_line(KvEventBatch(0.5, evs, 0)) + "\n")
    line = json.loads(path.read_text())
    assert (line["worker"], line["dp_rank"]) == (3, 1)
    (batch,) = read_batches(str(path))
    assert batch.events == evs and all(e.dp_rank == 1 for e in batch.events)
    # `dynlab events replay`: stored 1, removed 1, cleared 1 (every block dropped), the worker's rank shown
    (w,) = replay_events(str(path))["workers"]
    assert (w["worker"], w["dp_rank"], w["stored"], w["removed"], w["cleared"], w["blocks"]) == (3, 1, 1, 1, 1, 0)
    assert list(w)[:2] == ["worker", "dp_rank"]


def test_a_vllm_batch_rank_stays_the_worker(tmp_path):
    # vLLM's JSON line names only dp_rank (its engine): that number is the worker, the events say no rank of their
    # own (as before), and replay shows no dp_rank key
    path = tmp_path / "v.jsonl"
    path.write_text(json.dumps({"ts": 1.0, "events": [["BlockStored", [5], None, [], 16]], "dp_rank": 2}) + "\n")
    (batch,) = read_batches(str(path))
    assert batch.events == (BlockStored(2, (5,), None, (), 16),) and batch.events[0].dp_rank is None
    assert "dp_rank" not in replay_events(str(path))["workers"][0]


def test_the_timeline_shows_each_kv_events_rank(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "tl.json"
    res = CliRunner().invoke(main, ["sim", "--trace", str(trace), "--quiet", "--timing", "--model", "qwen3-30b-a3b",
                                    "--ep", "2", "--dp-attention", "--workers", "1", "--mode", "rr",
                                    "--latency-model", "linear", "--latency-opt", "beta0=10", "--latency-opt",
                                    "beta1=1", "--latency-opt", "beta2=2", *terms_off_args("linear"),
                                    "--timeline", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    kv = [(e["pid"], e["args"]["dp_rank"], e["args"]["blocks"]) for e in doc["traceEvents"] if e.get("cat") == "kv"]
    # pid = target + 1; target 0 is rank 0, target 1 rank 1; each stored its prompt's 4 blocks
    assert sorted(kv) == [(1, 0, 4), (2, 1, 4)]


def test_a_worker_or_rank_id_past_dynlabs_largest_is_one_line_naming_the_line(tmp_path):
    # the index keeps a bit per worker id: a 64-bit Dynamo lease id used as a worker made a 2^63-bit integer
    # (MemoryError) or an OverflowError traceback; it is refused with the file and line instead
    from dynlab.limits import MAX_WORKERS

    for key in ("worker", "dp_rank"):
        path = tmp_path / f"{key}.jsonl"
        path.write_text(json.dumps({"ts": 0, "events": [], key: 7587888160858523137}) + "\n")
        out = CliRunner().invoke(main, ["events", "replay", str(path)])
        assert out.exit_code != 0 and isinstance(out.exception, SystemExit)  # an error exit, not a traceback
        (line,) = out.stderr.strip().splitlines()
        assert f"{path}:1:" in line and f"above dynlab's largest worker id ({MAX_WORKERS - 1:,})" in line
