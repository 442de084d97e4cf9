"""Throughput of ``LRUCache.access`` on the bundled Mooncake conversation trace (not run by CI).

Each of the trace's 12,031 requests touches its ``hash_ids`` in order, each block of size 1:
288,500 block accesses over 182,790 distinct blocks. The cache is sized at 1%, 10% and 50% of
the distinct blocks; for each capacity the script prints accesses per second (best of
``--repeat`` runs, each on a fresh cache, trace parsing excluded) and the hit ratio.

For scale it also times a bare loop over one ``OrderedDict`` doing the same LRU work inline
(no method call, no size bookkeeping), and, with ``--all-policies``, every registered policy.

    python benchmarks/bench_lru.py [--repeat 5] [--all-policies]
"""
from __future__ import annotations

import argparse
import gzip
import json
import platform
import time
from collections import OrderedDict
from importlib import resources

from dynlab.kv.policies import LRUCache

FRACTIONS = (0.01, 0.10, 0.50)


def load_accesses() -> list[int]:
    path = resources.files("dynlab") / "data" / "traces" / "mooncake_conversation.jsonl.gz"
    keys: list[int] = []
    with path.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                keys.extend(json.loads(line)["hash_ids"])
    return keys


def run_policy(cls, capacity: int, keys: list, future=None) -> tuple[float, int]:
    cache = cls(capacity, future=future) if future is not None else cls(capacity)
    access = cache.access
    hits = 0
    start = time.perf_counter()
    for key in keys:
        if access(key, 1):
            hits += 1
    elapsed = time.perf_counter() - start
    assert cache.used <= capacity
    return elapsed, hits


def run_bare(capacity: int, keys: list) -> tuple[float, int]:
    data: OrderedDict = OrderedDict()
    move, pop = data.move_to_end, data.popitem
    hits = 0
    start = time.perf_counter()
    for key in keys:
        if key in data:
            move(key)
            hits += 1
        else:
            if len(data) >= capacity:
                pop(last=False)
            data[key] = 1
    return time.perf_counter() - start, hits


def best(fn, repeat: int) -> tuple[float, int]:
    runs = [fn() for _ in range(repeat)]
    hits = {h for _, h in runs}
    assert len(hits) == 1, "hit counts differ between runs"
    return min(t for t, _ in runs), hits.pop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure; the fastest is reported")
    parser.add_argument("--all-policies", action="store_true", help="also time every registered policy")
    args = parser.parse_args()

    keys = load_accesses()
    distinct = len(set(keys))
    n = len(keys)
    print(f"trace: mooncake_conversation, {n:,} block accesses, {distinct:,} distinct blocks")
    print(f"python {platform.python_version()} on {platform.machine()}, best of {args.repeat} runs\n")

    header = f"{'capacity':>18}  {'LRUCache.access/s':>18}  {'hit ratio':>9}  {'bare OrderedDict/s':>18}  {'ratio':>5}"
    print(header)
    for fraction in FRACTIONS:
        capacity = int(distinct * fraction)
        t, hits = best(lambda: run_policy(LRUCache, capacity, keys), args.repeat)
        tb, hits_bare = best(lambda: run_bare(capacity, keys), args.repeat)
        assert hits == hits_bare, (hits, hits_bare)
        label = f"{capacity:,} ({fraction:.0%})"
        print(f"{label:>18}  {n / t:>18,.0f}  {hits / n:>9.4f}  {n / tb:>18,.0f}  {t / tb:>5.2f}")

    if args.all_policies:
        from dynlab.kv.policies import FutureIndex
        from dynlab.plugins import eviction_policies

        future = FutureIndex(keys)
        print(f"\n{'policy':>6}  {'capacity':>18}  {'accesses/s':>12}  {'hit ratio':>9}")
        for entry in eviction_policies().entries():
            for fraction in FRACTIONS:
                capacity = int(distinct * fraction)
                t, hits = best(lambda: run_policy(entry.cls, capacity, keys, future=future), max(1, args.repeat // 2))
                label = f"{capacity:,} ({fraction:.0%})"
                print(f"{entry.name:>6}  {label:>18}  {n / t:>12,.0f}  {hits / n:>9.4f}")


if __name__ == "__main__":
    main()
