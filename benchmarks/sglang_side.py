"""SGLang's side of the SGLang differential harness (:mod:`fidelity_sglang`): sglang 0.5.23's own scheduling
code stepped offline on CPU in simulated time, no GPU, no weights.

What is SGLang's own code here (imported from the installed wheel, called as its ``Scheduler`` calls it):

- ``managers/schedule_batch.py``: ``Req`` (one per trace row: ``init_next_round_input`` matches its prefix,
  ``reset_for_retract``), ``ScheduleBatch._get_decode_retraction_order`` (the retraction order);
- ``managers/schedule_policy.py``: ``SchedulePolicy.calc_priority`` (the waiting queue's order, LPM's 128
  fallback, in-batch prefix deprioritisation) and ``PrefillAdder`` (``add_chunked_req``, ``add_one_req``,
  ``budget_state``: which requests join a prefill, their chunk, the new-token-ratio reserve);
- ``mem_cache/radix_cache.py``: ``RadixCache`` (``create_simulated``: match, insert, lock, LRU eviction);
  ``mem_cache/prefill_budget.py``: ``PrefillBudget``; ``mem_cache/allocator/base.py``: the allocator's
  ``create_prefill_budget``, ``request_slot_reserve``, ``evict_to_free_tokens``, ``check_decode_capacity``
  (bound to the counting allocator below);
- ``managers/scheduler_components/new_token_ratio_tracker.py``: ``NewTokenRatioTracker`` (decay, reset,
  ``estimate_new_token_ratio_after_retract``).

What is a FAKE (objects that only hold counts, or the loop that calls the real code):

- :class:`CountAllocator`: the token-to-KV pool as a count of free token slots (no tensors, no KV bytes);
  a request's KV row is the count of slots it holds (``slots``), of which ``protected`` belong to the tree;
- the loop (:class:`Driver`): ``Scheduler.get_next_batch_to_run`` / ``_get_new_batch_prefill_raw`` /
  ``update_running_batch`` and ``ScheduleBatch.retract_decode`` / ``prepare_for_extend`` /
  ``prepare_for_decode`` and ``RadixCache.checkpoint`` / ``release_kv_cache`` rewritten over those counts,
  in the order SGLang runs them (non-overlap scheduler, ``event_loop_normal``), and a fake model runner that
  samples one token per request per pass (the row's ``output_tokens`` when given, else fresh ids from
  ``OUTPUT_BASE``). A pass lasts the linear model's ``beta0 + beta1 x prefill tokens + beta2 x decodes`` ms.

Needs ``sglang`` importable (see docs/fidelity.md); importing this module publishes a CPU ``ServerArgs``
(``runtime_context.publish``), as SGLang's own tests do (``test/test_utils.py: published_topology``).
"""
from __future__ import annotations

import os
import random
from array import array
from dataclasses import dataclass
from typing import Optional

import torch
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.runtime_context import SpawnRanks, publish
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

publish(ServerArgs(model_path="dummy", device="cpu"), role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))

OUTPUT_BASE = 1_000_000


@dataclass(frozen=True)
class SgSetup:
    """One worker: ``tokens`` (pool size), ``page`` (``--page-size``), ``chunk`` (``--chunked-prefill-size``,
    ``None``: off), ``max_prefill`` (``--max-prefill-tokens``), ``max_running`` (``--max-running-requests``),
    ``policy`` (``--schedule-policy``), ``mixed`` (``--enable-mixed-chunk``), ``disable``
    (``--disable-radix-cache``: ``RadixCache(disable=True)``, whose match, insert, lock and evict do nothing, as
    the server's ``UnifiedRadixCache`` with ``disable``), ``conservativeness``
    (``--schedule-conservativeness``), ``init_ratio`` and ``decay_steps`` (``--init-new-token-ratio``,
    ``--new-token-ratio-decay-steps``: SGLang's ``SGLANG_INIT_NEW_TOKEN_RATIO`` and
    ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``, set in the environment, which ``environ.py`` reads at each call),
    ``seed`` (Python's ``random`` before the run: the ``random`` policy's ``random.shuffle``; dynlab's worker 0
    seeds its own generator with ``--seed`` x 1,000,003), the linear model's betas (ms); ``cache_outputs``:
    ``False`` inserts only a request's named tokens into the tree (dynlab's rule: its prompt and the reply ids
    its row gives, as ``output_tokens``; other generated tokens have no names), ``True`` SGLang's own (every
    computed token)."""

    tokens: int
    page: int = 16
    chunk: Optional[int] = 8192
    max_prefill: int = 16384
    max_running: int = 256
    policy: str = "fcfs"
    beta0: float = 10.0
    beta1: float = 1.0
    beta2: float = 2.0
    cache_outputs: bool = True
    mixed: bool = False
    disable: bool = False
    conservativeness: float = 1.0
    init_ratio: float = 0.7
    decay_steps: int = 600
    seed: int = 1_000_003


class CountAllocator:
    """FAKE ``TokenToKVPoolAllocator``: ``free`` token slots of ``size``; evicted tree nodes give theirs back."""

    device = "cpu"
    create_prefill_budget = BaseTokenToKVPoolAllocator.create_prefill_budget
    request_slot_reserve = BaseTokenToKVPoolAllocator.request_slot_reserve
    evict_to_free_tokens = BaseTokenToKVPoolAllocator.evict_to_free_tokens
    check_decode_capacity = BaseTokenToKVPoolAllocator.check_decode_capacity

    def __init__(self, size: int, page: int):
        self.size = self.free_slots = size
        self.page_size = page

    def available_size(self) -> int:
        return self.free_slots

    def free_segment(self, value, start_pos=0):
        self.free_slots += len(value)

    def free(self, value):
        self.free_slots += len(value)


class _Running:
    """FAKE ``ScheduleBatch`` for ``PrefillAdder``: its ``reqs`` (what the adder reads) and ``batch_is_full``."""

    def __init__(self):
        self.reqs: list = []
        self.batch_is_full = False

    def batch_size(self) -> int:
        return len(self.reqs)


class Driver:
    """The scheduler loop over ``rows`` (token-trace dicts) on ``setup``; :meth:`run` -> records by row.
    A request's counts: ``protected`` (its prefix the tree owns, locked), ``slots`` (slots it owns beyond it),
    ``computed`` (tokens whose KV it has)."""

    def __init__(self, setup: SgSetup, rows: list):
        self.s = setup
        # re-published (last publish wins): NewTokenRatioTracker.from_config reads schedule_conservativeness from it
        publish(ServerArgs(model_path="dummy", device="cpu", schedule_conservativeness=setup.conservativeness),
                role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))
        os.environ["SGLANG_INIT_NEW_TOKEN_RATIO"] = repr(setup.init_ratio)
        os.environ["SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS"] = str(setup.decay_steps)
        random.seed(setup.seed)
        self.alloc = CountAllocator(setup.tokens, setup.page)
        self.cache = RadixCache.create_simulated(disable=setup.disable, mock_allocator=self.alloc, page_size=setup.page)
        self.policy = SchedulePolicy(setup.policy, self.cache, False, False, False)
        self.ratio = NewTokenRatioTracker.from_config()
        self.rows, self.waiting, self.running, self.chunked = rows, [], _Running(), None
        self.st: dict = {}  # rid -> per-request counts and times
        self.next_row, self.next_token = 0, OUTPUT_BASE
        self.retractions = 0

    # -- requests -------------------------------------------------------------------------
    def _arrive(self, now: float) -> None:
        while self.next_row < len(self.rows) and self.rows[self.next_row]["timestamp"] <= now:
            i, row = self.next_row, self.rows[self.next_row]
            req = Req(str(i), "", array("q", row["tokens"]), SamplingParams(max_new_tokens=row["output_length"]))
            self.st[req.rid] = dict(id=i, arrival_ms=float(row["timestamp"]), first_scheduled_ms=None,
                                    first_token_ms=None, finish_ms=None, input_length=len(row["tokens"]),
                                    output_length=row["output_length"], hit_tokens=None, preemptions=0,
                                    slots=0, protected=0, computed=0, row=row)
            self.waiting.append(req)
            self.next_row += 1

    def _sample(self, req: Req) -> int:
        row, k = self.st[req.rid]["row"], len(req.output_ids)
        given = row.get("output_tokens")
        if given is not None and k < len(given):
            return given[k]
        self.next_token += 1
        return self.next_token

    # -- memory ---------------------------------------------------------------------------
    def _ceil(self, n: int) -> int:
        return -(-n // self.s.page) * self.s.page

    def _take(self, req: Req, upto: int) -> None:
        """``alloc_for_extend`` / ``alloc_for_decode``: slots for ``upto`` tokens, evicting when short."""
        st = self.st[req.rid]
        need = self._ceil(upto) - st["protected"] - st["slots"]
        if need > 0:
            self.alloc.evict_to_free_tokens(self.cache, need)
            if self.alloc.free_slots < need:
                raise RuntimeError(f"out of KV slots: {need} asked, {self.alloc.free_slots} free")
            self.alloc.free_slots -= need
            st["slots"] += need

    def _checkpoint(self, req: Req, upto: int) -> None:
        """``RadixCache.checkpoint``: insert the page-aligned ``fill_ids[:upto]`` (only its named part when
        ``cache_outputs`` is off), free the duplicates, move the lock to the new last node. A disabled cache's
        ``checkpoint`` returns at once (the request keeps its slots; ``release_kv_cache`` frees them)."""
        if self.cache.disable:
            return
        st = self.st[req.rid]
        fill = req.origin_input_ids + req.output_ids
        if not self.s.cache_outputs:  # dynlab's rule: only tokens with names (the prompt, the reply ids a row gives)
            upto = min(upto, len(req.origin_input_ids) + len(st["row"].get("output_tokens") or ()))
        key = RadixKey(fill[:upto]).page_aligned(self.s.page)
        k = len(key)  # (inserted even when nothing is new: the insert and the match refresh the path's LRU times)
        res = self.cache.insert(InsertParams(key=key, value=torch.zeros(k, dtype=torch.int64)))
        if 0 < len(req.origin_input_ids) < k:  # split_prompt: the prompt's boundary splits the leaf
            pkey = RadixKey(fill[:len(req.origin_input_ids)]).page_aligned(self.s.page)
            if 0 < len(pkey) < k:
                self.cache.insert(InsertParams(key=pkey, value=torch.zeros(len(pkey), dtype=torch.int64),
                                               priority=1))
        self.alloc.free_slots += res.prefix_len - st["protected"]  # duplicates of what the tree held already
        st["slots"] -= k - st["protected"]  # the rest moved into the tree
        last = self.cache.match_prefix(MatchPrefixParams(key=key)).last_device_node
        self.cache.unlock(req.lock)
        req.lock = self.cache.lock(last)
        req.last_node = last
        st["protected"] = k

    def _release(self, req: Req, checkpoint: bool) -> None:
        """``release_kv_cache``: checkpoint (or not), free the slots the tree does not own, unlock."""
        st = self.st[req.rid]
        if checkpoint:
            self._checkpoint(req, st["computed"])
        self.alloc.free_slots += st["slots"]
        st["slots"] = st["protected"] = 0
        self.cache.unlock(req.lock)
        req.lock = None

    # -- one pass -------------------------------------------------------------------------
    def _new_prefill(self) -> Optional[list]:
        """``_get_new_batch_prefill_raw``: the real ``calc_priority`` and ``PrefillAdder``; the slots allocated."""
        running = self.running
        if not running.reqs:
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        if self.s.max_running - len(running.reqs) <= 0 and self.chunked is None:
            running.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting)
        mixed = len(running.reqs) if self.s.mixed and self.s.chunk is not None else 0  # running_bs if is_mixed_chunk
        adder = PrefillAdder(self.s.page, self.cache, self.alloc, running, self.ratio.current, self.s.max_prefill,
                             self.s.chunk, mixed, max_running_requests=self.s.max_running)
        if self.chunked is not None:
            self.chunked.init_next_round_input()
            self.chunked = adder.add_chunked_req(self.chunked)
        for req in self.waiting:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            if len(adder.can_run_list) >= self.s.max_running - len(running.reqs):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            req.init_next_round_input(self.cache)
            res = adder.add_one_req(req, has_chunked_req=self.chunked is not None, truncation_align_size=None)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    running.batch_is_full = len(adder.can_run_list) > 0 or bool(running.reqs)
                break
        if not adder.can_run_list:
            return None
        chosen = set(id(r) for r in adder.can_run_list)
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        if adder.new_chunked_req is not None:
            self.chunked = adder.new_chunked_req
        batch = [(req, req.prefix_len, req.extend_end - req.prefix_len) for req in adder.can_run_list]
        # prepare_for_extend -> alloc_for_extend: one eviction for the batch (allocation.py:
        # alloc_token_slots at page 1, alloc_paged_token_slots_extend's over-estimate of a page per request
        # above), then each request's slots up to its extend's end
        extend = sum(n for _, _, n in batch)
        self.alloc.evict_to_free_tokens(self.cache, extend + (len(batch) * self.s.page if self.s.page > 1 else 0))
        for req, _, _ in batch:
            st = self.st[req.rid]
            if st["slots"] == 0 and st["protected"] == 0:
                st["protected"] = req.prefix_len
            self._take(req, req.extend_end)
        return batch

    def _mix(self) -> list:
        """The mixed-chunk tail of ``_get_new_batch_prefill_raw`` (``is_mixed_chunk``): when the running requests'
        next decode fits (``check_decode_mem``), ``prepare_for_decode`` (its eviction and slots, as in
        :meth:`_decode`, no ratio decay) and ``mix_with_running``; the running batch is then an empty
        ``ScheduleBatch`` and, after the pass, the mixed batch (its prefills first, then these decodes:
        ``merge_batch``) becomes the running batch, with ``batch_is_full`` False (``ScheduleBatch``'s default).
        -> the decodes mixed in."""
        running = self.running
        if not (self.s.mixed and self.s.chunk is not None and running.reqs):
            return []
        if not self._decode_fits(list(range(len(running.reqs)))):
            return []  # "they then sit out this step"
        self.alloc.evict_to_free_tokens(self.cache, len(running.reqs) * self.s.page)
        for req in running.reqs:
            self._take(req, self.st[req.rid]["computed"] + 1)
        decodes, running.reqs, running.batch_is_full = running.reqs, [], False
        return decodes

    def _decode(self) -> tuple:
        """``update_running_batch``: retract (real order, counts here) when the decode does not fit, else decay
        the ratio; then each request's slot for its next token (``prepare_for_decode``). -> (reqs, retracted)"""
        reqs = self.running.reqs
        retracted = []
        if not self._decode_fits(list(range(len(reqs)))):
            order = ScheduleBatch._get_decode_retraction_order(reqs)
            first = True
            while first or not self._decode_fits(order):
                if len(order) == 1:
                    break
                first = False
                req = reqs[order.pop()]
                self._release(req, checkpoint=False)  # release_req: no insert, the space is needed now
                self.alloc.evict_to_free_tokens(self.cache, len(order) * 20)  # SGLANG_RETRACT_DECODE_STEPS
                req.reset_for_retract()
                st = self.st[req.rid]
                st["computed"] = 0
                st["preemptions"] += 1
                retracted.append(req)
            self.running.reqs = [reqs[i] for i in order]  # filter_batch(keep_indices=sorted_indices): that order
            self.waiting.extend(retracted)
            self.retractions += len(retracted)
            self.ratio.current = NewTokenRatioTracker.estimate_new_token_ratio_after_retract(self.running.reqs)
            self.running.batch_is_full = False
        else:
            self.ratio.decay_step()
        # prepare_for_decode -> alloc_for_decode: one eviction of a page per request (allocation.py:
        # alloc_paged_token_slots_decode; alloc_token_slots of one token each at page 1), then the slots
        self.alloc.evict_to_free_tokens(self.cache, len(self.running.reqs) * self.s.page)
        for req in self.running.reqs:
            self._take(req, self.st[req.rid]["computed"] + 1)
        return list(self.running.reqs), retracted

    def _decode_fits(self, idx: list) -> bool:
        """``check_decode_mem``: a page for each request whose slots are full (``new_tokens_required_next_decode``)."""
        reqs = self.running.reqs
        need = self.s.page * sum(1 for i in idx if self.st[reqs[i].rid]["computed"] % self.s.page == 0)
        return self.alloc.check_decode_capacity(num_tokens=need, tree_cache=self.cache)

    # -- results --------------------------------------------------------------------------
    def _emit(self, req: Req, end: float, join: bool) -> None:
        st = self.st[req.rid]
        req.output_ids.append(self._sample(req))
        if len(req.output_ids) == 1:
            st["first_token_ms"] = end
        if len(req.output_ids) >= req.sampling_params.max_new_tokens:
            st["finish_ms"] = end
            self._release(req, checkpoint=True)
            if req in self.running.reqs:
                self.running.reqs.remove(req)
                self.running.batch_is_full = False
        elif join:
            self.running.reqs.append(req)

    def _apply(self, prefill: list, decodes: list, end: float) -> None:
        """``process_batch_result_prefill`` / ``_decode``: computed tokens, the tree, sampled tokens, finishes
        (the decodes of a mixed pass rejoin the running batch after its prefills)."""
        for req, prefix, extend in prefill:
            st = self.st[req.rid]
            st["computed"] = prefix + extend
            if req is self.chunked:  # cache_unfinished_req(chunked=True); the next chunk starts after it
                self._checkpoint(req, st["computed"])
                req.prefix_len = st["computed"]
                continue
            self._checkpoint(req, st["computed"])
            req.prefix_len = st["computed"]
            self._emit(req, end, True)
        for req in decodes:
            self.st[req.rid]["computed"] += 1
            self._emit(req, end, bool(prefill))

    def run(self) -> list:
        """Every row served; one record per row (the keys of ``dynlab sim --requests-out`` it compares)."""
        now = 0.0
        while self.next_row < len(self.rows) or self.waiting or self.running.reqs or self.chunked is not None:
            self._arrive(now)
            prefill = self._new_prefill()
            decodes, retracted = ((self._mix(), []) if prefill is not None else self._decode() if self.running.reqs
                                  else ([], []))
            if prefill is None and not decodes:
                self.ratio.reset()  # Scheduler.on_idle
                if self.next_row >= len(self.rows):
                    if self.waiting or self.chunked is not None:
                        raise RuntimeError("requests wait but nothing can run")
                    break
                now = max(now, float(self.rows[self.next_row]["timestamp"]))
                continue
            for req, prefix, _ in prefill or ():
                st = self.st[req.rid]
                if st["first_scheduled_ms"] is None:
                    st["first_scheduled_ms"], st["hit_tokens"] = now, prefix
            tokens = sum(n for _, _, n in prefill or ())
            end = now + self.s.beta0 + self.s.beta1 * tokens + self.s.beta2 * len(decodes)
            self._apply(prefill or [], decodes, end)
            if not self.waiting and not self.running.reqs and self.chunked is None:
                self.ratio.reset()
            now = end
        return [{k: v for k, v in st.items() if k not in ("slots", "protected", "computed", "row")}
                for st in sorted(self.st.values(), key=lambda d: d["id"])]
