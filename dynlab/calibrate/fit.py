"""Fit a latency model's coefficients to measured benchmark runs, with a cross-validated error.

:func:`calibrate` replays every measured point (:func:`dynlab.calibrate.replay.replay`) and moves the
named options of the latency model (:data:`DEFAULT_FIT`: ``linear``'s ``beta0, beta1, beta2``,
``roofline``'s ``mfu, mbu, overhead_ms``) to minimise the squared log ratios predicted / measured of
:data:`FIT_METRICS`, with scipy's ``least_squares`` (trust-region reflective, finite differences,
each option within its declared bounds). The error it quotes is k-fold cross-validated: the points are
dealt into ``folds`` folds (point ``i`` to fold ``i mod k``), each fold is predicted by a fit on the
others started from the same defaults, and the error of a metric is the median over all held-out
predictions of ``|predicted / measured - 1|``, in percent. With fewer than 3 points there is no
cross-validation (``cv_error_pct`` is empty and the calibration says so).

scipy is an optional dependency (``pip install 'dynlab[calibrate]'``); without it :func:`calibrate`
raises :class:`CalibrationError` naming the extra.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

from dynlab.calibrate.formats import MeasuredPoint
from dynlab.calibrate.replay import METRICS, ReplayError, lengths, measured, replay
from dynlab.engine.config import SimConfig

#: the options fitted by default, per latency model (``request_overhead_ms``: the run's, not the model's)
DEFAULT_FIT = {"linear": ("beta0", "beta1", "beta2", "request_overhead_ms"),
               "roofline": ("mfu", "mbu", "overhead_ms", "request_overhead_ms")}
#: run settings (SimConfig fields) a fit may move besides the latency model's options: (starting value, unit)
RUN_PARAMS = {"request_overhead_ms": 10.0}
#: the figures the fit minimises (the others of METRICS are reported, not fitted: p99s are noisy)
FIT_METRICS = ("median_ttft_ms", "median_tpot_ms", "median_e2el_ms", "total_token_throughput_per_gpu")
#: a replay that yields no figure for a measured metric counts as this log ratio
_MISSING = 5.0


class CalibrationError(ValueError):
    """The calibration cannot be made (no points, no scipy, an option that cannot be fitted)."""


@dataclass
class Calibration:
    """A fit: ``latency_model`` with ``opts`` (every fitted option's value); ``before`` and ``after``:
    per point ``{"source", "measured", "predicted", "error_pct"}`` (error_pct: predicted / measured - 1,
    in percent) at the starting and at the fitted options; ``cv_error_pct``: per metric the median
    absolute held-out error in percent (empty without cross-validation); ``folds``: k (0: none);
    ``on_bound``: each fitted option the fit on every point left on a bound of its range (its declared minimum or
    maximum, or the fit's floor of 1e-6 times its start) -> that bound: the model cannot explain the points with
    it inside its range (scipy's ``active_mask``)."""

    latency_model: str
    opts: dict
    before: list
    after: list
    cv_error_pct: dict = field(default_factory=dict)
    folds: int = 0
    cv_points: list = field(default_factory=list)
    on_bound: dict = field(default_factory=dict)


def _fit_options(config: SimConfig, names: Sequence[str]) -> list:
    """The ``StrategyOption`` of each name, checked: a float option of the latency model."""
    from dynlab.plugins import latency_models

    from dynlab.routing.strategy import StrategyOption

    cls = latency_models().get(config.latency_model)
    options = {o.name: o for o in cls.options}
    options.update({name: StrategyOption(name, float, start, "a run setting", minimum=0.0)
                    for name, start in RUN_PARAMS.items()})
    out = []
    for name in names:
        option = options.get(name)
        if option is None or option.type is not float:
            known = ", ".join(o.name for o in options.values() if o.type is float)
            raise CalibrationError(f"--fit {name}: not a number option of latency model {config.latency_model} "
                                   f"(it has {known})")
        out.append(option)
    return out


def _start(config: SimConfig, option) -> float:
    if option.name in RUN_PARAMS:
        return getattr(config, option.name) or RUN_PARAMS[option.name]
    value = config.latency_opts.get(option.name, option.default)
    value = float(value) if value is not None else 0.0
    return value if value > 0 else 1e-3


def _with(config: SimConfig, names, values) -> SimConfig:
    opts = dict(config.latency_opts)
    opts.update({n: repr(float(v)) for n, v in zip(names, values) if n not in RUN_PARAMS})
    run = {n: float(v) for n, v in zip(names, values) if n in RUN_PARAMS}
    return replace(config, latency_opts=opts, **run)


def _row(point: MeasuredPoint, config: SimConfig, pairs, tick=None) -> dict:
    want = measured(point)
    got = replay(point, config, pairs)
    if tick:
        tick()
    return {"source": point.source, "measured": want,
            "predicted": {m: got[m] for m in want if m in got},
            "error_pct": {m: 100.0 * (got[m] / want[m] - 1.0) for m in want if m in got and math.isfinite(got[m])}}


def _residuals(points, configs, pairs, tick=None) -> list:
    out = []
    for point, config, p in zip(points, configs, pairs):
        want, got = measured(point), replay(point, config, p)
        if tick:
            tick()
        for m in FIT_METRICS:
            if m in want:
                value = got.get(m)
                ok = value is not None and math.isfinite(value) and value > 0
                out.append(math.log(value / want[m]) if ok else _MISSING)
    return out


#: starting values of the front end (ms) tried when ``request_overhead_ms`` is fitted: a replay's figures
#: jump where a request's arrival crosses a step boundary, so one start can stall in a local minimum
FRONT_STARTS = (20.0, 1.0, 150.0)


def _least_squares(points, configs, pairs, options, max_nfev: int, tick=None) -> tuple[list[float], dict]:
    """The fitted values of ``options``: scipy's ``least_squares`` (each option scaled by its starting value,
    so each moves by ratios) from every start of :data:`FRONT_STARTS` (one start when the front end is not
    fitted) with coarse finite differences (10 %), then polished from the best with fine ones (0.5 %).
    ``tick``: called after every replay, or ``None``. Returns ``(values, on_bound)``: the options' fitted values and
    those left on a bound -> the bound (:attr:`Calibration.on_bound`)."""
    try:
        from scipy.optimize import least_squares
    except ImportError:
        raise CalibrationError("dynlab calibrate needs scipy: pip install 'dynlab[calibrate]'") from None
    names = [o.name for o in options]
    x0 = [_start(configs[0], o) for o in options]
    lo = [max((o.minimum or 0.0) / x, 1e-6) for o, x in zip(options, x0)]
    hi = [(o.maximum / x if o.maximum is not None else math.inf) for o, x in zip(options, x0)]

    def fun(u):
        values = [ui * xi for ui, xi in zip(u, x0)]
        return _residuals(points, [_with(c, names, values) for c in configs], pairs, tick)

    def solve(u, step):
        return least_squares(fun, u, bounds=(lo, hi), method="trf", diff_step=step, xtol=1e-8, ftol=1e-10,
                             max_nfev=max_nfev)

    base = [min(max(1.0, a), b) for a, b in zip(lo, hi)]
    starts = [base]
    if "request_overhead_ms" in names:
        i = names.index("request_overhead_ms")
        starts = [base[:i] + [front / x0[i]] + base[i + 1:] for front in FRONT_STARTS]
    best = None
    for u in starts:  # the next start only while none fits (a residual of 1e-6 is 0.1 % on every figure)
        f = solve(u, 0.1)
        best = f if best is None or f.cost < best.cost else best
        if best.cost < 1e-6 * len(best.fun):
            break
    fit = best
    if best.cost > 1e-12:  # polish what is not exact already
        polished = solve(best.x, 0.005)
        fit = polished if polished.cost <= best.cost else best
    on_bound = {n: float((lo[i] if side < 0 else hi[i]) * x0[i])
                for i, (n, side) in enumerate(zip(names, fit.active_mask)) if side}
    return [float(ui * xi) for ui, xi in zip(fit.x, x0)], on_bound


def _prepare(points, configs, fit) -> tuple:
    """``(latency model, fitted names, their options, each point's lengths)``, checked (:func:`calibrate`)."""
    if not points:
        raise CalibrationError("no measured points to calibrate on")
    model = configs[0].latency_model
    names = tuple(fit) if fit else DEFAULT_FIT.get(model)
    if not names:
        raise CalibrationError(f"latency model {model} has no default options to fit: name them with --fit")
    options = _fit_options(configs[0], names)
    for point in points:
        if not any(m in measured(point) for m in FIT_METRICS):
            raise ReplayError(f"{point.source}: none of {', '.join(FIT_METRICS)} is measured")
    return model, names, options, [lengths(p) for p in points]


def _ticker(progress: Optional[Callable[[str], None]], stage: str):
    """A no-argument callable telling ``progress`` of one replay in ``stage``, or ``None`` without ``progress``."""
    return (lambda: progress(stage)) if progress else None


def calibrate(points: Sequence[MeasuredPoint], configs: Sequence[SimConfig], fit: Optional[Sequence[str]] = None,
              folds: int = 5, max_nfev: int = 60, progress: Optional[Callable[[str], None]] = None) -> Calibration:
    """Fit ``configs[0].latency_model``'s options ``fit`` (default :data:`DEFAULT_FIT`) to ``points``
    (``configs[i]`` replays ``points[i]``: its model, GPU, tp; module docstring). Raises
    :class:`CalibrationError` (nothing to fit, no scipy, a bad ``--fit`` name) or
    :class:`~dynlab.calibrate.replay.ReplayError` (a point that cannot be replayed). ``progress``: called with
    the stage (``"fit"``, then ``"fold I/K"`` for each cross-validation fit) after every replay, so a caller can
    show progress (the library prints nothing; ``dynlab calibrate`` drives a tqdm bar on a terminal), or ``None``."""
    model, names, options, pairs = _prepare(points, configs, fit)
    tick = _ticker(progress, "fit")
    before = [_row(p, c, q, tick) for p, c, q in zip(points, configs, pairs)]
    values, on_bound = _least_squares(points, configs, pairs, options, max_nfev, tick)
    fitted = [_with(c, names, values) for c in configs]
    after = [_row(p, c, q, tick) for p, c, q in zip(points, fitted, pairs)]
    out = Calibration(model, dict(zip(names, values)), before, after, on_bound=on_bound)
    k = min(folds, len(points))
    if k >= 2 and len(points) >= 3:
        out.folds, out.cv_points = k, _cross_validate(points, configs, pairs, options, k, max_nfev, progress)
        out.cv_error_pct = cv_errors(out.cv_points)
    return out


def cross_validate(points: Sequence[MeasuredPoint], configs: Sequence[SimConfig],
                   fit: Optional[Sequence[str]] = None, folds: int = 5, max_nfev: int = 60) -> list[dict]:
    """The held-out rows of :func:`calibrate` alone (its ``cv_points``, the same folds and fits), without its fit
    on every point nor the rows before and after it: one fit fewer, for a score that needs only the held-out
    error (benchmarks/fidelity_real.py ``--cv-only``). ``k = min(folds, points)``; raises
    :class:`CalibrationError` below 3 points or 2 folds, and what :func:`calibrate` raises."""
    _, _, options, pairs = _prepare(points, configs, fit)
    k = min(folds, len(points))
    if k < 2 or len(points) < 3:
        raise CalibrationError(f"cross-validation needs 3 points and 2 folds (here {len(points)} and {folds})")
    return _cross_validate(points, configs, pairs, options, k, max_nfev)


def _cross_validate(points, configs, pairs, options, k: int, max_nfev: int, progress=None) -> list:
    names = [o.name for o in options]
    rows = [None] * len(points)
    for fold in range(k):
        tick = _ticker(progress, f"fold {fold + 1}/{k}")
        train = [i for i in range(len(points)) if i % k != fold]
        values, _ = _least_squares([points[i] for i in train], [configs[i] for i in train],
                                   [pairs[i] for i in train], options, max_nfev, tick)
        for i in range(fold, len(points), k):
            rows[i] = _row(points[i], _with(configs[i], names, values), pairs[i], tick)
    return rows


def cv_errors(rows: Sequence[dict]) -> dict:
    """Per metric (in :data:`METRICS` order) the median of ``|error_pct|`` over ``rows``, rounded to 0.1."""
    from statistics import median

    out = {}
    for m in METRICS:
        errs = [abs(r["error_pct"][m]) for r in rows if m in r["error_pct"]]
        if errs:
            out[m] = round(median(errs), 1)
    return out


__all__ = ["Calibration", "CalibrationError", "DEFAULT_FIT", "FIT_METRICS", "calibrate", "cross_validate", "cv_errors"]
