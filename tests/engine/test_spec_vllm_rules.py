"""Speculative decoding's per-request rules of vLLM 0.33.0's scheduler (issue 26), by hand.

Each case is derived by hand below and was confirmed against vLLM 0.33.0's own ``Scheduler`` with a
``SpeculativeConfig`` (``benchmarks/fidelity_spec.py``, whose ``spec_cases()`` are these traces; the
shared-prefix case is the harness's ``shared-prefix-ample``): every request identical.
Blocks of 16 tokens, the linear step model beta0 = 10, beta1 = 1 (per prefill or draft token), beta2 = 2
(per decode) ms, expected acceptance draws at 0.7 per token (a first verify of 2 drafts accepts
int(0.7 + 0.49) = 1).
"""
from __future__ import annotations

import json

import pytest

from dynlab.engine.spec import Acceptance, SpecDecoding, parse_acceptance
from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.routing.hashing import block_hashes, lookahead_names
from tests.engine.test_worker import Linear, run


def _spec(method="ngram", k=2, rate="0.7"):
    return SpecDecoding(method, k, Acceptance(parse_acceptance(rate, k), "expected"))


def _req(i, t, n_in, n_out, names):
    return EngineRequest(i, t, n_in, n_out, names)


def test_a_finish_names_only_the_tokens_it_kept():
    # capacity 4. X (16 + 1) leaves its block x at the tail: [U U U x]. A (30 + 2): prefill 30 tokens
    # (2 blocks: [U x]); its verify schedules 3 tokens (30, 31, 32: a third block, [x]) and accepts 1
    # draft, but A needs only 1 more token: vLLM's stop trims it, computed = num_tokens - 1 = 31, so
    # A's second block (tokens 16-31) is never hashed and goes to the HEAD with the third:
    # [U U x a]. B (32 + 1) takes 2 blocks from the head: x survives, and C (X's 16 tokens + 4) hits it.
    # (Counting the accepted draft, computed 32 would hash that block: [U x out a], B evicts x, C hits 0.)
    w = EngineWorker(0, 4, 16, Linear(10, 1, 2), spec=_spec())
    reqs = [_req(0, 0, 16, 1, [1]), _req(1, 100, 30, 2, [2]), _req(2, 200, 32, 1, [3, 4]),
            _req(3, 300, 20, 1, [1])]
    run(w, reqs, check=True)
    assert [r.hit_tokens for r in reqs] == [0, 0, 0, 16]
    assert reqs[1].generated == 2 and w.spec.accepted_tokens == 1
    assert reqs[3].first_token_ms - 300 == 10 + 4  # C computes 4 tokens


def test_a_full_hit_is_admitted_padded_to_one_plus_k_tokens():
    # E (33 + 1) caches 2 blocks. F, the same 33 tokens + 2, hits 32 and has 1 token left: vLLM pads it
    # to 1 + K = 3 tokens (K placeholder drafts, never accepted) for its uniform decode batch, so its
    # first step prices 3 prefill tokens (13 ms, not 11) and takes 32 + 3 = 35 slots. Then it verifies
    # 2 real drafts: a decode + 2 draft tokens, 10 + 2 + 2 = 14 ms, accepting 1 (emits 1: done).
    lin = Linear(10, 1, 2)
    w = EngineWorker(0, 16, 16, lin, spec=_spec())
    reqs = [_req(0, 0, 33, 1, [5, 6]), _req(1, 100, 33, 2, [5, 6])]
    res = run(w, reqs, check=True)
    f = reqs[1]
    assert f.hit_tokens == 32
    assert lin.batches[1].prefill_tokens == (3,) and res[1].end - res[1].start == 13
    assert f.first_token_ms - 100 == 13 and f.finish_ms - 100 == 13 + 14
    s = w.spec
    assert (s.num_drafts, s.draft_tokens, s.accepted_tokens) == (1, 2, 1)  # the padding is no draft


def test_padding_waits_for_a_budget_of_one_plus_k():
    # budget 2 < 1 + K = 3: vLLM would never admit F (it prefers not to schedule it unpadded);
    # dynlab admits it unpadded instead of stalling: 1 token, 10 + 1 ms
    w = EngineWorker(0, 16, 16, Linear(10, 1, 2), max_num_batched_tokens=2, spec=_spec())
    reqs = [_req(0, 0, 33, 1, [5, 6]), _req(1, 1000, 33, 2, [5, 6])]
    run(w, reqs, check=True)
    assert reqs[1].hit_tokens == 32 and reqs[1].first_token_ms - 1000 == 11


def test_the_whole_sequence_check_leaves_out_the_lookahead():
    # capacity 4, budget 16, EAGLE K = 2 (2 lookahead slots). A (16 + 20) prefills 16 tokens
    # (16 + 2 slots: 2 blocks); B (32 + 1) arrives meanwhile. Step 2 at 26 ms: A verifies 3 tokens
    # (16 + 3 + 2 = 21 slots: still 2 blocks), 13 tokens of budget left. vLLM admits B: its whole
    # sequence, 32 tokens = 2 blocks, fits the 2 free ones (the check counts request.num_tokens, no
    # lookahead), and its chunk of 13 + 2 lookahead slots takes 1. Reserving 32 + 2 = 3 blocks would
    # keep B waiting until A finishes.
    w = EngineWorker(0, 4, 16, Linear(10, 1, 2), max_num_batched_tokens=16, spec=_spec("eagle"))
    reqs = [_req(0, 0, 16, 20, [7]), _req(1, 1, 32, 1, [8, 9])]
    run(w, reqs, check=True)
    assert reqs[1].first_scheduled_ms == 26


def test_lookahead_names_cover_the_next_token():
    toks = list(range(1, 50))
    plain = block_hashes(toks, 16)
    names = lookahead_names(plain, toks, 16, 1)
    assert len(plain) == 3 and len(names) == 3  # 49 tokens: block 2 (32-47) has token 48 after it
    assert len(lookahead_names(plain[:3], toks[:48], 16, 1)) == 2  # 48 tokens: block 2 has none yet
    assert lookahead_names(plain, toks, 16, 0) == plain
    other = toks[:48] + [999]  # same 3 blocks, another token after them
    assert lookahead_names(block_hashes(other, 16), other, 16, 1)[:2] == names[:2]
    assert lookahead_names(block_hashes(other, 16), other, 16, 1)[2] != names[2]


def _trace(tmp_path, rows):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _sim(tmp_path, trace, method):
    from click.testing import CliRunner

    from dynlab.cli import main

    out = tmp_path / f"{method}.jsonl"
    r = CliRunner().invoke(main, ["sim", "--timing", "--workers", "1", "--mode", "rr", "--trace", trace,
                                  "--trace-format", "tokens", "--block", "16", "--capacity", "64",
                                  "--latency-model", "linear", "--latency-opt", "beta0=10", "--latency-opt",
                                  "beta1=1", "--latency-opt", "beta2=2", "--spec-method", method,
                                  "--spec-tokens", "2", "--spec-acceptance", "0.7", "--spec-draws", "expected",
                                  "--requests-out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("method, hits", [("ngram", [0, 48, 48]), ("eagle", [0, 32, 32]),
                                          ("eagle3", [0, 32, 32]), ("mtp", [0, 32, 32]), ("draft", [0, 48, 48])])
def test_eagle_family_hashes_a_block_with_the_token_after_it(tmp_path, method, hits):
    # three prompts share exactly 48 tokens (3 blocks; the harness's shared-prefix-ample): with eagle,
    # eagle3 or mtp vLLM 0.33 hashes block 2 (tokens 32-47) together with token 48, where the prompts
    # differ, so the later ones hit 2 blocks; ngram and a draft model keep the plain hashes: 3 blocks
    shared = list(range(1, 49))
    rows = [{"timestamp": 0, "tokens": shared + list(range(100, 110)), "output_length": 8},
            {"timestamp": 30, "tokens": shared + list(range(200, 220)), "output_length": 5},
            {"timestamp": 45, "tokens": shared + list(range(300, 303)), "output_length": 12}]
    recs = _sim(tmp_path, _trace(tmp_path, rows), method)
    assert [r["hit_tokens"] for r in recs] == hits


def test_a_shared_block_is_hit_when_the_token_after_it_is_shared(tmp_path):
    # the prompts share 50 tokens: block 2's next token (48) is shared too, so eagle hits 3 blocks
    shared = list(range(1, 51))
    rows = [{"timestamp": 0, "tokens": shared + [100], "output_length": 2},
            {"timestamp": 100, "tokens": shared + [200], "output_length": 2}]
    assert [r["hit_tokens"] for r in _sim(tmp_path, _trace(tmp_path, rows), "eagle")] == [0, 48]


def test_a_prompt_of_whole_blocks_caches_its_last_block_only_with_a_token_after_it(tmp_path):
    # a 32-token prompt: under eagle its block 1 is hashed with the first generated token, which no
    # later prompt quotes (the trace gives no reply ids), so the same 32 tokens + 16 hit 1 block, not 2
    p = list(range(1, 33))
    rows = [{"timestamp": 0, "tokens": p, "output_length": 3},
            {"timestamp": 100, "tokens": p + list(range(40, 56)), "output_length": 2}]
    assert [r["hit_tokens"] for r in _sim(tmp_path, _trace(tmp_path, rows), "eagle")] == [0, 16]
    assert [r["hit_tokens"] for r in _sim(tmp_path, _trace(tmp_path, rows), "ngram")] == [0, 32]


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=70), st.lists(st.integers(0, 5), min_size=1, max_size=40),
       st.integers(0, 2))
def test_reply_names_with_lookahead_are_the_quoting_prompts_names(prompt, reply, lookahead):
    # a reply's blocks are named as a later prompt quoting prompt + reply names the same tokens, with the
    # lookahead too; the prompt keeps (len - lookahead) // 16 of them
    from dynlab.traces.replies import reply_names

    names, replied = reply_names(prompt, reply, 16, lookahead=lookahead)
    assert len(names) == max(0, (len(prompt) - lookahead) // 16)
    quote = prompt + reply + [9]  # the next turn: the whole exchange and more
    later = lookahead_names(block_hashes(quote, 16), quote, 16, lookahead)
    full = list(names) + list(replied)
    assert full == later[:len(full)]
    # the last generated token's KV is never computed, and a name needs the lookahead tokens after it
    assert len(full) == (len(prompt) + len(reply) - max(1, lookahead)) // 16


def test_compare_and_sweep_name_blocks_as_sim_does(tmp_path):
    # compare loads a trace once for all its runs, and sweep/plan through cached_trace: both must give a run
    # with eagle the names sim gives it (a review found them plain); a --spec-tokens 0 run keeps plain names
    from click.testing import CliRunner

    from dynlab.cli import main
    from dynlab.engine.config import SimConfig
    from dynlab.sweep.executors import cached_trace, clear_trace_cache

    shared = list(range(1, 49))
    rows = [{"timestamp": 0, "tokens": shared + list(range(100, 110)), "output_length": 8},
            {"timestamp": 30, "tokens": shared + list(range(200, 220)), "output_length": 5}]
    trace = _trace(tmp_path, rows)
    r = CliRunner().invoke(main, ["compare", "--timing", "--workers", "1", "--mode", "rr", "--trace", trace,
                                  "--trace-format", "tokens", "--block", "16", "--capacity", "64",
                                  "--spec-method", "eagle", "--spec-tokens", "0,2", "--quiet", "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["0"]["prefix_hit_rate"] == round(48 / 126, 4)  # (58 + 68 prompt tokens) the second prompt's 3 shared blocks
    assert out["2"]["prefix_hit_rate"] == round(32 / 126, 4)  # eagle: block 2 is named with token 48
    r = CliRunner().invoke(main, ["compare", "--timing", "--workers", "1", "--mode", "rr", "--trace", "-",
                                  "--trace-format", "tokens", "--block", "16", "--capacity", "64",
                                  "--spec-method", "eagle", "--spec-tokens", "0,2", "--quiet", "--format", "json"],
                           input=open(trace).read())
    assert r.exit_code == 0, r.output  # stdin read once, each run names its blocks from that copy (was refused)
    piped = json.loads(r.stdout)
    for k in ("0", "2"):  # the same runs as from the file
        assert piped[k] == out[k]
    clear_trace_cache()
    base = dict(timing=True, trace=trace, trace_format="tokens", block=16, spec_method="eagle")
    plain, eagle = (cached_trace(SimConfig(**base, spec_tokens=k)) for k in (0, 2))
    from dynlab.traces.reader import load_trace

    assert [r.hashes for r in plain] == [r.hashes for r in load_trace(trace, "tokens", 16)]
    assert [r.hashes for r in eagle] == [r.hashes for r in load_trace(trace, "tokens", 16, hash_lookahead=1)]
    assert plain[1].hashes != eagle[1].hashes
    clear_trace_cache()


def test_submit_wants_exactly_the_names_of_its_lookahead():
    # block 16, 32 tokens: 2 names plainly; with EAGLE's hash lookahead (a name covers the token after
    # its block) (32 - 1) // 16 = 1. Each count is accepted only where it is right, and a wrong one
    # names the count wanted.
    eagle = _spec("eagle")
    eagle.hash_lookahead = 1
    w = EngineWorker(0, 16, 16, Linear(10, 1, 2), spec=eagle)
    assert w.submit(_req("r", 0.0, 32, 4, [1]), 0.0)
    for names in ([1, 2], []):
        with pytest.raises(ValueError, match=rf"{len(names)} block names for 32 tokens at block 16 \(want 1\)"):
            w.submit(_req("s", 0.0, 32, 4, names), 0.0)
    plain = EngineWorker(0, 16, 16, Linear(10, 1, 2), spec=_spec("eagle"))  # hash_lookahead 0: a P/D decode's
    assert plain.submit(_req("r", 0.0, 32, 4, [1, 2]), 0.0)
    with pytest.raises(ValueError, match=r"want 2"):
        plain.submit(_req("s", 0.0, 32, 4, [1]), 0.0)


def test_the_hash_lookahead_has_one_rule():
    # SpecDecoding itself sets none; a timed run's spec_decoding applies hash_lookahead_tokens(config)
    from dynlab.engine.config import SimConfig
    from dynlab.engine.serving import spec_decoding
    from dynlab.engine.spec import hash_lookahead_tokens

    assert all(_spec(m).hash_lookahead == 0 for m in ("ngram", "eagle", "eagle3", "mtp", "draft"))
    for method in ("ngram", "eagle", "eagle3", "mtp", "draft"):
        for split in (None, "1:1"):
            c = SimConfig(timing=True, spec_method=method, spec_tokens=2, split=split)
            assert spec_decoding(c).hash_lookahead == hash_lookahead_tokens(c)
            assert hash_lookahead_tokens(c) == (method in ("eagle", "eagle3", "mtp") and split is None)
