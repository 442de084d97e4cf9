"""A timed run's engines, built from its configuration: engines, pool size, latency model, block names.

:func:`build_engines` resolves what ``--timing`` needs from a :class:`~dynlab.engine.config.SimConfig`:
the hardware (``--model``, ``--gpu``, ``--tp``), the latency model (``--latency-model``,
``--latency-opt``), each worker's pool (``--capacity`` engine blocks, or the hardware-derived
pool of :func:`dynlab.latency.hardware.kv_blocks`), and the mapping from a workload's names
(trace blocks of ``--trace-block`` tokens) to the engine's block names (``--block`` tokens,
:func:`dynlab.engine.names.engine_block_names`). It knows nothing of strategies or metrics.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional

from dynlab.engine.config import SimConfig
from dynlab.engine.lora import lora_spec
from dynlab.engine.names import MAX_RATIO, engine_block_names, engine_block_runs
from dynlab.engine.lockstep import rank_latency, check_dp_ranks, dp_rank_of  # noqa: F401 (dp_rank_of: public here)
from dynlab.engine.spec import drops_last_block, hash_lookahead_tokens
from dynlab.engine.spec_setup import spec_decoding, spec_describe  # noqa: F401 (public here too)
from dynlab.engine.worker import EngineWorker
from dynlab.latency.base import LatencyModel


@dataclass
class TimedSetup:
    """What a timed run is made of: :meth:`engines` (an aggregated pool) and :meth:`pd_engines` build fresh
    engines, :meth:`describe` says what was used; the run layer (:mod:`dynlab.sim.topology`) serves on them."""

    config: SimConfig
    latency: LatencyModel
    capacity: int
    capacity_source: str
    trace_block: int
    names_of: Callable
    bulk: bool = True
    cpu_capacity: Optional[int] = None
    kv_bytes_per_block: int = 0
    load_ms_per_block: float = 0.0
    #: ``request -> (names, runs)`` (:func:`~dynlab.engine.names.engine_block_runs`), or ``None``
    runs_of: Optional[Callable] = None
    #: where ``cpu_capacity`` comes from (:func:`cpu_tier_source`), ``""`` without a CPU tier
    cpu_capacity_source: str = ""
    #: the KV cache groups (:class:`~dynlab.kv.groups.HybridPool`) of a model with window, chunked or state
    #: layers, ``None`` for one whose layers all keep every token (today's one-group engine)
    kv_layout: Any = None
    #: the workers' LoRA adapter settings (:class:`~dynlab.engine.lora.LoraSpec`), ``None`` without ``--max-loras``
    lora: Any = None
    #: ``--pool`` (:mod:`dynlab.engine.pools`): ``(Pool, TimedSetup of that pool alone)`` per pool in worker order;
    #: ``()`` for a fleet of one GPU and tp (the other fields are then the run's; with pools, pool 0's)
    pools: tuple = ()
    #: attention data-parallel ranks per worker (``--dp-attention``: ``ep / tp``, :mod:`dynlab.models.parallel`),
    #: 1 without; each rank is an engine of its own (:meth:`engines`) and ``capacity`` is one rank's
    dp: int = 1
    #: with ranks, the worker's latency model (``latency`` is one rank's): what :meth:`describe` reports
    worker_latency: Any = None

    def engines(self) -> list[EngineWorker]:
        """Fresh engines of an aggregated pool, ``config.workers x dp`` of the run's engine kind
        (:meth:`engine_kind`): with ``--dp-attention`` rank ``r`` of worker ``w`` is engine (routing target)
        ``w * dp + r``, with its own scheduler, KV pool and prefix cache (:func:`dp_rank_of`); with ``pools``, each
        pool's workers built from its own setup, ids ``0 .. N-1`` in pool order."""
        kind = self.engine_kind()
        if self.pools:
            subs = [sub for pool, sub in self.pools for _ in range(pool.workers)]  # each worker's pool's setup
            return [kind.build(sub, w) for w, sub in enumerate(subs)]
        return [kind.build(self, w) for w in range(self.config.workers * self.dp)]

    @property
    def pool_blocks(self) -> Optional[int]:
        """Each routed worker's KV pool (blocks) when every one has the same (``RunContext.pool_blocks``; a P/D fleet's
        prefill pool), else ``None``."""
        sizes = {sub.capacity for pool, sub in self.pools if pool.role != "decode"} or {self.capacity}
        return sizes.pop() if len(sizes) == 1 else None

    def spec_decoding(self):
        """A worker's speculative decoding for this run (:func:`spec_decoding`; ``None``: off)."""
        return spec_decoding(self.config)

    def engine_kind(self):
        """The run's engine kind (``config.engine_kind``, a registered name: :mod:`dynlab.engine.kinds`)."""
        from dynlab.plugins import engine_kinds

        return engine_kinds().get(self.config.engine_kind)()

    @functools.cached_property
    def queue_policy(self):
        """The run's queue policy (``config.queue_policy``, a registered name: :func:`dynlab.plugins.queue_policies`),
        one instance for every worker (a policy keeps no state: each waiting queue is its own)."""
        from dynlab.plugins import queue_policies

        return queue_policies().get(self.config.queue_policy)()

    def pd_engines(self) -> tuple[list[EngineWorker], list[EngineWorker]]:
        """Fresh ``(prefill, decode)`` pools of ``config.pd()`` workers: prefill engines hand requests off at
        their first token (``handoff=True``); neither has a CPU tier or works on runs."""
        p, d = self.config.pd()
        kind = self.engine_kind()
        if self.pools:  # --pool prefill:... --pool decode:...: each role's workers from its pool's setup
            role = {pool.role: sub for pool, sub in self.pools}
            return ([kind.build(role["prefill"], w, handoff=True) for w in range(p)],
                    [kind.build(role["decode"], w, decode=True) for w in range(d)])
        return ([kind.build(self, w, handoff=True) for w in range(p)],
                [kind.build(self, w, decode=True) for w in range(d)])

    def transfer_bytes(self):
        """``(tokens, hit) -> bytes`` a P/D transfer sends with KV cache groups (what is resident,
        :func:`dynlab.kv.groups.transfer_bytes`), ``None`` otherwise (every token's KV)."""
        if self.kv_layout is None:
            return None
        from dynlab.kv.groups import transfer_bytes

        groups = self.latency.hardware.model.kv_groups
        return lambda tokens, hit: transfer_bytes(groups, tokens, hit)

    def describe(self) -> dict[str, Any]:
        """The keys that say where a timed run's numbers come from (block sizes, pool, hardware, latency, the
        scheduler's admission rule and async scheduling; ``queue_policy`` unless FCFS). With ``--pool``, pool 0's,
        without the keys whose values differ between pools (:data:`POOL_KEYS`: ``gpu``, ``tp``, ``kv_blocks``, ...;
        the ``pools`` section has each pool's): one pool's keys are those of ``--workers/--gpu/--tp``."""
        if self.pools:
            each = [sub.describe() for _, sub in self.pools]
            out = each[0]
            for key in POOL_KEYS:  # a key whose value differs between pools: in the pools section only
                if any(d.get(key) != out.get(key) for d in each[1:]):
                    out.pop(key, None)
            return out
        c = self.config
        out = {"block": c.block, "trace_block": self.trace_block, "kv_blocks": self.capacity,
               "kv_blocks_source": self.capacity_source, "model": c.model, "gpu": c.gpu, "tp": c.tp,
               "latency_model": c.latency_model, "admission": c.admission, "async_scheduling": c.async_scheduling}
        if self.dp > 1:  # kv_blocks is one rank's; the per-engine lists have workers x dp entries
            out["dp_ranks"] = self.dp
        if c.engine_kind != "vllm":
            out["engine"] = c.engine_kind
        if c.engine_kind == "sglang":  # its options as resolved (dynlab.engine.sglang.defaults), vLLM's left out
            from dynlab.engine.sglang.defaults import describe

            del out["admission"], out["async_scheduling"]
            out.update(describe(self))
        if c.queue_policy != "fcfs":
            out["queue_policy"] = c.queue_policy
        out.update((self.worker_latency or self.latency).describe_hardware())  # non-default parallelism, latency_domain
        if c.spec_tokens and c.spec_method is not None:
            out.update(spec_describe(c, self.latency))
        if self.cpu_capacity is not None:
            out.update({"cpu_kv_blocks": self.cpu_capacity, "cpu_kv_blocks_source": self.cpu_capacity_source,
                        "kv_bytes_per_block": self.kv_bytes_per_block,
                        "pcie_gbps": c.pcie_gbps, "load_ms_per_block": round(self.load_ms_per_block, 6),
                        "cpu_write": c.cpu_write})
        return out


#: the keys of :meth:`TimedSetup.describe` that differ per pool: a mixed fleet's result has them in its ``pools``
POOL_KEYS = ("gpu", "tp", "kv_blocks", "kv_blocks_source", "cpu_kv_blocks", "cpu_kv_blocks_source",
             "load_ms_per_block", "latency_domain")


def _pooled(config: SimConfig, own_block_tokens: Optional[int], bulk: bool) -> TimedSetup:
    """The :class:`TimedSetup` of a ``--pool`` fleet: each pool's own (:func:`dynlab.engine.pools.pool_configs`),
    gathered in pool 0's; raises ``ValueError`` as :func:`build_engines` for any pool, or when the pools' KV
    bytes per block differ with a CPU tier (its PCIe figures are the run's, one block size)."""
    from dataclasses import replace

    from dynlab.engine.pools import pool_configs

    pools = tuple((pool, build_engines(sub, own_block_tokens, bulk)) for pool, sub in pool_configs(config))
    first = pools[0][1]
    if first.cpu_capacity is not None and len({sub.kv_bytes_per_block for _, sub in pools}) > 1:
        raise ValueError("--pool with a CPU tier: the pools' KV bytes per block differ (their tp splits the KV "
                         "heads differently), which one tier's figures cannot hold")
    return replace(first, config=config, pools=pools)


def build_engines(config: SimConfig, own_block_tokens: Optional[int], bulk: bool = True) -> TimedSetup:
    """The :class:`TimedSetup` of ``config``; ``own_block_tokens``: tokens per block of the names a trace
    carries itself (512 for Mooncake), ``None`` when the workload's tokens are hashed at ``config.block``.

    Raises ``ValueError`` (one line) for an unknown model, GPU or latency model, a model that
    does not fit the GPUs, a ``--trace-block`` that has no effect, or block sizes whose ratio
    exceeds what engine block names can carry. With ``config.pools``: one setup per pool (:func:`_pooled`).
    """
    if config.pools:
        return _pooled(config, own_block_tokens, bulk)
    hardware, latency, capacity, source, layout = _hardware_pool(config)
    _warn_draft_size(config, hardware.model)
    dp, worker_latency = hardware.parallel.dp, None
    if dp > 1:  # ranks (dynlab.engine.lockstep): a pool each, priced as one rank, one step at a time
        check_dp_ranks(config)
        if capacity < dp:
            raise ValueError(f"a worker's {capacity} KV blocks cannot give each of its {dp} attention-DP ranks one")
        capacity, source = capacity // dp, f"{source}; / {dp} attention-DP ranks = {capacity // dp} blocks per rank"
        worker_latency, latency, bulk = latency, rank_latency(config, hardware), False
    trace_block = own_block_tokens or config.block
    if config.trace_block is not None:
        if own_block_tokens is None:
            raise ValueError(f"--trace-block has no effect: the workload's blocks are hashed at --block "
                             f"({config.block} tokens); it applies to traces that name their own blocks (mooncake)")
        trace_block = config.trace_block
    if trace_block > MAX_RATIO * config.block:
        raise ValueError(f"--block {config.block} is too small for trace blocks of {trace_block} tokens "
                         f"(at most {MAX_RATIO} engine blocks per trace block)")
    block = config.block
    la = hash_lookahead_tokens(config)  # EAGLE's hash lookahead: a prompt's names end a token earlier
    if trace_block == block:
        def names_of(req) -> list:
            return list(req.hashes[:(req.input_length - la) // block])
        runs_of = None  # one engine block per trace block: the routing recorder takes the names
    else:
        def names_of(req) -> list:
            return engine_block_names(req.hashes, req.input_length - la, trace_block, block)

        def runs_of(req) -> tuple:
            return engine_block_runs(req.hashes, req.input_length - la, trace_block, block)
    cpu, per_block, load_ms = cpu_tier_size(config, hardware.model, layout)
    if layout is not None and runs_of is not None:
        # KV cache groups over mapped names: every group named from the same engine block names, on the
        # plain pool (dynlab.kv.hybrid; no runs), the extra groups' names above the mapped ones
        from dataclasses import replace

        from dynlab.kv.groups import MAPPED_NAME_STRIDE

        layout, runs_of = replace(layout, name_stride=MAPPED_NAME_STRIDE), None
    return TimedSetup(config, latency, capacity, source, trace_block, names_of, bulk, cpu, per_block, load_ms,
                      runs_of, cpu_tier_source(config, cpu, per_block, layout), layout,
                      lora_spec(config, hardware.model), dp=dp, worker_latency=worker_latency)


def _warn_draft_size(config: SimConfig, target) -> None:
    """Warn (one line) when the draft model of ``--spec-method draft --spec-model M`` holds at least as
    many weight bytes as the target ``target`` (a ``ModelSpec``): each of its K steps then costs at
    least the target's weights (a decode step is memory-bound: the roofline reads the weights once per
    step), so a verify emitting at most ``1 + K`` tokens takes about ``1 + K`` target steps or more:
    speculation can hardly speed decoding up (a draft model is a small one of the target's family). A warning, not a refusal: vLLM accepts
    any draft model and the run is well defined; ``--model`` and ``--spec-model`` swapped is the
    likely mistake."""
    if not (config.spec_tokens and config.spec_method == "draft" and config.spec_model is not None):
        return
    from dynlab.latency.hardware import model_spec

    draft = model_spec(config.spec_model, config.kv_cache_dtype)
    if draft.weight_bytes >= target.weight_bytes:
        import warnings

        warnings.warn(f"--spec-model {config.spec_model} ({draft.weight_bytes / 1e9:,.1f} GB of weights) is not "
                      f"smaller than --model {config.model} ({target.weight_bytes / 1e9:,.1f} GB): each of its "
                      f"{config.spec_tokens} draft steps reads at least the target's weights, so speculation can "
                      "hardly speed decoding up (a draft model is a small one of the target's family; are the two swapped?)",
                      stacklevel=2)


def _hardware_pool(config: SimConfig) -> tuple:
    """``(hardware, latency model, pool blocks per worker, where that number comes from)`` of ``config``;
    raises ``ValueError`` for an unknown model, GPU or latency model, or a model that does not fit."""
    from dynlab.engine.kinds import run_latency_model
    from dynlab.latency.grid import hardware_for
    from dynlab.latency.hardware import kv_blocks

    hardware = hardware_for(config.model, config.gpu, config.tp, ep=config.ep, pp=config.pp,
                            dp_attention=config.dp_attention, kv_cache_dtype=config.kv_cache_dtype)
    latency = run_latency_model(config, hardware)
    layout = None if hardware.model.uniform_kv else _kv_layout(config, hardware)
    if config.capacity is not None:
        return (hardware, latency, config.capacity, f"--capacity {config.capacity} blocks of {config.block} tokens",
                layout and layout[2])
    if layout is not None:
        return hardware, latency, layout[0], layout[1], layout[2]
    capacity, source = kv_blocks(hardware.model, hardware.gpu, config.block, config.tp, _memory_share(config),
                                 parallel=hardware.parallel, draft=_draft_model(config))
    return hardware, latency, capacity, source, None


def _draft_model(config: SimConfig):
    """The ``ModelSpec`` of ``--spec-method draft --spec-model M`` (loaded beside the target, so it shrinks
    the pool: :func:`dynlab.models.capacity.kv_blocks`), ``None`` otherwise (EAGLE/MTP heads: dynlab has
    no figure for their weights)."""
    if not (config.spec_tokens and config.spec_method == "draft" and config.spec_model is not None):
        return None
    from dynlab.latency.hardware import model_spec

    return model_spec(config.spec_model, config.kv_cache_dtype)


def _kv_layout(config: SimConfig, hardware) -> tuple:
    """``(blocks, derivation, HybridPool)`` of a model with KV cache groups (:func:`dynlab.kv.groups.hybrid_kv_blocks`);
    raises ``ValueError`` with a parallel layout other than ``--tp``."""
    from dynlab.kv.groups import hybrid_kv_blocks

    if hardware.parallel is not None and not hardware.parallel.plain:
        raise ValueError(f"{hardware.model.name} has KV cache groups, which dynlab models with --tp only "
                         f"(not {hardware.parallel.describe()})")
    if drops_last_block(config) and any(g.kind == "chunked_local" for g in hardware.model.kv_groups):
        raise ValueError(f"--spec-hash-rule drop: {hardware.model.name} has chunked-local attention, with which "
                         "vLLM 0.33 does not drop a hit's last block (ChunkedLocalAttentionManager refuses it)")
    return hybrid_kv_blocks(hardware.model, hardware.gpu, config.block, config.tp, _memory_share(config))


def _memory_share(config: SimConfig) -> float:
    """The share of GPU memory for weights and KV: ``--mem-fraction-static`` when given (SGLang's), else
    ``--gpu-memory-utilization`` (vLLM's; :mod:`dynlab.engine.sglang.defaults` says why SGLang's default is it)."""
    share = config.mem_fraction_static
    return config.gpu_memory_utilization if share is None else share


def check_timed(config: SimConfig, requests=None) -> None:
    """Raise the one-line ``ValueError`` a timed run of ``config`` would raise for its options, before any
    engine is built or request served: an unknown model, GPU or latency model, a model that does not
    fit the GPUs, a CPU tier the options cannot size (:func:`cpu_tier_size`) and, given the loaded
    trace ``requests``, an arrival past the clock's horizon (:func:`dynlab.engine.env.check_arrivals`),
    and ``--time-scale`` or ``--rate`` where the workload ignores it
    (:func:`dynlab.engine.arrival_options.check_arrival_options`; ``requests`` ``None`` with a trace: not checked here,
    the run checks it at its first request). A ``--model`` config.json that opens but holds a bad config
    raises :class:`dynlab.disagg.cost.ModelConfigError` instead (a bad input file, not a bad option), one
    that cannot be opened :class:`dynlab.errors.InputFileError`. ``compare`` and ``sweep`` call it for
    every run before the first, so a bad value writes nothing.
    """
    from dynlab.engine.arrival_options import check_arrival_options
    from dynlab.engine.env import check_arrivals
    from dynlab.engine.pools import pool_configs

    for one in [sub for _, sub in pool_configs(config)] if config.pools else [config]:  # --pool: each pool's
        hardware, *_, layout = _hardware_pool(one)
        if hardware.parallel.dp > 1:
            check_dp_ranks(one)
        cpu_tier_size(one, hardware.model, layout)
        lora_spec(one, hardware.model)  # a model whose adapters dynlab cannot size
        spec_decoding(one)  # a bad --spec-acceptance
    if requests is not None:
        check_arrivals(requests, config.time_scale)
    if requests or (config.trace is None and config.workload is None):  # a loaded trace, or the seed workload
        check_arrival_options(bool(requests) and requests[0].timestamp is not None, config.time_scale, config.rate,
                              config.rate_scale, config.duration)


def cpu_tier_source(config: SimConfig, cpu: Optional[int], per_block: int, layout=None) -> str:
    """Where a CPU tier of ``cpu`` blocks per worker comes from (the run's ``cpu_kv_blocks_source``): the
    ``--cpu-capacity`` given, or the ``--cpu-memory-gb`` formula of :func:`cpu_tier_size` with its numbers
    (``per_block``: KV bytes per block; with KV cache groups, ``layout``, a block of one group); ``""``
    without a tier."""
    if cpu is None:
        return ""
    if config.cpu_capacity is not None:
        return f"--cpu-capacity {cpu} blocks of {config.block} tokens"
    if layout is not None:
        return (f"floor({config.cpu_memory_gb:g} x 10^9 B / {per_block:,} B per block of {config.block} tokens "
                f"of one KV cache group of {layout.group_size} layers) = {cpu} blocks per worker, shared by "
                f"{layout.describe()}")
    return (f"floor({config.cpu_memory_gb:g} x 10^9 B / {per_block:,} B per block of {config.block} tokens) "
            f"= {cpu} blocks ({cpu * config.block:,} tokens) per worker")


def _one_block_gb(per_block: float) -> float:
    """The GB (10^9 bytes), rounded up to 4 significant digits, that hold one block of ``per_block`` bytes."""
    import math

    from dynlab.kv.cpu_tier import cpu_blocks

    scale = 10.0 ** (math.floor(math.log10(per_block / 1e9)) - 3)
    gb = float(f"{math.ceil(per_block / 1e9 / scale) * scale:.4g}")
    while cpu_blocks(gb, per_block) < 1:  # float rounding of the product: one step up
        gb = float(f"{gb + scale:.4g}")
    return gb


def cpu_tier_size(config: SimConfig, model, layout=None) -> tuple[Optional[int], int, float]:
    """``(cpu blocks per worker or None, KV bytes per block (an int), ms to load one block over PCIe)`` of ``config``.

    With KV cache groups (``layout``, a :class:`~dynlab.kv.groups.HybridPool`) a block is one pool block of
    one group, :meth:`~dynlab.kv.groups.HybridPool.block_bytes` (``page * group_size * tp``); the rest as below.

    A worker's block holds ``kv_bytes_per_token_per_gpu(tp) * tp * block`` bytes (its share on each of
    its ``tp`` GPUs; :meth:`dynlab.latency.hardware.ModelSpec.kv_bytes_per_token_per_gpu`), a whole
    number: MLA replicates its latent (``kv_bytes_per_token * tp * block``); otherwise the product is
    ``kv_bytes_per_token * tp * block / min(tp, kv_heads)``, and ``kv_bytes_per_token``
    (``2 * layers * kv_heads * head_dim * dtype_bytes``) is a multiple of ``kv_heads``, so the division
    is exact. It is computed in integers (no float rounding at any size). Each GPU
    loads its share over its own link of ``pcie_gbps`` GB/s (10^9 bytes/s), so one block takes
    ``bytes / tp / (pcie_gbps * 1e9) * 1000`` ms. ``cpu_memory_gb`` (GB of host memory per worker)
    becomes ``floor(cpu_memory_gb * 1e9 / bytes per block)`` blocks.

    Raises ``ValueError`` naming ``--pcie-gbps`` when one block's load would take longer than the
    simulated clock's horizon (:data:`dynlab.limits.HORIZON_MS`), naming ``--cpu-memory-gb`` when it is > 0
    but holds no block (a tier the user asked for would silently be none; 0 is "no tier"), and as
    :func:`~dynlab.kv.cpu_tier.cpu_blocks`.
    """
    import math

    from dynlab.limits import HORIZON_MS
    from dynlab.kv.cpu_tier import cpu_blocks

    if layout is not None:
        per_block = layout.block_bytes(config.tp)
    else:
        per_block = model.kv_bytes_per_token * config.tp * config.block
        if model.attention != "mla":  # heads split over min(tp, kv_heads) GPUs; exact (see above)
            per_block //= min(config.tp, model.kv_heads)
    try:
        load_ms = float(per_block) / config.tp / (config.pcie_gbps * 1e9) * 1000.0
    except OverflowError:  # more bytes than a float holds (an absurd --block): past any horizon
        load_ms = math.inf
    if (config.cpu_capacity is not None or config.cpu_memory_gb is not None) and not load_ms <= HORIZON_MS:
        raise ValueError(f"--pcie-gbps {config.pcie_gbps:g} is too small: one block of {per_block:,} bytes would "
                         f"take {load_ms:g} ms to load, past the simulated clock's horizon ({HORIZON_MS:g} ms)")
    if config.cpu_capacity is not None:
        return config.cpu_capacity, per_block, load_ms
    if config.cpu_memory_gb is not None:
        blocks = cpu_blocks(config.cpu_memory_gb, per_block)
        if blocks == 0 and config.cpu_memory_gb > 0:
            raise ValueError(f"--cpu-memory-gb {config.cpu_memory_gb:g} holds no KV block of {per_block:,} bytes: "
                             f"give at least {_one_block_gb(per_block):g}, or 0 for no tier")
        return blocks, per_block, load_ms
    return None, per_block, load_ms
