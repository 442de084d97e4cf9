"""Closed-loop arrivals (issue 38): --concurrency users, --think-time-ms, --requests, --warmup, and the
benchmark clients' figures (itl_ms, interactivity, tokens_per_s_per_gpu)."""
from __future__ import annotations

import json
import statistics

import pytest

from click.testing import CliRunner
from hypothesis import given, strategies as st

from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.engine.metrics import stats
from dynlab.latency.overheads import CPU_STEP_US, CPU_US_PER_REQUEST, DETOK_US_PER_TOKEN, FRONT_END_MS
from dynlab.sim import run
from dynlab.sim.benchmark import weighted_stats
from dynlab.sim.records import RequestRecorder

# linear steps: 10 ms + 1 ms per prefill token + 2 ms per decode (the issues' hand-case model)
LINEAR = {"beta0": "10", "beta1": "1", "beta2": "2"}

# The overhead terms stay ON here (the subject is what the users see): the run's defaults, BLIS's published
# values (dynlab.latency.overheads). A user sends a request FRONT ms before the engine sees it (its record's
# arrival_ms) and sees its last token TOKEN ms per output token after the engine's finish (finish_ms); its
# next request is sent think time after that.
FRONT = FRONT_END_MS  # --request-overhead-ms default, ms
TOKEN = DETOK_US_PER_TOKEN / 1000.0  # --detok-us-per-token default, in ms per output token
# the linear model's server CPU time of a step of one request (cpu_step_us + cpu_us_per_request, us -> ms)
CPU_ONE = CPU_STEP_US / 1000.0 + CPU_US_PER_REQUEST / 1000.0
# float slack (ms) when comparing a send with the previous answer's last token: the engine computes the send
# as finish + (think + front) + detok, the test the other way round; far below any gap between two events
EPS = 1e-6


def spec(tmp_path, requests=80, rate=5):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"seed": 3, "requests": requests, "arrival": {"process": "poisson", "rate": rate},
                                "input": {"dist": "uniform", "min": 100, "max": 300},
                                "output": {"dist": "uniform", "min": 5, "max": 40}}))
    return str(path)


def records_of(config: SimConfig) -> tuple[dict, list]:
    rec = RequestRecorder()
    out = run(config, recorders=[rec])
    return out, list(rec.records())


def sent(r: dict) -> float:
    """When the user sent ``r`` (a --requests-out record): the front end before the engine's arrival."""
    return r["arrival_ms"] - FRONT


def seen(r: dict) -> float:
    """When the user saw ``r``'s last token: detokenisation of every output token after the engine's finish."""
    return r["finish_ms"] + TOKEN * r["output_length"]


def in_flight(records: list, t: float) -> int:
    """Requests a user sent at or before ``t`` (users' clock) whose last token it has not seen by then (one
    seen at ``t`` is gone), up to :data:`EPS`."""
    return sum(1 for r in records if sent(r) <= t + EPS and t < seen(r) - EPS)


def test_sixty_four_in_flight_until_the_drain(tmp_path):
    """The issue's done-when line, through the CLI and --requests-out."""
    w = spec(tmp_path, requests=700)
    out_file = tmp_path / "r.jsonl"
    res = CliRunner().invoke(main, ["sim", "--timing", "--workload", w, "--concurrency", "64", "--requests", "640",
                                    "--warmup", "128", "--requests-out", str(out_file), "--mode", "rr", "--quiet"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(records) == 640 and result["requests"] == 640
    assert sorted(r["arrival_ms"] for r in records)[:64] == [0.0] * 64  # the engine's clock: sent at -FRONT
    # the users take the requests in the workload's order: whoever sees its answer first sends the next one
    assert [r["id"] for r in sorted(records, key=lambda r: (r["arrival_ms"], r["id"]))] == list(range(640))
    last_sent = sent(max(records, key=lambda r: r["arrival_ms"]))  # on the users' clock from here
    for r in records:  # at every send, 64 requests are in flight: the one sent replaced one that was answered
        if sent(r) < last_sent:  # (at the last send, two users may finish and only one request is left)
            assert in_flight(records, sent(r)) == 64
    # the drain: after the last send nothing new comes, and the requests in flight are answered
    finishes = sorted({seen(r) for r in records if seen(r) > last_sent})
    drain = [in_flight(records, t) for t in finishes]
    assert drain == sorted(drain, reverse=True) and drain[-1] == 0 and in_flight(records, last_sent) <= 64
    assert result["concurrency"] == 64 and result["warmup"] == 128


def test_one_user_sends_after_each_answer_plus_the_think_time(tmp_path):
    config = SimConfig(timing=True, workload=spec(tmp_path, requests=6), concurrency=1, think_time_ms=25.0,
                       latency_model="linear", latency_opts=LINEAR, mode="rr", workers=2)
    out, records = records_of(config)
    records.sort(key=lambda r: r["id"])
    assert records[0]["arrival_ms"] == 0.0
    for prev, nxt in zip(records, records[1:]):  # sent 25 ms after the user saw the last token of the answer
        assert sent(nxt) == pytest.approx(seen(prev) + 25.0, abs=EPS)
    # one request alone on a worker, no cache hit: prefill step 10 + n ms, then one 12 ms step per token,
    # each step plus the server CPU time of a step of one request (CPU_ONE = 0.13044166944 ms)
    first = records[0]
    assert first["first_token_ms"] == pytest.approx(10.0 + first["input_length"] + CPU_ONE, abs=1e-9)
    assert first["finish_ms"] == pytest.approx(
        first["first_token_ms"] + (12.0 + CPU_ONE) * (first["output_length"] - 1), abs=1e-9)


def test_warmup_leaves_the_first_requests_out_of_the_figures(tmp_path):
    config = SimConfig(timing=True, workload=spec(tmp_path), concurrency=4, warmup=10,
                       latency_model="linear", latency_opts=LINEAR, mode="rr")
    out, records = records_of(config)
    measured = [r for r in records if r["id"] >= 10]
    assert len(records) == 80
    # the users' figures: TTFT from the send to the first token seen (front end + one token's detokenisation)
    assert out["ttft_ms"] == stats([r["first_token_ms"] - r["arrival_ms"] + FRONT + TOKEN for r in measured])
    # each gap between two tokens seen: the engine's plus one token's detokenisation
    tpots = [(r["finish_ms"] - r["first_token_ms"]) / (r["output_length"] - 1) + TOKEN for r in measured
             if r["output_length"] > 1]
    assert out["tpot_ms"] == stats(tpots)
    assert out["interactivity"] == stats([1000.0 / t for t in tpots])
    # mean ITL: every gap of every measured request (vLLM's mean_itl_ms), each with its token's detokenisation
    gaps = sum(r["finish_ms"] - r["first_token_ms"] for r in measured)
    assert out["itl_ms"]["mean"] == round(gaps / sum(r["output_length"] - 1 for r in measured) + TOKEN, 1)
    # the span: the engine's, first measured arrival to last finish (BenchmarkRecorder)
    span_s = (max(r["finish_ms"] for r in measured) - min(r["arrival_ms"] for r in measured)) / 1000.0
    tokens = sum(r["input_length"] + r["output_length"] for r in measured)
    assert out["total_tokens_per_s"] == round(tokens / span_s, 1)
    assert out["tokens_per_s_per_gpu"] == round(tokens / span_s / 2, 1)  # two workers of one GPU
    # every request sent counts in "requests"; the figures cover the 70 past the warm-up
    assert (out["requests"], out["warmup"], out["measured_requests"]) == (80, 10, 70) == (80, 10, len(measured))


def test_duration_stops_the_users_sending(tmp_path):
    config = SimConfig(timing=True, workload=spec(tmp_path, requests=200), concurrency=3, duration=0.5,
                       latency_model="linear", latency_opts=LINEAR, mode="rr")
    out, records = records_of(config)
    assert 3 < len(records) < 200
    assert max(r["arrival_ms"] for r in records) <= 500.0
    assert max(r["finish_ms"] for r in records) > 500.0  # the drain finishes what was sent
    assert out["duration_s"] == 0.5


def test_a_trace_in_closed_loop_ignores_its_timestamps(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 1000 * i, "input_length": 600, "output_length": 4,
                                         "hash_ids": [i, i + 100]}) + "\n" for i in range(5)))
    config = SimConfig(timing=True, trace=str(trace), concurrency=5, latency_model="linear", latency_opts=LINEAR,
                       mode="rr")
    _, records = records_of(config)
    assert [r["arrival_ms"] for r in records] == [0.0] * 5


def test_requests_beyond_the_workload_is_one_line_error(tmp_path):
    res = CliRunner().invoke(main, ["sim", "--timing", "--workload", spec(tmp_path, requests=5), "--requests", "9"])
    assert res.exit_code == 2
    (line,) = res.stderr.splitlines()
    assert "--requests 9" in line and "only 5" in line


def test_warmup_must_leave_requests_to_measure(tmp_path):
    res = CliRunner().invoke(main, ["sim", "--timing", "--workload", spec(tmp_path), "--requests", "4",
                                    "--warmup", "4"])
    assert res.exit_code == 2 and "--warmup 4" in res.stderr


def test_without_the_new_options_a_run_has_no_new_keys(tmp_path):
    out = run(SimConfig(timing=True, workload=spec(tmp_path), mode="rr"))
    assert not {"itl_ms", "interactivity", "tokens_per_s_per_gpu", "concurrency"} & set(out)


@given(st.lists(st.tuples(st.floats(0, 1000, allow_nan=False), st.integers(0, 6)), min_size=1, max_size=30))
def test_weighted_stats_are_the_stats_of_the_repeated_values(pairs):
    values = [v for v, w in pairs for _ in range(w)]
    got = weighted_stats([v for v, _ in pairs], [w for _, w in pairs])
    want = stats(values)
    for key in ("p50", "p90", "p99"):
        assert got[key] == want[key] or abs(got[key] - want[key]) <= 0.1 + 1e-9  # float rounding at .x5
    if values:
        assert abs(got["mean"] - round(statistics.fmean(values), 1)) <= 0.1 + 1e-9


def _spec(tmp_path, arrival):
    path = tmp_path / f"{arrival['process']}.json"
    path.write_text(json.dumps({"seed": 3, "requests": 60, "arrival": arrival,
                                "input": {"dist": "uniform", "min": 100, "max": 400},
                                "output": {"dist": "uniform", "min": 5, "max": 40}}))
    return str(path)


def test_a_spec_with_closed_arrivals_runs_as_concurrency_and_think_time(tmp_path):
    closed = _spec(tmp_path, {"process": "closed", "concurrency": 6, "think_time_s": 0.25})
    poisson = _spec(tmp_path, {"process": "poisson", "rate": 3})  # same rows; the users ignore timestamps
    a = CliRunner().invoke(main, ["sim", "--timing", "--workload", closed, "--quiet"])
    b = CliRunner().invoke(main, ["sim", "--timing", "--workload", poisson, "--concurrency", "6",
                                  "--think-time-ms", "250", "--quiet"])
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    assert ra["concurrency"] == 6 and ra["think_time_ms"] == 250.0
    assert ra == rb


@pytest.mark.parametrize("extra, message", [
    (["--timing", "--concurrency", "2"], "--concurrency: the workload spec's arrival is closed loop already (6 users)"),
    ([], "a workload spec with closed-loop arrivals needs --timing"),
])
def test_a_closed_spec_refuses_a_second_arrival_process(tmp_path, extra, message):
    closed = _spec(tmp_path, {"process": "closed", "concurrency": 6})
    r = CliRunner().invoke(main, ["sim", "--workload", closed, "--quiet", *extra])
    assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output


def test_a_closed_spec_needs_whole_users(tmp_path):
    bad = _spec(tmp_path, {"process": "closed", "concurrency": 2.5})
    r = CliRunner().invoke(main, ["sim", "--timing", "--workload", bad, "--quiet"])
    assert r.exit_code != 0 and "arrival.concurrency: must be an integer > 0, got 2.5" in r.output


def _sessions(tmp_path, closed=True):
    path = tmp_path / "sessions.json"
    path.write_text(json.dumps({"seed": 2, "requests": 24, "arrival": {"process": "poisson", "rate": 2},
                                "input": {"dist": "uniform", "min": 100, "max": 300},
                                "output": {"dist": "uniform", "min": 20, "max": 60},
                                "sessions": {"turns": 4, "think_time_s": 1.5, "closed": closed}}))
    return str(path)


def test_a_closed_session_sends_each_turn_think_time_after_the_previous_answer(tmp_path):
    from dynlab.traces.workload_io import workload_requests

    spec = _sessions(tmp_path)
    out = tmp_path / "r.jsonl"
    r = CliRunner().invoke(main, ["sim", "--timing", "--workload", spec, "--quiet", "--requests-out", str(out)])
    assert r.exit_code == 0, r.output
    recs = {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines())}
    follows = workload_requests(spec).follows
    assert len(follows) == 18 and len(recs) == 24  # 6 sessions of 4 turns: 18 later turns
    for child, (parent, think) in follows.items():  # sent think time after the answer's last token was seen
        assert think == 1500.0
        assert sent(recs[child]) == pytest.approx(seen(recs[parent]) + 1500.0, abs=EPS)
    assert workload_requests(_sessions(tmp_path, False)).follows is None  # open-loop turns: at their timestamps


@pytest.mark.parametrize("args, message", [
    ([], "closed session turns needs --timing"),
    (["--timing", "--concurrency", "2"], "--concurrency: the workload spec's session turns wait"),
])
def test_closed_sessions_refuse_what_would_ignore_them(tmp_path, args, message):
    r = CliRunner().invoke(main, ["sim", "--workload", _sessions(tmp_path), "--quiet", *args])
    assert r.exit_code != 0 and message in r.output


def test_a_closed_spec_cannot_be_written_as_a_trace(tmp_path):
    r = CliRunner().invoke(main, ["workload", _sessions(tmp_path), "--out", str(tmp_path / "t.jsonl")])
    assert r.exit_code != 0 and "sessions.closed: a trace has no field" in r.output
    assert not (tmp_path / "t.jsonl").exists()
