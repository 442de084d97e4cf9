"""Built-in admission policies (``--admission-policy``), registered through the ``dynlab`` entry-point group.

``always`` lives in :mod:`dynlab.engine.gateway` (the default: no gateway); ``queue-bound`` and
``token-bucket`` live here, registered exactly as a third-party package would register its own.
"""
from __future__ import annotations

from typing import Mapping

from dynlab import hookimpl
from dynlab.engine.gateway import AdmissionPolicy, Always
from dynlab.routing.strategy import request_class, request_tenant


def _per_name(opts: Mapping[str, str], key: str, spec: str, integer: bool = False) -> dict:
    """``{NAME: number}`` of the options ``KEY.NAME=VALUE`` (a class's or a tenant's own setting)."""
    prefix = key + "."
    return {k[len(prefix):]: AdmissionPolicy.number(opts, k, minimum=1 if integer else 0, spec=spec, integer=integer)
            for k in opts if k.startswith(prefix)}


def _unknown(opts: Mapping[str, str], known: tuple, spec: str) -> None:
    for k in opts:
        base, dot, who = k.partition(".")
        if base not in known or (dot and not who):
            raise ValueError(f"admission policy {spec!r}: unknown option {k!r} (options: "
                             f"{', '.join(f'{n}, {n}.NAME' for n in known)})")


class QueueBound(AdmissionPolicy):
    """Shed a request when its class already has `limit` requests queued (admitted, no first token yet)."""

    name = "queue-bound"

    def __init__(self, opts: Mapping[str, str], spec: str = "", warmup: int = 0):
        super().__init__(opts, spec, warmup)
        _unknown(opts, ("limit",), self.spec)
        self.limit = self.number(opts, "limit", minimum=1, spec=self.spec, integer=True)
        self.limits = _per_name(opts, "limit", self.spec, integer=True)
        if self.limit is None and not self.limits:
            raise ValueError(f"admission policy {self.spec!r}: give limit=N (every class) or limit.CLASS=N")
        self.queued: dict = {}  # class -> its requests admitted and waiting for a first token
        self._waiting: set = set()  # ids of those requests

    def admit(self, request, now: float) -> bool:
        cls = request_class(request.attrs)
        limit = self.limits.get(cls, self.limit)
        n = self.queued.get(cls, 0)
        if limit is not None and n >= limit:
            return False
        self.queued[cls] = n + 1
        self._waiting.add(request.index)
        return True

    def _left(self, req) -> None:
        if req.id in self._waiting:
            self._waiting.discard(req.id)
            self.queued[request_class(req.attrs)] -= 1

    def on_first_token(self, req, t: float) -> None:
        self._left(req)

    def on_reject(self, req) -> None:
        self._left(req)

    def on_finish(self, req, t: float) -> None:
        self._left(req)


class TokenBucket(AdmissionPolicy):
    """Per tenant, a bucket of `burst` tokens refilled at `rate` per second; a request takes one or is shed."""

    name = "token-bucket"

    def __init__(self, opts: Mapping[str, str], spec: str = "", warmup: int = 0):
        super().__init__(opts, spec, warmup)
        _unknown(opts, ("rate", "burst"), self.spec)
        self.rate = self.number(opts, "rate", spec=self.spec)
        self.rates = _per_name(opts, "rate", self.spec)
        if self.rate is None and not self.rates:
            raise ValueError(f"admission policy {self.spec!r}: give rate=R requests/s (every tenant) or rate.TENANT=R")
        self.burst = self.number(opts, "burst", 1.0, minimum=1, spec=self.spec)
        self.bursts = _per_name(opts, "burst", self.spec)
        self.buckets: dict = {}  # tenant -> [tokens, time of the last refill in ms]

    def admit(self, request, now: float) -> bool:
        tenant = request_tenant(request.attrs)
        rate = self.rates.get(tenant, self.rate)
        if rate is None:  # a tenant without a rate: unlimited
            return True
        burst = self.bursts.get(tenant, self.burst)
        bucket = self.buckets.get(tenant)
        if bucket is None:
            bucket = self.buckets[tenant] = [burst, now]  # a tenant's bucket starts full
        tokens = min(burst, bucket[0] + (now - bucket[1]) * rate / 1000.0)
        bucket[1] = now
        if tokens >= 1.0:
            bucket[0] = tokens - 1.0
            return True
        bucket[0] = tokens
        return False


@hookimpl
def dynlab_register_admission_policies(register):
    for cls in (Always, QueueBound, TokenBucket):
        register(cls)
