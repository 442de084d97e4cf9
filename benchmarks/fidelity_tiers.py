"""Fidelity of the engine's CPU tier against the cache lab (seed lab 002's two-tier document cache).

    python benchmarks/fidelity_tiers.py [--gpu 5011,21520,45000,50109,50110] [--cpu 0,5011,21520,40000,50110]

The reference is :func:`dynlab.labs.scenario.run_scenario` (what ``dynlab scenario`` and ``dynlab cliff``
print): ten documents of 5,011 tokens read in passes (fwd,fwd,rev) through a GPU tier and an inclusive
CPU tier, whole documents, LRU. The model is one timed engine worker serving the same reads
(:func:`dynlab.labs.on_engine.scenario_on_engine`: vLLM's block pool of 16-token blocks and the CPU tier
of ``--cpu-capacity``), under each write rule of ``--cpu-write``: ``compute`` (write-through, the lab's
rule) and ``evict`` (a victim tier, the default). For every pair of capacities (lab tokens, mapped to
blocks as the module docstring of ``on_engine`` says) it compares every pass's GPU hits, CPU hits and
misses, and prints, per write rule, how many of the cells agree exactly, and each cell that does not
(with the engine's partial hits, which the lab's whole-document cache cannot have).
"""
from __future__ import annotations

import argparse

from dynlab.labs.on_engine import scenario_on_engine
from dynlab.labs.scenario import DEFAULT_PASSES, DEFAULT_TOKENS, PASS_ORDERS, run_scenario

KEYS = ("gpu_hits", "cpu_hits", "misses")


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"capacities are tokens >= 0, got {text!r}")
    return values


def _passes(text: str) -> list[str]:
    orders = text.split(",")
    bad = [o for o in orders if o not in PASS_ORDERS]
    if bad:
        raise argparse.ArgumentTypeError(f"pass orders are {' or '.join(PASS_ORDERS)}, got {bad[0]!r}")
    return orders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=_ints, default=[5011, 21520, 45000, 50109, 50110],
                    help="lab GPU capacities (tokens), comma list")
    ap.add_argument("--cpu", type=_ints, default=[0, 5011, 21520, 40000, 50110],
                    help="lab CPU capacities (tokens), comma list")
    ap.add_argument("--passes", type=_passes, default=list(DEFAULT_PASSES), help="pass orders, comma list")
    args = ap.parse_args()
    if min(args.gpu) < DEFAULT_TOKENS:
        ap.error(f"--gpu: every GPU capacity must hold a document ({DEFAULT_TOKENS} tokens), got {min(args.gpu)}")
    passes = args.passes
    print(f"# cache lab vs one engine worker: 10 documents of 5,011 tokens, passes {','.join(passes)}; "
          "per pass (gpu hits, cpu hits, misses), lab -> engine")
    rows, notes = [], []
    for rule in ("compute", "evict"):
        equal = 0
        for gpu in args.gpu:
            for cpu in args.cpu:
                lab = run_scenario(gpu=gpu, cpu=cpu, passes=passes)["passes"]
                eng = scenario_on_engine(gpu, cpu, passes, cpu_write=rule)["passes"]
                lab_t = [tuple(p[k] for k in KEYS) for p in lab]
                eng_t = [tuple(p[k] for k in KEYS) for p in eng]
                if lab_t == eng_t and all(p["partial"] == 0 for p in eng):
                    equal += 1
                else:
                    partial = [p["partial"] for p in eng]
                    notes.append(f"| {rule} | {gpu:,} | {cpu:,} | {lab_t} | {eng_t} | {partial} |")
        rows.append(f"| {rule} | {len(args.gpu) * len(args.cpu)} | {equal} |")
    print("| write rule | cells (GPU x CPU sizes) | every pass equal |")
    print("|:---|---:|---:|")
    print("\n".join(rows))
    print("\nCells that differ:\n")
    print("| write rule | GPU tokens | CPU tokens | lab | engine | engine partial hits |")
    print("|:---|---:|---:|:---|:---|:---|")
    print("\n".join(notes))

if __name__ == "__main__":
    main()
