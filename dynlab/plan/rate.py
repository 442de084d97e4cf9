"""The arrival rate of a plan: ``--rate R`` / ``--rate-scale X`` as the engine's ``time_scale`` or Poisson ``rate``.

The arithmetic is :mod:`dynlab.traces.rates`' (the same as ``sim``, ``compare`` and ``sweep``); this
module only picks, for a workload with or without timestamps, which setting of
:class:`~dynlab.engine.config.SimConfig` carries it.
"""
from __future__ import annotations

from typing import Optional, Sequence

from dynlab.engine.config import POISSON_RATE
from dynlab.traces import rates


def mean_rate(requests: Sequence) -> Optional[float]:
    """A timestamped trace's mean arrival rate in requests/s (:func:`dynlab.traces.rates.mean_rate`:
    ``(n - 1) / (last - first timestamp)``, timestamps in ms). ``None`` without timestamps, with fewer
    than two requests, or when every request arrives at once."""
    if len(requests) < 2 or requests[0].timestamp is None:
        return None
    try:
        return rates.mean_rate([float(r.timestamp) for r in requests])
    except rates.RateError:
        return None


def arrival_settings(requests: Sequence, rate: Optional[float] = None, rate_scale: Optional[float] = None,
                     concurrency: Optional[int] = None) -> tuple[float, Optional[float]]:
    """``(time_scale, poisson_rate)`` for :class:`~dynlab.engine.config.SimConfig`.

    - closed loop (``concurrency`` users, or a workload spec whose arrival is closed,
      :attr:`dynlab.traces.reader.TraceRequests.closed`): ``(1.0, None)``, the users set the pace;
    - on a timestamped trace: ``time_scale`` from :func:`dynlab.traces.rates.time_scale_for` (``rate``
      R: its mean rate becomes R; ``rate_scale`` X: ``1 / X``), and no Poisson rate (``None``);
    - without timestamps: ``time_scale`` 1 and a Poisson rate of R, or ``X * POISSON_RATE``, or
      ``POISSON_RATE`` for neither.

    Raises ``ValueError`` (:class:`~dynlab.traces.rates.RateError`) for both at once, a value that is
    not > 0, ``rate`` on a trace whose requests all arrive at one instant (no mean rate to scale), or
    either in closed loop.
    """
    rates.time_scale_for(1.0, rate, rate_scale)     # refuses both at once and values not > 0
    if closed_users(requests, concurrency) is not None:
        for flag, v in (("--rate", rate), ("--rate-scale", rate_scale)):
            if v is not None:
                raise rates.RateError(f"{flag} has no effect with closed-loop users: each sends its next request "
                                      "when its previous one finished, not at a rate")
        return 1.0, None
    timestamps = bool(requests) and requests[0].timestamp is not None
    if timestamps:
        current = mean_rate(requests) if rate is not None else None
        if rate is not None and current is None:
            raise rates.RateError("--rate: the trace's requests all arrive at one instant; it has no mean rate to scale")
        return rates.time_scale_for(current, rate, rate_scale), None
    if rate_scale is not None:
        return 1.0, POISSON_RATE * rate_scale
    return 1.0, rate if rate is not None else POISSON_RATE


def served(requests: Sequence, num_requests: Optional[int]) -> Sequence:
    """The requests every replay serves: the first ``num_requests`` (``--requests``), all without it.
    Raises ``ValueError`` when the workload has fewer."""
    if num_requests is None:
        return requests
    from dynlab.sim.runner import first_requests

    return first_requests(requests, num_requests)[0]


def closed_users(requests: Sequence, concurrency: Optional[int]) -> Optional[int]:
    """The closed-loop users of a replay: ``concurrency`` (``--concurrency``), else a workload spec's
    (``"arrival": {"process": "closed"}``); ``None`` in open loop."""
    if concurrency is not None:
        return concurrency
    closed = getattr(requests, "closed", None)
    return closed[0] if closed is not None else None
