"""Engine block names: a trace's prompt names (trace blocks) turned into an engine's block names.

A trace names a prompt in *trace blocks* of ``trace_block`` tokens (Mooncake: 512 tokens per
``hash_id``; its ids are already prefix-chained, so id ``i`` identifies the whole prefix up to
trace block ``i``). An engine caches KV in *engine blocks* of ``block`` tokens (vLLM: 16), and
only **full** engine blocks of the prompt are named.

Engine block ``j`` covers tokens ``[j*block, (j+1)*block)`` and exists only when
``(j+1)*block <= input_length``. It is named after the trace block holding its LAST token,
``t = ((j+1)*block - 1) // trace_block``, plus its offset among the engine blocks whose last
token falls in ``t``::

    name(j) = trace_hashes[t] * 1024 + (j - first engine block whose last token is in t)

So two requests share engine block ``j`` exactly when they share every trace id up to ``t(j)``
(given prefix-chained ids). When ``trace_block == block`` the names are the trace ids themselves.
Names are ints, non-negative when the trace ids are (the engine's block pool relies on that).
"""
from __future__ import annotations

from typing import Sequence

from dynlab.groups import GROUP_SIZE

#: names carry at most this many engine blocks per trace block (offsets 0..1023): one group (dynlab.groups)
_SPREAD = GROUP_SIZE
#: largest trace_block / block ratio accepted (so offsets stay well below _SPREAD)
MAX_RATIO = 1022


def engine_block_names(trace_hashes: Sequence[int], input_length: int, trace_block: int, block: int) -> list[int]:
    """The names of the full engine blocks of a prompt (``input_length // block`` ints, prefix order).

    ``trace_hashes``: the trace's prefix-chained ids of ``trace_block``-token blocks;
    ``input_length``: prompt tokens; ``block``: engine tokens per block.

    Raises ``ValueError`` for a non-positive ``block``/``trace_block``, a ratio
    ``trace_block / block`` above 1022, a negative ``input_length``, or a hash list too short
    to name the last full engine block.
    """
    n, last_t = _check(trace_hashes, input_length, trace_block, block)
    if n == 0:
        return []
    if trace_block == block:
        return list(trace_hashes[:n])
    out: list[int] = []
    extend = out.extend
    for base, c in _runs(trace_hashes, n, last_t, trace_block, block):
        extend(range(base, base + c))
    return out


def engine_block_runs(trace_hashes: Sequence[int], input_length: int, trace_block: int,
                      block: int) -> tuple[list[int], list[tuple[int, int]]]:
    """``(names, runs)``: :func:`engine_block_names` and the same names as runs ``(first name, count)``,
    one per trace block that names engine blocks, in prefix order (``names`` is the runs expanded:
    ``first, first + 1, ..., first + count - 1``). Raises what :func:`engine_block_names` raises.

    Runs with different first names are disjoint when ``trace_block != block`` (a run holds at most
    :data:`MAX_RATIO` names, spaced :data:`_SPREAD` apart), and a run of a trace block always starts
    at offset 0, so the names of the same trace block seen so far are the run's first ``c`` names for
    some ``c``: a set of such names can be kept as ``first name -> c``
    (:class:`dynlab.engine.metrics.RoutingMetrics` does). When ``trace_block == block`` every run is
    one trace id (count 1).
    """
    n, last_t = _check(trace_hashes, input_length, trace_block, block)
    if n == 0:
        return [], []
    if trace_block == block:
        names = list(trace_hashes[:n])
        return names, [(h, 1) for h in names]
    runs = _runs(trace_hashes, n, last_t, trace_block, block)
    names: list[int] = []
    extend = names.extend
    for base, c in runs:
        extend(range(base, base + c))
    return names, runs


def _runs(trace_hashes: Sequence[int], n: int, last_t: int, trace_block: int, block: int) -> list:
    """The runs ``(first name, count)`` of the ``n`` full engine blocks (``trace_block != block``)."""
    if trace_block % block == 0:  # (Mooncake: 512 / 16) engine block j lies in trace block j // per
        per = trace_block // block
        full, rest = divmod(n, per)
        out = [(h * _SPREAD, per) for h in trace_hashes[:full]]
        if rest:
            out.append((trace_hashes[full] * _SPREAD, rest))
        return out
    out = []
    # trace block t holds the last tokens of engine blocks (t*T)//B .. ((t+1)*T)//B - 1
    first = 0
    for t in range(last_t + 1):
        end = min(((t + 1) * trace_block) // block, n)
        if end > first:
            out.append((trace_hashes[t] * _SPREAD, end - first))
            first = end
    return out


def _check(trace_hashes: Sequence[int], input_length: int, trace_block: int, block: int) -> tuple[int, int]:
    """``(full engine blocks, index of the last trace block they reach)``, or the ``ValueError`` of
    :func:`engine_block_names`."""
    if block < 1 or trace_block < 1:
        raise ValueError(f"block sizes must be >= 1 (block={block}, trace_block={trace_block})")
    if trace_block > MAX_RATIO * block:
        raise ValueError(f"trace_block/block = {trace_block}/{block} is above {MAX_RATIO}: "
                         "engine block names would collide")
    if input_length < 0:
        raise ValueError(f"input_length must be >= 0, got {input_length}")
    n = input_length // block
    if n == 0:
        return 0, 0
    last_t = (n * block - 1) // trace_block
    if len(trace_hashes) <= last_t:
        raise ValueError(f"{len(trace_hashes)} trace hashes of {trace_block} tokens cannot name "
                         f"{input_length} tokens ({last_t + 1} needed)")
    return n, last_t
