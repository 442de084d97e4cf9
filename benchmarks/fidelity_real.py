"""dynlab against real GPUs: the real measurements under benchmarks/data/real/, replayed (issue 38 item 5).

Fetches nothing: it reads ``benchmarks/data/real/*.csv`` (provenance and licences in that folder's
README.md). Each row is one measured benchmark stage (a server, a client driving it at a fixed
concurrency or a Poisson rate, a length distribution); each is replayed by
:func:`dynlab.calibrate.replay.replay` on one simulated server of the row's model, GPU and tp, with the
row's measured length distribution where a ``*_lengths.json`` beside the CSV gives its percentiles
(:func:`with_lengths`), else its mean lengths (``random_input_len`` / ``random_output_len``), at most
``dynlab.calibrate.replay.MAX_REQUESTS`` requests, with the row's ``max_num_seqs`` and
``max_num_batched_tokens``.

For each latency model and each (model, GPU, tp) group it reports the error of every measured figure
(``predicted / measured - 1``):

- ``uncalibrated``: the model's defaults;
- ``calibrated (cv)``: k-fold cross-validated (:func:`dynlab.calibrate.fit.calibrate`, k = min(5, rows in the
  group)): each row predicted by a fit on the group's other rows, so no row's error comes from a fit that saw it;
  or, with ``--fit-on REGEX``, one fit per group on its rows whose experiment matches, the others predicted by
  it (held out as well; cheaper: InferenceMAX's groups fit on their concurrency-4 points, docs/fidelity.md).

The summary table is the median over rows of ``|error|`` per metric, in percent (docs/fidelity.md). Models a
row needs that dynlab does not bundle are the config.json files under ``benchmarks/data/real/models/``.

    python benchmarks/fidelity_real.py [--latency-model roofline[,linear]] [--files A.csv[,B.csv]] [--only SUBSTRING]
        [--uncalibrated | --fit-on REGEX] [--fit NAME[,NAME...]] [--folds K] [--cv-only] [--max-nfev N] [--json FILE]
    python benchmarks/fidelity_real.py --from-json A.json[,B.json]

``--folds K``: the k of the k-fold calibration (5 by default; each group takes min(K, its rows)); ``--cv-only``
scores the same held-out rows without the fit on each whole group (one fit fewer; ``fitted`` stays empty).
``--from-json``: the tables of earlier runs' ``--json`` files, merged, without replaying anything: a long
k-fold run can be split into one process per group (``--only``) and its tables printed once all are in.

``--files`` defaults to BLIS's ``blis_h100.csv`` (the run docs/fidelity.md quotes first); each CSV named is
scored on its own (its own fits, its own table), so adding a file leaves the others' figures as they were.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys
import time
from collections import defaultdict
from dataclasses import replace
from statistics import median

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(HERE, "data", "real")
sys.path.insert(0, os.path.dirname(HERE))

from dynlab.calibrate.fit import RUN_PARAMS, calibrate, cross_validate  # noqa: E402
from dynlab.calibrate.formats import MeasuredPoint  # noqa: E402
from dynlab.calibrate.replay import MAX_REQUESTS, METRICS, lengths, measured, replay  # noqa: E402
from dynlab.engine.config import SimConfig  # noqa: E402

#: a row's Hugging Face model id -> dynlab's bundled name or a config.json under data/real/models
MODELS = {"meta-llama/Llama-2-7b-hf": "llama-2-7b", "meta-llama/Llama-2-70b-hf": "llama-2-70b",
          "codellama/CodeLlama-34b-Instruct-hf": "codellama-34b", "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
          # DeepSeek-R1-0528 is DeepSeek-V3's architecture (its config.json: DeepseekV3ForCausalLM, the same
          # layers, MLA and experts, FP8 block-quantised weights): dynlab's bundled deepseek-v3
          "deepseek-ai/DeepSeek-R1-0528": "deepseek-v3"}
SHORT = {"median_ttft_ms": "TTFT p50", "p99_ttft_ms": "TTFT p99", "median_tpot_ms": "TPOT p50",
         "p99_tpot_ms": "TPOT p99", "median_e2el_ms": "E2E p50", "total_token_throughput_per_gpu": "tok/s/GPU"}
_INT = ("tp", "ep", "max_concurrency", "num_prompts")
#: the server settings a row states, as dynlab's options (vLLM's names)
_SERVER = ("max_num_seqs", "max_num_batched_tokens")
_FLOAT = ("request_rate", "random_range_ratio", "median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
          "mean_tpot_ms", "p99_tpot_ms", "median_itl_ms", "median_e2el_ms", "p99_e2el_ms", "total_token_throughput",
          "output_throughput")


def model_for(hf_id: str) -> str:
    """dynlab's ``--model`` for a row's model: a bundled name, or the config.json shipped beside the data."""
    name = MODELS.get(hf_id, hf_id.rsplit("/", 1)[-1].lower())
    local = os.path.join(REAL, "models", name, "config.json")
    return local if os.path.isfile(local) else name


def quantile_lengths(table: dict, n: int) -> list[int]:
    """``n`` lengths at the quantiles ``(i + 0.5) / n`` of a percentile table ``{percent: tokens}``
    (linear between the listed percentiles), so the replay's lengths have the measured distribution."""
    ps = sorted((float(p), float(v)) for p, v in table.items())
    out = []
    for i in range(n):
        q = 100.0 * (i + 0.5) / n
        k = next(j for j in range(1, len(ps)) if ps[j][0] >= q or j == len(ps) - 1)
        (p0, v0), (p1, v1) = ps[k - 1], ps[k]
        out.append(round(v0 + (v1 - v0) * (q - p0) / (p1 - p0) if p1 > p0 else v1))
    return out


def with_lengths(point: MeasuredPoint, table: dict) -> MeasuredPoint:
    """``point`` with per-request lengths drawn from its stage's measured percentiles (``*_lengths.json``):
    each list at the quantiles, then shuffled with a fixed seed (inputs and outputs paired at random)."""
    import random

    n = min(point.num_prompts or MAX_REQUESTS, MAX_REQUESTS)
    ins, outs = quantile_lengths(table["prompt_len"], n), quantile_lengths(table["output_len"], n)
    rng = random.Random(0)
    rng.shuffle(ins)
    rng.shuffle(outs)
    return replace(point, input_lens=tuple(max(x, 1) for x in ins), output_lens=tuple(max(x, 1) for x in outs))


def read_rows(path: str) -> list[MeasuredPoint]:
    """The rows of one real-measurement CSV (tests/test_real_data.py pins its columns) as measured points."""
    points = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            values = {k: int(float(row[k])) for k in _INT if row.get(k)}
            values.update({k: float(row[k]) for k in _FLOAT if row.get(k)})
            for k in ("random_input_len", "random_output_len"):
                if row.get(k):
                    values[k] = round(float(row[k]))
            point = MeasuredPoint(source=row["experiment"], model=row["model"], gpu=row["gpu"],
                                  engine=row["engine"] or None, version=row["version"] or None,
                                  per_gpu=row["per_gpu"] == "true", arrival=row.get("arrival") or None, **values)
            points.append(point)
            SERVER[point.source] = {k: int(row[k]) for k in _SERVER if row.get(k)}
            if row["engine"] == "sglang":
                SERVER[point.source] = sglang_server(SERVER[point.source], path, point.ep or 1)
    side = path[:-len(".csv")] + "_lengths.json"
    if os.path.isfile(side):
        with open(side) as fh:
            tables = json.load(fh)
        points = [with_lengths(p, tables[p.source]) if p.source in tables else p for p in points]
    return points


#: experiment -> the settings its row states, as SimConfig fields (vLLM's max_num_seqs, max_num_batched_tokens;
#: an SGLang row's, :func:`sglang_server`)
SERVER: dict = {}
#: an SGLang row's columns -> SimConfig's SGLang fields (data/real/README.md: the CSV's vLLM-named columns hold
#: SGLang's --max-running-requests and --chunked-prefill-size)
_SGLANG_COLUMNS = {"max_num_seqs": "max_running_requests", "max_num_batched_tokens": "chunked_prefill_size"}


def sglang_server(vllm_named: dict, path: str, ep: int = 1) -> dict:
    """An SGLang row's server as SimConfig fields: ``engine_kind`` sglang, its columns under SGLang's names
    (:data:`_SGLANG_COLUMNS`), ``ep``, and the flags the CSV's columns cannot hold, from the
    ``*_server.json`` beside the CSV (a mapping of SimConfig fields: ``mem_fraction_static``,
    ``disable_radix_cache``, ``max_prefill_tokens``; data/real/README.md gives their source)."""
    out = {"engine_kind": "sglang", "ep": ep}
    out.update({_SGLANG_COLUMNS[k]: v for k, v in vllm_named.items()})
    side = path[:-len(".csv")] + "_server.json"
    if os.path.isfile(side):
        with open(side) as fh:
            out.update(json.load(fh))
    return out


def _errors(point, config) -> dict:
    want, got = measured(point), replay(point, config, lengths(point))
    return {m: 100.0 * (got[m] / want[m] - 1.0) for m in want if m in got and math.isfinite(got[m])}


def fitted_config(config: SimConfig, opts: dict) -> SimConfig:
    """``config`` with a fit's values: run settings (``RUN_PARAMS``) as fields, the rest as latency options."""
    run = {k: float(v) for k, v in opts.items() if k in RUN_PARAMS}
    latency = dict(config.latency_opts, **{k: repr(float(v)) for k, v in opts.items() if k not in RUN_PARAMS})
    return replace(config, latency_opts=latency, **run)


def _group_rows(members, configs, folds: int, max_nfev: int, fit: bool, fit_on, cv_only: bool,
                fit_names=None) -> list[dict]:
    """One group's rows (:func:`score`): k-fold held out (``cv_only``: without the fit on all of them), or
    (``fit_on``) one fit on the matching rows and the others predicted by it; the defaults' errors unless
    ``fit_on`` is given. ``fit_names``: the options fitted (``dynlab calibrate --fit``; default its own)."""
    cal, held = None, [{} for _ in members]
    if fit_on is not None:
        train = [i for i, p in enumerate(members) if fit_on.search(p.source)]
        if train and len(train) < len(members):
            cal = calibrate([members[i] for i in train], [configs[i] for i in train], fit=fit_names, folds=1,
                            max_nfev=max_nfev)
            held = [{} if i in train else _errors(p, fitted_config(configs[i], cal.opts))
                    for i, p in enumerate(members)]
    elif fit and len(members) >= 3 and cv_only:
        held = [row["error_pct"] for row in cross_validate(members, configs, fit=fit_names, folds=folds,
                                                               max_nfev=max_nfev)]
    elif fit and len(members) >= 3:
        cal = calibrate(members, configs, fit=fit_names, folds=folds, max_nfev=max_nfev)
        held = [row["error_pct"] for row in cal.cv_points]
    return [{"source": p.source, "uncalibrated": _errors(p, configs[i]) if fit_on is None else {}, "cv": held[i],
             "fitted": cal.opts if cal is not None else {}} for i, p in enumerate(members)]


def score(points: list, latency_model: str, folds: int = 5, max_nfev: int = 15, fit: bool = True,
          fit_on=None, cv_only: bool = False, fit_names=None, latency_opts=None) -> list[dict]:
    """Per row: ``{"source", "group", "uncalibrated": {metric: error %}, "cv": {metric: error %}}`` (``cv``
    empty when ``fit`` is false or the group has fewer than 3 rows). ``fit_on`` (a compiled regular
    expression): instead of k folds, fit each group once on its rows whose experiment matches and predict
    the others with it (their ``cv``; the fitted rows' is empty), without the defaults (``uncalibrated`` empty).
    ``fit_names``: the options to fit (``dynlab calibrate --fit``; None: :data:`dynlab.calibrate.fit.DEFAULT_FIT`).
    ``latency_opts``: ``{NAME: VALUE}`` given to every replay (``--latency-opt``), over the engine's defaults."""
    groups = defaultdict(list)
    for p in points:
        groups[(p.model, p.gpu, p.tp or 1)].append(p)
    rows = []
    for (model, gpu, tp), members in groups.items():
        base = SimConfig(timing=True, latency_model=latency_model, model=model_for(model), gpu=gpu, tp=tp,
                         latency_opts=dict(latency_opts or {}))
        configs = [replace(base, **SERVER.get(p.source, {})) for p in members]
        mine = _group_rows(members, configs, folds, max_nfev, fit, fit_on, cv_only, fit_names)
        rows.extend(dict(r, group=f"{model} tp{tp} {gpu}") for r in mine)
        print(f"# {latency_model} {model} tp{tp} {gpu}: fitted {mine[0]['fitted'] or '-'}; held out "
              f"{summary(mine, 'cv')}; defaults {summary(mine, 'uncalibrated')}", file=sys.stderr, flush=True)
    return rows


def summary(rows: list[dict], stage: str) -> dict:
    """Per metric the median |error| (percent, 0.1) over ``rows`` at ``stage``, and how many rows had it."""
    out = {}
    for m in METRICS:
        errs = [abs(r[stage][m]) for r in rows if m in r[stage]]
        if errs:
            out[m] = (round(median(errs), 1), len(errs))
    return out


def table(results: dict) -> str:
    metrics = [m for m in METRICS if any(m in summary(rows, stage) for rows in results.values()
                                         for stage in ("uncalibrated", "cv"))]
    head = ["latency model", "stage"] + [SHORT[m] for m in metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rows in results.items():
        for stage, label in (("uncalibrated", "defaults"), ("cv", "calibrated, held out")):
            s = summary(rows, stage)
            if not s:  # no fit was made (--uncalibrated, or groups of fewer than 3 rows)
                continue
            cells = [f"{s[m][0]:.1f} % ({s[m][1]})" if m in s else "-" for m in metrics]
            lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def chosen(files: str) -> list[str]:
    """The CSV names of data/real that ``--files`` names (a comma list, or ``all``), sorted; exits with one
    line naming the files there when a name is not one of them."""
    names = sorted(n for n in os.listdir(REAL) if n.endswith(".csv"))
    if files == "all":
        return names
    unknown = sorted(set(files.split(",")) - set(names))
    if unknown:
        sys.exit(f"fidelity_real.py: no {', '.join(unknown)} under {REAL} (there: {', '.join(names)})")
    return [n for n in names if n in files.split(",")]


def _per_row(name: str, rows: list) -> None:
    for r in rows:
        nan = float("nan")
        cells = ", ".join(f"{SHORT[m]} {r['uncalibrated'].get(m, nan):+.0f} -> {r['cv'].get(m, nan):+.0f}"
                          for m in METRICS if m in r["uncalibrated"] or m in r["cv"])
        print(f"  {name} {r['source']}: {cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency-model", default="roofline,linear")
    ap.add_argument("--files", default="blis_h100.csv",
                    help="the CSVs of data/real to score, a table each (comma list of names, or 'all')")
    ap.add_argument("--only", default=None, help="only the rows whose experiment contains this")
    ap.add_argument("--uncalibrated", action="store_true", help="the defaults only: no fit, no held-out column")
    ap.add_argument("--max-nfev", type=int, default=15, help="least_squares evaluations per start of each fit")
    ap.add_argument("--folds", type=int, default=None,
                    help="k of the k-fold calibration (default 5; per group, at most its rows)")
    ap.add_argument("--cv-only", action="store_true",
                    help="k-fold held-out errors only: skip each group's fit on all its rows (no fitted values)")
    ap.add_argument("--from-json", default=None, metavar="A.json[,B.json]",
                    help="print the tables of earlier runs' --json files, merged; replays nothing")
    ap.add_argument("--fit-on", default=None, metavar="REGEX",
                    help="fit each group once on its rows whose experiment matches; score the others (no defaults)")
    ap.add_argument("--json", default=None, help="also write every row's errors here")
    ap.add_argument("--latency-opt", action="append", default=[], metavar="NAME=VALUE",
                    help="an option of the latency model for every replay (repeatable), as dynlab sim's")
    ap.add_argument("--fit", default=None, metavar="NAME[,NAME...]",
                    help="the options to fit, as dynlab calibrate --fit (default: its defaults per latency model)")
    args = ap.parse_args()
    _refuse_idle(args)
    if args.from_json:
        by_file = merged(args.from_json.split(","))
        for file, results in sorted(by_file.items()):
            report(file, results, len(by_file) > 1)
        return
    names = chosen(args.files)
    out: dict = {}
    for file in names:
        points = [p for p in read_rows(os.path.join(REAL, file)) if not args.only or args.only in p.source]
        if not points:
            continue
        results = {}
        for name in args.latency_model.split(","):
            start = time.perf_counter()
            results[name] = score(points, name, folds=args.folds or 5, max_nfev=args.max_nfev,
                                  fit=not args.uncalibrated, cv_only=args.cv_only,
                                  fit_on=re.compile(args.fit_on) if args.fit_on else None,
                                  fit_names=args.fit.split(",") if args.fit else None,
                                  latency_opts=dict(o.split("=", 1) for o in args.latency_opt))
            print(f"# {file} {name}: {len(points)} rows in {time.perf_counter() - start:.0f} s", file=sys.stderr)
            out.setdefault(name, []).extend(dict(r, file=file) for r in results[name])
        report(file, results, len(names) > 1)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


def _refuse_idle(args) -> None:
    """Exit with one line when ``--folds`` or ``--cv-only`` would do nothing (no k-fold is run with
    ``--uncalibrated``, ``--fit-on`` or ``--from-json``), ``--folds`` is below 2 or a ``--latency-opt`` is not
    ``NAME=VALUE``."""
    for opt in args.latency_opt:
        if "=" not in opt:
            sys.exit(f"fidelity_real.py: --latency-opt {opt}: give NAME=VALUE")
    if args.folds is not None and args.folds < 2:
        sys.exit(f"fidelity_real.py: --folds {args.folds}: k-fold needs at least 2 folds")
    given = [o for o, v in (("--folds", args.folds is not None), ("--cv-only", args.cv_only)) if v]
    other = [o for o, v in (("--uncalibrated", args.uncalibrated), ("--fit-on", args.fit_on),
                            ("--from-json", args.from_json)) if v]
    if given and other:
        sys.exit(f"fidelity_real.py: {given[0]} has no effect with {other[0]}: no k-fold calibration is run")


def report(file: str, results: dict, named: bool) -> None:
    """Print one CSV's table (``results``: latency model -> rows of :func:`score`) and its rows."""
    if named:
        print(f"\n{file}:")
    print(table(results))
    print("\nper row (error %, uncalibrated -> held out):")
    for name, rows in results.items():
        _per_row(name, rows)


def merged(paths: list[str]) -> dict:
    """``{file: {latency model: rows}}`` of several ``--json`` files (rows in the files' order). Exits with one
    line when a file is missing, is not such a file, or repeats a row another file holds (the same
    experiment, file and latency model), since its medians would count that row twice."""
    out: dict = {}
    seen = set()
    for path in paths:
        try:
            with open(path) as fh:
                data = json.load(fh)
            rows = [(name, r) for name, rs in data.items() for r in rs]
            keys = [(r["file"], name, r["source"]) for name, r in rows]
        except (OSError, ValueError, AttributeError, TypeError, KeyError) as exc:
            sys.exit(f"fidelity_real.py: {path}: not a --json file of fidelity_real.py ({exc})")
        again = sorted(k[2] for k in set(keys) & seen)
        if again:
            sys.exit(f"fidelity_real.py: {path}: rows already in an earlier file: {', '.join(again[:3])}")
        seen.update(keys)
        for name, r in rows:
            out.setdefault(r["file"], {}).setdefault(name, []).append(r)
    return out


if __name__ == "__main__":
    main()
