"""Mixed GPU pools in one fleet (``--pool GPU:tpN:COUNT``, repeatable; dynlab issue 41, item 5).

A pooled fleet is an aggregated timed fleet whose workers differ per pool in GPU and tensor parallelism:
pool ``i`` holds ``COUNT`` workers of ``GPU`` (a catalogue name or a GPU file, :func:`dynlab.models.gpus.gpu_spec`)
at ``tp`` GPUs each. Worker ids run ``0 .. N-1`` in pool order (pool 0's first). Each pool is served as the
same run's homogeneous configuration would be with ``--gpu GPU --tp N --workers COUNT``
(:func:`pool_configs`): its own latency model instance (the run's ``--latency-model`` and options on its
hardware) and its own KV pool (:func:`dynlab.models.capacity.kv_blocks` from its GPU's memory, its tp and
``--gpu-memory-utilization``), so one pool gives the run of ``--workers/--gpu/--tp`` exactly.

A P/D fleet on two GPUs: ``--pool prefill:GPU:tpN:P --pool decode:GPU:tpN:D`` (a role before each pool; one pool
of each role) is the P/D split ``P:D`` whose prefill workers are built as ``--gpu``/``--tp`` of the prefill pool
and whose decode workers as the decode pool's (:meth:`dynlab.engine.serving.TimedSetup.pd_engines`); the KV
transfer's bytes are the model's, whatever the GPUs (:mod:`dynlab.disagg.cost`).

``--pool`` replaces ``--workers``, ``--gpu`` and ``--tp`` (and, with roles, ``--split`` and
``--prefill-workers``/``--decode-workers``; giving both is refused); what is not modelled with it is refused too
(:func:`pool_rules`): count-based runs, ``--controller``, ``--engine sglang``, ``--latency-profile``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple, Optional, Sequence

__all__ = ["Pool", "ROLES", "parse_pool", "parse_pools", "pd_pools", "pool_configs", "pool_of_worker", "pool_rules",
           "pooled_workers"]


#: the roles a pool of a P/D fleet takes (``--pool prefill:...``, ``--pool decode:...``)
ROLES = ("prefill", "decode")


class Pool(NamedTuple):
    """One pool of a mixed fleet: ``workers`` workers of ``gpu`` (a catalogue name or a GPU file) at ``tp`` GPUs each;
    ``role``: ``prefill`` or ``decode`` in a P/D fleet, ``None`` in an aggregated one."""

    gpu: str
    tp: int
    workers: int
    role: Optional[str] = None

    @property
    def text(self) -> str:
        """The pool as ``--pool`` writes it: ``[ROLE:]GPU:tpN:COUNT``."""
        return f"{self.role + ':' if self.role else ''}{self.gpu}:tp{self.tp}:{self.workers}"


def parse_pool(text: str) -> Pool:
    """``"h100:tp1:4"`` -> ``Pool("h100", 1, 4)``, ``"decode:h200:tp2:2"`` -> ``Pool("h200", 2, 2, "decode")``. The
    GPU part may itself hold ``:`` (a file path): the last two fields are read from the right, a role from the left.
    Raises ``ValueError`` (one line) unless ``tp`` and ``COUNT`` are integers >= 1 after ``tp`` and the GPU is not
    empty (the GPU name is checked when the run builds its hardware)."""
    parts = str(text).rsplit(":", 2)
    form = "[prefill:|decode:]GPU:tpN:COUNT (e.g. h100:tp1:4)"
    if len(parts) != 3 or not parts[0] or not parts[1].startswith("tp"):
        raise ValueError(f"--pool {text!r}: expected {form}")
    try:
        tp, count = int(parts[1][2:]), int(parts[2])
    except ValueError:
        raise ValueError(f"--pool {text!r}: expected {form}") from None
    if tp < 1 or count < 1:
        raise ValueError(f"--pool {text!r}: tp and COUNT must be >= 1")
    role, sep, gpu = parts[0].partition(":")
    if not sep or role not in ROLES:
        role, gpu = None, parts[0]
    if not gpu:
        raise ValueError(f"--pool {text!r}: expected {form}")
    return Pool(gpu, tp, count, role)


def parse_pools(texts: Sequence[str]) -> tuple[Pool, ...]:
    """Every ``--pool`` value, parsed (:func:`parse_pool`), in the order given. Raises ``ValueError`` (one line)
    when some pools have a role and others none, or a P/D fleet has not exactly one pool of each role (several
    GPUs within a role are not modelled yet)."""
    pools = tuple(parse_pool(t) for t in ((texts,) if isinstance(texts, str) else texts))  # one text: one pool
    roles = [p.role for p in pools]
    if any(roles) and not all(roles):
        raise ValueError("--pool: give every pool a role (prefill:GPU:tpN:P, decode:GPU:tpN:D) or none")
    if any(roles) and sorted(roles) != ["decode", "prefill"]:
        raise ValueError("--pool: a P/D fleet takes one prefill pool and one decode pool (several GPUs per role "
                         "are not modelled yet)")
    return pools


def pd_pools(config) -> Optional[tuple[int, int]]:
    """``(prefill workers, decode workers)`` of ``--pool prefill:... --pool decode:...``, ``None`` without roles."""
    pools = parse_pools(config.pools)
    if not pools or pools[0].role is None:
        return None
    count = {p.role: p.workers for p in pools}
    return count["prefill"], count["decode"]


def pooled_workers(config) -> int:
    """The workers the router of ``config`` (a :class:`~dynlab.engine.config.SimConfig`) routes to: the sum of its
    pools' counts (the prefill pool's in a P/D fleet), else ``config.workers``."""
    if not config.pools:
        return config.workers
    pools = parse_pools(config.pools)
    return sum(p.workers for p in pools if p.role in (None, "prefill"))


def run_gpus(config) -> tuple[str, ...]:
    """The ``--gpu`` values a run of ``config`` uses: each pool's GPU in pool order (once each), else ``config.gpu``."""
    if not config.pools:
        return (config.gpu,)
    return tuple(dict.fromkeys(p.gpu for p in parse_pools(config.pools)))


def pool_configs(config) -> list[tuple[Pool, object]]:
    """``(pool, configuration)`` per pool of ``config``: the configuration of that pool alone, ``config`` with
    ``gpu``, ``tp`` and ``workers`` of the pool and no pools (the homogeneous run the pool is built as)."""
    return [(p, replace(config, gpu=p.gpu, tp=p.tp, workers=p.workers, pools=()))
            for p in parse_pools(config.pools)]


def pool_of_worker(pools: Sequence[Pool]) -> list[int]:
    """Each worker's pool index, workers in pool order: ``[0] * pools[0].workers + [1] * pools[1].workers + ...``."""
    return [i for i, p in enumerate(pools) for _ in range(p.workers)]


#: what a pooled fleet does not model; each completes "--pool has no effect ..." or names the option refused
_WHY = "with --pool (the pools set each worker's GPU, tp and the workers' count)"


def pool_rules(config):
    """``(field, why)`` rows of :func:`dynlab.engine.option_rules.check_effective` for ``--pool``: the options it
    replaces, and the combinations dynlab does not model with mixed pools (refused, never ignored)."""
    if not config.pools:
        return
    for name in ("workers", "gpu", "tp"):
        yield name, _WHY
    if not config.timing:
        yield "pools", "without --timing (a pool's GPU and tp set the timed engine's hardware)"
    for name in ("split", "prefill_workers", "decode_workers"):  # a P/D fleet's pools: --pool prefill:... decode:...
        yield name, "with --pool (a P/D fleet's pools: --pool prefill:GPU:tpN:P --pool decode:GPU:tpN:D)"
    if config.controller != "none":
        yield "pools", "with --controller: a joining worker's pool is not modelled (for now)"
    if config.engine_kind != "vllm":
        yield "pools", "with --engine other than vllm: mixed pools are modelled for vLLM workers only (for now)"
    if config.latency_profile is not None:
        yield "pools", "with --latency-profile: a profile is fitted on one GPU and tp (its own)"
    if config.dp_attention:
        yield "pools", "with --dp-attention: attention-DP ranks are modelled in a fleet of one GPU and tp (for now)"
