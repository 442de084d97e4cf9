"""One engine's scheduler: a step plan under a token budget and ``max_num_seqs``, admission, preemption, chunking.

Modelled on vLLM v1's ``Scheduler.schedule`` / ``update_from_output``
(``vllm/v1/core/sched/scheduler.py``, prefix caching, recompute preemption); the rules are those
of the :mod:`dynlab.engine.worker` docstring. The scheduler never touches blocks: it asks the
:class:`~dynlab.kv.cache_manager.KvCacheManager` to find a request's cached prefix, allocate slots
for ``n`` more tokens, free it, hold it (P/D handoff) or start its CPU-tier load.

Queues (FIFO unless said): ``waiting`` (the queue policy's order, :mod:`dynlab.engine.queues`; FCFS:
preempted requests at its FRONT), ``running`` (running order), ``received`` (P/D: KV arrived by a
transfer), ``loading`` (CPU hits in transit, ready order), ``ready`` (CPU hits arrived).
"""
from __future__ import annotations

from collections import deque
from typing import List, Tuple

from dynlab.engine.lora import LORA_ATTR
from dynlab.engine.queues import Fcfs, QueuePolicy
from dynlab.engine.request import DECODE_TOKENS, EngineRequest
from dynlab.kv.cache_manager import KvCacheManager

__all__ = ["Scheduler"]


class Scheduler:
    """The queues of one engine and the rules that turn them into a step's ``(request, tokens)`` pairs.

    ``kv``: the engine's KV cache manager; ``max_num_batched_tokens``: token budget per step;
    ``max_num_seqs``: running requests at most; ``spec``: speculative decoding (a
    :class:`~dynlab.engine.spec.SpecDecoding`, ``None``: off); ``queue_policy``: the waiting queue's order
    and the preemption victim (a :class:`~dynlab.engine.queues.QueuePolicy`, ``None``: FCFS, vLLM's
    default). Counter: ``preemptions``.

    With ``spec``: a running request schedules ``num_tokens + spec - computed`` tokens (``1 + K`` when
    decoding, cut by the budget) and every allocation reserves ``spec.lookahead`` slots more (vLLM's
    ``allocate_slots(..., num_lookahead_tokens)``, admissions too); a request admitted in a step
    carries no drafts (its first step is its prefill chunk, its drafts come after its first token).
    A block is named (cached) only once the tokens its name covers are known: vLLM caches up to
    ``num_tokens`` (never an unverified draft), less the ``spec.hash_lookahead`` tokens after it.
    """

    def __init__(self, kv: KvCacheManager, max_num_batched_tokens: int, max_num_seqs: int, spec=None,
                 queue_policy: QueuePolicy | None = None):
        self.kv = kv
        policy = queue_policy if queue_policy is not None else Fcfs()
        self.victim = policy.victim  # (running, waiting=None) -> the index in running to preempt
        self.displaces = policy.displaces  # a waiting request may displace a runner at max_num_seqs
        self.spec = spec
        self.lookahead = spec.lookahead if spec is not None else 0  # KV slots reserved past the scheduled tokens
        self.hash_lookahead = spec.hash_lookahead if spec is not None else 0  # tokens after a block its name covers
        if spec is not None and spec.drop_last:
            kv.drop_last = True  # a prefix hit's last block is recomputed (the KV cache manager's rule)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting = policy.waiting_queue()
        self.running: List[EngineRequest] = []
        self.received: deque = deque()  # requests whose KV arrived, waiting to be admitted with their blocks
        self.loading: deque = deque()  # admitted requests whose CPU hits are in transit, ready order
        self.ready: deque = deque()  # requests whose CPU hits have arrived, not yet scheduled
        self.arrived: list = []  # requests queued since the last schedule (their names dropped if they wait)
        self.preemptions = 0
        #: distinct adapters a step may hold (``--max-loras``, :mod:`dynlab.engine.lora`); 0: no adapter rule
        self.max_loras = 0
        self._skipped: list = []  # waiting requests the adapter rule skipped in this admission pass
        self._displaced = 0  # runners displaced by waiting requests in the step being planned
        self._ran = 0  # requests the running loop scheduled in the step being planned

    def promote_loaded(self, now: float) -> None:
        """Move the requests whose CPU-tier loads have arrived by ``now`` (ms) to ``ready``."""
        loading = self.loading
        while loading and loading[0].ready_ms <= now:
            self.ready.append(loading.popleft())  # scheduled before the waiting queue, in arrival order

    def schedule(self, now: float) -> Tuple[list, int, int]:
        """The step starting at ``now`` (ms): ``(sched, preempted, admitted)``, ``sched`` the
        ``(request, tokens)`` pairs in schedule order (running first, then admitted).

        The running requests first, in running order, preempting the queue policy's victim (FCFS: the
        newest) when the KV cache cannot give a request its slots (a victim scheduled earlier in this step
        gives its tokens back; a request that is its own victim leaves, and the loop goes on with the next);
        then admission (:meth:`_admit`). One call per step: the running loop is written here, not in a
        helper of its own."""
        sched: list = []
        running, kv = self.running, self.kv
        allocate_slots = kv.allocate_slots
        budget = self.max_num_batched_tokens
        la = self.lookahead
        preempted = 0
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = req.num_tokens + req.spec - req.computed
            if n > budget:
                n = budget
            if not allocate_slots(req, req.computed + n + la):
                while True:
                    j = self.victim(running)
                    victim = running.pop(j)
                    if j < i:  # scheduled in this step (a priority policy): its tokens go back to the budget
                        budget += self._unschedule(victim, sched)
                        i -= 1
                    self.preempt(victim)
                    preempted += 1
                    if victim is req or allocate_slots(req, req.computed + n + la):
                        break
                if victim is req:  # the policy's last choice: the requests after it may still fit (vLLM 0.33's
                    continue  # priority path; FCFS preempts from the back, so none is after it)
            if req.nreg < req.n_names:  # names left to register (a decode has none: no call)
                kv.name_blocks(req, min(n, req.num_tokens - self.hash_lookahead - req.computed))  # no draft's block
            sched.append((req, n))
            budget -= n
            i += 1
        self._ran = len(sched)  # requests the running loop scheduled (speculation's admission padding)
        admitted = 0
        if (not preempted or not sched) and (self.waiting or self.ready or self.received):
            admitted = self._admit(sched, budget, now)  # (every running request preempted: admit, or nothing runs)
            if self._displaced:
                preempted += self._displaced
                self._displaced = 0
        if self.arrived:
            self._drop_waiting_names()
        return sched, preempted, admitted

    @staticmethod
    def _unschedule(victim: EngineRequest, sched: list) -> int:
        """Take ``victim``'s pair out of the step being planned (``sched``); its tokens (0 when it has none)."""
        for k, (r, n) in enumerate(sched):
            if r is victim:
                del sched[k]
                return n
        return 0

    def _displace(self, sched: list) -> int:
        """The waiting queue's head meets ``max_num_seqs`` running requests: preempt the runner the queue
        policy says it displaces (:meth:`~dynlab.engine.queues.QueuePolicy.victim`; its tokens in this step
        given back). Returns the tokens given back, ``-1`` when the head displaces no one."""
        running = self.running
        j = self.victim(running, self.waiting[0])
        if j is None:
            return -1
        victim = running.pop(j)
        n = self._unschedule(victim, sched)
        if j < self._ran:
            self._ran -= 1
        self.preempt(victim)
        self._displaced += 1
        return n

    def _drop_waiting_names(self) -> None:
        """The requests queued since the last schedule that this one did not admit keep their names only as
        runs while they wait (:meth:`EngineRequest.drop_names`, issue 28: a waiting request's memory); those
        admitted at once keep them (no drop and expansion again for a request that never waited a step)."""
        for req in self.arrived:
            if req.first_scheduled_ms is None:
                req.drop_names()
        self.arrived = []

    def _admit(self, sched: list, budget: int, now: float) -> int:
        """Admit, while ``budget`` tokens and sequence slots remain: received requests (their KV came by
        a transfer, admitted with the blocks they hold: those must not wait behind requests that need
        new ones), then those whose CPU hits have arrived, then the waiting queue in FCFS order,
        stopping at the first that cannot get its blocks. Appends to ``sched``; returns how many were
        admitted (loads too)."""
        running, kv, max_seqs = self.running, self.kv, self.max_num_seqs
        admitted = 0
        received = self.received
        while received and budget > 0 and len(running) < max_seqs:
            req = received[0]
            n = min(req.num_tokens - req.computed, budget)
            if not kv.allocate_slots(req, req.computed + n + self.lookahead):
                break
            received.popleft()
            if req.nreg < req.n_names:  # a trace-named reply, on a decode worker with its prefix cache
                kv.name_blocks(req, n)
            running.append(req)
            sched.append((req, n))
            budget -= n
            admitted += 1
        ready = self.ready
        while ready and budget > 0 and len(running) < max_seqs:
            req = ready.popleft()  # its CPU hits have arrived: its blocks are held, no lookup
            n = self._admit_loaded(req, budget)
            running.append(req)
            sched.append((req, n))
            budget -= n
            admitted += 1
        if self.waiting and budget > 0 and (len(running) < max_seqs or self.displaces):
            admitted += self._admit_waiting(sched, budget, now)
        return admitted

    def _admit_waiting(self, sched: list, budget: int, now: float) -> int:
        """Admit from the waiting queue in the queue policy's order (prefix lookup; a request with CPU hits
        starts its load instead of running), stopping at the first that cannot get its blocks, or at
        ``max_num_seqs`` running unless the head displaces a runner (:meth:`_displace`)."""
        running, waiting, kv, max_seqs = self.running, self.waiting, self.kv, self.max_num_seqs
        admitted = 0
        loras = {a for r in running if (a := r.attrs.get(LORA_ATTR))} if self.max_loras else None  # vLLM's scheduled_loras
        while waiting and budget > 0:
            if len(running) >= max_seqs:
                back = self._displace(sched) if self.displaces else -1
                if back < 0:
                    break
                budget += back
            req = waiting[0]
            if loras is not None and self._skips(req, loras):
                continue
            h, hc = kv.find_cached_prefix(req)
            if hc:
                if not self._admit_loading(req, h, hc, budget, now):
                    break
                admitted += 1
                continue
            computed = kv.hit_tokens(h)
            n = req.num_tokens - computed
            if n > budget:
                n = budget
            elif n == 1 and self.spec is not None:
                n = self._padded(sched, computed)
                if n > budget:
                    break  # vLLM: better not scheduled than scheduled unpadded
            if not kv.admit(req, h, computed + n + self.lookahead,
                            kv.admission_tokens(req, computed, n)):  # (vLLM's full-sequence check: no lookahead)
                break
            waiting.popleft()
            if req.hit_tokens is None:
                req.hit_tokens = computed
                req.cpu_hit_blocks = 0
                req.first_scheduled_ms = now
            kv.name_blocks(req, min(n, req.num_tokens - self.hash_lookahead - computed))  # (a padding: no block)
            running.append(req)
            sched.append((req, n))
            budget -= n
            admitted += 1
            if loras is not None and (a := req.attrs.get(LORA_ATTR)):
                loras.add(a)
        if self._skipped:
            self._unskip()
        return admitted

    def _skips(self, req: EngineRequest, loras: set) -> bool:
        """vLLM 0.33's adapter rule in the waiting loop: the head ``req`` is skipped (taken out of the queue
        until the pass ends, :meth:`_unskip`) when its adapter is not among ``loras`` (the adapters of the running
        requests and of those admitted so far) and they number ``max_loras`` already. Returns whether it was."""
        a = req.attrs.get(LORA_ATTR)
        if not a or a in loras or len(loras) < self.max_loras:
            return False
        self._skipped.append(self.waiting.popleft())
        return True

    def _unskip(self) -> None:
        """Put the requests the adapter rule skipped back at the front of the waiting queue, in their order
        (vLLM's ``prepend_requests`` of its skipped requests; a priority queue orders them itself)."""
        waiting = self.waiting
        for req in reversed(self._skipped):
            waiting.appendleft(req)
        self._skipped = []

    def _padded(self, sched: list, computed: int) -> int:
        """Tokens a waiting request with one token left (a resume, a full prefix hit) is admitted with under
        speculation: ``1 + K`` (``K`` placeholder drafts, never accepted: vLLM 0.33 pads a new decode to the
        uniform spec-decode size for its CUDA graphs) when no running request scheduled in this step is
        mid-prefill and some was scheduled (or ``computed`` > 0); else 1 (vLLM's ``pad_spec_decode``). A budget
        under ``1 + K`` never pads (vLLM would never admit the request: it prefers not to schedule it unpadded)."""
        ran = sched[:self._ran]
        pad = 1 + self.spec.k
        if (ran or computed) and pad <= self.max_num_batched_tokens and all(r.spec for r, _ in ran):
            return pad  # (spec == 0: a running request still prefilling)
        return 1

    def _admit_loading(self, req: EngineRequest, h: int, hc: int, budget: int, now: float) -> bool:
        """Admit the waiting queue's head ``req`` whose lookup found ``h`` GPU then ``hc`` CPU blocks:
        its load starts (:meth:`KvCacheManager.start_load`); ``False`` (nothing changed) when the
        KV cache cannot give the blocks."""
        kv = self.kv
        computed = kv.hit_tokens(h + hc)
        n = min(req.num_tokens - computed, budget)
        if not kv.start_load(req, h, hc, n, now):  # (it counts a first admission's hits)
            return False
        self.waiting.popleft()
        if req.hit_tokens is None:
            req.hit_tokens = computed
            req.cpu_hit_blocks = hc
            req.first_scheduled_ms = now
        self.loading.append(req)
        return True

    def _admit_loaded(self, req: EngineRequest, budget: int) -> int:
        """The first chunk of ``req`` whose CPU hits have arrived: the loaded blocks named, at most what
        the KV cache can give (never less than the blocks taken at admission). Returns its tokens."""
        kv = self.kv
        kv.load_arrived(req)
        n = min(req.num_tokens - req.computed, budget)
        if not kv.allocate_slots(req, req.computed + n + self.lookahead):
            n = max(1, min(n, kv.free_slots(req) - self.lookahead)) if self.lookahead else kv.free_slots(req)
        kv.name_blocks(req, n)
        return n

    def preempt(self, req: EngineRequest) -> None:
        """Recompute preemption: free ``req``'s blocks, put it at the FRONT of the waiting queue. With a
        step of it in flight (async scheduling) only its tokens whose blocks vLLM has hashed count
        (:func:`dynlab.engine.async_steps.after_schedule`)."""
        if req.inflight:
            req.computed = req.safe
        self.kv.preempt(req)  # (its blocks freed, none named any more)
        req.computed = 0
        req.spec = 0  # its drafts are dropped (vLLM clears spec_token_ids on preemption)
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    def update_from_step(self, sched: list, k: int, end: float, handoff: bool) -> Tuple[list, list, list]:
        """Apply a step (``k == 1``) or a bulk run of ``k`` decode steps of the ``(request, tokens)``
        pairs ``sched`` at its ``end`` (ms): computed and emitted tokens (:data:`DECODE_TOKENS` per
        completing step), first tokens, finishes (their blocks freed), handoffs (``handoff``: a prefill
        worker's requests leave at their first token, blocks held). Returns ``(first_tokens, finished,
        handed)``, ``[(request, end)]`` each."""
        if self.spec is not None:
            return self._update_spec(sched, end, handoff)
        first_tokens, finished, handed = [], [], []
        for req, n in sched:
            if k > 1:
                t = k * DECODE_TOKENS
                req.computed += t
                req.num_tokens += t
                req.generated += t
            else:
                req.computed += n
                if req.computed != req.num_tokens:
                    continue
                req.num_tokens += DECODE_TOKENS
                req.generated += DECODE_TOKENS
                if req.generated == DECODE_TOKENS:
                    self._emitted(req, end, True, handoff, first_tokens, finished, handed)
                    continue
            if req.generated >= req.output_length:
                self._emitted(req, end, False, handoff, first_tokens, finished, handed)
        if finished or handed:
            self._drop_done(handed, finished)
        return first_tokens, finished, handed

    def _emitted(self, req: EngineRequest, end: float, first: bool, handoff: bool, first_tokens: list,
                 finished: list, handed: list) -> None:
        """The tail of a step's update (plain and speculative) for ``req``, which emitted its ``first``
        token(s) or reached ``output_length`` at ``end`` (ms): its first token, its handoff (``handoff``: it
        leaves with its blocks held, unless that token is its last), or its finish (its blocks freed),
        appended as ``(request, end)`` to ``first_tokens`` / ``handed`` / ``finished``. Called only then
        (a few times per request), not for every request of every step."""
        if first:
            req.first_token_ms = end
            first_tokens.append((req, end))
            if handoff and req.generated < req.output_length:
                handed.append((req, end))
                self.kv.hold(req)
                return
        if req.generated >= req.output_length:
            req.finish_ms = end
            finished.append((req, end))
            req.computed = req.num_tokens - 1  # (speculation: vLLM's stop trims the drafts past output_length)
            self.kv.free(req)

    def _drop_done(self, handed: list, finished: list) -> None:
        """After a step's update: the running list without the finished requests and those handed off
        (held for a P/D transfer)."""
        if handed:
            self.running = self.kv.drop_held([r for r in self.running if r.finish_ms is None])
        elif finished:
            self.running = [r for r in self.running if r.finish_ms is None]

    def _update_spec(self, sched: list, end: float, handoff: bool) -> Tuple[list, list, list]:
        """:meth:`update_from_step` of one step with speculative decoding (vLLM's ``update_from_output``):
        a request whose scheduled tokens reach past ``num_tokens`` verified ``s`` drafts, accepts
        ``a`` (the acceptance model), keeps ``computed = num_tokens + a`` (the rejected drafts' slots
        are overwritten later) and emits ``1 + a`` tokens, never past ``output_length``; then it
        carries ``K`` new drafts."""
        spec = self.spec
        first_tokens, finished, handed = [], [], []
        for req, n in sched:
            computed = req.computed + n
            if computed < req.num_tokens:
                req.computed = computed
                continue
            s = min(computed - req.num_tokens, req.spec)  # (an admission's padding: no draft)
            a = spec.verify(req, s) if s > 0 else 0
            req.computed = req.num_tokens + a
            emit = min(1 + a, req.output_length - req.generated)
            first = req.generated == 0
            req.num_tokens += emit
            req.generated += emit
            req.spec = spec.k
            if first or req.generated >= req.output_length:
                self._emitted(req, end, first, handoff, first_tokens, finished, handed)
        self._drop_done(handed, finished)
        return first_tokens, finished, handed
