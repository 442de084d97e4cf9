"""``dynamo-load``: NVIDIA Dynamo Planner's load-based scaling of an aggregated fleet (its ``sla`` target, ``agg``
mode), as its design document (``docs/design-docs/planner-design.md``, "Load-Based Scaling") and its source
(``components/src/dynamo/planner/core/load_scaling.py``: ``_advance_load_agg``, ``_agg_prefill_scaling``,
``_agg_decode_scaling``, ``_scale_decision``; ``perf_model/agg.py``; ``config`` defaults) define it.

Every ``period`` (default 5 s, ``load_adjustment_interval_seconds``):

1. Observe (:mod:`dynlab_builtins.dynamo_fpm`): one ForwardPassMetrics per live worker, its latest iteration or an
   idle heartbeat (``fpm=latest``, Dynamo's; ``fpm=every`` takes every iteration of the period), into moving
   averages (``avg_isl``, ``avg_decode_len``, prompt tokens per step) and the regression ``ms = a + b x prefill_tokens
   + c x kv_tokens`` over at most ``samples`` (64, ``max_num_fpm_samples``) points; no decision before
   ``min_observations`` (5) points, nor on a fit with a negative load coefficient.
2. Per live worker: the next TTFT, simulating chunked prefill of its queued prompt tokens plus one ``avg_isl``, in
   chunks of ``max_num_batched_tokens`` each costing ``predict(chunk, kv_tokens)``; the next ITL,
   ``predict(avg prompt tokens per step, kv_tokens + avg_decode_len)``.
3. Up by 1 when EVERY worker's TTFT is above ``ttft`` (ms, default 500) or every worker's ITL above ``itl`` (ms,
   default 50): ``_scale_decision``, whatever the worker's load (an empty worker's estimate still carries one
   ``avg_isl`` and the average step). Down by 1 only when both sides allow it: for every worker, the TTFT re-predicted
   with its queue and KV scaled by ``N / (N - 1)`` (the survivors absorbing a retired worker's load) keeps its
   queue-induced part (that TTFT minus the same with no queue) below ``(ttft - own) x sensitivity`` (80 %,
   ``load_scaling_down_sensitivity``); and its KV plus queued prompt tokens scaled by ``N / (N - 1)`` fits its pool
   with the ITL there below ``itl x sensitivity``. dynlab adds one thing to Dynamo's decode check: the survivor's
   steps carry ``N / (N - 1)`` times the prompt tokens per step (it takes the retired worker's arrivals too; Dynamo
   keeps the current average), which kept the step workload of docs/autoscaling.md from flapping 1 <-> 2.
4. No decision while a worker is starting (``scaling in progress``); ``min`` / ``max`` bound the count.

In a P/D fleet (``--split P:D``; :mod:`dynlab.disagg.elastic`: the decode pool scales, the prefill pool keeps its
workers unless ``prefill_min=`` / ``prefill_max=`` are given, below) the decode pool's call follows Dynamo's decode planner instead (``components/src/dynamo/planner/utils/
decode_planner.py``, ``DecodePlanner.loadbased_plan_adjustment``, and ``utils/load_based_regression.py``,
``LoadBasedRegressionModel.predict_x_from_sla``): the decode workers' iterations fit ``ms = a + c x kv_tokens`` (a line,
least squares over the last ``samples`` decode steps, none before ``min_observations``); the KV load a worker can hold
at the ITL target is ``x = (itl - a) / c``; up by 1 when EVERY live decode worker holds more than ``x`` tokens of KV,
down by 1 when every one holds less than ``x x (N - 1) / N x sensitivity``; nothing when ``c <= 0`` (Dynamo falls back
to a heuristic on its observations there) or ``x <= 0`` (the target is out of reach), nor while a decode worker starts;
``decode_min`` / ``decode_max`` bound the count.

With ``prefill_min=`` or ``prefill_max=`` the P/D prefill pool scales too, by Dynamo's prefill planner
(``components/src/dynamo/planner/utils/prefill_planner.py``, ``PrefillPlanner.loadbased_plan_adjustment``; its
observations as ``planner_core.py`` feeds ``ttft_regression``): each period with first tokens adds one point ``(x, y)``,
``x`` the live prefill workers' mean queued prompt tokens (``active_prefill_tokens``) plus the period's mean prompt
length (``last_isl``), ``y`` the period's mean TTFT (ms); a line ``y = a + c x`` over the last ``samples`` points (none
before ``min_observations``) gives the load ``x_sla = (ttft - a) / c`` meeting the TTFT target, and per worker the
target of queued prompt tokens ``x_sla - avg_isl`` (the last point's prompt length); up by 1 when EVERY live prefill
worker queues more than it, down by 1 when every one queues less than ``target x (N - 1) / N x sensitivity``;
nothing when ``c <= 0``, the target is ``<= 0`` (out of reach at that prompt length), or a prefill worker starts.
Simplified: Dynamo fits one point per prefill worker (its own TTFT); dynlab's :class:`FleetState` gives the fleet's
TTFTs, so one point per period, from the pool's means.

The P/D decode pool's fit is simplified: Dynamo buckets its samples (``fpm_sample_bucket_size``) before fitting; dynlab
fits the last samples as they are.

Simplified: dynlab's ``kv_tokens`` are the KV all requests hold (Dynamo's ``sum_decode_kv_tokens``: decode
requests') and no KV hit-rate discount is applied to the queued tokens (every queued token is computed).
"""
from __future__ import annotations

import math
from typing import Optional

from dynlab.engine.autoscale import Autoscaler
from dynlab.engine.controller import LIVE, STARTING
from dynlab_builtins.dynamo_fpm import Fpm, Latest, fit

__all__ = ["DynamoLoad", "fit", "fit_line"]


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


class DynamoLoad(Autoscaler):
    """NVIDIA Dynamo Planner's load-based scaling of an aggregated fleet (docs/autoscaling.md).

    A regression of step time on load from the workers' forward passes, +/-1 worker to keep every worker's estimated
    TTFT and ITL within ttft / itl ms (module docstring)."""

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
        self.every = self.choice("fpm", ("latest", "every"), "latest") == "every"
        self.fpm, self.latest = Fpm(self.samples), Latest()
        self.model: Optional[tuple] = None
        self.window: list = []  # a P/D decode pool's last decode steps (decode_pool)
        self.points: list = []  # a P/D prefill pool's last (load, TTFT ms, prompt length) points (prefill_pool)

    @property
    def avg_isl(self) -> float:
        return self.fpm.avg_isl.value

    @property
    def avg_decode_len(self) -> float:
        return self.fpm.avg_decode_len.value

    @property
    def avg_prefill(self) -> float:
        return self.fpm.avg_prefill.value

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
        """The next ITL (ms) at ``kv`` tokens of KV, the average prompt tokens per step times ``load``."""
        return self.predict(self.avg_prefill * load, kv + self.avg_decode_len)

    def learn(self, state) -> bool:
        """Take the period's forward passes (module docstring, step 1); whether the model is ready."""
        if self.every:
            seen = [s for s in state.steps for _ in range(min(s.steps, self.samples))]
        else:
            seen = self.latest.read(state.now_s, state.steps, [w for w in state.workers if w.state == LIVE])
        for s in seen:
            self.fpm.add(s)
        self.model = self.fpm.model(self.min_observations)
        return self.model is not None

    def prefill_says(self, live, n: int) -> int:
        """The prefill (TTFT) side's count: n + 1, n - 1 or n (module docstring, step 3)."""
        if all(self.est_ttft(w.queued_prefill_tokens, w.kv_tokens, w.max_batched_tokens) > self.ttft for w in live):
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
        if all(self.est_itl(w.kv_tokens) > self.itl for w in live):
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

    def prefill_pool(self, state):
        """A P/D fleet's prefill pool: Dynamo's prefill planner (module docstring)."""
        live = [w for w in state.workers if w.state == LIVE]
        if live and state.arrivals and state.ttft_ms:
            isl = state.prompt_tokens / state.arrivals
            x = sum(w.queued_prefill_tokens for w in live) / len(live) + isl
            self.points = (self.points + [(x, sum(state.ttft_ms) / len(state.ttft_ms), isl)])[-self.samples:]
        if len(self.points) < self.min_observations or any(w.state == STARTING for w in state.workers):
            return ()
        line = fit_line([(x, y) for x, y, _ in self.points])
        n = len(live)
        if line is None or line[1] <= 0 or not n:
            return ()
        target = (self.ttft - line[0]) / line[1] - self.points[-1][2]
        if target <= 0:
            return ()
        if all(w.queued_prefill_tokens > target for w in live):
            return self.scale_to(state, self.bounded(n + 1, "prefill"))
        if n > 1 and all(w.queued_prefill_tokens < target * (n - 1) / n * self.sensitivity for w in live):
            return self.scale_to(state, self.bounded(n - 1, "prefill"))
        return ()

    def decide(self, state):
        if state.pool == "decode":
            return self.decode_pool(state)
        if state.pool == "prefill":
            return self.prefill_pool(state)
        ready = self.learn(state)
        if any(w.state == STARTING for w in state.workers) or not ready:
            return ()
        live = [w for w in state.workers if w.state == LIVE]
        n = len(live)
        if not n:
            return ()
        p, d = self.prefill_says(live, n), self.decode_says(live, n)
        if p > n or d > n:
            want = n + 1
        elif p < n and d < n:
            want = n - 1
        else:
            return ()
        return self.scale_to(state, self.bounded(want))
