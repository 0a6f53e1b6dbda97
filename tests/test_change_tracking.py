"""Change tracking of the pure map (rules T and D of ``cowstate.state_map``):
what changed and what was removed since a base snapshot, at a bounded cost.

The map machine checks the tracking against the model after every step
(``cowstate_spec.machine.ChangeTracking``, on ``cow-map-128``); these tests
pin the API, the memory bound and that nothing is spent when it is off. The
C map does not track changes (its backend writes full checkpoints).
"""

from __future__ import annotations

from typing import Any

import pytest

from cowstate.errors import InvalidArgumentError
from cowstate.state_map import DEFAULT_REMOVAL_LIMIT, CopyOnWriteStateMap
from cowstate_spec.invariants import changed_keys, check_map

Map = CopyOnWriteStateMap[Any, Any, Any]


def filled(n: int = 6, limit: int = DEFAULT_REMOVAL_LIMIT) -> Map:
    m: Map = CopyOnWriteStateMap()
    for i in range(n):
        m.put(i, "ns", [i])
    m.track_changes(limit)
    return m


def test_a_map_does_not_track_until_asked_and_logs_nothing() -> None:
    m: Map = CopyOnWriteStateMap()
    m.put(1, "ns", [1])
    m.remove(1, "ns")
    assert m.tracking_since is None
    assert m.removals_since(0) is None
    assert m._removals is None  # no log: a removal costs one attribute test
    snap = m.snapshot()
    assert m._guard == m._highest_required == snap.version  # get compares what it did
    snap.release()
    assert m._guard == 0
    check_map(m)


def test_a_get_after_the_base_was_written_marks_the_state_without_copying_it() -> None:
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


def test_changed_items_are_what_was_put_replaced_transformed_or_handed_out() -> None:
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


def test_removals_name_each_key_once_in_the_order_of_its_last_removal() -> None:
    m = filled()
    base = m.snapshot()
    m.remove(1, "ns")
    m.remove(2, "ns")
    m.put(1, "ns", [1])
    m.remove(1, "ns")
    m.remove(7, "ns")  # absent: nothing removed, nothing logged
    assert m.removals_since(base.version) == [(2, "ns"), (1, "ns")]
    base.release()


def test_the_removal_log_holds_at_most_its_limit_then_older_bases_are_refused() -> None:
    m = filled(n=8, limit=3)
    base = m.snapshot()
    for i in range(3):
        m.remove(i, "ns")
    assert m.removals_since(base.version) == [(i, "ns") for i in range(3)]
    m.remove(3, "ns")  # the fourth record overflows: the log starts over
    assert m._removals is not None and len(m._removals) <= 3
    assert m.removals_since(base.version) is None  # the next checkpoint is full
    assert m.tracking_since == base.version + 1
    base.release()
    after = m.snapshot()
    m.remove(4, "ns")
    assert m.removals_since(after.version) == [(4, "ns")]
    after.release()
    check_map(m)


def test_trim_drops_older_records_and_refuses_older_bases() -> None:
    m = filled()
    first = m.snapshot()
    m.remove(0, "ns")
    second = m.snapshot()
    m.remove(1, "ns")
    m.trim_removals(second.version)
    assert m.removals_since(second.version) == [(1, "ns")]
    assert m.removals_since(first.version) is None
    assert m._removals == [(second.version, 1, "ns")]
    first.release()
    second.release()
    check_map(m)


@pytest.mark.parametrize("limit", [0, -1, 1.5, "8", True])
def test_a_removal_limit_that_is_not_a_positive_int_is_refused(limit: Any) -> None:
    m: Map = CopyOnWriteStateMap()
    with pytest.raises(InvalidArgumentError, match="expected a removal limit >= 1"):
        m.track_changes(limit)
    assert m.tracking_since is None
