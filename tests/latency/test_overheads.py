"""The server terms of the latency models (dynlab.latency.overheads): step CPU time and CUDA-graph padding,
each on by default with its published value, each switched off by 0, each pinned by hand."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynlab.latency.base import StepBatch
from dynlab.latency.grid import build_latency_model, hardware_for, latency_grid
from dynlab.latency.overheads import (CLIENT_TERMS, CPU_STEP_US, CPU_US_PER_REQUEST, CUDA_GRAPH_MAX,
                                      DETOK_US_PER_TOKEN, FRONT_END_MS, capture_sizes)

OFF = {"cpu_step_us": "0", "cpu_us_per_request": "0", "cuda_graph_max": "0"}
HW = hardware_for("llama-3.1-8b", "h100", 1)


def test_published_defaults():
    # inference-sim defaults.yaml at f90a1e3a: beta_coeffs[6], beta_coeffs[5], alpha_coeffs[0] (us), alpha_coeffs[2]
    assert (CPU_STEP_US, CPU_US_PER_REQUEST) == (126.024825, 4.41684444)
    assert (FRONT_END_MS, DETOK_US_PER_TOKEN) == (15.563199579, 45.907545)
    assert CUDA_GRAPH_MAX == 512  # vLLM: min(2 x max_num_seqs 256, 512)
    opts = build_latency_model("roofline", HW).opts
    assert (opts["cpu_step_us"], opts["cpu_us_per_request"], opts["cuda_graph_max"]) == (126.024825, 4.41684444, 512)


def test_capture_sizes_are_vllms_ladder():
    sizes = capture_sizes(512)
    assert sizes[:6] == (1, 2, 4, 8, 16, 24)
    assert sizes[33:37] == (248, 256, 272, 288)
    assert sizes[-1] == 512 and len(sizes) == 3 + 31 + 17
    assert capture_sizes(0) == ()
    assert capture_sizes(100)[-1] == 96  # the largest is on the ladder, not the cap itself


@pytest.mark.parametrize("decodes,padded_to", [(3, 4), (5, 8), (9, 16), (250, 256), (257, 272), (512, 512)])
def test_a_decode_step_costs_its_capture_size(decodes, padded_to):
    """A step of 3 decodes runs the graph of 4: its GPU time is that of 4 decodes of the same summed
    context (a padded row has no KV), its CPU time that of the 3 real requests."""
    on = build_latency_model("roofline", HW, {"cpu_step_us": "0", "cpu_us_per_request": "0"})
    off = build_latency_model("roofline", HW, OFF)
    context = 1000 * decodes
    assert on.step_ms(StepBatch((), (), decodes, context)) == off.step_ms(StepBatch((), (), padded_to, context))


def test_mixed_steps_pad_their_tokens_and_large_steps_none():
    on = build_latency_model("roofline", HW, {"cpu_step_us": "0", "cpu_us_per_request": "0"})
    off = build_latency_model("roofline", HW, OFF)
    # 100 prefill tokens + 3 decodes = 103 tokens -> the graph of 104: one padded row
    assert on.step_ms(StepBatch((100,), (0,), 3, 3000)) == off.step_ms(StepBatch((100,), (0,), 4, 3000))
    big = StepBatch((2048,), (0,), 3, 3000)  # above 512 tokens: eager, no padding
    assert on.step_ms(big) == off.step_ms(big)


def test_step_cpu_time_per_step_and_per_request():
    cpu = build_latency_model("roofline", HW, {"cuda_graph_max": "0"})
    off = build_latency_model("roofline", HW, OFF)
    for batch, requests in ((StepBatch((), (), 7, 7000), 7), (StepBatch((300, 0), (0, 5), 2, 100), 3)):
        extra = (126.024825 + 4.41684444 * requests) / 1000.0
        assert cpu.step_ms(batch) == pytest.approx(off.step_ms(batch) + extra, rel=1e-12)
    lin, lin_off = build_latency_model("linear", HW), build_latency_model("linear", HW, {"cpu_step_us": "0",
                                                                                           "cpu_us_per_request": "0"})
    batch = StepBatch((512,), (0,), 10, 10000)
    assert lin.step_ms(batch) == pytest.approx(lin_off.step_ms(batch) + (126.024825 + 4.41684444 * 11) / 1000.0)
    assert lin.decode_ms(10, 10000, 5) == pytest.approx(5 * lin.step_ms(StepBatch((), (), 10, 10000)))


@given(requests=st.integers(1, 600), context=st.integers(1, 50_000), steps=st.integers(0, 300),
       hw=st.sampled_from([("llama-3.1-8b", "h100", 1), ("qwen3-32b", "h200", 2), ("qwen3-30b-a3b", "h100", 1)]))
def test_closed_form_decode_is_the_sum_of_its_steps_with_the_terms_on(requests, context, steps, hw):
    model = build_latency_model("roofline", hardware_for(*hw))
    summed = sum(model.step_ms(StepBatch((), (), requests, context + k * requests)) for k in range(steps))
    assert model.decode_ms(requests, context, steps) == pytest.approx(summed, rel=1e-9, abs=1e-9)


def test_the_terms_show_in_dynlab_latency():
    grid = latency_grid(("roofline", "linear", "blis"))
    assert grid["latency_models"]["roofline"]["server_terms"] == {
        "cpu_step_us": 126.024825, "cpu_us_per_request": 4.41684444, "cuda_graph_max": 512}
    assert set(grid["latency_models"]["linear"]["server_terms"]) == {"cpu_step_us", "cpu_us_per_request"}
    assert "server_terms" not in grid["latency_models"]["blis"]  # BLIS prices its own per step and request
    assert grid["client_terms"] == CLIENT_TERMS == {"request_overhead_ms": 15.563199579,
                                                    "detok_us_per_token": 45.907545}
    off = latency_grid(("roofline",), options=OFF)["latency_models"]["roofline"]
    assert off["server_terms"] == {"cpu_step_us": 0.0, "cpu_us_per_request": 0.0, "cuda_graph_max": 0}
    # decode 16 x 2,048 (16 is a capture size): the terms add 126.0 + 16 x 4.42 us = 0.197 ms
    on = grid["latency_models"]["roofline"]["decode_ms"]["2048"]["16"]
    assert on - off["decode_ms"]["2048"]["16"] == pytest.approx(0.197, abs=0.0015)


# ---- the run's request-level terms: the front end and detokenisation (ServingMetrics, the users) ----------

class _Req:
    def __init__(self, id, arrival, first, output):
        self.id, self.arrival_ms, self.first_token_ms, self.first_scheduled_ms = id, arrival, first, arrival
        self.output_length, self.input_length, self.hit_tokens = output, 100, 0


def test_serving_metrics_add_the_front_end_and_one_detokenisation_per_token():
    from dynlab.engine.metrics import ServingMetrics

    m = ServingMetrics(front_ms=5.0, token_ms=0.5)
    req = _Req(0, 0.0, 10.0, 4)  # engine: first token at 10 ms, last at 40 ms
    m.on_arrival(req, 0.0)
    m.on_finish(req, 40.0)
    # the client: first token 10 + 5 + 0.5; the last 40 + 5 + 4 x 0.5; TPOT (47 - 15.5) / 3 = 10.5
    assert (m.ttft, m.e2e, m.tpot) == ([15.5], [47.0], [10.5])
    assert m.e2e[0] - m.ttft[0] == pytest.approx(3 * m.tpot[0])


def test_a_closed_loop_user_waits_for_its_last_token():
    from dynlab.engine.closed import ClosedLoop, SessionTurns

    class Loop:
        now = 0.0

        def __init__(self):
            self.sent = []
            self.events = []

        def at(self, t, kind, fn, *args):
            self.sent.append((t, *args))
            self.events.append((t, fn, args))

        def run(self):
            """The events scheduled so far in time order (ties in their order), as EventLoop runs them."""
            for t, fn, args in sorted(self.events, key=lambda e: e[0]):
                self.now = t
                fn(*args)
            self.events = []

    loop = Loop()
    users = ClosedLoop(["a", "b"], 1, loop, think_time_ms=2.0 + 5.0, token_ms=0.5)  # think 2, front 5
    arrived = []
    users.attach(lambda req: arrived.append((loop.now, req)))
    assert list(users.initial()) == [("a", 0.0)]
    users.on_finish(_Req(0, 0.0, 10.0, 4), 40.0)
    loop.run()
    assert arrived == [(40.0 + 7.0 + 2.0, "b")]
    # the users take the requests in the workload's order as they see their answers: "a" (40 tokens) ends at
    # 40 ms, seen at 60; "b" (2 tokens) ends at 41, seen at 42: b's user sends first, and sends "c"
    loop = Loop()
    users = ClosedLoop(["a", "b", "c", "d"], 2, loop, think_time_ms=5.0, token_ms=0.5)  # front 5, no think
    arrived = []
    users.attach(lambda req: arrived.append((loop.now, req)))
    assert list(users.initial()) == [("a", 0.0), ("b", 0.0)]
    users.on_finish(_Req(0, 0.0, 10.0, 40), 40.0)
    users.on_finish(_Req(1, 0.0, 10.0, 2), 41.0)
    loop.run()
    assert arrived == [(41.0 + 5.0 + 2 * 0.5, "c"), (40.0 + 5.0 + 40 * 0.5, "d")]
    loop2 = Loop()
    turns = SessionTurns([type("R", (), {"index": i})() for i in (0, 1)], {1: (0, 3.0)}, loop2, 5.0, 0.5)
    turns.attach(lambda req: None)
    turns.on_finish(_Req(0, 0.0, 10.0, 4), 40.0)
    assert loop2.sent[0][0] == 40.0 + 5.0 + 2.0 + 3.0  # the answer seen, then the think time


def test_sim_switches_each_term_off(tmp_path):
    """An open-loop run's engine does not see the request-level terms: switching them off moves every TTFT
    by exactly the front end plus one detokenisation."""
    import json

    from dynlab.engine.config import SimConfig
    from dynlab.sim import run

    path = tmp_path / "w.json"
    path.write_text(json.dumps({"seed": 1, "requests": 40, "arrival": {"process": "poisson", "rate": 4},
                                "input": {"dist": "uniform", "min": 100, "max": 900},
                                "output": {"dist": "uniform", "min": 2, "max": 50}}))
    on = run(SimConfig(workload=str(path), timing=True, workers=2))
    off = run(SimConfig(workload=str(path), timing=True, workers=2, request_overhead_ms=0.0,
                        detok_us_per_token=0.0))
    assert on["ttft_ms"]["p50"] == pytest.approx(off["ttft_ms"]["p50"] + 15.563 + 0.046, abs=0.051)
    assert on["queue_wait_ms"] == off["queue_wait_ms"]  # the engine's own times do not move
    gpu_off = run(SimConfig(workload=str(path), timing=True, workers=2, request_overhead_ms=0.0,
                            detok_us_per_token=0.0, latency_opts=dict(OFF)))
    assert gpu_off["tpot_ms"]["p50"] < off["tpot_ms"]["p50"]  # the step CPU time slows every decode
