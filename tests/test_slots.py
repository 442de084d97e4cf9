"""dynlab.slots.quick_maker and quick_replacer: the same objects as the dataclass constructors and
``dataclasses.replace``, faster (issue 23, start-up pass; issue 39, the timed fleet's routed request)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynlab.routing.strategy import NO_ATTRS, Request, make_request, reroute
from dynlab.slots import quick_maker, quick_replacer


@given(st.lists(st.integers(), max_size=6).map(tuple), st.integers(0, 10**6), st.integers(0, 10**6),
       st.one_of(st.none(), st.floats(0, 1e9)), st.integers(0, 10**6))
def test_make_request_is_the_constructor(hashes, inp, out, ts, index):
    made, ref = make_request(hashes, inp, out, ts, index), Request(hashes, inp, out, ts, index)
    assert type(made) is Request
    assert made == ref and hash(made) == hash(ref) and repr(made) == repr(ref)
    assert made.prefix is None and made.runs is None and made.output_hashes is None
    assert made.attrs is NO_ATTRS and ref.attrs is NO_ATTRS  # one shared empty mapping, not one per request


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


_ATTRS = st.dictionaries(st.sampled_from(["priority", "tenant", "x"]), st.integers() | st.text(max_size=3),
                         max_size=3).map(MappingProxyType)


@given(st.lists(st.integers(), max_size=6).map(tuple), st.integers(0, 10**6), st.one_of(st.none(), st.integers()),
       st.one_of(st.none(), st.lists(st.integers(), max_size=3).map(tuple)), _ATTRS,
       st.lists(st.integers(), max_size=4).map(tuple), st.floats(0, 1e9),
       st.one_of(st.none(), st.just([(1, 2)])))
def test_reroute_is_dataclasses_replace(hashes, inp, prefix, reply, attrs, new_hashes, t, runs):
    req = Request(hashes, inp, 3, 1.0, 7, prefix, output_hashes=reply, attrs=attrs)
    made, ref = reroute(req, new_hashes, t, runs), replace(req, hashes=new_hashes, timestamp=t, runs=runs)
    assert type(made) is Request and made == ref and repr(made) == repr(ref) and hash(made) == hash(ref)
    assert made.runs is ref.runs and made.attrs is req.attrs and made.output_hashes is req.output_hashes


def test_attrs_are_neither_compared_nor_shown():
    a, b = Request((1,), 5), Request((1,), 5, attrs=MappingProxyType({"tenant": "t"}))
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b) and "attrs" not in repr(b)
    assert b.attrs["tenant"] == "t"


def test_what_quick_replacer_refuses():
    with pytest.raises(ValueError, match="no field"):
        quick_replacer(_Pair, ("d",))
    assert quick_replacer(_Pair, ("c",))(_Pair(1, 3, [4]), [5]) == _Pair(1, 3, [5])

    @dataclass(frozen=True)
    class Plain:
        a: int

    with pytest.raises(TypeError):
        quick_replacer(Plain, ("a",))
