"""``dynamo-load``: NVIDIA Dynamo Planner's load-based scaling of an aggregated fleet (its ``sla`` target, ``agg``
mode), as its design document (``docs/design-docs/planner-design.md``, "Load-Based Scaling") and its source
(``components/src/dynamo/planner/core/load_scaling.py``, ``perf_model/agg.py``, ``config`` defaults) define it.

Every ``period`` (default 5 s, ``load_adjustment_interval_seconds``):

1. Regression: the step time (ms) fitted by least squares to ``a + b x prefill_tokens + c x kv_tokens`` over the last
   ``samples`` (64, ``max_num_fpm_samples``) engine iterations of every worker (their ForwardPassMetrics); no decision
   before ``min_observations`` (5). Running averages over the same samples: the prompt tokens per prefill request
   (``avg_isl``), the KV tokens per decode request (``avg_decode_len``), the prompt tokens per step.
2. Per live worker: the next TTFT, simulating chunked prefill of its queued prompt tokens plus one ``avg_isl``, in
   chunks of ``max_num_batched_tokens`` each costing ``predict(chunk, kv_tokens)``; the next ITL,
   ``predict(avg prompt tokens per step, kv_tokens + avg_decode_len)``.
3. Prefill: up by 1 when EVERY worker has prompt tokens queued and its TTFT is above ``ttft`` (ms, default 500); down
   by 1 when, for every worker, the TTFT re-predicted with its queue and KV scaled by ``N / (N - 1)`` (the survivors
   absorbing a retired worker's load) keeps its queue-induced part (that TTFT minus the same with no queue) below
   ``(ttft - own) x sensitivity`` (80 %, ``load_scaling_down_sensitivity``). Decode: up when every worker holds KV and
   its ITL is above ``itl`` (ms, default 50); down when, for every worker, its KV plus queued prompt tokens scaled by
   ``N / (N - 1)`` fits its pool and the ITL there is below ``itl x sensitivity``, the survivor's steps carrying
   ``N / (N - 1)`` times the prompt tokens (it takes the retired worker's arrivals too).
   A side whose target is out of reach with no load at all (an empty worker's estimate above it) decides nothing.
   ``agg_planner.py`` (``_prefill_scaling_decision``, ``_decode_scaling_decision``) compares each worker's active
   prefill tokens and decode blocks with the load the regression gives at the SLA: a worker with none is never above
   it, so an idle fleet is never scaled up, and a target at or below zero load skips the decision. Aggregated: up if
   either says up; down only if both say down (to the larger of the two).
4. No decision while a worker is starting (``scaling in progress``); ``min`` / ``max`` bound the count.

In a P/D fleet (``--split P:D``; :mod:`dynlab.disagg.elastic`: the decode pool scales, the prefill pool keeps its
workers, for now) the call follows Dynamo's decode planner instead (``components/src/dynamo/planner/utils/
decode_planner.py``, ``DecodePlanner.loadbased_plan_adjustment``, and ``utils/load_based_regression.py``,
``LoadBasedRegressionModel.predict_x_from_sla``): the decode workers' iterations fit ``ms = a + c x kv_tokens`` (a line,
least squares over the last ``samples`` decode steps, none before ``min_observations``); the KV load a worker can hold
at the ITL target is ``x = (itl - a) / c``; up by 1 when EVERY live decode worker holds more than ``x`` tokens of KV,
down by 1 when every one holds less than ``x x (N - 1) / N x sensitivity``; nothing when ``c <= 0`` (Dynamo falls back
to a heuristic on its observations there) or ``x <= 0`` (the target is out of reach), nor while a decode worker starts;
``decode_min`` / ``decode_max`` bound the count.

Simplified: Dynamo buckets its samples (``fpm_sample_bucket_size``) before fitting and reads the KV of decode requests
(``sum_decode_kv_tokens``); dynlab fits the last samples as they are and uses the KV all requests hold. The KV hit-rate
discount of the TTFT estimate is left out (no hit rate is applied: every queued token is computed).
"""
from __future__ import annotations

import math
from typing import Optional

from dynlab.engine.autoscale import Autoscaler
from dynlab.engine.controller import LIVE, STARTING


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


def fit_line(points) -> Optional[tuple]:
    """``(a, c)`` of ``y = a + c x`` by least squares over ``points`` (``(x, y)`` pairs); ``None`` when every ``x`` is
    the same (no slope to fit)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        return None
    c = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - c * mx, c


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


class DynamoLoad(Autoscaler):
    """NVIDIA Dynamo Planner's load-based scaling of an aggregated fleet (docs/autoscaling.md).

    A per-interval regression of step time on load, +/-1 worker to keep every worker's estimated TTFT and ITL within
    ttft / itl ms (module docstring)."""

    name = "dynamo-load"
    default_period_s = 5.0

    def __init__(self, opts, spec=""):
        super().__init__(opts, spec)
        self.ttft = self.number("ttft", 500.0, minimum=1e-9)
        self.itl = self.number("itl", 50.0, minimum=1e-9)
        self.sensitivity = self.number("sensitivity", 80.0) / 100.0
        if not self.sensitivity <= 1.0:  # a share of the target, in %: over 100 would scale down past it
            raise ValueError(f"controller {self.spec!r}: sensitivity is a percentage of the targets, 0 to 100")
        self.samples = self.number("samples", 64, minimum=1, integer=True)
        self.min_observations = self.number("min_observations", 5, minimum=1, integer=True)
        self.window: list = []
        self.model: Optional[tuple] = None

    def predict(self, prefill: float, kv: float) -> float:
        a, b, c = self.model
        return max(a + b * prefill + c * kv, 1e-6)

    def est_ttft(self, queued: float, kv: float, budget: int) -> float:
        total = queued + self.avg_isl
        out, left = 0.0, total
        for _ in range(math.ceil(total / budget) if total > 0 else 0):
            chunk = min(left, budget)
            out += self.predict(chunk, kv)
            left -= chunk
        return out

    def est_itl(self, kv: float, load: float = 1.0) -> float:
        """The next ITL (ms) at ``kv`` tokens of KV, the window's prompt tokens per step times ``load``."""
        return self.predict(self.avg_prefill * load, kv + self.avg_decode_len)

    def learn(self, state) -> bool:
        """Take the period's step samples; whether the model is ready."""
        self.window = (self.window + list(state.steps))[-self.samples:]
        if len(self.window) < self.min_observations:
            return False
        self.model = fit(self.window)
        w = self.window
        self.avg_isl = _mean(s.prefill_tokens / s.prefill_requests for s in w if s.prefill_requests)
        self.avg_decode_len = _mean(s.kv_tokens / s.decode_requests for s in w if s.decode_requests)
        self.avg_prefill = _mean(s.prefill_tokens for s in w)
        return self.model is not None

    def prefill_says(self, live, n: int) -> int:
        """The prefill (TTFT) side's count: n + 1, n - 1 or n (module docstring, step 3)."""
        if self.est_ttft(0, 0, min(w.max_batched_tokens for w in live)) > self.ttft:
            return n  # the target is out of reach even with no queue: no decision (agg_planner's target <= 0)
        if all(w.queued_prefill_tokens > 0 and self.est_ttft(w.queued_prefill_tokens, w.kv_tokens,
                                                             w.max_batched_tokens) > self.ttft for w in live):
            return n + 1
        if n < 2:
            return n
        c = n / (n - 1)
        for w in live:
            own = self.est_ttft(0, w.kv_tokens * c, w.max_batched_tokens)
            post = self.est_ttft(w.queued_prefill_tokens * c, w.kv_tokens * c, w.max_batched_tokens)
            budget = (self.ttft - own) * self.sensitivity
            if budget <= 0 or post - own >= budget:
                return n
        return n - 1

    def decode_says(self, live, n: int) -> int:
        """The decode (ITL) side's count: n + 1, n - 1 or n (module docstring, step 3)."""
        if self.est_itl(0) > self.itl:
            return n  # the target is out of reach even with no KV: no decision (agg_planner's x_sla <= 0)
        if all(w.kv_tokens > 0 and self.est_itl(w.kv_tokens) > self.itl for w in live):
            return n + 1
        if n < 2:
            return n
        c = n / (n - 1)
        for w in live:
            post = (w.kv_tokens + w.queued_prefill_tokens) * c
            if post >= w.kv_capacity_tokens or self.est_itl(post, c) >= self.itl * self.sensitivity:
                return n
        return n - 1

    def decode_pool(self, state):
        """A P/D fleet's decode pool: Dynamo's decode planner (module docstring)."""
        self.window = (self.window + list(state.steps))[-self.samples:]
        if len(self.window) < self.min_observations or any(w.state == STARTING for w in state.workers):
            return ()
        line = fit_line([(s.kv_tokens, s.ms) for s in self.window])
        if line is None or line[1] <= 0:
            return ()
        x_sla = (self.itl - line[0]) / line[1]
        live = [w for w in state.workers if w.state == LIVE]
        n = len(live)
        if x_sla <= 0 or not n:
            return ()
        if all(w.kv_tokens > x_sla for w in live):
            return self.scale_to(state, self.bounded(n + 1))
        if n > 1 and all(w.kv_tokens < x_sla * (n - 1) / n * self.sensitivity for w in live):
            return self.scale_to(state, self.bounded(n - 1))
        return ()

    def decide(self, state):
        if state.pool == "decode":
            return self.decode_pool(state)
        ready = self.learn(state)
        if any(w.state == STARTING for w in state.workers) or not ready:
            return ()
        live = [w for w in state.workers if w.state == LIVE]
        n = len(live)
        p, d = self.prefill_says(live, n), self.decode_says(live, n)
        if p > n or d > n:
            want = n + 1
        elif p < n and d < n:
            want = n - 1
        else:
            return ()
        return self.scale_to(state, self.bounded(want))
