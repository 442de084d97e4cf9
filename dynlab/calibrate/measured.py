"""What every reader of :mod:`dynlab.calibrate.formats` shares: :class:`MeasuredPoint` (one measured
benchmark run), the summary statistics of per-request lists as ``vllm bench serve`` computes them
(:func:`summarize`, :func:`percentile`), the checks of a point's settings and the reading of a file's
text and JSON with ``FILE:LINE`` errors.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

from dynlab.errors import InputError, InputFileError


_SUMMARY_KEYS = ("median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "mean_tpot_ms",
                 "p99_tpot_ms", "median_itl_ms", "mean_itl_ms", "median_e2el_ms", "p99_e2el_ms",
                 "total_token_throughput", "output_throughput", "request_throughput", "duration")


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured benchmark run. Settings and metrics are None where the file lacks them.

    Settings: ``model``, ``gpu`` (str), ``tp``, ``ep`` (int), ``max_concurrency`` (int; None = open
    loop), ``request_rate`` (req/s; ``inf`` = all at once; None = not stated), ``num_prompts`` (int),
    ``random_input_len``, ``random_output_len`` (tokens), ``random_range_ratio``, ``backend`` (the
    benchmark client's backend/endpoint type), ``engine`` and ``version`` (the serving engine, where
    stated), ``per_gpu`` (the throughputs are per GPU already), ``source`` ("FILE" or "FILE:LINE"),
    ``arrival`` (how an open-loop client spaced its requests: ``"poisson"``, ``"constant"``; None: not
    stated, replayed as Poisson).

    Per-request data (tuples, None when the format has none): ``input_lens``, ``output_lens``
    (tokens), ``ttfts_ms`` (ms), ``itls_ms`` (ms, a tuple of inter-token gaps per request). Failed
    requests are left out.

    Summary metrics with vllm bench serve's names: ``*_ms`` in ms, ``total_token_throughput`` (input
    + output tokens/s), ``output_throughput`` (tokens/s), ``request_throughput`` (req/s),
    ``duration`` (s).
    """

    source: str
    model: str | None = None
    gpu: str | None = None
    tp: int | None = None
    ep: int | None = None
    max_concurrency: int | None = None
    request_rate: float | None = None
    num_prompts: int | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_range_ratio: float | None = None
    backend: str | None = None
    engine: str | None = None
    version: str | None = None
    per_gpu: bool = False
    arrival: str | None = None
    input_lens: tuple | None = None
    output_lens: tuple | None = None
    ttfts_ms: tuple | None = None
    itls_ms: tuple | None = None
    median_ttft_ms: float | None = None
    mean_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    median_tpot_ms: float | None = None
    mean_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    median_itl_ms: float | None = None
    mean_itl_ms: float | None = None
    median_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    total_token_throughput: float | None = None
    output_throughput: float | None = None
    request_throughput: float | None = None
    duration: float | None = None

    def gpus(self) -> int:
        """The GPUs one replica of the measured server used: ``max(tp, ep, 1)`` (None counts as 1).
        A simplification: an expert-parallel deployment's attention is taken to run data-parallel
        on the same GPUs as its experts, so the count is the larger of the two degrees."""
        return max(self.tp or 1, self.ep or 1, 1)

    def total_token_throughput_per_gpu(self) -> float | None:
        """Input + output tokens/s per GPU: the file's ``total_token_throughput`` as it is when
        ``per_gpu`` is true, else divided by :meth:`gpus`. None when the throughput is unknown."""
        if self.total_token_throughput is None:
            return None
        return self.total_token_throughput if self.per_gpu else self.total_token_throughput / self.gpus()


# --- statistics, with vLLM's definitions -----------------------------------------------------------

def percentile(values, p: float) -> float:
    """The ``p``-th percentile (0-100) of ``values`` by linear interpolation between the closest
    ranks, as numpy's default (``method="linear"``). ``values`` must not be empty."""
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def summarize(input_lens, output_lens, ttfts_ms, itls_ms, e2els_ms=None, duration=None) -> dict:
    """The summary metrics vllm bench serve reports, computed from per-request data (successful
    requests only). Times in ms, ``duration`` in s. TPOT per request with more than one output token
    = (E2E - TTFT)/(output - 1); ITL = all inter-token gaps flattened; E2E defaults to TTFT + the sum
    of the request's gaps. Throughputs need ``duration``; metrics of empty lists are None."""
    if e2els_ms is None:
        e2els_ms = [t + sum(g) for t, g in zip(ttfts_ms, itls_ms)]
    tpots = [(e - t) / (n - 1) for e, t, n in zip(e2els_ms, ttfts_ms, output_lens) if n > 1]
    itls = [g for gaps in itls_ms for g in gaps]
    out: dict = {}
    for name, xs in (("ttft", ttfts_ms), ("tpot", tpots), ("itl", itls), ("e2el", e2els_ms)):
        out[f"mean_{name}_ms"] = _mean(xs)
        out[f"median_{name}_ms"] = percentile(xs, 50) if xs else None
        out[f"p99_{name}_ms"] = percentile(xs, 99) if xs else None
    for key in ("p99_itl_ms", "mean_e2el_ms"):
        out.pop(key)
    if duration:
        out["request_throughput"] = len(ttfts_ms) / duration
        out["output_throughput"] = sum(output_lens) / duration
        out["total_token_throughput"] = (sum(input_lens) + sum(output_lens)) / duration
        out["duration"] = duration
    return out


def _fill_summary(point: MeasuredPoint, computed: dict) -> MeasuredPoint:
    """``point`` with each summary metric it lacks taken from ``computed``."""
    missing = {k: v for k, v in computed.items() if getattr(point, k) is None and v is not None}
    return replace(point, **missing) if missing else point


# --- value checks ----------------------------------------------------------------------------------

#: how an open-loop client spaces its requests (a points file's ``arrival``)
ARRIVALS = ("poisson", "constant")
_INT_SETTINGS = ("tp", "ep", "max_concurrency", "num_prompts", "random_input_len", "random_output_len")
_FLOAT_SETTINGS = ("request_rate", "random_range_ratio")
_STR_SETTINGS = ("model", "gpu", "backend", "engine", "version")


def _number(value, what: str, integer: bool = False, allow_inf: bool = False):
    """``value`` (a JSON number or a string) as an int or a finite float; raises ValueError with a
    message naming ``what``."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a number, got {json.dumps(value)}")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text) if not integer or not text.lstrip("+-").isdigit() else int(text)
        except ValueError:
            raise ValueError(f"{what}: expected a number, got {value!r}") from None
    if not isinstance(value, (int, float)):
        raise ValueError(f"{what}: expected a number, got {json.dumps(value)}")
    if math.isinf(value) and allow_inf and value > 0:
        return math.inf
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: expected a finite number >= 0, got {value!r}")
    if integer:
        if value != int(value):
            raise ValueError(f"{what}: expected a whole number, got {value!r}")
        return int(value)
    return float(value)


def _bool(value, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{what}: expected true or false, got {value!r}")


def _setting(name: str, value, what: str | None = None):
    """A settings or metric value checked and converted for field ``name`` (None stays None);
    ``what`` names it in the ValueError (default ``name``)."""
    what = what or name
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    if name in _STR_SETTINGS:
        return str(value)
    if name == "per_gpu":
        return _bool(value, what)
    if name == "arrival":
        if value not in ARRIVALS:
            raise ValueError(f"{what}: expected one of {', '.join(ARRIVALS)}, got {value!r}")
        return value
    if name in _INT_SETTINGS:
        return _number(value, what, integer=True)
    return _number(value, what, allow_inf=(name == "request_rate"))


# --- file helpers ----------------------------------------------------------------------------------

def _read_text(path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, PermissionError, NotADirectoryError) as exc:
        raise InputFileError(str(path), exc.strerror or type(exc).__name__) from None
    except UnicodeDecodeError:
        raise InputError(str(path), 1, "not a UTF-8 text file") from None


def json_reason(exc: json.JSONDecodeError) -> str:
    """The decoder's whole reason in one line, with the column its line number leaves out (``Unterminated
    string starting at column 14``: ``json``'s ``msg`` alone drops the position)."""
    return f"not valid JSON: {exc.msg}{'' if exc.msg.endswith(' at') else ' at'} column {exc.colno}"


def _load_json(path, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(str(path), exc.lineno, json_reason(exc)) from None


def _key_line(text: str, key: str) -> int:
    """The line where ``"key":`` first appears in ``text`` (1 if it does not)."""
    m = re.search(r'"%s"\s*:' % re.escape(key), text)
    return text.count("\n", 0, m.start()) + 1 if m else 1


def _checked(path, line: int, name: str, value, what: str | None = None):
    try:
        return _setting(name, value, what)
    except ValueError as exc:
        raise InputError(str(path), line, str(exc)) from None


def _first_json_line(text: str):
    for line in text.splitlines():
        if line.strip():
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


assert set(_SUMMARY_KEYS) <= {f.name for f in fields(MeasuredPoint)}
