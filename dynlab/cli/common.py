"""Helpers shared by the CLI commands: JSON output, comma lists, atomic writes, error display."""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import tempfile
import warnings

import click

from dynlab.atomic import replace_file
from dynlab.errors import DynlabError, InputFileError


def echo_json(obj, err: bool = False) -> None:
    """Print one JSON object on one line (``json.dumps`` default separators); on stderr when ``err``.

    Raises :class:`click.UsageError` (exit 2) naming the first key whose value is ``NaN`` or an
    infinity rather than print it (not JSON): only inputs out of all proportion give one, and the
    commands refuse those they can foresee with a message naming the option.
    """
    click.echo(json_text(obj), err=err)


def json_text(obj) -> str:
    """``obj`` as one line of JSON; raises :class:`click.UsageError` as :func:`echo_json` does."""
    try:
        return json.dumps(obj, allow_nan=False)
    except ValueError:
        where = _non_finite_key(obj)
        raise click.UsageError(f"the result{' ' + repr(where) if where else ''} is not a finite number "
                               "(NaN or infinity): an input is too large or too small") from None


def output_format(fmt):
    """The ``--format`` to print in: ``fmt`` when given (``"table"``/``"json"``), else a table on a terminal
    and JSON when stdout is a pipe or a file (what a script reads)."""
    return fmt or ("table" if sys.stdout.isatty() else "json")


def echo_table_or_json(obj, fmt, table) -> None:
    """Print ``obj`` as ``table(obj)`` (a string) or as :func:`echo_json`, by :func:`output_format`."""
    if output_format(fmt) == "json":
        echo_json(obj)
    else:
        click.echo(table(obj))


def _non_finite_key(obj, path: str = "") -> str:
    """The dotted key path (``"ttft_ms.mean"``, list items as ``[i]``) of the first non-finite float in ``obj``."""
    if isinstance(obj, float):
        return path if not math.isfinite(obj) else ""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        sub = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)
        found = _non_finite_key(value, sub)
        if found:
            return found
    return ""


def split_list(value: str, option: str) -> list[str]:
    """``"a,b,c"`` -> ``["a", "b", "c"]``; an empty item is a usage error naming ``option``."""
    items = [v.strip() for v in value.split(",")]
    if not items or any(v == "" for v in items):
        raise click.BadParameter(f"empty value in the list {value!r}", param_hint=option)
    return items


def refuse_repeats(texts: list[str], values: list, option: str) -> None:
    """A usage error when two items of a list option have the same value (``100,0100``, ``unbounded,none``).

    Every list option calls this, so each refuses a repeat alike: the message names the option and
    both spellings. ``values`` are the converted items, compared with ``==``.
    """
    for j, value in enumerate(values):
        for i in range(j):
            if values[i] == value:
                raise click.BadParameter(f"{texts[j]!r} repeats {texts[i]!r}; list each value once",
                                         param_hint=f"'{option}'")


def output_path(ctx, param, value):
    """click callback: an output file whose directory must exist and be writable (``-`` passes through)."""
    if value is None or value == "-":
        return value
    directory = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(directory):
        raise click.BadParameter(f"{value}: directory {directory} does not exist", ctx, param)
    if os.path.isdir(value):
        raise click.BadParameter(f"{value} is a directory", ctx, param)
    # os.access() says yes to root on a read-only file system: try to create the temporary file an
    # atomic write will need, so an unwritable path fails now, not after a long run.
    target = os.path.realpath(value)
    if not os.path.exists(target) or os.path.isfile(target):
        try:
            fd, probe = tempfile.mkstemp(prefix=".dynlab-probe-", dir=os.path.dirname(target))
        except OSError as exc:
            raise click.BadParameter(f"{value}: cannot write in {os.path.dirname(target)}: "
                                     f"{exc.strerror or exc}", ctx, param) from None
        os.close(fd)
        os.unlink(probe)
    return value


def check_plot(path: str, flag: str = "--plot") -> None:
    """Before any work: a ``flag`` path whose suffix matplotlib cannot write is a usage error (exit 2),
    like an unwritable one (:func:`output_path`); a missing matplotlib stays an error (exit 1)."""
    from dynlab.plots import PlotFormatError, check_plot_path

    try:
        check_plot_path(path)
    except PlotFormatError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{flag}'") from None


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`dynlab.atomic.replace_file`); ``-`` is stdout.

    A failure leaves an existing ``path`` exactly as it was.
    """
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return

    def write(name: str) -> None:
        with open(name, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            if os.path.isfile(name):
                os.fsync(fh.fileno())

    replace_file(path, write)


def progress_bar(total, desc: str, unit: str, quiet: bool = False, unit_scale: bool = False):
    """A tqdm bar on stderr, shown only when stderr is a terminal (never when piped) and not ``quiet``.

    Use as a context manager; a hidden bar takes ``update()`` calls and writes nothing.
    ``unit_scale``: show large counts as 1.2M (for counts in the millions).
    """
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, unit_scale=unit_scale,
                disable=quiet or not sys.stderr.isatty())


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    click.echo(f"Warning: {message}", err=True)


class DynlabGroup(click.Group):
    """A click group whose errors are one line on stderr, never a traceback.

    Usage errors (bad option values, unknown names, an input file that cannot be opened:
    :class:`~dynlab.errors.InputFileError`) print ``Error: ...`` and exit 2; other
    :class:`DynlabError` (bad lines in input files) and OS errors print ``Error: ...`` and exit 1.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        warnings.showwarning = _one_line_warning
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help(), err=True)
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            click.echo(f"Error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except (click.Abort, KeyboardInterrupt, EOFError):
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break the clean-up at exit
            click.echo("Aborted!", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except InputFileError as exc:
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(2)
        except DynlabError as exc:
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(1)
        except OSError as exc:
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            click.echo(f"Error: {where}{exc.strerror or exc}", err=True)
            ctx.exit(1)


def parse_opts(values: tuple[str, ...], flag: str = "--opt") -> dict[str, str]:
    """``("a=1", "b=x")`` -> ``{"a": "1", "b": "x"}``; a malformed or repeated NAME is a usage error."""
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint=flag)
        if name.strip() in out:
            raise click.BadParameter(f"option {name.strip()!r} is given twice", param_hint=flag)
        out[name.strip()] = value.strip()
    return out
