"""Ctrl-C: exit 130 with ``Aborted!`` and no traceback, from the moment dynlab's own code runs.

The console script's first import is :mod:`dynlab._entry`, which imports nothing heavy and catches a
KeyboardInterrupt raised while the command line is still being imported. The tests wait for a
readiness sign (a file the child creates) before signalling, never for a fixed time.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from helpers import HANG, dynlab_command, interruptible, wait_for

# Put on PYTHONPATH, this sitecustomize holds the child at the moment it starts importing dynlab.cli
# (the heavy part of start-up) and says so by creating $DYNLAB_TEST_READY; a SIGINT then lands in the
# middle of the import, deterministically, as a Ctrl-C typed during a slow start-up would.
_HOLD = textwrap.dedent("""
    import os, sys, time

    class _Hold:
        def find_spec(self, name, path=None, target=None):
            if name == "dynlab.cli":
                sys.meta_path.remove(self)
                open(os.environ["DYNLAB_TEST_READY"], "w").close()
                time.sleep(%d)  # interrupted by the test's SIGINT
            return None

    sys.meta_path.insert(0, _Hold())
""" % HANG)


def _held_child(tmp_path, args):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_HOLD)
    ready = tmp_path / "ready"
    env = dict(os.environ, DYNLAB_TEST_READY=str(ready),
               PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = interruptible(dynlab_command() + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    wait_for(ready.exists, proc, "the start of the command line's imports")
    return proc


@pytest.mark.parametrize("args", [["sim", "--quiet"], ["sweep", "--grid", "workers=2,3", "--quiet"], ["--help"]])
def test_ctrl_c_while_the_command_line_is_still_importing_exits_130(tmp_path, args):
    proc = _held_child(tmp_path, args)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.decode().strip() == "Aborted!"
    assert out == b""


def test_the_console_scripts_first_import_is_tiny():
    """``import dynlab._entry`` (what the script imports before any handler of ours exists) imports no
    other dynlab module, nor click or pluggy: the window in which Ctrl-C could print a traceback is
    Python's own start-up only."""
    code = ("import sys, dynlab._entry; "
            "print(sorted(m for m in sys.modules if m.startswith(('dynlab', 'click', 'pluggy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=HANG).stdout
    assert out.strip() == "['dynlab', 'dynlab._entry']"


def test_ctrl_c_during_a_run_exits_130(tmp_path):
    """A long sim (a big synthetic workload), interrupted once its progress shows it is running."""
    ready = tmp_path / "started"
    code = textwrap.dedent(f"""
        import sys
        from dynlab.sim import runner as run_module
        real = run_module.run

        def run(*a, **k):
            open({str(ready)!r}, "w").close()
            return real(*a, **k)

        run_module.run = run
        from dynlab._entry import main
        sys.argv[0] = "dynlab"
        sys.exit(main())
    """)
    proc = interruptible([sys.executable, "-c", code, "sim", "--workers", "64", "--prefixes", "5000", "--reps", "100",
                          "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(ready.exists, proc, "the start of the simulation")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.decode().strip() == "Aborted!" and out == b""


def test_python_m_dynlab_ends_a_ctrl_c_at_start_up_as_the_script_does(monkeypatch, capsys):
    """``python -m dynlab`` goes through the script's entry point: a Ctrl-C while the command line is
    imported prints ``Aborted!`` and exits 130 (it printed a traceback: __main__ called the click group
    itself)."""
    import runpy
    import signal

    import dynlab._entry as entry

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(entry, "command_line", interrupted)
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as exc:
            runpy.run_module("dynlab", run_name="__main__")
    finally:
        signal.signal(signal.SIGINT, handler)
    assert exc.value.code == 130
    assert capsys.readouterr().err == "\nAborted!\n"
