"""``plan``: for every candidate shape the fewest workers meeting a :class:`~dynlab.plan.target.Target`,
searched by replay on the sweep executors (process pool or Ray), every replay kept in a resumable log."""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Callable, Mapping, Optional, Sequence

from dynlab.engine.config import SimConfig
from dynlab.plan import analysis
from dynlab.plan.binding import class_compute_text, class_text, compute_text, idle, idle_text, replay_text, routing_text
from dynlab.plan.rate import closed_users
from dynlab.plan.search import PdSearch, Search, Shape
from dynlab.plan.target import Target

#: the most workers a shape is given by default (``--max-workers``)
DEFAULT_CAP = 128


@dataclass
class Outcome:
    """One shape's answer. ``workers``: the fewest meeting the target (``None``: none up to the cap, or
    compute-bound); ``kind``/``why``: the binding constraint (:data:`dynlab.plan.binding.KINDS`) in
    words; ``search``: its replays; ``floor``: for a compute-bound shape, the search for the fewest
    workers adding no misses beyond the compute floor (``None`` otherwise)."""

    shape: Shape
    search: Search
    lower: int
    never_share: float
    kind: str = ""
    why: str = ""
    floor: Optional[Search] = None
    helps: dict = field(default_factory=dict)
    slo_floors: dict = field(default_factory=dict)
    users: Optional[int] = None
    domain: Optional[str] = None
    #: the class whose own SLOs (``--slo``) bind: missed furthest at N - 1 (or at the count shown when none
    #: is met); ``None`` when no class misses its own there, or none is given
    binding_class: Optional[str] = None
    #: the classes whose own SLOs their requests miss even alone, more than allowed (:func:`class_floors`)
    class_floors: dict = field(default_factory=dict)

    @property
    def workers(self) -> Optional[int]:
        return None if self.kind == "compute" else self.search.best()

    @property
    def shown(self) -> Optional[int]:
        """The worker count the report's figures are taken at: the answer, the compute floor's, or the cap."""
        if self.workers is not None:
            return self.workers
        s = self.floor if self.floor is not None and self.floor.tested else self.search
        return s.best() if s.best() is not None else (max(s.tested) if s.tested else None)

    def shown_split(self) -> str:
        """A P/D shape's ``P:D`` at :attr:`shown` (empty for an aggregated shape)."""
        n = self.shown
        for s in (self.search, self.floor):
            if s is not None and n in s.tested:
                return s.fleet(n)
        return ""

    def shown_result(self) -> dict:
        n = self.shown
        for s in (self.search, self.floor):
            if s is not None and n in s.tested:
                return s.tested[n][1]
        return {}


def config_cell(config: SimConfig) -> dict:
    """A replay's identity in the log: the ``sim`` options that differ from ``sim``'s defaults (field names;
    ``timing`` and ``workers`` always), so each logged replay can be rerun with ``dynlab sim``."""
    cell = {}
    for f in fields(SimConfig):
        name, default = f.name, f.default if f.default is not MISSING else f.default_factory()
        value = getattr(config, name)
        if value != default or name in ("timing", "workers"):
            cell[name] = dict(value) if isinstance(value, Mapping) else value
    return cell


def with_profile(config: SimConfig) -> SimConfig:
    """``config``'s step and front-end times as a replay runs them: with ``--latency-profile``, the profile's
    latency model, fitted options and request front end (:func:`dynlab.latency.profile.apply_profile`)
    and no profile left to apply again; else unchanged. For the analysis only (a replay applies the profile
    itself and reports its error bands)."""
    if config.latency_profile is None:
        return config
    from dynlab.latency.profile import apply_profile

    return replace(apply_profile(config)[0], latency_profile=None)


def latency_for(config: SimConfig, rank: bool = False):
    """One worker's latency model for ``config``'s model, GPU, TP and latency options (a profile's, with
    ``--latency-profile``: :func:`with_profile`). ``rank``: with ``dp_attention``, one attention-DP rank's
    model instead (:func:`dynlab.engine.lockstep.rank_latency`: what a run prices each rank's own batch with),
    for the per-request floors: a request alone is served by one rank."""
    from dynlab.engine.kinds import run_latency_model
    from dynlab.engine.lockstep import rank_latency
    from dynlab.latency.grid import hardware_for

    config = with_profile(config)
    hardware = hardware_for(config.model, config.gpu, config.tp, ep=config.ep, pp=config.pp,
                            dp_attention=config.dp_attention, kv_cache_dtype=config.kv_cache_dtype)
    if rank and config.dp_attention:
        return rank_latency(config, hardware)
    return run_latency_model(config, hardware)


def floor_latency_for(config: SimConfig):
    """The latency model of a request served alone (the floors, the work): :func:`latency_for` of one rank."""
    return latency_for(config, rank=True)


def _search(shape: Shape, config: SimConfig, target: Target, lower: int, cap: int, prefill_share: float) -> Search:
    """The search of one shape: :class:`PdSearch` (at least 2 workers) for a P/D shape, else :class:`Search`."""
    if shape.pd:
        return PdSearch(config, target, max(2, lower), cap, prefill_share=prefill_share)
    return Search(config, target, lower, cap)


def prepare(requests: Sequence, shapes: Sequence[Shape], base: SimConfig, target: Target, cap: int,
            trace_block: int) -> list[Outcome]:
    """Each shape's analysis (floors, lower bound) and its :class:`Search`; a compute-bound shape gets the
    floor search instead (the fewest workers meeting the SLOs on every request that can meet them). A class of
    ``target.classes`` no request carries is a ``ValueError``, before any replay."""
    target.check_classes(requests)
    out, top_k = [], max(s.spec_tokens for s in shapes)
    for shape in shapes:
        config = shape.config(base, top_k)
        timed = with_profile(config)
        lat = latency_for(timed, rank=True)  # with dp_attention one rank's: the rank serves a request alone
        fl = analysis.floors(requests, lat, timed, trace_block)
        never = fl.never_share(target.slo_ttft_ms, target.slo_tpot_ms)
        work = analysis.work_ms(requests, lat, timed, fl)
        users = closed_users(requests, config.concurrency)
        if users is None:
            top, lower = cap, min(cap, analysis.workers_lower_bound(requests, config, work))
            if shape.dp_attention:  # work priced per rank; ranks work side by side: a worker does ep / tp ranks. work
                lower = max(1, -(-lower // shape.ranks))
        else:  # closed loop: no arrival span to bound the work by; C users never keep more than C workers busy
            top, lower = min(cap, users), 1
        share = analysis.prefill_share(work) if shape.pd else 0.5
        o = Outcome(shape, _search(shape, config, target, lower, top, share), lower, never, users=users,
                    slo_floors={k: fl.per_slo(k, slo, 1.0 - target.allowed_miss)
                                for k, slo in (("ttft", target.slo_ttft_ms), ("tpot", target.slo_tpot_ms))},
                    domain=(latency_for(timed) if shape.dp_attention else lat).describe_hardware().get("latency_domain"))
        if never > target.allowed_miss:
            o.kind = "compute"
            o.helps = analysis.help_shares(requests, timed, trace_block, target.slo_ttft_ms, target.slo_tpot_ms,
                                           floor_latency_for)
            floor_goodput = 1.0 - never - target.allowed_miss
            if floor_goodput > 0:
                relaxed = Target(target.slo_ttft_ms, target.slo_tpot_ms, goodput=round(floor_goodput, 6))
                o.floor = _search(shape, config, relaxed, lower, top, share)
            else:  # nothing left to serve in time: one replay at the lower bound shows the figures
                o.floor = _search(shape, config, target, o.search.lower, o.search.lower, share)
        elif target.classes:
            o.class_floors = class_floors(requests, fl, target)
            if o.class_floors:  # a class misses its own SLOs alone: one replay at the lower bound shows the figures
                o.kind, o.binding_class = "compute", next(iter(o.class_floors))
                o.floor = _search(shape, config, target, o.search.lower, o.search.lower, share)
        out.append(o)
    return out


def class_floors(requests: Sequence, fl: analysis.Floors, target: Target) -> dict:
    """Each class of ``target.classes`` whose requests miss its own SLOs even alone (their :class:`~analysis.Floors`)
    in a larger share of the class than the target allows: ``{class: {"never_share", "missing", "requests",
    "lowest_ttft_ms", "lowest_tpot_ms"}}`` (the lowest target of each SLO given the percentile, or goodput
    share, could meet for it), the largest share first; ``{}`` when none."""
    from dynlab.routing.strategy import request_class

    names = [request_class(r.attrs or {}) for r in requests]
    out = {}
    for name, ttft, tpot in target.classes:
        idx = [i for i, n in enumerate(names) if n == name]
        sub = analysis.Floors(tuple(fl.ttft[i] for i in idx), tuple(fl.tpot[i] for i in idx))
        share = sub.never_share(ttft, tpot)
        if share > target.allowed_miss:
            lowest = {k: (sub.per_slo(k, slo, 1.0 - target.allowed_miss) or {}).get("lowest_ms") if slo is not None
                      else None for k, slo in (("ttft", ttft), ("tpot", tpot))}
            out[name] = {"never_share": round(share, 6), "missing": round(share * len(idx)), "requests": len(idx),
                         "lowest_ttft_ms": lowest["ttft"], "lowest_tpot_ms": lowest["tpot"]}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["never_share"]))


def run_searches(outcomes: Sequence[Outcome], run_batch: Callable, known: Mapping[str, dict],
                 on_result: Callable = lambda cell, result, fresh: None) -> None:
    """Drive every search to its end in rounds: each round asks every unfinished search for its next
    worker count, takes results ``known`` (log key -> result) has, and runs the rest together with
    ``run_batch(configs) -> iterable of (position, result)``. ``on_result(cell, result, fresh)`` sees each."""
    from dynlab.sweep.grid import cell_key

    while True:
        asks = []
        for o in outcomes:
            s = o.floor if o.kind == "compute" else o.search
            if s is None:
                continue
            ask = s.next_config()
            if ask is not None:
                asks.append((s, *ask))
        if not asks:
            return
        todo = []
        for s, n, config in asks:
            cell = config_cell(config)
            if cell_key(cell) in known:
                s.record_config(n, config, known[cell_key(cell)])
                on_result(cell, known[cell_key(cell)], False)
            else:
                todo.append((s, n, config, cell))
        for i, result in run_batch([c for _, _, c, _ in todo]):
            s, n, config, cell = todo[i]
            s.record_config(n, config, result)
            on_result(cell, result, True)


def explain(outcomes: Sequence[Outcome], n_requests: int) -> None:
    """Fill each outcome's binding constraint (``kind``, ``why``) and binding class from its replays and analysis."""
    for o in outcomes:
        s, target = o.search, o.search.target
        if o.class_floors:
            o.why = class_compute_text(target, o.class_floors)
            continue
        if o.kind == "compute":
            fw = o.floor.best() if o.floor is not None and o.floor.target is not target else None
            fg = o.floor.tested[fw][1].get("goodput") if fw is not None else None
            o.why = compute_text(target, o.never_share, n_requests, o.slo_floors, o.helps, fw, fg,
                                 _floor_note(o.floor) if fw is None else "")
            continue
        missed = _explain_search(o, s, target)
        o.binding_class = target.binding_class(missed) if missed is not None else None
        if o.binding_class is not None:
            o.why += "; " + class_text(target, missed, o.binding_class)
        note = s.monotone_note()
        if note:
            o.why += f". {note}"


def _explain_search(o: Outcome, s: Search, target: Target) -> Optional[Mapping]:
    """Fill ``o.kind`` and ``o.why`` from an answer search's replays; return the replay that misses the target
    the binding constraint is read from (N - 1, the plateau's or the cap's), ``None`` when one worker meets it."""
    best = s.best()
    if best == 1:
        o.kind, o.why = "none", "none: one worker meets the target"
        return None
    if best == s.least:
        o.kind, o.why = "none", f"none: the smallest P/D fleet ({s.fleet(best)}) meets the target"
        return None
    if best is not None:
        r = s.tested[best - 1][1]
        o.kind, o.why = replay_text(target, best - 1, r, o.never_share, s.fleet(best - 1))
        return r
    if s.plateau() is not None:
        a, b = s.plateau()
        r = s.tested[b][1]
        if idle(r) and not (r.get("preemptions") or r.get("rejected")):
            o.kind, o.why = "routing", routing_text(target, a, b, r)
        else:
            o.kind, o.why = replay_text(target, b, r, o.never_share, s.fleet(b), (a, b))
        return r
    top = max(s.tested)
    r = s.tested[top][1]
    kind, text = replay_text(target, top, r, o.never_share, s.fleet(top))
    bound = "--max-workers" if o.users is None or s.cap < o.users else f"{o.users} closed-loop users keep no more busy"
    o.kind, o.why = kind, f"{text}; not met at the cap of {s.cap} workers ({bound})"
    return r


def _floor_note(floor: Optional[Search]) -> str:
    """Why a compute-bound shape's floor search found no worker count (empty when it did not run)."""
    if floor is None or not floor.tested or floor.target.goodput is None:
        return ""
    top = max(floor.tested)
    g = floor.tested[top][1].get("goodput", 0.0)
    if floor.plateau() is not None:
        a, b = floor.plateau()
        return (f"the replays at {a} and {b} workers are the same (goodput {g:.4f} < {floor.target.goodput:.4f}; "
                f"{idle_text(floor.tested[b][1], b)}): the strategy leaves the extra workers idle")
    return f"goodput {g:.4f} < {floor.target.goodput:.4f} at {top} workers (--max-workers {floor.cap})"
