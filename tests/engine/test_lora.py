"""LoRA adapters on the workers (issue 42 item 4): slots, load times, vLLM 0.33's max_loras rule, lora-affinity.

Timed hand cases: linear step model 10 ms + 1 ms per prefill token + 2 ms per decode request, every overhead
term off, one worker, 16-token prompts of fresh tokens; figures derived in the comments. Llama-3.1-8B's
adapter at rank 16 (dynlab/models/lora.py): 16 x (7 x 4096 + 2 x 4096 + 2 x 1024 + 3 x 14336) = 1,310,720
parameters per layer, x 32 layers x 2 bytes (bfloat16) = 83,886,080 bytes.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.engine.config import SimConfig
from dynlab.engine.lora import AdaptersInFlight, LoraSlots, LoraSpec
from dynlab.engine.request import EngineRequest
from dynlab.engine.worker import EngineWorker
from dynlab.latency.base import LatencyModel, StepBatch
from dynlab.latency.hardware import model_spec
from dynlab.models.lora import adapter_bytes
from dynlab.routing.strategy import FleetView, Request, RunContext
from dynlab.sim import run
from dynlab_builtins.scorers import LoraScorer
from helpers import terms_off

LINEAR = {"latency_model": "linear", **terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2})}
BYTES = 83_886_080


def _row(i, t, out, lora=None, **attrs):
    row = {"timestamp": t, "tokens": list(range(100 * i + 1, 100 * i + 17)), "output_length": out, **attrs}
    if lora is not None:
        row["lora_name"] = lora
    return row


def _run(tmp_path, rows, **kw):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run(SimConfig(trace=str(path), trace_format="tokens", timing=True, workers=1, mode="rr", capacity=64,
                         **{**LINEAR, **kw}))


def test_adapter_bytes_from_the_models_shapes():
    assert adapter_bytes(model_spec("llama-3.1-8b"), 16)[0] == BYTES  # the module docstring's sum
    # Qwen3-8B: 16 x (7 x 4096 + 2 x 32 x 128 + 2 x 8 x 128 + 3 x 12288) = 1,212,416 per layer, x 36 x 2 B
    assert adapter_bytes(model_spec("qwen3-8b"), 16)[0] == 1_212_416 * 36 * 2
    assert adapter_bytes(model_spec("llama-3.1-8b"), 64)[0] == 4 * BYTES  # linear in the rank
    with pytest.raises(ValueError, match="experts"):
        adapter_bytes(model_spec("qwen3-30b-a3b"), 16)


def test_a_third_adapter_waits_at_max_loras_2_until_the_first_two_finish(tmp_path):
    """A (a), B (b), C (c) arrive at 0; --max-loras 2, --max-cpu-loras 3. Bandwidths chosen so a load takes
    83,886,080 B / 83.88608 GB/s = 1 ms from host memory and 83,886,080 B / 8.388608 GB/s = 10 ms more from disk.

    Step 1 at 0: A admitted (adapters {a}), B admitted ({a, b}), C skipped (c would be a third). Cold loads of
    a and b: 2 x 11 = 22 ms, then the prefill 10 + 32 = 42: first tokens at 64. Decode steps of A and B (10 +
    4 = 14 ms each): 78, 92, 106, where both finish (4 tokens). C is skipped at every one (a and b run).
    Step at 106: C admitted, cold load 11 ms (a full GPU: an eviction), prefill 10 + 16 = 26: first token at
    143 (TTFT 143), its second token at 143 + 12 = 155."""
    rows = [_row(0, 0, 4, "a", **{"class": "ab"}), _row(1, 0, 4, "b", **{"class": "ab"}),
            _row(2, 0, 2, "c", **{"class": "c"})]
    out = _run(tmp_path, rows, max_loras=2, max_cpu_loras=3, pcie_gbps=83.88608, lora_disk_gbps=8.388608)
    assert out["by_class"]["ab"]["ttft_ms"]["mean"] == 64.0
    assert out["by_class"]["c"]["ttft_ms"]["mean"] == 143.0
    lora = out["lora"]
    assert (lora["loads"], lora["cold_loads"], lora["evictions"], lora["cpu_evictions"]) == (3, 3, 1, 0)
    assert lora["load_time_ms"] == pytest.approx(33.0, abs=1e-3)
    assert (lora["requests"], lora["adapters"], lora["adapter_bytes"]) == (3, 3, BYTES)
    # --max-loras 3: no one waits: three cold loads (33 ms), then one prefill of 48 tokens (58 ms): 91 each
    wide = _run(tmp_path, rows, max_loras=3, pcie_gbps=83.88608, lora_disk_gbps=8.388608)
    assert wide["by_class"]["c"]["ttft_ms"]["mean"] == 91.0 and wide["lora"]["evictions"] == 0


def test_a_load_delays_the_first_step_by_bytes_over_bandwidth(tmp_path):
    """Default bandwidths: host -> GPU 83,886,080 B / 25 GB/s = 3.3554432 ms; disk 83,886,080 B / 7 GB/s =
    11.98372571 ms. --max-loras 1, --max-cpu-loras 2; one-token answers, 100 ms apart (each alone).

    r0 (a): cold load 15.33916891 ms + prefill 26: TTFT 41.339. r1 (b): cold too (41.339), evicting a from the
    GPU slot (a stays in host memory). r2 (a): from host memory, 3.3554432 + 26 = 29.355. r3 (a): resident, 26."""
    rows = [_row(0, 0, 1, "a", **{"class": "cold"}), _row(1, 100, 1, "b", **{"class": "cold"}),
            _row(2, 200, 1, "a", **{"class": "warm"}), _row(3, 300, 1, "a", **{"class": "hot"})]
    out = _run(tmp_path, rows, max_loras=1, max_cpu_loras=2)
    by = out["by_class"]
    assert (by["cold"]["ttft_ms"]["mean"], by["warm"]["ttft_ms"]["mean"], by["hot"]["ttft_ms"]["mean"]) == (
        41.3, 29.4, 26.0)
    lora = out["lora"]
    assert lora["load_ms"] == pytest.approx(BYTES / 25e9 * 1e3) and lora["load_ms"] == pytest.approx(3.3554432)
    assert lora["cold_load_ms"] == pytest.approx(BYTES / 7e9 * 1e3 + BYTES / 25e9 * 1e3)
    assert (lora["loads"], lora["cold_loads"], lora["evictions"]) == (3, 2, 2)
    assert lora["load_time_ms"] == pytest.approx(2 * 15.33916891 + 3.3554432, abs=1e-3)


def test_tensor_parallel_gpus_copy_their_share_each(tmp_path):
    """--tp 2: each GPU copies half the bytes over its own link: 3.3554432 / 2 ms from host memory."""
    out = _run(tmp_path, [_row(0, 0, 1, "a")], max_loras=1, tp=2)
    assert out["lora"]["load_ms"] == pytest.approx(3.3554432 / 2)


def test_no_lora_section_without_adapters_or_without_max_loras(tmp_path):
    plain = [_row(0, 0, 2), _row(1, 0, 2)]
    assert "lora" not in _run(tmp_path, plain, max_loras=2)  # no request names an adapter
    named = [_row(0, 0, 2, "a"), _row(1, 0, 2, "b")]
    out = _run(tmp_path, named)  # adapters not modelled: both run at once, no load
    assert "lora" not in out and out["ttft_ms"]["mean"] == 42.0  # 10 + 32


class Flat(LatencyModel):
    """1 ms per step, whatever it computes."""

    def __init__(self):
        pass

    def step_ms(self, batch: StepBatch) -> float:
        return 1.0


def _req(rid, lora, n_out=3):
    r = EngineRequest(rid, 0.0, 8, n_out, [rid * 10, rid * 10 + 1])
    if lora:
        r.attrs = {"lora_name": lora}
    return r


def _spec(max_loras, cpu=None):
    return LoraSpec(max_loras, cpu or max_loras, 16, 0, "", 0.0, 0.0)


def test_skipped_requests_keep_their_place_and_later_ones_go_on():
    """--max-loras 1: A (a) then B (b), C (a), D (none), E (b). The first step admits A, skips B, admits C
    (a is in the step already) and D (the base model needs no slot), skips E: the waiting queue is B, E."""
    w = EngineWorker(0, 100, 4, Flat(), lora=_spec(1))
    reqs = [_req(0, "a"), _req(1, "b"), _req(2, "a"), _req(3, None), _req(4, "b")]
    for r in reqs:
        assert w.submit(r, 0.0)
    w.start_step(0.0)
    assert [r.id for r in w.running] == [0, 2, 3] and [r.id for r in w.waiting] == [1, 4]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", None]), min_size=1, max_size=12),
       st.integers(1, 3), st.integers(0, 2))
def test_running_requests_never_hold_more_than_max_loras_adapters(adapters, k, extra_cpu):
    """Whatever the adapters, every request finishes, the running requests never name more than max_loras
    adapters (vLLM asserts it), and each adapter is loaded at least once."""
    w = EngineWorker(0, 200, 4, Flat(), lora=_spec(k, k + extra_cpu))
    reqs = [_req(i, a, 1 + i % 3) for i, a in enumerate(adapters)]
    for r in reqs:
        w.submit(r, 0.0)
    t = 0.0
    while not w.idle:
        end = w.start_step(t)
        assert len({r.attrs["lora_name"] for r in w.running if r.attrs}) <= k
        t = end
        w.finish_step()
    assert all(r.finish_ms is not None for r in reqs)
    assert w.lora.loads >= len({a for a in adapters if a})
    assert len(w.lora.gpu) <= k and len(w.lora.cpu) <= k + extra_cpu


def test_lora_slots_keep_the_batchs_own_adapters():
    """GPU slots 2 holding [c, a] (c least recent); a step of a and b: a is touched first, so b evicts c."""
    s = LoraSlots(_spec(2, 3))
    s.activate([(_req(0, "c"), 1)])
    s.activate([(_req(1, "a"), 1)])
    s.activate([(_req(2, "b"), 1), (_req(3, "a"), 1)])
    assert list(s.gpu) == ["a", "b"] and s.evictions == 1 and s.loads == 3


def test_lora_scorer_is_llm_ds_affinity_score():
    """Slots 2: worker 0 runs a (1.0 for a), worker 1 runs b and c (full: 0.0), worker 2 none (room: 0.8)."""
    fleet = FleetView([0] * 3, [1, 2, 0], [0] * 3, [0] * 3, [0] * 3, [0] * 3,
                      lora_adapters=[{"a": 1}, {"b": 1, "c": 2}, {}])
    scorer = LoraScorer(RunContext(workers=3, timed=True, max_loras=2))
    assert scorer.score(Request((), attrs={"lora_name": "a"}), fleet, None) == [1.0, 0.0, 0.8]
    assert scorer.score(Request(()), fleet, None) == [0.0, 0.0, 0.0]  # the base model: no preference
    one = LoraScorer(RunContext(workers=3, timed=True))  # no --max-loras: vLLM's default 1 slot
    assert one.score(Request((), attrs={"lora_name": "b"}), fleet, None) == [0.0, 1.0, 0.8]


def test_lora_affinity_loads_fewer_adapters_than_round_robin(tmp_path):
    """A seeded workload: 300 requests at 30/s (Poisson), prompts mean 600 tokens, answers mean 150, 16 adapters
    of zipf popularity; 4 H100 workers (Llama-3.1-8B, roofline), --max-loras 2. Round robin spreads every
    adapter over every worker; lora-affinity keeps an adapter where its requests are in flight. Figures
    measured on this commit (2026-12-07)."""
    spec = tmp_path / "w.json"
    spec.write_text(json.dumps({"seed": 1, "requests": 300, "arrival": {"process": "poisson", "rate": 30},
                                "input": {"dist": "lognormal", "mean": 600, "sigma": 0.6},
                                "output": {"dist": "lognormal", "mean": 150, "sigma": 0.5},
                                "adapters": {"count": 16, "popularity": "zipf"}}))
    out = {m: run(SimConfig(workload=str(spec), timing=True, workers=4, mode=m, max_loras=2))
           for m in ("rr", "lora-affinity")}
    rr, aff = out["rr"]["lora"], out["lora-affinity"]["lora"]
    assert rr["requests"] == aff["requests"] == 300 and rr["adapters"] == aff["adapters"]  # share 1: all name one
    assert aff["loads"] < rr["loads"] and aff["load_time_ms"] < rr["load_time_ms"]
    assert (rr["loads"], aff["loads"]) == (85, 30)  # measured (rr: 1,303.8 ms loading, lora-affinity: 460.2 ms)
    for x in (rr, aff):  # each load's time: every load here is cold (host slots = GPU slots, vLLM's default)
        assert x["load_time_ms"] == pytest.approx(x["cold_loads"] * x["cold_load_ms"]
                                                  + (x["loads"] - x["cold_loads"]) * x["load_ms"], abs=1e-2)


def test_kv_costs_lora_penalty():
    """kv-cost with lora_penalty=10 and one slot: no block, no load (costs 0 but for the term); worker 0 runs a
    (no penalty), worker 1 runs nothing (a load: 0.2 x 10 = 2), worker 2 runs b (a wait: 10)."""
    from dynlab_builtins.strategies import KvCost

    fleet = FleetView([0] * 3, [0] * 3, [0] * 3, [0] * 3, [0] * 3, [0] * 3,
                      lora_adapters=[{"a": 1}, {}, {"b": 1}])
    ctx = RunContext(workers=3, timed=True, max_loras=1, options={"lora_penalty": 10.0})
    costs, _ = KvCost(ctx).costs(Request((), attrs={"lora_name": "a"}), fleet)
    assert costs == [0.0, 2.0, 10.0]
    assert KvCost(ctx).costs(Request(()), fleet)[0] == [0.0, 0.0, 0.0]  # the base model: no term
    with pytest.raises(ValueError, match="lora_penalty"):
        KvCost(RunContext(workers=3, options={"lora_penalty": 10.0}))


def test_the_routers_adapter_book_counts_requests_in_flight():
    """TimedFleet's book (AdaptersInFlight): A twice and B once routed to worker 0, A once to worker 1, a
    request without an adapter anywhere: worker 0 holds {A: 2, B: 1}, worker 1 {A: 1}. One A and the B leave
    worker 0: {A: 1} (B, at 0, is left out); a joining worker 2 starts empty."""
    book = AdaptersInFlight(2)
    for attrs, w in (({"lora_name": "A"}, 0), ({"lora_name": "A"}, 0), ({"lora_name": "B"}, 0),
                     ({"lora_name": "A"}, 1), ({}, 1), (None, 0)):
        book.add(attrs, w)
    assert book.per_worker == [{"A": 2, "B": 1}, {"A": 1}]
    book.remove({"lora_name": "A"}, 0)
    book.remove({"lora_name": "B"}, 0)
    book.remove(None, 1)
    book.add_worker()
    assert book.per_worker == [{"A": 1}, {"A": 1}, {}]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["A", "B", None]), st.integers(0, 2)), max_size=30))
def test_the_adapter_book_is_empty_once_every_request_left(routed):
    """Every request added then removed, in any order: no adapter is left in flight anywhere."""
    book = AdaptersInFlight(3)
    reqs = [({"lora_name": a} if a else {}, w) for a, w in routed]
    for attrs, w in reqs:
        book.add(attrs, w)
    assert sum(sum(h.values()) for h in book.per_worker) == sum(1 for a, _ in routed if a)
    for attrs, w in reversed(reqs[::2] + reqs[1::2]):
        book.remove(attrs, w)
    assert book.per_worker == [{}, {}, {}]

