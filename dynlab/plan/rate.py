"""The arrival rate of a plan: ``--rate R`` / ``--rate-scale X`` as the engine's ``time_scale`` or Poisson ``rate``.

PLAN-LOCAL STAND-IN (issue 27 item 3): the "workloads" work adds ``--rate``/``--rate-scale``/``--duration``
to sim, compare and sweep. Until it lands, :func:`arrival_settings` is the one place plan turns a
target rate into engine settings; swap it for the shared function then.
"""
from __future__ import annotations

from typing import Optional, Sequence

from dynlab.engine.config import POISSON_RATE


def mean_rate(requests: Sequence) -> Optional[float]:
    """A timestamped trace's mean arrival rate in requests/s: ``(n - 1) / (last - first timestamp)``
    (one over the mean inter-arrival time; timestamps in ms). ``None`` without timestamps, with fewer
    than two requests, or when every request arrives at once."""
    if len(requests) < 2 or requests[0].timestamp is None:
        return None
    span_ms = float(requests[-1].timestamp) - float(requests[0].timestamp)
    return (len(requests) - 1) / (span_ms / 1000.0) if span_ms > 0 else None


def arrival_settings(requests: Sequence, rate: Optional[float] = None,
                     rate_scale: Optional[float] = None) -> tuple[float, float]:
    """``(time_scale, poisson_rate)`` for :class:`~dynlab.engine.config.SimConfig`.

    - ``rate_scale`` X: arrivals X times as fast, ``time_scale = 1 / X`` on a timestamped trace, a
      Poisson rate of ``X * POISSON_RATE`` requests/s on one without timestamps;
    - ``rate`` R (requests/s): ``time_scale = mean_rate(requests) / R`` on a timestamped trace (its mean
      rate becomes R), a Poisson rate of R without timestamps;
    - neither: the trace as it is (``(1.0, POISSON_RATE)``).

    Raises ``ValueError`` for both at once, a value that is not > 0, or ``rate`` on a trace whose
    requests all arrive at one instant (no mean rate to scale).
    """
    if rate is not None and rate_scale is not None:
        raise ValueError("--rate and --rate-scale both set the arrival rate: give one")
    for name, v in (("--rate", rate), ("--rate-scale", rate_scale)):
        if v is not None and not v > 0:
            raise ValueError(f"{name} must be > 0, got {v}")
    timestamps = bool(requests) and requests[0].timestamp is not None
    if rate_scale is not None:
        return (1.0 / rate_scale, POISSON_RATE) if timestamps else (1.0, POISSON_RATE * rate_scale)
    if rate is not None:
        if not timestamps:
            return 1.0, rate
        current = mean_rate(requests)
        if current is None:
            raise ValueError("--rate: the trace's requests all arrive at one instant; it has no mean rate to scale")
        return current / rate, POISSON_RATE
    return 1.0, POISSON_RATE
