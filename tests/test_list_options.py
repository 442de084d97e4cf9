"""Every list option refuses a repeated value alike: exit 2, one line naming the option and both spellings."""
from __future__ import annotations

import pytest

from helpers import invoke


@pytest.mark.parametrize("args, option, words", [
    (["cliff", "--gpu", "100,100"], "--gpu", "'100' repeats '100'"),
    (["cliff", "--cpu", "0,100,0100"], "--cpu", "'0100' repeats '100'"),  # same number, other spelling
    (["disagg", "--tokens", "10", "--gbps", "1,1.0"], "--gbps", "'1.0' repeats '1'"),
    (["compare", "--workers", "2,02"], "--workers", "'02' repeats '2'"),
    (["compare", "--capacity", "unbounded,none"], "--capacity", "'none' repeats 'unbounded'"),
    (["compare", "--modes", "rr,kv,rr"], "--mode", "'rr' repeats 'rr'"),
    (["sweep", "--grid", "workers=2,02", "--dry-run"], "workers", "'02' repeats '2'"),
])
def test_a_repeated_value_is_refused(args, option, words):
    result = invoke(*args)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: ") and option in line and words in line


def test_passes_is_a_sequence_and_may_repeat():
    # --passes lists reads in order (fwd,fwd reads forward twice through one cache): a repeat is a new pass
    result = invoke("scenario", "--passes", "fwd,fwd")
    assert result.exit_code == 0
    assert result.output.count('"order": "fwd"') == 2
