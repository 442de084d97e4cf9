"""A plan's target: the SLOs and the percentile (or goodput share) at which they must hold, and the verdict
of one replay against it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

#: the percentiles a replay reports (``dynlab sim``'s ``ttft_ms`` / ``tpot_ms`` keys)
PERCENTILES = ("p50", "p90", "p99")


@dataclass(frozen=True)
class Target:
    """SLOs in ms (``None``: not asked) and how they must hold.

    - ``goodput`` given (0..1): the share of all requests meeting every SLO given (``sim``'s
      ``goodput``, DistServe's definition, rejected requests counted as misses) must be at least it;
    - otherwise the ``percentile`` (``p50``/``p90``/``p99``) of TTFT and of TPOT must be within the
      SLO, and no request may be rejected (a prompt the pool can never hold is never served).
    """

    slo_ttft_ms: Optional[float] = None
    slo_tpot_ms: Optional[float] = None
    percentile: str = "p99"
    goodput: Optional[float] = None

    def __post_init__(self):
        if self.slo_ttft_ms is None and self.slo_tpot_ms is None:
            raise ValueError("give at least one SLO: --slo-ttft-ms or --slo-tpot-ms")
        if self.percentile not in PERCENTILES:
            raise ValueError(f"--slo-percentile must be one of {', '.join(PERCENTILES)}, got {self.percentile!r}")
        if self.goodput is not None and not 0.0 < self.goodput <= 1.0:
            raise ValueError(f"--goodput must be in (0, 1], got {self.goodput}")

    @property
    def allowed_miss(self) -> float:
        """The share of requests (0..1) that may miss: ``1 - goodput``, or ``1 - percentile / 100``."""
        if self.goodput is not None:
            return 1.0 - self.goodput
        return 1.0 - int(self.percentile[1:]) / 100.0

    def describe(self) -> str:
        """``TTFT <= 2000 ms and TPOT <= 50 ms at p99`` / ``... for 99% of requests (goodput)``."""
        parts = [f"{name} <= {v:g} ms" for name, v in (("TTFT", self.slo_ttft_ms), ("TPOT", self.slo_tpot_ms))
                 if v is not None]
        how = f"for {self.goodput:.4g} of requests (goodput)" if self.goodput is not None else f"at {self.percentile}"
        return " and ".join(parts) + " " + how

    def misses(self, result: Mapping) -> list[str]:
        """What a replay's ``result`` (``sim``'s JSON) misses, in words (empty: it meets the target)."""
        if self.goodput is not None:
            g = result.get("goodput", 0.0)
            return [] if g >= self.goodput else [f"goodput {g:.4f} < {self.goodput:g}"]
        out = []
        for name, key, slo in (("TTFT", "ttft_ms", self.slo_ttft_ms), ("TPOT", "tpot_ms", self.slo_tpot_ms)):
            value = measured(result, key, self.percentile)
            if slo is not None and value is not None and value > slo:
                out.append(f"{name} {self.percentile} {value:g} ms > {slo:g} ms")
        if result.get("rejected"):
            out.append(f"{result['rejected']} request(s) rejected (never fit the pool)")
        return out

    def headroom(self, result: Mapping) -> Optional[float]:
        """How far inside the target a replay is (0..1; negative outside): the smallest
        ``1 - measured / SLO`` over the SLOs given, or ``goodput - target`` in goodput mode."""
        if self.goodput is not None:
            return round(result.get("goodput", 0.0) - self.goodput, 4)
        room = [1.0 - value / slo for key, slo in (("ttft_ms", self.slo_ttft_ms), ("tpot_ms", self.slo_tpot_ms))
                if slo is not None and slo > 0 and (value := measured(result, key, self.percentile)) is not None]
        return round(min(room), 4) if room else None


def measured(result: Mapping, key: str, percentile: str) -> Optional[float]:
    """``result[key][percentile]`` (``ttft_ms``/``tpot_ms``), ``None`` when the replay has none."""
    block = result.get(key)
    return block.get(percentile) if isinstance(block, Mapping) else None
