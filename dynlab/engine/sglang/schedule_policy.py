"""SGLang's waiting-queue order and prefill admission (``python/sglang/srt/managers/schedule_policy.py``, sglang 0.5.23).

- :class:`SchedulePolicy` (``SchedulePolicy.calc_priority``): ``fcfs`` (SGLang's default) keeps arrival order
  (and every 32nd call refreshes the waiting requests' cached prefixes in the radix cache's LRU order, as every
  cache-agnostic order does: ``_touch_waiting_prefixes``);
  ``lpm`` sorts by the longest cached prefix first (a stable sort: ties keep their order), falls back to FCFS
  when more than :data:`WAITING_QUEUE_PREFIX_MATCH_MAX` requests wait (``_determine_active_policy``), and
  puts last the requests whose cached prefix is at most :data:`IN_BATCH_CHECK_TOKENS` tokens but which share
  at least :data:`IN_BATCH_DEPRIORITIZE_TOKENS` with a request ahead of them (``_compute_prefix_matches``,
  in-batch prefix caching: one of them computes the prefix, the others hit it later); ``lof``: longest
  ``max_new_tokens`` first; ``random``: shuffled (dynlab seeds it per worker). With the radix cache
  disabled a cache-aware policy is FCFS (``_validate_and_adjust_policy``; dynlab refuses the combination).
- :class:`PrefillAdder`: which waiting requests join one prefill batch (``PrefillAdder``, its budget
  ``PrefillBudget`` in ``mem_cache/prefill_budget.py``). A request is admitted when ``extend + max_new +
  page_size`` tokens (``max_new = min(max_new_tokens - generated, CLIP_MAX_NEW_TOKENS)``) are below the
  free plus evictable tokens left after the running requests' reserve: each running request holds back
  ``min(max_new_tokens - generated, CLIP) * new_token_ratio`` tokens (``_get_running_request_total_token_offset``)
  and each admitted one its page-rounded extend, a page and its ``max_new``. ``rem_chunk_tokens``
  (``--chunked-prefill-size``) cuts the last admitted request into a chunk (page aligned; it then reserves
  no ``max_new``); ``rem_input_tokens`` (``--max-prefill-tokens``) bounds the batch.
- :class:`NewTokenRatio` (``scheduler_components/new_token_ratio_tracker.py``): starts at
  ``min(0.7 x schedule_conservativeness, 1)`` (``SGLANG_INIT_NEW_TOKEN_RATIO`` 0.7), decays by ``(init - min) /
  600`` per decode step (``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``) down to ``init x 0.14``
  (``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``), is raised by a retraction to ``min(1, (tokens decoded + 20 x
  requests) / (max_new_tokens summed + 1))`` over the requests left (``SGLANG_RETRACT_DECODE_STEPS`` 20), and
  resets to ``init`` when the engine is idle (``Scheduler.on_idle``).

A request's ``max_new_tokens`` is its trace's output length, and it is not ``ignore_eos`` (the ratio applies).
"""
from __future__ import annotations

import random
from enum import Enum
from typing import Optional

__all__ = ["AddReqResult", "CLIP_MAX_NEW_TOKENS", "NewTokenRatio", "PrefillAdder", "SchedulePolicy", "SCHEDULE_POLICIES",
           "WAITING_QUEUE_PREFIX_MATCH_MAX"]

#: ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``: the estimate of a request's future tokens is clipped to this
CLIP_MAX_NEW_TOKENS = 4096
#: ``WAITING_QUEUE_PREFIX_MATCH_MAX``: above this many waiting requests, ``lpm`` orders them FCFS
WAITING_QUEUE_PREFIX_MATCH_MAX = 128
#: ``WAITING_PREFIX_REFRESH_INTERVAL``: a cache-agnostic order refreshes the waiting prefixes' LRU times every this many
#: calls (``SGLANG_ENABLE_WAITING_PREFIX_REFRESH``, on by default)
WAITING_PREFIX_REFRESH_INTERVAL = 32
#: ``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD`` / ``..._DEPRIORITIZE_THRESHOLD`` (tokens)
IN_BATCH_CHECK_TOKENS = IN_BATCH_DEPRIORITIZE_TOKENS = 32
#: the policies dynlab models (SGLang's ``--schedule-policy`` choices; ``hrrn``, ``routing-key``, ``priority``
#: and ``shortest-prefill-first`` are not modelled)
SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random")
CACHE_AWARE = ("lpm", "dfs-weight")


class AddReqResult(Enum):
    """``AddReqResult``: go on with the next request, stop for lack of KV tokens, or stop for another budget."""

    CONTINUE = 0
    NO_TOKEN = 1
    OTHER = 2


class NewTokenRatio:
    """``NewTokenRatioTracker``: ``current`` (the ratio), ``init``, ``min``, ``decay`` per decode step."""

    def __init__(self, init_ratio: float = 0.7, conservativeness: float = 1.0, decay_steps: int = 600,
                 min_factor: float = 0.14):
        self.init = min(init_ratio * conservativeness, 1.0)
        self.min = min(self.init * min_factor, 1.0)
        self.decay = (self.init - self.min) / decay_steps
        self.current = self.init

    def decay_step(self) -> None:
        self.current = max(self.current - self.decay, self.min)

    def reset(self) -> None:
        self.current = self.init

    @staticmethod
    def after_retract(reqs) -> float:
        """``estimate_new_token_ratio_after_retract`` over the requests left in the decode batch."""
        decoded = sum(r.req.generated for r in reqs)
        max_new = sum(r.req.output_length for r in reqs)
        return min(1.0, (decoded + 20 * len(reqs)) / (max_new + 1))


class SchedulePolicy:
    """The waiting queue's order (``SchedulePolicy.calc_priority``); ``policy``: one of :data:`SCHEDULE_POLICIES`;
    ``rng``: the ``random`` policy's generator."""

    def __init__(self, policy: str, cache, rng: Optional[random.Random] = None):
        if policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}, got {policy!r}")
        self.policy = "fcfs" if cache.disable and policy in CACHE_AWARE else policy
        self.cache = cache
        self.rng = rng or random.Random(0)
        self.refresh_calls = 0

    def active(self, waiting: list) -> str:
        """``_determine_active_policy``: ``lpm`` turns FCFS above :data:`WAITING_QUEUE_PREFIX_MATCH_MAX` waiting
        (``dfs-weight`` never does)."""
        if self.policy == "lpm" and len(waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX:
            return "fcfs"
        return self.policy

    def calc_priority(self, waiting: list) -> None:
        """Sort ``waiting`` (a list of :class:`~dynlab.engine.sglang.scheduler.SgReq`) in place."""
        policy = self.active(waiting)
        if policy == "lpm":
            late = self._prefix_matches(waiting)
            waiting.sort(key=lambda r: float("inf") if id(r) in late else -r.matched_tokens)
        elif policy == "dfs-weight":
            self._prefix_matches(waiting)
            waiting[:] = self._dfs_weight_order(waiting)
        elif policy == "lof":
            waiting.sort(key=lambda r: -r.req.output_length)
        elif policy == "random":
            self.rng.shuffle(waiting)
        self._touch_waiting_prefixes(policy, waiting)

    def _touch_waiting_prefixes(self, policy: str, waiting: list) -> None:
        """``_touch_waiting_prefixes``: under a cache-agnostic order (``lpm`` turned FCFS above 128 included), every
        :data:`WAITING_PREFIX_REFRESH_INTERVAL`-th call (the first one too) refreshes the cached prefixes of the
        first :data:`WAITING_QUEUE_PREFIX_MATCH_MAX` waiting requests, the queue's head last, so LRU evicts them
        in reverse admission order (``touch_waiting_prefix``: a match of the whole fill, splitting as a match does)."""
        if policy in CACHE_AWARE or not waiting or self.cache.disable:
            return
        refresh = self.refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
        self.refresh_calls += 1
        if refresh:
            block = self.cache.block
            for r in reversed(waiting[:WAITING_QUEUE_PREFIX_MATCH_MAX]):
                self.cache.match_prefix(r.fill_names(block))

    def _dfs_weight_order(self, waiting: list) -> list:
        """``_sort_by_dfs_weight`` (``mem_cache/base_prefix_cache.py: _dfs_weight_order``): a node's weight is the
        number of waiting requests whose match ends in its subtree; a depth-first walk from the root visits the
        children heaviest first (ties: the tree's child order) and lists a node's own requests after its
        children's. Only the nodes on a request's path are walked (the others weigh nothing)."""
        root = self.cache.root
        at: dict = {}
        weight: dict = {}
        for r in waiting:
            at.setdefault(id(r.node), []).append(r)
            node = r.node
            while node is not None:
                weight[id(node)] = weight.get(id(node), 0) + 1
                node = node.parent
        order, stack = [], [(root, False)]
        while stack:
            node, visited = stack.pop()
            if visited:
                order += at.get(id(node), ())
                continue
            stack.append((node, True))
            kids = sorted((c for c in node.children.values() if id(c) in weight), key=lambda c: -weight[id(c)])
            stack += [(c, False) for c in reversed(kids)]
        return order

    def _prefix_matches(self, waiting: list) -> set:
        """Each request's cached prefix (``matched_tokens``), and the requests in-batch prefix caching puts last."""
        block = self.cache.block
        late: set = set()
        seen: dict = {}  # the waiting requests' names as a trie: (parent key, name) -> key
        for r in waiting:
            r.match(self.cache, whole=True)  # match_kv_cache(r, tree_cache, prefix_ids): no max_prefix_len here
            if r.matched_tokens > IN_BATCH_CHECK_TOKENS:
                continue
            names, key, shared = r.fill_names(block), None, 0
            for name in names:  # match against the requests ahead (SGLang's waiting_queue_radix_tree)
                nxt = seen.get((key, name))
                if nxt is None:
                    break
                key, shared = nxt, shared + 1
            if shared * block >= IN_BATCH_DEPRIORITIZE_TOKENS:
                late.add(id(r))
                continue
            key = None
            for name in names:
                key = seen.setdefault((key, name), (key, name))
        return late


class PrefillAdder:
    """One prefill batch's admission (SGLang's ``PrefillAdder``).

    ``pool``: the worker's token pool (:class:`~dynlab.engine.sglang.scheduler.TokenPool`: ``available`` and
    the cache's ``evictable_size``, tokens); ``running``: the running requests; ``ratio``: the new-token
    ratio; ``max_prefill_tokens``; ``chunk``: ``--chunked-prefill-size`` (``None``: no chunking); ``page``:
    tokens per page; ``mixed``: decode tokens the batch also carries (``--enable-mixed-chunk``).
    """

    def __init__(self, pool, running: list, ratio: float, max_prefill_tokens: int, chunk: Optional[int],
                 page: int, mixed: int = 0):
        self.pool, self.page = pool, page
        self.rem_input_tokens = max_prefill_tokens - mixed
        self.rem_chunk_tokens = None if chunk is None else chunk - mixed
        self.total_offset = self.current_offset = mixed
        self.total_offset += sum(min(r.req.output_length - r.req.generated, CLIP_MAX_NEW_TOKENS) * ratio
                                 for r in running)
        self.can_run: list = []  # (request, prefix tokens, extend tokens)
        self.new_chunked = None

    def _ceil(self, tokens: int) -> int:
        return -(-tokens // self.page) * self.page

    def _free(self) -> int:
        return self.pool.available + self.pool.cache.evictable_size

    @property
    def rem_total_tokens(self) -> float:
        return self._free() - self.total_offset

    def budget_state(self) -> AddReqResult:
        free = self._free()
        if not (free - self.total_offset > 0 and free - self.current_offset > 0):
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _reserve(self, extend: int, max_new: int) -> None:
        """``_update_prefill_budget``: charge one admitted request (or chunk)."""
        paged = self._ceil(extend)
        self.total_offset += paged + self.page + max_new
        self.current_offset += paged + self.page
        self.rem_input_tokens -= paged
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= paged

    def add_chunked_req(self, r) -> bool:
        """Continue the chunked request ``r``; ``True`` when it still has a chunk left after this one."""
        rem = self.rem_chunk_tokens
        avail = min(rem, int(self.rem_total_tokens))
        rem = avail if avail > 0 else rem  # PrefillBudget.available_chunk_tokens: progress to release its KV
        extend = r.fill_len() - r.prefix_tokens
        truncated = extend > rem
        n = min(extend, rem)
        self.can_run.append((r, r.prefix_tokens, n))
        self._reserve(n, 0 if truncated else min(r.req.output_length, CLIP_MAX_NEW_TOKENS))
        return truncated

    def add_one_req(self, r) -> AddReqResult:
        """``add_one_req`` for a waiting request whose prefix was matched (and is locked by the caller while
        this runs: its prefix is not evictable)."""
        max_new = min(max(r.req.output_length - r.req.generated, 0), CLIP_MAX_NEW_TOKENS)
        prefix = r.prefix_tokens
        extend = r.fill_len() - prefix
        if not extend + max_new + self.page < self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        paged = self._ceil(extend)
        if self.rem_chunk_tokens is None and self.can_run and paged >= self.rem_input_tokens:
            return AddReqResult.OTHER
        if self.rem_chunk_tokens is not None and paged > self.rem_chunk_tokens:
            end = (prefix + self.rem_chunk_tokens // self.page * self.page) // self.page * self.page
            extend, max_new = end - prefix, 0
            if extend <= 0:
                return AddReqResult.OTHER
            self.new_chunked = r
        else:
            max_new = min(r.req.output_length, CLIP_MAX_NEW_TOKENS)
        self.can_run.append((r, prefix, extend))
        self._reserve(extend, max_new)
        return self.budget_state()
