"""Runs of names for the pool tests: what the engine hands :class:`dynlab.kv.run_pool.RunBlockPool`."""
from __future__ import annotations


def runs_of(names, split: int = 0) -> list:
    """``names`` as runs ``(first name, count)``: consecutive ascending names within a group of 1024
    (``name >> 10``), cut every ``split`` names when ``split > 0`` (runs need not be maximal)."""
    runs: list = []
    for name in names:
        if runs:
            first, c = runs[-1]
            if name == first + c and name >> 10 == first >> 10 and (split <= 0 or c < split):
                runs[-1] = (first, c + 1)
                continue
        runs.append((name, 1))
    return runs
