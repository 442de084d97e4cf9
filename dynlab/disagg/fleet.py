"""Disaggregated serving (P/D): a prefill pool and a decode pool of engines, and the KV transfer between them.

The model, built on the timed engine (:mod:`dynlab.engine.timed`, :mod:`dynlab.engine.worker`):

- A request is routed to a **prefill worker** by the run's strategy, which sees only the prefill
  pool (its load view and the prefill workers' KV events; decode pools publish none). The prefill
  worker (an :class:`~dynlab.engine.worker.EngineWorker` with ``handoff=True``) prefills it with
  chunking, batching, its prefix cache and its block pool as an aggregated worker does, and
  produces its **first token** there: TTFT is measured on the prefill worker. A request of one
  output token finishes there (nothing to decode, nothing sent).
- A **decode worker** is then chosen by the decode router (:data:`DECODE_ROUTERS`):
  ``least-loaded`` (fewest requests assigned and not finished, then lowest id), ``round-robin``,
  ``kv-usage`` (lowest share of its blocks in use, reservations included; then fewest requests).
  The decode worker must **reserve** the blocks for the request's KV and next token before the
  transfer starts (:meth:`~dynlab.engine.worker.EngineWorker.reserve`); when it cannot, the
  request waits, first come first served per decode worker, until a finish there frees blocks:
  that wait is ``decode_wait_ms``.
- The **transfer** moves ``(input_length - decode-side hit tokens) * kv_bytes_per_token`` bytes
  (:attr:`ModelSpec.kv_bytes_per_token <dynlab.latency.hardware.ModelSpec>`, the whole model's
  KV, from :func:`dynlab.disagg.cost.kv_bytes_per_token_from_config`); the hit is 0 unless
  ``decode_prefix_cache``. Each prefill worker has one link of ``link_gbps`` GB/s (10**9 B/s;
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
  tokens 0) unless it is preempted there (then it recomputes, as vLLM does). E2E and TPOT are
  measured at its finish on the decode worker.

Metrics (:meth:`DisaggFleet.result`): ``transfers``, ``transfer_ms`` and ``decode_wait_ms``
(``{p50, p90, p99, mean}`` ms, rounded to 0.1 like every timed percentile), ``transfer_bytes``
(the sum over requests), ``decode_hit_tokens`` and per pool ``{workers, utilization,
mean_kv_usage, peak_kv_blocks}``: utilization is the share of the run's span (first arrival to
last finish) a worker spends in steps, averaged over the pool; KV usage is block-time held by
requests (reservations and held blocks included) over capacity-time, per worker. Exact
per-request values are in :attr:`DisaggFleet.records`.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from dynlab.disagg.cost import GB
from dynlab.engine.bus import EventBus
from dynlab.engine.config import DECODE_ROUTERS
from dynlab.engine.loop import ARRIVAL, STEP_END, STEP_START, EventLoop
from dynlab.engine.metrics import RoutingMetrics, ServingMetrics, event_refusals, ratio, stats
from dynlab.engine.timed import TimedFleet, arrival_times, step_past_horizon
from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.limits import HORIZON_MS, past_horizon
from dynlab.routing.events import BlockStored
from dynlab.routing.strategy import Request, Strategy

#: the decode-side routing rules (``--decode-router``)
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
    prompt tokens the decode worker already cached.
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

    @property
    def transfer_ms(self) -> float:
        return self.arrived - self.reserved

    @property
    def decode_wait_ms(self) -> float:
        return self.reserved - self.asked


class DisaggFleet(TimedFleet):
    """A :class:`~dynlab.engine.timed.TimedFleet` whose engines are the prefill pool, plus a decode pool.

    ``prefill`` engines need ``handoff=True``; ``decode`` engines are plain. ``kv_bytes_per_token``:
    bytes of one token's KV (the whole model); ``link_gbps`` > 0, ``link_latency_ms`` >= 0;
    ``decode_router`` one of :data:`DECODE_ROUTERS`. Raises ``ValueError`` for a bad one.
    """

    def __init__(self, strategy: Strategy, prefill: Sequence[EngineWorker], decode: Sequence[EngineWorker],
                 bus: EventBus, loop: EventLoop, names_of: Callable, routing: RoutingMetrics,
                 serving: ServingMetrics, *, kv_bytes_per_token: int, link_gbps: float = DEFAULT_LINK_GBPS,
                 link_latency_ms: float = 0.0, overlap_transfer: bool = False, decode_prefix_cache: bool = False,
                 decode_router: str = "least-loaded", progress=None):
        if decode_router not in DECODE_ROUTERS:
            raise ValueError(f"decode_router must be one of {', '.join(DECODE_ROUTERS)}, got {decode_router!r}")
        if not link_gbps > 0 or not link_latency_ms >= 0:
            raise ValueError("link_gbps must be > 0 and link_latency_ms >= 0")
        if not prefill or not decode:
            raise ValueError("a disaggregated fleet needs at least one prefill and one decode worker")
        if not all(e.handoff for e in prefill):
            raise ValueError("prefill engines must hand requests off at their first token (handoff=True)")
        super().__init__(strategy, prefill, bus, loop, names_of, routing, serving, progress)
        self._lazy = False  # a transfer's release touches a prefill worker's pool between arrivals
        self.decode = list(decode)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.bytes_per_ms = link_gbps * GB / 1000.0
        self.link_latency_ms = link_latency_ms
        self.overlap = overlap_transfer
        self.prefix_cache = decode_prefix_cache
        self.decode_router = decode_router
        self.dgeneration = [0] * len(decode)
        self.dload = [0] * len(decode)
        self.pending = [deque() for _ in decode]
        self.link_free = [0.0] * len(prefill)
        self.busy_ms = [0.0] * (len(prefill) + len(decode))
        self._rr = 0
        self.records: dict = {}  # request id -> TransferRecord
        self._where: dict = {}  # EngineRequest -> prefill worker, while its prefill is not scheduled (overlap)

    # -- prefill side ------------------------------------------------------------------------
    def _on_start(self, w: int) -> None:
        engine = self.engines[w]
        super()._on_start(w)
        if self.overlap and engine._step is not None:
            # layer-pipelined: a request's transfer is requested when its prefill is first scheduled
            now = self.loop.now
            for ereq, _ in engine._step.sched:
                if ereq.first_scheduled_ms == now and ereq.id not in self.records and \
                        ereq.output_length > 1 and ereq.generated == 0:
                    self._ask_decode(ereq, w, now)

    def _on_end(self, w: int, generation: int) -> None:
        if generation != self.generation[w]:
            return
        engine = self.engines[w]
        res = engine.finish_step()
        self.busy_ms[w] += res.end - res.start
        if res.stored:
            self.bus.send((BlockStored(w, tuple(res.stored)),))
        serving = self.serving
        serving.on_step(w, res)
        now = self.loop.now
        for ereq, t in res.first_tokens:
            self._first_token(ereq)
            serving.on_first_token(ereq, t)
        for ereq, t in res.finished:  # one-token requests: nothing to decode
            self._untrack(ereq)
            serving.on_finish(ereq, t)
        for ereq, t in res.handed_off:
            self._untrack(ereq)  # the router's view: the request left its prefill worker
            rec = self.records.get(ereq.id)
            if rec is None:
                self._ask_decode(ereq, w, now)
                self.records[ereq.id].prefill_done = now
            else:
                rec.prefill_done = now
                if rec.link_end is not None and rec.arrived is None and rec.link_end + self.link_latency_ms <= now:
                    self._arrive(ereq)
        if not engine.idle and engine.step_end is None:
            self.loop.at(now, STEP_START, self._on_start, w)

    # -- the decode router and the reservation -------------------------------------------------
    def _pick_decode(self) -> int:
        n = len(self.decode)
        if self.decode_router == "round-robin":
            d = self._rr % n
            self._rr += 1
            return d
        load = self.dload
        if self.decode_router == "least-loaded":
            return min(range(n), key=lambda d: (load[d], d))
        dec = self.decode
        return min(range(n), key=lambda d: (dec[d].used_blocks / dec[d].capacity, load[d], d))

    def _ask_decode(self, ereq: EngineRequest, w: int, now: float) -> None:
        d = self._pick_decode()
        self.dload[d] += 1
        self.records[ereq.id] = TransferRecord(ereq, w, d, now)
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
            rec.nbytes = (ereq.input_length - hit) * self.kv_bytes_per_token
            p = rec.prefill
            rec.link_start = max(now, self.link_free[p])
            rec.link_end = self.link_free[p] = rec.link_start + rec.nbytes / self.bytes_per_ms
            done = rec.link_end + self.link_latency_ms
            if not done <= HORIZON_MS:
                raise past_horizon(done, f"request {ereq.id}'s KV transfer ({rec.nbytes:,} bytes)",
                                   "use a larger --link-gbps or a smaller --link-latency-ms")
            self.loop.at(done, ARRIVAL, self._on_link_done, ereq)

    def _on_link_done(self, ereq: EngineRequest) -> None:
        rec = self.records[ereq.id]
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
            self.loop.at(now, STEP_START, self._on_start, rec.prefill)
        d = rec.decode
        engine = self.decode[d]
        before = engine.step_end
        engine.receive(ereq, now, self.prefix_cache)
        if before is None:
            self.loop.at(now, STEP_START, self._on_dstart, d)
        elif engine.step_end != before:
            self._schedule_dend(d)

    # -- decode side ---------------------------------------------------------------------------
    def _on_dstart(self, d: int) -> None:
        engine = self.decode[d]
        if engine.step_end is not None or engine.idle:
            return
        engine.start_step(self.loop.now)
        self._schedule_dend(d)

    def _schedule_dend(self, d: int) -> None:
        self.dgeneration[d] += 1
        end = self.decode[d].step_end
        if end is not None:
            if not end <= HORIZON_MS:
                raise step_past_horizon(self.decode[d], f"decode worker {d}", self.loop.now, end)
            self.loop.at(end, STEP_END, self._on_dend, d, self.dgeneration[d])

    def _on_dend(self, d: int, generation: int) -> None:
        if generation != self.dgeneration[d]:
            return
        engine = self.decode[d]
        res = engine.finish_step()
        self.busy_ms[len(self.engines) + d] += res.end - res.start
        self.serving.on_step(len(self.engines) + d, res)
        for ereq, t in res.finished:
            self.dload[d] -= 1
            self.serving.on_finish(ereq, t)
        now = self.loop.now
        if res.finished and self.pending[d]:
            self._try_reserve(d, now)
        if not engine.idle:
            self.loop.at(now, STEP_START, self._on_dstart, d)

    # -- metrics ---------------------------------------------------------------------------------
    def result(self) -> dict:
        """The P/D keys of a run's JSON (see the module docstring)."""
        serving = self.serving
        start = serving.first_arrival or 0.0
        span = max(serving.last_finish - start, 0.0)
        recs = [r for r in self.records.values() if r.arrived is not None]

        def pool(engines, offset):
            n = len(engines)
            busy = sum(self.busy_ms[offset:offset + n])
            return {"workers": n, "utilization": ratio(busy, n * span),
                    "mean_kv_usage": [ratio(e.used_block_ms(serving.last_finish), e.capacity * span)
                                      for e in engines],
                    "peak_kv_blocks": [e.peak_used_blocks for e in engines]}

        return {
            "link_sharing": LINK_SHARING,
            "transfers": len(recs),
            "transfer_ms": stats([r.transfer_ms for r in recs]),
            "transfer_bytes": sum(r.nbytes for r in recs),
            "decode_wait_ms": stats([r.decode_wait_ms for r in recs]),
            "decode_hit_tokens": sum(r.hit_tokens for r in recs),
            "prefill_pool": pool(self.engines, 0),
            "decode_pool": pool(self.decode, len(self.engines)),
        }


def serve_disagg(requests: Iterable[Request], strategy: Strategy, prefill: Sequence[EngineWorker],
                 decode: Sequence[EngineWorker], *, names_of: Callable[[Request], list], kv_bytes_per_token: int,
                 link_gbps: float = DEFAULT_LINK_GBPS, link_latency_ms: float = 0.0, overlap_transfer: bool = False,
                 decode_prefix_cache: bool = False, decode_router: str = "least-loaded", time_scale: float = 1.0,
                 rate: float = 4.0, arrival_rng: Optional[random.Random] = None, publish: bool = True,
                 event_delay_ms: float = 0.0, event_loss: float = 0.0, loss_rng: Optional[random.Random] = None,
                 slo_ttft_ms: Optional[float] = None, slo_tpot_ms: Optional[float] = None,
                 progress=None) -> DisaggFleet:
    """Serve ``requests`` on a P/D fleet in time; return the :class:`DisaggFleet` after the last finish
    (its recorders, :attr:`~DisaggFleet.records` and engines hold every figure, unrounded).

    Raises ``ValueError`` for a bad fleet option or timestamps that go backwards.
    """
    loop = EventLoop()
    bus = EventBus(loop, strategy.on_event, delay_ms=event_delay_ms, loss=event_loss, rng=loss_rng,
                   publish=publish)
    routing, serving = RoutingMetrics(len(prefill)), ServingMetrics(slo_ttft_ms, slo_tpot_ms)
    fleet = DisaggFleet(strategy, prefill, decode, bus, loop, names_of, routing, serving,
                        kv_bytes_per_token=kv_bytes_per_token, link_gbps=link_gbps, link_latency_ms=link_latency_ms,
                        overlap_transfer=overlap_transfer, decode_prefix_cache=decode_prefix_cache,
                        decode_router=decode_router, progress=progress)
    fleet.run(arrival_times(requests, time_scale, rate, arrival_rng or random.Random(0)))
    fleet.bus_published, fleet.bus_dropped = bus.published, bus.dropped
    return fleet


def replay_disagg(requests: Iterable[Request], strategy: Strategy, prefill: Sequence[EngineWorker],
                  decode: Sequence[EngineWorker], **kwargs) -> dict:
    """:func:`serve_disagg`, summarised: the routing and serving metrics of
    :func:`~dynlab.engine.timed.replay_timed` (``peak_kv_blocks`` / ``mean_kv_usage`` list the
    prefill workers, then the decode workers) plus :meth:`DisaggFleet.result`."""
    fleet = serve_disagg(requests, strategy, prefill, decode, **kwargs)
    out = fleet.routing.result()
    counts = fleet.routing.counts
    mean = fleet.routing.requests / len(counts) if counts else 0.0
    out.update({
        "evicted_blocks": fleet.evicted_blocks,
        "events_published": fleet.bus_published,
        "events_dropped": fleet.bus_dropped,
        **event_refusals(strategy),
        "requests_per_worker": list(counts),
        "load_imbalance": round(max(counts) / mean, 4) if mean else 0.0,
    })
    out.update(fleet.serving.result(list(fleet.engines) + fleet.decode))
    out.update(fleet.result())
    if any(e.spec is not None for e in fleet.decode):  # the decode pool's speculative decoding
        from dynlab.engine.spec import spec_metrics

        out.update(spec_metrics([e.spec for e in fleet.decode]))
    return out


__all__ = ["DECODE_ROUTERS", "DEFAULT_LINK_GBPS", "LINK_SHARING", "DisaggFleet", "TransferRecord",
           "replay_disagg", "serve_disagg"]
