"""A workload spec's LoRA adapters (issue 42 item 4): ``"adapters": {"count": N, "popularity": ..., "share": p}``."""
from __future__ import annotations

import collections

import pytest

from dynlab import plugins
from dynlab.traces.workload import SpecError


def rows(spec):
    return list(plugins.workloads().get("synthetic")(spec, "spec.json").rows())


BASE = {"seed": 3, "requests": 400, "arrival": {"process": "constant", "rate": 5},
        "input": {"dist": "constant", "value": 4}, "output": {"dist": "constant", "value": 2}}


def test_weights_pick_the_adapters():
    """Weights [0, 1, 0]: every request names lora-1; a name of its own: x-1."""
    assert {r["lora_name"] for r in rows({**BASE, "adapters": {"count": 3, "popularity": [0, 1, 0]}})} == {"lora-1"}
    named = rows({**BASE, "adapters": {"count": 3, "popularity": [0, 1, 0], "name": "x-"}})
    assert {r["lora_name"] for r in named} == {"x-1"}


def test_zipf_popularity_and_share():
    """Zipf over 4 adapters: weights 1, 1/2, 1/3, 1/4 (sum 25/12): lora-0 expected 400 x 12/25 = 192 times,
    lora-3 48; share 0.5: about half name none (binomial, sd 10: within 5 sd)."""
    counts = collections.Counter(r.get("lora_name") for r in rows({**BASE, "adapters": {"count": 4}}))
    assert set(counts) == {"lora-0", "lora-1", "lora-2", "lora-3"}
    assert abs(counts["lora-0"] - 192) < 5 * 10 and abs(counts["lora-3"] - 48) < 5 * 7
    assert counts["lora-0"] > counts["lora-1"] > counts["lora-3"]
    half = collections.Counter("lora_name" in r for r in rows({**BASE, "adapters": {"count": 4, "share": 0.5}}))
    assert abs(half[True] - 200) < 50


def test_a_sessions_turns_keep_their_adapter_and_the_other_draws_stay():
    """Turns of one session name one adapter; adding adapters changes no timestamp or token."""
    spec = {**BASE, "requests": 60, "sessions": {"turns": 3, "think_time_s": 1}}
    plain, with_lora = rows(spec), rows({**spec, "adapters": {"count": 8, "popularity": "uniform"}})
    assert [{k: v for k, v in r.items() if k != "lora_name"} for r in with_lora] == plain
    by_first = {}
    for r in with_lora:  # a session's turns quote its first prompt's tokens
        by_first.setdefault(r["tokens"][0], set()).add(r["lora_name"])
    assert all(len(names) == 1 for names in by_first.values()) and len(by_first) == 20


def test_a_class_draws_adapters_or_names_one_not_both():
    mix = {"seed": 1, "input": BASE["input"], "output": BASE["output"], "arrival": BASE["arrival"], "classes": [
        {"class": "a", "requests": 3, "adapters": {"count": 2, "popularity": [1, 0]}},
        {"class": "b", "requests": 3, "lora_name": "own"}]}
    assert collections.Counter(r["lora_name"] for r in rows(mix)) == {"lora-0": 3, "own": 3}
    mix["classes"][1]["adapters"] = {"count": 2}
    with pytest.raises(SpecError, match="classes\\[1\\].lora_name"):
        rows(mix)


@pytest.mark.parametrize("adapters, key", [({"count": 0}, "adapters.count"), ({"count": 2, "share": 2}, "adapters.share"),
                                           ({"count": 2, "popularity": [1]}, "adapters.popularity"),
                                           ({"count": 2, "name": ""}, "adapters.name"),
                                           ({"count": 2, "rank": 8}, "adapters")])
def test_bad_adapters_are_refused_by_key(adapters, key):
    with pytest.raises(SpecError) as exc:
        rows({**BASE, "adapters": adapters})
    assert key in str(exc.value)


def test_an_adapter_keys_the_block_names_as_in_a_token_trace(tmp_path):
    """20 requests of one 64-token system prompt + 40 own tokens (104: 6 full 16-token blocks), adapters lora-0 and
    lora-1: the prompt's 4 blocks are named per adapter (vLLM's extra key), so each adapter's first request misses
    them and the 18 others hit them: 18 x 4 / (20 x 6) = 0.6 (one name for both would give 19 x 4 / 120). The
    spec's run equals the run of the trace it writes."""
    import json

    from dynlab.engine.config import SimConfig
    from dynlab.sim import run
    from dynlab.traces.workload_io import write_workload

    spec = {"seed": 1, "requests": 20, "arrival": {"process": "poisson", "rate": 40},
            "input": {"dist": "constant", "value": 40}, "output": {"dist": "constant", "value": 2},
            "prefix": {"groups": 1, "length": 64}, "adapters": {"count": 2, "popularity": "uniform"}}
    assert {r["lora_name"] for r in rows(spec)} == {"lora-0", "lora-1"}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(spec))
    out = run(SimConfig(workload=str(path), workers=1, mode="rr"))
    assert out["block_hit_rate"] == 0.6
    trace = tmp_path / "w.jsonl"
    write_workload(str(path), str(trace))
    assert run(SimConfig(trace=str(trace), workers=1, mode="rr"))["block_hit_rate"] == 0.6
