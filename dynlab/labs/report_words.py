"""How ``REPORT.md`` (:func:`dynlab.labs.reproduce.render_report`) writes numbers and words: thousands
separators, lists joined with "and", plurals, a value against a quoted band, a pass's hits.
"""
from __future__ import annotations

from typing import Mapping, Sequence, Union


def _n(value: Union[int, float]) -> str:
    """A number as the report prints it: thousands separators for integers."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _join(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _plural(count: int, word: str) -> str:
    return f"{_n(count)} {word}{'' if count == 1 else 's'}"


def _band(value: int, band: tuple[int, int]) -> str:
    low, high = band
    if value < low:
        return "below"
    if value > high:
        return "above"
    return "inside"


def _hits(passes: Mapping) -> int:
    return passes["gpu_hits"] + passes["cpu_hits"]
