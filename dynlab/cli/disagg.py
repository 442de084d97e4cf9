"""``dynlab disagg``, ``dynlab models`` and ``dynlab summarize {disagg,offload}``: parse, call the library, print."""
from __future__ import annotations

import json
import math
import sys

import click

from dynlab.cli import main
from dynlab.cli.common import echo_json, refuse_repeats, split_list, stream_output_path, write_atomic
from dynlab.disagg import cost as lib
from dynlab.labs import summarize as summ


class _Number(click.ParamType):
    """A finite float, either > 0 (``positive``) or >= 0."""

    def __init__(self, positive: bool):
        self.positive = positive
        self.name = "positive number" if positive else "non-negative number"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < 0 or (self.positive and number == 0):
            self.fail(f"{value!r} is not a {self.name}", param, ctx)
        return number


POSITIVE = _Number(positive=True)
NON_NEGATIVE = _Number(positive=False)
SIZE = click.IntRange(min=1)


def _bandwidths(value: str) -> list[tuple[str, float]]:
    out = []
    for item in split_list(value, "--gbps"):
        try:
            out.append((item, POSITIVE.convert(item, None, None)))
        except click.BadParameter as exc:
            raise click.BadParameter(exc.message, param_hint="'--gbps'") from None
    refuse_repeats([k for k, _ in out], [v for _, v in out], "--gbps")
    return out


@main.command("disagg")
@click.option("--tokens", required=True, type=click.IntRange(min=0), help="Prompt tokens whose KV is moved.")
@click.option("--gbps", required=True, metavar="G[,G...]",
              help="Link bandwidth in GB/s (10^9 bytes/s); a comma list prints one record per value, keyed as written.")
@click.option("--model", type=click.Choice(lib.bundled_models()), help="A bundled model config (see `dynlab models`).")
@click.option("--model-config", type=click.Path(), metavar="PATH",
              help="A Hugging Face config.json, or a model directory holding one, to read the KV "
                   "shape from.")
@click.option("--layers", type=SIZE, help="Layers (default 28, Qwen3-0.6B).")
@click.option("--kv-heads", type=SIZE, help="KV heads (default 8, Qwen3-0.6B).")
@click.option("--head-dim", type=SIZE, help="Head size (default 128, Qwen3-0.6B).")
@click.option("--dtype-bytes", type=SIZE, help="Bytes per KV element (default 2, bfloat16); overrides a config's dtype.")
@click.option("--prefill-ms", type=POSITIVE, help="Prefill time in ms: adds ttft_disagg_ms.")
@click.option("--overhead-ms", type=NON_NEGATIVE, help="Other per-request time in ms, added to ttft_disagg_ms.")
@click.option("--saved-ms", type=POSITIVE, help="Time disaggregation saves per request, in ms: adds breakeven_gbps.")
def disagg_cmd(tokens, gbps, model, model_config, layers, kv_heads, head_dim, dtype_bytes,
               prefill_ms, overhead_ms, saved_ms):
    """KV bytes per token, and the time to move the KV of --tokens tokens at each --gbps.

    Prints {"bytes_per_token", "kv_mib", "transfer_ms"} (MiB = 2^20 bytes, ms, one decimal). The
    model is Qwen3-0.6B unless --model, --model-config or the shape options say otherwise. A model
    with sliding-window, chunked-local or state layers moves what stays resident (the global layers'
    tokens, each window, each state): the record adds kv_bytes and layer_groups.
    """
    links = _bandwidths(gbps)
    if model and model_config:
        raise click.UsageError("--model and --model-config cannot be used together")
    if overhead_ms is not None and prefill_ms is None:
        raise click.UsageError("--overhead-ms needs --prefill-ms")
    if model or model_config:
        given = [o for o, v in (("--layers", layers), ("--kv-heads", kv_heads), ("--head-dim", head_dim)) if v]
        if given:
            raise click.UsageError(f"{given[0]} cannot be combined with --model or --model-config "
                                   "(only --dtype-bytes overrides a config)")
        if model:
            kv_shape = lib.kv_shape_from_config(lib.load_model_config(model), dtype_bytes, source=model)
        else:
            path = lib.config_file(model_config)  # a directory's config.json
            kv_shape = lib.kv_shape_from_config(lib.read_model_config(path), dtype_bytes, source=path)
        bpt = kv_shape.bytes_per_token
    else:
        kv_shape = None
        shape = {k: v for k, v in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                                   ("dtype_bytes", dtype_bytes)) if v is not None}
        bpt = lib.kv_bytes_per_token(**shape)

    def record(g: float) -> dict:
        try:
            return lib.cost_report(tokens, bpt, g, prefill_ms=prefill_ms, overhead_ms=overhead_ms or 0.0,
                                   saved_ms=saved_ms, shape=kv_shape)
        except ValueError as exc:  # a result that overflows (a huge size, a tiny --gbps or --saved-ms)
            raise click.UsageError(str(exc)) from None

    if len(links) == 1:
        echo_json(record(links[0][1]))
    else:
        echo_json({key: record(g) for key, g in links})


@main.command("models")
def models_cmd():
    """List the bundled model configs with their KV shape and bytes per token."""
    echo_json(lib.model_table())


@main.group("summarize")
def summarize():
    """Summarize measured JSON-lines files (IN and OUT may be - for stdin/stdout)."""


_IN = click.argument("input", metavar="IN", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
_OUT = click.argument("output", metavar="OUT", type=click.Path(dir_okay=False, allow_dash=True),
                      callback=stream_output_path)


def _warn(message: str) -> None:
    click.echo(f"Warning: {message}", err=True)


def _run(path: str, output: str, summarize_lines) -> None:
    # The whole summary is built before OUT is touched, and OUT is replaced atomically.
    if path == "-":
        result = summarize_lines(sys.stdin.buffer, "<stdin>")
    else:
        with open(path, "rb") as fh:
            result = summarize_lines(fh, path)
    write_atomic(output, json.dumps(result) + "\n")


@summarize.command("disagg")
@_IN
@_OUT
def summarize_disagg_cmd(input, output):
    """Median TTFT per <input>x<conc> cell, agg vs disagg, and the ratio disagg/agg.

    \b
    Each line of IN is one JSON object, e.g.
      {"mode": "agg", "input": 1500, "conc": 4, "rep": 0, "ttft_p50_ms": 45.7}
    mode: agg or disagg; input: prompt tokens; conc: concurrency; rep: repetition;
    ttft_p50_ms: the run's median TTFT in ms. OUT holds {"<input>x<conc>": {"agg_ms",
    "disagg_ms", "ratio"}}; a cell with a TTFT of 0 ms also gets "zero_ttft_lines".
    """
    _run(input, output, lambda lines, name: summ.summarize_disagg(lines, name, warn=_warn))


@summarize.command("offload")
@_IN
@_OUT
@click.option("--base", default="baseline", show_default=True, help="Configuration in the ratio's numerator.")
@click.option("--cand", default="lmcache", show_default=True, help="Configuration in the ratio's denominator.")
def summarize_offload_cmd(input, output, base, cand):
    """TTFT count, median and mean per pass for two configurations, and the ratio base/cand.

    \b
    Each line of IN is one JSON object, e.g.
      {"config": "lmcache", "pass": "pass2-replay", "doc": 3, "doc_tokens": 4864, "ttft_ms": 47.5, "total_ms": 251.0}
    config: the configuration measured (--base, --cand); pass: the pass name; doc: the
    document; doc_tokens: its length; ttft_ms: time to first token and total_ms: the
    request's whole time, both in ms. OUT holds
    {base: {pass: {"n", "p50_ms", "mean_ms"}}, cand: {...}, "ratio": {pass: {"p50", "mean"}}};
    a pass entry with a TTFT of 0 ms also gets "zero_ttft_lines".
    """
    if base == cand:
        raise click.BadParameter(f"--base and --cand are both {base!r}", param_hint="'--cand'")
    for option, value in (("--base", base), ("--cand", cand)):
        if value == "ratio":
            raise click.BadParameter("'ratio' is the output's ratio key", param_hint=f"'{option}'")
    _run(input, output, lambda lines, name: summ.summarize_offload(lines, name, base, cand, warn=_warn))
