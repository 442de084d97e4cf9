"""Calibration profiles: the JSON ``dynlab calibrate`` writes and ``--latency-profile FILE`` reads.

A profile is one JSON object (``PROFILE_KEYS``, in that order):

- ``dynlab_calibration``: the format version, 1;
- ``model``, ``gpu``, ``tp``: the hardware the points were replayed on (dynlab's names); a model given as a path
  (a ``config.json`` or its directory) and a GPU file (``.json``) are stored as absolute paths (:func:`stored_path`),
  so a run from another directory compares the same file (profiles written before 2026-12-07 hold the path as
  typed, read from the current directory);
- ``engine``: the engine whose scheduler replayed the points (``dynlab calibrate --engine``, else the files'
  stated engine, else vllm; profiles written before 2026-12-07 give the files' stated engine or null);
- ``version``: the serving engine's version when the files state it (else null);
- ``latency_model`` and ``latency_opts``: the model and every fitted option's value (floats);
- ``request_overhead_ms``: the server's front end per request (``--request-overhead-ms``) the fit used: fitted
  when ``fitted`` names it, else the run's setting (profiles written before 2026-12-06 say 0 there);
- ``fitted``: the names of the fitted options;
- ``on_bound``: each fitted option the fit left on a bound of its range -> that bound (``{}``: none; a fit
  not to trust, :attr:`dynlab.calibrate.fit.Calibration.on_bound`; profiles written before 2026-12-07 lack it);
- ``folds`` and ``cv_error_pct``: k of the k-fold cross-validation and, per metric, the median absolute
  held-out error in percent (:mod:`dynlab.calibrate.fit`); ``{}`` and 0 with fewer than 3 points;
- ``points``: per measured point its ``source`` (FILE or FILE:LINE), ``max_concurrency``,
  ``request_rate`` (req/s, ``"inf"``: all at once), ``measured`` figures and ``error_pct`` before the fit, after it and held out (``cv``).

:func:`read_profile` checks every key (the latency model and each option of it too, in its declared range) and says
what is wrong in one line (``FILE:LINE: ...``, the key's line): an
``engine`` or ``version`` of ``""`` is refused (null says the files stated none); ``fitted``, ``folds`` and
``points`` may be left out, but not be of another type.
"""
from __future__ import annotations

import json
import math
from typing import Any, Sequence

from dynlab.errors import InputError, InputFileError
from dynlab.latency.overheads import FRONT_END_MS

PROFILE_VERSION = 1
PROFILE_KEYS = ("dynlab_calibration", "model", "gpu", "tp", "engine", "version", "latency_model", "latency_opts",
                "request_overhead_ms", "fitted", "on_bound", "folds", "cv_error_pct", "points")


def _round(mapping: dict, digits: int = 1) -> dict:
    return {k: round(float(v), digits) for k, v in mapping.items()}


def stored_path(name: str, gpu: bool = False) -> str:
    """``name`` (a model, or with ``gpu`` a GPU) as a profile stores it: a path as an absolute path, a catalogue name
    as it is. A path is what a run reads as one: for a GPU a name ending ``.json``
    (:func:`dynlab.models.gpus.gpu_spec`); for a model anything but a bundled name that contains ``/``, ends
    ``.json`` or names an existing file or directory (:func:`dynlab.models.spec.model_spec`)."""
    import os

    if gpu:
        return os.path.abspath(name) if name.endswith(".json") else name
    from dynlab.models.config import bundled_models

    if name in bundled_models():
        return name
    if os.sep in name or "/" in name or name.endswith(".json") or os.path.lexists(name):
        return os.path.abspath(name)
    return name


def profile_json(calibration, points: Sequence, configs: Sequence) -> dict[str, Any]:
    """The profile object of a :class:`~dynlab.calibrate.fit.Calibration` of ``points`` replayed with ``configs``."""
    first = configs[0]
    versions = {p.version for p in points if p.version}
    rows = []
    for i, p in enumerate(points):
        rate = p.request_rate if p.request_rate is None or math.isfinite(p.request_rate) else "inf"
        row = {"source": p.source, "max_concurrency": p.max_concurrency, "request_rate": rate,
               "measured": _round(calibration.before[i]["measured"], 3),
               "error_pct": {"before": _round(calibration.before[i]["error_pct"]),
                             "after": _round(calibration.after[i]["error_pct"])}}
        if calibration.cv_points:
            row["error_pct"]["cv"] = _round(calibration.cv_points[i]["error_pct"])
        rows.append(row)
    return {"dynlab_calibration": PROFILE_VERSION, "model": stored_path(first.model),
            "gpu": stored_path(first.gpu, gpu=True), "tp": first.tp,
            "engine": first.engine_kind, "version": ",".join(sorted(versions)) or None,
            "latency_model": calibration.latency_model,
            "latency_opts": {k: float(f"{float(v):.6g}") for k, v in calibration.opts.items()
                             if k != "request_overhead_ms"},
            "request_overhead_ms": float(f"{float(calibration.opts.get('request_overhead_ms', first.request_overhead_ms)):.6g}"),
            "fitted": list(calibration.opts),
            "on_bound": {k: float(f"{float(v):.6g}") for k, v in calibration.on_bound.items()},
            "folds": calibration.folds,
            "cv_error_pct": dict(calibration.cv_error_pct), "points": rows}


def read_profile(path: str) -> dict[str, Any]:
    """The profile in ``path``, checked. Raises :class:`~dynlab.errors.InputFileError` when it cannot be
    read and :class:`~dynlab.errors.InputError` (``FILE:LINE: what``) when it is not a profile."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise InputFileError(path, f"cannot read the calibration profile: {why}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(path, exc.lineno, f"not JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(data, dict) or data.get("dynlab_calibration") != PROFILE_VERSION:
        raise InputError(path, 1, "not a dynlab calibration profile (no \"dynlab_calibration\": 1; "
                                  "write one with dynlab calibrate)")
    unknown = sorted(set(data) - set(PROFILE_KEYS))
    if unknown:
        raise InputError(path, _line_of(text, unknown[0]),
                         f"unknown key {unknown[0]!r} (a profile has {', '.join(PROFILE_KEYS)})")
    for key, kind in (("model", str), ("gpu", str), ("tp", int), ("latency_model", str), ("latency_opts", dict),
                      ("cv_error_pct", dict)):
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise InputError(path, _line_of(text, key), f"{key!r} must be {_KINDS[kind]}, got {data.get(key)!r}")
    if data["tp"] < 1:
        raise InputError(path, _line_of(text, "tp"), f"'tp' must be at least 1, got {data['tp']!r}")
    for key in ("engine", "version"):  # names apart by commas, or null when the measured files stated none
        if data.get(key) is not None and (not isinstance(data[key], str) or not data[key].strip()):
            raise InputError(path, _line_of(text, key),
                             f"{key!r} must be a non-empty string or null, got {data[key]!r}")
    _check_record_keys(data, text, path)
    extra = {"request_overhead_ms": data["request_overhead_ms"]} if "request_overhead_ms" in data else {}
    for name, value in {**data["latency_opts"], **data["cv_error_pct"], **extra}.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InputError(path, _line_of(text, name), f"{name!r} must be a finite number >= 0, got {value!r}")
    _check_latency_model(data, text, path)
    return data


#: a JSON type as a profile's messages name it
_KINDS = {str: "a string", int: "an integer", dict: "an object"}


def _check_latency_model(data: dict, text: str, path: str) -> None:
    """``latency_model`` a registered latency model (:func:`dynlab.plugins.latency_models`) and each key of
    ``latency_opts`` one of its options with a value in the option's declared range (its ``convert``, as
    ``--latency-opt`` is checked), so a run refuses them at the key's line rather than as a bad option.
    Raises :class:`~dynlab.errors.InputError`."""
    from dynlab import plugins

    registry = plugins.latency_models()
    name = data["latency_model"]
    if name not in registry:
        raise InputError(path, _line_of(text, "latency_model"),
                         f"unknown latency model {name!r} (available: {', '.join(registry.names())})")
    declared = {o.name: o for o in registry.get(name).options}
    for key, value in data["latency_opts"].items():
        if key not in declared:
            raise InputError(path, _line_of(text, key), f"latency model {name!r} has no option {key!r} "
                                                        f"(its options: {', '.join(declared) or 'none'})")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                declared[key].convert(json.dumps(value))
            except ValueError as exc:
                raise InputError(path, _line_of(text, key), str(exc)) from None


def _check_record_keys(data: dict, text: str, path: str) -> None:
    """The keys a profile records and a run reads little of, each optional (hand-written profiles leave them out):
    ``fitted`` a list of option names, ``on_bound`` an object of numbers, ``folds`` an integer >= 0, ``points`` a
    list of objects. Raises :class:`~dynlab.errors.InputError` at the key's line."""
    checks = (("fitted", lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v),
               "a list of option names"),
              ("on_bound", lambda v: isinstance(v, dict) and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                                                 for b in v.values()), "an object of option -> bound"),
              ("folds", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0"),
              ("points", lambda v: isinstance(v, list) and all(isinstance(p, dict) for p in v), "a list of objects"))
    for key, good, what in checks:
        if key in data and not good(data[key]):
            raise InputError(path, _line_of(text, key), f"{key!r} must be {what}, got {data[key]!r}")


def _line_of(text: str, key: str) -> int:
    """The 1-based line of the first ``"key":`` in ``text`` (a profile's JSON), 1 when it is not found."""
    needle = json.dumps(key) + ":"
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line.replace('" :', '":'):
            return number
    return 1


#: a profile's metric -> the figure of a run's result it bands (``key.stat`` for a stats object)
BAND_KEYS = {"median_ttft_ms": "ttft_ms.p50", "p99_ttft_ms": "ttft_ms.p99", "median_tpot_ms": "tpot_ms.p50",
             "p99_tpot_ms": "tpot_ms.p99", "median_e2el_ms": "e2e_ms.p50",
             "total_token_throughput_per_gpu": "tokens_per_s_per_gpu"}


def _model_key(model: str) -> str:
    """A model or GPU as compared between a profile and a run: an existing path by its real path (so a relative
    and an absolute spelling match), a catalogue name as it is."""
    import os

    return os.path.realpath(model) if os.path.exists(model) else model


def other_engines(stated, engine_kind: str) -> str:
    """The engines a profile states (its ``engine``: names apart by commas, ``None`` when its files stated none)
    when ``engine_kind`` (the run's ``--engine``) is not among them, compared in lower case (``vLLM`` is
    ``vllm``); ``""`` otherwise. A profile of another engine is still used (its step times are the same GPU's
    kernels), but the engines' own costs differ (scheduler CPU time, front end: SGLang's overlap scheduler,
    vLLM's AsyncScheduler), so its error band is not claimed for this run: a warning, not a refusal."""
    names = [n.strip() for n in (stated or "").split(",") if n.strip()]
    return stated if names and engine_kind.lower() not in {n.lower() for n in names} else ""


def profile_domain(profile: dict, path: str, model: str, gpu: str, tp: int, engine_kind: str) -> str:
    """What a run on ``model``, ``tp`` x ``gpu`` under ``engine_kind`` (the run's ``--engine``) says of the profile
    ``profile`` read from ``path`` (:func:`read_profile`): that it was calibrated elsewhere (another model, GPU or tp,
    or another engine when it states its engine, :func:`other_engines`), so its error is unmeasured here; else that
    it has no cross-validated error; else ``""``. The ``latency_domain`` of :func:`apply_profile`, and the
    warning ``dynlab latency --latency-profile`` prints."""
    shape = (profile["model"], profile["gpu"], profile["tp"])
    elsewhere = []
    if (_model_key(shape[0]), _model_key(shape[1]), shape[2]) != (_model_key(model), _model_key(gpu), tp):
        elsewhere.append(f"on {shape[0]}, {shape[2]} x {shape[1]}, not on {model}, {tp} x {gpu}")
    engines = other_engines(profile.get("engine"), engine_kind)
    if engines:
        elsewhere.append(f"with {engines}, not {engine_kind}")
    if elsewhere:
        return f"--latency-profile {path} was calibrated {' and '.join(elsewhere)}: its error is unmeasured here"
    if not any(m in BAND_KEYS for m in profile["cv_error_pct"]):
        return (f"--latency-profile {path} has no cross-validated error (it was fitted on fewer than 3 points): "
                "its figures carry no error band")
    return ""


def apply_profile(config):
    """``(config, keys)``: ``config`` (a :class:`~dynlab.engine.config.SimConfig` with ``latency_profile``)
    with the profile's latency model, fitted options and request overhead (the one its fit used, unless the
    run gives ``--request-overhead-ms`` and the profile did not fit it), and the result keys ``latency_profile`` (the
    path) and ``error_band_pct`` (:data:`BAND_KEYS` -> the cross-validated error in percent; ``{}`` when
    the run's model, GPU or tp, or its ``--engine`` when the profile states its engine (:func:`other_engines`), is
    not the profile's, whose error was not measured there, or when the profile
    has no cross-validated error: ``latency_domain`` then says so).
    Raises the errors of :func:`read_profile`, and ``ValueError`` for a ``--latency-opt`` the profile fits."""
    from dataclasses import replace

    path = config.latency_profile
    profile = read_profile(path)
    fitted = sorted(set(profile["latency_opts"]) & set(config.latency_opts))
    if fitted:
        raise ValueError(f"--latency-opt {fitted[0]}: --latency-profile {path} fits it; leave it out or calibrate again")
    front = float(profile.get("request_overhead_ms", 0.0))
    if config.request_overhead_ms != FRONT_END_MS:  # given: the run's, unless the profile fitted it
        if "request_overhead_ms" in profile.get("fitted", ()):
            raise ValueError(f"--request-overhead-ms: --latency-profile {path} fits it; leave it out or calibrate again")
        front = config.request_overhead_ms
    opts = {**{k: repr(float(v)) for k, v in profile["latency_opts"].items()}, **config.latency_opts}
    config = replace(config, latency_model=profile["latency_model"], latency_opts=opts, request_overhead_ms=front)
    band = {BAND_KEYS[m]: v for m, v in profile["cv_error_pct"].items() if m in BAND_KEYS}
    keys = {"latency_profile": path, "error_band_pct": band}
    domain = profile_domain(profile, path, config.model, config.gpu, config.tp, config.engine_kind)
    if domain:  # calibrated elsewhere, or no cross-validated error: no band is claimed
        keys["error_band_pct"], keys["latency_domain"] = {}, domain
    return config, keys


__all__ = ["BAND_KEYS", "PROFILE_KEYS", "PROFILE_VERSION", "apply_profile", "other_engines", "profile_domain",
           "profile_json", "read_profile", "stored_path"]
