"""The replay engine: a workload's requests -> a strategy -> simulated workers -> KV events -> metrics.

:func:`run` is the library function behind ``dynlab sim`` (and every ``compare``
run and ``sweep`` cell): it takes a :class:`SimConfig` and returns the JSON object
that ``dynlab sim`` prints.

Count-based model (no time): requests are routed one after another in workload
order. Each worker serves its request at once (stores its blocks, evicts, and
publishes the net change as ``BlockStored`` / ``BlockRemoved`` when publishing is
on). Events produced by serving request ``i`` reach the strategy just before
request ``i + 1 + event_delay`` is routed; each is dropped with probability
``event_loss`` (from its own RNG, seeded from the run's seed, so the routing RNG
is untouched).
"""
from __future__ import annotations

import itertools
import random
import sys
from dataclasses import fields, replace
from typing import Any, Iterable, Optional, Sequence

from dynlab.engine.config import SimConfig, check_effective
from dynlab.engine.counted import Worker
from dynlab.engine.bus import CountedEventBus
from dynlab.engine.metrics import RoutingMetrics, event_refusals
from dynlab.errors import DynlabError
from dynlab.routing.strategy import FleetView, Request, RunContext, Strategy, StrategyOption

SEED_KEYS = ("mode", "workers", "requests", "repeat_requests", "hits", "hit_rate")


class StrategyError(DynlabError):
    """A strategy plugin raised an exception: the message names the strategy and the call."""


def _raised_in_plugin(exc: BaseException, strategy: Strategy) -> bool:
    """Whether the traceback of ``exc`` passes through the strategy class's own source files."""
    classes = [c for s in getattr(strategy, "instances", None) or (strategy,) for c in type(s).__mro__]
    files = {getattr(c, "__module__", None) for c in classes} - {"builtins", "abc", __name__}
    files = {getattr(sys.modules.get(m), "__file__", None) for m in files} - {None}
    files.discard(getattr(sys.modules.get("dynlab.routing.strategy"), "__file__", None))
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in files:
            return True
        tb = tb.tb_next
    return False


#: the option of router replicas (``--routers N``), given with the strategy's: ``--opt shared_load=true``
SHARED_LOAD = StrategyOption("shared_load", bool, False,
                             "router replicas read the whole fleet's load, not only their own requests'")


def build_strategy(config: SimConfig, rng: random.Random, registry=None, block_tokens: Optional[int] = None,
                   pool_blocks: Optional[int] = None) -> Strategy:
    """Instantiate ``config.mode`` from the strategy registry with converted options.

    ``block_tokens``: tokens per block of the workload's names (default ``config.block``);
    ``pool_blocks``: each worker's pool in blocks (``RunContext.pool_blocks``; default ``config.capacity``).
    With ``config.routers > 1``: a :class:`~dynlab.routing.replicas.RouterReplicas` of that many
    instances, sharing the run's RNG; ``--opt shared_load=true`` shares the load view among them.

    Raises :class:`dynlab.plugins.UnknownNameError` for an unknown mode and
    ``ValueError`` for an unknown or ill-typed option, or ``shared_load`` where it has no effect
    (one router, or no ``--timing``: the load a router knows is zero without it), or an option that
    needs a CPU tier (``StrategyOption.needs_cpu_tier``) given without one.
    """
    from dynlab import plugins

    registry = registry if registry is not None else plugins.strategies()
    cls = registry.get(config.mode)
    declared = {o.name: o for o in cls.options}
    values = {o.name: o.default for o in cls.options}
    opts = dict(config.opts)
    shared = False
    if SHARED_LOAD.name in opts and SHARED_LOAD.name not in declared:
        text = opts.pop(SHARED_LOAD.name)
        shared = SHARED_LOAD.convert(text) if isinstance(text, str) else bool(text)
        if config.routers == 1:
            raise ValueError("option 'shared_load' has no effect with one router (--routers 1): "
                             "it shares the load among router replicas")
        if not config.timing:
            raise ValueError("option 'shared_load' has no effect without --timing: "
                             "the load a router knows is zero there")
    tier = config.timing and (config.cpu_capacity is not None or config.cpu_memory_gb is not None)
    for name, text in opts.items():
        if name not in declared:
            known = ", ".join(declared) or "none"
            raise ValueError(f"strategy {config.mode!r} has no option {name!r} (options: {known})")
        if declared[name].needs_cpu_tier and not tier:
            raise ValueError(f"option {name!r} has no effect without a CPU tier (--timing with --cpu-capacity "
                             "or --cpu-memory-gb): it weighs blocks in the workers' CPU tiers")
        values[name] = declared[name].convert(text) if isinstance(text, str) else text
    ctx = RunContext(workers=config.workers, block=block_tokens or config.block, rng=rng, options=values,
                     publish=config.publish == "yes", timed=config.timing,
                     pool_blocks=pool_blocks if pool_blocks is not None else config.capacity)
    if config.routers == 1:
        return cls(ctx)
    from dynlab.routing.replicas import RouterReplicas

    return RouterReplicas([cls(ctx) for _ in range(config.routers)], config.router_assign, shared)


def make_workers(config: SimConfig, future: Optional[list] = None) -> list[Worker]:
    """``config.workers`` workers, each with a ``config.capacity``-block cache of ``config.policy``."""
    if config.capacity is None:
        return [Worker(w) for w in range(config.workers)]
    from dynlab import plugins

    policy = plugins.eviction_policies().get(config.policy)
    return [Worker(w, policy(config.capacity, future=future)) for w in range(config.workers)]


def _needs_future(config: SimConfig) -> bool:
    if config.capacity is None:
        return False
    from dynlab import plugins

    cls = plugins.eviction_policies().get(config.policy)
    return bool(getattr(cls, "needs_future", False))


def replay(requests: Iterable[Request], strategy: Strategy, workers: list[Worker], *,
           publish: bool = True, event_delay: int = 0, event_loss: float = 0.0,
           loss_rng: Optional[random.Random] = None, synthetic_prefix_blocks: Optional[bool] = None,
           progress=None) -> dict[str, Any]:
    """Route and serve every request, count-based (no time); return the fleet metrics (without ``mode``).

    Each request is routed, then served at once by its worker, whose net change reaches the
    strategy through a :class:`~dynlab.engine.bus.CountedEventBus` (``event_delay`` requests later,
    each event dropped with probability ``event_loss``). ``synthetic_prefix_blocks``: ``None`` for
    a trace, else the synthetic workload's rule for repeats and hits
    (:class:`~dynlab.engine.metrics.RoutingMetrics`).
    """
    n = len(workers)
    routing = RoutingMetrics(n, synthetic_prefix_blocks)
    cached_sizes = [0] * n
    fleet = FleetView(routing.counts, [0] * n, [0] * n, [0] * n, cached_sizes)
    bus = CountedEventBus(strategy.on_event, delay=event_delay, loss=event_loss, rng=loss_rng, publish=publish)
    route, on_route, tick, change = strategy.route, routing.on_route, bus.tick, bus.change
    i = -1
    try:
        for i, req in enumerate(requests):
            tick(i)
            strategy.predicted = None
            w = route(req, fleet)
            if type(w) is not int or not 0 <= w < n:
                raise DynlabError(f"strategy {strategy.name!r} returned {w!r}, not a worker in 0..{n - 1}")
            worker = workers[w]
            hashes = req.hashes
            actual = worker.overlap(hashes)
            on_route(hashes, w, strategy.predicted, actual, None, req.prefix)
            stored, removed = worker.serve(hashes, actual)
            cached_sizes[w] = worker.size
            if stored or removed:
                change(w, stored, removed)
            if progress is not None:
                progress.update(1)
    except DynlabError:
        raise
    except Exception as exc:
        if _raised_in_plugin(exc, strategy):
            raise StrategyError(f"strategy {strategy.name!r} failed at request {i}: "
                                f"{type(exc).__name__}: {exc}") from exc
        raise
    bus.flush()
    out = routing.result()
    out |= {"evicted_blocks": sum(wk.evicted_blocks for wk in workers),
            "events_published": bus.published, "events_dropped": bus.dropped}
    out |= event_refusals(strategy)
    out |= routing.balance()
    return out


def run(config: SimConfig, progress: bool = False, requests: Optional[Sequence[Request]] = None) -> dict[str, Any]:
    """Run one simulation and return the JSON object ``dynlab sim`` prints.

    ``requests``: the trace already loaded (:func:`dynlab.traces.reader.load_trace` of
    ``config.trace``, ``config.trace_format`` and ``config.block``), so a sweep reads a
    trace once per process; ``None`` streams it from ``config.trace``.

    Key order: the seed's keys (``mode, workers, requests, repeat_requests, hits,
    hit_rate``), then ``publish`` for strategies that use KV events, then (on a trace,
    with ``all_metrics`` or with ``timing``) ``block_tokens`` (tokens per block of the names
    replayed: the trace format's own, 512 for Mooncake, else ``config.block``; without ``timing``),
    ``hash`` (the scheme that named blocks of tokens; absent when the trace names its own blocks)
    and the fleet metrics; timed runs add the serving metrics and say which block sizes, pool,
    hardware and latency model they used.

    Raises ``ValueError`` for a bad option or one that has no effect here
    (:func:`dynlab.engine.config.check_effective`), :class:`dynlab.plugins.UnknownNameError`
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
    timed = None
    shaped = {}
    if config.timing or config.duration is not None:
        requests, first = _peek(requests)
        config, requests, total, shaped = _shaped(config, requests, first, total)
    if config.timing:
        from dynlab.engine.serving import build_engines

        timed = build_engines(config, own)
        block_tokens = config.block
    strategy = build_strategy(config if pd is None else replace(config, workers=pd[0]), rng,
                              block_tokens=block_tokens, pool_blocks=timed.capacity if timed is not None else None)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="req", leave=False, desc=config.mode)
    try:
        if pd is not None:
            metrics = _guard(strategy, lambda: timed.replay_disagg(requests, strategy, rng=rng, loss_rng=loss_rng,
                                                                   progress=bar))
        elif timed is not None:
            metrics = _guard(strategy, lambda: timed.replay(requests, strategy, rng=rng, loss_rng=loss_rng,
                                                            progress=bar))
        else:
            metrics = _replay_counted(config, requests, strategy, synthetic, loss_rng, bar)
    finally:
        if bar is not None:
            bar.close()
    return _result(config, metrics, strategy, timed, own, block_tokens) | shaped


def _result(config: SimConfig, metrics: dict, strategy: Strategy, timed, own: Optional[int],
            block_tokens: int) -> dict[str, Any]:
    """The JSON object of :func:`run` (its key order) from the replay's ``metrics``; ``timed``: the timed
    setup (``None`` without ``--timing``), ``own``: the trace's own block size, ``block_tokens``: the
    block size replayed."""
    pd = config.pd()
    out: dict[str, Any] = {"mode": config.mode, "workers": config.workers if pd is None else sum(pd)}
    for key in SEED_KEYS[2:]:
        out[key] = metrics[key]
    if strategy.uses_events:
        out["publish"] = config.publish
    if config.trace is not None or config.workload is not None or config.all_metrics or timed is not None:
        if timed is not None:
            out.update(timed.describe())
            if pd is not None:
                out.update({"prefill_workers": pd[0], "decode_workers": pd[1], "decode_router": config.decode_router,
                            "link_gbps": config.link_gbps, "link_latency_ms": config.link_latency_ms,
                            "overlap_transfer": config.overlap_transfer,
                            "decode_prefix_cache": config.decode_prefix_cache})
        else:
            out["block_tokens"] = block_tokens
        if own is None:
            out["hash"] = config.hash  # the scheme that named the blocks
        for key, value in metrics.items():
            if key not in out:
                out[key] = value
                if key == "output_tokens_per_s":
                    gpus = config.tp * config.pp * (config.ep // config.tp if config.dp_attention else 1)
                    out["output_tokens_per_s_per_gpu"] = round(value / (out["workers"] * gpus), 1)
    if config.routers > 1:
        out["routers"] = config.routers
        out["router_assign"] = config.router_assign
        out["requests_per_router"] = list(strategy.routed)
    return out


def _peek(requests) -> tuple:
    """``(requests, first request or None)``: a list as it is, an iterator with its first request put back."""
    if isinstance(requests, (list, tuple)):
        return requests, requests[0] if requests else None
    it = iter(requests)
    first = next(it, None)
    return (it if first is None else itertools.chain((first,), it)), first


def _shaped(config: SimConfig, requests, first, total) -> tuple:
    """``(config, requests, total, keys)``: the arrival options checked
    (:func:`dynlab.engine.config.check_arrival_options`) and, when ``--rate`` (on timestamps),
    ``--rate-scale`` or ``--duration`` is given, the requests rescaled, cut or looped
    (:mod:`dynlab.traces.rates`), ``config.time_scale`` folded into them, and the keys that say so."""
    from dynlab.engine.config import POISSON_RATE, check_arrival_options

    stamped = first is not None and first.timestamp is not None
    if config.timing:
        check_arrival_options(stamped, config.time_scale, config.rate, config.rate_scale, config.duration)
    elif config.duration is not None and not stamped:
        check_arrival_options(False, 1.0, None, None, config.duration)
    if not stamped:
        return (replace(config, rate=POISSON_RATE) if config.rate is None else config), requests, total, {}
    if config.rate is None and config.rate_scale is None and config.duration is None:
        return config, requests, total, {}
    from dynlab.traces import rates

    requests = list(requests)
    stamps = [r.timestamp for r in requests]
    try:
        trace_rate = rates.mean_rate(stamps)
    except rates.RateError:
        if config.rate is not None:
            raise
        trace_rate = None
    scale = rates.time_scale_for(trace_rate, config.rate, config.rate_scale) * config.time_scale
    out = rates.shape(requests, scale, config.duration, config.duration_repeat)
    out = _like(out, requests)
    return replace(config, time_scale=1.0, rate=None), out, len(out), rates.describe(trace_rate, scale, out)


def _like(out: list, like) -> list:
    """``out`` carrying ``like``'s ``block_tokens`` / ``own_block_tokens`` (a loaded trace's), when it has them."""
    from dynlab.traces.reader import TraceRequests

    if not hasattr(like, "own_block_tokens"):
        return out
    t = TraceRequests(out)
    t.block_tokens, t.own_block_tokens = like.block_tokens, like.own_block_tokens
    return t


def _workload(config: SimConfig, rng: random.Random, requests) -> tuple:
    """``(requests, total, own, synthetic_prefix_blocks)`` of ``config``; ``own``: tokens per block of
    names the trace carries itself (512 for Mooncake), ``None`` when dynlab hashes tokens at ``block``."""
    if config.workload is not None and requests is None:
        from dynlab.traces.workload import workload_requests

        requests = workload_requests(config.workload, config.block, config.hash)
    if config.trace is None and config.workload is None:
        from dynlab.traces.synthetic import seed_requests

        requests = seed_requests(config.prefixes, config.reps, config.plen, config.tail, config.block, rng,
                                 config.hash)
        return requests, config.prefixes * config.reps, None, config.plen >= config.block
    if requests is None:
        from dynlab.traces.reader import open_reader

        requests, total, reader = open_reader(config.trace, config.trace_format, config.block, scheme=config.hash,
                                              trace_block=config.trace_block, tokenizer=config.tokenizer)
        own = reader.block_tokens
    else:
        total, own = len(requests), getattr(requests, "own_block_tokens", None)
    check_effective(config, own_block_tokens=own)  # --block on a trace that names its own blocks
    return requests, total, own, None


def _replay_counted(config: SimConfig, requests, strategy: Strategy, synthetic, loss_rng, bar) -> dict:
    future = None
    if _needs_future(config):
        requests = list(requests)
        from dynlab.kv.policies import FutureIndex

        # indexed once, shared; a block's time is its request's number (opt ranks a request's blocks together)
        future = FutureIndex([h for r in requests for h in reversed(r.hashes)],
                             times=[i for i, r in enumerate(requests) for _ in r.hashes])
    workers = make_workers(config, future)
    return replay(requests, strategy, workers, publish=config.publish == "yes",
                  event_delay=config.event_delay, event_loss=config.event_loss,
                  loss_rng=loss_rng, synthetic_prefix_blocks=synthetic, progress=bar)


def _guard(strategy: Strategy, fn):
    """Run ``fn()``; an exception raised inside the strategy's own code becomes a :class:`StrategyError`."""
    try:
        return fn()
    except DynlabError:
        raise
    except Exception as exc:
        if _raised_in_plugin(exc, strategy):
            raise StrategyError(f"strategy {strategy.name!r} failed: {type(exc).__name__}: {exc}") from exc
        raise


def config_fields() -> list[str]:
    """Names of the :class:`SimConfig` fields (the ``sim`` options, underscores for dashes)."""
    return [f.name for f in fields(SimConfig)]


__all__ = ["SimConfig", "run", "replay", "build_strategy", "make_workers", "config_fields"]
