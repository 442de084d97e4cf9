"""Arrival rates of timestamped workloads: rescale a trace to a target rate, cut or loop it to a duration.

The arithmetic of ``--rate``, ``--rate-scale``, ``--time-scale`` and ``--duration`` lives here, in
:func:`time_scale_for` and :func:`shape`, so every command (``sim``, ``compare``, ``sweep``, ``plan``)
means the same by them.

Definitions (dynlab's own; pinned by tests/test_rates.py):

- A trace's **mean arrival rate** (requests/s) is its number of inter-arrival gaps over their total
  length: ``(n - 1) / (t_last - t_first) * 1000`` for ``n`` timestamps in ms. One request, or every
  request at the same instant, has no rate (:class:`RateError`).
- ``--rate R`` multiplies every timestamp by ``trace_mean_rate / R``; ``--rate-scale X`` by ``1 / X``
  (X times the trace's rate: the same as ``--time-scale 1/X``).
- ``--duration S`` keeps the arrivals in ``[t_first, t_first + S s)`` (after rescaling). When the
  trace is shorter it is looped: repeat ``k`` (from 1) is the trace shifted by ``k * period``, with
  ``period = (t_last - t_first) * n / (n - 1)`` (its span plus one mean gap, so the mean rate stays
  the trace's), and its block names renamed (:func:`rename`) so a repeat is new traffic, unless
  ``repeat="same"`` (a repeat then sends the same prompts again, and hits what the caches kept).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional, Sequence

from dynlab.routing.strategy import Request

#: values of ``--duration-repeat``: ``new`` renames a loop's blocks (new traffic), ``same`` keeps them
DURATION_REPEATS = ("new", "same")


class RateError(ValueError):
    """A rate option that cannot apply to this workload (one line, naming the option)."""


def mean_rate(timestamps_ms: Sequence[float]) -> float:
    """The mean arrival rate (requests/s) of ``timestamps_ms`` (ms, non-decreasing):
    ``(n - 1) / (last - first) * 1000``. Raises :class:`RateError` for fewer than two timestamps
    or a span of 0 ms."""
    n = len(timestamps_ms)
    if n < 2:
        raise RateError(f"the trace has {n} timestamped request(s): a rate needs at least two arrivals")
    span = timestamps_ms[-1] - timestamps_ms[0]
    if not span > 0:
        raise RateError("every request of the trace arrives at the same instant: it has no rate to rescale")
    return (n - 1) * 1000.0 / span


def time_scale_for(trace_mean_rate: Optional[float], rate: Optional[float] = None,
                   rate_scale: Optional[float] = None) -> float:
    """The factor that multiplies a trace's timestamps: ``trace_mean_rate / rate`` for a target
    ``rate`` (requests/s), ``1 / rate_scale`` for ``rate_scale`` times the trace's rate, 1.0 for neither.

    ``trace_mean_rate`` (requests/s, :func:`mean_rate`) is needed only with ``rate``. Raises
    :class:`RateError` when both are given, or for a value that is not a finite number > 0.
    """
    if rate is not None and rate_scale is not None:
        raise RateError("--rate and --rate-scale both set the trace's rate: give one")
    for flag, v in (("--rate", rate), ("--rate-scale", rate_scale)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise RateError(f"{flag} must be a finite number > 0, got {v}")
    if rate is not None:
        if trace_mean_rate is None or not trace_mean_rate > 0:
            raise RateError("--rate needs the trace's mean rate (a trace with timestamps)")
        return trace_mean_rate / rate
    if rate_scale is not None:
        return 1.0 / rate_scale
    return 1.0


def rename(hashes: tuple, repeat: int, stride: int) -> tuple:
    """Block names of loop ``repeat`` (1, 2, ...): ``h + repeat * stride`` each, where ``stride`` is
    one more than the largest name of the trace, so repeats never share a name with each other or
    with the original, and names stay prefix-chained ints >= 0 (when the trace's are)."""
    off = repeat * stride
    return tuple(h + off for h in hashes)


def shape(requests: Sequence[Request], scale: float = 1.0, duration_s: Optional[float] = None,
          repeat: str = "new") -> list[Request]:
    """``requests`` (timestamped, in time order) with timestamps times ``scale``, cut or looped to
    ``duration_s`` seconds from the first arrival (``None``: as long as the trace); ``index``
    renumbered from 0. Block names of loops are renamed (:func:`rename`; a reply's too,
    ``Request.output_hashes``) unless ``repeat`` is ``"same"``. Raises :class:`RateError` for an empty trace, a ``duration_s`` that is not > 0, or a
    loop of a trace whose requests all arrive at once.
    """
    if repeat not in DURATION_REPEATS:
        raise RateError(f"--duration-repeat must be one of {', '.join(DURATION_REPEATS)}, got {repeat!r}")
    if not requests:
        raise RateError("the trace holds no request")
    t0 = requests[0].timestamp
    if duration_s is None:
        return [r if scale == 1.0 else replace(r, timestamp=r.timestamp * scale) for r in requests]
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise RateError(f"--duration must be a finite number of seconds > 0, got {duration_s}")
    end = t0 * scale + duration_s * 1000.0
    n = len(requests)
    span = requests[-1].timestamp - t0
    period = span * n / (n - 1) if n > 1 else 0.0
    if period > 0 and scale > 0:  # a loop: refused before it is built when it would not fit in memory
        _check_loops(n * math.ceil((end - t0 * scale) / (period * scale) + 1), duration_s)
    stride = 1 + max((h for r in requests for h in r.hashes + (r.output_hashes or ()) if isinstance(h, int)),
                     default=0)
    out: list[Request] = []
    k = 0
    while True:
        for r in requests:
            t = (r.timestamp + k * period) * scale
            if not t < end:
                return out
            same = k == 0 or repeat == "same"
            hashes = r.hashes if same else rename(r.hashes, k, stride)
            reply = r.output_hashes if same or not r.output_hashes else rename(r.output_hashes, k, stride)
            out.append(replace(r, hashes=hashes, timestamp=t, index=len(out), runs=None, output_hashes=reply))
        if not period > 0:
            raise RateError("--duration cannot loop a trace whose requests all arrive at the same instant")
        k += 1


def _check_loops(count: int, duration_s: float) -> None:
    """:class:`RateError` when looping to ``duration_s`` s makes more than
    :data:`~dynlab.limits.MAX_LOOPED_REQUESTS` requests (about ``count``)."""
    from dynlab.limits import LOOPED_REQUEST_BYTES, MAX_LOOPED_REQUESTS

    if count > MAX_LOOPED_REQUESTS:
        raise RateError(f"--duration {duration_s:g} s loops the trace into about {count:,} requests, more than "
                        f"dynlab allows: at most {MAX_LOOPED_REQUESTS:,} (about {LOOPED_REQUEST_BYTES:,} bytes each; "
                        "see docs/limits.md); use a shorter --duration")


def describe(trace_rate: Optional[float], scale: float, arrivals_ms: Sequence[float]) -> dict:
    """The keys a run adds when its arrivals were shaped: ``trace_rate`` (requests/s of the trace as
    read, 4 decimals; ``None`` for one arrival), ``time_scale_applied`` (the factor on timestamps, 4
    decimals: shown only, the run scaled by ``scale`` unrounded) and
    ``arrival_rate`` (requests/s of what was replayed, its arrival times ``arrivals_ms`` in ms, 4 decimals)."""
    try:
        arrival = round(mean_rate(arrivals_ms), 4)
    except RateError:
        arrival = None
    return {"trace_rate": None if trace_rate is None else round(trace_rate, 4), "time_scale_applied": round(scale, 4),
            "arrival_rate": arrival}
