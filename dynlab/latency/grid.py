"""Choosing a latency model by name, and the table of step times ``dynlab latency`` prints.

:func:`build_latency_model` is what a caller (the engine, the CLI) uses to turn names and
``NAME=VALUE`` option strings into a constructed :class:`~dynlab.latency.base.LatencyModel`;
:func:`latency_grid` evaluates one or more models on a fixed grid of steps.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from dynlab import plugins
from dynlab.latency import hardware as hw
from dynlab.latency.base import Hardware, LatencyModel, StepBatch
from dynlab.latency.overheads import CLIENT_TERMS, SERVER_TERMS, SGLANG_GRAPH_TERMS, VLLM
from dynlab.models.parallel import Parallelism, check_parallelism

DEFAULT_LATENCY_MODEL = "roofline"

PREFILL_TOKENS = (512, 2048, 8192)
"""Prefill grid: one request of this many prompt tokens, nothing cached (context 0)."""
DECODE_BATCHES = (1, 16, 64, 256)
"""Decode grid: this many requests, each at every context in :data:`DECODE_CONTEXTS`."""
DECODE_CONTEXTS = (2048, 16384)


def hardware_for(model: str = hw.DEFAULT_MODEL, gpu: str = hw.DEFAULT_GPU, tp: int = 1, *, ep: int = 1, pp: int = 1,
                 dp_attention: bool = False, kv_cache_dtype: str = "auto") -> Hardware:
    """The :class:`Hardware` of a bundled model (or ``config.json`` path) on ``tp`` catalogue GPUs.

    ``ep``/``pp``/``dp_attention``: :mod:`dynlab.models.parallel`; ``kv_cache_dtype``: ``auto`` or ``fp8``.

    Raises ``ValueError`` naming what exists for an unknown model or GPU, or a bad ``tp`` (one that
    does not split the model's heads evenly, vLLM's rule) or other degree;
    :class:`dynlab.disagg.cost.ModelConfigError` for a ``config.json`` that holds a bad config and
    :class:`dynlab.errors.InputFileError` for one that cannot be opened
    (:func:`dynlab.latency.hardware.model_spec`).
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    spec = hw.model_spec(model, kv_cache_dtype)
    # vLLM's rule: the attention heads split evenly, and the KV heads split or replicate evenly; then the
    # expert and pipeline degrees (dynlab.models.parallel.check_parallelism)
    check_parallelism(spec, Parallelism(tp, ep, pp, dp_attention))
    return Hardware(spec, hw.gpu_spec(gpu), tp, ep, pp, dp_attention)


def build_latency_model(name: str, hardware: Hardware, options: Mapping[str, Any] | None = None,
                        defaults: Mapping[str, Any] | None = None) -> LatencyModel:
    """Construct the registered latency model ``name`` with ``options`` (strings are converted).

    Option values may be strings (``--latency-opt NAME=VALUE``, converted by the declared
    ``StrategyOption``) or already-typed values; missing ones take their defaults: ``defaults``' value
    (typed; an engine kind's own, :meth:`dynlab.engine.kinds.EngineKind.latency_defaults`) for an option the
    model declares (others in it are ignored), else the declared default. Raises
    ``ValueError`` (one line) for an unknown model name (listing the registered ones), an option the
    model does not declare (listing those it does), a bad value, or a model that refuses the hardware.
    """
    try:
        cls = plugins.latency_models().get(name)
    except plugins.UnknownNameError as exc:
        raise ValueError(str(exc)) from None
    declared = {o.name: o for o in cls.options}
    values = {o.name: o.default for o in cls.options}
    values.update((k, v) for k, v in (defaults or {}).items() if k in declared)
    for key, value in (options or {}).items():
        if key not in declared:
            known = ", ".join(declared) or "none"
            raise ValueError(f"latency model {name!r} has no option {key!r}; its options: {known}")
        values[key] = declared[key].convert(value) if isinstance(value, str) else value
    return cls(hardware, values)


def _row(model: LatencyModel) -> dict:
    prefill = {str(t): model.step_ms(StepBatch((t,), (0,), 0, 0)) for t in PREFILL_TOKENS}
    decode = {str(c): {str(b): model.step_ms(StepBatch((), (), b, b * c)) for b in DECODE_BATCHES}
              for c in DECODE_CONTEXTS}
    return {"prefill_ms": prefill, "decode_ms": decode}


def engine_defaults(engine: str, config, hardware: Hardware) -> dict:
    """The latency-option defaults the engine kind ``engine`` gives a run of ``config`` (a ``SimConfig``, or
    ``None``: the engine's own defaults) on ``hardware``
    (:meth:`dynlab.engine.kinds.EngineKind.latency_defaults`). Raises
    :class:`dynlab.plugins.UnknownNameError` for an unknown engine kind."""
    return plugins.engine_kinds().get(engine)().latency_defaults(config, hardware)


def _declared(latency_models: Sequence[str], options: Mapping[str, str]) -> dict:
    """``{model name: its option names}``; raises ``ValueError`` for an unknown model, ``spec_gamma``, or an option
    no listed model declares (:func:`latency_grid`)."""
    if "spec_gamma" in options:  # the grid has no speculative step for it to price
        raise ValueError("--latency-opt spec_gamma has no effect here: the grid has no speculative decoding "
                         "step (it prices the drafter in sim --spec-method ... --spec-tokens K)")
    registry = plugins.latency_models()
    for name in latency_models:
        if name not in registry:
            raise ValueError(f"unknown latency model {name!r}; available: {', '.join(registry.names())}")
    declared = {n: {o.name for o in registry.get(n).options} for n in latency_models}
    for key in options:
        if not any(key in d for d in declared.values()):
            raise ValueError(f"no listed latency model ({', '.join(latency_models)}) has an option {key!r}")
    return declared


def latency_grid(latency_models: Sequence[str] = (DEFAULT_LATENCY_MODEL,), model: str = hw.DEFAULT_MODEL,
                 gpu: str = hw.DEFAULT_GPU, tp: int = 1, options: Mapping[str, str] | None = None,
                 digits: int = 3, *, ep: int = 1, pp: int = 1, dp_attention: bool = False,
                 kv_cache_dtype: str = "auto", engine: str = "vllm") -> dict:
    """Step times (ms, rounded to ``digits`` decimals) of each latency model on the fixed grid.

    Returns ``{"model", "gpu", "tp", "latency_models": {NAME: {"prefill_ms": {TOKENS: ms},
    "decode_ms": {CONTEXT: {BATCH: ms}}, "server_terms": {OPTION: value}}}, "client_terms": {...}}`` (keys
    are strings, as in JSON). ``server_terms``: the model's server options in the step times shown
    (:mod:`dynlab.latency.overheads`; only for a model that declares them; ``cuda_graphs`` and
    ``cuda_graph_prefill_max`` only with SGLang's rule); ``client_terms``: the run's
    request-level defaults, which are not in a step (``--request-overhead-ms``, ``--detok-us-per-token``). The grid: one prefill of
    512/2,048/8,192 tokens at context 0; 1/16/64/256 decodes each at context 2,048 and 16,384.
    ``options`` go to every listed model that declares them; one that no listed model declares is
    a ``ValueError``. ``ep``, ``pp``, ``dp_attention``, ``kv_cache_dtype``: :func:`hardware_for`; when not
    their defaults they are keys of the result too, and ``"latency_domain": {NAME: why}`` lists each model
    that answers outside what it was fitted or measured on (:meth:`LatencyModel.domain`). ``engine``: the engine
    kind whose option defaults the models take (:func:`engine_defaults`), a key of the result unless ``vllm``;
    an unknown one is a ``ValueError``. Raises
    ``ValueError`` as :func:`build_latency_model` and :func:`hardware_for`, and for ``spec_gamma`` (no
    speculative step in the grid).
    """
    if not latency_models:
        raise ValueError("no latency model given")
    if len(set(latency_models)) != len(latency_models):
        raise ValueError(f"a latency model is listed twice in {','.join(latency_models)}")
    hardware = hardware_for(model, gpu, tp, ep=ep, pp=pp, dp_attention=dp_attention, kv_cache_dtype=kv_cache_dtype)
    options = dict(options or {})
    declared = _declared(latency_models, options)
    try:
        defaults = engine_defaults(engine, None, hardware)
    except plugins.UnknownNameError as exc:
        raise ValueError(f"--engine: {exc.args[0]}") from None
    out = {"model": hardware.model.name, "gpu": hardware.gpu.name, "tp": tp, "latency_models": {}}
    if engine != "vllm":
        out["engine"] = engine
    domains = {}
    for name in latency_models:
        built = build_latency_model(name, hardware, {k: v for k, v in options.items() if k in declared[name]},
                                    defaults)
        extra = built.describe_hardware()
        if "latency_domain" in extra:
            domains[name] = extra.pop("latency_domain")
        out.update(extra)
        row = _row(built)
        out["latency_models"][name] = {
            "prefill_ms": {k: round(v, digits) for k, v in row["prefill_ms"].items()},
            "decode_ms": {c: {b: round(v, digits) for b, v in d.items()} for c, d in row["decode_ms"].items()},
        }
        shown = SERVER_TERMS + (SGLANG_GRAPH_TERMS if built.opts.get("cuda_graphs", VLLM) != VLLM else ())
        terms = {k: built.opts[k] for k in shown if k in built.opts}
        if terms:
            out["latency_models"][name]["server_terms"] = terms
    if domains:
        out["latency_domain"] = domains
    out["client_terms"] = dict(CLIENT_TERMS)
    return out


def gpu_table() -> dict:
    """``{name: GpuSpec.as_dict()}`` for every catalogue GPU (``dynlab latency --list``)."""
    return {name: g.as_dict() for name, g in hw.GPUS.items()}
