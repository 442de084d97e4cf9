"""``dynlab calibrate``'s library side: read the benchmark files, settle each point's hardware, fit, and
return the profile (:mod:`dynlab.latency.profile`).

Each point is replayed on ``model``, ``gpu`` and ``tp`` when given, else on those its file names (tp 1 when
neither gives one); a given ``tp`` also replaces the point's own, so its measured throughput per GPU is divided by
it (:meth:`~dynlab.calibrate.measured.MeasuredPoint.gpus`). A file's model is a Hugging Face id
(``meta-llama/Llama-3.1-8B-Instruct``): it is taken as dynlab's bundled name when its last part, lower
case, is one, or is the Hub repository of a bundled config or an instruction-tuned release of the same
architecture (:data:`dynlab.models.hub_ids.HUB_IDS`: ``llama-3.1-8b-instruct`` is ``llama-3.1-8b``); others need
``--model``. A GPU and an engine, a file's or given
(``--gpu``, ``--engine``), are compared in lower case: the measured server's names as the benchmark tools
spell them (``H100``, ``SGLang``); a GPU file's path (``.json``) is kept as it is. A profile is for one model and one
GPU: points on several are refused.

The points are replayed on one engine (:func:`replay_engine`): ``--engine`` when given, else the one the
files state (a points file's ``engine`` column, a vLLM result's ``engine``), else vLLM; a file stating
another engine than the one given is refused (issue 38 item 4: an SGLang server's benchmark is fitted on
SGLang's scheduler, :mod:`dynlab.engine.sglang`, as ``benchmarks/fidelity_real.py`` replays SGLang rows).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

from dynlab.calibrate.fit import Calibration, CalibrationError, calibrate
from dynlab.calibrate.formats import MeasuredPoint, read_points
from dynlab.latency.profile import profile_json
from dynlab.engine.config import SimConfig


def _model(point: MeasuredPoint, given: Optional[str]) -> str:
    if given is not None:
        return given
    from dynlab.models.hub_ids import bundled_name

    if point.model:
        name = bundled_name(point.model)
        if name is not None:
            return name
        raise CalibrationError(f"{point.source}: model {point.model!r} is not one dynlab bundles: give --model "
                               "(a bundled name, see dynlab models, or a config.json)")
    raise CalibrationError(f"{point.source}: the file names no model: give --model")


def _gpu(point: MeasuredPoint, given: Optional[str]) -> str:
    if given is not None:  # compared in lower case as a file's is (a GPU file's path kept as it is)
        return given if given.endswith(".json") else given.lower()
    if point.gpu:
        return point.gpu.lower()
    raise CalibrationError(f"{point.source}: the file names no GPU: give --gpu")


def point_configs(points: Sequence[MeasuredPoint], base: SimConfig, model: Optional[str] = None,
                  gpu: Optional[str] = None, tp: Optional[int] = None) -> list[SimConfig]:
    """One replay configuration per point: ``base`` with the point's model, GPU and tp (module docstring).
    Raises :class:`CalibrationError` for a point with none given, or for points on several models or GPUs."""
    configs = []
    for p in points:
        configs.append(replace(base, model=_model(p, model), gpu=_gpu(p, gpu), tp=tp or p.tp or 1))
    shapes = {(c.model, c.gpu) for c in configs}
    if len(shapes) > 1:
        listed = ", ".join(f"{m} on {g}" for m, g in sorted(shapes))
        raise CalibrationError(f"the points are on several models or GPUs ({listed}): calibrate one at a time")
    return configs


#: the engines ``dynlab calibrate`` replays on (SimConfig's ``engine_kind``)
ENGINES = ("vllm", "sglang")


def replay_engine(points: Sequence[MeasuredPoint], given: Optional[str] = None) -> str:
    """The engine kind the points are replayed on: ``given`` (``--engine``), else the one engine the points
    state (compared in lower case), else ``"vllm"``. Raises :class:`CalibrationError` (one line naming both)
    for a point stating another engine than ``given``, for points stating several, or for a stated engine
    dynlab cannot replay (not in :data:`ENGINES`)."""
    stated = {}
    for p in points:
        if p.engine:
            stated.setdefault(p.engine.lower(), p.source)
    if given is not None:
        for name, source in stated.items():
            if name != given:
                raise CalibrationError(f"{source}: the file states engine {name!r} but --engine is {given!r}: "
                                       "give the engine the file was measured on")
        return given
    if len(stated) > 1:
        raise CalibrationError(f"the points state several engines ({', '.join(sorted(stated))}): "
                               "calibrate one at a time")
    name = next(iter(stated), "vllm")
    if name not in ENGINES:
        raise CalibrationError(f"{stated[name]}: engine {name!r} is not one dynlab replays "
                               f"({', '.join(ENGINES)}): calibrate on measurements of one of them")
    return name


#: each engine's server flags (SimConfig fields) -> their flags and dynlab calibrate's defaults for them
#: (None: SimConfig's, :data:`dynlab.engine.options.OPTIONS`; 256 and 8192 are vLLM's own defaults,
#: vllm/config/scheduler.py)
_ENGINE_FLAGS = {"vllm": {"max_num_seqs": ("--max-num-seqs", 256),
                          "max_num_batched_tokens": ("--max-num-batched-tokens", 8192)},
                 "sglang": {"max_running_requests": ("--max-running-requests", None),
                            "chunked_prefill_size": ("--chunked-prefill-size", None),
                            "max_prefill_tokens": ("--max-prefill-tokens", None),
                            "mem_fraction_static": ("--mem-fraction-static", None),
                            "disable_radix_cache": ("--disable-radix-cache", None)}}
#: the engine's flags no replay of :mod:`dynlab.calibrate.replay` depends on -> why (refused, as sim refuses an
#: option that would do nothing): every replayed prompt is distinct, so a prefix cache never matches one
NO_EFFECT = {"disable_radix_cache": "their prompts share no prefix, so SGLang's radix cache never matches one"}


def engine_fields(kind: str, flags: Optional[dict]) -> dict:
    """SimConfig fields of the server's flags ``flags`` (field -> value, ``None`` where not given) replayed on
    engine ``kind``: its own flags with their defaults (:data:`_ENGINE_FLAGS`), ``engine_kind``. Raises
    :class:`CalibrationError` (one line naming the flag) for a flag of the other engine, or one of
    :data:`NO_EFFECT`: either would do nothing."""
    out = {"engine_kind": kind}
    for other, names in _ENGINE_FLAGS.items():
        for field, (flag, default) in names.items():
            value = (flags or {}).get(field)
            if other != kind and value is not None:
                raise CalibrationError(f"{flag} has no effect with engine {kind} (it is {other}'s flag)")
            if value is not None and field in NO_EFFECT:
                raise CalibrationError(f"{flag} has no effect on dynlab calibrate's replays ({NO_EFFECT[field]}): "
                                       "leave it out")
            if other == kind and (value if value is not None else default) is not None:
                out[field] = value if value is not None else default
    for field, value in (flags or {}).items():  # other SimConfig fields no engine table names, kept as given
        if value is not None and not any(field in names for names in _ENGINE_FLAGS.values()):
            out[field] = value
    return out


def calibrate_files(paths: Sequence[str], fmt: Optional[str] = None, model: Optional[str] = None,
                    gpu: Optional[str] = None, tp: Optional[int] = None, latency_model: str = "linear",
                    latency_opts: Optional[dict] = None, fit: Optional[Sequence[str]] = None,
                    folds: int = 5, concurrency: Optional[int] = None,
                    engine: Optional[dict] = None, engine_kind: Optional[str] = None,
                    max_nfev: int = 60, progress=None) -> tuple[dict, Calibration]:
    """``(profile, calibration)`` of the points in ``paths`` (each read by
    :func:`~dynlab.calibrate.formats.read_points` with ``fmt``). Raises
    :class:`~dynlab.errors.InputError` / :class:`~dynlab.errors.InputFileError` for a bad file,
    :class:`CalibrationError` and :class:`~dynlab.calibrate.replay.ReplayError` for points that cannot be
    fitted, ``ValueError`` for a bad option. ``concurrency``: the client's users where a file states neither
    ``max_concurrency`` nor a request rate (aiperf's per-request export). ``engine``: the server's engine
    settings the files do not state, as :class:`~dynlab.engine.config.SimConfig` fields
    (vLLM's ``max_num_seqs``, ``max_num_batched_tokens``; SGLang's ``max_running_requests``,
    ``chunked_prefill_size``, ``max_prefill_tokens``, ``mem_fraction_static``; :func:`engine_fields`).
    ``engine_kind``: ``--engine`` (:func:`replay_engine`); the profile records the engine replayed on. ``model``,
    ``gpu``, ``tp``: given, they replace the files' (module docstring).
    ``max_nfev``: the optimiser's evaluations at most per fit. ``progress``: called with the stage after every
    replay (:func:`~dynlab.calibrate.fit.calibrate`), or ``None``."""
    points = []
    for path in paths:
        read = read_points(path, fmt)
        if not read:
            raise CalibrationError(f"{path}: no measured point in the file")
        points.extend(read)
    if concurrency is not None:
        if all(p.max_concurrency is not None or p.request_rate is not None for p in points):
            raise CalibrationError("--concurrency has no effect: every point states its concurrency or request rate")
        points = [replace(p, max_concurrency=concurrency)
                  if p.max_concurrency is None and p.request_rate is None else p for p in points]
    if tp is not None:  # given: replaces the files' tp, as --model and --gpu replace theirs
        points = [replace(p, tp=tp) for p in points]
    kind = replay_engine(points, engine_kind)
    base = SimConfig(timing=True, latency_model=latency_model, latency_opts=dict(latency_opts or {}),
                     **engine_fields(kind, engine))
    configs = point_configs(points, base, model, gpu, tp)
    for config in configs:
        config.validate()
    calibration = calibrate(points, configs, fit, folds, max_nfev, progress)
    return profile_json(calibration, points, configs), calibration


__all__ = ["ENGINES", "calibrate_files", "point_configs", "replay_engine"]
