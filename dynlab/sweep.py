"""Parameter sweeps: a grid of ``sim`` options, one :func:`dynlab.engine.run.run` per cell, run serially,
on a process pool or on a Ray cluster, resumable from a JSON-lines results file.

A *cell* is a dict of option name -> value (names as the user writes them: ``mode``,
``event-loss``, ``opt.NAME`` for a strategy option). Its result is exactly what
``dynlab sim`` prints for those options: every cell starts from the same base
configuration (``sim``'s defaults plus the options that apply to every cell), and
its seed is an option like any other, never derived from execution order or from
the process it ran on. So the same grid gives byte-identical results with every
executor.

This module knows nothing about the command line: option names, types and
validation come from the caller (the ``dynlab sweep`` command derives them from
``sim``'s options), as plain converted values.
"""
from __future__ import annotations

import csv
import io
import itertools
import json
import logging
import math
import os
import random
import signal
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

from dynlab.engine.config import SimConfig
from dynlab.engine.run import build_strategy, run
from dynlab.errors import DynlabError

#: Prefix of grid names that set a strategy option (``opt.NAME`` -> ``SimConfig.opts[NAME]``).
OPT_PREFIX = "opt."
#: The executors :func:`execute` knows.
EXECUTORS = ("serial", "local", "ray")
#: Loaded traces each process keeps (least recently used dropped first).
TRACE_CACHE_SIZE = 2
RAY_EXTRA_MESSAGE = "--executor ray needs Ray: pip install 'dynlab[ray]'"


class GridError(DynlabError):
    """The grid itself is wrong (unknown name, empty or duplicate values, unreadable grid file).

    The CLI shows it as a usage error (exit 2).
    """


# --------------------------------------------------------------------------- the grid

@dataclass(frozen=True)
class Axis:
    """One varied option: its name, its converted values, and the text of each as written (for labels)."""

    name: str
    values: tuple
    labels: tuple = ()

    def label(self, i: int) -> str:
        """The text of value ``i`` as the user wrote it (its JSON form when unknown)."""
        if i < len(self.labels):
            return str(self.labels[i])
        return json.dumps(self.values[i])


@dataclass(frozen=True)
class Grid:
    """A sweep's cells: the cross product of ``axes``, each cell also holding ``fixed``.

    - ``axes``: the varied options in the order given; the first varies slowest.
    - ``fixed``: options given once that apply to every cell (name -> converted value);
      they are part of each cell's identity, so a results file records them.
    - ``fields``: option name -> :class:`SimConfig` field for every name used
      (``opt.NAME`` names need no entry: they go to ``SimConfig.opts``).
    - ``base``: :class:`SimConfig` keyword arguments every cell starts from (``sim``'s defaults).
    """

    axes: tuple[Axis, ...]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    fields: Mapping[str, str] = field(default_factory=dict)
    base: Mapping[str, Any] = field(default_factory=dict)

    def cells(self) -> list[dict]:
        """Every cell in order (the last axis varies fastest): axes' values first, then ``fixed``."""
        names = [a.name for a in self.axes]
        out = []
        for combo in itertools.product(*(a.values for a in self.axes)):
            cell = dict(zip(names, combo))
            for name, value in self.fixed.items():
                cell.setdefault(name, value)
            out.append(cell)
        return out

    def varied(self) -> list[Axis]:
        """The axes with more than one value."""
        return [a for a in self.axes if len(a.values) > 1]

    def config(self, cell: Mapping[str, Any]) -> SimConfig:
        """The :class:`SimConfig` of ``cell``: ``base`` with the cell's options applied."""
        kwargs = dict(self.base)
        opts = dict(kwargs.get("opts") or {})
        for name, value in cell.items():
            if name.startswith(OPT_PREFIX):
                opts[name[len(OPT_PREFIX):]] = value
            else:
                kwargs[self.fields.get(name, name.replace("-", "_"))] = value
        kwargs["opts"] = opts
        return SimConfig(**kwargs)


def cell_key(cell: Mapping[str, Any]) -> str:
    """A cell's identity: its options as canonical JSON (sorted names), as read back from a results file."""
    return json.dumps(json.loads(json.dumps(cell)), sort_keys=True, separators=(",", ":"))


def check_config(config: SimConfig) -> None:
    """Raise ``ValueError`` (or :class:`dynlab.plugins.UnknownNameError`) when ``run(config)`` would reject it.

    Checks the fields and builds the strategy with its options, without reading any trace.
    """
    config.validate()
    build_strategy(config, random.Random(0))


def read_grid_file(path: str) -> list[tuple[str, list]]:
    """Read a TOML grid file: ``(name, values)`` pairs in file order.

    Each top-level key is an option name; its value is an array (the values to sweep)
    or a single value (an option that applies to every cell, i.e. a one-value axis).
    A table ``[opt]`` (or keys ``"opt.NAME"``) holds strategy options. Raises
    :class:`GridError` when the file cannot be read or parsed, or holds a nested
    table or array.
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise GridError("--grid-file needs Python 3.11 (tomllib) or the tomli package") from None
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise GridError(f"cannot read grid file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GridError(f"grid file {path} is not valid TOML: {exc}") from None
    out: list[tuple[str, list]] = []

    def add(name, value):
        if isinstance(value, dict):
            raise GridError(f"grid file {path}: {name!r} is a table; give a value or an array of values")
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, (list, dict)):
                raise GridError(f"grid file {path}: {name!r} holds a nested array or table")
        out.append((name, values))

    for name, value in data.items():
        if name == "opt" and isinstance(value, dict):
            for sub, v in value.items():
                add(OPT_PREFIX + sub, v)
        else:
            add(name, value)
    return out


def option_text(value: Any) -> str:
    """A grid-file value as the text a strategy option (``opt.NAME``) takes: ``true``/``false`` for booleans."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --------------------------------------------------------------------------- running cells

_TRACES: "OrderedDict[tuple, Any]" = OrderedDict()


def _trace_key(config: SimConfig) -> tuple:
    return (config.trace, config.trace_format, config.block)


def cached_trace(config: SimConfig, loader: Optional[Callable[[], Any]] = None):
    """This process's copy of ``config``'s trace (``None`` without a trace), loaded on first use.

    Keyed by (trace, trace format, block); at most :data:`TRACE_CACHE_SIZE` traces are kept.
    ``loader`` replaces :func:`dynlab.traces.reader.load_trace` (Ray fetches from its object store).
    """
    if config.trace is None:
        return None
    key = _trace_key(config)
    if key in _TRACES:
        _TRACES.move_to_end(key)
        return _TRACES[key]
    if loader is None:
        from dynlab.traces.reader import load_trace

        requests = load_trace(config.trace, config.trace_format, config.block)
    else:
        requests = loader()
    _TRACES[key] = requests
    while len(_TRACES) > TRACE_CACHE_SIZE:
        _TRACES.popitem(last=False)
    return requests


def clear_trace_cache() -> None:
    """Drop this process's loaded traces."""
    _TRACES.clear()


def preload_traces(configs: Iterable[SimConfig]) -> None:
    """Load every trace the configurations use into this process's cache, raising their errors now.

    With more than :data:`TRACE_CACHE_SIZE` traces the first ones are read (checked) and dropped again.
    """
    seen = set()
    for config in configs:
        key = _trace_key(config)
        if config.trace is not None and key not in seen:
            seen.add(key)
            cached_trace(config)


def run_cell(config: SimConfig) -> dict:
    """``run(config)`` with the trace from this process's cache: the JSON object ``dynlab sim`` prints."""
    return run(config, requests=cached_trace(config))


def _guarded(config: SimConfig, loader=None) -> tuple[bool, Any]:
    # Worker side: user errors travel back as text (some error classes do not pickle).
    try:
        if loader is not None:
            cached_trace(config, loader)
        return True, run_cell(config)
    except (DynlabError, ValueError, LookupError, OSError) as exc:
        where = f"{exc.filename}: " if isinstance(exc, OSError) and getattr(exc, "filename", None) else ""
        return False, f"{where}{exc}"


class CellError(DynlabError):
    """A cell failed while running: ``index`` is its position in the configurations run."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


def _unwrap(ok: bool, value: Any, index: int) -> dict:
    if not ok:
        raise CellError(index, value)
    return value


def default_jobs() -> int:
    """The number of CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def import_ray(address: Optional[str] = None):
    """Import Ray, or raise :class:`DynlabError` naming the ``dynlab[ray]`` extra.

    ``address``: the cluster the sweep will use (``None``: a local instance it starts).
    Ray reads its settings from the environment when it is imported, so when this is
    the first import, the environment is prepared first (existing values are kept):

    - a local instance, or a cluster at a loopback address, stays on the loopback
      interface (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``; otherwise Ray replaces
      127.0.0.1 with the host's outbound address);
    - a local instance sends no usage statistics, and is protected by a throwaway
      authentication token held in this process's environment (``RAY_AUTH_MODE=token``,
      ``RAY_AUTH_TOKEN``), unless Ray authentication is configured already. Ray's own
      default would save a token to ``~/.ray/auth_token``, which later ``ray start``
      runs then pick up.
    """
    if "ray" not in sys.modules:
        if address is None or _is_loopback(address):
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        if address is None:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            if not any(k in os.environ for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
                import secrets

                os.environ["RAY_AUTH_MODE"] = "token"
                os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    try:
        import ray
    except ImportError:
        raise DynlabError(RAY_EXTRA_MESSAGE) from None
    return ray


def check_ray_address(address: str, timeout: float = 10.0) -> None:
    """Raise :class:`DynlabError` when nothing accepts connections at a ``host:port`` Ray address.

    Ray itself keeps retrying an unreachable address for minutes. ``auto`` and
    ``ray://`` client addresses are left to Ray. ``timeout``: seconds to wait for the
    TCP connection.
    """
    if address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise DynlabError(f"--ray-address {address!r}: expected HOST:PORT (the head node's GCS port)")
    import socket

    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise DynlabError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None


def _is_loopback(address: str) -> bool:
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _serial(configs: Sequence[SimConfig]) -> Iterator[tuple[int, dict]]:
    for i, config in enumerate(configs):
        yield i, _unwrap(*_guarded(config), i)


def _local(configs: Sequence[SimConfig], jobs: int) -> Iterator[tuple[int, dict]]:
    from concurrent.futures import ProcessPoolExecutor

    # The pool starts (forks) here, before the caller opens output files or starts threads.
    # Its workers ignore Ctrl-C: only this process handles it, then cancels what has not started
    # (a worker interrupted while holding the pool's queue lock would hang the shutdown).
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_ignore_sigint)
    try:
        futures = {pool.submit(_guarded, config): i for i, config in enumerate(configs)}
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    return _drain_pool(pool, futures)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _drain_pool(pool, futures: dict) -> Iterator[tuple[int, dict]]:
    from concurrent.futures import as_completed

    finished = False
    try:
        for fut in as_completed(futures):
            yield futures[fut], _unwrap(*fut.result(), futures[fut])
        finished = True
    finally:
        if not finished:
            # Interrupted (Ctrl-C) or closed early: stop the workers now rather than wait for
            # a clean hand-over that an interrupt in this process can leave stuck forever.
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
        pool.shutdown(wait=finished, cancel_futures=True)


def _ray_cell(config: SimConfig, box: list) -> tuple[bool, Any]:
    # ``box`` holds the trace's object reference inside a list, so Ray does not fetch
    # it for every task: a worker process fetches it once and keeps it in its cache.
    if config.trace is None or _trace_key(config) in _TRACES:
        return _guarded(config)
    import ray

    return _guarded(config, loader=lambda: ray.get(box[0]))


def _ray(configs: Sequence[SimConfig], jobs: int, address: Optional[str]) -> Iterator[tuple[int, dict]]:
    ray = import_ray(address)
    own = not ray.is_initialized()
    if own and address is not None:
        check_ray_address(address)  # fails in one line at once, where Ray would retry for minutes
    if own:
        # The processes Ray starts inherit an ignored SIGINT, so Ctrl-C reaches only this
        # driver, which then shuts them down; a raylet hit by Ctrl-C crashes and leaks agents.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if address is None:
                ray.init(address="local", num_cpus=jobs, include_dashboard=False, _node_ip_address="127.0.0.1",
                         logging_level=logging.ERROR, log_to_driver=False)
            else:
                ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        except Exception as exc:  # Ray's connection errors: one line for the user
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            raise DynlabError(f"cannot start or reach {where}: {first}") from None
        finally:
            signal.signal(signal.SIGINT, previous)
    pending: list = []
    try:
        refs: dict = {}
        for config in configs:  # each trace goes into the object store once
            key = _trace_key(config)
            if config.trace is not None and key not in refs:
                refs[key] = ray.put(cached_trace(config))
        task = ray.remote(num_cpus=1)(_ray_cell)
        index = {}
        for i, config in enumerate(configs):
            ref = task.remote(config, [refs.get(_trace_key(config))])
            index[ref] = i
            pending.append(ref)
    except BaseException:
        _ray_stop(ray, pending, own)
        raise
    return _drain_ray(ray, pending, index, own)


def _drain_ray(ray, pending: list, index: dict, own: bool) -> Iterator[tuple[int, dict]]:
    try:
        while pending:
            # a short timeout returns to Python regularly, so Ctrl-C (KeyboardInterrupt) is seen at once
            done, pending = ray.wait(pending, num_returns=1, timeout=0.2)
            for ref in done:
                yield index[ref], _unwrap(*ray.get(ref), index[ref])
    finally:
        _ray_stop(ray, pending, own)


def _ray_stop(ray, pending: list, own: bool) -> None:
    for ref in pending:
        try:
            ray.cancel(ref)
        except Exception:  # best effort: the task may have finished meanwhile
            pass
    if own:
        ray.shutdown()


def execute(configs: Sequence[SimConfig], executor: str = "local", jobs: Optional[int] = None,
            ray_address: Optional[str] = None) -> Iterator[tuple[int, dict]]:
    """Run every configuration; yield ``(position in configs, result)`` as each finishes.

    - ``serial``: one after another in this process.
    - ``local``: a :class:`concurrent.futures.ProcessPoolExecutor` of ``jobs`` processes
      (default: the CPUs this process may use).
    - ``ray``: one Ray task per configuration (1 CPU each) on the cluster at
      ``ray_address``, or on a local instance of ``jobs`` CPUs started here and shut
      down at the end. Each trace is put in Ray's object store once.

    Every process loads each trace once (see :func:`cached_trace`); the traces are
    loaded here first, so a bad trace raises before any cell runs. The pool or the Ray
    instance starts before this returns; iterate the result to completion or close it
    (``contextlib.closing``) to shut them down. Results do not depend on the executor.
    A cell's error raises :class:`DynlabError` (one line); closing early cancels the
    cells not yet started.
    """
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; available: {', '.join(EXECUTORS)}")
    if not configs:
        return _serial(())
    jobs = jobs or default_jobs()
    preload_traces(configs)  # errors before any cell runs; forked pool workers inherit the cache
    if executor == "serial":
        return _serial(configs)
    if executor == "local":
        return _local(configs, min(jobs, len(configs)))
    return _ray(configs, jobs, ray_address)


# --------------------------------------------------------------------------- results file

def record_line(cell: Mapping[str, Any], result: Mapping[str, Any]) -> str:
    """One results-file line (without the newline): ``{"cell": {...}, "result": {...}}``.

    ``json.dumps`` with default separators, so the ``result`` part is byte for byte what
    ``dynlab sim`` prints.
    """
    return json.dumps({"cell": cell, "result": result})


class ResultsFile:
    """A sweep's JSON-lines results file, one :func:`record_line` per finished cell.

    :meth:`open` takes an exclusive lock (a second sweep on the same file fails),
    reads the records already there, drops an incomplete last line (a sweep killed in
    the middle of a write), and positions for appending; :meth:`append` writes one
    line and flushes it, so an interrupted sweep loses only the cells in flight.
    """

    def __init__(self, path: str):
        self.path = path
        self.records: "OrderedDict[str, tuple[dict, dict]]" = OrderedDict()
        self.dropped_partial = False
        self._fh = None
        self._fh_truncate: Optional[int] = None

    def open(self) -> "ResultsFile":
        """Lock, read and prepare the file for appending (created if absent). Returns ``self``."""
        fh = open(self.path, "a+b")
        try:
            try:
                import fcntl

                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except ImportError:  # not POSIX: no lock
                pass
            except OSError:
                raise DynlabError(f"{self.path} is in use by another sweep") from None
            fh.seek(0)
            data = fh.read()
            self._parse(data)
        except BaseException:
            fh.close()
            raise
        self._fh = fh
        return self

    def _parse(self, data: bytes) -> None:
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a line without its newline: a write was cut short
            self.dropped_partial = True
            self._fh_truncate = end
        else:
            self._fh_truncate = None
        for lineno, raw in enumerate(data[:end].splitlines(), 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                cell, result = record["cell"], record["result"]
                if not isinstance(cell, dict) or not isinstance(result, dict):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                raise DynlabError(f"{self.path}:{lineno}: not a sweep record "
                                  '({"cell": {...}, "result": {...}})') from None
            self.records.setdefault(cell_key(cell), (cell, result))

    def scan(self) -> "ResultsFile":
        """Read the records without locking, creating or changing the file (for ``--dry-run``)."""
        if os.path.exists(self.path):
            with open(self.path, "rb") as fh:
                self._parse(fh.read())
        return self

    def done(self) -> set[str]:
        """The keys (:func:`cell_key`) of the cells already in the file."""
        return set(self.records)

    def append(self, cell: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        """Append one record and flush it; a cell already in the file is not written again."""
        key = cell_key(cell)
        if key in self.records:
            return
        if self._fh_truncate is not None:
            self._fh.truncate(self._fh_truncate)
            self._fh_truncate = None
        self._fh.write((record_line(cell, result) + "\n").encode("utf-8"))
        self._fh.flush()
        self.records[key] = (dict(cell), dict(result))

    def close(self) -> None:
        """Release the lock and close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()


# --------------------------------------------------------------------------- CSV and plots

def flatten(result: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys (``ttft_ms.p99``); lists kept as values."""
    out: dict[str, Any] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (bool, list, dict)):
        return json.dumps(value)
    return str(value)


def to_csv(records: Iterable[tuple[Mapping, Mapping]]) -> str:
    """CSV text: one row per ``(cell, result)``, the cell's options then the flattened metrics.

    Columns are the union over all rows in first-seen order; a metric named like an
    option (``mode``, ``workers``, ``publish``) repeats its value and is left out.
    Missing and null values are empty; lists and booleans are written as JSON.
    """
    records = list(records)
    cell_cols: dict[str, None] = {}
    metric_cols: dict[str, None] = {}
    rows = []
    for cell, result in records:
        flat = flatten(result)
        cell_cols.update(dict.fromkeys(cell))
        rows.append((cell, flat))
    for _, flat in rows:
        metric_cols.update(dict.fromkeys(k for k in flat if k not in cell_cols))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(list(cell_cols) + list(metric_cols))
    for cell, flat in rows:
        writer.writerow([_csv_value(cell.get(c)) for c in cell_cols] + [_csv_value(flat.get(c)) for c in metric_cols])
    return buf.getvalue()


def metric_value(result: Mapping[str, Any], path: str) -> Optional[float]:
    """The number at dotted ``path`` in ``result`` (``ttft_ms.p99``), or ``None`` when absent or not a number."""
    value: Any = result
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def numeric_paths(results: Iterable[Mapping[str, Any]]) -> list[str]:
    """Dotted paths that hold a number in at least one result, in first-seen order."""
    seen: dict[str, None] = {}
    for r in results:
        for k, v in flatten(r).items():
            if not isinstance(v, bool) and isinstance(v, (int, float)):
                seen.setdefault(k, None)
    return list(seen)


def _is_numeric_axis(axis: Axis) -> bool:
    vals = [v for v in axis.values if v is not None]
    return bool(vals) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)


def plot_layout(grid: Grid) -> tuple[list[Axis], list[Axis]]:
    """``(numeric axes, series axes)`` of a sweep plot; raises :class:`GridError` when it cannot be drawn.

    The numeric axes are the varied options whose values are all numbers (or null,
    e.g. ``capacity=unbounded``): one gives a line plot, two a heatmap. The other
    varied options (``mode``, ``policy``, ...) make the series: one line, or one
    heatmap panel, per combination.
    """
    varied = grid.varied()
    numeric = [a for a in varied if _is_numeric_axis(a)]
    if not 1 <= len(numeric) <= 2:
        names = ", ".join(a.name for a in numeric) or "none"
        raise GridError("--plot needs one or two varied numeric options (a line or a heatmap per strategy); "
                        f"varied numeric options: {names}")
    return numeric, [a for a in varied if a not in numeric]


def _compact(v: float) -> str:
    """A short label for a heatmap cell: three significant digits, k and M for large values."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if a >= 1e3:
        return f"{v:.0f}"
    return f"{v:.3g}"


def plot_sweep(grid: Grid, results: Mapping[str, Mapping[str, Any]], path: str, metric: str) -> None:
    """Plot ``metric`` (a dotted path into each result) over the grid, as a PNG at ``path``.

    ``results``: :func:`cell_key` -> result for the grid's cells (missing cells are
    left blank). One varied numeric option: a line per series (strategy) against it.
    Two: a heatmap per series, the first option across and the second down, all
    panels on one colour scale (logarithmic when the values span more than a factor
    of 100), each cell labelled with its value. Needs matplotlib
    (``dynlab[plot]``); raises :class:`GridError` when the layout cannot be drawn.
    """
    from dynlab.plots import pyplot, save

    numeric, series_axes = plot_layout(grid)
    plt = pyplot()
    series = list(itertools.product(*(range(len(a.values)) for a in series_axes)))

    def series_label(combo) -> str:
        if not combo:
            return ""
        return ", ".join(a.label(i) if a.name == "mode" else f"{a.name}={a.label(i)}"
                         for a, i in zip(series_axes, combo))

    # (series value indices, numeric values) -> metric, from the first matching cell
    table: dict = {}
    for cell in grid.cells():
        r = results.get(cell_key(cell))
        v = metric_value(r, metric) if r is not None else None
        combo = tuple(a.values.index(cell[a.name]) for a in series_axes)
        table.setdefault((combo, tuple(cell[a.name] for a in numeric)), math.nan if v is None else v)

    def value_at(combo, picks: Sequence[Any]) -> float:
        return table.get((combo, tuple(picks)), math.nan)

    label = metric
    if len(numeric) == 1:
        ax_opt = numeric[0]
        fig, ax = plt.subplots(figsize=(7, 4.2))
        xs = list(range(len(ax_opt.values)))
        for combo in series:
            ys = [value_at(combo, (v,)) for v in ax_opt.values]
            ax.plot(xs, ys, marker="o", label=series_label(combo) or None)
        ax.set_xticks(xs, [ax_opt.label(i) for i in xs])
        ax.set_xlabel(ax_opt.name)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if any(series_label(c) for c in series):
            ax.legend(fontsize=8)
        ax.set_title(f"{label} by {ax_opt.name}")
        fig.tight_layout()
        save(fig, path)
        return
    x_opt, y_opt = numeric
    grids = []
    for combo in series:
        grids.append([[value_at(combo, (xv, yv)) for xv in x_opt.values]
                      for yv in y_opt.values])
    finite = [v for g in grids for row in g for v in row if not math.isnan(v)]
    vmin, vmax = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if vmin == vmax:
        vmin, vmax = vmin - 0.5, vmax + 0.5
    n = len(series)
    ncols = n if n <= 3 else math.ceil(math.sqrt(n))
    nrows = math.ceil(n / ncols)
    cw = max(2.6, 0.7 * len(x_opt.values) + 1.0)
    ch = max(2.0, 0.45 * len(y_opt.values) + 1.0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(cw * ncols + 1.4, ch * nrows + 0.7), squeeze=False,
                             constrained_layout=True)
    cmap = plt.get_cmap("viridis")
    log = vmin > 0 and vmax / vmin > 100  # values over several decades: a log colour scale
    if log:
        from matplotlib.colors import LogNorm

        norm = LogNorm(vmin=vmin, vmax=vmax)
    else:
        from matplotlib.colors import Normalize

        norm = Normalize(vmin=vmin, vmax=vmax)
    image = None
    for k, (combo, g) in enumerate(zip(series, grids)):
        ax = axes[k // ncols][k % ncols]
        image = ax.imshow(g, cmap=cmap, norm=norm, aspect="auto", origin="lower")
        ax.set_xticks(range(len(x_opt.values)), [x_opt.label(i) for i in range(len(x_opt.values))], fontsize=8)
        ax.set_yticks(range(len(y_opt.values)), [y_opt.label(i) for i in range(len(y_opt.values))], fontsize=8)
        if k // ncols == nrows - 1 or k + ncols >= n:
            ax.set_xlabel(x_opt.name, fontsize=9)
        if k % ncols == 0:
            ax.set_ylabel(y_opt.name, fontsize=9)
        ax.set_title(series_label(combo) or label, fontsize=10)
        for yi, row in enumerate(g):
            for xi, v in enumerate(row):
                if math.isnan(v):
                    continue
                bright = float(norm(v)) > 0.6
                ax.text(xi, yi, _compact(v), ha="center", va="center", fontsize=7,
                        color="black" if bright else "white")
    for k in range(n, nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    fig.suptitle(label, fontsize=11)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.9, label=label + (" (log scale)" if log else ""))
    save(fig, path)


__all__ = [
    "Axis", "Grid", "GridError", "ResultsFile", "cell_key", "check_config", "read_grid_file", "option_text",
    "cached_trace", "clear_trace_cache", "preload_traces", "run_cell", "execute", "default_jobs", "import_ray",
    "check_ray_address", "record_line", "flatten", "to_csv", "metric_value", "numeric_paths", "plot_layout",
    "plot_sweep", "EXECUTORS", "OPT_PREFIX", "TRACE_CACHE_SIZE",
]
