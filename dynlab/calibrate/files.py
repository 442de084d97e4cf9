"""``dynlab calibrate``'s library side: read the benchmark files, settle each point's hardware, fit, and
return the profile (:mod:`dynlab.latency.profile`).

Each point is replayed on ``model`` and ``gpu`` when given, else on those its file names; on the tp its
file states, else ``tp`` (1 when neither). A file's model is a Hugging Face id
(``meta-llama/Llama-3.1-8B-Instruct``): it is taken as dynlab's bundled name when its last part, lower
case, is one (``llama-3.1-8b-instruct`` is not; give ``--model``). A profile is for one model and one
GPU: points on several are refused.
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
    from dynlab.models.config import bundled_models

    if point.model:
        name = point.model.rsplit("/", 1)[-1].lower()
        if name in bundled_models():
            return name
        raise CalibrationError(f"{point.source}: model {point.model!r} is not one dynlab bundles: give --model "
                               "(a bundled name, see dynlab models, or a config.json)")
    raise CalibrationError(f"{point.source}: the file names no model: give --model")


def _gpu(point: MeasuredPoint, given: Optional[str]) -> str:
    if given is not None:
        return given
    if point.gpu:
        return point.gpu.lower()
    raise CalibrationError(f"{point.source}: the file names no GPU: give --gpu")


def point_configs(points: Sequence[MeasuredPoint], base: SimConfig, model: Optional[str] = None,
                  gpu: Optional[str] = None, tp: Optional[int] = None) -> list[SimConfig]:
    """One replay configuration per point: ``base`` with the point's model, GPU and tp (module docstring).
    Raises :class:`CalibrationError` for a point with none given, or for points on several models or GPUs."""
    configs = []
    for p in points:
        configs.append(replace(base, model=_model(p, model), gpu=_gpu(p, gpu), tp=p.tp or tp or 1))
    shapes = {(c.model, c.gpu) for c in configs}
    if len(shapes) > 1:
        listed = ", ".join(f"{m} on {g}" for m, g in sorted(shapes))
        raise CalibrationError(f"the points are on several models or GPUs ({listed}): calibrate one at a time")
    return configs


def calibrate_files(paths: Sequence[str], fmt: Optional[str] = None, model: Optional[str] = None,
                    gpu: Optional[str] = None, tp: Optional[int] = None, latency_model: str = "linear",
                    latency_opts: Optional[dict] = None, fit: Optional[Sequence[str]] = None,
                    folds: int = 5, concurrency: Optional[int] = None,
                    engine: Optional[dict] = None) -> tuple[dict, Calibration]:
    """``(profile, calibration)`` of the points in ``paths`` (each read by
    :func:`~dynlab.calibrate.formats.read_points` with ``fmt``). Raises
    :class:`~dynlab.errors.InputError` / :class:`~dynlab.errors.InputFileError` for a bad file,
    :class:`CalibrationError` and :class:`~dynlab.calibrate.replay.ReplayError` for points that cannot be
    fitted, ``ValueError`` for a bad option. ``concurrency``: the client's users where a file states neither
    ``max_concurrency`` nor a request rate (aiperf's per-request export). ``engine``: the server's engine
    settings the files do not state, as :class:`~dynlab.engine.config.SimConfig` fields
    (``max_num_seqs``, ``max_num_batched_tokens``)."""
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
    base = SimConfig(timing=True, latency_model=latency_model, latency_opts=dict(latency_opts or {}), **(engine or {}))
    configs = point_configs(points, base, model, gpu, tp)
    for config in configs:
        config.validate()
    calibration = calibrate(points, configs, fit, folds)
    return profile_json(calibration, points, configs), calibration


__all__ = ["calibrate_files", "point_configs"]
