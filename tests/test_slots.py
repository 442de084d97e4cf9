"""dynlab.slots.quick_maker: the same objects as the dataclass constructors, faster (issue 23, start-up pass)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynlab.routing.strategy import Request, make_request
from dynlab.slots import quick_maker


@given(st.lists(st.integers(), max_size=6).map(tuple), st.integers(0, 10**6), st.integers(0, 10**6),
       st.one_of(st.none(), st.floats(0, 1e9)), st.integers(0, 10**6))
def test_make_request_is_the_constructor(hashes, inp, out, ts, index):
    made, ref = make_request(hashes, inp, out, ts, index), Request(hashes, inp, out, ts, index)
    assert type(made) is Request
    assert made == ref and hash(made) == hash(ref) and repr(made) == repr(ref)
    assert made.prefix is None and made.runs is None and made.output_hashes is None


def test_a_made_object_is_frozen():
    with pytest.raises(AttributeError):
        make_request((1,), 512, 0, None, 0).index = 3


@dataclass(frozen=True, slots=True)
class _Pair:
    a: int
    b: int = 2
    c: list = field(default_factory=list)


def test_what_quick_maker_refuses():
    with pytest.raises(ValueError, match="not a prefix"):
        quick_maker(_Pair, ("b",))
    with pytest.raises(ValueError, match="no plain default"):
        quick_maker(_Pair, ("a",))  # c's default is a factory
    assert quick_maker(_Pair, ("a", "b", "c"))(1, 3, [4]) == _Pair(1, 3, [4])

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    with pytest.raises(TypeError, match="slotted"):
        quick_maker(NoSlots, ("a",))
