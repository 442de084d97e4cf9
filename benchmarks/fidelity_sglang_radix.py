"""Differential check of dynlab's SGLang radix cache against sglang 0.5.23's own ``RadixCache`` on CPU.

Drives both with the same seeded random operations (insert a chain of blocks, match a chain, lock and
unlock a matched path, evict N tokens) and reports, per seed, how many matches agree and how many
evictions leave the same cached blocks. A dynlab block of ``BLOCK`` tokens is ``BLOCK`` token ids in
SGLang (ids unique to the block's name), and SGLang runs at ``page_size = BLOCK``, so both match whole
blocks. dynlab's tree keeps SGLang's nodes as segments of blocks (a chain inserted together, split where a
branch or a match ends inside it), so its LRU refreshes and whole-node evictions should be SGLang's; after
each eviction, if the two differ, dynlab's tree is set to SGLang's content so that later matches still
compare like for like (the report counts the evictions that differed).

Needs sglang importable (its ``srt`` package and torch; see docs/engine.md for the environment it was
run in) and this repository on ``sys.path``::

    /work/venv-sglang/bin/python benchmarks/fidelity_sglang_radix.py --seeds 20
"""
from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dynlab.engine.sglang.radix_cache import RadixCache as DynCache  # noqa: E402

BLOCK = 4


class _Allocator:
    """What SGLang's tree asks of a token pool when it evicts (nothing is freed anywhere)."""

    device = "cpu"
    page_size = BLOCK

    def free_segment(self, value, start_pos=0):
        pass

    def free(self, value):
        pass


def _sglang_cache():
    from sglang.srt.mem_cache.radix_cache import RadixCache

    return RadixCache.create_simulated(mock_allocator=_Allocator(), page_size=BLOCK)


def _key(names):
    from array import array

    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(array("q", [n * BLOCK + j for n in names for j in range(BLOCK)]))


def _sg_cached(cache) -> set:
    """The block names SGLang's tree holds (each node's tokens, a block every BLOCK ids)."""
    out, stack = set(), [cache.root_node]
    while stack:
        node = stack.pop()
        ids = list(node.key.token_ids) if node.key is not None and node is not cache.root_node else []
        out.update(ids[i] // BLOCK for i in range(0, len(ids), BLOCK))
        stack.extend(node.children.values())
    return out


def run_seed(seed: int, ops: int = 300) -> dict:
    """One seeded sequence of operations on both caches; counts of agreeing matches and evictions."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams

    rng = random.Random(seed)
    names: dict = {}  # a chain's prefix (tuple) -> its block name: chained, as dynlab's hashes are

    def chain():
        digits = tuple(rng.randrange(3) for _ in range(rng.randint(1, 6)))
        return [names.setdefault(digits[:i + 1], len(names) + 1) for i in range(len(digits))]

    sg, dyn = _sglang_cache(), DynCache(BLOCK)
    locks = []
    out = {"matches": 0, "matches_equal": 0, "evictions": 0, "evictions_equal": 0, "dyn_keeps_more": 0}
    for _ in range(ops):
        op = rng.choice(("insert", "insert", "match", "lock", "unlock", "evict"))
        c = chain()
        if op == "insert":
            sg.insert(InsertParams(key=_key(c)))
            dyn.insert(c)
        elif op in ("match", "lock"):
            res = sg.match_prefix(MatchPrefixParams(key=_key(c)))
            k, node = dyn.match_prefix(c)
            out["matches"] += 1
            out["matches_equal"] += res.device_prefix_len == k * BLOCK
            if op == "lock":
                sg.inc_lock_ref(res.last_device_node)
                dyn.lock(node)
                locks.append((res.last_device_node, node))
        elif op == "unlock" and locks:
            a, b = locks.pop(rng.randrange(len(locks)))
            sg.dec_lock_ref(a)
            dyn.unlock(b)
        elif op == "evict":
            n = BLOCK * rng.randint(1, 4)
            sg.evict(EvictParams(num_tokens=n))
            dyn.evict(n)
            a, b = _sg_cached(sg), dyn.cached_names()
            out["evictions"] += 1
            out["evictions_equal"] += a == b
            out["dyn_keeps_more"] += a < b
            # resynchronise dynlab to SGLang's content, so later matches compare like for like: drop what SGLang
            # no longer holds, put back what it still holds (each block with its chain)
            if b - a:
                _drop(dyn, b - a)
            chains = {v: k for k, v in names.items()}
            for name in sorted(a - dyn.cached_names()):
                prefix = chains[name]
                dyn.insert([names[prefix[:i + 1]] for i in range(len(prefix))])
    return out


def _drop(cache, gone: set) -> None:
    """Remove the blocks ``gone`` (and anything under them) from dynlab's tree."""
    stack = [cache.root]
    while stack:
        node = stack.pop()
        for name, child in list(node.children.items()):
            if name in gone and child.lock_ref == 0:
                _cut(cache, child)
            else:
                stack.append(child)


def _cut(cache, node) -> None:
    for child in list(node.children.values()):
        _cut(cache, child)
    del node.parent.children[node.name]
    node.parent = None
    cache.nodes -= 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--ops", type=int, default=300)
    args = p.parse_args(argv)
    total: dict = {}
    for seed in range(args.seeds):
        for k, v in run_seed(seed, args.ops).items():
            total[k] = total.get(k, 0) + v
    print(f"seeds {args.seeds} x {args.ops} operations, block {BLOCK} tokens (SGLang page_size {BLOCK})")
    print(f"matches equal:   {total['matches_equal']} of {total['matches']}")
    print(f"evictions equal: {total['evictions_equal']} of {total['evictions']} "
          f"(dynlab keeping a strict superset: {total['dyn_keeps_more']})")
    return 0 if total["matches_equal"] == total["matches"] else 1


if __name__ == "__main__":
    sys.exit(main())
