"""Reports of runs: a self-contained HTML page (:func:`build_report`, :func:`write_report`) and a Chrome
trace-event timeline (:func:`write_timeline`) that Perfetto's UI opens offline.

- :mod:`~dynlab.report.runs`: the inputs (runs from ``sim``/``compare``/``sweep`` output, per-request records);
- :mod:`~dynlab.report.figures`, :mod:`~dynlab.report.record_figures`, :mod:`~dynlab.report.sweep_figures`:
  the figures (matplotlib SVG, each with a caption and its numbers);
- :mod:`~dynlab.report.html`: the page;
- :mod:`~dynlab.report.timeline`: the trace-event writer.
"""
from dynlab.report.runs import PD_KEYS, RECORD_KEYS, Run, check_record, read_records, read_runs, runs_from_json

__all__ = ["Run", "RECORD_KEYS", "PD_KEYS", "check_record", "read_records", "read_runs", "runs_from_json",
           "build_report", "write_report", "write_timeline"]


def __getattr__(name):  # the page and the timeline import matplotlib / json only when used
    if name in ("build_report", "write_report"):
        from dynlab.report import html

        return getattr(html, name)
    if name == "write_timeline":
        from dynlab.report.timeline import write_timeline

        return write_timeline
    raise AttributeError(name)
