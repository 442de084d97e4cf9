"""The reference runs: outputs that a change meant to keep behaviour must leave byte-identical.

Runs a fixed list of ``dynlab`` commands (timed and count-based replays of the bundled trace, CPU
tiers, event delay and loss, preemption, P/D, many workers, the labs) and writes each one's stdout
into a folder, one file per run; ``--against DIR`` then diffs the new outputs with an earlier
folder and exits 1 on any difference.

Usage::

    python benchmarks/reference_runs.py --out /tmp/ref-before            # on the old code
    python benchmarks/reference_runs.py --out /tmp/ref-after --against /tmp/ref-before

``--only NAME[,NAME]`` runs a subset; ``--list`` prints the names. Takes 2-4 minutes of one core
(the timed runs 2.5-7 s each). Uses the ``dynlab`` on PATH, or ``python -m dynlab`` with
``--module``.
"""
from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

T = ["--trace", "mooncake-conversation", "--quiet"]
TIMED = T + ["--timing"]

#: name -> arguments of ``dynlab``; every routed run names its ``--mode`` (or ``--modes``), so that a change of
#: the default (kv -> kv-cost, dynlab issue 43) leaves them as they were; the labs of ``reproduce`` name theirs
RUNS: dict[str, list[str]] = {
    "count-compare": ["compare", *T, "--workers", "8", "--capacity", "4096",
                      "--modes", "rr,random,kv,kv-events", "--format", "json"],
    "count-kv-cost": ["sim", *T, "--workers", "8", "--capacity", "4096", "--mode", "kv-cost"],
    "count-delay-loss": ["sim", *T, "--workers", "4", "--capacity", "2048", "--mode", "kv-events",
                         "--event-delay", "3", "--event-loss", "0.05"],
    "synthetic": ["sim", "--mode", "kv", "--workers", "4", "--all-metrics"],
    "t-kv-cost": ["sim", *TIMED, "--workers", "8", "--mode", "kv-cost"],
    "t-kv": ["sim", *TIMED, "--workers", "8", "--mode", "kv"],
    "t-kv-events": ["sim", *TIMED, "--workers", "8", "--mode", "kv-events"],
    "t-cache-aware": ["sim", *TIMED, "--workers", "8", "--mode", "cache-aware"],
    "t-rr": ["sim", *TIMED, "--workers", "8", "--mode", "rr"],
    "t-cpu-evict": ["sim", *TIMED, "--workers", "8", "--mode", "kv-cost", "--cpu-capacity", "20000",
                    "--cpu-write", "evict"],
    "t-cpu-compute": ["sim", *TIMED, "--workers", "8", "--mode", "kv-events", "--cpu-memory-gb", "64",
                      "--cpu-write", "compute"],
    "t-delay-loss": ["sim", *TIMED, "--workers", "8", "--mode", "kv-cost", "--event-delay-ms", "3",
                     "--event-loss", "0.05"],
    "t-preempt": ["sim", *TIMED, "--workers", "8", "--mode", "kv-cost", "--capacity", "3000"],
    "t-32-fast": ["sim", *TIMED, "--workers", "32", "--mode", "kv-events", "--time-scale", "0.3"],
    "t-small-tier-delay": ["sim", *TIMED, "--workers", "4", "--mode", "kv-cost", "--capacity", "4000",
                           "--cpu-capacity", "8000", "--cpu-write", "evict", "--event-delay-ms", "20", "--time-scale", "0.5"],
    "t-pd": ["sim", *TIMED, "--split", "2:6", "--mode", "kv-cost", "--slo-ttft-ms", "2000",
             "--slo-tpot-ms", "50"],
    "t-pd-overlap": ["sim", *TIMED, "--prefill-workers", "3", "--decode-workers", "5", "--mode",
                     "kv-events", "--overlap-transfer", "--decode-prefix-cache",
                     "--decode-router", "kv-usage"],
    "t-128": ["sim", *TIMED, "--workers", "128", "--mode", "kv-cost"],
    "t-linear-slo": ["sim", *TIMED, "--workers", "8", "--mode", "least-loaded", "--latency-model",
                     "linear", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50", "--time-scale", "0.5"],
    "t-synthetic": ["sim", "--timing", "--quiet", "--mode", "kv-cost", "--workers", "4",
                    "--prefixes", "40", "--reps", "20", "--plen", "2000", "--tail", "300",
                    "--capacity", "600", "--rate", "40"],
    "disagg-cost": ["disagg", "--model", "llama-3.1-8b", "--tokens", "8192", "--gbps", "25,50"],
}


def _run(cmd: list[str], name: str, args: list[str], out: Path) -> tuple[str, float, int]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd + args, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    body = p.stdout + (f"\n# exit {p.returncode}\n# stderr:\n{p.stderr}" if p.returncode else "")
    (out / f"{name}.out").write_text(body)
    return name, dt, p.returncode


def _reproduce(cmd: list[str], out: Path) -> tuple[str, float, int]:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        target = Path(d) / "rep"
        p = subprocess.run(cmd + ["reproduce", str(target)], capture_output=True, text=True)
        lines = []
        if target.is_dir():
            for f in sorted(target.rglob("*")):
                if f.is_file() and f.suffix in (".json", ".jsonl", ".csv", ".txt"):
                    lines.append(f"## {f.relative_to(target)}\n{f.read_text()}")
    (out / "reproduce.out").write_text(f"# exit {p.returncode}\n" + "\n".join(lines))
    return "reproduce", time.perf_counter() - t0, p.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--against", type=Path)
    ap.add_argument("--only", default="")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--module", action="store_true", help="run `python -m dynlab` instead of `dynlab`")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args()
    names = list(RUNS) + ["reproduce"]
    if a.list:
        print("\n".join(names))
        return 0
    if a.out is None:
        ap.error("--out is required")
    chosen = [n for n in a.only.split(",") if n] or names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        ap.error(f"unknown run(s): {', '.join(unknown)}")
    a.out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "dynlab"] if a.module else ["dynlab"]
    with ThreadPoolExecutor(a.jobs) as ex:
        futs = [ex.submit(_reproduce, cmd, a.out) if n == "reproduce" else ex.submit(_run, cmd, n, RUNS[n], a.out)
                for n in chosen]
        for f in futs:
            name, dt, rc = f.result()
            print(f"{name:20s} {dt:6.1f} s" + (f"  exit {rc}" if rc else ""), flush=True)
    if a.against is None:
        return 0
    bad = 0
    for n in chosen:
        old, new = a.against / f"{n}.out", a.out / f"{n}.out"
        if not old.exists():
            print(f"{n}: no earlier output in {a.against}")
            continue
        if old.read_bytes() != new.read_bytes():
            bad += 1
            diff = difflib.unified_diff(old.read_text().splitlines(), new.read_text().splitlines(),
                                        str(old), str(new), lineterm="", n=1)
            print(f"{n}: DIFFERENT")
            print("\n".join(list(diff)[:40]))
    print(f"{len(chosen) - bad} identical, {bad} different")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
