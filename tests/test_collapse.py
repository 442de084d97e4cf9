"""The kv collapse warning (dynlab/collapse.py): one stderr line when a timed run sent almost every
request to one worker, naming the load-aware strategies; nothing otherwise."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynlab.collapse import COLLAPSE_SHARE, LOAD_AWARE, alive_rates, collapse_warning, collapsed_share
from helpers import invoke, ok

TIMED = {"ttft_ms": {"p50": 1.0}}
SAME_PREFIX = ["--timing", "--prefixes", "1", "--reps", "20", "--rate", "1000", "--quiet"]  # requests overlap


def test_threshold_and_names_are_pinned():
    assert COLLAPSE_SHARE == 0.9
    assert LOAD_AWARE == ("kv-cost", "cache-aware", "least-loaded", "power-of-two")


@pytest.mark.parametrize("per_worker, expected", [
    ([9, 1], (9, 10, 2)),          # 90 %: the threshold itself
    ([89, 11], None),              # 89 %
    ([20, 0, 0, 0], (20, 20, 4)),
    ([5], None),                   # one worker cannot be imbalanced
    ([0, 0], None),                # no requests
])
def test_collapsed_share_by_hand(per_worker, expected):
    assert collapsed_share(dict(TIMED, requests_per_worker=per_worker)) == expected


def test_a_count_based_replay_is_flagged_too():
    """Issue 43: 10 of 10 requests on one of 2 workers without ttft_ms (count-based) is a collapse, and the line
    says that load-aware strategies collapse there too and to add --timing."""
    assert collapsed_share({"requests_per_worker": [10, 0]}) == (10, 10, 2)
    msg = collapse_warning({"kv-cost": {"mode": "kv-cost", "requests_per_worker": [10, 0], "load_imbalance": 2.0}})
    assert msg.startswith("one worker took almost every request (kv-cost: 10 of 10 requests on one of 2 workers "
                          "(100%, imbalance 2.0)): the run measures one worker, not the fleet; a count-based replay "
                          "has no load")
    assert "collapse here too: add --timing" in msg and "\n" not in msg


@given(st.lists(st.integers(0, 1000), min_size=2, max_size=16))
def test_flagged_exactly_when_the_busiest_worker_has_the_share(per_worker):
    found = collapsed_share(dict(TIMED, requests_per_worker=per_worker))
    total = sum(per_worker)
    assert (found is not None) == (total > 0 and max(per_worker) >= COLLAPSE_SHARE * total)


def test_the_message_names_the_run_its_share_and_the_load_aware_strategies():
    msg = collapse_warning({"rr": dict(TIMED, mode="rr", requests_per_worker=[10, 10], load_imbalance=1.0),
                            "kv": dict(TIMED, mode="kv", requests_per_worker=[12031] + [0] * 7,
                                       load_imbalance=8.0)})
    assert msg.startswith("one worker took almost every request (kv: 12,031 of 12,031 requests on one of 8 "
                          "workers (100%, imbalance 8.0)): ")
    assert "rr" not in msg.split("):")[0]
    assert "kv-cost, cache-aware, least-loaded, power-of-two" in msg and "\n" not in msg


def test_sim_warns_in_one_line_for_kv_and_not_for_rr():
    r = ok(invoke("sim", *SAME_PREFIX, "--workers", "2", "--mode", "kv"))
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("Warning: one worker took almost every request (kv: 20 of 20")
    assert ok(invoke("sim", *SAME_PREFIX, "--workers", "2", "--mode", "rr")).stderr == ""
    assert ok(invoke("sim", "--prefixes", "1", "--reps", "20", "--workers", "2", "--mode", "kv", "--quiet")).stderr == ""


def test_compare_warns_once_for_every_collapsed_run():
    r = ok(invoke("compare", *SAME_PREFIX, "--workers", "2", "--modes", "rr,kv,least-loaded"))
    assert r.stderr.count("\n") == 1 and "(kv: 20 of 20 requests" in r.stderr
    assert "; " not in r.stderr.split("):")[0]  # kv alone


def test_a_split_comparison_with_a_collapsing_strategy_warns():
    r = ok(invoke("compare", *SAME_PREFIX, "--mode", "kv", "--split", "4:0,2:2"))
    assert r.stderr.count("\n") == 1
    assert "4:0 [kv]: 20 of 20 requests on one of 4 workers" in r.stderr
    assert "2:2 [kv]: 20 of 20 requests on one of 2 prefill workers" in r.stderr


def test_a_load_aware_strategy_that_collapsed_is_not_told_to_use_itself():
    # kv-cost in a timed run with its 3 requests on one worker (README's chat.jsonl): the line says why a load term
    # did not act here instead of naming kv-cost among the cures
    text = collapse_warning({"kv-cost": {"mode": "kv-cost", "requests_per_worker": [3, 0], "load_imbalance": 2.0,
                                         "ttft_ms": {"p50": 1.0}}})
    assert "kv-cost: 3 of 3 requests on one of 2 workers (100%, imbalance 2.0)" in text
    assert "too few requests, or too far apart" in text and "cache-aware" not in text
    mixed = collapse_warning({"kv": {"mode": "kv", "requests_per_worker": [3, 0], "ttft_ms": {"p50": 1.0}},
                              "kv-cost": {"mode": "kv-cost", "requests_per_worker": [3, 0], "ttft_ms": {"p50": 1.0}}})
    assert "cache-aware" in mixed  # kv collapsed too: the load-aware strategies are the advice


def test_a_dp_run_counts_ranks():
    # --dp-attention: requests_per_worker has one entry per rank (2 workers x 2 ranks = 4 targets); 10 of 10 on one
    # is 100 % of the requests on one of 4 ranks, and the line says rank, never worker
    msg = collapse_warning({"kv": dict(TIMED, mode="kv", requests_per_worker=[0, 10, 0, 0], dp_ranks=2,
                                       load_imbalance=4.0)})
    assert msg.startswith("one rank took almost every request (kv: 10 of 10 requests on one of 4 attention-DP ranks "
                          "(2 a worker) (100%, imbalance 4.0)): the run measures one overloaded rank, not the fleet")
    assert msg.endswith("(at least 90% on one rank counts; see docs/commands.md)") and "worker took" not in msg


def test_sim_with_dp_attention_warns_of_a_rank():
    # 20 requests of one prefix on one worker of 2 ranks routed by kv: the first rank to store the prefix takes all
    r = ok(invoke("sim", *SAME_PREFIX, "--model", "qwen3-30b-a3b", "--ep", "2", "--dp-attention", "--workers", "1",
                  "--mode", "kv"))
    line = r.stderr.splitlines()[-1]
    assert line.startswith("Warning: one rank took almost every request (kv: 20 of 20 requests on one of 2 "
                           "attention-DP ranks (2 a worker)")


def _elastic(per_worker, lives, makespan_s=100.0, **more):
    """A timed elastic run's result: ``lives`` is ``(ready_s, left_s)`` per worker id."""
    return dict(TIMED, mode="least-loaded", requests_per_worker=per_worker, makespan_s=makespan_s,
                worker_lifetimes=[{"worker": w, "joined_s": ready, "ready_s": ready, "left_s": left, "left_by": None}
                                  for w, (ready, left) in enumerate(lives)], **more)


def test_an_elastic_run_is_judged_per_second_alive():
    # worker 0 alive 0-100 s took 100 requests: 1.0/s; worker 1 ready at 90 s (to the end, 100 s) took 10:
    # 10 / 10 s = 1.0/s; worker 2 never became ready (left out). Counts: 100 of 110 = 91 % (the count rule
    # would warn), rates: 1.0 of 2.0 = 50 %: fair.
    fair = _elastic([100, 10, 0], [(0.0, None), (90.0, None), (None, 95.0)])
    assert alive_rates(fair) == [1.0, 1.0, None]
    assert collapsed_share(fair) == (100, 110, 3)
    assert collapse_warning({"least-loaded": fair}) is None
    # worker 1 alive 90-100 s took none: rates 1.0 and 0.0, 100 % on worker 0
    msg = collapse_warning({"least-loaded": _elastic([100, 0, 0], [(0.0, None), (90.0, None), (None, 95.0)])})
    assert "least-loaded: 1 requests/s alive on one of 2 workers, the others 0 together (100% of the rates" in msg


@pytest.mark.parametrize("first, warns", [(90, True), (89, False)])
def test_the_elastic_threshold_by_hand(first, warns):
    # worker 0: first requests over 100 s; worker 1 (ready 20 s, left 30 s: 10 s alive) 1 request = 0.1/s.
    # 90: 0.9 of 1.0 = 90 % (the threshold); 89: 0.89 of 0.99 = 89.9 %
    result = _elastic([first, 1], [(0.0, None), (20.0, 30.0)])
    assert (collapse_warning({"kv": result}) is not None) is warns


def test_decode_only_scaling_keeps_the_count_rule():
    # --split with an elastic decode pool: the lifetimes are decode workers', the counts the 2 prefill workers'
    result = _elastic([10, 0], [(0.0, None)] * 3)
    for life in result["worker_lifetimes"]:
        life["pool"] = "decode"
    assert alive_rates(result) is None
    assert "10 of 10 requests on one of 2 workers" in collapse_warning({"kv": result})
