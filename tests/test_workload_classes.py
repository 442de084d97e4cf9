"""A workload spec's mix of classes (issue 42 item 2): ``"classes": [{"class": NAME, "requests": N, ...}]``."""
from __future__ import annotations

import json

import pytest

from dynlab import plugins
from dynlab.traces.workload import SpecError
from helpers import invoke


def rows(spec):
    return list(plugins.workloads().get("synthetic")(spec, "spec.json").rows())


CONST = {"input": {"dist": "constant", "value": 4}, "output": {"dist": "constant", "value": 2}}


def test_a_mix_by_hand():
    """chat: 5 requests/s, one every 200 ms, 4-token prompts, 2-token answers: ids 1-4 (answer 5-6), 7-10
    (11-12); batch: 2 requests/s, one every 500 ms, 8-token prompts (its own input), ids after chat's last
    (13): 13-20 (answer 21-22), 23-30. Merged in time order; a tie goes to the earlier class."""
    spec = {**CONST, "classes": [
        {"class": "chat", "requests": 2, "priority": 0, "tenant": "acme", "arrival": {"process": "constant", "rate": 5}},
        {"class": "batch", "requests": 2, "priority": 2, "arrival": {"process": "constant", "rate": 2},
         "input": {"dist": "constant", "value": 8}}]}
    chat = {"class": "chat", "priority": 0, "tenant": "acme"}
    batch = {"class": "batch", "priority": 2}
    assert rows(spec) == [
        {"timestamp": 200.0, "tokens": [1, 2, 3, 4], "output_length": 2, **chat},
        {"timestamp": 400.0, "tokens": [7, 8, 9, 10], "output_length": 2, **chat},
        {"timestamp": 500.0, "tokens": list(range(13, 21)), "output_length": 2, **batch},
        {"timestamp": 1000.0, "tokens": list(range(23, 31)), "output_length": 2, **batch}]


def test_a_tie_keeps_the_class_order():
    spec = {**CONST, "classes": [
        {"class": "b", "requests": 1, "arrival": {"process": "constant", "rate": 5}},
        {"class": "a", "requests": 1, "arrival": {"process": "constant", "rate": 5}}]}
    assert [r["class"] for r in rows(spec)] == ["b", "a"]


def test_each_class_draws_from_its_own_rngs_and_the_rows_repeat():
    """A class's draws depend on the seed and its name only: adding a class leaves the others' lengths and
    times as they were (their token ids move after the new class's)."""
    base = {"seed": 4, "input": {"dist": "uniform", "min": 5, "max": 50}, "output": {"dist": "uniform", "min": 1, "max": 9},
            "arrival": {"process": "poisson", "rate": 3}}
    one = {**base, "classes": [{"class": "chat", "requests": 20}]}
    two = {**base, "classes": [{"class": "bulk", "requests": 7}, {"class": "chat", "requests": 20}]}
    assert rows(one) == rows(one)
    chat_alone = [(r["timestamp"], len(r["tokens"]), r["output_length"]) for r in rows(one)]
    chat_mixed = [(r["timestamp"], len(r["tokens"]), r["output_length"]) for r in rows(two) if r["class"] == "chat"]
    assert chat_alone == chat_mixed
    ids = [set(r["tokens"]) for r in rows(two)]
    bulk = set().union(*(s for s, r in zip(ids, rows(two)) if r["class"] == "bulk"))
    chat = set().union(*(s for s, r in zip(ids, rows(two)) if r["class"] == "chat"))
    assert not bulk & chat  # no prefix shared across classes by accident


def test_the_classes_reach_the_run(tmp_path):
    spec = {"seed": 1, **CONST, "arrival": {"process": "poisson", "rate": 20},
            "classes": [{"class": "chat", "requests": 6, "tenant": "t1"}, {"class": "batch", "requests": 3}]}
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(spec))
    res = invoke("sim", "--timing", "--workload", str(path), "--slo", "chat:ttft_ms=1000", "--quiet")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert {k: v["requests"] for k, v in out["by_class"].items()} == {"chat": 6, "batch": 3}
    assert {k: v["requests"] for k, v in out["by_tenant"].items()} == {"t1": 6, "default": 3}


@pytest.mark.parametrize("change, key, words", [
    ({"classes": []}, "classes", "must be a list of classes"),
    ({"requests": 5, "classes": [{"class": "a", "requests": 1}]}, "requests", "gives requests per class"),
    ({"classes": [{"class": "a", "requests": 1}, {"class": "a", "requests": 1}]}, "classes[1].class",
     "class 'a' is given twice"),
    ({"classes": [{"requests": 1}]}, "classes[0].class", "must be a name"),
    ({"classes": [{"class": "a"}]}, "classes[0].requests", ""),
    ({"classes": [{"class": "a", "requests": 1, "priority": "high"}]}, "classes[0].priority", "must be an integer"),
    ({"classes": [{"class": "a", "requests": 1, "rate": 3}]}, "classes[0].rate", "unknown key"),
    ({"classes": [{"class": "a", "requests": 1, "arrival": {"process": "closed", "concurrency": 2}}]}, "classes[0]",
     "arrives open loop"),
    ({"classes": [{"class": "a", "requests": 1, "input": {"dist": "nope"}}]}, "classes[0].input.dist", ""),
])
def test_a_bad_mix_names_its_key(change, key, words):
    spec = {**CONST, "arrival": {"process": "poisson", "rate": 1}, **change}
    with pytest.raises(SpecError) as err:
        rows(spec)
    assert err.value.key == key and words in err.value.message
