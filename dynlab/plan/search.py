"""The search for one shape's fewest workers: a bracket from the analytic lower bound, galloping up by
replay until the target is met, then bisection, so the answer N is a replay that meets the target and
N - 1 one that misses it (or N is 1)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional

from dynlab.engine.config import SimConfig
from dynlab.plan.target import Target

#: the CPU tier's options: a candidate without a tier (``--cpu-memory-gb 0``) runs without them
CPU_TIER_FIELDS = ("pcie_gbps", "cpu_write")
#: each gallop step multiplies the worker count by this much (at least one more worker)
GALLOP = 1.5


@dataclass(frozen=True)
class Shape:
    """One candidate: workers of ``tp`` ``gpu`` GPUs each serving ``model``, routed by ``mode``, with a CPU
    tier of ``cpu_memory_gb`` GB per worker (``None``: none), ``ep`` expert-parallel GPUs (1: none; else
    ``ep`` = ``tp``, or with ``dp_attention`` ``tp`` x its attention ranks), ``spec_tokens`` draft tokens per
    decode step (0: no speculation), with ``pd``, a disaggregated fleet whose prefill:decode split is
    searched (:class:`PdSearch`) and, when a plan compares engine kinds, ``engine`` (``vllm`` or ``sglang``)."""

    model: str
    gpu: str
    tp: int
    mode: str
    cpu_memory_gb: Optional[float] = None
    ep: int = 1
    spec_tokens: int = 0
    pd: bool = False
    dp_attention: bool = False
    #: the engine kind of a plan comparing several (``plan --engine vllm,sglang``); ``None``: the base's, unnamed
    engine: Optional[str] = None

    @property
    def ranks(self) -> int:
        """Attention-DP ranks per worker: ``ep / tp`` with ``dp_attention``, else 1 (:attr:`dynlab.models.parallel.
        Parallel.dp`)."""
        return self.ep // self.tp if self.dp_attention else 1

    @property
    def worker_gpus(self) -> int:
        """GPUs of one worker: ``tp`` x :attr:`ranks` (``pp`` 1)."""
        return self.tp * self.ranks

    @property
    def label(self) -> str:
        """``h100x2 kv-cost``; `` ep2`` after the TP with expert parallelism (`` ep4 dp2`` with 2 attention
        ranks), `` sglang`` after the mode when a plan compares engines, ``+cpu256`` with a CPU tier of 256 GB,
        `` spec2`` with 2 draft tokens, `` P/D`` for a disaggregated fleet."""
        ep = f" ep{self.ep}" if self.ep > 1 else ""
        ep += f" dp{self.ranks}" if self.dp_attention else ""
        cpu = f" +cpu{self.cpu_memory_gb:g}" if self.cpu_memory_gb else ""
        spec = f" spec{self.spec_tokens}" if self.spec_tokens else ""
        engine = f" {self.engine}" if self.engine else ""
        return f"{self.gpu}x{self.tp}{ep} {self.mode}{engine}{cpu}{spec}{' P/D' if self.pd else ''}"

    def other_engine_fields(self) -> tuple:
        """The scheduler options of the engines this shape is not (with ``engine`` set; else none): SGLang's
        for a vLLM shape, vLLM's for an SGLang one, as ``compare --engine vllm,sglang`` leaves them out
        (:func:`dynlab.engine.option_rules.align_split`)."""
        from dynlab.engine.option_rules import SGLANG_FIELDS, VLLM_SCHEDULER_FIELDS

        if self.engine is None:
            return ()
        return VLLM_SCHEDULER_FIELDS if self.engine == "sglang" else SGLANG_FIELDS

    def config(self, base: SimConfig, top_k: int = 0) -> SimConfig:
        """``base`` with this shape's fields. Without speculation (``spec_tokens`` 0) the other spec options
        are dropped (as ``compare --spec-tokens 0,2`` drops them for its baseline); an aggregated shape
        drops the P/D options, a P/D one gets the split ``1:1`` until its search sets one; a shape without
        a CPU tier drops the tier's options (:data:`CPU_TIER_FIELDS`), one of several engines the other engines'
        scheduler options (:meth:`other_engine_fields`). ``top_k``: the largest
        ``--spec-tokens`` candidate: a shape of fewer draft tokens takes the first K of the acceptance rates
        read at ``top_k`` (a rate list or ``file:PATH``), as ``compare --spec-tokens 2,4`` does
        (:func:`dynlab.engine.spec.align_rates`)."""
        from dynlab.engine.config import DEFAULTS
        from dynlab.engine.option_rules import PD_FIELDS, SPEC_FIELDS
        from dynlab.engine.spec import align_rates

        drop = ((SPEC_FIELDS if not self.spec_tokens else ()) + (PD_FIELDS if not self.pd else ())
                + (CPU_TIER_FIELDS if not self.cpu_memory_gb else ()) + self.other_engine_fields())
        config = replace(base, model=self.model, gpu=self.gpu, tp=self.tp, mode=self.mode,
                         cpu_memory_gb=self.cpu_memory_gb, ep=self.ep, spec_tokens=self.spec_tokens,
                         dp_attention=self.dp_attention,
                         split="1:1" if self.pd else None, **{f: DEFAULTS[f] for f in drop},
                         **({"engine_kind": self.engine} if self.engine else {}))
        if 0 < self.spec_tokens < top_k:
            config = align_rates([config, replace(config, spec_tokens=top_k)])[0]
        return config

    def impossible(self) -> str:
        """Why no worker can have this shape, in words (empty when it can): ``ep`` > 1 on a dense model (no
        experts to divide); ``ep`` > 1 must equal ``tp`` (without ``--dp-attention``) or be a multiple of it
        (with: :func:`dynlab.models.parallel.check_parallelism`); a P/D fleet's workers have no CPU tier; attention
        ranks are not modelled in a P/D fleet or with a CPU tier (:func:`dynlab.engine.serving.check_dp_ranks`).
        An unknown model is not judged here (the options' check names it); an ``sglang`` shape of a plan comparing
        engines has no P/D split, CPU tier or speculation (dynlab models none of them for SGLang:
        :data:`dynlab.engine.option_rules.VLLM_ONLY`)."""
        if self.engine == "sglang" and (self.pd or self.cpu_memory_gb or self.spec_tokens):
            what = "a P/D fleet" if self.pd else "a CPU tier" if self.cpu_memory_gb else "speculative decoding"
            return f"{what} with --engine sglang is not modelled"
        dense = _dense(self.model) if self.ep > 1 else False
        if dense:
            return f"--ep {self.ep}: {self.model} is a dense model (no experts to divide)"
        if self.dp_attention and self.ep % self.tp:
            return f"--ep {self.ep} is not a multiple of --tp {self.tp} (with --dp-attention)"
        if self.dp_attention and (self.pd or self.cpu_memory_gb):
            return f"--dp-attention with {'a P/D fleet' if self.pd else 'a CPU tier'} is not modelled"
        if self.ep > 1 and self.ep != self.tp and not self.dp_attention and dense is not None:
            return f"--ep {self.ep} must equal --tp {self.tp}" + (" (or add --dp-attention)" if self.ep > self.tp else "")
        if self.pd and self.cpu_memory_gb:
            return "a P/D fleet's workers have no CPU tier"
        return ""


def _dense(model: str) -> Optional[bool]:
    """Whether ``model`` (a catalogue name or config.json path) has no experts; ``None`` when it cannot be read."""
    from dynlab.errors import DynlabError
    from dynlab.models.spec import model_spec

    try:
        return not model_spec(model).experts
    except (ValueError, DynlabError):  # unknown or bad: the options' check reports it, in one line
        return None


@dataclass
class Search:
    """The bracket-and-bisection state of one shape against one :class:`Target`.

    Call :meth:`next_workers` for the next count to replay (``None``: done) and :meth:`record` with its
    result. ``lower``: the analytic lower bound (first probe); ``cap``: the most workers tried.
    ``tested``: workers -> (meets the target, the replay's result).
    """

    config: SimConfig
    target: Target
    lower: int
    cap: int
    tested: dict = field(default_factory=dict)
    #: the fewest workers the shape can have (a P/D fleet: 2)
    least = 1

    def good(self) -> list[int]:
        return sorted(n for n, (ok, _) in self.tested.items() if ok)

    def best(self) -> Optional[int]:
        """The fewest workers seen meeting the target, ``None`` when none has."""
        good = self.good()
        return good[0] if good else None

    def next_workers(self) -> Optional[int]:
        best = self.best()
        if best is None:
            if not self.tested:
                return min(self.lower, self.cap)
            top = max(self.tested)
            if top >= self.cap or self.plateau() is not None:
                return None
            return min(self.cap, max(top + 1, math.ceil(top * GALLOP)))
        below = [n for n, (ok, _) in self.tested.items() if not ok and n < best]
        lo = max(below, default=self.least - 1)
        if best - lo <= 1:
            return None
        return (lo + best) // 2

    def plateau(self) -> Optional[tuple[int, int]]:
        """``(a, b)``: the two largest counts tried, both missing the target with the same latencies,
        goodput, preemptions and rejections (:func:`signature`): more workers stopped changing anything
        (the routing leaves the extra workers idle, or the misses are requests that never fit one pool),
        so the gallop stops there; :func:`dynlab.plan.planner.explain` says which. ``None`` otherwise."""
        if self.best() is not None or len(self.tested) < 2:
            return None
        a, b = sorted(self.tested)[-2:]
        return (a, b) if signature(self.tested[a][1]) == signature(self.tested[b][1]) else None

    def record(self, workers: int, result: Mapping) -> None:
        self.tested[workers] = (not self.target.misses(result), dict(result))

    def next_config(self) -> Optional[tuple[int, SimConfig]]:
        """``(workers, the replay's configuration)`` to run next, ``None`` when the search is done."""
        n = self.next_workers()
        return None if n is None else (n, replace(self.config, workers=n))

    def record_config(self, workers: int, config: SimConfig, result: Mapping) -> None:
        """Record the result of :meth:`next_config`'s replay."""
        self.record(workers, result)

    def fleet(self, workers: int) -> str:
        """How ``workers`` workers are arranged: empty for an aggregated fleet."""
        return ""

    def monotone_note(self) -> str:
        """Empty when every replay seen is consistent with "more workers never hurt"; otherwise what was
        seen and what was done."""
        best = self.best()
        if best is None:
            return ""
        worse = sorted(n for n, (ok, _) in self.tested.items() if not ok and n > best)
        if not worse:
            return ""
        return (f"not monotone in N: meets the target at {best} workers but misses it at "
                f"{', '.join(map(str, worse))}; the answer is the fewest workers that met it with N - 1 "
                "replayed and missing, and larger counts were not all checked")


def signature(result: Mapping) -> tuple:
    """What the target reads of a replay, to tell two replays apart: TTFT, TPOT and queue wait
    percentiles, goodput, preemptions, rejections, the per-class figures."""
    return tuple(json.dumps(result.get(k), sort_keys=True) for k in
                 ("ttft_ms", "tpot_ms", "queue_wait_ms", "goodput", "preemptions", "rejected", "by_class"))


@dataclass
class PdSearch(Search):
    """:class:`Search` for a disaggregated shape: the total worker count T is galloped and bisected as an
    aggregated shape's is (``lower`` at least 2), and at each T the prefill:decode split is searched by
    bisection on the prefill workers P in ``[1, T - 1]``: first P = ``prefill_share`` x T (rounded, the
    prefill's share of the work from the floors), then, while the target is missed, more prefill workers
    when the TTFT SLO is the further missed (measured / SLO at the percentile), fewer when TPOT is. T
    meets the target when one split does; ``splits``: T -> P -> (meets, result). When every split tried
    at T misses, T is recorded with the split closest to the target (the most headroom)."""

    least = 2
    prefill_share: float = 0.5
    splits: dict = field(default_factory=dict)
    _bounds: dict = field(default_factory=dict)  # T -> [lo, hi]: P <= lo needs more prefill, P >= hi fewer

    def next_config(self) -> Optional[tuple[int, SimConfig]]:
        while True:
            open_t = [t for t in self.splits if t not in self.tested]
            if open_t:
                t = open_t[0]
                lo, hi = self._bounds[t]
                if hi - lo > 1:
                    return t, self._at(t, (lo + hi) // 2)
                tried = self.splits[t]
                best = max(tried, key=lambda p: _room(self.target, tried[p][1]))
                self.tested[t] = (False, tried[best][1])
                continue
            t = self.next_workers()
            if t is None:
                return None
            self.splits[t], self._bounds[t] = {}, [0, t]
            return t, self._at(t, min(t - 1, max(1, round(self.prefill_share * t))))

    def _at(self, total: int, p: int) -> SimConfig:
        return replace(self.config, split=f"{p}:{total - p}")

    def record_config(self, workers: int, config: SimConfig, result: Mapping) -> None:
        p = int(config.split.partition(":")[0])
        ok = not self.target.misses(result)
        self.splits.setdefault(workers, {})[p] = (ok, dict(result))
        bounds = self._bounds.setdefault(workers, [0, workers])
        if ok:
            self.tested[workers] = (True, dict(result))
        elif self._needs_prefill(result):
            bounds[0] = max(bounds[0], p)
        else:
            bounds[1] = min(bounds[1], p)

    def _needs_prefill(self, result: Mapping) -> bool:
        """More prefill workers (True) or more decode workers: the SLO missed the furthest (a class's too)."""
        ratio = self.target.ratios(result)  # the run-wide SLOs and each class's
        return ratio["ttft_ms"] >= ratio["tpot_ms"]

    def next_workers(self) -> Optional[int]:
        return None if self.cap < self.least else super().next_workers()

    def fleet(self, workers: int) -> str:
        """``4:2``: the prefill:decode split of the replay recorded at ``workers``."""
        r = self.tested.get(workers, (None, {}))[1]
        return f"{r['prefill_workers']}:{r['decode_workers']}" if "prefill_workers" in r else ""


def _room(target: Target, result: Mapping) -> float:
    """``target.headroom(result)``, ``-inf`` when the replay has none of the figures it reads."""
    room = target.headroom(result)
    return float("-inf") if room is None else room
