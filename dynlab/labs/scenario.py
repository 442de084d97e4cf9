"""Document scenarios: long documents re-read through a (GPU, optionally CPU) KV cache, and capacity sweeps.

The seed lab (``shared/seeds/002``, steps 2-7) models a serving engine that keeps each long
document's KV cache for reuse across questions: documents ``0 .. docs-1``, each ``tokens``
tokens of KV, read in passes (``fwd``: 0 first, ``rev``: docs-1 first) through one cache that
is never emptied between passes. Capacities and sizes are in tokens. The defaults are the seed
lab's: a 21,520-token GPU cache (about 4.3 documents), 10 documents of 5,011 tokens, passes
``fwd,fwd,rev``, no CPU tier. The CPU tier (``cpu > 0``) is the offload idea of LMCache and
vLLM's CPU KV offloading (see :class:`dynlab.kv.tiers.TwoTierCache`).

:func:`run_scenario` gives the seed's JSON object; :func:`cliff` sweeps one capacity and reports
one number of the last pass per capacity (the seed's steps 4 and 7).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

from dynlab.kv.policies import EvictionPolicy, FutureIndex
from dynlab.kv.tiers import TwoTierCache
from dynlab.limits import check_doc_reads

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_CPU",
    "DEFAULT_DOCS",
    "DEFAULT_TOKENS",
    "DEFAULT_PASSES",
    "PASS_ORDERS",
    "METRICS",
    "pass_docs",
    "access_sequence",
    "resolve_policy",
    "run_scenario",
    "cliff",
]

# The seed lab's defaults (shared/seeds/002, step 2 and step 6).
DEFAULT_GPU = 21520  # tokens of GPU KV space
DEFAULT_CPU = 0  # tokens of CPU KV space (0: no CPU tier)
DEFAULT_DOCS = 10
DEFAULT_TOKENS = 5011  # tokens of KV per document
DEFAULT_PASSES = ("fwd", "fwd", "rev")

#: Pass orders: ``fwd`` reads documents 0..docs-1, ``rev`` reads docs-1..0.
PASS_ORDERS = ("fwd", "rev")
#: Per-pass numbers :func:`cliff` can report (``hits`` = ``gpu_hits + cpu_hits``).
METRICS = ("hits", "misses", "gpu_hits", "cpu_hits")

PolicyArg = Union[str, type, None]


def _check_non_negative(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def pass_docs(order: str, docs: int) -> list[int]:
    """The document ids one pass reads, in reading order: ``fwd`` -> ``0..docs-1``, ``rev`` -> reversed.

    Raises ``ValueError`` on any other order (naming the valid ones).
    """
    if order == "fwd":
        return list(range(docs))
    if order == "rev":
        return list(range(docs - 1, -1, -1))
    raise ValueError(f"unknown pass order {order!r}; use one of: {', '.join(PASS_ORDERS)}")


def access_sequence(docs: int, passes: Sequence[str]) -> list[int]:
    """Every document read of the scenario, all passes concatenated (the ``future`` of ``opt``)."""
    out: list[int] = []
    for order in passes:
        out.extend(pass_docs(order, docs))
    return out


def resolve_policy(policy: PolicyArg) -> type:
    """A policy class from a registered name (``None`` -> ``"lru"``) or an :class:`EvictionPolicy` subclass.

    Raises :class:`dynlab.plugins.UnknownNameError` (listing the registered names) for an unknown
    name and ``TypeError`` for anything that is not an eviction-policy class.
    """
    if policy is None:
        policy = "lru"
    if isinstance(policy, str):
        from dynlab.plugins import eviction_policies

        return eviction_policies().get(policy)
    if isinstance(policy, type) and issubclass(policy, EvictionPolicy):
        return policy
    raise TypeError(f"policy must be a registered name or an EvictionPolicy subclass, got {policy!r}")


def run_scenario(
    gpu: int = DEFAULT_GPU,
    docs: int = DEFAULT_DOCS,
    tokens: int = DEFAULT_TOKENS,
    passes: Sequence[str] = DEFAULT_PASSES,
    cpu: int = DEFAULT_CPU,
    policy: PolicyArg = None,
    progress=None,
) -> dict:
    """Read the documents pass after pass through one two-tier cache; count hits per pass.

    ``gpu`` and ``cpu`` are capacities in tokens (``cpu=0``: GPU only, exactly the seed's single
    LRU cache), ``docs`` documents of ``tokens`` tokens each, ``passes`` a sequence of ``"fwd"`` /
    ``"rev"``, ``policy`` a registered policy name or class used by both tiers (default ``lru``,
    the seed's; ``opt`` is given the whole access sequence).

    Returns ``{"passes": [{"order", "gpu_hits", "cpu_hits", "misses", "hit_docs"}, ...]}``, one
    object per pass in order, ``hit_docs`` the documents hit on either tier in reading order.
    With the defaults the third pass hits ``[9, 8, 7, 6]`` on the GPU.

    ``progress``: an object with ``update(n)`` (a tqdm bar) told of every document read, or ``None``.

    Raises ``ValueError`` on a negative number, ``docs`` or ``tokens`` 0 (nothing to read, or no KV to
    cache: the capacities may be 0, a tier with no room), an unknown pass order, more document reads
    (``docs * len(passes)``) than :data:`dynlab.limits.MAX_DOC_READS`, ``TypeError`` on a
    non-integer, :class:`dynlab.plugins.UnknownNameError` on an unknown policy name.
    """
    for name, value in (("gpu", gpu), ("docs", docs), ("tokens", tokens), ("cpu", cpu)):
        _check_non_negative(name, value)
    for name, value, why in (("docs", docs, "a run of no documents reads nothing"),
                             ("tokens", tokens, "a document of 0 tokens has no KV to cache")):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}: {why}")
    passes = list(passes)
    check_doc_reads(docs, passes)
    future = FutureIndex(access_sequence(docs, passes))  # also validates the pass orders
    cache = TwoTierCache(gpu, cpu, policy=resolve_policy(policy), future=future)
    out = []
    for order in passes:
        counts = {"gpu": 0, "cpu": 0, "miss": 0}
        hit_docs = []
        for doc in pass_docs(order, docs):
            where = cache.access(doc, tokens)
            if progress is not None:
                progress.update(1)
            counts[where] += 1
            if where != "miss":
                hit_docs.append(doc)
        out.append(
            {
                "order": order,
                "gpu_hits": counts["gpu"],
                "cpu_hits": counts["cpu"],
                "misses": counts["miss"],
                "hit_docs": hit_docs,
            }
        )
    return {"passes": out}


def _metric(last_pass: dict, metric: str) -> int:
    if metric == "hits":
        return last_pass["gpu_hits"] + last_pass["cpu_hits"]
    return last_pass[metric]


def cliff(
    capacities: Sequence[int],
    over: str = "gpu",
    metric: str = "hits",
    labels: Optional[Sequence[str]] = None,
    **scenario,
) -> dict[str, int]:
    """Run :func:`run_scenario` once per capacity of one tier; report one number of the last pass.

    ``capacities`` (tokens) replace ``gpu`` (``over="gpu"``) or ``cpu`` (``over="cpu"``); the
    other keyword arguments are :func:`run_scenario`'s. ``metric`` is one of :data:`METRICS`
    (``hits`` = GPU + CPU hits). Returns ``{label: value}`` in the order given, where ``labels``
    are the keys (the capacities as the user wrote them; default ``str(capacity)``).

    The seed's step 4: ``cliff([21520, 30000, 40000, 45000, 50109, 50110], passes=["fwd", "fwd"])``
    -> every value 0 but ``"50110": 10``: a cyclic read hits nothing under LRU until all ten
    documents (50,110 tokens) fit. Step 7 (``over="cpu"``, ``metric="misses"``, GPU 21520) shows
    the CPU tier needs room for every document too. A ``progress`` keyword (see :func:`run_scenario`)
    is told of every read of every run.

    Raises ``ValueError`` on an unknown ``over`` or ``metric``, labels of the wrong length, or any
    error of :func:`run_scenario`.
    """
    if over not in ("gpu", "cpu"):
        raise ValueError(f"unknown tier {over!r}; use gpu or cpu")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; use one of: {', '.join(METRICS)}")
    capacities = list(capacities)
    labels = [str(c) for c in capacities] if labels is None else list(labels)
    if len(labels) != len(capacities):
        raise ValueError(f"{len(labels)} labels for {len(capacities)} capacities")
    if not list(scenario.get("passes", DEFAULT_PASSES)):
        raise ValueError("at least one pass is needed: the metric is read from the last pass")
    if over in scenario:
        raise TypeError(f"{over!r} is swept: give it as capacities, not as a keyword")
    out: dict[str, int] = {}
    for label, capacity in zip(labels, capacities):
        result = run_scenario(**{over: capacity}, **scenario)
        out[label] = _metric(result["passes"][-1], metric)
    return out
