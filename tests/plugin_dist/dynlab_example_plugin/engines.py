"""The ``one-at-a-time`` engine kind, registered through the ``dynlab`` entry-point group."""
from __future__ import annotations

from dynlab import hookimpl
from dynlab.engine.kinds import EngineKind
from dynlab.engine.worker import EngineWorker


class OneAtATime(EngineKind):
    """vLLM's engine serving one request at a time (an example third-party engine kind)."""

    name = "one-at-a-time"

    def build(self, setup, worker_id, *, handoff=False, decode=False):
        c = setup.config
        if c.async_scheduling or setup.cpu_capacity:
            raise ValueError("one-at-a-time: no --async-scheduling or CPU tier")
        return EngineWorker(worker_id, setup.capacity, c.block, setup.latency, max_num_seqs=1,
                            max_num_batched_tokens=c.max_num_batched_tokens, handoff=handoff,
                            kv_layout=setup.kv_layout, admission=c.admission)


@hookimpl
def dynlab_register_engine_kinds(register):
    register(OneAtATime)
