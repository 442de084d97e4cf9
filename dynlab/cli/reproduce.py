"""``dynlab reproduce OUTDIR``: every artifact of the two labs, their plots and REPORT.md, in one run.

Thin: check the options and OUTDIR, call :func:`dynlab.labs.reproduce.build`, write its files atomically
one by one, print the paths written.
"""
from __future__ import annotations

import os

import click

from dynlab.cli import main
from dynlab.cli.common import write_atomic
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
              help="Measured disagg JSON-lines file: adds disagg_measured.json (lab000).")
@click.option("--offload-file", type=_FILE, default=None, metavar="FILE",
              help="Measured offload JSON-lines file: adds offload_measured.json (lab002).")
@click.option("--with-samples", is_flag=True,
              help="Use the package's sample measured files for the files not given.")
@click.option("--no-plots", is_flag=True, help="Write the JSON files and REPORT.md without plots (no matplotlib).")
def reproduce_cmd(outdir, force, only, disagg_file, offload_file, with_samples, no_plots):
    """Write every artifact of the two labs into OUTDIR, with plots and a REPORT.md that reads them.

    Each JSON file is exactly what the command named in REPORT.md prints. OUTDIR is created if
    missing; a non-empty OUTDIR is refused unless --force, which also removes dynlab's own files
    from an earlier run that this run does not produce. Plots need matplotlib (dynlab[plot]); without
    it the command stops before writing anything, unless --no-plots.
    """
    if only == "lab000" and offload_file:
        raise click.UsageError("--offload-file is a lab002 input; it cannot be used with --only lab000")
    if only == "lab002" and disagg_file:
        raise click.UsageError("--disagg-file is a lab000 input; it cannot be used with --only lab002")
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
    result = lib.build(
        only=only,
        disagg=disagg,
        offload=offload,
        with_plots=not no_plots,
        warn=lambda message: click.echo(f"Warning: {message}", err=True),
        invocation=_invocation(only, disagg_file, offload_file, with_samples, no_plots),
    )

    os.makedirs(outdir, exist_ok=True)
    written = []
    for name, artifact in result.artifacts.items():
        path = os.path.join(outdir, name)
        write_atomic(path, artifact.text)
        written.append(path)
    for name, plot in result.plots.items():
        path = os.path.join(outdir, name)
        plot.draw(path)
        written.append(path)
    path = os.path.join(outdir, lib.REPORT)
    write_atomic(path, result.report)
    written.append(path)
    if force:
        produced = set(result.files())
        for name in lib.artifact_names():
            stale = os.path.join(outdir, name)
            if name not in produced and os.path.isfile(stale):
                os.remove(stale)
    for path in written:
        click.echo(path)
