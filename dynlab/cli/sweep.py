"""``dynlab sweep``: a grid of ``sim`` options, one ``sim`` run per cell, on a process pool or Ray.

Thin: the grid's option names, types and validation come from ``sim``'s own options
(the ``SIM_OPTIONS`` table of ``dynlab/cli/sim_options.py`` and ``sim``'s flags, read from this command's parameters),
converted here and handed to :mod:`dynlab.sweep` as plain values.
"""
from __future__ import annotations

import json
import os
import time

import click
from click.core import ParameterSource

from dynlab import plugins
from dynlab.cli import main
from dynlab.sweep.plots import FRONTIER, FRONTIER_METRICS  # matplotlib is imported only when a plot is drawn
from dynlab.cli.common import domain_warning, output_path, stream_output_path, write_atomic
from dynlab.cli.common import claim_inputs, input_path, parse_opts
from dynlab.cli.sim_options import OWN_COMMAS, common_flags, sim_options
from dynlab.cli.report import report_option
from dynlab.cli.sweep_cells import open_results, run_cells
from dynlab.engine.config import SimConfig
from dynlab.engine.run import config_fields
from dynlab.errors import DynlabError
from dynlab.limits import MAX_GRID_CELLS
from dynlab.sweep import (EXECUTORS, OPT_PREFIX, LATENCY_OPT_PREFIX, Axis, Grid, GridError, cell_key, check_config,
                          option_text, plot_layout, plot_sweep, read_grid_file, to_csv)

# this command's own parameters: everything else that is a SimConfig field is a sim option
_OWN = {"grid_items", "grid_file", "executor", "jobs", "ray_address", "out", "resume", "csv_path",
        "plot_path", "metric", "dry_run", "opt", "quiet", "report_path"}


def _sim_params(command: click.Command) -> dict[str, click.Option]:
    """Option name as written in a grid (``event-loss``; also ``event_loss`` and aliases) -> its parameter."""
    fields = set(config_fields()) - {"opts"}
    names: dict[str, click.Option] = {}
    for p in command.params:
        if p.name in _OWN or p.name not in fields or not isinstance(p, click.Option):
            continue
        for flag in p.opts:
            names.setdefault(flag.lstrip("-"), p)
        names.setdefault(p.name, p)
    return names


def _canonical(p: click.Option) -> str:
    return p.opts[0].lstrip("-")


def _convert(p: click.Option, name: str, raw, ctx) -> object:
    try:
        return p.type.convert(raw, p, ctx)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint=f"--grid {name}") from None


def _canonical_opt(name: str, text: str) -> str:
    """A strategy option's value in one spelling (``0``, ``0.0`` and ``0e0`` are one cell), when a
    registered strategy declares ``name`` and the text converts; otherwise the text as written
    (a bad value is then reported per cell, as ``sim`` reports it)."""
    for entry in plugins.strategies().entries():
        for o in entry.cls.options:
            if o.name == name:
                try:
                    value = o.convert(text)
                except ValueError:
                    return text
                return option_text(value)
    return text


def _parse_grid_item(item: str) -> tuple[str, list[str]]:
    name, sep, text = item.partition("=")
    name = name.strip()
    if not sep or not name:
        raise click.BadParameter(f"expected NAME=V1,V2,..., got {item!r}", param_hint="--grid")
    if not text.strip():
        raise click.BadParameter(f"{name}: empty value list", param_hint="--grid")
    values = [v.strip() for v in text.split(",")]
    if any(v == "" for v in values):
        raise click.BadParameter(f"{name}: empty value in the list {text!r}", param_hint="--grid")
    return name, values


def _axis(ctx, params, known, fixed_opts, fields, axes, name, values, from_file) -> Axis:
    """One grid axis, its values converted and checked as the option's own (usage errors)."""
    if not values:
        raise click.UsageError(f"grid option {name!r}: empty value list")
    if name.startswith(OPT_PREFIX):
        canon = OPT_PREFIX + name[len(OPT_PREFIX):].strip()
        if canon == OPT_PREFIX:
            raise click.UsageError(f"grid option {name!r}: no strategy option name after 'opt.'")
        if canon[len(OPT_PREFIX):] in fixed_opts:
            raise click.UsageError(f"{canon} is both in the grid and given with --opt")
        converted = [_canonical_opt(canon[len(OPT_PREFIX):], option_text(v) if from_file else v)
                     for v in values]
    else:
        p = params.get(name)
        if p is None:
            raise click.UsageError(f"unknown option {name!r} in the grid; options: {', '.join(known)}, "
                                   "opt.NAME (strategy options)")
        canon = _canonical(p)
        if ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT, None):
            raise click.UsageError(f"{canon} is both in the grid and given as {p.opts[0]}")
        fields[canon] = p.name
        converted = [_convert(p, canon, option_text(v) if from_file else v, ctx) for v in values]
    if any(a.name == canon for a in axes):
        raise click.UsageError(f"grid option {canon!r} is given twice")
    seen: dict[str, object] = {}
    for text, value in zip(values, converted):
        key = cell_key({"v": value})
        if key in seen:
            raise click.UsageError(f"grid option {canon!r}: value {text!r} repeats {seen[key]!r}")
        seen[key] = text
    return Axis(canon, tuple(converted), tuple(str(option_text(v)) for v in values))


def _build_grid(ctx, grid_items, grid_file, opt, options, latency_opt=()) -> Grid:
    params = _sim_params(ctx.command)
    known = sorted({_canonical(p) for p in params.values()})
    raw_axes: list[tuple[str, list, bool]] = []  # (name as written, values, from the file)
    if grid_file is not None:
        try:
            raw_axes += [(n, v, True) for n, v in read_grid_file(grid_file)]
        except GridError as exc:
            raise click.UsageError(str(exc)) from None
    raw_axes += [(*_parse_grid_item(item), False) for item in grid_items]
    if not raw_axes:
        raise click.UsageError("give the grid with --grid NAME=V1,V2,... or --grid-file FILE")
    fixed_opts = parse_opts(opt)
    axes: list[Axis] = []
    fields: dict[str, str] = {}
    for name, values, from_file in raw_axes:
        try:
            axes.append(_axis(ctx, params, known, fixed_opts, fields, axes, name, values, from_file))
        except click.BadParameter as exc:
            p = params.get(name.strip())
            if not from_file and p is not None and p.name in OWN_COMMAS:  # --grid split a value at its commas
                raise click.UsageError(f"{exc.format_message()} ({name}'s values hold commas: give this axis in "
                                       "a --grid-file, a TOML list)") from None
            if not from_file:
                raise
            raise click.UsageError(f"{grid_file}: {name}: {exc.message}") from None
        except click.UsageError as exc:
            if not from_file:
                raise
            raise click.UsageError(f"{grid_file}: {exc.message}") from None
    # options given once apply to every cell and are part of its identity
    fields_of_config = set(config_fields())
    fixed: dict[str, object] = {}
    for p in ctx.command.params:
        if p.name in options and ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT, None):
            if p.name not in fields_of_config:  # a sim flag that is not a simulation setting
                raise click.UsageError(f"{p.opts[0]} is not supported by sweep")
            fixed[_canonical(p)] = options[p.name]
            fields[_canonical(p)] = p.name
    for name, text in fixed_opts.items():
        fixed[OPT_PREFIX + name] = _canonical_opt(name, text)
    for name, text in parse_opts(latency_opt, "--latency-opt").items():
        fixed[LATENCY_OPT_PREFIX + name] = text
    base = {name: value for name, value in options.items() if name in fields_of_config}
    return Grid(tuple(axes), fixed, fields, dict(base, opts={}))


def _claim_grid_inputs(ctx, grid: Grid) -> None:
    """A usage error when a file a grid value reads (``trace=``, ``workload=``, ``spec-acceptance=file:``)
    is also an output of the sweep (``--out``, ``--csv``, ...), which would overwrite it."""
    given = [(a.name, v) for a in grid.axes for v in a.values] + list(grid.fixed.items())
    claim_inputs(ctx, [(f"--grid {name}", grid.fields.get(name), value) for name, value in given])


def _check_cells(grid: Grid, cells: list[dict]) -> list[SimConfig]:
    """Every cell's configuration, checked as `sim` checks its options and as a timed run checks its
    values (:func:`dynlab.engine.serving.check_timed`, with the cell's trace loaded), before any cell
    runs or any output is opened, with --dry-run too (usage errors name the cell)."""
    from dynlab.engine.option_rules import check_effective
    from dynlab.engine.serving import build_engines, check_timed
    from dynlab.traces.reader import own_block_tokens

    from dynlab.engine.option_rules import align_split

    # a split axis: its aggregated cells (P:0) drop the P/D options the disaggregated ones use
    try:
        aligned = align_split([grid.config(cell) for cell in cells], set(grid.fields.values()))
    except ValueError as exc:  # a file of acceptance lengths that does not fit the largest K
        raise click.UsageError(str(exc)) from None
    own: dict = {}  # (trace, format) -> the block size its format names its blocks at
    configs = []
    for cell, (config, given) in zip(cells, aligned):
        _check_profile(config, own)
        try:
            check_config(config)
            key = (config.trace, config.trace_format)
            if config.trace not in (None, "-") and "block" in given and key not in own:
                own[key] = own_block_tokens(config.trace, config.trace_format, config.block)
            check_effective(config, given, own.get(key))
            if config.timing:  # what a timed run refuses of its values (compare refuses them up front too)
                trace = _trace(config)
                check_timed(config.resolved(), trace)
                # --trace-block on a workload, block ratios, KV cache groups with trace blocks
                build_engines(config.resolved(), getattr(trace, "own_block_tokens", None))
        except (ValueError, plugins.UnknownNameError) as exc:
            raise click.UsageError(f"cell {json.dumps(cell)}: {exc}") from None
        configs.append(config)
    return configs


def _check_profile(config: SimConfig, seen: dict) -> None:
    """Read a cell's ``--latency-profile`` once per file before any cell runs: a missing or bad file is the
    sweep's error (``FILE: why``, exit 2; a bad line ``FILE:LINE``, exit 1), not one cell's in the middle of
    the run."""
    path = config.latency_profile
    if not config.timing or path is None or ("profile", path) in seen:
        return
    from dynlab.latency.profile import read_profile
    from dynlab.errors import InputFileError

    try:
        read_profile(path)
    except InputFileError as exc:
        raise click.UsageError(str(exc)) from None
    seen[("profile", path)] = True


def _trace(config: SimConfig):
    """The cell's loaded trace (``None`` without one), from this process's cache, which the executors
    reuse (a forked pool inherits it); a bad line raises its ``FILE:LINE`` error here, before any cell runs.
    An error of the options the trace is read with (``--hash`` on named blocks) is a usage error."""
    from dynlab.sweep.executors import cached_trace

    if config.trace is None:
        return None
    try:
        return cached_trace(config)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


#: metrics only a timed run (--timing) computes
TIMED_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms", "queue_wait_ms", "makespan_s", "output_tokens_per_s", "goodput",
                 "preemptions", "prefix_hit_rate")


@main.command()
@sim_options
@common_flags("No progress bar and no closing summary line on stderr.")
@click.option("--grid", "grid_items", multiple=True, metavar="NAME=V1,V2,...",
              help="An option to vary and its values; repeatable. NAME: a sim option without dashes "
                   "(workers, capacity, event-loss, ...) or opt.NAME for a strategy option. "
                   f"At most {MAX_GRID_CELLS:,} cells (see docs/limits.md).")
@click.option("--grid-file", type=click.Path(dir_okay=False), default=None, callback=input_path,
              help="A TOML file of NAME = [values] (a single value applies to every cell; [opt] for strategy options).")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
              help="serial (this process), local (a process pool) or ray (dynlab[ray]).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Processes (local) or CPUs of the local Ray instance [default: the CPUs available].")
@click.option("--ray-address", default=None, metavar="ADDRESS",
              help="Run on this Ray cluster (host:port) instead of a local instance started for the sweep.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, callback=stream_output_path,
              help="Append one JSON line per finished cell here (- : stdout) [default: print them to stdout].")
@click.option("--resume", is_flag=True, help="Skip the cells already in --out; append the others.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None, callback=stream_output_path,
              help="Also write the grid's results as CSV (options, then flattened metrics; - : stdout, "
                   "with --out FILE).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, callback=output_path,
              help="Write a PNG: a line per strategy (one varied number) or a heatmap per strategy (two).")
@click.option("--metric", default=None, metavar="PATH",
              help="Metric to plot, a dotted path (block_hit_rate, ttft_ms.p99, load_imbalance) "
                   "[default: block_hit_rate, else hit_rate].")
@click.option("--dry-run", is_flag=True, help="List the cells (still to run, with --resume) and stop.")
@report_option
@click.pass_context
def sweep(ctx, grid_items, grid_file, executor, jobs, ray_address, out, resume, csv_path, plot_path, metric,
          dry_run, opt, latency_opt, quiet, report_path, **options):
    """Run `sim` for every cell of a grid of options and collect the results.

    The cells are the cross product of the --grid options; the other sim options
    apply to every cell. Each result is exactly what `dynlab sim` prints for the
    cell's options, whichever executor runs it. Example:

    \b
      dynlab sweep --trace mooncake-conversation --grid mode=rr,kv \\
        --grid workers=2,4,8 --grid capacity=1024,4096 --out results.jsonl --plot hit.png
    """
    _refuse_flag_combinations(executor, jobs, ray_address, out, resume, csv_path, plot_path, metric)
    if report_path and dry_run:
        raise click.UsageError("--report has no effect with --dry-run (no cell runs)")
    out = None if out == "-" else out  # the results lines on stdout, as without --out
    grid = _build_grid(ctx, grid_items, grid_file, opt, options, latency_opt)
    _claim_grid_inputs(ctx, grid)
    try:
        cells = grid.cells()  # refuses a grid over the cell limit before building any cell
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    configs = _check_cells(grid, cells)
    if plot_path:
        try:
            plot_layout(grid)
        except GridError as exc:
            raise click.UsageError(str(exc)) from None
    if out and not resume and not dry_run and os.path.exists(out) and os.path.getsize(out) > 0:
        raise click.UsageError(f"{out} is not empty: add --resume to run only the cells its results lack, "
                               "or choose another file")
    results_file, todo = open_results(out, resume, cells, configs)
    in_grid = {cell_key(c) for c in cells}
    if dry_run:
        for cell, _ in todo:
            click.echo(json.dumps(cell))
        note = f", {len(cells) - len(todo)} already in {out}" if resume else ""
        click.echo(f"{_cells(len(cells))}{note}, {len(todo)} to run", err=True)
        return
    if plot_path:
        _check_plot_request(plot_path, metric, configs)
    results = {k: r for k, (_, r) in (results_file.records.items() if results_file else ())}
    started = time.perf_counter()
    run_cells(todo, executor, jobs, ray_address, results_file, results, in_grid, quiet)
    elapsed = time.perf_counter() - started
    results = _warned({k: r for k, r in results.items() if k in in_grid}, cells)  # records of other grids stay out
    if plot_path:
        metric = _plot_metric(results, metric)  # a metric no result has fails before any file is written
    if csv_path:
        write_atomic(csv_path, to_csv((c, results[cell_key(c)]) for c in cells if cell_key(c) in results))
    if plot_path:
        plot_sweep(grid, results, plot_path, metric)
    if report_path:
        _report(ctx, report_path, cells, configs, results)
    if not quiet:  # last: no success line before an error of the CSV, the plot or the report
        skipped = len(cells) - len(todo)
        where = f" into {out}" if out else ""
        extra = f"; {skipped} already there" if skipped else ""
        click.echo(f"sweep: {_cells(len(todo))} in {elapsed:.1f} s ({executor}){where}{extra}", err=True)


def _warned(results: dict, cells: list) -> dict:
    """``results``, after the warning ``sim`` prints for a result outside its latency model's (or profile's)
    domain (``latency_domain``), on stderr once per distinct warning in the order of ``cells``: once per shape, as
    ``plan`` and ``compare`` warn (the text names what puts the shape outside: its GPU, model, tp)."""
    ordered = [results[cell_key(c)] for c in cells if cell_key(c) in results]
    lines = {line: None for line in map(domain_warning, ordered) if line is not None}
    for line in lines:
        click.echo(line, err=True)
    return results


def _check_plot_request(plot_path, metric, configs) -> None:
    """Refuse, before any cell runs, a plot that could not be drawn: a missing matplotlib, an unknown suffix, or a
    ``--metric`` no cell computes (``click.UsageError``)."""
    from dynlab.cli.common import check_plot

    check_plot(plot_path)
    if metric and metric.split(".")[0] in TIMED_METRICS and not any(c.timing for c in configs):
        raise click.UsageError(f"--metric {metric} needs --timing (no cell computes it)")
    if metric == FRONTIER and not any(c.timing and c.concurrency for c in configs):
        raise click.UsageError("--metric frontier needs --timing and --concurrency (a closed-loop sweep)")
    if metric and metric != FRONTIER:
        from dynlab.sweep.probe import metric_problem

        problem = metric_problem(configs, metric, _trace)
        if problem:
            raise click.UsageError(problem)


def _report(ctx, path, cells, configs, results) -> None:
    """The sweep's HTML report: a run per finished cell, in grid order."""
    from dynlab.cli.report import write_run_report
    from dynlab.report import Run
    from dynlab.report.runs import cell_label

    runs = [Run(cell_label(c), results[cell_key(c)], cell=dict(c)) for c in cells if cell_key(c) in results]
    write_run_report(ctx, path, runs, configs)


def _refuse_flag_combinations(executor, jobs, ray_address, out, resume, csv_path, plot_path, metric) -> None:
    """Raise ``click.UsageError`` for sweep flags that need another flag or contradict one."""
    if resume and out in (None, "-"):
        raise click.UsageError("--resume needs --out FILE")
    if csv_path == "-" and out in (None, "-"):
        raise click.UsageError("--csv - needs --out FILE: the results lines already go to stdout")
    if metric and not plot_path:
        raise click.UsageError("--metric needs --plot")
    if ray_address and executor != "ray":
        raise click.UsageError("--ray-address needs --executor ray")
    if jobs is not None and executor == "serial":
        raise click.UsageError("--jobs needs --executor local or ray")
    if jobs is not None and ray_address:
        raise click.UsageError("--jobs sets the CPUs of a local Ray instance; with --ray-address the cluster's count")
    paths = [os.path.realpath(p) for p in (out, csv_path, plot_path) if p and p != "-"]
    if len(set(paths)) != len(paths):
        raise click.UsageError("--out, --csv and --plot must name different files")


def _cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def _plot_metric(results: dict, metric) -> str:
    """The metric to plot (``--metric``; else ``frontier`` for a closed-loop sweep, ``block_hit_rate``, else
    ``hit_rate``); raises
    :class:`DynlabError` listing the numbers there are when no result has it."""
    from dynlab.sweep import metric_value, numeric_paths

    values = list(results.values())
    if metric is None and any(metric_value(r, FRONTIER_METRICS[1]) is not None and r.get("concurrency")
                              for r in values):
        metric = FRONTIER  # a closed-loop sweep: the throughput-interactivity frontier
    if metric == FRONTIER:
        for path in FRONTIER_METRICS:
            if not any(metric_value(r, path) is not None for r in values):
                raise DynlabError(f"--metric frontier: no result has {path} (it needs --timing and --concurrency)")
        return metric
    if metric is None:
        metric = "block_hit_rate" if any(metric_value(r, "block_hit_rate") is not None for r in values) \
            else "hit_rate"
    if not any(metric_value(r, metric) is not None for r in values):
        raise DynlabError(f"--metric {metric}: no result has this number; available: "
                          f"{', '.join(numeric_paths(values))}")
    return metric
