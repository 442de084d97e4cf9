"""A request inside one engine and its state (vLLM v1's ``Request``, ``vllm/v1/request.py``).

The state the scheduler and the KV cache manager read and write: the prompt (``input_length``
tokens, the names of its full blocks), the tokens computed (in the KV cache) and generated, the
blocks it holds (``keys``: the one full-attention KV cache group's blocks, in sequence order; a
layout with more KV cache groups gives each group its list), and its timestamps (ms).

:data:`DECODE_TOKENS` is the one place that says how many tokens a decode step computes and
emits per request (1; speculative decoding makes it ``1 + K``, with ``K`` lookahead slots).
"""
from __future__ import annotations

from typing import Optional, Sequence

from dynlab.kv.run_pool import expand
from dynlab.routing.strategy import NO_ATTRS

__all__ = ["EngineRequest", "DECODE_TOKENS", "peak_tokens"]

#: tokens a decode step computes (its KV) and emits per request: 1. Everything that counts decode
#: tokens (the batch's decodes, a bulk run's length and block boundaries, a finish's emitted
#: token, a P/D reservation's next token) reads it here (speculative decoding: ``1 + K``).
DECODE_TOKENS = 1


def peak_tokens(req, spec=None) -> int:
    """Tokens of KV ``req`` (an :class:`EngineRequest`) holds at most on one engine: ``input_length +
    output_length - 1`` (the last token's KV is never computed), plus, with speculative decoding
    (``spec``, a :class:`~dynlab.engine.spec.SpecDecoding`), a last verify's ``K`` drafts and
    ``lookahead`` slots. A pool whose blocks cannot hold them can never serve it: the engine's
    :meth:`~dynlab.engine.worker.EngineWorker.submit` rejects it, and a P/D fleet rejects a request
    its decode pool can never hold (:mod:`dynlab.disagg.fleet`)."""
    spare = 0 if spec is None else spec.k + spec.lookahead
    return req.input_length + req.output_length - 1 + spare


class EngineRequest:
    """A request inside an engine: its identity and lengths, its progress, its metrics.

    Given: ``id`` (any, for the caller), ``arrival_ms``, ``input_length`` (prompt tokens, >= 1),
    ``output_length`` (tokens to generate, >= 1), ``names`` (the names of its full prompt
    blocks at the engine's block size, ``input_length // block`` ints >= 0, from
    :func:`dynlab.engine.names.engine_block_names`; distinct within a request), ``runs`` (optional: the
    same names as runs ``(first name, count)``, from :func:`dynlab.engine.names.engine_block_runs`,
    which a worker with ``runs=True`` works on; ``None``: one run per name). ``out_blocks`` (set after
    construction, default 0): how many of ``names`` follow the prompt's, the names of its reply's full
    blocks a trace's ``output_tokens`` give (:mod:`dynlab.traces.replies`), registered as they are
    computed, like the prompt's, so another request can hit them. ``attrs`` (set after construction,
    default the shared empty ``NO_ATTRS``): the request's attributes (``Request.attrs``: ``priority``,
    ``tenant``, ...), a read-only mapping for recorders and queue policies.

    ``n_names``: ``len(names)`` (read-only; the same while the names are dropped), what the scheduler
    reads each step to know whether a request has names left to register.

    Progress (read-only for callers): ``num_tokens``, ``computed``, ``generated``; ``spec``: draft
    tokens it carries into its next step (speculative decoding, :mod:`dynlab.engine.spec`; 0 otherwise);
    ``pending``, ``inflight``, ``safe``: async scheduling's state (:mod:`dynlab.engine.async_steps`; 0 otherwise).
    Metrics (``None`` until known): ``hit_tokens``, ``first_scheduled_ms``, ``first_token_ms``,
    ``finish_ms``; ``preemptions`` (int); ``rejected`` (bool).
    """

    __slots__ = ("id", "arrival_ms", "input_length", "output_length", "_names", "runs", "seq",
                 "num_tokens", "computed", "generated", "keys", "nreg",
                 "hit_tokens", "first_scheduled_ms", "first_token_ms", "finish_ms",
                 "preemptions", "rejected", "ready_ms", "load_blocks", "cpu_hit_blocks", "spec", "spec_state",
                 "pending", "inflight", "safe", "out_blocks", "n_names", "attrs")

    def __init__(self, id, arrival_ms: float, input_length: int, output_length: int, names: Sequence[int],
                 runs: Optional[Sequence[tuple]] = None):
        if input_length < 1:
            raise ValueError(f"request {id!r}: input_length must be >= 1, got {input_length}")
        if output_length < 1:
            raise ValueError(f"request {id!r}: output_length must be >= 1 (a request generates a token), "
                             f"got {output_length}")
        self.id = id
        self.arrival_ms = arrival_ms
        self.input_length = input_length
        self.output_length = output_length
        self._names = names
        self.n_names = len(names)  # len(names), kept while the names are dropped (read on every step)
        self.runs = runs
        self.seq = None  # names as the pool takes them (BlockPool.sequence), set by the worker
        self.num_tokens = input_length
        self.computed = 0
        self.generated = 0
        self.keys: list = []  # the pool keys of its blocks, in sequence order
        self.nreg = 0  # leading full prompt blocks already hit or registered
        self.hit_tokens: Optional[int] = None
        self.first_scheduled_ms: Optional[float] = None
        self.first_token_ms: Optional[float] = None
        self.finish_ms: Optional[float] = None
        self.preemptions = 0
        self.rejected = False
        self.ready_ms = 0.0  # while its CPU hits load: when they have arrived (ms)
        self.load_blocks = 0  # while its CPU hits load: how many
        self.cpu_hit_blocks: Optional[int] = None  # of its first admission's hit, blocks found in the CPU tier
        self.spec = 0  # speculative decoding: draft tokens it carries into its next step (vLLM's spec_token_ids)
        self.spec_state = None  # the acceptance model's state for it (dynlab.engine.spec.Acceptance)
        # async scheduling (dynlab.engine.async_steps): tokens sampled in flight, steps in flight holding it,
        # and the computed tokens whose blocks vLLM has hashed while a step is in flight
        self.pending = self.inflight = self.safe = 0
        self.out_blocks = 0  # names past the prompt's: its reply's blocks, named by the trace (output_tokens)
        self.attrs = NO_ATTRS  # the request's attributes (Request.attrs), set by the fleet

    @property
    def names(self) -> Sequence[int]:
        """The names of its full prompt blocks, in prefix order; expanded from :attr:`runs` again after
        :meth:`drop_names` (the same list of ints)."""
        names = self._names
        if names is None:
            seq = self.seq  # its pool sequence (a Runs of the same runs): one expansion, one list for both
            if seq is not None and getattr(seq, "runs", None) is self.runs:
                names = self._names = seq.names
            else:
                names = self._names = expand(self.runs)
        return names

    @names.setter
    def names(self, value: Sequence[int]) -> None:
        self._names = value
        self.n_names = len(value)

    def drop_names(self) -> None:
        """Keep the names only as :attr:`runs` (and its pool sequence's runs) until next read: a waiting
        request's memory (issue 28: ~770 ints, ~28 KB, a request of the bundled trace). No-op without runs."""
        if self.runs is not None:
            self._names = None
            drop = getattr(self.seq, "drop_names", None)
            if drop is not None:
                drop()

    @property
    def queue_wait_ms(self) -> Optional[float]:
        """First scheduled minus arrival (ms), ``None`` before it is scheduled."""
        return None if self.first_scheduled_ms is None else self.first_scheduled_ms - self.arrival_ms

    def __repr__(self):
        return (f"EngineRequest({self.id!r}, arrival={self.arrival_ms}, in={self.input_length}, "
                f"out={self.output_length}, computed={self.computed}/{self.num_tokens})")
