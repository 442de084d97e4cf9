"""A simulation's configuration: :class:`SimConfig` (every option of ``dynlab sim``) and its validation."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Mapping, Optional

from dynlab.engine.timing import DECODE_TPS, POISSON_RATE, PREFILL_TPS, TimeModel


@dataclass(frozen=True)
class SimConfig:
    """Every option of ``dynlab sim``; the defaults are the seed's (lab 000 step 4).

    Workload: without ``trace``, the seed's synthetic workload (``prefixes``, ``reps``,
    ``plen``, ``tail`` tokens, ``block`` tokens per block, shuffled by ``seed``; block names by the
    ``hash`` scheme, ``dynlab`` or ``dynamo``); with it,
    a built-in trace name or a path, read by ``trace_format`` (``None``: detected).
    Fleet: ``workers``; ``capacity`` blocks per worker (``None``: unbounded) under the
    eviction ``policy``. Events: ``publish`` (``"yes"``/``"no"``), ``event_delay``
    (requests), ``event_loss`` (probability). ``opts``: strategy options (name -> text).
    ``all_metrics``: on the synthetic workload, add the fleet metrics to the seed's keys.
    Time (``timing=True``, :mod:`dynlab.engine.timing`): ``time_scale`` multiplies trace
    timestamps, ``rate`` (requests/s) drives Poisson arrivals for workloads without
    them, ``prefill_tps`` (tokens/s per worker) and ``decode_tps`` (tokens/s per request).
    """

    mode: str = "kv"
    workers: int = 2
    prefixes: int = 12
    reps: int = 6
    plen: int = 96
    tail: int = 16
    seed: int = 1
    block: int = 16
    hash: str = "dynlab"
    publish: str = "yes"
    capacity: Optional[int] = None
    policy: str = "lru"
    event_delay: int = 0
    event_loss: float = 0.0
    trace: Optional[str] = None
    trace_format: Optional[str] = None
    all_metrics: bool = False
    opts: Mapping[str, str] = field(default_factory=dict)
    timing: bool = False
    time_scale: float = 1.0
    rate: float = POISSON_RATE
    prefill_tps: float = PREFILL_TPS
    decode_tps: float = DECODE_TPS

    def time_model(self) -> TimeModel:
        """The :class:`dynlab.engine.timing.TimeModel` of these options."""
        return TimeModel(self.prefill_tps, self.decode_tps, self.time_scale, self.rate)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        for name in ("workers", "block"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("prefixes", "reps", "plen", "tail", "event_delay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.capacity is not None and self.capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {self.capacity}")
        from dynlab.routing.hashing import HASH_SCHEMES

        if self.hash not in HASH_SCHEMES:
            raise ValueError(f"hash must be one of {', '.join(HASH_SCHEMES)}, got {self.hash!r}")
        if self.publish not in ("yes", "no"):
            raise ValueError(f"publish must be yes or no, got {self.publish!r}")
        if not 0.0 <= self.event_loss <= 1.0:
            raise ValueError(f"event_loss must be between 0 and 1, got {self.event_loss}")
        self.time_model().validate()
        if not self.timing:
            for name in TIME_MODEL_FIELDS:
                if getattr(self, name) != _DEFAULTS[name]:
                    raise ValueError(f"--{name.replace('_', '-')} only applies with --timing")
        if self.timing and self.capacity is not None and self.policy != "lru":
            raise ValueError(f"--timing pins active blocks in an LRU list (vLLM's free-block queue); "
                             f"policy {self.policy!r} is not supported with it")


#: the options of the time model: set without ``timing`` they would silently do nothing, so they are refused
TIME_MODEL_FIELDS = ("time_scale", "rate", "prefill_tps", "decode_tps")
_DEFAULTS = {f.name: f.default for f in fields(SimConfig)}
