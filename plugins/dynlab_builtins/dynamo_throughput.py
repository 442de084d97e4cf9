"""``dynamo-throughput``: NVIDIA Dynamo Planner's throughput-based scaling (its predictive, profile-driven mode),
adapted to one aggregated pool and to a P/D fleet's pools. Sources: Dynamo's
``docs/design-docs/planner-design.md`` ("Throughput-Based Scaling", steps 1-5),
``components/src/dynamo/planner/utils/planner_core.py`` (the replica formulas, ``_apply_component_gpu_budget``),
``utils/load_predictor.py`` (the predictors) and ``defaults.py`` (``SLAPlannerDefaults``: ``adjustment_interval``
180 s, ``max_gpu_budget`` 8, ``min_endpoint`` 1, ``ttft`` 500 ms, ``itl`` 50 ms).

Every ``period`` (default 180 s):

1. Observe the interval: requests arrived, the mean prompt tokens of the arrivals (ISL) and the mean output tokens of
   the requests finished in it (OSL), as Dynamo's Prometheus queries of the frontend do.
2. Predict the next interval's three figures with ``predictor``: ``constant`` (the last value, Dynamo's
   ``ConstantPredictor`` and its warm-up fallback), ``average`` (the mean of the last ``window`` values, dynlab's) or
   ``arima`` (statsmodels' ARIMA, the order of the lowest AIC among a few small ones: Dynamo's default predictor uses
   pmdarima's auto-ARIMA; the optional extra ``dynlab[arima]``). ARIMA falls back to the last value before
   ``min_points`` (5) intervals, as Dynamo's predictors do during warm-up.
3. A worker's capacity at the targets, replayed (:func:`capacity`): one worker of the run's own engine, model, GPU and
   latency model (the one ``--latency-profile`` calibrated, when given) serves ``replay_requests`` (200) requests of
   the predicted ISL and OSL (two significant digits, cached) at a Poisson rate; the highest rate whose mean TTFT and
   TPOT stay within ``ttft`` and ``itl`` (ms) is a worker's requests/s. Dynamo reads the same figure from its
   pre-deployment profile (the interpolators' ``find_best_throughput_per_gpu``).
4. Replicas. Dynamo sizes separate pools: ``ceil(rate x ISL / prefill throughput)`` and ``ceil(rate x OSL / decode
   throughput at the ITL target)``. One aggregated worker does both, so its replayed request rate stands for the pair:
   ``replicas = ceil(predicted requests/s / a worker's requests/s)``.
5. Bounds: ``min`` (1), ``max``, and ``gpu_budget`` (GPUs, default 8: at most ``floor(gpu_budget / GPUs per
   worker)`` workers, ``_apply_component_gpu_budget``); then the fleet goes to that count at once (adds ready after
   the cold start, retires newest first). Scaling is not blocking (Dynamo's default): a call while workers start
   still decides, counting them.

In a P/D fleet (``--split P:D``) each call sizes the pool it is called for (the decode pool; the prefill pool too with
``prefill_min=`` / ``prefill_max=``) by Dynamo's two formulas (``planner_core.py``, the prefill and decode planners'
``_compute_replica_requirements``): prefill workers ``ceil(rate x ISL / a prefill worker's prompt tokens per ms)``,
decode workers ``ceil(rate x OSL / a decode worker's output tokens per ms within itl)``, the capacities computed from
the run's step model (:mod:`dynlab_builtins.dynamo_pd_capacity`, Dynamo's ``perf_interpolation.py`` interpolators'
figures), not replayed; the period is observed once (on the first pool's call); ``gpu_budget`` bounds each pool apart
(Dynamo's ``_apply_global_gpu_budget`` shares one budget: simplified).

Left out: Dynamo's correction factors (observed TTFT and ITL over the profile's: ``--no-correction``'s behaviour), its
Kalman and Prophet predictors, and warm-starting from a trace (in a simulation the profile is the run's own engine, so
a correction factor would measure only the load's effects). An interval without arrivals predicts (with ``constant``)
no load: the fleet goes to ``min``.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from dataclasses import replace
from typing import Optional

from dynlab.engine.autoscale import Autoscaler
from dynlab.engine.config import SimConfig
from dynlab.engine.sections import SECTIONS
from dynlab_builtins.dynamo_pd_capacity import decode_tokens_per_ms, prefill_tokens_per_ms

#: the few ARIMA orders (p, d, q) tried, the lowest AIC kept (a small stand-in for pmdarima's stepwise search)
ARIMA_ORDERS = ((1, 0, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1))


def replay(config, rate: float, isl: int, osl: int, requests: int) -> tuple:
    """``(mean TTFT ms, mean TPOT ms)`` of one worker of ``config`` (the run's engine, model, GPU and latency model;
    its own traffic, fleet and SLO left at their defaults) serving ``requests`` requests of ``isl`` prompt and ``osl``
    output tokens arriving as a Poisson process at ``rate`` requests/s (seed 1): the client's figures, every overhead
    of the run included."""
    from dynlab.sim import run

    spec = {"seed": 1, "requests": requests, "arrival": {"process": "poisson", "rate": rate},
            "input": {"dist": "constant", "value": isl}, "output": {"dist": "constant", "value": osl}}
    fresh = SimConfig()
    keep = {f: getattr(fresh, f) for f in (*SECTIONS["traffic"], *SECTIONS["fleet"], *SECTIONS["slo"])}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "replay.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        out = run(replace(config, **{**keep, "workload": path, "workers": 1, "timing": True}))
    return out["ttft_ms"]["mean"], out["tpot_ms"]["mean"]


def capacity(config, isl: int, osl: int, ttft: float, itl: float, requests: int) -> float:
    """Requests/s one worker serves with a mean TTFT within ``ttft`` ms and a mean TPOT within ``itl`` ms (:func:`replay`
    at doubling rates from 1/s until one misses, then 6 bisections; the highest rate that met both, at least 1/64 s):
    the pre-deployment profile's throughput at the SLA (Dynamo's ``find_best_throughput_per_gpu``) measured on the run's
    own engine instead of a GPU."""
    ok = lambda r: all(v <= lim for v, lim in zip(replay(config, r, isl, osl, requests), (ttft, itl)))  # noqa: E731
    lo, hi = 0.0, 1.0
    while ok(hi) and hi < 4096:
        lo, hi = hi, hi * 2.0
    for _ in range(6):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return max(lo, 1.0 / 64.0)


def two_digits(x: float) -> int:
    """``x`` rounded to two significant digits (the replay cache's key: 1,013 -> 1,000)."""
    x = max(int(round(x)), 1)
    scale = 10 ** max(len(str(x)) - 2, 0)
    return int(round(x / scale)) * scale


class Predictor:
    """The next value of one series: ``constant``, ``average`` over ``window`` values, or ``arima``."""

    def __init__(self, kind: str, window: int, min_points: int):
        self.kind, self.window, self.min_points = kind, window, min_points
        self.values: list = []

    def add(self, value: float) -> None:
        self.values.append(float(value))

    def next(self) -> float:
        v = self.values
        if self.kind == "average":
            tail = v[-self.window:]
            return sum(tail) / len(tail)
        if self.kind == "arima" and len(v) >= self.min_points:
            return max(arima_next(v), 0.0)
        return v[-1]


def arima_next(values) -> float:
    """One step ahead of ``values`` by statsmodels' ARIMA, the order of :data:`ARIMA_ORDERS` with the lowest AIC;
    the last value when no order fits (a constant series)."""
    from statsmodels.tsa.arima.model import ARIMA

    best: Optional[tuple] = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for order in ARIMA_ORDERS:
            try:
                fit = ARIMA(values, order=order).fit()
            except Exception:  # noqa: BLE001 - a degenerate series fails in several ways inside statsmodels
                continue
            if math.isfinite(fit.aic) and (best is None or fit.aic < best[0]):
                best = (fit.aic, float(fit.forecast(1)[0]))
    return values[-1] if best is None or not math.isfinite(best[1]) else best[1]


class DynamoThroughput(Autoscaler):
    """NVIDIA Dynamo Planner's throughput-based scaling on one aggregated pool or a P/D fleet's pools
    (docs/autoscaling.md).

    Predicted requests per interval x a worker's time per request (from the run's latency model, the calibrated one
    with --latency-profile) = the replicas; bounded by min, max and a GPU budget (module docstring)."""

    name = "dynamo-throughput"
    default_period_s = 180.0

    def __init__(self, opts, spec=""):
        super().__init__(opts, spec)
        self.itl = self.number("itl", 50.0, minimum=1e-9)
        kind = self.choice("predictor", ("constant", "average", "arima"), "constant")
        window = self.number("window", 3, minimum=1, integer=True)
        points = self.number("min_points", 5, minimum=2, integer=True)
        budget = self.number("gpu_budget", 8, minimum=1, integer=True)
        self.gpu_budget = budget
        self.ttft = self.number("ttft", 500.0, minimum=1e-9)
        self.requests = self.number("replay_requests", 200, minimum=10, integer=True, maximum=100_000)
        self.cache: dict = {}  # (isl, osl) -> requests/s a worker serves
        if kind == "arima":
            try:
                import statsmodels  # noqa: F401
            except ImportError:
                raise ValueError(f"controller {self.spec!r}: predictor=arima needs statsmodels: "
                                 f"pip install 'dynlab[arima]'") from None
        self.num_req, self.isl, self.osl = (Predictor(kind, window, points) for _ in range(3))
        self.info = None
        self.last: Optional[dict] = None  # the last call's figures (tests, docs)

    def bind(self, info) -> None:
        self.info = info

    def observe(self, state) -> None:
        """Add the period's figures to the predictors (step 1): once a period, on the first pool's call of a P/D
        fleet (the prefill pool's when it scales, else the decode pool's; both states carry the fleet's figures)."""
        if state.pool == "decode" and self.scales_prefill:
            return
        self.num_req.add(state.arrivals)
        if state.arrivals:
            self.isl.add(state.prompt_tokens / state.arrivals)
        if state.finished:
            self.osl.add(state.output_tokens / state.finished)

    def decide(self, state):
        self.observe(state)
        if not self.isl.values or not self.osl.values:
            return ()  # no request seen arriving and finishing yet: nothing to size by
        rate = max(self.num_req.next(), 0.0) / (state.period_s * 1000.0)  # requests per ms
        isl, osl = self.isl.next(), self.osl.next()
        if state.pool:
            return self.pd_pool(state, rate, isl, osl)
        key = (two_digits(isl), two_digits(osl))
        if key not in self.cache:
            self.cache[key] = capacity(self.info.config, *key, self.ttft, self.itl, self.requests)
        per_worker = self.cache[key]
        want = math.ceil(rate * 1000.0 / per_worker - 1e-9)
        n = min(self.bounded(want), max(self.gpu_budget // self.info.gpus, 1))
        self.last = {"rate_per_s": rate * 1000.0, "isl": key[0], "osl": key[1], "worker_rate_per_s": per_worker,
                     "replicas": n}
        return self.scale_to(state, n)

    def pd_pool(self, state, rate: float, isl: float, osl: float):
        """A P/D pool's count (module docstring, "In a P/D fleet"): ``rate`` requests per ms, ``isl`` / ``osl``
        tokens predicted."""
        info = self.info
        if state.pool == "prefill":
            per_worker = prefill_tokens_per_ms(info.latency, round(isl), info.max_batched_tokens)
            tokens = rate * isl  # prompt tokens per ms to prefill
        else:
            per_worker = decode_tokens_per_ms(info.latency, isl, osl, self.itl, info.max_num_seqs,
                                              info.kv_capacity_tokens)
            tokens = rate * osl  # output tokens per ms to generate
        want = math.ceil(tokens / per_worker - 1e-9)
        n = min(self.bounded(want, state.pool), max(self.gpu_budget // info.gpus, 1))
        self.last = {"pool": state.pool, "rate_per_s": rate * 1000.0, "isl": isl, "osl": osl,
                     "worker_tokens_per_s": per_worker * 1000.0, "replicas": n}
        return self.scale_to(state, n)
