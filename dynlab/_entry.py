"""The ``dynlab`` console script's entry point: Ctrl-C at any moment exits 130, even while starting.

Importing the command line (click, pluggy, every command and the simulator behind them) takes a
noticeable time on a busy machine. This module is the script's first import and is tiny (``sys``
and ``signal`` only; ``import dynlab`` imports nothing either), so a Ctrl-C that lands while the
rest is still being imported ends the run as one during a command does: ``Aborted!`` on stderr,
exit status 130 (128 + SIGINT, what shells report for an interrupted command), no traceback.

Only a Ctrl-C before Python itself has set up its signal handling (the interpreter's first
milliseconds, before any code of dynlab runs) still ends the process by the signal itself, which
shells report as 130 too.

Start-up: importing click and the command line makes ~20,000 long-lived objects (modules, classes,
functions) and no garbage; the cyclic collector's passes over them were ~9 % of a 2-request run's
instructions (docs/performance.md). So the script (here, not ``import dynlab.cli``, which must leave an
importer's collector and pending garbage alone) pauses the collector while they are imported, and while a
command's module is (:data:`dynlab.cli.lazy.FREEZE_IMPORTS`), freezes what they made (``gc.freeze``: never
traversed again) and turns it back on before any command runs.
"""
import gc
import signal
import sys


def command_line():
    """The ``dynlab`` click group (:data:`dynlab.cli.main`), imported with the collector paused and what
    the imports made frozen, and set to import a command's module the same way."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        from dynlab.cli import lazy, main as cli

        lazy.FREEZE_IMPORTS = True
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
    return cli


def main(prog_name=None):
    """Run the ``dynlab`` click group (:data:`dynlab.cli.main`) as ``prog_name`` (click's default: the
    script's name); ``KeyboardInterrupt`` -> exit 130. The console script and ``python -m dynlab`` both."""
    try:
        cli = command_line()
        return cli(prog_name=prog_name)
    except KeyboardInterrupt:
        # Raised before the click group's own handler was entered (during the imports above).
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the exit
        try:
            sys.stderr.write("\nAborted!\n")  # as click ends an interrupted command
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        sys.exit(130)
