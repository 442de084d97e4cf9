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
from dynlab.labs.lab_inputs import (
    BOUNDED_CAPACITIES, BOUNDED_MODES, CPU_SWEEP, GPU_SWEEP, KV_GBPS, KV_TOKENS, LAB000_MEASURED, OFFLOAD_CPU,
    total_tokens,
)
from dynlab.labs.report_lab000 import lab000_report
from dynlab.labs.report_lab002 import lab002_report
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


def lab_plots(artifacts: Mapping[str, Artifact]) -> dict[str, Plot]:
    """The plots whose data is among ``artifacts``; drawing them needs matplotlib."""
    from dynlab.labs import report_plots as rp

    data = {name: a.data for name, a in artifacts.items()}
    total = total_tokens()
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


def render_report(artifacts: Mapping[str, Artifact], labs: Sequence[str],
                  sources: Optional[Mapping[str, MeasuredSource]] = None,
                  plots: Optional[Mapping[str, Plot]] = None, invocation: str = "dynlab reproduce OUTDIR") -> str:
    """``REPORT.md``: per artifact one or two sentences answering the lab's question from its numbers.

    Every number is read from ``artifacts`` (the same objects written as JSON beside the report); the
    only fixed figures are the labs' own measured ranges (:data:`LAB000_MEASURED`). Plots in ``plots``
    are embedded with relative links; without ``plots`` the report says they were not drawn. Each lab's
    sentences: :func:`dynlab.labs.report_lab000.lab000_report`, :func:`dynlab.labs.report_lab002.lab002_report`.
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
        lines.extend(lab000_report(d, sources, plots))
    if "lab002" in labs:
        lines.extend(lab002_report(d, sources, plots))
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
