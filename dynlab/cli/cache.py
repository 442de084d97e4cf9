"""``dynlab scenario``, ``dynlab cliff`` and ``dynlab policies``: the document-cache lab (seed 002, steps 1-7).

Thin: parse and validate the options, call :mod:`dynlab.labs.scenario`, print one JSON object.
"""
from __future__ import annotations

import click

from dynlab.cli import main
from dynlab.cli.common import echo_json, progress_bar, refuse_repeats, split_list
from dynlab.limits import MAX_DOC_READS, check_doc_reads
from dynlab.labs.scenario import (DEFAULT_CPU, DEFAULT_DOCS, DEFAULT_GPU, DEFAULT_PASSES, DEFAULT_TOKENS, METRICS,
                                  PASS_ORDERS, cliff, run_scenario)


def _passes(ctx, param, value: str) -> list[str]:
    orders = split_list(value, "--passes")
    for order in orders:
        if order not in PASS_ORDERS:
            raise click.BadParameter(f"unknown pass order {order!r}; use {' or '.join(PASS_ORDERS)}")
    return orders


def _policy(ctx, param, value: str) -> type:
    from dynlab.plugins import UnknownNameError, eviction_policies

    try:
        return eviction_policies().get(value)
    except UnknownNameError as exc:
        raise click.BadParameter(str(exc)) from None


def _capacities(ctx, param, value: str) -> list[tuple[str, int]]:
    """``"21520,30000"`` -> ``[("21520", 21520), ("30000", 30000)]``: (as written, tokens)."""
    out = []
    for item in split_list(value, param.opts[0]):
        try:
            number = int(item)
        except ValueError:
            raise click.BadParameter(f"{item!r} is not a valid integer") from None
        if number < 0:
            raise click.BadParameter(f"{item} is negative; it must be >= 0")
        out.append((item, number))
    refuse_repeats([t for t, _ in out], [v for _, v in out], param.opts[0])
    return out


class NonNegativeInt(click.ParamType):
    """An integer >= 0 (a capacity in tokens); with ``zero`` set, >= 1 and ``zero`` says why 0 is refused."""

    name = "integer"

    def __init__(self, zero: str = ""):
        self.zero = zero

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a valid integer", param, ctx)
        if number < 0:
            self.fail(f"{number} is negative; it must be >= {1 if self.zero else 0}", param, ctx)
        if number == 0 and self.zero:
            self.fail(f"0: {self.zero}; it must be >= 1", param, ctx)
        return number


_TOKENS = NonNegativeInt()

_docs_option = click.option(
    "--docs", type=NonNegativeInt("a run of no documents reads nothing"), default=DEFAULT_DOCS, show_default=True,
    help=f"Documents 0..docs-1; docs x passes at most {MAX_DOC_READS:,} reads (see docs/limits.md)."
)
_tokens_option = click.option(
    "--tokens", type=NonNegativeInt("a document of 0 tokens has no KV to cache"), default=DEFAULT_TOKENS, show_default=True, help="KV tokens per document."
)
_passes_option = click.option(
    "--passes",
    default=",".join(DEFAULT_PASSES),
    show_default=True,
    callback=_passes,
    help="Comma-separated pass orders: fwd reads 0..docs-1, rev the reverse; one cache across all passes. "
         "A sequence, not a set: fwd,fwd reads forward twice.",
)
_policy_option = click.option(
    "--policy",
    default="lru",
    show_default=True,
    callback=_policy,
    help="Eviction policy of each tier (see `dynlab policies`); opt is the offline optimum.",
)


@main.command()
@click.option("--gpu", type=_TOKENS, default=DEFAULT_GPU, show_default=True, help="GPU KV capacity in tokens.")
@_docs_option
@_tokens_option
@_passes_option
@click.option(
    "--cpu", type=_TOKENS, default=DEFAULT_CPU, show_default=True, help="CPU KV capacity in tokens (0: no CPU tier)."
)
@_policy_option
def scenario(gpu, docs, tokens, passes, cpu, policy):
    """Re-read documents through a GPU (and optional CPU) KV cache; print hits per pass as JSON.

    Prints {"passes": [{"order", "gpu_hits", "cpu_hits", "misses", "hit_docs"}, ...]}.
    Defaults are the two-tier KV cache lab's (10 documents of 5011 tokens, a 21520-token GPU cache).
    """
    _check_reads(docs, passes)
    with progress_bar(docs * len(passes), "scenario", "read", unit_scale=True) as bar:
        result = run_scenario(gpu=gpu, docs=docs, tokens=tokens, passes=passes, cpu=cpu, policy=policy,
                              progress=bar)
    echo_json(result)


def _check_reads(docs: int, passes: list) -> None:
    """Usage error (exit 2) before any work when the runs would read more than the limit allows."""
    try:
        check_doc_reads(docs, passes)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@main.command("cliff")
@click.option(
    "--gpu",
    default=str(DEFAULT_GPU),
    show_default=True,
    callback=_capacities,
    help="GPU KV capacity in tokens, or a comma-separated list to sweep.",
)
@click.option(
    "--cpu",
    default=str(DEFAULT_CPU),
    show_default=True,
    callback=_capacities,
    help="CPU KV capacity in tokens, or a comma-separated list to sweep.",
)
@_docs_option
@_tokens_option
@_passes_option
@click.option(
    "--metric",
    type=click.Choice(METRICS),
    default="hits",
    show_default=True,
    help="What to report from the last pass (hits = gpu_hits + cpu_hits).",
)
@_policy_option
@click.pass_context
def cliff_command(ctx, gpu, cpu, docs, tokens, passes, metric, policy):
    """Sweep the GPU or CPU capacity; print {"capacity as written": value of the last pass}.

    The swept option is the one given a list of more than one value; when both have one value,
    --gpu is swept unless only --cpu was given.
    """
    if len(gpu) > 1 and len(cpu) > 1:
        raise click.UsageError("sweep one capacity at a time: give a list to --gpu or to --cpu, not both")
    if len(cpu) > 1:
        over = "cpu"
    elif len(gpu) > 1:
        over = "gpu"
    else:
        from click.core import ParameterSource

        given = {name: ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE for name in ("gpu", "cpu")}
        over = "cpu" if given["cpu"] and not given["gpu"] else "gpu"
    swept, fixed = (gpu, cpu) if over == "gpu" else (cpu, gpu)
    fixed_name = "cpu" if over == "gpu" else "gpu"
    _check_reads(docs, passes)
    with progress_bar(docs * len(passes) * len(swept), "cliff", "read", unit_scale=True) as bar:
        result = cliff(
            [value for _, value in swept],
            over=over,
            metric=metric,
            labels=[label for label, _ in swept],
            docs=docs,
            tokens=tokens,
            passes=passes,
            policy=policy,
            progress=bar,
            **{fixed_name: fixed[0][1]},
        )
    echo_json(result)
