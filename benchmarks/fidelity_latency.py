"""Fidelity of the closed-form latency models against aiconfigurator (vLLM backend): MAPE and worst case.

    pip install -e ".[aiconfigurator]"   # Python 3.11+
    python benchmarks/fidelity_latency.py [--models roofline,linear,blis] [--families dense,moe] [--only deepseek-v3]

Every bundled model that aiconfigurator-core's vLLM support matrix passes on h100_sxm and h200_sxm
(the ``HF_IDS`` of :mod:`dynlab_builtins.latency_aic`), on h100 and h200, at every tp of 1, 2, 4
and 8 whose weights fit (at most 80 % of the GPUs' memory) and that splits the heads; a model with
experts also at ep = tp for tp > 1. Each latency model is compared with aiconfigurator-core on a
grid denser than the one roofline was fitted on: prefills of 128-8,192 tokens with nothing cached,
and of 512-4,096 tokens after 4,096 cached ones; 1-256 decodes at contexts 512-32,768. Prints one
table row per model x GPU x parallelism and phase, then per phase a row per family (dense, MoE) and
one over all. A configuration aiconfigurator cannot estimate is listed and skipped; a latency model
that refuses a configuration (blis: dense models only) shows "-" there.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time

from dynlab.latency.base import StepBatch
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.latency.overheads import SERVER_TERMS_OFF
from dynlab.latency.hardware import model_names

GPUS = ("h100", "h200")
PREFILL = [((t,), (0,)) for t in (128, 256, 512, 1024, 2048, 4096, 8192)] + \
          [((t,), (4096,)) for t in (512, 1024, 2048, 4096)]
DECODE = [(b, c) for b in (1, 4, 16, 32, 64, 128, 256) for c in (512, 2048, 8192, 16384, 32768)]


def steps():
    for tokens, ctx in PREFILL:
        yield "prefill", StepBatch(tokens, ctx, 0, 0)
    for b, c in DECODE:
        yield "decode", StepBatch((), (), b, b * c)


TPS = (1, 2, 4, 8)


def configs(families=("dense", "moe"), only=None):
    """``(model, gpu, tp, ep)`` of every configuration compared (module docstring); ``only``: a set of
    bundled model names to keep (``None``: every one)."""
    from dynlab.models.gpus import GIB, gpu_spec
    from dynlab.models.spec import model_spec
    from dynlab_builtins.latency_aic import HF_IDS

    for model in model_names():
        if model == "llama-3-8b" or model not in HF_IDS or (only is not None and model not in only):
            continue  # llama-3-8b: the same shapes and aiconfigurator model as llama-3.1-8b
        spec = model_spec(model)
        if ("moe" if spec.experts else "dense") not in families:
            continue
        for gpu in GPUS:
            for tp in TPS:
                if spec.weight_bytes / tp > 0.8 * gpu_spec(gpu).memory_gb * GIB:
                    continue
                eps = (1, tp) if spec.experts and tp > 1 else (1,)
                for ep in eps:
                    yield model, gpu, tp, ep


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="roofline,linear,blis", help="latency models to compare (comma list)")
    parser.add_argument("--families", default="dense,moe", help="model families to compare (dense, moe)")
    parser.add_argument("--only", default="", help="bundled models to compare (comma list; default: every one)")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    names = args.models.split(",")
    rows, everything, dense, moe, skipped = [], {}, {}, {}, []
    start = time.perf_counter()
    for model, gpu, tp, ep in configs(args.families.split(","), only):
        label = f"{model} {tp}x{gpu}" + (f" ep {ep}" if ep > 1 else "")
        try:
            hardware = hardware_for(model, gpu, tp, ep=ep)
            ref = build_latency_model("aiconfigurator", hardware)
        except ValueError as exc:
            skipped.append(f"{label}: {exc}")
            continue
        built = {}
        for n in names:
            try:
                built[n] = build_latency_model(n, hardware, SERVER_TERMS_OFF.get(n))  # kernels vs kernels
            except ValueError as exc:
                skipped.append(f"{n} on {label}: {exc}")
        errs = {(n, phase): [] for n in names for phase in ("prefill", "decode")}
        for phase, batch in steps():
            truth = ref.step_ms(batch)
            for n in built:
                e = built[n].step_ms(batch) / truth - 1.0
                errs[(n, phase)].append(e)
                everything.setdefault((n, phase), []).append(e)
                (moe if hardware.model.experts else dense).setdefault((n, phase), []).append(e)
        for phase in ("prefill", "decode"):
            rows.append((label, phase, {n: errs[(n, phase)] for n in names}))
    for label, pool in (("all dense models", dense), ("all MoE models", moe), ("all", everything)):
        for phase in ("prefill", "decode"):
            rows.append((label, phase, {n: pool.get((n, phase), []) for n in names}))

    def cell(es):
        if not es:
            return "-"
        worst = max(es, key=abs)
        return f"{100 * sum(abs(e) for e in es) / len(es):5.1f}% ({100 * worst:+6.1f}%)"

    header = ["model, GPU", "phase", "steps"] + [f"{n} MAPE (worst)" for n in names]
    table = [header] + [[label, phase, str(max(len(v) for v in d.values()))] + [cell(d[n]) for n in names]
                        for label, phase, d in rows]
    widths = [max(len(r[j]) for r in table) for j in range(len(header))]
    print("| " + " | ".join(h.ljust(widths[j]) for j, h in enumerate(header)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in table[1:]:
        print("| " + " | ".join(c.ljust(widths[j]) for j, c in enumerate(r)) + " |")
    from importlib.metadata import version

    print(f"\nreference: aiconfigurator-core {version('aiconfigurator-core')} (vLLM backend, latest database per GPU); "
          f"{platform.machine()} {platform.system()}, Python {platform.python_version()}; "
          f"{time.perf_counter() - start:.1f} s")
    for s in skipped:
        print(f"skipped: {s}", file=sys.stderr)


if __name__ == "__main__":
    main()
