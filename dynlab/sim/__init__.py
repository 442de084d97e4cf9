"""The run layer: builds and runs a topology above :mod:`dynlab.engine` and :mod:`dynlab.disagg`.

- :mod:`~dynlab.sim.runner`: :func:`run` (one :class:`~dynlab.engine.config.SimConfig` -> the JSON
  ``dynlab sim`` prints; also ``dynlab.run``);
- :mod:`~dynlab.sim.drive`: the :class:`~dynlab.sim.drive.Topology` protocol, :func:`~dynlab.sim.drive.serve`
  (every run's one path) and the count-based topology :class:`~dynlab.sim.drive.CountBased`;
- :mod:`~dynlab.sim.topology`: the aggregated and P/D topologies (timed);
- :mod:`~dynlab.sim.records`: :class:`~dynlab.sim.records.RequestRecorder`, the per-request records
  (``--requests-out``).

Nothing below (engine/, disagg/, kv/, latency/) imports this package.
"""
from dynlab.sim.runner import run

__all__ = ["run"]
