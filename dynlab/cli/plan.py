"""``dynlab plan``: the fewest GPUs, per candidate shape, that meet the SLOs for a trace (thin: parse, call
:func:`dynlab.plan.plan`, print)."""
from __future__ import annotations

import os
import re
import time
from dataclasses import replace

import click

from dynlab.cli import main
from dynlab.cli.report import report_option
from dynlab.cli.common import (INPUT_FIELDS, check_plot, echo_json, input_path, output_format, output_path,
                               parse_opts, progress_bar)
from dynlab.cli.plan_prices import plan_prices
from dynlab.cli.plan_shapes import BY_FIELD, CANDIDATES, candidates, check_shapes
from dynlab.cli.routing import given_fields
from dynlab.cli.sim_options import FiniteFloat
from dynlab.engine.class_metrics import parse_class_slos
from dynlab.engine.config import SimConfig
from dynlab.plan import DEFAULT_CAP, PERCENTILES, Target
from dynlab.plan.mix import refusal as _mix_refusal
from dynlab.sweep import EXECUTORS

#: exit status of a plan in which no shape meets the target (its outputs are written all the same)
INFEASIBLE = 3
#: sim options plan takes as they are (one value for every replay), with sim's meaning
SHARED = ("trace", "workload", "trace_format", "tokenizer", "block", "hash", "trace_block", "capacity",
          "max_num_batched_tokens", "max_num_seqs", "latency_model", "latency_profile", "request_overhead_ms",
          "detok_us_per_token",
          "concurrency", "think_time_ms", "num_requests", "warmup",
          "gpu_memory_utilization",
          "publish",
          "event_delay_ms", "event_loss", "routers", "router_assign", "pcie_gbps", "cpu_write", "admission", "queue_policy", "admission_policy", "seed",
          "slo_ttft_ms",
          "slo_tpot_ms", "slo_classes", "spec_method", "spec_acceptance", "spec_draws", "decode_router", "link_gbps",
          "link_latency_ms", "max_running_requests", "chunked_prefill_size", "max_prefill_tokens", "schedule_policy",
          "page_size", "mem_fraction_static", "schedule_conservativeness", "init_new_token_ratio",
          "new_token_ratio_decay_steps")
#: sim's on/off flags plan takes as they are (the P/D fleet's, the engine's async scheduling, SGLang's)
FLAGS = ("overlap_transfer", "decode_prefix_cache", "async_scheduling", "dp_attention", "disable_radix_cache",
         "enable_mixed_chunk")


def _help(text: str, own_default: bool = False) -> str:
    """sim's help of an option as plan shows it: every replay is timed; ``own_default``: sim's default
    left out (plan shows its own)."""
    # sim's "With --timing: X" / "With --timing and a CPU tier: X": every replay is timed
    text = re.sub(r"With --timing(?: and ([^:]+))?: ", lambda m: f"With {m.group(1)}: " if m.group(1) else "", text)
    if own_default:
        text = re.sub(r"\s*\[default: [^]]*\]", "", text)
    return text[:1].upper() + text[1:]


#: plan's own wording where sim's would mislead (every replay is timed)
_HELP = {"pcie_gbps": "With a CPU tier: GB/s per direction between host and each GPU (PCIe Gen4 x16 in practice).",
         "capacity": "KV blocks per worker (at least 1) [default: derived from the GPU memory and "
                     "--gpu-memory-utilization].",
         "spec_tokens": "With --spec-method: draft tokens K per decode step (vLLM's num_speculative_tokens; 0: off; "
                        "plan --spec-tokens 0,2,4 sizes the fleet for each K, 0 without speculation, the baseline; "
                        "below --max-num-batched-tokens, as vLLM requires, and at most 10,000,000, see "
                        "docs/limits.md).",
         "slo_classes": "SLOs of request classes (a trace's field `class`, a workload spec's classes), "
                        "CLASS:ttft_ms=X,tpot_ms=Y, several apart by ';': a shape meets the target only when each "
                        "class given meets its own at --slo-percentile (or its class goodput is at least --goodput), "
                        "besides --slo-ttft-ms/--slo-tpot-ms if given; the class that binds is named (see "
                        "docs/plan.md#per-class-slos-which-class-binds)."}


#: plan's own type where sim's admits a value every replay would refuse (an engine needs one block at least)
_TYPES = {"capacity": click.IntRange(min=1)}


def _shared_options(fn):
    from dynlab.cli.sim_options import SIM_FLAGS

    for flag, field, help_ in reversed([f for f in SIM_FLAGS if f[1] in FLAGS]):
        fn = click.option(flag, field, is_flag=True, help=_help(help_))(fn)
    fn = click.option("--split", "split", type=click.STRING, default="agg", show_default=True,
                      metavar="agg|auto[,...]",
                      help="Aggregated workers (agg), or a P/D fleet (auto): the fewest total workers and their "
                           "prefill:decode split are searched (see docs/plan.md). A comma list: one candidate each.")(fn)
    for field in reversed(SHARED):
        flags, ptype, default, help_ = BY_FIELD[field]
        help_ = _HELP.get(field) or _help(help_)
        ptype = _TYPES.get(field, ptype)
        fn = click.option(*flags, field, type=ptype, default=default, show_default=default is not None,
                          help=help_, callback=input_path if field in INPUT_FIELDS else None)(fn)
    for field in reversed(CANDIDATES):
        flags, ptype, default, help_ = BY_FIELD[field]
        default = {"cpu_memory_gb": 0}.get(field, default)  # mode kv-cost, ep 1, spec-tokens 0: sim's
        fn = click.option(*flags, field, type=click.STRING, default=str(default),
                          show_default=True, metavar="V[,V...]",
                          help=(_HELP.get(field) or _help(help_, own_default=True))
                          + " A comma list: one candidate each.")(fn)
    return fn




def _refuse(executor, jobs, ray_address, log, resume, goodput, percentile_given, plot_path,
            report_path=None) -> None:
    if resume and not log:
        raise click.UsageError("--resume needs --log FILE")
    if ray_address and executor != "ray":
        raise click.UsageError("--ray-address has no effect without --executor ray")
    if jobs is not None and executor == "serial":
        raise click.UsageError("--jobs has no effect with --executor serial")
    if goodput is not None and percentile_given:
        raise click.UsageError("--slo-percentile has no effect with --goodput (the share of requests meeting "
                               "every SLO is the target)")
    paths = [os.path.realpath(p) for p in (log, plot_path, report_path) if p and p != "-"]
    if len(set(paths)) != len(paths):
        raise click.UsageError("--log, --plot and --report must name different files")


@main.command()
@_shared_options
@click.option("--rate", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Target mean arrival rate, requests/s: a timestamped trace's time is rescaled so its mean rate is "
                   "this; a trace without timestamps arrives as a Poisson process of this rate.")
@click.option("--rate-scale", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Arrivals this many times as fast as the trace's (2 = twice the rate).")
@click.option("--slo-percentile", type=click.Choice(PERCENTILES), default="p99", show_default=True,
              help="Percentile of TTFT and TPOT that must meet the SLOs.")
@click.option("--goodput", type=FiniteFloat(0.0, 1.0, min_open=True), default=None,
              help="Instead of a percentile: the share of all requests that must meet every SLO given (sim's goodput).")
@click.option("--price", "price", multiple=True, metavar="GPU=USD_PER_HOUR",
              help="Price of one GPU-hour, for the $/h column and ranking; repeatable, one per --gpu candidate.")
@click.option("--objective", type=click.Choice(["gpus", "cost"]), default="gpus", show_default=True,
              help="Rank the shapes meeting the target by fewest GPUs ($/h when --price prices every candidate), or "
                   "by cost: $/h at the bundled on-demand list prices (docs/cost.md) or --price's, reporting the "
                   "cheapest shape, its binding constraint and where each price came from.")
@click.option("--mix", is_flag=True, help="With --objective cost: also try fleets of two pools of the shapes (--pool "
              "GPU:tpN:COUNT twice) next to the answers, and report one cheaper than every shape (docs/plan.md#mixed-pools).")
@click.option("--max-workers", type=click.IntRange(min=1), default=DEFAULT_CAP, show_default=True,
              help="The most workers tried per shape.")
@click.option("--controller", "controller", default=None, metavar="NAME[:KEY=VALUE,...]",
              help="After sizing, replay each answered shape's traffic with this autoscaler (sim's --controller: "
                   "static, hpa:..., dynamo-load:..., dynamo-throughput:...), from its min (1) to max = the static "
                   "answer N (or --max-workers when given), and report static against autoscaled GPU-hours, $ "
                   "(--price, else the bundled table), goodput and whether it meets the target (docs/autoscaling.md).")
@click.option("--opt", "opt", multiple=True, metavar="NAME=VALUE", help="Strategy option; repeatable.")
@click.option("--latency-opt", "latency_opt", multiple=True, metavar="NAME=VALUE",
              help="Latency model option (see `dynlab latency --list`); repeatable.")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
              help="serial (this process), local (a process pool) or ray (dynlab[ray]).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Processes (local) or CPUs of the local Ray instance [default: the CPUs available].")
@click.option("--ray-address", default=None, metavar="ADDRESS", help="Run on this Ray cluster (host:port).")
@click.option("--log", type=click.Path(dir_okay=False), default=None, callback=output_path,
              help="Append every replay here as a JSON line ({\"cell\": sim options, \"result\": sim's JSON}).")
@click.option("--resume", is_flag=True, help="Reuse the replays already in --log; append the others.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default=None,
              help="Output [default: table on a terminal, else json].")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, callback=output_path,
              help="Write a Pareto plot: TTFT (TPOT without a TTFT SLO) at the percentile against GPUs ($/h with --price).")
@report_option
@click.option("--quiet", is_flag=True, help="No progress bar on stderr (shown only when stderr is a terminal).")
@click.pass_context
def plan(ctx, rate, rate_scale, slo_percentile, goodput, price, objective, mix, max_workers, controller, opt,
         latency_opt, executor, jobs, ray_address, log, resume, fmt, plot_path, report_path, quiet, **options):
    """The fewest workers (and GPUs) per candidate shape that meet the SLOs on a trace, searched by replay.

    Each shape (--model x --gpu x --tp x --ep x --modes x --engine x --cpu-memory-gb x --spec-tokens x --split) gets
    an analytic lower bound from the latency model, then replays bracket and bisect the worker count (and,
    with --split auto, the prefill:decode split); the answer N meets the target and N - 1 misses it. Each
    shape's binding constraint is said in words (queueing, prefill, memory, routing, compute). Exit 3: no
    shape meets the target (the outputs are written). Example:

    \b
      dynlab plan --trace mooncake-conversation --rate-scale 2 --slo-ttft-ms 2000 \\
        --slo-tpot-ms 50 --gpu h100,h200 --tp 1,2 --modes kv-cost,kv-events
    """
    from click.core import ParameterSource

    from dynlab.plan import plan as run_plan

    given = given_fields(ctx)
    _refuse(executor, jobs, ray_address, log, resume, goodput,
            ctx.get_parameter_source("slo_percentile") == ParameterSource.COMMANDLINE, plot_path, report_path)
    if (options["trace"] is None) == (options["workload"] is None):
        raise click.UsageError("give the traffic: --trace T or --workload SPEC (one of them)")
    shapes = candidates(ctx, options)
    if max_workers < 2 and any(s.pd for s in shapes):
        raise click.UsageError("--max-workers 1: a P/D candidate (--split auto) needs 2 workers at least")
    prices, sources = plan_prices(price, {s.gpu for s in shapes}, objective)
    target = _target(options, slo_percentile, goodput)
    base = SimConfig(**options, timing=True, opts=parse_opts(opt), latency_opts=parse_opts(latency_opt, "--latency-opt"))
    if mix and _mix_refusal(shapes, base, objective):
        raise click.UsageError(_mix_refusal(shapes, base, objective))
    if base.latency_profile is not None:  # a missing or bad profile fails now, not at the first replay
        from dynlab.latency.profile import read_profile

        read_profile(base.latency_profile)
    requests, checked = _load(base, rate, rate_scale)
    _usage(target.check_classes, requests)  # a class no request carries: before any replay
    check_shapes(shapes, checked, given - set(CANDIDATES) - {"split", "slo_ttft_ms", "slo_tpot_ms", "slo_classes"},
                  requests)
    cap = _controller_cap(ctx, controller, max_workers, shapes, checked, requests)
    if plot_path:
        check_plot(plot_path)
    started, fresh = time.perf_counter(), []
    with progress_bar(None, "plan", "replay", quiet) as bar:
        try:
            out = run_plan(requests, base, shapes, target, rate=rate, rate_scale=rate_scale, cap=max_workers,
                           prices=prices, price_sources=sources, executor=executor, jobs=jobs, ray_address=ray_address, log_path=log,
                           resume=resume, on_replay=lambda new: (bar.update(1), fresh.append(new)), mix=mix,
                           controller=controller, controller_max=cap)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    if not quiet:
        _summary(fresh, log, time.perf_counter() - started, executor)
    if report_path:  # written before the table is printed: no output that looks like success before an error
        _html_report(ctx, report_path, out, shapes, checked)
    _report(out, fmt, plot_path)
    if not any(s["meets"] for s in out["shapes"]):  # an answer, but not the one asked for: outputs written, exit 3
        click.echo(f"plan: no shape meets the target (exit {INFEASIBLE}); each shape's binding constraint says why",
                   err=True)
        ctx.exit(INFEASIBLE)



def _summary(fresh: list, log, seconds: float, executor) -> None:
    """The closing line on stderr: replays run (``fresh``: one bool per replay, False for one read from ``log``)."""
    where = f"; {fresh.count(False)} from {log}" if fresh.count(False) else ""
    click.echo(f"plan: {len(fresh)} replay{'' if len(fresh) == 1 else 's'} in {seconds:.1f} s ({executor}){where}",
               err=True)

def _controller_cap(ctx, controller, max_workers: int, shapes, base: SimConfig, requests):
    """--controller's ``max``: --max-workers when given, else ``None`` (each shape's answer N); the controller
    checked against every shape before any replay (:func:`dynlab.plan.autoscaled.check`)."""
    from click.core import ParameterSource

    cap = max_workers if ctx.get_parameter_source("max_workers") == ParameterSource.COMMANDLINE else None
    if controller is not None:
        from dynlab.plan.autoscaled import check

        _usage(check, controller, cap or max_workers, shapes, base, getattr(requests, "own_block_tokens", None))
    return cap


def _target(options: dict, percentile: str, goodput) -> Target:
    """The target of the SLO options (the run-wide ones, --slo's per class); usage errors in one line."""
    return _usage(Target, options["slo_ttft_ms"], options["slo_tpot_ms"], percentile, goodput,
                  _usage(parse_class_slos, options["slo_classes"]))


def _usage(fn, *args):
    """``fn(*args)``, a ``ValueError`` raised as a usage error (one line, exit 2)."""
    try:
        return fn(*args)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _html_report(ctx, path: str, out: dict, shapes, base: SimConfig) -> None:
    """The plan's HTML report: a run per answered shape (its replay at the answer N; when no shape meets
    the target, each shape's replay at the count its figures are taken at, labelled ``(misses)``), the
    ranked table and each shape's binding constraint, and the Pareto plot as a figure."""
    from dynlab.cli.report import write_run_report
    from dynlab.plan.report import pareto_figure, table
    from dynlab.report import Run
    from dynlab.report.figures import Figure, to_svg

    plan_out = {k: v for k, v in out.items() if k != "_results"}
    by_label = {s.label: s for s in shapes}
    answered = [s for s in out["shapes"] if s["meets"]]
    if not answered:  # an infeasible plan: each shape's replay at the count its figures are taken at
        answered = [s for s in out["shapes"] if s["shown_workers"] is not None]
    runs = [Run(f"{s['shape']} N={s['shown_workers']}{'' if s['meets'] else ' (misses)'}",
                out["_results"][s["shape"]][s["shown_workers"]]) for s in answered]
    if not runs:
        raise click.UsageError("--report: no shape was replayed, so there is nothing to report")
    top_k = max(s.spec_tokens for s in shapes)
    configs = [replace(by_label[s["shape"]].config(base, top_k), **({"split": s["split"]} if s["split"] else
                                                             {"workers": s["shown_workers"]})) for s in answered]
    extra = {"target": out["target"], **{f"binding, {s['shape']}": s["why"]
                                         for s in out["shapes"]}}
    fig = Figure("pareto", "Pareto plot: the replays against GPUs",
                 "Every replay's latency at the SLO percentile against GPUs ($/h with prices), a line per shape, "
                 "the SLO dashed, each answer starred and the answers' Pareto front in grey.",
                 to_svg(pareto_figure(out), "pareto"), ["shape", "workers", "gpus", "ttft_ms", "tpot_ms"],
                 [[s["shape"], s["shown_workers"], s["gpus"], s["ttft_ms"], s["tpot_ms"]] for s in answered])
    try:
        write_run_report(ctx, path, runs, configs, extra=extra, title=f"dynlab plan: {out['target']}",
                         sections=[("Plan", table(plan_out))], extra_figures=[fig])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _load(base: SimConfig, rate, rate_scale) -> tuple:
    """``(the loaded trace, base with the arrivals it will be replayed at)``; usage errors for a trace the
    options cannot read, an empty one, or arrival options it cannot take."""
    from dynlab.plan.rate import arrival_settings, served
    from dynlab.sweep.executors import cached_trace

    try:
        requests = cached_trace(base)  # a workload's too: generated once, named as sim names it (EAGLE's lookahead)
        if not requests:
            raise ValueError(f"{base.trace or base.workload}: the {'trace' if base.trace else 'workload'} has no request")
        time_scale, poisson = arrival_settings(requests, rate, rate_scale, base.concurrency)
        requests = served(requests, base.num_requests)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    return requests, replace(base, time_scale=time_scale, rate=poisson)


def _report(out: dict, fmt, plot_path) -> None:
    """Draw the plot (``plot_path``) and print the plan as a table or JSON."""
    from dynlab.plan.report import plot, table

    if plot_path:
        plot(out, plot_path)
    out.pop("_results")
    for shape in out["shapes"]:  # the latency model's own word on a shape outside its validated domain, once each
        if shape.get("latency_domain"):
            click.echo(f"Warning: {shape['shape']}: latency model outside its validated domain: "
                       f"{shape['latency_domain']}", err=True)
    if output_format(fmt) == "json":
        echo_json(out)
    else:
        click.echo(table(out))
