"""Replay one measured benchmark run through dynlab's timed engine and read the figures the benchmark reported.

:func:`replay` takes a :class:`~dynlab.calibrate.formats.MeasuredPoint` and a base
:class:`~dynlab.engine.config.SimConfig` (model, GPU, latency model and its options) and drives one
simulated worker the way the client drove the server:

- ``max_concurrency`` set and ``request_rate`` unset or ``inf``: closed loop, ``max_concurrency`` users
  (``vllm bench serve --max-concurrency``, aiperf's and guidellm's concurrency modes);
- a finite ``request_rate`` without ``max_concurrency``: Poisson arrivals at that rate (vllm bench's
  default arrival process), or evenly spaced ones when the point's ``arrival`` is ``"constant"``
  (guidellm's ``constant`` rate; inference-perf's ``constant`` load draws exponential gaps: ``poisson``);
- ``request_rate`` ``inf`` without ``max_concurrency`` (vllm bench's defaults): every request at time 0;
- both a finite rate and a concurrency: refused (a rate-limited client with a concurrency cap is not
  modelled yet).

The prompts are the file's own token counts when it has them (``input_lens`` / ``output_lens``, in the
file's order); otherwise ``vllm bench serve``'s random dataset is redrawn from ``random_input_len``,
``random_output_len`` and ``random_range_ratio`` (uniform integers in ``[L(1-r), L(1+r)]``, vLLM's
``RandomDataset``) with a fixed seed. Every prompt is distinct (random tokens share no prefix).
At most ``MAX_REQUESTS`` requests are replayed (the first ones), as a benchmark measures them all:
no warm-up is left out.

The figures (:data:`METRICS`) follow ``vllm bench serve``'s definitions, unrounded: TTFT, TPOT =
(E2E - TTFT) / (output - 1) over requests of more than one output token, E2E, and total (input +
output) tokens per second per GPU over the run's duration (first arrival to last finish).
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, replace
from typing import Optional

from dynlab.calibrate.formats import MeasuredPoint, percentile
from dynlab.engine.config import SimConfig
from dynlab.engine.metrics import Recorder, client_times

#: the figures compared, as ``MeasuredPoint`` names them (throughput: per GPU)
METRICS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms",
           "total_token_throughput_per_gpu")
#: requests replayed per point at most: enough for stable medians, few enough for a fit's many replays
MAX_REQUESTS = 400
#: requests replayed when the file states no count
DEFAULT_REQUESTS = 200
#: the seed of the redrawn random dataset
SEED = 0


class ReplayError(ValueError):
    """A measured point dynlab cannot replay (no lengths, a mode it does not model); the message names it."""


def measured(point: MeasuredPoint) -> dict[str, float]:
    """The point's figures among :data:`METRICS` that its file states (throughput per GPU)."""
    out = {}
    for name in METRICS:
        value = (point.total_token_throughput_per_gpu() if name == "total_token_throughput_per_gpu"
                 else getattr(point, name))
        if value is not None and math.isfinite(value) and value > 0:
            out[name] = float(value)
    return out


def lengths(point: MeasuredPoint) -> list[tuple[int, int]]:
    """``[(input tokens, output tokens)]`` of the requests to replay (module docstring). Raises
    :class:`ReplayError` when the point gives neither per-request lengths nor random-dataset settings."""
    if point.input_lens and point.output_lens:
        pairs = list(zip(point.input_lens, point.output_lens))
        return pairs[:MAX_REQUESTS]
    if point.random_input_len is None or point.random_output_len is None:
        raise ReplayError(f"{point.source}: no request lengths (per-request input_lens/output_lens, or "
                          "random_input_len and random_output_len)")
    n = min(point.num_prompts or DEFAULT_REQUESTS, MAX_REQUESTS)
    r = point.random_range_ratio or 0.0
    rng = random.Random(SEED)

    def draw(mean: float) -> int:
        lo, hi = max(int(mean * (1 - r)), 1), max(int(mean * (1 + r)), 1)
        return rng.randint(lo, hi)

    return [(draw(point.random_input_len), draw(point.random_output_len)) for _ in range(n)]


def _requests(pairs: list[tuple[int, int]], block: int, spacing_ms: Optional[float] = None):
    """The replayed requests: distinct prompts; timestamps ``i x spacing_ms`` when given."""
    from dynlab.routing.strategy import Request
    from dynlab.traces.reader import TraceRequests

    names = itertools.count(1)
    out = TraceRequests()
    for i, (n_in, n_out) in enumerate(pairs):
        out.append(Request(hashes=tuple(next(names) for _ in range(-(-n_in // block))), input_length=n_in,
                           output_length=max(n_out, 1), index=i,
                           timestamp=None if spacing_ms is None else i * spacing_ms))
    out.block_tokens = block
    return out


def arrival(point: MeasuredPoint, config: SimConfig, n: Optional[int] = None) -> SimConfig:
    """``config`` with the point's arrival process (module docstring) for ``n`` requests; raises
    :class:`ReplayError`."""
    rate = point.request_rate
    if rate is not None and math.isinf(rate) and point.max_concurrency is None and n:
        return replace(config, concurrency=n, rate=None)  # vllm bench's default: every request at once
    open_rate = rate is not None and math.isfinite(rate)
    if point.max_concurrency is not None and open_rate:
        raise ReplayError(f"{point.source}: request_rate {rate:g} with max_concurrency {point.max_concurrency}: "
                          "a rate-limited client with a concurrency cap is not modelled")
    if point.max_concurrency is not None:
        return replace(config, concurrency=point.max_concurrency, rate=None)
    if open_rate:
        return replace(config, rate=None if point.arrival == "constant" else rate, concurrency=None)
    raise ReplayError(f"{point.source}: neither max_concurrency nor a finite request_rate: "
                      "dynlab cannot tell how the client sent its requests")


class _Figures(Recorder):
    """Each request's ``(input, output, TTFT ms, E2E ms)`` by its position (with ``front_ms``, the server's
    front end, and ``token_ms`` per output token, as :class:`~dynlab.engine.metrics.ServingMetrics` counts them), and the run's first arrival
    and last finish (ms, unrounded)."""

    def on_arrival(self, req, t: float) -> None:
        if self.first is None or t < self.first:
            self.first = t

    def __init__(self, front_ms: float, token_ms: float = 0.0):
        self.rows: dict = {}
        self.first = None
        self.last = 0.0
        self.front_ms, self.token_ms = front_ms, token_ms

    def on_finish(self, req, t: float) -> None:
        self.rows[req.id] = (req.input_length, req.output_length, *client_times(req, t, self.front_ms, self.token_ms))
        self.last = max(self.last, t)


@dataclass
class Replayed:
    """A replayed point: ``rows`` ``(input tokens, output tokens, TTFT ms, E2E ms)`` per finished request
    in the workload's order, ``span_ms`` (first arrival to last finish) and the ``gpus`` of the server."""

    rows: list
    span_ms: float
    gpus: int

    def figures(self) -> dict[str, float]:
        """The :data:`METRICS` of the run (module docstring); TPOT ones only with a request of 2+ tokens."""
        ttft = [r[2] for r in self.rows]
        e2e = [r[3] for r in self.rows]
        tpot = [(r[3] - r[2]) / (r[1] - 1) for r in self.rows if r[1] > 1]
        tokens = sum(r[0] + r[1] for r in self.rows)
        out = {"median_ttft_ms": percentile(ttft, 50), "p99_ttft_ms": percentile(ttft, 99),
               "median_e2el_ms": percentile(e2e, 50),
               "total_token_throughput_per_gpu": (tokens / (self.span_ms / 1000.0) / self.gpus
                                                  if self.span_ms > 0 else math.inf)}
        if tpot:
            out["median_tpot_ms"] = percentile(tpot, 50)
            out["p99_tpot_ms"] = percentile(tpot, 99)
        return out


def simulate(point: MeasuredPoint, config: SimConfig, pairs: Optional[list] = None) -> Replayed:
    """Replay ``point`` under ``config`` (one worker; its ``model``, ``gpu``, ``tp``, ``latency_model`` and
    ``latency_opts`` are the replay's). ``pairs``: the lengths (:func:`lengths`), to skip redrawing them.
    Requests the server refuses are left out of the figures, as ``vllm bench serve`` leaves out failed ones.
    Raises :class:`ReplayError` (also when it refuses every request: no figure to compare), or ``ValueError``
    for a bad option."""
    from dynlab.sim.runner import run

    pairs = lengths(point) if pairs is None else pairs
    config = replace(arrival(point, config, len(pairs)), timing=True, workers=1, trace="<measured point>")
    recorder = _Figures(config.request_overhead_ms, config.detok_ms)
    constant = point.arrival == "constant" and config.concurrency is None
    spacing = 1000.0 / point.request_rate if constant else None
    run(config, requests=_requests(pairs, config.block, spacing), recorders=(recorder,))
    rows = [recorder.rows[i] for i in sorted(recorder.rows)]
    if not rows:
        raise ReplayError(f"{point.source}: the replayed server refused all {len(pairs)} requests (each needs "
                          "more KV cache than its pool holds: more GPUs or memory, or with SGLang a larger "
                          "--mem-fraction-static)")
    return Replayed(rows, recorder.last - (recorder.first or 0.0), config.tp * config.pp)


def replay(point: MeasuredPoint, config: SimConfig, pairs: Optional[list] = None) -> dict[str, float]:
    """The figures (:data:`METRICS`) dynlab predicts for ``point`` under ``config`` (:func:`simulate`)."""
    return simulate(point, config, pairs).figures()


__all__ = ["METRICS", "MAX_REQUESTS", "ReplayError", "Replayed", "arrival", "lengths", "measured", "replay",
           "simulate"]
