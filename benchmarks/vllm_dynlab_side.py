"""dynlab's side of the vLLM differential harness (:mod:`benchmarks.fidelity_vllm`): one ``dynlab sim``.

:func:`run_dynlab` runs ``dynlab sim --timing --latency-model linear --latency-opt beta0=.. beta1=..
beta2=.. --capacity C --block 16 --workers 1 --max-num-batched-tokens B --max-num-seqs S --trace FILE``
in this process (click's ``main`` with ``standalone_mode=False``) and returns one record per trace
request, in trace order, with the keys of ``sim --requests-out`` (issue 24, item 4): ``id`` (0-based
trace line), ``worker``, ``arrival_ms``, ``first_scheduled_ms``, ``first_token_ms``, ``finish_ms``,
``input_length``, ``output_length``, ``hit_tokens``, ``preemptions``, ``rejected``.

This is the ONE place that knows how the per-request values are obtained: ``sim --requests-out``.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

KEYS = ("id", "worker", "arrival_ms", "first_scheduled_ms", "first_token_ms", "finish_ms",
        "input_length", "output_length", "hit_tokens", "preemptions", "rejected")


@dataclass(frozen=True)
class EngineSetup:
    """One run's engine: ``capacity`` blocks of ``block`` tokens, the scheduler's limits (tokens, sequences),
    the linear latency model's ``beta0`` (ms per step), ``beta1`` (ms per prefill token), ``beta2`` (ms
    per decode request) (:class:`dynlab_builtins.latency.Linear`); ``model``: a model with KV cache groups or
    ``None``; ``queue_policy``: ``fcfs`` or ``priority`` (vLLM's
    ``SchedulerConfig.policy``; dynlab's ``--queue-policy``, the rows' ``priority`` field); ``max_loras``: LoRA
    adapters a step may hold (the rows' ``lora_name``; 0: no LoRA config). vLLM's scheduler never waits for an
    adapter's load (its worker does), so dynlab's loads are made instant: ``--pcie-gbps`` and ``--lora-disk-gbps``
    1e300, whose bytes per ms overflow to infinity (a load of 0.0 ms exactly)."""

    capacity: int
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    beta0: float = 3.991
    beta1: float = 0.02339
    beta2: float = 0.10746
    block: int = 16
    queue_policy: str = "fcfs"
    max_loras: int = 0  # LoRA adapters (vLLM's LoRAConfig.max_loras; dynlab's --max-loras), 0: none
    #: a catalogue model with KV cache groups (``gpt-oss-120b``, ``gemma-3-27b``: ``--model``), ``None``: one
    #: full-attention group (the model then changes nothing: the linear latency model ignores it)
    model: Optional[str] = None
    #: GPUs per worker (``--tp``) for a model too big for one (the pool is ``capacity`` either way)
    tp: int = 1


def sim_args(setup: EngineSetup, trace: str) -> list[str]:
    """The ``dynlab sim`` arguments that serve ``trace`` on one worker of ``setup`` (a list of str)."""
    return ["sim", "--timing", "--workers", "1", "--mode", "rr", "--trace", trace, "--trace-format", "tokens",
            "--block", str(setup.block), "--capacity", str(setup.capacity),
            "--max-num-batched-tokens", str(setup.max_num_batched_tokens),
            "--max-num-seqs", str(setup.max_num_seqs), "--latency-model", "linear",
            "--latency-opt", f"beta0={setup.beta0!r}", "--latency-opt", f"beta1={setup.beta1!r}",
            "--latency-opt", f"beta2={setup.beta2!r}", *_terms_off(), "--quiet",
            *(["--queue-policy", setup.queue_policy] if setup.queue_policy != "fcfs" else []),
            *(["--max-loras", str(setup.max_loras), "--pcie-gbps", "1e300", "--lora-disk-gbps", "1e300"]
              if setup.max_loras else []),
            *(["--model", setup.model] if setup.model is not None else []),
            *(["--tp", str(setup.tp)] if setup.tp != 1 else [])]


def _terms_off() -> list[str]:
    """The overhead terms off (dynlab.latency.overheads): vLLM's side steps the bare linear time, so the harness
    compares scheduling alone (records are engine times: the run's front end and detokenisation are not in them)."""
    from dynlab.latency.overheads import SERVER_TERMS_OFF

    return [arg for name, value in SERVER_TERMS_OFF["linear"].items() for arg in ("--latency-opt", f"{name}={value}")]


def sim_has(option: str) -> bool:
    """Whether ``dynlab sim`` has ``option`` (``--requests-out``, ``--admission``: issue 24's, not yet in every build)."""
    from dynlab.cli import main

    return any(option in p.opts for p in main.commands["sim"].params)


def _invoke(args: list[str]) -> dict:
    """Run ``dynlab ARGS`` in this process; its printed JSON (raises ``RuntimeError`` on a non-zero exit)."""
    from dynlab.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main.main(args, standalone_mode=False)
        except SystemExit as exc:  # click exits on its own errors even without standalone mode
            if exc.code:
                raise RuntimeError(f"dynlab {' '.join(args)} exited {exc.code}") from None
    return json.loads(out.getvalue())


def run_dynlab(setup: EngineSetup, trace: str, admission: Optional[str] = None,
               async_scheduling: Optional[bool] = None) -> tuple[list[dict], dict, float]:
    """``(records in trace order, sim's JSON, wall seconds of the sim call)`` of ``trace`` on ``setup``.

    ``admission`` (``full`` or ``chunk``) is passed as ``--admission`` when ``sim`` has that option, and
    ignored otherwise (dynlab then runs its one rule, the chunk rule). ``async_scheduling`` (``True`` /
    ``False``) passes ``--async-scheduling`` / ``--no-async-scheduling`` (``None``: sim's default);
    ``RuntimeError`` when ``True`` and ``sim`` has no such option.
    """
    args = sim_args(setup, trace)
    if admission is not None and sim_has("--admission"):
        args += ["--admission", admission]
    if async_scheduling is not None:
        if sim_has("--async-scheduling"):
            args.append("--async-scheduling" if async_scheduling else "--no-async-scheduling")
        elif async_scheduling:
            raise RuntimeError("this dynlab's sim has no --async-scheduling")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "requests.jsonl")
        summary = _invoke(args + ["--requests-out", path])
        wall = time.perf_counter() - start
        with open(path) as fh:
            records = [json.loads(line) for line in fh if line.strip()]
    return records, summary, wall
