"""Throughput of ``KvIndex``: ``apply_stored`` and ``find_matches`` on 128-block sequences, 8 to 512 workers.

Workload: ``--sequences`` sequences of ``--depth`` chained block names (random 64-bit
ints, like vLLM's and Dynamo's sequence hashes). Each sequence starts with the
``--head``-block head of one of ``--heads`` shared prompts (a system prompt) and
continues with names of its own. Each sequence is stored (one ``apply_stored`` event)
on a worker chosen at random, then ``find_matches`` is asked for every sequence: its
owner matches all ``--depth`` blocks, every other worker holding the same head matches
``--head`` blocks and must be reported too, so with shared heads the answer itself
grows with the number of workers (about 360 of 512 workers per query with 16 heads).

By default two scenarios run: no shared head (the walk alone) and 16 shared heads of
4 blocks. For each worker count it prints events/s and blocks/s for ``apply_stored``,
queries/s and µs/query for ``find_matches``, and the cost ratio against the smallest
worker count (the issue's target: within 2x from 8 to 512 workers).

    python benchmarks/bench_index.py [--workers 8,64,512] [--sequences 10000] [--head N] [--repeat 3]
"""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from dynlab.routing.index import KvIndex


def make_sequences(n: int, depth: int, heads: int, head: int, seed: int) -> list[list[int]]:
    """``n`` sequences of ``depth`` random 64-bit names; sequence i starts with shared head ``i % heads``."""
    rng = random.Random(seed)
    bits = rng.getrandbits
    head_names = [[bits(64) for _ in range(head)] for _ in range(heads)]
    return [head_names[i % heads] + [bits(64) for _ in range(depth - head)] for i in range(n)]


def timed(fn) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        gc.enable()


def bench(n_workers: int, seqs: list[list[int]], repeat: int, seed: int) -> dict:
    rng = random.Random(seed)
    owners = [rng.randrange(n_workers) for _ in seqs]
    store_times, query_times = [], []
    matched = 0
    for _ in range(repeat):
        index = KvIndex()
        apply_stored = index.apply_stored

        def store():
            for w, s in zip(owners, seqs):
                apply_stored(w, s)

        store_times.append(timed(store))
        find_matches = index.find_matches
        results: list = []

        def query():
            append = results.append
            for s in seqs:
                append(find_matches(s))

        query_times.append(timed(query))
        # Sanity: every sequence is fully matched by its owner.
        assert all(r.get(w) == len(s) for r, w, s in zip(results, owners, seqs))
        matched = statistics.mean(len(r) for r in results)
    n, blocks = len(seqs), sum(len(s) for s in seqs)
    t_store, t_query = min(store_times), min(query_times)
    return {
        "workers": n_workers,
        "events_per_s": n / t_store,
        "blocks_per_s": blocks / t_store,
        "queries_per_s": n / t_query,
        "us_per_query": t_query / n * 1e6,
        "workers_matched": matched,
    }


def run_scenario(workers: list[int], sequences: int, depth: int, heads: int, head: int, repeat: int,
                 seed: int) -> None:
    seqs = make_sequences(sequences, depth, heads, head, seed)
    shared = f"{heads} shared heads of {head} blocks" if head else "no shared head (every name distinct)"
    print(f"\nKvIndex: {sequences} sequences x {depth} blocks, {shared}; best of {repeat}")
    print(f"{'workers':>7}  {'stored events/s':>15}  {'blocks/s':>11}  {'find_matches/s':>14}  {'us/query':>8}  "
          f"{'workers matched/query':>21}")
    rows = []
    for w in workers:
        r = bench(w, seqs, repeat, seed + w)
        rows.append(r)
        print(f"{r['workers']:>7}  {r['events_per_s']:>15,.0f}  {r['blocks_per_s']:>11,.0f}  "
              f"{r['queries_per_s']:>14,.0f}  {r['us_per_query']:>8.2f}  {r['workers_matched']:>21.1f}")
    base = min(rows, key=lambda r: r["workers"])
    for r in rows:
        if r is base:
            continue
        ratio = r["us_per_query"] / base["us_per_query"]
        verdict = "within 2x" if ratio <= 2 else "NOT within 2x"
        print(f"find_matches cost, {r['workers']} vs {base['workers']} workers: {ratio:.2f}x ({verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="8,64,512", help="comma list of worker counts")
    parser.add_argument("--sequences", type=int, default=10_000)
    parser.add_argument("--depth", type=int, default=128, help="blocks per sequence")
    parser.add_argument("--heads", type=int, default=16, help="distinct shared heads")
    parser.add_argument("--head", type=int, default=None,
                        help="blocks in a shared head [default: run both 0 (no sharing) and 4]")
    parser.add_argument("--repeat", type=int, default=3, help="runs per worker count (best is reported)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    for head in ([0, 4] if args.head is None else [args.head]):
        run_scenario(workers, args.sequences, args.depth, args.heads, head, args.repeat, args.seed)


if __name__ == "__main__":
    main()
