"""Chained block hashes and prefix overlap (lab 000 steps 1-2): ``block_hashes``, ``overlap``."""
from __future__ import annotations

import hashlib
import struct
from typing import Hashable, Sequence

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_ROOT = b"dynlab-block-hash-v1"


def _check_tokens(tokens: Sequence) -> None:
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not hasattr(t, "__index__"):
            raise ValueError(f"token at position {i} is not an int: {t!r}")
        v = t.__index__()
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise ValueError(f"token at position {i} is outside the signed 64-bit range: {v}")


def block_hashes(tokens: Sequence[int], block: int = 16) -> list[int]:
    """Name each full block of ``block`` tokens; the name of block i identifies blocks 0..i.

    Each token is serialised as 8 little-endian signed bytes (so ``[1, 23]`` and
    ``[12, 3]`` differ), and block i's name is the first 8 bytes of
    ``blake2b(name(i-1) || tokens of block i)`` as an unsigned int (block 0 uses a
    fixed root instead of a parent): a hash chain, as vLLM's prefix caching and
    Dynamo's sequence hashes do. Two sequences share their i-th name exactly when
    their first i+1 blocks are equal (up to 64-bit collisions). A trailing partial
    block gets no name. Deterministic across processes (hashlib, never ``hash()``).

    Returns a list of ``len(tokens) // block`` ints.
    Raises ``ValueError`` for ``block < 1`` or a token that is not an int in the
    signed 64-bit range (naming its position).
    """
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an int >= 1, got {block!r}")
    n_full = len(tokens) // block
    if any(t.__class__ is bool for t in tokens):
        _check_tokens(tokens)
    try:
        data = struct.pack(f"<{len(tokens)}q", *tokens)
    except (struct.error, TypeError):
        _check_tokens(tokens)
        raise
    out = []
    parent = _ROOT
    step = 8 * block
    blake2b = hashlib.blake2b
    for i in range(n_full):
        parent = blake2b(parent + data[i * step : (i + 1) * step], digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


def overlap(hashes: Sequence[Hashable], cached) -> int:
    """How many leading names of ``hashes`` are in ``cached``, stopping at the first missing one.

    ``cached`` is a set (anything supporting ``in``); neither argument is mutated.
    The result is between 0 and ``len(hashes)``.
    """
    n = 0
    for h in hashes:
        if h not in cached:
            break
        n += 1
    return n
