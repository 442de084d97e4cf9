"""``KvIndex`` side by side with NVIDIA Dynamo's Rust radix tree, through its Python bindings.

Needs the ``bench`` extra (``pip install -e '.[bench]'``, which pins
``ai-dynamo-runtime==1.6.1``); without it the script says so in one line and prints
``KvIndex``'s own figures only.

Workload: ``--sequences`` token sequences of ``--depth`` blocks of ``--block`` tokens,
built so that prefixes are shared the way real traffic shares them:

* ``--prompts`` system prompts of ``--prompt-blocks`` blocks;
* ``--contexts`` contexts (a document, an earlier conversation) of ``--context-blocks``
  blocks, context ``c`` following system prompt ``c % prompts``;
* each sequence takes a context at random (seeded), then one *turn marker* block whose
  tokens are the same in every sequence (so the same local hash sits under hundreds of
  different prefixes), then blocks of its own up to ``--depth``.

Sequence ``i`` is stored on worker ``i % workers`` by one stored event of all its
blocks (parent: none), then ``find_matches`` is asked for every sequence.

Names: Dynamo's own. A block's *local hash* is :func:`dynlab.dynamo_local_hashes` (xxh3-64,
seed 1337, of its tokens as u32; ``tokens_hash`` in Dynamo's event, and what
``dynamo.llm.compute_block_hash_for_seq`` returns: the script checks that on the first
sequences); its *sequence hash* is ``dynlab.block_hashes(..., scheme="dynamo")``, chained over
the blocks before it (``block_hash``). ``KvIndex`` is keyed by sequence hashes and queried
with them; Dynamo's tree is queried with local hashes, which it walks from the root: both
get the same real hashes a Dynamo deployment would see. The script checks that
(parent, local) -> sequence hash is one-to-one over the whole workload before timing anything.

Timed: only the index operations. ``KvIndex.apply_stored(worker, sequence_hashes)`` vs
``RadixTree.apply_event(worker, json_bytes)`` (the JSON bytes are encoded beforehand,
not timed: the encoding time is printed separately; Dynamo's own JSON *decoding* is
inside ``apply_event`` and so is timed). An extra line times ``KvIndex`` fed the same
JSON bytes (``json.loads`` included) for reference. ``KvIndex.find_matches(sequence
hashes)`` (a dict) vs ``RadixTree.find_matches(local hashes).scores`` (a dict keyed by
``(worker_id, dp_rank)``; reading ``.scores`` is timed, as any caller must).
``--repeat`` rounds, each timing KvIndex, Dynamo and KvIndex-on-JSON in turn on fresh
indexes (interleaved, so that load from other processes falls on all alike); the best
time of each is reported, with ``time.perf_counter``, GC off while timing.
``KvIndex`` runs in-process in Python; every Dynamo call crosses the Python/Rust
boundary (PyO3) and is served by Dynamo's background thread, so the CPU seconds of
the process (all threads) are printed too.

Then the scores are compared query by query (worker ids as ints, every ``dp_rank`` 0);
the script prints the number of mismatches and exits 1 if there is any.

    python benchmarks/bench_dynamo.py [--sequences 10000] [--depth 128] [--workers 8] [--repeat 3]
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import struct
import sys
import time

from dynlab.routing.hashing import block_hashes, dynamo_local_hashes
from dynlab.routing.index import KvIndex


# --------------------------------------------------------------------------- workload


def make_workload(args) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """(owner worker, sequence hashes, local hashes) for every sequence."""
    rng = random.Random(args.seed)
    blk = args.block

    def tokens(n_blocks: int) -> list[int]:
        n = n_blocks * blk
        return list(struct.unpack(f"<{n}H", rng.randbytes(2 * n)))  # vocabulary of 65,536

    tail = args.depth - args.prompt_blocks - args.context_blocks - 1
    if tail < 0:
        raise SystemExit("--depth must be at least --prompt-blocks + --context-blocks + 1")
    prompts = [tokens(args.prompt_blocks) for _ in range(args.prompts)]
    contexts = [prompts[c % args.prompts] + tokens(args.context_blocks) for c in range(args.contexts)]
    marker = tokens(1)
    owners, seq_hashes, local_hashes, samples = [], [], [], []
    for i in range(args.sequences):
        toks = contexts[rng.randrange(args.contexts)] + marker + tokens(tail)
        owners.append(i % args.workers)
        seq_hashes.append(block_hashes(toks, blk, scheme="dynamo"))
        local_hashes.append(dynamo_local_hashes(toks, blk))
        if i < 20:
            samples.append(toks)
    return owners, seq_hashes, local_hashes, samples


def check_against_dynamo(samples, local_hashes, blk) -> None:
    """dynlab's local hashes must be the ones Dynamo computes for the same tokens."""
    from dynamo.llm import compute_block_hash_for_seq

    for toks, ours in zip(samples, local_hashes):
        if list(compute_block_hash_for_seq(toks, blk)) != ours:
            raise SystemExit("dynlab's dynamo local hashes differ from dynamo.llm.compute_block_hash_for_seq")


def check_names(seq_hashes, local_hashes) -> int:
    """Check (parent sequence hash, local hash) <-> sequence hash is one-to-one; distinct blocks."""
    child: dict = {}
    node: dict = {}
    for seqs, locs in zip(seq_hashes, local_hashes):
        parent = None
        for s, l in zip(seqs, locs):
            if child.setdefault((parent, l), s) != s or node.setdefault(s, (parent, l)) != (parent, l):
                raise SystemExit("workload error: local and sequence hashes disagree (64-bit collision?)")
            parent = s
    return len(node)


def stored_event(event_id: int, seqs: list[int], locs: list[int]) -> bytes:
    return json.dumps({"event_id": event_id, "data": {"stored": {
        "parent_hash": None,
        "blocks": [{"block_hash": s, "tokens_hash": l} for s, l in zip(seqs, locs)],
    }}}).encode()


# --------------------------------------------------------------------------- timing


def timed(fn) -> tuple[float, float, object]:
    """(wall seconds, process CPU seconds over all threads, fn's result), GC off."""
    gc.collect()
    gc.disable()
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        t1, c1 = time.perf_counter(), time.process_time()
    finally:
        gc.enable()
    return t1 - t0, c1 - c0, out


def best(runs: list[tuple[float, float, object]]) -> tuple[float, float, object]:
    return min(runs, key=lambda r: r[0])


def kvindex_round(owners, seq_hashes):
    index = KvIndex()
    apply_stored = index.apply_stored

    def store():
        for w, s in zip(owners, seq_hashes):
            apply_stored(w, s)

    stored = timed(store)
    find_matches = index.find_matches
    return stored, timed(lambda: [find_matches(s) for s in seq_hashes])


def kvindex_json_round(owners, events):
    """KvIndex fed the same JSON bytes Dynamo gets (json.loads + picking the block hashes)."""
    index = KvIndex()
    apply_stored = index.apply_stored
    loads = json.loads

    def store():
        for w, e in zip(owners, events):
            apply_stored(w, [b["block_hash"] for b in loads(e)["data"]["stored"]["blocks"]])

    return timed(store)


def dynamo_round(RadixTree, owners, events, local_hashes):
    tree = RadixTree()
    apply_event = tree.apply_event
    find_matches = tree.find_matches

    def store():
        for w, e in zip(owners, events):
            apply_event(w, e)
        find_matches([])  # barrier: the tree is served by a background thread

    stored = timed(store)
    return stored, timed(lambda: [find_matches(l).scores for l in local_hashes])


# --------------------------------------------------------------------------- report


def compare(kv_results, dyn_results) -> tuple[int, list[str]]:
    mismatches, examples = 0, []
    for i, (ours, theirs) in enumerate(zip(kv_results, dyn_results)):
        converted = {w: n for (w, dp), n in theirs.items()} if all(dp == 0 for _, dp in theirs) else None
        if converted != ours:
            mismatches += 1
            if len(examples) < 3:
                examples.append(f"  query {i}: KvIndex {dict(sorted(ours.items()))}, Dynamo {dict(sorted(theirs.items()))}")
    return mismatches, examples


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=10_000)
    parser.add_argument("--depth", type=int, default=128, help="blocks per sequence")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--block", type=int, default=16, help="tokens per block")
    parser.add_argument("--prompts", type=int, default=10, help="shared system prompts")
    parser.add_argument("--prompt-blocks", type=int, default=16)
    parser.add_argument("--contexts", type=int, default=500, help="shared contexts (each after one prompt)")
    parser.add_argument("--context-blocks", type=int, default=47)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (the best time of each is reported)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def _radix_tree() -> tuple:
    """``(dynamo.llm.RadixTree, None)``, or ``(None, why it cannot be imported)``."""
    try:
        from dynamo.llm import RadixTree
    except Exception as exc:  # ImportError, or a broken native module
        return None, f"{type(exc).__name__}: {exc}"
    return RadixTree, None


def _rounds(repeat: int, RadixTree, owners, seq_hashes, events, local_hashes) -> tuple:
    """``(kv_store, kv_query, dyn_store, dyn_query, kv_json)``: each round's timings (Dynamo's lists empty
    without ``RadixTree``). Rounds interleave the contenders, so that load from other processes falls on both
    alike."""
    kv_store, kv_query, dyn_store, dyn_query, kv_json = [], [], [], [], []
    for _ in range(repeat):
        stored, queried = kvindex_round(owners, seq_hashes)
        kv_store.append(stored)
        kv_query.append(queried)
        if RadixTree is not None:
            stored, queried = dynamo_round(RadixTree, owners, events, local_hashes)
            dyn_store.append(stored)
            dyn_query.append(queried)
            kv_json.append(kvindex_json_round(owners, events))
    return kv_store, kv_query, dyn_store, dyn_query, kv_json


HEAD = (f"{'':<28}{'stored events/s':>16}{'blocks/s':>12}{'find_matches/s':>16}{'us/query':>10}"
        f"{'CPU/wall store':>16}{'CPU/wall query':>16}")


def _row(label: str, n: int, blocks: int, stores, queries=None) -> str:
    """One line of the table under :data:`HEAD`: ``n`` sequences of ``blocks`` blocks in all, the best round."""
    s_wall, s_cpu, _ = best(stores)
    line = f"{label:<28}{n / s_wall:>16,.0f}{blocks / s_wall:>12,.0f}"
    if queries is None:
        return line + f"{'-':>16}{'-':>10}{s_cpu / s_wall:>16.2f}{'-':>16}"
    q_wall, q_cpu, _ = best(queries)
    return line + (f"{n / q_wall:>16,.0f}{q_wall / n * 1e6:>10.2f}"
                   f"{s_cpu / s_wall:>16.2f}{q_cpu / q_wall:>16.2f}")


def _ratio(theirs, ours, col: int) -> float:
    """KvIndex's speed / Dynamo's, from the best times of column ``col`` (0: wall, 1: CPU)."""
    return min(r[col] for r in theirs) / min(r[col] for r in ours)


def _compare_with_dynamo(n: int, blocks: int, events, t_encode: float, rounds: tuple) -> int:
    """Print the table, the speed ratios and the score comparison of KvIndex and Dynamo; 1 on a mismatch."""
    kv_store, kv_query, dyn_store, dyn_query, kv_json = rounds
    print(f"Dynamo events: JSON bytes encoded beforehand in {t_encode:.2f} s "
          f"({sum(map(len, events)) / 2**20:.0f} MiB), not timed; Dynamo's JSON decoding is timed")
    print(HEAD)
    print(_row("KvIndex (in-process)", n, blocks, kv_store, kv_query))
    print(_row("Dynamo RadixTree (PyO3)", n, blocks, dyn_store, dyn_query))
    print(_row("KvIndex fed the JSON bytes", n, blocks, kv_json))
    for what, theirs, ours in (("stored events", dyn_store, kv_store), ("find_matches", dyn_query, kv_query)):
        r = _ratio(theirs, ours, 0)
        verdict = "target met" if r >= 1 else "target NOT met"
        print(f"{what}: KvIndex is {r:.2f}x Dynamo's speed ({verdict}: at least as fast)")
    print(f"stored events, both fed the same JSON bytes: KvIndex is {_ratio(dyn_store, kv_json, 0):.2f}x "
          f"Dynamo's speed")
    print(f"by CPU seconds (all threads; less sensitive to other load): stored events "
          f"{_ratio(dyn_store, kv_store, 1):.2f}x, find_matches {_ratio(dyn_query, kv_query, 1):.2f}x, "
          f"same JSON bytes {_ratio(dyn_store, kv_json, 1):.2f}x")
    kv_results, dyn_results = best(kv_query)[2], best(dyn_query)[2]
    mismatches, examples = compare(kv_results, dyn_results)
    matched = sum(len(r) for r in kv_results) / n
    print(f"scores compared on {n:,} queries ({matched:.1f} workers matched per query on average): "
          f"{mismatches} mismatches")
    for line in examples:
        print(line)
    return 1 if mismatches else 0


def main() -> int:
    args = _parse_args()
    RadixTree, dynamo_error = _radix_tree()
    t0 = time.perf_counter()
    owners, seq_hashes, local_hashes, samples = make_workload(args)
    if RadixTree is not None:
        check_against_dynamo(samples, local_hashes, args.block)
    distinct = check_names(seq_hashes, local_hashes)
    n, blocks = len(seq_hashes), sum(len(s) for s in seq_hashes)
    tail = args.depth - args.prompt_blocks - args.context_blocks - 1
    print(f"workload: {n:,} sequences x {args.depth} blocks of {args.block} tokens, {args.workers} workers "
          f"(sequence i on worker i % {args.workers}); each = one of {args.prompts} system prompts "
          f"({args.prompt_blocks} blocks) + one of {args.contexts} contexts ({args.context_blocks}) + a turn "
          f"marker block common to all + {tail} blocks of its own; {blocks:,} blocks stored, {distinct:,} "
          f"distinct; built in {time.perf_counter() - t0:.1f} s")
    print(f"timed: index operations only, best of {args.repeat}; KvIndex takes sequence hashes in-process, "
          f"Dynamo takes JSON events and local hashes across the Python/Rust boundary")

    events, t_encode = None, 0.0
    if RadixTree is not None:
        t0 = time.perf_counter()
        events = [stored_event(i, s, l) for i, (s, l) in enumerate(zip(seq_hashes, local_hashes))]
        t_encode = time.perf_counter() - t0
    rounds = _rounds(args.repeat, RadixTree, owners, seq_hashes, events, local_hashes)
    if RadixTree is None:
        print(f"Dynamo comparison skipped: cannot import dynamo.llm.RadixTree ({dynamo_error}); "
              f"install it with pip install -e '.[bench]'")
        print(HEAD)
        print(_row("KvIndex (in-process)", n, blocks, rounds[0], rounds[1]))
        return 0
    return _compare_with_dynamo(n, blocks, events, t_encode, rounds)


if __name__ == "__main__":
    sys.exit(main())
