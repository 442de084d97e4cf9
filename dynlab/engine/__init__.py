"""The replay engine: requests -> a strategy -> simulated workers -> KV events -> metrics.

- :mod:`~dynlab.engine.config`: :class:`SimConfig`, every option of ``dynlab sim``, and its validation;
- :mod:`~dynlab.engine.run`: :func:`run` (one simulation, the JSON ``dynlab sim`` prints),
  :func:`replay` (the event loop over given requests, strategy and workers) and their helpers;
- :mod:`~dynlab.engine.counted`: the count-based :class:`Worker` (no time);
- :mod:`~dynlab.engine.timed`, :mod:`~dynlab.engine.worker`: the timed serving engine (``--timing``).

The function :func:`~dynlab.engine.run.run` is not re-exported here, where it would hide its own
module ``dynlab.engine.run``; it is ``dynlab.run``.
"""
from dynlab.engine.config import SimConfig
from dynlab.engine.run import StrategyError, replay

__all__ = ["SimConfig", "replay", "StrategyError"]
