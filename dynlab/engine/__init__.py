"""The replay engine: requests -> a strategy -> simulated workers -> KV events -> metrics.

- :mod:`~dynlab.engine.config`: :class:`SimConfig`, every option of ``dynlab sim``, and its validation;
- :mod:`~dynlab.engine.run`: the count-based fleet (:class:`~dynlab.engine.run.CountedFleet`, run by the
  run layer's count-based topology: :func:`dynlab.sim.drive.replay` on hand-made workers),
  :func:`~dynlab.engine.run.build_strategy`, :func:`~dynlab.engine.run.make_workers`;
- :mod:`~dynlab.engine.counted`: the count-based :class:`Worker` (no time);
- :mod:`~dynlab.engine.timed`, :mod:`~dynlab.engine.worker`: the timed serving engine (``--timing``);
- :mod:`~dynlab.engine.env`: the run environment; :mod:`~dynlab.engine.metrics`: the recorders and the result builder.

The run of one configuration (``dynlab.run``) is the run layer's, above this package: :mod:`dynlab.sim`.
"""
from dynlab.engine.config import SimConfig
from dynlab.engine.run import StrategyError

__all__ = ["SimConfig", "StrategyError"]
