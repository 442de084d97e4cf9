"""Reference counts kept as bitmask **levels** per group of names (:class:`~dynlab.kv.run_pool.RunBlockPool`'s counts).

A group's names are bits ``0 .. 1023`` of a mask (name ``(group << 10) + bit``, :mod:`dynlab.groups`).
``counts`` maps a group to its **levels**: ``[L1, L2, ...]``, ``Lk`` the mask of names counted at
least ``k`` times, or the mask ``L1`` alone (an int) when no name is counted twice. Counting a run
once more or once less is a few bitwise operations per level, no step per name.
"""
from __future__ import annotations

from dynlab.groups import GROUP_LOW as _LOW
from dynlab.groups import GROUP_SHIFT as _SHIFT

__all__: list = []  # helpers of dynlab.kv.run_pool


def _top(mask: int, k: int) -> int:
    """The ``k`` highest set bits of ``mask`` (``0 < k < mask.bit_count()``)."""
    cut = mask.bit_length() - k
    top = mask >> cut << cut
    if top.bit_count() == k:  # no hole among them: one shift
        return top
    rest = mask
    for _ in range(k):
        rest ^= 1 << (rest.bit_length() - 1)
    return mask ^ rest


def _once(levels) -> int:
    """The names counted at least once in a group's ``levels`` (``0``: none)."""
    return levels if levels.__class__ is int else levels[0]


def _count(counts: dict, name: int) -> int:
    """How many times ``name`` is counted in ``counts`` (group -> levels)."""
    lv = counts.get(name >> _SHIFT, 0)
    o = name & _LOW
    return lv >> o & 1 if lv.__class__ is int else sum(m >> o & 1 for m in lv)


def _count_in(counts: dict, g: int, bits: int) -> None:
    """Count the names ``bits`` of group ``g`` once more in ``counts`` (group -> levels)."""
    lv = counts.get(g)
    if lv is None:
        counts[g] = bits
    elif lv.__class__ is int:
        counts[g] = lv | bits if not lv & bits else [lv | bits, lv & bits]
    else:
        for k, m in enumerate(lv):
            lv[k] = m | bits
            bits &= m  # those already at this level go one higher
            if not bits:
                return
        lv.append(bits)


def _count_out(counts: dict, g: int, bits: int) -> int:
    """Count the names ``bits`` of group ``g`` (all counted) once less in ``counts``; returns those
    of them no longer counted."""
    lv = counts[g]
    if lv.__class__ is int:
        if lv == bits:
            del counts[g]
        else:
            counts[g] = lv ^ bits
        return bits
    gone = bits & ~lv[1]
    last = len(lv) - 1
    for k in range(last):
        lv[k] = lv[k] & ~bits | lv[k + 1] & bits
    lv[last] &= ~bits
    if not lv[last]:
        lv.pop()
    if len(lv) == 1:
        counts[g] = lv[0]
    return gone
