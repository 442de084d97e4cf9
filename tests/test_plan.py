"""``dynlab plan``: hand-derived answers on tiny traces with a linear step model, the search's invariants,
the analytic floors, the arrival settings, the log (audit and resume) and bad input.

The traces are written here: every request arrives at t = 0 with its own blocks (no prefix reuse), and
the linear model (``beta0`` = 1 ms per step, ``beta1`` = 0.01 ms per prefill token, ``beta2`` = 0) with a
1,000-token step budget makes a 1,000-token prompt one 11 ms step, so each worker serves its k-th
request's first token at 11 k ms.
"""
from __future__ import annotations

import json
import re
from html import escape

import pytest
from click.testing import CliRunner
from hypothesis import given, strategies as st

from dynlab.cli import main
from dynlab.engine.config import POISSON_RATE, SimConfig
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.plan.analysis import Floors, ideal_hit_tokens, prefill_alone_ms, work_ms, workers_lower_bound
from dynlab.plan.rate import arrival_settings, mean_rate
from dynlab.plan.search import Search, Shape
from dynlab.plan.target import Target
from dynlab.routing.strategy import Request

from helpers import terms_off, terms_off_args

# the hand model alone: every overhead term (server CPU, front end, detokenisation) off
LINEAR = ["--latency-model", "linear", "--latency-opt", "beta0=1", "--latency-opt", "beta1=0.01",
          "--latency-opt", "beta2=0", *terms_off_args("linear"), "--max-num-batched-tokens", "1000", "--modes", "rr",
          "--executor", "serial", "--format", "json", "--quiet"]


def _trace(path, rows) -> str:
    """A Mooncake trace of ``(timestamp ms, input tokens, output tokens)`` rows, each with blocks of its own."""
    ids = iter(range(1, 10**6))
    with open(path, "w") as fh:
        for t, n_in, n_out in rows:
            fh.write(json.dumps({"timestamp": t, "input_length": n_in, "output_length": n_out,
                                 "hash_ids": [next(ids) for _ in range(-(-n_in // 512))]}) + "\n")
    return str(path)


def _plan(*args):
    out = CliRunner().invoke(main, ["plan", *map(str, args)])
    return out


def _json(*args, code: int = 0) -> dict:
    """The plan's JSON; ``code``: the exit status expected (3: no shape meets the target)."""
    out = _plan(*args)
    assert out.exit_code == code, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def queue_trace(tmp_path):
    return _trace(tmp_path / "q.jsonl", [(0, 1000, 1)] * 12)


# --------------------------------------------------------------------------- hand-derived answers
def test_queueing_answer_is_three_workers(queue_trace):
    # N workers by rr hold 12/N requests each: TTFTs 11, 22, ..., 11 * 12/N ms. p99 (inclusive quantiles
    # of 12 values: between the two largest) is 132 * 0.99-ish at 1 worker (130.8), 66 at 2, 44 at 3.
    plan = _json("--trace", queue_trace, "--slo-ttft-ms", 50, *LINEAR)
    (shape,) = plan["shapes"]
    assert (shape["workers"], shape["gpus"], shape["ttft_ms"], shape["binding"]) == (3, 3, 44.0, "queueing")
    assert [(r["workers"], r["meets"]) for r in shape["replays"]] == [(1, False), (2, False), (3, True)]
    assert shape["replays"][1]["misses"] == ["TTFT p99 66 ms > 50 ms"]
    assert shape["why"].startswith("queueing: at 2 workers TTFT p99 66 ms > 50 ms")
    assert shape["headroom"] == round(1 - 44 / 50, 4)
    assert shape["lower_bound_workers"] == 1  # every arrival at one instant: no span to spread the work over


def test_goodput_target(queue_trace):
    # goodput = share with TTFT <= 50 ms: 4/12 at 1 worker (11..44 of 11..132), 8/12 at 2, 12/12 at 3
    two = _json("--trace", queue_trace, "--slo-ttft-ms", 50, "--goodput", 0.6, *LINEAR)["shapes"][0]
    assert (two["workers"], two["goodput"]) == (2, 0.6667)
    assert two["why"].startswith("queueing: at 1 worker goodput 0.3333 < 0.6")
    assert _json("--trace", queue_trace, "--slo-ttft-ms", 50, "--goodput", 0.75, *LINEAR)["shapes"][0]["workers"] == 3


def test_one_worker_is_enough(queue_trace):
    shape = _json("--trace", queue_trace, "--slo-ttft-ms", 200, *LINEAR)["shapes"][0]
    assert (shape["workers"], shape["binding"]) == (1, "none")
    assert [r["workers"] for r in shape["replays"]] == [1]


def test_compute_bound_shape_is_not_given_workers(tmp_path):
    # a 10,000-token prompt takes 10 chunks of 11 ms alone: 110 ms > 100 ms at any worker count;
    # 1 of 13 requests (7.69%) is more than p99 allows. The 12 short ones meet 100 ms once each
    # worker holds at most 9 of them (11 k <= 100): 2 workers (6 each, the long one last on worker 0).
    path = _trace(tmp_path / "c.jsonl", [(0, 1000, 1)] * 12 + [(0, 10000, 1)])
    shape = _json("--trace", path, "--slo-ttft-ms", 100, *LINEAR, code=3)["shapes"][0]
    assert (shape["meets"], shape["workers"], shape["binding"], shape["shown_workers"]) == (False, None, "compute", 2)
    assert shape["never_share"] == round(1 / 13, 6)
    assert "7.69% of requests (1 of 13)" in shape["why"] and "up to 110 ms" in shape["why"]
    assert "no worker count helps" in shape["why"] and "2 workers serve every other request" in shape["why"]
    assert "lowest TTFT target p99 can meet here is about 110 ms" in shape["why"]
    # the floor search's target: 1 - 1/13 - 0.01 of requests within the SLOs; 2 workers give 12/13
    floor = [r for r in shape["replays"] if r["search"] == "floor"]
    assert [(r["workers"], r["meets"]) for r in floor] == [(1, False), (2, True)]


def test_compute_bound_suggests_only_what_the_floors_support(tmp_path):
    # the linear model ignores TP: at twice the TP the 10,000-token prompt still takes 110 ms alone, so
    # TP is not suggested; twice the step budget makes it 5 chunks of 1 + 20 ms = 105 ms: no help at a
    # 100 ms SLO, within a 106 ms one
    path = _trace(tmp_path / "c.jsonl", [(0, 1000, 1)] * 12 + [(0, 10000, 1)])
    why = _json("--trace", path, "--slo-ttft-ms", 100, *LINEAR, code=3)["shapes"][0]["why"]
    assert ("Measured the same way: tp 2 does not lower it (7.69%); max-num-batched-tokens 2000 does not "
            "lower it (7.69%).") in why
    assert "would help" not in why and "Would help" not in why
    why = _json("--trace", path, "--slo-ttft-ms", 106, *LINEAR, code=3)["shapes"][0]["why"]
    assert ("tp 2 does not lower it (7.69%); max-num-batched-tokens 2000 would help (0.00% would still never "
            "meet them, within the 1.00% allowed).") in why


def test_helps_text_by_hand():
    from dynlab.plan.binding import helps_text

    text = helps_text({"tp 2": 0.005, "chunk": 0.02, "x": 0.04}, 0.04, 0.01)
    assert text == ("Measured the same way: tp 2 would help (0.50% would still never meet them, within the 1.00% "
                    "allowed); chunk lowers that share to 2.00%, not enough; x does not lower it (4.00%).")


def test_memory_binding(tmp_path):
    # 100-token prompts generating 1,000 tokens grow to 69 blocks of 16 each; a pool of 80 blocks holds
    # one: two requests on a worker preempt. rr over 4 requests: 4 workers hold one each.
    path = _trace(tmp_path / "m.jsonl", [(0, 100, 1000)] * 4)
    shape = _json("--trace", path, "--slo-ttft-ms", 10000, "--slo-tpot-ms", 1.2, "--capacity", 80, *LINEAR)["shapes"][0]
    assert (shape["workers"], shape["binding"], shape["preemptions"]) == (4, "memory", 0)
    assert shape["why"].startswith("memory: at 3 workers 1 preemption (the pool of 80 blocks per worker runs dry)")


def test_ranking_by_price(queue_trace):
    # h100 and h200 need the same workers under the linear model (it ignores the GPU): price decides
    plan = _json("--trace", queue_trace, "--slo-ttft-ms", 50, "--gpu", "h100,h200", "--price", "h100=3",
                 "--price", "h200=2", *LINEAR)
    assert [(s["shape"], s["usd_per_hour"]) for s in plan["shapes"]] == [("h200x1 rr", 6.0), ("h100x1 rr", 9.0)]


def test_table_and_plot(queue_trace, tmp_path):
    png = tmp_path / "p.png"
    out = _plan("--trace", queue_trace, "--slo-ttft-ms", 50, *LINEAR[:-3], "--format", "table", "--plot", png)
    assert out.exit_code == 0, out.stderr
    head, row = out.stdout.splitlines()[:2]
    assert head.split() == ["rank", "shape", "workers", "gpus", "$/h", "goodput", "ttft_p99_ms", "tpot_p99_ms",
                            "headroom", "binding"]
    # one-token requests have no TPOT: its p99 is null, shown as "-" (issue 24)
    assert row.split() == ["1", "h100x1", "rr", "3", "3", "-", "1.0", "44.0", "-", "12.0%", "queueing"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_report(tmp_path):
    # two shapes answered on the queueing trace: each one's replay at its answer, the ranked table and
    # the binding constraint in words, all in one file that loads nothing
    trace = _trace(tmp_path / "q.jsonl", [(0, 1000, 1)] * 12)
    html = tmp_path / "plan.html"
    out = _plan("--trace", trace, "--slo-ttft-ms", 50, "--gpu", "h100,h200", *LINEAR, "--report", html)
    assert out.exit_code == 0, out.stderr
    plan = json.loads(out.stdout)
    page = html.read_text()
    urls = set(re.findall(r"https?://[^\s\"'<>]+", page))  # the SVG namespaces only: nothing is loaded
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    assert "<svg" in page and 'id="pareto"' in page
    for s in plan["shapes"]:
        assert s["meets"]
        assert f"{s['shape']} N={s['workers']}" in page
        assert escape(s["why"], quote=False) in page  # the binding constraint in words
    assert "rank" in page and "queueing" in page


def test_html_report_refuses_stdout_and_writes_nothing_on_error(queue_trace, tmp_path):
    out = _plan("--trace", queue_trace, "--slo-ttft-ms", 50, *LINEAR, "--report", "-")
    assert out.exit_code == 2 and "- is not accepted" in out.stderr
    html = tmp_path / "none.html"
    out = _plan("--trace", queue_trace, "--slo-ttft-ms", 50, "--gpu", "nope", *LINEAR, "--report", html)
    assert out.exit_code == 2 and out.stdout == "" and not html.exists()


def test_an_infeasible_plan_exits_3_and_writes_its_outputs(queue_trace, tmp_path):
    # one worker at most: TTFT p99 130.8 ms > 50 ms, so no shape meets the target; the plan is still an
    # answer: the JSON, the log, the plot and the report (the replay at 1 worker, "(misses)") are written
    html, log, png = tmp_path / "p.html", tmp_path / "p.jsonl", tmp_path / "p.png"
    out = _plan("--trace", queue_trace, "--slo-ttft-ms", 50, "--max-workers", 1, *LINEAR[:-1], "--report", html,
                "--log", log, "--plot", png)
    assert out.exit_code == 3, out.stderr
    (shape,) = json.loads(out.stdout)["shapes"]
    assert (shape["meets"], shape["shown_workers"]) == (False, 1)
    assert out.stderr.splitlines()[-1] == ("plan: no shape meets the target (exit 3); each shape's binding "
                                           "constraint says why")
    assert "h100x1 rr N=1 (misses)" in html.read_text()
    assert len(log.read_text().splitlines()) == 1 and png.read_bytes()[:4] == b"\x89PNG"
    # a plan in which one shape meets exits 0 (h200 meets at 1 worker with a 200 ms SLO; h100 too)
    assert _plan("--trace", queue_trace, "--slo-ttft-ms", 200, "--max-workers", 1, *LINEAR).exit_code == 0


def test_the_parentheses_footnote_only_when_a_shape_misses(queue_trace):
    met = _plan("--trace", queue_trace, "--slo-ttft-ms", 50, *LINEAR[:-3], "--format", "table").stdout
    assert "parentheses" not in met and "(" not in met.splitlines()[1]
    missed = _plan("--trace", queue_trace, "--slo-ttft-ms", 50, "--max-workers", 2, *LINEAR[:-3], "--format", "table")
    assert missed.exit_code == 3 and "workers in parentheses: the shape misses the target" in missed.stdout


def test_help_has_no_sim_wording():
    text = CliRunner().invoke(main, ["plan", "--help"]).stdout
    assert "--timing" not in text and "With a CPU tier: GB/s" in " ".join(text.split())
    # a fresh user's trial: --spec-tokens spoke of compare; plan's says what plan does with a list of K
    assert "compare" not in text and "plan --spec-tokens 0,2,4 sizes the fleet for each K" in " ".join(text.split())


# --------------------------------------------------------------------------- the log: audit and resume
def test_every_logged_replay_reruns_as_sim(queue_trace, tmp_path):
    import dynlab

    log = tmp_path / "log.jsonl"
    _json("--trace", queue_trace, "--slo-ttft-ms", 50, *LINEAR, "--log", log)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["cell"]["workers"] for r in records] == [1, 2, 3]
    for r in records:
        assert dynlab.run(SimConfig(**r["cell"])) == r["result"]


def test_resume_reuses_the_log(queue_trace, tmp_path):
    log = tmp_path / "log.jsonl"
    args = ["--trace", queue_trace, "--slo-ttft-ms", 50, *LINEAR[:-1], "--log", log]
    first = _plan(*args)
    text = log.read_text()
    again = _plan(*args, "--resume")
    assert again.exit_code == 0 and again.stdout == first.stdout
    assert "plan: 3 replays in" in again.stderr and f"; 3 from {log}" in again.stderr
    assert log.read_text() == text
    # an interrupted run: the last record cut short; resume drops it, reruns that replay, same answer
    lines = text.splitlines(keepends=True)
    log.write_text("".join(lines[:2]) + lines[2][:20])
    cut = _plan(*args, "--resume")
    assert cut.exit_code == 0 and cut.stdout == first.stdout and "; 2 from" in cut.stderr
    assert log.read_text() == text


def test_a_log_with_records_needs_resume(queue_trace, tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("x\n")
    out = _plan("--trace", queue_trace, "--slo-ttft-ms", 50, *LINEAR, "--log", log)
    assert out.exit_code == 2 and len(out.stderr.splitlines()) == 1 and "--resume" in out.stderr
    assert log.read_text() == "x\n"


# --------------------------------------------------------------------------- bad input: one line, exit 2
@pytest.mark.parametrize("args, words", [
    ([], "give at least one SLO"),
    (["--slo-ttft-ms", "50", "--gpu", "h100,nope"], "unknown GPU 'nope'"),
    (["--slo-ttft-ms", "50", "--gpu", "h100,"], "empty value"),
    (["--slo-ttft-ms", "50", "--tp", "1,1"], "repeats"),
    (["--slo-ttft-ms", "50", "--price", "h200=2"], "not a --gpu candidate"),
    (["--slo-ttft-ms", "50", "--gpu", "h100,h200", "--price", "h100=2"], "no price for h200"),
    (["--slo-ttft-ms", "50", "--price", "h100=cheap"], "not a number"),
    (["--slo-ttft-ms", "50", "--rate", "2", "--rate-scale", "2"], "give one"),
    (["--slo-ttft-ms", "50", "--goodput", "1.5"], "--goodput"),
    (["--slo-ttft-ms", "50", "--goodput", "0.9", "--slo-percentile", "p90"], "--slo-percentile has no effect"),
    (["--slo-ttft-ms", "50", "--slo-percentile", "p95"], "--slo-percentile"),
    (["--slo-ttft-ms", "50", "--pcie-gbps", "5"], "--pcie-gbps has no effect"),
    (["--slo-ttft-ms", "50", "--capacity", "0"], "'--capacity': 0 is not in the range x>=1"),  # was the replay's
    (["--slo-ttft-ms", "50", "--resume"], "--resume needs --log"),
    (["--slo-ttft-ms", "50", "--modes", "nope"], "unknown strategy 'nope'"),
    (["--slo-ttft-ms", "50", "--model", "qwen3-8b", "--tp", "3"], "--tp 3 cannot split"),
    (["--slo-ttft-ms", "50", "--latency-opt", "beta0=1"], "has no option 'beta0'"),
    (["--slo-ttft-ms", "50", "--plot", "p.xyz"], "cannot write a .xyz plot"),
    (["--slo-ttft-ms", "50", "--concurrency", "4", "--rate", "2"], "--rate has no effect with closed-loop users"),
    (["--slo-ttft-ms", "50", "--concurrency", "4", "--rate-scale", "2"], "--rate-scale has no effect with closed-loop"),
    (["--slo-ttft-ms", "50", "--concurrency", "4", "--requests", "13"], "--requests 13: the workload has only 12"),
    (["--slo-ttft-ms", "50", "--think-time-ms", "5"], "--think-time-ms has no effect without --concurrency"),
    (["--slo-ttft-ms", "50", "--concurrency", "4", "--requests", "4", "--warmup", "4"], "leaves none of --requests 4"),
])
def test_bad_input_is_one_line(queue_trace, args, words):
    out = _plan("--trace", queue_trace, "--executor", "serial", *args)
    assert out.exit_code == 2, out.stdout
    (line,) = out.stderr.splitlines()
    assert line.startswith("Error: ") and words in line, line


def test_a_bad_trace_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 5}\n')
    out = _plan("--trace", path, "--slo-ttft-ms", 50, "--executor", "serial")
    (line,) = out.stderr.splitlines()
    assert out.exit_code == 1 and line.startswith(f"Error: {path}:2:"), line


# --------------------------------------------------------------------------- pieces, by hand
def _linear():
    """The hand model, its server terms off."""
    opts = terms_off("linear", {"beta0": 1.0, "beta1": 0.01, "beta2": 0.0})["latency_opts"]
    return build_latency_model("linear", hardware_for(), opts)


def test_prefill_alone_by_hand():
    lat = _linear()
    assert prefill_alone_ms(lat, 10000, 0, 1000) == pytest.approx(10 * 11.0)
    assert prefill_alone_ms(lat, 10000, 5000, 1000) == pytest.approx(5 * 11.0)
    assert prefill_alone_ms(lat, 1500, 0, 1000) == pytest.approx(11.0 + 6.0)
    assert prefill_alone_ms(lat, 100, 100, 1000) == pytest.approx(1 + 0.01)  # the last token is recomputed


def test_ideal_hits_by_hand():
    reqs = [Request((1, 2, 3), 1500), Request((1, 2, 4), 1100), Request((5,), 300), Request((1, 2), 1024)]
    # 512-token trace blocks, 16-token engine blocks: 2 leading blocks seen (1,024 tokens), none, and
    # the whole prompt seen but its last token recomputed (1,023 -> 1,008 in whole blocks)
    assert ideal_hit_tokens(reqs, 512, 16) == [0, 1024, 0, 1008]


def test_lower_bound_by_hand():
    # 12 prompts of 1,000 tokens every 10 ms: 132 ms of prefill over a 110 ms span: 2 workers at least
    reqs = [Request((i,), 1000, 1, timestamp=10 * i) for i in range(12)]
    off = terms_off("linear", {"beta0": "1", "beta1": "0.01", "beta2": "0"})  # floors without the client terms
    config = SimConfig(max_num_batched_tokens=1000, timing=True, latency_model="linear", **off)
    fl = Floors(tuple([11.0] * 12), tuple([None] * 12))
    assert work_ms(reqs, _linear(), config, fl) == (132.0, 0.0)  # one output token each: no decode
    assert workers_lower_bound(reqs, config, work_ms(reqs, _linear(), config, fl)) == 2
    half = SimConfig(time_scale=0.5, latency_model="linear", **off)
    assert workers_lower_bound(reqs, half, work_ms(reqs, _linear(), half, fl)) == 3  # 132 / 55


def test_floors_add_the_client_terms_by_hand():
    # 1,000-token prompts alone: 11 ms, plus the 5 ms front end and one token's 0.5 ms detokenisation; a
    # decode alone 1 ms (beta0) plus 0.5 ms per token; a one-token request has no TPOT floor (no term added
    # to it). The client terms are no GPU work: the prefill work is the two 11 ms steps
    from dynlab.plan.analysis import floors

    reqs = [Request((1, 2), 1000, 1, timestamp=0), Request((3, 4), 1000, 3, timestamp=0)]
    off = terms_off("linear", {"beta0": "1", "beta1": "0.01", "beta2": "0"})
    config = SimConfig(max_num_batched_tokens=1000, timing=True, latency_model="linear",
                       **{**off, "request_overhead_ms": 5.0, "detok_us_per_token": 500.0})
    fl = floors(reqs, _linear(), config, 512)
    assert fl.ttft == pytest.approx((16.5, 16.5)) and fl.tpot[0] is None and fl.tpot[1] == pytest.approx(1.5)
    assert work_ms(reqs, _linear(), config, fl)[0] == pytest.approx(22.0)


def test_floor_shares_by_hand():
    fl = Floors((10.0, 20.0, 30.0, 40.0), (1.0, None, 5.0, 1.0))
    assert fl.never_share(25.0, None) == 0.5
    assert fl.never_share(None, 2.0) == 0.25
    assert fl.never_share(25.0, 2.0) == 0.5  # the third misses both
    assert fl.ttft_quantile(0.5) == 20.0 and fl.ttft_quantile(0.99) == 40.0


def test_arrival_settings_by_hand():
    timed = [Request((i,), 1, 1, timestamp=1000 * i) for i in range(3)]  # 2 gaps over 2 s: 1 request/s
    assert mean_rate(timed) == 1.0
    assert arrival_settings(timed, rate=4) == (0.25, None)
    assert arrival_settings(timed, rate_scale=2) == (0.5, None)
    assert arrival_settings(timed) == (1.0, None)
    untimed = [Request((i,), 1, 1) for i in range(3)]
    assert arrival_settings(untimed, rate=3) == (1.0, 3)
    assert arrival_settings(untimed, rate_scale=2) == (1.0, 2 * POISSON_RATE)
    with pytest.raises(ValueError, match="one instant"):
        arrival_settings([Request((i,), 1, 1, timestamp=0) for i in range(3)], rate=2)
    assert arrival_settings(timed, concurrency=4) == arrival_settings(untimed, concurrency=4) == (1.0, None)
    with pytest.raises(ValueError, match="--rate has no effect with closed-loop users"):
        arrival_settings(untimed, rate=3, concurrency=4)


# --------------------------------------------------------------------------- closed loop (--concurrency)
# C users on the queue trace: each 1,000-token prompt is one 11 ms step and its only output token, so a
# user's next request is sent the moment the previous one's step ends. On N workers by rr, C/N users share
# a worker: each request waits behind the C/N - 1 others of its worker, TTFT 11 * C/N ms once warm.
@pytest.mark.parametrize("slo, workers, ttft, tried", [(50, 1, 44.0, [1]), (30, 2, 22.0, [1, 2]),
                                                     (15, 4, 11.0, [1, 2, 3, 4])])
def test_closed_loop_answers_by_hand(queue_trace, slo, workers, ttft, tried):
    plan = _json("--trace", queue_trace, "--concurrency", 4, "--slo-ttft-ms", slo, *LINEAR)
    assert plan["arrivals"] == "12 requests, closed loop: 4 users, think time 0 ms"
    (shape,) = plan["shapes"]
    assert (shape["workers"], shape["ttft_ms"], shape["lower_bound_workers"]) == (workers, ttft, 1)
    assert [r["workers"] for r in shape["replays"]] == tried


def test_closed_loop_search_stops_at_the_users(queue_trace):
    # 2 users never keep more than 2 workers busy: the search's cap, and the binding sentence says so
    out = _plan("--trace", queue_trace, "--concurrency", 2, "--slo-ttft-ms", 15, "--goodput", 1.0, *LINEAR)
    shape = json.loads(out.stdout)["shapes"][0]
    assert max(r["workers"] for r in shape["replays"]) <= 2


def test_closed_loop_warmup_and_requests_bound_the_measured_requests(queue_trace):
    # 8 requests, the first 4 (all sent at t = 0: TTFTs 11..44 ms on one worker) not measured: the
    # other 4 wait behind 3 each, 44 ms
    plan = _json("--trace", queue_trace, "--concurrency", 4, "--requests", 8, "--warmup", 4, "--slo-ttft-ms", 50,
                 *LINEAR)
    assert plan["arrivals"] == "8 requests, closed loop: 4 users, think time 0 ms, the first 4 not measured"
    assert plan["shapes"][0]["ttft_ms"] == 44.0


def test_a_closed_workload_spec_plans_without_a_rate(tmp_path):
    spec = tmp_path / "closed.json"
    spec.write_text(json.dumps({"seed": 1, "requests": 12, "arrival": {"process": "closed", "concurrency": 4,
                                                                      "think_time_s": 0.5},
                                "input": {"dist": "constant", "value": 1000}, "output": {"dist": "constant", "value": 1}}))
    plan = _json("--workload", spec, "--slo-ttft-ms", 50, *LINEAR)
    assert plan["arrivals"] == "12 requests, closed loop: 4 users, think time 500 ms"
    assert plan["shapes"][0]["workers"] == 1


# --------------------------------------------------------------------------- the search's invariants
def _drive(search: Search, meets, flat_from=None) -> None:
    # a miss improves with every worker added (until ``flat_from``: from there on the same replay)
    while (n := search.next_workers()) is not None:
        miss = 100.0 + 1000.0 / (n if flat_from is None else min(n, flat_from))
        search.record(n, {"ttft_ms": {"p99": 1.0 if meets(n) else miss}})


@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40))
def test_monotone_search_finds_the_threshold(k, lower, cap):
    # meets exactly from k workers on: the answer is k (tested, with k - 1 tested and missing), or
    # nothing when k is past the cap (then the cap itself was tried)
    s = Search(SimConfig(), Target(10.0), min(lower, cap), cap)
    _drive(s, lambda n: n >= k)
    if k <= cap:
        assert s.best() == k and s.tested[k][0]
        assert k == 1 or s.tested[k - 1][0] is False
    else:
        assert s.best() is None and max(s.tested) == cap
    assert s.monotone_note() == ""


@given(st.sets(st.integers(1, 30)), st.integers(1, 30))
def test_any_search_ends_verified(good, lower):
    # whatever the replays say, the answer meets the target and one fewer was replayed and missed;
    # a miss seen above the answer is said
    s = Search(SimConfig(), Target(10.0), lower, 30)
    _drive(s, lambda n: n in good)
    best = s.best()
    if best is not None:
        assert best in good and (best == 1 or s.tested[best - 1][0] is False)
        worse = [n for n, (ok, _) in s.tested.items() if not ok and n > best]
        assert bool(s.monotone_note()) == bool(worse)


@given(st.integers(1, 20), st.integers(1, 40))
def test_a_plateau_stops_the_gallop(flat_from, lower):
    # never met, and from ``flat_from`` workers on every replay is the same: the search stops at the
    # second such count instead of galloping to the cap
    s = Search(SimConfig(), Target(10.0), lower, 1000)
    _drive(s, lambda n: False, flat_from)
    a, b = s.plateau()
    assert a < b and a >= flat_from and max(s.tested) == b < 1000


def test_routing_binding_when_workers_stop_helping(tmp_path):
    # kv sends every request to the worker holding its prefix: all share one block, so one worker
    # takes them all, however many there are (TTFTs 11, 22, ..., 132 ms on it)
    ids = iter(range(100, 10**6))
    rows = [{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, next(ids)]}
            for _ in range(12)]
    path = tmp_path / "k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [a if a != "rr" else "kv" for a in LINEAR]
    shape = _json("--trace", path, "--slo-ttft-ms", 50, *args, code=3)["shapes"][0]
    assert (shape["meets"], shape["binding"]) == (False, "routing")
    assert [r["workers"] for r in shape["replays"]] == [1, 2]
    assert shape["why"].startswith("routing: the replays at 1 and 2 workers are the same")


def test_json_keys_are_pinned(queue_trace):
    plan = _json("--trace", queue_trace, "--slo-ttft-ms", 50, *LINEAR)
    assert list(plan) == ["target", "percentile", "slo_ttft_ms", "slo_tpot_ms", "goodput_target", "slo_classes",
                          "arrivals", "time_scale", "prices", "max_workers", "shapes"]
    assert list(plan["shapes"][0]) == [
        "shape", "model", "gpu", "tp", "mode", "cpu_memory_gb", "ep", "spec_tokens", "pd", "meets", "workers",
        "shown_workers", "split", "gpus",
        "usd_per_hour", "goodput", "ttft_ms", "tpot_ms", "headroom", "preemptions", "error_band_pct", "latency_domain",
        "extrapolated", "binding", "why",
        "never_share", "slo_floors", "lower_bound_workers", "replays", "binding_class", "by_class", "class_floors"]
    assert list(plan["shapes"][0]["replays"][0]) == ["workers", "meets", "misses", "search"]
    assert (plan["target"], plan["arrivals"], plan["max_workers"]) == (
        "TTFT <= 50 ms at p99", "12 requests, all at one instant", 128)


def test_ctrl_c_keeps_the_log_and_resume_finishes(queue_trace, tmp_path):
    # the second replay blocks until the interrupt (its start is the readiness sign): the first one is
    # in the log, complete; --resume then runs the rest and answers as an uninterrupted plan
    import os
    import signal
    import subprocess
    import sys
    import textwrap

    from helpers import HANG, interruptible, wait_for

    log, ready = tmp_path / "log.jsonl", tmp_path / "started"
    code = textwrap.dedent(f"""
        import sys, time
        from dynlab.sweep import executors
        real, calls = executors.run, []

        def run(*a, **k):
            calls.append(1)
            if len(calls) == 2:
                open({str(ready)!r}, "w").close()
                time.sleep({HANG})
            return real(*a, **k)

        executors.run = run
        from dynlab._entry import main
        sys.argv[0] = "dynlab"
        sys.exit(main())
    """)
    args = ["plan", "--trace", queue_trace, "--slo-ttft-ms", "50", *LINEAR, "--log", str(log)]
    proc = interruptible([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(ready.exists, proc, "the second replay")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 130 and err.decode().strip() == "Aborted!" and out == b""
    assert [json.loads(line)["cell"]["workers"] for line in log.read_text().splitlines()] == [1]
    resumed = _json("--trace", queue_trace, "--slo-ttft-ms", 50, *LINEAR, "--log", log, "--resume")
    assert resumed == _json("--trace", queue_trace, "--slo-ttft-ms", 50, *LINEAR)
    assert len(log.read_text().splitlines()) == 3


def test_binding_is_prefill_when_the_ttft_tail_is_not_the_queue_wait():
    """docs/plan.md's H200 x 2 shape at 15 workers as it read before the overhead terms (a hand case now): TTFT p99 2,003.1 ms > 2,000 with a queue wait p99 of 3.7 ms
    (under half the 2,000 ms SLO: the other 1,999.4 ms, after scheduling, are the tail): prefill, not queueing.
    A queue wait p99 of 1,000 ms (half the SLO) or more is queueing; a TPOT-only miss stays queueing; a
    preemption is memory first."""
    from dynlab.plan.binding import KINDS, replay_text
    from dynlab.plan.target import Target

    target = Target(slo_ttft_ms=2000, slo_tpot_ms=50)

    def result(ttft, wait, tpot=7.0, pre=0):
        return {"ttft_ms": {"p99": ttft}, "tpot_ms": {"p99": tpot}, "queue_wait_ms": {"p99": wait},
                "preemptions": pre, "rejected": 0, "kv_blocks": 100}

    kind, text = replay_text(target, 15, result(2003.1, 3.7), 0.0)
    assert kind == "prefill" and kind in KINDS
    assert text.startswith("prefill: at 15 workers TTFT p99 2003.1 ms > 2000 ms, but the queue wait p99 is only 3.7 ms: "
                           "the TTFT tail is the prompts' own prefill")
    assert replay_text(target, 15, result(2003.1, 1000.0), 0.0)[0] == "queueing"   # 2 x 1000 = the SLO
    assert replay_text(target, 15, result(2003.1, 999.9), 0.0)[0] == "prefill"     # 2 x 999.9 < 2000
    assert replay_text(target, 15, result(1900.0, 3.7, tpot=60.0), 0.0)[0] == "queueing"  # TPOT only
    assert replay_text(target, 15, result(2003.1, 3.7, pre=1), 0.0)[0] == "memory"
    assert replay_text(Target(slo_ttft_ms=2000, goodput=0.99), 15, {**result(2003.1, 3.7), "goodput": 0.9},
                       0.0)[0] == "queueing"  # a goodput miss does not say which SLO


def test_a_trace_block_the_trace_does_not_fit_is_the_same_line_and_exit_in_plan_and_sim():
    """--trace-block 16 on the bundled Mooncake trace: its first row holds 14 ids for 6,758 tokens, and
    16-token blocks need ceil(6758 / 16) = 423. A bad line of the input (FILE:LINE: why), exit 1, in both."""
    line = ("Error: mooncake-conversation:1: hash_ids holds 14 ids, but input_length 6758 needs ceil(6758/16) = 423 "
            "(one per 16-token block)")
    common = ["--trace", "mooncake-conversation", "--trace-block", "16", "--quiet"]
    plan = CliRunner().invoke(main, ["plan", *common, "--slo-ttft-ms", "2000", "--executor", "serial"])
    sim = CliRunner().invoke(main, ["sim", *common, "--timing"])
    assert plan.exit_code == sim.exit_code == 1
    assert plan.stderr.strip() == sim.stderr.strip() == line


def test_requests_that_never_fit_the_pool_are_memory_not_routing(tmp_path):
    """A 2,000-token prompt needs ceil(2000 / 16) = 125 blocks, over a pool of 80: every such request is
    rejected at 1 and at 2 workers alike, so the replays are the same (the search stops at 2) but no worker
    is idle (rr gives each one): memory, and more workers are not said to help."""
    path = _trace(tmp_path / "r.jsonl", [(0, 2000, 10)] * 4)
    shape = _json("--trace", path, "--slo-ttft-ms", 10000, "--capacity", 80, *LINEAR, code=3)["shapes"][0]
    assert (shape["meets"], shape["binding"]) == (False, "memory")
    assert [r["workers"] for r in shape["replays"]] == [1, 2]
    assert shape["why"] == ("memory: at 2 workers 4 request(s) rejected (they never fit one worker's pool of 80 "
                            "blocks); more workers and a CPU tier do not help the rejected requests; a larger pool "
                            "per worker (higher TP, less --gpu-memory-utilization lost, a smaller model) does")


def test_memory_and_routing_sentences_by_hand():
    """memory_text: rejections (with or without preemptions, with a goodput miss) never say more workers
    help; preemptions alone do, unless the replays were the same. idle: a 0 in requests_per_worker."""
    from dynlab.plan.binding import idle, memory_text, replay_text
    from dynlab.plan.target import Target

    r = {"preemptions": 15, "rejected": 59, "kv_blocks": 80, "goodput": 0.06}
    text = memory_text("8 workers", r, ["goodput 0.0600 < 0.5"])
    assert text.startswith("memory: at 8 workers 15 preemptions and 59 request(s) rejected (they never fit one "
                           "worker's pool of 80 blocks) and goodput 0.0600 < 0.5; more workers and a CPU tier do not")
    assert "more workers help" not in text and "(more workers)" not in text
    pre = {"preemptions": 2, "rejected": 0, "kv_blocks": 80}
    assert memory_text("3 workers", pre, ["TTFT p99 20 ms > 10 ms"]).endswith(
        "fewer requests per worker (more workers), a larger pool (higher TP) or a CPU tier helps")
    assert "more workers do not help (the replays at 2 and 3 workers are the same)" in \
        memory_text("3 workers", pre, ["TTFT p99 20 ms > 10 ms"], (2, 3))
    q = {"ttft_ms": {"p99": 300.0}, "tpot_ms": {"p99": 5.0}, "queue_wait_ms": {"p99": 200.0},
         "preemptions": 0, "rejected": 0}
    kind, text = replay_text(Target(slo_ttft_ms=150), 3, q, 0.0, same=(2, 3))
    assert kind == "queueing" and text.endswith("more workers do not help (the replays at 2 and 3 workers are the same)")
    assert idle({"requests_per_worker": [5, 0, 0]}) and not idle({"requests_per_worker": [1, 1, 1]})


# --------------------------------------------------------------------------- --objective cost (issue 41 item 5)
def test_objective_cost_prices_at_the_table_and_names_the_cheapest(queue_trace):
    # both GPUs need 3 workers under the linear model (it ignores the GPU): h200 at --price's $2 is 3 x 2 = $6/h,
    # h100 at the table's $6.88 is 3 x 6.88 = $20.64/h; the cheapest is h200x1, bound by queueing
    from dynlab.models.prices import PRICES

    plan = _json("--trace", queue_trace, "--slo-ttft-ms", 50, "--gpu", "h100,h200", "--price", "h200=2",
                 "--objective", "cost", *LINEAR)
    assert [(s["shape"], s["gpus"], s["usd_per_hour"]) for s in plan["shapes"]] == [
        ("h200x1 rr", 3, 6.0), ("h100x1 rr", 3, 20.64)]
    assert plan["objective"] == "cost" and plan["prices"] == {"h100": 6.88, "h200": 2.0}
    assert plan["price_source"] == {"h100": PRICES["h100"].source(), "h200": "--price"}
    assert {k: plan["cheapest"][k] for k in ("shape", "workers", "gpus", "usd_per_hour", "binding", "price_source")} \
        == {"shape": "h200x1 rr", "workers": 3, "gpus": 3, "usd_per_hour": 6.0, "binding": "queueing",
            "price_source": "--price"}
    out = _plan("--trace", queue_trace, "--slo-ttft-ms", 50, "--gpu", "h100,h200", "--price", "h200=2",
                "--objective", "cost", *LINEAR[:-3], "--format", "table")
    assert "cheapest meeting the target: h200x1 rr, 3 workers (3 GPUs), $6.00/h; binding: queueing" in out.stdout
    assert "price of h200: --price" in out.stdout and f"price of h100: {PRICES['h100'].source()}" in out.stdout


def test_objective_gpus_is_the_plan_without_it(queue_trace):
    args = ("--trace", queue_trace, "--slo-ttft-ms", 50, "--gpu", "h100,h200", *LINEAR)
    assert _json(*args, "--objective", "gpus") == _json(*args)
    assert "objective" not in _json(*args) and "cheapest" not in _json(*args)


def test_more_gpus_at_a_lower_price_rank_first_on_cost():
    # h100 x tp1 at 3 workers: 3 GPUs x $6.88 = $20.64/h; a100-40gb x tp2 at 3 workers: 6 GPUs x $2.7447 = $16.4682
    # -> $16.47/h. By GPUs the h100 shape is first (3 < 6); by cost the a100-40gb one (16.47 < 20.64).
    from types import SimpleNamespace

    from dynlab.models.prices import PRICES
    from dynlab.plan.report import ranked, usd_per_hour

    def outcome(gpu, tp):
        return SimpleNamespace(workers=3, shown=3, shape=Shape("llama-3.1-8b", gpu, tp, "rr"), shown_result=dict,
                               search=SimpleNamespace(target=SimpleNamespace(headroom=lambda r: 0.1)))

    h100, a100 = outcome("h100", 1), outcome("a100-40gb", 2)
    prices = {g: PRICES[g].usd_per_gpu_hour for g in ("h100", "a100-40gb")}
    assert (usd_per_hour(h100, prices), usd_per_hour(a100, prices)) == (20.64, 16.47)
    assert ranked([h100, a100], {}) == [h100, a100]
    assert ranked([h100, a100], prices) == [a100, h100]


def test_objective_cost_refuses_a_gpu_without_a_price(queue_trace):
    out = _plan("--trace", queue_trace, "--executor", "serial", "--slo-ttft-ms", "50", "--gpu", "h100,l4",
                "--objective", "cost")
    assert out.exit_code == 2
    (line,) = out.stderr.splitlines()
    assert line == ("Error: --objective cost: no price for GPU l4: give --price l4=USD (USD per GPU-hour; the bundled "
                    "table has h100, a100-80gb, a100-40gb, a100-80gb-pcie, h100-nvl, h200)")
def test_dp_attention_shape_counts_ranks_and_gpus(queue_trace):
    # Qwen3-30B-A3B (a MoE), --ep 1,2 --dp-attention: the ep 1 shape is one-GPU workers as above (3 workers,
    # 3 GPUs); the ep 2 shape's worker is 2 attention ranks on 2 GPUs. By rr its 2N ranks hold 12 / 2N
    # requests each and step in lockstep, every step one 1,000-token prompt per rank: 1 + 10 = 11 ms, so a
    # rank's k-th first token is at 11 k ms. 1 worker: 6 per rank, TTFT p99 66 > 50; 2 workers: 3 per rank,
    # TTFTs up to 33 <= 50: 2 workers, 2 x 1 (tp) x 2 (ranks) = 4 GPUs.
    plan = _json("--trace", queue_trace, "--slo-ttft-ms", 50, "--model", "qwen3-30b-a3b", "--ep", "1,2",
                 "--dp-attention", *LINEAR)
    by = {s["shape"]: s for s in plan["shapes"]}
    assert set(by) == {"h100x1 rr", "h100x1 ep2 dp2 rr"}
    assert (by["h100x1 rr"]["workers"], by["h100x1 rr"]["gpus"]) == (3, 3) and "dp_attention" not in by["h100x1 rr"]
    dp = by["h100x1 ep2 dp2 rr"]
    assert (dp["workers"], dp["gpus"], dp["ttft_ms"], dp["dp_attention"]) == (2, 4, 33.0, True)
    assert [(r["workers"], r["meets"]) for r in dp["replays"]] == [(1, False), (2, True)]


def test_dp_attention_without_an_ep_above_tp_is_refused(queue_trace):
    out = _plan("--trace", queue_trace, "--slo-ttft-ms", 50, "--model", "qwen3-30b-a3b", "--ep", "1",
                "--dp-attention", *LINEAR)
    assert out.exit_code == 2 and "--dp-attention has no effect: no --ep candidate exceeds a --tp candidate" in out.output


def test_objective_cost_prices_a_gpu_file_by_its_name(queue_trace, tmp_path):
    # the error names the file's GPU (h20); --price h20=2 prices the candidate --gpu h20.json (3 workers of one GPU
    # under the linear model: 3 x $2 = $6/h); the file as written works too
    gpu = tmp_path / "h20.json"
    gpu.write_text(json.dumps({"name": "h20", "memory_gb": 96, "bf16_tflops": 148, "hbm_gbps": 4000, "source": "s"}))
    missing = _plan("--trace", queue_trace, "--executor", "serial", "--slo-ttft-ms", "50", "--gpu", str(gpu),
                    "--objective", "cost")
    assert missing.exit_code == 2 and "no price for GPU h20: give --price h20=USD" in missing.stderr
    for priced in ("h20=2", f"{gpu}=2"):
        plan = _json("--trace", queue_trace, "--slo-ttft-ms", 50, "--gpu", str(gpu), "--price", priced,
                     "--objective", "cost", *LINEAR)
        assert [(s["gpus"], s["usd_per_hour"]) for s in plan["shapes"]] == [(3, 6.0)]
