"""A plan's target: the SLOs and the percentile (or goodput share) at which they must hold, and the verdict
of one replay against it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

#: the percentiles a replay reports (``dynlab sim``'s ``ttft_ms`` / ``tpot_ms`` keys)
PERCENTILES = ("p50", "p90", "p99")


@dataclass(frozen=True)
class Target:
    """SLOs in ms (``None``: not asked) and how they must hold.

    - ``goodput`` given (0..1): the share of all requests meeting every SLO given (``sim``'s
      ``goodput``, DistServe's definition, rejected requests counted as misses) must be at least it;
    - otherwise the ``percentile`` (``p50``/``p90``/``p99``) of TTFT and of TPOT must be within the
      SLO, and no request may be rejected (a prompt the pool can never hold is never served).

    ``classes``: per-class SLOs, ``((class, TTFT ms or None, TPOT ms or None), ...)`` (a mapping
    ``{class: (ttft, tpot)}``, :func:`dynlab.engine.class_metrics.parse_class_slos`'s, is taken too): each
    class's figures in the replay's ``by_class`` must meet its own, at the percentile (or its class goodput
    at least ``goodput``), besides the run-wide SLOs when those are given.
    """

    slo_ttft_ms: Optional[float] = None
    slo_tpot_ms: Optional[float] = None
    percentile: str = "p99"
    goodput: Optional[float] = None
    classes: tuple = ()

    def __post_init__(self):
        if isinstance(self.classes, Mapping):
            object.__setattr__(self, "classes", tuple((k, *v) for k, v in self.classes.items()))
        if self.slo_ttft_ms is None and self.slo_tpot_ms is None and not self.classes:
            raise ValueError("give at least one SLO: --slo-ttft-ms, --slo-tpot-ms or --slo CLASS:ttft_ms=X,tpot_ms=Y")
        if self.percentile not in PERCENTILES:
            raise ValueError(f"--slo-percentile must be one of {', '.join(PERCENTILES)}, got {self.percentile!r}")
        if self.goodput is not None and not 0.0 < self.goodput <= 1.0:
            raise ValueError(f"--goodput must be in (0, 1], got {self.goodput}")

    @property
    def run_wide(self) -> bool:
        """Whether a run-wide SLO (``--slo-ttft-ms``, ``--slo-tpot-ms``) is given."""
        return self.slo_ttft_ms is not None or self.slo_tpot_ms is not None

    @property
    def allowed_miss(self) -> float:
        """The share of requests (0..1) that may miss: ``1 - goodput``, or ``1 - percentile / 100``."""
        if self.goodput is not None:
            return 1.0 - self.goodput
        return 1.0 - int(self.percentile[1:]) / 100.0

    def classes_text(self) -> Optional[str]:
        """The per-class SLOs as ``sim --slo`` takes them (``None`` without any)."""
        parts = [f"{name}:" + ",".join(f"{k}={v!r}" for k, v in (("ttft_ms", ttft), ("tpot_ms", tpot)) if v is not None)
                 for name, ttft, tpot in self.classes]
        return ";".join(parts) or None

    def classes_json(self) -> dict:
        """``{class: {"ttft_ms": X, "tpot_ms": Y}}`` (``None``: not given), the plan JSON's ``slo_classes``."""
        return {name: {"ttft_ms": ttft, "tpot_ms": tpot} for name, ttft, tpot in self.classes}

    def describe(self) -> str:
        """``TTFT <= 2000 ms and TPOT <= 50 ms at p99`` / ``... for 99% of requests (goodput)``; a class's
        SLOs after its name (``chat TTFT <= 500 ms``)."""
        def slos(ttft, tpot):
            return " and ".join(f"{name} <= {v:g} ms" for name, v in (("TTFT", ttft), ("TPOT", tpot)) if v is not None)

        parts = ([slos(self.slo_ttft_ms, self.slo_tpot_ms)] if self.run_wide else []) + \
            [f"{name} {slos(ttft, tpot)}" for name, ttft, tpot in self.classes]
        if self.goodput is None:
            how = f"at {self.percentile}"
        else:
            whose = ("of requests" if not self.classes else "of each class's requests" if not self.run_wide
                     else "of requests and of each class's")
            how = f"for {self.goodput:.4g} {whose} (goodput)"
        return ", ".join(parts) + " " + how

    def rows(self, result: Mapping):
        """``(label, figures, TTFT SLO, TPOT SLO)``: the run-wide SLOs on ``result`` (label empty), then each
        class's on its figures (:func:`class_figures`; ``{}`` when the replay has none)."""
        if self.run_wide:
            yield "", result, self.slo_ttft_ms, self.slo_tpot_ms
        for name, ttft, tpot in self.classes:
            yield name, class_figures(result, name) or {}, ttft, tpot

    def misses(self, result: Mapping) -> list[str]:
        """What a replay's ``result`` (``sim``'s JSON) misses, in words (empty: it meets the target); a class's
        misses start with its name (``chat TTFT p99 612 ms > 500 ms``)."""
        out = []
        for label, figures, ttft, tpot in self.rows(result):
            who = f"{label} " if label else ""
            if self.goodput is not None:
                g = figures.get("goodput") or 0.0
                if g < self.goodput:
                    out.append(f"{who}goodput {g:.4f} < {self.goodput:g}")
                continue
            for name, key, slo in (("TTFT", "ttft_ms", ttft), ("TPOT", "tpot_ms", tpot)):
                value = measured(figures, key, self.percentile)
                if slo is not None and value is not None and value > slo:
                    out.append(f"{who}{name} {self.percentile} {value:g} ms > {slo:g} ms")
        if self.goodput is None and result.get("rejected"):
            out.append(f"{result['rejected']} request(s) rejected (never fit the pool)")
        return out

    def rooms(self, result: Mapping) -> dict:
        """Headroom per row (:meth:`headroom`'s figure): ``""`` for the run-wide SLOs, a class's name for its
        own; a row with no figure it reads is left out."""
        out = {}
        for label, figures, ttft, tpot in self.rows(result):
            if self.goodput is not None:
                out[label] = round((figures.get("goodput") or 0.0) - self.goodput, 4)
                continue
            room = [1.0 - value / slo for key, slo in (("ttft_ms", ttft), ("tpot_ms", tpot))
                    if slo is not None and slo > 0 and (value := measured(figures, key, self.percentile)) is not None]
            if room:
                out[label] = round(min(room), 4)
        return out

    def headroom(self, result: Mapping) -> Optional[float]:
        """How far inside the target a replay is (0..1; negative outside): the smallest
        ``1 - measured / SLO`` over the SLOs given (each class's too), or ``goodput - target`` in goodput mode."""
        rooms = self.rooms(result)
        return min(rooms.values()) if rooms else None

    def binding_class(self, result: Mapping) -> Optional[str]:
        """The class whose SLOs a replay that misses the target misses furthest (the least headroom among the
        classes missing theirs); ``None`` when no class misses its own (the run-wide SLOs bind)."""
        missing = {label for label, figures, ttft, tpot in self.rows(result) if label
                   and Target(ttft, tpot, self.percentile, self.goodput).misses(figures)}
        if not missing:
            return None
        rooms = self.rooms(result)
        return min(sorted(missing), key=lambda name: rooms.get(name, float("-inf")))

    def ratios(self, result: Mapping) -> dict:
        """``{"ttft_ms": r, "tpot_ms": r}``: the largest ``measured / SLO`` at the percentile over the SLOs given
        of each (run-wide and each class's); 0.0 without one."""
        out = {"ttft_ms": 0.0, "tpot_ms": 0.0}
        for _, figures, ttft, tpot in self.rows(result):
            for key, slo in (("ttft_ms", ttft), ("tpot_ms", tpot)):
                if slo:
                    out[key] = max(out[key], (measured(figures, key, self.percentile) or 0.0) / slo)
        return out

    def check_classes(self, requests: Sequence) -> None:
        """``ValueError`` (one line) when a class given no request of ``requests`` carries."""
        from dynlab.routing.strategy import request_class

        carried = list(dict.fromkeys(request_class(r.attrs or {}) for r in requests))
        for name, _, _ in self.classes:
            if name not in carried:
                raise ValueError(f"--slo: no request carries class {name!r} (the requests' classes: "
                                 f"{', '.join(carried)})")


def class_figures(result: Mapping, name: str) -> Optional[Mapping]:
    """A class's figures in a replay (``by_class[name]``); a replay without ``by_class`` (no request named a
    class) has every request in class ``default``, whose figures are the run's. ``None``: none."""
    by = result.get("by_class")
    if isinstance(by, Mapping):
        return by.get(name)
    from dynlab.routing.strategy import DEFAULT_CLASS

    return result if name == DEFAULT_CLASS else None


def measured(result: Mapping, key: str, percentile: str) -> Optional[float]:
    """``result[key][percentile]`` (``ttft_ms``/``tpot_ms``), ``None`` when the replay has none."""
    block = result.get(key)
    return block.get(percentile) if isinstance(block, Mapping) else None
