"""``dynlab report`` (runs already made -> one HTML file) and the ``--report FILE.html`` option that
``sim``, ``compare``, ``sweep`` and ``plan`` share. Thin: the page is :func:`dynlab.report.build_report`'s."""
from __future__ import annotations

import os
import shlex

import click
from click.core import ParameterSource

from dynlab.cli import main
from dynlab.cli.common import output_path, stream_output_path

SUFFIXES = (".html", ".htm")


def _html_path(ctx, param, value):
    """click callback: an ``.html`` file to write (its directory writable); ``-`` (stdout) only for ``report``."""
    if value is None:
        return value
    if value == "-" and param.name == "report_path":
        raise click.BadParameter("- is not accepted: standard output carries the run's JSON; name a file",
                                 ctx, param)
    if value != "-" and not value.lower().endswith(SUFFIXES):
        raise click.BadParameter(f"{value}: a report is HTML; name a .html file", ctx, param)
    if value == "-":  # `dynlab report --out -`: the HTML on stdout, a stream
        return stream_output_path(ctx, param, value)
    return output_path(ctx, param, value)


def report_option(fn):
    """``--report FILE.html``: also write the run's self-contained HTML report."""
    return click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
                        callback=_html_path, metavar="FILE.html",
                        help="Also write a self-contained HTML report of the run(s): configuration, headline "
                             "table and figures (see docs/report.md).")(fn)


def timeline_options(fn):
    """``--timeline FILE.json`` and ``--timeline-max-requests N`` (``sim --timing``: docs/report.md)."""
    fn = click.option("--timeline-max-requests", "timeline_max_requests", type=click.IntRange(min=1),
                      default=1000, show_default=True, metavar="N",
                      help="With --timeline: keep the first N requests by arrival (and the steps and KV events "
                           "up to the last one's end), so a long trace does not write gigabytes.")(fn)
    return click.option("--timeline", "timeline", type=click.Path(dir_okay=False), default=None,
                        callback=output_path, metavar="FILE.json",
                        help="With --timing: also write the run's timeline as Chrome trace-event JSON (a track "
                             "per worker with its steps and KV events, a span per request), for Perfetto's UI "
                             "(see docs/report.md).")(fn)


def command_line(ctx) -> str:
    """The command as given: ``dynlab NAME`` and the options not left at their default, for the question."""
    words = ["dynlab", ctx.info_name]
    for p in ctx.command.params:
        source = ctx.get_parameter_source(p.name)
        if source in (ParameterSource.DEFAULT, None) or p.name in ("report_path", "timeline"):
            continue
        value = ctx.params.get(p.name)
        flag = p.opts[0] if isinstance(p, click.Option) else None
        for v in (value if isinstance(value, (tuple, list)) else [value]):
            if isinstance(p, click.Option) and p.is_flag:
                words.append(flag)
            elif flag:
                words += [flag, str(v)]
            else:
                words.append(str(v))
    return shlex.join(words)


def run_context(ctx, configs) -> dict:
    """What the run JSON does not say, from the runs' configurations: the command, the trace, the arrivals."""
    def joined(values):
        return ", ".join(dict.fromkeys(str(v) for v in values))

    from dynlab.engine.config import POISSON_RATE

    def source(c):
        if c.trace:
            return c.trace
        return f"the workload spec {c.workload}" if c.workload else "the KV-aware router lab's synthetic workload"

    def arrivals(c):
        if c.trace or c.workload:
            shown = "the trace's timestamps" if c.trace else "the spec's arrival process"
            return shown + (f", rescaled to {c.rate} requests/s" if c.rate else "") + \
                (f" x {c.rate_scale} in rate" if c.rate_scale else "") + \
                (f" x {c.time_scale} in time" if c.time_scale != 1.0 else "")
        return f"Poisson, {c.rate or POISSON_RATE} requests/s"

    timed = [c for c in configs if c.timing]
    context = {"command": command_line(ctx), "trace": joined(source(c) for c in configs)}
    if timed:
        context["arrivals"] = joined(arrivals(c) for c in timed)
    else:
        context["arrivals"] = "none: a count-based replay (no time; add --timing to serve in time)"
    return context


def usage_recorder(config, report_path):
    """A :class:`dynlab.sim.recorders.UsageRecorder` for a timed run with ``--report`` (its KV usage and load
    over time), else ``None``."""
    if not (report_path and config.timing):
        return None
    from dynlab.sim.recorders import UsageRecorder

    return UsageRecorder()


def write_run_report(ctx, path: str, runs, configs, extra: dict | None = None, records=None, title=None,
                     sections=(), extra_figures=(), usage=None) -> None:
    """Write the report of ``runs`` (:class:`dynlab.report.Run`) made from ``configs`` to ``path``;
    ``records``: label -> the run's per-request records, when the command has them (``--requests-out``);
    ``usage``: label -> its KV usage series (:func:`usage_recorder`);
    ``sections``, ``extra_figures``: the command's own (:func:`dynlab.report.build_report`)."""
    from dynlab.report import write_report

    write_report(path, runs, records, context={**run_context(ctx, configs), **(extra or {})}, title=title,
                 sections=sections, extra_figures=extra_figures, usage=usage or None)


def _records_option(ctx, param, values):
    """``[LABEL=]FILE`` items -> ``[(label, path)]``; the label defaults to the file's name without suffix."""
    out = []
    for item in values:
        label, sep, path = item.rpartition("=")
        if not sep:
            label, path = os.path.splitext(os.path.basename(item))[0], item
        if not path:
            raise click.BadParameter(f"{item!r}: expected [LABEL=]FILE", ctx, param)
        if label in {lb for lb, _ in out}:
            raise click.BadParameter(f"label {label!r} is given twice", ctx, param)
        out.append((label, path))
    return out


@main.command()
@click.argument("runs", nargs=-1, required=True, metavar="RUN.json...")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), callback=_html_path,
              metavar="FILE.html", help="The HTML file to write (- for standard output).")
@click.option("--requests", "records", multiple=True, callback=_records_option, metavar="[LABEL=]R.jsonl",
              help="Per-request records of a run (sim --requests-out), for TTFT/TPOT CDFs, per-worker load over "
                   "time and the P/D transfer timeline; repeatable [LABEL: the file's name].")
@click.option("--title", default=None, help="The report's title [default: the runs' labels].")
def report(runs, out, records, title):
    """Write one self-contained HTML report of runs already made.

    RUN.json: what `dynlab sim` or `dynlab compare --format json` printed, or a `dynlab sweep` results
    file (JSON lines). The page loads nothing from the network: open it anywhere, or mail it.
    """
    from dynlab.report import build_report, read_records, read_runs
    from dynlab.cli.common import write_atomic

    loaded = [run for path in runs for run in read_runs(path)]
    recs = {label: read_records(path) for label, path in records}
    page = build_report(loaded, recs or None, title=title)
    write_atomic(out, page)
    if out != "-":
        n = page.count("<figure ")
        click.echo(f"report: {len(loaded)} run{'s' if len(loaded) != 1 else ''}, {n} figure{'s' if n != 1 else ''} "
                   f"into {out}", err=True)
