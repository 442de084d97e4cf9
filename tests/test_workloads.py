"""Workload specs (dynlab.traces.workload, the built-in ``synthetic`` generator, `dynlab workload`, `sim --workload`)."""
from __future__ import annotations

import json
import math
import random
import statistics

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from dynlab import plugins
from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.sim.runner import run
from dynlab.routing.hashing import block_hashes
from dynlab.traces.workload import SpecError
from dynlab.traces.workload_io import mooncake_rows

ISSUE_SPEC = {"seed": 1, "requests": 200, "arrival": {"process": "poisson", "rate": 5},
              "input": {"dist": "lognormal", "mean": 1000, "sigma": 0.5},
              "output": {"dist": "uniform", "min": 20, "max": 200}}


def make(spec):
    return plugins.workloads().get(spec.get("generator", "synthetic"))(spec, "spec.json")


def rows(spec):
    return list(make(spec).rows())


def write(tmp_path, spec, name="spec.json"):
    path = tmp_path / name
    path.write_text(json.dumps(spec))
    return str(path)


# -- the issue's spec -----------------------------------------------------------------------------------------
def test_the_issue_spec():
    out = rows(ISSUE_SPEC)
    assert len(out) == 200
    assert all(20 <= r["output_length"] <= 200 for r in out)
    assert [r["timestamp"] for r in out] == sorted(r["timestamp"] for r in out)
    # Poisson at 5 requests/s: 200 arrivals take about 40 s (seeded: this exact draw)
    assert 30_000 < out[-1]["timestamp"] < 50_000


def test_lognormal_mean_is_the_mean_not_the_median():
    w = make({**ISSUE_SPEC, "requests": 1})
    # mu = ln(1000) - 0.5^2 / 2: E[X] = exp(mu + sigma^2/2) = 1000, median exp(mu) = 1000 * exp(-0.125) = 882.5
    assert w.input.mu == pytest.approx(math.log(1000) - 0.125)
    assert math.exp(w.input.mu) == pytest.approx(882.4969, rel=1e-6)
    rng = random.Random(3)
    draws = [w.input.draw(rng) for _ in range(40_000)]
    assert statistics.fmean(draws) == pytest.approx(1000, rel=0.02)
    assert statistics.median(draws) == pytest.approx(882.5, rel=0.02)


def test_constant_arrivals_and_lengths_by_hand():
    spec = {"requests": 3, "arrival": {"process": "constant", "rate": 5},
            "input": {"dist": "constant", "value": 4}, "output": {"dist": "constant", "value": 2}}
    out = rows(spec)
    # 5 requests/s: one every 200 ms; tokens numbered from 1, each prompt's answer takes 2 ids after it
    assert out == [{"timestamp": 200.0, "tokens": [1, 2, 3, 4], "output_length": 2},
                   {"timestamp": 400.0, "tokens": [7, 8, 9, 10], "output_length": 2},
                   {"timestamp": 600.0, "tokens": [13, 14, 15, 16], "output_length": 2}]


def test_sessions_extend_the_last_prompt_by_hand():
    spec = {"requests": 3, "arrival": {"process": "constant", "rate": 1},
            "input": {"dist": "constant", "value": 2}, "output": {"dist": "constant", "value": 1},
            "prefix": {"groups": 1, "length": 3}, "sessions": {"turns": 2}}
    out = rows(spec)
    # the system prompt is tokens 1-3; session 1 turn 1 adds 4-5 (answer 6), turn 2 the answer and 7-8
    # (think time 0: at the same instant); session 2 starts at 2 s
    assert [r["tokens"] for r in out] == [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 10, 11]]
    assert [r["timestamp"] for r in out] == [1000.0, 1000.0, 2000.0]


def test_think_time_is_in_seconds():
    # sessions 10,000 s apart, two turns each, think time exponential with a mean of 10 s: the gap between
    # a session's turns averages 10,000 ms (1,000 draws: within 15 %; it was 10 ms, the mean taken as a rate)
    spec = {"seed": 2, "requests": 2000, "arrival": {"process": "constant", "rate": 0.0001},
            "input": {"dist": "constant", "value": 2}, "output": {"dist": "constant", "value": 1},
            "sessions": {"turns": 2, "think_time_s": 10}}
    out = rows(spec)
    gaps = [out[i + 1]["timestamp"] - out[i]["timestamp"] for i in range(0, len(out), 2)]
    assert statistics.fmean(gaps) == pytest.approx(10_000, rel=0.15)


def test_piecewise_rate_curve():
    # 0 requests/s for 10 s, then 50 requests/s: nothing arrives before 10 s, about 50 per second after
    spec = {"seed": 3, "requests": 500, "arrival": {"process": "piecewise", "curve": [[0, 0], [10, 50]]},
            "input": {"dist": "constant", "value": 1}, "output": {"dist": "constant", "value": 1}}
    ts = [r["timestamp"] for r in rows(spec)]
    assert ts[0] >= 10_000
    assert (len(ts) - 1) * 1000 / (ts[-1] - ts[0]) == pytest.approx(50, rel=0.15)


def test_gamma_burstiness_one_is_poisson_like_and_lower_is_burstier():
    def cv(b):
        spec = {"seed": 2, "requests": 4000, "arrival": {"process": "gamma", "rate": 10, "burstiness": b},
                "input": {"dist": "constant", "value": 1}, "output": {"dist": "constant", "value": 1}}
        ts = [0.0] + [r["timestamp"] for r in rows(spec)]
        gaps = [b - a for a, b in zip(ts, ts[1:])]
        return statistics.pstdev(gaps) / statistics.fmean(gaps)
    # the gaps' coefficient of variation is 1/sqrt(burstiness): 1 for Poisson, 2 at 0.25
    assert cv(1.0) == pytest.approx(1.0, rel=0.1) and cv(0.25) == pytest.approx(2.0, rel=0.1)


def test_empirical_from_values_and_from_a_trace(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"input_length": 600, "output_length": 9, "hash_ids": [1, 2]}\n')
    spec = {"requests": 5, "arrival": {"process": "constant", "rate": 1},
            "input": {"dist": "empirical", "trace": str(trace)}, "output": {"dist": "empirical", "values": [3, 4]}}
    out = rows(spec)
    assert {len(r["tokens"]) for r in out} == {600} and {r["output_length"] for r in out} <= {3, 4}


def test_an_empirical_trace_is_read_from_the_specs_folder(tmp_path, monkeypatch):
    # "trace": "t.jsonl" next to the spec is found from any working directory; an absolute path is as given
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "t.jsonl").write_text('{"input_length": 600, "output_length": 9, "hash_ids": [1, 2]}\n')
    (tmp_path / "t.jsonl").write_text('{"input_length": 700, "output_length": 9, "hash_ids": [1, 2]}\n')
    spec = {"requests": 3, "arrival": {"process": "constant", "rate": 1},
            "input": {"dist": "empirical", "trace": "t.jsonl"}, "output": {"dist": "constant", "value": 1}}
    path = write(folder, spec)
    monkeypatch.chdir(tmp_path)  # a t.jsonl here too: the spec's own must win
    out = CliRunner().invoke(main, ["workload", path, "--out", str(tmp_path / "out.jsonl")])
    assert out.exit_code == 0, out.stderr
    lengths = {len(json.loads(line)["tokens"]) for line in (tmp_path / "out.jsonl").read_text().splitlines()}
    assert lengths == {600}
    absolute = write(folder, {**spec, "input": {"dist": "empirical", "trace": str(tmp_path / "t.jsonl")}}, "abs.json")
    assert {len(r["tokens"]) for r in plugins.workloads().get("synthetic")(json.loads(open(absolute).read()),
                                                                          absolute).rows()} == {700}
    bundled = {**spec, "input": {"dist": "empirical", "trace": "mooncake-conversation"}}
    assert len(list(plugins.workloads().get("synthetic")(bundled, write(folder, bundled, "b.json")).rows())) == 3
    missing = write(folder, {**spec, "input": {"dist": "empirical", "trace": "nope.jsonl"}}, "missing.json")
    out = CliRunner().invoke(main, ["workload", missing, "--out", str(tmp_path / "out2.jsonl")])
    (line,) = out.stderr.splitlines()
    assert out.exit_code != 0 and line.startswith(f"Error: {folder / 'nope.jsonl'}: no such file"), line


def test_an_empirical_trace_without_requests_is_one_line(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    spec = {"requests": 3, "arrival": {"process": "constant", "rate": 1},
            "input": {"dist": "empirical", "trace": "empty.jsonl"}, "output": {"dist": "constant", "value": 1}}
    out = CliRunner().invoke(main, ["workload", write(tmp_path, spec), "--out", str(tmp_path / "o.jsonl")])
    assert out.exit_code == 1
    assert out.stderr.splitlines() == [f"Error: {tmp_path / 'empty.jsonl'}: the trace holds no request"]
    assert not (tmp_path / "o.jsonl").exists()


def test_mooncake_rows_chain_their_ids():
    toks = list(range(1, 1201))
    out = list(mooncake_rows([{"timestamp": 0.0, "tokens": toks, "output_length": 1},
                              {"timestamp": 1.0, "tokens": toks[:1024] + [9] * 10, "output_length": 1},
                              {"timestamp": 2.0, "tokens": toks[512:1024], "output_length": 1}]))
    # 1,200 tokens = 3 blocks of 512 (the last partial); the second shares its first two blocks
    assert [r["hash_ids"] for r in out] == [[0, 1, 2], [0, 1, 3], [4]]
    assert [r["input_length"] for r in out] == [1200, 1034, 512]


# -- bad specs: one line naming the key --------------------------------------------------------------------
@pytest.mark.parametrize("change, key", [
    ({"arrival": {"process": "poisson", "rate": -1}}, "arrival.rate"),
    ({"arrival": {"process": "weibull", "rate": 1}}, "arrival.process"),
    ({"arrival": {"process": "poisson"}}, "arrival.rate"),
    ({"arrival": {"process": "poisson", "rate": 1, "burstiness": 2}}, "arrival.burstiness"),
    ({"arrival": {"process": "piecewise", "curve": [[5, 1]]}}, "arrival.curve[0]"),
    ({"input": {"dist": "lognormal", "sigma": 0.5}}, "input.mean"),
    ({"output": {"dist": "uniform", "min": 20, "max": 10}}, "output.max"),
    ({"output": {"dist": "zipf"}}, "output.dist"),
    ({"requests": 0}, "requests"),
    ({"requests": 2.5}, "requests"),
    ({"requests": 10**12}, "requests"),
    ({"seed": "x"}, "seed"),
    ({"colour": "red"}, "colour"),
    ({"prefix": {"groups": 2, "length": 10, "share": 2}}, "prefix.share"),
    ({"prefix": {"groups": 2, "length": 10, "popularity": [1]}}, "prefix.popularity"),
    ({"sessions": {"turns": 0}}, "sessions.turns"),
    ({"generator": "nope"}, "generator"),
])
def test_a_bad_spec_names_its_key(tmp_path, change, key):
    path = write(tmp_path, {**ISSUE_SPEC, **change})
    res = CliRunner().invoke(main, ["workload", path, "--out", str(tmp_path / "o.jsonl")])
    assert res.exit_code == 1, res.output
    (line,) = res.output.splitlines()
    assert line.startswith(f"Error: {path}: {key}: "), line
    assert not (tmp_path / "o.jsonl").exists()


def test_a_spec_that_is_not_json_says_where(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"seed": 1,\n "requests": }')
    res = CliRunner().invoke(main, ["workload", str(path), "--out", str(tmp_path / "o.jsonl")])
    assert res.exit_code == 1 and res.output.startswith(f"Error: {path}:2: not JSON")


def test_a_failed_run_keeps_the_old_file(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text("old\n")
    CliRunner().invoke(main, ["workload", write(tmp_path, {**ISSUE_SPEC, "requests": -1}), "--out", str(out)])
    assert out.read_text() == "old\n"


def test_yaml_spec(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "s.yaml"
    path.write_text("seed: 1\nrequests: 200\narrival: {process: poisson, rate: 5}\n"
                    "input: {dist: lognormal, mean: 1000, sigma: 0.5}\noutput: {dist: uniform, min: 20, max: 200}\n")
    from dynlab.traces.workload_io import open_workload

    assert list(open_workload(str(path)).rows()) == rows(ISSUE_SPEC)


# -- writing and replaying ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["token", "mooncake"])
def test_sim_workload_is_sim_of_the_written_trace(tmp_path, fmt):
    spec = write(tmp_path, {**ISSUE_SPEC, "requests": 40, "prefix": {"groups": 3, "length": 600},
                            "sessions": {"turns": 2, "think_time_s": 2}})
    out = str(tmp_path / "t.jsonl")
    res = CliRunner().invoke(main, ["workload", spec, "--out", out, "--format", fmt])
    assert res.exit_code == 0 and "wrote 40 requests" in res.output
    direct = run(SimConfig(workload=spec, timing=True, mode="kv-events", workers=2))
    replay = run(SimConfig(trace=out, timing=True, mode="kv-events", workers=2))
    if fmt == "token":
        assert {k: v for k, v in direct.items() if k != "hash"} == {k: v for k, v in replay.items() if k != "hash"}
    else:  # a Mooncake trace names 512-token blocks: the same requests, prefix hits counted per trace block
        assert direct["requests"] == replay["requests"] == 40 and replay["trace_block"] == 512


def test_sim_workload_takes_the_rate_options(tmp_path):
    spec = write(tmp_path, ISSUE_SPEC)
    out = run(SimConfig(workload=spec, timing=True, rate=10.0, mode="rr"))
    assert out["arrival_rate"] == 10.0


# -- properties ----------------------------------------------------------------------------------------------
specs = st.fixed_dictionaries({
    "seed": st.integers(0, 10**6), "requests": st.integers(1, 60),
    "arrival": st.sampled_from([{"process": "poisson", "rate": 5}, {"process": "gamma", "rate": 2, "burstiness": 0.3},
                                {"process": "constant", "rate": 50},
                                {"process": "piecewise", "curve": [[0, 1], [2, 20]]}]),
    "input": st.sampled_from([{"dist": "lognormal", "mean": 300, "sigma": 0.8, "max": 2000},
                              {"dist": "uniform", "min": 1, "max": 64}]),
    "output": st.just({"dist": "uniform", "min": 0, "max": 30}),
    "prefix": st.sampled_from([{"groups": 3, "length": 64, "popularity": "zipf"},
                               {"groups": 2, "length": 40, "popularity": "uniform", "share": 0.5}]),
    "sessions": st.sampled_from([{"turns": 1}, {"turns": {"dist": "uniform", "min": 1, "max": 4}, "think_time_s": 1}]),
})


@settings(max_examples=40, deadline=None)
@given(specs)
def test_generated_rows_keep_their_promises(spec):
    out = rows(spec)
    assert out == rows(spec)  # seeded: the same spec, the same rows
    assert len(out) == spec["requests"]
    ts = [r["timestamp"] for r in out]
    assert ts == sorted(ts) and ts[0] >= 0
    plen = spec["prefix"]["length"]
    for r in out:
        assert len(r["tokens"]) >= 1 and 0 <= r["output_length"] <= 30
    # rows that start with the same system prompt share their leading full blocks of it
    by_first = {}
    for r in out:
        by_first.setdefault(r["tokens"][0], []).append(r["tokens"])
    for group in by_first.values():
        if len(group) > 1 and group[0][0] <= 3 * plen:  # a system prompt (ids 1 .. groups x length)
            full = plen // 16
            heads = {tuple(block_hashes(t, 16)[:full]) for t in group if len(t) >= full * 16}
            assert len(heads) <= 1


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6))
def test_session_turns_extend_the_previous_prompt(requests, turns):
    spec = {"requests": requests, "arrival": {"process": "poisson", "rate": 3},
            "input": {"dist": "uniform", "min": 1, "max": 20}, "output": {"dist": "uniform", "min": 0, "max": 5},
            "sessions": {"turns": turns, "think_time_s": 0.5}}
    out = rows(spec)
    assert len(out) == requests
    starts = {}
    for r in out:  # a turn's prompt starts with its session's first prompt (and every earlier turn)
        starts.setdefault(r["tokens"][0], []).append(r["tokens"])
    for prompts in starts.values():
        prompts.sort(key=len)
        assert all(b[:len(a)] == a for a, b in zip(prompts, prompts[1:]))
        assert len(prompts) <= turns


def test_workload_is_a_plugin_kind():
    assert "workload" in plugins.kinds() and "synthetic" in plugins.workloads()
    res = CliRunner().invoke(main, ["plugins"])
    assert "synthetic" in res.output
