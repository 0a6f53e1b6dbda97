"""Tests that kill mutants of the ``tables`` mutation scope (``make mutate
SCOPE=tables``) in the table layer's own modules -- ``cowstate.state_table``,
``cowstate.nested_table``, ``cowstate.table_base``, ``cowstate.state_meta`` and
``cowstate.descriptors`` -- that the scope's other killer tests let through or
never reach.

Each test is named after what it pins; the mutants it was written for are
named in its comment. Mutants that no behaviour can tell apart (a fail-fast
counter bumped by 2 instead of 1, ...) are listed in
``docs/equivalent-mutants.md`` instead.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from cowstate import nested_table, state_table
from cowstate.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from cowstate.errors import (
    AmbiguousKeyError,
    ConcurrentModificationError,
    ForeignSnapshotError,
    InvalidArgumentError,
    KeyComparisonError,
    KeyGroupOutOfRangeError,
    KeyHashError,
    KeyTypeMismatchError,
    SnapshotReleasedError,
    StateCopyError,
    StateTooDeepError,
    UnhashableKeyError,
)
from cowstate.introspection import describe
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.nested_table import NestedMapsStateTable, NestedStateMap
from cowstate.serializers import DefaultSerializer, ImmutableSerializer
from cowstate.state_meta import SnapshotFormat, StateKind, StateMetadata, StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable, StateTable, StateTableSnapshot

#: Until these tests move beside the tests of what they pin.
pytestmark = [
    pytest.mark.kills(module="cowstate.state_table"),
    pytest.mark.kills(module="cowstate.nested_table"),
    pytest.mark.kills(module="cowstate.table_base"),
    pytest.mark.kills(module="cowstate.state_meta"),
    pytest.mark.kills(module="cowstate.descriptors"),
]

#: The two heap table classes (the snapshot life cycle is theirs).
HEAP_TABLES: list[type[StateTable[Any, Any, Any]]] = [CopyOnWriteStateTable, NestedMapsStateTable]

MAXP = 16

#: The message of a table iterator that notices a change before its next entry.
TABLE_CHANGED_MID_WALK = (
    "expected no mapping added or removed while iterating the table; "
    "collect what you need first, e.g. list(table.keys(ns))"
)
#: The message of a nested map's iterator that notices a change.
MAP_CHANGED = "expected no mapping added or removed while iterating the map"


def message(exc_type: type[Exception], call: Callable[[], object]) -> str:
    """The message of the ``exc_type`` that ``call()`` raises (exactly that type)."""
    with pytest.raises(exc_type) as info:
        call()
    assert type(info.value) is exc_type
    return str(info.value)


def keys_of_group(table: StateTable[Any, Any, Any], group: int, count: int) -> list[int]:
    """The first ``count`` int keys that ``table`` routes to key group ``group``."""
    found = [k for k in range(64 * MAXP * count) if table.key_group_of(k) == group]
    assert len(found) >= count
    return found[:count]


class _Clashing:
    """A key or namespace with a fixed hash whose ``__eq__`` raises (rule U):
    two of them collide in a dict, and the dict's comparison raises."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        raise ValueError("no comparing today")

    def __repr__(self) -> str:
        return f"Clashing({self.name})"


# ------------------------------------------------- state_table: fail-fast counter


def _walk_one_group_then(table: StateTable[Any, Any, Any], change: Callable[[], object]) -> str:
    """Walk key group 0 (two mappings), ``change()`` after the first entry, and
    return the message of the ConcurrentModificationError of the next step."""
    first, second = keys_of_group(table, 0, 2)
    table.put(first, "ns", 1)
    table.put(second, "ns", 2)
    walk = table.entries_in_key_group(0)
    next(walk)
    change()
    return message(ConcurrentModificationError, lambda: next(walk))


def test_table_walk_notices_an_insert_by_put_and_get_old_undone_by_a_removal() -> None:
    # state_table StateTable.put_and_get_old__mutmut_15 (the counter goes down on
    # an insert, so the removal that follows brings it back where the walk started).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, MAXP)
    (other,) = keys_of_group(table, 1, 1)

    def insert_then_remove() -> None:
        assert table.put_and_get_old(other, "ns", 3) is None
        assert table.remove_and_get_old(other, "ns") == 3

    assert _walk_one_group_then(table, insert_then_remove) == TABLE_CHANGED_MID_WALK
    assert len(table) == 2


def test_table_walk_notices_a_removal_by_remove_and_get_old_after_an_insert() -> None:
    # state_table StateTable.remove_and_get_old__mutmut_12 (the counter goes down
    # on a removal and cancels the insert's step up).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, MAXP)
    (other,) = keys_of_group(table, 1, 1)

    def insert_then_remove() -> None:
        assert table.put(other, "ns", 3) is True
        assert table.remove_and_get_old(other, "ns") == 3

    assert _walk_one_group_then(table, insert_then_remove) == TABLE_CHANGED_MID_WALK


def test_table_walk_notices_an_insert_by_put_undone_by_a_removal() -> None:
    # state_table StateTable.put__mutmut_14 (put counts down) and
    # StateTable.remove__mutmut_13 (remove counts down): each cancels the other.
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, MAXP)
    (other,) = keys_of_group(table, 1, 1)
    table.put(other, "ns", 0)

    def remove_then_insert() -> None:
        table.remove(other, "ns")
        assert table.put(other, "ns", 3) is True

    assert _walk_one_group_then(table, remove_then_insert) == TABLE_CHANGED_MID_WALK


def test_table_walk_notices_an_insert_by_transform_undone_by_a_removal() -> None:
    # state_table StateTable.transform__mutmut_17 (transform counts down an insert).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, MAXP)
    (other,) = keys_of_group(table, 1, 1)

    def insert_then_remove() -> None:
        table.transform(other, "ns", 5, lambda old, value: value)
        table.remove(other, "ns")

    assert _walk_one_group_then(table, insert_then_remove) == TABLE_CHANGED_MID_WALK


def test_nested_table_walk_notices_changes_that_cancel_out_in_a_buggy_counter() -> None:
    # The same pins over the nested table, whose StateTable counters are shared.
    table: NestedMapsStateTable[int, str, int] = NestedMapsStateTable(None, MAXP)
    (other,) = keys_of_group(table, 1, 1)

    def insert_then_remove() -> None:
        assert table.put_and_get_old(other, "ns", 3) is None
        assert table.remove_and_get_old(other, "ns") == 3

    assert _walk_one_group_then(table, insert_then_remove) == TABLE_CHANGED_MID_WALK


@pytest.mark.parametrize("table_class", HEAP_TABLES, ids=lambda c: c.__name__)
def test_table_walk_notices_a_lone_removal_and_not_a_removal_of_nothing(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTable.remove__mutmut_6 (no size taken: every remove counts),
    # __mutmut_11 (only a remove of nothing counts) and __mutmut_12 (the counter
    # set to 1), and transform__mutmut_6 / __mutmut_15 (the same for transform).
    table = table_class(None, MAXP)
    (other, absent) = keys_of_group(table, 1, 2)
    table.put(other, "ns", 0)
    table.put(absent, "ns", 0)
    table.remove(absent, "ns")
    first, second, third = keys_of_group(table, 0, 3)
    for key in (first, second, third):
        table.put(key, "ns", 1)
    walk = table.entries_in_key_group(0)
    next(walk)
    table.remove(absent, "ns")  # nothing removed: the walk goes on
    table.transform(other, "ns", 5, lambda old, value: value)  # an update: goes on
    next(walk)
    table.remove(other, "ns")
    assert message(ConcurrentModificationError, lambda: next(walk)) == TABLE_CHANGED_MID_WALK
    assert len(table) == 3


@pytest.mark.parametrize("table_class", HEAP_TABLES, ids=lambda c: c.__name__)
def test_table_walk_notices_a_removal_when_the_last_change_was_a_removal(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTable.remove__mutmut_12 (a removal sets the counter to 1:
    # a walk started right after a removal never sees the next one).
    table = table_class(None, MAXP)
    x, y = keys_of_group(table, 0, 2)
    other, z = keys_of_group(table, 1, 2)
    for key in (x, y, other, z):
        table.put(key, "ns", 1)
    table.remove(z, "ns")
    walk = table.entries_in_key_group(0)
    next(walk)
    table.remove(other, "ns")
    assert message(ConcurrentModificationError, lambda: next(walk)) == TABLE_CHANGED_MID_WALK


@pytest.mark.parametrize("table_class", HEAP_TABLES, ids=lambda c: c.__name__)
def test_a_whole_table_walk_goes_in_key_group_order_and_fails_fast_at_its_end(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTable.__iter____mutmut_1..4 and _iterate__mutmut_7..10 (the
    # check after the last entry, and its message).
    table = table_class(KeyGroupRange(2, 5), MAXP)
    for group in (5, 2, 4):
        (key,) = keys_of_group(table, group, 1)
        table.put(key, "ns", group)
    assert [e.state for e in table] == [2, 4, 5]
    walk = iter(table)
    assert [next(walk).state for _ in range(3)] == [2, 4, 5]
    (key,) = keys_of_group(table, 3, 1)
    table.put(key, "ns", 3)  # after the last entry was handed out
    assert message(ConcurrentModificationError, lambda: next(walk)) == (
        "expected no mapping added or removed while iterating the table"
    )
    assert sorted(table.keys("ns")) == sorted(e.key for e in table)


@pytest.mark.parametrize("table_class", HEAP_TABLES, ids=lambda c: c.__name__)
def test_every_keyed_operation_obeys_an_explicit_key_group(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTable.get/contains_key/put/put_and_get_old/remove/
    # remove_and_get_old/transform with ``key_group`` dropped (the key's own group
    # computed instead): a mapping stored under another group is found there only.
    table = table_class(None, MAXP)
    key = 7
    own = table.key_group_of(key)
    foreign = (own + 1) % MAXP
    assert table.put(key, "ns", 1, key_group=foreign) is True
    assert table.get(key, "ns") is None
    assert table.get(key, "ns", key_group=foreign) == 1
    assert table.contains_key(key, "ns", key_group=foreign) is True
    assert table.contains_key(key, "ns") is False
    assert table.put_and_get_old(key, "ns", 2, key_group=foreign) == 1
    table.transform(key, "ns", 3, lambda old, value: (old or 0) + value, key_group=foreign)
    assert list(table.entries_in_key_group(foreign)) == [(key, "ns", 5)]
    assert list(table.entries_in_key_group(own)) == []
    table.remove(key, "ns")  # the key's own group: nothing there
    assert len(table) == 1
    assert table.remove_and_get_old(key, "ns", key_group=foreign) == 5
    table.put(key, "ns", 6, key_group=foreign)
    table.remove(key, "ns", key_group=foreign)
    assert len(table) == 0
    assert table.size_of_namespace("ns") == 0


def test_copy_on_write_maps_get_the_tables_state_serializer_and_initial_capacity() -> None:
    # state_table CopyOnWriteStateTable._create_map__mutmut_1 (the default
    # serializer) and __mutmut_2..4 (the default capacity), StateTable.__init____mutmut_10.
    serializer = ImmutableSerializer()
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(
        KeyGroupRange(0, 1), 2, meta=StateMetaInfo(state_serializer=serializer), initial_capacity=16
    )
    for group in (0, 1):
        assert table.state_map(group).serializer is serializer
        assert describe(table.state_map(group)).capacity == 16
    nested: NestedMapsStateTable[int, str, int] = NestedMapsStateTable(
        KeyGroupRange(0, 1), 2, meta=StateMetaInfo(state_serializer=serializer)
    )
    assert nested.state_map(1).serializer is serializer


def test_a_nested_map_without_a_serializer_deep_copies_with_the_default_one() -> None:
    # nested_table NestedStateMap.__init____mutmut_1..4 (no serializer, or the
    # given one ignored).
    m = NestedStateMap[int, str, list[int]]()
    assert type(m.serializer) is DefaultSerializer
    state = [1, 2]
    m.put(1, "ns", state)
    (copied,) = m.copy_entries()
    assert copied == (1, "ns", [1, 2])
    assert copied.state is not state
    immutable = ImmutableSerializer()
    trusting = NestedStateMap[int, str, list[int]](immutable)
    assert trusting.serializer is immutable
    trusting.put(1, "ns", state)
    assert trusting.copy_entries()[0].state is state
    assert message(InvalidArgumentError, partial(setattr, m, "serializer", 3)) == (
        "expected a serializer with copy/serialize/deserialize, got int"
    )


def test_a_key_stored_by_transform_fixes_its_type() -> None:
    # state_table StateTable.transform__mutmut_19 (and put__mutmut_16,
    # put_and_get_old__mutmut_17: the type of None admitted instead of the key's).
    def by_transform(table: StateTable[Any, str, int]) -> None:
        table.transform(1, "ns", 5, lambda old, value: value)

    def by_put(table: StateTable[Any, str, int]) -> None:
        table.put(1, "ns", 5)

    def by_put_and_get_old(table: StateTable[Any, str, int]) -> None:
        table.put_and_get_old(1, "ns", 5)

    for store in (by_transform, by_put, by_put_and_get_old):
        table: CopyOnWriteStateTable[Any, str, int] = CopyOnWriteStateTable(None, MAXP)
        store(table)
        assert message(KeyTypeMismatchError, partial(table.put, True, "ns", 6)) == (
            "expected a key of type int (fixed by the first key of its kind), got bool: True"
        )
        assert len(table) == 1


# ------------------------------------------------- nested map: fail-fast counter


def _walk_namespace_a_then(m: NestedStateMap[Any, Any, Any], change: Callable[[], object]) -> str:
    """Walk ``m`` (namespace ``a`` first, two mappings; namespace ``b`` after it),
    ``change()`` namespace ``b`` after the first entry, and return the message of
    the ConcurrentModificationError of the next step."""
    m.put(1, "a", 1)
    m.put(2, "a", 2)
    m.put(10, "b", 10)
    walk = iter(m)
    assert next(walk) == (1, "a", 1)
    change()
    return message(ConcurrentModificationError, lambda: next(walk))


def test_nested_map_walk_notices_an_insert_undone_by_a_removal() -> None:
    # nested_table NestedStateMap.put_and_get_old__mutmut_34 (an insert counts
    # down; the removal after it brings the counter back to where the walk started).
    m = NestedStateMap[Any, Any, Any]()

    def insert_then_remove() -> None:
        assert m.put_and_get_old(11, "b", 11) is None
        assert m.remove_and_get_old(11, "b") == 11

    assert _walk_namespace_a_then(m, insert_then_remove) == MAP_CHANGED
    assert len(m) == 3


def test_nested_map_walk_notices_a_removal_undone_by_an_insert() -> None:
    # nested_table NestedStateMap.remove_and_get_old__mutmut_30 (a removal counts down).
    m = NestedStateMap[Any, Any, Any]()

    def remove_then_insert() -> None:
        assert m.put(11, "b", 11) is True
        m.remove(11, "b")

    assert _walk_namespace_a_then(m, remove_then_insert) == MAP_CHANGED


def test_nested_map_walk_notices_an_insert_when_the_counter_was_already_one() -> None:
    # nested_table NestedStateMap.put_and_get_old__mutmut_33 and
    # remove_and_get_old__mutmut_29 (the counter is set to 1 instead of counted up:
    # a walk that starts at 1 never sees it move).
    m = NestedStateMap[Any, Any, Any]()

    def insert() -> None:
        assert m.put(11, "b", 11) is True

    assert _walk_namespace_a_then(m, insert) == MAP_CHANGED
    m2 = NestedStateMap[Any, Any, Any]()
    m2.put(1, "a", 1)
    m2.put(2, "a", 2)
    m2.put(10, "b", 10)
    m2.put(11, "b", 11)
    m2.remove(11, "b")
    walk = iter(m2)
    next(walk)
    m2.remove(10, "b")
    assert message(ConcurrentModificationError, lambda: next(walk)) == MAP_CHANGED


# ------------------------------------------ nested map: rule U messages, word for word


def test_nested_contains_key_names_the_key_and_namespace_when_keys_cannot_be_compared() -> None:
    # nested_table NestedStateMap.contains_key__mutmut_10..15 (the message loses
    # the key, the namespace or the cause).
    m = NestedStateMap[Any, Any, Any]()
    m.put(_Clashing("stored"), "ns", 1)
    assert message(KeyComparisonError, lambda: m.contains_key(_Clashing("asked"), "ns")) == (
        "expected comparing (Clashing(asked), 'ns') with the mapped keys (__eq__) to return "
        "a bool, got ValueError: no comparing today; the map is unchanged"
    )
    assert len(m) == 1


def test_nested_size_of_namespace_names_the_namespace_when_namespaces_cannot_be_compared() -> None:
    # nested_table NestedStateMap.size_of_namespace__mutmut_3..7 (the message loses
    # the namespace or the cause).
    m = NestedStateMap[Any, Any, Any]()
    m.put(1, _Clashing("stored"), 1)
    assert message(KeyComparisonError, lambda: m.size_of_namespace(_Clashing("asked"))) == (
        "expected comparing (None, Clashing(asked)) with the mapped keys (__eq__) to return "
        "a bool, got ValueError: no comparing today; the map is unchanged"
    )


class _RaisingHash:
    """A key or namespace whose ``hash()`` raises a ``ValueError`` (rule U)."""

    def __hash__(self) -> int:
        raise ValueError("no hash today")

    def __repr__(self) -> str:
        return "RaisingHash()"


class _HashFailsOnCall:
    """A key or namespace whose ``hash()`` raises on call number ``fail_on``
    only (``fail_on`` is set by the test, relative to ``calls``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.fail_on = -1

    def __hash__(self) -> int:
        self.calls += 1
        if self.calls == self.fail_on:
            raise ValueError("hash failed this once")
        return 13

    def __repr__(self) -> str:
        return f"HashFails({self.name})"


class _Uncopyable:
    """A state whose deep copy raises ``exc``."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def __deepcopy__(self, memo: object) -> _Uncopyable:
        raise self.exc

    def __repr__(self) -> str:
        return "Uncopyable()"


def test_nested_get_names_the_key_and_namespace_when_keys_cannot_be_compared() -> None:
    # nested_table NestedStateMap.get__mutmut_11..16.
    m = NestedStateMap[Any, Any, Any]()
    m.put(_Clashing("stored"), "ns", 1)
    assert message(KeyComparisonError, lambda: m.get(_Clashing("asked"), "ns")) == (
        "expected comparing (Clashing(asked), 'ns') with the mapped keys (__eq__) to return "
        "a bool, got ValueError: no comparing today; the map is unchanged"
    )


def test_nested_put_that_cannot_compare_keys_keeps_the_namespace_and_names_the_pair() -> None:
    # nested_table NestedStateMap.put_and_get_old__mutmut_10 (``created`` starts
    # True: the failed put deletes the namespace with its mappings) and
    # put_and_get_old__mutmut_23..28 (the message).
    m = NestedStateMap[Any, Any, Any]()
    stored = _Clashing("stored")
    m.put(stored, "ns", 1)
    assert message(KeyComparisonError, lambda: m.put(_Clashing("asked"), "ns", 2)) == (
        "expected comparing (Clashing(asked), 'ns') with the mapped keys (__eq__) to return "
        "a bool, got ValueError: no comparing today; the map is unchanged"
    )
    assert [(e.key is stored, e.namespace, e.state) for e in m] == [(True, "ns", 1)]
    assert len(m) == 1
    assert m.size_of_namespace("ns") == 1


def test_nested_put_that_fails_in_a_new_namespace_leaves_no_namespace_behind() -> None:
    # nested_table NestedStateMap.put_and_get_old__mutmut_20 and __mutmut_21 (the
    # new namespace is not marked created, so its empty dict stays: a later
    # mapping of that namespace is then walked before the namespaces added since).
    m = NestedStateMap[Any, Any, Any]()
    key = _HashFailsOnCall("k")
    key.fail_on = 2  # _check_hashable hashes it once; storing it hashes it again
    assert message(KeyComparisonError, lambda: m.put(key, "b", 1)) == (
        "expected comparing (HashFails(k), 'b') with the mapped keys (__eq__) to return "
        "a bool, got ValueError: hash failed this once; the map is unchanged"
    )
    assert len(m) == 0
    m.put(1, "c", 1)
    m.put(2, "b", 2)
    assert list(m) == [(1, "c", 1), (2, "b", 2)]


def test_nested_remove_that_cannot_compare_keys_names_the_pair_and_removes_nothing() -> None:
    # nested_table NestedStateMap.remove_and_get_old__mutmut_12..17.
    m = NestedStateMap[Any, Any, Any]()
    stored = _Clashing("stored")
    m.put(stored, "ns", 1)
    assert message(KeyComparisonError, lambda: m.remove_and_get_old(_Clashing("asked"), "ns")) == (
        "expected comparing (Clashing(asked), 'ns') with the mapped keys (__eq__) to return "
        "a bool, got ValueError: no comparing today; the map is unchanged"
    )
    assert len(m) == 1


def test_nested_remove_puts_the_state_back_when_dropping_the_namespace_raises() -> None:
    # nested_table NestedStateMap.remove_and_get_old__mutmut_19 (None put back
    # instead of the state) and __mutmut_20..25 (the message).
    m = NestedStateMap[Any, Any, Any]()
    namespace = _HashFailsOnCall("ns")
    m.put(5, namespace, "five")
    # remove: _check_hashable hashes it (1), the lookup (2), dropping the
    # namespace that became empty (3) raises.
    namespace.fail_on = namespace.calls + 3
    assert message(KeyComparisonError, lambda: m.remove_and_get_old(5, namespace)) == (
        "expected comparing (5, HashFails(ns)) with the mapped keys (__eq__) to return "
        "a bool, got ValueError: hash failed this once; the map is unchanged"
    )
    assert list(m) == [(5, namespace, "five")]
    assert len(m) == 1
    assert m.get(5, namespace) == "five"


def test_nested_map_names_the_key_or_namespace_whose_hash_raises() -> None:
    # nested_table _check_hashable__mutmut_7..12 (KeyHashError of the wrong part,
    # or without its cause).
    m = NestedStateMap[Any, Any, Any]()
    assert message(KeyHashError, lambda: m.get(_RaisingHash(), "ns")) == (
        "expected hash() of the key RaisingHash() to return an int, got ValueError: "
        "no hash today; the map is unchanged"
    )
    assert message(KeyHashError, lambda: m.put(1, _RaisingHash(), 1)) == (
        "expected hash() of the namespace RaisingHash() to return an int, got ValueError: "
        "no hash today; the map is unchanged"
    )
    assert message(UnhashableKeyError, lambda: m.get(1, ["n"])) == (
        "expected a hashable namespace, got list ['n']"
    )
    assert message(UnhashableKeyError, lambda: m.put([1], "ns", 1)) == (
        "expected a hashable key, got list [1]"
    )
    assert len(m) == 0


def test_nested_snapshot_names_the_mapping_whose_state_cannot_be_copied() -> None:
    # nested_table NestedStateMap.copy_entries__mutmut_11..16 (the message loses
    # the key, the namespace or the cause; RecursionError no longer StateTooDeepError).
    table: NestedMapsStateTable[int, str, Any] = NestedMapsStateTable(None, MAXP)
    table.put(3, "ns", _Uncopyable(ValueError("cannot copy")))
    assert message(StateCopyError, table.snapshot) == (
        "expected the state serializer to copy the state of (3, 'ns'), got ValueError: "
        "cannot copy; the map is unchanged"
    )
    deep: NestedMapsStateTable[int, str, Any] = NestedMapsStateTable(None, MAXP)
    deep.put(4, "ns", _Uncopyable(RecursionError("deep")))
    assert message(StateTooDeepError, deep.snapshot) == (
        "expected a state the serializer can copy within Python's recursion limit for "
        "(4, 'ns'), got one nested too deep (RecursionError: deep); the map is unchanged"
    )


# ------------------------------------------------------- state_table: old names


def test_state_table_still_exports_the_nested_tables_names() -> None:
    # state_table __getattr__mutmut_1..14 (a name no longer found, looked up
    # elsewhere, or the lookup broken).
    assert state_table.NestedMapsStateTable is nested_table.NestedMapsStateTable
    assert state_table.NestedMapsStateTableSnapshot is nested_table.NestedMapsStateTableSnapshot
    assert state_table.NestedStateMap is nested_table.NestedStateMap


def test_state_table_names_a_missing_attribute_like_any_module() -> None:
    # state_table __getattr__mutmut_1 (every other name sent to nested_table) and
    # __getattr__mutmut_15 (the AttributeError without its message).
    with pytest.raises(AttributeError) as info:
        _ = state_table.NoSuchTable
    assert type(info.value) is AttributeError
    assert str(info.value) == "module 'cowstate.state_table' has no attribute 'NoSuchTable'"


# ------------------------------------------------------------ state_meta: reprs


def test_snapshot_formats_repr_as_their_plain_values() -> None:
    # state_meta SnapshotFormat.__repr__mutmut_1 (repr(None) for every format).
    assert [repr(f) for f in SnapshotFormat] == ["'heap'", "'canonical'", "'rocksdb-native'"]
    assert repr([SnapshotFormat.CANONICAL]) == "['canonical']"


# ------------------------------------------------- table_base: construction, `in`


def test_a_table_of_max_parallelism_one_holds_key_group_zero() -> None:
    # table_base TableBase.__init____mutmut_7 (``max_parallelism > 1``: no range
    # made for a max parallelism of 1).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, 1)
    assert table.key_group_range == KeyGroupRange(0, 0)
    assert table.put(7, "ns", 1) is True
    assert list(table.entries_in_key_group(0)) == [(7, "ns", 1)]


def test_a_table_names_a_bad_max_parallelism_before_making_a_range() -> None:
    # table_base TableBase.__init____mutmut_1 and __mutmut_6 (the range made from
    # a max parallelism that is not an int, or is 0).
    assert message(InvalidArgumentError, lambda: CopyOnWriteStateTable(None, 0)) == (
        "expected max_parallelism in 1..32768, got 0"
    )
    assert message(InvalidArgumentError, lambda: CopyOnWriteStateTable(None, "8")) == (  # type: ignore[arg-type]
        "expected max_parallelism in 1..32768, got '8'"
    )


def test_a_table_names_a_bad_meta_info_and_key_serializer_by_type() -> None:
    # table_base TableBase.__init____mutmut_21..32 (the checks and their messages).
    full = KeyGroupRange(0, 3)
    assert message(InvalidArgumentError, lambda: CopyOnWriteStateTable(full, 4, meta="m")) == (  # type: ignore[arg-type]
        "expected a StateMetaInfo, got str"
    )
    assert message(
        InvalidArgumentError,
        lambda: CopyOnWriteStateTable(full, 4, key_serializer=3),  # type: ignore[arg-type]
    ) == ("expected a key_serializer with copy/serialize/deserialize, got int")
    plain: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(full, 4)
    assert (plain.meta.name, plain.meta.kind) == ("state", StateKind.VALUE)
    assert type(plain.key_serializer) is DefaultSerializer
    meta = StateMetaInfo("named")
    key_serializer = ImmutableSerializer()
    given: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(
        full, 4, meta=meta, key_serializer=key_serializer
    )
    assert given.meta is meta
    assert given.key_serializer is key_serializer


def test_a_table_answers_in_for_key_namespace_pairs_only() -> None:
    # table_base TableBase.__contains____mutmut_1..12.
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, MAXP)
    table.put(1, "ns", 1)
    assert (1, "ns") in table
    assert (1, "other") not in table
    assert (2, "ns") not in table
    assert message(InvalidArgumentError, lambda: (1,) in table) == (
        "expected a (key, namespace) tuple, got tuple (1,)"
    )
    assert message(InvalidArgumentError, lambda: (1, "ns", 1) in table) == (
        "expected a (key, namespace) tuple, got tuple (1, 'ns', 1)"
    )
    assert message(InvalidArgumentError, lambda: [1, "ns"] in table) == (
        "expected a (key, namespace) tuple, got list [1, 'ns']"
    )


def test_a_table_fixes_one_key_type_per_domain() -> None:
    # table_base TableBase.__init____mutmut_44 and __mutmut_45 (one key type for
    # the whole table, K1, instead of one per domain, K4) and _stored_key__mutmut_1.
    table: NestedMapsStateTable[Any, str, int] = NestedMapsStateTable(None, MAXP)
    table.put(1, "ns", 1)
    table.put("a", "ns", 2)
    assert table.get(1, "ns") == 1 and table.get("a", "ns") == 2
    refused = "expected a key of type int (fixed by the first key of its kind), got bool: True"
    assert message(KeyTypeMismatchError, lambda: table.put(True, "ns", 3)) == refused
    # state_table StateTable._route__mutmut_6 (the key type checked on None, not
    # the key: the refused put stored its mapping, and reads were not refused).
    assert message(KeyTypeMismatchError, lambda: table.get(True, "ns")) == refused
    assert len(table) == 2
    assert table.get(1, "ns") == 1


def test_set_meta_info_names_what_it_got_and_reaches_every_map() -> None:
    # table_base TableBase.set_meta_info__mutmut_1..5.
    table: NestedMapsStateTable[int, str, int] = NestedMapsStateTable(KeyGroupRange(0, 1), 2)
    assert message(InvalidArgumentError, lambda: table.set_meta_info(3)) == (  # type: ignore[arg-type]
        "expected a StateMetaInfo, got int"
    )
    serializer = ImmutableSerializer()
    meta = StateMetaInfo("renamed", state_serializer=serializer)
    table.set_meta_info(meta)
    assert table.meta is meta
    assert table.serializer is serializer
    assert table.state_map(0).serializer is serializer
    assert table.state_map(1).serializer is serializer


# ---------------------------------------------------------- state_table: routing


def test_a_table_names_a_missing_key_and_a_key_group_that_is_no_int() -> None:
    # state_table StateTable._route__mutmut_1..5 and __mutmut_17..20.
    table: CopyOnWriteStateTable[Any, str, int] = CopyOnWriteStateTable(None, MAXP)
    assert message(InvalidArgumentError, lambda: table.put(None, "ns", 1)) == (
        "expected a key, got None; keyed state needs a key (no key set?)"
    )
    assert message(InvalidArgumentError, lambda: table.get(1, "ns", key_group="3")) == (  # type: ignore[arg-type]
        "expected an int key_group, got str '3'"
    )
    (key,) = keys_of_group(table, 3, 1)
    table.put(key, "ns", 1, key_group=3)
    assert table.get(key, "ns", key_group=3) == 1
    assert len(table) == 1


def test_a_key_group_just_past_the_range_is_out_of_range() -> None:
    # state_table StateTable._route__mutmut_25 (``index <= len(maps)``: the key
    # group after the last one was an IndexError).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(KeyGroupRange(2, 5), MAXP)
    for outside in (6, 1):
        assert message(
            KeyGroupOutOfRangeError, partial(table.put, 1, "ns", 1, key_group=outside)
        ) == (
            f"expected a key group in KeyGroupRange(2, 5), got key group {outside}; unless "
            "you pass key groups yourself, this is most likely a key whose hash or equality "
            "is not deterministic"
        )
    assert len(table) == 0


def test_a_table_routes_each_key_group_of_a_range_to_its_own_map() -> None:
    # state_table StateTable._route__mutmut_21..24 and StateTable.__init____mutmut_9
    # (an index from the wrong start).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(KeyGroupRange(1, 6), MAXP)
    for group in range(1, 7):
        (key,) = keys_of_group(table, group, 1)
        table.put(key, "ns", group)
    for group in range(1, 7):
        assert [e.state for e in table.entries_in_key_group(group)] == [group]
        assert len(table.state_map(group)) == 1


def test_an_unhashable_key_that_is_also_ambiguous_is_named_unhashable() -> None:
    # state_table StateTable._route__mutmut_7 (the key-type refusal, an
    # AmbiguousKeyError, no longer turned into the UnhashableKeyError every table raises).
    table: CopyOnWriteStateTable[Any, str, int] = CopyOnWriteStateTable(None, MAXP)
    key = (float("nan"), [1])
    assert message(UnhashableKeyError, lambda: table.put(key, "ns", 1)) == (
        "expected a hashable key, got tuple (nan, [1])"
    )
    assert message(AmbiguousKeyError, lambda: table.put((float("nan"), 1), "ns", 1)) == (
        "expected a key equal to itself, got float nan: NaN != NaN, so a mapping under it "
        "could never be found again (inside the key (nan, 1))"
    )


class _TaggedSerializer:
    """A key serializer of its own (the default one refuses user classes)."""

    TAG = b"tagged:"

    def copy(self, state: Any) -> Any:
        return state

    def serialize(self, state: Any) -> bytes:
        return self.TAG + pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    def deserialize(self, data: bytes) -> Any:
        return pickle.loads(data[len(self.TAG) :])


@dataclass(frozen=True)
class _Point:
    """A key without a Java counterpart: its key group comes from its bytes."""

    x: int
    y: int


def test_a_table_hashes_keys_with_its_own_key_serializer() -> None:
    # table_base TableBase.key_group_of__mutmut_3 and __mutmut_6, state_table
    # StateTable._route__mutmut_12 and __mutmut_15 (the default key serializer,
    # which refuses a user class, instead of the table's).
    serializer = _TaggedSerializer()
    table: CopyOnWriteStateTable[_Point, str, int] = CopyOnWriteStateTable(
        None, MAXP, key_serializer=serializer
    )
    key = _Point(1, 2)
    group = assign_to_key_group(key, MAXP, serializer)
    assert table.key_group_of(key) == group
    table.put(key, "ns", 1)
    assert [e.key for e in table.entries_in_key_group(group)] == [key]
    assert table.get(key, "ns") == 1


def test_a_set_key_is_refused_as_unhashable_by_every_table() -> None:
    # state_table StateTable._route__mutmut_16 (the key-group assignment's
    # InvalidArgumentError for a set key no longer turned into UnhashableKeyError).
    for table_class in HEAP_TABLES:
        table = table_class(None, MAXP)
        assert message(UnhashableKeyError, partial(table.put, {1}, "ns", 1)) == (
            "expected a hashable key, got set {1}"
        )
        assert len(table) == 0


# ------------------------------------------------- state_table: table snapshots


@pytest.mark.parametrize("table_class", HEAP_TABLES, ids=lambda c: c.__name__)
def test_table_snapshots_are_numbered_from_one_per_table(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTable.__init____mutmut_14 and __mutmut_15 (no count, or
    # counting from 2) and StateTable._next_snapshot_number__mutmut_1..3.
    table = table_class(KeyGroupRange(2, 5), MAXP, meta=StateMetaInfo("counts"))
    versions = []
    for _ in range(3):
        with table.snapshot() as snap:
            versions.append(snap.version)
    assert versions == [1, 2, 3]
    other = table_class(KeyGroupRange(2, 5), MAXP)
    with other.snapshot() as snap:
        assert snap.version == 1


@pytest.mark.parametrize("table_class", HEAP_TABLES, ids=lambda c: c.__name__)
def test_a_table_snapshot_holds_what_the_table_held_at_its_moment(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTableSnapshot.__init__, key_group_entries, key_group_items,
    # size_of_key_group, __iter__, __len__ (what a snapshot reads, per key group).
    state_serializer = _CountingSerializer()
    table = table_class(
        KeyGroupRange(2, 5), MAXP, meta=StateMetaInfo("counts", state_serializer=state_serializer)
    )
    keys = {group: keys_of_group(table, group, 2) for group in range(2, 6)}
    for group in (2, 4):
        for i, key in enumerate(keys[group]):
            table.put(key, "ns", 10 * group + i)
    snap = table.snapshot()
    table.put(keys[3][0], "ns", 99)  # after the snapshot: not in it
    assert snap.key_group_range == KeyGroupRange(2, 5)
    assert snap.max_parallelism == MAXP
    assert snap.meta.name == "counts"
    assert type(snap.meta.state_serializer) is _CountingSerializer
    assert snap.meta.state_serializer is not state_serializer
    assert type(snap.key_serializer) is DefaultSerializer
    assert len(snap) == 4
    assert [snap.size_of_key_group(g) for g in range(2, 6)] == [2, 0, 2, 0]
    assert sorted(snap.key_group_entries(4)) == [(k, "ns", 40 + i) for i, k in enumerate(keys[4])]
    assert sorted(snap.key_group_items(2)) == [(k, "ns", 20 + i) for i, k in enumerate(keys[2])]
    assert list(snap.key_group_entries(3)) == []
    assert sorted(e.state for e in snap) == [20, 21, 40, 41]
    assert [e.state // 10 for e in snap] == [2, 2, 4, 4]  # key-group order
    snap.release()


@pytest.mark.parametrize("table_class", HEAP_TABLES, ids=lambda c: c.__name__)
def test_a_table_snapshot_applies_its_transformer_to_what_it_yields(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTableSnapshot.key_group_entries__mutmut_3..10,
    # key_group_items__mutmut_5..8 and _transformed__mutmut_1..9 (odd states
    # dropped, even ones halved; the sizes count before the transformer).
    def halve_evens(state: int) -> int | None:
        return state // 2 if state % 2 == 0 else None

    table = table_class(None, MAXP, meta=StateMetaInfo("t", snapshot_transformer=halve_evens))
    (a, b, c) = keys_of_group(table, 5, 3)
    table.put(a, "x", 4)
    table.put(b, "y", 7)
    table.put(c, "z", 10)
    with table.snapshot() as snap:
        assert snap.size_of_key_group(5) == 3
        assert len(snap) == 3
        assert sorted(snap.key_group_entries(5)) == sorted([(a, "x", 2), (c, "z", 5)])
        assert sorted(snap.key_group_items(5)) == sorted([(a, "x", 2), (c, "z", 5)])
        assert sorted(snap) == sorted([(a, "x", 2), (c, "z", 5)])
    assert table.get(a, "x") == 4


@pytest.mark.parametrize("table_class", HEAP_TABLES, ids=lambda c: c.__name__)
def test_a_released_key_group_of_a_table_snapshot_is_refused_by_name(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTableSnapshot.release_key_group__mutmut_1..5,
    # release__mutmut_1..4, is_key_group_released__mutmut_1..2, _open_index__mutmut_1..4,
    # is_released, __exit__.
    table = table_class(KeyGroupRange(2, 5), MAXP, meta=StateMetaInfo("counts"))
    (key,) = keys_of_group(table, 3, 1)
    table.put(key, "ns", 1)
    snap = table.snapshot()
    assert not snap.is_released
    assert [snap.is_key_group_released(g) for g in range(2, 6)] == [False] * 4
    snap.release_key_group(3)
    snap.release_key_group(3)  # idempotent
    assert [snap.is_key_group_released(g) for g in range(2, 6)] == [False, True, False, False]
    assert not snap.is_released
    released = (
        "expected an open key group, got key group 3 of snapshot #1 of 'counts', which was released"
    )
    assert message(SnapshotReleasedError, lambda: snap.key_group_entries(3)) == released
    assert message(SnapshotReleasedError, lambda: snap.key_group_items(3)) == released
    assert message(SnapshotReleasedError, lambda: snap.size_of_key_group(3)) == released
    assert message(SnapshotReleasedError, lambda: len(snap)) == released
    assert list(snap.key_group_entries(2)) == []
    assert snap.size_of_key_group(5) == 0
    assert repr(snap) == (
        f"<{type(snap).__name__} 'counts' #1 KeyGroupRange(2, 5), 3 key groups open>"
    )
    with snap:
        pass
    assert snap.is_released
    assert [snap.is_key_group_released(g) for g in range(2, 6)] == [True] * 4
    assert message(SnapshotReleasedError, lambda: snap.key_group_items(2)) == (
        "expected an open key group, got key group 2 of snapshot #1 of 'counts', which was released"
    )
    snap.release()  # idempotent
    assert repr(snap).endswith(", 0 key groups open>")


def test_a_copy_on_write_snapshot_hands_out_its_map_snapshots_while_open() -> None:
    # state_table CopyOnWriteStateTableSnapshot.map_snapshot__mutmut_1 and the
    # release of each map snapshot (_release).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(
        KeyGroupRange(2, 5), MAXP, meta=StateMetaInfo("counts")
    )
    (key,) = keys_of_group(table, 4, 1)
    table.put(key, "ns", 1)
    snap = table.snapshot()
    assert list(snap.map_snapshot(4)) == [(key, "ns", 1)]
    map_snapshot = snap.map_snapshot(2)
    snap.release_key_group(2)
    assert map_snapshot.is_released
    assert not snap.map_snapshot(4).is_released
    assert message(SnapshotReleasedError, lambda: snap.map_snapshot(2)) == (
        "expected an open key group, got key group 2 of snapshot #1 of 'counts', which was released"
    )
    kept = snap.map_snapshot(4)
    snap.release()
    assert kept.is_released


def test_a_table_releases_only_its_own_snapshots() -> None:
    # state_table StateTable.release__mutmut_1..12.
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, MAXP)
    other: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, MAXP)
    snap = other.snapshot()
    assert message(ForeignSnapshotError, lambda: table.release(snap)) == (
        "expected a snapshot taken from this table, got one of another table"
    )
    assert message(ForeignSnapshotError, lambda: table.release("snap")) == (  # type: ignore[arg-type]
        "expected a snapshot taken from this table, got str"
    )
    assert not snap.is_released
    other.release(snap)
    assert snap.is_released
    assert isinstance(snap, StateTableSnapshot)


# ------------------------------------------------------ state_meta: the meta info


def test_state_meta_info_names_each_bad_field() -> None:
    # state_meta StateMetaInfo.__post_init____mutmut_1..35.
    assert message(InvalidArgumentError, lambda: StateMetaInfo(name="")) == (
        "expected a non-empty str state name, got ''"
    )
    assert message(InvalidArgumentError, lambda: StateMetaInfo(name=3)) == (  # type: ignore[arg-type]
        "expected a non-empty str state name, got 3"
    )
    assert message(InvalidArgumentError, lambda: StateMetaInfo(kind="x")) == (  # type: ignore[arg-type]
        "expected a state kind in ('value', 'list', 'map', 'reducing', 'aggregating'), got 'x'"
    )
    assert message(InvalidArgumentError, lambda: StateMetaInfo(namespace_serializer=1)) == (  # type: ignore[arg-type]
        "expected a namespace_serializer with copy/serialize/deserialize, got int"
    )
    assert message(InvalidArgumentError, lambda: StateMetaInfo(state_serializer="s")) == (  # type: ignore[arg-type]
        "expected a state_serializer with copy/serialize/deserialize, got str"
    )
    assert message(InvalidArgumentError, lambda: StateMetaInfo(snapshot_transformer=3)) == (  # type: ignore[arg-type]
        "expected a callable snapshot_transformer or None, got int"
    )


def test_state_meta_info_stores_a_kind_given_as_a_string_as_a_state_kind() -> None:
    # state_meta StateMetaInfo.__post_init____mutmut_7..15 (the kind not replaced
    # by its StateKind) and StateKind.__repr__.
    meta = StateMetaInfo("s", "list")  # type: ignore[arg-type]
    assert type(meta.kind) is StateKind
    assert meta.kind is StateKind.LIST
    assert repr(meta.kind) == "'list'"
    assert sorted(vars(meta)) == [
        "kind",
        "name",
        "namespace_serializer",
        "snapshot_transformer",
        "state_serializer",
    ]
    transformer = StateMetaInfo(snapshot_transformer=len)
    assert transformer.snapshot_transformer is len


class _CountingSerializer(DefaultSerializer):
    """A serializer with ``duplicate()``: each duplicate is a new object."""

    def duplicate(self) -> _CountingSerializer:
        return _CountingSerializer()


def test_duplicated_meta_info_duplicates_both_serializers_and_keeps_the_rest() -> None:
    # state_meta StateMetaInfo.duplicated__mutmut_1..8.
    namespace_serializer = _CountingSerializer()
    state_serializer = _CountingSerializer()
    meta = StateMetaInfo(
        "s",
        StateKind.MAP,
        namespace_serializer=namespace_serializer,
        state_serializer=state_serializer,
        snapshot_transformer=len,
    )
    copy = meta.duplicated()
    assert type(copy.namespace_serializer) is _CountingSerializer
    assert type(copy.state_serializer) is _CountingSerializer
    assert copy.namespace_serializer is not namespace_serializer
    assert copy.state_serializer is not state_serializer
    assert copy.namespace_serializer is not copy.state_serializer
    assert (copy.name, copy.kind, copy.snapshot_transformer) == ("s", StateKind.MAP, len)
    shared = StateMetaInfo("t").duplicated()
    assert type(shared.state_serializer) is DefaultSerializer


def test_state_meta_info_metadata_records_identifiers() -> None:
    # state_meta StateMetaInfo.metadata__mutmut_1..12.
    meta = StateMetaInfo("s", StateKind.REDUCING, state_serializer=ImmutableSerializer())
    assert meta.metadata(3) == StateMetadata(
        id=3,
        name="s",
        kind=StateKind.REDUCING,
        namespace_serializer="cowstate-value",
        state_serializer="cowstate-value-immutable",
    )


# ------------------------------------------------------ descriptors: bad fields


def test_descriptors_name_each_bad_field() -> None:
    # descriptors StateDescriptor / ReducingStateDescriptor /
    # AggregatingStateDescriptor.__post_init__ (the checks and their messages).
    assert message(InvalidArgumentError, lambda: ValueStateDescriptor("")) == (
        "expected a non-empty str state name, got ''"
    )
    assert message(InvalidArgumentError, lambda: ListStateDescriptor(5)) == (  # type: ignore[arg-type]
        "expected a non-empty str state name, got 5"
    )
    assert message(InvalidArgumentError, lambda: ListStateDescriptor("l", 5)) == (  # type: ignore[arg-type]
        "expected a serializer with copy/serialize/deserialize for state 'l', got int"
    )
    assert message(InvalidArgumentError, lambda: ReducingStateDescriptor("r")) == (
        "expected a callable reduce_function for reducing state 'r', got NoneType"
    )
    assert message(
        InvalidArgumentError,
        lambda: ReducingStateDescriptor("r", reduce_function=3),  # type: ignore[arg-type]
    ) == ("expected a callable reduce_function for reducing state 'r', got int")
    assert message(InvalidArgumentError, lambda: AggregatingStateDescriptor("a")) == (
        "expected an aggregate_function with create_accumulator/add/get_result/merge for "
        "aggregating state 'a', got NoneType"
    )
    assert message(
        InvalidArgumentError,
        lambda: AggregatingStateDescriptor("a", aggregate_function=max),  # type: ignore[arg-type]
    ) == (
        "expected an aggregate_function with create_accumulator/add/get_result/merge for "
        "aggregating state 'a', got builtin_function_or_method"
    )
    reducing: ReducingStateDescriptor[int] = ReducingStateDescriptor("r", reduce_function=max)
    assert reducing.reduce_function is max
    assert ValueStateDescriptor("v").name == "v"
