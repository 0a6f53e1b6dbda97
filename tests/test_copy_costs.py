"""Copy only what a snapshot can reach, and compare keys by equality.

Flink's ``testCopyOnWriteContracts`` pins down which objects the map may copy:
entries and states created after the newest open snapshot are never copied
(rules E and S copy only versions ``< H``). A map that copies more still
agrees with the model -- it only costs more -- so these tests watch object
identity. The last tests cover composite keys that are equal but not
identical, fail-fast iteration, and the smallest capacity.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import bind_map_class

from cowstate import ConcurrentModificationError, CopyOnWriteStateMap
from cowstate.arithmetic import composite_hash
from cowstate_spec.cmap_view import view_of as I
from cowstate_spec.invariants import chain
from cowstate_spec.keys import HashKey, value_key

Map = CopyOnWriteStateMap[Any, Any, Any]
NS = 0


@pytest.fixture(autouse=True)
def _each_map(map_impl: str) -> None:
    """Every test here runs on the pure and the C map (tests/conftest.py)."""
    bind_map_class(globals(), map_impl)


def entry(m: Map, key: Any, namespace: Any = NS) -> Any:
    """The entry of (key, namespace): the pure map's _Entry, or the C entry's view
    (the same view object for the same C entry, so ``is`` compares entries)."""
    view = I(m)
    h = composite_hash(key, namespace)
    tables = [view._primary] if view._rehash is None else [view._primary, view._rehash]
    found = [
        e
        for table in tables
        for head in table
        for e in chain(head)
        if e.hash == h and e.key == key and e.namespace == namespace
    ]
    assert len(found) == 1, found
    return found[0]


def test_transform_gets_a_state_put_after_the_snapshot_as_it_is() -> None:
    m: Map = CopyOnWriteStateMap()
    m.put(1, NS, [1])
    snap = m.snapshot()
    fresh = [2]
    m.put(1, NS, fresh)  # state_version == H: no snapshot holds it
    seen: list[Any] = []

    def remember_and_append(old: list[int] | None, v: int) -> list[int]:
        assert old is not None
        seen.append(old)
        return [*old, v]

    m.transform(1, NS, 3, remember_and_append)
    assert seen[0] is fresh
    assert m.get(1, NS) == [2, 3]
    snap.release()


def test_an_entry_made_after_the_snapshot_is_updated_in_place() -> None:
    m: Map = CopyOnWriteStateMap()
    snap = m.snapshot()
    m.put(1, NS, [1])
    before = entry(m, 1)
    m.put(1, NS, [2])
    assert entry(m, 1) is before
    snap.release()


def test_removing_behind_a_new_predecessor_does_not_copy_it() -> None:
    m: Map = CopyOnWriteStateMap(initial_capacity=8)
    snap = m.snapshot()
    m.put(HashKey("a", 3), NS, 1)
    m.put(HashKey("b", 3), NS, 2)  # head of bucket 3, made after the snapshot
    head = I(m)._primary[3]
    m.remove(HashKey("a", 3), NS)
    assert I(m)._primary[3] is head and head is not None and head.next is None
    snap.release()


def test_chain_copy_stops_at_entries_made_after_the_snapshot() -> None:
    m: Map = CopyOnWriteStateMap(initial_capacity=8)
    m.put(HashKey("x", 5), NS, [0])  # shared with the snapshot
    snap = m.snapshot()
    m.put(HashKey("y", 5), NS, [1])  # new
    m.put(HashKey("z", 5), NS, [2])  # new: chain z -> y -> x
    z, y = I(m)._primary[5], I(m)._primary[5].next
    m.put(HashKey("x", 5), NS, [3])  # rule E copies x only
    assert I(m)._primary[5] is z and z.next is y
    assert y.next is not None and y.next.state == [3]
    assert [e.state for e in snap] == [[0]]
    snap.release()


def test_rehash_moves_entries_made_after_the_snapshot_without_copying() -> None:
    m: Map = CopyOnWriteStateMap(initial_capacity=4)
    snap = m.snapshot()
    for i in range(5):  # the 5th insert starts the rehash
        m.put(value_key(i), NS, [i])
    before = {i: entry(m, value_key(i)) for i in range(5)}
    m.contains_key(value_key(0), NS)  # a rehash step moves them
    assert I(m)._rehash is None or I(m)._rehash_index > 0
    assert all(entry(m, value_key(i)) is before[i] for i in range(5))
    snap.release()


def test_equal_but_not_identical_namespaces_are_the_same_mapping() -> None:
    m: Map = CopyOnWriteStateMap()
    put_ns = tuple([1000, "window"])
    other_ns = tuple([1000, "window"])
    assert put_ns == other_ns and put_ns is not other_ns
    m.put(1, put_ns, [1])
    assert m.get(1, other_ns) == [1]
    assert m.contains_key(1, other_ns)
    m.put(1, other_ns, [2])
    assert len(m) == 1 and m.get(1, put_ns) == [2]
    m.remove(1, other_ns)
    assert len(m) == 0


def test_removing_during_iteration_is_detected_after_one_insert() -> None:
    m: Map = CopyOnWriteStateMap()
    m.put(1, NS, 1)
    it = iter(m)
    m.remove(1, NS)
    with pytest.raises(ConcurrentModificationError):
        list(it)


def test_every_rehash_step_during_iteration_is_detected() -> None:
    m: Map = CopyOnWriteStateMap(initial_capacity=8)
    for i in range(8):  # the 8th insert starts the rehash
        m.put(value_key(i), NS, i)
    m.get(value_key(0), NS)  # first step
    it = iter(m)
    m.get(value_key(1), NS)  # second step (finishes the rehash)
    with pytest.raises(ConcurrentModificationError):
        list(it)


def test_initial_capacity_zero_gives_the_minimum() -> None:
    m: Map = CopyOnWriteStateMap(initial_capacity=0)
    assert len(I(m)._primary) == 4
    m.put(1, NS, 1)
    assert m.get(1, NS) == 1


def test_put_reports_whether_it_inserted() -> None:
    m: Map = CopyOnWriteStateMap(initial_capacity=4)
    assert [m.put(k, NS, k) for k in range(6)] == [True] * 6  # through a rehash start
    assert m.put(3, NS, 30) is False and m.get(3, NS) == 30
    with m.snapshot():
        assert m.put(3, NS, 31) is False and m.put(9, NS, 9) is True
    m.remove(3, NS)
    assert m.put(3, NS, 3) is True
