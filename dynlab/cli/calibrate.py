"""``dynlab calibrate``: fit a latency model to benchmark result files; parse, call the library, print."""
from __future__ import annotations

import json
import os

import click

from dynlab.cli import main
from dynlab.cli.common import (echo_table_or_json, json_text, output_path, parse_opts, progress_bar, split_list,
                               write_atomic)
from dynlab.cli.sim_options import click_type
from dynlab.engine.options import BY_NAME

_SHORT = {"median_ttft_ms": "TTFT p50", "p99_ttft_ms": "TTFT p99", "median_tpot_ms": "TPOT p50",
          "p99_tpot_ms": "TPOT p99", "median_e2el_ms": "E2E p50", "total_token_throughput_per_gpu": "tok/s/GPU"}


def _sim_type(field: str) -> click.ParamType:
    """The click type of sim's option ``field`` (its range declared once, :data:`dynlab.engine.options.OPTIONS`):
    the server's flags calibrate takes are refused as ``dynlab sim`` refuses them."""
    return click_type(BY_NAME[field])


def _pct(value) -> str:
    if value is None:
        return "-"
    return f"{0.0 if abs(value) < 0.05 else value:+.1f}%"


def _where(source: str) -> str:
    """A point's FILE[:LINE] with the file's directory left out (the table's first column)."""
    return source.replace("\\", "/").rsplit("/", 1)[-1]


def _shown(path: str) -> str:
    """A profile's model or GPU as the table shows it: a stored absolute path (:func:`dynlab.latency.profile.stored_path`)
    relative to the current directory when inside it, as the user typed it; anything else as it is."""
    if not os.path.isabs(path):
        return path
    rel = os.path.relpath(path)
    return path if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def _table(profile: dict, on_bound: dict) -> str:
    """One row per point and measured metric: its error before the fit, after it and held out (cv); the fit;
    its cross-validated error; a line per option the fit left on a bound (``on_bound``: name -> bound)."""
    stages = ["before", "after"] + (["cv"] if profile["folds"] else [])
    rows = [["point", "metric", "measured"] + stages]
    for p in profile["points"]:
        for m in (m for m in _SHORT if m in p["measured"]):
            rows.append([_where(p["source"]), _SHORT[m], f"{p['measured'][m]:,.1f}"]
                        + [_pct(p["error_pct"][s].get(m)) for s in stages])
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(widths[j]) if j < 2 else c.rjust(widths[j]) for j, c in enumerate(r)) for r in rows]
    opts = ", ".join(f"{k}={v:g}" for k, v in profile["latency_opts"].items())
    opts += f", request_overhead_ms={profile['request_overhead_ms']:g}"
    lines.append(f"fitted {profile['latency_model']} on {_shown(profile['model'])}, {profile['tp']} x "
                 f"{_shown(profile['gpu'])}: {opts}")
    if profile["folds"]:
        cv = ", ".join(f"{_SHORT[m]} {v:.1f}%" for m, v in profile["cv_error_pct"].items())
        lines.append(f"{profile['folds']}-fold cross-validated median |error|: {cv}")
    else:
        lines.append("no cross-validation: it needs 3 points or more")
    lines += [f"{name} ended on its bound {bound:g}: the model cannot explain these measurements with it inside its "
              "range (a fit not to trust: measure more points, or fit fewer options)" for name, bound in on_bound.items()]
    return "\n".join(lines)


@main.command("calibrate")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "file_format", type=click.Choice(["vllm-bench", "aiperf", "guidellm", "points"]),
              default=None, help="The files' format [default: detected from each file].")
@click.option("--model", default=None, metavar="NAME|PATH",
              help="The model [default: the one each file names, when dynlab bundles it]; given, it replaces "
                   "the files' (needed where a file names none or one dynlab does not bundle).")
@click.option("--gpu", default=None, help="The GPU [default: the one each file names]; given, it replaces the files'. "
                                         "Any case, as a file's (H100 is h100).")
@click.option("--tp", type=click.IntRange(min=1), default=None,
              help="GPUs per server (tensor parallel) [default: the one each file states, else 1]; given, it replaces "
                   "the files' (and divides their throughput per GPU).")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="The client's concurrent users, where a file states neither them nor a request rate.")
@click.option("--engine", "engine_kind", type=click.Choice(["vllm", "sglang"], case_sensitive=False), default=None,
              help="The measured server's engine, whose scheduler replays the points [default: the one the "
                   "files state, else vllm]; a file stating another is refused. Any case, as a file's "
                   "(SGLang is sglang).")
@click.option("--max-num-seqs", type=_sim_type("max_num_seqs"), default=None,
              help="The measured server's running requests per engine at most (vLLM's) [default: 256].")
@click.option("--max-num-batched-tokens", type=_sim_type("max_num_batched_tokens"), default=None,
              help="The measured server's token budget of one engine step (vLLM's) [default: 8192].")
@click.option("--max-running-requests", type=_sim_type("max_running_requests"), default=None,
              help="The measured server's running requests at most (SGLang's) [default: SGLang's, from memory].")
@click.option("--chunked-prefill-size", type=_sim_type("chunked_prefill_size"), default=None,
              help="The measured server's prefill chunk in tokens (SGLang's; -1: none) [default: SGLang's].")
@click.option("--max-prefill-tokens", type=_sim_type("max_prefill_tokens"), default=None,
              help="The measured server's tokens of one prefill pass at most (SGLang's) [default: 16384, SGLang's].")
@click.option("--mem-fraction-static", type=_sim_type("mem_fraction_static"), default=None,
              help="The measured server's share of GPU memory for weights and KV (SGLang's); sizes the replay's KV "
                   "pool [default: as sim, docs/engine.md].")
@click.option("--disable-radix-cache", is_flag=True,
              help="The measured server's (SGLang's): refused, it changes no replay (the replayed prompts share no "
                   "prefix, so the radix cache never matches one).")
@click.option("--latency-model", type=_sim_type("latency_model"), default="linear", show_default=True,
              help="The latency model to fit (linear or roofline, or any with --fit).")
@click.option("--latency-opt", "latency_opts", multiple=True, metavar="NAME=VALUE",
              help="A starting or fixed option of the latency model (repeatable).")
@click.option("--fit", "fit", default=None, metavar="NAME[,NAME...]",
              help="The options to fit [default: beta0,beta1,beta2 for linear, mfu,mbu,overhead_ms for roofline, "
                   "each with request_overhead_ms, the server's front end per request].")
@click.option("--folds", type=click.IntRange(min=2), default=5, show_default=True,
              help="k of the k-fold cross-validation (at most one fold per point).")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None, callback=output_path, metavar="FILE",
              help="Write the calibration profile (JSON) here, for --latency-profile.")
@click.option("--output-format", "fmt", type=click.Choice(["table", "json"]), default=None,
              help="Output: an aligned table or the profile as JSON [default: table on a terminal, else json].")
def calibrate_cmd(files, file_format, model, gpu, tp, concurrency, engine_kind, max_num_seqs, max_num_batched_tokens,
                  max_running_requests, chunked_prefill_size, max_prefill_tokens, mem_fraction_static,
                  disable_radix_cache, latency_model, latency_opts, fit, folds, out, fmt):
    """Fit a latency model to measured benchmark runs; print the error per point before and after.

    FILES: `vllm bench serve --save-result` JSON, aiperf's profile_export.jsonl or its summary JSON,
    guidellm's benchmarks JSON, or a points CSV/JSON (docs/calibrate.md). Each measured point is
    replayed as its client drove the server (fixed concurrency or a Poisson rate) and the latency
    model's options are fitted with scipy's least_squares; the error quoted is k-fold cross-validated.
    A bar on stderr counts the replays done and names the fit or fold (on a terminal only).
    Example: `dynlab calibrate result.json --model llama-3.1-8b --gpu h100 --out profile.json`.
    """
    from dynlab.calibrate.files import calibrate_files
    from dynlab.calibrate.fit import CalibrationError

    names = split_list(fit, "'--fit'") if fit is not None else None
    engine = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
              "max_running_requests": max_running_requests, "chunked_prefill_size": chunked_prefill_size,
              "max_prefill_tokens": max_prefill_tokens, "mem_fraction_static": mem_fraction_static,
              "disable_radix_cache": disable_radix_cache or None}  # None: not given
    try:
        with progress_bar(None, "calibrate", "replay") as bar:
            def progress(stage: str) -> None:  # one replay done in stage ("fit", "fold 2/5")
                bar.set_postfix_str(stage, refresh=False)
                bar.update(1)

            profile, _ = calibrate_files(files, file_format, model, gpu, tp, latency_model,
                                         parse_opts(latency_opts, "--latency-opt"), names, folds,
                                         concurrency, engine, engine_kind, progress=progress)
    except CalibrationError as exc:  # the options cannot calibrate these files (--fit, --model, --engine...)
        raise click.UsageError(str(exc)) from None
    except ValueError as exc:  # a point that cannot be replayed, a bad option value
        raise click.ClickException(str(exc)) from None
    if out:
        json_text(profile)  # refuses a non-finite figure before writing
        write_atomic(out, json.dumps(profile, indent=2) + "\n")
    echo_table_or_json(profile, fmt, lambda p: _table(p, p["on_bound"]))
