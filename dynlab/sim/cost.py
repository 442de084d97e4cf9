"""A timed run's bill (``--price``, ``--spot-discount``; issue 41 item 4): ``gpu_hours``, ``cost_usd`` and
``price_source`` added to its result, by :func:`dynlab.models.prices.cost`.

The GPU-hours: an elastic fleet's (``--controller``) are its :class:`~dynlab.engine.scaling_metrics.ScalingRecorder`'s
(each worker from its add to its leaving, or to the last finish); a fixed fleet's are its GPUs (workers x GPUs per
worker, both pools of a P/D fleet) times the run's ``makespan_s`` (first arrival to last finish), to 6 decimals; a
fleet of mixed pools (``--pool``) is billed per GPU from its ``gpu_hours_by_gpu`` (each pool from 0 to the last
finish, :mod:`dynlab.engine.pool_metrics`) and ``gpu_hours`` is their sum. The
cost is of ``gpu_hours`` as shown, so ``cost_usd`` = ``gpu_hours`` x price x (1 - discount) can be checked by hand. The
cost keys follow ``gpu_hours`` where the result has it, else they close the result. Without either option the result
is unchanged.
"""
from __future__ import annotations

from typing import Any

from dynlab.engine.pools import run_gpus
from dynlab.models.prices import cost, gpu_name, run_prices


def asks_cost(config) -> bool:
    """Whether ``config`` (a :class:`~dynlab.engine.config.SimConfig`) asks for its cost: a timed run with
    ``--price`` or a ``--spot-discount`` above 0."""
    return config.timing and (config.price is not None or config.spot_discount > 0)


def with_cost(result: dict[str, Any], config, gpus: int) -> dict[str, Any]:
    """``result`` with ``gpu_hours`` (when it lacks it: ``gpus`` x ``makespan_s`` / 3600), ``cost_usd``,
    ``price_source`` (GPU -> where its price came from) and ``spot_discount`` (when above 0) after it."""
    hours = result.get("gpu_hours")
    own = hours is None  # a fixed fleet: its GPU-hours to 6 decimals, as an elastic fleet's
    by_gpu = result.get("gpu_hours_by_gpu")  # mixed pools (--pool): each GPU's own hours, priced at its price
    if by_gpu is not None:
        hours = round(sum(by_gpu.values()), 6)
    elif own:
        hours = round(gpus * result["makespan_s"] / 3600.0, 6)
    keys = {**({"gpu_hours": hours} if own else {}),  # priced as shown: cost_usd = gpu_hours x price x (1 - F)
            **cost(by_gpu or {gpu_name(config.gpu): hours}, run_prices(config.price, run_gpus(config)), config.spot_discount)}
    if own:
        return {**result, **keys}
    out: dict[str, Any] = {}
    for key, value in result.items():
        out[key] = value
        if key == "gpu_hours":
            out.update(keys)
    return out
