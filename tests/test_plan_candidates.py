"""``dynlab plan``'s candidate kinds beyond model x GPU x TP x mode x CPU tier: ``--workload SPEC``, ``--ep``,
``--spec-tokens`` (with ``--spec-method``) and ``--split auto`` (the P/D split search), each on a small trace
with the linear step model of tests/test_plan.py (cheap: serial replays of tens of requests).
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from dynlab.engine.config import SimConfig
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.plan.analysis import floors, prefill_share, work_ms
from dynlab.plan.search import PdSearch, Shape
from dynlab.plan.target import Target
from dynlab.routing.strategy import Request

from helpers import terms_off
from test_plan import LINEAR, _json, _plan, _trace

#: each decode request adds 0.001 ms to a step (beta2), so TPOT grows with the decode batch
DECODE = [a if a != "beta2=0" else "beta2=0.001" for a in LINEAR]


@pytest.fixture
def steady(tmp_path):
    """40 requests of 1,000 prompt and 40 output tokens, one every 5 ms, each with blocks of its own."""
    return _trace(tmp_path / "s.jsonl", [(5 * i, 1000, 40) for i in range(40)])


def _cells(log) -> list[dict]:
    return [json.loads(line)["cell"] for line in log.read_text().splitlines()]


# --------------------------------------------------------------------------- --split auto: P/D
def test_split_auto_answers_a_total_and_a_split_verified_below(steady, tmp_path):
    log = tmp_path / "log.jsonl"
    plan = _json("--trace", steady, "--slo-ttft-ms", 30, "--slo-tpot-ms", 3, *DECODE, "--split", "agg,auto",
                 "--link-gbps", 100, "--log", log)
    by = {s["shape"]: s for s in plan["shapes"]}
    pd, agg = by["h100x1 rr P/D"], by["h100x1 rr"]
    assert (pd["pd"], pd["meets"], agg["pd"], agg["split"]) == (True, True, False, None)
    p, d = map(int, pd["split"].split(":"))
    assert p + d == pd["workers"] and pd["gpus"] == pd["workers"]
    cells = _cells(log)
    splits = [c["split"] for c in cells if "split" in c]
    assert pd["split"] in splits and all(sum(map(int, s.split(":"))) >= 2 for s in splits)
    # every split tried one worker fewer missed (N - 1 verified at each split the ratio search tried)
    below = [r for r in pd["replays"] if r["workers"] == pd["workers"] - 1]
    assert pd["workers"] == 2 or (below and not below[0]["meets"])
    # the P/D options are the P/D candidate's: its replays carry them, the aggregated ones do not
    assert {c.get("link_gbps") for c in cells if "split" in c} == {100.0}
    assert all("link_gbps" not in c for c in cells if "split" not in c)


def test_split_auto_table_shows_the_split(steady, tmp_path):
    html = tmp_path / "p.html"
    out = _plan("--trace", steady, "--slo-ttft-ms", 30, "--slo-tpot-ms", 3, *DECODE[:-3], "--split", "auto",
                "--format", "table", "--report", html)
    assert out.exit_code == 0, out.stderr
    assert "h100x1 rr P/D N=4" in html.read_text()
    row = out.stdout.splitlines()[1].split()
    assert row[1:5] == ["h100x1", "rr", "P/D", "4"] and row[5] == "[3:1]", row
    assert "[P:D]: a P/D shape's prefill and decode workers" in out.stdout


def test_split_auto_by_hand(steady):
    # the floors' bracket: 40 prefills of 11 ms and 40 x 39 decode tokens at 1.256 / 256 ms in a full batch
    # (447.7 ms of work) over a 195 ms span: 3 workers first, split 2:1 (the prefill's share of the work,
    # 0.98, x 3 rounds to 3, at most T - 1 = 2). TTFT is the user's (issue 24): the prefill (11 ms) after
    # its queue wait, the transfer of 1,000 x 131,072 B at 50 GB/s (2.62 ms), the decode worker's first
    # step (~1.3 ms). At 2:1 two prefill workers take a request every 10 ms each for 11 ms of work, so the
    # queue grows to a p99 wait of 19.0 ms: TTFT p99 34 ms misses 30 ms; 4 workers (3:1) meet it, and so
    # do 5 (the gallop's upper end).
    pd = _json("--trace", steady, "--slo-ttft-ms", 30, "--slo-tpot-ms", 3, *DECODE, "--split", "auto")["shapes"][0]
    assert (pd["workers"], pd["split"], pd["binding"]) == (4, "3:1", "queueing")
    assert [(r["workers"], r["meets"]) for r in pd["replays"]] == [(3, False), (4, True), (5, True)]
    assert pd["why"].startswith("queueing: at 3 workers (split 2:1 P:D, the closest of the splits tried) "
                                "TTFT p99 34 ms > 30 ms (queue wait p99 19.0 ms)")


def _fake(p: int, d: int, pmin: int, dmin: int) -> dict:
    """A replay of ``p``:``d`` that meets TTFT <= 10 ms only with ``pmin`` prefill workers and TPOT <= 10 ms
    only with ``dmin`` decode workers; the further it is, the worse."""
    return {"ttft_ms": {"p99": 1.0 if p >= pmin else 100.0 * (1 + pmin - p)},
            "tpot_ms": {"p99": 1.0 if d >= dmin else 100.0 * (1 + dmin - d)},
            "prefill_workers": p, "decode_workers": d}


@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 30), st.floats(0.0, 1.0))
def test_pd_search_finds_the_fewest_total_and_its_split(pmin, dmin, lower, share):
    # meets exactly when P >= pmin and D >= dmin: the fewest total is pmin + dmin, at the split pmin:dmin,
    # and one fewer was replayed with every split tried missing
    s = PdSearch(SimConfig(), Target(10.0, 10.0), max(2, lower), 60, prefill_share=share)
    while (ask := s.next_config()) is not None:
        total, config = ask
        p, d = map(int, config.split.split(":"))
        assert p >= 1 and d >= 1 and p + d == total
        s.record_config(total, config, _fake(p, d, pmin, dmin))
    best = s.best()
    assert best == pmin + dmin and s.fleet(best) == f"{pmin}:{dmin}"
    if best > 2:
        assert s.tested[best - 1][0] is False and all(not ok for ok, _ in s.splits[best - 1].values())


def test_split_auto_refusals(steady):
    out = _plan("--trace", steady, "--slo-ttft-ms", 30, *LINEAR, "--split", "auto", "--max-workers", 1)
    assert out.exit_code == 2 and "needs 2 workers at least" in out.stderr
    out = _plan("--trace", steady, "--slo-ttft-ms", 30, *LINEAR, "--split", "6:2")
    assert out.exit_code == 2 and "'6:2' is not agg or auto" in out.stderr
    out = _plan("--trace", steady, "--slo-ttft-ms", 30, *LINEAR, "--link-gbps", "10")
    assert out.exit_code == 2 and "--link-gbps has no effect" in out.stderr  # no P/D candidate
    out = _plan("--trace", steady, "--slo-ttft-ms", 30, *LINEAR, "--split", "auto", "--cpu-memory-gb", "1")
    assert out.exit_code == 2 and "no candidate shape is possible" in out.stderr and "no CPU tier" in out.stderr


def test_prefill_share_by_hand():
    # 2 prompts of 1,000 tokens (11 ms each alone) and 11 output tokens each: 10 decode tokens each at
    # (1 ms + 0.001 ms x 256 decode requests) / 256 per token in a full batch
    off = terms_off("linear", {"beta0": "1", "beta1": "0.01", "beta2": "0.001"})  # the hand model alone
    lat = build_latency_model("linear", hardware_for(), off["latency_opts"])
    reqs = [Request((i,), 1000, 11, timestamp=0) for i in range(2)]
    config = SimConfig(max_num_batched_tokens=1000, timing=True, latency_model="linear", **off)
    per_token = (1.0 + 0.001 * 256) / 256
    decode = per_token * 20
    work = work_ms(reqs, lat, config, floors(reqs, lat, config, 16))
    assert work == pytest.approx((22.0, decode))
    assert prefill_share(work) == pytest.approx(22.0 / (22.0 + decode))


# --------------------------------------------------------------------------- --spec-tokens
def test_spec_tokens_candidates(steady, tmp_path):
    log = tmp_path / "log.jsonl"
    plan = _json("--trace", steady, "--slo-ttft-ms", 30, "--slo-tpot-ms", 3, *DECODE, "--spec-tokens", "0,2",
                 "--spec-method", "ngram", "--spec-draws", "expected", "--log", log)
    by = {s["shape"]: s for s in plan["shapes"]}
    assert set(by) == {"h100x1 rr", "h100x1 rr spec2"} and by["h100x1 rr spec2"]["spec_tokens"] == 2
    for cell in _cells(log):  # the K = 0 baseline without the spec options, as compare --spec-tokens 0,2
        if cell.get("spec_tokens"):
            assert (cell["spec_method"], cell["spec_draws"]) == ("ngram", "expected")
        else:
            assert "spec_method" not in cell and "spec_draws" not in cell
    for s in plan["shapes"]:
        assert s["meets"] and not [r for r in s["replays"] if r["workers"] == s["workers"] - 1][0]["meets"]


def test_spec_acceptance_at_the_largest_k_as_compare_reads_it(steady, tmp_path):
    """--spec-tokens 2,4 with a file of lengths measured at K = 4 (1 2 3 4 5 3 5 2 1: rates 7/9, 5/9, 2/9,
    2/9): the K = 2 shape takes the first 2 rates (7/9, 5/9), which is the file capped at K + 1 = 3 (1 2 3 3
    3 3 3 2 1) read at K = 2: its replays are those of a plan of K = 2 alone on the capped file. A rate
    list 0.8,0.6,0.5,0.4 gives the K = 2 shape 0.8,0.6 the same way. Before, plan refused the file
    (acceptance length 4 outside 1..3 (K = 2)) and the list (more rates than K)."""
    full, capped = tmp_path / "acc4.txt", tmp_path / "acc2.txt"
    full.write_text("1 2 3\n4 5 3\n5 2 1\n")
    capped.write_text("1 2 3\n3 3 3\n3 2 1\n")
    args = ["--trace", steady, "--slo-ttft-ms", 30, "--slo-tpot-ms", 3, *DECODE, "--spec-method", "ngram",
            "--spec-draws", "expected"]

    def spec2(tokens, acceptance):
        plan = _json(*args, "--spec-tokens", tokens, "--spec-acceptance", acceptance)
        return [{k: v for k, v in s.items() if k != "rank"} for s in plan["shapes"] if s["spec_tokens"] == 2]

    assert spec2("2,4", f"file:{full}") == spec2("2", f"file:{capped}") != []
    assert spec2("0,2,4", "0.8,0.6,0.5,0.4") == spec2("2", "0.8,0.6") != []


def test_spec_shapes_have_no_tpot_floor():
    lat = build_latency_model("linear", hardware_for(), {"beta0": 1.0, "beta1": 0.01, "beta2": 0.001})
    reqs = [Request((1,), 100, 10, timestamp=0)]
    plain = floors(reqs, lat, SimConfig(timing=True), 16)
    spec = floors(reqs, lat, SimConfig(timing=True, spec_method="ngram", spec_tokens=2), 16)
    assert plain.tpot[0] is not None and spec.tpot == (None,) and spec.ttft == plain.ttft


def test_spec_options_refused_without_a_spec_candidate(steady):
    out = _plan("--trace", steady, "--slo-ttft-ms", 30, *LINEAR, "--spec-method", "ngram")
    assert out.exit_code == 2 and "--spec-method has no effect with --spec-tokens 0" in out.stderr
    out = _plan("--trace", steady, "--slo-ttft-ms", 30, *LINEAR, "--spec-tokens", "2")
    assert out.exit_code == 2 and "--spec-tokens has no effect without --spec-method" in out.stderr


# --------------------------------------------------------------------------- --ep
def test_ep_candidates(steady, tmp_path):
    # mixtral-8x7b's 8 experts over TP 2 (ep 2) or not (ep 1); ep 4 with tp 2 is left out, said once
    log = tmp_path / "log.jsonl"
    out = _plan("--trace", steady, "--slo-ttft-ms", 30, "--slo-tpot-ms", 3, *DECODE, "--model", "mixtral-8x7b",
                "--gpu", "h200", "--tp", 2, "--ep", "1,2,4", "--log", log)
    assert out.exit_code == 0, out.stderr
    assert out.stderr.splitlines() == ["plan: left out 1 candidate no worker can be: h200x2 ep4 rr "
                                       "(--ep 4 must equal --tp 2 (or add --dp-attention))"]
    plan = json.loads(out.stdout)
    assert sorted((s["shape"], s["ep"], s["gpus"] // s["workers"]) for s in plan["shapes"]) == [
        ("h200x2 ep2 rr", 2, 2), ("h200x2 rr", 1, 2)]
    assert sorted({c.get("ep", 1) for c in _cells(log)}) == [1, 2]


def test_ep_on_a_dense_model_is_refused(steady):
    # the first reason is the model's: it has no experts (not that --ep differs from --tp)
    for tp in (1, 2):
        out = _plan("--trace", steady, "--slo-ttft-ms", 30, *LINEAR, "--tp", tp, "--ep", 2)
        assert out.exit_code == 2 and out.stderr.splitlines() == [
            f"Error: no candidate shape is possible: h100x{tp} ep2 rr (--ep 2: llama-3.1-8b is a dense model "
            "(no experts to divide))"]
    out = _plan("--trace", steady, "--slo-ttft-ms", 30, *LINEAR, "--model", "nope", "--ep", 2)
    assert out.exit_code == 2 and "unknown model 'nope'" in out.stderr  # not judged dense or not


#: plan's refusal of the CPU tier's options when no candidate has a tier
NO_TIER = "has no effect without a CPU tier candidate (an aggregated one, --split agg, with --cpu-memory-gb above 0)"


@pytest.mark.parametrize("args, line", [
    (["--pcie-gbps", "5"], f"--pcie-gbps {NO_TIER}"),
    (["--cpu-memory-gb", "0", "--cpu-write", "evict"], f"--cpu-write {NO_TIER}"),
    (["--split", "auto", "--cpu-memory-gb", "0,1", "--pcie-gbps", "5"], f"--pcie-gbps {NO_TIER}"),  # +cpu1 P/D left out
    (["--link-gbps", "5"], "--link-gbps has no effect without a P/D candidate (--split auto)"),
    (["--split", "agg", "--decode-prefix-cache"],
     "--decode-prefix-cache has no effect without a P/D candidate (--split auto)"),
])
def test_candidate_option_refusals_name_plans_options(steady, args, line):
    # plan has no --cpu-capacity, --prefill-workers or --split P:D: its refusals name its own options
    out = _plan("--trace", steady, "--slo-ttft-ms", 30, *LINEAR, *args)
    assert out.exit_code == 2 and out.stderr.splitlines()[-1:] == [f"Error: {line}"]
    assert len(out.stderr.splitlines()) == 1 + ("auto" in args)  # the left-out candidate's line first


def test_cpu_tier_options_apply_to_the_tiered_candidates(steady, tmp_path):
    # --cpu-memory-gb 0,1 --pcie-gbps 5: the tiered candidate replays at 5 GB/s, the other without a tier
    log = tmp_path / "log.jsonl"
    plan = _json("--trace", steady, "--slo-ttft-ms", 30, *LINEAR, "--cpu-memory-gb", "0,1", "--pcie-gbps", 5,
                 "--cpu-write", "evict", "--log", log)
    assert sorted(s["shape"] for s in plan["shapes"]) == ["h100x1 rr", "h100x1 rr +cpu1"]
    cells = _cells(log)
    tiered = [c for c in cells if c.get("cpu_memory_gb")]
    plain = [c for c in cells if not c.get("cpu_memory_gb")]
    assert tiered and plain
    assert all((c["pcie_gbps"], c["cpu_write"]) == (5.0, "evict") for c in tiered)
    assert all("pcie_gbps" not in c and "cpu_write" not in c for c in plain)


def test_shape_labels():
    assert Shape("m", "h100", 2, "kv-cost", 256.0, 2, 4, True).label == "h100x2 ep2 kv-cost +cpu256 spec4 P/D"
    assert Shape("m", "h100", 1, "rr").label == "h100x1 rr"


# --------------------------------------------------------------------------- --workload
SPEC = {"seed": 1, "requests": 30, "arrival": {"process": "poisson", "rate": 200},
        "input": {"dist": "uniform", "min": 800, "max": 1200}, "output": {"dist": "uniform", "min": 2, "max": 20}}


def test_workload_plans_as_its_written_trace(tmp_path):
    # --workload SPEC replays the requests `dynlab workload SPEC --out T` writes as a token trace:
    # the same plan, replay for replay
    from click.testing import CliRunner

    from dynlab.cli import main

    spec, trace = tmp_path / "spec.json", tmp_path / "t.jsonl"
    spec.write_text(json.dumps(SPEC))
    assert CliRunner().invoke(main, ["workload", str(spec), "--out", str(trace)]).exit_code == 0
    args = ["--slo-ttft-ms", 30, *DECODE]
    by_spec, by_trace = _json("--workload", spec, *args), _json("--trace", trace, *args)
    assert by_spec["shapes"] == by_trace["shapes"] and by_spec["arrivals"].startswith("30 requests, mean rate")


def test_workload_and_trace_are_one_or_the_other(steady, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    for args in (["--trace", steady, "--workload", spec], []):
        out = _plan(*args, "--slo-ttft-ms", 30, *LINEAR)
        assert out.exit_code == 2 and out.stderr.splitlines() == [
            "Error: give the traffic: --trace T or --workload SPEC (one of them)"]
    spec.write_text(json.dumps({**SPEC, "requests": -1}))
    out = _plan("--workload", spec, "--slo-ttft-ms", 30, *LINEAR)
    assert out.exit_code != 0 and len(out.stderr.splitlines()) == 1 and str(spec) in out.stderr


def test_trace_block_refused_up_front(tmp_path):
    # sim --workload SPEC --trace-block 16 is a usage error before anything runs; so is plan's (it was refused
    # by the first replay, exit 1); and a block ratio beyond what engine names carry
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    log = tmp_path / "log.jsonl"
    out = _plan("--workload", spec, "--slo-ttft-ms", 30, *LINEAR, "--trace-block", 16, "--log", log)
    assert out.exit_code == 2 and out.stderr.splitlines() == [
        "Error: --trace-block has no effect: the workload's blocks are hashed at --block (16 tokens); it applies "
        "to traces that name their own blocks (mooncake)"]
    assert not log.exists() or log.read_text() == ""
    one_block = _trace(tmp_path / "t.jsonl", [(0, 500, 1), (5, 500, 1)])  # one 512-token id per request
    out = _plan("--trace", one_block, "--slo-ttft-ms", 30, *LINEAR, "--block", 1, "--trace-block", 2000)
    assert out.exit_code == 2 and out.stderr.splitlines() == [
        "Error: --block 1 is too small for trace blocks of 2000 tokens (at most 1022 engine blocks per trace block)"]


# --------------------------------------------------------------------------- one Ray session per plan
class _FakeRay:
    """Just enough of Ray's API for dynlab.sweep.executors.ray_executor, run in this process; ``calls`` records
    starts and stops."""

    def __init__(self):
        self.calls, self.up, self.out = [], False, {}

    def is_initialized(self):
        return self.up

    def init(self, **kwargs):
        self.calls.append("init")
        self.up = True

    def shutdown(self):
        self.calls.append("shutdown")
        self.up = False

    def put(self, obj):
        return obj

    def remote(self, **kwargs):
        fake = self

        def decorate(fn):
            class Task:
                @staticmethod
                def remote(*args):
                    ref = object()
                    fake.out[ref] = fn(*args)
                    return ref
            return Task
        return decorate

    def wait(self, pending, num_returns=1, timeout=None):
        return pending[:1], pending[1:]

    def get(self, ref):
        return self.out.pop(ref)

    def cancel(self, ref):
        pass


def test_ray_starts_once_for_every_round(monkeypatch, tmp_path):
    # the queueing trace's plan replays 1, 2, then 3 workers: three rounds, one Ray start and one stop
    from dynlab.sweep import executors

    trace = _trace(tmp_path / "q.jsonl", [(0, 1000, 1)] * 12)
    fake = _FakeRay()
    monkeypatch.setattr(executors, "import_ray", lambda address=None: fake)
    serial = _json("--trace", trace, "--slo-ttft-ms", 50, *LINEAR)
    args = [a for a in LINEAR if a != "serial"]
    args = args[:args.index("--executor") + 1] + ["ray"] + args[args.index("--executor") + 1:]
    assert _json("--trace", trace, "--slo-ttft-ms", 50, *args) == serial
    assert fake.calls == ["init", "shutdown"] and [r["workers"] for r in serial["shapes"][0]["replays"]] == [1, 2, 3]


def test_split_auto_resumes_from_its_log(steady, tmp_path):
    log = tmp_path / "log.jsonl"
    args = ["--trace", steady, "--slo-ttft-ms", 30, "--slo-tpot-ms", 3, *DECODE[:-1], "--split", "auto", "--log", log]
    first = _plan(*args)
    n = len(log.read_text().splitlines())
    again = _plan(*args, "--resume")
    assert again.exit_code == 0 and again.stdout == first.stdout and f"; {n} from {log}" in again.stderr
    assert len(log.read_text().splitlines()) == n


def test_workload_generated_once_and_named_as_sim_names_it(tmp_path, monkeypatch):
    # plan --workload: the analysis and every replay read one generated copy (cached like a trace, keyed by
    # what makes it), and with eagle its blocks carry EAGLE's hash lookahead, as sim's runner names them
    # (the analysis load generated plain names, and each replay generated the workload again)
    from dataclasses import replace

    from dynlab.cli.plan import _load
    from dynlab.sweep.executors import cached_trace, clear_trace_cache
    from dynlab.traces import workload_io

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    real, calls = workload_io.workload_requests, []
    monkeypatch.setattr(workload_io, "workload_requests", lambda *a: calls.append(a) or real(*a))
    clear_trace_cache()
    base = SimConfig(timing=True, workload=str(spec), spec_method="eagle", spec_tokens=2)
    requests, _ = _load(base, None, None)
    assert calls == [(str(spec), 16, "dynlab", 1)]  # sim: workload_requests(..., hash_lookahead_tokens(config))
    assert [r.hashes for r in requests] == [r.hashes for r in real(str(spec), 16, "dynlab", 1)]
    assert [r.hashes for r in requests] != [r.hashes for r in real(str(spec), 16, "dynlab", 0)]
    assert cached_trace(replace(base, workers=3)) is requests and len(calls) == 1  # a replay: no new generation
    plain = cached_trace(replace(base, spec_tokens=0))
    assert plain is not requests and calls[-1] == (str(spec), 16, "dynlab", 0)
    clear_trace_cache()
