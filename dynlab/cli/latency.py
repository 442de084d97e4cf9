"""``dynlab latency``: a latency model's step times on a fixed grid; parse, call the library, print."""
from __future__ import annotations

import click

from dynlab.cli import main
from dynlab.cli.common import echo_json, echo_table_or_json, output_format, output_path, parse_opts, split_list
from dynlab.latency import grid as lib
from dynlab.latency import hardware as hw


def _table(grid: dict) -> str:
    names = list(grid["latency_models"])
    rows = [["step"] + [f"{n} ms" for n in names]]
    first = grid["latency_models"][names[0]]
    for tokens in first["prefill_ms"]:
        rows.append([f"prefill {int(tokens):,} tokens"] +
                    [f"{grid['latency_models'][n]['prefill_ms'][tokens]:.2f}" for n in names])
    for ctx, by_batch in first["decode_ms"].items():
        for batch in by_batch:
            rows.append([f"decode {int(batch)} x context {int(ctx):,}"] +
                        [f"{grid['latency_models'][n]['decode_ms'][ctx][batch]:.2f}" for n in names])
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    head = f"{grid['model']} on {grid['tp']} x {grid['gpu']}" + (f" ({grid['engine']})" if "engine" in grid else "")
    return "\n".join([head] + ["  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j])
                                         for j, c in enumerate(r)) for r in rows] + _terms(grid))


def _terms(grid: dict) -> list:
    """The lines naming the server terms in the step times and the run's per-request terms outside them."""
    lines = []
    for name, row in grid["latency_models"].items():
        t = row.get("server_terms")
        if t:
            graphs = _graphs(t)
            lines.append(f"{name} includes server CPU {t['cpu_step_us']:.3g} us per step + "
                         f"{t['cpu_us_per_request']:.3g} us per request" + (f"; {graphs}" if graphs else ""))
    c = grid["client_terms"]
    front = f"--latency-profile {grid['latency_profile']}" if "latency_profile" in grid else "--request-overhead-ms"
    lines.append(f"not in a step (a run's defaults): front end {c['request_overhead_ms']:.2f} ms per request "
                 f"({front}), detokenisation {c['detok_us_per_token']:.3g} us per output token "
                 "(--detok-us-per-token)")
    return lines


def _graphs(t: dict) -> str:
    """The CUDA-graph padding of a model's ``server_terms`` in words (``""`` for a model without it)."""
    if "cuda_graph_max" not in t:
        return ""
    if t.get("cuda_graphs", "vllm") == "vllm":
        return (f"steps of <= {t['cuda_graph_max']} tokens padded to a CUDA-graph size" if t["cuda_graph_max"]
                else "no CUDA-graph padding")
    decode = (f"decode passes of <= {t['cuda_graph_max']} requests" if t["cuda_graph_max"]
              else "no decode pass")
    prefill = (f"prefill passes of <= {t['cuda_graph_prefill_max']:,} tokens" if t.get("cuda_graph_prefill_max")
               else "no prefill pass")
    return f"{decode} and {prefill} padded to SGLang's CUDA-graph sizes"


def _gpu_table() -> str:
    rows = [["gpu", "memory_gb", "bf16_tflops", "fp8_tflops", "fp4_tflops", "hbm_gbps", "link", "link_gbps", "source"]]
    for name, g in lib.gpu_table().items():
        rows.append([name] + [f"{g[k]:g}" for k in ("memory_gb", "bf16_tflops", "fp8_tflops", "fp4_tflops", "hbm_gbps")]
                    + [g["link"], f"{g['link_gbps']:g}", g["source"]])
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(widths[j]) for j, c in enumerate(r)).rstrip() for r in rows)


def _profiled(ctx: click.Context, path: str, opts: dict) -> tuple:
    """``([model], options, profile)`` of the profile at ``path``, refused as ``sim`` refuses it
    (:func:`dynlab.engine.arrival_options`, :func:`dynlab.latency.profile.apply_profile`): ``--latency-model``
    given beside it, or a ``--latency-opt`` it fits, is a usage error."""
    from click.core import ParameterSource

    from dynlab.latency.profile import read_profile

    if ctx.get_parameter_source("latency_models") != ParameterSource.DEFAULT:
        raise click.UsageError("--latency-model has no effect with --latency-profile "
                               "(the profile names its latency model)")
    profile = read_profile(path)
    fitted = sorted(set(opts) & set(profile["latency_opts"]))
    if fitted:
        raise click.UsageError(f"--latency-opt {fitted[0]}: --latency-profile {path} fits it")
    opts = {**{k: repr(float(v)) for k, v in profile["latency_opts"].items()}, **opts}
    return [profile["latency_model"]], opts, profile


def _with_profile(grid: dict, profile: dict, path: str, shape: tuple) -> dict:
    """``grid`` with the profile at ``path``: its front end (``request_overhead_ms``, the one its fit used) in
    ``client_terms``, the key ``latency_profile`` (the path), and in ``latency_domain`` what ``sim`` says of the
    profile on ``shape`` (model, GPU, tp, engine as given: :func:`dynlab.latency.profile.profile_domain`), after
    the latency model's own word as sim's result puts it."""
    from dynlab.latency.profile import profile_domain

    grid = {**grid, "client_terms": {**grid["client_terms"],
                                      "request_overhead_ms": float(profile.get("request_overhead_ms", 0.0))},
            "latency_profile": path}
    why = profile_domain(profile, path, *shape)
    if why:
        name = profile["latency_model"]
        own = grid.get("latency_domain", {}).get(name)
        grid["latency_domain"] = {**grid.get("latency_domain", {}), name: f"{own}; {why}" if own else why}
    return grid


@main.command("latency")
@click.option("--model", default=hw.DEFAULT_MODEL, show_default=True, metavar="NAME|PATH",
              help="A bundled model (see `dynlab models`), a Hugging Face config.json or a model "
                   "directory holding one.")
@click.option("--gpu", default=hw.DEFAULT_GPU, show_default=True,
              help="A catalogue GPU (see --list), or a GPU file (JSON; docs/latency.md).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="GPUs per worker (tensor parallel).")
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True,
              help="Expert-parallel GPUs (the routed experts divided among them; = --tp, or --tp x replicas "
                   "with --dp-attention).")
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True, help="Pipeline stages.")
@click.option("--dp-attention", is_flag=True, help="With --ep > --tp: --ep / --tp attention replicas (DeepSeek-style).")
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True,
              help="KV cache element type: the model's dtype, or one byte (fp8).")
@click.option("--latency-model", "latency_models", default=lib.DEFAULT_LATENCY_MODEL, show_default=True,
              metavar="NAME[,NAME...]", help="Registered latency model; a comma list compares them side by side.")
@click.option("--latency-opt", "latency_opts", multiple=True, metavar="NAME=VALUE",
              help="An option of the latency model(s) (repeatable), e.g. mfu=0.6.")
@click.option("--engine", default="vllm", show_default=True, metavar="NAME",
              help="The engine kind whose server terms the latency models default to (vllm, sglang: docs/latency.md).")
@click.option("--latency-profile", "profile_path", default=None, metavar="FILE",
              help="A calibration profile (dynlab calibrate): its latency model, fitted options and front end; "
                   "not with --latency-model; a warning when --model/--gpu/--tp/--engine are not its own.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default=None,
              help="Output: an aligned table or JSON [default: table on a terminal, else json].")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, callback=output_path,
              metavar="FILE.png",
              help="Also write step time against batch size (an image; the suffix sets its format, PNG without one).")
@click.option("--list", "list_gpus", is_flag=True, help="List the catalogue GPUs and latency models, and exit.")
@click.pass_context
def latency_cmd(ctx, model, gpu, tp, ep, pp, dp_attention, kv_cache_dtype, latency_models, latency_opts, engine, profile_path,
                fmt, plot_path, list_gpus):
    """Step times (ms) of one or more latency models on a fixed grid of steps.

    The grid: one prefill of 512, 2,048 and 8,192 tokens at context 0; 1, 16, 64 and 256 decodes,
    each at context 2,048 and 16,384. Example: `dynlab latency --latency-model roofline,linear`.
    """
    if list_gpus:
        given = [flag for flag, value, default in (
            ("--model", model, hw.DEFAULT_MODEL), ("--gpu", gpu, hw.DEFAULT_GPU), ("--tp", tp, 1),
            ("--ep", ep, 1), ("--pp", pp, 1), ("--dp-attention", dp_attention, False),
            ("--kv-cache-dtype", kv_cache_dtype, "auto"),
            ("--latency-model", latency_models, lib.DEFAULT_LATENCY_MODEL), ("--latency-opt", latency_opts, ()),
            ("--engine", engine, "vllm"),
            ("--plot", plot_path, None), ("--latency-profile", profile_path, None)) if value != default]
        if given:
            raise click.UsageError(f"--list cannot be combined with {', '.join(given)}")
        from dynlab import plugins

        entries = plugins.latency_models().entries()
        if output_format(fmt) == "json":
            echo_json({"gpus": lib.gpu_table(),
                       "latency_models": {e.name: {"description": e.description, "source": e.source,
                                                   "options": {o.name: o.default for o in e.cls.options}}
                                          for e in entries}})
        else:
            click.echo(_gpu_table())
            click.echo("")
            width = max(len(e.name) for e in entries)
            for e in entries:
                click.echo(f"{e.name.ljust(width)}  {e.description}  [{e.source}]")
        return
    names = split_list(latency_models, "'--latency-model'")
    opts = parse_opts(latency_opts, "'--latency-opt'")
    profile = None
    if profile_path is not None:
        names, opts, profile = _profiled(ctx, profile_path, opts)
    if plot_path:
        from dynlab.cli.common import check_plot

        check_plot(plot_path)  # before the work: a bad suffix or missing matplotlib fails now
    try:
        grid = lib.latency_grid(names, model=model, gpu=gpu, tp=tp, options=opts, ep=ep, pp=pp,
                                dp_attention=dp_attention, kv_cache_dtype=kv_cache_dtype, engine=engine)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if profile is not None:
        grid = _with_profile(grid, profile, profile_path, (model, gpu, tp, engine))
    for name, why in grid.get("latency_domain", {}).items():
        click.echo(f"Warning: latency model {name}: {why}", err=True)
    if plot_path:
        from dynlab.latency.plot import plot_latency_grid

        plot_latency_grid(grid, plot_path)
    echo_table_or_json(grid, fmt, _table)
