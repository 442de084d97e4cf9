"""The ``kv`` collapse: a run in which one worker took almost every request.

A strategy that routes on prefix overlap alone (``kv``, ``kv-events`` with instant events) sends every
request of a trace whose requests share a first block (a system prompt) to the worker that holds it,
so the run measures one overloaded worker, not the fleet (README, "The longest-prefix rule
collapses"; docs/disagg.md for a ``--split`` comparison). :func:`collapse_warning` says so in one
line, naming the load-aware strategies. A count-based replay (no ``--timing``) is flagged too: it has no
load (every request has finished before the next arrives), so there even the load-aware strategies
collapse, and the line says to add ``--timing`` (issue 43).

The threshold, :data:`COLLAPSE_SHARE`: the busiest worker took at least 90 % of the requests
(project choice: well above what any load-aware strategy reaches on the bundled trace, whose busiest
worker takes 13-15 % of 8; a 2-worker fleet's 90:10 split is a collapse too).

With attention-DP ranks (``--dp-attention``: the result has ``dp_ranks``) the routing targets, and so the
entries of ``requests_per_worker``, are the ranks (:mod:`dynlab.engine.lockstep`): the line counts and names ranks.

An elastic run (``--controller``: the result has ``worker_lifetimes``, :mod:`dynlab.engine.elastic`) counts every
worker id it ever made, and a worker there for ten minutes of a day takes few requests although it was served
fairly. There each worker is judged by its rate: its requests over the seconds it could take them (``ready_s`` to
``left_s``, or to the run's ``makespan_s`` when it never left; a drained worker's drain counts, a worker never
ready is left out), and the run collapsed when the busiest worker's rate is at least :data:`COLLAPSE_SHARE` of
the rates' sum (project choice, the same test on rates as on counts: workers alive side by side and served alike
have equal rates; one worker of ``n`` alive all along taking everything has all of it). The line gives the rates
(requests per second alive). A fleet whose ``worker_lifetimes`` are not its routing targets (``--split`` scaling
the decode pool only; attention-DP ranks) keeps the count rule.
"""
from __future__ import annotations

from typing import Mapping, Optional

__all__ = ["COLLAPSE_SHARE", "LOAD_AWARE", "alive_rates", "collapsed_share", "collapse_warning"]

#: the busiest worker's share of the requests (0-1) at or above which a run has collapsed
COLLAPSE_SHARE = 0.9
#: the built-in strategies that weigh each worker's load, named in the warning
LOAD_AWARE = ("kv-cost", "cache-aware", "least-loaded", "power-of-two")


def collapsed_share(result: Mapping) -> Optional[tuple[int, int, int]]:
    """``(requests on the busiest worker, requests, workers)`` when ``result`` (what ``dynlab sim``
    prints: a timed run, or a count-based one with the fleet metrics) is a run of two workers or more
    (prefill workers, with P/D) in which the busiest worker took at least :data:`COLLAPSE_SHARE` of the
    requests; else ``None``. Counts only: an elastic run is judged by :func:`alive_rates` in
    :func:`collapse_warning`."""
    per_worker = result.get("requests_per_worker")
    if not isinstance(per_worker, list) or len(per_worker) < 2:
        return None
    total = sum(per_worker)
    busiest = max(per_worker)
    if total <= 0 or busiest < COLLAPSE_SHARE * total:
        return None
    return busiest, total, len(per_worker)


def alive_rates(result: Mapping) -> Optional[list[Optional[float]]]:
    """Per routing target, requests per second alive (``ready_s`` to ``left_s``, or to ``makespan_s``; ``None``
    for a worker never ready or alive 0 s) when ``result`` is an elastic run whose ``worker_lifetimes`` (the
    prefill pool's with ``--split``) are its ``requests_per_worker``'s workers; else ``None`` (a fixed fleet)."""
    lives = result.get("worker_lifetimes")
    per_worker = result.get("requests_per_worker")
    if not isinstance(lives, list) or not isinstance(per_worker, list) or result.get("dp_ranks"):
        return None
    lives = [life for life in lives if life.get("pool", "prefill") == "prefill"]
    end = result.get("makespan_s")
    if len(lives) != len(per_worker) or end is None:
        return None
    rates: list[Optional[float]] = []
    for life, n in zip(lives, per_worker):
        ready = life.get("ready_s")
        until = life.get("left_s") if life.get("left_s") is not None else end
        alive = None if ready is None else until - ready
        rates.append(n / alive if alive and alive > 0 else None)
    return rates


def _part(result: Mapping) -> Optional[str]:
    """The words for one run that collapsed (by rates if elastic, :func:`alive_rates`; else by counts,
    :func:`collapsed_share`); ``None`` when it did not."""
    rates = alive_rates(result)
    if rates is not None:
        alive = [r for r in rates if r is not None]
        total = sum(alive)
        if len(alive) < 2 or total <= 0 or max(alive) < COLLAPSE_SHARE * total:
            return None
        busiest = max(alive)
        return (f"{busiest:.3g} requests/s alive on one of {len(alive)} workers, the others {total - busiest:.3g} "
                f"together ({busiest / total:.0%} of the rates; elastic: judged per second alive)")
    found = collapsed_share(result)
    if found is None:
        return None
    busiest, total, workers = found
    imbalance = result.get("load_imbalance")
    imb = f", imbalance {imbalance}" if imbalance is not None else ""
    kind = ("prefill workers" if result.get("prefill_workers")
            else f"attention-DP ranks ({result['dp_ranks']} a worker)" if result.get("dp_ranks") else "workers")
    return f"{busiest:,} of {total:,} requests on one of {workers} {kind} ({busiest / total:.0%}{imb})"


def collapse_warning(results: Mapping[str, Mapping]) -> Optional[str]:
    """One line (without ``Warning:``) naming every run of ``results`` (label -> result) that collapsed
    (:func:`collapsed_share`), with its share and imbalance and the load-aware strategies (for count-based
    runs: that they collapse there too, and ``--timing``); ``None``
    when none did. A label that is not the run's strategy (a ``--split`` value, a capacity) is
    followed by the strategy in brackets."""
    parts, collapsed = [], []
    for label, result in results.items():
        part = _part(result)
        if part is None:
            continue
        collapsed.append(result)
        mode = result.get("mode")
        name = str(label) if mode in (None, label) else f"{label} [{mode}]"
        parts.append(f"{name}: {part}")
    if not parts:
        return None
    one = "rank" if all(r.get("dp_ranks") for r in collapsed) else "worker"  # what a routing target is
    if all("ttft_ms" in r and r.get("mode") in LOAD_AWARE for r in collapsed):  # a load-aware strategy collapsed
        advice = (f"the run measures one {one}, not the fleet; a strategy with a load term spreads requests only "
                  "when they overlap in time enough for the load to outweigh a prefix hit (here they did not: too "
                  "few requests, or too far apart)")
    elif any("ttft_ms" in r for r in results.values()):
        advice = (f"the run measures one overloaded {one}, not the fleet; strategies with a load term spread it "
                  f"when requests overlap in time: {', '.join(LOAD_AWARE)}")
    else:  # count-based: no request is in flight when the next is routed, so no load term can act
        advice = (f"the run measures one {one}, not the fleet; a count-based replay has no load (every request "
                  f"has finished before the next), so strategies with a load term ({', '.join(LOAD_AWARE)}) "
                  f"collapse here too: add --timing, where requests overlap in time")
    return (f"one {one} took almost every request ({'; '.join(parts)}): {advice} "
            f"(at least {COLLAPSE_SHARE:.0%} on one {one} counts; see docs/commands.md)")
