"""The ``highest-index`` scorer, registered through the ``dynlab`` entry-point group."""
from __future__ import annotations

from dynlab import hookimpl
from dynlab.routing.scorer import Scorer


class HighestIndex(Scorer):
    """Prefers higher-numbered workers: worker w scores w (an example third-party scorer)."""

    name = "highest-index"

    def score(self, request, fleet, index):
        return [float(w) for w in range(fleet.workers)]


@hookimpl
def dynlab_register_scorers(register):
    register(HighestIndex)
