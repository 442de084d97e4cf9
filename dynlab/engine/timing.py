"""The time model: a first-order queueing model of each worker (``--timing``).

Assumptions (documented as a first-order model, not a serving engine):

- Arrivals: a request arrives at its trace ``timestamp`` (ms) times ``time_scale``
  (0.5 = twice the rate); a workload without timestamps arrives as a Poisson
  process at ``rate`` requests/s from its own seeded RNG. Timestamps that go
  backwards are clamped to the previous arrival.
- Routing, the prefix-cache lookup and block allocation happen on arrival.
- Prefill: each worker computes prefills one at a time, first come first served,
  at ``prefill_tps`` tokens/s, on the *uncached* prompt tokens only (cached blocks
  are free): ``ttft = queue wait + uncached_tokens / prefill_tps``; the first token
  appears when the prefill ends.
- Decode: runs concurrently with everything else, ``output_length / decode_tps``
  seconds per request, after its prefill. The request's blocks are *active*
  (pinned, never evicted) from arrival until its decode ends; then they return
  to the evictable LRU list tail-first (vLLM's free-block queue). When active
  blocks alone exceed the capacity the cache overflows for that while; the peak
  excess is reported as ``overflow_blocks``.
- Ignored: batching effects on prefill speed (a prefill runs at the same speed
  whatever else the GPU does), chunked prefill (decode steps never interleave
  with or slow a prefill), preemption and recomputation, the network, and the
  KV-event transport (events keep the count-based ``event_delay``).

Defaults (an 8B model, e.g. Llama-3-8B, on one H100-class GPU, bf16):

- ``prefill_tps = 16,000`` tokens/s: 2 x 8e9 FLOP per token against ~989 TFLOP/s
  dense bf16 is ~62,000 tokens/s at full use; attention over long prompts and a
  realistic 25-30 % model-FLOPs utilisation bring it to ~16,000.
- ``decode_tps = 60`` tokens/s per request: a decode step is memory-bound (16 GB
  of weights over ~3.35 TB/s is ~5 ms) and grows to ~15-20 ms with a batch's KV
  reads, so one request sees ~50-70 tokens/s.

Implementation: a discrete-event loop over a heap of ``(time, kind, seq, ...)``
(stdlib ``heapq``): prefill ends and decode ends are events; arrivals come from
the workload in order and first drain every event due at or before them.
"""
from __future__ import annotations

import heapq
import math
import random
import statistics
from dataclasses import dataclass
from typing import Hashable, Optional, Sequence

PREFILL_TPS = 16_000.0
DECODE_TPS = 60.0
POISSON_RATE = 4.0

_PREFILL_END, _DECODE_END = 0, 1


@dataclass(frozen=True)
class TimeModel:
    """Parameters of the time model (see the module docstring for sources and assumptions).

    ``prefill_tps``: prompt tokens/s per worker; ``decode_tps``: generated tokens/s per
    request; ``time_scale``: multiplies trace timestamps; ``rate``: requests/s of the
    Poisson arrivals used when the workload has no timestamps. All must be > 0.
    """

    prefill_tps: float = PREFILL_TPS
    decode_tps: float = DECODE_TPS
    time_scale: float = 1.0
    rate: float = POISSON_RATE

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first non-positive parameter."""
        for name in ("prefill_tps", "decode_tps", "time_scale", "rate"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v) and math.isfinite(1000.0 / v)):
                raise ValueError(f"{name} must be a finite number > 0 (and not vanishingly small), got {v}")


class PinnedLRUWorker:
    """A worker's KV cache under the time model: active blocks pinned, the rest an LRU list.

    ``capacity`` blocks (``None``: unbounded). Blocks of requests in flight are
    pinned (reference-counted) and never evicted; released blocks join the LRU
    list tail-first, so a parent is always more recent than its children and the
    cache stays prefix-closed. Same ``overlap`` / ``serve`` interface as
    :class:`dynlab.engine.counted.Worker`, plus :meth:`release`.
    """

    __slots__ = ("id", "capacity", "lru", "pins", "evicted_blocks", "overflow_peak", "bounded", "size")

    def __init__(self, worker_id: int, capacity: Optional[int]):
        self.id = worker_id
        self.capacity = capacity
        self.bounded = capacity is not None
        self.lru: dict = {}  # evictable blocks, oldest first (dicts keep insertion order)
        self.pins: dict = {}  # block -> number of requests in flight using it
        self.evicted_blocks = 0
        self.overflow_peak = 0
        self.size = 0  # blocks held (pinned + evictable), kept current by serve() and release()

    def __contains__(self, block: Hashable) -> bool:
        return block in self.pins or block in self.lru

    def __len__(self) -> int:
        return len(self.pins) + len(self.lru)

    def keys(self) -> list:
        return list(self.pins) + list(self.lru)

    def overlap(self, hashes: Sequence[Hashable]) -> int:
        pins, lru = self.pins, self.lru
        n = 0
        for h in hashes:
            if h not in pins and h not in lru:
                break
            n += 1
        return n

    def _evict(self) -> list:
        over = len(self.pins) + len(self.lru) - self.capacity
        if over <= 0:
            return []
        lru = self.lru
        gone = []
        it = iter(lru)
        for _ in range(min(over, len(lru))):
            gone.append(next(it))
        for h in gone:
            del lru[h]
        self.evicted_blocks += len(gone)
        excess = len(self.pins) + len(lru) - self.capacity
        if excess > self.overflow_peak:
            self.overflow_peak = excess
        return gone

    def serve(self, hashes: Sequence[Hashable], cached: int):
        """Pin the request's blocks (the ``cached`` head is held; the rest is new); evict if over capacity.

        Returns ``(stored, removed)`` like :meth:`dynlab.engine.counted.Worker.serve`.
        """
        pins, lru = self.pins, self.lru
        for i in range(cached):
            h = hashes[i]
            c = pins.get(h)
            if c is None:
                del lru[h]
                pins[h] = 1
            else:
                pins[h] = c + 1
        new = hashes[cached:]
        for h in new:
            pins[h] = 1
        removed = self._evict() if self.bounded else ()
        self.size = len(pins) + len(lru)
        return new, removed

    def release(self, hashes: Sequence[Hashable]) -> list:
        """The request finished: unpin its blocks tail-first; returns blocks evicted to get back under capacity."""
        pins, lru = self.pins, self.lru
        for i in range(len(hashes) - 1, -1, -1):
            h = hashes[i]
            c = pins[h]
            if c == 1:
                del pins[h]
                lru[h] = 1
            else:
                pins[h] = c - 1
        removed = self._evict() if self.bounded else []
        self.size = len(pins) + len(lru)
        return removed


def _stats(values: list) -> dict:
    """``{"p50", "p90", "p99", "mean"}`` rounded to 0.1 (inclusive-method quantiles; empty -> zeros)."""
    if not values:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0}
    if len(values) == 1:
        v = round(values[0], 1)
        return {"p50": v, "p90": v, "p99": v, "mean": v}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(q[49], 1), "p90": round(q[89], 1), "p99": round(q[98], 1),
            "mean": round(statistics.fmean(values), 1)}


class Clock:
    """The fleet's time state during a timed replay: arrivals, per-worker prefill queues, a heap of completions.

    The engine calls :meth:`arrival` for each request in workload order, then
    :meth:`advance` (which drains every completion due by then and returns the
    KV blocks released-and-evicted per worker), routes, serves, and calls
    :meth:`admit`. :meth:`metrics` gives the timed keys of ``dynlab sim``.
    """

    def __init__(self, model: TimeModel, workers: list, active_requests: list, active_blocks: list,
                 queued_prefill_tokens: list, seed: int = 1):
        model.validate()
        self.model = model
        self.workers = workers
        self.active_requests = active_requests
        self.active_blocks = active_blocks
        self.queued = queued_prefill_tokens
        n = len(workers)
        self.free_at = [0.0] * n
        self.peak_active = [0] * n
        self.heap: list = []
        self.seq = 0
        self.now = 0.0
        self.first: Optional[float] = None
        self.last_end = 0.0
        self.ttft: list = []
        self.waits: list = []
        self._poisson = random.Random(f"dynlab-arrivals-{seed}")
        self._ms_per_token = 1000.0 / model.prefill_tps
        self._decode_ms_per_token = 1000.0 / model.decode_tps

    def arrival(self, timestamp: Optional[float]) -> float:
        """The arrival time (ms) of the next request."""
        if timestamp is None:
            t = self.now + self._poisson.expovariate(self.model.rate) * 1000.0
        else:
            t = max(timestamp * self.model.time_scale, self.now)
        if self.first is None:
            self.first = t
        self.now = t
        return t

    def advance(self, t: float) -> list:
        """Apply every completion due at or before ``t``; returns ``[(worker, removed blocks), ...]``."""
        heap = self.heap
        released = []
        while heap and heap[0][0] <= t:
            _, kind, _, w, payload = heapq.heappop(heap)
            if kind == _PREFILL_END:
                self.queued[w] -= payload
            else:
                self.active_requests[w] -= 1
                self.active_blocks[w] -= len(payload)
                removed = self.workers[w].release(payload)
                if removed:
                    released.append((w, removed))
        return released

    def admit(self, w: int, t: float, hashes: Sequence[Hashable], uncached_tokens: int, output_length: int) -> None:
        """Queue the request's prefill on worker ``w`` and schedule its completions."""
        start = self.free_at[w]
        if start < t:
            start = t
        end = start + uncached_tokens * self._ms_per_token
        self.free_at[w] = end
        self.waits.append(start - t)
        self.ttft.append(end - t)
        done = end + output_length * self._decode_ms_per_token
        if done > self.last_end:
            self.last_end = done
        self.seq += 1
        heapq.heappush(self.heap, (end, _PREFILL_END, self.seq, w, uncached_tokens))
        self.seq += 1
        heapq.heappush(self.heap, (done, _DECODE_END, self.seq, w, hashes))
        self.queued[w] += uncached_tokens
        a = self.active_requests[w] + 1
        self.active_requests[w] = a
        self.active_blocks[w] += len(hashes)
        if a > self.peak_active[w]:
            self.peak_active[w] = a

    def metrics(self) -> dict:
        """``ttft_ms``, ``queue_wait_ms`` (p50/p90/p99/mean, ms), ``makespan_s``, ``peak_active_requests``, ``overflow_blocks``."""
        makespan = (self.last_end - self.first) / 1000.0 if self.first is not None else 0.0
        return {
            "ttft_ms": _stats(self.ttft),
            "queue_wait_ms": _stats(self.waits),
            "makespan_s": round(makespan, 3),
            "peak_active_requests": list(self.peak_active),
            "overflow_blocks": max((getattr(w, "overflow_peak", 0) for w in self.workers), default=0),
        }
