"""dynlab sweep --executor ray against a real local Ray cluster on the loopback interface.

Marked ``ray`` (select with ``-m ray``). Without Ray these tests fail under CI (``CI`` set: CI
installs ``dynlab[ray]``) and are skipped with the reason elsewhere.

The cluster: ``ray start --head --block`` on 127.0.0.1 and a free port, with its own
temporary directory, stopped at the end by sending SIGTERM to that process's id (it then
stops the processes it started); anything of its process group still alive after that
gets SIGKILL. No other Ray instance on the machine is touched.
"""
from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest


from helpers import dynlab_command, invoke, lines_of, ok

pytestmark = pytest.mark.ray

TRACE = "mooncake-conversation"
GRID = ["--trace", TRACE, "--grid", "mode=rr,kv-cost,power-of-two", "--grid", "capacity=512,unbounded",
        "--grid", "workers=2,3", "--event-loss", "0.2", "--quiet"]


def _require_ray():
    if importlib.util.find_spec("ray") is None:
        message = "Ray is not installed: pip install 'dynlab[ray]'"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + " (CI installs the ray extra; these tests must run there)")
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The test cluster's authentication token: the cluster and the sweeps that connect to it get it
#: from the environment (nothing is read from or written to ~/.ray).
TOKEN = secrets.token_hex(32)


def _ray_env() -> dict:
    # Ray replaces 127.0.0.1 with the host's outbound address unless this is 0; no usage reports.
    return dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0",
                RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)


@pytest.fixture(scope="module")
def ray_cluster():
    _require_ray()
    # Ray's unix sockets live under the temp dir and must fit in ~107 bytes: keep its path short.
    temp_dir = tempfile.mkdtemp(prefix="dlray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    log_path = Path(temp_dir) / "ray-start.log"
    port = _free_port()
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
           "--node-ip-address=127.0.0.1", f"--port={port}", f"--temp-dir={temp_dir}",
           "--include-dashboard=false", "--num-cpus=2", "--disable-usage-stats"]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_ray_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 180  # a liveness bound only: start-up takes a few seconds
        while "Ray runtime started" not in log_path.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start did not come up (exit {proc.poll()}):\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(proc)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:  # leftovers of this cluster only: the session (process group) started above
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=30)


def _sweep(*args, env=None, timeout=600):
    proc = subprocess.run(dynlab_command() + ["sweep", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_ray_cluster_sweep_equals_serial(ray_cluster, tmp_path):
    out = tmp_path / "ray.jsonl"
    proc = _sweep(*GRID, "--executor", "ray", "--ray-address", ray_cluster, "--out", str(out),
                  env=dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN))
    assert proc.stdout == ""
    serial = ok(invoke("sweep", *GRID, "--executor", "serial")).stdout
    got = lines_of(out.read_text())
    assert len(got) == 12
    assert sorted(got) == sorted(lines_of(serial))


def test_ray_cluster_resume_runs_only_the_missing_cells(ray_cluster, tmp_path):
    out = tmp_path / "ray.jsonl"
    serial = lines_of(ok(invoke("sweep", *GRID, "--executor", "serial")).stdout)
    out.write_text("\n".join(serial[:5]) + "\n")
    _sweep(*GRID, "--executor", "ray", "--ray-address", ray_cluster, "--out", str(out), "--resume",
           env=dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN))
    got = lines_of(out.read_text())
    assert got[:5] == serial[:5]
    assert sorted(got) == sorted(serial)


def test_ray_local_instance_sweep_equals_serial(tmp_path):
    """Without --ray-address the sweep starts a local instance (loopback only) and shuts it down."""
    _require_ray()
    grid = ["--grid", "mode=random,power-of-two", "--grid", "seed=1,2", "--all-metrics", "--quiet"]
    ray_tmp = tempfile.mkdtemp(prefix="dlray-", dir="/tmp" if os.path.isdir("/tmp") else None)  # short: sockets
    try:
        proc = _sweep(*grid, "--executor", "ray", "--jobs", "2", env=dict(os.environ, RAY_TMPDIR=ray_tmp))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    serial = ok(invoke("sweep", *grid, "--executor", "serial")).stdout
    assert sorted(lines_of(proc.stdout)) == sorted(lines_of(serial))
    assert all(json.loads(x)["result"]["requests"] == 72 for x in lines_of(proc.stdout))
