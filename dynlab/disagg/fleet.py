"""Disaggregated serving (P/D): a prefill pool and a decode pool of engines, and the KV transfer between them.

The model, built on the timed engine (:mod:`dynlab.engine.timed`, :mod:`dynlab.engine.worker`):

- A request is routed to a **prefill worker** by the run's strategy, which sees only the prefill
  pool (its load view and the prefill workers' KV events; decode pools publish none). The prefill
  worker (an :class:`~dynlab.engine.worker.EngineWorker` with ``handoff=True``) prefills it with
  chunking, batching, its prefix cache and its block pool as an aggregated worker does, and
  computes its first token there (``ttft_prefill_ms``, the prefill side's time to first token). A
  request of one output token finishes there (nothing to decode, nothing sent: its TTFT is that).
- A request with something to decode whose whole KV (:func:`~dynlab.engine.request.peak_tokens`, with
  the decode workers' speculative spare) some decode worker's pool can never hold (the decode router may
  pick any) is **rejected at arrival** (routed, then neither prefilled nor sent), as an aggregated engine
  rejects one its pool can never hold: it counts in ``rejected``, a failure for ``goodput``.
- A **decode worker** is then chosen by the decode router (a :class:`~dynlab.routing.strategy.Strategy`,
  :mod:`dynlab.disagg.decode_router`; by name :data:`DECODE_ROUTERS`):
  ``least-loaded`` (fewest requests assigned and not finished, then lowest id), ``round-robin``,
  ``kv-usage`` (lowest share of its blocks in use, reservations included; then fewest requests).
  The decode worker must **reserve** the blocks for the request's KV and next token before the
  transfer starts (:meth:`~dynlab.engine.worker.EngineWorker.reserve`); when it cannot, the
  request waits, first come first served per decode worker, until a finish there frees blocks:
  that wait is ``decode_wait_ms``.
- The **transfer** moves ``(input_length - decode-side hit tokens) * kv_bytes_per_token`` bytes
  (:attr:`ModelSpec.kv_bytes_per_token <dynlab.latency.hardware.ModelSpec>`, the whole model's
  KV, from :func:`dynlab.disagg.cost.kv_bytes_per_token_from_config`); the hit is 0 unless
  ``decode_prefix_cache``, the decode worker's own prefix cache: it names the prompt blocks it receives
  and, when the trace names the reply (``Request.output_hashes``), the reply's full blocks as its steps
  compute them (published in those steps' results as ``BlockStored``; no router reads the decode pool's
  events, as Dynamo's decode stage does not score overlap). The prefill worker never computes a reply,
  so a conversation's next turn hits only its previous prompt there (docs/disagg.md). Each prefill worker has one link of ``link_gbps`` GB/s (10**9 B/s;
  time per transfer :func:`dynlab.disagg.cost.transfer_ms`) shared **first come first served**
  (FIFO): a transfer occupies the whole link from ``max(its start, the link's previous transfer
  end)`` for ``bytes / bandwidth``, then arrives ``link_latency_ms`` later (propagation, not
  occupying the link). ``transfer_ms`` of a request is its KV's arrival minus its reservation
  (link queueing included). Without ``overlap_transfer`` the transfer starts when the prefill
  ends (the step emitting the first token); with it the transfer is layer-pipelined with the
  prefill (as NIXL-based connectors stream KV layer by layer): it is requested when the
  request's prefill is first scheduled, and the KV arrives at ``max(link arrival, prefill end)``.
- When the KV arrives the prefill worker frees the request's blocks (they stay cached) and the
  decode worker queues the request with its KV present
  (:meth:`~dynlab.engine.worker.EngineWorker.receive`): its steps compute decodes only (prefill
  tokens 0) unless it is preempted there (then it recomputes, as vLLM does). **TTFT is the
  user's**: the end of the decode worker's first step for the request after its KV arrived (prefill,
  decode wait, transfer, then that step), as llm-d / vLLM's KV connectors, SGLang and Dynamo stream
  it: the prefill worker's token reaches the user with that step's. The request's
  ``first_token_ms`` is set to it then (``--requests-out``'s ``first_token_ms``; the prefill side's
  is :attr:`TransferRecord.prefill_done`). E2E and TPOT are measured at its finish on the decode
  worker; TPOT, ``(finish - TTFT) / (output_length - 1)``, starts at the user's first token, so the
  transfer is in TTFT and not in TPOT.

Metrics (:class:`TransferRecorder`, :meth:`DisaggFleet.result`): ``ttft_prefill_ms`` (arrival to the
first token on the prefill worker, every request served; an engine time, like ``queue_wait_ms``: without the
run's front end and detokenisation, which ``ttft_ms``, the user's, includes), ``transfers``, ``transfer_ms`` and
``decode_wait_ms`` (``{p50, p90, p99, mean}`` ms, rounded to 0.1 like every timed percentile,
``null`` with no sample), ``transfer_bytes`` (the sum over requests), ``decode_hit_tokens`` and
per pool ``{workers, utilization, mean_kv_usage, mean_kv_usage_busy, peak_kv_blocks}``:
utilization is the share of the run's span (first arrival to last finish) a worker spends in
steps, averaged over the pool; KV usage is block-time held by requests (reservations and held
blocks included) over capacity-time, per worker, over the span (``mean_kv_usage``) or over the
worker's time in steps (``mean_kv_usage_busy``). Exact per-request values are in
:attr:`DisaggFleet.records`.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from dynlab.disagg.cost import GB
from dynlab.disagg.decode_router import decode_router
from dynlab.engine.config import DECODE_ROUTERS, PdSection
from dynlab.engine.loop import ARRIVAL
from dynlab.engine.metrics import Recorder, hooks, kv_usage, kv_usage_busy, ratio, stats
from dynlab.engine.request import peak_tokens
from dynlab.engine.steps import StepDriver
from dynlab.engine.timed import TimedFleet
from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.errors import DynlabError
from dynlab.limits import HORIZON_MS, past_horizon
from dynlab.routing.strategy import FleetView, Request, Strategy

#: how transfers from one prefill worker share its link
LINK_SHARING = "fifo"
#: default link bandwidth, GB/s: one 400 Gb/s NIC (ConnectX-7 / InfiniBand NDR, 400 Gb/s = 50 GB/s)
DEFAULT_LINK_GBPS = 50.0


@dataclass
class TransferRecord:
    """One request's trip from its prefill worker to its decode worker (times in ms, unrounded).

    ``asked``: when it asked a decode worker for blocks; ``reserved``: when it got them (the
    transfer starts); ``link_start`` / ``link_end``: its time on the prefill worker's link;
    ``arrived``: its KV present on the decode worker; ``nbytes``: bytes sent; ``hit_tokens``:
    prompt tokens the decode worker already cached; ``prefill_done``: its first token on the
    prefill worker (handed off); ``first_token``: the end of the decode worker's first step for it
    after ``arrived``, the user's first token.
    """

    request: EngineRequest
    prefill: int
    decode: int
    asked: float
    reserved: Optional[float] = None
    link_start: Optional[float] = None
    link_end: Optional[float] = None
    arrived: Optional[float] = None
    nbytes: int = 0
    hit_tokens: int = 0
    prefill_done: Optional[float] = None
    first_token: Optional[float] = None

    @property
    def transfer_ms(self) -> float:
        return self.arrived - self.reserved

    @property
    def decode_wait_ms(self) -> float:
        return self.reserved - self.asked


class _UsedBlocks:
    """A live read-only sequence of the decode engines' blocks in use (the decode router's ``active_blocks``)."""

    __slots__ = ("_engines",)

    def __init__(self, engines: Sequence[EngineWorker]):
        self._engines = engines

    def __getitem__(self, d: int) -> int:
        return self._engines[d].used_blocks

    def __len__(self) -> int:
        return len(self._engines)


class DisaggFleet:
    """A P/D fleet: a :class:`~dynlab.engine.timed.TimedFleet` of the prefill pool (driven through its public
    hooks), plus a decode pool, a decode router and the transfers between them.

    ``prefill`` engines need ``handoff=True``; ``decode`` engines are plain. ``env``: the run's
    :class:`~dynlab.engine.env.RunEnv` (its routing recorder sized to the prefill pool).
    ``kv_bytes_per_token``: bytes of one token's KV (the whole model); ``pd``: the P/D section
    (``link_gbps`` > 0, ``link_latency_ms`` >= 0, ``decode_router`` one of :data:`DECODE_ROUTERS`);
    ``decode_strategy``: a decode router of one's own (default: ``pd.decode_router``'s). A
    :class:`TransferRecorder` joins ``env.recorders`` (:attr:`transfer`). Raises ``ValueError`` for a bad option.
    """

    def __init__(self, strategy: Strategy, prefill: Sequence[EngineWorker], decode: Sequence[EngineWorker], env,
                 names_of: Callable, *, kv_bytes_per_token: int, pd: PdSection = PdSection(),
                 decode_strategy: Optional[Strategy] = None, transfer_bytes: Optional[Callable] = None):
        if pd.decode_router not in DECODE_ROUTERS:
            raise ValueError(f"decode_router must be one of {', '.join(DECODE_ROUTERS)}, got {pd.decode_router!r}")
        if not pd.link_gbps > 0 or not pd.link_latency_ms >= 0:
            raise ValueError("link_gbps must be > 0 and link_latency_ms >= 0")
        if not prefill or not decode:
            raise ValueError("a disaggregated fleet needs at least one prefill and one decode worker")
        if not all(e.handoff for e in prefill):
            raise ValueError("prefill engines must hand requests off at their first token (handoff=True)")
        self.transfer = TransferRecorder(len(prefill))
        env.recorders.append(self.transfer)
        self.env, self.loop, self.bus = env, env.loop, env.bus
        self.routing, self.serving = env.routing, env.serving
        # the prefill pool: a timed fleet; a transfer's release touches its pools between arrivals (lazy=False)
        self.prefill_fleet = TimedFleet(strategy, prefill, env, names_of, lazy=False,
                                        on_step_started=self._on_pstart if pd.overlap_transfer else None,
                                        on_handed_off=self._on_handed_off, admits=self._decodable)
        self.engines = self.prefill_fleet.engines
        self.decode = list(decode)
        self.kv_bytes_per_token = kv_bytes_per_token
        #: ``(tokens, hit) -> bytes`` sent, when not every token's KV is resident (KV cache groups), else ``None``
        self.transfer_bytes = transfer_bytes
        self.bytes_per_ms = pd.link_gbps * GB / 1000.0
        self.link_latency_ms = pd.link_latency_ms
        self.overlap = pd.overlap_transfer
        self.prefix_cache = pd.decode_prefix_cache
        n = len(decode)
        self.decode_strategy = decode_strategy or decode_router(pd.decode_router, n, self.decode[0].capacity,
                                                                self.decode[0].block)
        # the decode pool's steps: the aggregated workers' driver, publishing nothing (no router reads them)
        self.decode_pool = StepDriver(self.decode, env.loop, env.bus, self._on_dend, publishes=False, lazy=False,
                                      who="decode worker")
        # the recorders' worker ids (on_step, the result's per-worker lists): given in order of creation across both
        # pools, so a fixed fleet's are 0..P-1 (prefill) then P..P+D-1 (decode); a worker added to either pool
        # (dynlab.disagg.elastic) takes the next one
        self.pids, self.dids = list(range(len(prefill))), list(range(len(prefill), len(prefill) + n))
        self.by_id = [*self.engines, *self.decode]  # engines in id order (all_engines)
        self.transfer.pids, self.transfer.dids = self.pids, self.dids
        self.prefill_fleet.step_ids = self.pids
        self.dload = [0] * n
        self.drouted = [0] * n
        self.droutable = list(range(n))  # decode workers a request may be sent to (dynlab.disagg.elastic changes it)
        self.dview = self.decode_view()
        self.pending = [deque() for _ in decode]
        #: per decode worker: requests received, their user's first token not yet out -> generated at receipt
        self.awaiting = [{} for _ in decode]
        self.link_free = [0.0] * len(prefill)
        self.records: dict = {}  # request id -> TransferRecord
        recorders = env.recorders
        self._h_step, self._h_finish = hooks(recorders, "on_step"), hooks(recorders, "on_finish")
        self._h_handoff = hooks(recorders, "on_handoff")

    @property
    def evicted_blocks(self) -> int:
        """Cached blocks the prefill pool evicted (decode pools publish no events)."""
        return self.prefill_fleet.evicted_blocks

    @property
    def all_engines(self) -> list:
        """Every engine in the order of the recorders' worker ids (the result's lists): a fixed fleet's prefill
        engines, then its decode engines, then any added to either pool, in order of creation."""
        return list(self.by_id)

    def new_id(self, engine: EngineWorker, pool: str) -> int:
        """Give ``engine``, just appended to ``pool``'s list (``"prefill"`` or ``"decode"``), the next recorders' id;
        returns it."""
        i = len(self.by_id)
        self.by_id.append(engine)
        if pool == "prefill":
            self.pids.append(i)
            self.link_free.append(0.0)
        else:
            self.dids.append(i)
        return i

    def cancel_transfer(self, rec: "TransferRecord", now: float) -> None:
        """Forget ``rec``'s trip (its prefill worker was killed with its KV): its decode worker drops the reservation
        or the place in its queue; a request waiting behind it there may reserve now."""
        d, ereq = rec.decode, rec.request
        del self.records[ereq.id]
        self.dload[d] -= 1
        if rec.reserved is None:
            self.pending[d].remove(ereq)
        else:  # the blocks reserved for its KV go back to the decode worker's pool
            kv = self.decode[d].kv
            keys, _ = kv.reserved.pop(ereq)
            kv.accumulate(now)
            kv.pool.release(keys, ereq.seq)
        self._try_reserve(d, now)

    def arrive(self, req) -> None:
        """Route and submit the workload's request ``req`` now to the prefill pool (closed-loop users)."""
        self.prefill_fleet.arrive(req)

    def run(self, arrivals=None) -> None:
        """Replay the arrivals (default: the environment's) until the last request finishes."""
        self.prefill_fleet.run(arrivals)

    # -- prefill side: the prefill fleet's public hooks ---------------------------------------
    def _decodable(self, ereq: EngineRequest) -> bool:
        """The prefill fleet's ``admits``: ``False`` when some decode worker could never hold ``ereq`` (above)."""
        if ereq.output_length <= 1 or all(e.kv.fits(peak_tokens(ereq, e.spec)) for e in self.decode):
            return True
        return False  # rejected at arrival, counted in the result's ``rejected`` (TimedFleet's reject)

    def _on_pstart(self, w: int, engine: EngineWorker, now: float) -> None:
        # layer-pipelined (overlap): a request's transfer is requested when its prefill is first scheduled
        for ereq in engine.step_requests:
            if ereq.first_scheduled_ms == now and ereq.id not in self.records and \
                    ereq.output_length > 1 and ereq.generated == 0:
                self.ask_decode(ereq, w, now)

    def _on_handed_off(self, w: int, ereq: EngineRequest, now: float) -> None:
        rec = self.records.get(ereq.id)
        if rec is None:
            self.ask_decode(ereq, w, now)
            self.records[ereq.id].prefill_done = now
        else:
            rec.prefill_done = now
            if rec.link_end is not None and rec.arrived is None and rec.link_end + self.link_latency_ms <= now:
                self._arrive(ereq)

    # -- the decode router and the reservation -------------------------------------------------
    def decode_view(self) -> FleetView:
        """The decode router's view of the decode pool as it is now (rebuilt when it grows: dynlab.disagg.elastic)."""
        n = len(self.decode)
        return FleetView(self.drouted, self.dload, _UsedBlocks(self.decode), [0] * n, [0] * n, routable=self.droutable)

    def _pick_decode(self, ereq: EngineRequest, now: float) -> int:
        d = self.decode_strategy.route(Request((), ereq.input_length, ereq.output_length, now, ereq.id,
                                               attrs=ereq.attrs), self.dview)
        n = len(self.decode)
        if type(d) is not int or not 0 <= d < n:
            raise DynlabError(f"decode router {self.decode_strategy.name!r} returned {d!r}, "
                              f"not a decode worker in 0..{n - 1}")
        return d

    def ask_decode(self, ereq: EngineRequest, w: int, now: float) -> None:
        d = self._pick_decode(ereq, now)
        self.dload[d] += 1
        self.drouted[d] += 1
        rec = self.records[ereq.id] = TransferRecord(ereq, w, d, now)
        for hook in self._h_handoff:
            hook(rec)
        self.pending[d].append(ereq)
        self._try_reserve(d, now)

    def _try_reserve(self, d: int, now: float) -> None:
        queue, engine = self.pending[d], self.decode[d]
        while queue:
            ereq = queue[0]
            hit = engine.reserve(ereq, now, self.prefix_cache)
            if hit is None:
                return
            queue.popleft()
            rec = self.records[ereq.id]
            rec.reserved, rec.hit_tokens = now, hit
            rec.nbytes = ((ereq.input_length - hit) * self.kv_bytes_per_token if self.transfer_bytes is None
                          else self.transfer_bytes(ereq.input_length, hit))
            p = rec.prefill
            rec.link_start = max(now, self.link_free[p])
            rec.link_end = self.link_free[p] = rec.link_start + rec.nbytes / self.bytes_per_ms
            done = rec.link_end + self.link_latency_ms
            if not done <= HORIZON_MS:
                raise past_horizon(done, f"request {ereq.id}'s KV transfer ({rec.nbytes:,} bytes)",
                                   "use a larger --link-gbps or a smaller --link-latency-ms")
            self.loop.at(done, ARRIVAL, self._on_link_done, rec)

    def _on_link_done(self, rec: TransferRecord) -> None:
        ereq = rec.request
        if self.records.get(ereq.id) is not rec:
            return  # its decode worker was killed meanwhile: sent again elsewhere (dynlab.disagg.elastic)
        if rec.prefill_done is not None and rec.arrived is None:
            self._arrive(ereq)
        # else (overlap): the KV streamed as fast as the prefill computed it: it arrives with the prefill's end

    def _arrive(self, ereq: EngineRequest) -> None:
        now = self.loop.now
        rec = self.records[ereq.id]
        rec.arrived = now
        prefill = self.engines[rec.prefill]
        prefill.release(ereq, now)
        if prefill.step_end is None and not prefill.idle:  # it may have waited for these blocks
            self.prefill_fleet.wake(rec.prefill)
        elif self.prefill_fleet.elastic is not None:  # a draining prefill worker leaves once its KV is all sent
            self.prefill_fleet.elastic.idle(rec.prefill)
        d = rec.decode
        engine = self.decode[d]
        before = engine.step_end
        engine.receive(ereq, now, self.prefix_cache)
        self.awaiting[d][ereq] = ereq.generated
        self.decode_pool.resume(d, before)

    # -- decode side: the decode pool's ``ended`` -----------------------------------------------
    def _on_dend(self, d: int, res) -> None:
        if self.awaiting[d]:
            self._stamp_first_tokens(d, res)
        for hook in self._h_step:
            hook(self.dids[d], res)
        for ereq, t in res.finished:
            self.dload[d] -= 1
            for hook in self._h_finish:
                hook(ereq, t)
        if res.finished and self.pending[d]:
            self._try_reserve(d, self.loop.now)

    def _stamp_first_tokens(self, d: int, res) -> None:
        """The user's first token of each request that emitted its first token on decode worker ``d`` in
        the step ``res`` just ended: ``first_token`` of its record and the request's ``first_token_ms``.

        A received request is admitted in a step of its own (an admission ends any bulk decode run:
        ``plan_step``), so that step is one engine iteration and its end is the token's time."""
        awaiting = self.awaiting[d]
        for ereq, generated in list(awaiting.items()):
            if ereq.generated > generated:
                if res.steps != 1:
                    raise RuntimeError(f"request {ereq.id}'s first decode step is in a bulk run of {res.steps} (bug)")
                del awaiting[ereq]
                self.records[ereq.id].first_token = ereq.first_token_ms = res.end

    # -- metrics ---------------------------------------------------------------------------------
    def result(self) -> dict:
        """The P/D keys of a run's JSON (:meth:`TransferRecorder.result`)."""
        return self.transfer.result(self.all_engines)


class TransferRecorder(Recorder):
    """The P/D keys of a run (module docstring): transfers, their times and bytes, each pool's use.

    ``prefill_workers``: the size of the prefill pool (workers ``0..P-1`` in :meth:`on_step`, decode
    workers after them; :attr:`pids` and :attr:`dids`, the ids of each pool's workers, the fleet's own lists when
    its pools grow, :class:`DisaggFleet`). The span is the run's (first arrival to last finish), as the serving
    recorder's.
    """

    def __init__(self, prefill_workers: int):
        self.prefill_workers = prefill_workers
        self.pids: Optional[list] = None
        self.dids: Optional[list] = None
        self.records: list = []  # TransferRecord, in the order requests were handed off
        self.busy_ms: list = []  # per worker (prefill, then decode): ms in steps
        self.first_arrival: Optional[float] = None
        self.last_finish = 0.0
        self.ttft_prefill: list = []  # ms: arrival to the first token on the prefill worker

    def on_arrival(self, req, t: float) -> None:
        if self.first_arrival is None:
            self.first_arrival = t

    def on_first_token(self, req, t: float) -> None:
        """A prefill worker computed ``req``'s first token at ``t`` (a P/D fleet's decode workers never call it)."""
        self.ttft_prefill.append(t - req.arrival_ms)

    def on_finish(self, req, t: float) -> None:
        if t > self.last_finish:
            self.last_finish = t

    def on_step(self, worker: int, result) -> None:
        busy = self.busy_ms
        if worker >= len(busy):
            busy.extend([0.0] * (worker + 1 - len(busy)))
        busy[worker] += result.end - result.start

    def on_handoff(self, record: TransferRecord) -> None:
        self.records.append(record)

    def result(self, engines: Sequence) -> dict:
        start = self.first_arrival or 0.0
        span = max(self.last_finish - start, 0.0)
        recs = [r for r in self.records if r.arrived is not None]
        busy_ms = self.busy_ms + [0.0] * (len(engines) - len(self.busy_ms))

        p = self.prefill_workers
        pids = self.pids if self.pids is not None else range(p)
        dids = self.dids if self.dids is not None else range(p, len(engines))

        def pool(ids):
            pool_engines = [engines[i] for i in ids]
            n = len(pool_engines)
            busy = sum(busy_ms[i] for i in ids)
            return {"workers": n, "utilization": ratio(busy, n * span),
                    "mean_kv_usage": kv_usage(pool_engines, self.last_finish, span),
                    "mean_kv_usage_busy": kv_usage_busy(pool_engines),
                    "peak_kv_blocks": [e.peak_used_blocks for e in pool_engines]}

        return {
            "link_sharing": LINK_SHARING,
            "ttft_prefill_ms": stats(self.ttft_prefill),
            "transfers": len(recs),
            "transfer_ms": stats([r.transfer_ms for r in recs]),
            "transfer_bytes": sum(r.nbytes for r in recs),
            "decode_wait_ms": stats([r.decode_wait_ms for r in recs]),
            "decode_hit_tokens": sum(r.hit_tokens for r in recs),
            "prefill_pool": pool(pids),
            "decode_pool": pool(dids),
        }


__all__ = ["DECODE_ROUTERS", "DEFAULT_LINK_GBPS", "LINK_SHARING", "DisaggFleet", "TransferRecord",
           "TransferRecorder"]
