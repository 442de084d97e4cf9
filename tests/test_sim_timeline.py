"""``dynlab sim --timing --timeline FILE.json`` (issue 28; docs/report.md): the run's timeline, written by
:class:`dynlab.sim.timeline.TimelineRecorder` through :func:`dynlab.report.timeline.write_timeline`."""
from __future__ import annotations

import json

from click.testing import CliRunner

from dynlab.cli import main

# 3 requests of a Mooncake trace (512-token blocks), 2 workers; requests 0 and 1 share blocks 1, 2; routed by kv
# (overlap, then fewest requests): 0 and 1 on worker 0, 2 on worker 1, so both workers have a track
TRACE = "".join(json.dumps(r) + "\n" for r in [
    {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},
    {"timestamp": 50, "input_length": 1536, "output_length": 4, "hash_ids": [1, 2, 3]},
    {"timestamp": 90, "input_length": 600, "output_length": 4, "hash_ids": [7, 8]},
])


def _run(tmp_path, *extra):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    out = tmp_path / "timeline.json"
    res = CliRunner().invoke(main, ["sim", "--trace", str(trace), "--timing", "--quiet", "--workers", "2",
                                    "--mode", "kv", "--timeline", str(out), *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), json.loads(out.read_text())


def test_the_timeline_is_trace_event_json_with_workers_requests_and_kv_events(tmp_path):
    result, doc = _run(tmp_path)
    events = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ms" and isinstance(events, list)
    for ev in events:  # the trace-event format's required fields
        assert {"name", "ph", "pid", "tid"} <= set(ev) and ev["ph"] in ("X", "i", "M")
        if ev["ph"] in ("X", "i"):
            assert ev["ts"] >= 0
        if ev["ph"] == "X":
            assert ev["dur"] >= 0
    names = {(ev["pid"], ev["args"]["name"]) for ev in events if ev["name"] == "process_name"}
    assert names == {(0, "requests"), (1, "worker 0"), (2, "worker 1")}  # a track per worker
    spans = sorted(ev["args"]["id"] for ev in events if ev["name"].startswith("request "))
    assert spans == [0, 1, 2]  # a span per request
    steps = [ev for ev in events if ev["name"] == "step"]
    assert {ev["pid"] for ev in steps} == {1, 2}
    assert sum(ev["args"]["steps"] for ev in steps) == result["engine_steps"]
    kv = [ev for ev in events if ev.get("cat") == "kv"]
    # every published event is a BlockStored here (nothing is evicted): one per prefill that stored blocks
    assert len(kv) == result["events_published"] == doc["otherData"]["kv_events"]
    assert {ev["name"] for ev in kv} == {"BlockStored"} and all(ev["tid"] == 1 for ev in kv)
    # the full 16-token blocks the prompts computed: 1024/16 = 64, 1536/16 - 64 hit = 32, floor(600/16) = 37
    assert sum(ev["args"]["blocks"] for ev in kv) == 64 + 32 + 37
    assert doc["otherData"]["requests"] == 3 and doc["otherData"]["requests_dropped"] == 0


def test_max_requests_bounds_the_requests(tmp_path):
    _, doc = _run(tmp_path, "--timeline-max-requests", "1")
    spans = [ev for ev in doc["traceEvents"] if ev["name"].startswith("request ")]
    assert [ev["args"]["id"] for ev in spans] == [0]
    assert doc["otherData"]["requests"] == 1 and doc["otherData"]["requests_dropped"] == 2


def test_a_failed_write_leaves_the_file_and_says_why(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    res = CliRunner().invoke(main, ["sim", "--trace", str(trace), "--timing", "--quiet",
                                    "--timeline", str(tmp_path / "no" / "t.json")])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
