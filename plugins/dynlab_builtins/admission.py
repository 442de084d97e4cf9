"""Built-in admission policies (``--admission-policy``), registered through the ``dynlab`` entry-point group.

``always`` lives in :mod:`dynlab.engine.gateway` (the default: no gateway); ``queue-bound``, ``token-bucket``
and ``slo-shed`` live here, registered exactly as a third-party package would register its own.
"""
from __future__ import annotations

from typing import Mapping

from dynlab import hookimpl
from dynlab.engine.gateway import WAIT, AdmissionPolicy, Always
from dynlab.latency.base import StepBatch
from dynlab.routing.strategy import request_class, request_tenant


def _per_name(opts: Mapping[str, str], key: str, spec: str, integer: bool = False) -> dict:
    """``{NAME: number}`` of the options ``KEY.NAME=VALUE`` (a class's or a tenant's own setting)."""
    prefix = key + "."
    return {k[len(prefix):]: AdmissionPolicy.number(opts, k, minimum=1 if integer else 0, spec=spec, integer=integer)
            for k in opts if k.startswith(prefix)}


def _unknown(opts: Mapping[str, str], known: tuple, spec: str, plain: tuple = ()) -> None:
    """Refuse an option that is neither ``KEY`` or ``KEY.NAME`` of ``known`` nor ``KEY`` of ``plain``."""
    for k in opts:
        base, dot, who = k.partition(".")
        if k not in plain and (base not in known or (dot and not who)):
            raise ValueError(f"admission policy {spec!r}: unknown option {k!r} (options: "
                             f"{', '.join([f'{n}, {n}.NAME' for n in known] + list(plain))})")


def _hold_options(policy: AdmissionPolicy, opts: Mapping[str, str]) -> bool:
    """``hold=true|false`` and ``max_wait_ms=X`` (ms, only with ``hold=true``) of ``opts``; sets the policy's
    ``max_wait_ms`` and returns whether it holds."""
    text = opts.get("hold", "false").strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"admission policy {policy.spec!r}: hold={opts['hold']} must be true or false")
    hold = text == "true"
    policy.max_wait_ms = policy.number(opts, "max_wait_ms", spec=policy.spec)
    if policy.max_wait_ms is not None and not hold:
        raise ValueError(f"admission policy {policy.spec!r}: max_wait_ms bounds a held request's wait: give hold=true")
    return hold


class QueueBound(AdmissionPolicy):
    """Shed (or hold, `hold=true`) a request when its class already has `limit` requests queued (admitted, no first token yet).

    ``hold=true``: a request over its class's limit waits at the gateway (:data:`~dynlab.engine.gateway.WAIT`)
    until one of its class's queued requests gets its first token, in its class's FIFO (llm-d's flow control
    holds requests at the gateway while the pool is saturated); ``max_wait_ms=X``: shed after X ms held
    (llm-d's time to live of a queued request); without it a held request waits as long as it takes."""

    name = "queue-bound"

    def __init__(self, opts: Mapping[str, str], spec: str = "", warmup: int = 0):
        super().__init__(opts, spec, warmup)
        _unknown(opts, ("limit",), self.spec, ("hold", "max_wait_ms"))
        self.hold = _hold_options(self, opts)
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
            return WAIT if self.hold else False
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


class SloShed(AdmissionPolicy):
    """Shed a request when its class's TTFT SLO is predicted to be missed on every worker.

    The prediction is what the gateway can know: the routers' load view and the run's step latency model
    (:class:`~dynlab.engine.gateway.GatewayContext`). For a request of ``L`` prompt tokens, on worker ``w``
    with ``Q_w`` prompt tokens routed and not yet prefilled (``queued_prefill_tokens``) and ``D_w`` requests
    past their first token (``active_requests - waiting_requests``: decoding), the ``Q_w + L`` tokens are
    prefilled before its first token, in chunks of ``C_w = max(budget - D_w, 1)`` tokens (the step's token
    budget, ``--max-num-batched-tokens``, less one token per decode), each chunk a step beside the ``D_w``
    decodes::

        TTFT_w = sum over chunks c of step_ms(prefill c tokens, context 0; D_w decodes, context 0)

    and the request is shed when ``margin * min_w TTFT_w`` exceeds its class's TTFT SLO (``--slo
    CLASS:ttft_ms=X``). A class without a TTFT SLO is never shed. Option ``margin`` (default 1, > 0: above 1
    sheds earlier).

    Source: the latency admission of the Gateway API Inference Extension (llm-d's router;
    kubernetes-sigs/gateway-api-inference-extension PR #2695, ``requestcontrol/admission``): reject a sheddable
    request when no endpoint's predicted latency meets its SLO. Where dynlab differs: the prediction is the
    run's own latency model over the router's load view, not a trained predictor (it leaves out the new
    request's prefix-cache hit and the decodes' context, which the gateway does not know); any class with
    a TTFT SLO is sheddable (the extension: priority below 0 only); no idle-endpoint exception (the extension
    admits while some endpoint is idle, as its predictor is unreliable there; this prediction is the same
    model the engines run on).
    """

    name = "slo-shed"

    def __init__(self, opts: Mapping[str, str], spec: str = "", warmup: int = 0):
        super().__init__(opts, spec, warmup)
        _unknown(opts, (), self.spec, ("margin",))
        self.margin = self.number(opts, "margin", 1.0, spec=self.spec)
        if not self.margin > 0:
            raise ValueError(f"admission policy {self.spec!r}: margin={opts['margin']} must be > 0")
        self.ttft: dict = {}  # class -> its TTFT SLO (ms)

    @staticmethod
    def _ttft_slos(class_slos) -> dict:
        return {c: slo[0] for c, slo in class_slos.items() if slo[0] is not None}

    @classmethod
    def no_effect(cls, opts, class_slos):
        """No class with a TTFT SLO: nothing is ever shed."""
        if not cls._ttft_slos(class_slos):
            return ("as slo-shed without a class TTFT SLO: it sheds a class's request predicted to miss its class's "
                    "TTFT SLO (give --slo CLASS:ttft_ms=X)")
        return None

    def bind(self, context) -> None:
        super().bind(context)
        self.ttft = self._ttft_slos(context.class_slos)
        if not self.ttft:
            raise ValueError(f"admission policy {self.spec!r} sheds against a class's TTFT SLO: give one with "
                             "--slo CLASS:ttft_ms=X")
        if context.latency is None:
            raise ValueError(f"admission policy {self.spec!r} needs the workers' step latency model")

    def predicted_ttft(self, tokens: int, w: int) -> float:
        """TTFT (ms) of a request of ``tokens`` prompt tokens on worker ``w`` (the class docstring's formula)."""
        c = self.context
        fleet, step_ms = c.fleet, c.latency.step_ms
        n = fleet.queued_prefill_tokens[w] + tokens
        decoding = fleet.active_requests[w] - fleet.waiting_requests[w]
        chunk = max((c.budget or n) - decoding, 1)
        full, rest = divmod(n, chunk)
        total = full * step_ms(StepBatch((chunk,), (0,), decoding, 0)) if full else 0.0
        return total + (step_ms(StepBatch((rest,), (0,), decoding, 0)) if rest else 0.0)

    def admit(self, request, now: float) -> bool:
        slo = self.ttft.get(request_class(request.attrs))
        if slo is None:
            return True
        tokens = max(request.input_length, 1)
        best = min(self.predicted_ttft(tokens, w) for w in self.context.fleet.routable)  # not retired or starting
        return self.margin * best <= slo


@hookimpl
def dynlab_register_admission_policies(register):
    for cls in (Always, QueueBound, TokenBucket, SloShed):
        register(cls)
