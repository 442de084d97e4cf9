"""The trace formats people have (dynlab_builtins.trace_files): ShareGPT, aiperf, BurstGPT, Azure; text to tokens.

Sample files: tests/data/traces/ (written for these tests; see its README.md).
"""
from __future__ import annotations

import json
import os
import warnings

import pytest
from hypothesis import given, settings, strategies as st
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.sim.runner import run
from dynlab.errors import InputError
from dynlab.traces.reader import TraceWarning, load_trace
from dynlab.traces.text import ApproxTokenizer

DATA = os.path.join(os.path.dirname(__file__), "data", "traces")


def path(name):
    return os.path.join(DATA, name)


def load(name, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reqs = load_trace(path(name), **kw)
    return reqs, [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]


def shares_leading(a, b, n):
    return a.hashes[:n] == b.hashes[:n]


# -- the approximation ---------------------------------------------------------------------------------------
def test_approx_tokenizer_by_hand():
    enc = ApproxTokenizer().encode
    # Name | three | prime | numbers | . : one token per word of up to 7 letters, one per mark
    assert len(enc("Name three prime numbers.")) == 5
    # " assistant" has 9 letters: 2 tokens; "12345678": 3 digits a token, 3 tokens
    assert len(enc(" assistant")) == 2 and len(enc("12345678")) == 3
    assert len(enc("你好，世界")) == 5  # one token per character of other scripts


def test_approx_tokenizer_keeps_shared_prefixes_shared():
    enc = ApproxTokenizer().encode
    system = "You are a helpful assistant. Answer briefly and politely, in plain English.\n"
    a, b = enc(system + "What is a KV cache?"), enc(system + "Name three prime numbers.")
    n = len(enc(system))
    # all but the last piece of the shared text: alone, its newline is a token; followed, it joins "What"
    assert a[:n - 1] == b[:n - 1] and a[n - 1:] != b[n - 1:]


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=200), st.text(max_size=80), st.text(max_size=80))
def test_approx_shared_text_shares_all_but_one_token(prefix, a, b):
    enc = ApproxTokenizer().encode
    n = len(enc(prefix))
    # a piece never reaches back before the text it follows: at most the last piece of the prefix changes
    assert enc(prefix + a)[:n - 1] == enc(prefix + b)[:n - 1]


# -- each format reads its sample files ------------------------------------------------------------------------
def test_sharegpt():
    reqs, warned = load("sharegpt.json")
    assert len(reqs) == 3 and all(r.timestamp is None for r in reqs)
    # the second human turn of conv-1 extends its first (system, question, answer, question)
    first_blocks = reqs[0].input_length // 16
    assert shares_leading(reqs[0], reqs[1], first_blocks) and reqs[1].input_length > reqs[0].input_length
    # conv-2: "Two, three and five." is 6 tokens (Two , three and five .)
    assert reqs[2].output_length == 6
    assert warned == []  # ShareGPT's own id is a known field (issue 43)


def test_sharegpt_with_a_tokenizer_file():
    pytest.importorskip("tokenizers")
    approx, _ = load("sharegpt.json")
    real, _ = load("sharegpt.json", tokenizer=path("tokenizer.json"))
    # the test tokenizer is word-level (one token per word or mark): conv-2's question is
    # system (15 words and marks) + "Name three prime numbers." (5), joined by a newline
    assert real[2].input_length == 15 + 5
    assert [r.input_length for r in real] != [r.input_length for r in approx]


def test_aiperf_single_turn_keeps_timestamp_and_delay():
    reqs, warned = load("aiperf_single_turn.jsonl")
    # timestamps 0 and 250; the third arrives 100 ms after the second; the fourth at 900
    assert [r.timestamp for r in reqs] == [0, 250, 350, 900]
    assert [r.output_length for r in reqs] == [50, 120, 0, 80]
    assert warned == [f"{path('aiperf_single_turn.jsonl')}: aiperf fields not used by dynlab: extra"]


def test_aiperf_multi_turn_sessions():
    reqs, warned = load("aiperf_multi_turn.jsonl")
    # chat_1 at 0 and 0 + 2000; chat_2 at 500, 500 + 1000, 1500 + 1500: sorted by arrival
    assert [r.timestamp for r in reqs] == [0, 500, 1500, 2000, 3000]
    c1t1, c1t2 = reqs[0], reqs[3]
    # turn 2 holds turn 1's prompt (the hoisted system turn and its text) and its 30-token answer
    assert shares_leading(c1t1, c1t2, c1t1.input_length // 16)
    assert c1t2.input_length == c1t1.input_length + 30 + len(ApproxTokenizer().encode("Can you give me an example?"))
    assert warned == []


def test_aiperf_mooncake_sessions_and_delays():
    reqs, warned = load("aiperf_mooncake.jsonl")
    # s1: 0, then 3000 ms after; s2: 1000, then 500 ms after: 0, 1000, 1500, 3000
    assert [r.timestamp for r in reqs] == [0, 1000, 1500, 3000]
    assert [r.hashes for r in reqs] == [(0, 1, 2), (4, 5), (4, 5, 6), (0, 1, 2, 3)]
    assert reqs.own_block_tokens == 512
    assert warned == [f"{path('aiperf_mooncake.jsonl')}: aiperf-mooncake fields not used by dynlab: extra"]


def test_burstgpt():
    reqs, warned = load("burstgpt.csv", keep_failed=True)
    assert [r.timestamp for r in reqs] == [5000.0, 45000.0, 118000.0, 118500.0]
    assert [(r.input_length, r.output_length) for r in reqs] == [(472, 18), (1087, 0), (417, 330), (2048, 97)]
    assert [len(r.hashes) for r in reqs] == [472 // 16, 1087 // 16, 417 // 16, 2048 // 16]
    assert [dict(r.attrs) for r in reqs] == [{}, {"failed": True}, {}, {}]  # the row at 45 s failed (issue 43)
    names = [h for r in reqs for h in r.hashes]
    assert len(names) == len(set(names))  # no prefix is known: nothing shared
    assert warned == [f"{path('burstgpt.csv')}: burstgpt fields not used by dynlab: Log Type, Model, Total tokens"]
    skipped, warned = load("burstgpt.csv")  # by default the failed row is skipped, and one line says so
    assert [r.timestamp for r in skipped] == [5000.0, 118000.0, 118500.0]
    assert warned[0].startswith(f"{path('burstgpt.csv')}: skipped 1 failed request(s)")


def test_burstgpt_session_turns_share_their_history():
    reqs, _ = load("burstgpt_sessions.csv")
    a1, b1, a2 = reqs
    # a's first turn: 100 tokens = 6 blocks; its context after the answer: (100 + 60) // 16 = 10 blocks;
    # a's second turn (200 tokens, 12 blocks) starts with those 10
    assert len(a1.hashes) == 6 and len(a2.hashes) == 12
    assert a2.hashes[:6] == a1.hashes and not set(a2.hashes) & set(b1.hashes)


def test_azure():
    reqs, warned = load("azure_conv.csv")
    # times from the first row: 50.9951690 - 46.6805900 = 4.314579 s, ...
    assert [round(r.timestamp, 3) for r in reqs] == [0.0, 4314.579, 4319.41, 14819.41]
    assert [(r.input_length, r.output_length) for r in reqs] == [(374, 44), (396, 109), (879, 8), (2048, 1)]
    assert warned == []


@pytest.mark.parametrize("name, fmt", [("sharegpt.json", "sharegpt"), ("aiperf_single_turn.jsonl", "aiperf"),
                                       ("aiperf_multi_turn.jsonl", "aiperf"), ("aiperf_mooncake.jsonl", "aiperf-mooncake"),
                                       ("burstgpt.csv", "burstgpt"), ("azure_conv.csv", "azure")])
def test_each_format_is_detected_and_runs_timed(name, fmt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        detected = run(SimConfig(trace=path(name), timing=True, mode="kv-events", workers=2))
        named = run(SimConfig(trace=path(name), trace_format=fmt, timing=True, mode="kv-events", workers=2))
    assert detected == named and detected["requests"] == len(load(name)[0])


# -- errors ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, text, where", [
    ("b.csv", "Timestamp,Model,Request tokens,Response tokens\n1,x,10,2\n2,x,ten,2\n", "b.csv:3: Request tokens"),
    ("b.csv", "Timestamp,Model,Request tokens,Response tokens\n1,x,10\n", "b.csv:2: 3 values for 4 columns"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", "a.csv:2: TIMESTAMP"),
    ("s.json", '[\n {"conversations": [{"from": "human", "value": "hi"}]},\n {"id": 3}\n]\n', "s.json:3: expected a conversation"),
    ("s.json", '[\n {"conversations": [{"from": "robot", "value": "hi"}]}\n]\n', "s.json:2: conversations[0]: unknown"),
    ("s.json", '[\n {"conversations": []},\n', "s.json:3: not JSON"),
    ("p.jsonl", '{"text": "hi", "timestamp": 0}\n{"text": "yo", "delay": -5}\n', "p.jsonl:2: delay"),
    ("m.jsonl", '{"session_id": "s", "hash_ids": [1], "timestamp": 0}\n{"session_id": "s", "hash_ids": "x"}\n',
     "m.jsonl:2: hash_ids"),
    ("m.jsonl", '{"session_id": "s", "timestamp": 0, "input_length": 0}\n', "m.jsonl:1: a row needs hash_ids"),
])
def test_a_bad_row_is_one_line_with_file_and_line(tmp_path, name, text, where):
    (tmp_path / name).write_text(text)
    res = CliRunner().invoke(main, ["sim", "--trace", str(tmp_path / name)])
    assert res.exit_code == 1, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
    assert line.startswith(f"Error: {tmp_path / where}"), line


def test_tokenizer_is_refused_without_text_and_for_a_missing_file():
    res = CliRunner().invoke(main, ["sim", "--trace", path("burstgpt.csv"), "--tokenizer", path("tokenizer.json")])
    assert res.exit_code == 2 and "--tokenizer has no effect on burstgpt traces" in res.output
    res = CliRunner().invoke(main, ["sim", "--trace", path("sharegpt.json"), "--tokenizer", "missing.json"])
    assert res.exit_code == 2 and "missing.json: no such tokenizer file" in res.output


def test_the_warning_is_one_line():
    res = CliRunner().invoke(main, ["sim", "--trace", path("burstgpt.csv")])
    assert res.exit_code == 0
    assert [ln for ln in res.output.splitlines() if "not used" in ln] == [
        f"Warning: {path('burstgpt.csv')}: burstgpt fields not used by dynlab: Log Type, Model, Total tokens"]


@pytest.mark.parametrize("fmt", ["burstgpt", "azure"])
def test_a_csv_format_forced_onto_json_lines_is_one_line(tmp_path, fmt):
    """A fresh user's trial: --trace-format burstgpt on a JSON-lines file raised csv.Error with a traceback."""
    from click.testing import CliRunner

    from dynlab.cli import main

    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "tokens": [1, 2, 3], "output_length": 2}\n')
    out = CliRunner().invoke(main, ["sim", "--trace", str(path), "--trace-format", fmt])
    assert out.exit_code == 1
    assert f"{path}:1: a JSON line, not the CSV header of a {fmt} trace" in out.output
    assert not isinstance(out.exception, Exception) or isinstance(out.exception, SystemExit)


# -- replies: the next turn hits its previous reply (issue 24 leftovers) ----------------------------------------
# Both files at --block 4, by hand: turn 1 is 8 prompt tokens (2 blocks) and a 6-token reply; its computed
# tokens are 8 + 6 - 1 = 13 (the last token's KV is never computed): 3 full blocks, one past the prompt's
# (the reply's first 4 tokens). Turn 2 is turn 1's prompt, the reply and 4 new tokens: 18 tokens, 4 blocks;
# its first 3 are turn 1's 2 prompt blocks and that reply block. Without the reply's names it would hit 2.
@pytest.mark.parametrize("name", ["sharegpt_replies.json", "aiperf_replies.jsonl"])
def test_a_turn_names_its_reply_and_the_next_turn_quotes_it(name):
    reqs, _ = load(name, block=4)
    turn1, turn2 = [r for r in reqs if r.input_length in (8, 18)]
    assert (turn1.input_length, turn1.output_length, len(turn1.hashes)) == (8, 6, 2)
    assert len(turn1.output_hashes) == 1 and turn2.input_length == 18
    assert turn2.hashes[:3] == turn1.hashes + turn1.output_hashes


def test_sharegpt_reply_tokens_are_the_conversation_text_past_the_prompt():
    enc = ApproxTokenizer().encode
    reqs, _ = load("sharegpt_replies.json", block=4)
    # "yes sir" answers turn 2 (2 tokens, "\nyes", " sir"): 18 + 2 - 1 = 19 tokens, no full block past the prompt's 4
    assert [(r.input_length, r.output_length) for r in reqs] == [(8, 6), (18, 2)]
    assert reqs[1].output_hashes == ()
    assert len(enc("nine ten red blue green pink")) == 6


def test_aiperf_single_turn_rows_name_no_reply():
    # the single_turn row (at 500 ms, between the session's turns) has no history to quote its answer
    reqs, _ = load("aiperf_replies.jsonl", block=4)
    assert [(r.timestamp, r.input_length, r.output_length) for r in reqs] == [(0, 8, 6), (500, 4, 8), (1000, 18, 2)]
    assert reqs[1].output_hashes is None and reqs[2].output_hashes == ()


@pytest.mark.parametrize("name", ["sharegpt_replies.json", "aiperf_replies.jsonl"])
def test_replies_are_hit_count_based_timed_and_on_a_decode_worker(name, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        counted = run(SimConfig(trace=path(name), block=4, workers=1))
        # count-based: turn 2 finds turn 1's 3 blocks on the one worker; prompt blocks 2 + 4 (+ 1 aiperf's row)
        assert counted["cached_blocks"] == 3
        out = tmp_path / "r.jsonl"
        res = CliRunner().invoke(main, ["sim", "--trace", path(name), "--block", "4", "--workers", "1", "--timing",
                                        "--requests-out", str(out)])
        assert res.exit_code == 0, res.output
        assert [json.loads(line)["hit_tokens"] for line in out.read_text().splitlines()][-1] == 12
        # P/D: the prefill worker never computed the reply (turn 2 hits its 8 prompt tokens there); the decode
        # worker, with its prefix cache, holds turn 1's prompt and reply blocks: 12 tokens it need not be sent
        pd = run(SimConfig(trace=path(name), block=4, timing=True, prefill_workers=1, decode_workers=1,
                           decode_prefix_cache=True))
        assert pd["decode_hit_tokens"] == 12


def test_aiperf_sessions_run_under_the_dynamo_hash():
    # the answers' placeholder ids fit Dynamo's u32 tokens (they were 2**62 up, refused by --hash dynamo)
    reqs, _ = load("aiperf_replies.jsonl", block=4, scheme="dynamo")
    turn1, turn2 = reqs[0], reqs[2]
    assert turn2.hashes[:3] == turn1.hashes + turn1.output_hashes
    res = CliRunner().invoke(main, ["sim", "--trace", path("aiperf_multi_turn.jsonl"), "--hash", "dynamo"])
    assert res.exit_code == 0, res.output
