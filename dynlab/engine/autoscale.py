"""What autoscaling controllers share (``--controller hpa:...``, ``static``, a plugin's own): replica bounds, the
cold start of a new worker and how a worker is retired, read from the controller's options.

:class:`Autoscaler` is a :class:`~dynlab.engine.controller.Controller` that reads, besides ``period`` (s):

- ``min`` / ``max``: the replica bounds (workers, starting ones counted; each an integer from 1 to
  :data:`~dynlab.limits.MAX_WORKERS`, as every bound below; Kubernetes HPA's ``minReplicas``, default
  1, and ``maxReplicas``); ``max`` has no default where a controller needs it (HPA requires it too); in a P/D fleet
  (``--split P:D``) the pool's own, ``decode_min`` / ``decode_max`` (the decode pool scales; ``min`` / ``max`` are
  refused there, as ``decode_*`` and ``prefill_*`` are in an aggregated fleet: :meth:`Autoscaler.no_effect`);
  ``prefill_min`` / ``prefill_max`` (default 1 and none; ``prefill_max`` required where ``max`` is) make the
  prefill pool scale too, within them (``scales_prefill``; without either it keeps ``--split``'s ``P`` workers:
  :mod:`dynlab.disagg.elastic`);
- ``cold_start_s``: seconds from :class:`~dynlab.engine.controller.Add` to routable, overriding the computed
  :func:`cold_start_s` (``load_gbps`` and ``startup_s`` set its terms instead);
- ``scale_down``: ``drain`` (default: no new route, the worker finishes what it holds) or ``kill`` (its requests
  requeued, counted in the result's ``requeued``);
- ``scrape_delay_s``: the metrics' age, s (default 0): the controller decides at ``t + scrape_delay_s`` on what was
  observed at ``t`` (Prometheus scrapes every ``scrape_interval``, 1 m by default in its configuration docs, and a
  rate over a window lags further; Dynamo's Planner reads Prometheus: docs/autoscaling.md);
- ``discovery_delay_s``: s the router takes to learn of a join or a leave (default 0): a worker is routable that
  long after its ready time, and a retired one keeps its routes that long before its drain or kill starts (Dynamo's
  routers learn of workers through a discovery store's watch: etcd leases; the figure is an assumption to set).

The cold start (:func:`cold_start_s`) is ``weight_bytes / (load_gbps x 1e9) + startup_s``: one worker reads its
model's weights (the catalogue's :attr:`dynlab.models.spec.ModelSpec.weight_bytes`, every GPU of the worker
together) at ``load_gbps`` GB/s (1e9 B/s), then the engine starts up (torch.compile, CUDA-graph capture, the KV
cache's allocation and the server's start: the six steps "Breaking the Ice: Analyzing Cold Start Latency in
vLLM", arXiv 2606.07362, measures). Both defaults are dynlab's assumptions, not measurements of one deployment
(docs/autoscaling.md says why these numbers): ``DEFAULT_LOAD_GBPS`` 2 GB/s (weights cached on a local NVMe
volume or read from a fast network volume; a cold download from a hub is slower), ``DEFAULT_STARTUP_S`` 30 s.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

from dynlab.engine.controller import LIVE, STARTING, Add, Controller, Retire
from dynlab.limits import HORIZON_MS, MAX_WORKERS

__all__ = ["Autoscaler", "DEFAULT_LOAD_GBPS", "DEFAULT_STARTUP_S", "ceil_ratio", "cold_start_s", "retire_order"]

#: GB/s (1e9 B/s) a new worker reads its weights at (an assumption: docs/autoscaling.md)
DEFAULT_LOAD_GBPS = 2.0
#: s of engine start-up after the weights are loaded: compile, CUDA graphs, KV allocation (an assumption)
DEFAULT_STARTUP_S = 30.0


def cold_start_s(weight_bytes: float, load_gbps: float = DEFAULT_LOAD_GBPS,
                 startup_s: float = DEFAULT_STARTUP_S) -> float:
    """Seconds from adding a worker to its first route: ``weight_bytes`` (B) / (``load_gbps`` x 1e9 B/s) +
    ``startup_s`` (module docstring). Llama-3.1-8B (16.06e9 B in bf16) at the defaults: 8.03 + 30 = 38.03 s."""
    return weight_bytes / (load_gbps * 1e9) + startup_s


def retire_order(workers) -> list:
    """The ids to retire first, in order: starting workers (newest first), then live ones (newest first); Kubernetes'
    ReplicaSet controller deletes a not-ready pod before a ready one and, among equals, the newest first
    (``pkg/controller/replicaset``, ``getPodsToDelete`` over ``ActivePodsWithRanks``; simplified to these two keys).
    ``workers``: :class:`~dynlab.engine.controller.WorkerState` of a :class:`FleetState`."""
    starting = sorted((w.id for w in workers if w.state == STARTING), reverse=True)
    live = sorted((w.id for w in workers if w.state == LIVE), reverse=True)
    return starting + live


#: the most seconds a controller's time option may hold: the simulated clock's horizon (dynlab.limits.HORIZON_MS)
MAX_SECONDS = HORIZON_MS / 1000.0


class Autoscaler(Controller):
    """A controller with replica bounds, a cold start and a scale-down mode (module docstring). ``need_max``: the
    subclass requires ``max``. Subclasses implement :meth:`desired` (the replica count wanted now) or
    :meth:`decide`; :meth:`scale_to` turns a count into decisions."""

    need_max = False

    def __init__(self, opts: Mapping[str, str], spec: str = ""):
        super().__init__(opts, spec)
        self._bounds()
        self.cold_override = self.number("cold_start_s", None, maximum=MAX_SECONDS)
        self.load_gbps = self.number("load_gbps", DEFAULT_LOAD_GBPS, minimum=1e-9)
        self.startup_s = self.number("startup_s", DEFAULT_STARTUP_S, maximum=MAX_SECONDS)
        self.kill = self.choice("scale_down", ("drain", "kill"), "drain") == "kill"
        self.scrape_delay_s = self.number("scrape_delay_s", 0.0, maximum=MAX_SECONDS)
        self.discovery_delay_s = self.number("discovery_delay_s", 0.0, maximum=MAX_SECONDS)

    def replicas(self, key: str, default: Optional[int]) -> Optional[int]:
        """The replica bound ``key``: an integer from 1 to :data:`~dynlab.limits.MAX_WORKERS` (the most workers a
        run may hold: dynlab/limits.py), ``default`` when absent; every bound is read so (``max=2.5``,
        ``prefill_max=2.5``, ``decode_max=1e30`` refused alike)."""
        return self.number(key, default, minimum=1, integer=True, maximum=MAX_WORKERS)

    def _bounds(self) -> None:
        """Read ``min``/``max``, ``decode_min``/``decode_max`` and ``prefill_min``/``prefill_max`` (module docstring);
        a bound below its lower one is refused naming the keys given."""
        given = set(self._opts)
        pmin, pmax = self.replicas("prefill_min", None), self.replicas("prefill_max", None)
        self.scales_prefill = pmin is not None or pmax is not None  # a P/D fleet's prefill pool scales too
        self.prefill_bounds = (pmin or 1, pmax)
        if self.scales_prefill and pmax is None and self.need_max:
            raise ValueError(f"controller {self.spec!r}: prefill_max=N (the most prefill workers) is required with "
                             f"prefill_min=")
        if pmax is not None and pmax < (pmin or 1):
            raise ValueError(f"controller {self.spec!r}: prefill_max={pmax} is below prefill_min={pmin or 1}")
        self.min = self.replicas("decode_min", self.replicas("min", 1))  # P/D: the decode pool's (docstring)
        self.max = self.replicas("decode_max", self.replicas("max", None))
        if self.max is None and self.need_max:
            raise ValueError(f"controller {self.spec!r}: max=N (the most workers; decode_max=N in a P/D fleet) "
                             f"is required")
        if self.max is not None and self.max < self.min:
            low, high = ("decode_min" if "decode_min" in given else "min"), \
                ("decode_max" if "decode_max" in given else "max")
            raise ValueError(f"controller {self.spec!r}: {high}={self.max} is below {low}={self.min}")

    @classmethod
    def no_effect(cls, opts, pd: bool):
        """The bounds name the pool they bound: ``decode_min`` / ``decode_max`` in a P/D fleet, ``min`` / ``max`` in
        an aggregated one (module docstring)."""
        wrong = ("min", "max") if pd else ("decode_min", "decode_max", "prefill_min", "prefill_max")
        given = [k for k in wrong if k in opts]
        if not given:
            return None
        if pd:
            return (f"as {','.join(given)}= with a P/D split: name the pool, decode_min= and decode_max= (the decode "
                    f"pool scales; prefill_min= and prefill_max= make the prefill pool scale too)")
        return f"as {','.join(given)}= without a P/D split (--split P:D): use min= and max="

    def choice(self, key: str, choices: tuple, default: str) -> str:
        """The option ``key``, one of ``choices`` (``default`` when absent); ``ValueError`` otherwise."""
        text = self.text(key, default)
        if text not in choices:
            raise ValueError(f"controller {self.spec!r}: {key}={text} must be one of {', '.join(choices)}")
        return text

    def cold_start(self, state) -> float:
        """Seconds until a worker added now is routable: ``cold_start_s`` if given, else :func:`cold_start_s` of the
        run's model (``state.weight_bytes``)."""
        if self.cold_override is not None:
            return self.cold_override
        return cold_start_s(state.weight_bytes, self.load_gbps, self.startup_s)

    def bounded(self, n: int, pool: str = "") -> int:
        """``n`` within ``[min, max]`` (``pool`` ``"prefill"``: within ``[prefill_min, prefill_max]``)."""
        low, high = self.prefill_bounds if pool == "prefill" else (self.min, self.max)
        n = max(n, low)
        return n if high is None else min(n, high)

    def scale_to(self, state, n: int) -> list:
        """Decisions taking the fleet's replicas (starting and live workers) to ``n``: adds, each ready after
        :meth:`cold_start`, or retires in :func:`retire_order`."""
        workers = [w for w in state.workers if w.state in (STARTING, LIVE)]
        current = len(workers)
        if n > current:
            ready = self.cold_start(state)
            return [Add(ready, state.pool) for _ in range(n - current)]
        return [Retire(w, self.kill, state.pool) for w in retire_order(workers)[:current - n]]


def ceil_ratio(current: int, ratio: float) -> int:
    """``ceil(current x ratio)``, robust to a product that float arithmetic lands a hair above an integer."""
    x = current * ratio
    return int(math.ceil(x - 1e-9))

