"""The seed lab's document scenario and capacity cliffs (shared/seeds/002 steps 2-7), library and CLI."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dynlab.cli import main
from helpers import HANG
from dynlab.labs.scenario import access_sequence, cliff, pass_docs, run_scenario
from dynlab.plugins import UnknownNameError, eviction_policies

NO_HITS_FWD = {"order": "fwd", "gpu_hits": 0, "cpu_hits": 0, "misses": 10, "hit_docs": []}

CYCLIC = {"passes": [NO_HITS_FWD, NO_HITS_FWD]}
BASELINE = {
    "passes": [
        NO_HITS_FWD,
        NO_HITS_FWD,
        {"order": "rev", "gpu_hits": 4, "cpu_hits": 0, "misses": 6, "hit_docs": [9, 8, 7, 6]},
    ]
}
OFFLOAD = {
    "passes": [
        NO_HITS_FWD,
        {"order": "fwd", "gpu_hits": 0, "cpu_hits": 10, "misses": 0, "hit_docs": list(range(10))},
        {"order": "rev", "gpu_hits": 4, "cpu_hits": 6, "misses": 0, "hit_docs": list(range(9, -1, -1))},
    ]
}
CLIFF = {"21520": 0, "30000": 0, "40000": 0, "45000": 0, "50109": 0, "50110": 10}
CPU_CLIFF = {"0": 10, "20000": 10, "30000": 10, "40000": 10, "50109": 10, "50110": 0, "56000": 0}


def run_cli(*args):
    result = CliRunner().invoke(main, list(args))
    return result


def cli_json(*args):
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("\n") and result.stdout.count("\n") == 1  # one object, nothing else
    obj = json.loads(result.stdout)
    assert result.stdout == json.dumps(obj) + "\n"  # default separators
    return obj


# ---- library -------------------------------------------------------------------------------


def test_seed_steps_2_3_6_library():
    assert run_scenario(passes=["fwd", "fwd"]) == CYCLIC
    assert run_scenario() == BASELINE
    assert run_scenario(gpu=21520, cpu=56000) == OFFLOAD


def test_seed_steps_4_7_library():
    assert cliff([21520, 30000, 40000, 45000, 50109, 50110], passes=["fwd", "fwd"]) == CLIFF
    got = cliff([0, 20000, 30000, 40000, 50109, 50110, 56000], over="cpu", metric="misses", gpu=21520, passes=["fwd", "fwd"])
    assert got == CPU_CLIFF
    assert list(got) == list(CPU_CLIFF)  # keys in the order given


def test_opt_hits_where_lru_hits_nothing():
    second = run_scenario(gpu=21520, passes=["fwd", "fwd"], policy="opt")["passes"][1]
    assert second == {"order": "fwd", "gpu_hits": 4, "cpu_hits": 0, "misses": 6, "hit_docs": [0, 1, 2, 9]}
    assert run_scenario(gpu=21520, passes=["fwd", "fwd"], policy="lru")["passes"][1]["gpu_hits"] == 0


def test_pass_orders_and_errors():
    assert pass_docs("fwd", 3) == [0, 1, 2] and pass_docs("rev", 3) == [2, 1, 0]
    assert access_sequence(2, ["fwd", "rev"]) == [0, 1, 1, 0]
    with pytest.raises(ValueError, match="unknown pass order"):
        run_scenario(passes=["fwd", "sideways"])
    with pytest.raises(ValueError):
        run_scenario(gpu=-1)
    with pytest.raises(TypeError):
        run_scenario(docs=2.5)
    with pytest.raises(ValueError, match="tokens must be >= 1, got 0"):
        run_scenario(tokens=0)
    with pytest.raises(ValueError, match="docs must be >= 1, got 0"):
        run_scenario(docs=0)
    # a GPU tier with no room is allowed: 2 documents read twice forward, nothing cached, 2 misses each pass
    assert [p["misses"] for p in run_scenario(gpu=0, docs=2, tokens=1, passes=["fwd", "fwd"])["passes"]] == [2, 2]
    with pytest.raises(UnknownNameError, match="available: .*lru"):
        run_scenario(policy="nope")
    with pytest.raises(ValueError):
        cliff([1, 2], metric="speed")
    with pytest.raises(ValueError):
        cliff([1, 2], passes=[])


@given(
    gpu=st.integers(0, 60),
    cpu=st.integers(0, 60),
    docs=st.integers(1, 8),
    tokens=st.integers(1, 12),
    passes=st.lists(st.sampled_from(["fwd", "rev"]), min_size=1, max_size=4),
    policy=st.sampled_from(eviction_policies().names()),
)
def test_scenario_counts_add_up(gpu, cpu, docs, tokens, passes, policy):
    result = run_scenario(gpu=gpu, docs=docs, tokens=tokens, passes=passes, cpu=cpu, policy=policy)
    assert [p["order"] for p in result["passes"]] == passes
    for p, order in zip(result["passes"], passes):
        assert p["gpu_hits"] + p["cpu_hits"] + p["misses"] == docs
        assert len(p["hit_docs"]) == p["gpu_hits"] + p["cpu_hits"]
        reading = pass_docs(order, docs)
        assert p["hit_docs"] == [d for d in reading if d in p["hit_docs"]]  # reading order
    if cpu == 0:
        assert all(p["cpu_hits"] == 0 for p in result["passes"])
    if docs * tokens <= gpu:  # everything fits: only the first read of each document misses
        assert sum(p["misses"] for p in result["passes"]) == docs


# ---- CLI -----------------------------------------------------------------------------------


def test_cli_scenario_seed_outputs():
    assert cli_json("scenario", "--passes", "fwd,fwd") == CYCLIC
    assert cli_json("scenario") == BASELINE
    assert cli_json("scenario", "--passes", "fwd,fwd,rev") == BASELINE
    assert cli_json("scenario", "--gpu", "21520", "--cpu", "56000") == OFFLOAD
    assert cli_json("scenario", "--gpu", "21520", "--cpu", "56000", "--passes", "fwd,fwd,rev") == OFFLOAD
    assert cli_json("scenario", "--cpu", "0") == BASELINE  # --cpu 0 is the single-tier result


def test_cli_cliff_seed_outputs():
    got = run_cli("cliff", "--gpu", "21520,30000,40000,45000,50109,50110", "--passes", "fwd,fwd")
    assert got.exit_code == 0
    assert got.stdout == '{"21520": 0, "30000": 0, "40000": 0, "45000": 0, "50109": 0, "50110": 10}\n'
    got = run_cli(
        "cliff", "--gpu", "21520", "--cpu", "0,20000,30000,40000,50109,50110,56000", "--passes", "fwd,fwd",
        "--metric", "misses",
    )
    assert got.exit_code == 0
    assert got.stdout == '{"0": 10, "20000": 10, "30000": 10, "40000": 10, "50109": 10, "50110": 0, "56000": 0}\n'


def test_cli_cliff_sweep_choice_and_labels():
    assert cli_json("cliff", "--gpu", "50110", "--passes", "fwd,fwd") == {"50110": 10}
    assert cli_json("cliff", "--cpu", "56000", "--passes", "fwd,fwd", "--metric", "cpu_hits") == {"56000": 10}
    assert cli_json("cliff", "--gpu", "21520", "--cpu", "56000", "--passes", "fwd,fwd") == {"21520": 10}
    assert cli_json("cliff", "--gpu", "050110", "--passes", "fwd,fwd") == {"050110": 10}  # key as written
    opt = cli_json("cliff", "--gpu", "21520,30000,40000,45000", "--passes", "fwd,fwd", "--policy", "opt")
    assert opt == {"21520": 4, "30000": 5, "40000": 7, "45000": 8}


def test_cli_opt_example_from_readme():
    got = cli_json("scenario", "--policy", "opt", "--gpu", "21520", "--passes", "fwd,fwd")
    assert got["passes"][1]["hit_docs"] == [0, 1, 2, 9]


def test_cli_policies_lists_builtins():
    result = run_cli("policies")
    assert result.exit_code == 0
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert {"lru", "fifo", "lfu", "opt"} <= set(names)
    listed = cli_json("policies", "--json")["policies"]
    assert {"lru", "fifo", "lfu", "opt"} <= {p["name"] for p in listed}
    assert all(p["description"] and p["source"] for p in listed)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["scenario", "--passes", "fwd,up"], "unknown pass order 'up'"),
        (["scenario", "--passes", "fwd,,rev"], "empty value"),
        (["scenario", "--gpu", "abc"], "'abc' is not a valid integer"),
        (["scenario", "--gpu", "1.5"], "not a valid integer"),
        (["scenario", "--cpu", "-1"], "negative"),
        (["scenario", "--docs", "-3"], "negative"),
        (["scenario", "--tokens", "x"], "not a valid integer"),
        # a document of 0 tokens has no KV, and 0 documents give nothing to read: refused; --gpu 0
        # and --cpu 0 stay (a tier with no room, the seed's "no CPU tier")
        (["scenario", "--tokens", "0"], "'--tokens': 0: a document of 0 tokens has no KV to cache; it must be >= 1"),
        (["scenario", "--docs", "0"], "'--docs': 0: a run of no documents reads nothing; it must be >= 1"),
        (["scenario", "--tokens", "-2"], "-2 is negative; it must be >= 1"),
        (["cliff", "--tokens", "0"], "a document of 0 tokens has no KV"),
        (["cliff", "--docs", "0", "--gpu", "1,2"], "a run of no documents reads nothing"),
        (["scenario", "--policy", "belady"], "available: "),
        (["cliff", "--gpu", "21520,x"], "'x' is not a valid integer"),
        (["cliff", "--cpu", "0,-5"], "negative"),
        (["cliff", "--gpu", "1,2", "--cpu", "3,4"], "one capacity at a time"),
        (["cliff", "--metric", "speed"], "speed"),
        (["cliff", "--passes", "rev,back"], "unknown pass order 'back'"),
        (["cliff", "--policy", "nope"], "available: "),
    ],
)
def test_cli_usage_errors_are_one_line_exit_2(args, fragment):
    result = run_cli(*args)
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert fragment in lines[0]
    assert "Traceback" not in result.output


def test_real_process_prints_one_json_line_and_one_error_line():
    import subprocess
    import sys

    def run(*args):
        code = "import sys; from dynlab._entry import main; sys.argv[0] = 'dynlab'; sys.exit(main())"
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=HANG)

    ok = run("scenario", "--gpu", "21520", "--cpu", "56000")
    assert ok.returncode == 0 and json.loads(ok.stdout) == OFFLOAD and ok.stderr == ""
    bad = run("cliff", "--policy", "nope")
    assert bad.returncode == 2 and bad.stdout == ""
    (line,) = bad.stderr.splitlines()
    assert line.startswith("Error: Invalid value for '--policy': unknown eviction policy 'nope'; available: ")
    assert {"lru", "fifo", "lfu", "opt"} <= set(line.split("available: ")[1].split(", "))
