"""The Chrome trace-event timeline (dynlab.report.timeline) on hand-made records: valid trace-event JSON
(ph/ts/dur/pid/tid, microseconds), a track per worker, a slice per request with its phases, KV events
as instants, bounded by max_requests."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from dynlab.report import write_timeline
from dynlab.report.timeline import timeline_events

STEPS = [{"worker": 0, "start_ms": 0.0, "end_ms": 5.0, "prefill_tokens": 512, "decodes": 0, "preemptions": 0},
         {"worker": 1, "start_ms": 1.0, "end_ms": 2.5, "prefill_tokens": 0, "decodes": 3, "preemptions": 1,
          "kv_blocks_used": 40}]
REQUESTS = [{"id": 7, "worker": 0, "arrival_ms": 0.0, "first_scheduled_ms": 0.5, "first_token_ms": 5.0,
             "finish_ms": 9.0, "output_length": 4},
            {"id": 8, "worker": 1, "arrival_ms": 2.0, "first_scheduled_ms": 2.0, "first_token_ms": 3.0,
             "finish_ms": 12.0}]
EVENTS = [{"worker": 0, "time_ms": 5.25, "kind": "BlockStored", "blocks": 32, "medium": "GPU"}]


def _load(path):
    with open(path) as fh:
        return json.load(fh)


def _check_format(doc):
    assert set(doc) == {"displayTimeUnit", "otherData", "traceEvents"}
    for ev in doc["traceEvents"]:
        assert ev["ph"] in ("X", "i", "M") and isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        assert isinstance(ev["name"], str)
        if ev["ph"] != "M":
            assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
        if ev["ph"] == "X":
            assert ev["dur"] >= 0
        if ev["ph"] == "i":
            assert ev["s"] in ("g", "p", "t")


def test_hand_made_records(tmp_path):
    path = tmp_path / "t.json"
    counts = write_timeline(STEPS, REQUESTS, EVENTS, str(path), max_requests=10)
    assert counts == {"requests": 2, "requests_dropped": 0, "steps": 2, "steps_dropped": 0, "kv_events": 1,
                      "kv_events_dropped": 0}
    doc = _load(path)
    _check_format(doc)
    evs = doc["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    assert names == {(0, 0): "lane 0", (0, 1): "lane 1", (1, 0): "steps", (1, 1): "KV events", (2, 0): "steps",
                     (2, 1): "KV events"}
    procs = {e["pid"]: e["args"]["name"] for e in evs if e["name"] == "process_name"}
    assert procs == {0: "requests", 1: "worker 0", 2: "worker 1"}
    # the step of worker 1: 1.0 ms -> 1000 µs, lasting 1.5 ms -> 1500 µs, its batch in args
    (step,) = [e for e in evs if e["name"] == "step" and e["pid"] == 2]
    assert (step["ts"], step["dur"], step["tid"]) == (1000.0, 1500.0, 0)
    assert step["args"] == {"prefill_tokens": 0, "decodes": 3, "preemptions": 1, "kv_blocks_used": 40}
    # request 7 on lane 0: 0-9 ms; queued 0-0.5, prefill 0.5-5, decode 5-9
    r7 = [(e["name"], e["ts"], e["dur"]) for e in evs if e["pid"] == 0 and e["ph"] == "X" and e["tid"] == 0]
    assert r7 == [("request 7", 0.0, 9000.0), ("queued", 0.0, 500.0), ("prefill", 500.0, 4500.0),
                  ("decode", 5000.0, 4000.0)]
    (req7,) = [e for e in evs if e["name"] == "request 7"]
    assert req7["args"] == {"id": 7, "worker": 0, "output_length": 4}
    # request 8 overlaps request 7: a second lane
    assert [e["tid"] for e in evs if e["name"] == "request 8"] == [1]
    (kv,) = [e for e in evs if e["ph"] == "i"]
    assert (kv["name"], kv["ts"], kv["pid"], kv["tid"], kv["s"]) == ("BlockStored", 5250.0, 1, 1, "t")
    assert kv["args"] == {"blocks": 32, "medium": "GPU"}


def test_pd_requests_get_a_transfer_phase(tmp_path):
    pd = [{"id": 1, "worker": 3, "arrival_ms": 0.0, "first_scheduled_ms": 1.0, "first_token_ms": 10.0,
           "finish_ms": 30.0, "prefill_worker": 0, "decode_worker": 3, "transfer_start_ms": 10.0,
           "transfer_end_ms": 14.0}]
    evs, _ = timeline_events([], pd, [])
    phases = [(e["name"], e["ts"], e["dur"]) for e in evs if e["ph"] == "X" and e["name"] != "request 1"]
    assert phases == [("queued", 0.0, 1000.0), ("prefill", 1000.0, 9000.0), ("transfer", 10000.0, 4000.0),
                      ("decode", 14000.0, 16000.0)]
    # both workers of the request get their tracks
    assert {e["args"]["name"] for e in evs if e["name"] == "process_name"} == {"requests", "worker 0", "worker 3"}


def test_max_requests_bounds_the_file(tmp_path):
    reqs = [{"id": i, "worker": 0, "arrival_ms": 10.0 * i, "first_scheduled_ms": 10.0 * i,
             "first_token_ms": 10.0 * i + 2, "finish_ms": 10.0 * i + 5} for i in range(100)]
    steps = [{"worker": 0, "start_ms": float(t), "end_ms": t + 1.0, "prefill_tokens": 1, "decodes": 1,
              "preemptions": 0} for t in range(1000)]
    events = [{"worker": 0, "time_ms": float(t), "kind": "BlockRemoved", "blocks": 1} for t in range(1000)]
    counts = write_timeline(steps, reqs, events, str(tmp_path / "t.json"), max_requests=3)
    # requests 0-2 are kept; the last ends at 25 ms: steps starting at 0..25 ms and events up to 25 ms stay
    assert counts == {"requests": 3, "requests_dropped": 97, "steps": 26, "steps_dropped": 974, "kv_events": 26,
                      "kv_events_dropped": 974}
    _check_format(_load(tmp_path / "t.json"))


def test_a_bad_record_is_refused_and_nothing_is_written(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("old")
    with pytest.raises(ValueError, match="step 1: missing key.*decodes"):
        write_timeline([STEPS[0], {"worker": 0, "start_ms": 0, "end_ms": 1, "prefill_tokens": 1,
                                   "preemptions": 0}], REQUESTS, EVENTS, str(path))
    with pytest.raises(ValueError, match="KV event 0: worker must be an integer >= 0"):
        write_timeline([], [], [dict(EVENTS[0], worker="a")], str(path))
    assert path.read_text() == "old"


times = st.floats(0, 1e5, allow_nan=False)


@given(st.lists(st.tuples(times, times, times, times), max_size=25), st.one_of(st.none(), st.integers(0, 30)))
def test_lanes_never_overlap_and_the_bound_holds(spans, bound):
    reqs = []
    for i, ts in enumerate(spans):
        a, s, f, e = sorted(ts)
        reqs.append({"id": i, "worker": i % 3, "arrival_ms": a, "first_scheduled_ms": s, "first_token_ms": f,
                     "finish_ms": e})
    evs, counts = timeline_events([], reqs, [], max_requests=bound)
    slices = [e for e in evs if e["ph"] == "X" and e["name"].startswith("request ")]
    assert len(slices) == (len(reqs) if bound is None else min(bound, len(reqs))) == counts["requests"]
    by_lane: dict = {}
    for e in slices:
        by_lane.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans_ in by_lane.values():
        spans_.sort()
        assert all(a_end <= b_start + 1e-6 for (_, a_end), (b_start, _) in zip(spans_, spans_[1:]))
    json.dumps(evs, allow_nan=False)  # valid JSON
