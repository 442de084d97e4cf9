"""The seed's synthetic workload (lab 000 step 4): shared prefixes with per-request tails."""
from __future__ import annotations

import random
from typing import Iterator

from dynlab.routing.hashing import block_hashes
from dynlab.routing.strategy import Request


def seed_order(prefixes: int, reps: int, rng: random.Random) -> list[int]:
    """``[k for k in range(prefixes) for _ in range(reps)]`` shuffled in place by ``rng`` (one ``shuffle`` call)."""
    order = [k for k in range(prefixes) for _ in range(reps)]
    rng.shuffle(order)
    return order


def seed_tokens(k: int, i: int, plen: int, tail: int) -> list[int]:
    """Tokens of the request at position ``i`` with prefix ``k``:
    ``[k*1000 + j for j in range(plen)] + [10**6 + i*100 + j for j in range(tail)]``."""
    return [k * 1000 + j for j in range(plen)] + [10**6 + i * 100 + j for j in range(tail)]


def seed_requests(prefixes: int = 12, reps: int = 6, plen: int = 96, tail: int = 16,
                  block: int = 16, rng: random.Random | None = None,
                  scheme: str = "dynlab") -> Iterator[Request]:
    """Yield the seed workload's ``prefixes * reps`` requests in shuffled order.

    The shuffle draws from ``rng`` (default ``random.Random(1)``) before the first
    request is yielded, so a strategy drawing from the same ``rng`` afterwards sees
    the seed's sequence. Each request carries its block names at ``block`` tokens,
    its prompt length, and ``prefix=k``. No timestamps; ``output_length`` is 0.
    ``scheme``: the hash scheme of the names (:func:`dynlab.routing.hashing.block_hashes`).
    """
    rng = rng if rng is not None else random.Random(1)
    order = seed_order(prefixes, reps, rng)
    for i, k in enumerate(order):
        tokens = seed_tokens(k, i, plen, tail)
        yield Request(tuple(block_hashes(tokens, block, scheme=scheme)), input_length=len(tokens), index=i, prefix=k)
