"""The structural checker catches each kind of corruption it promises to.

Each test builds a healthy map, checks that ``check_map`` accepts it, breaks
one thing by hand, and requires the violation of the right invariant. The
last tests drive maps through growth and rehash with the checker after every
operation (what the state machines do), so mutants that only change structure
or cost -- a table that never grows, a stalled rehash -- are caught.
"""

from __future__ import annotations

from typing import Any

import pytest

from cowstate.state_map import CopyOnWriteStateMap, _Entry
from cowstate_spec.invariants import (
    InvariantViolation,
    chain,
    check_map,
    fingerprint,
    rehash_step_check,
)
from cowstate_spec.keys import HashKey, value_key


def healthy(n: int = 5, capacity: int = 8) -> CopyOnWriteStateMap[Any, Any, Any]:
    m: CopyOnWriteStateMap[Any, Any, Any] = CopyOnWriteStateMap(initial_capacity=capacity)
    for i in range(n):
        m.put(value_key(i), 0, [i])
    check_map(m)
    return m


def rehashing() -> CopyOnWriteStateMap[Any, Any, Any]:
    """A map of capacity 4 in the middle of its rehash to 8."""
    m: CopyOnWriteStateMap[Any, Any, Any] = CopyOnWriteStateMap(initial_capacity=4)
    for i in range(5):
        m.put(value_key(i), 0, [i])
    assert m._rehash is not None and m._rehash_index == 0
    m.get(value_key(0), 0)  # one step: moves buckets 0, 1, ...
    assert m._rehash is not None and 0 < m._rehash_index < 4
    check_map(m)
    return m


def violation(m: CopyOnWriteStateMap[Any, Any, Any], invariant: int, *fps: Any) -> str:
    with pytest.raises(InvariantViolation, match=f"invariant {invariant} violated") as info:
        check_map(m, fps)
    return str(info.value)


def test_wrong_cached_hash_is_invariant_1() -> None:
    m = healthy()
    e = m._primary[1]
    assert e is not None
    e.hash = 9
    assert "caches hash 9" in violation(m, 1)


def test_entry_in_the_wrong_bucket_is_invariant_1() -> None:
    m = healthy()
    m._primary[6] = m._primary[1]
    m._primary[1] = None
    assert "belongs in bucket 1" in violation(m, 1)


def test_entry_in_the_rehash_table_too_early_is_invariant_2() -> None:
    m = rehashing()
    r = m._rehash_index
    e = m._primary[r]
    assert m._rehash is not None and e is not None
    m._primary[r] = e.next
    m._primary_size -= len(chain(e)) - len(chain(e.next))
    e.next = m._rehash[e.hash & 7]
    m._rehash[e.hash & 7] = e
    m._rehash_size += 1
    assert "must still be in the primary table" in violation(m, 2)


def test_moved_bucket_left_in_primary_is_invariant_2() -> None:
    m = rehashing()
    m._primary[0] = _Entry(value_key(8), 0, [8], 8, None, 0, 0)
    m._primary_size += 1
    assert "is not empty" in violation(m, 2)


def test_wrong_counter_is_invariant_3() -> None:
    m = healthy()
    m._primary_size += 1
    assert "counter says" in violation(m, 3)


def test_duplicate_mapping_is_invariant_4() -> None:
    m = healthy()
    e = m._primary[2]
    assert e is not None
    m._primary[2] = _Entry(e.key, e.namespace, [0], e.hash, e, 0, 0)
    m._primary_size += 1
    assert "reachable twice" in violation(m, 4)


def test_version_above_the_map_version_is_invariant_5() -> None:
    m = healthy()
    e = m._primary[3]
    assert e is not None
    e.state_version = 7
    assert "above the map version" in violation(m, 5)


def test_highest_required_not_the_max_of_open_is_invariant_5() -> None:
    m = healthy()
    first, second = m.snapshot(), m.snapshot()
    m._highest_required = first.version
    violation(m, 5)
    second.release()
    first.release()


def tracking(n: int = 5, limit: int = 4) -> CopyOnWriteStateMap[Any, Any, Any]:
    """A healthy map tracking changes, one removal logged after a snapshot."""
    m = healthy(n)
    m.track_changes(limit)
    m.snapshot().release()
    m.remove(value_key(0), 0)
    check_map(m)
    return m


def test_guard_of_an_untracked_map_not_h_is_invariant_13() -> None:
    m = healthy()
    snap = m.snapshot()
    m._guard = 0
    assert "while not tracking" in violation(m, 13)
    snap.release()


def test_guard_of_a_tracking_map_not_v_is_invariant_13() -> None:
    m = tracking()
    m._guard = m._version - 1
    assert "while tracking" in violation(m, 13)


def test_overlong_removal_log_is_invariant_13() -> None:
    m = tracking()
    assert m._removals is not None
    m._removals += [(m._version, value_key(9), 0)] * m._removal_limit
    assert "above its limit" in violation(m, 13)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_removal_log_out_of_order_is_invariant_13(where: str) -> None:
    m = tracking(limit=8)
    for i in (1, 2):
        m.snapshot().release()
        m.remove(value_key(i), 0)
    log = m._removals
    assert log is not None and len(log) == 3
    index = {"first": 0, "middle": 1, "last": 2}[where]
    _, key, namespace = log[index]
    log[index] = (m._version + 1 if index < 2 else 0, key, namespace)
    violation(m, 13)


def test_snapshot_state_changed_in_place_is_invariant_8() -> None:
    m = healthy()
    snap = m.snapshot()
    fp = fingerprint(snap)
    check_map(m, [fp])
    e = m._primary[4]
    assert e is not None
    e.state.append(99)  # what a missing rule S would allow
    assert "mutated in place" in violation(m, 8, fp)


def test_snapshot_entry_relinked_is_invariant_8() -> None:
    m: CopyOnWriteStateMap[Any, Any, Any] = CopyOnWriteStateMap(initial_capacity=8)
    for i in range(4):
        m.put(HashKey(i, i % 2), 0, [i])  # two chains of two
    snap = m.snapshot()
    fp = fingerprint(snap)
    head = next(e for e in m._primary if e is not None and e.next is not None)
    head.next = None
    with pytest.raises(InvariantViolation, match=r"invariant [38] violated"):
        check_map(m, [fp])


def test_shared_entry_with_a_new_version_is_invariant_6() -> None:
    m = healthy()
    snap = m.snapshot()
    fp = fingerprint(snap)
    e = m._primary[0]
    assert e is not None
    e.entry_version = m._version  # claims it is private to the live map
    assert "an open snapshot reaches it" in violation(m, 6, fp)


def test_snapshot_layout_is_checked_when_fingerprinted() -> None:
    m = rehashing()
    snap = m.snapshot()
    assert snap._data is not None
    snap._data.pop()
    with pytest.raises(InvariantViolation, match="compact layout"):
        fingerprint(snap)


def test_over_full_table_is_invariant_9() -> None:
    m = healthy(n=6, capacity=8)
    m._threshold = 3
    assert "threshold" in violation(m, 9)


def test_non_power_of_two_capacity_is_invariant_9() -> None:
    m = healthy(n=2, capacity=8)
    m._primary.extend([None, None])
    m._mask = 9
    assert "power of two" in violation(m, 9)


def test_stalled_rehash_step_is_invariant_9() -> None:
    m = rehashing()
    after = rehash_step_check(m)
    with pytest.raises(InvariantViolation, match="did not move a bucket"):
        after()  # nothing happened: the rehash stalled
    after = rehash_step_check(m)
    m.contains_key(value_key(1), 0)
    after()


def test_growth_under_the_checker_after_every_operation() -> None:
    m: CopyOnWriteStateMap[Any, Any, Any] = CopyOnWriteStateMap(initial_capacity=4)
    snaps = []
    for i in range(300):
        after = rehash_step_check(m)
        m.put(value_key(i), i % 3, [i])
        after()
        if i % 37 == 0:
            snap = m.snapshot()
            snaps.append(fingerprint(snap))
        if i % 53 == 0 and snaps:
            snaps.pop(0).snapshot.release()
        check_map(m, snaps)
    assert len(m) == 300 and len(m._primary) >= 512
    for i in range(0, 300, 2):
        after = rehash_step_check(m)
        m.remove(value_key(i), i % 3)
        after()
        check_map(m, snaps)
    assert len(m) == 150
    for fp in snaps:
        fp.snapshot.release()
