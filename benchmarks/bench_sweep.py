"""Sweep throughput: one 32-cell grid on the bundled trace, serially, on a process pool and on Ray.

The grid is ``mode`` (4) x ``workers`` (2) x ``capacity`` (4) on ``mooncake-conversation``:
32 replays of 12,031 requests. Each executor's wall time covers everything
:func:`dynlab.sweep.execute` does (loading the trace, starting the pool or Ray
instance, running every cell, shutting down); the speed-up is serial time / executor
time. Ray's start-up cost is measured on its own (start and stop a local instance with
no task) and printed beside it. The results of all executors are checked to be equal.

Run: ``python benchmarks/bench_sweep.py [--jobs N] [--repeat R] [--no-ray]``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time

from dynlab import sweep as lib
from dynlab.errors import DynlabError

TRACE = "mooncake-conversation"
MODES = ("rr", "random", "kv", "kv-events")
WORKERS = (4, 8)
CAPACITIES = (1024, 2048, 4096, 8192)


def grid() -> lib.Grid:
    return lib.Grid((lib.Axis("mode", MODES), lib.Axis("workers", WORKERS), lib.Axis("capacity", CAPACITIES)),
                    fixed={"trace": TRACE}, base={"trace": TRACE})


def timed(configs, executor, jobs, address=None):
    """(wall seconds, {position: result JSON}) of one complete sweep with a cold trace cache."""
    lib.clear_trace_cache()
    start = time.perf_counter()
    results = {i: json.dumps(r) for i, r in lib.execute(configs, executor, jobs, address)}
    return time.perf_counter() - start, results


def ray_startup(jobs: int) -> tuple[float, float]:
    """Seconds to start a local Ray instance (as the sweep starts it) and to stop it, with no task run."""
    ray = lib.import_ray(None)
    start = time.perf_counter()
    ray.init(address="local", num_cpus=jobs, include_dashboard=False, _node_ip_address="127.0.0.1",
             logging_level=logging.ERROR, log_to_driver=False)
    up = time.perf_counter() - start
    start = time.perf_counter()
    ray.shutdown()
    return up, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=lib.default_jobs(), help="pool processes / Ray CPUs")
    ap.add_argument("--repeat", type=int, default=3, help="runs per executor (the median is reported)")
    ap.add_argument("--no-ray", action="store_true", help="skip Ray")
    args = ap.parse_args()
    g = grid()
    configs = [g.config(c) for c in g.cells()]
    print(f"dynlab sweep benchmark: {len(configs)} cells ({len(MODES)} modes x {len(WORKERS)} worker counts x "
          f"{len(CAPACITIES)} capacities) on {TRACE}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"--jobs {args.jobs}, median of {args.repeat}")
    rows = []
    reference = None
    for executor in ("serial", "local"):
        times = []
        for _ in range(args.repeat):
            t, results = timed(configs, executor, args.jobs)
            times.append(t)
            if reference is None:
                reference = results
            assert results == reference, f"{executor} results differ from serial"
        rows.append((executor, statistics.median(times), min(times)))
    extra = ""
    if not args.no_ray:
        try:
            lib.import_ray(None)
        except DynlabError as exc:
            print(f"ray: skipped ({exc})")
        else:
            ups, downs, times = [], [], []
            for _ in range(args.repeat):
                up, down = ray_startup(args.jobs)
                ups.append(up)
                downs.append(down)
                t, results = timed(configs, "ray", args.jobs)
                assert results == reference, "ray results differ from serial"
                times.append(t)
            rows.append(("ray", statistics.median(times), min(times)))
            extra = (f"ray start-up of a local instance: {statistics.median(ups):.2f} s to start, "
                     f"{statistics.median(downs):.2f} s to stop (included in its wall time)")
    serial = rows[0][1]
    print(f"{'executor':<9} {'wall s':>7} {'best s':>7} {'cells/s':>8} {'speed-up':>9}")
    for name, med, best in rows:
        print(f"{name:<9} {med:7.2f} {best:7.2f} {len(configs) / med:8.2f} {serial / med:8.2f}x")
    if extra:
        print(extra)
    print("results: identical across executors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
