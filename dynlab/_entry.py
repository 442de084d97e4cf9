"""The ``dynlab`` console script's entry point: Ctrl-C at any moment exits 130, even while starting.

Importing the command line (click, pluggy, every command and the simulator behind them) takes a
noticeable time on a busy machine. This module is the script's first import and is tiny (``sys``
and ``signal`` only; ``import dynlab`` imports nothing either), so a Ctrl-C that lands while the
rest is still being imported ends the run as one during a command does: ``Aborted!`` on stderr,
exit status 130 (128 + SIGINT, what shells report for an interrupted command), no traceback.

Only a Ctrl-C before Python itself has set up its signal handling (the interpreter's first
milliseconds, before any code of dynlab runs) still ends the process by the signal itself, which
shells report as 130 too.
"""
import signal
import sys


def main():
    """Run the ``dynlab`` click group (:data:`dynlab.cli.main`); ``KeyboardInterrupt`` -> exit 130."""
    try:
        from dynlab.cli import main as cli

        return cli()
    except KeyboardInterrupt:
        # Raised before the click group's own handler was entered (during the imports above).
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the exit
        try:
            sys.stderr.write("\nAborted!\n")  # as click ends an interrupted command
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        sys.exit(130)
