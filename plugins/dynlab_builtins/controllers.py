"""Built-in controllers (``--controller``), registered through the ``dynlab`` entry-point group: ``none``, ``static``,
``hpa``, ``dynamo-load`` (:mod:`dynlab_builtins.dynamo_planner`) and ``dynamo-throughput``
(:mod:`dynlab_builtins.dynamo_throughput`; docs/autoscaling.md: each one's algorithm and source).

In a P/D fleet (``--split P:D``, :mod:`dynlab.disagg.elastic`) a controller scales the decode pool, and the prefill
pool too when given ``prefill_min=`` or ``prefill_max=`` (else it keeps ``--split``'s ``P`` workers): ``static`` keeps
both pools; ``hpa`` applies its rule to each scaling pool on its own (its own stabilisation history and scale-up
policy; decode ``queue``: requests waiting in a decode worker's engine, received and not admitted, or waiting for a
reservation; prefill ``queue``: requests waiting in a prefill worker's engine; ``running``; ``kv``) within
``decode_min`` / ``decode_max`` and ``prefill_min`` / ``prefill_max``; ``dynamo-load`` follows Dynamo's decode and
prefill planners (:mod:`dynlab_builtins.dynamo_planner`); ``dynamo-throughput`` sizes each
scaling pool by Dynamo's prefill and decode formulas (:mod:`dynlab_builtins.dynamo_pd_capacity`)."""
from __future__ import annotations

import math

from dynlab import hookimpl
from dynlab.engine.autoscale import Autoscaler, ceil_ratio
from dynlab.engine.controller import LIVE, STARTING, Controller, NoController
from dynlab_builtins.dynamo_planner import DynamoLoad
from dynlab_builtins.dynamo_throughput import DynamoThroughput

#: HPA's metrics: a worker's figure of :class:`dynlab.engine.controller.WorkerState`
METRICS = {"queue": lambda w: w.waiting, "running": lambda w: w.running, "kv": lambda w: w.kv_usage}


class Static(Controller):
    """Keep the fleet at --workers for the whole run, the scaling keys (gpu_hours, ...) in its result.

    A controller that never decides: the baseline to compare an autoscaler's result with."""

    name = "static"

    def decide(self, state):
        return ()


class Hpa(Autoscaler):
    """Kubernetes' Horizontal Pod Autoscaler on a worker metric: queue, running or kv (docs/autoscaling.md).

    desired = ceil(current x metric / target) outside a tolerance, a scale-down stabilisation window, a scale-up
    rate policy.

    The rule is kube-controller-manager's (``pkg/controller/podautoscaler``: ``replica_calculator.go``,
    ``horizontal.go``), as the Kubernetes documentation "Horizontal Pod Autoscaling" states it:

    - ``metric`` (``queue``: requests waiting in a worker's engine, the default; ``running``: in its batch; ``kv``:
      its KV usage, 0 to 1) averaged over the live workers, against ``target`` (required; an ``AverageValue``
      target): ``ratio = mean / target``; within ``tolerance`` (default 0.1, ``--horizontal-pod-autoscaler-
      tolerance``) of 1 nothing changes, else ``desired = ceil(live x ratio)``;
    - workers still starting (not ready pods) are counted at 0 when scaling up and at ``target`` when scaling down:
      ``ratio' = (sum + starting x (0 or target)) / (replicas x target)``; if ``ratio'`` is within the tolerance or
      turns the direction round, nothing changes, else ``desired = ceil(replicas x ratio')``;
    - stabilisation: the recommendation is the highest ``desired`` of the last ``down_window`` s (default 300,
      ``behavior.scaleDown.stabilizationWindowSeconds``) when it would go down, the lowest of the last
      ``up_window`` s (default 0) when it would go up;
    - scale-up policy (``behavior.scaleUp.policies``, default: the larger of ``up_pods`` = 4 pods and ``up_percent``
      = 100 % per ``up_policy_s`` = 15 s): at most ``max(start + up_pods, ceil(start x (1 + up_percent / 100)))``
      replicas, ``start`` being the replicas before the adds of the last ``up_policy_s``; scale-down's default
      policy (100 % per 15 s) limits nothing beyond ``min``;
    - then ``min`` (default 1) and ``max`` (required, as ``maxReplicas`` is); ``period`` defaults to 15 s
      (``--horizontal-pod-autoscaler-sync-period``). Metrics are read at the call, without a scrape delay.
    """

    name = "hpa"
    need_max = True
    default_period_s = 15.0

    def __init__(self, opts, spec=""):
        super().__init__(opts, spec)
        self.metric = METRICS[self.choice("metric", tuple(METRICS), "queue")]
        self.target = self.number("target", None, minimum=1e-9)
        if self.target is None:
            raise ValueError(f"controller {self.spec!r}: target=X (the metric's value per worker to hold) is required")
        self.tolerance = self.number("tolerance", 0.1)
        self.down_window_s = self.number("down_window", 300.0)
        self.up_window_s = self.number("up_window", 0.0)
        self.up_pods = self.number("up_pods", 4, integer=True)
        self.up_percent = self.number("up_percent", 100.0)
        self.up_policy_s = self.number("up_policy_s", 15.0)
        self.history: list = []  # (s, desired) of every call: the stabilisation windows'
        self.adds: list = []  # (s, count) of the adds made: the scale-up policy's
        self.books: dict = {}  # pool -> (history, adds)

    def raw(self, live, starting: int) -> int:
        """The metric's desired replicas (the replica calculator), before stabilisation and limits."""
        current = len(live) + starting
        total = sum(self.metric(w) for w in live)
        ratio = total / (len(live) * self.target)
        if abs(ratio - 1.0) <= self.tolerance + 1e-9:  # 1e-9: 11 / 10 - 1 is a hair above 0.1 in floats
            return current
        if not starting:
            return ceil_ratio(len(live), ratio)
        unready = 0.0 if ratio > 1.0 else self.target  # not-ready pods: 0 scaling up, the target scaling down
        ratio2 = (total + starting * unready) / (current * self.target)
        if abs(ratio2 - 1.0) <= self.tolerance + 1e-9 or (ratio2 > 1.0) != (ratio > 1.0):
            return current
        return ceil_ratio(current, ratio2)

    def desired(self, state, current: int, raw: int) -> int:
        """``raw`` stabilised, rate-limited and bounded (horizontal.go's ``normalizeDesiredReplicasWithBehaviors``)."""
        now = state.now_s
        self.history.append((now, raw))
        keep = max(self.down_window_s, self.up_window_s)
        self.history = [(t, r) for t, r in self.history if t > now - keep + 1e-9 or t == now]
        up = min(r for t, r in self.history if t > now - self.up_window_s + 1e-9 or t == now)
        down = max(r for t, r in self.history if t > now - self.down_window_s + 1e-9 or t == now)
        n = min(max(current, up), down)
        if n > current:
            start = current - sum(k for t, k in self.adds if t > now - self.up_policy_s + 1e-9)
            limit = max(start + self.up_pods, int(math.ceil(start * (1.0 + self.up_percent / 100.0) - 1e-9)))
            n = min(n, limit)
        return self.bounded(n, state.pool)

    def decide(self, state):
        """:meth:`decide_pool` with ``state.pool``'s own history and adds (a P/D fleet's pools scale apart)."""
        self.history, self.adds = self.books.get(state.pool, ([], []))
        out = self.decide_pool(state)
        self.books[state.pool] = (self.history, self.adds)
        return out

    def decide_pool(self, state):
        live = [w for w in state.workers if w.state == LIVE]
        starting = sum(1 for w in state.workers if w.state == STARTING)
        if not live:
            return ()
        current = len(live) + starting
        n = self.desired(state, current, self.raw(live, starting))
        if n > current:
            self.adds.append((state.now_s, n - current))
        return self.scale_to(state, n)


@hookimpl
def dynlab_register_controllers(register):
    register(NoController)
    register(Static)
    register(Hpa)
    register(DynamoLoad)
    register(DynamoThroughput)
