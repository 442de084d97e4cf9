"""The KV cache manager of one engine: a request's blocks, over its KV cache groups, the CPU tier and the P/D handoff.

Modelled on vLLM v1's ``KVCacheManager`` / ``KVCacheCoordinator`` / ``SingleTypeKVCacheManager`` (``vllm/v1/core/``):
the scheduler never touches blocks, it asks this manager three questions about a request, all in tokens:

- :meth:`KvCacheManager.find_cached_prefix` (vLLM's ``get_computed_blocks``): the leading full prompt blocks
  cached (GPU pool, then the CPU tier behind it);
- :meth:`KvCacheManager.allocate_slots` / :meth:`KvCacheManager.allocate_new`: blocks for ``n``
  more tokens (``False`` / ``None``, nothing taken, when the free queue cannot give them);
- :meth:`KvCacheManager.free`: return its blocks (cached ones stay in the prefix cache).

**KV cache groups.** :class:`FullAttentionGroup` (vLLM's ``FullAttentionManager``: blocks needed =
``ceil(tokens / block)``, :meth:`FullAttentionGroup.blocks_needed`, the one formula); sliding-window,
chunked-local and state groups are :mod:`dynlab.kv.groups`, over one pool in :mod:`dynlab.kv.hybrid`.

CPU tier (``cpu_capacity > 0``; vLLM's CPU KV offloading, LMCache; :mod:`dynlab.kv.cpu_tier`):

- Write rule ``cpu_write="evict"`` (a victim tier): the names a step's allocation evicts
  from the pool (the engine's ``removed``) are written to the CPU tier (LRU); its net change is
  the engine's ``cpu_stored`` / ``cpu_removed`` (publish as ``BlockStored`` / ``BlockRemoved`` with
  ``medium="CPU"`` at the step's start, after the GPU ``BlockRemoved``).
- Write rule ``cpu_write="compute"`` (the default; write-through, as vLLM's ``OffloadingConnector`` and LMCache
  store KV on the way in): the full prompt blocks a step computes are written to the CPU tier at the
  step's end, unless it holds them already; a GPU eviction writes nothing (the copy is there, unless
  the tier dropped it). The net change is :attr:`~dynlab.engine.bulk.StepResult.cpu_stored` /
  ``cpu_removed`` (publish at the step's end, after the GPU ``BlockStored``). The tiers are then
  inclusive and independent, the rule of the cache lab's :class:`~dynlab.kv.tiers.TwoTierCache`.
- Admission's lookup continues in the CPU tier where the GPU hits end (contiguous, within the same
  last-token cap, :meth:`~dynlab.kv.blocks.FullAttentionGroup.hit_cap`); the CPU hits are touched (most recent) and keep their host copy.
- **Load rule**: a request with CPU hits waits for their load before its first step (:mod:`dynlab.kv.cpu_tier`).

The rules that differ between vLLM releases, each in one place, vLLM 0.33.0's by default: which
blocks must be free to admit a request (:meth:`KvCacheManager.admission_tokens`: the whole
sequence; ``admission="chunk"`` the chunk scheduled now), which full blocks are named
(:meth:`KvCacheManager.nameable` / :meth:`KvCacheManager.name_output`: generated tokens' too), the free-queue
position of a released sequence's unnamed blocks (:meth:`dynlab.kv.block_pool.BlockPool._push_unnamed`: the head).

Requests are duck-typed (:class:`dynlab.engine.request.EngineRequest`: ``names``, ``n_names``, ``runs``, ``seq``,
``keys``, ``nreg``, ``computed``, ``num_tokens``, ...): this module imports nothing from :mod:`dynlab.engine`.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from dynlab.kv.block_pool import UNNAMED, BlockPool
from dynlab.kv.blocks import FullAttentionGroup
from dynlab.kv.cpu_tier import CpuTier, queue_load
from dynlab.kv.output_blocks import OUTPUT_NAMES, name_output, name_reply, published
from dynlab.kv.pool_checks import check_manager
from dynlab.kv.run_pool import RunBlockPool

__all__ = ["KvCacheManager", "FullAttentionGroup", "CPU_WRITES", "ADMISSIONS", "OUTPUT_NAMES"]

#: admission rules: ``full`` (vLLM 0.33.0's default: the whole sequence's blocks must be free) or
#: ``chunk`` (the releases before ``scheduler_reserve_full_isl``: the chunk scheduled now's)
ADMISSIONS = ("full", "chunk")
#: when a block is written to the CPU tier: ``evict`` (when the GPU pool evicts it: a victim tier) or
#: ``compute`` (when the step computing it ends: write-through, the copy stays on both tiers)
CPU_WRITES = ("evict", "compute")


class KvCacheManager:
    """One engine's KV cache: the block pool of its group, the CPU tier behind it, the P/D handoff, the counters.

    ``capacity``: blocks in the pool; ``block``: tokens per block; ``runs``: the pool works on runs of
    names (:class:`~dynlab.kv.run_pool.RunBlockPool`); ``cpu_capacity``: CPU-tier blocks (0: none);
    ``load_ms_per_block``: host-to-device load time per block (ms); ``cpu_write``: one of :data:`CPU_WRITES`;
    ``admission``: one of :data:`ADMISSIONS`. Raises ``ValueError`` for a negative load time, an unknown value.

    Counters: ``loaded_blocks`` / ``offloaded_blocks`` (CPU -> GPU / GPU -> CPU), ``gpu_hit_blocks`` /
    ``cpu_hit_blocks`` (first admissions' hits per tier), ``peak_used_blocks``, :meth:`used_block_ms`.
    """

    drop_last = False  #: a prefix hit drops its last block (--spec-hash-rule drop, spec.drops_last_block; the scheduler sets it)

    def __init__(self, capacity: int, block: int, *, runs: bool = False, cpu_capacity: int = 0,
                 load_ms_per_block: float = 0.0, cpu_write: str = "evict", admission: str = "full"):
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {', '.join(ADMISSIONS)}, got {admission!r}")
        self.full_admission = admission == "full"
        self.next_output_name = OUTPUT_NAMES  # the next name for a block of generated tokens (name_output)
        self.stored_outputs = False  # whether the pool's stored names may hold such names (name_blocks)
        self._late: list = []  # reply blocks named by the trace, registered at a finish (finish_stored)
        self.replies = False  # whether a request with reply names (out_blocks) was sequenced here
        self.block = block
        #: the KV cache groups (one today: full attention); each holds ``req.keys`` (one list per group
        #: once there are several)
        self.groups = (FullAttentionGroup(block),)
        #: blocks ``tokens`` tokens of a request occupy: the one group's ``blocks_needed``
        self.blocks_needed = self.groups[0].blocks_needed
        #: the most leading full blocks a request of ``tokens`` tokens may hit: the one group's ``hit_cap``
        self.hit_cap = self.groups[0].hit_cap
        self.runs = runs
        self.pool = RunBlockPool(capacity) if runs else BlockPool(capacity)
        if load_ms_per_block < 0:
            raise ValueError(f"load_ms_per_block must be >= 0, got {load_ms_per_block}")
        self.cpu: Optional[CpuTier] = CpuTier(cpu_capacity) if cpu_capacity else None
        if cpu_write not in CPU_WRITES:
            raise ValueError(f"cpu_write must be one of {', '.join(CPU_WRITES)}, got {cpu_write!r}")
        self.write_through = cpu_write == "compute"
        self.load_ms_per_block = load_ms_per_block
        self.link_free = 0.0  # when the host-to-device link finishes its queued loads (ms)
        self.held: dict = {}  # request -> its keys, handed off and not yet released
        self.reserved: dict = {}  # request -> (its keys, blocks hit): reserved, KV not yet received
        self.loaded_blocks = 0
        self.offloaded_blocks = 0
        self.gpu_hit_blocks = self.cpu_hit_blocks = 0
        self.peak_used_blocks = 0
        self.used_ms = 0.0
        self.used_t: Optional[float] = None

    # -- the rules (one place each; vLLM 0.33.0's by default) -----------------------------------
    def admission_tokens(self, req, computed: int, n: int) -> int:
        """Tokens whose blocks must be free to admit ``req`` with ``computed`` tokens cached and ``n``
        scheduled now (only ``computed + n`` are allocated). ``admission="full"`` (vLLM 0.33.0's
        default ``scheduler_reserve_full_isl=True``): the whole sequence, ``req.num_tokens`` (the
        prompt, plus the tokens generated so far on a resume); ``"chunk"`` (the releases before it,
        vLLM PR #37307): ``computed + n``."""
        return req.num_tokens if self.full_admission else computed + n

    def nameable(self, req, tokens: int) -> int:
        """Leading full blocks of ``req`` that are named once ``tokens`` are computed:
        ``min(tokens // block, len(req.names))``; ``req.names`` are its prompt's full blocks, plus
        the blocks of generated tokens named by :meth:`name_output` before a preemption (vLLM
        hashes every full block of a request, output tokens included)."""
        n = tokens // self.block
        return n if n < req.n_names else req.n_names

    def name_output(self, req) -> None:
        """Name the full blocks of ``req``'s generated tokens before it frees them
        (:func:`dynlab.kv.output_blocks.name_output`)."""
        name_output(self, req)

    # -- reading ------------------------------------------------------------------------------
    capacity = property(lambda self: self.pool.capacity, doc="Blocks in the pool.")
    num_free = property(lambda self: self.pool.num_free, doc="Blocks the free queue can give now.")
    used_blocks = property(lambda self: self.pool.used_blocks, doc="Blocks held by requests now.")

    def fits(self, tokens: int) -> bool:
        """Whether ``tokens`` tokens of one request can ever be held at once (their blocks <= capacity)."""
        return self.blocks_needed(tokens) <= self.pool.capacity

    def free_slots(self, req) -> int:
        """Tokens ``req`` can still compute in the blocks it holds (``len(keys) * block - computed``)."""
        return len(req.keys) * self.block - req.computed

    def free_slots_of(self, sched: list) -> list:
        """:meth:`free_slots` of each request of the ``(request, tokens)`` pairs ``sched``, in order."""
        B = self.block
        return [len(r.keys) * B - r.computed for r, _ in sched]

    def sequence(self, req):
        """``req``'s names as the pool takes them (:attr:`seq`, computed once)."""
        if req.seq is None:
            req.seq = self.pool.sequence(req.names, req.runs)
        if req.out_blocks:  # (a request handed over by a P/D transfer has its seq from its prefill worker)
            self.replies = True
        return req.seq

    def overlap(self, names: Sequence[int], cap: Optional[int] = None) -> int:
        """Leading ``names`` cached now in the pool (at most ``cap``)."""
        return self.pool.lookup(self.pool.sequence(names, None), len(names) if cap is None else cap)

    def overlap_of(self, req, cap: Optional[int] = None) -> int:
        """:meth:`overlap` of ``req``'s names (and runs)."""
        return self.pool.lookup(self.sequence(req), req.n_names if cap is None else cap)

    def find_cached_prefix(self, req) -> Tuple[int, int]:
        """``(h, hc)``: the leading full prompt blocks of ``req`` cached in the pool (``h``), then in
        the CPU tier (``hc``, contiguous after them), at most ``min(len(names), hit_cap(num_tokens))``
        in all (vLLM recomputes the last token); with :attr:`drop_last` one block fewer in the pool."""
        names = req.names
        cap = min(len(names), self.hit_cap(req.num_tokens))
        h = self.pool.lookup(req.seq, cap)
        h = h - 1 if self.drop_last and h else h  # (vLLM's one-group hit with use_eagle_block_drop: its last block recomputed)
        cpu = self.cpu
        if cpu is not None and h < cap:
            return h, cpu.lookup(names, h, cap - h)
        return h, 0

    # -- allocating ---------------------------------------------------------------------------
    def allocate_new(self, req, h: int, tokens: int, reserve: int = 0) -> Optional[list]:
        """Keys for a request holding nothing: its ``h`` pool hits taken, plus new blocks up to
        ``tokens`` tokens; ``None`` (nothing taken) when the free queue cannot give them, or the
        blocks of ``max(tokens, reserve)`` tokens (:meth:`admission_tokens`) are not free now."""
        pool = self.pool
        need = self.blocks_needed(tokens) - h
        check = self.blocks_needed(reserve) - h if reserve > tokens else need
        if check + (pool.evictable_hits(req.seq, h) if h else 0) > pool.num_free:
            return None
        keys = pool.take_hits(req.seq, h)
        if need > 0:
            keys += pool.allocate(need)
        return keys

    def hit_tokens(self, blocks: int) -> int:
        """Tokens the leading ``blocks`` full blocks of a hit cover: a request's computed tokens once admitted."""
        return blocks * self.block

    def admit(self, req, h: int, tokens: int, reserve: int = 0) -> bool:
        """:meth:`allocate_new` for ``req``, which then holds the keys, ``h`` hit blocks computed and named;
        ``False`` (nothing taken) as there. A first admission's hits count (``gpu_hit_blocks``)."""
        keys = self.allocate_new(req, h, tokens, reserve)
        if keys is None:
            return False
        self.count_hits(req, h, 0)
        req.keys, req.computed, req.nreg = keys, h * self.block, h
        return True

    def allocate_slots(self, req, tokens: int) -> bool:
        """Grow ``req.keys`` to hold ``tokens`` tokens; ``False`` (nothing taken) when the free queue cannot."""
        need = self.blocks_needed(tokens) - len(req.keys)
        if need > 0:
            pool = self.pool
            if need > pool.num_free:
                return False
            req.keys += pool.allocate(need)
        return True

    def name_blocks(self, req, n: int) -> None:
        """Name the full blocks the chunk of ``n`` tokens scheduled now completes (:meth:`nameable`);
        nothing once every name ``req`` has is registered (its prompt's: a decode's fast path)."""
        if req.nreg < req.n_names:
            full = self.nameable(req, req.computed + n)
            if full > req.nreg:
                self.pool.register(req.keys, req.seq, req.nreg, full)
                if full > req.input_length // self.block:  # a resumed request's generated-token blocks
                    self.stored_outputs = True
                req.nreg = full

    def preempt(self, req) -> None:
        """:meth:`free` ``req``'s blocks for a recompute: it names none of them any more."""
        self.free(req)
        req.nreg = 0

    def drop_held(self, reqs: list) -> list:
        """``reqs`` without those handed off whose blocks are held (:meth:`hold`), in order."""
        return [r for r in reqs if r not in self.held]

    def free(self, req) -> None:
        """Return ``req``'s blocks to the free queue (named ones stay cached; a trace-named reply's blocks named
        first, :func:`~dynlab.kv.output_blocks.name_reply`; the full blocks of its other generated tokens named,
        :meth:`name_output`, or, at a finish, freed to the tail unnamed: no one can hit them)."""
        if req.out_blocks and req.nreg < req.n_names:
            name_reply(self, req)
        have = req.n_names
        if req.computed >= (have + 1) * self.block:
            if req.generated >= req.output_length:  # finished: its generated-token blocks can never be hit
                out = min(req.computed // self.block, len(req.keys)) - have if req.nreg >= have else 0
                self.pool.release(req.keys, req.seq, have, out)
                req.keys = []
                return
            self.name_output(req)
        self.pool.release(req.keys, req.seq)
        req.keys = []

    def finish_stored(self, sched: Sequence = ()) -> tuple:
        """Names :func:`~dynlab.kv.output_blocks.name_reply` registered since :meth:`step_events` (finishes), and
        now for the reply blocks a bulk run (``sched``: its pairs) completed: ``BlockStored`` at its end.
        Nothing to do (``()``) until a request with reply names was sequenced here."""
        if not self.replies:
            return ()
        for req, _ in sched:
            if req.out_blocks and req.keys and req.nreg < req.n_names:
                name_reply(self, req)
        late, self._late = tuple(self._late), []
        return late

    def take_boundaries(self, bound_at: list, bound_reqs: list, n: int) -> Tuple[int, int]:
        """The next ``n`` block boundaries of a bulk decode run (popped from the ends of ``bound_at`` /
        ``bound_reqs``, earliest last): each request there takes an unnamed block, one
        :meth:`BlockPool.allocate_each` for all, the usage integral advanced to each boundary's
        time (ms). Returns ``(allocations that evicted, blocks used after)``."""
        pool = self.pool
        used, used_ms, used_t = pool.used_blocks, self.used_ms, self.used_t
        counts = []
        for _ in range(n):
            tb, reqs = bound_at.pop(), bound_reqs.pop()
            if used_t is not None:  # accumulate(tb): the same sums in the same order
                used_ms += used * (tb - used_t)
            used_t = tb
            for req in reqs:  # in running order, as a step start takes them
                req.keys.append(UNNAMED)
            used += len(reqs)
            counts.append(len(reqs))
        self.used_ms, self.used_t = used_ms, used_t
        pool.clear_events(stored=False)
        evicting = pool.allocate_each(counts, OUTPUT_NAMES if self.next_output_name != OUTPUT_NAMES else None)
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
        return evicting, used

    # -- events and usage ---------------------------------------------------------------------
    def begin_step(self, now: float) -> None:
        """A step starts at ``now`` (ms): the usage integral advanced to it, the pool's stored /
        removed names cleared (a step's events start empty)."""
        pool = self.pool
        if self.used_t is not None:  # accumulate(now), written out: once per step
            self.used_ms += pool.used_blocks * (now - self.used_t)
        self.used_t = now
        pool.clear_events()

    def step_events(self) -> tuple:
        """``(stored, stored_runs, removed, removed_runs, used)`` since :meth:`begin_step`: the names
        registered and evicted (tuples; their runs, or ``None`` without ``runs``; the blocks of generated
        tokens left out, :meth:`name_output`) and the blocks used now (recorded in :attr:`peak_used_blocks`)."""
        pool = self.pool
        used = pool.used_blocks
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
        removed = pool.removed
        if removed and (pool.copies.name or self.next_output_name != OUTPUT_NAMES):
            removed = self.evicted()  # (else evicted() is removed itself: no alias to translate, no output name)
        self._late = []  # preemptions' reply blocks are in this step's events
        if self.stored_outputs:  # a resumed request's generated-token blocks: not published
            self.stored_outputs = False
            published(self, pool.stored, pool.stored_runs if self.runs else None)
        if self.runs:
            return tuple(pool.stored), tuple(pool.stored_runs), tuple(removed), tuple(pool.removed_runs), used
        return tuple(pool.stored), None, tuple(removed), None, used

    def removed(self) -> Tuple[tuple, Optional[tuple]]:
        """``(names, runs or None)`` the pool evicted since :meth:`begin_step` (:meth:`evicted`)."""
        pool = self.pool
        return tuple(self.evicted() if pool.removed else ()), (tuple(pool.removed_runs) if self.runs else None)

    def evicted(self) -> list:
        """The pool's evicted names since :meth:`begin_step`, a copy's alias as its name (:mod:`dynlab.kv.copies`),
        generated tokens' dropped (:func:`~dynlab.kv.output_blocks.published`): the ``BlockRemoved`` names, offloaded."""
        pool, runs = self.pool, (self.pool.removed_runs if self.runs else None)
        copies, removed = pool.copies, pool.removed
        return published(self, copies.translate(removed, runs, pool.__contains__) if copies.name else removed, runs)

    def note_used(self) -> int:
        """Blocks used now, recorded in :attr:`peak_used_blocks`."""
        used = self.pool.used_blocks
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
        return used

    def accumulate(self, t: float) -> None:
        """Advance the usage integral (blocks x ms) to ``t`` (ms)."""
        if self.used_t is not None:
            self.used_ms += self.pool.used_blocks * (t - self.used_t)
        self.used_t = t

    def used_block_ms(self, now: Optional[float] = None) -> float:
        """Integral of used blocks over time (blocks x ms) up to ``now`` (default: the last change)."""
        total = self.used_ms
        if now is not None and self.used_t is not None:
            total += self.pool.used_blocks * (now - self.used_t)
        return total

    # -- the CPU tier -------------------------------------------------------------------------
    def offload(self, removed: list) -> Optional[Tuple[tuple, tuple]]:
        """Write the names the pool evicted to the CPU tier: its net change ``(stored, removed)``;
        ``None`` under write-through (``cpu_write="compute"``: written when computed)."""
        if self.write_through:
            return None
        cpu = self.cpu
        self.offloaded_blocks += len({name for name in removed if name not in cpu})  # two copies: one write
        return cpu.offload(removed)

    def write_computed(self, stored: tuple) -> Optional[Tuple[tuple, tuple]]:
        """Write the names a step computed to the CPU tier except those it holds: its net change, or
        ``None`` when all were there."""
        cpu = self.cpu
        new = list(dict.fromkeys(name for name in stored if name not in cpu))  # two copies of a name: one write
        if not new:
            return None
        self.offloaded_blocks += len(new)
        return cpu.offload(new)

    def start_load(self, req, h: int, hc: int, n: int, now: float) -> bool:
        """Admit ``req`` whose lookup found ``h`` pool then ``hc`` CPU blocks, ``n`` tokens to schedule:
        take its hits and the blocks of its loads and first chunk, queue the load on the link
        (``req.ready_ms``). ``False`` (nothing changed) when the pool cannot give the blocks."""
        B = self.block
        computed = (h + hc) * B
        keys = self.allocate_new(req, h, computed + n, self.admission_tokens(req, computed, n))
        if keys is None:
            return False
        self.count_hits(req, h, hc)
        req.keys = keys
        self.cpu.touch(req.names[h:h + hc])
        req.computed = h * B
        req.nreg = h
        req.load_blocks = hc
        queue_load(self, req, hc, now)
        return True

    def count_hits(self, req, h: int, hc: int) -> None:
        """Count ``req``'s hits, ``h`` pool and ``hc`` CPU-tier blocks, if this is its first admission."""
        if req.hit_tokens is None:
            self.gpu_hit_blocks += h
            self.cpu_hit_blocks += hc

    def load_arrived(self, req) -> None:
        """Name the blocks ``req`` loaded from the CPU tier: its computed tokens cover them."""
        hc = req.load_blocks
        self.pool.register(req.keys, req.seq, req.nreg, req.nreg + hc)
        req.nreg += hc
        req.computed = req.nreg * self.block
        req.load_blocks = 0

    # -- the P/D handoff ----------------------------------------------------------------------
    def hold(self, req) -> None:
        """Keep ``req``'s blocks in use after it leaves (handed off) until :meth:`release`."""
        self.held[req] = req.keys
        req.keys = []

    def release(self, req, now: float) -> None:
        """Free the blocks held for ``req`` at ``now`` (ms). Raises ``KeyError`` if none are held."""
        keys = self.held.pop(req)
        self.accumulate(now)
        self.pool.release(keys, req.seq)

    def reserve(self, req, now: float, tokens: int, prefix_cache: bool = False) -> Optional[int]:
        """Reserve, at ``now`` (ms), blocks for ``tokens`` tokens of ``req`` whose KV comes from a peer,
        its cached prefix taken as hits with ``prefix_cache``; returns the blocks hit, ``None``
        (nothing taken) when they are not free."""
        pool = self.pool
        self.sequence(req)
        h = pool.lookup(req.seq, req.n_names - req.out_blocks) if prefix_cache else 0  # prompt blocks only
        need = self.blocks_needed(tokens) - h
        if need + (pool.evictable_hits(req.seq, h) if h else 0) > pool.num_free:
            return None
        self.accumulate(now)
        keys = pool.take_hits(req.seq, h)
        keys += pool.allocate(need)
        self.reserved[req] = (keys, h)  # req.keys may still be its prefill worker's
        self.note_used()
        return h

    def receive(self, req, prefix_cache: bool = False) -> None:
        """Give ``req`` the blocks reserved for it (its KV arrived); with ``prefix_cache`` name its prompt blocks now, and
        a trace-named reply's (``req.out_blocks``) as its decode steps compute them. ``KeyError`` without a reservation."""
        req.keys, req.nreg = self.reserved.pop(req)
        if not prefix_cache:
            req.nreg = req.n_names  # no prefix cache modelled here: nothing is named
        self.name_blocks(req, 0)

    def check(self, holders: list) -> None:
        """Assert (tests) the pool is consistent and its used blocks are those of ``holders`` (key lists)
        plus the held and reserved ones; the CPU tier within its capacity (:func:`~dynlab.kv.pool_checks.check_manager`)."""
        check_manager(self, holders)
