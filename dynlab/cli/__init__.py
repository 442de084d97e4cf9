"""The ``dynlab`` command: a click group; each command module stays thin (parse, call the library, print).

The command modules are imported lazily, on a command's first use (:mod:`dynlab.cli.lazy`): each module
registers its commands on :data:`main` when imported, and :data:`dynlab.cli.lazy.COMMANDS` says which
module defines which command, with the short help ``dynlab --help`` lists.
"""
from __future__ import annotations

import click

from dynlab import __version__
from dynlab.cli.lazy import COMMANDS, LazyGroup


@click.group(cls=LazyGroup, lazy=COMMANDS, package="dynlab.cli", context_settings={"max_content_width": 120})
@click.version_option(__version__, prog_name="dynlab")
def main():
    """Simulate KV-aware request routing over a fleet of LLM serving workers and their KV caches."""
