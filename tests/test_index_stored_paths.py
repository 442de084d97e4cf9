"""KvIndex.apply_event's BlockStored paths (new names, names held elsewhere, names given twice) agree
with applying the event's names one at a time (the copy-counting rule of the class docstring)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.routing.events import BlockRemoved, BlockStored
from dynlab.routing.index import KvIndex


def test_a_name_twice_in_one_new_event_is_two_copies():
    # fresh index, worker 0 stores [5, 6, 5]: 5 gets a copy, so one removal of 5 keeps it (by hand)
    idx = KvIndex()
    assert idx.apply_event(BlockStored(0, (5, 6, 5)))
    assert idx.find_matches([5, 6]) == {0: 2}
    idx.apply_event(BlockRemoved(0, (5,)))
    assert idx.holders(5) == frozenset({0})
    idx.apply_event(BlockRemoved(0, (5,)))
    assert idx.holders(5) == frozenset()
    assert len(idx) == 1


events = st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.lists(st.integers(0, 6), min_size=1, max_size=5)),
                  max_size=30)


@given(events)
@settings(max_examples=300)
def test_stored_paths_match_one_name_at_a_time(evs):
    """Property: an event of several names leaves the index as the same names in one-name events do."""
    whole, single = KvIndex(), KvIndex()
    for stored, w, names in evs:
        kind = BlockStored if stored else BlockRemoved
        whole.apply_event(kind(w, tuple(names)))
        for h in names:
            single.apply_event(kind(w, (h,)))
        assert whole._holders == single._holders
        assert whole._copies == single._copies


changes = st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 6), max_size=5),
                             st.lists(st.integers(0, 6), max_size=5), st.booleans()), max_size=30)


@given(changes)
@settings(max_examples=300)
def test_apply_change_is_the_two_events(chs):
    """Property: apply_change(w, stored, removed) leaves the index and its counters as BlockRemoved then
    BlockStored do (lists or tuples; an empty side makes no event)."""
    direct, evented = KvIndex(), KvIndex()
    for w, stored, removed, as_list in chs:
        s, r = (stored, removed) if as_list else (tuple(stored), tuple(removed))
        direct.apply_change(w, s, r)
        if removed:
            evented.apply_event(BlockRemoved(w, tuple(removed)))
        if stored:
            evented.apply_event(BlockStored(w, tuple(stored)))
        assert direct._holders == evented._holders
        assert direct._copies == evented._copies
        assert direct.refusals() == evented.refusals()
