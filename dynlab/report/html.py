"""The self-contained HTML report: :func:`build_report` (runs and optional per-request records -> one HTML
document) and :func:`write_report` (atomically to a file).

The document loads nothing: styles are inline, figures are inline SVG, there is no script, and a
Content-Security-Policy (``default-src 'none'``) forbids any request, so it opens offline, from a mail
attachment or an archive, exactly as it was written.
"""
from __future__ import annotations

import html
from typing import Mapping, Optional, Sequence

from dynlab.report.figures import Figure, hit_rates, latency_percentiles, metric, per_worker
from dynlab.report.record_figures import record_figures
from dynlab.report.runs import Run, shared_and_varied, short_labels
from dynlab.report.scaling_figures import fleet_over_time
from dynlab.report.sweep_figures import frontier_figure, sweep_figure, sweep_metrics

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

#: the headline table: (column, dotted path in a result); a column appears when some run has it
HEADLINE = [("requests", "requests"), ("hit_rate", "hit_rate"), ("block_hit_rate", "block_hit_rate"),
            ("prefix_hit_rate", "prefix_hit_rate"), ("ideal", "ideal_block_hit_rate"),
            ("pred_error", "prediction_error"), ("evicted", "evicted_blocks"), ("imbalance", "load_imbalance"),
            ("ttft_p50_ms", "ttft_ms.p50"), ("ttft_p99_ms", "ttft_ms.p99"), ("tpot_p50_ms", "tpot_ms.p50"),
            ("tpot_p99_ms", "tpot_ms.p99"), ("goodput", "goodput"), ("tok_s_gpu", "output_tokens_per_s_per_gpu"),
            ("xfer_p50_ms", "transfer_ms.p50"), ("xfer_p99_ms", "transfer_ms.p99"), ("preempted", "preemptions"),
            ("rejected", "rejected")]

#: the configuration table: (setting, key of a result or of the context); a row appears when some run has it
CONFIG = [("strategy", "mode"), ("workers", "workers"), ("prefill workers", "prefill_workers"),
          ("decode workers", "decode_workers"), ("decode router", "decode_router"), ("model", "model"),
          ("GPU", "gpu"), ("TP (GPUs per worker)", "tp"), ("latency model", "latency_model"),
          ("admission", "admission"), ("async scheduling", "async_scheduling"),
          ("latency model's domain", "latency_domain"),
          ("KV pool (blocks per worker)", "kv_blocks"), ("pool derivation", "kv_blocks_source"),
          ("CPU tier (blocks per worker)", "cpu_kv_blocks"), ("CPU tier derivation", "cpu_kv_blocks_source"),
          ("CPU tier write", "cpu_write"), ("tokens per block", "block"), ("tokens per trace block", "trace_block"),
          ("KV link (GB/s)", "link_gbps"), ("KV events published", "publish")]

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1b1b;background:#fff;margin:0}
main{max-width:1200px;margin:0 auto;padding:1.2em 1.5em 3em}
h1{font-size:1.6em;margin:.2em 0 .1em}h2{font-size:1.25em;margin:1.6em 0 .4em;border-bottom:1px solid #ddd}
code,.cmd{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.9em}
.cmd{background:#f4f4f4;padding:.5em .7em;border-radius:4px;overflow-x:auto;white-space:pre-wrap}
table{border-collapse:collapse;margin:.4em 0;font-size:.9em}
th,td{border:1px solid #ddd;padding:.25em .4em;text-align:right;vertical-align:top}
th{background:#f4f6f8}th.l{white-space:nowrap}td.l,th.l{text-align:left}td.src{font-size:.85em;text-align:left;max-width:48em}
.scroll{overflow-x:auto}figure{margin:1.2em 0;padding:0}figcaption{font-size:.92em;color:#333;margin:.3em 0}
figure svg{max-width:100%;height:auto}details summary{cursor:pointer;color:#0b5cad;font-size:.9em}
footer{margin-top:3em;color:#666;font-size:.85em}
"""


def _e(value) -> str:
    return html.escape("-" if value is None else str(value))


def _table(header: Sequence, rows: Sequence[Sequence], left: int = 1) -> str:
    # a column name may break after each underscore (ttft_p50_ms), so a wide table's header does not set its width
    head = "".join(f'<th scope="col"{" class=l" if j < left else ""}>{_e(h).replace("_", "_<wbr>")}</th>'
                   for j, h in enumerate(header))
    body = "".join("<tr>" + "".join((f'<th scope="row" class=l>{_e(c)}</th>' if j == 0 else
                                     f'<td{" class=l" if j < left else ""}>{_e(c)}</td>') for j, c in enumerate(row))
                   + "</tr>" for row in rows)
    return f'<div class=scroll><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def headline_rows(runs: Sequence[Run]) -> tuple[list, list]:
    """``(header, rows)`` of the headline table: a row per run, the :data:`HEADLINE` columns some run has."""
    cols = [(name, path) for name, path in HEADLINE if any(metric(r.result, path) is not None for r in runs)]
    return ["run"] + [c for c, _ in cols], [[r.label] + [metric(r.result, p) for _, p in cols] for r in runs]


#: a timed run whose latency model reported no ``latency_domain`` answers inside the model's domain
IN_DOMAIN = "inside it (the model reported nothing outside what it was fitted or measured on)"


def _setting(result: Mapping, key: str):
    """A configuration value of a result; ``latency_domain`` is :data:`IN_DOMAIN` for a timed run without it; a
    flag (``async_scheduling``) is ``on`` or ``off``."""
    value = result.get(key)
    if value is None and key == "latency_domain" and result.get("latency_model") is not None:
        return IN_DOMAIN
    if isinstance(value, bool):  # async_scheduling
        return "on" if value else "off"
    return value


def config_rows(runs: Sequence[Run], context: Mapping) -> list[list]:
    """``[setting, value]`` rows: each :data:`CONFIG` setting some run has (one value, or each run's), then
    the context's (trace, arrivals, ...)."""
    rows = []
    for name, key in CONFIG:
        values = [(r.label, _setting(r.result, key)) for r in runs if _setting(r.result, key) is not None]
        if not values:
            continue
        distinct = list(dict.fromkeys(str(v) for _, v in values))
        if len(distinct) == 1:
            rows.append([name, distinct[0]])
        elif all(str(v) == label for label, v in values):
            rows.append([name, ", ".join(distinct)])
        elif len(values) <= 8:
            rows.append([name, "; ".join(f"{label}: {v}" for label, v in values)])
        else:
            rows.append([name, f"{len(distinct)} values: " + ", ".join(distinct[:8]) + (", ..." if len(distinct) > 8 else "")])
    rows += [[k, v] for k, v in context.items() if k != "command" and v is not None]
    return rows


def _figure_html(fig: Figure) -> str:
    svg = fig.svg.replace("<svg ", f'<svg role="img" aria-labelledby="{fig.key}-cap" ', 1)
    return (f'<figure id="{fig.key}"><h3>{_e(fig.title)}</h3>{svg}'
            f'<figcaption id="{fig.key}-cap">{_e(fig.caption)}</figcaption>'
            f'<details><summary>The numbers of this figure</summary>{_table(fig.header, fig.rows)}</details></figure>')


def figures(runs: Sequence[Run], records: Optional[Mapping[str, Sequence[dict]]] = None,
            usage: Optional[Mapping[str, dict]] = None) -> list[Figure]:
    """Every figure for these runs, records and usage series, in report order: records' CDFs first when
    given; the usage series' figure after the per-worker load."""
    out = record_figures(records or {})
    out += [f for f in (latency_percentiles(runs), hit_rates(runs), per_worker(runs)) if f]
    if usage:
        from dynlab.report.usage_figures import usage_over_time

        out += [f for f in (usage_over_time(usage),) if f]
    out += [f for f in (fleet_over_time(runs, records),) if f]
    if any(r.cell is not None for r in runs):
        out += [f for f in (frontier_figure(runs), *(sweep_figure(runs, m) for m in sweep_metrics(runs))) if f]
    return out


def build_report(runs: Sequence[Run], records: Optional[Mapping[str, Sequence[dict]]] = None,
                 context: Optional[Mapping] = None, title: Optional[str] = None,
                 sections: Sequence[tuple] = (), extra_figures: Sequence[Figure] = (),
                 usage: Optional[Mapping[str, dict]] = None) -> str:
    """One self-contained HTML document about ``runs``.

    ``runs``: :class:`~dynlab.report.runs.Run` (``read_runs``/``runs_from_json`` make them from what
    ``sim``, ``compare`` and ``sweep`` print). ``records``: label -> per-request records
    (``read_records``) for the CDFs, load over time and the P/D transfer timeline. ``context``: what the
    run files do not say, shown in the configuration table (``command``: the command line asked, shown as
    the question; ``trace``, ``arrivals`` ...). ``sections``: ``(heading, text)`` pairs a command adds after the
    headline, each text shown preformatted (``plan``'s ranked table); ``extra_figures``: its own
    :class:`~dynlab.report.figures.Figure` objects, after the others. ``usage``: label -> the run's per-worker
    KV usage and load series (:meth:`dynlab.sim.recorders.UsageRecorder.series`), for the figure of them over
    time. Raises ``ValueError`` without runs;
    needs matplotlib."""
    if not runs:
        raise ValueError("a report needs at least one run")
    runs = unique_labels(short_labels(runs))
    context = dict(context or {})
    cells = [r.cell for r in runs if r.cell is not None]
    if len(cells) > 1:
        shared, _ = shared_and_varied(cells)
        context.setdefault("options of every cell", " ".join(f"{k}={v}" for k, v in shared.items()) or "none")
    if records:
        context.update(_arrival_rates(records))
    from dynlab import __version__

    title = title or default_title(runs)
    sources = [r.source for r in runs if r.source]
    question = context.get("command") or ("runs read from " + ", ".join(dict.fromkeys(sources)) if sources
                                          else "runs given without their command line")
    header, rows = headline_rows(runs)
    figs = figures(runs, records, usage) + list(extra_figures)
    nav = " · ".join(f'<a href="#{f.key}">{_e(f.title)}</a>' for f in figs)
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{_e(title)}</title><style>{STYLE}</style></head><body><main>',
        f'<h1>{_e(title)}</h1>',
        f'<h2 id="question">Question</h2><p class=cmd>{_e(question)}</p>',
        f'<h2 id="configuration">Configuration</h2>{_table(["setting", "value"], config_rows(runs, context), 2)}',
        f'<h2 id="headline">Headline</h2>{_table(header, rows)}',
        *(f'<h2 id="section-{i}">{_e(head)}</h2><pre class=cmd>{_e(text)}</pre>'
          for i, (head, text) in enumerate(sections, 1)),
        f'<h2 id="figures">Figures</h2><p>{nav}</p>' + "".join(_figure_html(f) for f in figs),
        f'<footer>Written by dynlab {_e(__version__)}. Every figure has its numbers below it; '
        f'the page loads nothing from the network.</footer></main></body></html>\n',
    ]
    return "\n".join(parts)


def default_title(runs: Sequence[Run]) -> str:
    """``dynlab sweep: 12 cells`` for a sweep, else ``dynlab: rr, kv, kv-events`` (six labels at most)."""
    if any(r.cell is not None for r in runs):
        return f"dynlab sweep: {len(runs)} cell{'s' if len(runs) != 1 else ''}"
    return f"dynlab: {', '.join(r.label for r in runs[:6])}{' ...' if len(runs) > 6 else ''}"


def unique_labels(runs: Sequence[Run]) -> list[Run]:
    """The runs, a label that repeats another run's made unique by its file (``kv (a.json)``) or a number."""
    from collections import Counter
    from dataclasses import replace
    import os

    counts = Counter(r.label for r in runs)
    out, used = [], set()
    for r in runs:
        label = r.label
        if counts[label] > 1:
            label = f"{r.label} ({os.path.basename(r.source)})" if r.source else r.label
            n = 2
            while label in used:
                label, n = f"{r.label} #{n}", n + 1
        used.add(label)
        out.append(replace(r, label=label))
    return out


def _arrival_rates(records: Mapping[str, Sequence[dict]]) -> dict:
    out = {}
    for label, recs in records.items():
        arrivals = sorted(r["arrival_ms"] for r in recs if r["arrival_ms"] is not None)
        if len(arrivals) > 1 and arrivals[-1] > arrivals[0]:
            rate = (len(arrivals) - 1) / ((arrivals[-1] - arrivals[0]) / 1000)
            out[f"arrival rate, {label} (requests/s, from its records)"] = round(rate, 3)
    return out


def write_report(path: str, runs: Sequence[Run], records=None, context=None, title=None, sections=(),
                 extra_figures=(), usage=None) -> None:
    """Build the report (:func:`build_report`) and write it to ``path`` atomically: a failure leaves an
    existing file as it was (:func:`dynlab.atomic.replace_file`; raises ``DynlabError``)."""
    text = build_report(runs, records, context, title, sections, extra_figures, usage)
    from dynlab.atomic import replace_file

    def write(name: str) -> None:
        with open(name, "w", encoding="utf-8") as fh:
            fh.write(text)

    replace_file(path, write, suffix=".html")
