"""What ``dynamo-load`` learns from its workers' forward passes: NVIDIA Dynamo Planner's FPM regression of an
aggregated engine (``components/src/dynamo/planner/core/perf_model/agg.py``, ``AggRegressionModel``, on
``perf_model/base.py``'s ``_BaseRegressionModel`` and ``_MovingAverage``).

Which passes it sees (``fpm``):

- ``latest`` (the default, Dynamo's): at each call, one ForwardPassMetrics per live worker, its LATEST iteration.
  Dynamo's planner reads ``FpmEventSubscriber.get_recent_stats()``, which keeps only the last message of each
  (worker, dp rank); an engine gone idle last published an idle heartbeat (every field 0, ``wall_time`` 0). dynlab:
  :class:`Latest` (a decode run in progress read as a decode step, an idle worker as a heartbeat).
- ``every``: every iteration of the period, as Dynamo's offline replay feeds its regression
  (``components/src/dynamo/planner/offline/replay_adapter.py``, ``_feed_extra_fpm_to_regression``: every snapshot
  of the interval, the last per worker through the live path). A bulk run of decode steps counts as its ``steps``
  iterations (at most ``samples``). dynlab read every :class:`~dynlab.engine.controller.StepSample` once before
  issue 41's diagnosis, a bulk run as ONE sample: the per-sample mean of prompt tokens per step then counted a second
  of decode steps as one step beside each prefill step and overstated the prompt tokens of an average step.

Each sample feeds (``add``):

- moving averages over the last ``samples`` values each (64, ``max_num_fpm_samples``), leading zeros skipped:
  ``avg_isl`` (prompt tokens / prefill requests, of samples with a prefill request), ``avg_decode_len`` (KV tokens /
  decode requests, of samples with a decode request), ``avg_prefill`` (prompt tokens per step, of every sample: a
  heartbeat adds 0);
- the regression's store, unless its wall time is 0 (a heartbeat): at most ``samples`` points ``(prompt tokens, KV
  tokens) -> ms``; past that the oldest point of the fullest cell of a 4 x 4 grid over the points' range is retired
  (Dynamo's ``fpm_sample_bucket_size`` 16: keeps points over the whole operating range; among equally full cells
  dynlab takes the one holding the oldest point, Dynamo the one its dict met first).

:meth:`Fpm.model` fits ``ms = a + b x prompt tokens + c x KV tokens`` by least squares; a fit with a negative ``b``
or ``c`` (more load, less time) is rejected and the planner decides nothing (``_BaseRegressionModel._fit``).
"""
from __future__ import annotations

from collections import deque
from typing import Optional

from dynlab.engine.controller import StepSample

#: cells per axis of the retirement grid: Dynamo's fpm_sample_bucket_size (16) as sqrt(16) x sqrt(16)
GRID = 4


def fit(samples) -> Optional[tuple]:
    """``(a, b, c)`` of ``ms = a + b x prefill_tokens + c x kv_tokens`` by least squares over ``samples``
    (:class:`~dynlab.engine.controller.StepSample`), a tiny ridge (1e-9) keeping a degenerate sample set solvable."""
    rows = [(1.0, float(s.prefill_tokens), float(s.kv_tokens), s.ms) for s in samples]
    a = [[sum(r[i] * r[j] for r in rows) + (1e-9 if i == j and i else 0.0) for j in range(3)] for i in range(3)]
    y = [sum(r[i] * r[3] for r in rows) for i in range(3)]
    for col in range(3):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, 3), key=lambda k: abs(a[k][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot], y[col], y[pivot] = a[pivot], a[col], y[pivot], y[col]
        for k in range(col + 1, 3):
            f = a[k][col] / a[col][col]
            a[k] = [a[k][j] - f * a[col][j] for j in range(3)]
            y[k] -= f * y[col]
    out = [0.0, 0.0, 0.0]
    for i in (2, 1, 0):
        out[i] = (y[i] - sum(a[i][j] * out[j] for j in range(i + 1, 3))) / a[i][i]
    return tuple(out)


class Average:
    """The mean of the last ``size`` values added, zeros before the first non-zero value skipped (Dynamo's
    ``_MovingAverage``); 0 before any."""

    def __init__(self, size: int):
        self.values: deque = deque(maxlen=size)

    def add(self, value: float) -> None:
        if value or self.values:
            self.values.append(value)

    @property
    def value(self) -> float:
        return sum(self.values) / len(self.values) if self.values else 0.0


class Latest:
    """Each worker's latest forward pass at a call, as ``FpmEventSubscriber.get_recent_stats()`` returns it.

    dynlab's engine reports a bulk run of decode steps when the run ends, so at a call the run in progress is not
    among the period's samples although its first steps may be done. A worker running requests with no prompt token
    to compute is in a decode run that started when its last reported iteration ended (``end_s``): once one decode
    step (its last decode-only iteration's ``ms``) has passed since, its latest pass is a decode step, read as that
    last decode-only iteration; before, and for a worker with prompt tokens to compute (a prefill step in progress),
    the last iteration reported. An idle worker (nothing running nor waiting) reads as a heartbeat, all zeros
    (Dynamo's engines publish one when they go idle), and so does a worker that never ran a step."""

    def __init__(self):
        self.last: dict = {}  # worker -> its last StepSample
        self.last_decode: dict = {}  # worker -> its last StepSample with no prompt token and a decode

    def read(self, now_s: float, steps, live) -> list:
        """One sample per worker of ``live`` (:class:`~dynlab.engine.controller.WorkerState`) at ``now_s`` after
        the period's ``steps`` (in the order they ended)."""
        for s in steps:
            self.last[s.worker] = s
            if not s.prefill_tokens and s.decode_requests:
                self.last_decode[s.worker] = s
        return [self.one(now_s, w) for w in live]

    def one(self, now_s: float, w):
        """Worker ``w``'s latest pass at ``now_s`` (class docstring)."""
        last = self.last.get(w.id)
        if last is None or (not w.running and not w.waiting):
            return StepSample(w.id, 0, 0, 0, 0, 0.0, now_s)
        dec = self.last_decode.get(w.id)
        if dec is not None and w.running and not w.queued_prefill_tokens and now_s - last.end_s >= dec.ms / 1000.0:
            return dec
        return last


class Fpm:
    """The regression's store and moving averages (module docstring); ``size``: ``samples``."""

    def __init__(self, size: int):
        self.size = size
        self.points: list = []  # StepSample with ms > 0, oldest first
        self.avg_isl, self.avg_decode_len, self.avg_prefill = Average(size), Average(size), Average(size)

    def add(self, s) -> None:
        """Take one sample (:class:`~dynlab.engine.controller.StepSample`)."""
        if s.prefill_requests:
            self.avg_isl.add(s.prefill_tokens / s.prefill_requests)
        if s.decode_requests:
            self.avg_decode_len.add(s.kv_tokens / s.decode_requests)
        self.avg_prefill.add(float(s.prefill_tokens))
        if s.ms <= 0:
            return
        self.points.append(s)
        if len(self.points) > self.size:
            self.retire()

    def retire(self) -> None:
        """Drop the oldest point of the grid's fullest cell (ties: the cell holding the oldest point)."""
        lo = [min(p.prefill_tokens for p in self.points), min(p.kv_tokens for p in self.points)]
        hi = [max(p.prefill_tokens for p in self.points), max(p.kv_tokens for p in self.points)]

        def cell(p) -> tuple:
            key = []
            for i, v in enumerate((p.prefill_tokens, p.kv_tokens)):
                k = int((v - lo[i]) / (hi[i] - lo[i]) * GRID) if hi[i] > lo[i] else 0
                key.append(min(max(k, 0), GRID - 1))
            return tuple(key)

        cells = [cell(p) for p in self.points]
        counts: dict = {}
        for c in cells:  # insertion order: a cell first met holds an older point
            counts[c] = counts.get(c, 0) + 1
        fullest = max(counts, key=lambda c: counts[c])
        del self.points[cells.index(fullest)]

    def model(self, min_points: int) -> Optional[tuple]:
        """The fit ``(a, b, c)`` over the stored points; ``None`` with fewer than ``min_points``, a degenerate set
        or a negative load coefficient."""
        if len(self.points) < min_points:
            return None
        got = fit(self.points)
        if got is None or got[1] < 0 or got[2] < 0:
            return None
        return got
