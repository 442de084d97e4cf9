"""The ``dynlab`` command: a click group; each command module stays thin (parse, call the library, print)."""
from __future__ import annotations

import click

from dynlab import __version__
from dynlab.cli.common import DynlabGroup


@click.group(cls=DynlabGroup, context_settings={"max_content_width": 120})
@click.version_option(__version__, prog_name="dynlab")
def main():
    """Simulate KV-aware request routing over a fleet of LLM serving workers and their KV caches."""


def _attach() -> None:
    # Importing each module registers its commands on ``main``.
    import importlib

    for module in ("routing", "cache", "disagg", "sweep", "reproduce", "latency", "events", "plugins", "report",
                   "plan", "workload"):
        try:
            importlib.import_module(f"dynlab.cli.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"dynlab.cli.{module}":
                raise


_attach()
