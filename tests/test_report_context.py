"""The report's configuration block says where a run's requests and arrivals come from (a fresh user's trial:
a ``--workload`` run read as the lab's synthetic workload, "Poisson, None requests/s", and plan's binding
words doubled, "none: none: ...")."""
from __future__ import annotations

import json

from click.testing import CliRunner

from dynlab.cli import main

SPEC = {"seed": 1, "requests": 6, "arrival": {"process": "poisson", "rate": 5},
        "input": {"dist": "constant", "value": 40}, "output": {"dist": "constant", "value": 4}}


def _run(tmp_path, *args):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    out = CliRunner().invoke(main, [a if a != "SPEC" else str(spec) for a in args])
    assert out.exit_code in (0, 3), out.output
    return (tmp_path / "r.html").read_text()


def test_a_workload_run_names_its_spec_and_arrival_process(tmp_path):
    html = _run(tmp_path, "sim", "--workload", "SPEC", "--timing", "--quiet", "--report", str(tmp_path / "r.html"))
    assert "the workload spec" in html and "spec.json" in html
    assert "the spec&#x27;s arrival process" in html or "the spec's arrival process" in html
    assert "lab&#x27;s synthetic workload" not in html and "None requests/s" not in html


def test_the_synthetic_workload_states_its_default_rate(tmp_path):
    html = _run(tmp_path, "sim", "--timing", "--quiet", "--report", str(tmp_path / "r.html"))
    assert "Poisson, 4.0 requests/s" in html and "None requests/s" not in html


def test_plan_report_says_each_binding_word_once(tmp_path):
    html = _run(tmp_path, "plan", "--workload", "SPEC", "--slo-ttft-ms", "5000", "--executor", "serial", "--quiet",
                "--latency-model", "linear", "--report", str(tmp_path / "r.html"))
    for word in ("none", "queueing", "memory", "compute", "routing"):
        assert f"{word}: {word}:" not in html
