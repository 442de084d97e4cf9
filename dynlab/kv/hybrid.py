"""The KV cache manager of a model with several KV cache groups (vLLM 0.33's ``HybridKVCacheCoordinator``).

:class:`HybridKvCacheManager` extends :class:`~dynlab.kv.cache_manager.KvCacheManager`: the first
full-attention group stays ``req.keys`` (named, prefix-cached, what the router's KV events name), and
each further KV cache group of :class:`~dynlab.kv.groups.HybridPool` (sliding window, chunked local,
state, extra full-attention groups) holds its own block table per request, from the same pool:

- a table is ``(skip, keys)``: its first ``skip`` entries are out of the window and were freed (vLLM's
  null blocks), ``keys`` the blocks held (``UNNAMED`` or a name);
- before each allocation the blocks that left the window are freed (vLLM's ``remove_skipped_blocks``
  at ``num_computed_tokens``); a freed named block stays cached (evictable) as in vLLM;
- names: group ``i``'s block of prompt block ``j`` is named ``name_j + i * stride`` (vLLM hashes the
  group id into the block hash), ``stride`` the layout's ``name_stride``: ``2**64`` when a trace block is
  one engine block, ``2**74`` for engine block names mapped from trace blocks (``trace id * 1024 + offset``,
  :mod:`dynlab.engine.names`; every group's names come from the same full-group names, so two requests
  share a window group's block exactly when they share the full group's); these names never reach the
  KV events (:meth:`step_events` drops them);
- prefix hit (vLLM's ``find_longest_cache_hit`` over groups): the longest ``h`` the full group has
  cached for which every window group has its window's blocks before token ``h * block`` cached; a
  state group serves none (``h = 0``);
- P/D (:meth:`reserve`): the decode side reserves what is resident after the prompt: every full
  group's ``ceil(tokens / block)``, a window group's blocks in its window.
- freeing (vLLM frees every full block it has hashed to the free-queue tail, generated tokens' too): a
  window group's blocks that leave the window, and at a finish its full blocks of generated tokens, go
  to the tail (unnamed: no one can hit them), a partial block to the head; a preemption names them as
  the full group's (:func:`~dynlab.kv.output_blocks.name_output`, each group under its own names);
- admission (``admission="full"``): the whole-sequence check counts a window group's blocks up to its
  :meth:`~dynlab.kv.groups.SlidingWindowGroup.admission_cap` (``in_flight``: the engine's token budget);
- speculative decoding (:mod:`dynlab.engine.spec`): the ``K`` lookahead slots of each allocation are
  taken in every group, a window group's before its drop at the computed tokens (vLLM rolls rejected
  drafts back first); names cover the token after each block (EAGLE's hash lookahead) in every group,
  since every group's names come from the full group's.

CPU tier (``cpu_capacity > 0``), per group: one LRU tier of blocks (each one pool page of every layer of
one group, so one size for all groups), holding each group's blocks under that group's names:

- write rule ``evict``: every group's blocks the GPU pool evicts are written (a victim tier takes what
  the GPU cache drops; a window group's blocks are there only if the GPU cached them);
- write rule ``compute`` (write-through): at a step's end, each group's blocks named in the step that
  are still resident: the full groups' all, a window group's only those still in its window at the
  request's computed tokens (blocks that already left it are not written);
- lookup: the longest ``H`` blocks for which the full group has a GPU run then a CPU run covering
  ``0 .. H - 1`` and every window group a GPU run then a CPU run covering the window's blocks before
  token ``H * block`` (each group's prefix rule, served from either tier); a state group: none;
- load: every group's blocks of the hit that are not on the GPU are loaded over the link, all in one
  load of ``sum over groups`` blocks (``load_ms_per_block`` each); the scheduler sees ``(h, H - h)``,
  ``h`` the hit every group has on the GPU alone.

Bulk decode runs: a run of decode-only steps stops where the next step would change the pool: a full
group's block boundary (as for one group; a window table grows with it) or the first step at which a
window group frees a block (:meth:`free_slots_of`); it never crosses boundaries (:meth:`take_boundaries`).
Decode steps that free and take nothing are answered in O(1) from a per-request room
(:mod:`dynlab.kv.hybrid_slots`, whose :meth:`grow` is the general path above).

Pools working on runs (:class:`~dynlab.kv.run_pool.RunBlockPool`) are not modelled: with trace blocks of
several engine blocks the engine set-up gives the groups the plain pool, names one by one.
"""
from __future__ import annotations

from typing import Optional, Tuple

from dynlab.kv.cache_manager import FullAttentionGroup, KvCacheManager
from dynlab.kv.cpu_tier import queue_load
from dynlab.kv.groups import HybridPool, SlidingWindowGroup
from dynlab.kv.hybrid_slots import HybridSlots

__all__ = ["HybridKvCacheManager", "GROUP_NAME_STRIDE"]

GROUP_NAME_STRIDE = 1 << 64
"""Offset between the names of one prompt block in successive KV cache groups when a trace block is one
engine block (names are < 2**64); :attr:`~dynlab.kv.groups.HybridPool.name_stride` is the manager's."""

_NO_WINDOW = 1 << 62  # an extra full-attention group: a window nothing leaves


class HybridKvCacheManager(HybridSlots, KvCacheManager):
    """One engine's KV cache over the groups of ``layout`` (:class:`~dynlab.kv.groups.HybridPool`), one pool
    of ``capacity`` blocks of ``block`` tokens; ``in_flight``: tokens one step may schedule (the engine's
    ``max_num_batched_tokens``), which caps a window group's blocks in the whole-sequence admission check
    (``None``: no cap). Raises ``ValueError`` with ``runs``."""

    def __init__(self, capacity: int, block: int, layout: HybridPool, in_flight: Optional[int] = None, **kw):
        if kw.get("runs"):
            raise ValueError("KV cache groups (sliding-window, chunked-local or state layers) are not modelled "
                             "with trace blocks other than --block")
        super().__init__(capacity, block, **kw)
        extra = tuple(SlidingWindowGroup(block, _NO_WINDOW) for _ in range(layout.full_groups - 1))
        self.extra = extra + layout.groups
        self.groups = (FullAttentionGroup(block),) + self.extra
        self.layout = layout
        self.in_flight = in_flight  # tokens a step may schedule (vLLM's max_in_flight_tokens, synchronous); None: no cap
        self.stride = layout.name_stride
        self.tables: dict = {}  # request -> [[skip, keys] per extra group]
        self.held_tables: dict = {}
        self.reserved_tables: dict = {}
        self._seqs: dict = {}
        self._plan: Optional[tuple] = None  # (req, H, full GPU hits, [GPU hits per extra group]) of a CPU hit
        self._loads: dict = {}  # request -> [(extra group, first, end)] of its blocks loading from the CPU
        self._named: list = []  # (req, extra group, first, end) named this step (write-through)
        self._room: dict = {}  # request -> (lo, hi, limit, stop): its decode steps' O(1) answers (hybrid_slots)

    # -- reading ------------------------------------------------------------------------------
    def fits(self, tokens: int) -> bool:
        """Whether every group's whole table for ``tokens`` tokens fits at once (conservative: a prompt
        computed in one chunk holds them all before the window frees any)."""
        return sum(g.blocks_needed(tokens) for g in self.groups) <= self.pool.capacity

    def seq_of(self, req, i: int) -> list:
        """Names of ``req``'s prompt blocks in extra group ``i`` (0-based): ``name + (i + 1) * stride``."""
        seqs = self._seqs.get(req)
        if seqs is None:
            seqs = self._seqs[req] = [None] * len(self.extra)
        if seqs[i] is None:
            off = (i + 1) * self.stride
            seqs[i] = [n + off for n in self.sequence(req)]
        return seqs[i]

    def held_blocks(self, req) -> list:
        """Blocks ``req`` holds in each group, full group first (tests, docs)."""
        return [len(req.keys)] + [len(keys) for _, keys in self.tables.get(req, ())]

    def _window_cached(self, req, h: int, peek: int = 0) -> bool:
        """Whether every extra group has its window's blocks before token ``h * block`` cached, and with
        ``peek`` 1 block ``h`` too (the block a drop took back: vLLM's ``tail + 1`` rule, PR #44082)."""
        pool = self.pool
        e = h + peek
        for i, g in enumerate(self.extra):
            if not g.prefix_cache:
                return h == 0
            s = g.skipped(h * self.block)
            if e > s and pool.lookup(self.seq_of(req, i)[s:e], e - s) < e - s:
                return False
        return True

    def _hit(self, req, h: int, peek: int = 0) -> int:
        while h > 0 and not self._window_cached(req, h, peek):
            h -= 1
        return h

    def _dropped_hit(self, req) -> int:
        """The hit with a drop of its last block (:attr:`drop_last`), vLLM 0.33's hybrid coordinator with
        ``use_eagle_block_drop``: the full group matches up to one block past the usual cap (its EAGLE
        margin: at most the request's whole blocks) and drops its last, ``h = L - 1``; a window group
        matches its window's blocks before ``h`` plus block ``h`` itself and drops that one (the window's
        tail + 1 contiguous blocks), so the hit is the largest ``h <= L - 1`` with both."""
        top = self.pool.lookup(req.seq, min(len(req.names), req.num_tokens // self.block))
        return self._hit(req, top - 1, peek=1) if top > 1 else 0

    def find_cached_prefix(self, req) -> Tuple[int, int]:
        """``(h, hc)``: ``h`` the longest prefix every group serves from the GPU pool, ``h + hc`` the longest
        one they serve from the pool and the CPU tier (module docstring; ``hc`` 0 without a tier)."""
        if self.drop_last:
            return self._dropped_hit(req), 0  # (no CPU tier with the drop: refused)
        cap = min(len(req.names), self.hit_cap(req.num_tokens))
        g0 = self.pool.lookup(req.seq, cap)
        h = self._hit(req, g0)
        cpu = self.cpu
        if cpu is None or not all(g.prefix_cache for g in self.extra):
            return h, 0
        top = g0 + (cpu.lookup(req.names, g0, cap - g0) if g0 < cap else 0)
        H = top
        while H > h:
            gpu, miss = self._cpu_plan(req, H)
            if gpu is not None:
                self._plan = (req, H, min(g0, H), gpu)
                return h, H - h
            H = miss  # every longer hit's window holds the missing block too (windows only move forward)
        return h, 0

    def _cpu_plan(self, req, H: int) -> tuple:
        """``(each extra group's GPU hits, None)``: a leading run of its window's blocks before token
        ``H * block`` on the GPU, the rest in the CPU tier, contiguously; ``(None, m)`` when some group
        lacks its block ``m`` in both."""
        pool, cpu, out = self.pool, self.cpu, []
        for i, g in enumerate(self.extra):
            s = min(g.skipped(H * self.block), H)
            seq = self.seq_of(req, i)
            a = pool.lookup(seq[s:H], H - s)
            if a < H - s:
                c = cpu.lookup(seq, s + a, H - s - a)
                if c < H - s - a:
                    return None, s + a + c
            out.append(a)
        return out, None

    # -- allocating ---------------------------------------------------------------------------
    def _take(self, req, h: int, tokens: int, computed: int, gpu: Optional[tuple] = None,
              reserve: int = 0) -> Optional[tuple]:
        """Full keys and tables for ``req`` holding nothing: ``h`` hits, slots to ``tokens``, windows at
        ``computed``; ``None`` (nothing taken) when the free queue cannot give them, or the blocks of
        ``reserve`` tokens (full admission, :meth:`admission_tokens`; a window group's at most its
        :meth:`~dynlab.kv.groups.SlidingWindowGroup.admission_cap`, vLLM's ``apply_admission_cap``) are not free now. ``gpu``:
        ``(full GPU hits, [each extra group's GPU hits])`` when the CPU tier gives the rest of the ``h`` (new
        blocks are taken for them), else all ``h`` are GPU hits."""
        pool = self.pool
        hf = h if gpu is None else gpu[0]
        whole = reserve > tokens  # the whole-sequence check, each window group's blocks capped (admission_cap)
        need = self.blocks_needed(tokens) - hf
        seq_need = self.blocks_needed(reserve) - hf if whole else 0
        evict = pool.evictable_hits(req.seq, hf) if hf else 0
        plan = []
        for i, g in enumerate(self.extra):
            s = g.skipped(computed)
            a = max(h - s, 0) if gpu is None else gpu[1][i]
            hits = self.seq_of(req, i)[s:s + a] if a else []
            new = g.blocks_needed(tokens) - (s + a)
            plan.append((s, hits, new))
            need += max(new, 0)
            if whole:
                seq_need += max(min(g.blocks_needed(reserve), g.admission_cap(self.in_flight)) - (s + a), 0)
            evict += pool.evictable_hits(hits, len(hits)) if hits else 0
        if max(need, seq_need) + evict > pool.num_free:
            return None
        keys = pool.take_hits(req.seq, hf)  # every group's hits first: an allocation must not evict a hit
        taken = [pool.take_hits(hits, len(hits)) for _, hits, _ in plan]  # (a copy's key where a name has copies)
        if self.blocks_needed(tokens) > hf:
            keys += pool.allocate(self.blocks_needed(tokens) - hf)
        tables = [[s, hit + (pool.allocate(new) if new > 0 else [])] for (s, _, new), hit in zip(plan, taken)]
        return keys, tables

    def allocate_new(self, req, h: int, tokens: int, reserve: int = 0) -> Optional[list]:
        """Keys of the full group (tables of the others kept here) for a request holding nothing; ``reserve``:
        as :meth:`KvCacheManager.allocate_new`."""
        got = self._take(req, h, tokens, h * self.block, reserve=reserve)
        if got is None:
            return None
        self.tables[req] = got[1]
        self.forget_room(req)
        return got[0]

    def name_blocks(self, req, n: int) -> None:
        """Name the full blocks the chunk completes in every group (an extra group's under its own names)."""
        old = req.nreg
        super().name_blocks(req, n)
        if req.nreg > old:
            note = self.write_through and self.cpu is not None
            for i, (g, (s, keys)) in enumerate(zip(self.extra, self.tables[req])):
                if g.prefix_cache and req.nreg > max(old, s):
                    self.pool.register(keys, self.seq_of(req, i)[s:], max(old, s) - s, req.nreg - s)
                    if note:
                        self._named.append((req, i, max(old, s), req.nreg))

    def _release_tables(self, tables) -> None:
        for _, keys in tables:
            self.pool.release(keys)

    def _release_table(self, skip: int, keys: list, named: int, hashed: int) -> None:
        """Free ``keys``, a table's blocks from block ``skip`` on, reversed: those before block ``named`` (named)
        and the unnamed full blocks of generated tokens before block ``hashed`` (vLLM hashes them) to the tail,
        the rest (a partial block, lookahead slots) to the head (:meth:`BlockPool.release`'s ``out``)."""
        at = min(max(named - skip, 0), len(keys))
        self.pool.release(keys, (), at, max(min(hashed - skip, len(keys)) - at, 0))

    def free(self, req) -> None:
        """Return every group's blocks to the free queue, the full group's first (named ones stay cached). The
        extra groups' blocks of generated tokens follow the full group's (:meth:`KvCacheManager.free`): named
        under the names a preemption gives them there, or, at a finish, to the tail unnamed."""
        old = req.nreg
        super().free(req)
        tables = self.tables.pop(req, ())
        self.forget_room(req)
        self._seqs.pop(req, None)
        self._loads.pop(req, None)
        hashed = req.nreg
        if req.nreg > old:  # a preemption named the generated tokens' full blocks (name_output): here too
            self._name_extra(req, tables, old)
        elif req.generated >= req.output_length:
            hashed = req.computed // self.block
        for g, (skip, keys) in zip(self.extra, tables):
            if g.prefix_cache:
                self._release_table(skip, keys, req.nreg, hashed)
            else:  # a state group's blocks: never hashed, to the head
                self.pool.release(keys)

    def _name_extra(self, req, tables, old: int) -> None:
        """Register every extra group's blocks ``old .. req.nreg - 1`` (the names :func:`name_output` gave),
        without a ``BlockStored`` (as that function)."""
        pool = self.pool
        stored = len(pool.stored)
        for i, (g, (skip, keys)) in enumerate(zip(self.extra, tables)):
            end = min(req.nreg, skip + len(keys))
            if g.prefix_cache and end > max(old, skip):
                pool.register(keys, self.seq_of(req, i)[skip:], max(old, skip) - skip, end - skip)
        del pool.stored[stored:]
        self._seqs.pop(req, None)

    # -- the CPU tier, per group --------------------------------------------------------------
    def begin_step(self, now: float) -> None:
        """As :meth:`KvCacheManager.begin_step`; the blocks named for write-through start empty too."""
        super().begin_step(now)
        self._named = []

    def offload(self, removed: list) -> Optional[Tuple[tuple, tuple]]:
        """Write every group's evicted blocks to the CPU tier; the net change without the extra groups'
        names (what the CPU KV events carry)."""
        return _own_change(super().offload(removed), self.stride)

    def write_computed(self, stored: tuple) -> Optional[Tuple[tuple, tuple]]:
        """Write-through at a step's end: the full group's ``stored`` names, then each extra group's blocks
        named in the step that are still in its window (module docstring); the net change, own names."""
        extra = []
        for req, i, first, end in self._named:
            lo = max(first, self.extra[i].skipped(req.computed))
            off = (i + 1) * self.stride
            extra += [n + off for n in self.sequence(req)[lo:end]]
        self._named = []
        return _own_change(super().write_computed(tuple(stored) + tuple(extra)), self.stride)

    def start_load(self, req, h: int, hc: int, n: int, now: float) -> bool:
        """Admit ``req`` whose lookup found a hit of ``h + hc`` blocks needing the CPU tier: take every
        group's GPU hits and new blocks for the rest and its first chunk, queue one load of every group's
        blocks not on the GPU (``req.ready_ms``). ``False`` (nothing changed) when the pool cannot give them."""
        plan, self._plan = self._plan, None
        if plan is None or plan[0] is not req or plan[1] != h + hc:
            raise RuntimeError("start_load without the find_cached_prefix that found its CPU hit (bug)")
        _, H, hf, gpu = plan
        B = self.block
        got = self._take(req, H, H * B + n, H * B, (hf, gpu), self.admission_tokens(req, H * B, n))
        if got is None:
            return False
        self.count_hits(req, h, hc)
        req.keys, self.tables[req] = got
        self.forget_room(req)
        loads = []
        for i, (g, a) in enumerate(zip(self.extra, gpu)):
            first = min(g.skipped(H * B), H) + a
            if first < H:
                loads.append((i, first, H))
        names = list(req.names[hf:H]) + [m for i, a, b in loads for m in self.seq_of(req, i)[a:b]]
        self.cpu.touch(names)
        req.computed, req.nreg, req.load_blocks = hf * B, hf, H - hf
        self._loads[req] = loads
        queue_load(self, req, len(names), now)
        return True

    def load_arrived(self, req) -> None:
        """Name every group's blocks ``req`` loaded from the CPU tier."""
        for i, first, end in self._loads.pop(req, ()):
            s, keys = self.tables[req][i]
            self.pool.register(keys, self.seq_of(req, i)[s:], first - s, end - s)
        super().load_arrived(req)

    # -- events -------------------------------------------------------------------------------
    def step_events(self) -> tuple:
        """As :meth:`KvCacheManager.step_events`, the extra groups' names left out (the router sees prompt blocks)."""
        stored, _, removed, _, used = super().step_events()
        return _own(stored, self.stride), None, _own(removed, self.stride), None, used

    def removed(self) -> Tuple[tuple, Optional[tuple]]:
        """``(names, None)`` the pool evicted since the step began, the extra groups' names left out."""
        return _own(tuple(self.evicted()), self.stride), None

    # -- the P/D handoff ----------------------------------------------------------------------
    def hold(self, req) -> None:
        """Keep every group's blocks of ``req`` in use after it leaves (handed off) until :meth:`release`."""
        super().hold(req)
        self.held_tables[req] = self.tables.pop(req)
        self.forget_room(req)

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
        self.forget_room(req)
        super().receive(req, prefix_cache)

    def check(self, holders: list) -> None:
        """As :meth:`KvCacheManager.check`, every group's tables counted."""
        extra = [keys for tables in (list(self.tables.values()) + list(self.held_tables.values())
                                     + list(self.reserved_tables.values())) for _, keys in tables]
        super().check(holders + extra)

    def take_boundaries(self, bound_at, bound_reqs, n):  # pragma: no cover - the set-up turns bulk runs off
        raise RuntimeError("bulk decode runs are not modelled with KV cache groups")


def kv_cache_manager(capacity: int, block: int, kv_layout=None, in_flight: Optional[int] = None,
                     **kwargs) -> KvCacheManager:
    """The KV cache manager of one engine: a :class:`KvCacheManager` (one full-attention group) when
    ``kv_layout`` is ``None``, else a :class:`HybridKvCacheManager` over its KV cache groups (``in_flight``:
    its admission cap's tokens per step); ``kwargs`` are :class:`KvCacheManager`'s (``runs``,
    ``cpu_capacity``, ``load_ms_per_block``, ``cpu_write``)."""
    if kv_layout is None:
        return KvCacheManager(capacity, block, **kwargs)
    return HybridKvCacheManager(capacity, block, kv_layout, in_flight, **kwargs)


def _own_change(change, stride: int):
    """A CPU tier's net change ``(stored, removed)`` without the extra groups' names (``None`` stays)."""
    return None if change is None else (_own(change[0], stride), _own(change[1], stride))


def _own(names: tuple, stride: int) -> tuple:
    """``names`` without the extra groups' (>= ``stride``, the layout's ``name_stride``)."""
    if names and max(names) >= stride:
        return tuple(n for n in names if n < stride)
    return names

