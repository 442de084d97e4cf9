"""Every workload spec in examples/ (the docs' worked examples name them) runs: 20 requests of each, timed."""
import json
from pathlib import Path

import pytest

from helpers import invoke

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.json"))


def test_the_examples_folder_holds_specs():
    assert len(EXAMPLES) >= 4 and any(p.name == "step_x4.json" for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_workload_runs(path):
    res = invoke("sim", "--timing", "--workload", str(path), "--requests", "20", "--quiet")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["requests"] == 20
