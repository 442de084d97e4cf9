"""A run's timeline (``dynlab sim --timing --timeline FILE.json``): :class:`TimelineRecorder`, the
:class:`~dynlab.engine.metrics.Recorder` whose ``steps``, :meth:`records` and ``events`` the CLI hands to
:func:`dynlab.report.timeline.write_timeline` (the report layer, above this one, imports nothing of it).

It is a :class:`~dynlab.sim.records.RequestRecorder` (its per-request records are the timeline's requests)
that also keeps, from ``on_step(worker, result)``:

- a **step** per engine step or bulk decode run: ``worker``, ``start_ms``, ``end_ms`` (the
  :class:`~dynlab.engine.bulk.StepResult`'s ``start`` and ``end``), ``prefill_tokens``, ``decodes``
  (``decode_requests``: decodes per iteration), ``preemptions`` (``preempted``), and in its args ``steps``
  (iterations covered, > 1 for a bulk run), ``batch_size`` and ``kv_blocks_used`` (``used_blocks``);
- the **KV events** that step published: ``BlockRemoved`` (GPU) at its start when it evicted blocks,
  ``BlockStored`` (GPU) at its end when it computed blocks, and with ``--cpu-write compute`` the CPU tier's
  ``BlockRemoved`` / ``BlockStored`` (medium ``CPU``) at its end; ``blocks`` is how many. Their time is
  when the worker published them plus ``event_delay_ms`` (when the router received them; an event
  ``--event-loss`` dropped is still shown). A bulk run's block boundaries evict at their own times
  inside the run: they are shown at the run's start, counted together. With ``--dp-attention`` each KV
  event also has ``dp_rank`` (the rank that published it, as its :mod:`dynlab.routing.events` event carries;
  ``worker`` stays the routing target, ``worker id x dp + dp_rank``).

Timed runs only: a count-based run has no clock (the CLI refuses ``--timeline`` without ``--timing``).
Memory: one small dict per step and per event for the whole run (the writer keeps those up to the last kept
request's end).
"""
from __future__ import annotations

from dynlab.sim.records import RequestRecorder


class TimelineRecorder(RequestRecorder):
    """Collects a run's steps, KV events and requests (module docstring); adds no key to the run's JSON.

    ``event_delay_ms``: the bus's delay (``--event-delay-ms``, ms), added to the KV events' times."""

    def __init__(self, event_delay_ms: float = 0.0) -> None:
        super().__init__()
        self.event_delay_ms = event_delay_ms
        self.steps: list[dict] = []
        self.events: list[dict] = []

    def on_step(self, worker: int, result) -> None:
        self.steps.append({"worker": worker, "start_ms": result.start, "end_ms": result.end,
                           "prefill_tokens": result.prefill_tokens, "decodes": result.decode_requests,
                           "preemptions": result.preempted, "steps": result.steps,
                           "batch_size": result.batch_size, "kv_blocks_used": result.used_blocks})
        dp = self.info.dp
        rank = {"dp_rank": worker % dp} if dp > 1 else {}  # the rank's events carry it (dynlab.engine.lockstep)
        delay = self.event_delay_ms
        for t, kind, blocks, medium in ((result.start, "BlockRemoved", result.removed, "GPU"),
                                        (result.end, "BlockStored", result.stored, "GPU"),
                                        (result.end, "BlockRemoved", result.cpu_removed, "CPU"),
                                        (result.end, "BlockStored", result.cpu_stored, "CPU")):
            if blocks:
                self.events.append({"worker": worker, "time_ms": t + delay, "kind": kind, "blocks": len(blocks),
                                    "medium": medium, **rank})
