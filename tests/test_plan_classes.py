"""``dynlab plan --slo CLASS:...``: per-class SLOs in the target and the class that binds (issue 42 item 2).

Linear step model 10 ms + 1 ms per prefill token + 2 ms per decoding request, every overhead term off,
``rr`` routing, the default step budget (both prompts fit one step). Two requests at t = 0, each of its own
tokens: ``batch`` (100-token prompt, 2 output tokens) first, then ``chat`` (16 tokens, 2 output tokens).

- 1 worker: both prompts prefill in one step, 10 + 100 + 16 = 126 ms: TTFT 126 for each; then one step
  decodes both, 10 + 2 x 2 = 14 ms: TPOT 14 for each. Nobody waits (queue wait 0).
- 2 workers: ``rr`` gives each its own worker. chat prefills alone, 10 + 16 = 26 ms (TTFT 26), then decodes
  alone, 10 + 2 = 12 ms (TPOT 12); batch: TTFT 10 + 100 = 110, TPOT 12.

With ``chat:ttft_ms=50,tpot_ms=13;batch:ttft_ms=1000`` (a class's one value is its percentile, p99): chat
misses both at 1 worker (126 > 50, 14 > 13) and meets both at 2 (26, 12); batch meets at 1 (126 <= 1000).
So 2 workers, and chat binds: its headroom at 1 worker is min(1 - 126/50, 1 - 14/13) = -152 %, batch's
1 - 126/1000 = 87.4 %. At 2: chat min(1 - 26/50, 1 - 12/13) = 7.69 %, batch 1 - 110/1000 = 89 %.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.plan.target import Target
from helpers import terms_off_args

LINEAR = ["--latency-model", "linear", "--latency-opt", "beta0=10", "--latency-opt", "beta1=1",
          "--latency-opt", "beta2=2", *terms_off_args("linear"), "--modes", "rr", "--executor", "serial", "--quiet"]
SLO = "chat:ttft_ms=50,tpot_ms=13;batch:ttft_ms=1000"


@pytest.fixture
def two(tmp_path):
    rows = [{"timestamp": 0, "tokens": list(range(1, 101)), "output_length": 2, "class": "batch"},
            {"timestamp": 0, "tokens": list(range(1001, 1017)), "output_length": 2, "class": "chat"}]
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["--trace", str(path), "--trace-format", "tokens"]


def _plan(*args):
    return CliRunner().invoke(main, ["plan", *map(str, args)])


def _json(*args) -> dict:
    out = _plan(*args, "--format", "json")
    assert out.exit_code == 0, out.stderr
    return json.loads(out.stdout)


def test_chat_binds_at_two_workers(two):
    plan = _json(*two, "--slo", SLO, *LINEAR)
    (shape,) = plan["shapes"]
    assert (shape["workers"], shape["binding"], shape["binding_class"]) == (2, "prefill", "chat")
    assert [(r["workers"], r["meets"]) for r in shape["replays"]] == [(1, False), (2, True)]
    assert shape["replays"][0]["misses"] == ["chat TTFT p99 126 ms > 50 ms", "chat TPOT p99 14 ms > 13 ms"]
    assert shape["by_class"] == {
        "chat": {"ttft_ms": 26.0, "tpot_ms": 12.0, "goodput": 1.0, "headroom": round(1 - 12 / 13, 4), "meets": True},
        "batch": {"ttft_ms": 110.0, "tpot_ms": 12.0, "goodput": 1.0, "headroom": 0.89, "meets": True}}
    assert shape["headroom"] == round(1 - 12 / 13, 4)  # the least over every class's SLOs
    # the queue wait is 0: chat's TTFT is its prefill, sharing its one step with batch's 100 tokens
    assert shape["why"].startswith("prefill: at 1 worker chat TTFT p99 126 ms > 50 ms; chat TPOT p99 14 ms > 13 ms, "
                                   "but the queue wait p99 is only 0.0 ms")
    assert shape["why"].endswith("; class chat binds (headroom -152.0%; batch 87.4%)")
    assert plan["target"] == "chat TTFT <= 50 ms and TPOT <= 13 ms, batch TTFT <= 1000 ms at p99"
    assert plan["slo_classes"] == {"chat": {"ttft_ms": 50.0, "tpot_ms": 13.0},
                                   "batch": {"ttft_ms": 1000.0, "tpot_ms": None}}


def test_table_names_the_binding_class(two):
    out = _plan(*two, "--slo", SLO, *LINEAR, "--format", "table")
    assert out.exit_code == 0, out.stderr
    row = out.stdout.splitlines()[1].split()
    assert row[3] == "2" and row[-2:] == ["prefill", "(chat)"]


def test_with_a_run_wide_slo_and_with_goodput(two):
    # --slo-ttft-ms 1000 holds at 1 worker (TTFT p99 of 126, 126): chat still binds, at 2
    both = _json(*two, "--slo", SLO, "--slo-ttft-ms", 1000, *LINEAR)["shapes"][0]
    assert (both["workers"], both["binding_class"]) == (2, "chat")
    # --goodput 1: chat's goodput is 0 at 1 worker (126 > 50), 1 at 2; batch's 1 at both
    good = _json(*two, "--slo", SLO, "--goodput", 1, *LINEAR)["shapes"][0]
    assert (good["workers"], good["binding_class"]) == (2, "chat")
    assert good["replays"][0]["misses"] == ["chat goodput 0.0000 < 1"]


def test_a_plan_met_by_one_worker_names_no_class(two):
    # chat's 126 and 14 are within 200 and 20 at 1 worker: met at once, nothing binds
    shape = _json(*two, "--slo", "chat:ttft_ms=200,tpot_ms=20;batch:ttft_ms=1000", *LINEAR)["shapes"][0]
    assert (shape["workers"], shape["binding"], shape["binding_class"]) == (1, "none", None)
    assert shape["by_class"]["chat"] == {"ttft_ms": 126.0, "tpot_ms": 14.0, "goodput": 1.0,
                                         "headroom": round(1 - 14 / 20, 4), "meets": True}


def test_without_slo_no_class_keys(two):
    plan = _json(*two, "--slo-ttft-ms", 1000, *LINEAR)
    assert plan["slo_classes"] == {} and plan["shapes"][0]["binding_class"] is None
    assert plan["shapes"][0]["by_class"] == {}


@pytest.mark.parametrize("slo, words", [
    ("voice:ttft_ms=50", "--slo: no request carries class 'voice' (the requests' classes: batch, chat)"),
    ("chat:ttft=50", "'ttft=50' is not ttft_ms=X or tpot_ms=Y"),
    ("chat", "give CLASS:ttft_ms=X,tpot_ms=Y"),
    ("chat:ttft_ms=-1", "ttft_ms must be a finite number of ms >= 0"),
    ("chat:ttft_ms=1;chat:ttft_ms=2", "class 'chat' is given twice"),
])
def test_bad_slo_is_one_line(two, slo, words):
    out = _plan(*two, "--slo", slo, *LINEAR, "--log", "never.jsonl")
    assert out.exit_code == 2 and out.stdout == "", out.stdout
    (line,) = out.stderr.splitlines()
    assert line.startswith("Error: ") and words in line and "Traceback" not in out.stderr, line


def test_no_slo_at_all_is_one_line(two):
    out = _plan(*two, *LINEAR)
    assert out.exit_code == 2
    (line,) = out.stderr.splitlines()
    assert "give at least one SLO: --slo-ttft-ms, --slo-tpot-ms or --slo" in line


def test_target_reads_default_class_from_the_run():
    # no request named a class (no by_class): every request is in class default, whose figures are the run's
    result = {"ttft_ms": {"p99": 80.0}, "tpot_ms": {"p99": 9.0}, "goodput": 0.5}
    target = Target(classes={"default": (50.0, None)})
    assert target.misses(result) == ["default TTFT p99 80 ms > 50 ms"]
    assert target.binding_class(result) == "default"
    assert Target(classes={"chat": (50.0, None)}).misses(result) == []  # no figures: nothing read
    assert Target(classes={"default": (50.0, 10.0)}).classes_text() == "default:ttft_ms=50.0,tpot_ms=10.0"


def test_binding_class_is_the_furthest_missed():
    result = {"by_class": {"a": {"ttft_ms": {"p99": 60.0}}, "b": {"ttft_ms": {"p99": 300.0}},
                           "c": {"ttft_ms": {"p99": 10.0}}}}
    target = Target(classes={"a": (50.0, None), "b": (100.0, None), "c": (20.0, None)})
    assert target.rooms(result) == {"a": -0.2, "b": -2.0, "c": 0.5}
    assert target.binding_class(result) == "b"
    # the run-wide SLO missed, no class: no class binds
    run = Target(slo_ttft_ms=5.0, classes={"c": (20.0, None)})
    assert run.binding_class({**result, "ttft_ms": {"p99": 9.0}}) is None


def test_a_class_below_its_own_floor_is_compute_bound(two):
    # chat alone on an idle worker prefills in 10 + 16 = 26 ms > 20: no worker count meets chat's TTFT; the
    # lowest target its p99 could meet is 26 ms. One replay (at the lower bound, 1 worker) shows the figures.
    out = _plan(*two, "--slo", "chat:ttft_ms=20;batch:ttft_ms=1000", *LINEAR, "--format", "json")
    assert out.exit_code == 3, out.stderr
    (shape,) = json.loads(out.stdout)["shapes"]
    assert (shape["meets"], shape["binding"], shape["binding_class"]) == (False, "compute", "chat")
    assert shape["class_floors"] == {"chat": {"never_share": 1.0, "missing": 1, "requests": 1,
                                              "lowest_ttft_ms": 26.0, "lowest_tpot_ms": None}}
    assert [r["workers"] for r in shape["replays"]] == [1]
    assert shape["why"] == ("compute: 100.00% of class chat's requests (1 of 1) miss its SLOs (TTFT <= 20 ms at p99) "
                            "even alone on an idle worker with every prefix hit possible (the lowest targets it could "
                            "meet here: TTFT about 26 ms), more than the 1.00% allowed: no worker count helps; "
                            "class chat binds")
