"""SGLang's scheduler loop (``python/sglang/srt/managers/scheduler.py``, sglang 0.5.23): one batch per forward pass.

:meth:`SglangScheduler.schedule` is ``get_next_batch_to_run``: a prefill batch when
``get_new_batch_prefill`` admits anything (the running requests then do not decode in that pass unless
``--enable-mixed-chunk`` mixes them in), else a decode batch of every running request
(``update_running_batch``): when the pool cannot give each of them its next token's slot
(``ScheduleBatch.check_decode_mem``) requests are *retracted* (``ScheduleBatch.retract_decode``): fewest
tokens generated first (ties: longest prompt first), until the rest fit, keeping one; a retracted request
frees its KV without caching it, goes to the back of the waiting queue and recomputes prompt and generated
tokens from its cached prefix when admitted again, and the new-token ratio is raised; a decode pass without
retraction decays it. ``batch_is_full`` (set when admission ran out of KV tokens or request slots) stops
prefill attempts until a request leaves the running batch, as in SGLang.

Memory (:class:`TokenPool`): ``size`` tokens (the worker's pool, ``capacity x block``), holding the radix cache's
nodes and each request's own (uncached) tokens, allocated in pages of ``page`` tokens; an allocation short of
free tokens evicts from the cache (``evict_to_free_tokens``). A request's computed full blocks enter the
cache when a prefill chunk ends (``cache_unfinished_req``) and at its finish (``cache_finished_req``).
"""
from __future__ import annotations

from typing import Optional

from dynlab.engine.sglang.radix_cache import RadixCache
from dynlab.engine.sglang.schedule_policy import AddReqResult, NewTokenRatio, PrefillAdder, SchedulePolicy

__all__ = ["SgReq", "SglangScheduler", "Step", "TokenPool", "RETRACT_DECODE_STEPS"]

#: ``SGLANG_RETRACT_DECODE_STEPS``: tokens per remaining request a retraction frees in the cache at once
RETRACT_DECODE_STEPS = 20


class SgReq:
    """An :class:`~dynlab.engine.request.EngineRequest` (``req``) with SGLang's state: ``node`` (the cache node
    it locks), ``tree_blocks`` (its leading blocks held in the cache), ``alloc`` (tokens of KV slots allocated),
    ``private`` (tokens it holds outside the cache, page-rounded), ``prefix_tokens`` (the prefix its next
    pass starts from), ``matched_tokens`` (the cached prefix found at its last match)."""

    __slots__ = ("req", "node", "tree_blocks", "alloc", "private", "prefix_tokens", "matched_tokens")

    def __init__(self, req, root):
        self.req, self.node = req, root
        self.tree_blocks = self.alloc = self.private = self.prefix_tokens = self.matched_tokens = 0

    def fill_len(self) -> int:
        """Tokens of ``fill_ids`` (prompt + tokens generated): what a prefill of it computes in all."""
        return self.req.num_tokens

    def fill_names(self, block: int) -> list:
        """The names of its fill's full blocks."""
        return self.req.names[:self.fill_len() // block]

    def match(self, cache: RadixCache, whole: bool = False) -> None:
        """``init_next_round_input``: its cached prefix, at most ``fill_len - 1`` tokens (``_compute_max_prefix_len``);
        ``whole``: up to the whole fill (``SchedulePolicy._compute_prefix_matches`` matches without that cap)."""
        n, node = cache.match_prefix(self.req.names, (self.fill_len() - (0 if whole else 1)) // cache.block)
        self.node, self.tree_blocks = node, n
        self.prefix_tokens = self.matched_tokens = n * cache.block


class TokenPool:
    """The token-to-KV pool of ``size`` tokens in pages of ``page`` tokens, shared with the radix cache ``cache``.
    ``removed``: names the cache evicted since the caller last took them."""

    def __init__(self, size: int, cache: RadixCache, page: int):
        self.size, self.cache, self.page = size, cache, page
        self.private = 0
        self.removed: list = []

    @property
    def available(self) -> int:
        """Free tokens (neither cached nor held by a request)."""
        return self.size - self.cache.total_size - self.private

    @property
    def used(self) -> int:
        """Tokens held by requests: their own and the cached ones they lock."""
        return self.private + self.cache.protected_size

    def evict_to_free(self, tokens: int) -> None:
        short = tokens - self.available
        if short > 0:
            self.removed += self.cache.evict(short)

    def settle(self, r: SgReq, alloc: int) -> None:
        """Set ``r``'s slots to ``alloc`` tokens (its own: page-rounded, less the cached blocks it holds),
        evicting from the cache when short. Raises ``RuntimeError`` when even that cannot give them."""
        block = self.cache.block
        own = -(-alloc // self.page) * self.page - r.tree_blocks * block
        delta = own - r.private
        if delta > 0:
            self.evict_to_free(delta)
            if delta > self.available:
                raise RuntimeError(f"SGLang pool: {delta} tokens asked, {self.available} free (bug)")
        self.private += delta
        r.private, r.alloc = own, alloc

    def release(self, r: SgReq) -> None:
        self.private -= r.private
        r.private = r.alloc = 0


class Step:
    """One forward pass: ``prefill`` ``(request, prefix tokens, extend tokens)``, ``decodes`` (requests
    decoding in it), ``retracted`` (requests retracted when it was formed)."""

    __slots__ = ("prefill", "decodes", "retracted")

    def __init__(self, prefill: list, decodes: list, retracted: list):
        self.prefill, self.decodes, self.retracted = prefill, decodes, retracted


class SglangScheduler:
    """The waiting queue, the running batch and the chunked request of one SGLang worker (see the module
    docstring). ``max_running``: ``--max-running-requests``; ``chunk``: ``--chunked-prefill-size``
    (``None``: off); ``mixed``: ``--enable-mixed-chunk`` (only with chunking, as SGLang's ``is_mixed_chunk``)."""

    def __init__(self, pool: TokenPool, policy: SchedulePolicy, ratio: NewTokenRatio, max_running: int,
                 max_prefill_tokens: int, chunk: Optional[int], mixed: bool = False):
        self.pool, self.cache, self.policy, self.ratio = pool, pool.cache, policy, ratio
        self.max_running, self.max_prefill_tokens, self.chunk = max_running, max_prefill_tokens, chunk
        self.mixed = mixed and chunk is not None
        self.waiting: list = []
        self.running: list = []
        self.chunked: Optional[SgReq] = None
        self.batch_is_full = False
        self.retractions = 0

    def schedule(self) -> Optional[Step]:
        """``get_next_batch_to_run``: the next pass, ``None`` when there is nothing to run."""
        prefill = self._new_prefill()
        if prefill is not None:
            return Step(prefill, self._mix(), [])
        if self.running:
            return self._decode()
        return None

    def _mix(self) -> list:
        """The mixed-chunk tail of ``_get_new_batch_prefill_raw`` (``scheduler.py``, ``is_mixed_chunk``): after the
        prefill's slots are taken, the running requests decode in the same pass when their next tokens fit
        (``check_decode_mem``; else they sit this pass out, never retracted here), with ``prepare_for_decode``'s
        eviction and slots as in :meth:`_decode` and no ratio decay. -> the requests mixed in."""
        if not (self.mixed and self.running and self._decode_fits(self.running)):
            return []
        self.pool.evict_to_free(len(self.running) * self.pool.page)  # alloc_for_decode's one eviction
        for r in self.running:
            self.pool.settle(r, r.req.computed + 1)
        return list(self.running)

    def end_mixed(self) -> None:
        """After a mixed pass: ``mix_with_running`` left an empty running batch and the mixed batch (its prefills,
        then the decodes: ``ScheduleBatch.merge_batch``) becomes the running batch in ``get_next_batch_to_run``,
        with ``batch_is_full`` False (``ScheduleBatch``'s default). The caller appends the requests back in that
        order."""
        self.running = []
        self.batch_is_full = False

    def _new_prefill(self) -> Optional[list]:
        """``get_new_batch_prefill``: the requests (and chunk) of a prefill pass, their slots allocated."""
        if not self.running:
            self.batch_is_full = False
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        if self.max_running - len(self.running) <= 0 and self.chunked is None:
            self.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting)
        adder = PrefillAdder(self.pool, self.running, self.ratio.current, self.max_prefill_tokens, self.chunk,
                             self.pool.page, len(self.running) if self.mixed else 0)
        if self.chunked is not None:
            r = self.chunked
            r.prefix_tokens = r.req.computed
            if not adder.add_chunked_req(r):
                self.chunked = None
        self._admit(adder)
        if not adder.can_run:
            return None
        admitted = {id(r) for r, _, _ in adder.can_run}
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        if adder.new_chunked is not None:
            self.chunked = adder.new_chunked
        self._evict_for(adder.can_run)
        for r, prefix, extend in adder.can_run:
            self.pool.settle(r, prefix + extend)
        return adder.can_run

    def _evict_for(self, batch: list) -> None:
        """``alloc_for_extend``'s one eviction for a prefill batch ``(request, prefix, extend)`` before its slots
        are taken (``mem_cache/allocation.py``): its extend tokens (``alloc_token_slots`` at page 1), plus a
        page per request above (``alloc_paged_token_slots_extend`` over-estimates: "assume each request needs a
        new page"). At page 1 this is what the requests' own evictions add up to."""
        page = self.pool.page
        self.pool.evict_to_free(sum(n for _, _, n in batch) + (len(batch) * page if page > 1 else 0))

    def _admit(self, adder: PrefillAdder) -> None:
        """The waiting-queue loop of ``_get_new_batch_prefill_raw``."""
        cache = self.cache
        for r in list(self.waiting):
            if adder.budget_state() is AddReqResult.OTHER:
                break
            if len(adder.can_run) >= self.max_running - len(self.running):
                self.batch_is_full = True
            if self.batch_is_full:
                break
            r.match(cache)
            cache.lock(r.node)  # its prefix is not evictable while it is weighed (PrefillAdder._lock_node)
            res = adder.add_one_req(r)
            if not (adder.can_run and adder.can_run[-1][0] is r):
                cache.unlock(r.node)
                r.tree_blocks = 0
                r.node = cache.root
            if res is not AddReqResult.CONTINUE:
                if res is AddReqResult.NO_TOKEN:
                    self.batch_is_full = bool(adder.can_run) or bool(self.running)
                break

    # -- decode -------------------------------------------------------------------------
    def _decode_need(self, reqs) -> int:
        """``new_tokens_required_next_decode``: a page for each request whose slots are full."""
        page = self.pool.page
        return page * sum(1 for r in reqs if r.alloc % page == 0)

    def _decode_fits(self, reqs) -> bool:
        """``check_decode_mem``: evicts what the next decode of ``reqs`` needs, if it can."""
        need = self._decode_need(reqs)
        self.pool.evict_to_free(need)
        return self.pool.available >= need

    def _decode(self) -> Step:
        """``update_running_batch``: retract when the decode does not fit, else decay the ratio; allocate."""
        retracted = []
        if not self._decode_fits(self.running):
            retracted = self._retract()
            self.ratio.current = NewTokenRatio.after_retract(self.running)
            self.batch_is_full = False
        else:
            self.ratio.decay_step()
        # alloc_for_decode's one eviction: a page per request (alloc_paged_token_slots_decode over-estimates as
        # for an extend; at page 1 it is a token each, what every request takes anyway)
        self.pool.evict_to_free(len(self.running) * self.pool.page)
        for r in self.running:
            self.pool.settle(r, r.req.computed + 1)
        return Step([], list(self.running), retracted)

    def _retract(self) -> list:
        """``retract_decode``: retract (fewest generated first, then longest prompt) until the rest can decode."""
        running = self.running
        order = sorted(range(len(running)), key=lambda i: (running[i].req.generated, -running[i].req.input_length),
                       reverse=True)
        retracted, first = [], True
        while first or not self._decode_fits([running[i] for i in order]):
            if len(order) == 1:
                break
            first = False
            r = running[order.pop()]
            self._release(r)
            self.pool.evict_to_free(len(order) * RETRACT_DECODE_STEPS)
            r.req.computed = 0
            r.req.preemptions += 1
            retracted.append(r)
        if len(order) == 1 and not self._decode_fits([running[order[0]]]):
            raise RuntimeError("SGLang pool: one request cannot decode alone (bug: submit rejects such requests)")
        keep = set(order)
        self.running = [r for i, r in enumerate(running) if i in keep]
        self.waiting.extend(retracted)
        self.retractions += len(retracted)
        return retracted

    def _release(self, r: SgReq) -> None:
        """``release_kv_cache`` without caching: unlock its prefix, free its own tokens."""
        self.cache.unlock(r.node)
        r.node, r.tree_blocks, r.prefix_tokens = self.cache.root, 0, 0
        self.pool.release(r)

    # -- the pass's results ---------------------------------------------------------------
    def cache_computed(self, r: SgReq) -> list:
        """``cache_unfinished_req``: insert ``r``'s computed full blocks; it now locks them. Returns the names
        stored."""
        req, cache = r.req, self.cache
        n = min(req.n_names, req.computed // cache.block)
        if cache.disable or n == 0:
            return []
        stored, node = cache.insert(req.names[:n])  # (also refreshes the LRU time of what it holds already)
        if node is not r.node:
            cache.lock(node)
            cache.unlock(r.node)
        r.node, r.tree_blocks = node, n
        self.pool.settle(r, r.alloc)  # its blocks now cached: its own tokens shrink
        return stored

    def finish(self, r: SgReq) -> list:
        """``cache_finished_req``: cache ``r``'s computed full blocks, unlock, free the rest. Returns the names stored."""
        stored = self.cache_computed(r)
        self._release(r)
        return stored
