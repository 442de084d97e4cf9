"""A separate distribution (tests/plugin_dist) adds a strategy through the `dynlab` entry-point group.

The module installs it once into this interpreter with pip, checks the CLI in
subprocesses (the plugin manager is built once per process), and uninstalls it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HANG, dynlab_command

DIST_DIR = Path(__file__).parent / "plugin_dist"
DIST_NAME = "dynlab-example-plugin"
STRATEGY = "last-worker"
DESCRIPTION = "Always the highest-numbered worker (an example third-party strategy)."
SEED_KEYS = ["mode", "workers", "requests", "repeat_requests", "hits", "hit_rate"]


def _pip(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
                          capture_output=True, text=True, timeout=HANG,
                          env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    if proc.returncode != 0:
        pytest.fail(f"pip {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def dynlab(*args) -> subprocess.CompletedProcess:
    return subprocess.run(dynlab_command() + [str(a) for a in args], capture_output=True, text=True,
                          timeout=HANG)


def run_tests_on(test_file: str, name: str) -> str:
    """``pytest -q TEST_FILE -k NAME`` in a fresh process (the registry-parametrised tests then collect the
    plugin's class); its stdout. Exit 5 would mean no test matched: the class was not collected."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(Path(__file__).parent / test_file), "-k", name],
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "passed" in proc.stdout
    return proc.stdout


def assert_listed(kind: str, name: str, dist: str) -> None:
    """``dynlab plugins`` lists ``name`` under ``kind`` (one or two words) from distribution ``dist``."""
    proc = dynlab("plugins")
    assert proc.returncode == 0, proc.stderr
    row = [*kind.split(), name, dist]
    assert any(line.split()[:len(row)] == row for line in proc.stdout.splitlines()), proc.stdout


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    """Install the example distribution (from a copy, so the source tree stays clean); uninstall afterwards."""
    src = tmp_path_factory.mktemp("plugin_dist") / "dynlab-example-plugin"
    shutil.copytree(DIST_DIR, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist"))
    _pip("install", "--no-deps", "--no-build-isolation", "--no-index", "--force-reinstall", str(src))
    try:
        yield DIST_NAME
    finally:
        _pip("uninstall", "-y", DIST_NAME)


def test_the_distribution_declares_the_entry_point(installed_plugin):
    code = ("import importlib.metadata as m, json; d = m.distribution(%r); "
            "print(json.dumps([[e.group, e.name, e.value] for e in d.entry_points]))" % installed_plugin)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    assert ["dynlab", "example_strategies", "dynlab_example_plugin.strategies"] in json.loads(proc.stdout)


def test_strategies_lists_it_with_its_distribution(installed_plugin):
    proc = dynlab("strategies")
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert {"rr", "random", "kv", "kv-events", STRATEGY} <= set(lines)
    line = lines[STRATEGY]
    assert DESCRIPTION in line
    assert installed_plugin in line
    assert installed_plugin not in lines["rr"]


def test_sim_runs_it(installed_plugin):
    """Every request goes to the last worker, so every repeat is a hit."""
    proc = dynlab("sim", "--mode", STRATEGY)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert list(out) == SEED_KEYS
    assert out == {"mode": STRATEGY, "workers": 2, "requests": 72, "repeat_requests": 60, "hits": 60,
                   "hit_rate": 1.0}


def test_sim_really_uses_its_route(installed_plugin):
    """3 workers, 4 prefixes x 5 reps: all 20 requests land on worker 2 (no built-in does that)."""
    proc = dynlab("sim", "--mode", STRATEGY, "--workers", 3, "--prefixes", 4, "--reps", 5, "--all-metrics")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["requests"], out["repeat_requests"], out["hits"], out["hit_rate"]) == (20, 16, 16, 1.0)
    assert out["requests_per_worker"] == [0, 0, 20]


def test_compare_takes_it_like_a_builtin(installed_plugin):
    proc = dynlab("compare", "--modes", f"rr,{STRATEGY}")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert list(out) == ["rr", STRATEGY]
    assert out[STRATEGY]["hits"] == 60 and out["rr"]["hits"] == 49


def test_unknown_mode_error_lists_it(installed_plugin):
    proc = dynlab("sim", "--mode", "no-such-strategy")
    assert proc.returncode == 2
    assert STRATEGY in proc.stderr and "Traceback" not in proc.stderr


def test_registry_parametrised_tests_cover_it(installed_plugin):
    """tests/test_strategies.py parametrises over the registry, so a fresh run covers the new strategy."""
    run_tests_on("test_strategies.py", STRATEGY)


# ------------------------------------------------------------------------------- a third-party scorer
SCORER = "highest-index"


def test_plugins_lists_its_scorer(installed_plugin):
    assert_listed("scorer", SCORER, installed_plugin)


def test_weighted_uses_its_scorer(installed_plugin):
    """highest-index scores worker w as w: every request goes to the last worker."""
    proc = dynlab("sim", "--mode", "weighted", "--workers", 3, "--opt", f"scorers={SCORER}:1", "--all-metrics")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["requests_per_worker"] == [0, 0, 72]


def test_registry_wide_scorer_tests_cover_it(installed_plugin):
    run_tests_on("test_scorers.py", SCORER)


# -------------------------------------------------------------------------- a third-party queue policy
QUEUE_POLICY = "shortest-prompt"


def test_plugins_lists_its_queue_policy(installed_plugin):
    assert_listed("queue policy", QUEUE_POLICY, installed_plugin)


def test_sim_orders_the_waiting_queue_with_it(installed_plugin, tmp_path):
    """--max-num-seqs 1, linear 10 ms + 1 ms per prefill token + 2 ms per decode, every overhead term off:
    R0 (16 tokens + 1) runs 0-26; R1 (40 tokens) and R2 (8 tokens) wait. fcfs serves R1 (26-76) then R2
    (76-94); shortest-prompt serves R2 first (26-44), then R1 (44-94)."""
    from helpers import terms_off_args

    path = tmp_path / "t.jsonl"
    rows = [(0, 16), (1, 40), (2, 8)]
    path.write_text("".join(json.dumps({"timestamp": t, "tokens": list(range(100 * i, 100 * i + n)),
                                        "output_length": 1}) + "\n" for i, (t, n) in enumerate(rows)))
    starts = {}
    for policy in ("fcfs", QUEUE_POLICY):
        out = tmp_path / f"{policy}.jsonl"
        proc = dynlab("sim", "--timing", "--workers", 1, "--trace", path, "--trace-format", "tokens",
                      "--max-num-seqs", 1, "--queue-policy", policy, "--latency-model", "linear",
                      "--latency-opt", "beta0=10", "--latency-opt", "beta1=1", "--latency-opt", "beta2=2",
                      *terms_off_args("linear"), "--requests-out", out, "--quiet")
        assert proc.returncode == 0, proc.stderr
        starts[policy] = [json.loads(line)["first_scheduled_ms"] for line in out.read_text().splitlines()]
    assert starts == {"fcfs": [0.0, 26.0, 76.0], QUEUE_POLICY: [0.0, 44.0, 26.0]}


def test_registry_wide_queue_policy_tests_cover_it(installed_plugin):
    assert "2 passed" in run_tests_on("engine/test_queue_policies.py", QUEUE_POLICY)


# ---------------------------------------------------------------------- a third-party admission policy
ADMISSION_POLICY = "short-only"


def test_plugins_lists_its_admission_policy(installed_plugin):
    assert_listed("admission policy", ADMISSION_POLICY, installed_plugin)


def test_sim_sheds_with_it(installed_plugin, tmp_path):
    """Prompts of 8, 40 and 16 tokens behind short-only:max_tokens=16: the 40-token one is shed."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "tokens": list(range(100 * i, 100 * i + n)),
                                        "output_length": 2}) + "\n" for i, n in enumerate((8, 40, 16))))
    out = tmp_path / "r.jsonl"
    proc = dynlab("sim", "--timing", "--workers", 1, "--trace", path, "--trace-format", "tokens",
                  "--admission-policy", f"{ADMISSION_POLICY}:max_tokens=16", "--requests-out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["shed"] == 1
    assert [json.loads(line).get("shed", False) for line in out.read_text().splitlines()] == [False, True, False]
    bad = dynlab("sim", "--timing", "--admission-policy", f"{ADMISSION_POLICY}:size=3")
    assert bad.returncode == 2 and "unknown option 'size'" in bad.stderr and "Traceback" not in bad.stderr


# --------------------------------------------------------------------------- a third-party engine kind
ENGINE_KIND = "one-at-a-time"


def test_sim_serves_on_its_engine_kind(installed_plugin, tmp_path):
    """Two 16-token requests at 0 on one worker, linear 10 ms + 1 ms per prefill token + 2 ms per decode, every
    overhead term off. vllm batches them: one 32-token prefill, both first tokens at 10 + 32 = 42 ms.
    one-at-a-time (max_num_seqs 1): R0 prefills 0-26 and decodes its 2nd token 26-38; R1 prefills 38-64."""
    from helpers import terms_off_args

    assert_listed("engine kind", ENGINE_KIND, installed_plugin)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 0, "tokens": list(range(100 * i, 100 * i + 16)),
                                        "output_length": 2}) + "\n" for i in range(2)))
    first = {}
    for kind in ("vllm", ENGINE_KIND):
        out = tmp_path / f"{kind}.jsonl"
        proc = dynlab("sim", "--timing", "--workers", 1, "--trace", path, "--trace-format", "tokens",
                      "--engine", kind, "--latency-model", "linear", "--latency-opt", "beta0=10",
                      "--latency-opt", "beta1=1", "--latency-opt", "beta2=2", *terms_off_args("linear"),
                      "--requests-out", out, "--quiet")
        assert proc.returncode == 0, proc.stderr
        first[kind] = [json.loads(line)["first_token_ms"] for line in out.read_text().splitlines()]
        assert json.loads(proc.stdout).get("engine") == (None if kind == "vllm" else kind)
    assert first == {"vllm": [42.0, 42.0], ENGINE_KIND: [26.0, 64.0]}
    bad = dynlab("sim", "--timing", "--engine", ENGINE_KIND, "--async-scheduling")
    assert bad.returncode == 2 and "one-at-a-time: no --async-scheduling" in bad.stderr
    assert "Traceback" not in bad.stderr


# ----------------------------------------------------------------------------- a third-party controller
CONTROLLER = "add-then-retire"


def test_sim_adds_and_retires_workers_with_its_controller(installed_plugin, tmp_path):
    """Two workers, rr, 16-token prompts at 0, 5, 12, 15, 25 and 30 s (each done in well under a second).
    add-then-retire (defaults: called every second) adds worker 2 at 10 s (ready at once) and retires worker 0
    (drain) at 20 s, where it is idle: it leaves at once. rr's i-th request goes to routable[i % len]:
    [0, 1] -> 0, 1; [0, 1, 2] -> i=2: 2, i=3: 0; [1, 2] -> i=4: 1, i=5: 2."""
    assert_listed("controller", CONTROLLER, installed_plugin)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": s * 1000, "tokens": list(range(100 * i, 100 * i + 16)),
                                        "output_length": 2}) + "\n" for i, s in enumerate((0, 5, 12, 15, 25, 30))))
    out = tmp_path / "r.jsonl"
    proc = dynlab("sim", "--timing", "--workers", 2, "--mode", "rr", "--trace", path, "--trace-format", "tokens",
                  "--controller", CONTROLLER, "--requests-out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert [json.loads(line)["worker"] for line in out.read_text().splitlines()] == [0, 1, 2, 0, 1, 2]
    assert result["workers_over_time"] == [[0.0, 2], [10.0, 3], [20.0, 2]]
    assert [(w["joined_s"], w["left_s"], w["left_by"]) for w in result["worker_lifetimes"]] == \
        [(0.0, 20.0, "drain"), (0.0, None, None), (10.0, None, None)]
    assert result["requests_per_worker"] == [2, 2, 2] and result["controller"] == CONTROLLER
    bad = dynlab("sim", "--timing", "--controller", f"{CONTROLLER}:size=3")
    assert bad.returncode == 2 and "unknown option(s) size" in bad.stderr and "Traceback" not in bad.stderr
