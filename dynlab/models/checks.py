"""Argument checks shared by the model catalogue and the transfer cost (one line each, naming the argument).

A non-number (``bool`` included) raises ``TypeError``; an out-of-range value ``ValueError`` whose
message starts with the argument's name.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any


def real(name: str, value: Any) -> float:
    """``value`` if it is a finite number (``TypeError`` / ``ValueError`` naming ``name`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not isinstance(value, int) and not math.isfinite(value):  # an int is finite, however large
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def nbytes_text(n) -> str:
    """``n`` bytes for a message: ``1,146,880`` up to 10^18, ``about 10^N`` beyond (a huge int stays one short line)."""
    if isinstance(n, int) and n >= 10**18:
        return f"about 10^{len(str(n)) - 1}"
    return f"{n:,}"


def nbytes(tokens, bytes_per_token):
    """``tokens * bytes_per_token`` after their checks; ``ValueError`` when the product overflows a float."""
    size = non_negative("tokens", tokens) * non_negative("bytes_per_token", bytes_per_token)
    finite(lambda: size, f"tokens x bytes_per_token = {nbytes_text(size)} bytes overflows a float")
    return size


def finite(compute, message: str) -> float:
    """``compute()`` as a float, or ``ValueError(message)`` when it is not a finite number (a huge size, a
    tiny bandwidth or time: the float overflows, or a divisor underflows to 0)."""
    try:
        value = float(compute())
    except (OverflowError, ZeroDivisionError):
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(message)
    return value


def positive(name: str, value: Any) -> float:
    """``value`` if it is a number > 0."""
    if real(name, value) <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return value


def non_negative(name: str, value: Any) -> float:
    """``value`` if it is a number >= 0."""
    if real(name, value) < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return value


def count(name: str, value: Any) -> int:
    """``value`` if it is an integer >= 0 (not a ``bool``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return value

