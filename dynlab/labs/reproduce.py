"""Every artifact of the two seed labs in one run, and a report that answers their questions from the numbers.

``dynlab reproduce OUTDIR`` is :func:`build` followed by writing its files. :func:`build` calls the
same library functions the individual commands call (:func:`dynlab.sim.run` behind ``sim`` and
``compare``, :func:`dynlab.disagg.cost.cost_report` behind ``disagg``, :func:`dynlab.labs.scenario.run_scenario`
and :func:`dynlab.labs.scenario.cliff` behind ``scenario`` and ``cliff``, :mod:`dynlab.labs.summarize` behind
``summarize``), so each JSON artifact is exactly what its command prints (:attr:`Artifact.text`: one
``json.dumps`` line and a newline). ``REPORT.md`` is rendered from those objects; it holds no number
of its own except the ranges the labs quote from their measurements (:data:`LAB000_MEASURED`).

Artifacts per lab (file -> the equivalent command):

* ``lab000``: ``modes.json`` (``dynlab compare --modes rr,random,kv``), ``events.json``
  (``dynlab compare --mode kv-events --publish yes,no``), ``kvcost.json`` (``dynlab disagg --tokens
  1500 --gbps 0.112,0.608,13.4``), ``bounded.json`` (``dynlab compare --modes rr,random,kv,kv-events
  --capacity C --all-metrics`` for C in unbounded, 60, 42, keyed by C) and, given a measured file,
  ``disagg_measured.json`` (``dynlab summarize disagg FILE -``).
* ``lab002``: ``cyclic.json``, ``cyclic_opt.json`` (the same with ``--policy opt``), ``baseline.json``,
  ``cliff.json``, ``offload.json``, ``cpu_cliff.json`` (``dynlab scenario`` / ``dynlab cliff``) and,
  given a measured file, ``offload_measured.json`` (``dynlab summarize offload FILE -``).

Plots (:mod:`dynlab.labs.report_plots`, matplotlib): ``strategies.png`` and ``bounded.png`` (lab 000),
``cliff_gpu.png`` and ``cliff_cpu.png`` (lab 002).

This module writes nothing: :func:`build` returns a :class:`Reproduction` whose texts and plot
functions the caller writes (the CLI does it atomically, file by file).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from dynlab import __version__
from dynlab.disagg import cost as kvcost_lib
from dynlab.engine.config import SimConfig
from dynlab.sim.runner import run
from dynlab.labs import summarize as summarize_lib
from dynlab.labs.scenario import DEFAULT_DOCS, DEFAULT_GPU, DEFAULT_TOKENS, cliff, run_scenario

__all__ = [
    "LABS",
    "REPORT",
    "GPU_SWEEP",
    "CPU_SWEEP",
    "OFFLOAD_CPU",
    "KV_TOKENS",
    "KV_GBPS",
    "BOUNDED_CAPACITIES",
    "BOUNDED_MODES",
    "LAB000_MEASURED",
    "SAMPLE_FILES",
    "Artifact",
    "Plot",
    "Reproduction",
    "MeasuredSource",
    "measured_file",
    "sample_file",
    "compare_runs",
    "lab000_artifacts",
    "lab002_artifacts",
    "lab_plots",
    "render_report",
    "build",
    "artifact_names",
]

LABS = ("lab000", "lab002")
"""The labs ``--only`` can pick: ``shared/seeds/000`` (routing, disaggregation) and ``002`` (KV offload)."""
REPORT = "REPORT.md"

# The labs' inputs (shared/seeds/000 steps 4-6, shared/seeds/002 steps 2-7).
GPU_SWEEP = ("21520", "30000", "40000", "45000", "50109", "50110")
CPU_SWEEP = ("0", "20000", "30000", "40000", "50109", "50110", "56000")
OFFLOAD_CPU = 56000
KV_TOKENS = 1500
KV_GBPS = ("0.112", "0.608", "13.4")
#: What each bandwidth of ``kvcost.json`` is, as lab 000 step 6 explains it.
KV_LINKS = {
    "0.112": "TCP between servers",
    "0.608": "the disaggregated KV transfer measured in the lab's reading",
    "13.4": "PCIe Gen4 x8, host to GPU",
}
#: Beyond the labs: worker capacities in blocks (``unbounded``: the labs' simulator) and strategies.
BOUNDED_CAPACITIES = ("unbounded", "60", "42")
BOUNDED_MODES = ("rr", "random", "kv", "kv-events")
#: Hits of 60 repeat requests that lab 000 quotes from its 2026-10-07 measurement (real, bounded caches).
LAB000_MEASURED = {"rr": (35, 43), "kv": (53, 60)}
#: Hits lab 000 quotes for ``--router-mode kv`` with workers that publish no KV events.
LAB000_MEASURED_NO_EVENTS = (39, 44, 41)
#: The package's sample measured files (illustrative, not measurements), by summary kind.
SAMPLE_FILES = {"disagg": "data/fixtures/disagg.jsonl", "offload": "data/fixtures/ttft.jsonl"}

Warn = Callable[[str], None]


def _ignore(message: str) -> None:
    pass


# --------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class Artifact:
    """One JSON file: its ``name``, the ``lab`` it belongs to, the equivalent ``command``, and ``data``.

    ``text`` is the file's content: ``json.dumps(data)`` and a newline, as the command prints it.
    """

    name: str
    lab: str
    command: str
    data: Any

    @property
    def text(self) -> str:
        """The file content: one JSON line (``json.dumps`` default separators) and ``\\n``."""
        return json.dumps(self.data) + "\n"


@dataclass(frozen=True)
class Plot:
    """One PNG file: ``name``, ``lab``, a one-line ``caption``, and ``draw(path)`` that writes it."""

    name: str
    lab: str
    caption: str
    draw: Callable[[str], None]


@dataclass(frozen=True)
class Reproduction:
    """What :func:`build` produced: JSON artifacts, plots and the report text, in writing order."""

    labs: tuple[str, ...]
    artifacts: dict[str, Artifact]
    plots: dict[str, Plot]
    report: str

    def files(self) -> list[str]:
        """Every file name this reproduction writes: the JSON files, the plots, then ``REPORT.md``."""
        return [*self.artifacts, *self.plots, REPORT]


@dataclass(frozen=True)
class MeasuredSource:
    """A measured JSON-lines file: ``name`` (used in messages and the report) and how to open it."""

    name: str
    opener: Callable[[], Any]
    sample: bool = False

    def summarize(self, summarize_lines: Callable[..., dict], warn: Warn = _ignore) -> dict:
        """``summarize_lines(lines, name, warn=warn)`` over the file's lines (read as bytes)."""
        with self.opener() as fh:
            return summarize_lines(fh, self.name, warn=warn)


def measured_file(path: Union[str, os.PathLike]) -> MeasuredSource:
    """A measured file on disk, named in messages exactly as ``path`` is written."""
    return MeasuredSource(os.fspath(path), lambda: open(path, "rb"))


def sample_file(kind: str) -> MeasuredSource:
    """The package's sample measured file for ``kind`` (``"disagg"`` or ``"offload"``, see :data:`SAMPLE_FILES`).

    Raises ``ValueError`` for another kind.
    """
    if kind not in SAMPLE_FILES:
        raise ValueError(f"unknown sample kind {kind!r}; use one of: {', '.join(SAMPLE_FILES)}")
    resource = resources.files("dynlab").joinpath(SAMPLE_FILES[kind])
    return MeasuredSource(f"dynlab/{SAMPLE_FILES[kind]}", lambda: resource.open("rb"), sample=True)


def path_of_sample(kind: str) -> str:
    """The file-system path of the sample for ``kind`` (for running ``dynlab summarize`` on it)."""
    return str(resources.files("dynlab").joinpath(SAMPLE_FILES[kind]))


# --------------------------------------------------------------------------------------------
# the artifacts


def compare_runs(field_name: str, labels: Sequence[str], values: Sequence[Any], base: SimConfig) -> dict:
    """What ``dynlab compare`` prints: ``run(replace(base, field=value))`` keyed by ``label`` (as written)."""
    return {label: run(replace(base, **{field_name: value})) for label, value in zip(labels, values)}


def _capacity(label: str) -> Optional[int]:
    return None if label == "unbounded" else int(label)


def lab000_artifacts(disagg: Optional[MeasuredSource] = None, warn: Warn = _ignore, progress=None) -> dict[str, Artifact]:
    """Lab 000's artifacts (see the module docstring), ``disagg_measured.json`` only with ``disagg``.

    Raises :class:`dynlab.errors.InputError` (``FILE:LINE: ...``) for a bad line of the measured file
    and :class:`dynlab.errors.DynlabError` for an empty one; ``OSError`` if it cannot be read.
    """
    out: dict[str, Artifact] = {}

    def add(name: str, command: str, data: Any) -> None:
        out[name] = Artifact(name, "lab000", command, data)
        if progress is not None:
            progress.update(1)

    modes = ("rr", "random", "kv")
    add("modes.json", f"dynlab compare --modes {','.join(modes)}",
        compare_runs("mode", modes, modes, SimConfig()))
    add("events.json", "dynlab compare --mode kv-events --publish yes,no",
        compare_runs("publish", ("yes", "no"), ("yes", "no"), SimConfig(mode="kv-events")))
    bpt = kvcost_lib.kv_bytes_per_token()
    add("kvcost.json", f"dynlab disagg --tokens {KV_TOKENS} --gbps {','.join(KV_GBPS)}",
        {g: kvcost_lib.cost_report(KV_TOKENS, bpt, float(g)) for g in KV_GBPS})
    if disagg is not None:
        add("disagg_measured.json", f"dynlab summarize disagg {disagg.name} -",
            disagg.summarize(summarize_lib.summarize_disagg, warn))
    bounded = {}
    for label in BOUNDED_CAPACITIES:
        base = SimConfig(capacity=_capacity(label), all_metrics=True)
        bounded[label] = compare_runs("mode", BOUNDED_MODES, BOUNDED_MODES, base)
    add("bounded.json",
        f"dynlab compare --modes {','.join(BOUNDED_MODES)} --capacity C --all-metrics` "
        f"for C = {', '.join(BOUNDED_CAPACITIES)}, keyed by `C",
        bounded)
    return out


def lab002_artifacts(offload: Optional[MeasuredSource] = None, warn: Warn = _ignore, progress=None) -> dict[str, Artifact]:
    """Lab 002's artifacts (see the module docstring), ``offload_measured.json`` only with ``offload``.

    Raises as :func:`lab000_artifacts` for a bad measured file.
    """
    out: dict[str, Artifact] = {}

    def add(name: str, command: str, data: Any) -> None:
        out[name] = Artifact(name, "lab002", command, data)
        if progress is not None:
            progress.update(1)

    fwd2 = ["fwd", "fwd"]
    add("cyclic.json", "dynlab scenario --passes fwd,fwd", run_scenario(passes=fwd2))
    add("cyclic_opt.json", "dynlab scenario --passes fwd,fwd --policy opt", run_scenario(passes=fwd2, policy="opt"))
    add("baseline.json", "dynlab scenario", run_scenario())
    add("cliff.json", f"dynlab cliff --gpu {','.join(GPU_SWEEP)} --passes fwd,fwd",
        cliff([int(c) for c in GPU_SWEEP], over="gpu", labels=GPU_SWEEP, passes=fwd2))
    add("offload.json", f"dynlab scenario --gpu {DEFAULT_GPU} --cpu {OFFLOAD_CPU} --passes fwd,fwd,rev",
        run_scenario(gpu=DEFAULT_GPU, cpu=OFFLOAD_CPU, passes=["fwd", "fwd", "rev"]))
    add("cpu_cliff.json",
        f"dynlab cliff --gpu {DEFAULT_GPU} --cpu {','.join(CPU_SWEEP)} --passes fwd,fwd --metric misses",
        cliff([int(c) for c in CPU_SWEEP], over="cpu", metric="misses", labels=CPU_SWEEP, gpu=DEFAULT_GPU,
              passes=fwd2))
    if offload is not None:
        add("offload_measured.json", f"dynlab summarize offload {offload.name} -",
            offload.summarize(summarize_lib.summarize_offload, warn))
    return out


def artifact_names() -> list[str]:
    """Every file name ``dynlab reproduce`` can write (JSON, plots, report), whatever the options."""
    return ["modes.json", "events.json", "kvcost.json", "disagg_measured.json", "bounded.json",
            "cyclic.json", "cyclic_opt.json", "baseline.json", "cliff.json", "offload.json", "cpu_cliff.json",
            "offload_measured.json", "strategies.png", "bounded.png", "cliff_gpu.png", "cliff_cpu.png", REPORT]


# --------------------------------------------------------------------------------------------
# plots


def _total_tokens() -> int:
    return DEFAULT_DOCS * DEFAULT_TOKENS


def lab_plots(artifacts: Mapping[str, Artifact]) -> dict[str, Plot]:
    """The plots whose data is among ``artifacts``; drawing them needs matplotlib."""
    from dynlab.labs import report_plots as rp

    data = {name: a.data for name, a in artifacts.items()}
    total = _total_tokens()
    mark = f"documents' total: {DEFAULT_DOCS} x {DEFAULT_TOKENS:,} = {total:,} tokens"
    out: dict[str, Plot] = {}
    if "modes.json" in data and "events.json" in data:
        out["strategies.png"] = Plot(
            "strategies.png", "lab000", "Hits per strategy on the lab-000 workload (modes.json, events.json)",
            lambda path: rp.plot_strategies(data["modes.json"], data["events.json"], path))
    if "bounded.json" in data:
        out["bounded.png"] = Plot(
            "bounded.png", "lab000", "Hits per strategy with bounded vs unbounded worker caches (bounded.json)",
            lambda path: rp.plot_bounded(data["bounded.json"], path, bands=LAB000_MEASURED))
    if "cliff.json" in data:
        out["cliff_gpu.png"] = Plot(
            "cliff_gpu.png", "lab002", "Second-pass hits against GPU capacity (cliff.json)",
            lambda path: rp.plot_cliff(data["cliff.json"], path, xlabel="GPU KV capacity (tokens)",
                                       ylabel="hits in the second pass",
                                       title="GPU cliff: cyclic re-read of 10 documents under LRU",
                                       mark=total, mark_label=mark, fixed_note="no CPU tier"))
    if "cpu_cliff.json" in data:
        out["cliff_cpu.png"] = Plot(
            "cliff_cpu.png", "lab002", "Second-pass misses against CPU capacity (cpu_cliff.json)",
            lambda path: rp.plot_cliff(data["cpu_cliff.json"], path, xlabel="CPU KV capacity (tokens)",
                                       ylabel="misses in the second pass",
                                       title="CPU cliff: the same re-read with a CPU tier under the GPU",
                                       mark=total, mark_label=mark,
                                       fixed_note=f"GPU capacity {DEFAULT_GPU:,} tokens"))
    return out


# --------------------------------------------------------------------------------------------
# the report


def _n(value: Union[int, float]) -> str:
    """A number as the report prints it: thousands separators for integers."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _join(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _plural(count: int, word: str) -> str:
    return f"{_n(count)} {word}{'' if count == 1 else 's'}"


def _band(value: int, band: tuple[int, int]) -> str:
    low, high = band
    if value < low:
        return "below"
    if value > high:
        return "above"
    return "inside"


def _hits(passes: Mapping) -> int:
    return passes["gpu_hits"] + passes["cpu_hits"]


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


def _section_disagg_measured(d: Mapping, sources: Mapping[str, MeasuredSource]) -> list[str]:
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
    total = _total_tokens()
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
    total = _total_tokens()
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
    total = _total_tokens()
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


def _section_offload_measured(d: Mapping, sources: Mapping[str, MeasuredSource]) -> list[str]:
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


def render_report(artifacts: Mapping[str, Artifact], labs: Sequence[str],
                  sources: Optional[Mapping[str, MeasuredSource]] = None,
                  plots: Optional[Mapping[str, Plot]] = None, invocation: str = "dynlab reproduce OUTDIR") -> str:
    """``REPORT.md``: per artifact one or two sentences answering the lab's question from its numbers.

    Every number is read from ``artifacts`` (the same objects written as JSON beside the report); the
    only fixed figures are the labs' own measured ranges (:data:`LAB000_MEASURED`). Plots in ``plots``
    are embedded with relative links; without ``plots`` the report says they were not drawn.
    """
    sources = dict(sources or {})
    plots = dict(plots or {})
    d = {name: a.data for name, a in artifacts.items()}
    lines = [
        "# The two labs, reproduced",
        "",
        f"Written by `{invocation}` (dynlab {__version__}). Every number below is read from the JSON file "
        "named beside it, and every JSON file is exactly what the command listed with it prints.",
        "",
        "| file | equivalent command |",
        "|---|---|",
    ]
    for a in artifacts.values():
        lines.append(f"| [`{a.name}`]({a.name}) | `{a.command}` |")
    for p in plots.values():
        lines.append(f"| [`{p.name}`]({p.name}) | plot: {p.caption} |")
    lines.append("")
    if not plots:
        lines.extend(["Plots were not drawn (`--no-plots`).", ""])
    if "lab000" in labs:
        lines.extend(["## Lab 000: KV-aware routing and the cost of disaggregated serving", ""])
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
    if "lab002" in labs:
        lines.extend(["## Lab 002: an LRU KV cache, a CPU tier, and their cliffs", ""])
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
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# everything


def build(
    only: Optional[str] = None,
    disagg: Optional[MeasuredSource] = None,
    offload: Optional[MeasuredSource] = None,
    with_plots: bool = True,
    warn: Warn = _ignore,
    invocation: str = "dynlab reproduce OUTDIR",
    progress=None,
) -> Reproduction:
    """Compute every artifact of the labs (``only``: one of :data:`LABS`), the plots' data and ``REPORT.md``.

    ``disagg`` / ``offload``: measured files to summarize (:func:`measured_file`, :func:`sample_file`);
    a source whose lab is not selected is ignored. ``with_plots=False`` leaves the plots out of the
    result and the report. ``warn`` receives the summaries' warnings. ``invocation`` is quoted at the
    top of the report. ``progress``: an object with ``update(n)`` (a tqdm bar) told of each artifact
    computed, or ``None``.

    Raises ``ValueError`` for an unknown ``only``, and what :func:`lab000_artifacts` raises for a bad
    measured file. Nothing is written.
    """
    if only is not None and only not in LABS:
        raise ValueError(f"unknown lab {only!r}; use one of: {', '.join(LABS)}")
    labs = (only,) if only else LABS
    artifacts: dict[str, Artifact] = {}
    sources: dict[str, MeasuredSource] = {}
    if "lab000" in labs:
        artifacts.update(lab000_artifacts(disagg, warn, progress))
        if disagg is not None:
            sources["disagg"] = disagg
    if "lab002" in labs:
        artifacts.update(lab002_artifacts(offload, warn, progress))
        if offload is not None:
            sources["offload"] = offload
    plots = lab_plots(artifacts) if with_plots else {}
    report = render_report(artifacts, labs, sources, plots, invocation)
    return Reproduction(labs, artifacts, plots, report)
