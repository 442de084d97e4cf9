"""KV cache groups beyond full attention, and the pool they share (vLLM 0.33's hybrid KV cache manager).

vLLM keeps one KV cache group per attention type (``vllm/v1/core/kv_cache_coordinator.py``,
``single_type_kv_cache_manager.py``); each group has its own block table per request, and all groups
take their blocks from ONE block pool whose page size is equalised (``kv_cache_utils.py``,
``_get_kv_cache_groups_uniform_page_size``). This module models the groups' block rules and the pool
size; :class:`dynlab.kv.hybrid.HybridKvCacheManager` runs them. A model whose layers all keep every
token (full attention, MLA) never comes here: its engine keeps today's one-group manager.

Block rules, for a request with ``c`` tokens computed needing slots for ``t`` tokens, ``B`` tokens per block:

- full attention (:class:`~dynlab.kv.cache_manager.FullAttentionGroup`): ``ceil(t / B)`` blocks.
- sliding window of ``W`` tokens (:class:`SlidingWindowGroup`, vLLM's ``SlidingWindowManager``): the
  table is ``ceil(t / B)`` long, but its leading ``skipped(c) = max(0, c - W + 1) // B`` blocks are out of
  the window and freed (vLLM's ``remove_skipped_blocks``, run before each allocation); held:
  ``ceil(t / B) - skipped(c)``. A prefix hit of ``h`` blocks needs the window's blocks before token
  ``h * B`` cached: blocks ``skipped(h * B) .. h - 1``.
- chunked local of ``C`` tokens (:class:`ChunkedLocalGroup`, vLLM's ``ChunkedLocalAttentionManager``):
  ``skipped(c) = (c // C) * C // B``; a hit needs the current chunk's blocks, as for a window.
- state (Mamba, linear attention; :class:`StateGroup`, vLLM's ``MambaManager`` without prefix caching):
  a fixed ``n`` blocks per request holding its state, whatever its length; no prefix hit (a model with
  a state group gets none: vLLM's default ``mamba_cache_mode``).

Pool (:func:`hybrid_pool`): vLLM's uniform-page-size rule. With ``n_k`` layers of attention type ``k``,
``group_size = min_k n_k`` (or ``max_k n_k`` when ``max < 1.5 * min``); each type is split into
``ceil(n_k / group_size)`` KV cache groups of ``group_size`` layers (the last padded). One pool block is
one page of every layer of a group: ``page = B * bytes_per_token_per_layer_per_GPU``, so
``blocks = floor(free_bytes_per_GPU / (page * group_size))`` (:func:`hybrid_kv_blocks`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SlidingWindowGroup", "ChunkedLocalGroup", "StateGroup", "HybridPool", "hybrid_pool", "hybrid_kv_blocks",
           "MAPPED_NAME_STRIDE"]

#: :attr:`HybridPool.name_stride` when engine block names are mapped from trace blocks
#: (:func:`dynlab.engine.names.engine_block_names`: ``trace id * 2**10 + offset``, below ``2**74`` for the
#: 64-bit ids of a trace, its ids keyed by ``lora_name``/``cache_salt`` among them)
MAPPED_NAME_STRIDE = 1 << 74


class SlidingWindowGroup:
    """A sliding-window KV cache group: ``block`` tokens per block, ``window`` tokens (``W``) attended."""

    kind = "sliding_window"
    prefix_cache = True

    def __init__(self, block: int, window: int):
        self.block, self.window = block, window

    def blocks_needed(self, tokens: int) -> int:
        """Length of the block table for ``tokens`` tokens: ``ceil(tokens / block)`` (leading entries freed)."""
        return -(-tokens // self.block)

    def room(self, entries: int) -> int:
        """The most tokens a table of ``entries`` entries holds: ``entries * block`` (the largest ``t`` with
        ``blocks_needed(t) <= entries``; :mod:`dynlab.kv.hybrid_slots` reads it)."""
        return entries * self.block

    def skipped(self, computed: int) -> int:
        """Leading blocks out of the window once ``computed`` tokens are computed: ``max(0, computed - W + 1) // block``."""
        return max(0, computed - self.window + 1) // self.block

    def held(self, tokens: int, computed: int) -> int:
        """Blocks held for slots up to ``tokens`` with ``computed`` computed: ``blocks_needed - skipped``."""
        return self.blocks_needed(tokens) - self.skipped(computed)

    def next_drop(self, computed: int) -> int:
        """The least computed count ``> computed`` at which :meth:`skipped` grows (a block leaves the
        window): ``W - 1 + block * (skipped(computed) + 1)``. A bulk decode run stops there. Every group's rule:
        :meth:`skipped` and ``next_drop`` are constant on ``[computed, next_drop(computed))``."""
        return self.window - 1 + self.block * (self.skipped(computed) + 1)

    def admission_cap(self, in_flight) -> float:
        """Blocks the whole-sequence admission check counts for this group at most, with ``in_flight`` tokens
        scheduled per step (``None``: no cap): the window's tail, ``W - 1`` tokens, plus ``in_flight``, in
        blocks, plus 1 for a window that starts inside a block: ``ceil((W - 1 + in_flight) / block) + 1``
        (vLLM 0.33's ``SlidingWindowSpec.max_admission_blocks_per_request``; what a request holds at most,
        the blocks out of the window being freed before each chunk). A request with a longer prompt is
        admitted once that many are free (without ``max_model_len``'s cap: dynlab has none)."""
        if in_flight is None:
            return math.inf
        return -(-(self.window - 1 + in_flight) // self.block) + 1


class ChunkedLocalGroup(SlidingWindowGroup):
    """A chunked-local KV cache group (Llama 4): attention within chunks of ``window`` tokens (``C``)."""

    kind = "chunked_local"

    def skipped(self, computed: int) -> int:
        """Leading blocks before the current chunk: ``(computed // C) * C // block``."""
        return computed // self.window * self.window // self.block

    def next_drop(self, computed: int) -> int:
        """The next chunk's start, ``(computed // C + 1) * C`` (where :meth:`skipped` may grow)."""
        return (computed // self.window + 1) * self.window

    def admission_cap(self, in_flight) -> float:
        """``ceil((C + in_flight) / block)`` (vLLM 0.33's ``ChunkedLocalAttentionSpec.max_admission_blocks_per_request``;
        ``None``: no cap): one chunk and the tokens in flight."""
        if in_flight is None:
            return math.inf
        return -(-(self.window + in_flight) // self.block)


class StateGroup:
    """A state KV cache group (Mamba, linear attention): ``per_request`` blocks hold a request's state."""

    kind = "state"
    prefix_cache = False

    def __init__(self, block: int, per_request: int):
        self.block, self.per_request = block, per_request

    def blocks_needed(self, tokens: int) -> int:
        """``per_request`` blocks once ``tokens > 0``."""
        return self.per_request if tokens > 0 else 0

    def room(self, entries: int) -> float:
        """The most tokens a table of ``entries`` entries holds: any (``inf``) once it has its ``per_request``
        blocks, else none (0)."""
        return math.inf if entries >= self.per_request else 0

    def skipped(self, computed: int) -> int:
        """None: the state is one fixed set of blocks."""
        return 0

    def held(self, tokens: int, computed: int) -> int:
        """``blocks_needed(tokens)``: nothing is freed."""
        return self.blocks_needed(tokens)

    def next_drop(self, computed: int) -> float:
        """Never: nothing is freed."""
        return math.inf

    def admission_cap(self, in_flight) -> float:
        """None: its ``per_request`` blocks are what it holds."""
        return math.inf


@dataclass(frozen=True)
class HybridPool:
    """The KV cache groups of a model and its pool's page (:func:`hybrid_pool`).

    ``groups``: the extra groups' objects (one per vLLM KV cache group that is not full attention, in
    order); ``full_groups``: how many full-attention KV cache groups (each holds the request's
    ``ceil(t / B)`` blocks); ``group_size``: layers per group; ``page_bytes``: bytes of one layer's block
    on one GPU; ``counts``: ``{kind: layers}``; ``padding``: padding layers. ``name_stride``: the offset
    between the names of one block in successive groups (:mod:`dynlab.kv.hybrid`), above every full-group
    prompt name: ``2**64`` for names of one engine block per trace block (hashes and trace ids), ``2**74``
    for engine block names mapped from trace blocks (``trace id * 1024 + offset``:
    :data:`MAPPED_NAME_STRIDE`)."""

    groups: tuple
    full_groups: int
    group_size: int
    page_bytes: float
    counts: dict
    padding: int
    name_stride: int = 1 << 64

    def block_bytes(self, tp: int) -> int:
        """Bytes of one pool block on a worker of ``tp`` GPUs: one page of each of ``group_size`` layers on
        each GPU, ``page_bytes * group_size * tp`` (what a CPU tier stores per block, of any group)."""
        return round(self.page_bytes * self.group_size * tp)

    def describe(self) -> str:
        parts = ", ".join(f"{n} {k}" for k, n in self.counts.items())
        return (f"{self.full_groups + len(self.groups)} KV cache groups of {self.group_size} layers "
                f"({parts}; {self.padding} padding)")


def _group_size(counts: list) -> int:
    """vLLM's rule: the smallest type's layer count, or the largest when ``max < 1.5 * min``."""
    small, large = min(counts), max(counts)
    return large if large < small * 1.5 else small


def hybrid_pool(model, block: int, tp: int = 1) -> HybridPool:
    """The KV cache groups of ``model`` (a :class:`~dynlab.models.spec.ModelSpec` with ``kv_groups``) at
    ``block`` tokens per block on ``tp`` GPUs, by vLLM's uniform-page-size rule (module docstring).

    Attention kinds must keep equal bytes per layer and token (vLLM's uniform page); a state group's
    blocks per request are ``ceil(state bytes per layer / page)`` (vLLM instead raises the attention
    block size until one page holds a state). Raises ``ValueError`` (one line) for unequal pages."""
    split = 1 if model.attention == "mla" else min(tp, model.kv_heads)
    attn = [g for g in model.kv_groups if g.bytes_per_token]
    per_layer = {g.bytes_per_token / g.layers / split for g in attn}
    if len(per_layer) != 1:
        raise ValueError(f"{model.name}: its attention layer kinds keep different bytes per token, which "
                         "dynlab's KV cache groups do not model (vLLM equalises them by block size)")
    page = block * per_layer.pop()
    counts = {g.kind: g.layers for g in model.kv_groups}
    size = _group_size(list(counts.values()))
    groups, full, padding = [], 0, 0
    for g in model.kv_groups:
        n = math.ceil(g.layers / size)
        padding += n * size - g.layers
        if g.kind in ("full", "mla"):
            full += n
            continue
        for _ in range(n):
            if g.kind == "sliding_window":
                groups.append(SlidingWindowGroup(block, g.window))
            elif g.kind == "chunked_local":
                groups.append(ChunkedLocalGroup(block, g.window))
            else:
                groups.append(StateGroup(block, math.ceil(g.state_bytes / g.layers / split / page)))
    return HybridPool(tuple(groups), full, size, page, counts, padding)


def hybrid_kv_blocks(model, gpu, block: int, tp: int, gpu_memory_utilization: float = 0.9) -> tuple:
    """``(blocks, derivation, pool)``: pool blocks of a worker of ``tp`` GPUs serving a model with KV cache
    groups, ``floor((memory * utilization - weight_bytes / tp) / (page * group_size))`` with ``page = block *
    bytes per layer and token per GPU`` (vLLM's ``get_num_blocks`` over uniform pages). Memory in GiB as
    :func:`dynlab.models.capacity.kv_blocks` reads it. Raises ``ValueError`` when the weights do not fit."""
    from dynlab.models.gpus import GIB

    pool = hybrid_pool(model, block, tp)
    usable = gpu.memory_bytes * gpu_memory_utilization
    free = usable - model.weight_bytes / tp
    if free <= 0:
        raise ValueError(f"{model.name} does not fit on {tp} x {gpu.name}: {model.weight_bytes / tp / GIB:.1f} "
                         f"GiB of weights per GPU, {usable / GIB:.1f} GiB usable")
    blocks = math.floor(free / (pool.page_bytes * pool.group_size))
    why = (f"floor(({gpu.memory_gb} GiB x {gpu_memory_utilization} - {model.weight_bytes:,.0f} B weights / {tp}) "
           f"/ ({pool.page_bytes:g} B page/layer/GPU x {pool.group_size} layers)) = {blocks} blocks of {block} "
           f"tokens shared by {pool.describe()}, per worker of {tp} x {gpu.name}")
    return blocks, why, pool


def transfer_bytes(kv_groups, tokens: int, hit: int = 0) -> int:
    """Bytes a P/D transfer sends for a prompt of ``tokens`` tokens whose first ``hit`` the decode side
    has cached: what is resident after the prompt and not already there. Per
    :class:`~dynlab.models.layout.KvGroup`: full / MLA ``(tokens - hit) * bytes_per_token``; sliding window
    ``min(tokens - hit, W)`` tokens' bytes; chunked local ``min(tokens - hit, (tokens - 1) % C + 1)``; a state
    group its ``state_bytes``. ``kv_groups``: ``ModelSpec.kv_groups`` (bytes summed over each kind's layers)."""
    new = tokens - hit
    total = 0
    for g in kv_groups:
        if g.state_bytes:
            total += g.state_bytes
        else:
            total += min(new, g.resident_tokens(tokens)) * g.bytes_per_token
    return total
