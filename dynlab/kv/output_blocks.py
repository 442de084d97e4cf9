"""Blocks of generated tokens: named per request so a preempted request hits them on resume (issue 24 rule 3).

vLLM 0.33.0 hashes every full block of a request, output tokens included, and a resumed request's
prefix lookup (capped at ``num_tokens - 1`` tokens) runs over them.

A token trace that gives a row's reply token ids (``output_tokens``, :mod:`dynlab.traces.replies`)
names those blocks itself: the engine request's ``names`` run on past the prompt's
(``req.out_blocks`` more), and they are registered and published (``BlockStored``) as they are
computed, like prompt blocks, so a conversation's next turn hits its previous reply as in vLLM;
:func:`name_reply` registers those a bulk decode run completed at its end.

A request without them: such a block can only ever be hit by the request that computed it: it gets a name of
that request's own, from :data:`OUTPUT_NAMES` up (one counter per
:class:`~dynlab.kv.cache_manager.KvCacheManager`, so a run is deterministic). These names are never
published as KV events (no router could match them): :func:`published` drops them from a step's
stored and removed names. vLLM names them when the step computing them is scheduled; here they are
named when a preemption frees them (they are in use until then). A finish names none: no one can hit
them again, so :meth:`~dynlab.kv.block_pool.BlockPool.release` puts them at the tail as unnamed blocks
(``out``), the queue place vLLM's hashed blocks take, with nothing to register or leave out of events.

Requests are duck-typed (``names``, ``runs``, ``seq``, ``keys``, ``nreg``, ``computed``, ``out_blocks``,
``input_length``, ``load_blocks``).
"""
from __future__ import annotations

from typing import Optional

from dynlab.groups import GROUP_LOW, GROUP_SHIFT, GROUP_SIZE

__all__ = ["OUTPUT_NAMES", "name_output", "name_reply", "published"]

#: the first name of a block of generated tokens: above any trace-derived name (64-bit trace ids x 1024
#: + offset < 2**74), so the two never meet
OUTPUT_NAMES = 1 << 80
_OUTPUT_GROUP = OUTPUT_NAMES >> GROUP_SHIFT  # the run pool's group (dynlab.groups) of the first output name


def name_output(kv, req) -> None:
    """Name the full blocks of ``req``'s generated tokens it holds on ``kv`` (a ``KvCacheManager``):
    the computed tokens' full blocks beyond ``len(req.names)``, each a new name (``kv.next_output_name``
    up), appended to ``req.names`` (and ``req.runs``) and registered in the pool, without
    a ``BlockStored``. Nothing when they are named already or the prompt is not all registered."""
    full = min(req.computed // kv.block, len(req.keys))
    have = len(req.names)
    if full <= have:
        return
    first = kv.next_output_name
    kv.next_output_name += full - have
    new = list(range(first, first + full - have))
    req.names = list(req.names) + new
    if req.runs is not None:  # consecutive names: one run per group (GROUP_SIZE names) they fall in
        req.runs = list(req.runs) + _runs(first, full - have)
    req.seq = None
    seq = kv.sequence(req)
    if req.nreg < have:
        return
    pool = kv.pool
    stored = len(pool.stored)
    runs = len(pool.stored_runs) if kv.runs else 0
    pool.register(req.keys, seq, req.nreg, full)
    del pool.stored[stored:]
    if kv.runs:
        del pool.stored_runs[runs:]
    req.nreg = full


def name_reply(kv, req) -> None:
    """Register on ``kv``, before ``req`` frees them, the computed full blocks of its reply that the trace
    names (``req.out_blocks`` of ``req.names``, :mod:`dynlab.traces.replies`) and no scheduled step
    registered yet: those a bulk decode run completed (vLLM caches each when the step computing it
    is scheduled; they were in use meanwhile, so no lookup could have hit them): at the run's end
    (``kv.finish_stored(sched)``), or when the request frees them. Their names are published as
    ``BlockStored`` in that step's result (a finish, a run's end) or events (a preemption). Nothing before
    the prompt is computed or while a load is pending."""
    full = kv.nameable(req, req.computed)
    if full <= req.nreg or req.computed < req.input_length or req.load_blocks:
        return
    pool = kv.pool
    before = len(pool.stored)
    pool.register(req.keys, kv.sequence(req), req.nreg, full)
    req.nreg = full
    kv._late.extend(pool.stored[before:])


def _runs(first: int, n: int) -> list:
    """The names ``first .. first + n - 1`` as ``(first, count)`` runs, none crossing a group of
    ``GROUP_SIZE`` names (:mod:`dynlab.groups`)."""
    out = []
    while n:
        c = min(n, GROUP_SIZE - (first & GROUP_LOW))
        out.append((first, c))
        first += c
        n -= c
    return out


def published(kv, names: list, runs: Optional[list] = None) -> list:
    """``names`` (a pool's stored or removed list, changed in place) without the names of generated
    tokens' blocks, and ``runs`` (its ``(group, mask)`` runs, or ``None``) likewise; returns ``names``.
    A no-op (one comparison) until ``kv`` has named such a block."""
    if names and kv.next_output_name != OUTPUT_NAMES and max(names) >= OUTPUT_NAMES:
        names[:] = [name for name in names if name < OUTPUT_NAMES]
        if runs is not None:
            runs[:] = [run for run in runs if run[0] < _OUTPUT_GROUP]
    return names
