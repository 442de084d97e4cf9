"""``plan --objective cost --mix``: two-pool fleets of the candidate shapes, searched after the homogeneous plan
(dynlab issue 41, item 5).

A homogeneous answer of N workers rounds the trace's need up to a whole worker of one shape; a fleet of two pools
(``--pool GPU:tpN:COUNT`` twice, :mod:`dynlab.engine.pools`) can fill that remainder with a worker of another shape
and cost less. For every ordered pair ``(X, Y)`` of shapes with a homogeneous answer (``nX``, ``nY`` workers) that
differ only in GPU and TP (same model, routing mode, CPU tier, EP and speculation; aggregated), the search fixes
``x`` = ``nX - 1``, ``nX - 2``, ... (at most :data:`STEPS` counts, ``x`` >= 1) and looks for the fewest ``y``
workers of Y meeting the target among those keeping the fleet strictly cheaper than the cheapest found so far
(``x`` x ``cX`` + ``y`` x ``cY`` < best, ``c`` = TP x the GPU's price, USD per worker-hour): one replay at the
largest such ``y`` (a miss ends that ``x``: more workers are taken never to hurt, the assumption of the
homogeneous search, :mod:`dynlab.plan.search`), then bisection on ``[1, y]``. So a pair costs at most
:data:`STEPS` x (1 + ceil(log2 (nY - 1))) replays, and the plan at most that summed over the ordered pairs
(:func:`most_replays`). The answer is the cheapest fleet found that meets the target, with the replay of one Y
worker fewer (or X alone at ``x``) as its binding constraint. It is a search of the neighbourhood of the
homogeneous answers, not of every mix: a fleet with more than two shapes, or far from both answers, is not tried.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional, Sequence

from dynlab.engine.config import DEFAULTS, SimConfig
from dynlab.plan.binding import replay_text
from dynlab.plan.search import Shape
from dynlab.plan.target import Target, measured

#: the counts of the fixed shape X tried per ordered pair: its homogeneous answer - 1, - 2, - 3
STEPS = 3


def refusal(shapes: Sequence[Shape], base: SimConfig, objective: str) -> str:
    """Why ``--mix`` cannot be given with these candidates and options (empty when it can): it needs ``--objective
    cost`` and two (GPU, TP) candidates, and a mixed fleet does not model P/D candidates, attention-DP ranks,
    another engine than vLLM or a latency profile (:func:`dynlab.engine.pools.pool_rules`)."""
    if objective != "cost":
        return "--mix has no effect without --objective cost (it looks for a cheaper fleet of two pools)"
    if len({(s.gpu, s.tp) for s in shapes}) < 2:
        return "--mix has no effect with one --gpu and --tp candidate (a mixed fleet needs two)"
    if any(s.pd for s in shapes):
        return "--mix: a P/D candidate (--split auto) is not modelled in a mixed fleet (for now)"
    if base.dp_attention:
        return "--mix: --dp-attention is not modelled in a mixed fleet (for now)"
    if base.engine_kind != "vllm" or base.latency_profile is not None or any(s.engine not in (None, "vllm") for s in shapes):
        return "--mix: mixed pools are modelled for vLLM workers without --latency-profile only (for now)"
    return ""


@dataclass
class Mix:
    """A fleet of ``x`` workers of shape ``sx`` and ``y`` of ``sy``; ``result``: its replay."""

    sx: Shape
    x: int
    sy: Shape
    y: int
    usd_per_hour: float
    result: dict
    kind: str = ""
    why: str = ""
    #: the pools are written Y's first (the candidates' order, so a fleet has one text whichever shape is fixed)
    swap: bool = False

    def _pools(self) -> tuple:
        ours = ((self.sx, self.x), (self.sy, self.y))
        return ours[::-1] if self.swap else ours

    @property
    def label(self) -> str:
        """``h100x1:4 + h200x1:2``: each pool's GPU, TP and workers."""
        return " + ".join(f"{s.gpu}x{s.tp}:{n}" for s, n in self._pools())

    @property
    def pools(self) -> list[str]:
        """The fleet as ``sim --pool`` takes it."""
        return [f"{s.gpu}:tp{s.tp}:{n}" for s, n in self._pools()]


def pool_config(base: SimConfig, mix: Mix, top_k: int = 0) -> SimConfig:
    """The replay of ``mix``: its first shape's configuration with the two pools and the options they replace
    (``--gpu``, ``--tp``, ``--workers``) at their defaults."""
    return replace(mix.sx.config(base, top_k), gpu=DEFAULTS["gpu"], tp=DEFAULTS["tp"], workers=DEFAULTS["workers"],
                   pools=tuple(mix.pools))


def _kin(s: Shape) -> tuple:
    return s.model, s.mode, s.cpu_memory_gb, s.ep, s.spec_tokens, s.pd, s.dp_attention, s.engine


def pairs(outcomes: Sequence) -> list[tuple]:
    """The ordered pairs ``(X, Y)`` of outcomes with an answer, differing in GPU or TP and in nothing else."""
    met = [o for o in outcomes if o.workers is not None and not o.shape.pd and not o.shape.dp_attention]
    return [(a, b) for a in met for b in met if a is not b and _kin(a.shape) == _kin(b.shape)
            and (a.shape.gpu, a.shape.tp) != (b.shape.gpu, b.shape.tp)]


def most_replays(outcomes: Sequence) -> int:
    """The most replays :func:`search` makes on these outcomes (the module docstring's bound)."""
    return sum(STEPS * (1 + math.ceil(math.log2(max(1, y.workers - 1)))) for _, y in pairs(outcomes))


def most_workers(budget: float, each: float, cap: int) -> int:
    """The most workers at ``each`` USD/h costing strictly less than ``budget`` (to a cent), at most ``cap``."""
    if each <= 0 or budget <= 0:
        return 0
    n = min(cap, math.ceil(budget / each) - 1)
    while n > 0 and round(n * each, 2) >= round(budget, 2):
        n -= 1
    return max(0, n)


def search(outcomes: Sequence, base: SimConfig, prices: Mapping[str, float], target: Target, cap: int,
           replay: Callable[[SimConfig], dict], top_k: int = 0) -> tuple[Optional[Mix], list]:
    """``(the cheapest two-pool fleet meeting the target and cheaper than every homogeneous answer, or None; every
    mixed replay as ``(Mix, meets)``)``. ``prices``: GPU -> USD per GPU-hour (every candidate's); ``replay(config)``
    returns a replay's result (``sim``'s JSON); ``cap``: the most workers per pool."""
    met = [o.workers * o.shape.tp * prices[o.shape.gpu] for o in outcomes if o.workers is not None]
    if not met:
        return None, []
    best_cost, best, seen = round(min(met), 2), None, []
    order = {o.shape: i for i, o in enumerate(outcomes)}
    for ox, oy in pairs(outcomes):
        cx, cy = ox.shape.tp * prices[ox.shape.gpu], oy.shape.tp * prices[oy.shape.gpu]
        for x in range(ox.workers - 1, max(0, ox.workers - 1 - STEPS), -1):
            found = _fill(ox, x, oy, cx, cy, best_cost, base, target, cap, replay, top_k, seen,
                          order[oy.shape] < order[ox.shape])
            if found is not None:
                best_cost, best = found.usd_per_hour, found
    if best is not None:
        best.kind, best.why = _binding(best, seen, outcomes, target)
    return best, seen


def _fill(ox, x: int, oy, cx: float, cy: float, best_cost: float, base, target, cap, replay, top_k,
          seen: list, swap: bool) -> Optional[Mix]:
    """The fewest ``y`` workers of ``oy`` beside ``x`` of ``ox`` meeting the target for less than ``best_cost``
    (``swap``: ``oy`` comes first among the candidates, so its pool is written first)."""
    hi = most_workers(best_cost - x * cx, cy, cap)
    if hi < 1:
        return None
    def run(y: int) -> Mix:
        mix = Mix(ox.shape, x, oy.shape, y, round(x * cx + y * cy, 2), {}, swap=swap)
        mix.result = dict(replay(pool_config(base, mix, top_k)))
        seen.append((mix, not target.misses(mix.result)))
        return mix

    top = run(hi)
    if target.misses(top.result):
        return None
    lo, good = 0, top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        mix = run(mid)
        if target.misses(mix.result):
            lo = mid
        else:
            hi, good = mid, mix
    return good


def _binding(best: Mix, seen: list, outcomes: Sequence, target: Target) -> tuple[str, str]:
    """The answer's binding constraint: the replay with one worker of its second pool fewer (X alone at ``x``,
    the homogeneous search's replay, when that is none), in words."""
    fewer = [m for m, ok in seen if not ok and m.sx == best.sx and m.x == best.x and m.sy == best.sy
             and m.y == best.y - 1]
    if fewer:
        r, at = fewer[0].result, fewer[0].label
    else:
        o = next(o for o in outcomes if o.shape == best.sx)
        if best.x not in o.search.tested:
            return "unknown", f"the fleet with one {best.sy.gpu}x{best.sy.tp} worker fewer was not replayed"
        r, at = o.search.tested[best.x][1], f"{best.sx.gpu}x{best.sx.tp}:{best.x} alone"
    kind, text = replay_text(target, best.x + best.y - 1, r, 0.0)
    return kind, f"{text} (the fleet {at}: one {best.sy.gpu}x{best.sy.tp} worker fewer)"


def as_json(best: Optional[Mix], seen: list, target: Target, sources: Mapping[str, str], bound: int) -> dict:
    """The plan JSON's ``mix``: the answer (``None``: no two-pool fleet cheaper than every homogeneous answer was
    found) and every mixed replay, with the bound on their number."""
    replays = [{"pools": m.pools, "usd_per_hour": m.usd_per_hour, "meets": ok, "misses": target.misses(m.result)}
               for m, ok in seen]
    answer = None
    if best is not None:
        r, pct = best.result, target.percentile
        answer = {"shape": best.label, "pools": best.pools, "workers": best.x + best.y,
                  "gpus": best.x * best.sx.tp + best.y * best.sy.tp, "usd_per_hour": best.usd_per_hour,
                  "goodput": r.get("goodput"), "ttft_ms": measured(r, "ttft_ms", pct),
                  "tpot_ms": measured(r, "tpot_ms", pct), "headroom": target.headroom(r), "binding": best.kind,
                  "why": best.why, "price_source": {g: sources[g] for g in (best.sx.gpu, best.sy.gpu)}}
    return {"answer": answer, "replays": replays, "max_replays": bound}
