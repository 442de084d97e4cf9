"""``dynlab events replay``: apply a recorded vLLM KV-event stream to dynlab's index."""
from __future__ import annotations

import click

from dynlab.cli import main
from dynlab.cli.common import echo_json


@main.group()
def events():
    """Recorded KV-event streams (vLLM's KVEventBatch; see docs/events.md)."""


@events.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--block", type=click.IntRange(min=1), default=None,
              help="The router's tokens per block [default: the first BlockStored's block_size].")
def replay(file, block):
    """Apply FILE (msgpack KVEventBatch frames or JSON lines) to a KvIndex per worker; print per-worker counts as JSON.

    Stored events of another block size, or whose parent the worker does not hold, are refused and counted.
    """
    from dynlab.routing.events_io import replay_events

    echo_json(replay_events(file, block))
