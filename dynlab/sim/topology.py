"""The timed topologies: how a timed run's engines are arranged and driven (an aggregated fleet, a P/D fleet).

Each is built from a :class:`~dynlab.engine.serving.TimedSetup` and follows the
:class:`~dynlab.sim.drive.Topology` protocol (``routed_workers``, ``build(strategy, env) -> fleet``,
``describe()``), in the timed environment (:class:`~dynlab.engine.env.RunEnv`);
:func:`~dynlab.sim.drive.serve` (also importable from here) runs any topology, the count-based one
(:class:`~dynlab.sim.drive.CountBased`) too. Both timed topologies drive the engines only through
:class:`~dynlab.engine.timed.TimedFleet`'s public interface (``run``, ``arrive``, ``wake`` and the
hooks ``on_step_started``, ``on_step_ended``, ``on_handed_off``).
"""
from __future__ import annotations

from dynlab.disagg.elastic import DecodeElastic, PrefillElastic
from dynlab.disagg.fleet import DisaggFleet
from dynlab.engine.elastic import Elastic
from dynlab.engine.scaling_metrics import ScalingRecorder
from dynlab.engine.env import RunEnv
from dynlab.engine.lockstep import LockstepFleet
from dynlab.engine.lora_metrics import LoraRecorder
from dynlab.engine.tier_metrics import TierRecorder
from dynlab.engine.serving import TimedSetup
from dynlab.engine.timed import TimedFleet
from dynlab.routing.strategy import Strategy
from dynlab.sim.control import Control, build_controller
from dynlab.sim.drive import Topology, build_policy, serve


class Aggregated:
    """``config.workers`` aggregated engines (prefill and decode on each), with their CPU tiers if any; with
    ``--dp-attention`` each worker's ``dp`` ranks are engines and routing targets of their own
    (:meth:`~dynlab.engine.serving.TimedSetup.engines`)."""

    def __init__(self, setup: TimedSetup):
        self.setup = setup
        self.routed_workers = setup.config.fleet_workers * setup.dp  # --pool: the pools' workers summed; DP ranks

    def build(self, strategy: Strategy, env: RunEnv) -> TimedFleet:
        s = self.setup
        if s.cpu_capacity is not None:  # a tier setting (even 0 blocks): the tier keys follow the serving keys
            env.recorders.append(TierRecorder(s.kv_bytes_per_block))
        if s.lora is not None:  # adapters on the workers (--max-loras): the lora section, when a request names one
            env.recorders.append(LoraRecorder(s.lora))
        if s.pools:  # --pool: each pool's figures (dynlab.engine.pools), and the router sees each worker's pool
            from dynlab.engine.pool_metrics import PoolRecorder

            pools = PoolRecorder(s, env.serving)
            env.recorders.append(pools)
            return pools.attach(TimedFleet(strategy, s.engines(), env, s.names_of, s.runs_of))
        controller = build_controller(s.config.controller)
        if s.dp > 1:  # attention-DP ranks in lockstep (no controller: dynlab.engine.serving.check_dp_ranks)
            return LockstepFleet(strategy, s.engines(), env, s.names_of, s.runs_of, dp=s.dp,
                                 worker_latency=s.worker_latency)
        if controller is None:
            return TimedFleet(strategy, s.engines(), env, s.names_of, s.runs_of)
        kind = s.engine_kind()  # an elastic fleet (--controller): its recorder before the fleet reads the hooks
        hardware = s.latency.hardware
        elastic = Elastic(lambda w: kind.build(s, w), controller.spec, hardware.model.weight_bytes)
        env.recorders.append(elastic)
        env.recorders.append(ScalingRecorder(elastic, hardware.parallel.gpus, controller.period_s))
        fleet = TimedFleet(strategy, s.engines(), env, s.names_of, s.runs_of)
        elastic.attach(fleet)
        Control(controller, elastic).start(hardware.parallel.gpus, s.config)
        return fleet

    def describe(self) -> dict:
        return self.setup.describe()


class Disaggregated:
    """A P/D fleet of ``config.pd()`` prefill and decode workers (:class:`~dynlab.disagg.fleet.DisaggFleet`); with a
    controller its decode pool scales (:class:`~dynlab.disagg.elastic.DecodeElastic`)."""

    def __init__(self, setup: TimedSetup):
        self.setup = setup
        self.routed_workers = setup.config.pd()[0]  # the strategy routes to the prefill pool

    def build(self, strategy: Strategy, env: RunEnv) -> DisaggFleet:
        s = self.setup
        prefill, decode = s.pd_engines()
        if s.pools:  # --pool prefill:... --pool decode:...: each pool's figures (dynlab.engine.pool_metrics)
            from dynlab.engine.pool_metrics import PoolRecorder

            env.recorders.append(PoolRecorder(s, env.serving))
        controller = build_controller(s.config.controller)
        pre = None
        if controller is not None:  # the decode pool scales (dynlab.disagg.elastic); its recorders before the fleet
            kind, hardware = s.engine_kind(), s.latency.hardware
            weights = hardware.model.weight_bytes
            elastic = DecodeElastic(lambda d: kind.build(s, d, decode=True), controller.spec, weights)
            if controller.scales_prefill:  # and the prefill pool
                role = dict((pool.role, sub) for pool, sub in s.pools).get("prefill", s) if s.pools else s
                pre = PrefillElastic(lambda p: kind.build(role, p, handoff=True), controller.spec, weights)
                env.recorders.append(pre)
            env.recorders.append(elastic)
            env.recorders.append(ScalingRecorder(elastic, hardware.parallel.gpus, controller.period_s,
                                                 fixed=() if pre else ("prefill", len(prefill)), also=pre))
        fleet = DisaggFleet(strategy, prefill, decode, env, s.names_of,
                            kv_bytes_per_token=s.latency.hardware.model.kv_bytes_per_token, pd=s.config.disagg,
                            transfer_bytes=s.transfer_bytes())
        if controller is not None:
            elastic.attach(fleet)
            if pre is not None:
                pre.attach(fleet, elastic)
            Control(controller, elastic, pre).start(hardware.parallel.gpus, s.config)
        return fleet

    def describe(self) -> dict:
        c = self.setup.config
        p, d = c.pd()
        return {**self.setup.describe(), "prefill_workers": p, "decode_workers": d,
                "decode_router": c.decode_router, "link_gbps": c.link_gbps, "link_latency_ms": c.link_latency_ms,
                "overlap_transfer": c.overlap_transfer, "decode_prefix_cache": c.decode_prefix_cache}


def topology_for(setup: TimedSetup) -> Topology:
    """The topology of ``setup.config``: :class:`Disaggregated` with a P/D split, else :class:`Aggregated`."""
    return Aggregated(setup) if setup.config.pd() is None else Disaggregated(setup)


__all__ = ["Aggregated", "Disaggregated", "topology_for", "Topology", "serve", "build_policy"]
