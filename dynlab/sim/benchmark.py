"""The figures benchmark clients report (``vllm bench serve``, aiperf, guidellm, inference-perf), for runs
driven as they drive a server (``--concurrency``, ``--requests``, ``--warmup``): :class:`BenchmarkRecorder`.

Keys it adds after the serving keys (docs/commands.md names each definition and how the tools differ):

- ``itl_ms``: the inter-token latency distribution (ms). Each finished request with ``n > 1`` output
  tokens contributes ``n - 1`` gaps, each its mean gap ``(E2E - TTFT) / (n - 1)`` (its TPOT): the mean
  is exactly vLLM's ``mean_itl_ms`` (the mean over every gap of every request); the quantiles treat a
  request's gaps as equal (dynlab does not time each token of a bulk decode run);
- ``interactivity``: tokens/s seen by one user, ``1000 / TPOT`` per request (InferenceX's and
  aiconfigurator's x axis), as a distribution;
- ``total_tokens_per_s``: (prompt + output tokens of the measured, finished requests) / span, the span
  running from the first measured arrival to the last finish (vLLM's ``total_token_throughput``);
- ``tokens_per_s_per_gpu``: that over the run's GPUs (workers x GPUs per worker);
- ``measured_requests`` (with ``--warmup`` only): the finished requests past the warm-up, the ones every
  figure covers (``requests`` counts every request sent, the warm-up's included).

Requests whose id is below ``warmup`` are left out, as :class:`~dynlab.engine.metrics.ServingMetrics` does.
"""
from __future__ import annotations

import bisect
from typing import Any, Sequence

from dynlab.engine.metrics import Recorder, stats


def weighted_stats(values: Sequence[float], weights: Sequence[int]) -> dict:
    """:func:`~dynlab.engine.metrics.stats` of ``values`` each repeated ``weights[i]`` times (integers >= 0),
    without building that list: the same ``p50``, ``p90``, ``p99`` (inclusive method) and ``mean``."""
    pairs = sorted((v, w) for v, w in zip(values, weights) if w > 0)
    n = sum(w for _, w in pairs)
    if n == 0:
        return stats([])
    if n == 1:
        return stats([pairs[0][0]])
    ends, total = [], 0
    for _, w in pairs:
        total += w
        ends.append(total)  # expanded positions 0 .. total-1 belong to this value

    def at(k: int) -> float:
        return pairs[bisect.bisect_right(ends, k)][0]

    def quantile(p: float) -> float:
        h = (n - 1) * p
        lo = int(h)
        frac = h - lo
        a = at(lo)
        return a if frac == 0 else a + frac * (at(lo + 1) - a)

    import math

    mean = math.fsum(v * w for v, w in pairs) / n
    return {"p50": round(quantile(0.5), 1), "p90": round(quantile(0.9), 1), "p99": round(quantile(0.99), 1),
            "mean": round(mean, 1)}


class BenchmarkRecorder(Recorder):
    """The benchmark clients' figures (module docstring); ``gpus``: the run's GPUs, ``warmup``: requests
    left out (ids below it); ``token_ms``: detokenisation and streaming per output token, in every gap as
    in ``tpot_ms`` (:class:`~dynlab.engine.metrics.ServingMetrics`)."""

    def __init__(self, gpus: int, warmup: int = 0, token_ms: float = 0.0):
        self.gpus, self.warmup, self.token_ms = gpus, warmup, token_ms
        self.gaps: list = []
        self.gap_counts: list = []
        self.tokens = 0
        self.measured = 0  # finished requests the figures cover (past the warm-up)
        self.first_arrival = None
        self.last_finish = 0.0

    def on_arrival(self, req, t: float) -> None:
        if self.first_arrival is None and not (self.warmup and req.id < self.warmup):
            self.first_arrival = t

    def on_finish(self, req, t: float) -> None:
        from dynlab.engine.metrics import failed

        if (self.warmup and req.id < self.warmup) or failed(req):  # a failed request (--keep-failed): no answer
            return
        self.tokens += req.input_length + req.output_length
        self.measured += 1
        if req.output_length > 1:
            self.gaps.append((t - req.first_token_ms) / (req.output_length - 1) + self.token_ms)
            self.gap_counts.append(req.output_length - 1)
        if t > self.last_finish:
            self.last_finish = t

    def result(self, engines: Sequence) -> dict[str, Any]:
        span_s = max(self.last_finish - (self.first_arrival or 0.0), 0.0) / 1000.0
        per_s = self.tokens / span_s if span_s else 0.0
        out = {"itl_ms": weighted_stats(self.gaps, self.gap_counts),
               "interactivity": stats([1000.0 / g for g in self.gaps if g > 0]),
               "total_tokens_per_s": round(per_s, 1),
               "tokens_per_s_per_gpu": round(per_s / self.gpus, 1)}
        if self.warmup:  # beside "requests" (every request sent, warm-up included): those the figures cover
            out["measured_requests"] = self.measured
        return out


__all__ = ["BenchmarkRecorder", "weighted_stats"]
