"""How engine block names group into trace blocks: the encoding :mod:`dynlab.engine.names` writes and the
run-keyed block pool (:mod:`dynlab.kv.run_pool`) and router index (:mod:`dynlab.routing.run_index`) read.

An engine block name is ``trace id * 1024 + offset`` (``offset`` < 1024), so ``name >> GROUP_SHIFT`` is its
**group** (the trace block) and ``name & GROUP_LOW`` its offset: the names of one group are one bitmask of
offsets. Python's ``>>`` and ``&`` floor, so any int, negative too, has a group and an offset.
"""
from __future__ import annotations

from typing import List

__all__ = ["GROUP_SHIFT", "GROUP_SIZE", "GROUP_LOW", "set_bits"]

#: names ``(group << GROUP_SHIFT) + 0 .. GROUP_SIZE - 1`` form one group
GROUP_SHIFT = 10
GROUP_SIZE = 1 << GROUP_SHIFT
GROUP_LOW = GROUP_SIZE - 1


def set_bits(mask: int) -> List[int]:
    """The positions of the set bits of ``mask`` (an int >= 0), lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
