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

#: each gallop step multiplies the worker count by this much (at least one more worker)
GALLOP = 1.5


@dataclass(frozen=True)
class Shape:
    """One candidate: workers of ``tp`` ``gpu`` GPUs each serving ``model``, routed by ``mode``, with a CPU
    tier of ``cpu_memory_gb`` GB per worker (``None``: none)."""

    model: str
    gpu: str
    tp: int
    mode: str
    cpu_memory_gb: Optional[float] = None

    @property
    def label(self) -> str:
        """``h100x2 kv-cost`` (``+cpu256`` with a CPU tier of 256 GB)."""
        cpu = f" +cpu{self.cpu_memory_gb:g}" if self.cpu_memory_gb else ""
        return f"{self.gpu}x{self.tp} {self.mode}{cpu}"

    def config(self, base: SimConfig) -> SimConfig:
        """``base`` with this shape's fields."""
        return replace(base, model=self.model, gpu=self.gpu, tp=self.tp, mode=self.mode,
                       cpu_memory_gb=self.cpu_memory_gb)


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
        lo = max(below, default=0)
        if best - lo <= 1:
            return None
        return (lo + best) // 2

    def plateau(self) -> Optional[tuple[int, int]]:
        """``(a, b)``: the two largest counts tried, both missing the target with the same latencies,
        goodput, preemptions and rejections (:func:`signature`): more workers stopped changing anything
        (the routing leaves the extra workers idle), so the gallop stops there. ``None`` otherwise."""
        if self.best() is not None or len(self.tested) < 2:
            return None
        a, b = sorted(self.tested)[-2:]
        return (a, b) if signature(self.tested[a][1]) == signature(self.tested[b][1]) else None

    def record(self, workers: int, result: Mapping) -> None:
        self.tested[workers] = (not self.target.misses(result), dict(result))

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
    percentiles, goodput, preemptions, rejections."""
    return tuple(json.dumps(result.get(k), sort_keys=True) for k in
                 ("ttft_ms", "tpot_ms", "queue_wait_ms", "goodput", "preemptions", "rejected"))
