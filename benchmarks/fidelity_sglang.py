"""Per-request fidelity of ``--engine sglang`` against sglang 0.5.23's own scheduling code, driven offline on CPU.

    PYTHONPATH=.:plugins /path/to/sglang-venv/bin/python benchmarks/fidelity_sglang.py [--only NAME,..]
        [--scale 0.1] [--json OUT.json]

For each trace (:func:`cases`: hand cases and seeded multi-turn conversation traces of
:mod:`vllm_traces` over shared system prompts; ample, tight and overloaded pools, chunked prefill, a
``--max-running-requests`` limit, ``lpm`` with and without its 128-request FCFS fallback, ``dfs-weight``,
retraction) it runs

- dynlab: ``dynlab sim --timing --engine sglang --latency-model linear ... --requests-out`` (one worker);
- SGLang: :class:`sglang_side.Driver` (SGLang's ``Req``, ``SchedulePolicy.calc_priority``, ``PrefillAdder``,
  ``RadixCache``, ``PrefillBudget``, ``NewTokenRatioTracker``, ``ScheduleBatch._get_decode_retraction_order``;
  the loop and a counting allocator are fakes: see that module) with the same linear step time, twice:
  ``as-dynlab`` (only a request's prompt enters the tree: dynlab names no generated token unless the row
  gives its ids) and ``sglang`` (SGLang's own rule: prompt and generated tokens enter the tree);

and compares them request by request: TTFT (first token - arrival), E2E (finish - arrival), retractions
and hit tokens (the cached prefix at the first admission), equal when within 1e-6 ms (counts: exactly).
Both run at ``--page-size 16`` = ``--block 16`` (``--page``): a hit is whole 16-token pages on both sides; at
``--page 1`` (SGLang's default) SGLang's hits end at any token and dynlab's at a block's end (docs/fidelity.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vllm_traces  # noqa: E402
from vllm_dynlab_side import _invoke, _terms_off  # noqa: E402

TOL_MS = 1e-6
BLOCK = 16
RULES = ("as-dynlab", "sglang")


class SgCase:
    """A trace (token-trace rows) and its worker: pool ``tokens``, ``chunk``, ``max_running``, ``policy``,
    ``mixed`` (``--enable-mixed-chunk``), ``disable`` (``--disable-radix-cache``), ``max_prefill`` (``--max-prefill-tokens``), ``conservativeness``
    (``--schedule-conservativeness``), ``init_ratio``, ``decay_steps`` (``--init-new-token-ratio``,
    ``--new-token-ratio-decay-steps``), betas."""

    def __init__(self, name, rows, tokens, chunk=8192, max_running=256, policy="fcfs", what="", mixed=False,
                 disable=False, max_prefill=16384, conservativeness=1.0, init_ratio=0.7, decay_steps=600, **betas):
        self.name, self.rows, self.what = name, rows, what
        self.opts = dict(tokens=tokens, chunk=chunk, max_running=max_running, policy=policy, page=BLOCK,
                         mixed=mixed, disable=disable, max_prefill=max_prefill, conservativeness=conservativeness,
                         init_ratio=init_ratio, decay_steps=decay_steps,
                         **(betas or dict(beta0=3.991, beta1=0.02339, beta2=0.10746)))


def _hand_cases() -> list:
    """Hand-sized traces (beta0=10, beta1=1, beta2=2 ms: integer times)."""
    ids = vllm_traces._Ids()
    row, hand = vllm_traces._row, vllm_traces.HAND
    shared = ids.take(48)
    lpm_a, lpm_b = ids.take(64), ids.take(32)
    dfs_p, dfs_a, dfs_b = ids.take(32), ids.take(32), ids.take(32)
    evict_a = ids.take(64)
    return [
        SgCase("shared-prefix", [row(0, shared + ids.take(10), 8), row(30, shared + ids.take(20), 5),
                                 row(45, shared + ids.take(3), 12)], 1024, what="three prompts sharing 48 tokens",
               **hand),
        SgCase("chunked", [row(0, ids.take(20), 30), row(15, ids.take(100), 5), row(40, ids.take(7), 4)], 512,
               chunk=32, what="a 100-token prompt in 32-token chunks beside decodes", **hand),
        SgCase("no-cache", [row(0, shared + ids.take(10), 8), row(30, shared + ids.take(20), 5),
                            row(45, shared + ids.take(3), 12)], 1024, disable=True,
               what="shared-prefix with --disable-radix-cache: nothing hits", **hand),
        SgCase("mixed-chunked", [row(0, ids.take(20), 30), row(15, ids.take(100), 5), row(40, ids.take(7), 4)], 512,
               chunk=32, mixed=True, what="chunked, --enable-mixed-chunk: the decodes ride in the chunks' passes",
               **hand),
        SgCase("mixed-batch-full", [row(0, ids.take(160), 50), row(5, ids.take(320), 60), row(6, ids.take(48), 20)],
               672, mixed=True, what="mixed: C refused (NO_TOKEN), admitted the round after B's mixed pass", **hand),
        SgCase("mixed-decode-evict", [row(0, evict_a, 1), row(100, ids.take(40), 5), row(100, ids.take(40), 5),
                                      row(105, ids.take(33), 1), row(300, evict_a, 1)], 224, mixed=True,
               what="mixed: the decodes' page-per-request eviction drops A's cached prompt", **hand),
        SgCase("max-running", [row(0, ids.take(20), 5) for _ in range(4)], 512, max_running=2,
               what="four requests at 0, two running slots", **hand),
        SgCase("retract-cascade", [row(0, ids.take(30), 20) for _ in range(5)], 128,
               what="five 30+20 requests at 0 in 128 tokens: the ratio's reserve admits them a few at a time",
               **hand),
        SgCase("retract-decayed", [row(0, ids.take(16), 900), row(7300, ids.take(16), 300)], 1024,
               what="the ratio decays over A's 900 decodes, B is admitted, the pool runs out: B is retracted",
               **hand),
        SgCase("lpm-order", [row(0, lpm_a, 4), row(0, lpm_b, 4), row(300, ids.take(40), 2),
                             row(301, lpm_b + ids.take(8), 2), row(302, lpm_a + ids.take(8), 2),
                             row(302, ids.take(20), 2)], 1024, policy="lpm", max_running=1,
               what="lpm: longest cached prefix first, one running slot", **hand),
        SgCase("dfs-weight-order", [row(0, dfs_p + dfs_a, 2), row(0, dfs_p + dfs_b, 2), row(500, ids.take(40), 3),
                                    row(501, dfs_p + dfs_b + ids.take(8), 2), row(501, dfs_p + dfs_a + ids.take(8), 2),
                                    row(501, dfs_p + dfs_b + ids.take(8), 2), row(502, ids.take(20), 2)], 1024,
               policy="dfs-weight", max_running=1, what="dfs-weight: the heavier subtree first, one running slot",
               **hand),
        SgCase("lof-order", [row(0, ids.take(20), n) for n in (2, 6, 4, 6, 3)], 1024, policy="lof", max_running=1,
               what="lof: the longest max_new_tokens first (ties: arrival order), one running slot", **hand),
        SgCase("lpm-fallback", [row(0, ([1] * 0) + ids.take(16 + (i % 3) * 16), 2) for i in range(140)], 4096,
               policy="lpm", max_running=4, what="lpm with 140 waiting: FCFS above 128", **hand),
    ]


def _conversation_cases(scale: float) -> list:
    specs = [  # name, seed, requests, conversations/s, pool blocks, chunk, max running, policy, replies, what[, opts]
        ("conv-ample", 1, 200, 0.5, 4096, 8192, 256, "fcfs", False, "ample pool"),
        ("conv-tight", 2, 500, 1.0, 800, 8192, 256, "fcfs", False, "tight pool: evictions"),
        ("conv-overloaded", 3, 1000, 3.0, 500, 8192, 256, "fcfs", False, "overloaded: retractions"),
        ("conv-chunked", 4, 500, 1.0, 1200, 256, 256, "fcfs", False, "256-token chunks"),
        ("conv-max-running", 5, 500, 1.5, 2000, 8192, 4, "fcfs", False, "4 running requests"),
        ("conv-lpm-tight", 2, 500, 1.0, 800, 8192, 256, "lpm", False, "lpm, tight pool"),
        ("conv-lpm-overloaded", 3, 1000, 3.0, 500, 8192, 256, "lpm", False, "lpm, overloaded (FCFS above 128)"),
        ("conv-dfs-tight", 2, 500, 1.0, 800, 8192, 256, "dfs-weight", False, "dfs-weight, tight pool"),
        ("conv-dfs-overloaded", 3, 1000, 3.0, 500, 8192, 256, "dfs-weight", False, "dfs-weight, overloaded"),
        ("conv-replies-tight", 2, 500, 1.0, 800, 8192, 256, "fcfs", True, "conv-tight, replies' ids given"),
        ("conv-mixed-ample", 1, 200, 0.5, 4096, 256, 256, "fcfs", False, "mixed chunk, 256-token chunks, ample",
         dict(mixed=True)),
        ("conv-mixed-tight", 2, 500, 1.0, 800, 256, 256, "fcfs", False, "mixed chunk, 256-token chunks, tight",
         dict(mixed=True)),
        ("conv-mixed-overloaded", 3, 1000, 3.0, 500, 512, 256, "fcfs", False, "mixed chunk, overloaded",
         dict(mixed=True)),
        ("conv-mixed-lpm-tight", 2, 500, 1.0, 800, 256, 256, "lpm", False, "mixed chunk, lpm, tight",
         dict(mixed=True)),
        ("conv-lof-overloaded", 3, 1000, 3.0, 500, 8192, 256, "lof", False, "lof, overloaded"),
        ("conv-random-overloaded", 3, 1000, 3.0, 500, 8192, 256, "random", False,
         "random, overloaded (both seeded alike)"),
        ("conv-conservative", 3, 1000, 3.0, 500, 8192, 256, "fcfs", False, "overloaded, conservativeness 1.3",
         dict(conservativeness=1.3)),
        ("conv-eager", 3, 1000, 3.0, 500, 8192, 256, "fcfs", False, "overloaded, conservativeness 0.3",
         dict(conservativeness=0.3)),
        ("conv-ratio", 3, 1000, 3.0, 500, 8192, 256, "fcfs", False,
         "overloaded, --init-new-token-ratio 0.4, --new-token-ratio-decay-steps 100",
         dict(init_ratio=0.4, decay_steps=100)),
        ("conv-no-cache-tight", 2, 500, 1.0, 800, 8192, 256, "fcfs", False, "--disable-radix-cache, tight pool",
         dict(disable=True)),
        ("conv-no-cache-overloaded", 3, 1000, 3.0, 500, 8192, 256, "fcfs", False,
         "--disable-radix-cache, overloaded", dict(disable=True)),
        ("conv-max-prefill", 3, 1000, 3.0, 500, None, 256, "fcfs", False,
         "overloaded, no chunking, --max-prefill-tokens 1024", dict(max_prefill=1024)),
        ("conv-max-prefill-chunked", 6, 500, 20.0, 4096, 4096, 256, "fcfs", False,
         "busy, 4096-token chunks, --max-prefill-tokens 1024", dict(max_prefill=1024)),
    ]
    out = []
    for name, seed, n, rate, cap, chunk, running, policy, replies, what, *opts in specs:
        rows = vllm_traces._fit(vllm_traces.conversations(seed, max(int(n * scale), 1), rate, replies=replies), cap)
        out.append(SgCase(name, rows, cap * BLOCK, chunk=chunk, max_running=running, policy=policy, what=what,
                          **(opts[0] if opts else {})))
    return out


def cases(scale: float = 1.0) -> list:
    return _hand_cases() + _conversation_cases(scale)


def run_dynlab(case: SgCase, trace: str) -> list:
    """``dynlab sim --engine sglang`` on ``trace``: its ``--requests-out`` records in trace order."""
    o = case.opts
    args = ["sim", "--timing", "--engine", "sglang", "--workers", "1", "--mode", "rr", "--trace", trace,
            "--trace-format", "tokens", "--block", str(BLOCK), "--capacity", str(o["tokens"] // BLOCK),
            "--page-size", str(o["page"]), "--chunked-prefill-size", str(o["chunk"] or -1),
            "--max-running-requests", str(o["max_running"]), "--schedule-policy", o["policy"],
            "--max-prefill-tokens", str(o["max_prefill"]), *(["--enable-mixed-chunk"] if o["mixed"] else []),
            *(["--disable-radix-cache"] if o["disable"] else []),
            "--schedule-conservativeness", repr(o["conservativeness"]), "--seed", "1",
            "--init-new-token-ratio", repr(o["init_ratio"]), "--new-token-ratio-decay-steps", str(o["decay_steps"]),
            "--latency-model", "linear", *(a for k in ("beta0", "beta1", "beta2")
                                           for a in ("--latency-opt", f"{k}={o[k]!r}")), *_terms_off(), "--quiet"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "requests.jsonl")
        _invoke(args + ["--requests-out", path])
        with open(path) as fh:
            records = [json.loads(line) for line in fh if line.strip()]
    return sorted(records, key=lambda r: r["id"])


def run_sglang(case: SgCase, rule: str) -> list:
    import sglang_side

    setup = sglang_side.SgSetup(cache_outputs=rule == "sglang", **case.opts)
    return sglang_side.Driver(setup, case.rows).run()


def _span(rec: dict, key: str):
    return None if rec[key] is None else rec[key] - rec["arrival_ms"]


def _close(a, b) -> bool:
    return (a is None) == (b is None) and (a is None or abs(a - b) <= TOL_MS)


def compare(ours: list, theirs: list) -> dict:
    """Counts of requests equal on each figure and on all four; the worst TTFT / E2E gaps (ms)."""
    out = dict(requests=len(theirs), ttft=0, e2e=0, retractions=0, hits=0, identical=0, worst_ttft=0.0,
               worst_e2e=0.0, retractions_dynlab=0, retractions_sglang=0, first_differing=None)
    for a, b in zip(ours, theirs):
        ta, tb, ea, eb = _span(a, "first_token_ms"), _span(b, "first_token_ms"), _span(a, "finish_ms"), _span(b, "finish_ms")
        same = (_close(ta, tb), _close(ea, eb), a["preemptions"] == b["preemptions"], a["hit_tokens"] == b["hit_tokens"])
        for key, ok in zip(("ttft", "e2e", "retractions", "hits"), same):
            out[key] += ok
        out["identical"] += all(same)
        if not all(same) and out["first_differing"] is None:
            out["first_differing"] = (b["id"], a, b)
        if None not in (ta, tb):
            out["worst_ttft"] = max(out["worst_ttft"], abs(ta - tb))
        if None not in (ea, eb):
            out["worst_e2e"] = max(out["worst_e2e"], abs(ea - eb))
        out["retractions_dynlab"] += a["preemptions"]
        out["retractions_sglang"] += b["preemptions"]
    return out


def run_case(case: SgCase, tmp: str) -> list:
    trace = os.path.join(tmp, case.name + ".jsonl")
    with open(trace, "w") as fh:
        for r in case.rows:
            fh.write(json.dumps(r) + "\n")
    ours = run_dynlab(case, trace)
    rows = []
    for rule in RULES:
        start = time.perf_counter()
        theirs = run_sglang(case, rule)
        rows.append(dict(case=case.name, rule=rule, wall_s=time.perf_counter() - start, **compare(ours, theirs)))
    return rows


def table(results: list) -> str:
    head = (f"{'trace':22} {'rule':10} {'reqs':>5} {'identical':>9} {'ttft':>5} {'e2e':>5} {'retr':>5} {'hits':>5} "
            f"{'worst ttft ms':>13} {'worst e2e ms':>12} {'retr dyn/sg':>11}")
    lines = [head]
    for r in results:
        lines.append(f"{r['case']:22} {r['rule']:10} {r['requests']:>5} {r['identical']:>9} {r['ttft']:>5} "
                     f"{r['e2e']:>5} {r['retractions']:>5} {r['hits']:>5} {r['worst_ttft']:>13.6g} "
                     f"{r['worst_e2e']:>12.6g} {r['retractions_dynlab']:>5}/{r['retractions_sglang']:<5}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated trace names")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies the conversation traces' request counts")
    p.add_argument("--json", default=None, help="write every row (and the first differing request) here")
    p.add_argument("--verbose", action="store_true", help="print each trace's first differing request")
    p.add_argument("--page", type=int, default=BLOCK, help="--page-size on both sides (1: SGLang's default; dynlab "
                   "still matches whole 16-token blocks, SGLang any token prefix)")
    args = p.parse_args(argv)
    chosen = cases(args.scale)
    for case in chosen:
        case.opts["page"] = args.page
    if args.only:
        names = set(args.only.split(","))
        chosen = [c for c in chosen if c.name in names]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in chosen:
            results += run_case(case, tmp)
            if args.verbose:
                for r in results[-len(RULES):]:
                    if r["first_differing"]:
                        print(r["case"], r["rule"], r["first_differing"], file=sys.stderr)
    print(table(results))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=str)
    return 0 if all(r["identical"] == r["requests"] for r in results if r["rule"] == "as-dynlab") else 1


if __name__ == "__main__":
    sys.exit(main())
