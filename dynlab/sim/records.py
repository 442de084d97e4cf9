"""Per-request records (``dynlab sim --requests-out FILE``): one JSON object per trace request, in trace order.

:class:`RequestRecorder` is an ordinary :class:`~dynlab.engine.metrics.Recorder`: it learns the worker
from ``on_route``, keeps each engine request from ``on_arrival`` and, in a P/D fleet, each transfer
from ``on_handoff``; :meth:`RequestRecorder.records` reads their fields after the run.

Keys, in this order (:data:`KEYS`, then :data:`PD_KEYS` in P/D runs); times in ms on the run's clock
(the first request's arrival is its trace timestamp times ``--time-scale``), unrounded:

- ``id``: the request's 0-based position in the trace (its line, counting request lines only);
- ``worker``: the worker the strategy routed it to (in a P/D run: its prefill worker); with
  ``--dp-attention`` also ``dp_rank`` after it, the worker's attention-DP rank (routing target ``worker x dp + dp_rank``);
- ``arrival_ms``, ``first_scheduled_ms`` (its first engine step), ``first_token_ms`` (the user's first
  token: in a P/D run the end of the decode worker's first step for it, after its KV arrived, as the
  run's ``ttft_ms``), ``finish_ms``;
- ``input_length``, ``output_length``: the trace's token counts;
- ``hit_tokens``: prompt tokens found in the prefix cache at its first admission (count-based runs:
  ``min(overlap blocks x block_tokens, input_length)``, the blocks its worker held when it was routed);
- ``preemptions``: times the engine preempted it (count-based: 0, that model has none);
- ``rejected``: the engine refused it (it can never fit its pool); its other fields stay ``null``;
- ``shed``, after ``rejected`` and only when true: the gateway's admission policy shed it (never routed:
  ``worker`` and the engine's fields ``null``; :mod:`dynlab.engine.gateway`);
- P/D runs: ``prefill_worker``, ``decode_worker`` (``null`` when it never went to one: one output
  token, or rejected), ``transfer_start_ms`` (the decode worker reserved its blocks: the transfer
  starts) and ``transfer_end_ms`` (its KV arrived there), so ``transfer_ms`` of the run's JSON is
  their difference; ``prefill_token_ms``: its first token on the prefill worker (the run's
  ``ttft_prefill_ms``; equal to ``first_token_ms`` for a request that never went to a decode worker).

- ``attrs``, last and only when the request has attributes (``Request.attrs``: the trace fields its
  format carries, such as ``priority``, ``tenant``, ``lora_name``): an object of them, in the row's order;
  a trace without attributes gives records without the key.

Count-based runs (no ``--timing``) have no clock: every time field is ``null``.
"""
from __future__ import annotations

import json
from typing import Iterator, Optional

from dynlab.engine.metrics import Recorder, RunInfo

#: the keys of every record, in order
KEYS = ("id", "worker", "arrival_ms", "first_scheduled_ms", "first_token_ms", "finish_ms", "input_length",
        "output_length", "hit_tokens", "preemptions", "rejected")
#: the keys P/D runs add, in order
PD_KEYS = ("prefill_worker", "decode_worker", "transfer_start_ms", "transfer_end_ms", "prefill_token_ms")


class RequestRecorder(Recorder):
    """Collects one record per request (module docstring); adds no key to the run's JSON."""

    def __init__(self) -> None:
        self.info = RunInfo(timed=False, pd=False, block_tokens=1)
        self._routes: dict = {}  # request index -> (worker, input_length, output_length, overlap blocks, attrs)
        self._engine: dict = {}  # request index -> its EngineRequest (timed runs)
        self._transfers: dict = {}  # request index -> TransferRecord (P/D runs)
        self._shed: set = set()  # indices of the requests the gateway shed

    def on_run(self, info: RunInfo) -> None:
        self.info = info

    def on_route(self, request, worker: int, predicted: Optional[int], actual: int, cap: Optional[int]) -> None:
        self._routes[request.index] = (worker, request.input_length, request.output_length, actual, request.attrs)

    def on_arrival(self, req, t: float) -> None:
        self._engine[req.id] = req

    def on_requeue(self, req, t: float) -> None:
        """A killed worker's request went back through the router (:mod:`dynlab.engine.elastic`): its new one."""
        self._engine[req.id] = req

    def on_shed(self, req) -> None:
        self._routes[req.id] = (None, req.input_length, req.output_length, 0, req.attrs)
        self._shed.add(req.id)

    def on_handoff(self, record) -> None:
        self._transfers[record.request.id] = record

    def records(self) -> Iterator[dict]:
        """The records, in trace order (module docstring)."""
        info = self.info
        for index in sorted(self._routes):
            worker, n_in, n_out, overlap, attrs = self._routes[index]
            ereq = self._engine.get(index)
            if ereq is None:  # count-based
                rec = {"id": index, "worker": worker, "arrival_ms": None, "first_scheduled_ms": None,
                       "first_token_ms": None, "finish_ms": None, "input_length": n_in, "output_length": n_out,
                       "hit_tokens": min(overlap * info.block_tokens, n_in), "preemptions": 0, "rejected": False}
            else:
                rec = {"id": index, "worker": worker, "arrival_ms": ereq.arrival_ms,
                       "first_scheduled_ms": ereq.first_scheduled_ms, "first_token_ms": ereq.first_token_ms,
                       "finish_ms": ereq.finish_ms, "input_length": n_in, "output_length": n_out,
                       "hit_tokens": ereq.hit_tokens, "preemptions": ereq.preemptions, "rejected": ereq.rejected}
            if info.pd:
                tr = self._transfers.get(index)
                rec.update({"prefill_worker": worker, "decode_worker": None if tr is None else tr.decode,
                            "transfer_start_ms": None if tr is None else tr.reserved,
                            "transfer_end_ms": None if tr is None else tr.arrived,
                            "prefill_token_ms": rec["first_token_ms"] if tr is None else tr.prefill_done})
            if info.dp > 1 and worker is not None:  # the target's (worker, rank), as Dynamo keys its workers
                w, r = divmod(worker, info.dp)
                rec = {"id": index, "worker": w, "dp_rank": r, **{k: v for k, v in rec.items() if k not in ("id", "worker")}}
            if index in self._shed:
                rec["shed"] = True
            if attrs:
                rec["attrs"] = dict(attrs)
            yield rec

    def jsonl(self) -> str:
        """:meth:`records` as JSON lines (one object per line, ``json.dumps`` default separators)."""
        return "".join(json.dumps(rec) + "\n" for rec in self.records())
