"""Token traces' ``output_tokens`` (issue 24 item 2): the reply's ids, checked as FILE:LINE errors; its blocks
named by the prompt's chain, so a next turn quoting the reply hits them, timed and count-based; the
synthetic workload's sessions write them."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.routing.hashing import block_hashes
from dynlab.sim import run
from dynlab.traces.reader import load_trace
from dynlab.traces.replies import reply_names
from helpers import terms_off_args

# the hand model with every overhead term off (server CPU time, front end, detokenisation): the hand case's
# times are its steps' alone
LINEAR = ["--timing", "--latency-model", "linear", "--latency-opt", "beta0=10", "--latency-opt", "beta1=1",
          "--latency-opt", "beta2=2", *terms_off_args("linear")]
P, R, NEW = list(range(1, 33)), list(range(101, 133)), list(range(201, 217))


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _turns(given_ids=True):
    """Turn 1: 32 prompt tokens and a 32-token reply; turn 2 at 1 s: prompt + reply + 16 new (80 tokens)."""
    first = {"timestamp": 0, "tokens": P, "output_tokens": R} if given_ids else \
        {"timestamp": 0, "tokens": P, "output_length": 32}
    return [first, {"timestamp": 1000, "tokens": P + R + NEW, "output_length": 4}]


# -- the format --------------------------------------------------------------------------------------------
def test_output_tokens_give_the_length_and_the_reply_names(tmp_path):
    reqs = load_trace(_write(tmp_path / "t.jsonl", _turns()))
    r = reqs[0]
    assert r.output_length == 32  # output_length left out: the ids' count
    assert r.hashes == tuple(block_hashes(P, 16))
    # 32 + 32 - 1 = 63 tokens have KV once it finishes: full block 2 (tokens 32-47) past the prompt's two
    assert r.output_hashes == tuple(block_hashes(P + R, 16)[2:3])
    assert reqs[1].output_hashes is None


@pytest.mark.parametrize("field, message", [
    ('"output_tokens": 5', "field 'output_tokens' must be a list of ints"),
    ('"output_tokens": [1, "a"]', "output_tokens[1] must be an int, got 'a'"),
    ('"output_tokens": [1, 2.0]', "output_tokens[1] must be an int, got 2.0"),
    ('"output_tokens": [1, true]', "output_tokens[1] must be an int, got True"),
    ('"output_tokens": [1, 2], "output_length": 3', "output_tokens holds 2 ids, but output_length is 3"),
    ('"output_tokens": [1, 18446744073709551616]', "output_tokens[1] is outside the token range"),
])
def test_bad_output_tokens_are_one_line_file_line_errors(tmp_path, field, message):
    path = tmp_path / "t.jsonl"
    path.write_text('{"tokens": [1, 2, 3]}\n{"tokens": [1, 2], ' + field + '}\n')
    res = CliRunner().invoke(main, ["sim", "--trace", str(path)])
    assert res.exit_code != 0 and (res.exception is None or isinstance(res.exception, SystemExit))  # no traceback
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert f"{path}:2: " in line and message in line


def test_equal_output_length_is_accepted(tmp_path):
    reqs = load_trace(_write(tmp_path / "t.jsonl", [{"tokens": [1, 2], "output_tokens": [3, 4], "output_length": 2}]))
    assert reqs[0].output_length == 2 and reqs[0].output_hashes == ()  # 3 tokens with KV: no full block past 0


@settings(max_examples=100)
@given(st.lists(st.integers(0, 2**31), min_size=1, max_size=80), st.lists(st.integers(0, 2**31), min_size=1, max_size=60),
       st.integers(1, 8), st.sampled_from(["dynlab", "dynamo"]))
def test_prompt_and_reply_names_are_the_same_tokens_as_a_prompt(prompt, reply, block, scheme):
    names, out = reply_names(prompt, reply, block, scheme=scheme)
    assert names == block_hashes(prompt, block, scheme=scheme)
    # the names of prompt + reply are the names the same tokens get as a later prompt (minus the last
    # generated token, whose KV is never computed)
    assert list(names) + list(out) == block_hashes(prompt + reply[:-1], block, scheme=scheme)
    assert len(out) == (len(prompt) + len(reply) - 1) // block - len(prompt) // block


# -- runs ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("given_ids, hit", [(True, 48), (False, 32)])
def test_timed_next_turn_hits_the_reply_by_hand(tmp_path, given_ids, hit):
    # tests/engine/test_reply_blocks.py derives it: 3 blocks cached with the ids (2 prompt + the reply's
    # first full block; its last token's KV is never computed), 2 without. Turn 2's prefill: 80 - hit tokens.
    trace = _write(tmp_path / "t.jsonl", _turns(given_ids))
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(main, ["sim", "--trace", trace, "--workers", "1", "--capacity", "64", *LINEAR,
                                    "--requests-out", str(out)])
    assert res.exit_code == 0, res.output
    t1, t2 = [json.loads(line) for line in out.read_text().splitlines()]
    assert (t1["first_token_ms"], t1["finish_ms"]) == (42.0, 414.0)
    assert (t2["hit_tokens"], t2["first_token_ms"]) == (hit, 1000 + 10 + 80 - hit)


@pytest.mark.parametrize("given_ids, blocks", [(True, 3), (False, 2)])
def test_events_tell_the_router_of_the_reply(tmp_path, given_ids, blocks):
    # kv-events: turn 2's predicted overlap is what the events said turn 1's worker holds (every full block
    # held, no cap): 3 blocks with the ids (the reply's BlockStored), 2 without; turn 1 predicted 0
    trace = _write(tmp_path / "t.jsonl", _turns(given_ids))
    out = run(SimConfig(trace=trace, timing=True, mode="kv-events", workers=2, capacity=64, latency_model="linear",
                        latency_opts={"beta0": "10", "beta1": "1", "beta2": "2"}))
    assert out["predicted_blocks"] == blocks


@pytest.mark.parametrize("given_ids, cached", [(True, 3), (False, 2)])
def test_count_based_stores_the_reply_at_its_finish(tmp_path, given_ids, cached):
    # count-based (no time): a request's worker holds its prompt's blocks and, with the ids, its reply's
    # (the full blocks of 32 + 32 - 1 tokens: one past the prompt's); turn 2 finds 3 (or 2) cached
    out = run(SimConfig(trace=_write(tmp_path / "t.jsonl", _turns(given_ids)), workers=1))
    assert out["cached_blocks"] == cached and out["prompt_blocks"] == 2 + 5
    # the ideal bound (one infinite cache of every block seen) sees the reply's block too: never below
    assert out["ideal_block_hit_rate"] == round(cached / 7, 4) == out["block_hit_rate"]


# -- the workload generator -------------------------------------------------------------------------------
def test_sessions_write_their_answers_ids(tmp_path):
    spec = {"requests": 2, "arrival": {"process": "constant", "rate": 1},
            "input": {"dist": "constant", "value": 2}, "output": {"dist": "constant", "value": 3},
            "sessions": {"turns": 2}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "t.jsonl"
    res = CliRunner().invoke(main, ["workload", str(path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # turn 1: tokens 1-2, answer 3-5; turn 2: the history (1-5) and 6-7, answer 8-10
    assert rows == [{"timestamp": 1000.0, "tokens": [1, 2], "output_length": 3, "output_tokens": [3, 4, 5]},
                    {"timestamp": 1000.0, "tokens": [1, 2, 3, 4, 5, 6, 7], "output_length": 3,
                     "output_tokens": [8, 9, 10]}]


def test_rows_without_sessions_give_no_ids(tmp_path):
    spec = {"requests": 1, "arrival": {"process": "constant", "rate": 1},
            "input": {"dist": "constant", "value": 2}, "output": {"dist": "constant", "value": 3}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "t.jsonl"
    assert CliRunner().invoke(main, ["workload", str(path), "--out", str(out)]).exit_code == 0
    assert "output_tokens" not in out.read_text()


def test_a_looped_copy_names_its_reply_afresh():
    # --duration loops a trace with fresh names (repeat "new"): a copy's reply names move with its prompt's,
    # so the copy's next turn hits its own copy of the reply, never the original's
    from dynlab.routing.strategy import Request
    from dynlab.traces.rates import shape

    a = Request((5, 6), 32, 32, 0.0, 0, output_hashes=(7,))
    b = Request((5, 6, 7, 8), 80, 4, 1000.0, 1)
    looped = shape([a, b], duration_s=3.5)  # period 2,000 ms: copies at 2,000 and 3,000 ms
    assert [r.timestamp for r in looped] == [0.0, 1000.0, 2000.0, 3000.0]
    stride = 9  # one more than the largest name, the reply's included
    assert looped[2].hashes == (5 + stride, 6 + stride) and looped[2].output_hashes == (7 + stride,)
    assert looped[3].hashes[2] == looped[2].output_hashes[0]
    assert shape([a, b], duration_s=3.5, repeat="same")[2].output_hashes == (7,)
