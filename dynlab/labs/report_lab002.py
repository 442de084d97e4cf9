"""Lab 002's part of ``REPORT.md`` (:func:`dynlab.labs.reproduce.render_report`): an LRU KV cache, a CPU tier
and their cliffs, one or two sentences per artifact read from its JSON (``cyclic.json``, ``baseline.json``,
``cliff.json``, ``offload.json``, ``cpu_cliff.json``, ``offload_measured.json``).
"""
from __future__ import annotations

from typing import Mapping

from dynlab.labs.lab_inputs import OFFLOAD_CPU, total_tokens
from dynlab.labs.report_words import _hits, _join, _n, _plural
from dynlab.labs.scenario import DEFAULT_DOCS, DEFAULT_GPU, DEFAULT_TOKENS


def lab002_report(d: Mapping, sources: Mapping, plots: Mapping) -> list[str]:
    """Lab 002's lines of ``REPORT.md`` from ``d`` (artifact name -> its data), ``sources`` (summary kind ->
    :class:`~dynlab.labs.reproduce.MeasuredSource`) and ``plots`` (the plots drawn, by file name)."""
    lines = ["## Lab 002: an LRU KV cache, a CPU tier, and their cliffs", ""]
    lines.extend(_section_cyclic(d))
    lines.extend(_section_baseline(d))
    lines.extend(_section_cliff(d, "cliff_gpu.png" in plots))
    lines.extend(_section_offload(d))
    lines.extend(_section_cpu_cliff(d, "cliff_cpu.png" in plots))
    if "offload_measured.json" in d:
        lines.extend(_section_offload_measured(d, sources))
    else:
        lines.extend(["`offload_measured.json` was not written: pass `--offload-file FILE` or "
                      "`--with-samples`.", ""])
    return lines


def _section_cyclic(d: Mapping) -> list[str]:
    cyc = d["cyclic.json"]["passes"]
    fits = DEFAULT_GPU // DEFAULT_TOKENS
    last = cyc[-1]
    lines = [
        "### Reading the documents twice in order: `cyclic.json`",
        "",
        f"A {_n(DEFAULT_GPU)}-token GPU cache holds {fits} of the {DEFAULT_DOCS} documents of {_n(DEFAULT_TOKENS)} "
        f"tokens. The second forward pass hits **{_hits(last)}** and misses {last['misses']}: under LRU each miss "
        f"evicts the least recently used document, and in a cyclic read that is always the one needed soonest.",
    ]
    if "cyclic_opt.json" in d:
        opt = d["cyclic_opt.json"]["passes"][-1]
        lines.append(
            f"Belady's offline optimum (`--policy opt`, `cyclic_opt.json`) hits **{_hits(opt)}** with the same "
            f"space (documents {opt['hit_docs']}): it keeps some documents resident and sacrifices the rest, so "
            f"LRU's {_hits(last)} is the policy's doing, not only the lack of space.")
    lines.append("")
    return lines


def _section_baseline(d: Mapping) -> list[str]:
    passes = d["baseline.json"]["passes"]
    third = passes[2] if len(passes) > 2 else passes[-1]
    fits = DEFAULT_GPU // DEFAULT_TOKENS
    resident = list(range(DEFAULT_DOCS - fits, DEFAULT_DOCS))
    expected = list(reversed(resident))
    lines = [
        "### Reading them backwards: `baseline.json`",
        "",
        f"The third pass (`{third['order']}`) hits documents **{third['hit_docs']}** and misses {third['misses']}. "
        f"After the second forward pass the GPU holds the last {fits} documents read, {_join([str(x) for x in resident])} "
        f"({fits} × {_n(DEFAULT_TOKENS)} = {_n(fits * DEFAULT_TOKENS)} ≤ {_n(DEFAULT_GPU)} tokens); the reverse pass "
        f"reads exactly those first, newest first"
        + (", so it hits them in that order; " if third["hit_docs"] == expected else
           f" — yet the hits differ from the {expected} this predicts; ")
        + f"documents {DEFAULT_DOCS - fits - 1} down to 0 were evicted during the second pass, so every later read misses.",
        "",
    ]
    return lines


def _section_cliff(d: Mapping, plot: bool) -> list[str]:
    c = d["cliff.json"]
    total = total_tokens()
    zero = [k for k in c if c[k] == 0]
    some = [k for k in c if c[k] > 0]
    lines = ["### The GPU cliff: `cliff.json`", ""]
    if zero and some and max(int(k) for k in zero) < min(int(k) for k in some):
        first = min(some, key=int)
        lines.append(
            f"The second forward pass hits 0 documents at every GPU capacity from {_n(int(min(zero, key=int)))} to "
            f"{_n(int(max(zero, key=int)))} tokens and **{c[first]}** at {_n(int(first))}. The documents total "
            f"{DEFAULT_DOCS} × {_n(DEFAULT_TOKENS)} = {_n(total)} tokens, so the cliff sits "
            + ("exactly at that total" if int(first) == total and str(total - 1) in zero else f"at {_n(int(first))}")
            + ": below it a cyclic read under LRU evicts every document just before its next use (one token short "
              "is as bad as half the space), and once all documents fit nothing is evicted and every read hits.")
    else:
        lines.append(f"Second-pass hits per GPU capacity: {c}.")
    lines.extend(["", "![GPU cliff](cliff_gpu.png)", ""] if plot else [""])
    return lines


def _section_offload(d: Mapping) -> list[str]:
    passes = d["offload.json"]["passes"]
    total = total_tokens()
    lines = ["### A CPU tier under the GPU: `offload.json`", ""]
    sentences = [
        f"With {_n(OFFLOAD_CPU)} tokens of CPU space "
        f"({'at least' if OFFLOAD_CPU >= total else 'less than'} the {_n(total)}-token total)"
    ]
    if len(passes) >= 2:
        p2 = passes[1]
        sentences[0] += (f", the second pass loads {p2['cpu_hits']} documents from the CPU, hits {p2['gpu_hits']} on the "
                         f"GPU and recomputes {p2['misses']}")
    if len(passes) >= 3:
        p3 = passes[2]
        sentences[0] += (f"; the reverse pass hits {p3['gpu_hits']} on the GPU and {p3['cpu_hits']} from the CPU "
                         f"({p3['misses']} misses)")
    lines.append(sentences[0] + ". Offloading turns recomputation into loads from CPU memory.")
    lines.append("")
    return lines


def _section_cpu_cliff(d: Mapping, plot: bool) -> list[str]:
    c = d["cpu_cliff.json"]
    total = total_tokens()
    overflow = total - DEFAULT_GPU
    all_miss = [k for k in c if c[k] == DEFAULT_DOCS]
    none_miss = [k for k in c if c[k] == 0]
    lines = ["### The CPU cliff: `cpu_cliff.json`", ""]
    if all_miss and none_miss and len(all_miss) + len(none_miss) == len(c) \
            and max(int(k) for k in all_miss) < min(int(k) for k in none_miss):
        beyond = [k for k in all_miss if int(k) >= overflow]
        first = min(none_miss, key=int)
        lines.append(
            f"With the GPU at {_n(DEFAULT_GPU)} tokens the second pass misses all {DEFAULT_DOCS} documents at every "
            f"CPU capacity up to {_n(int(max(all_miss, key=int)))} tokens and **none** from {_n(int(first))}"
            + (f" — the documents' total of {_n(total)}" if int(first) == total else "") + ". "
            + (f"The GPU cannot hold {_n(overflow)} tokens of the documents, yet CPU capacities of "
               f"{_join([_n(int(k)) for k in beyond])} — more than that overflow — still miss everything: "
               if beyond else "")
            + "the CPU tier must hold every document, not just what the GPU cannot, because a miss stores the "
              "document in both tiers and the CPU tier is an LRU cache read in the same cyclic order. "
              "This is the simulator's prediction; the lab measured only a CPU tier that held every document.")
    else:
        lines.append(f"Second-pass misses per CPU capacity: {c}.")
    lines.extend(["", "![CPU cliff](cliff_cpu.png)", ""] if plot else [""])
    return lines


def _section_offload_measured(d: Mapping, sources: Mapping) -> list[str]:
    m = d["offload_measured.json"]
    src = sources.get("offload")
    names = [k for k in m if k != "ratio"]
    base, cand = names[0], names[1]
    ratio = {p: r for p, r in m["ratio"].items() if r is not None}
    lines = ["### Measured offload TTFT: `offload_measured.json`", ""]
    if src is not None:
        lines.append(f"Summary of `{src.name}`" + (" (the package's illustrative sample, not a measurement)."
                                                    if src.sample else "."))
    if not ratio:
        lines.extend(["No pass has both configurations, so there is no ratio to read.", ""])
        return lines
    below = [p for p, r in ratio.items() if r["p50"] is not None and r["p50"] < 1]
    above = [p for p, r in ratio.items() if r["p50"] is not None and r["p50"] > 1]
    lines.append(f"The ratio is {base} ÷ {cand} TTFT, so above 1 means {cand} was faster.")
    for p in below:
        r = ratio[p]
        lines.append(
            f"On `{p}` it is **{r['p50']}** (p50) and {r['mean']} (mean), below 1: {cand} was slower "
            f"({m[cand][p]['p50_ms']} vs {m[base][p]['p50_ms']} ms p50). Nothing is cached yet, so there is nothing "
            f"to reuse, and {cand} pays for storing each document's KV in CPU memory on the way.")
    if above:
        lines.append(
            f"On {_join([f'`{p}`' for p in above])} it is {_join([str(ratio[p]['p50']) for p in above])} (p50): "
            f"{cand} reloads the documents' KV instead of recomputing it "
            f"({_join([str(m[cand][p]['p50_ms']) + ' ms' for p in above])} vs "
            f"{_join([str(m[base][p]['p50_ms']) + ' ms' for p in above])}).")
    skewed = [p for p in m[base] if m[base][p] and m[base][p]["mean_ms"] < 0.9 * m[base][p]["p50_ms"]]
    for p in skewed:
        stats = m[base][p]
        tail = ""
        if "baseline.json" in d and p == list(m[base])[-1]:
            rev = d["baseline.json"]["passes"][-1]
            tail = (f", as in `baseline.json`, whose last pass (`{rev['order']}`) still finds "
                    f"{_plural(_hits(rev), 'document')} of {DEFAULT_DOCS} on the GPU")
        lines.append(
            f"{base}'s `{p}` mean ({stats['mean_ms']} ms) is well under its median ({stats['p50_ms']} ms): "
            f"some documents were fast even without offloading, still held by the GPU's own cache{tail}.")
    lines.append("")
    return lines
