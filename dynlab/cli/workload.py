"""``dynlab workload SPEC --out FILE``: generate a workload spec as a trace file."""
from __future__ import annotations

import click

from dynlab.cli import main
from dynlab.cli.common import input_path, output_path


@main.command()
@click.argument("spec", type=click.Path(dir_okay=False), callback=input_path)
@click.option("--out", "out", type=click.Path(dir_okay=False), required=True, callback=output_path,
              help="The trace file to write (JSON lines; replaced atomically).")
@click.option("--format", "fmt", type=click.Choice(["token", "mooncake"]), default="token", show_default=True,
              help="A token trace (the prompts' token ids, hashed at --block when replayed) or a Mooncake trace "
                   "(hash_ids of 512-token blocks).")
def workload(spec, out, fmt):
    """Generate the workload SPEC (a JSON spec file, or YAML with PyYAML) and write it to --out as a trace.

    `dynlab sim --workload SPEC` replays the same requests without writing them (docs/workloads.md).
    Prints one line to stderr: how many requests were written where.
    """
    from dynlab.traces.workload_io import write_workload

    n = write_workload(spec, out, fmt)
    click.echo(f"wrote {n} requests to {out} ({fmt} trace)", err=True)
