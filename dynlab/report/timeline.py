"""A run's timeline in the Chrome trace-event JSON format, which Perfetto's UI (https://ui.perfetto.dev,
"Open trace file") and chrome://tracing open offline: the page runs in the browser and the file stays
local. Format: Google's "Trace Event Format" document (``traceEvents``, phases ``X`` complete, ``i``
instant, ``M`` metadata; ``ts`` and ``dur`` in microseconds).

Input records (plain dicts; times in ms from the start of the run):

- a **step**: ``worker`` (int), ``start_ms``, ``end_ms``, ``prefill_tokens`` (tokens of prefill chunks in
  the batch), ``decodes`` (requests decoding one token), ``preemptions`` (requests preempted by the step);
  any other keys are kept in the step's args (``kv_blocks_used`` ...);
- a **request**: the per-request record of ``sim --requests-out`` (:mod:`dynlab.report.runs`): ``id``,
  ``worker``, ``arrival_ms``, ``first_scheduled_ms``, ``first_token_ms``, ``finish_ms`` (``null`` when not
  reached), optionally ``input_length``, ``output_length``, ``hit_tokens``, ``preemptions``, ``rejected``
  and, for P/D, ``prefill_worker``, ``decode_worker``, ``transfer_start_ms``, ``transfer_end_ms``;
- a **KV event**: ``worker``, ``time_ms`` (when the router received it), ``kind`` (``BlockStored``,
  ``BlockRemoved``, ``AllBlocksCleared``), ``blocks`` (how many), optionally ``medium`` (``GPU``, ``CPU``).

Layout: a process per worker (pid ``worker + 1``) with a ``steps`` track (a slice per step, its batch in
args) and a ``KV events`` track (instant events); a ``requests`` process (pid 0) whose tracks are lanes,
each request one slice ``request ID`` holding its phases ``queued``, ``prefill``, ``transfer`` (P/D) and
``decode`` (lanes are reused once a request finishes, so there are as many as requests overlap).
"""
from __future__ import annotations

import heapq
import json
from typing import Iterable, Mapping, Optional

STEP_KEYS = ("worker", "start_ms", "end_ms", "prefill_tokens", "decodes", "preemptions")
EVENT_KEYS = ("worker", "time_ms", "kind", "blocks")
REQUEST_KEYS = ("id", "worker", "arrival_ms", "first_scheduled_ms", "first_token_ms", "finish_ms")
#: default bound on the requests written (the steps and KV events written are those up to the last one's end)
MAX_REQUESTS = 1000
STEPS_TID, EVENTS_TID = 0, 1


def _us(ms: float) -> float:
    """ms -> µs, rounded to 1 ns (trace-event times are µs)."""
    return round(ms * 1000.0, 3)


def _need(rec: Mapping, keys, kind: str, n: int) -> None:
    if not isinstance(rec, Mapping):
        raise ValueError(f"{kind} {n}: not a mapping")
    missing = [k for k in keys if k not in rec]
    if missing:
        raise ValueError(f"{kind} {n}: missing key(s) {', '.join(missing)}")


def _phases(r: Mapping) -> list[tuple[str, float, float]]:
    """A request's phases ``(name, start ms, end ms)``, those whose two ends are known, in time order."""
    pd = r.get("transfer_start_ms") is not None and r.get("transfer_end_ms") is not None
    marks = [("queued", "arrival_ms", "first_scheduled_ms")]
    if pd:
        marks += [("prefill", "first_scheduled_ms", "transfer_start_ms"),
                  ("transfer", "transfer_start_ms", "transfer_end_ms"), ("decode", "transfer_end_ms", "finish_ms")]
    else:
        marks += [("prefill", "first_scheduled_ms", "first_token_ms"), ("decode", "first_token_ms", "finish_ms")]
    return [(name, r[a], r[b]) for name, a, b in marks
            if r.get(a) is not None and r.get(b) is not None and r[b] >= r[a]]


def _end(r: Mapping) -> float:
    times = [r.get(k) for k in ("finish_ms", "transfer_end_ms", "first_token_ms", "first_scheduled_ms")]
    return max([t for t in times if t is not None] + [r["arrival_ms"]])


def request_events(requests: list) -> tuple[list[dict], int]:
    """The requests' slices on lanes of pid 0, and the number of lanes (interval partitioning by arrival)."""
    free: list[int] = []
    busy: list[tuple[float, int]] = []  # (end, lane)
    lanes = 0
    out = []
    for r in sorted(requests, key=lambda r: (r["arrival_ms"], str(r["id"]))):
        while busy and busy[0][0] <= r["arrival_ms"]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lane = heapq.heappop(free) if free else lanes
        lanes = max(lanes, lane + 1)
        end = _end(r)
        heapq.heappush(busy, (end, lane))
        args = {k: v for k, v in r.items() if not k.endswith("_ms")}
        out.append({"name": f"request {r['id']}", "cat": "request", "ph": "X", "pid": 0, "tid": lane,
                    "ts": _us(r["arrival_ms"]), "dur": _us(end - r["arrival_ms"]), "args": args})
        for name, start, stop in _phases(r):
            out.append({"name": name, "cat": "request", "ph": "X", "pid": 0, "tid": lane, "ts": _us(start),
                        "dur": _us(stop - start), "args": {"id": r["id"]}})
    return out, lanes


def _metadata(workers: Iterable, lanes: int) -> list[dict]:
    meta = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "requests"}},
            {"name": "process_sort_index", "ph": "M", "pid": 0, "tid": 0, "args": {"sort_index": 0}}]
    meta += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": lane, "args": {"name": f"lane {lane}"}}
             for lane in range(lanes)]
    for w in sorted(workers):
        pid = w + 1
        meta += [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"worker {w}"}},
                 {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
                 {"name": "thread_name", "ph": "M", "pid": pid, "tid": STEPS_TID, "args": {"name": "steps"}},
                 {"name": "thread_name", "ph": "M", "pid": pid, "tid": EVENTS_TID, "args": {"name": "KV events"}}]
    return meta


def _worker(value, kind: str, n: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{kind} {n}: worker must be an integer >= 0, got {value!r}")
    return value


def timeline_events(steps: Iterable[Mapping], requests: Iterable[Mapping], events: Iterable[Mapping],
                    max_requests: Optional[int] = MAX_REQUESTS) -> tuple[list[dict], dict]:
    """``(traceEvents, otherData)`` of a timeline (see the module docstring).

    Keeps the first ``max_requests`` requests by arrival (``None``: all) and the steps and KV events that
    start before the last kept request ends, so the file's size follows ``max_requests``, not the trace's
    length. ``otherData`` counts what was kept and dropped. Raises ``ValueError`` naming the first record
    with a missing key or a bad worker."""
    reqs = []
    for n, r in enumerate(requests):
        _need(r, REQUEST_KEYS, "request", n)
        if not isinstance(r["arrival_ms"], (int, float)) or isinstance(r["arrival_ms"], bool):
            raise ValueError(f"request {n}: arrival_ms must be a number of ms, got {r['arrival_ms']!r}")
        reqs.append(r)
    reqs.sort(key=lambda r: r["arrival_ms"])
    kept = reqs if max_requests is None else reqs[:max_requests]
    horizon = max((_end(r) for r in kept), default=None)
    if max_requests is None or len(kept) == len(reqs):
        horizon = None  # everything: no cut
    out, lanes = request_events(kept)
    workers: set = set()
    counts = {"requests": len(kept), "requests_dropped": len(reqs) - len(kept), "steps": 0, "steps_dropped": 0,
              "kv_events": 0, "kv_events_dropped": 0}
    for n, s in enumerate(steps):
        _need(s, STEP_KEYS, "step", n)
        if horizon is not None and s["start_ms"] > horizon:
            counts["steps_dropped"] += 1
            continue
        w = _worker(s["worker"], "step", n)
        workers.add(w)
        args = {k: v for k, v in s.items() if k not in ("worker", "start_ms", "end_ms")}
        out.append({"name": "step", "cat": "step", "ph": "X", "pid": w + 1, "tid": STEPS_TID,
                    "ts": _us(s["start_ms"]), "dur": _us(s["end_ms"] - s["start_ms"]), "args": args})
        counts["steps"] += 1
    for n, e in enumerate(events):
        _need(e, EVENT_KEYS, "KV event", n)
        if horizon is not None and e["time_ms"] > horizon:
            counts["kv_events_dropped"] += 1
            continue
        w = _worker(e["worker"], "KV event", n)
        workers.add(w)
        args = {k: v for k, v in e.items() if k not in ("worker", "time_ms", "kind")}
        out.append({"name": str(e["kind"]), "cat": "kv", "ph": "i", "s": "t", "pid": w + 1, "tid": EVENTS_TID,
                    "ts": _us(e["time_ms"]), "args": args})
        counts["kv_events"] += 1
    for r in kept:
        for key in ("worker", "prefill_worker", "decode_worker"):
            if isinstance(r.get(key), int) and not isinstance(r.get(key), bool) and r[key] >= 0:
                workers.add(r[key])
    return _metadata(workers, lanes) + out, counts


def write_timeline(steps: Iterable[Mapping], requests: Iterable[Mapping], events: Iterable[Mapping], path: str,
                   max_requests: Optional[int] = MAX_REQUESTS) -> dict:
    """Write the timeline (:func:`timeline_events`) to ``path`` as trace-event JSON, atomically (a failure
    leaves an existing file as it was; :func:`dynlab.atomic.replace_file` raises ``DynlabError``).

    One event per line, so a large file stays readable with ``grep``. Returns ``otherData`` (counts kept
    and dropped). Raises ``ValueError`` for a bad record (nothing is written)."""
    trace_events, counts = timeline_events(steps, requests, events, max_requests)
    from dynlab.atomic import replace_file

    def write(name: str) -> None:
        with open(name, "w", encoding="utf-8") as fh:
            fh.write('{"displayTimeUnit": "ms", "otherData": ' + json.dumps(counts) + ', "traceEvents": [\n')
            for i, ev in enumerate(trace_events):
                fh.write(("," if i else "") + json.dumps(ev, allow_nan=False) + "\n")
            fh.write("]}\n")

    replace_file(path, write, suffix=".json")
    return counts
