"""``dynlab plugins``, ``dynlab strategies`` and ``dynlab policies``: what the plugin registries hold."""
from __future__ import annotations

import click

from dynlab import plugins
from dynlab.cli import main
from dynlab.cli.common import echo_json

_json = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text lines.")


def _record(entry, kind=None) -> dict:
    out = {"kind": kind} if kind else {}
    out.update(name=entry.name, description=entry.description, source=entry.source,
               version=plugins.distribution_version(entry.source))
    return out


def _strategy_details(entry) -> dict:
    return {"options": [{"name": o.name, "type": o.type.__name__, "default": o.default, "help": o.help}
                        for o in getattr(entry.cls, "options", ())]}


def _policy_details(entry) -> dict:
    return {"class": f"{entry.cls.__module__}.{entry.cls.__qualname__}",
            "needs_future": bool(getattr(entry.cls, "needs_future", False))}


def _list(key: str, entries, verbose: bool, as_json: bool, details, detail_lines) -> None:
    if as_json:
        echo_json({key: [dict(_record(e), **(details(e) if verbose else {})) for e in entries]})
        return
    width = max((len(e.name) for e in entries), default=0)
    for e in entries:
        click.echo(f"{e.name.ljust(width)}  {e.description}  [{e.source}]")
        if verbose:
            for line in detail_lines(e):
                click.echo(f"{'':{width}}    {line}")


def _strategy_lines(entry):
    for o in getattr(entry.cls, "options", ()):
        yield f"--opt {o.name}=<{o.type.__name__}> (default {o.default}): {o.help}"


def _policy_lines(entry):
    d = _policy_details(entry)
    yield f"class {d['class']}"
    yield ("offline: reads the whole workload ahead (needs_future)" if d["needs_future"]
           else "online: decides from the accesses so far")


@main.command()
@click.option("--verbose", "-v", is_flag=True, help="Also list each strategy's options (--opt NAME=VALUE).")
@_json
def strategies(verbose, as_json):
    """List the registered routing strategies (--mode names): name, description, distribution."""
    _list("strategies", plugins.strategies().entries(), verbose, as_json, _strategy_details, _strategy_lines)


@main.command()
@click.option("--verbose", "-v", is_flag=True,
              help="Also give each policy's class and whether it reads the workload ahead (offline).")
@_json
def policies(verbose, as_json):
    """List the registered cache eviction policies (--policy names): name, description, distribution."""
    _list("policies", plugins.eviction_policies().entries(), verbose, as_json, _policy_details, _policy_lines)


@main.command("plugins")
@_json
def plugins_cmd(as_json):
    """List every plugin of every kind (strategies, eviction policies, trace formats, scorers) with the
    distribution that provides it and its version ("-" for a plugin registered at run time)."""
    rows = [_record(e, kind) for kind, registry in plugins.kinds().items() for e in registry().entries()]
    if as_json:
        echo_json({"plugins": rows})
        return
    table = [("KIND", "NAME", "DISTRIBUTION", "VERSION", "DESCRIPTION")] + [
        (r["kind"], r["name"], r["source"], r["version"] or "-", r["description"]) for r in rows]
    widths = [max(len(row[j]) for row in table) for j in range(4)]
    for row in table:
        click.echo("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row[:4])) + "  " + row[4])
