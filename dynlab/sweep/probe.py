"""Which metrics a sweep's cells will report, known before they run.

A result's keys follow from a cell's options (``--timing``, a CPU tier, SLOs, P/D workers...), not from
its data, so each cell's configuration is run on the first :data:`PROBE_REQUESTS` requests of its
workload (a trace's first lines, or the synthetic workload cut to that size) and the paths of that small
result stand for the full one's. ``dynlab sweep --plot --metric`` uses it to refuse a metric no cell
will report before any cell runs (a typo used to surface only after the whole sweep).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterable, Optional

from dynlab.engine.config import SimConfig
from dynlab.sweep.results import flatten

__all__ = ["PROBE_REQUESTS", "probe_paths", "metric_problem"]

#: requests a probe runs: enough for every key of a result to appear (repeat and hit counts need two)
PROBE_REQUESTS = 2


def probe_paths(config: SimConfig, trace=None) -> dict[str, Any]:
    """The flattened result (dotted path -> value) of ``config`` run on :data:`PROBE_REQUESTS` requests.

    ``trace``: ``config``'s loaded trace (:func:`dynlab.traces.reader.load_trace`), ``None`` for the
    synthetic workload (cut to one prefix repeated twice). Raises what :func:`dynlab.sim.run` raises.
    """
    from dynlab.sim.runner import run
    from dynlab.traces.reader import TraceRequests

    if trace is None:
        return flatten(run(replace(config, prefixes=1, reps=PROBE_REQUESTS)))
    head = TraceRequests(trace[:PROBE_REQUESTS])
    head.block_tokens, head.own_block_tokens = trace.block_tokens, trace.own_block_tokens
    return flatten(run(config, requests=head))


def _number(value) -> bool:
    """Whether ``value`` is a number a plot can draw (an int or float, not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _reports(paths: dict[str, Any], metric: str) -> bool:
    """Whether a result with these ``paths`` can hold a number at ``metric``: a number there, or ``None`` at
    it or at a shorter path (a figure a two-request run leaves empty, such as a TPOT of one-token requests)."""
    parts = metric.split(".")
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in paths:
            value = paths[key]
            if value is None:
                return True
            return i == len(parts) and _number(value)
    return False


def metric_problem(configs: Iterable[SimConfig], metric: str, trace_of: Callable[[SimConfig], Any]) -> Optional[str]:
    """``None`` when some configuration of ``configs`` reports a number at ``metric`` (a dotted path), else
    the one-line reason, listing the paths they report. Probes (:func:`probe_paths`) stop at the first
    configuration that reports it; identical configurations are probed once. ``trace_of(config)``: its
    loaded trace or ``None``. A configuration whose probe raises is taken to report it (the full run
    will say what is wrong)."""
    seen: set = set()
    available: dict[str, None] = {}
    for config in configs:
        key = repr(config)
        if key in seen:
            continue
        seen.add(key)
        try:
            paths = probe_paths(config, trace_of(config))
        except Exception:  # noqa: BLE001 - the cell itself will fail with its own message, or succeed
            return None
        if _reports(paths, metric):
            return None
        available.update(dict.fromkeys(k for k, v in paths.items() if v is None or _number(v)))
    return f"--metric {metric}: no cell reports this number; available: {', '.join(available)}"
