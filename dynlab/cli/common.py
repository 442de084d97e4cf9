"""Helpers shared by the CLI commands: JSON output, comma lists, atomic writes, error display."""
from __future__ import annotations

import json
import os
import sys
import tempfile

import click

from dynlab.errors import DynlabError


def echo_json(obj) -> None:
    """Print one JSON object on one line (``json.dumps`` default separators)."""
    click.echo(json.dumps(obj))


def split_list(value: str, option: str) -> list[str]:
    """``"a,b,c"`` -> ``["a", "b", "c"]``; an empty item is a usage error naming ``option``."""
    items = [v.strip() for v in value.split(",")]
    if not items or any(v == "" for v in items):
        raise click.BadParameter(f"empty value in the list {value!r}", param_hint=option)
    return items


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed into place; ``-`` is stdout.

    A failure leaves an existing ``path`` exactly as it was.
    """
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".dynlab-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class DynlabGroup(click.Group):
    """A click group that shows :class:`DynlabError` and OS errors as one line and exits 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DynlabError as exc:
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(1)
        except OSError as exc:
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            click.echo(f"Error: {where}{exc.strerror or exc}", err=True)
            ctx.exit(1)
