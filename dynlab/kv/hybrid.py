"""The KV cache manager of a model with several KV cache groups (vLLM 0.33's ``HybridKVCacheCoordinator``).

:class:`HybridKvCacheManager` extends :class:`~dynlab.kv.cache_manager.KvCacheManager`: the first
full-attention group stays ``req.keys`` (named, prefix-cached, what the router's KV events name), and
each further KV cache group of :class:`~dynlab.kv.groups.HybridPool` (sliding window, chunked local,
state, extra full-attention groups) holds its own block table per request, from the same pool:

- a table is ``(skip, keys)``: its first ``skip`` entries are out of the window and were freed (vLLM's
  null blocks), ``keys`` the blocks held (``UNNAMED`` or a name);
- before each allocation the blocks that left the window are freed (vLLM's ``remove_skipped_blocks``
  at ``num_computed_tokens``); a freed named block stays cached (evictable) as in vLLM;
- names: group ``i``'s block of prompt block ``j`` is named ``name_j + i * 2**64`` (vLLM hashes the
  group id into the block hash); these names never reach the KV events (:meth:`step_events` drops them);
- prefix hit (vLLM's ``find_longest_cache_hit`` over groups): the longest ``h`` the full group has
  cached for which every window group has its window's blocks before token ``h * block`` cached; a
  state group serves none (``h = 0``);
- P/D (:meth:`reserve`): the decode side reserves what is resident after the prompt: every full
  group's ``ceil(tokens / block)``, a window group's blocks in its window.

Not modelled (refused by the engine set-up): a CPU tier, pools working on runs, bulk decode runs.
"""
from __future__ import annotations

from typing import Optional, Tuple

from dynlab.kv.cache_manager import FullAttentionGroup, KvCacheManager
from dynlab.kv.groups import HybridPool, SlidingWindowGroup

__all__ = ["HybridKvCacheManager", "GROUP_NAME_STRIDE"]

GROUP_NAME_STRIDE = 1 << 64
"""Offset between the names of one prompt block in successive KV cache groups (names are < 2**64)."""

_NO_WINDOW = 1 << 62  # an extra full-attention group: a window nothing leaves


class HybridKvCacheManager(KvCacheManager):
    """One engine's KV cache over the groups of ``layout`` (:class:`~dynlab.kv.groups.HybridPool`), one pool
    of ``capacity`` blocks of ``block`` tokens. Raises ``ValueError`` with a CPU tier or ``runs``."""

    def __init__(self, capacity: int, block: int, layout: HybridPool, **kw):
        if kw.get("cpu_capacity") or kw.get("runs"):
            raise ValueError("KV cache groups (sliding-window, chunked-local or state layers) are not modelled "
                             "with a CPU tier or trace blocks other than --block")
        super().__init__(capacity, block, **kw)
        extra = tuple(SlidingWindowGroup(block, _NO_WINDOW) for _ in range(layout.full_groups - 1))
        self.extra = extra + layout.groups
        self.groups = (FullAttentionGroup(block),) + self.extra
        self.layout = layout
        self.tables: dict = {}  # request -> [[skip, keys] per extra group]
        self.held_tables: dict = {}
        self.reserved_tables: dict = {}
        self._seqs: dict = {}

    # -- reading ------------------------------------------------------------------------------
    def fits(self, tokens: int) -> bool:
        """Whether every group's whole table for ``tokens`` tokens fits at once (conservative: a prompt
        computed in one chunk holds them all before the window frees any)."""
        return sum(g.blocks_needed(tokens) for g in self.groups) <= self.pool.capacity

    def seq_of(self, req, i: int) -> list:
        """Names of ``req``'s prompt blocks in extra group ``i`` (0-based): ``name + (i + 1) * 2**64``."""
        seqs = self._seqs.get(req)
        if seqs is None:
            seqs = self._seqs[req] = [None] * len(self.extra)
        if seqs[i] is None:
            off = (i + 1) * GROUP_NAME_STRIDE
            seqs[i] = [n + off for n in self.sequence(req)]
        return seqs[i]

    def held_blocks(self, req) -> list:
        """Blocks ``req`` holds in each group, full group first (tests, docs)."""
        return [len(req.keys)] + [len(keys) for _, keys in self.tables.get(req, ())]

    def _window_cached(self, req, h: int) -> bool:
        pool = self.pool
        for i, g in enumerate(self.extra):
            if not g.prefix_cache:
                return h == 0
            s = g.skipped(h * self.block)
            if h > s and pool.lookup(self.seq_of(req, i)[s:h], h - s) < h - s:
                return False
        return True

    def _hit(self, req, h: int) -> int:
        while h > 0 and not self._window_cached(req, h):
            h -= 1
        return h

    def find_cached_prefix(self, req) -> Tuple[int, int]:
        """``(h, 0)``: the longest prefix every group can serve (module docstring)."""
        h, _ = super().find_cached_prefix(req)
        return self._hit(req, h), 0

    # -- allocating ---------------------------------------------------------------------------
    def _take(self, req, h: int, tokens: int, computed: int, reserve: int = 0) -> Optional[tuple]:
        """Full keys and tables for ``req`` holding nothing: ``h`` hits, slots to ``tokens``, windows at
        ``computed``; ``None`` (nothing taken) when the free queue cannot give them, or the blocks of
        ``max(tokens, reserve)`` tokens (full admission, :meth:`admission_tokens`) are not free now."""
        pool = self.pool
        check_tokens = max(tokens, reserve)
        need = self.blocks_needed(check_tokens) - h
        evict = pool.evictable_hits(req.seq, h) if h else 0
        plan = []
        for i, g in enumerate(self.extra):
            s = g.skipped(computed)
            hits = self.seq_of(req, i)[s:h] if h > s else []
            new = g.blocks_needed(tokens) - max(h, s)
            plan.append((s, hits, new))
            need += max(g.blocks_needed(check_tokens) - max(h, s), 0)
            evict += pool.evictable_hits(hits, len(hits)) if hits else 0
        if need + evict > pool.num_free:
            return None
        pool.take_hits(req.seq, h)  # every group's hits first: an allocation must not evict a hit
        for _, hits, _ in plan:
            pool.take_hits(hits, len(hits))
        keys = list(req.names[:h])
        if self.blocks_needed(tokens) > h:
            keys += pool.allocate(self.blocks_needed(tokens) - h)
        tables = [[s, list(hits) + (pool.allocate(new) if new > 0 else [])] for s, hits, new in plan]
        return keys, tables

    def allocate_new(self, req, h: int, tokens: int, reserve: int = 0) -> Optional[list]:
        """Keys of the full group (tables of the others kept here) for a request holding nothing; ``reserve``:
        as :meth:`KvCacheManager.allocate_new`."""
        got = self._take(req, h, tokens, h * self.block, reserve)
        if got is None:
            return None
        self.tables[req] = got[1]
        return got[0]

    def _drop_skipped(self, req) -> None:
        """Free each window group's blocks that left the window at ``req.computed`` tokens."""
        pool = self.pool
        for g, table in zip(self.extra, self.tables[req]):
            s = g.skipped(req.computed)
            d = min(s - table[0], len(table[1]))
            if d > 0:
                pool.release(table[1][:d])
                del table[1][:d]
                table[0] += d

    def allocate_slots(self, req, tokens: int) -> bool:
        """Free blocks out of the windows, then grow every table to ``tokens`` tokens; ``False`` (nothing
        more taken) when the free queue cannot."""
        self._drop_skipped(req)
        tables = self.tables[req]
        need = [g.blocks_needed(tokens) - t[0] - len(t[1]) for g, t in zip(self.extra, tables)]
        full = self.blocks_needed(tokens) - len(req.keys)
        total = max(full, 0) + sum(n for n in need if n > 0)
        if total == 0:
            return True
        pool = self.pool
        if total > pool.num_free:
            return False
        if full > 0:
            req.keys += pool.allocate(full)
        for n, t in zip(need, tables):
            if n > 0:
                t[1] += pool.allocate(n)
        return True

    def name_blocks(self, req, n: int) -> None:
        """Name the full blocks the chunk completes in every group (an extra group's under its own names)."""
        old = req.nreg
        super().name_blocks(req, n)
        if req.nreg > old:
            for i, (g, (s, keys)) in enumerate(zip(self.extra, self.tables[req])):
                if g.prefix_cache and req.nreg > max(old, s):
                    self.pool.register(keys, self.seq_of(req, i)[s:], max(old, s) - s, req.nreg - s)

    def _release_tables(self, tables) -> None:
        for _, keys in tables:
            self.pool.release(keys)

    def free(self, req) -> None:
        """Return every group's blocks to the free queue, the full group's first (named ones stay cached)."""
        super().free(req)
        self._release_tables(self.tables.pop(req, ()))
        self._seqs.pop(req, None)

    # -- events -------------------------------------------------------------------------------
    def step_events(self) -> tuple:
        """As :meth:`KvCacheManager.step_events`, the extra groups' names left out (the router sees prompt blocks)."""
        stored, _, removed, _, used = super().step_events()
        return _own(stored), None, _own(removed), None, used

    def removed(self) -> Tuple[tuple, Optional[tuple]]:
        """``(names, None)`` the pool evicted since the step began, the extra groups' names left out."""
        return _own(tuple(self.pool.removed)), None

    # -- the P/D handoff ----------------------------------------------------------------------
    def hold(self, req) -> None:
        """Keep every group's blocks of ``req`` in use after it leaves (handed off) until :meth:`release`."""
        super().hold(req)
        self.held_tables[req] = self.tables.pop(req)

    def release(self, req, now: float) -> None:
        """Free every group's blocks held for ``req`` at ``now`` (ms). Raises ``KeyError`` if none are held."""
        super().release(req, now)
        self._release_tables(self.held_tables.pop(req))
        self._seqs.pop(req, None)

    def reserve(self, req, now: float, tokens: int, prefix_cache: bool = False) -> Optional[int]:
        """Reserve what is resident after ``tokens`` prompt tokens (module docstring); blocks hit or ``None``."""
        self.sequence(req)
        h = self._hit(req, self.pool.lookup(req.seq, len(req.names))) if prefix_cache else 0
        got = self._take(req, h, tokens, tokens)
        if got is None:
            return None
        self.accumulate(now)
        self.reserved[req] = (got[0], h)
        self.reserved_tables[req] = got[1]
        self.note_used()
        return h

    def receive(self, req, prefix_cache: bool = False) -> None:
        """Give ``req`` every group's reserved blocks (its KV arrived). Raises ``KeyError`` without a reservation."""
        self.tables[req] = self.reserved_tables.pop(req)
        super().receive(req, prefix_cache)

    def check(self, holders: list) -> None:
        """As :meth:`KvCacheManager.check`, every group's tables counted."""
        extra = [keys for tables in (list(self.tables.values()) + list(self.held_tables.values())
                                     + list(self.reserved_tables.values())) for _, keys in tables]
        super().check(holders + extra)

    def take_boundaries(self, bound_at, bound_reqs, n):  # pragma: no cover - the set-up turns bulk runs off
        raise RuntimeError("bulk decode runs are not modelled with KV cache groups")


def kv_cache_manager(capacity: int, block: int, kv_layout=None, **kwargs) -> KvCacheManager:
    """The KV cache manager of one engine: a :class:`KvCacheManager` (one full-attention group) when
    ``kv_layout`` is ``None``, else a :class:`HybridKvCacheManager` over its KV cache groups; ``kwargs``
    are :class:`KvCacheManager`'s (``runs``, ``cpu_capacity``, ``load_ms_per_block``, ``cpu_write``)."""
    if kv_layout is None:
        return KvCacheManager(capacity, block, **kwargs)
    return HybridKvCacheManager(capacity, block, kv_layout, **kwargs)


def _own(names: tuple) -> tuple:
    """``names`` without the extra groups' (>= :data:`GROUP_NAME_STRIDE`)."""
    if names and max(names) >= GROUP_NAME_STRIDE:
        return tuple(n for n in names if n < GROUP_NAME_STRIDE)
    return names

