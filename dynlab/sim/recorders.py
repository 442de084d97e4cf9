"""Recorders of the run layer that feed the report, not the run's JSON.

:class:`UsageRecorder` (``--report`` on timed ``sim`` and ``compare`` runs) keeps, per worker, a bounded
time series of its KV usage and its load from ``on_step(worker, result)``:

- **KV usage**: blocks held by running requests (the step's ``used_blocks``) as a share of the worker's pool
  (its ``capacity``, blocks), the time-weighted mean over each time bin;
- **load**: requests in the worker's batch (``batch_size``), the time-weighted mean over each bin.

Time between a worker's steps counts as 0 (an idle engine holds no running request), as in the run's
``mean_kv_usage`` (:meth:`~dynlab.engine.worker.EngineWorker.used_block_ms` over the run's span), so the
mean of a worker's bins over the run equals that figure up to the bins' edges. A bulk decode run counts its
``used_blocks`` (held after its last boundary) over its whole span.

Bounded: bins start :data:`FIRST_BIN_MS` wide from the first arrival and double (two neighbours merged)
whenever a worker would need more than :data:`MAX_BINS`, so memory is ``workers x MAX_BINS`` numbers
whatever the trace's length, and every worker's bins share one width. It adds no key to the run's JSON.
"""
from __future__ import annotations

from typing import Optional, Sequence

from dynlab.engine.metrics import Recorder

#: bins per worker at most (the series' length lies between MAX_BINS / 2 and MAX_BINS once it has doubled)
MAX_BINS = 256
#: the first bins' width (ms); it doubles as the run grows
FIRST_BIN_MS = 100.0


class UsageRecorder(Recorder):
    """Per-worker KV usage and load over time, in at most :data:`MAX_BINS` bins (module docstring)."""

    def __init__(self) -> None:
        self.origin: Optional[float] = None
        self.width = FIRST_BIN_MS
        self._blocks: dict[int, list] = {}  # worker -> block x ms per bin
        self._load: dict[int, list] = {}  # worker -> requests x ms per bin
        self.capacities: list[int] = []

    def on_arrival(self, req, t: float) -> None:
        if self.origin is None:
            self.origin = t

    def on_step(self, worker: int, result) -> None:
        origin = self.origin if self.origin is not None else result.start
        start, end = max(result.start - origin, 0.0), max(result.end - origin, 0.0)
        if end <= start:
            return
        while end > self.width * MAX_BINS:
            self._double()
        blocks = self._blocks.setdefault(worker, [])
        load = self._load.setdefault(worker, [])
        width = self.width
        last = min(-int(-end // width) - 1, MAX_BINS - 1)  # the bin holding the step's last instant
        if len(blocks) <= last:
            grow = last + 1 - len(blocks)
            blocks.extend([0.0] * grow)
            load.extend([0.0] * grow)
        used, size = result.used_blocks, result.batch_size
        for b in range(int(start / width), last + 1):
            dt = min(end, (b + 1) * width) - max(start, b * width)
            if dt > 0:
                blocks[b] += used * dt
                load[b] += size * dt

    def _double(self) -> None:
        """Merge neighbouring bins: the width doubles, the series halves."""
        for series in (*self._blocks.values(), *self._load.values()):
            merged = [sum(series[i:i + 2]) for i in range(0, len(series), 2)]
            series[:] = merged
        self.width *= 2

    def result(self, engines: Sequence) -> dict:
        self.capacities = [e.capacity for e in engines]
        return {}

    def series(self) -> dict:
        """``{"bin_ms", "origin_ms", "workers": [{"worker", "kv_usage", "load"}]}``: per worker (every
        worker of the fleet, in order; prefill then decode in a P/D fleet), the mean KV usage (share of its pool, 0..1, rounded to 4 digits) and the mean requests in its
        batch (rounded to 0.01) of each bin; bin ``i`` covers ``origin_ms + i x bin_ms`` to the next."""
        n = max((len(s) for s in self._blocks.values()), default=0)
        out = []
        for worker in range(max(len(self.capacities), max(self._blocks, default=-1) + 1)):
            cap = self.capacities[worker] if worker < len(self.capacities) else 0
            blocks = self._blocks.get(worker, [])
            load = self._load.get(worker, [])
            blocks, load = blocks + [0.0] * (n - len(blocks)), load + [0.0] * (n - len(load))
            out.append({"worker": worker,
                        "kv_usage": [round(b / (cap * self.width), 4) if cap else 0.0 for b in blocks],
                        "load": [round(x / self.width, 2) for x in load]})
        return {"bin_ms": self.width, "origin_ms": self.origin or 0.0, "workers": out}
