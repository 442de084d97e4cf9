"""Calibration profiles: the JSON ``dynlab calibrate`` writes and ``--latency-profile FILE`` reads.

A profile is one JSON object (``PROFILE_KEYS``, in that order):

- ``dynlab_calibration``: the format version, 1;
- ``model``, ``gpu``, ``tp``: the hardware the points were replayed on (dynlab's names);
- ``engine``, ``version``: the serving engine and its version when the files state them (else null);
- ``latency_model`` and ``latency_opts``: the model and every fitted option's value (floats);
- ``fitted``: the names of the fitted options;
- ``folds`` and ``cv_error_pct``: k of the k-fold cross-validation and, per metric, the median absolute
  held-out error in percent (:mod:`dynlab.calibrate.fit`); ``{}`` and 0 with fewer than 3 points;
- ``points``: per measured point its ``source`` (FILE or FILE:LINE), ``max_concurrency``,
  ``request_rate`` (req/s, ``"inf"``: all at once), ``measured`` figures and ``error_pct`` before the fit, after it and held out (``cv``).

:func:`read_profile` checks every key and says what is wrong in one line (``FILE: ...``).
"""
from __future__ import annotations

import json
import math
from typing import Any, Sequence

from dynlab.errors import InputError, InputFileError

PROFILE_VERSION = 1
PROFILE_KEYS = ("dynlab_calibration", "model", "gpu", "tp", "engine", "version", "latency_model", "latency_opts",
                "fitted", "folds", "cv_error_pct", "points")


def _round(mapping: dict, digits: int = 1) -> dict:
    return {k: round(float(v), digits) for k, v in mapping.items()}


def profile_json(calibration, points: Sequence, configs: Sequence) -> dict[str, Any]:
    """The profile object of a :class:`~dynlab.calibrate.fit.Calibration` of ``points`` replayed with ``configs``."""
    first = configs[0]
    engines = {p.engine for p in points if p.engine}
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
    return {"dynlab_calibration": PROFILE_VERSION, "model": first.model, "gpu": first.gpu, "tp": first.tp,
            "engine": ",".join(sorted(engines)) or None, "version": ",".join(sorted(versions)) or None,
            "latency_model": calibration.latency_model,
            "latency_opts": {k: float(f"{float(v):.6g}") for k, v in calibration.opts.items()},
            "fitted": list(calibration.opts), "folds": calibration.folds,
            "cv_error_pct": dict(calibration.cv_error_pct), "points": rows}


def read_profile(path: str) -> dict[str, Any]:
    """The profile in ``path``, checked. Raises :class:`~dynlab.errors.InputFileError` when it cannot be
    read and :class:`~dynlab.errors.InputError` (``FILE:LINE: what``) when it is not a profile."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"{path}: cannot read the calibration profile: {getattr(exc, 'strerror', None) or exc}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(path, exc.lineno, f"not JSON: {exc.msg}") from None
    if not isinstance(data, dict) or data.get("dynlab_calibration") != PROFILE_VERSION:
        raise InputError(path, 1, "not a dynlab calibration profile (no \"dynlab_calibration\": 1; "
                                  "write one with dynlab calibrate)")
    unknown = sorted(set(data) - set(PROFILE_KEYS))
    if unknown:
        raise InputError(path, 1, f"unknown key {unknown[0]!r} (a profile has {', '.join(PROFILE_KEYS)})")
    for key, kind in (("model", str), ("gpu", str), ("tp", int), ("latency_model", str), ("latency_opts", dict),
                      ("cv_error_pct", dict)):
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise InputError(path, 1, f"{key!r} must be a {kind.__name__}, got {data.get(key)!r}")
    for name, value in {**data["latency_opts"], **data["cv_error_pct"]}.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InputError(path, 1, f"{name!r} must be a finite number >= 0, got {value!r}")
    return data


def error_band(profile: dict, metric: str) -> float | None:
    """The cross-validated error (percent) of ``metric`` in ``profile``, or None when it has none."""
    value = profile.get("cv_error_pct", {}).get(metric)
    return None if value is None else float(value)


__all__ = ["PROFILE_KEYS", "PROFILE_VERSION", "error_band", "profile_json", "read_profile"]
