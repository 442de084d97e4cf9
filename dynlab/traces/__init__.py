"""Workloads: request traces read from files, and the lab's synthetic workload.

- :mod:`~dynlab.traces.format`: :class:`TraceFormat`, the interface trace-format plugins implement;
- :mod:`~dynlab.traces.reader`: :func:`open_trace` / :func:`load_trace` (JSONL traces streamed line by
  line as requests) and the bundled traces (:data:`BUILTIN_TRACES`);
- :mod:`~dynlab.traces.synthetic`: the seed's synthetic workload (lab 000 step 4).

The built-in formats (``mooncake``, ``tokens``) are plugins, in ``dynlab_builtins.trace_formats``.
"""
from dynlab.traces.format import TraceFormat
from dynlab.traces.reader import BUILTIN_TRACES, load_trace, open_trace

__all__ = ["TraceFormat", "open_trace", "load_trace", "BUILTIN_TRACES"]
