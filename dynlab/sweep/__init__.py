"""Parameter sweeps: a grid of ``sim`` options, one :func:`dynlab.sim.run` per cell, run serially,
on a process pool or on a Ray cluster, resumable from a JSON-lines results file.

A *cell* is a dict of option name -> value (names as the user writes them: ``mode``,
``event-loss``, ``opt.NAME`` for a strategy option). Its result is exactly what
``dynlab sim`` prints for those options: every cell starts from the same base
configuration (``sim``'s defaults plus the options that apply to every cell), and
its seed is an option like any other, never derived from execution order or from
the process it ran on. So the same grid gives byte-identical results with every
executor.

This package knows nothing about the command line: option names, types and
validation come from the caller (the ``dynlab sweep`` command derives them from
``sim``'s options), as plain converted values.

- :mod:`~dynlab.sweep.grid`: axes, grids, grid files, cell keys, option text;
- :mod:`~dynlab.sweep.executors`: serial, local pool and Ray execution (:func:`execute`), Ctrl-C handling;
- :mod:`~dynlab.sweep.results`: the resumable results file, flattened metrics, CSV, metric paths;
- :mod:`~dynlab.sweep.plots`: line and heatmap plots of one metric over the grid;
- :mod:`~dynlab.sweep.probe`: the metrics the cells will report, from two-request runs before they run.
"""
from dynlab.sweep.executors import (EXECUTORS, RAY_EXTRA_MESSAGE, TRACE_CACHE_SIZE, CellError, Running, cached_trace,
                                    check_ray_address, clear_trace_cache, default_jobs, execute, import_ray,
                                    preload_traces, run_cell)
from dynlab.sweep.grid import (LATENCY_OPT_PREFIX, OPT_PREFIX, Axis, Grid, GridError, cell_key, check_config,
                               option_text, read_grid_file)
from dynlab.sweep.plots import plot_layout, plot_sweep
from dynlab.sweep.results import ResultsFile, flatten, metric_value, numeric_paths, record_line, to_csv

__all__ = [
    "Axis", "Grid", "GridError", "ResultsFile", "cell_key", "check_config", "read_grid_file", "option_text",
    "cached_trace", "clear_trace_cache", "preload_traces", "run_cell", "execute", "default_jobs", "import_ray",
    "check_ray_address", "record_line", "flatten", "to_csv", "metric_value", "numeric_paths", "plot_layout",
    "plot_sweep", "EXECUTORS", "OPT_PREFIX", "LATENCY_OPT_PREFIX", "TRACE_CACHE_SIZE", "CellError", "Running", "RAY_EXTRA_MESSAGE",
]
