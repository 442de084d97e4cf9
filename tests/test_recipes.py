"""docs/development.md's extension recipes, each built as a toy through the public interface only
(issue 39 item 7). The recipes that have a test elsewhere name it:

- a metric (a recorder): here, a per-tenant recorder, one class, fed by a trace's ``tenant`` field;
- a GPU: tests/models/test_gpu_file.py;
- a topology: tests/sim/test_toy_topology.py;
- an engine kind, a queue policy, an admission policy, a strategy, a scorer: tests/test_thirdparty_plugin.py
  (a separate distribution, tests/plugin_dist);
- a per-request attribute and a trace format of one's own: tests/test_request_attrs.py.
"""
from __future__ import annotations

import json
from collections import defaultdict

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
