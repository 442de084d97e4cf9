"""``dynlab reproduce OUTDIR``: every artifact of the two labs, their plots and REPORT.md, in one run.

Thin: check the options and OUTDIR, call :func:`dynlab.labs.reproduce.build`, write its files into a
temporary directory beside OUTDIR and move it into place at the end, print the paths written.
"""
from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile

import click

from dynlab.cli import main
from dynlab.cli.common import progress_bar, write_atomic
from dynlab.errors import DynlabError
from dynlab.labs import reproduce as lib

_FILE = click.Path(exists=True, dir_okay=False)


def _invocation(only, disagg_file, offload_file, with_samples, no_plots) -> str:
    parts = ["dynlab reproduce OUTDIR"]
    if only:
        parts.append(f"--only {only}")
    if disagg_file:
        parts.append(f"--disagg-file {disagg_file}")
    if offload_file:
        parts.append(f"--offload-file {offload_file}")
    if with_samples:
        parts.append("--with-samples")
    if no_plots:
        parts.append("--no-plots")
    return " ".join(parts)


@main.command("reproduce")
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Write into a non-empty OUTDIR, replacing dynlab's files there.")
@click.option("--only", type=click.Choice(lib.LABS), default=None, help="Only one lab's artifacts.")
@click.option("--disagg-file", type=_FILE, default=None, metavar="FILE",
              help="Measured disagg JSON-lines file: adds disagg_measured.json (lab000: the KV-aware router lab).")
@click.option("--offload-file", type=_FILE, default=None, metavar="FILE",
              help="Measured offload JSON-lines file: adds offload_measured.json (lab002: the two-tier KV cache lab).")
@click.option("--with-samples", is_flag=True,
              help="Use the package's sample measured files for the files not given.")
@click.option("--no-plots", is_flag=True, help="Write the JSON files and REPORT.md without plots.")
def reproduce_cmd(outdir, force, only, disagg_file, offload_file, with_samples, no_plots):
    """Write every artifact of the two labs into OUTDIR, with plots and a REPORT.md that reads them.

    Each JSON file is exactly what the command named in REPORT.md prints. The files are written
    into a temporary directory beside OUTDIR, which becomes OUTDIR at the end: an interrupted run
    (Ctrl-C, an error) leaves no OUTDIR, never a partial one. A non-empty OUTDIR is refused unless
    --force, which moves the new files in one by one at the end and removes dynlab's own files from
    an earlier run that this run does not produce.
    """
    if only == "lab000" and offload_file:
        raise click.UsageError("--offload-file is a lab002 input; it cannot be used with --only lab000")
    if only == "lab002" and disagg_file:
        raise click.UsageError("--disagg-file is a lab000 input; it cannot be used with --only lab002")
    _check_parent(outdir)
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise click.UsageError(f"{outdir} exists and is not a directory")
    if os.path.isdir(outdir) and os.listdir(outdir) and not force:
        raise click.UsageError(f"{outdir} is not empty; pass --force to write into it")
    if not no_plots:
        from dynlab.plots import pyplot

        try:
            pyplot()
        except DynlabError as exc:
            raise DynlabError(f"{exc} (or pass --no-plots to write the JSON files and REPORT.md only)") from None

    disagg = lib.measured_file(disagg_file) if disagg_file else (lib.sample_file("disagg") if with_samples else None)
    offload = lib.measured_file(offload_file) if offload_file else (lib.sample_file("offload") if with_samples else None)
    bar = progress_bar(None, "reproduce", "file")  # one step per file computed or drawn; closed below
    try:
        result = lib.build(
            only=only,
            disagg=disagg,
            offload=offload,
            with_plots=not no_plots,
            warn=lambda message: bar.write(f"Warning: {message}", file=sys.stderr),
            invocation=_invocation(only, disagg_file, offload_file, with_samples, no_plots),
            progress=bar,
        )
    except BaseException:
        bar.close()
        raise

    try:
        names = _write_into(outdir, result, bar)
    finally:
        bar.close()
    for name in names:
        click.echo(os.path.join(outdir, name))


def _write_into(outdir: str, result, bar) -> list[str]:
    """Write ``result``'s files into a staging folder beside OUTDIR and move them into place; returns
    the names written. An error names OUTDIR (the folder asked for), never the staging folder."""
    parent = os.path.dirname(os.path.abspath(outdir))
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(outdir))}.dynlab-", dir=parent)
    except OSError as exc:  # the folder changed since the check
        raise DynlabError(f"{outdir}: cannot write in {parent}: {exc.strerror or exc}") from None
    try:
        names = []
        for name, artifact in result.artifacts.items():
            write_atomic(os.path.join(staging, name), artifact.text)
            names.append(name)
        for name, plot in result.plots.items():
            plot.draw(os.path.join(staging, name))
            names.append(name)
            bar.update(1)
        write_atomic(os.path.join(staging, lib.REPORT), result.report)
        names.append(lib.REPORT)
        _move_into_place(staging, outdir, names, stale=set(lib.artifact_names()) - set(result.files()))
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError) and str(getattr(exc, "filename", "") or "").startswith(staging):
            raise DynlabError(f"{outdir}: {exc.strerror or exc}") from None
        if isinstance(exc, DynlabError) and staging in str(exc):  # a file of the staging folder
            raise DynlabError(str(exc).replace(staging, outdir.rstrip(os.sep))) from None
        raise
    return names


def _check_parent(outdir: str) -> None:
    """Before any work: a usage error naming OUTDIR when it is ``-`` (a folder of files cannot be a
    stream) or when its parent folder cannot be created or written in (read-only, /proc)."""
    if outdir == "-":
        raise click.BadParameter("- (standard output) cannot hold a folder of files; give a folder",
                                 param_hint="'OUTDIR'")
    parent = os.path.dirname(os.path.abspath(outdir))
    try:
        os.makedirs(parent, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".dynlab-probe-", dir=parent))
    except OSError as exc:
        raise click.UsageError(f"{outdir}: cannot write in {parent}: {exc.strerror or exc}") from None


def _move_into_place(staging: str, outdir: str, names: list[str], stale: set[str]) -> None:
    """Make ``staging`` OUTDIR: renamed whole when OUTDIR is absent or empty, else (``--force``) file by file."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, stat.S_IMODE(os.stat(outdir).st_mode) if os.path.isdir(outdir) else 0o777 & ~umask)
    if os.path.isdir(outdir) and not os.listdir(outdir):
        os.rmdir(outdir)
    if not os.path.exists(outdir):
        os.rename(staging, outdir)
        return
    for name in names:
        os.replace(os.path.join(staging, name), os.path.join(outdir, name))
    for name in stale:
        path = os.path.join(outdir, name)
        if os.path.isfile(path):
            os.remove(path)
    os.rmdir(staging)
