"""Hash schemes (``dynlab`` / ``dynamo``), vLLM's extra keys, event checks in ``KvIndex`` and ``events replay``."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from importlib import resources

import pytest
import xxhash
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

import dynlab
from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.errors import DynlabError
from dynlab.sim.runner import run
from dynlab.routing.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch
from dynlab.routing.events_io import frame, read_batches, replay_events
from dynlab.routing.hashing import block_hashes, dynamo_local_hashes, dynamo_seed
from dynlab.routing.index import KvIndex
from dynlab.routing.router import KvRouter

U32 = 2**32 - 1
SCHEMES = ["dynlab", "dynamo"]
KEYS = st.sampled_from([None, "", "X", "adapter-é"])


@st.composite
def related(draw, tokens=st.integers(0, 2), max_len=14):
    """Token lists sharing heads: each a random cut of an earlier one plus a random tail."""
    seqs = [draw(st.lists(tokens, max_size=max_len))]
    for _ in range(draw(st.integers(1, 5))):
        parent = draw(st.sampled_from(seqs))
        cut = draw(st.integers(0, len(parent)))
        seqs.append(parent[:cut] + draw(st.lists(tokens, max_size=max_len - cut)))
    return seqs


# ------------------------------------------------------------------ properties, both schemes


@pytest.mark.parametrize("scheme", SCHEMES)
@given(seqs=st.one_of(related(), related(st.sampled_from([0, 1, 12, 23, 123, U32, U32 - 1]), 10)),
       block=st.integers(1, 4), lora=KEYS, salt=KEYS)
def test_names_identify_whole_prefixes_and_keys(scheme, seqs, block, lora, salt):
    """Names are equal exactly when (whole prefix, lora_name, cache_salt) are, under both schemes;
    each sequence is hashed with and without the keys (empty strings count as absent)."""
    name_of: dict = {}
    key_of: dict = {}
    for tokens in seqs:
        for keys in ((None, None), (lora or None, salt or None)):
            names = block_hashes(tokens, block, scheme=scheme, lora_name=keys[0], cache_salt=keys[1])
            assert len(names) == len(tokens) // block
            for i, name in enumerate(names):
                key = (tuple(tokens[: (i + 1) * block]), keys)
                assert name_of.setdefault(key, name) == name
                assert key_of.setdefault(name, key) == key


@pytest.mark.parametrize("scheme", SCHEMES)
def test_names_are_the_same_in_another_process(scheme):
    """Deterministic across processes (another PYTHONHASHSEED): no built-in hash()."""
    cases = [([i % 7 for i in range(n)], b, lora) for n, b, lora in ((0, 1, None), (40, 16, None), (33, 4, "X"))]
    code = ("import json, sys; from dynlab.routing.hashing import block_hashes as h; "
            f"print(json.dumps([h(t, b, scheme={scheme!r}, lora_name=l) for t, b, l in json.load(sys.stdin)]))")
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(cases), capture_output=True, text=True,
                          env=dict(os.environ, PYTHONHASHSEED="12345"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [block_hashes(t, b, scheme=scheme, lora_name=l) for t, b, l in cases]


def test_default_scheme_keeps_the_labs_names():
    """Without extra keys the dynlab scheme is the labs' (a pinned value from before this change)."""
    assert block_hashes(list(range(40)), 16) == block_hashes(list(range(40)), 16, scheme="dynlab", lora_name="",
                                                             cache_salt=None)
    assert block_hashes([1, 2], 2) == [block_hashes([1, 2], 2)[0]]


# ------------------------------------------------------------------ Dynamo's formulas, by hand


def test_dynamo_hashes_by_the_formula():
    """Local hash: xxh3_64 of the block's tokens as u32 LE, seed 1337; sequence hash 0 = local 0,
    then xxh3_64(parent seq || local, both u64 LE, seed 1337) (the issue's definition, computed here
    directly with xxhash)."""
    tokens = [1, 2, 3, 4, 5, 6]
    local = [xxhash.xxh3_64_intdigest(struct.pack("<2I", *tokens[i:i + 2]), seed=1337) for i in (0, 2, 4)]
    assert dynamo_local_hashes(tokens, 2) == local
    s1 = xxhash.xxh3_64_intdigest(struct.pack("<QQ", local[0], local[1]), seed=1337)
    s2 = xxhash.xxh3_64_intdigest(struct.pack("<QQ", s1, local[2]), seed=1337)
    assert block_hashes(tokens, 2, scheme="dynamo") == [local[0], s1, s2]
    # [1, 2] at block 2: the value dynamo.llm.compute_block_hash_for_seq([1, 2], 2) returned (1.6.1)
    assert dynamo_local_hashes([1, 2], 2) == [10773075109927122010]


def test_dynamo_seed_rule():
    """seed = 1337 + xxh3_64(lora, seed 0) + xxh3_64(namespace, seed 1) mod 2**64; empty = absent
    (Dynamo's compute_salt_hash); the chain seed stays 1337."""
    x0 = xxhash.xxh3_64_intdigest(b"X", seed=0)
    n1 = xxhash.xxh3_64_intdigest(b"N", seed=1)
    assert dynamo_seed() == dynamo_seed("", "") == 1337
    assert dynamo_seed("X") == (1337 + x0) % 2**64
    assert dynamo_seed("X", "N") == (1337 + x0 + n1) % 2**64
    assert dynamo_local_hashes([7, 8], 2, lora_name="X") == [
        xxhash.xxh3_64_intdigest(struct.pack("<2I", 7, 8), seed=dynamo_seed("X"))]
    # [1, 2] under lora "X": the value Dynamo 1.6.1 returned
    assert dynamo_local_hashes([1, 2], 2, lora_name="X") == [1236274047140039206]


@pytest.mark.parametrize("bad", [-1, 2**32, 2**40])
def test_dynamo_tokens_must_fit_u32(bad):
    with pytest.raises(ValueError, match=r"position 1 is outside the unsigned 32-bit range"):
        block_hashes([1, bad, 3, 4], 2, scheme="dynamo")


def test_bad_scheme_and_keys():
    with pytest.raises(ValueError, match="unknown hash scheme 'x'"):
        block_hashes([1], 1, scheme="x")
    with pytest.raises(ValueError, match="lora_name must be a string"):
        block_hashes([1], 1, lora_name=3)
    with pytest.raises(ValueError, match="unknown hash scheme"):
        KvRouter(2, scheme="blake")


def test_top_level_api():
    assert dynlab.dynamo_local_hashes is dynamo_local_hashes
    assert dynlab.block_hashes([1, 2], 2, scheme="dynamo") == dynamo_local_hashes([1, 2], 2)


# ------------------------------------------------------------------ LoRA and salt never share


@pytest.mark.parametrize("scheme", SCHEMES)
def test_token_trace_lora_then_salt_is_no_hit(tmp_path, scheme):
    """The issue's example: {"tokens": [1, 2], "lora_name": "X"} then {..., "cache_salt": "X"} must not hit;
    a plain repeat of the first line must (3 distinct first blocks, 1 repeat, by hand)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"tokens": [1, 2], "lora_name": "X"}\n{"tokens": [1, 2], "cache_salt": "X"}\n'
                     '{"tokens": [1, 2]}\n{"tokens": [1, 2], "lora_name": "X"}\n')
    out = run(SimConfig(mode="kv", workers=1, block=2, trace=str(trace), hash=scheme))
    assert (out["repeat_requests"], out["hits"], out["cached_blocks"]) == (1, 1, 1)


def test_mooncake_rows_with_keys_never_share(tmp_path):
    trace = tmp_path / "m.jsonl"
    rows = [{"hash_ids": [1, 2]}, {"hash_ids": [1, 2], "lora_name": "A"}, {"hash_ids": [1, 2], "cache_salt": "A"},
            {"hash_ids": [1, 2], "lora_name": ""}]  # the last: an empty name is no name, so it repeats the first
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run(SimConfig(mode="kv", workers=1, trace=str(trace)))
    assert (out["repeat_requests"], out["hits"], out["cached_blocks"]) == (1, 1, 2)


def test_hash_dynamo_on_mooncake_is_a_usage_error():
    result = CliRunner().invoke(main, ["sim", "--trace", "mooncake-conversation", "--hash", "dynamo"])
    assert result.exit_code == 2
    assert "--hash has no effect on mooncake traces: they carry their own block names" in result.output


def test_sim_hash_dynamo_on_the_seed_workload():
    """The seed workload's routing depends only on name equality, so both schemes give the same counts;
    the run says which scheme named its blocks."""
    a = run(SimConfig(mode="kv-events", hash="dynlab", all_metrics=True))
    b = run(SimConfig(mode="kv-events", hash="dynamo", all_metrics=True))
    assert (a.pop("hash"), b.pop("hash")) == ("dynlab", "dynamo")
    assert a == b
    assert (b["events_refused_block_size"], b["events_refused_parent"]) == (0, 0)
    with pytest.raises(ValueError, match="hash must be one of"):
        run(SimConfig(hash="md5"))


# ------------------------------------------------------------------ the index's event checks


def test_router_refuses_events_of_another_block_size():
    """The issue's silent case: a router at 16 fed events hashed at 64 now refuses and counts them."""
    tokens = list(range(128))
    r = KvRouter(2, block=16, use_events=True)
    assert r.on_event(BlockStored(1, tuple(block_hashes(tokens, 64)), block_size=64)) is False
    assert r.refused == {"block_size": 1, "parent": 0, "stored": 1}
    assert r.on_event(BlockStored(1, tuple(block_hashes(tokens, 16)), block_size=16)) is True
    r.route(tokens)
    assert r.last_overlap == 8  # 128 / 16 blocks, all held by worker 1


def test_unknown_parent_is_refused_and_known_parent_applies():
    ix = KvIndex(4)
    assert not ix.apply_event(BlockStored(0, (2,), parent_block_hash=1, block_size=4))
    assert ix.apply_event(BlockStored(0, (1,), block_size=4))
    assert not ix.apply_event(BlockStored(1, (2,), parent_block_hash=1))  # worker 1 does not hold 1
    assert ix.apply_event(BlockStored(0, (2,), parent_block_hash=1))
    assert (ix.refused_parent, ix.refused_block_size, len(ix)) == (2, 0, 2)


def test_duplicate_stored_events_keep_live_copies():
    """Two copies stored, one removed: still held; the second removal forgets it; a duplicate removal is harmless."""
    ix = KvIndex()
    ix.apply_event(BlockStored(0, (5, 6)))
    ix.apply_event(BlockStored(0, (5,)))
    ix.apply_event(BlockRemoved(0, (5,)))
    assert ix.find_matches([5, 6]) == {0: 2}
    ix.apply_event(BlockRemoved(0, (5,)))
    ix.apply_event(BlockRemoved(0, (5,)))
    assert ix.find_matches([5, 6]) == {}
    ix.apply_event(BlockStored(0, (5,)))
    ix.apply_event(BlockStored(0, (5,)))
    ix.apply_event(AllBlocksCleared(0))
    ix.apply_event(BlockStored(0, (5,)))
    ix.apply_event(BlockRemoved(0, (5,)))
    # the clear dropped 6 and both copies of 5, so the last store + remove leave nothing (a stale
    # copy count would have kept 5)
    assert len(ix) == 0


@given(ops=st.lists(st.tuples(st.sampled_from(["s", "r", "c"]), st.integers(0, 2), st.integers(0, 3)), max_size=40))
def test_index_equals_a_multiset_model(ops):
    """apply_event agrees with a plain model: per (worker, block), the number of live copies."""
    ix, model = KvIndex(), {}
    for op, w, h in ops:
        if op == "s":
            ix.apply_event(BlockStored(w, (h,)))
            model[(w, h)] = model.get((w, h), 0) + 1
        elif op == "r":
            ix.apply_event(BlockRemoved(w, (h,)))
            if model.get((w, h)):
                model[(w, h)] -= 1
        else:
            ix.apply_event(AllBlocksCleared(w))
            model = {k: n for k, n in model.items() if k[0] != w}
        for block in range(4):
            assert ix.holders(block) == frozenset(w for (w, b), n in model.items() if b == block and n)


def test_events_keep_the_short_forms():
    ev = BlockStored(3, (1, 2))
    assert ev.hashes == ev.block_hashes == (1, 2)
    assert (ev.parent_block_hash, ev.block_size, ev.medium, ev.lora_name, ev.token_ids) == (None, None, "GPU", None, None)
    assert BlockRemoved(3, (1,)).medium == "GPU"
    assert KvEventBatch(1.5, (ev,), 7).seq == 7


# ------------------------------------------------------------------ events replay


def _fixture(name: str) -> str:
    return str(resources.files("dynlab").joinpath("data", "fixtures", name))


# by hand, from the stream benchmarks/make_events_fixture.py describes in its docstring
FIXTURE_WORKERS = [
    {"worker": 0, "stored": 4, "removed": 1, "cleared": 0, "blocks": 6, "refused_parent": 1, "refused_block_size": 1},
    {"worker": 1, "stored": 2, "removed": 1, "cleared": 1, "blocks": 0, "refused_parent": 0, "refused_block_size": 0},
]


@pytest.mark.parametrize("name", ["kv_events.msgpack", "kv_events.jsonl"])
def test_replay_reads_the_fixture(name):
    out = replay_events(_fixture(name))
    assert (out["batches"], out["block_size"], out["workers"]) == (11, 4, FIXTURE_WORKERS)


def test_fixture_is_what_the_script_writes(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "make_events_fixture.py")
    proc = subprocess.run([sys.executable, script, "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in ("kv_events.msgpack", "kv_events.jsonl"):
        assert (tmp_path / name).read_bytes() == open(_fixture(name), "rb").read()


def test_replay_cli_and_block_option(tmp_path):
    result = CliRunner().invoke(main, ["events", "replay", _fixture("kv_events.msgpack"), "--block", "64"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["block_size"] == 64
    # worker 0 sends 5 stored events at 4 tokens (refused) and 1 at 64 (applied); worker 1 sends 2 at 4
    assert [(w["stored"], w["refused_block_size"]) for w in out["workers"]] == [(1, 5), (0, 2)]


def test_replay_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ts": 1, "events": []}\n{"ts": 1, "events": [["BlockStored", [1]]]}\n')
    result = CliRunner().invoke(main, ["events", "replay", str(bad)])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {bad}:2: BlockStored needs block_hashes, parent_block_hash, " \
                                    "token_ids and block_size, got ['BlockStored', [1]]"
    trunc = tmp_path / "t.msgpack"
    trunc.write_bytes(frame(KvEventBatch(0.0, (AllBlocksCleared(0),)))[:-1])
    result = CliRunner().invoke(main, ["events", "replay", str(trunc)])
    assert result.exit_code == 1 and "t.msgpack:1: truncated payload" in result.output
    result = CliRunner().invoke(main, ["events", "replay", str(tmp_path / "none")])
    assert result.exit_code == 2 and "cannot open" in result.output  # a usage error, as tests/test_input_files.py


@pytest.mark.parametrize("body", [b"", b"\n\n  \n"], ids=["empty", "blank-lines"])
def test_replay_of_no_batch_is_an_error_naming_the_file(tmp_path, body):
    # a recording that saved nothing: one line naming the file, exit 1 (as a trace that holds no request), no JSON
    path = tmp_path / "none.jsonl"
    path.write_bytes(body)
    result = CliRunner().invoke(main, ["events", "replay", str(path)])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [f"Error: {path}: holds no KV-event batch (an empty recording; "
                                                  "docs/events.md has the framing)"]
    with pytest.raises(DynlabError, match="holds no KV-event batch"):
        replay_events(str(path))


def test_replay_of_a_batch_of_no_event_counts_it(tmp_path):
    # one batch whose events list is empty: 1 batch, no worker seen, no block size read (exit 0)
    path = tmp_path / "quiet.jsonl"
    path.write_text('{"ts": 0.5, "events": []}\n')
    result = CliRunner().invoke(main, ["events", "replay", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"file": str(path), "batches": 1, "block_size": None, "workers": []}


def test_msgpack_bytes_hashes_and_vllm_short_arrays(tmp_path):
    """vLLM omits trailing defaults and may send bytes hashes: both are read."""
    import msgpack

    payload = msgpack.packb([2.0, [["BlockStored", [b"\x01" * 32], None, [1, 2], 2], ["BlockRemoved", [b"\x01" * 32]]],
                             None])
    path = tmp_path / "v.msgpack"
    path.write_bytes(struct.pack(">QI", 9, len(payload)) + payload)
    (batch,) = read_batches(str(path))
    assert (batch.seq, batch.dp_rank, batch.events[0].block_size, batch.events[1].medium) == (9, 0, 2, "GPU")


# ------------------------------------------------------------------ Dynamo itself (bench extra)


@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("lora", [None, "my-adapter"])
def test_local_hashes_equal_dynamos(block, lora):
    """dynlab's dynamo local hashes equal dynamo.llm.compute_block_hash_for_seq (ai-dynamo-runtime 1.6.1)."""
    llm = pytest.importorskip("dynamo.llm", reason="needs the bench extra (ai-dynamo-runtime==1.6.1)")
    import random

    rnd = random.Random(block * 7 + (lora is not None))
    for _ in range(25):
        tokens = [rnd.randrange(2**32) for _ in range(rnd.randrange(0, 5 * block))]
        theirs = llm.compute_block_hash_for_seq(tokens, block, lora_name=lora)
        assert dynamo_local_hashes(tokens, block, lora_name=lora) == list(theirs)
        assert dynamo_local_hashes(tokens, block, lora_name=lora, cache_salt="ns") == list(
            llm.compute_block_hash_for_seq(tokens, block, lora_name=lora, cache_namespace="ns"))


def test_a_run_whose_events_were_all_refused_warns():
    """An engine publishing at another block size: every stored event refused, the JSON counts them, a warning says so."""
    import random
    import warnings

    from dynlab import plugins
    from dynlab.engine.run import build_strategy, make_workers
    from dynlab.sim.drive import replay

    strategy = build_strategy(SimConfig(mode="kv-events", workers=2), random.Random(1), plugins.strategies())
    apply = strategy.on_event

    def at_64(ev):  # as an engine hashing at 64 tokens would publish them
        apply(BlockStored(ev.worker, ev.hashes, block_size=64) if type(ev) is BlockStored else ev)

    strategy.on_event = at_64
    requests = [dynlab.routing.Request(tuple(block_hashes(list(range(32)), 16)), index=i) for i in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = replay(requests, strategy, make_workers(SimConfig(workers=2)))
    # the index learns nothing, so requests go by load: 0 -> worker 0, 1 -> worker 1 (each one stored event,
    # refused), 2 -> worker 0 again, whose cache does hold both blocks
    assert (out["events_refused_block_size"], out["cached_blocks"]) == (2, 2)
    assert any("refused every one of its 2 stored KV events" in str(w.message) for w in caught)
