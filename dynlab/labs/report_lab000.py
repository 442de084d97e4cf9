"""Lab 000's part of ``REPORT.md`` (:func:`dynlab.labs.reproduce.render_report`): KV-aware routing and the cost
of disaggregated serving, one or two sentences per artifact read from its JSON (``modes.json``,
``events.json``, ``kvcost.json``, ``disagg_measured.json``, ``bounded.json``), compared with the ranges the
lab quotes from its measurements (:data:`dynlab.labs.lab_inputs.LAB000_MEASURED`).
"""
from __future__ import annotations

from typing import Mapping, Optional

from dynlab.engine.config import SimConfig
from dynlab.labs.lab_inputs import KV_LINKS, KV_TOKENS, LAB000_MEASURED, LAB000_MEASURED_NO_EVENTS
from dynlab.labs.report_words import _band, _join, _n, _plural


def lab000_report(d: Mapping, sources: Mapping, plots: Mapping) -> list[str]:
    """Lab 000's lines of ``REPORT.md`` from ``d`` (artifact name -> its data), ``sources`` (summary kind ->
    :class:`~dynlab.labs.reproduce.MeasuredSource`) and ``plots`` (the plots drawn, by file name)."""
    lines = ["## Lab 000: KV-aware routing and the cost of disaggregated serving", ""]
    lines.extend(_section_modes(d))
    lines.extend(_section_events(d))
    if "strategies.png" in plots:
        lines.extend(["![hits per strategy](strategies.png)", ""])
    lines.extend(_section_kvcost(d))
    if "disagg_measured.json" in d:
        lines.extend(_section_disagg_measured(d, sources))
    else:
        lines.extend(["`disagg_measured.json` was not written: pass `--disagg-file FILE` or `--with-samples`.",
                      ""])
    lines.extend(_section_bounded(d))
    if "bounded.png" in plots:
        lines.extend(["![bounded vs unbounded hits](bounded.png)", ""])
    return lines


def _section_modes(d: Mapping) -> list[str]:
    modes = d["modes.json"]
    kv, rr, rnd = modes["kv"], modes["rr"], modes["random"]
    cfg = SimConfig()
    above = rr["hits"] > LAB000_MEASURED["rr"][1]
    lines = [
        "### Three strategies: `modes.json`",
        "",
        f"Of the {kv['requests']} requests ({cfg.prefixes} prefixes × {cfg.reps} requests each), "
        f"{kv['repeat_requests']} repeat a prefix seen before. kv sends **{kv['hits']} of {kv['repeat_requests']}** "
        f"of them to a worker that already processed the prefix (hit rate {kv['hit_rate']}); "
        f"round robin hits {rr['hits']} ({rr['hit_rate']}) and random {rnd['hits']} ({rnd['hit_rate']}).",
        f"Round robin and random score this high because the simulated workers never forget a prefix: with "
        f"{kv['workers']} workers, once a prefix has been processed on both, every later repeat hits wherever "
        f"it goes"
        + (f" — which is why round robin's {rr['hits']} is above the "
           f"{LAB000_MEASURED['rr'][0]}–{LAB000_MEASURED['rr'][1]} of 60 the lab measured on real, bounded caches "
           f"(see `bounded.json` below)." if above else "."),
        "",
    ]
    return lines


def _section_events(d: Mapping) -> list[str]:
    ev = d["events.json"]
    yes, no = ev["yes"], ev["no"]
    lines = [
        "### Without KV events: `events.json`",
        "",
        f"When workers publish KV events, kv-events hits {yes['hits']} of {yes['repeat_requests']}; "
        f"when they publish nothing it hits **{no['hits']} of {no['repeat_requests']}** (hit rate {no['hit_rate']}).",
    ]
    if "modes.json" in d:
        rr = d["modes.json"]["rr"]
        if no["hits"] == rr["hits"] and no["hit_rate"] == rr["hit_rate"]:
            lines.append(
                f"That is exactly round robin's {rr['hits']} ({rr['hit_rate']}): the router learns blocks only "
                f"from events, so without them its index stays empty, every overlap is 0 and only the tie-breaks "
                f"are left — fewest requests so far, then the lowest worker id — which send the requests to "
                f"workers 0, 1, 0, 1, …, the round-robin order. Nothing fails or warns; the lab measured "
                f"{_join([str(x) for x in LAB000_MEASURED_NO_EVENTS])} hits of 60 for `--router-mode kv` "
                f"without events.")
        else:
            lines.append(
                f"Round robin hits {rr['hits']} ({rr['hit_rate']}), so here kv-events without events does NOT "
                f"reduce to round robin.")
    lines.append("")
    return lines


def _prefill_ms(d: Mapping) -> Optional[tuple[str, float]]:
    measured = d.get("disagg_measured.json")
    key = f"{KV_TOKENS}x1"
    if measured and key in measured and measured[key].get("agg_ms"):
        return key, measured[key]["agg_ms"]
    return None


def _section_kvcost(d: Mapping) -> list[str]:
    cost = d["kvcost.json"]
    first = next(iter(cost.values()))
    parts = [f"{_n(cost[g]['transfer_ms'])} ms at {g} GB/s ({KV_LINKS.get(g, 'a link')})" for g in cost]
    lines = [
        "### What the KV transfer costs: `kvcost.json`",
        "",
        f"{_n(KV_TOKENS)} tokens of Qwen3-0.6B KV ({_n(first['bytes_per_token'])} bytes per token) are "
        f"{first['kv_mib']} MiB. Moving them takes {_join(parts)}.",
    ]
    prefill = _prefill_ms(d)
    if prefill is not None:
        key, ms = prefill
        times = [f"{cost[g]['transfer_ms'] / ms:.1f}× at {g} GB/s" for g in cost]
        faster = [g for g in cost if cost[g]["transfer_ms"] < ms]
        lines.append(
            f"Against the prefill itself — the aggregated TTFT of the measured {key} cell, {ms} ms, in "
            f"`disagg_measured.json` — the transfer is {_join(times)}: "
            + (f"only at {_join([g + ' GB/s' for g in faster])} does the KV move in less time than the "
               f"prefill takes." if faster else "at none of them does the KV move faster than the prefill."))
    else:
        slow = [g for g in cost if cost[g]["transfer_ms"] >= 100]
        mid = [g for g in cost if 10 <= cost[g]["transfer_ms"] < 100]
        fast = [g for g in cost if cost[g]["transfer_ms"] < 10]
        said = []
        if slow:
            said.append(f"at {_join(slow)} GB/s it takes longer than any prefill of tens of milliseconds")
        if mid:
            said.append(f"at {_join(mid)} GB/s it is as long as such a prefill")
        if fast:
            said.append(f"at {_join(fast)} GB/s it is shorter")
        lines.append(f"Against a prefill of tens of milliseconds: {'; '.join(said)}.")
    lines.append("")
    return lines


def _section_disagg_measured(d: Mapping, sources: Mapping) -> list[str]:
    m = d["disagg_measured.json"]
    src = sources.get("disagg")
    cells = {k: v for k, v in m.items() if v.get("ratio") is not None}
    lines = ["### Measured disaggregated vs aggregated TTFT: `disagg_measured.json`", ""]
    if src is not None:
        lines.append(f"Summary of `{src.name}`" + (" (the package's illustrative sample, not a measurement)."
                                                    if src.sample else "."))
    if not cells:
        lines.extend(["No cell has both modes, so there is no ratio to read.", ""])
        return lines
    hi = max(cells, key=lambda k: cells[k]["ratio"])
    lo = min(cells, key=lambda k: cells[k]["ratio"])
    above = [k for k in cells if cells[k]["ratio"] > 1]
    verdict = ("above 1 in every cell: disaggregation made the first token slower everywhere"
               if len(above) == len(cells) else
               f"above 1 in {len(above)} of {len(cells)} cells")
    lines.append(
        f"The ratio disagg ÷ agg of the median TTFTs runs from {cells[lo]['ratio']} ({lo}) to "
        f"{cells[hi]['ratio']} ({hi}), {verdict}.")
    conc1 = sorted((int(k.split("x")[0]), k) for k in cells if k.endswith("x1") and k.split("x")[0].isdigit())
    if len(conc1) >= 2:
        ratios = [cells[k]["ratio"] for _, k in conc1]
        trend = ("falls" if all(a > b for a, b in zip(ratios, ratios[1:])) else
                 "rises" if all(a < b for a, b in zip(ratios, ratios[1:])) else "moves")
        steps = _join([f"{k}: {cells[k]['ratio']}" for _, k in conc1])
        k0, k1 = conc1[0][1], conc1[-1][1]
        extra0 = cells[k0]["disagg_ms"] - cells[k0]["agg_ms"]
        extra1 = cells[k1]["disagg_ms"] - cells[k1]["agg_ms"]
        agg_growth = cells[k1]["agg_ms"] / cells[k0]["agg_ms"]
        extra_growth = extra1 / extra0 if extra0 else float("inf")
        slope = (extra1 - extra0) / (conc1[-1][0] - conc1[0][0])
        fixed = extra0 - slope * conc1[0][0]
        lines.append(
            f"At concurrency 1 it {trend} as the input grows ({steps}): from {k0} to {k1} the aggregated TTFT "
            f"grows {agg_growth:.1f}× ({cells[k0]['agg_ms']} to {cells[k1]['agg_ms']} ms) and the time "
            f"disaggregation adds on top of it {extra_growth:.1f}× ({extra0:.1f} to {extra1:.1f} ms)"
            + (f"; a straight line through those two points leaves {fixed:.1f} ms of it that does not grow with "
               f"the input." if extra_growth < agg_growth and fixed > 0 else "."))
    lines.append("")
    return lines


def _section_bounded(d: Mapping) -> list[str]:
    b = d["bounded.json"]
    cfg = SimConfig()
    per_req = cfg.plen // cfg.block + cfg.tail // cfg.block
    prefix_blocks = cfg.prefixes * (cfg.plen // cfg.block)
    caps = list(b)
    strategies = list(next(iter(b.values())))
    any_run = b[caps[0]][strategies[0]]
    total = any_run["repeat_requests"]
    header = "| strategy | " + " | ".join("unbounded" if c == "unbounded" else f"capacity {c}" for c in caps) + " |"
    lines = [
        "### Bounded worker caches: `bounded.json`",
        "",
        f"The lab's simulator never evicts. Here each worker keeps at most C blocks of {cfg.block} tokens (LRU); a "
        f"request is {per_req} blocks ({cfg.plen // cfg.block} of prefix, {cfg.tail // cfg.block} of tail) and the "
        f"{cfg.prefixes} prefixes alone are {prefix_blocks} blocks. Hits of the {total} repeat requests "
        f"(block hit rate, evicted blocks):",
        "",
        header,
        "|" + "---|" * (len(caps) + 1),
    ]
    for s in strategies:
        cells = [f"{b[c][s]['hits']} ({b[c][s]['block_hit_rate']}, {b[c][s]['evicted_blocks']})" for c in caps]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines.append("")
    bounded_caps = [c for c in caps if c != "unbounded"]
    for s, band in LAB000_MEASURED.items():
        if s not in strategies:
            continue
        values = [f"{b[c][s]['hits']} at capacity {c} ({_band(b[c][s]['hits'], band)})" for c in bounded_caps]
        lines.append(
            f"- {s}: {_join(values)} against the {band[0]}–{band[1]} of 60 the lab measured"
            + (f"; unbounded {b['unbounded'][s]['hits']} ({_band(b['unbounded'][s]['hits'], band)})."
               if "unbounded" in b else "."))
    inside = all(_band(b[c][s]["hits"], band) == "inside"
                 for s, band in LAB000_MEASURED.items() if s in strategies for c in bounded_caps)
    lines.append("")
    fixed = f"The capacities ({_join(bounded_caps)} blocks per worker) are fixed inputs, not fitted to the bands."
    lines.append(
        ("With bounded caches both strategies land inside the bands the lab measured: evictions take away the "
         "second copies that made round robin look good, while kv keeps each prefix on one worker. " + fixed
         if inside else
         "Not every bounded run lands inside the lab's bands (marked above). " + fixed))
    if "kv" in strategies and "kv-events" in strategies:
        errs = [f"{_plural(b[c]['kv']['prediction_error'], 'block')} at capacity {c}" for c in bounded_caps
                if b[c]["kv"].get("prediction_error")]
        ev_errs = {b[c]["kv-events"].get("prediction_error") for c in bounded_caps}
        if errs and ev_errs == {0}:
            lines.append(
                f"kv remembers where it sent each prefix but not what the worker evicted, so its predicted overlaps "
                f"are off by {_join(errs)} in total; kv-events learns evictions from `BlockRemoved` events and predicts exactly "
                f"(prediction error 0).")
    lines.append("")
    return lines
