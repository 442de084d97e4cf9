"""The timed replay (--timing): engines behind a router, KV events on the clock, the serving metrics."""
from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import published, terms_off
from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.engine.metrics import ServingMetrics
from dynlab.engine.run import build_strategy
from dynlab.sim.runner import run
from dynlab.engine.serving import build_engines
from dynlab.routing.hashing import block_hashes
from dynlab.routing.strategy import Request

LINEAR = {"beta0": "10", "beta1": "0.01", "beta2": "1"}  # ms, ms per prefill token, ms per decode request


def write(tmp_path, rows, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def timed(path, **kw):
    """A timed run with every overhead term off (server CPU time, front end, detokenisation): the hand
    cases' figures are the step model's alone."""
    kw.setdefault("workers", 1)
    kw.setdefault("mode", "rr")
    model = kw.setdefault("latency_model", "linear")
    for name, value in terms_off(model, kw.pop("latency_opts", LINEAR)).items():
        kw.setdefault(name, value)
    return run(SimConfig(trace=path, timing=True, **kw))


# ---- hand-computed cases with the linear model (beta0=10, beta1=0.01, beta2=1) ----------------------------

def test_one_request_ttft_e2e_tpot(tmp_path):
    # prefill 1,000 tokens: 10 + 0.01 x 1000 = 20 ms (first token); 9 decode steps of 10 + 1 = 11 ms
    out = timed(write(tmp_path, [{"tokens": list(range(1000)), "output_length": 10, "timestamp": 0}]))
    assert out["ttft_ms"]["p50"] == 20.0
    assert out["e2e_ms"]["p50"] == 119.0
    assert out["tpot_ms"]["p50"] == 11.0
    assert out["engine_steps"] == 10 and out["preemptions"] == 0 and out["rejected"] == 0


def test_chunked_prefill_of_a_long_prompt(tmp_path):
    # 10,000 tokens at 4,096 per step: chunks 4096, 4096, 1808 -> 3 x 10 + 0.01 x 10,000 = 130 ms
    out = timed(write(tmp_path, [{"tokens": list(range(10_000)), "output_length": 1, "timestamp": 0}]),
                max_num_batched_tokens=4096)
    assert out["ttft_ms"]["p50"] == 130.0 and out["engine_steps"] == 3
    assert out["tpot_ms"]["p50"] is None  # a one-token request has no TPOT: no sample, null (issue 24)


def test_the_same_prompt_twice_hits_all_but_the_last_block(tmp_path):
    # 1,008 tokens = 63 blocks of 16; at most 1,007 tokens can hit: 62 blocks = 992 tokens, 16 computed
    tokens = list(range(1008))
    out = timed(write(tmp_path, [{"tokens": tokens, "output_length": 1, "timestamp": 0},
                                 {"tokens": tokens, "output_length": 1, "timestamp": 1000}]))
    assert out["prefix_hit_rate"] == round(992 / 2016, 4)
    # TTFTs: 10 + 10.08 = 20.08 (first), 10 + 0.16 = 10.16 (second); p50 of the two, inclusive
    assert out["ttft_ms"]["mean"] == round((20.08 + 10.16) / 2, 1)


def test_trace_blocks_and_engine_blocks_are_separate(tmp_path):
    # a trace written at 64-token blocks: request 1 shares ids 1, 2 (128 tokens) with request 0
    rows = [{"timestamp": 0, "input_length": 200, "output_length": 10, "hash_ids": [1, 2, 3, 4]},
            {"timestamp": 10000, "input_length": 200, "output_length": 10, "hash_ids": [1, 2, 5, 6]}]
    path = write(tmp_path, rows)
    out = timed(path, mode="kv", block=64, trace_block=64)
    assert out["block"] == 64 and out["trace_block"] == 64
    assert out["prefix_hit_rate"] == round(128 / 400, 4)
    # TTFT: 10 + 0.01 x 200 = 12 ms, then 10 + 0.01 x 72 = 10.72 ms
    assert out["ttft_ms"]["mean"] == round((12 + 10.72) / 2, 1)
    # at engine blocks of 16 the same trace shares 8 blocks (128 tokens) too, named from the 64-token ids
    out16 = timed(path, mode="kv", block=16, trace_block=64)
    assert out16["prefix_hit_rate"] == round(128 / 400, 4)


def test_goodput_counts_every_request_against_both_slos(tmp_path):
    rows = [{"tokens": list(range(1000)), "output_length": 10, "timestamp": 0}]
    path = write(tmp_path, rows)
    assert timed(path, slo_ttft_ms=20, slo_tpot_ms=11)["goodput"] == 1.0
    assert timed(path, slo_ttft_ms=19.9, slo_tpot_ms=11)["goodput"] == 0.0
    assert timed(path, slo_tpot_ms=10.9)["goodput"] == 0.0
    assert "goodput" not in timed(path)


def test_a_request_that_can_never_fit_is_rejected(tmp_path):
    rows = [{"tokens": list(range(100)), "output_length": 10, "timestamp": 0},
            {"tokens": list(range(16)), "output_length": 1, "timestamp": 5}]
    out = timed(write(tmp_path, rows), capacity=4)  # 4 blocks = 64 tokens < 100 + 10 - 1
    assert out["rejected"] == 1 and out["requests"] == 2
    assert out["goodput"] if "goodput" in out else True


# ---- KV events on the clock ------------------------------------------------------------------------------

def _two_identical(tmp_path, gap_ms):
    tokens = list(range(1000))
    return write(tmp_path, [{"tokens": tokens, "output_length": 1, "timestamp": 0},
                            {"tokens": tokens, "output_length": 1, "timestamp": gap_ms}])


def test_blocks_are_stored_when_their_step_ends(tmp_path):
    # the first request's prefill ends at 20 ms; a second at 10 ms has no event yet, at 30 ms it has
    early = timed(_two_identical(tmp_path, 10), mode="kv-events", workers=2)
    late = timed(_two_identical(tmp_path, 30), mode="kv-events", workers=2)
    assert early["requests_per_worker"] == [1, 1] and early["prefix_hit_rate"] == 0.0
    assert late["requests_per_worker"] == [2, 0] and late["prefix_hit_rate"] > 0.4


def test_event_delay_ms_makes_the_router_late(tmp_path):
    path = _two_identical(tmp_path, 30)
    assert timed(path, mode="kv-events", workers=2, event_delay_ms=5)["requests_per_worker"] == [2, 0]
    assert timed(path, mode="kv-events", workers=2, event_delay_ms=15)["requests_per_worker"] == [1, 1]


def test_event_loss_drops_events(tmp_path):
    out = timed(_two_identical(tmp_path, 30), mode="kv-events", workers=2, event_loss=1.0)
    assert out["events_dropped"] == out["events_published"] > 0
    assert out["requests_per_worker"] == [1, 1]


def test_the_router_sees_finishes_at_once(tmp_path):
    # least-loaded: the first request has finished (20 ms) when the second arrives (30 ms): worker 0 again
    out = timed(_two_identical(tmp_path, 30), mode="least-loaded", workers=2)
    assert out["requests_per_worker"] == [2, 0]
    busy = timed(_two_identical(tmp_path, 10), mode="least-loaded", workers=2)
    assert busy["requests_per_worker"] == [1, 1]


# ---- properties over random small traces -----------------------------------------------------------------

class Counting(ServingMetrics):
    def __init__(self):
        super().__init__()
        self.finished: list = []

    def on_finish(self, req, t):
        super().on_finish(req, t)
        self.finished.append(req.id)


rows_st = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 80), st.integers(1, 12), st.integers(0, 30)),
                   min_size=1, max_size=25)


def _requests(rows, block):
    out, t = [], 0
    for i, (prefix, tail, output, gap) in enumerate(rows):
        t += gap
        tokens = [prefix] * 20 + list(range(1000 + i * 100, 1000 + i * 100 + tail))
        out.append(Request(tuple(block_hashes(tokens, block)), len(tokens), output, float(t), i))
    return out


@settings(max_examples=40, deadline=None)
@given(rows_st, st.sampled_from(["rr", "kv-events", "kv-cost", "least-loaded"]), st.integers(1, 3),
       st.integers(3, 12), st.sampled_from([4, 8]))
def test_every_request_finishes_once_and_events_mirror_the_pools(rows, mode, workers, capacity, block):
    from dynlab.engine.bus import EventBus
    from dynlab.engine.loop import EventLoop
    from dynlab.engine.env import RunEnv
    from dynlab.engine.metrics import RoutingMetrics
    from dynlab.engine.timed import TimedFleet, arrival_times

    cfg = SimConfig(mode=mode, workers=workers, capacity=capacity, block=block, timing=True,
                    latency_model="linear", latency_opts=LINEAR, max_num_batched_tokens=32)
    setup = build_engines(cfg, None)
    strategy = build_strategy(cfg, random.Random(1), block_tokens=block)
    engines = setup.engines()
    loop = EventLoop()
    stored: list = [set() for _ in engines]

    def on_event(ev):
        strategy.on_event(ev)
        target = stored[ev.worker]
        if type(ev).__name__ == "BlockStored":
            target.update(ev.hashes)
        else:
            target.difference_update(ev.hashes)

    bus = EventBus(loop, on_event)
    serving = Counting()
    reqs = _requests(rows, block)
    fleet = TimedFleet(strategy, engines, RunEnv(loop, bus, None, RoutingMetrics(workers), [serving]),
                       setup.names_of)
    fleet.run(arrival_times(reqs, 1.0, 1.0, random.Random(0)))
    assert sorted(serving.finished) + [] == sorted(set(serving.finished))
    assert len(serving.finished) + serving.rejected == len(reqs)
    for e, held in zip(engines, stored):
        assert e.idle and e.used_blocks == 0
        assert held == published(e.pool)  # zero delay, no loss: the events rebuild each pool's cached set
    if mode == "kv-events":
        for w, held in enumerate(stored):
            assert set(strategy.router.index.blocks(w)) == held


def test_same_seed_gives_byte_identical_json(tmp_path):
    args = ["sim", "--trace", _two_identical(tmp_path, 3), "--timing", "--workers", "2", "--mode", "power-of-two",
            "--quiet"]
    a = CliRunner().invoke(main, args)
    b = CliRunner().invoke(main, args)
    assert a.exit_code == 0 and a.output == b.output


def test_poisson_arrivals_without_timestamps_are_seeded():
    one = run(SimConfig(mode="rr", timing=True, rate=2.0))
    assert one == run(SimConfig(mode="rr", timing=True, rate=2.0))
    assert one["makespan_s"] != run(SimConfig(mode="rr", timing=True, rate=2.0, seed=2))["makespan_s"]


# ---- options that have no effect are refused --------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--max-num-seqs", "4"], "--max-num-seqs has no effect without --timing"),
    (["--event-delay-ms", "5"], "--event-delay-ms has no effect without --timing"),
    (["--latency-model", "linear"], "--latency-model has no effect without --timing"),
    (["--timing", "--event-delay", "2"], "--event-delay has no effect with --timing"),
    (["--timing", "--policy", "fifo"], "--policy has no effect with --timing"),
    (["--timing", "--capacity", "9", "--policy", "fifo"], "--policy has no effect with --timing"),
    (["--timing", "--publish", "no", "--event-delay-ms", "3"], "--event-delay-ms has no effect with --publish no"),
    (["--timing", "--trace-block", "64"], "--trace-block has no effect"),
    (["--timing", "--gpu", "h1000"], "h1000"),
    (["--timing", "--model", "nope"], "nope"),
    (["--timing", "--latency-model", "linear", "--latency-opt", "gamma=1"], "gamma"),
])
def test_timed_options_are_checked(args, message):
    r = CliRunner().invoke(main, ["sim", *args])
    assert r.exit_code == 2, r.output
    assert message in r.output


# ---- the arrival option a workload ignores is refused (a fresh user's trial: both were silently ignored) ----

# --rate on a trace with timestamps rescales it now (issue 27, tests/test_rates.py); two speeds are refused
SPEEDS_REFUSED = ("Error: --rate-scale and --time-scale both set the trace's speed (--rate-scale X is --time-scale "
                  "1/X): give one\n")
SCALE_REFUSED = ("Error: --time-scale has no effect: the workload has no timestamps (its requests arrive as a "
                 "Poisson process of --rate requests/s)\n")


@pytest.mark.parametrize("command", ["sim", "compare", "sweep"])
@pytest.mark.parametrize("timestamps, option, message", [
    (True, ["--rate-scale", "2", "--time-scale", "2"], SPEEDS_REFUSED),
    (False, ["--time-scale", "5"], SCALE_REFUSED),
    (None, ["--time-scale", "5"], SCALE_REFUSED),  # the synthetic workload: a Poisson process too
])
def test_an_arrival_option_the_workload_ignores_is_refused(tmp_path, command, timestamps, option, message):
    rows = [{"input_length": 40, "output_length": 2, "hash_ids": [i]} for i in range(3)]
    if timestamps:
        for i, row in enumerate(rows):
            row["timestamp"] = 10 * i
    trace = [] if timestamps is None else ["--trace", write(tmp_path, rows)]
    args = {"sim": [], "compare": ["--modes", "rr,kv"], "sweep": ["--grid", "mode=rr,kv", "--out",
                                                                 str(tmp_path / "r.jsonl")]}[command]
    r = CliRunner().invoke(main, [command, *trace, "--timing", "--capacity", "50", *option, *args])
    assert (r.exit_code, r.stdout) == (2, "")
    if command == "sweep":  # its errors name the cell
        assert r.stderr.startswith("Error: cell {") and r.stderr.endswith("}: " + message[len("Error: "):])
    else:
        assert r.stderr == message
    assert not (tmp_path / "r.jsonl").exists()


def test_an_arrival_option_the_workload_uses_is_accepted(tmp_path):
    rows = [{"timestamp": 10 * i, "input_length": 40, "output_length": 2, "hash_ids": [i]} for i in range(3)]
    trace = write(tmp_path, rows)
    assert timed(trace, capacity=50, time_scale=5.0)["requests"] == 3
    assert run(SimConfig(timing=True, capacity=50, rate=2.0, latency_model="linear",
                         latency_opts=LINEAR))["requests"] == 72  # the synthetic workload: 12 prefixes x 6
    # a trace streamed from stdin is checked at its first request (nothing to peek at before the run)
    data = "".join(json.dumps(r) + "\n" for r in rows)
    r = CliRunner().invoke(main, ["sim", "--trace", "-", "--timing", "--capacity", "50", "--rate-scale", "2",
                                  "--time-scale", "2"], input=data)
    assert (r.exit_code, r.stderr) == (2, SPEEDS_REFUSED)
    # --rate on it rescales: 2 gaps over 20 ms is 100 requests/s; at --rate 2, timestamps x 50
    r = CliRunner().invoke(main, ["sim", "--trace", "-", "--timing", "--capacity", "50", "--rate", "2"], input=data)
    assert r.exit_code == 0 and json.loads(r.stdout)["time_scale_applied"] == 50.0
