"""Per-class and per-tenant figures of a timed run: ``by_class`` and ``by_tenant`` (issue 42).

:class:`ClassMetrics` is a :class:`~dynlab.engine.metrics.Recorder`. A request's class is its ``class``
attribute and its tenant its ``tenant`` (else ``user``) attribute, ``default`` without one
(:mod:`dynlab.engine.gateway`). When some request of the run names a class, the result gains ``by_class``;
when some names a tenant or user, ``by_tenant``; a run whose requests name neither gains no key. Each is
``{name: {"requests", "shed", "ttft_ms", "tpot_ms", "goodput"}}`` in the order names first arrive (an empty
name counts as none):

- ``requests``: the measured requests of that class (or tenant) that arrived, shed and rejected ones included
  (a failed one a trace recorded, replayed by ``--keep-failed``, is left out, as the run's figures leave it out);
- ``shed``: those the gateway's admission policy shed;
- ``ttft_ms``, ``tpot_ms``: the distributions of :class:`~dynlab.engine.metrics.ServingMetrics` (client view,
  the same definitions) over its finished requests;
- ``goodput``: the share of its requests meeting its SLOs, its class's own (``--slo``) or else the run's
  (``--slo-ttft-ms``, ``--slo-tpot-ms``); ``null`` when it has none.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from dynlab.engine.metrics import Recorder, client_times, client_tpot, failed, meets, ratio, stats
from dynlab.routing.strategy import DEFAULT_CLASS, request_class, request_tenant

__all__ = ["ClassMetrics", "ClassWarning", "parse_class_slos"]

#: the SLO keys of ``--slo CLASS:ttft_ms=X,tpot_ms=Y``
SLO_KEYS = ("ttft_ms", "tpot_ms")


def parse_class_slos(text: Optional[str]) -> dict:
    """``"chat:ttft_ms=200,tpot_ms=30;batch:ttft_ms=5000"`` -> ``{"chat": (200.0, 30.0), "batch": (5000.0,
    None)}``: each class's ``(TTFT, TPOT)`` SLO in ms (``None``: none). Raises ``ValueError`` (one line) for
    an empty class, an unknown key, a number that is not finite and >= 0, or a class given twice."""
    out: dict = {}
    if text is not None and not text.replace(";", "").strip():  # '' or ';;;': no class at all
        raise ValueError(f"--slo {text!r}: give CLASS:ttft_ms=X,tpot_ms=Y (classes apart by ';')")
    for part in filter(None, (p.strip() for p in (text or "").split(";"))):
        name, colon, rest = part.partition(":")
        name = name.strip()
        if not name or not colon:
            raise ValueError(f"--slo {part!r}: give CLASS:ttft_ms=X,tpot_ms=Y (classes apart by ';')")
        if name in out:
            raise ValueError(f"--slo: class {name!r} is given twice")
        slo = dict.fromkeys(SLO_KEYS)
        for item in filter(None, (i.strip() for i in rest.split(","))):
            key, eq, value = item.partition("=")
            key = key.strip()
            if key not in SLO_KEYS or not eq:
                raise ValueError(f"--slo {part!r}: {item!r} is not ttft_ms=X or tpot_ms=Y")
            if slo[key] is not None:
                raise ValueError(f"--slo {part!r}: {key} is given twice")
            try:
                number = float(value)
            except ValueError:
                number = float("nan")
            if not 0 <= number < float("inf"):
                raise ValueError(f"--slo {part!r}: {key} must be a finite number of ms >= 0, got {value!r}")
            slo[key] = number
        if slo["ttft_ms"] is None and slo["tpot_ms"] is None:
            raise ValueError(f"--slo {part!r}: give ttft_ms=X, tpot_ms=Y or both")
        out[name] = (slo["ttft_ms"], slo["tpot_ms"])
    return out


class ClassWarning(UserWarning):
    """An SLO of ``--slo`` named a class no request of the run carried."""


class _Group:
    __slots__ = ("requests", "shed", "ttft", "tpot", "good", "slo")

    def __init__(self, slo):
        self.requests = self.shed = self.good = 0
        self.ttft: list = []
        self.tpot: list = []
        self.slo = slo  # (ttft ms, tpot ms) or None

    def figures(self) -> dict:
        return {"requests": self.requests, "shed": self.shed, "ttft_ms": stats(self.ttft), "tpot_ms": stats(self.tpot),
                "goodput": ratio(self.good, self.requests) if self.slo is not None and self.requests else None}


class ClassMetrics(Recorder):
    """``by_class`` and ``by_tenant`` (module docstring). ``class_slos``: ``{class: (ttft ms, tpot ms)}``
    (:func:`parse_class_slos`); ``slo_ttft_ms`` / ``slo_tpot_ms``: the run's SLOs, for the classes (and every
    tenant) without their own; ``warmup``, ``front_ms``, ``token_ms``: as :class:`~dynlab.engine.metrics.ServingMetrics`."""

    def __init__(self, class_slos: Mapping[str, tuple] = (), slo_ttft_ms: Optional[float] = None,
                 slo_tpot_ms: Optional[float] = None, warmup: int = 0, front_ms: float = 0.0, token_ms: float = 0.0):
        self.class_slos = dict(class_slos)
        self.run_slo = None if slo_ttft_ms is None and slo_tpot_ms is None else (slo_ttft_ms, slo_tpot_ms)
        self.warmup, self.front_ms, self.token_ms = warmup, front_ms, token_ms
        self.classes: dict = {}
        self.tenants: dict = {}
        self.named_class = self.named_tenant = False
        self._default = None  # the groups of a request without attributes

    def _groups(self, req) -> tuple:
        attrs = req.attrs
        if not attrs:  # (most requests of most traces: no call, no lookup)
            groups = self._default
            if groups is None:
                groups = self._default = self._named(DEFAULT_CLASS, DEFAULT_CLASS)
            return groups
        return self._named(request_class(attrs), request_tenant(attrs))

    def _named(self, cls: str, tenant: str) -> tuple:
        c = self.classes.get(cls)
        if c is None:
            c = self.classes[cls] = _Group(self.class_slos.get(cls, self.run_slo))
        t = self.tenants.get(tenant)
        if t is None:
            t = self.tenants[tenant] = _Group(self.run_slo)
        return c, t

    def on_arrival(self, req, t: float) -> None:
        if (self.warmup and req.id < self.warmup) or failed(req):  # (--keep-failed: outside the figures)
            return
        attrs = req.attrs
        if attrs:
            self.named_class = self.named_class or bool(attrs.get("class"))
            self.named_tenant = self.named_tenant or bool(attrs.get("tenant") or attrs.get("user"))
        for group in self._groups(req):
            group.requests += 1

    def on_shed(self, req) -> None:
        if not (self.warmup and req.id < self.warmup):
            for group in self._groups(req):
                group.shed += 1

    def on_finish(self, req, t: float) -> None:
        if (self.warmup and req.id < self.warmup) or failed(req):
            return
        ttft, _ = client_times(req, t, self.front_ms, self.token_ms)
        tpot = client_tpot(req, t, self.token_ms)
        for group in self._groups(req):
            group.ttft.append(ttft)
            if tpot is not None:
                group.tpot.append(tpot)
            if group.slo is not None and meets(group.slo, ttft, tpot):
                group.good += 1

    def result(self, engines: Sequence) -> dict[str, Any]:
        unseen = [name for name in self.class_slos if name not in self.classes]
        if unseen:  # a typo'd class, or a trace without that class: its SLO judged no request
            import warnings

            warnings.warn(ClassWarning(f"--slo names {', '.join(map(repr, unseen))}, which no request of the run "
                                       f"carries (classes seen: {', '.join(self.classes) or 'none'})"), stacklevel=2)
        out: dict = {}
        if self.named_class:
            out["by_class"] = {name: g.figures() for name, g in self.classes.items()}
        if self.named_tenant:
            out["by_tenant"] = {name: g.figures() for name, g in self.tenants.items()}
        return out
