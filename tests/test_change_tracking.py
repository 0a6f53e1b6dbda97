"""Change tracking of both maps (rules T and D of ``cowstate.state_map``, the
same rules in ``_cmap.c``): what changed and what was removed since a base
snapshot, at a bounded cost.

The map machine checks the tracking against the model after every step
(``cowstate_spec.machine.ChangeTracking``, on ``cow-map-128`` and
``c-map-128``); these tests pin the API, its argument checks, the memory
bound and that nothing is spent when it is off, on the pure map and on the
C map alike (the ``new_map`` fixture).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from cowstate.errors import InvalidArgumentError, TransformFunctionError
from cowstate.maps import c_map_class
from cowstate.state_map import DEFAULT_REMOVAL_LIMIT, CopyOnWriteStateMap
from cowstate_spec.cmap_view import MapView, is_c_map
from cowstate_spec.invariants import changed_keys, check_map

Map = Any  # CopyOnWriteStateMap or the C map of the same API
C_MAP = c_map_class()
MAPS = [
    pytest.param(CopyOnWriteStateMap, id="pure"),
    pytest.param(
        C_MAP,
        id="c",
        marks=pytest.mark.skipif(
            C_MAP is None, reason="the C map is not built (tests/test_implementations.py fails)"
        ),
    ),
]


@pytest.fixture(params=MAPS)
def new_map(request: pytest.FixtureRequest) -> Callable[[], Map]:
    """The map class under test: the pure map, then the C map."""
    cls: Callable[[], Map] = request.param
    return cls


def removal_log(m: Map) -> list[tuple[int, Any, Any]] | None:
    """The removal log as ``(version, key, namespace)`` records, None when not
    tracking (the C map's through its structure export)."""
    log: list[tuple[int, Any, Any]] | None = MapView(m)._removals if is_c_map(m) else m._removals
    return log


@pytest.fixture
def filled(new_map: Callable[[], Map]) -> Callable[..., Map]:
    def make(n: int = 6, limit: int = DEFAULT_REMOVAL_LIMIT) -> Map:
        m = new_map()
        for i in range(n):
            m.put(i, "ns", [i])
        m.track_changes(limit)
        return m

    return make


def test_a_map_does_not_track_until_asked_and_logs_nothing(new_map: Callable[[], Map]) -> None:
    m = new_map()
    m.put(1, "ns", [1])
    m.remove(1, "ns")
    assert m.tracking_since is None
    assert m.removals_since(0) is None
    assert removal_log(m) is None  # no log: a removal costs one test
    snap = m.snapshot()
    assert m._guard == m._highest_required == snap.version  # get compares what it did
    snap.release()
    assert m._guard == 0
    check_map(m)


def test_a_get_after_the_base_was_written_marks_the_state_without_copying_it(
    filled: Callable[..., Map],
) -> None:
    m = filled()
    state = m.get(2, "ns")
    base = m.snapshot()
    base.release()  # the writer is done: nothing to copy for
    got = m.get(2, "ns")
    assert got is state  # rule T marks, it does not copy
    assert got is not None
    got.append(99)
    later = m.snapshot()
    assert sorted(k for k, _, _ in later.changed_items(base.version)) == [2]
    later.release()
    check_map(m)


def test_changed_items_are_what_was_put_replaced_transformed_or_handed_out(
    filled: Callable[..., Map],
) -> None:
    m = filled()
    m.get(0, "ns")  # before the base: not a change since it
    base = m.snapshot()
    m.put(1, "ns", [10])  # replaced
    m.put(9, "ns", [9])  # inserted
    m.transform(2, "ns", 5, lambda old, v: [*(old or []), v])
    m.put_and_get_old(3, "ns", [30])
    m.get(4, "ns")  # handed out while the base is open: rule S copies and marks
    m.remove(5, "ns")
    base.release()
    later = m.snapshot()
    changed = sorted(k for k, _, _ in later.changed_items(base.version))
    assert changed == [1, 2, 3, 4, 9]
    assert m.removals_since(base.version) == [(5, "ns")]
    assert changed_keys(m, base.version) == {(k, "ns") for k in changed}
    later.release()


def test_removals_name_each_key_once_in_the_order_of_its_last_removal(
    filled: Callable[..., Map],
) -> None:
    m = filled()
    base = m.snapshot()
    m.remove(1, "ns")
    m.remove(2, "ns")
    m.put(1, "ns", [1])
    m.remove(1, "ns")
    m.remove(7, "ns")  # absent: nothing removed, nothing logged
    assert m.removals_since(base.version) == [(2, "ns"), (1, "ns")]
    base.release()


def test_the_removal_log_holds_at_most_its_limit_then_older_bases_are_refused(
    filled: Callable[..., Map],
) -> None:
    m = filled(n=8, limit=3)
    base = m.snapshot()
    for i in range(3):
        m.remove(i, "ns")
    assert m.removals_since(base.version) == [(i, "ns") for i in range(3)]
    m.remove(3, "ns")  # the fourth record overflows: the log starts over
    log = removal_log(m)
    assert log is not None and len(log) <= 3
    assert m.removals_since(base.version) is None  # the next checkpoint is full
    assert m.tracking_since == base.version + 1
    base.release()
    after = m.snapshot()
    m.remove(4, "ns")
    assert m.removals_since(after.version) == [(4, "ns")]
    after.release()
    check_map(m)


def test_trim_drops_older_records_and_refuses_older_bases(filled: Callable[..., Map]) -> None:
    m = filled()
    first = m.snapshot()
    m.remove(0, "ns")
    second = m.snapshot()
    m.remove(1, "ns")
    m.trim_removals(second.version)
    assert m.removals_since(second.version) == [(1, "ns")]
    assert m.removals_since(first.version) is None
    assert removal_log(m) == [(second.version, 1, "ns")]
    first.release()
    second.release()
    check_map(m)


@pytest.mark.parametrize("limit", [0, -1, 1.5, "8", True, None])
def test_a_removal_limit_that_is_not_a_positive_int_is_refused(
    new_map: Callable[[], Map], limit: Any
) -> None:
    m = new_map()
    with pytest.raises(InvalidArgumentError, match="expected a removal limit >= 1"):
        m.track_changes(limit)
    assert m.tracking_since is None
    assert removal_log(m) is None


def test_a_bad_removal_limit_leaves_a_tracking_map_as_it_was(filled: Callable[..., Map]) -> None:
    m = filled(limit=4)
    base = m.snapshot()
    m.remove(0, "ns")
    with pytest.raises(InvalidArgumentError, match="expected a removal limit >= 1, got 0"):
        m.track_changes(0)
    assert m.tracking_since == 1
    assert removal_log(m) == [(base.version, 0, "ns")]
    m.remove(1, "ns")
    m.remove(2, "ns")
    m.remove(3, "ns")  # still the limit of 4
    assert m.removals_since(base.version) == [(i, "ns") for i in range(4)]
    base.release()
    check_map(m)


@pytest.mark.parametrize("version", [None, "1", 1.0, True])
def test_a_version_that_is_not_an_int_is_refused_and_changes_nothing(
    filled: Callable[..., Map], version: Any
) -> None:
    m = filled()
    base = m.snapshot()
    m.remove(0, "ns")
    for call in (m.removals_since, m.trim_removals, base.changed_items):
        with pytest.raises(InvalidArgumentError, match=r"expected an int (version|since), got"):
            call(version)
    assert removal_log(m) == [(base.version, 0, "ns")]
    assert m.tracking_since == 1
    base.release()
    check_map(m)


def test_trimming_past_the_next_snapshot_is_refused(filled: Callable[..., Map]) -> None:
    m = filled()
    base = m.snapshot()
    m.remove(0, "ns")
    with pytest.raises(InvalidArgumentError, match=r"expected a version <= V \+ 1 = 2 .*got 3"):
        m.trim_removals(base.version + 2)
    assert m.tracking_since == 1 and removal_log(m) == [(base.version, 0, "ns")]
    m.trim_removals(base.version + 1)  # the next snapshot's: everything older goes
    assert m.tracking_since == 2 and removal_log(m) == []
    base.release()
    check_map(m)


def test_a_huge_limit_is_a_bound_no_log_reaches(filled: Callable[..., Map]) -> None:
    m = filled(limit=10**30)
    base = m.snapshot()
    for i in range(6):
        m.remove(i, "ns")
    assert m.removals_since(base.version) == [(i, "ns") for i in range(6)]
    assert m.removals_since(10**30) == [] and m.removals_since(-(10**30)) is None
    base.release()
    check_map(m)


class ReentrantKey:
    """A key whose finalizer removes another mapping from the map: the drop of
    an overflowed or trimmed log runs it while the map is mid-operation."""

    def __init__(self, m: Map, victim: int) -> None:
        self.m = m
        self.victim = victim

    def __del__(self) -> None:
        self.m.remove(self.victim, "ns")


@pytest.mark.parametrize("limit", [1, 2])
def test_a_finalizer_run_by_dropping_the_log_may_use_the_map(
    filled: Callable[..., Map], limit: int
) -> None:
    # The pure map cleared its full log in place before it appended: a key's
    # finalizer that removed meanwhile logged into the cleared list, and the
    # record appended after it made two records over a limit of 1 (inv. 13).
    m = filled(n=8, limit=limit)
    m.put(ReentrantKey(m, 7), "ns", [0])
    base = m.snapshot()
    base.release()  # written: nothing but the log holds a removed key then
    key = next(k for k, _, _ in m if isinstance(k, ReentrantKey))
    m.remove(key, "ns")
    del key
    if limit == 2:
        m.remove(0, "ns")  # the log holds the key and (0, "ns"): full
    m.remove(1, "ns")  # overflow: dropping the key's record removes 7 meanwhile
    assert not m.contains_key(7, "ns")
    assert m.tracking_since == base.version + 1
    log = removal_log(m)
    assert log is not None and [k for _, k, _ in log] == [1, 7][-limit:]
    check_map(m)


def test_a_removed_key_that_refers_to_its_map_is_collected(new_map: Callable[[], Map]) -> None:
    # The log holds the key alive: the map's tp_traverse visits it, so the
    # cycle map -> log -> key -> map is found.
    m = new_map()
    m.track_changes(4)

    class Key:
        def __init__(self, owner: Map) -> None:
            self.owner = owner

    key = Key(m)
    m.put(key, "ns", 1)
    m.remove(key, "ns")
    dead = weakref.ref(m)
    del m, key
    gc.collect()
    assert dead() is None


def test_a_failed_transform_that_changed_the_state_in_place_is_tracked(
    filled: Callable[..., Map],
) -> None:
    # The transform contract keeps an in-place change its function made to the
    # stored state before raising; transform marked the state only once the
    # function returned, so such a change was missing from the next delta
    # (the hostile map machine on c-map-128 found it).
    m = filled()
    base = m.snapshot()
    base.release()  # written: transform hands out the stored state

    def mutate_then_raise(old: Any, value: int) -> Any:
        old.append(value)
        raise ValueError("after the change")

    with pytest.raises(TransformFunctionError):
        m.transform(3, "ns", 7, mutate_then_raise)
    later = m.snapshot()  # (no get before it: a get would mark the state itself)
    assert {k: s for k, _, s in later.items()}[3] == [3, 7]
    assert [(k, s) for k, _, s in later.changed_items(base.version)] == [(3, [3, 7])]
    later.release()
    check_map(m)
