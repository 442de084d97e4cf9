"""docs/development.md's extension recipes, each built as a toy through the public interface only
(issue 39 item 7). The recipes that have a test elsewhere name it:

- a metric (a recorder): here, a per-tenant recorder, one class, fed by a trace's ``tenant`` field, and a
  count-based one (``on_route``; its keys on the synthetic workload only with ``all_metrics``);
- a GPU: tests/models/test_gpu_file.py;
- a topology: tests/sim/test_toy_topology.py;
- an engine kind, a queue policy, an admission policy, a strategy, a scorer: tests/test_thirdparty_plugin.py
  (a separate distribution, tests/plugin_dist);
- a per-request attribute and a trace format of one's own: tests/test_request_attrs.py.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

from dynlab.engine.config import SimConfig
from dynlab.engine.metrics import Recorder
from dynlab.sim import run
from helpers import terms_off

#: linear steps: 10 ms + 1 ms per prefill token + 2 ms per decoding request; no overhead term
LINEAR = {"latency_model": "linear", **terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2})}


class TenantTtft(Recorder):
    """The recipe's toy metric: each tenant's requests and first-token times (ms), in one class."""

    def __init__(self):
        self.arrived, self.ttft = {}, defaultdict(list)

    def on_arrival(self, req, t):
        self.arrived[req.id] = t

    def on_first_token(self, req, t):
        self.ttft[req.attrs.get("tenant", "none")].append(round(t - self.arrived[req.id], 6))

    def result(self, engines):
        return {"tenant_ttft_ms": {k: v for k, v in sorted(self.ttft.items())}}


def test_a_per_tenant_recorder_is_one_class_fed_by_a_trace_field(tmp_path):
    rows = [{"timestamp": 0, "tokens": list(range(32)), "output_length": 3, "tenant": "acme"},
            {"timestamp": 1000, "tokens": list(range(100, 116)), "output_length": 2, "tenant": "beta"},
            {"timestamp": 2000, "tokens": list(range(200, 248)), "output_length": 2}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = SimConfig(trace=str(path), trace_format="tokens", timing=True, workers=1, mode="rr", **LINEAR)
    out = run(config, recorders=(TenantTtft(),))
    # each request is alone on the worker (1 s apart): its first token ends its prefill step,
    # 10 ms + 1 ms x prompt tokens: 32 -> 42 ms, 16 -> 26 ms, 48 -> 58 ms
    assert out["tenant_ttft_ms"] == {"acme": [42.0], "beta": [26.0], "none": [58.0]}
    assert out["ttft_ms"]["p50"] == 42.0  # the run's own figure agrees (median of 26, 42, 58)


class HitRoutes(Recorder):
    """The recipe's count-based hook: requests routed to a worker already holding some of their blocks."""

    def __init__(self):
        self.hit_routes, self.held = 0, 0

    def on_route(self, request, worker, predicted, actual, cap):
        self.hit_routes += actual > 0
        self.held += actual

    def result(self, engines):
        return {"hit_routes": self.hit_routes, "held_blocks": self.held}


def test_a_recorder_sees_count_based_routes_and_its_keys_need_all_metrics_on_the_synthetic_workload(tmp_path):
    # 16-token blocks; rr on 2 workers: A (2 blocks) -> w0, B (2 blocks) -> w1, A + 1 block -> w0 (holds A's 2),
    # B + 1 block -> w1 (holds B's 2): 2 routes hit, 2 + 2 = 4 blocks held, which is the run's cached_blocks
    a, b = list(range(32)), list(range(100, 132))
    prompts = [a, b, a + list(range(32, 48)), b + list(range(132, 148))]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "tokens": p, "output_length": 1}) + "\n"
                            for i, p in enumerate(prompts)))
    out = run(SimConfig(trace=str(path), trace_format="tokens", block=16, workers=2, mode="rr"),
              recorders=(HitRoutes(),))
    assert (out["hit_routes"], out["held_blocks"]) == (2, 4) == (2, out["cached_blocks"])
    # the synthetic workload's count-based run prints the six seed keys only, a recorder's too, unless all_metrics
    synthetic = SimConfig(mode="rr", workers=2, prefixes=3, reps=2, plen=64, tail=16, block=16)
    assert "hit_routes" not in run(synthetic, recorders=(HitRoutes(),))
    out = run(replace(synthetic, all_metrics=True), recorders=(HitRoutes(),))
    assert out["held_blocks"] == out["cached_blocks"]
