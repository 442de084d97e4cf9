"""The binding constraint of a shape, in words: queueing (more workers help: requests wait), prefill (more
workers help, but the TTFT tail is the prompts' prefill, not the wait), memory (the pool runs dry:
preemptions), routing (more workers stop changing anything: the strategy leaves them idle) or compute
(the slowest prompts' own prefill misses the target: no worker count helps)."""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from dynlab.plan.target import Target, measured

#: the kinds of binding constraint, in the order the report explains them
KINDS = ("none", "queueing", "prefill", "memory", "routing", "compute")


def _workers(n: int) -> str:
    return f"{n} worker{'' if n == 1 else 's'}"


def _pct(share: float) -> str:
    return f"{share * 100:.2f}%"


def compute_text(target: Target, never: float, n_requests: int, slo_floors: Mapping[str, Optional[Mapping]],
                 helps: Mapping[str, float], floor_workers: Optional[int], floor_goodput: Optional[float],
                 floor_note: str = "") -> str:
    """Why no worker count meets ``target``: ``never`` (0..1) of the ``n_requests`` miss an SLO even served
    alone with every prefix hit possible; ``slo_floors``: each SLO's floor (``"ttft"``, ``"tpot"``:
    :meth:`dynlab.plan.analysis.Floors.per_slo`), said per SLO given (:func:`floor_text`: the share missing it
    alone, the longest floor, and the lowest target it could meet when it binds); ``helps``: change -> the
    share that would still never meet them; ``floor_workers``: the fewest workers found to add no misses
    beyond these (goodput ``floor_goodput``); ``floor_note``: why that search found none (said when
    ``floor_workers`` is ``None``)."""
    count = round(never * n_requests)
    text = (f"compute: {_pct(never)} of requests ({count:,} of {n_requests:,}) miss the SLOs even alone on an idle "
            f"worker with every prefix hit possible, more than the {_pct(target.allowed_miss)} {target.describe()} "
            "allows: no worker count helps.")
    slos = (("ttft", target.slo_ttft_ms), ("tpot", target.slo_tpot_ms))
    for slo, ms in slos:
        if ms is not None and slo_floors.get(slo):
            text += " " + floor_text(slo, ms, slo_floors[slo], target, n_requests)
    if helps:
        text += " " + helps_text(helps, never, target.allowed_miss)
    text += _pd_text([slo for slo, ms in slos if ms is not None and (slo_floors.get(slo) or {}).get("never_share")])
    if floor_workers is not None:
        text += (f" {_workers(floor_workers)} serve{'s' if floor_workers == 1 else ''} every other request within the SLOs"
                 f" (goodput {floor_goodput:.4f}).")
    elif floor_note:
        text += f" The other requests are not all served within the SLOs either: {floor_note}."
    return text


def class_compute_text(target: Target, floors: Mapping[str, Mapping]) -> str:
    """Why no worker count meets a class's own SLOs: ``floors`` (:func:`dynlab.plan.planner.class_floors`, the
    largest share first) gives, per class, the share of its requests missing its SLOs even alone on an idle
    worker with every prefix hit possible, and the lowest target of each SLO it could meet. The first binds."""
    parts = []
    for name, f in floors.items():
        slo = {n: ttft_tpot for n, *ttft_tpot in target.classes}[name]
        own = Target(*slo, target.percentile, target.goodput)
        lowest = [f"{label} about {f[key]:,.0f} ms" for label, key in (("TTFT", "lowest_ttft_ms"), ("TPOT", "lowest_tpot_ms"))
                  if f.get(key) is not None]
        parts.append(f"{_pct(f['never_share'])} of class {name}'s requests ({f['missing']:,} of {f['requests']:,}) miss its "
                     f"SLOs ({own.describe()}) even alone on an idle worker with every prefix hit possible"
                     + (f" (the lowest targets it could meet here: {', '.join(lowest)})" if lowest else ""))
    first = next(iter(floors))
    return (f"compute: {'; '.join(parts)}, more than the {_pct(target.allowed_miss)} allowed: no worker count helps; "
            f"class {first} binds")


#: each SLO's floor in words: its name, what its floor is, the floor's name
_FLOORS = {"ttft": ("TTFT", "a prompt's own prefill takes up to", "the prefill floor"),
           "tpot": ("TPOT", "one decode step alone takes up to", "the decode floor")}


def floor_text(slo: str, slo_ms: float, floor: Mapping, target: Target, n_requests: int) -> str:
    """One SLO's floor in words (``slo``: ``"ttft"`` or ``"tpot"``; ``floor``: its
    :meth:`~dynlab.plan.analysis.Floors.per_slo`): *binds* when the share missing ``slo_ms`` alone is over what
    ``target`` allows (then the lowest target of it the percentile, or the goodput share, could meet), a share
    within it, or *does not bind* when no request misses it alone."""
    name, what, called = _FLOORS[slo]
    share = floor["never_share"]
    worst = f"{what} {floor['worst_ms']:,.0f} ms"
    if not share:
        return f"{name} does not bind: no request misses {slo_ms:g} ms alone ({worst})."
    who = target.percentile if target.goodput is None else f"a goodput of {target.goodput:g}"
    missed = f"{_pct(share)} ({round(share * n_requests):,} of {n_requests:,}) miss {slo_ms:g} ms alone"
    if share <= target.allowed_miss:
        return f"{name}: {missed} ({worst}), within the {_pct(target.allowed_miss)} allowed."
    return (f"{name} binds: {missed}: {worst} ({called}); the lowest {name} target {who} can meet here is about "
            f"{floor['lowest_ms']:,.0f} ms.")


def _pd_text(missed: Sequence[str]) -> str:
    """What P/D does to the floors of the SLOs in ``missed`` (``"ttft"``, ``"tpot"``): nothing."""
    what = {"ttft": "a prompt's own prefill", "tpot": "a decode step alone"}
    if not missed:
        return ""
    if len(missed) == 1:
        return f" P/D keeps decodes out of the prefill steps but does not shorten {what[missed[0]]}."
    return " P/D keeps decodes out of the prefill steps but shortens neither " + " nor ".join(what[m] for m in missed) + "."


def helps_text(helps: Mapping[str, float], never: float, allowed: float) -> str:
    """What each change measured in ``helps`` (change -> the share, 0..1, that would still never meet the
    SLOs) does to the share ``never`` that cannot meet them now, against the ``allowed`` share: within
    the target, lower but not enough, or no lower. Only a change that brings the share within the target
    is called one that helps: the others are said as measured."""
    parts = []
    for k, v in helps.items():
        if v <= allowed:
            parts.append(f"{k} would help ({_pct(v)} would still never meet them, within the {_pct(allowed)} allowed)")
        elif v < never:
            parts.append(f"{k} lowers that share to {_pct(v)}, not enough")
        else:
            parts.append(f"{k} does not lower it ({_pct(v)})")
    return "Measured the same way: " + "; ".join(parts) + "."


def replay_text(target: Target, workers: int, result: Mapping, never: float, fleet: str = "",
                same: Optional[tuple[int, int]] = None) -> tuple[str, str]:
    """``(kind, words)`` for the replay at ``workers`` that misses ``target`` (N - 1, or the cap): memory when it
    preempted or rejected (:func:`memory_text`); else prefill when TTFT misses and the queue wait at the target's
    percentile is under half the TTFT SLO (:func:`prefill_bound`: most of the tail is spent after scheduling);
    else queueing. ``fleet``: a P/D shape's split at that count (``3:2``, the closest to the target of the splits
    tried). ``same``: ``(a, b)`` when the replays at ``a`` and ``b`` workers were the same (the search stopped
    there, ``workers`` is ``b``): then more workers are not said to help."""
    misses = "; ".join(target.misses(result))
    at = _workers(workers) + (f" (split {fleet} P:D, the closest of the splits tried)" if fleet else "")
    wait = measured(result, "queue_wait_ms", "p99")
    more = (f"more workers do not help (the replays at {same[0]} and {same[1]} workers are the same)" if same
            else "more workers help")
    if result.get("preemptions", 0) or result.get("rejected", 0):
        kind, text = "memory", memory_text(at, result, target.misses(result), same)
    elif prefill_bound(target, result):
        kind, q = "prefill", target.percentile
        text = (f"prefill: at {at} {misses}, but the queue wait {q} is only {_ms(measured(result, 'queue_wait_ms', q))}: "
                "the TTFT tail is the prompts' own prefill, slowed by the other requests sharing its steps"
                f"{' (then the KV transfer and the first decode step)' if fleet else ''}; {more}"
                f"{'' if same else ' (fewer requests per step)'}, and so would a faster prefill (higher TP)")
    else:
        kind = "queueing"
        why = ("too many requests decode together on each worker; " if misses.startswith("TPOT") else "")
        text = f"queueing: at {at} {misses} ({why}queue wait p99 {_ms(wait)}); {more}"
    if never > 0:
        text += (f"; {_pct(never)} of requests can never meet the SLOs (their own prefill/decode alone), "
                 f"within the {_pct(target.allowed_miss)} allowed")
    return kind, text


def memory_text(at: str, result: Mapping, misses: Sequence[str], same: Optional[tuple[int, int]] = None) -> str:
    """The memory sentence for a replay (``at``: its worker count, in words; ``misses``: what of the target it
    misses, :meth:`Target.misses`) that preempted or rejected. A
    rejected request needs more blocks than one worker's whole pool (``input + output - 1`` tokens and the
    speculation's slots, :class:`dynlab.engine.worker.Worker`): more workers and a CPU tier do not help it, a
    larger pool per worker does. Preemptions alone: fewer requests per worker (more workers, unless ``same``
    says the replays at ``same`` workers were the same) helps too."""
    pre, rej, pool = result.get("preemptions", 0), result.get("rejected", 0), result.get("kv_blocks")
    said = f"{pre:,} preemption{'' if pre == 1 else 's'}" if pre else ""
    if not rej:
        text = f"memory: at {at} {said} (the pool of {pool:,} blocks per worker runs dry) and {'; '.join(misses)}; "
    else:
        rest = "; ".join(m for m in misses if "rejected" not in m)
        text = (f"memory: at {at} {said + ' and ' if said else ''}{rej:,} request(s) rejected (they never fit one "
                f"worker's pool of {pool:,} blocks){' and ' + rest if rest else ''}; ")
    if rej:
        return text + ("more workers and a CPU tier do not help the rejected requests; a larger pool per worker "
                       "(higher TP, less --gpu-memory-utilization lost, a smaller model) does")
    if same:
        return text + (f"more workers do not help (the replays at {same[0]} and {same[1]} workers are the same); "
                       "a larger pool (higher TP) or a CPU tier might")
    return text + "fewer requests per worker (more workers), a larger pool (higher TP) or a CPU tier helps"


def prefill_bound(target: Target, result: Mapping) -> bool:
    """Whether a replay that misses ``target`` without preempting misses it in the prefill rather than the
    queue: TTFT at the target's percentile is over its SLO, and the queue wait (arrival to first scheduled)
    at that percentile is under half the SLO. Then the time after scheduling (its prefill chunks, sharing
    steps with other requests) is over half the SLO and more than the wait: most of the tail, and what
    misses it. A wait of half the SLO or more is queueing (docs/plan.md's one-worker rows: 139 ms of a
    150 ms SLO). With per-class SLOs, every TTFT missed (the run's, a class's) must be so against the run's
    queue wait. Percentile targets only (a goodput miss does not say which SLO it misses)."""
    q = target.percentile
    wait = measured(result, "queue_wait_ms", q)
    if target.goodput is not None or wait is None:
        return False
    missed = [slo for _, figures, slo, _ in target.rows(result)
              if slo is not None and (measured(figures, "ttft_ms", q) or 0.0) > slo]
    return bool(missed) and all(2 * wait < slo for slo in missed)


def class_text(target: Target, result: Mapping, name: str) -> str:
    """``class chat binds (headroom -152.0%; batch 87.4%)``: the class :meth:`Target.binding_class` names for
    a replay, with its headroom and the other classes'."""
    rooms = target.rooms(result)
    others = "".join(f"; {k} {_room(v)}" for k, v in rooms.items() if k and k != name)
    return f"class {name} binds (headroom {_room(rooms.get(name))}{others})"


def _room(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1%}"


def _ms(value: Optional[float]) -> str:
    """``1,234.5 ms``, or ``-`` for a distribution with no sample (``null``: every request rejected)."""
    return "-" if value is None else f"{value:,.1f} ms"


def routing_text(target: Target, a: int, b: int, result: Mapping) -> str:
    """Why a shape's search stopped below the cap: the replays at ``a`` and ``b`` workers are the same."""
    misses = "; ".join(target.misses(result))
    wait = measured(result, "queue_wait_ms", "p99")
    return (f"routing: the replays at {a} and {b} workers are the same ({misses}; queue wait p99 {_ms(wait)}; "
            f"{idle_text(result, b)}): the strategy leaves the extra workers idle, "
            "so more workers do not help; a strategy that spreads the load does")


def idle(result: Mapping) -> bool:
    """Whether a replay left a worker without a request (``requests_per_worker`` has a 0), or, without that
    list, its load imbalance is over 1 (the busiest worker has more than its share)."""
    per = result.get("requests_per_worker")
    if isinstance(per, list) and per:
        return any(n == 0 for n in per)
    return (result.get("load_imbalance") or 0) > 1


def idle_text(result: Mapping, workers: int) -> str:
    """``10 of 18 workers received no request`` from a replay's ``requests_per_worker``, else its load imbalance."""
    per = result.get("requests_per_worker")
    if isinstance(per, list) and per:
        return f"{sum(1 for n in per if n == 0)} of {len(per)} workers received no request"
    return f"load imbalance {result.get('load_imbalance')} at {workers} workers"
