"""Running a sweep's cells: serially, on a local process pool or on Ray (:func:`execute`).

Each process loads a trace once (:func:`cached_trace`); a failing cell comes back as one
line (:class:`CellError`); Ctrl-C stops pool workers and Ray tasks instead of waiting for them.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from collections import OrderedDict
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from dynlab.engine.config import SimConfig
from dynlab.sim.runner import run
from dynlab.errors import DynlabError

#: The executors :func:`execute` knows.
EXECUTORS = ("serial", "local", "ray")
#: Loaded traces each process keeps (least recently used dropped first).
TRACE_CACHE_SIZE = 2
RAY_EXTRA_MESSAGE = "--executor ray needs Ray: pip install 'dynlab[ray]'"


_TRACES: "OrderedDict[tuple, Any]" = OrderedDict()


def _trace_key(config: SimConfig) -> tuple:
    """What makes ``config``'s requests: a trace's reading options, or a workload spec's path, block and hash
    (``workload_requests``' arguments after the tag), with EAGLE's hash lookahead either way."""
    from dynlab.engine.spec import hash_lookahead_tokens

    if config.trace is None:
        return ("workload", config.workload, config.block, config.hash, hash_lookahead_tokens(config))
    return (config.trace, config.trace_format, config.block, config.hash, config.trace_block, config.tokenizer,
            hash_lookahead_tokens(config), config.keep_failed)


def cached_trace(config: SimConfig, loader: Optional[Callable[[], Any]] = None):
    """This process's copy of ``config``'s trace, or the requests of its workload spec (``--workload``,
    generated once: :func:`dynlab.traces.workload_io.workload_requests`), loaded on first use; ``None``
    for neither (the synthetic workload).

    Keyed by everything that makes them (:func:`_trace_key`: the reading options, EAGLE's hash lookahead);
    at most :data:`TRACE_CACHE_SIZE` traces and workloads are kept. ``loader`` replaces the loading (Ray
    fetches from its object store).
    """
    if config.trace is None and config.workload is None:
        return None
    key = _trace_key(config)
    if key in _TRACES:
        _TRACES.move_to_end(key)
        return _TRACES[key]
    if loader is None and config.trace is None:
        from dynlab.traces.workload_io import workload_requests

        requests = workload_requests(*key[1:])
    elif loader is None:
        from dynlab.traces.reader import load_trace

        requests = load_trace(*key)  # (EAGLE's hash lookahead too: the names sim gives the same trace)
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


def _serial(configs: Sequence[SimConfig]) -> Running:
    return Running((i, _unwrap(*_guarded(config), i)) for i, config in enumerate(configs))


class Running:
    """The cells of :func:`execute` as they finish: iterate for ``(position, result)``; :meth:`close` stops
    whatever is still running (pool workers, Ray tasks and a Ray instance started for the sweep), whether
    the iteration finished, failed, was interrupted or never began. A context manager that closes."""

    def __init__(self, results: Iterator[tuple[int, dict]], stop: Callable[[], None] = lambda: None):
        self._results = results
        self._stop = stop
        self._stopped = False

    def __iter__(self):
        return self._results

    def __next__(self):
        return next(self._results)

    def close(self) -> None:
        """Stop the cells still running and release their processes; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        try:
            close = getattr(self._results, "close", None)
            if close is not None:
                close()
        finally:
            self._stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _local(configs: Sequence[SimConfig], jobs: int) -> Running:
    from concurrent.futures import ProcessPoolExecutor

    # The pool starts (forks) here, before the caller opens output files or starts threads.
    # Its workers ignore Ctrl-C and SIGHUP and die on SIGTERM: only this process handles the signals,
    # then terminates them (a worker interrupted while holding the pool's queue lock would hang the shutdown).
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_pool_worker_signals)
    state = {"finished": False}
    try:
        futures = {pool.submit(_guarded, config): i for i, config in enumerate(configs)}
    except BaseException:
        _stop_pool(pool, state)
        raise
    return Running(_drain_pool(futures, state), lambda: _stop_pool(pool, state))


def _pool_worker_signals() -> None:
    """In each pool worker: the parent alone handles Ctrl-C and SIGHUP; SIGTERM (what the parent sends
    to stop a worker) ends the worker at once; and the worker is sent SIGTERM if the parent dies
    (Linux ``PR_SET_PDEATHSIG``), so even a parent killed with SIGKILL leaves no worker behind."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # best effort: no libc prctl
            pass
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)


def _drain_pool(futures: dict, state: dict) -> Iterator[tuple[int, dict]]:
    from concurrent.futures import as_completed

    for fut in as_completed(futures):
        yield futures[fut], _unwrap(*fut.result(), futures[fut])
    state["finished"] = True


def _stop_pool(pool, state: dict) -> None:
    """Shut the pool down: at once (its workers terminated and reaped) unless every cell finished."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    if not state["finished"]:
        # Interrupted, failed or closed early: stop the workers now rather than wait for a clean
        # hand-over that an interrupt in this process can leave stuck forever.
        for proc in procs:
            proc.terminate()
    pool.shutdown(wait=state["finished"], cancel_futures=True)
    for proc in procs:
        proc.join()
    if manager is not None:
        # The pool's thread sees its workers gone and closes its pipes: wait for that here. Left running,
        # it closed them while the exit's own wake-up call (concurrent.futures' _python_exit, unlocked in
        # Python 3.11) wrote to one: "Exception ignored in: <module 'threading'> ... OSError: [Errno 9]
        # Bad file descriptor" on the stderr of a sweep ended by a signal.
        manager.join()


def _ray_cell(config: SimConfig, box: list) -> tuple[bool, Any]:
    # ``box`` holds the trace's object reference inside a list, so Ray does not fetch
    # it for every task: a worker process fetches it once and keeps it in its cache.
    if config.trace is None or _trace_key(config) in _TRACES:
        return _guarded(config)
    import ray

    return _guarded(config, loader=lambda: ray.get(box[0]))


def ray_executor(configs: Sequence[SimConfig], jobs: int, address: Optional[str]) -> Running:
    """``configs`` running on Ray: a local instance of ``jobs`` CPUs (``address`` ``None``, started and owned
    here) or the cluster at ``address``; each trace goes into the object store once. Raises
    :class:`~dynlab.errors.DynlabError` in one line when Ray cannot be started or reached."""
    ray = import_ray(address)
    own = not ray.is_initialized()
    if own and address is not None:
        check_ray_address(address)  # fails in one line at once, where Ray would retry for minutes
    if own:
        # The processes Ray starts inherit an ignored SIGINT and SIGHUP, so Ctrl-C reaches only this
        # driver, which then shuts them down; a raylet hit by Ctrl-C crashes and leaks agents.
        # Ray's driver replaces the SIGTERM handler with its own (which logs a stack and dies by the
        # signal, skipping this process's clean-up): the handlers in place before are put back after.
        keep = {signal.SIGTERM: signal.getsignal(signal.SIGTERM)}
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGHUP, signal.SIG_IGN)
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
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGHUP, previous[1])
            for signum, handler in keep.items():
                if handler is not None:
                    signal.signal(signum, handler)
    state = {"pending": [], "own": own, "stopped": False}
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
            state["pending"].append(ref)
    except BaseException:
        _ray_stop(ray, state)
        raise
    return Running(_drain_ray(ray, state, index), lambda: _ray_stop(ray, state))


def _drain_ray(ray, state: dict, index: dict) -> Iterator[tuple[int, dict]]:
    while state["pending"]:
        # a short timeout returns to Python regularly, so Ctrl-C (KeyboardInterrupt) is seen at once
        done, state["pending"] = _signal_safe(ray.wait, state["pending"], num_returns=1, timeout=0.2)
        for ref in done:
            yield index[ref], _unwrap(*_signal_safe(ray.get, ref), index[ref])


def _signal_safe(call, *args, **kwargs):
    """``call(*args, **kwargs)``; an exception a signal handler raised inside Ray's C code (a SIGTERM
    turned into the CLI's ``Terminated``, a ``BaseException``) comes out wrapped in a ``SystemError``:
    re-raised as itself, so the caller's clean-up sees the signal, not a crash."""
    try:
        return call(*args, **kwargs)
    except SystemError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, BaseException) and not isinstance(cause, Exception):
            raise cause from None
        raise


def _ray_stop(ray, state: dict) -> None:
    """Cancel the tasks not finished and shut down a Ray instance the sweep started; idempotent."""
    if state["stopped"]:
        return
    state["stopped"] = True
    if state["own"]:  # the instance and its tasks go together (cancelling first can crash Ray's core worker)
        ray.shutdown()
        return
    for ref in state["pending"]:  # a cluster someone else runs: cancel only this sweep's tasks
        try:
            ray.cancel(ref)
        except Exception:  # best effort: the task may have finished meanwhile
            pass


def execute(configs: Sequence[SimConfig], executor: str = "local", jobs: Optional[int] = None,
            ray_address: Optional[str] = None) -> Running:
    """Run every configuration; the :class:`Running` it returns yields ``(position in configs, result)``
    as each finishes.

    - ``serial``: one after another in this process.
    - ``local``: a :class:`concurrent.futures.ProcessPoolExecutor` of ``jobs`` processes
      (default: the CPUs this process may use).
    - ``ray``: one Ray task per configuration (1 CPU each) on the cluster at
      ``ray_address``, or on a local instance of ``jobs`` CPUs started here and shut
      down at the end. Each trace is put in Ray's object store once.

    Every process loads each trace once (see :func:`cached_trace`); the traces are
    loaded here first, so a bad trace raises before any cell runs. The pool or the Ray
    instance starts before this returns; close the result (or use it as a context manager) to shut them
    down, whether or not it was iterated. Results do not depend on the executor.
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
    return ray_executor(configs, jobs, ray_address)
