"""A sweep ends the processes it started: on SIGTERM, SIGHUP and SIGINT sent to it alone (what ``timeout``
and CI runners send), and when it stops early for any reason, no pool worker is left running.

Processes are found through /proc (psutil is not a dependency): every process of the session the test
started the sweep in. Each test waits for a readiness sign (the first finished cell in --out), never
for a fixed time.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from dynlab import sweep as lib
from dynlab.engine.config import SimConfig
from helpers import HANG, dynlab_command, interruptible, wait_for

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")

TRACE = "mooncake-conversation"
# 64 cells: far more than can finish between the first line and the signal
GRID = ["--trace", TRACE, "--grid", "mode=rr,kv,kv-events,random", "--grid", "workers=2,3,4,5",
        "--grid", "capacity=256,512,1024,2048"]


def _stat(pid: str):
    """(parent pid, session id, state) of a live process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), int(fields[3]), fields[0]


def alive_in_session(sid: int) -> list[int]:
    """The pids of the processes of session ``sid`` that still run (a zombie has ended: not counted)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        st = _stat(pid)
        if st is not None and st[1] == sid and st[2] not in ("Z", "X"):
            out.append(int(pid))
    return out


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        st = _stat(p)
        if st is not None and st[0] == pid and st[2] not in ("Z", "X"):
            out.append(int(p))
    return out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_a_pool_sweep_ends_it_and_every_pool_worker(tmp_path, signum):
    out = tmp_path / "r.jsonl"
    cmd = dynlab_command() + ["sweep", *GRID, "--executor", "local", "--jobs", "2", "--out", str(out), "--quiet"]
    err_file = tmp_path / "stderr"
    # files, not pipes: a pool worker left behind would hold a pipe open and make the test hang
    with open(err_file, "wb") as err_fh:
        proc = interruptible(cmd, stdout=subprocess.DEVNULL, stderr=err_fh)
    try:
        wait_for(lambda: out.exists() and b"\n" in out.read_bytes(), proc, "the first finished cell")
        assert len(alive_in_session(proc.pid)) >= 2  # the sweep and its pool are running
        os.kill(proc.pid, signum)  # the sweep alone, as `timeout` sends it: not its process group
        try:
            proc.wait(timeout=HANG)  # a hang, not a speed
        except subprocess.TimeoutExpired:
            pytest.fail(f"the sweep hung after {signum.name}")
        left = alive_in_session(proc.pid)
        err = err_file.read_bytes()
    finally:
        if alive_in_session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert left == [], f"processes left after {signum.name}: {left}"
    finished = out.read_bytes().count(b"\n")
    expected = 130 if signum == signal.SIGINT else 128 + signum
    assert proc.returncode == (0 if finished == 64 else expected), (proc.returncode, finished, err)
    assert b"Traceback" not in err
    if finished < 64:
        word = b"Aborted!" if signum == signal.SIGINT else f"Terminated ({signum.name})".encode()
        assert err.strip() == word


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (children, their children...), whatever their session."""
    parents: dict[int, list[int]] = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        st = _stat(p)
        if st is not None and st[2] not in ("Z", "X"):
            parents.setdefault(st[0], []).append(int(p))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


@pytest.mark.ray
def test_sigterm_to_a_ray_sweep_ends_it_and_its_local_ray_instance(tmp_path):
    """Ray's driver installs its own SIGTERM handler (a logged stack, death by the signal): the sweep
    puts its own back, so SIGTERM ends it with one line and exit 143 after ray.shutdown()."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        message = "Ray is not installed: pip install 'dynlab[ray]'"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    out = tmp_path / "r.jsonl"
    err_file = tmp_path / "stderr"
    cmd = dynlab_command() + ["sweep", *GRID, "--executor", "ray", "--jobs", "1", "--out", str(out), "--quiet"]
    with open(err_file, "wb") as err_fh:
        proc = interruptible(cmd, stdout=subprocess.DEVNULL, stderr=err_fh)
    started: list[int] = []
    try:
        wait_for(lambda: out.exists() and b"\n" in out.read_bytes(), proc, "the first finished cell")
        started = descendants(proc.pid)  # Ray's GCS, raylet, agents and workers
        assert started
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            pytest.fail("the Ray sweep hung after SIGTERM")
        wait_for(lambda: not set(started) & set(_alive(started)), _Done(proc.pid),
                 "Ray's processes ending")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in _alive(started):
            os.kill(pid, signal.SIGKILL)
    err = err_file.read_bytes()
    finished = out.read_bytes().count(b"\n")
    assert proc.returncode == (0 if finished == 64 else 143), (proc.returncode, err)
    if finished < 64:
        assert err.strip() == b"Terminated (SIGTERM)", err


class _Done:
    """A stand-in for an exited process in :func:`wait_for`, which polls it (and on a timeout kills
    the process group ``pid`` led)."""

    returncode = 0

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self):
        return None

    def wait(self):
        return 0


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if _stat(str(p)) is not None and _stat(str(p))[2] not in ("Z", "X")]


def test_closing_a_run_before_reading_it_stops_the_pool():
    """execute() starts the pool before it returns; closing the result without iterating it (an output
    that fails to open, an error between start and first result) must stop the workers at once."""
    configs = [SimConfig(trace=TRACE, workers=w) for w in (2, 3, 4, 5)]
    before = set(children_of(os.getpid()))  # another test's processes (a Ray instance) are not the pool's
    running = lib.execute(configs, "local", jobs=2)
    try:
        assert set(children_of(os.getpid())) - before  # the pool's workers
    finally:
        running.close()
    assert set(children_of(os.getpid())) - before == set()
    running.close()  # idempotent


def test_closing_a_run_early_leaves_no_pool_thread():
    """Closing an unfinished run waits for the pool's manager thread too: left running, it closed the
    pool's pipes while the exit's wake-up (concurrent.futures' _python_exit) wrote to one, and a sweep ended
    by a signal printed "Exception ignored in: <module 'threading'> ... Bad file descriptor" (flaky)."""
    import threading
    from concurrent.futures.process import _ExecutorManagerThread

    configs = [SimConfig(trace=TRACE, workers=w) for w in (2, 3, 4, 5)]
    with lib.execute(configs, "local", jobs=2) as running:
        next(iter(running))
    assert [t for t in threading.enumerate() if isinstance(t, _ExecutorManagerThread) and t.is_alive()] == []


def test_a_finished_run_leaves_no_pool_worker(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]}\n')
    configs = [SimConfig(trace=str(bad), workers=w) for w in (2, 3)]
    before = set(children_of(os.getpid()))
    running = lib.execute(configs, "local", jobs=2)
    with running:
        results = list(running)
    assert len(results) == 2
    assert set(children_of(os.getpid())) - before == set()


def test_pool_workers_leave_stop_signals_to_the_parent():
    """The initializer the pool workers run: SIGINT and SIGHUP ignored, SIGTERM at its default (so
    terminate() ends them even though they inherit the parent's Python handlers)."""
    code = ("import signal; from dynlab.sweep.executors import _pool_worker_signals as f; f(); "
            "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, signal.getsignal(signal.SIGHUP) is signal.SIG_IGN, "
            "signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG, check=True)
    assert out.stdout.split() == ["True", "True", "True"]
