"""compare's out-of-domain latency warning: once per shape per command, as plan warns (not once per run)."""
from __future__ import annotations

import pytest
from helpers import invoke, ok

RUN = ["compare", "--trace", "mooncake-conversation", "--requests", "12", "--timing", "--quiet", "--format", "json"]
ROOFLINE = "Warning: latency model roofline: outside its fit"


def _warnings(*args) -> list:
    return [line for line in ok(invoke(*RUN, *args)).stderr.splitlines() if line.startswith(ROOFLINE)]


@pytest.mark.parametrize("args", [("--gpu", "b200", "--modes", "rr,kv-cost"),
                                  ("--gpu", "b200", "--concurrency", "1,4"),
                                  ("--gpu", "h100,b200")])  # h100 is inside the roofline's fit
def test_one_shape_outside_the_domain_warns_once(args):
    lines = _warnings(*args)
    assert len(lines) == 1 and lines[0].endswith("GPU b200 (see docs/latency.md)")


def test_each_shape_outside_the_domain_warns_once():
    lines = _warnings("--gpu", "b200,l40s", "--mode", "rr")
    assert len(lines) == 2 and len(set(lines)) == 2
    assert lines[0].endswith("GPU b200 (see docs/latency.md)") and lines[1].endswith("GPU l40s (see docs/latency.md)")


def test_sweep_warns_once_per_shape_too(tmp_path):
    r = ok(invoke("sweep", "--trace", "mooncake-conversation", "--requests", "12", "--timing", "--quiet",
                  "--grid", "gpu=b200,h100,l40s", "--grid", "concurrency=1,4", "--out", tmp_path / "r.jsonl"))
    lines = [line for line in r.stderr.splitlines() if line.startswith(ROOFLINE)]
    assert len(lines) == 2 and lines[0].endswith("GPU b200 (see docs/latency.md)")
    assert lines[1].endswith("GPU l40s (see docs/latency.md)")
