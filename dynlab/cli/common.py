"""Helpers shared by the CLI commands: JSON output, comma lists, atomic writes, error display."""
from __future__ import annotations

import json
import math
import os
import signal
import stat
import sys
import tempfile
import threading
import warnings
from typing import Optional

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


def domain_warning(result, model: Optional[str] = None) -> Optional[str]:
    """The stderr line for a run ``result`` outside its latency model's (or its profile's) domain
    (``latency_domain``), naming the result's latency model (``model`` when the result names none); ``None``
    inside it or for a result that is not a run's dict."""
    if not isinstance(result, dict) or not result.get("latency_domain"):
        return None
    return f"Warning: latency model {result.get('latency_model') or model}: {result['latency_domain']}"


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


def _special_kind(mode: int) -> str:
    return ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")


def _check_output(value: str, ctx, param, stream: bool) -> str:
    hint = "a file, or - for standard output" if stream else "a file"
    if not value.strip():
        raise click.BadParameter(f"an empty path; give {hint}", ctx, param)
    directory = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(directory):
        raise click.BadParameter(f"{value}: directory {directory} does not exist", ctx, param)
    if os.path.isdir(value):
        raise click.BadParameter(f"{value} is a directory", ctx, param)
    target = os.path.realpath(value)
    try:
        mode = os.stat(target).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        # a device (/dev/full, /dev/stdout) or a FIFO cannot be replaced atomically, nor read back or
        # locked (sweep's --out); writing one could block or fail only after the whole run
        raise click.BadParameter(f"{value} is {_special_kind(mode)}, not a regular file; give {hint}", ctx, param)
    # os.access() says yes to root on a read-only file system: try to create the temporary file an
    # atomic write will need, so an unwritable path fails now, not after a long run.
    try:
        fd, probe = tempfile.mkstemp(prefix=".dynlab-probe-", dir=os.path.dirname(target))
    except OSError as exc:
        raise click.BadParameter(f"{value}: cannot write in {os.path.dirname(target)}: "
                                 f"{exc.strerror or exc}", ctx, param) from None
    os.close(fd)
    os.unlink(probe)
    return value


def output_path(ctx, param, value):
    """click callback for an output that must be a file (a plot, a report): its directory must exist
    and be writable; ``-`` is refused (a usage error: this output is not a stream), and so is an
    existing path that is not a regular file (a device such as /dev/full, a FIFO).

    The rule for ``-`` in every command: standard output where the output is a stream of text
    (:func:`stream_output_path`), refused where it is not."""
    if value is None:
        return value
    if value == "-":
        raise click.BadParameter("- (standard output) is not accepted: this output is written as a file; "
                                 "give a file name", ctx, param)
    return _claim(_check_output(value, ctx, param, stream=False), ctx, param)


def _claim(value, ctx, param):
    """``value``, refused when another output option of this command already names the same file (one
    would overwrite the other)."""
    if value is None or value == "-" or not isinstance(value, str):
        return value
    claimed = ctx.meta.setdefault("dynlab_outputs", {})
    key = os.path.realpath(value)
    source = ctx.meta.get("dynlab_inputs", {}).get(key)
    if source is not None:
        raise click.BadParameter(f"{value} is also given to {_flag(ctx, source)}: an output would overwrite "
                                 "the input it reads", ctx, param)
    other = claimed.get(key)
    if other is not None and other != param.name:
        raise click.BadParameter(f"{value} is also given to {_flag(ctx, other)}: give each output its own file",
                                 ctx, param)
    claimed[key] = param.name
    return value


def _flag(ctx, name: str) -> str:
    """The first flag of ``ctx``'s parameter ``name`` (``name`` itself when there is none)."""
    flag = next((o for o in ctx.command.params if o.name == name), None)
    return flag.opts[0] if flag is not None else name


def input_path(ctx, param, value):
    """click callback for an input that may be a file (``--trace``, ``--workload``, ``--spec-acceptance
    file:PATH``): refused when an output option of the command names the same file (the run would overwrite
    what it reads); a bundled name, ``-`` or an acceptance given as rates passes."""
    path = _input_file(param.name, value)
    if path is None:
        return value
    other = claim_input(ctx, path, param.name)
    if other is not None:
        raise click.BadParameter(f"{path} is also given to {_flag(ctx, other)}: an output would overwrite "
                                 "the input it reads", ctx, param)
    return value


def claim_input(ctx, value, source: str) -> Optional[str]:
    """Record the file ``value`` (if it is one) as an input of ``ctx``'s command, given to ``source``
    (a parameter name, or the text the error names, such as ``--grid trace``); the output parameter
    already naming the same file, else ``None``."""
    if value is None or value == "-" or not isinstance(value, str) or not os.path.isfile(value):
        return None
    key = os.path.realpath(value)
    ctx.meta.setdefault("dynlab_inputs", {})[key] = source
    return ctx.meta.get("dynlab_outputs", {}).get(key)


#: the fields whose value is a file a run reads (``--spec-acceptance`` only as ``file:PATH``)
INPUT_FIELDS = ("trace", "workload", "spec_acceptance", "latency_profile")


def _input_file(field: Optional[str], value) -> Optional[str]:
    """The path an input's ``value`` may name (``--spec-acceptance``'s only as ``file:PATH``), else ``None``
    (a non-string, acceptance rates)."""
    if not isinstance(value, str):
        return None
    if field == "spec_acceptance":
        return value[len("file:"):] if value.startswith("file:") else None
    return value


def claim_inputs(ctx, given) -> None:
    """For values given after click parsed the outputs (a sweep's grid, compare's comma lists): a usage error
    when a file one of them reads is also an output of the command, which would overwrite it. ``given``:
    ``(label, field, value)`` triples; ``label`` is what the error names (``--grid trace``, ``--trace``);
    fields outside :data:`INPUT_FIELDS`, non-strings, ``-`` and acceptance rates pass."""
    for label, field, value in given:
        path = _input_file(field, value) if field in INPUT_FIELDS else None
        if path is None:
            continue
        other = claim_input(ctx, path, label)
        if other is not None:
            raise click.UsageError(f"{label}: {path} is also given to {_flag(ctx, other)}: an output would "
                                   "overwrite the input it reads")


def stream_output_path(ctx, param, value):
    """click callback for an output that is a stream of text (JSON lines, CSV, a summary): ``-`` is
    standard output; any other value is checked as :func:`output_path` checks it."""
    if value is None or value == "-":
        return value
    return _claim(_check_output(value, ctx, param, stream=True), ctx, param)


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


class Terminated(BaseException):
    """Raised in the main thread when the process receives SIGTERM or SIGHUP (what ``timeout``, CI
    runners and a closed terminal send), so that ``finally`` blocks and context managers run: a sweep
    stops its pool workers or its Ray instance instead of leaving them behind. ``signum``: the signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame) -> None:
    raise Terminated(signum)


#: The signals :class:`DynlabGroup` turns into :class:`Terminated` (Ctrl-C's SIGINT is click's Abort).
TERMINATING_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _ignore_stop_signals() -> None:
    """While cleaning up after a signal: a second one must not interrupt the clean-up."""
    for signum in (signal.SIGINT, *TERMINATING_SIGNALS):
        signal.signal(signum, signal.SIG_IGN)


class DynlabGroup(click.Group):
    """A click group whose errors are one line on stderr, never a traceback.

    Usage errors (bad option values, unknown names, an input file that cannot be opened:
    :class:`~dynlab.errors.InputFileError`) print ``Error: ...`` and exit 2; other
    :class:`DynlabError` (bad lines in input files) and OS errors print ``Error: ...`` and exit 1.
    Ctrl-C prints ``Aborted!`` and exits 130; SIGTERM and SIGHUP print ``Terminated (SIGTERM)`` and
    exit 128 + the signal's number (143, 129), as a shell reports a command a signal ended, after the
    command's clean-up (processes it started are stopped) has run.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        warnings.showwarning = _one_line_warning
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in TERMINATING_SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:  # e.g. nohup: SIGHUP stays ignored
                    previous[signum] = signal.signal(signum, _raise_terminated)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except Terminated as exc:
            _ignore_stop_signals()
            click.echo(f"Terminated ({signal.Signals(exc.signum).name})", err=True)
            sys.exit(128 + exc.signum)
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
            _ignore_stop_signals()  # a second Ctrl-C must not break the clean-up at exit
            click.echo("Aborted!", err=True)
            sys.exit(130)
        finally:
            for signum, handler in previous.items():
                if signal.getsignal(signum) is _raise_terminated:
                    signal.signal(signum, handler)
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
