"""The ``last-worker`` strategy, registered through the ``dynlab`` entry-point group."""
from __future__ import annotations

from dynlab import hookimpl
from dynlab.routing.strategy import Strategy


class LastWorker(Strategy):
    """Always the highest-numbered worker (an example third-party strategy)."""

    name = "last-worker"

    def route(self, request, fleet):
        return fleet.workers - 1


@hookimpl
def dynlab_register_strategies(register):
    register(LastWorker)
