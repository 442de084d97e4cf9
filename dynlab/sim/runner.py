"""The run of one configuration: :func:`run`, the library function behind ``dynlab sim`` (and every
``compare`` run and ``sweep`` cell). It takes a :class:`~dynlab.engine.config.SimConfig` and returns the
JSON object ``dynlab sim`` prints.

It reads the workload (:mod:`dynlab.traces`), builds the run's topology (count-based:
:class:`dynlab.sim.drive.CountBased`; timed: :func:`dynlab.sim.topology.topology_for`) and the strategy
(:func:`dynlab.engine.run.build_strategy`), and serves on the topology (:func:`dynlab.sim.drive.serve`),
the one path of every run.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import replace
from typing import Any, Optional, Sequence

from dynlab.engine.config import SimConfig
from dynlab.engine.option_rules import check_effective
from dynlab.engine.metrics import Recorder, RunInfo
from dynlab.engine.run import StrategyError, raised_in_plugin, build_strategy
from dynlab.errors import DynlabError
from dynlab.routing.strategy import Request, Strategy
from dynlab.sim.drive import CountBased, serve

SEED_KEYS = ("mode", "workers", "requests", "repeat_requests", "hits", "hit_rate")


def run(config: SimConfig, progress: bool = False, requests: Optional[Sequence[Request]] = None,
        recorders: Sequence[Recorder] = ()) -> dict[str, Any]:
    """Run one simulation and return the JSON object ``dynlab sim`` prints.

    ``requests``: the trace already loaded (:func:`dynlab.traces.reader.load_trace` of
    ``config.trace``, ``config.trace_format`` and ``config.block``), so a sweep reads a
    trace once per process; ``None`` streams it from ``config.trace``. ``recorders``: more
    :class:`~dynlab.engine.metrics.Recorder` to observe the run (``on_run`` first; count-based runs
    call ``on_route`` only), e.g. :class:`dynlab.sim.records.RequestRecorder`; their result keys
    follow the serving keys.

    Key order: the seed's keys (``mode, workers, requests, repeat_requests, hits,
    hit_rate``), then ``publish`` for strategies that use KV events, then (on a trace,
    with ``all_metrics`` or with ``timing``) ``block_tokens`` (tokens per block of the names
    replayed: the trace format's own, 512 for Mooncake, else ``config.block``; without ``timing``),
    ``hash`` (the scheme that named blocks of tokens; absent when the trace names its own blocks)
    and the fleet metrics; timed runs add the serving metrics and say which block sizes, pool,
    hardware and latency model they used.

    Raises ``ValueError`` for a bad option or one that has no effect here
    (:func:`dynlab.engine.option_rules.check_effective`), :class:`dynlab.plugins.UnknownNameError`
    for an unknown mode, policy or trace format, :class:`dynlab.errors.InputError`
    for a bad trace line, :class:`dynlab.disagg.cost.ModelConfigError` for a bad ``--model`` config.json.
    """
    config.validate()
    config = config.resolved()
    pd = config.pd()
    rng = random.Random(config.seed)
    loss_rng = random.Random(f"dynlab-event-loss-{config.seed}")
    requests, total, own, synthetic = _workload(config, rng, requests)
    block_tokens = own or config.block
    config, requests, total, shaped = _arrivals(config, requests, total)
    if config.timing:
        config, shaped, topology = _timed_topology(config, shaped, own)
        block_tokens = config.block
        pool_blocks, dp = topology.setup.pool_blocks, topology.setup.dp
    else:
        topology, pool_blocks, dp = CountBased(config, synthetic, block_tokens), None, 1
    routed = topology.routed_workers  # the targets the strategy routes to (attention-DP ranks)
    strategy = build_strategy(config if routed == config.workers else replace(config, workers=routed), rng,
                              block_tokens=block_tokens, pool_blocks=pool_blocks)
    recorders = _with_benchmark(config, recorders)
    info = RunInfo(timed=config.timing, pd=pd is not None, block_tokens=block_tokens,
                   dp=dp)
    for recorder in recorders:
        recorder.on_run(info)
    metrics = _served(config, topology, requests, strategy, loss_rng, recorders, progress, total)
    result = _merged(_result(config, metrics, strategy, topology, own, block_tokens), shaped)
    if config.timing and (config.price is not None or config.spot_discount > 0):  # asks its cost
        from dynlab.sim.cost import with_cost

        result = with_cost(result, config, _run_gpus(config))
    return result


def _arrivals(config: SimConfig, requests, total) -> tuple:
    """``(config, requests, total, keys)``: the workload spec's closed-loop users put in ``config``
    (:func:`_spec_users`), the first ``--requests`` kept (:func:`first_requests`), then the keys of the
    closed-loop users (``--concurrency``: they ignore timestamps) or, on a timed run or with ``--duration``,
    the arrivals checked and shaped (:func:`_shaped`)."""
    config = _spec_users(config, requests)
    keys: dict = {}
    if config.num_requests is not None:
        requests, total = first_requests(requests, config.num_requests, total)
    if config.concurrency is not None:  # closed loop (timed only): the users ignore timestamps
        keys = _closed_keys(config)
    elif config.timing or config.duration is not None:
        requests, first = _peek(requests)
        config, requests, total, keys = _shaped(config, requests, first, total)
    return config, requests, total, keys


def _timed_topology(config: SimConfig, keys: dict, own: Optional[int]) -> tuple:
    """``(config, keys, topology)`` of a timed run: its calibration profile applied (``--latency-profile``,
    :func:`_profiled`), then its topology (:func:`dynlab.sim.topology.topology_for` of
    :func:`dynlab.engine.serving.build_engines`). The timed engine's modules are imported here only, so that
    a count-based run starts without them."""
    from dynlab.engine.serving import build_engines
    from dynlab.sim.topology import topology_for

    if config.latency_profile is not None:
        config, keys = _profiled(config, keys)
    return config, keys, topology_for(build_engines(config, own))


def _with_benchmark(config: SimConfig, recorders: Sequence[Recorder]) -> Sequence[Recorder]:
    """``recorders``, followed by a :class:`dynlab.sim.benchmark.BenchmarkRecorder` when the run is driven as a
    benchmark client drives a server (:func:`_benchmark`)."""
    if not _benchmark(config):
        return recorders
    from dynlab.sim.benchmark import BenchmarkRecorder

    return (*recorders, BenchmarkRecorder(_run_gpus(config), config.warmup, config.detok_ms))


def _served(config: SimConfig, topology, requests, strategy: Strategy, loss_rng: random.Random,
            recorders: Sequence[Recorder], progress: bool, total) -> dict:
    """The metrics of :func:`dynlab.sim.drive.serve` of ``requests`` on ``topology``, with a progress bar of
    ``total`` requests (tqdm) when ``progress``; an exception in the strategy's code becomes a
    :class:`StrategyError` (:func:`_guard`)."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="req", leave=False, desc=config.mode)
    try:
        return _guard(strategy, lambda: serve(topology, requests, strategy, config, loss_rng=loss_rng,
                                              recorders=recorders, progress=bar))
    finally:
        if bar is not None:
            bar.close()


def _merged(result: dict, keys: dict) -> dict:
    """``result`` followed by ``keys``; a ``latency_domain`` in both says both (the latency model's, the profile's)."""
    if "latency_domain" in keys and result.get("latency_domain"):
        keys = {**keys, "latency_domain": f"{result['latency_domain']}; {keys['latency_domain']}"}
    return result | keys


def _result(config: SimConfig, metrics: dict, strategy: Strategy, topology, own: Optional[int],
            block_tokens: int) -> dict[str, Any]:
    """The JSON object of :func:`run` (its key order) from the replay's ``metrics``; ``topology``: the run's
    (its ``describe()`` keys), ``own``: the trace's own block size, ``block_tokens``: the
    block size replayed."""
    pd = config.pd()
    out: dict[str, Any] = {"mode": config.mode, "workers": config.fleet_workers if pd is None else sum(pd)}
    for key in SEED_KEYS[2:]:
        out[key] = metrics[key]
    if strategy.uses_events:
        out["publish"] = config.publish
    if config.trace is not None or config.workload is not None or config.all_metrics or config.timing:
        out.update(topology.describe())
        if own is None:
            out["hash"] = config.hash  # the scheme that named the blocks
        for key, value in metrics.items():
            if key not in out:
                out[key] = value
                if key == "output_tokens_per_s":
                    out["output_tokens_per_s_per_gpu"] = round(value / _run_gpus(config), 1)
    if config.routers > 1:
        out["routers"] = config.routers
        out["router_assign"] = config.router_assign
        out["requests_per_router"] = list(strategy.routed)
    return out


def _profiled(config: SimConfig, keys: dict) -> tuple:
    """``config`` with its calibration profile applied and ``keys`` with the profile's result keys
    (:func:`dynlab.latency.profile.apply_profile`)."""
    from dynlab.latency.profile import apply_profile

    config, profiled = apply_profile(config)
    return config, {**keys, **profiled}


def _spec_users(config: SimConfig, requests) -> SimConfig:
    """``config`` with the closed-loop users a workload spec asks for (``"arrival": {"process": "closed"}``,
    :attr:`dynlab.traces.reader.TraceRequests.closed`) as ``concurrency`` and ``think_time_ms``. Raises
    ``ValueError`` when ``--concurrency`` or ``--think-time-ms`` is given too, or without ``--timing`` (so
    for closed session turns, ``follows``)."""
    closed = getattr(requests, "closed", None)
    if getattr(requests, "follows", None):  # closed session turns: timed, and no users of --concurrency
        if not config.timing:
            raise ValueError("a workload spec with closed session turns needs --timing (a turn waits for an answer)")
        if config.concurrency is not None:
            raise ValueError("--concurrency: the workload spec's session turns wait for their answers already")
    if closed is None:
        return config
    for name in ("concurrency", "think_time_ms", "rate"):
        if getattr(config, name):
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag}: the workload spec's arrival is closed loop already ({closed[0]} users)")
    if not config.timing:
        raise ValueError("a workload spec with closed-loop arrivals needs --timing (users wait for answers)")
    return replace(config, concurrency=closed[0], think_time_ms=closed[1])


def _run_gpus(config: SimConfig) -> int:
    """The GPUs of a timed run: workers (both P/D pools) x GPUs per worker (tp x pp, x the attention
    replicas with ``dp_attention``); with ``--pool``, the sum over the pools of the same."""
    if config.pools:
        from dynlab.engine.pools import pool_configs

        return sum(pool.workers * _worker_gpus(sub) for pool, sub in pool_configs(config))
    pd = config.pd()
    workers = config.workers if pd is None else sum(pd)
    return workers * _worker_gpus(config)


def _worker_gpus(config: SimConfig) -> int:
    """One worker's GPUs: tp x pp, x the attention replicas with ``dp_attention``."""
    return config.tp * config.pp * (config.ep // config.tp if config.dp_attention else 1)


def _benchmark(config: SimConfig) -> bool:
    """Whether the run is driven as a benchmark client drives a server (``--concurrency``, ``--requests``,
    ``--warmup``): it then adds the clients' figures (:mod:`dynlab.sim.benchmark`)."""
    return config.timing and (config.concurrency is not None or config.num_requests is not None
                              or config.warmup > 0)


def _closed_keys(config: SimConfig) -> dict:
    """The keys that say how closed-loop users drove the run."""
    keys = {"concurrency": config.concurrency, "think_time_ms": config.think_time_ms}
    if config.duration is not None:
        keys["duration_s"] = config.duration
    if config.warmup:
        keys["warmup"] = config.warmup
    return keys


def first_requests(requests, n: int, total=None) -> tuple:
    """``(requests, total)``: the workload's first ``n`` requests (``--requests``); a loaded trace stays a
    trace (its block sizes kept). Raises ``ValueError`` when the workload has fewer."""
    out = _like(list(itertools.islice(requests, n)), requests)
    if len(out) < n:
        raise ValueError(f"--requests {n}: the workload has only {len(out)} requests")
    return out, n


def _peek(requests) -> tuple:
    """``(requests, first request or None)``: a list as it is, an iterator with its first request put back."""
    if isinstance(requests, (list, tuple)):
        return requests, requests[0] if requests else None
    it = iter(requests)
    first = next(it, None)
    return (it if first is None else itertools.chain((first,), it)), first


def _shaped(config: SimConfig, requests, first, total) -> tuple:
    """``(config, requests, total, keys)``: the arrival options checked
    (:func:`dynlab.engine.arrival_options.check_arrival_options`) and, when ``--rate`` (on timestamps),
    ``--rate-scale`` or ``--duration`` is given, the requests rescaled, cut or looped
    (:mod:`dynlab.traces.rates`), ``config.time_scale`` folded into them, and the keys that say so;
    ``--time-scale`` alone leaves the scaling to the engine and adds the same keys. Requests without
    timestamps arrive as a Poisson process: ``poisson_rate`` (requests/s) and ``poisson_rate_from`` (``--rate``,
    or the default :data:`~dynlab.engine.config.POISSON_RATE` because the workload has none) say so."""
    from dynlab.engine.arrival_options import check_arrival_options
    from dynlab.engine.config import POISSON_RATE

    stamped = first is not None and first.timestamp is not None
    if config.timing:
        check_arrival_options(stamped, config.time_scale, config.rate, config.rate_scale, config.duration)
    elif config.duration is not None and not stamped:
        check_arrival_options(False, 1.0, None, None, config.duration)
    if not stamped:  # Poisson arrivals: the run says at which rate, and whose
        keys = {"poisson_rate": POISSON_RATE if config.rate is None else config.rate,
                "poisson_rate_from": "default: the workload has no timestamps" if config.rate is None else "--rate"}
        return (replace(config, rate=POISSON_RATE) if config.rate is None else config), requests, total, keys
    from dynlab.traces import rates

    if config.rate is None and config.rate_scale is None and config.duration is None:
        if config.time_scale == 1.0:
            return config, requests, total, {}
        # --time-scale alone: the engine scales the arrivals (as before); the keys say so, as --rate-scale's do
        requests = requests if isinstance(requests, list) else list(requests)
        scale = config.time_scale  # the arrivals' rate from their scaled times: no copy of the requests
        keys = rates.describe(_trace_rate(requests, None), scale, [r.timestamp * scale for r in requests])
        return config, requests, total, keys
    requests = list(requests)
    trace_rate = _trace_rate(requests, config.rate)
    scale = rates.time_scale_for(trace_rate, config.rate, config.rate_scale) * config.time_scale
    out = rates.shape(requests, scale, config.duration, config.duration_repeat)
    out = _like(out, requests)
    keys = rates.describe(trace_rate, scale, [r.timestamp for r in out])
    return replace(config, time_scale=1.0, rate=None), out, len(out), keys


def _trace_rate(requests: list, rate) -> Optional[float]:
    """The trace's mean rate (requests/s, :func:`dynlab.traces.rates.mean_rate`); ``None`` when it has none
    (one arrival, or all at once), which is an error only for a target ``rate``."""
    from dynlab.traces import rates

    try:
        return rates.mean_rate([r.timestamp for r in requests])
    except rates.RateError:
        if rate is not None:
            raise
        return None


def _like(out: list, like) -> list:
    """``out`` carrying ``like``'s ``block_tokens`` / ``own_block_tokens`` (a loaded trace's), when it has them."""
    from dynlab.traces.reader import TraceRequests

    if not hasattr(like, "own_block_tokens"):
        return out
    t = TraceRequests(out)
    t.block_tokens, t.own_block_tokens = like.block_tokens, like.own_block_tokens
    t.closed, t.follows = getattr(like, "closed", None), getattr(like, "follows", None)
    return t


def _workload(config: SimConfig, rng: random.Random, requests) -> tuple:
    """``(requests, total, own, synthetic_prefix_blocks)`` of ``config``; ``own``: tokens per block of
    names the trace carries itself (512 for Mooncake), ``None`` when dynlab hashes tokens at ``block``."""
    if config.workload is not None and requests is None:
        from dynlab.traces.workload_io import workload_requests

        from dynlab.engine.spec import hash_lookahead_tokens

        requests = workload_requests(config.workload, config.block, config.hash, hash_lookahead_tokens(config))
    if config.trace is None and config.workload is None:
        from dynlab.traces.synthetic import seed_requests

        requests = seed_requests(config.prefixes, config.reps, config.plen, config.tail, config.block, rng,
                                 config.hash)
        return requests, config.prefixes * config.reps, None, config.plen >= config.block
    if requests is None:
        from dynlab.traces.reader import open_reader

        from dynlab.engine.spec import hash_lookahead_tokens

        requests, total, reader = open_reader(config.trace, config.trace_format, config.block, scheme=config.hash,
                                              trace_block=config.trace_block, tokenizer=config.tokenizer,
                                              hash_lookahead=hash_lookahead_tokens(config),
                                              keep_failed=config.keep_failed)
        own = reader.block_tokens
    else:
        total, own = len(requests), getattr(requests, "own_block_tokens", None)
    check_effective(config, own_block_tokens=own)  # --block on a trace that names its own blocks
    return requests, total, own, None


def _guard(strategy: Strategy, fn):
    """Run ``fn()``; an exception raised inside the strategy's own code becomes a :class:`StrategyError`."""
    try:
        return fn()
    except DynlabError:
        raise
    except Exception as exc:
        if raised_in_plugin(exc, strategy):
            raise StrategyError(f"strategy {strategy.name!r} failed: {type(exc).__name__}: {exc}") from exc
        raise


__all__ = ["run", "SEED_KEYS", "StrategyError"]
