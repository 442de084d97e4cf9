"""Capacity planning by replay (``dynlab plan``): the fewest GPUs, per candidate shape, that meet the SLOs.

For each :class:`~dynlab.plan.search.Shape` (model, GPU, TP, routing mode, CPU tier) the latency model
first gives floors (:mod:`~dynlab.plan.analysis`: each prompt's own prefill, the work against one
worker's capacity); then replays of the trace (:func:`dynlab.run`, on the sweep executors) bracket and
bisect the worker count (:mod:`~dynlab.plan.search`), so each answer N is a replay meeting the target
and N - 1 one missing it. :mod:`~dynlab.plan.binding` says what binds; :mod:`~dynlab.plan.report`
ranks, prints and plots.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Callable, Mapping, Optional, Sequence

from dynlab.engine.config import SimConfig
from dynlab.errors import DynlabError
from dynlab.plan.planner import DEFAULT_CAP, Outcome, config_cell, explain, prepare, run_searches
from dynlab.plan.rate import arrival_settings, closed_users, mean_rate
from dynlab.plan.search import Shape
from dynlab.plan.target import PERCENTILES, Target

__all__ = ["plan", "Shape", "Target", "PERCENTILES", "DEFAULT_CAP", "arrival_settings", "mean_rate", "config_cell",
           "Outcome", "executor_session"]


def _log_known(log_path: Optional[str], resume: bool) -> tuple:
    """``(ResultsFile or None, log key -> result)``; a non-empty log without ``resume`` is a ``ValueError``."""
    import os

    from dynlab.sweep.results import ResultsFile

    if log_path is None:
        return None, {}
    if not resume and os.path.exists(log_path) and os.path.getsize(log_path) > 0:
        raise ValueError(f"{log_path} is not empty: add --resume to reuse its replays, or choose another file")
    log = ResultsFile(log_path)
    if resume:
        log.scan()
    return log, {k: r for k, (_, r) in log.records.items()}


@contextlib.contextmanager
def executor_session(executor: str, jobs: Optional[int], ray_address: Optional[str]):
    """One executor session for every round of a plan. With ``executor`` ``"ray"``: Ray is started (a
    local instance of ``jobs`` CPUs) or reached (``ray_address``) once here, unless this process has it
    running already, so each round's :func:`dynlab.sweep.executors.execute` finds it initialized and
    leaves it up; it is shut down (or disconnected) when the block ends, error or not. Other executors:
    nothing (the process pool forks per round, which is cheap). Raises :class:`DynlabError` when Ray is
    missing or cannot be started or reached."""
    if executor != "ray":
        yield
        return
    from dynlab.sweep import executors

    # a session without a task: executors' own start (signals, loopback, one-line errors) and stop
    with contextlib.closing(executors.ray_executor([], jobs or executors.default_jobs(), ray_address)):
        yield


def _arrivals(requests: Sequence, time_scale: float, poisson: float, base: SimConfig) -> str:
    """The arrivals replayed, in words: closed-loop users, the mean rate and time scale, all at once, or Poisson."""
    n = f"{len(requests):,} request{'' if len(requests) == 1 else 's'}"
    users = closed_users(requests, base.concurrency)
    if users is not None:
        think = base.think_time_ms if base.concurrency is not None else requests.closed[1]
        warm = f", the first {base.warmup:,} not measured" if base.warmup else ""
        return f"{n}, closed loop: {users:,} users, think time {think:g} ms{warm}"
    if requests[0].timestamp is None:
        return f"{n}, Poisson {poisson:g} requests/s"
    rate_now = mean_rate(requests)
    if rate_now is None:
        return f"{n}, all at one instant"
    return f"{n}, mean rate {rate_now / time_scale:.3g} requests/s (time scale {time_scale:.4g})"


def _mixes(outcomes, base: SimConfig, prices, sources, target: Target, cap: int, shapes, known: dict, run_batch,
           on_replay) -> dict:
    """:func:`dynlab.plan.mix.search` on the homogeneous answers, each fleet replayed once (the log's, with
    ``known``), as the plan JSON's ``mix`` (:func:`dynlab.plan.mix.as_json`)."""
    from dynlab.plan import mix
    from dynlab.sweep.grid import cell_key

    ran: dict = {}

    def replay(config: SimConfig) -> dict:
        key = cell_key(config_cell(config))
        if key not in ran:  # a fleet two ordered pairs reach is replayed (and counted) once
            ran[key] = known[key] if key in known else list(run_batch([config]))[0][1]
            on_replay(key not in known)
        return ran[key]

    best, seen = mix.search(outcomes, base, prices, target, cap, replay, max(s.spec_tokens for s in shapes))
    return mix.as_json(best, seen, target, sources, mix.most_replays(outcomes))


def _autoscale(out, outcomes, controller, controller_max, target, prices, run_batch, on_replay, session) -> None:
    """:func:`dynlab.plan.autoscaled.attach` in one executor session, ``on_replay(True)`` per autoscaled replay."""
    from dynlab.plan.autoscaled import attach

    def counted(configs):
        for item in run_batch(configs):
            on_replay(True)
            yield item

    with executor_session(*session):
        attach(out, outcomes, controller, controller_max, target, prices, counted)


def _batch_runner(executor: str, jobs, ray_address, log) -> Callable:
    """``run_batch(configs)``: the replays of ``configs`` on the executor, each yielded as ``(index, result)`` and
    appended to ``log`` (a replay log, or ``None``); a replay's error becomes a :class:`DynlabError` naming its fleet."""
    from dynlab.sweep.executors import CellError, execute

    def run_batch(configs):
        if not configs:
            return
        with contextlib.closing(execute(configs, executor, jobs, ray_address)) as runs:
            with log if log is not None else contextlib.nullcontext():  # opened after the pool forked
                try:
                    for i, result in runs:
                        if log is not None:
                            log.append(config_cell(configs[i]), result)
                        yield i, result
                except CellError as exc:
                    c = configs[exc.index]
                    fleet = f"split {c.split}" if c.split else f"{c.workers} workers"
                    where = f"pools {' + '.join(c.pools)}" if c.pools else f"{fleet} ({c.gpu} tp {c.tp})"
                    raise DynlabError(f"replay at {where}: {exc}") from None

    return run_batch


def _with_mix(out: dict, mixed: dict) -> None:
    """``out`` (the plan's object) with ``mix`` and, when the mixed fleet found is cheaper than every shape meeting
    the target (so by construction when it is not ``None``), ``cheapest`` that fleet."""
    out["mix"] = mixed
    if mixed["answer"] is not None:
        out["cheapest"] = {k: mixed["answer"][k] for k in ("shape", "pools", "workers", "gpus", "usd_per_hour",
                                                           "binding", "why", "price_source")}


def plan(requests: Sequence, base: SimConfig, shapes: Sequence[Shape], target: Target, *,
         rate: Optional[float] = None, rate_scale: Optional[float] = None, cap: int = DEFAULT_CAP,
         prices: Optional[Mapping[str, float]] = None, price_sources: Optional[Mapping[str, str]] = None,
         executor: str = "local", jobs: Optional[int] = None,
         ray_address: Optional[str] = None, log_path: Optional[str] = None, resume: bool = False,
         on_replay: Callable = lambda fresh: None, mix: bool = False, controller: Optional[str] = None,
         controller_max: Optional[int] = None) -> dict:
    """Plan ``shapes`` for the loaded trace ``requests`` (``base.trace``'s, from
    :func:`dynlab.sweep.executors.cached_trace`) against ``target``.

    ``base``: the engine options every replay shares (a timed :class:`SimConfig`; its model, GPU, TP, mode
    and CPU tier are the shape's); ``rate`` (requests/s) or ``rate_scale``: the arrivals
    (:func:`~dynlab.plan.rate.arrival_settings`); ``cap``: the most workers per shape; ``prices``: GPU
    name -> USD per GPU-hour; ``price_sources``: GPU name -> where its price came from, given for ``--objective cost``
    (:mod:`dynlab.models.prices`): the object then says ``objective`` ``cost``, each price's source and the cheapest
    shape meeting the target (:func:`dynlab.plan.report.cheapest`); ``executor``/``jobs``/``ray_address``: as
    ``dynlab sweep``; ``log_path``: a JSON-lines file of every replay (``{"cell": sim options, "result": sim's
    JSON}``), reused with ``resume``; ``on_replay(fresh)`` is called per replay (``fresh``: it ran now); ``mix``
    (with ``price_sources``): then two-pool fleets of the shapes are searched too (:mod:`dynlab.plan.mix`), the
    object's ``mix`` says the cheapest found and its replays, and ``cheapest`` is that fleet when it is cheaper than
    every shape; ``controller`` (``NAME[:KEY=VALUE,...]``) and ``controller_max``: each shape's ``autoscaled``
    comparison (:mod:`dynlab.plan.autoscaled`; ``None``: no such key).

    Returns :func:`dynlab.plan.report.as_json`'s object plus ``_results`` (shape label -> workers ->
    result, for the plot). Raises ``ValueError`` for bad options (a class of ``target.classes`` no request
    carries among them), :class:`DynlabError` for a replay's error.
    """
    from dynlab.plan.report import as_json

    prices = dict(prices or {})
    time_scale, poisson = arrival_settings(requests, rate, rate_scale, base.concurrency)
    base = replace(base, timing=True, time_scale=time_scale, rate=poisson, slo_ttft_ms=target.slo_ttft_ms,
                   slo_tpot_ms=target.slo_tpot_ms, slo_classes=target.classes_text())
    own = getattr(requests, "own_block_tokens", None)
    trace_block = base.trace_block or own or base.block
    log, known = _log_known(log_path, resume)
    outcomes = prepare(requests, shapes, base, target, cap, trace_block)

    run_batch = _batch_runner(executor, jobs, ray_address, log)
    with executor_session(executor, jobs, ray_address):
        run_searches(outcomes, run_batch, known, lambda cell, result, fresh: on_replay(fresh))
        explain(outcomes, len(requests))
        mixed = _mixes(outcomes, base, prices, price_sources, target, cap, shapes, known, run_batch,
                       on_replay) if mix else None
    arrivals = _arrivals(requests, time_scale, poisson, base)
    header = {"target": target.describe(), "percentile": target.percentile, "slo_ttft_ms": target.slo_ttft_ms,
              "slo_tpot_ms": target.slo_tpot_ms, "goodput_target": target.goodput,
              "slo_classes": target.classes_json(), "arrivals": arrivals,
              "time_scale": time_scale, "prices": prices, "max_workers": cap}
    if price_sources:  # --objective cost: said only then (a gpus plan's object is unchanged)
        header["objective"], header["price_source"] = "cost", dict(price_sources)
    out = as_json(outcomes, prices, header)
    if mixed is not None:
        _with_mix(out, mixed)
    if controller is not None:  # the autoscaled replays, after the searches (they need each answer N)
        _autoscale(out, outcomes, controller, controller_max, target, prices, run_batch, on_replay,
                   (executor, jobs, ray_address))
    out["_results"] = {o.shape.label: {n: r for s in (o.search, o.floor) if s is not None
                                       for n, (_, r) in s.tested.items()} for o in outcomes}
    return out
