"""Checks of the arrival options: how a workload's requests reach the fleet (its timestamps, a Poisson
rate, or closed-loop users). Raise ``ValueError`` with the one-line message a command prints."""
from __future__ import annotations

from typing import Optional


def check_arrival_options(timestamps: bool, time_scale: float, rate: Optional[float],
                          rate_scale: Optional[float] = None, duration: Optional[float] = None) -> None:
    """Raise ``ValueError`` (``--NAME has no effect ...``, or a conflict) for the arrival options a
    workload ignores or that contradict each other. With ``timestamps``, ``rate`` (a target mean rate),
    ``rate_scale`` and ``time_scale`` other than 1 all set the trace's speed: at most one may be given.
    Without them (the requests arrive as a Poisson process of ``rate`` requests/s), ``time_scale``
    other than 1, ``rate_scale`` and ``duration`` have nothing to act on. A trace's timestamps are all
    there or none (the readers refuse a mix)."""
    if timestamps:
        speed = [flag for flag, on in (("--rate", rate is not None), ("--rate-scale", rate_scale is not None),
                                       ("--time-scale", time_scale != 1.0)) if on]
        if len(speed) > 1:
            why = " (--rate-scale X is --time-scale 1/X)" if "--rate" not in speed else ""
            raise ValueError(f"{' and '.join(speed)} both set the trace's speed{why}: give one")
        return
    if time_scale != 1.0:
        raise ValueError("--time-scale has no effect: the workload has no timestamps (its requests arrive as a "
                         "Poisson process of --rate requests/s)")
    for flag, v in (("--rate-scale", rate_scale), ("--duration", duration)):
        if v is not None:
            raise ValueError(f"{flag} has no effect: the workload has no timestamps (its requests arrive as a "
                             "Poisson process of --rate requests/s)")


def check_closed_loop(concurrency: Optional[int], num_requests: Optional[int], warmup: int) -> None:
    """Raise ``ValueError`` unless ``concurrency`` (users) and ``num_requests`` (``--requests``) are
    ``None`` or >= 1 and ``warmup`` (requests left out of the metrics) is >= 0 and below ``num_requests``."""
    for name, v in (("concurrency", concurrency), ("num_requests", num_requests)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if num_requests is not None and warmup >= num_requests:
        raise ValueError(f"--warmup {warmup} leaves none of --requests {num_requests} to measure")


def workload_rules(config, without_timing: str):
    """The rows of :func:`dynlab.engine.option_rules._no_effect_rules` (``(field, why it has no effect)``) for the
    arrival options, what a workload spec replaces and what a calibration profile sets (``--latency-model``).
    ``config``: a :class:`~dynlab.engine.config.SimConfig`; ``without_timing``: the reason of a timed-only option."""
    if config.latency_profile is not None:
        yield "latency_model", "with --latency-profile (the profile names its latency model)"
    if config.trace is None:
        yield "keep_failed", "without --trace (it keeps the failed requests a BurstGPT trace records)"
    if config.trace is None and config.workload is None:
        for name in ("rate_scale", "duration"):
            yield name, "without --trace or --workload: the synthetic workload has no timestamps"
    if not config.timing:
        yield "rate_scale", without_timing
    if config.duration is None:
        yield "duration_repeat", "without --duration (it says what a looped trace repeats)"
    if config.concurrency is None:
        yield "think_time_ms", "without --concurrency (a user's pause between an answer and its next request)"
    else:
        why = "with --concurrency: closed-loop requests are sent as earlier ones finish, not at a rate"
        for name in ("rate", "rate_scale", "time_scale"):
            yield name, why
        yield "duration_repeat", "with --concurrency: --duration stops the users sending, it loops no trace"
    if config.workload is not None:
        yield "trace_format", "with --workload: the spec generates token requests, there is no trace to read"
        yield "tokenizer", "with --workload: the spec generates token ids, there is no text to tokenize"
        if not config.timing:  # (a timed run refuses it naming the engine's block: dynlab.engine.serving)
            yield "trace_block", ("with --workload: the workload's blocks are hashed at --block; it applies to traces "
                                  "that name their own blocks (mooncake)")
