"""``dynlab sim``, ``dynlab compare`` and ``dynlab strategies``."""
from __future__ import annotations

import random
import sys
from dataclasses import replace

import click

from dynlab import plugins
from dynlab.cli import main
from dynlab.cli.common import (INPUT_FIELDS, claim_inputs, domain_warning, echo_table_or_json, json_text, output_path,
                               parse_opts, progress_bar, refuse_repeats, split_list, stream_output_path, write_atomic)
from dynlab.cli.sim_options import (SIM_FLAGS, SIM_OPTIONS, OWN_COMMAS, common_flags, compare_options,  # noqa: F401
                                    pool_option, sim_options)
from dynlab.engine.config import SimConfig
from dynlab.engine.run import build_strategy
from dynlab.sim.runner import run
from dynlab.cli.report import report_option, timeline_options, usage_recorder, write_run_report


def given_fields(ctx: click.Context) -> set[str]:
    """The :class:`SimConfig` fields the user wrote on the command line (or in the environment)."""
    from click.core import ParameterSource

    return {p.name for p in ctx.command.params
            if ctx.get_parameter_source(p.name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}


def check_options(config: SimConfig, given, requests=None) -> None:
    """Usage error (exit 2) for an option that has no effect in ``config``
    (:func:`dynlab.engine.option_rules.check_effective`); ``given``: the fields the user wrote.

    ``--block`` needs the trace's format: read from the loaded ``requests``, else from the
    trace's first line (stdin cannot be read twice: :func:`run` then refuses a non-default value).
    """
    from dynlab.engine.option_rules import check_effective

    own = None
    if config.trace is not None and ("block" in given or config.block != SimConfig.block):
        if requests is not None:
            own = getattr(requests, "own_block_tokens", None)
        elif config.trace != "-":
            from dynlab.traces.reader import own_block_tokens

            own = own_block_tokens(config.trace, config.trace_format, config.block)
    try:
        config.validate()
        check_effective(config, given, own)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _run(config: SimConfig, quiet: bool, requests=None, recorders=(), warned: set | None = None) -> dict:
    """``sim``'s result of ``config``, warning on stderr when it lies outside the latency model's (or the profile's)
    domain; with ``warned`` (the warnings printed so far, a command's set) each warning once: one per shape, as
    ``plan`` warns, since the text names what puts the shape outside (its GPU, model, tp)."""
    try:
        result = run(config, progress=not quiet and sys.stderr.isatty(), requests=requests, recorders=recorders)
    except (ValueError, plugins.UnknownNameError) as exc:
        raise click.UsageError(str(exc)) from None
    line = domain_warning(result, config.latency_model)  # a profile's model, when one replaced the flag's
    if line is not None:
        if warned is None or line not in warned:
            click.echo(line, err=True)
        if warned is not None:
            warned.add(line)
    return result


@main.command()
@sim_options
@pool_option
@common_flags()
@click.option("--requests-out", "requests_out", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              callback=stream_output_path, metavar="FILE",
              help="Write one JSON line per trace request, in trace order (worker, times, hits, preemptions; "
                   "see docs/commands.md); - for stdout, the result JSON then going to stderr.")
@report_option
@timeline_options
@click.pass_context
def sim(ctx, opt, latency_opt, all_metrics, timing, quiet, requests_out, report_path, timeline,
        timeline_max_requests, **options):
    """Replay one workload through the fleet and print its metrics as one JSON object.

    Without --trace: the KV-aware router lab's synthetic workload (12 shared prefixes,
    6 requests each), printing that lab's keys. With --trace: a real trace, printing the fleet metrics too, with
    block_tokens (tokens per block of the names replayed: 512 for a Mooncake trace).
    An option that would have no effect in the combination given is refused (exit 2).
    """
    from dynlab.engine.option_rules import check_outputs
    from dynlab.sim.records import RequestRecorder

    config = SimConfig(**options, opts=parse_opts(opt), latency_opts=parse_opts(latency_opt, "--latency-opt"),
                       all_metrics=all_metrics, timing=timing)
    given = given_fields(ctx)
    check_options(config, given)
    try:
        check_outputs(timing, given)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    per_request = RequestRecorder() if requests_out else None
    line = None
    if timeline:
        from dynlab.sim.timeline import TimelineRecorder
        line = TimelineRecorder(config.event_delay_ms)
    usage = usage_recorder(config, report_path)
    result = _run(config, quiet, recorders=[r for r in (per_request, line, usage) if r is not None])
    text = json_text(result)
    if report_path:  # written before the JSON is printed: no output that looks like success before an error
        from dynlab.report import Run
        records = {config.mode: list(per_request.records())} if requests_out else None
        write_run_report(ctx, report_path, [Run(config.mode, result)], [config], records=records,
                         usage=None if usage is None else {config.mode: usage.series()})
    if timeline:
        from dynlab.report.timeline import write_timeline

        write_timeline(line.steps, list(line.records()), line.events, timeline, timeline_max_requests)
    if requests_out:
        write_atomic(requests_out, per_request.jsonl())
    click.echo(text, err=requests_out == "-")
    _warn_collapse({result.get("mode"): result})


def _format_table(results: dict) -> str:
    """An aligned text table of the main metrics, one row per run (``-`` where a run lacks a value); a
    column appears when some run has its key (``prefix_hit_rate``: timed runs, the engines' own hit rate,
    GPU and CPU tier, beside the router's GPU-only ``block_hit_rate``; ``ttft_p99_ms`` and ``tpot_p99_ms``
    beside the medians, as SLOs are p99). When some run speculates (``compare --spec-tokens 0,2,4``) the
    table also has ``accept_len`` (the mean acceptance length); ``goodput`` shows with an SLO, ``shed`` with an
    admission policy, ``held`` when a gateway held requests, ``gpu_hours`` with an autoscaler or a price, ``cost_usd`` with a price
    (``--price``, ``--spot-discount``)."""
    cols = [("run", None), ("requests", "requests"), ("hits", "hits"), ("hit_rate", "hit_rate"),
            ("block_hit_rate", "block_hit_rate"), ("prefix_hit_rate", "prefix_hit_rate"),
            ("ideal", "ideal_block_hit_rate"),
            ("pred_error", "prediction_error"), ("evicted", "evicted_blocks"),
            ("imbalance", "load_imbalance"), ("ttft_p50_ms", "ttft_ms.p50"), ("ttft_p99_ms", "ttft_ms.p99"),
            ("tpot_p50_ms", "tpot_ms.p50"), ("tpot_p99_ms", "tpot_ms.p99"), ("goodput", "goodput"), ("shed", "shed"),
            ("held", "held"), ("tok_s_gpu", "output_tokens_per_s_per_gpu"), ("gpu_hours", "gpu_hours"), ("cost_usd", "cost_usd"), ("xfer_p50_ms", "transfer_ms.p50"),
            ("xfer_p99_ms", "transfer_ms.p99"), ("dwait_p99_ms", "decode_wait_ms.p99"), ("preempted", "preemptions"),
            ("gpu_hit_blocks", "gpu_hit_blocks"), ("cpu_hit_blocks", "cpu_hit_blocks"), ("pcie_gb", "pcie_gb")]

    if any("mean_acceptance_length" in r for r in results.values()):
        at = cols.index(("tpot_p99_ms", "tpot_ms.p99")) + 1
        cols[at:at] = [("accept_len", "mean_acceptance_length")]

    def get(r, path):
        if path == "pcie_gb":
            return None if "pcie_bytes" not in r else round(r["pcie_bytes"] / 1e9, 1)
        for part in path.split("."):
            if not isinstance(r, dict) or part not in r:
                return None
            r = r[part]
        return r

    # a column shows when some run has its key (a distribution with no sample, null, shows as "-")
    present = [c for c in cols if c[1] is None or any(get(r, c[1]) is not None or c[1].split(".")[0] in r
                                                      for r in results.values())]
    rows = [[c[0] for c in present]]
    for key, r in results.items():
        rows.append([key] + ["-" if get(r, f) is None else str(get(r, f)) for _, f in present[1:]])
    widths = [max(len(row[j]) for row in rows) for j in range(len(present))]
    lines = ["  ".join(cell.ljust(widths[j]) if j == 0 else cell.rjust(widths[j]) for j, cell in enumerate(row))
             for row in rows]
    return "\n".join(lines)


@main.command()
@compare_options
@pool_option
@common_flags("No progress bar per run on stderr (shown only when stderr is a terminal).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default=None,
              help="Output: an aligned table or the keyed JSON object [default: table on a terminal, else json].")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, callback=output_path,
              help="Write a bar chart of block hit rate per run (PNG); with --timing also the engines' prefix hit rate "
                   "and TTFT.")
@report_option
@click.pass_context
def compare(ctx, opt, latency_opt, all_metrics, timing, quiet, fmt, plot_path, report_path, pools, **options):
    """Run `sim` once per value of ONE option given as a comma list; print the runs keyed by value.

    Example: `dynlab compare --modes rr,random,kv` (the KV-aware router lab's modes.json) or
    `dynlab compare --mode kv-events --publish yes,no` (its events.json).
    """
    claim_inputs(ctx, [("--" + f.replace("_", "-"), f, v) for f in INPUT_FIELDS if options.get(f) is not None
                       for v in options[f].split(",")])  # --trace a.jsonl,b.jsonl: each a file it reads
    fixed, varied = _split_compared(ctx, options)
    base = SimConfig(**fixed, opts=parse_opts(opt), latency_opts=parse_opts(latency_opt, "--latency-opt"),
                     all_metrics=all_metrics, timing=timing, pools=tuple(pools))
    if varied is None:
        flag, field = "--mode", "mode"
        items, values = [base.mode], [base.mode]
    else:
        flag, field, items, values = varied
    configs = {item: replace(base, **{field: value}) for item, value in zip(items, values)}
    given = {f for f, text in options.items() if text is not None} | ({"all_metrics"} if all_metrics else set())
    given |= {"pools"} if pools else set()
    given |= {f for _, f, _ in SIM_FLAGS if fixed.get(f)}
    configs = _check_compared(configs, given, flag)
    if plot_path:
        from dynlab.cli.common import check_plot

        check_plot(plot_path)  # before the runs: a bad suffix or missing matplotlib fails now
    requests = None
    from dynlab.engine.spec import hash_lookahead_tokens

    lookahead = {hash_lookahead_tokens(c) for c in configs.values()}  # EAGLE's names differ with speculation on
    if base.trace is not None and len(lookahead) == 1 and field not in (
            "trace", "trace_format", "block", "hash", "trace_block", "tokenizer"):
        from dynlab.traces.reader import load_trace  # read once for every run (and stdin can only be read once)

        try:
            requests = load_trace(base.trace, base.trace_format, base.block, base.hash, base.trace_block,
                                  base.tokenizer, lookahead.pop(), base.keep_failed)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    elif base.trace == "-":  # each run reads the trace (names its blocks its own way): from one copy of stdin
        from dynlab.traces.reader import keep_stdin

        keep_stdin()
    _check_timed_runs(configs, requests)
    results, usage, warned = {}, {}, set()
    with progress_bar(len(configs), "compare", "run", quiet) as bar:  # each run adds its own bar below
        for item, config in configs.items():
            recorder = usage_recorder(config, report_path)
            results[item] = _run(config, quiet, requests, () if recorder is None else (recorder,), warned)
            if recorder is not None:
                usage[item] = recorder
            bar.update(1)
    if plot_path:
        _plot_compared(results, plot_path, field, flag, base)
    if report_path:
        from dynlab.report import Run
        write_run_report(ctx, report_path, [Run(k, r) for k, r in results.items()], list(configs.values()),
                         usage={k: rec.series() for k, rec in usage.items()})
    echo_table_or_json(results, fmt, _format_table)
    _warn_collapse(results)


def _warn_collapse(results: dict) -> None:
    """One stderr line when a run (timed or count-based) collapsed onto one worker (:mod:`dynlab.collapse`)."""
    from dynlab.collapse import collapse_warning

    message = collapse_warning(results)
    if message:
        click.echo(f"Warning: {message}", err=True)


def _split_compared(ctx, options: dict) -> tuple:
    """``(fixed, varied)`` of compare's options: ``fixed`` field -> the one value given (flags set
    included), ``varied`` ``(flag, field, items as written, values)`` of the one option given as a comma
    list, or ``None``. Raises ``click.UsageError`` when two options list values, a value is bad or
    repeated."""
    by_field = {field: (flags, ptype) for flags, field, ptype, _, _ in SIM_OPTIONS}
    fixed: dict = {field: True for _, field, _ in SIM_FLAGS if options.pop(field)}
    varied = None
    for field, text in options.items():
        if text is None:
            continue
        flags, ptype = by_field[field]
        flag = flags[0]
        items = [text] if field in OWN_COMMAS else split_list(text, flag)
        try:
            values = [ptype.convert(v, None, ctx) for v in items]
        except click.BadParameter as exc:
            exc.param_hint = " / ".join(f"'{f}'" for f in flags)  # as click names it for sim
            raise
        refuse_repeats(items, values, flag)
        if len(items) > 1:
            if varied is not None:
                raise click.UsageError(f"only one option may vary per call: {varied[0]} and {flag} both list values")
            varied = (flag, field, items, values)
        else:
            fixed[field] = values[0]
    return fixed, varied


def _check_compared(configs: dict, given: set, flag: str) -> dict:
    """Every run's config, aligned (``align_split``) and checked before the first runs: an option a compared
    strategy lacks (--opt), or one that has no effect, is refused for all alike, as sweep refuses it for
    its cells. Returns item -> aligned config; raises ``click.UsageError``."""
    from dynlab.engine.option_rules import align_split

    try:
        aligned = align_split(list(configs.values()), given)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    configs = {item: c for item, (c, _) in zip(configs, aligned)}
    for (item, config), (_, run_given) in zip(configs.items(), aligned):
        check_options(config, run_given)
        try:
            build_strategy(config, random.Random(0))
        except ValueError as exc:
            raise click.UsageError(f"{flag} {item}: {exc}") from None
    return configs


def _check_timed_runs(configs: dict, requests) -> None:
    """Refuse, before any run, the values a timed run refuses (a model that does not fit, --pcie-gbps, ...)."""
    from dynlab.engine.serving import check_timed

    for config in configs.values():
        if config.timing:
            try:
                check_timed(config.resolved(), requests)
            except (ValueError, plugins.UnknownNameError) as exc:
                raise click.UsageError(str(exc)) from None


def _plot_compared(results: dict, plot_path: str, field: str, flag: str, base: SimConfig) -> None:
    """Compare's chart: the P/D split's TTFT/TPOT chart for --split, else block hit rate per run."""
    if field == "split":
        from dynlab.disagg.plot import plot_split

        plot_split(results, plot_path, title=f"varying --split ({base.trace or 'synthetic workload'})")
    else:
        from dynlab.plots import plot_compare

        plot_compare(results, plot_path, title=f"varying {flag}")
