"""A click group that imports a command's module on first use (issue 23: start-up).

``dynlab --help`` lists every command with its short help from :data:`COMMANDS` (no command module is
imported for it); running a command imports only the module that defines it. ``tests/test_cli_lazy.py``
checks that each short help is the first line of its command's docstring, so the table cannot go stale.
"""
from __future__ import annotations

import gc
import importlib

import click

from dynlab.cli.common import DynlabGroup

#: Whether a command's module is imported with the cyclic collector paused and what it made frozen
#: (``gc.freeze``): the console script's choice (:func:`dynlab._entry.main`), never an importer's, whose
#: pending garbage a freeze would keep for good.
FREEZE_IMPORTS = False
#: command name -> (the module of dynlab.cli that registers it on ``main``, its short help:
#: the first line of the command's docstring)
COMMANDS = {
    "calibrate": ("calibrate", "Fit a latency model to measured benchmark runs; print the error per point before "
                               "and after."),
    "cliff": ("cache", 'Sweep the GPU or CPU capacity; print {"capacity as written": value of the last pass}.'),
    "compare": ("routing", "Run `sim` once per value of ONE option given as a comma list; print the runs keyed "
                           "by value."),
    "disagg": ("disagg", "KV bytes per token, and the time to move the KV of --tokens tokens at each --gbps."),
    "events": ("events", "Recorded KV-event streams (vLLM's KVEventBatch; see docs/events.md)."),
    "latency": ("latency", "Step times (ms) of one or more latency models on a fixed grid of steps."),
    "models": ("disagg", "List the bundled model configs with their KV shape and bytes per token."),
    "plan": ("plan", "The fewest workers (and GPUs) per candidate shape that meet the SLOs on a trace, searched "
                     "by replay."),
    "plugins": ("plugins", "List every plugin of every kind (strategies, eviction policies, trace formats, "
                           'scorers) with the distribution that provides it and its version ("-" for a plugin '
                           "registered at run time)."),
    "policies": ("plugins", "List the registered cache eviction policies (--policy names): name, description, "
                            "distribution."),
    "report": ("report", "Write one self-contained HTML report of runs already made."),
    "reproduce": ("reproduce", "Write every artifact of the two labs into OUTDIR, with plots and a REPORT.md "
                               "that reads them."),
    "scenario": ("cache", "Re-read documents through a GPU (and optional CPU) KV cache; print hits per pass as "
                          "JSON."),
    "sim": ("routing", "Replay one workload through the fleet and print its metrics as one JSON object."),
    "strategies": ("plugins", "List the registered routing strategies (--mode names): name, description, "
                              "distribution."),
    "summarize": ("disagg", "Summarize measured JSON-lines files (IN and OUT may be - for stdin/stdout)."),
    "sweep": ("sweep", "Run `sim` for every cell of a grid of options and collect the results."),
    "workload": ("workload", "Generate the workload SPEC (a JSON spec file, or YAML with PyYAML) and write it to "
                             "--out as a trace."),
}


class _Listed(click.Command):
    """A command not imported yet, as ``--help`` lists it: its name and short help only."""


class LazyGroup(DynlabGroup):
    """:class:`~dynlab.cli.common.DynlabGroup` whose commands (``lazy``: name -> (module of
    ``package``, short help)) are imported when first looked up.

    :attr:`commands` (click's attribute, read by tools and tests that walk the tree) imports them all;
    listing (``--help``) imports none. A module that fails to import raises as it would at start-up (one
    missing from the install leaves its commands out, as before)."""

    def __init__(self, *args, lazy: dict, package: str, **kwargs):
        self._registered: dict = {}
        super().__init__(*args, **kwargs)
        self._lazy, self._package = dict(lazy), package

    @property
    def commands(self) -> dict:
        for name in list(self._lazy):
            self._load(name)
        return self._registered

    @commands.setter
    def commands(self, value: dict) -> None:
        self._registered = dict(value)

    def add_command(self, cmd: click.Command, name=None) -> None:
        self._registered[name or cmd.name] = cmd

    def _load(self, name: str) -> None:
        entry = self._lazy.pop(name, None)
        if entry is not None and name not in self._registered:
            module = f"{self._package}.{entry[0]}"
            collecting = gc.isenabled()
            if FREEZE_IMPORTS:
                gc.disable()  # imports make long-lived objects only (start-up: dynlab._entry)
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:  # a module left out of this install: its commands are absent
                if exc.name != module:
                    raise
            finally:
                if FREEZE_IMPORTS:
                    gc.freeze()  # what the imports made is never traversed again
                    if collecting:
                        gc.enable()
            for other, (module, _) in list(self._lazy.items()):  # the module registered its siblings too
                if module == entry[0] and other in self._registered:
                    del self._lazy[other]

    def get_command(self, ctx, cmd_name: str):
        self._load(cmd_name)
        return self._registered.get(cmd_name)

    def list_commands(self, ctx) -> list:
        return sorted(set(self._registered) | set(self._lazy))

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        limit = formatter.width - 6 - max((len(n) for n in self.list_commands(ctx)), default=0)
        for name in self.list_commands(ctx):
            cmd = self._registered.get(name)
            if cmd is None:
                cmd = _Listed(name, short_help=None, help=self._lazy[name][1])
            elif cmd.hidden:
                continue
            rows.append((name, cmd.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
