"""Built-in scorers and the ``weighted`` strategy that sums them (llm-d's inference scheduler).

``weighted`` picks the worker with the highest ``sum(weight * score)`` over the scorers named in
``--opt scorers=NAME:WEIGHT,...``; ties go to the worker with fewer active requests, then the
lower index. Its default, ``prefix:3,queue:2,kv-usage:2``, is the weighting of llm-d's default
scheduling profile (``default-plugins.yaml``: prefix-cache-scorer 3, queue-scorer 2,
kv-cache-utilization-scorer 2). The built-in scorers are dynlab's forms of those terms, each in
[0, 1]: ``prefix`` (leading blocks held ÷ request blocks, from KV events), ``queue``
(``1 / (1 + waiting requests)``), ``kv-usage`` (free share of the pool), ``load``
(``1 / (1 + active requests)``), ``lora`` (llm-d's LoRA affinity). ``lora-affinity`` is ``weighted`` with
``lora:1,queue:1``.
"""
from __future__ import annotations

import math
from dataclasses import replace

from dynlab import hookimpl, plugins
from dynlab.engine.lora import LORA_ATTR
from dynlab.routing.index import KvIndex
from dynlab.routing.scorer import Scorer
from dynlab.routing.strategy import Strategy, StrategyOption


class PrefixScorer(Scorer):
    """Share of the request's blocks the worker holds as a leading prefix (KV events' index)."""

    name = "prefix"

    def score(self, request, fleet, index):
        n = len(request.hashes)
        out = [0.0] * fleet.workers
        if n:
            for w, depth in index.find_matches(request.hashes).items():
                if w < fleet.workers:
                    out[w] = depth / n
        return out


class QueueScorer(Scorer):
    """1 / (1 + requests waiting for a first token) the router sent to the worker."""

    name = "queue"
    reads_load = True

    def score(self, request, fleet, index):
        return [1.0 / (1 + q) for q in fleet.waiting_requests]


class LoadScorer(Scorer):
    """1 / (1 + active requests) the router sent to the worker."""

    name = "load"
    reads_load = True

    def score(self, request, fleet, index):
        return [1.0 / (1 + a) for a in fleet.active_requests]


class KvUsageScorer(Scorer):
    """Free share of the worker's KV pool: 1 - the router's estimate of blocks in use / pool blocks.

    Blocks in use: the router's estimate for the requests it sent that are in flight
    (``fleet.active_blocks``: ``ceil((input + output) / block)`` each). Pool size: ``pool_blocks``
    when given, else the pool the run configures per worker (``--capacity``, or with ``--timing``
    the hardware-derived pool: what vLLM logs at start-up as its GPU blocks), which a router knows
    only as configuration; in a fleet of mixed pools (``--pool``), whose workers' pools differ, each worker's
    own (``fleet.kv_blocks``): llm-d's ``kv-cache-utilization`` scorer reads each pod's own usage share, so a
    bigger pool holding the same blocks scores freer. Clamped to [0, 1]; raises ``ValueError`` when no pool
    size is known.
    """

    name = "kv-usage"
    reads_load = True
    options = (StrategyOption("pool_blocks", int, 0, "pool blocks per worker the router assumes "
                              "(0: the run's pool, --capacity or the hardware-derived one)", minimum=0),)

    def score(self, request, fleet, index):
        pool = self.option("pool_blocks") or self.ctx.pool_blocks
        if pool is None and fleet.workers and None not in fleet.kv_blocks:  # mixed pools: each worker's own
            return [min(1.0, max(0.0, 1.0 - b / k)) if k > 0 else 0.0
                    for b, k in zip(fleet.active_blocks, fleet.kv_blocks)]
        if pool is None:
            raise ValueError("scorer 'kv-usage' needs the pool size: run with --timing or --capacity, "
                             "or give --opt kv-usage.pool_blocks=N")
        if pool <= 0:
            return [0.0] * fleet.workers
        return [min(1.0, max(0.0, 1.0 - b / pool)) for b in fleet.active_blocks]


def lora_affinity(request, fleet, max_loras) -> list[float]:
    """llm-d's LoRA affinity score of each worker for ``request`` (:class:`LoraScorer`'s rule): 1.0 where its
    adapter has requests in flight (``fleet.lora_adapters``), 0.8 where fewer than ``max_loras`` adapters do,
    else 0.0; ``None`` for a request without an adapter."""
    a = request.attrs.get(LORA_ATTR)
    if not a:
        return None
    return [1.0 if a in held else 0.8 if len(held) < max_loras else 0.0 for held in fleet.lora_adapters]


class LoraScorer(Scorer):
    """llm-d's LoRA affinity: 1 where the request's adapter has requests in flight, 0.8 where one more adapter fits.

    llm-d's ``lora-affinity-scorer`` (llm-d-router, ``pkg/epp/framework/plugins/scheduling/scorer/loraaffinity``)
    reads vLLM's ``vllm:lora_requests_info`` metric (the adapters of the running and waiting requests, and
    ``max_lora``) and scores a worker 1.0 when the request's adapter is among them, 0.8 when they number fewer
    than ``max_lora`` (the adapter can join without waiting), else 0. The router here knows the same from its
    own requests in flight (``fleet.lora_adapters``, no scrape delay). A request without an adapter scores 0
    everywhere (the base model needs no slot; llm-d would score its name as an absent adapter). ``max_loras``:
    the slots a worker has as the router assumes (0: the run's ``--max-loras``, else vLLM's default 1).
    """

    name = "lora"
    reads_load = True
    options = (StrategyOption("max_loras", int, 0, "adapter slots per worker the router assumes (0: the run's "
                              "--max-loras, else vLLM's default 1)", minimum=0),)

    def score(self, request, fleet, index):
        scores = lora_affinity(request, fleet, self.option("max_loras") or self.ctx.max_loras or 1)
        return [0.0] * fleet.workers if scores is None else scores


DEFAULT_SCORERS = "prefix:3,queue:2,kv-usage:2"


class _Options:
    """``weighted``'s options: ``scorers`` and each registered scorer's options as ``SCORER.OPTION``
    (read from the scorer registry when asked, so a third-party scorer's options are accepted)."""

    def __get__(self, obj, owner):
        out = [StrategyOption("scorers", str, owner.default_scorers,
                              f"NAME:WEIGHT,... summed per worker (default: {owner.default_source})")]
        for entry in plugins.scorers().entries():
            for o in entry.cls.options:
                out.append(StrategyOption(f"{entry.name}.{o.name}", o.type, o.default, o.help, o.minimum,
                                          o.maximum))
        return tuple(out)


def parse_scorers(text: str) -> list[tuple[str, float]]:
    """``"prefix:3,queue:2"`` -> ``[("prefix", 3.0), ("queue", 2.0)]`` (a name without ``:`` weighs 1).

    Raises ``ValueError`` for an empty item, a weight that is not a finite number >= 0, or a repeated name.
    """
    out: list[tuple[str, float]] = []
    for item in text.split(","):
        name, sep, weight = item.strip().partition(":")
        name = name.strip()
        if not name:
            raise ValueError(f"option 'scorers' has an empty item in {text!r} (NAME:WEIGHT,...)")
        try:
            w = float(weight) if sep else 1.0
        except ValueError:
            raise ValueError(f"option 'scorers': weight {weight.strip()!r} of {name!r} is not a number") from None
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"option 'scorers': weight of {name!r} must be a finite number >= 0, got {weight!r}")
        if any(n == name for n, _ in out):
            raise ValueError(f"option 'scorers' names {name!r} twice")
        out.append((name, w))
    return out


class Weighted(Strategy):
    """Highest sum of weight x score over pluggable scorers (llm-d's scheduler), ties to the least loaded.

    ``--opt scorers=NAME:WEIGHT,...`` names registered scorers (``dynlab plugins``); a scorer's
    options are ``--opt NAME.OPTION=VALUE``. The index behind ``prefix`` grows only from KV
    events. Without ``--timing`` the load is zero for every worker: the default list then runs
    its ``prefix`` term alone (the load terms are equal for every worker and could not change a
    choice), and a list given explicitly that names a load-reading scorer is refused.
    """

    name = "weighted"
    uses_events = True
    options = _Options()
    default_scorers, default_source = DEFAULT_SCORERS, "llm-d's default profile"

    def __init__(self, ctx):
        super().__init__(ctx)
        registry = plugins.scorers()
        spec = self.option("scorers")
        pairs = parse_scorers(spec)
        named = set()
        self.terms: list[tuple[float, Scorer]] = []
        for name, weight in pairs:
            cls = registry.get(name)  # UnknownNameError lists the scorers
            named.add(name)
            if cls.reads_load and not ctx.timed:
                if spec != self.default_scorers:
                    raise ValueError(f"scorer {name!r} has no effect without --timing: it reads the router's load, "
                                     f"which is zero there; run with --timing or leave it out of 'scorers'")
                continue
            values = {o.name: ctx.options.get(f"{name}.{o.name}", o.default) for o in cls.options}
            sctx = replace(ctx, options=values)
            self.terms.append((weight, cls(sctx)))
        for key, value in ctx.options.items():
            scorer, dot, opt = key.partition(".")
            if dot and scorer not in named:
                default = next((o.default for o in registry.get(scorer).options if o.name == opt), value)
                if value != default:
                    raise ValueError(f"option {key!r} has no effect: scorer {scorer!r} is not in 'scorers'")
        self.index = KvIndex(ctx.block)

    def on_event(self, event):
        self.index.apply_event(event)

    def refused_events(self):
        return self.index.refusals()

    def totals(self, request, fleet) -> list[float]:
        """``sum(weight * score)`` per worker; raises ``ValueError`` when a scorer returns the wrong
        number of scores or one that is not finite."""
        n = fleet.workers
        total = [0.0] * n
        for weight, scorer in self.terms:
            scores = scorer.score(request, fleet, self.index)
            if len(scores) != n:
                raise ValueError(f"scorer {scorer.name!r} returned {len(scores)} scores for {n} workers")
            for w, s in enumerate(scores):
                if not math.isfinite(s):
                    raise ValueError(f"scorer {scorer.name!r} returned {s!r} for worker {w}")
                total[w] += weight * s
        return total

    def on_leave(self, worker):
        self.index.clear(worker)

    def route(self, request, fleet):
        total = self.totals(request, fleet)
        routable = fleet.routable
        best = max(total) if len(routable) == len(total) else max(total[k] for k in routable)
        active = fleet.active_requests
        w = min((k for k in routable if total[k] == best), key=lambda k: (active[k], k))
        self.predicted = self.index.find_matches(request.hashes).get(w, 0) if request.hashes else 0
        return w


class LoraAffinity(Weighted):
    """llm-d's LoRA affinity with its queue scorer: highest lora + queue score (weighted, scorers=lora:1,queue:1).

    ``weighted`` with the default ``scorers=lora:1,queue:1``: llm-d's ``lora-affinity-scorer`` and
    ``queue-scorer`` in one scheduling profile at the default weight 1 (an EPP profile that names a scorer
    without a weight gives it 1); ties to the fewest active requests, then the lower index. It needs
    ``--timing`` (adapters are in flight only in time; refused without it). Other weights or scorers:
    ``--opt scorers=lora:3,queue:1,prefix:1``.
    """

    name = "lora-affinity"
    needs_timing = True  # a worker's adapters are those of its requests in flight: none in a count-based run
    default_scorers, default_source = "lora:1,queue:1", "llm-d's lora-affinity and queue scorers"


@hookimpl
def dynlab_register_scorers(register):
    for cls in (PrefixScorer, QueueScorer, KvUsageScorer, LoadScorer, LoraScorer):
        register(cls)


@hookimpl
def dynlab_register_strategies(register):
    register(Weighted)
    register(LoraAffinity)
