"""``plan --objective cost --mix`` (dynlab.plan.mix): a hand-built case where a fleet of two pools must be cheaper
than any homogeneous one, the bound on the mixed replays, the budget arithmetic and the refusals.

The hand case: two GPU files, ``fast`` with exactly twice ``slow``'s bf16 peak and HBM bandwidth, so under the
roofline with its fixed overhead and every CPU term off each step on ``fast`` takes exactly half ``slow``'s.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, strategies as st

from dynlab.cli import main
from dynlab.latency.base import StepBatch
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.plan.mix import STEPS, most_workers

from helpers import terms_off, terms_off_args

ROOFLINE = ["--latency-opt", "overhead_ms=0", *terms_off_args("roofline"), "--max-num-batched-tokens", "1000",
            "--modes", "rr", "--executor", "serial", "--quiet"]


def _gpus(tmp_path) -> tuple[str, str]:
    paths = []
    for name, scale in (("slow", 1), ("fast", 2)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"name": name, "memory_gb": 80, "bf16_tflops": 500 * scale,
                                    "hbm_gbps": 2000 * scale, "source": "hand-made for this test"}))
        paths.append(str(path))
    return paths[0], paths[1]


def _trace(tmp_path) -> str:
    """12 requests at t = 0, each a 1,000-token prompt of its own blocks and one output token."""
    path, ids = tmp_path / "q.jsonl", iter(range(1, 10**6))
    path.write_text("".join(json.dumps({"timestamp": 0, "input_length": 1000, "output_length": 1,
                                        "hash_ids": [next(ids), next(ids)]}) + "\n" for _ in range(12)))
    return str(path)


def _step_ms(gpu: str) -> float:
    """One step prefilling a 1,000-token prompt alone (no cached context, no decodes) on ``gpu``."""
    lat = build_latency_model("roofline", hardware_for("llama-3.1-8b", gpu, 1),
                              terms_off("roofline", {"overhead_ms": 0})["latency_opts"])
    return lat.step_ms(StepBatch(prefill_tokens=(1000,), prefill_context=(0,)))


def _run(*args):
    return CliRunner().invoke(main, ["plan", *map(str, args)])


def test_a_mix_is_cheaper_than_every_homogeneous_fleet(tmp_path):
    slow, fast = _gpus(tmp_path)
    s = _step_ms(slow)
    assert _step_ms(fast) == s / 2  # both figures of the roofline doubled: every step takes half as long
    # rr deals the 12 requests (all at t = 0) evenly over N workers; a worker's k-th first token is at k x its step
    # (a 1,000-token step budget: one prompt per step, 1 output token: done at its first token). With a 50 ms
    # TTFT SLO (s is about 43 ms): slow meets k = 1 only (s <= 50 < 2 s), fast k = 1 and 2 (s/2, s <= 50 < 1.5 s).
    assert s <= 50 < 1.5 * s
    # goodput 0.25: 3 of the 12 requests within 50 ms. slow: 1 per worker -> 3 workers, 3 x $1 = $3.00/h;
    # fast: 2 per worker -> 2 workers (1 has 2 < 3), 2 x $1.50 = $3.00/h. One of each: 6 requests each, 1 + 2 = 3
    # meet, for $1 + $1.50 = $2.50/h. No homogeneous fleet is that cheap: 2 slow serve 2 < 3, 1 fast serves 2 < 3.
    out = _run("--trace", _trace(tmp_path), "--gpu", f"{slow},{fast}", "--price", "slow=1", "--price", "fast=1.5",
               "--objective", "cost", "--mix", "--slo-ttft-ms", 50, "--goodput", 0.25, *ROOFLINE, "--format", "json")
    assert out.exit_code == 0, out.stderr
    plan = json.loads(out.stdout)
    assert sorted((s["gpu"], s["workers"], s["usd_per_hour"]) for s in plan["shapes"]) == [(fast, 2, 3.0),
                                                                                          (slow, 3, 3.0)]
    answer = plan["mix"]["answer"]
    assert answer["pools"] == [f"{slow}:tp1:1", f"{fast}:tp1:1"] and answer["shape"] == f"{slow}x1:1 + {fast}x1:1"
    assert (answer["workers"], answer["gpus"], answer["usd_per_hour"], answer["goodput"]) == (2, 2, 2.5, 0.25)
    assert answer["price_source"] == {slow: "--price", fast: "--price"}
    # the binding replay: slow x1 alone (one fast worker fewer) serves 1 < 3 in time: goodput 1/12
    assert answer["binding"] == "queueing" and "goodput 0.0833 < 0.25" in answer["why"]
    assert plan["cheapest"]["pools"] == answer["pools"] and plan["cheapest"]["usd_per_hour"] == 2.5
    # slow fixed at 3 - 1 = 2: $2 leaves $1, less than a fast worker; at 1: $2 buys 1 fast ($1.50 < $2): one replay,
    # which meets; then fast fixed at 2 - 1 = 1 leaves $2.50 - $1.50 = $1, no slow worker is strictly cheaper
    assert [(r["pools"], r["meets"]) for r in plan["mix"]["replays"]] == [(answer["pools"], True)]
    assert len(plan["mix"]["replays"]) <= plan["mix"]["max_replays"]
    table = _run("--trace", _trace(tmp_path), "--gpu", f"{slow},{fast}", "--price", "slow=1", "--price", "fast=1.5",
                 "--objective", "cost", "--mix", "--slo-ttft-ms", 50, "--goodput", 0.25, *ROOFLINE, "--format", "table")
    assert f"cheapest meeting the target: {slow}x1:1 + {fast}x1:1, 2 workers (2 GPUs), $2.50/h" in table.stdout
    assert f"sim --pool {slow}:tp1:1 --pool {fast}:tp1:1" in table.stdout
    row = table.stdout.splitlines()[1].split()  # the mix row first: above both shapes at $3.00/h
    assert row[:8] == ["mix", f"{slow}x1:1", "+", f"{fast}x1:1", "2", "2", "2.50", "0.25"]


def test_no_mix_cheaper_when_one_gpu_is_cheaper_per_worker(tmp_path):
    # the linear model ignores the GPU: both need 3 workers (tests/test_plan.py), h200 at $2 -> $6/h, h100 at $6.88.
    # h200 fixed at 2 or 1 leaves $2 or $4, under one h100 ($6.88); h100 fixed at 2 already costs $13.76 > $6: no
    # mixed replay. The bound: 2 ordered pairs x STEPS counts x (1 + ceil(log2(3 - 1))) = 2 x 3 x 2 = 12.
    trace = _trace(tmp_path)
    linear = ["--latency-model", "linear", "--latency-opt", "beta0=1", "--latency-opt", "beta1=0.01",
              "--latency-opt", "beta2=0", *terms_off_args("linear"), "--max-num-batched-tokens", "1000",
              "--modes", "rr", "--executor", "serial", "--quiet", "--format", "json"]
    args = ["--trace", trace, "--slo-ttft-ms", 50, "--gpu", "h100,h200", "--price", "h200=2", "--objective", "cost"]
    out = _run(*args, "--mix", *linear)
    assert out.exit_code == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["mix"] == {"answer": None, "replays": [], "max_replays": 2 * STEPS * 2}
    assert plan["cheapest"]["shape"] == "h200x1 rr" and "pools" not in plan["cheapest"]
    without = json.loads(_run(*args, *linear).stdout)
    assert "mix" not in without and without["shapes"] == plan["shapes"]


@pytest.mark.parametrize("extra, words", [
    (["--gpu", "h100,h200"], "--mix has no effect without --objective cost"),
    (["--objective", "cost"], "--mix has no effect with one --gpu and --tp candidate"),
    (["--objective", "cost", "--gpu", "h100,h200", "--split", "auto"], "--mix: a P/D candidate (--split auto) is not"),
])
def test_mix_refusals_are_one_line(tmp_path, extra, words):
    out = _run("--trace", _trace(tmp_path), "--slo-ttft-ms", 50, "--mix", *extra, *ROOFLINE)
    assert out.exit_code == 2
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"Error: {words}")


@given(budget=st.floats(0, 1000, allow_nan=False), each=st.floats(0.01, 100), cap=st.integers(1, 200))
def test_most_workers_strictly_under_the_budget(budget, each, cap):
    n = most_workers(budget, each, cap)
    assert 0 <= n <= cap
    if n:
        assert round(n * each, 2) < round(budget, 2)
    if n < cap:  # one more would not be strictly cheaper (to a cent)
        assert round((n + 1) * each, 2) >= round(budget, 2) or round(budget, 2) <= 0


@given(cap_a=st.integers(1, 9), cap_b=st.integers(1, 9), demand=st.integers(1, 60),
       cents_a=st.integers(50, 1000), cents_b=st.integers(50, 1000))
def test_the_search_finds_the_cheapest_mix_around_the_answers(cap_a, cap_b, demand, cents_a, cents_b):
    # a capacity model in place of replays: a worker of GPU a serves cap_a units, of b cap_b; a fleet meets the
    # target when its units reach the demand (so more workers never hurt, the search's assumption)
    import math
    from types import SimpleNamespace

    from dynlab.engine.config import SimConfig
    from dynlab.engine.pools import parse_pools
    from dynlab.plan.mix import most_replays, search
    from dynlab.plan.search import Shape
    from dynlab.plan.target import Target

    units = {"h100": cap_a, "h200": cap_b}
    prices = {"h100": cents_a / 100, "h200": cents_b / 100}
    target = Target(slo_ttft_ms=1.0, goodput=1.0)
    n = {g: math.ceil(demand / units[g]) for g in units}
    outcomes = [SimpleNamespace(shape=Shape("llama-3.1-8b", g, 1, "rr"), workers=n[g],
                                search=SimpleNamespace(tested={n[g] - 1: (False, {"goodput": 0.0})}))
                for g in units]

    def replay(config):
        served = sum(units[p.gpu] * p.workers for p in parse_pools(config.pools))
        return {"goodput": 1.0 if served >= demand else 0.0}

    best, seen = search(outcomes, SimConfig(timing=True), prices, target, 1000, replay)
    assert len(seen) <= most_replays(outcomes)
    homogeneous = round(min(n[g] * prices[g] for g in units), 2)
    # every fleet the search looks at: X at its answer - 1, - 2, - 3 (>= 1) beside 1 .. Y's answer - 1 of Y
    around = [round(x * prices[gx] + y * prices[gy], 2) for gx, gy in (("h100", "h200"), ("h200", "h100"))
              for x in range(max(1, n[gx] - 3), n[gx]) for y in range(1, n[gy])
              if x * units[gx] + y * units[gy] >= demand]
    cheaper = [c for c in around if c < homogeneous]
    if not cheaper:
        assert best is None
    else:
        assert best.usd_per_hour == min(cheaper)
        assert best.x * units[best.sx.gpu] + best.y * units[best.sy.gpu] >= demand
