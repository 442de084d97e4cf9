"""A trace piped on stdin (``--trace -``) read by several configurations (compare, sweep and plan runs that
name its blocks differently: another block size, EAGLE's hash lookahead, a P/D split): stdin is read once and
every configuration reads that copy, so the results are those of the same trace given as a file (they
failed with "I/O operation on closed file")."""
from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.sweep.executors import clear_trace_cache


@pytest.fixture(autouse=True)
def _fresh_cache():
    """This process's loaded traces keep a ``-`` trace of an earlier test's stdin: start without them."""
    clear_trace_cache()
    yield
    clear_trace_cache()


def _trace(n: int = 24, seed: int = 3) -> str:
    rng = random.Random(seed)
    prefix = [rng.randrange(1, 30000) for _ in range(64)]
    lines = []
    for i in range(n):
        tokens = prefix[:rng.randrange(16, 64)] + [rng.randrange(1, 30000) for _ in range(rng.randrange(8, 80))]
        lines.append(json.dumps({"timestamp": 40 * i, "tokens": tokens, "output_length": rng.randrange(4, 24)}))
    return "\n".join(lines) + "\n"


CASES = {
    "plan-eagle": ["plan", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50", "--max-workers", "2", "--quiet",
                   "--spec-method", "eagle", "--spec-tokens", "2"],
    "sweep-spec-tokens": ["sweep", "--grid", "spec_tokens=0,2", "--spec-method", "eagle", "--timing", "--quiet"],
    "sweep-block": ["sweep", "--grid", "block=16,32", "--quiet"],
    # three traces in a cache of two: a forked pool worker reads the evicted one again (multiprocessing gives
    # it /dev/null as stdin)
    "sweep-block-local": ["sweep", "--grid", "block=16,32,64", "--executor", "local", "--jobs", "2", "--quiet"],
    "compare-block": ["compare", "--block", "16,32", "--timing"],
    "compare-spec-tokens": ["compare", "--spec-tokens", "0,2", "--spec-method", "eagle", "--timing"],
    "compare-split": ["compare", "--split", "2:0,1:1", "--timing", "--spec-method", "eagle", "--spec-tokens", "2"],
}


def _lines(output: str, path: str) -> list:
    """The output with the trace's name (- or the file) taken out, sweep's lines in cell order."""
    return sorted(output.replace(json.dumps(path), '"TRACE"').splitlines())


@pytest.mark.parametrize("case", sorted(CASES))
def test_stdin_read_by_several_configurations_gives_the_files_results(tmp_path, case):
    text = _trace()
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    args = CASES[case]
    piped = CliRunner().invoke(main, args + ["--trace", "-"], input=text)
    assert piped.exit_code == 0, piped.output
    given = CliRunner().invoke(main, args + ["--trace", str(path)])
    assert given.exit_code == 0, given.output
    assert _lines(piped.output, "-") == _lines(given.output, str(path))


def test_each_command_reads_its_own_stdin(tmp_path):
    """The copy belongs to the stdin it was read from: a second command (another stdin) reads its own."""
    args = ["compare", "--block", "16,32"]
    first = CliRunner().invoke(main, args + ["--trace", "-"], input=_trace(seed=3))
    second = CliRunner().invoke(main, args + ["--trace", "-"], input=_trace(n=10, seed=4))
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert json.loads(first.stdout)["16"]["requests"] == 24
    assert json.loads(second.stdout)["16"]["requests"] == 10
