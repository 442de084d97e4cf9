"""Per-request fidelity of the timed engine against vLLM 0.33.0's own v1 scheduler, driven offline on CPU.

    pip install -e ".[vllm-oracle]"          # vLLM 0.33.0 and its torch (~9 GB), in a venv of its own
    python benchmarks/fidelity_vllm.py [--only NAME,..] [--scale 0.1] [--json OUT.json] [--no-async]

For each trace (:mod:`vllm_traces`: eleven hand-sized cases and nine seeded multi-turn conversation
traces over shared system prompts, FCFS; four hand cases and three seeded traces whose rows carry a
``priority``, run with vLLM's ``policy="priority"`` and dynlab's ``--queue-policy priority``) it runs

- dynlab: ``dynlab sim --timing --latency-model linear --latency-opt beta0=.. --capacity C --block 16
  --workers 1 --max-num-batched-tokens B --max-num-seqs S --trace FILE`` (:mod:`vllm_dynlab_side`,
  one record per request: the keys of ``sim --requests-out``);
- vLLM: its ``Scheduler`` built as ``EngineCore`` builds it, stepped in simulated time with the same
  linear step time and a fake model output (:mod:`vllm_side`), once at vLLM's defaults
  (``scheduler_reserve_full_isl=True``: ``full``) and once with ``scheduler_reserve_full_isl=False``
  (``chunk``, the rule before that option), and once more with that and vLLM's block pool switched
  to dynlab's rules (``as-dynlab``: :func:`vllm_side.dynlab_rules`: freed blocks all to the free
  queue's tail, blocks of generated tokens unnamed, a duplicate copy unnamed), to check that issue 24's
  rules are the only differences;

and compares them request by request: TTFT (first token - arrival), E2E (finish - arrival),
preemptions and hit tokens (the prefix hit of the first admission), equal when within 1e-6 ms (or
exactly, for the counts). It prints one table row per trace and rule: requests, how many are
identical on each figure and on all four, the worst TTFT and E2E difference (ms), preemptions on each
side, and the wall time of each side's run (dynlab: the ``sim`` call; vLLM: its schedule loop, without
building the scheduler). When ``dynlab sim`` has an ``--admission`` option, ``full`` and ``chunk``
are passed to it; until then dynlab runs its one rule (the chunk rule) against both.

Unless ``--no-async``, it also runs vLLM's ``AsyncScheduler`` (a batch queue of 2, as
``EngineCore.step_with_batch_queue``) and compares it with the synchronous scheduler: how many
requests join a different step (their first scheduled step starts at another time) and how many get
their first token or finish at another time; and, when ``sim`` has ``--async-scheduling``, dynlab's
async mode (``--admission full --async-scheduling``) against it request by request, as above (the
synchronous rows then pass ``--no-async-scheduling``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vllm_side  # noqa: E402  (sets VLLM_TARGET_DEVICE=cpu, HF_HUB_OFFLINE=1 before vLLM loads)
import vllm_traces  # noqa: E402
from vllm_dynlab_side import run_dynlab, sim_has  # noqa: E402

TOL_MS = 1e-6
VLLM_VERSION = "0.33.0"
#: label, scheduler_reserve_full_isl, vLLM's block pool on dynlab's rules (vllm_side.dynlab_rules), dynlab's --admission
RULES = (("full", True, False, "full"), ("chunk", False, False, "chunk"), ("as-dynlab", False, True, "chunk"))


def _span(rec: dict, key: str):
    t = rec[key]
    return None if t is None else t - rec["arrival_ms"]


def _differs(a, b) -> bool:
    if a is None or b is None:
        return a is not b
    return abs(a - b) > TOL_MS


def compare(ours: list[dict], theirs: list[dict]) -> dict:
    """Per-request agreement of two record lists (same trace order): counts of identical TTFT, E2E,
    preemptions, hit tokens and all four; the worst |TTFT| and |E2E| difference (ms); the requests
    that differ (trace lines, first 10); each side's preemptions and mean TTFT/E2E (ms)."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} records against {len(theirs)}")
    same = {"ttft": 0, "e2e": 0, "preemptions": 0, "hit_tokens": 0, "all": 0}
    worst = {"ttft": 0.0, "e2e": 0.0}
    differing = []
    for a, b in zip(ours, theirs):
        ok = {}
        for name, key in (("ttft", "first_token_ms"), ("e2e", "finish_ms")):
            x, y = _span(a, key), _span(b, key)
            ok[name] = not _differs(x, y)
            if x is not None and y is not None:
                worst[name] = max(worst[name], abs(x - y))
        ok["preemptions"] = a["preemptions"] == b["preemptions"]
        ok["hit_tokens"] = a["hit_tokens"] == b["hit_tokens"]
        for name, good in ok.items():
            same[name] += good
        if all(ok.values()):
            same["all"] += 1
        else:
            differing.append(a["id"])
    return {"requests": len(ours), "identical": same, "worst_ms": worst, "differing": differing[:10],
            "preemptions": [sum(r["preemptions"] for r in ours), sum(r["preemptions"] for r in theirs)],
            "mean_ttft_ms": [_mean(ours, "first_token_ms"), _mean(theirs, "first_token_ms")],
            "mean_e2e_ms": [_mean(ours, "finish_ms"), _mean(theirs, "finish_ms")]}


def _mean(records: list[dict], key: str):
    vals = [_span(r, key) for r in records if r[key] is not None]
    return round(sum(vals) / len(vals), 3) if vals else None


def compare_async(sync: list[dict], asyn: list[dict], sync_steps: list, async_steps: list) -> dict:
    """How vLLM's AsyncScheduler's timeline differs from the synchronous one's, per request."""
    joins = sum(_differs(a["first_scheduled_ms"], b["first_scheduled_ms"]) for a, b in zip(sync, asyn))
    first = sum(_differs(a["first_token_ms"], b["first_token_ms"]) for a, b in zip(sync, asyn))
    finish = sum(_differs(a["finish_ms"], b["finish_ms"]) for a, b in zip(sync, asyn))
    worst = max([abs(_span(a, "first_token_ms") - _span(b, "first_token_ms")) for a, b in zip(sync, asyn)] or [0.0])
    return {"requests": len(sync), "other_step": joins, "other_first_token": first, "other_finish": finish,
            "worst_ttft_ms": worst, "steps": [len(sync_steps), len(async_steps)],
            "mean_ttft_ms": [_mean(sync, "first_token_ms"), _mean(asyn, "first_token_ms")],
            "preemptions": [sum(r["preemptions"] for r in sync), sum(r["preemptions"] for r in asyn)]}


def run_case(case, tmp: str, with_async: bool = True) -> dict:
    """Both sides on one :class:`vllm_traces.Case`: ``{rule: comparison}`` plus ``async`` and wall times."""
    path = os.path.join(tmp, f"{case.name}.jsonl")
    case.write(path)
    out = {"trace": case.name, "what": case.what, "requests": len(case.rows), "capacity": case.setup.capacity,
           "budget": case.setup.max_num_batched_tokens, "max_num_seqs": case.setup.max_num_seqs}
    sync_runs = {}
    for label, full, as_dynlab, admission in RULES:
        ours, _, dyn_wall = run_dynlab(case.setup, path, admission=admission, async_scheduling=False)
        theirs, steps, vllm_wall = vllm_side.run_vllm(case.setup, case.rows, reserve_full_isl=full,
                                                      as_dynlab=as_dynlab)
        sync_runs[label] = (theirs, steps)
        out[label] = {**compare(ours, theirs), "wall_s": [round(dyn_wall, 3), round(vllm_wall, 3)]}
    if with_async:
        asyn, steps, wall = vllm_side.run_vllm(case.setup, case.rows, async_scheduling=True)
        out["async"] = {**compare_async(*sync_runs["full"][:1], asyn, sync_runs["full"][1], steps),
                        "wall_s": round(wall, 3)}
        # dynlab's async mode against vLLM's AsyncScheduler, per request (dynlab refuses LoRA with it: not modelled)
        if sim_has("--async-scheduling") and not case.setup.max_loras:
            ours, _, dyn_wall = run_dynlab(case.setup, path, admission="full", async_scheduling=True)
            out["async-dynlab"] = {**compare(ours, asyn), "wall_s": [round(dyn_wall, 3), round(wall, 3)]}
    return out


#: the ablation's columns: vLLM with dynlab's every rule but one (that one vLLM's own); reserve_full_isl, flags
ABLATION = (("dynlab's rules", False, {}), ("rule 1 vLLM's", True, {}),
            ("rule 2 vLLM's", False, {"free_to_tail": False}), ("rule 3 vLLM's", False, {"prompt_only": False}),
            ("duplicates vLLM's", False, {"first_copy_only": False}))


def ablation(case, tmp: str) -> dict:
    """Requests identical (all four figures) between dynlab and vLLM with dynlab's rules but one, per
    :data:`ABLATION` column: which of issue 24's rules makes each trace differ."""
    path = os.path.join(tmp, f"{case.name}.jsonl")
    case.write(path)
    ours = run_dynlab(case.setup, path, admission="chunk")[0]
    out = {}
    for label, full, flags in ABLATION:
        theirs = vllm_side.run_vllm(case.setup, case.rows, reserve_full_isl=full, as_dynlab={**flags})[0]
        out[label] = compare(ours, theirs)["identical"]["all"]
    return out


def ablation_table(results: list[dict]) -> str:
    lines = ["| trace | requests | " + " | ".join(label for label, *_ in ABLATION) + " |",
             "|" + "---|" * (2 + len(ABLATION))]
    for r in results:
        if "ablation" in r:
            lines.append(f"| {r['trace']} | {r['requests']} | " + " | ".join(str(r["ablation"][label])
                                                                       for label, *_ in ABLATION) + " |")
    return "\n".join(lines)


def _identity_cells(c: dict) -> str:
    """The cells a per-request comparison ``c`` fills in both tables: requests, identical TTFT / E2E /
    preemptions / hit tokens / all four, worst TTFT and E2E difference (ms)."""
    i = c["identical"]
    return (f"{c['requests']} | {i['ttft']} | {i['e2e']} | {i['preemptions']} | {i['hit_tokens']} | {i['all']} "
            f"| {c['worst_ms']['ttft']:.6g} | {c['worst_ms']['e2e']:.6g}")


def table(results: list[dict]) -> str:
    """The markdown table of :func:`run_case` results (one row per trace and admission rule)."""
    head = ("| trace | rule | requests | identical TTFT | E2E | preemptions | hit tokens | all four "
            "| worst TTFT ms | worst E2E ms | preemptions dynlab / vLLM | wall s dynlab / vLLM |")
    lines = [head, "|" + "---|" * 12]
    for r in results:
        for label, *_ in RULES:
            c = r[label]
            lines.append(f"| {r['trace']} | {label} | {_identity_cells(c)} "
                         f"| {c['preemptions'][0]} / {c['preemptions'][1]} | {c['wall_s'][0]} / {c['wall_s'][1]} |")
    return "\n".join(lines)


def async_table(results: list[dict]) -> str:
    """The markdown table of vLLM's AsyncScheduler against its synchronous Scheduler."""
    lines = ["| trace | requests | join another step | other first token | other finish | worst TTFT ms "
             "| mean TTFT ms sync / async | steps sync / async | preemptions sync / async |",
             "|" + "---|" * 9]
    for r in results:
        a = r.get("async")
        if a:
            lines.append(f"| {r['trace']} | {a['requests']} | {a['other_step']} | {a['other_first_token']} "
                         f"| {a['other_finish']} | {a['worst_ttft_ms']:.6g} | {a['mean_ttft_ms'][0]} / "
                         f"{a['mean_ttft_ms'][1]} | {a['steps'][0]} / {a['steps'][1]} | {a['preemptions'][0]} / "
                         f"{a['preemptions'][1]} |")
    return "\n".join(lines)


def async_dynlab_table(results: list[dict]) -> str:
    """The markdown table of dynlab's ``--async-scheduling`` against vLLM's AsyncScheduler, per request."""
    lines = ["| trace | requests | identical TTFT | E2E | preemptions | hit tokens | all four | worst TTFT ms "
             "| worst E2E ms | mean TTFT ms dynlab / vLLM | preemptions dynlab / vLLM | wall s dynlab / vLLM |",
             "|" + "---|" * 12]
    for r in results:
        c = r.get("async-dynlab")
        if c:
            lines.append(f"| {r['trace']} | {_identity_cells(c)} "
                         f"| {c['mean_ttft_ms'][0]} / {c['mean_ttft_ms'][1]} | {c['preemptions'][0]} / "
                         f"{c['preemptions'][1]} | {c['wall_s'][0]} / {c['wall_s'][1]} |")
    return "\n".join(lines)


def all_cases(scale: float = 1.0) -> list:
    return (vllm_traces.hand_cases() + vllm_traces.random_cases(scale) + vllm_traces.priority_cases(scale)
            + vllm_traces.lora_cases(scale))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="comma list of trace names (default: all 27)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the random traces' request counts")
    ap.add_argument("--json", default=None, help="also write every figure to this JSON file")
    ap.add_argument("--no-async", action="store_true", help="skip vLLM's AsyncScheduler")
    ap.add_argument("--ablation", action="store_true",
                    help="also run vLLM with dynlab's rules but one, for each rule (5 more vLLM runs a trace)")
    args = ap.parse_args()
    _check_vllm()
    cases = all_cases(args.scale)
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {c.name for c in cases})
        if unknown:
            ap.error(f"--only: unknown trace {unknown[0]!r}; the traces are {', '.join(c.name for c in cases)}")
        cases = [c for c in cases if c.name in wanted]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        run_dynlab(cases[0].setup, _warm(cases[0], tmp))  # imports and plugin loading out of the first timing
        for case in cases:
            results.append(run_case(case, tmp, not args.no_async))
            if args.ablation:
                results[-1]["ablation"] = ablation(case, tmp)
            print(f"# {case.name}: done", file=sys.stderr, flush=True)
    print(table(results))
    if not args.no_async:
        print()
        print(async_table(results))
        if any("async-dynlab" in r for r in results):
            print()
            print(async_dynlab_table(results))
    if args.ablation:
        print()
        print(ablation_table(results))
    if args.json:
        from dynlab.atomic import replace_file

        def write(tmp_path: str) -> None:
            with open(tmp_path, "w") as fh:
                json.dump(results, fh, indent=1)

        replace_file(args.json, write)


def _check_vllm() -> None:
    """Refuse in one line without vLLM; warn (one line) when it is not the release the harness was written for."""
    try:
        import vllm
    except ImportError:
        sys.exit('fidelity_vllm.py: needs vLLM 0.33.0: pip install -e ".[vllm-oracle]" '
                 '(best in a virtual environment of its own)')
    if getattr(vllm, "__version__", None) != VLLM_VERSION:
        print(f"warning: vLLM {getattr(vllm, '__version__', '?')} is installed, the harness follows {VLLM_VERSION}",
              file=sys.stderr)


def _warm(case, tmp: str) -> str:
    path = os.path.join(tmp, "warm.jsonl")
    case.write(path)
    return path


if __name__ == "__main__":
    main()
