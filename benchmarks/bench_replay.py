"""Fleet replay throughput on the bundled Mooncake conversation trace (issue: fleet replay).

Prints requests/s and blocks/s of ``dynlab.sim.run`` (parsing included: the trace is
decompressed and decoded inside every timed run) for each built-in mode, for 8, 64
and 512 workers, with ``--timing`` (time scale 0.5) for 8 workers, and a bare loop doing the same work in plain Python (one
OrderedDict per worker as an LRU cache, one set per worker as the router's index,
KV events applied at once), with the ratio from the same run.

    python benchmarks/bench_replay.py [--repeat 3] [--capacity 4096]
    python benchmarks/bench_replay.py --bare-once [--cpu]   # the bare loop once, dynlab not imported

Best of ``--repeat`` runs; one core; not a test. ``--bare-once`` is the yardstick of the whole-process
comparison (docs/performance.md): ``farm-bench --vs "python benchmarks/bench_replay.py --bare-once" --
dynlab sim --trace mooncake-conversation --workers 8 --capacity 4096 --mode kv-events --quiet``.
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
import time
from collections import OrderedDict
from importlib import resources

TRACE = "mooncake-conversation"
#: the bundled trace's file under dynlab/data (dynlab.traces.reader.BUILTIN_TRACES; not imported, so that
#: --bare-once imports nothing of dynlab's but the package's empty __init__)
RESOURCE = "traces/mooncake_conversation.jsonl.gz"


def best_of(repeat, fn):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _best_worker(index: list, counts: list, hashes: list) -> int:
    """The worker :func:`bare_loop` routes ``hashes`` to: the smallest ``(-overlap, requests so far, index)``,
    the overlap counted from the start of ``hashes`` in the worker's index set."""
    best = None
    for w, s in enumerate(index):
        k = 0
        for h in hashes:
            if h not in s:
                break
            k += 1
        key = (-k, counts[w], w)
        if best is None or key < best:
            best = key
    return best[2]


def _touch(od: OrderedDict, s: set, hashes: list, actual: int, capacity: int) -> None:
    """LRU update of one worker for :func:`bare_loop`: the ``actual`` hit blocks first (so new blocks cannot
    evict them), then every block tail-first, new ones stored in ``od`` and the index set ``s``, the least
    recently used evicted from both past ``capacity`` blocks."""
    for h in hashes[:actual]:
        od.move_to_end(h)
    for h in reversed(hashes):
        if h in od:
            od.move_to_end(h)
        else:
            od[h] = 1
            s.add(h)
            if len(od) > capacity:
                old, _ = od.popitem(last=False)
                s.discard(old)


def bare_loop(workers: int, capacity: int) -> dict:
    """kv-events in plain Python, computing the same metrics as dynlab.

    Parse each line; overlap per worker from its index set; pick (-overlap, count, index);
    LRU touch tail-first (hits first, so new blocks cannot evict them); evictions and
    stores applied to the index at once (publish yes, no delay); count repeats, hits,
    cached blocks and the one-infinite-cache bound.
    """
    raw = resources.files("dynlab").joinpath("data", RESOURCE).open("rb")
    caches = [OrderedDict() for _ in range(workers)]
    index = [set() for _ in range(workers)]
    counts = [0] * workers
    seen = set()
    n_req = n_blocks = cached_blocks = ideal = repeats = hits = 0
    with io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            hashes = json.loads(line)["hash_ids"]
            w = _best_worker(index, counts, hashes)
            counts[w] += 1
            od, s = caches[w], index[w]
            actual = 0
            for h in hashes:
                if h not in od:
                    break
                actual += 1
            j = 0
            for h in hashes:
                if h not in seen:
                    break
                j += 1
            seen.update(hashes)
            if hashes and j:
                repeats += 1
                hits += actual > 0
            _touch(od, s, hashes, actual, capacity)
            n_req += 1
            n_blocks += len(hashes)
            cached_blocks += actual
            ideal += j
    return {"requests": n_req, "prompt_blocks": n_blocks, "cached_blocks": cached_blocks,
            "repeat_requests": repeats, "hits": hits, "requests_per_worker": counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--bare-once", action="store_true", help="run the bare loop once (8 workers), print its result")
    ap.add_argument("--cpu", action="store_true",
                    help="with --bare-once: also print the loop's own CPU seconds (time.process_time) on stderr")
    args = ap.parse_args()
    cap = args.capacity
    if args.bare_once:
        t0 = time.process_time()
        out = bare_loop(8, cap)
        cpu = time.process_time() - t0
        print(json.dumps(out))
        if args.cpu:
            print(f"bare loop in-process cpu s {cpu:.4f}", file=sys.stderr)
        return
    from dynlab.engine.config import SimConfig
    from dynlab.sim.runner import run
    from dynlab.traces.reader import BUILTIN_TRACES

    assert BUILTIN_TRACES[TRACE][0] == RESOURCE
    print(f"trace {TRACE}, capacity {cap} blocks per worker, best of {args.repeat}")
    print(f"{'run':<40}{'requests/s':>12}{'blocks/s':>12}{'seconds':>9}")

    def show(label, secs, reqs, blocks):
        print(f"{label:<40}{reqs / secs:>12,.0f}{blocks / secs:>12,.0f}{secs:>9.3f}")

    t_bare, bare = best_of(args.repeat, lambda: bare_loop(8, cap))
    reqs, blocks = bare["requests"], bare["prompt_blocks"]
    show("bare loop, 8 workers", t_bare, reqs, blocks)
    t_dyn = None
    for workers in (8, 64, 512):
        for mode in ("rr", "random", "kv", "kv-events"):
            if workers != 8 and mode in ("rr", "random"):
                continue
            cfg = SimConfig(mode=mode, workers=workers, capacity=cap, trace=TRACE)
            secs, out = best_of(args.repeat, lambda: run(cfg))
            show(f"dynlab {mode}, {workers} workers", secs, out["requests"], out["prompt_blocks"])
            if workers == 8 and mode == "kv-events":
                t_dyn = secs
                same = all(out[k] == v for k, v in bare.items())
                print(f"{'':<40}(same results as the bare loop: {same})")
    for mode in ("rr", "kv-events", "kv-cost", "cache-aware"):
        cfg = SimConfig(mode=mode, workers=8, capacity=cap, trace=TRACE, timing=True, time_scale=0.5)
        secs, out = best_of(args.repeat, lambda: run(cfg))
        show(f"dynlab --timing {mode}, 8 workers", secs, out["requests"], out["prompt_blocks"])
    t_b512, _ = best_of(1, lambda: bare_loop(512, cap))
    show("bare loop, 512 workers", t_b512, reqs, blocks)
    print(f"\nkv-events, 8 workers: dynlab is {t_bare / t_dyn:.2f}x the bare loop's speed "
          f"(time ratio dynlab/bare = {t_dyn / t_bare:.2f})")


if __name__ == "__main__":
    main()
