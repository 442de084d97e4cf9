"""Helpers shared by the test modules (imported as ``helpers``: pytest puts tests/ on sys.path)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from click.testing import CliRunner

from dynlab.cli import main


def dynlab_command() -> list[str]:
    """How to run the installed ``dynlab`` console script of this interpreter (a fallback without it)."""
    bindir = Path(sys.executable).parent
    for name in ("dynlab", "dynlab.exe"):
        if (bindir / name).exists():
            return [str(bindir / name)]
    return [sys.executable, "-c", "import sys; from dynlab._entry import main; sys.exit(main())"]


#: Seconds a child process may take before a test calls it hung. A bound on liveness only: no test
#: asserts how fast anything runs, and a loaded machine may be many times slower than an idle one.
HANG = 600


def wait_for(ready: Callable[[], bool], proc: subprocess.Popen, what: str, limit: float = HANG) -> None:
    """Poll ``ready()`` until it is true: the readiness sign a test waits for instead of a fixed sleep.

    Fails the test when ``proc`` exits first (saying ``what`` it never showed), or after ``limit``
    seconds (then the process group ``proc`` leads is killed: start it with ``start_new_session=True``).
    """
    import pytest

    deadline = time.monotonic() + limit
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the process exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"no sign of {what} after {limit} s")
        time.sleep(0.01)


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interruptible(cmd: list, **kw) -> subprocess.Popen:
    """Start ``cmd`` in its own session (so ``os.killpg(proc.pid, ...)`` reaches it and only it) with
    SIGINT at its default disposition, as a command typed at a terminal has it.

    A test runner started in the background of a non-interactive shell (``nohup ... &``, some CI
    runners) has SIGINT *ignored*; children inherit that, and Python then never raises
    KeyboardInterrupt, so a test of Ctrl-C would fail for a reason outside dynlab.
    """
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=_sigint_default, **kw)


def stderr_on_a_terminal(args: list) -> bytes:
    """What ``dynlab ARGS`` writes to stderr when stderr is a terminal (a pty of 24 x 80: tqdm draws no
    bar at 0 columns); stdout is a pipe. Asserts the command exits 0."""
    import fcntl
    import pty
    import struct
    import termios

    main_fd, tty = pty.openpty()
    fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        proc = subprocess.run(dynlab_command() + args, stderr=tty, stdout=subprocess.PIPE, timeout=HANG)
        os.close(tty)
        tty = None
        chunks = []
        while True:
            try:
                data = os.read(main_fd, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not data:
                break
            chunks.append(data)
    finally:
        if tty is not None:
            os.close(tty)
        os.close(main_fd)
    assert proc.returncode == 0
    return b"".join(chunks)


def invoke(*args):
    """Run the CLI in-process (click's CliRunner) with every argument as a string."""
    return CliRunner().invoke(main, [str(a) for a in args])


def ok(result):
    """Assert a CliRunner result succeeded and return it."""
    assert result.exit_code == 0, (result.exit_code, result.stderr, result.exception)
    return result


def lines_of(text: str) -> list[str]:
    """The non-blank lines of ``text``."""
    return [line for line in text.splitlines() if line.strip()]


def published(pool) -> set:
    """The names of ``pool`` (a block pool) its KV events publish: its cached set without the blocks of
    generated tokens (names from :data:`dynlab.kv.cache_manager.OUTPUT_NAMES` up, never published)."""
    from dynlab.kv.cache_manager import OUTPUT_NAMES
    return {name for name in pool.cached() if name < OUTPUT_NAMES}


# ---- the overhead terms off (dynlab.latency.overheads), for hand cases that price steps by their own model ----

#: the latency-model options of the server terms, off, per model that declares them (roofline: all three)
from dynlab.latency.overheads import SERVER_TERMS_OFF
#: the run's request-level terms off, as SimConfig fields
CLIENT_TERMS_OFF = {"request_overhead_ms": 0.0, "detok_us_per_token": 0.0}


def terms_off_args(latency_model: str = "roofline") -> list[str]:
    """Command-line arguments switching every overhead term of a timed run off (``latency_model``'s server
    terms and the run's front end and detokenisation): a hand case's figures are its step model's alone."""
    args = ["--request-overhead-ms", "0", "--detok-us-per-token", "0"]
    for name, value in SERVER_TERMS_OFF.get(latency_model, {}).items():
        args += ["--latency-opt", f"{name}={value}"]
    return args


def terms_off(latency_model: str = "roofline", latency_opts=None) -> dict:
    """SimConfig keyword arguments switching every overhead term off: ``latency_opts`` (a hand model's options,
    kept) with the server terms off, and the client terms off."""
    return {"latency_opts": {**SERVER_TERMS_OFF.get(latency_model, {}), **dict(latency_opts or {})},
            **CLIENT_TERMS_OFF}



# ---- P/D hand cases (tests/sim/test_pd_elastic.py, test_pd_prefill_elastic.py) ----

#: the flat step model of the P/D hand cases: every step 100 ms, whatever it holds; no overhead terms
PD_FLAT = {"latency_model": "linear", **terms_off("linear", {"beta0": 100, "beta1": 0, "beta2": 0})}


def pd_trace(path, times_s, outs=None) -> str:
    """A tokens trace at ``path``: request i arrives at ``times_s[i]`` s with 16 fresh prompt tokens (no prefix shared)
    and ``outs[i]`` output tokens (5 each by default); returns its path."""
    import json

    outs = outs or [5] * len(times_s)
    path.write_text("".join(json.dumps({"timestamp": round(t * 1000), "output_length": o,
                                        "tokens": list(range(100 * i + 1, 100 * i + 17))}) + "\n"
                            for i, (t, o) in enumerate(zip(times_s, outs))))
    return str(path)


def run_pd(tmp_path, times_s, controller, split="1:2", **kw) -> dict:
    """The result of :func:`pd_trace`'s trace on a ``split`` P/D fleet under ``controller``: least-loaded routing, 256
    blocks a worker, one request in a batch, :data:`PD_FLAT` steps (``kw`` overrides any of them)."""
    from dynlab.engine.config import SimConfig
    from dynlab.sim import run

    config = SimConfig(trace=pd_trace(tmp_path / "t.jsonl", times_s), trace_format="tokens", timing=True,
                       controller=controller, **{"mode": "least-loaded", "capacity": 256, "split": split,
                                                  "max_num_seqs": 1, **PD_FLAT, **kw})
    return run(config)

# ---- library-level timed runs on hand-built engines (the CLI's only entry is the run layer, dynlab.sim) ----

def replay_timed(requests, strategy, engines, *, names_of, env=None, runs_of=None, kv_bytes_per_block=None) -> dict:
    """Serve ``requests`` on ``engines`` (one aggregated pool) in time; the routing and serving metrics of
    :func:`~dynlab.engine.metrics.fleet_result`. ``env``: default :meth:`RunEnv.timed` with Poisson arrivals from
    ``random.Random(0)``; ``kv_bytes_per_block``: given, a :class:`TierRecorder` joins (the tier keys)."""
    import random

    from dynlab.engine.env import RunEnv
    from dynlab.engine.metrics import fleet_result
    from dynlab.engine.tier_metrics import TierRecorder
    from dynlab.engine.timed import TimedFleet

    if env is None:
        env = RunEnv.timed(requests, strategy, len(engines), arrival_rng=random.Random(0))
    if kv_bytes_per_block is not None:
        env.recorders.append(TierRecorder(kv_bytes_per_block))
    fleet = TimedFleet(strategy, engines, env, names_of, runs_of)
    fleet.run()
    return fleet_result(env.routing, env.counts(fleet.evicted_blocks), strategy, env.recorders, engines)


def serve_disagg(requests, strategy, prefill, decode, *, names_of, env=None, **kw):
    """Serve ``requests`` on a P/D fleet in time; the :class:`~dynlab.disagg.fleet.DisaggFleet` after the last
    finish. ``env`` as :func:`replay_timed`'s (sized to the prefill pool); ``kw``: DisaggFleet's keywords."""
    import random

    from dynlab.disagg.fleet import DisaggFleet
    from dynlab.engine.env import RunEnv

    if env is None:
        env = RunEnv.timed(requests, strategy, len(prefill), arrival_rng=random.Random(0))
    fleet = DisaggFleet(strategy, prefill, decode, env, names_of, **kw)
    fleet.run()
    return fleet


def pd_result(fleet) -> dict:
    """:func:`~dynlab.engine.metrics.fleet_result` of a P/D fleet after its run (what ``dynlab sim`` reports)."""
    from dynlab.engine.metrics import fleet_result

    env = fleet.env
    return fleet_result(env.routing, env.counts(fleet.evicted_blocks), fleet.prefill_fleet.strategy, env.recorders,
                        fleet.all_engines)
