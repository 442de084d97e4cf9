"""The hooks that dynlab plugins implement.

A plugin is any module or object registered with dynlab's pluggy manager,
normally through the ``dynlab`` entry-point group of its distribution::

    [project.entry-points.dynlab]
    my_plugin = "my_package.my_module"

and implements one or more of the hooks below with ``@dynlab.hookimpl``.
Each hook receives a ``register`` callback; call it once per class.
"""
from __future__ import annotations

import pluggy

PROJECT = "dynlab"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def dynlab_register_strategies(register):
    """Register routing strategies: ``register(StrategySubclass)``.

    The class must subclass :class:`dynlab.routing.strategy.Strategy` and set a
    non-empty class attribute ``name`` (the ``--mode`` value).
    """


@hookspec
def dynlab_register_eviction_policies(register):
    """Register cache eviction policies: ``register(EvictionPolicySubclass)``.

    The class must subclass :class:`dynlab.kv.policies.EvictionPolicy` and set a
    non-empty class attribute ``name`` (the ``--policy`` value).
    """


@hookspec
def dynlab_register_trace_formats(register):
    """Register trace readers: ``register(TraceFormatSubclass)``.

    The class must subclass :class:`dynlab.traces.format.TraceFormat` and set a
    non-empty class attribute ``name`` (the ``--trace-format`` value).
    """


@hookspec
def dynlab_register_latency_models(register):
    """Register step-latency models: ``register(LatencyModelSubclass)``.

    The class must subclass :class:`dynlab.latency.base.LatencyModel` and set a
    non-empty class attribute ``name`` (the ``--latency-model`` value).
    """


@hookspec
def dynlab_register_scorers(register):
    """Register scorers of the ``weighted`` strategy: ``register(ScorerSubclass)``.

    The class must subclass :class:`dynlab.routing.scorer.Scorer` and set a non-empty
    class attribute ``name`` (the name in ``--opt scorers=NAME:WEIGHT,...``).
    """


@hookspec
def dynlab_register_engine_kinds(register):
    """Register engine kinds of the timed fleet: ``register(EngineKindSubclass)``.

    The class must subclass :class:`dynlab.engine.kinds.EngineKind` and set a non-empty class
    attribute ``name`` (the ``--engine`` value).
    """


@hookspec
def dynlab_register_queue_policies(register):
    """Register queue policies of the timed engine: ``register(QueuePolicySubclass)``.

    The class must subclass :class:`dynlab.engine.queues.QueuePolicy` and set a non-empty class
    attribute ``name`` (the ``--queue-policy`` value).
    """


@hookspec
def dynlab_register_admission_policies(register):
    """Register admission policies of the gateway: ``register(AdmissionPolicySubclass)``.

    The class must subclass :class:`dynlab.engine.gateway.AdmissionPolicy` and set a non-empty class
    attribute ``name`` (the ``--admission-policy`` value).
    """


@hookspec
def dynlab_register_controllers(register):
    """Register controllers of elastic fleets: ``register(ControllerSubclass)``.

    The class must subclass :class:`dynlab.engine.controller.Controller` and set a non-empty class
    attribute ``name`` (the ``--controller`` value).
    """


@hookspec
def dynlab_register_workloads(register):
    """Register workload generators: ``register(WorkloadSubclass)``.

    The class must subclass :class:`dynlab.traces.workload.Workload` and set a non-empty class
    attribute ``name`` (the ``generator`` key of a workload spec, docs/workloads.md).
    """
