"""Fit the roofline model's mfu, mbu and overhead_ms to aiconfigurator's vLLM step times; fit `linear` to roofline.

    python benchmarks/fit_roofline.py               # fit on benchmarks/data/aic_vllm_grid.json, print
    python benchmarks/fit_roofline.py --regenerate  # first rebuild that file (needs dynlab[aiconfigurator])

The grid (one row per model, GPU and tp): prefill of one request of 512/2,048/8,192 tokens with
nothing cached; 1/16/64/256 decodes each at context 2,048 and 16,384 (aiconfigurator-core's
``RustForwardPassPerfModel.from_native``, backend vLLM, the latest database it ships per GPU).
The roofline fit uses the h100 and h200 rows of every bundled model aiconfigurator knows;
it minimises prefill MAPE + decode MAPE by a coarse-to-fine grid search (no SciPy needed).
The `linear` defaults are an ordinary least-squares fit to the fitted roofline for llama-3.1-8b
on h100 (prefill chunks 256-8,192 tokens; 1-256 decodes at context 2,048).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from dynlab.latency.base import StepBatch
from dynlab.latency.overheads import SERVER_TERMS_OFF
from dynlab.latency.grid import DECODE_BATCHES, DECODE_CONTEXTS, PREFILL_TOKENS, build_latency_model, hardware_for

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "aic_vllm_grid.json")
FIT_GPUS = ("h100", "h200")
MODELS = {"Qwen/Qwen3-0.6B": "qwen3-0.6b", "meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b",
          "Qwen/Qwen3-8B": "qwen3-8b", "Qwen/Qwen3-32B": "qwen3-32b"}
SYSTEMS = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200", "a100_sxm": "a100-80gb", "l40s": "l40s"}


def regenerate(path: str = DATA) -> None:
    """Query aiconfigurator for every model x GPU (tp 1, and 2 for qwen3-32b); write ``path`` atomically."""
    from dynlab.atomic import replace_file

    rows = []
    for system, gpu in SYSTEMS.items():
        for hf, name in MODELS.items():
            for tp in ((1, 2) if name == "qwen3-32b" else (1,)):
                aic = build_latency_model("aiconfigurator", hardware_for(name, gpu, tp))
                row = {"model": hf, "system": system, "backend": "vllm",
                       "backend_version": aic.config["backend_version"], "tp_size": tp}
                row["prefill_ms"] = {str(t): round(aic.step_ms(StepBatch((t,), (0,), 0, 0)), 4) for t in PREFILL_TOKENS}
                row["decode_ms"] = {str(c): {str(b): round(aic.step_ms(StepBatch((), (), b, b * c)), 4)
                                             for b in DECODE_BATCHES} for c in DECODE_CONTEXTS}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    import aiconfigurator_core  # noqa: F401  (for the version below)
    from importlib.metadata import version

    doc = {"source": f"aiconfigurator-core {version('aiconfigurator-core')} RustForwardPassPerfModel.from_native, "
                     "backend=vllm", "units": "milliseconds per forward pass (one engine step)",
           "prefill_definition": "one request, sum_prefill_tokens=N, sum_prefill_kv_tokens=0, no decodes",
           "decode_definition": "num_decode_requests=B, sum_decode_kv_tokens=B*ctx, no prefill",
           "generated_by": "benchmarks/fit_roofline.py --regenerate", "rows": rows}

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(doc, indent=1) + "\n")

    replace_file(path, write)


def load_points(path: str = DATA, gpus=FIT_GPUS) -> list[tuple]:
    """``[(phase, model, gpu, tp, StepBatch, aiconfigurator ms)]`` for the rows on ``gpus``."""
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    points = []
    for row in doc["rows"]:
        gpu = SYSTEMS[row["system"]]
        if gpu not in gpus or row["model"] not in MODELS or "error" in row:
            continue
        model, tp = MODELS[row["model"]], row["tp_size"]
        for t, ms in row["prefill_ms"].items():
            points.append(("prefill", model, gpu, tp, StepBatch((int(t),), (0,), 0, 0), ms))
        for c, by_batch in row["decode_ms"].items():
            for b, ms in by_batch.items():
                points.append(("decode", model, gpu, tp, StepBatch((), (), int(b), int(b) * int(c)), ms))
    return points


def errors(points, latency_model: str, options: dict) -> list[tuple]:
    """``[(point, relative error)]`` of ``latency_model`` with ``options`` on ``points``."""
    built = {}
    out = []
    for p in points:
        _, model, gpu, tp, batch, ms = p
        key = (model, gpu, tp)
        if key not in built:
            opts = {**SERVER_TERMS_OFF.get(latency_model, {}), **options}  # the GPU step alone, as aiconfigurator's
            built[key] = build_latency_model(latency_model, hardware_for(model, gpu, tp), opts)
        out.append((p, built[key].step_ms(batch) / ms - 1.0))
    return out


def mape(errs, phase):
    sel = [abs(e) for p, e in errs if p[0] == phase]
    return sum(sel) / len(sel), max(sel)


def fit_roofline(points) -> tuple[dict, float]:
    """Coarse-to-fine grid search of (mfu, mbu, overhead_ms) minimising prefill MAPE + decode MAPE."""
    def loss(x):
        errs = errors(points, "roofline", dict(zip(("mfu", "mbu", "overhead_ms"), x)))
        return mape(errs, "prefill")[0] + mape(errs, "decode")[0]

    best = (0.6, 0.8, 1.0)
    steps = (0.1, 0.1, 0.5)
    best_loss = loss(best)
    for _ in range(7):
        improved = True
        while improved:
            improved = False
            for i in range(3):
                for sign in (-1, 1):
                    x = list(best)
                    x[i] = x[i] + sign * steps[i]
                    if not (0.01 <= x[0] <= 1 and 0.01 <= x[1] <= 1 and x[2] >= 0):
                        continue
                    value = loss(x)
                    if value < best_loss - 1e-12:
                        best, best_loss, improved = tuple(x), value, True
        steps = tuple(s / 2 for s in steps)
    return dict(zip(("mfu", "mbu", "overhead_ms"), (round(best[0], 3), round(best[1], 3), round(best[2], 2)))), best_loss


def fit_linear(roofline_options: dict) -> dict:
    """Least squares of beta0 + beta1 * prefill tokens + beta2 * decode requests on roofline (llama-3.1-8b, h100)."""
    roof = build_latency_model("roofline", hardware_for("llama-3.1-8b", "h100", 1),
                               {**SERVER_TERMS_OFF["roofline"], **roofline_options})  # linear adds its own terms
    rows = [((1.0, t, 0.0), roof.step_ms(StepBatch((t,), (0,), 0, 0))) for t in (256, 512, 1024, 2048, 4096, 8192)]
    rows += [((1.0, 0.0, b), roof.step_ms(StepBatch((), (), b, b * 2048))) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    # normal equations, 3 x 3, solved by Gaussian elimination
    a = [[sum(x[i] * x[j] for x, _ in rows) for j in range(3)] + [sum(x[i] * y for x, y in rows)] for i in range(3)]
    for i in range(3):
        piv = a[i][i]
        a[i] = [v / piv for v in a[i]]
        for k in range(3):
            if k != i:
                f = a[k][i]
                a[k] = [vk - f * vi for vk, vi in zip(a[k], a[i])]
    beta = [a[i][3] for i in range(3)]
    return {"beta0": round(beta[0], 3), "beta1": round(beta[1], 5), "beta2": round(beta[2], 5)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regenerate", action="store_true", help="rebuild the grid from aiconfigurator first")
    args = parser.parse_args(argv)
    if args.regenerate:
        regenerate()
    points = load_points()
    fitted, loss = fit_roofline(points)
    errs = errors(points, "roofline", fitted)
    print(f"roofline fit on {len(points)} steps ({', '.join(FIT_GPUS)}; vLLM): {fitted}")
    for phase in ("prefill", "decode"):
        m, worst = mape(errs, phase)
        (p, e) = max(((p, e) for p, e in errs if p[0] == phase), key=lambda pe: abs(pe[1]))
        print(f"  {phase:8s} MAPE {100 * m:5.1f}%  worst {100 * worst:5.1f}% "
              f"({p[1]} on {p[3]} x {p[2]}, {p[4]})")
    print("per model x GPU x tp (signed mean error):")
    groups = {}
    for p, e in errs:
        groups.setdefault((p[1], p[2], p[3], p[0]), []).append(e)
    for (model, gpu, tp, phase), es in sorted(groups.items()):
        print(f"  {model:13s} {gpu:5s} tp{tp} {phase:8s} {100 * sum(es) / len(es):+6.1f}%")
    print(f"linear fit to that roofline (llama-3.1-8b, h100): {fit_linear(fitted)}")


if __name__ == "__main__":
    main()
