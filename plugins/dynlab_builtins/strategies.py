"""Built-in routing strategies, registered through the ``dynlab`` entry-point group.

``rr``, ``random``, ``kv`` and ``kv-events`` reproduce lab 000 (steps 4-5).
``least-loaded``, ``power-of-two``, ``kv-cost`` (NVIDIA Dynamo's KV router cost) and
``cache-aware`` (SGLang's router policy) weigh load; they read the fleet view's
load, which is only non-zero with ``--timing`` (without it every worker's load is 0).

In a fleet of mixed pools (``--pool``, :mod:`dynlab.engine.pools`) each compares load as its source does:
``kv-cost`` in raw blocks (Dynamo's ``DefaultWorkerSelector::select_worker``,
``lib/kv-router/src/scheduling/selector.rs``: ``overlap_weight x potential prefill blocks + decode blocks``, no
share of the worker's pool or speed), ``least-loaded``, ``power-of-two`` and ``cache-aware`` in requests (SGLang's
router counts requests per worker); a faster pool still gets more requests because its load drains sooner. The
``kv-usage`` scorer weighs each worker's own pool (llm-d's ``kv-cache-utilization`` scorer reads each pod's share).
"""
from __future__ import annotations

import math
from collections import OrderedDict

from dynlab import hookimpl
from dynlab.engine.counted import Worker
from dynlab.kv.policies import LRUCache
from dynlab.routing.index import KvIndex
from dynlab.routing.router import KvRouter
from dynlab.routing.run_index import RunIndex
from dynlab.routing.strategy import Strategy, StrategyOption
from dynlab_builtins.scorers import lora_affinity


class RoundRobin(Strategy):
    """Round robin: request i goes to worker i % workers."""

    name = "rr"

    def __init__(self, ctx):
        super().__init__(ctx)
        self._i = 0

    def route(self, request, fleet):
        routable = fleet.routable  # every worker in a fixed fleet (an elastic one: those ready, not retired)
        w = routable[self._i % len(routable)]
        self._i += 1
        return w


class RandomChoice(Strategy):
    """Uniform random worker: one rng.randrange(workers) per request, from the run's RNG."""

    name = "random"

    def route(self, request, fleet):
        routable = fleet.routable
        return routable[self.ctx.rng.randrange(len(routable))]


class KvAware(Strategy):
    """Largest prefix overlap, then fewest requests, then lowest index; remembers where it routed.

    Its index is approximate (what it routed, never what the workers evicted), as NVIDIA Dynamo's
    router without KV events. ``ttl_s`` forgets a (worker, block) that many seconds after it was
    last routed there: a block routed at ``s`` ms is still credited to a request arriving at
    ``t < s + 1000 * ttl_s`` and forgotten from ``t >= s + 1000 * ttl_s`` (Dynamo's approximate
    mode: ``router_ttl_secs``, default 120). It needs ``--timing`` (a count-based run has no
    clock: refused without it). ``max_blocks`` keeps at most that many (worker, block) entries
    in the whole index, dropping the least recently routed first (a request's blocks are
    recorded tail first, so its head goes last and the index stays prefix-closed); Dynamo bounds
    its tree the same way (``router_max_tree_size``, 2^20, pruned to 0.8 of it), dynlab prunes
    only the excess. Both 0 (the defaults): never forget.
    """

    name = "kv"
    options = (
        StrategyOption("ttl_s", float, 0.0, "forget a worker's routed block this many seconds after it was last "
                       "routed there (0: never; needs --timing; Dynamo's approximate mode: 120)", minimum=0),
        StrategyOption("max_blocks", int, 0, "keep at most this many (worker, block) entries, least recently "
                       "routed dropped first (0: unbounded)", minimum=0),
    )
    _age = None  # (worker, block) -> last routed ms, oldest first; None: never forget

    def __init__(self, ctx):
        super().__init__(ctx)
        self.router = KvRouter(ctx.workers, ctx.block)
        ttl, cap = self.option("ttl_s"), self.option("max_blocks")
        if ttl and not ctx.timed:
            raise ValueError("option 'ttl_s' has no effect without --timing: a count-based run has no clock to expire blocks by")
        self._ttl_ms = ttl * 1000.0 if ttl else None
        self._cap = cap or None
        if ttl or cap:
            self._age = OrderedDict()

    def on_join(self, worker):
        self.router.add_worker(worker)

    def on_leave(self, worker):  # its blocks leave the index (a kv router's view of a worker that left)
        self.router.remove_worker(worker)
        if self._age is not None:
            for key in [k for k in self._age if k[0] == worker]:
                del self._age[key]

    def route(self, request, fleet):
        if self._age is not None:
            return self._route_forgetting(request)
        w = self.router.route_hashes(request.hashes, request.runs)
        self.predicted = self.router.last_overlap
        return w

    def _route_forgetting(self, request) -> int:
        age, index = self._age, self.router.index
        t = request.timestamp
        if self._ttl_ms is not None:
            if t is None:
                raise ValueError("option 'ttl_s' needs arrival times (run with --timing)")
            horizon = t - self._ttl_ms
            while age:
                key = next(iter(age))
                if age[key] > horizon:
                    break
                del age[key]
                index.apply_removed(key[0], (key[1],))
        w = self.router.route_hashes(request.hashes)
        self.predicted = self.router.last_overlap
        move = age.move_to_end
        for h in reversed(request.hashes):
            key = (w, h)
            age[key] = t
            move(key)
        if self._cap is not None:
            while len(age) > self._cap:
                (v, h), _ = age.popitem(last=False)
                index.apply_removed(v, (h,))
        return w


class KvEvents(KvAware):
    """As kv, but the index grows only from the workers' KV events (BlockStored/BlockRemoved).

    The overlap counts GPU blocks (events with ``medium`` GPU). ``tiers=all``: a worker's overlap is
    its GPU overlap plus the blocks that follow it in its CPU tier (``--cpu-capacity``), as the
    engine's lookup continues there; ``predicted_blocks`` stays the GPU part either way. Its index
    is a :class:`~dynlab.routing.run_index.RunIndex` in a timed run, as kv-cost's (per run when the
    events and requests carry runs, the same answers as a KvIndex), and a
    :class:`~dynlab.routing.index.KvIndex` in a count-based one, whose events and requests carry no runs.
    """

    name = "kv-events"
    uses_events = True
    # the events say what the workers hold: nothing to forget by age; tiers: which tiers' blocks count
    options = tuple(o for o in KvAware.options if o.name not in ("ttl_s", "max_blocks")) + (
        StrategyOption("tiers", str, "gpu", "gpu: overlap counts GPU blocks; all: CPU-tier blocks too "
                       "(needs a CPU tier)", needs_cpu_tier=True),)

    def __init__(self, ctx):
        Strategy.__init__(self, ctx)
        # timed: a RunIndex, per run when the events and requests carry runs (as kv-cost's), the same answers;
        # count-based: no event or request carries runs, and a RunIndex would only add a call to each
        index = RunIndex(ctx.block) if ctx.timed else KvIndex(ctx.block)
        self.router = KvRouter(ctx.workers, ctx.block, use_events=True, index=index)
        self.on_event = self.router.index.apply_event  # the hot path: no wrapper per event
        if not ctx.timed:  # count-based: the bus hands each request's change to the KvIndex, no events made
            self.on_change = index.apply_change
        tiers = self.option("tiers")
        if tiers not in ("gpu", "all"):
            raise ValueError(f"option 'tiers' must be gpu or all, got {tiers!r}")
        self.all_tiers = tiers == "all"

    def route(self, request, fleet):
        if not self.all_tiers:  # KvAware.route without its forgetting (this index never forgets): one call less
            w = self.router.route_hashes(request.hashes, request.runs)
            self.predicted = self.router.last_overlap
            return w
        router = self.router
        matches = router.index.find_matches_tiers(request.hashes, runs=request.runs) if request.hashes else {}
        counts = router.counts
        if matches:
            w = min(matches, key=lambda k: (-sum(matches[k]), counts[k], k))
            self.predicted = matches[w][0]
        else:
            w = min(fleet.routable, key=lambda k: (counts[k], k))
            self.predicted = 0
        counts[w] += 1
        return w

    def refused_events(self):
        return self.router.refused


def _least_active(active, routable) -> int:
    """Fewest active requests among the ``routable`` workers (ascending ids), ties to the lowest index."""
    return min(routable, key=active.__getitem__)


class LeastLoaded(Strategy):
    """Fewest active requests (queued, prefilling or decoding), ties to the lowest index."""

    name = "least-loaded"

    def route(self, request, fleet):
        return _least_active(fleet.active_requests, fleet.routable)


class PowerOfTwo(Strategy):
    """Two distinct workers drawn from the run's RNG; the one with fewer active requests (tie: the first drawn)."""

    name = "power-of-two"

    def route(self, request, fleet):
        routable = fleet.routable
        n = len(routable)
        if n == 1:
            return routable[0]
        rng = self.ctx.rng
        a = rng.randrange(n)
        b = rng.randrange(n - 1)
        if b >= a:
            b += 1
        a, b = routable[a], routable[b]
        active = fleet.active_requests
        return b if active[b] < active[a] else a


class KvCost(Strategy):
    """NVIDIA Dynamo's KV router: cheapest prefill_load_scale*max(prefill - credit*overlap, 0) + decode, from KV events.

    For each worker ``w`` (blocks of ``ctx.block`` tokens): ``overlap`` = leading blocks
    of the request that the events say ``w`` holds on its GPU, plus ``host_credit`` times the
    blocks that follow them in its CPU tier (``--cpu-capacity``; Dynamo's KV router credits a
    cached block by where it lives: device 1.0, host 0.75, disk 0.25; so ``host_credit`` is bounded to
    [0, 1], and refused without a CPU tier); ``prefill_blocks`` = ``w``'s queued
    prefill tokens / block + the request's blocks; ``decode_blocks`` = ``w``'s active
    blocks + the request's blocks; ``cost = prefill_load_scale * max(prefill_blocks -
    overlap_credit * overlap, 0) + decode_blocks``. Temperature 0 takes the cheapest
    (ties drawn from the run's RNG); above 0 it samples from ``softmax(-c / T)`` over
    min-max normalised costs ``c``. Source: NVIDIA Dynamo's KV router (its overlap
    weight and router temperature settings). The index grows only from KV events,
    so ``--publish no`` shows the same trap as ``kv-events``. It is a
    :class:`~dynlab.routing.run_index.RunIndex`: a KvIndex that works per run when the events and
    requests carry runs (the timed engine on traces naming their own blocks), with the same answers.
    ``lora_penalty`` (dynlab's own term, Dynamo has none; 0: off): blocks added to the cost of a worker where
    the request's LoRA adapter has no request in flight, 0.2 times it where another adapter fits (a load) and
    the whole where ``--max-loras`` adapters are in flight (the request would wait): llm-d's affinity score
    (:func:`dynlab_builtins.scorers.lora_affinity`) turned into a cost.
    """

    name = "kv-cost"
    uses_events = True
    options = (
        StrategyOption("overlap_credit", float, 1.0, "blocks of prefill saved per cached block", minimum=0),
        StrategyOption("prefill_load_scale", float, 1.0, "weight of the prefill term against decode", minimum=0),
        StrategyOption("temperature", float, 0.0, "0: cheapest worker; > 0: softmax sampling", minimum=0),
        StrategyOption("host_credit", float, 0.75, "weight of a block in the worker's CPU tier against a GPU "
                       "block (Dynamo's host credit; 0 to 1; needs a CPU tier)", minimum=0, maximum=1,
                       needs_cpu_tier=True),
        StrategyOption("lora_penalty", float, 0.0, "blocks added where the request's LoRA adapter has no request "
                       "in flight: 0.2x where another adapter fits, 1x where it must wait (dynlab's; needs "
                       "--timing; 0: off)", minimum=0),
    )

    def __init__(self, ctx):
        super().__init__(ctx)
        self.credit = self.option("overlap_credit")
        self.scale = self.option("prefill_load_scale")
        self.temperature = self.option("temperature")
        self.host_credit = self.option("host_credit")
        self.lora_penalty = self.option("lora_penalty")
        if self.lora_penalty and not ctx.timed:
            raise ValueError("option 'lora_penalty' has no effect without --timing: no request is in flight in a "
                             "count-based run")
        self.index = RunIndex(ctx.block)
        self.on_event = self.index.apply_event  # the hot path: no wrapper per event

    def refused_events(self):
        return self.index.refusals()

    def on_leave(self, worker):
        self.index.clear(worker)

    def costs(self, request, fleet) -> tuple[list, dict]:
        """Each routable worker's cost (in ``fleet.routable``'s order) and the index's GPU overlaps (worker -> blocks)."""
        matches = self.index.find_matches(request.hashes, request.runs) if self.credit else {}
        credited = matches
        if self.host_credit and self.credit and self.index.tiered and request.hashes:
            hc = self.host_credit
            tiers = self.index.find_matches_tiers(request.hashes, runs=request.runs)
            credited = {w: g + hc * c for w, (g, c) in tiers.items()}
        nb = len(request.hashes)
        block = self.ctx.block
        queued, active = fleet.queued_prefill_tokens, fleet.active_blocks
        scale, credit = self.scale, self.credit
        out = []
        for w in fleet.routable:
            prefill = queued[w] / block + nb - credit * credited.get(w, 0)
            out.append(scale * (prefill if prefill > 0 else 0.0) + active[w] + nb)
        if self.lora_penalty and (scores := lora_affinity(request, fleet, self.ctx.max_loras or 1)) is not None:
            pen = self.lora_penalty  # llm-d's affinity 1.0 / 0.8 / 0.0 -> no penalty / a load / a wait
            out = [c + (0.0 if s == 1.0 else 0.2 * pen if s else pen) for c, s in zip(out, scores)]
        return out, matches

    def route(self, request, fleet):
        costs, matches = self.costs(request, fleet)
        rng = self.ctx.rng
        if self.temperature > 0:
            lo, hi = min(costs), max(costs)
            span = hi - lo
            weights = [math.exp(-((c - lo) / span if span else 0.0) / self.temperature) for c in costs]
            x = rng.random() * sum(weights)
            w = len(costs) - 1
            for i, wt in enumerate(weights):
                x -= wt
                if x < 0:
                    w = i
                    break
        else:
            best = min(costs)
            ties = [i for i, c in enumerate(costs) if c == best]
            w = ties[0] if len(ties) == 1 else rng.choice(ties)
        w = fleet.routable[w]  # a position in the costs -> the worker's id
        self.predicted = matches.get(w, 0)
        return w


class CacheAware(Strategy):
    """SGLang's cache_aware router: shortest queue when unbalanced, else best prefix match above a threshold.

    Loads are active requests. If ``max - min > balance_abs_threshold`` and
    ``max > balance_rel_threshold * min``: the least-loaded worker. Otherwise, if the
    best match rate (leading blocks held / request blocks, from the strategy's own
    approximate index of what it routed) exceeds ``cache_threshold``: that worker
    (ties: less loaded, then lower index). Otherwise ``fallback``: ``least-loaded``
    (current SGLang) or ``least-cached`` (older releases: the smallest approximate
    index). The index keeps ``index_capacity`` blocks per worker, least recently
    routed dropped first; it never sees KV events. Defaults 64, 1.5 and 0.3 are
    SGLang's router defaults.
    """

    name = "cache-aware"
    options = (
        StrategyOption("balance_abs_threshold", int, 64, "imbalance needs max - min load above this", minimum=0),
        StrategyOption("balance_rel_threshold", float, 1.5, "... and max load above this times min load",
                       minimum=0),
        StrategyOption("cache_threshold", float, 0.3, "route by prefix match above this match rate",
                       minimum=0, maximum=1),
        StrategyOption("index_capacity", int, 1 << 20, "blocks per worker in the approximate index", minimum=0),
        StrategyOption("fallback", str, "least-loaded", "least-loaded (current SGLang) or least-cached (older)"),
    )

    def __init__(self, ctx):
        super().__init__(ctx)
        self.abs_thr = self.option("balance_abs_threshold")
        self.rel_thr = self.option("balance_rel_threshold")
        self.cache_thr = self.option("cache_threshold")
        self.fallback = self.option("fallback")
        capacity = self.option("index_capacity")
        if self.fallback not in ("least-loaded", "least-cached"):
            raise ValueError(f"option 'fallback' must be least-loaded or least-cached, got {self.fallback!r}")
        self.index = KvIndex(ctx.block)
        self._capacity = capacity
        self.trees = [Worker(w, LRUCache(capacity)) for w in range(ctx.workers)]

    def on_join(self, worker):
        self.trees.extend(Worker(w, LRUCache(self._capacity)) for w in range(len(self.trees), worker + 1))

    def on_leave(self, worker):
        self.index.clear(worker)

    def choose(self, request, fleet) -> tuple[int, int]:
        """``(worker, approximate overlap)`` by SGLang's rule, among ``fleet.routable``."""
        active, routable = fleet.active_requests, fleet.routable
        if len(routable) == len(active):  # every worker (a fixed fleet): no list made
            hi, lo = max(active), min(active)
        else:
            loads = [active[w] for w in routable]
            hi, lo = max(loads), min(loads)
        matches = self.index.find_matches(request.hashes)
        if hi - lo > self.abs_thr and hi > self.rel_thr * lo:
            w = _least_active(active, routable)
            return w, matches.get(w, 0)
        if matches:
            w = min(matches, key=lambda k: (-matches[k], active[k], k))
            if matches[w] / len(request.hashes) > self.cache_thr:
                return w, matches[w]
        if self.fallback == "least-cached":
            w = min(routable, key=lambda k: (len(self.trees[k]), k))
        else:
            w = _least_active(active, routable)
        return w, matches.get(w, 0)

    def route(self, request, fleet):
        w, self.predicted = self.choose(request, fleet)
        tree = self.trees[w]
        stored, removed = tree.serve(request.hashes, tree.overlap(request.hashes))
        if removed:
            self.index.apply_removed(w, removed)
        self.index.apply_stored(w, stored)
        return w


@hookimpl
def dynlab_register_strategies(register):
    for cls in (RoundRobin, RandomChoice, KvAware, KvEvents, LeastLoaded, PowerOfTwo, KvCost, CacheAware):
        register(cls)
