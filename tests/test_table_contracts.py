"""What the table layer promises beyond the model comparison.

The state machines compare contents with the model; these tests pin what a
comparison of contents cannot see: that an explicit key group is obeyed,
that a table hashes keys with *its* key serializer, that fail-fast iteration
notices every insert and removal (also after earlier ones), the error
messages word for word, the inputs ``restore_table`` accepts, and the keyed
states' empty views. Each was a mutant of ``make mutate --scope tables``
that survived the rest of the suite. The table tests run over every table
type of ``conftest.TABLES``; those about table snapshots over the types with
the ``snapshots`` capability (the heap tables).

The tests marked ``kills`` were written for the mutants of one module each
(``cowstate.state_table``, ``nested_table``, ``table_base``, ``state_meta``,
``descriptors``; ``make mutate SCOPE=tables``), named in their comments. They
run over cowstate's two heap table classes (``TABLE_CLASSES``) or one of them:
routing and construction, the fail-fast counter operation by operation, table
snapshots, the nested map's counter and its rule U messages, the meta info.
Mutants that no behaviour can tell apart (a fail-fast counter bumped by 2
instead of 1, ...) are listed in ``docs/equivalent-mutants.md``.
"""

from __future__ import annotations

import gc
import io
import pickle
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from conftest import TABLES, Tables, table_types

from cowstate import nested_table, state_table
from cowstate.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
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
    NoneStateError,
    SnapshotReleasedError,
    StateCopyError,
    StateTooDeepError,
    TransformFunctionError,
    UnhashableKeyError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.introspection import describe
from cowstate.key_groups import (
    KeyGroupRange,
    assign_key_to_parallel_operator,
    assign_to_key_group,
)
from cowstate.keyed_state import VOID_NAMESPACE
from cowstate.nested_table import NestedMapsStateTable, NestedStateMap
from cowstate.serializers import DefaultSerializer, ImmutableSerializer, PickleSerializer
from cowstate.snapshot import (
    RestoredSnapshot,
    SnapshotReader,
    read_snapshot,
    restore_table,
    write_snapshot,
)
from cowstate.state_meta import SnapshotFormat, StateKind, StateMetadata, StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable, StateTable, StateTableSnapshot
from cowstate_spec.backends import BACKENDS, BackendImplementation, SumCount
from cowstate_spec.hostile import RaisingHash

MAXP = 16

#: cowstate's two heap table classes (the snapshot life cycle is theirs).
TABLE_CLASSES: list[type[StateTable[Any, Any, Any]]] = [CopyOnWriteStateTable, NestedMapsStateTable]

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


class TaggedSerializer:
    """A key serializer whose bytes differ from pickle's: the pickle behind a
    tag, so the keys decode again (the RocksDB table stores them)."""

    TAG = b"tagged:"

    def copy(self, state: Any) -> Any:
        return state

    def serialize(self, state: Any) -> bytes:
        return self.TAG + pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    def deserialize(self, data: bytes) -> Any:
        assert data.startswith(self.TAG), f"expected tagged bytes, got {data!r}"
        return pickle.loads(data[len(self.TAG) :])


@dataclass(frozen=True)
class Point:
    """A key without a Java counterpart: hashed through its serializer's bytes."""

    x: int
    y: int


def keys_told_apart(max_parallelism: int) -> list[Point]:
    """Keys that the two serializers put in different key groups (Points need an
    explicit serializer: the default one refuses user classes)."""
    return [
        key
        for key in (Point(i, i + 1) for i in range(50))
        if assign_to_key_group(key, max_parallelism, TaggedSerializer())
        != assign_to_key_group(key, max_parallelism, PickleSerializer())
    ]


def kg(key: Any) -> int:
    return assign_to_key_group(key, MAXP)


def keys_in(group: int, count: int = 1) -> list[int]:
    """The first ``count`` int keys of key group ``group``."""
    return [k for k in range(100 * MAXP * count) if kg(k) == group][:count]


def key_in_other_group(key: Any) -> int:
    """A key group of the table that is not ``key``'s own."""
    return (kg(key) + 1) % MAXP


# ------------------------------------------------------ routing and hashing


# It absorbed test_a_table_hashes_keys_with_its_own_key_serializer (table_base
# TableBase.key_group_of__mutmut_3, 6, state_table StateTable._route__mutmut_12,
# 15: the default key serializer instead of the table's): and reads it back.
@pytest.mark.kills(module="cowstate.table_base")
@pytest.mark.kills(module="cowstate.state_table")
@pytest.mark.parametrize("table_type", TABLES, indirect=True, ids=repr)
def test_a_table_hashes_keys_with_its_key_serializer(table_type: Tables) -> None:
    told_apart = keys_told_apart(MAXP)
    assert told_apart, "no key tells the serializers apart; pick other candidates"
    table = table_type(None, MAXP, key_serializer=TaggedSerializer())
    for key in told_apart:
        group = assign_to_key_group(key, MAXP, TaggedSerializer())
        assert table.key_group_of(key) == group
        table.put(key, "ns", 1)
        assert [e.key for e in table.entries_in_key_group(group)].count(key) == 1
        assert table.get(key, "ns") == 1
    assert assign_key_to_parallel_operator(
        told_apart[0], MAXP, MAXP, TaggedSerializer()
    ) == assign_to_key_group(told_apart[0], MAXP, TaggedSerializer())


@pytest.mark.parametrize("table_type", TABLES, indirect=True, ids=repr)
def test_an_explicit_key_group_is_obeyed_by_every_operation(table_type: Tables) -> None:
    """Flink passes the key context's key group down; the table trusts it."""
    table = table_type(None, MAXP)
    key = 7
    group = key_in_other_group(key)
    assert table.put_and_get_old(key, "ns", "a", key_group=group) is None
    assert table.contains_key(key, "ns", key_group=group)
    assert not table.contains_key(key, "ns")  # not in its own group
    assert table.put_and_get_old(key, "ns", "b", key_group=group) == "a"
    assert table.get(key, "ns", key_group=group) == "b"
    assert table.remove_and_get_old(key, "ns") is None  # its own group is empty
    assert table.remove_and_get_old(key, "ns", key_group=group) == "b"
    assert len(table) == 0


# It absorbed test_a_table_answers_in_for_key_namespace_pairs_only (table_base
# TableBase.__contains____mutmut_1..12): pairs of another length, a list.
@pytest.mark.kills(module="cowstate.table_base")
@pytest.mark.parametrize("table_type", TABLES, indirect=True, ids=repr)
def test_membership_takes_a_key_namespace_pair(table_type: Tables) -> None:
    table = table_type(None, MAXP)
    table.put(3, "ns", 1)
    assert (3, "ns") in table and (3, "other") not in table and (4, "ns") not in table
    assert message(InvalidArgumentError, lambda: 3 in table) == (
        "expected a (key, namespace) tuple, got int 3"
    )
    assert message(InvalidArgumentError, lambda: (1, 2, 3) in table) == (
        "expected a (key, namespace) tuple, got tuple (1, 2, 3)"
    )
    assert message(InvalidArgumentError, lambda: (1,) in table) == (
        "expected a (key, namespace) tuple, got tuple (1,)"
    )
    assert message(InvalidArgumentError, lambda: [1, "ns"] in table) == (
        "expected a (key, namespace) tuple, got list [1, 'ns']"
    )


# --------------------------- routing: explicit key groups, key types, refusals


@pytest.mark.kills(module="cowstate.state_table")
@pytest.mark.parametrize("table_class", TABLE_CLASSES, ids=lambda c: c.__name__)
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


@pytest.mark.kills(module="cowstate.state_table")
def test_a_table_names_a_missing_key_and_a_key_group_that_is_no_int() -> None:
    # state_table StateTable._route__mutmut_1..5 and __mutmut_17..20.
    table: CopyOnWriteStateTable[Any, str, int] = CopyOnWriteStateTable(None, MAXP)
    assert message(InvalidArgumentError, lambda: table.put(None, "ns", 1)) == (
        "expected a key, got None; keyed state needs a key (no key set?)"
    )
    assert message(InvalidArgumentError, lambda: table.get(1, "ns", key_group="3")) == (  # type: ignore[arg-type]
        "expected an int key_group, got str '3'"
    )
    (key,) = keys_in(3, 1)
    table.put(key, "ns", 1, key_group=3)
    assert table.get(key, "ns", key_group=3) == 1
    assert len(table) == 1


@pytest.mark.kills(module="cowstate.state_table")
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


@pytest.mark.kills(module="cowstate.state_table")
def test_a_table_routes_each_key_group_of_a_range_to_its_own_map() -> None:
    # state_table StateTable._route__mutmut_21..24 and StateTable.__init____mutmut_9
    # (an index from the wrong start).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(KeyGroupRange(1, 6), MAXP)
    for group in range(1, 7):
        (key,) = keys_in(group, 1)
        table.put(key, "ns", group)
    for group in range(1, 7):
        assert [e.state for e in table.entries_in_key_group(group)] == [group]
        assert len(table.state_map(group)) == 1


@pytest.mark.kills(module="cowstate.state_table")
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


@pytest.mark.kills(module="cowstate.state_table")
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


@pytest.mark.kills(module="cowstate.table_base")
@pytest.mark.kills(module="cowstate.state_table")
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


# ------------------------------ construction: a table's range, meta info, maps


@pytest.mark.kills(module="cowstate.table_base")
def test_a_table_of_max_parallelism_one_holds_key_group_zero() -> None:
    # table_base TableBase.__init____mutmut_7 (``max_parallelism > 1``: no range
    # made for a max parallelism of 1).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, 1)
    assert table.key_group_range == KeyGroupRange(0, 0)
    assert table.put(7, "ns", 1) is True
    assert list(table.entries_in_key_group(0)) == [(7, "ns", 1)]


@pytest.mark.kills(module="cowstate.table_base")
def test_a_table_names_a_bad_max_parallelism_before_making_a_range() -> None:
    # table_base TableBase.__init____mutmut_1 and __mutmut_6 (the range made from
    # a max parallelism that is not an int, or is 0).
    assert message(InvalidArgumentError, lambda: CopyOnWriteStateTable(None, 0)) == (
        "expected max_parallelism in 1..32768, got 0"
    )
    assert message(InvalidArgumentError, lambda: CopyOnWriteStateTable(None, "8")) == (  # type: ignore[arg-type]
        "expected max_parallelism in 1..32768, got '8'"
    )


@pytest.mark.kills(module="cowstate.table_base")
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


@pytest.mark.kills(module="cowstate.state_table")
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


# ------------------------------------------------------------ fail-fast


INSERTS = {
    "put": lambda t, k: t.put(k, "ns", 1),
    "put_and_get_old": lambda t, k: t.put_and_get_old(k, "ns", 1),
    "transform": lambda t, k: t.transform(k, "ns", 1, lambda old, v: v),
}
REMOVALS = {
    "remove": lambda t, k: t.remove(k, "ns"),
    "remove_and_get_old": lambda t, k: t.remove_and_get_old(k, "ns"),
}


@pytest.mark.parametrize("table_type", TABLES, indirect=True, ids=repr)
@pytest.mark.parametrize("change", [*INSERTS, *REMOVALS])
def test_iteration_fails_fast_on_a_change_in_a_later_key_group(
    table_type: Tables, change: str
) -> None:
    """The per-key-group map cannot see a change to a group it has not reached;
    the table's own counter must. The same operation runs once before the
    walk, so an operation that set the counter instead of advancing it would
    leave it where the walk started. A table without fail-fast iteration
    (RocksDB) yields instead every unchanged mapping exactly once and the
    changed one at most once."""
    table = table_type(None, MAXP)
    [first], [later, spare, fresh] = keys_in(0), keys_in(MAXP - 1, 3)
    table.put(first, "ns", 1)
    table.put(later, "ns", 1)
    if change in INSERTS:
        INSERTS[change](table, spare)  # the same operation, before the walk
    else:
        table.put(spare, "ns", 1)
        REMOVALS[change](table, spare)
    it = iter(table)
    assert next(it).key == first
    if change in INSERTS:
        INSERTS[change](table, fresh)
    else:
        REMOVALS[change](table, later)
    if table_type.capabilities.fail_fast:
        with pytest.raises(ConcurrentModificationError, match="while iterating the table"):
            list(it)
    else:  # RocksDB: the change is seen or not, never an error, never a mapping twice
        rest = [entry.key for entry in it]
        assert len(rest) == len(set(rest)), f"a mapping yielded twice: {rest}"
        if change in INSERTS:  # ``fresh`` may be seen
            assert {later, spare} <= set(rest) <= {later, spare, fresh}
        else:  # ``later`` may be seen
            assert set(rest) <= {later}


@pytest.mark.parametrize("table_type", TABLES, indirect=True, ids=repr)
def test_replacing_a_state_is_not_a_structural_change(table_type: Tables) -> None:
    table = table_type(None, MAXP)
    [first], [later] = keys_in(0), keys_in(MAXP - 1)
    table.put(first, "ns", 1)
    table.put(later, "ns", 1)
    seen = []
    for entry in table:
        seen.append(entry.key)
        assert table.put_and_get_old(later, "ns", 2) is not None
        table.put(first, "ns", 3)
        assert table.remove_and_get_old(12345, "absent") is None
        table.remove(12345, "absent")
    assert seen == [first, later]


# ---------------------- fail-fast: the table's counter, operation by operation


def _walk_one_group_then(table: StateTable[Any, Any, Any], change: Callable[[], object]) -> str:
    """Walk key group 0 (two mappings), ``change()`` after the first entry, and
    return the message of the ConcurrentModificationError of the next step."""
    first, second = keys_in(0, 2)
    table.put(first, "ns", 1)
    table.put(second, "ns", 2)
    walk = table.entries_in_key_group(0)
    next(walk)
    change()
    return message(ConcurrentModificationError, lambda: next(walk))


@pytest.mark.kills(module="cowstate.state_table")
def test_table_walk_notices_an_insert_by_put_and_get_old_undone_by_a_removal() -> None:
    # state_table StateTable.put_and_get_old__mutmut_15 (the counter goes down on
    # an insert, so the removal that follows brings it back where the walk started).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, MAXP)
    (other,) = keys_in(1, 1)

    def insert_then_remove() -> None:
        assert table.put_and_get_old(other, "ns", 3) is None
        assert table.remove_and_get_old(other, "ns") == 3

    assert _walk_one_group_then(table, insert_then_remove) == TABLE_CHANGED_MID_WALK
    assert len(table) == 2


@pytest.mark.kills(module="cowstate.state_table")
def test_table_walk_notices_a_removal_by_remove_and_get_old_after_an_insert() -> None:
    # state_table StateTable.remove_and_get_old__mutmut_12 (the counter goes down
    # on a removal and cancels the insert's step up).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, MAXP)
    (other,) = keys_in(1, 1)

    def insert_then_remove() -> None:
        assert table.put(other, "ns", 3) is True
        assert table.remove_and_get_old(other, "ns") == 3

    assert _walk_one_group_then(table, insert_then_remove) == TABLE_CHANGED_MID_WALK


@pytest.mark.kills(module="cowstate.state_table")
def test_table_walk_notices_an_insert_by_put_undone_by_a_removal() -> None:
    # state_table StateTable.put__mutmut_14 (put counts down) and
    # StateTable.remove__mutmut_13 (remove counts down): each cancels the other.
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, MAXP)
    (other,) = keys_in(1, 1)
    table.put(other, "ns", 0)

    def remove_then_insert() -> None:
        table.remove(other, "ns")
        assert table.put(other, "ns", 3) is True

    assert _walk_one_group_then(table, remove_then_insert) == TABLE_CHANGED_MID_WALK


@pytest.mark.kills(module="cowstate.state_table")
def test_table_walk_notices_an_insert_by_transform_undone_by_a_removal() -> None:
    # state_table StateTable.transform__mutmut_17 (transform counts down an insert).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(None, MAXP)
    (other,) = keys_in(1, 1)

    def insert_then_remove() -> None:
        table.transform(other, "ns", 5, lambda old, value: value)
        table.remove(other, "ns")

    assert _walk_one_group_then(table, insert_then_remove) == TABLE_CHANGED_MID_WALK


@pytest.mark.kills(module="cowstate.state_table")
def test_nested_table_walk_notices_changes_that_cancel_out_in_a_buggy_counter() -> None:
    # The same pins over the nested table, whose StateTable counters are shared.
    table: NestedMapsStateTable[int, str, int] = NestedMapsStateTable(None, MAXP)
    (other,) = keys_in(1, 1)

    def insert_then_remove() -> None:
        assert table.put_and_get_old(other, "ns", 3) is None
        assert table.remove_and_get_old(other, "ns") == 3

    assert _walk_one_group_then(table, insert_then_remove) == TABLE_CHANGED_MID_WALK


@pytest.mark.kills(module="cowstate.state_table")
@pytest.mark.parametrize("table_class", TABLE_CLASSES, ids=lambda c: c.__name__)
def test_table_walk_notices_a_lone_removal_and_not_a_removal_of_nothing(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTable.remove__mutmut_6 (no size taken: every remove counts),
    # __mutmut_11 (only a remove of nothing counts) and __mutmut_12 (the counter
    # set to 1), and transform__mutmut_6 / __mutmut_15 (the same for transform).
    table = table_class(None, MAXP)
    (other, absent) = keys_in(1, 2)
    table.put(other, "ns", 0)
    table.put(absent, "ns", 0)
    table.remove(absent, "ns")
    first, second, third = keys_in(0, 3)
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


@pytest.mark.kills(module="cowstate.state_table")
@pytest.mark.parametrize("table_class", TABLE_CLASSES, ids=lambda c: c.__name__)
def test_table_walk_notices_a_removal_when_the_last_change_was_a_removal(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTable.remove__mutmut_12 (a removal sets the counter to 1:
    # a walk started right after a removal never sees the next one).
    table = table_class(None, MAXP)
    x, y = keys_in(0, 2)
    other, z = keys_in(1, 2)
    for key in (x, y, other, z):
        table.put(key, "ns", 1)
    table.remove(z, "ns")
    walk = table.entries_in_key_group(0)
    next(walk)
    table.remove(other, "ns")
    assert message(ConcurrentModificationError, lambda: next(walk)) == TABLE_CHANGED_MID_WALK


@pytest.mark.kills(module="cowstate.state_table")
@pytest.mark.parametrize("table_class", TABLE_CLASSES, ids=lambda c: c.__name__)
def test_a_whole_table_walk_goes_in_key_group_order_and_fails_fast_at_its_end(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTable.__iter____mutmut_1..4 and _iterate__mutmut_7..10 (the
    # check after the last entry, and its message).
    table = table_class(KeyGroupRange(2, 5), MAXP)
    for group in (5, 2, 4):
        (key,) = keys_in(group, 1)
        table.put(key, "ns", group)
    assert [e.state for e in table] == [2, 4, 5]
    walk = iter(table)
    assert [next(walk).state for _ in range(3)] == [2, 4, 5]
    (key,) = keys_in(3, 1)
    table.put(key, "ns", 3)  # after the last entry was handed out
    assert message(ConcurrentModificationError, lambda: next(walk)) == (
        "expected no mapping added or removed while iterating the table"
    )
    assert sorted(table.keys("ns")) == sorted(e.key for e in table)


# ----------------------------------------------------------- snapshots


@pytest.mark.parametrize("table_type", table_types(snapshots=True), indirect=True, ids=repr)
def test_snapshot_length_counts_every_key_group(table_type: Tables) -> None:
    table = table_type(KeyGroupRange(2, 9), MAXP)
    keys = [k for k in range(200) if 2 <= kg(k) <= 9]
    for key in keys:
        table.put(key, "ns", key)
    with table.snapshot() as snap:
        assert len(snap) == len(keys)
        assert sum(snap.size_of_key_group(g) for g in range(2, 10)) == len(keys)


# It absorbed test_a_table_releases_only_its_own_snapshots (state_table
# StateTable.release__mutmut_1..12): the same checks, and the snapshot's type.
@pytest.mark.kills(module="cowstate.state_table")
# It absorbed test_a_table_releases_only_its_own_snapshots (state_table
# StateTable.release__mutmut_1..12): the same checks, and the snapshot's type.
@pytest.mark.kills(module="cowstate.state_table")
@pytest.mark.parametrize("table_type", table_types(snapshots=True), indirect=True, ids=repr)
def test_release_refuses_what_is_not_its_own_snapshot(table_type: Tables) -> None:
    table, other = table_type(None, MAXP), table_type(None, MAXP)
    snap = other.snapshot()
    assert message(ForeignSnapshotError, lambda: table.release(snap)) == (
        "expected a snapshot taken from this table, got one of another table"
    )
    assert message(ForeignSnapshotError, lambda: table.release("snap")) == (
        "expected a snapshot taken from this table, got str"
    )
    assert not snap.is_released
    other.release(snap)
    assert snap.is_released
    assert isinstance(snap, StateTableSnapshot)


# -------------------- table snapshots: numbers, contents, transformer, release


@pytest.mark.kills(module="cowstate.state_table")
@pytest.mark.parametrize("table_class", TABLE_CLASSES, ids=lambda c: c.__name__)
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


class _CountingSerializer(DefaultSerializer):
    """A serializer with ``duplicate()``: each duplicate is a new object."""

    def duplicate(self) -> _CountingSerializer:
        return _CountingSerializer()


@pytest.mark.kills(module="cowstate.state_table")
@pytest.mark.parametrize("table_class", TABLE_CLASSES, ids=lambda c: c.__name__)
def test_a_table_snapshot_holds_what_the_table_held_at_its_moment(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTableSnapshot.__init__, key_group_entries, key_group_items,
    # size_of_key_group, __iter__, __len__ (what a snapshot reads, per key group).
    state_serializer = _CountingSerializer()
    table = table_class(
        KeyGroupRange(2, 5), MAXP, meta=StateMetaInfo("counts", state_serializer=state_serializer)
    )
    keys = {group: keys_in(group, 2) for group in range(2, 6)}
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


@pytest.mark.kills(module="cowstate.state_table")
@pytest.mark.parametrize("table_class", TABLE_CLASSES, ids=lambda c: c.__name__)
def test_a_table_snapshot_applies_its_transformer_to_what_it_yields(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTableSnapshot.key_group_entries__mutmut_3..10,
    # key_group_items__mutmut_5..8 and _transformed__mutmut_1..9 (odd states
    # dropped, even ones halved; the sizes count before the transformer).
    def halve_evens(state: int) -> int | None:
        return state // 2 if state % 2 == 0 else None

    table = table_class(None, MAXP, meta=StateMetaInfo("t", snapshot_transformer=halve_evens))
    (a, b, c) = keys_in(5, 3)
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


@pytest.mark.kills(module="cowstate.state_table")
@pytest.mark.parametrize("table_class", TABLE_CLASSES, ids=lambda c: c.__name__)
def test_a_released_key_group_of_a_table_snapshot_is_refused_by_name(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # state_table StateTableSnapshot.release_key_group__mutmut_1..5,
    # release__mutmut_1..4, is_key_group_released__mutmut_1..2, _open_index__mutmut_1..4,
    # is_released, __exit__.
    table = table_class(KeyGroupRange(2, 5), MAXP, meta=StateMetaInfo("counts"))
    (key,) = keys_in(3, 1)
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


@pytest.mark.kills(module="cowstate.state_table")
def test_a_copy_on_write_snapshot_hands_out_its_map_snapshots_while_open() -> None:
    # state_table CopyOnWriteStateTableSnapshot.map_snapshot__mutmut_1 and the
    # release of each map snapshot (_release).
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(
        KeyGroupRange(2, 5), MAXP, meta=StateMetaInfo("counts")
    )
    (key,) = keys_in(4, 1)
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


# ------------------------------------------------- nested map: bad input


def test_nested_map_names_the_unhashable_part() -> None:
    table: NestedMapsStateTable[Any, Any, Any] = NestedMapsStateTable(None, MAXP)
    m = table.state_map(kg(1))
    assert message(UnhashableKeyError, lambda: m.contains_key([1], "ns")) == (
        "expected a hashable key, got list [1]"
    )
    assert message(UnhashableKeyError, lambda: m.contains_key(1, {"n": 1})) == (
        "expected a hashable namespace, got dict {'n': 1}"
    )
    assert message(UnhashableKeyError, lambda: m.remove_and_get_old([1], "ns")) == (
        "expected a hashable key, got list [1]"
    )
    assert message(UnhashableKeyError, lambda: m.remove_and_get_old(1, ["n"])) == (
        "expected a hashable namespace, got list ['n']"
    )


def test_nested_map_transform_errors_name_the_function_and_the_mapping() -> None:
    table: NestedMapsStateTable[int, str, Any] = NestedMapsStateTable(None, MAXP)
    table.put(5, "ns", 1)

    def explode(old: Any, value: Any) -> Any:
        raise ValueError("boom")

    assert message(TransformFunctionError, lambda: table.transform(5, "ns", 0, explode)) == (
        "expected transform function 'explode' to return a state, got ValueError: boom; "
        "(5, 'ns') still maps the same state object (an in-place change the function made "
        "to its argument is not undone)"
    )
    assert message(NoneStateError, lambda: table.transform(5, "ns", 0, lambda o, v: None)) == (
        "expected the transform function to return a state, got None for (5, 'ns'); "
        "the mapping is unchanged"
    )
    assert table.get(5, "ns") == 1


# ------------------------------------------- nested map: the fail-fast counter


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


@pytest.mark.kills(module="cowstate.nested_table")
def test_nested_map_walk_notices_an_insert_undone_by_a_removal() -> None:
    # nested_table NestedStateMap.put_and_get_old__mutmut_34 (an insert counts
    # down; the removal after it brings the counter back to where the walk started).
    m = NestedStateMap[Any, Any, Any]()

    def insert_then_remove() -> None:
        assert m.put_and_get_old(11, "b", 11) is None
        assert m.remove_and_get_old(11, "b") == 11

    assert _walk_namespace_a_then(m, insert_then_remove) == MAP_CHANGED
    assert len(m) == 3


@pytest.mark.kills(module="cowstate.nested_table")
def test_nested_map_walk_notices_a_removal_undone_by_an_insert() -> None:
    # nested_table NestedStateMap.remove_and_get_old__mutmut_30 (a removal counts down).
    m = NestedStateMap[Any, Any, Any]()

    def remove_then_insert() -> None:
        assert m.put(11, "b", 11) is True
        m.remove(11, "b")

    assert _walk_namespace_a_then(m, remove_then_insert) == MAP_CHANGED


@pytest.mark.kills(module="cowstate.nested_table")
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


# ------------------------------------------- nested map: rule U, word for word


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


@pytest.mark.kills(module="cowstate.nested_table")
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


@pytest.mark.kills(module="cowstate.nested_table")
def test_nested_size_of_namespace_names_the_namespace_when_namespaces_cannot_be_compared() -> None:
    # nested_table NestedStateMap.size_of_namespace__mutmut_3..7 (the message loses
    # the namespace or the cause).
    m = NestedStateMap[Any, Any, Any]()
    m.put(1, _Clashing("stored"), 1)
    assert message(KeyComparisonError, lambda: m.size_of_namespace(_Clashing("asked"))) == (
        "expected comparing (None, Clashing(asked)) with the mapped keys (__eq__) to return "
        "a bool, got ValueError: no comparing today; the map is unchanged"
    )


@pytest.mark.kills(module="cowstate.nested_table")
def test_nested_get_names_the_key_and_namespace_when_keys_cannot_be_compared() -> None:
    # nested_table NestedStateMap.get__mutmut_11..16.
    m = NestedStateMap[Any, Any, Any]()
    m.put(_Clashing("stored"), "ns", 1)
    assert message(KeyComparisonError, lambda: m.get(_Clashing("asked"), "ns")) == (
        "expected comparing (Clashing(asked), 'ns') with the mapped keys (__eq__) to return "
        "a bool, got ValueError: no comparing today; the map is unchanged"
    )


@pytest.mark.kills(module="cowstate.nested_table")
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


@pytest.mark.kills(module="cowstate.nested_table")
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


@pytest.mark.kills(module="cowstate.nested_table")
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


@pytest.mark.kills(module="cowstate.nested_table")
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


@pytest.mark.kills(module="cowstate.nested_table")
def test_nested_map_names_the_key_or_namespace_whose_hash_raises() -> None:
    # nested_table _check_hashable__mutmut_7..12 (KeyHashError of the wrong part,
    # or without its cause).
    m = NestedStateMap[Any, Any, Any]()
    assert message(KeyHashError, lambda: m.get(RaisingHash(), "ns")) == (
        "expected hash() of the key RaisingHash() to return an int, got ValueError: "
        "no hash today; the map is unchanged"
    )
    assert message(KeyHashError, lambda: m.put(1, RaisingHash(), 1)) == (
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


@pytest.mark.kills(module="cowstate.nested_table")
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


# -------------------------------------------------- nested map: its serializer


@pytest.mark.kills(module="cowstate.nested_table")
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


# ---------------------------------------------------------- restore_table


def two_state_file() -> tuple[bytes, dict[tuple[Any, Any], Any]]:
    """A file with states ``a`` (plain) and ``b`` (pickled, and whose states
    cannot be unpickled); ``a``'s contents."""
    a: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(
        None, MAXP, meta=StateMetaInfo("a")
    )
    b: CopyOnWriteStateTable[int, str, Unpicklable] = CopyOnWriteStateTable(
        None, MAXP, meta=StateMetaInfo("b", state_serializer=PickleSerializer())
    )
    for key in range(40):
        a.put(key, "ns", key * 10)
        b.put(key, "ns", Unpicklable(key))
    out = io.BytesIO()
    write_snapshot([a.snapshot(), b.snapshot()], out)
    return out.getvalue(), {(e.key, e.namespace): e.state for e in a}


class Unpicklable:
    """Pickles fine; unpickling raises (its class refuses to be rebuilt)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self) -> Any:
        return (_refuse, (self.n,))


def _refuse(n: int) -> Any:
    raise RuntimeError(f"cannot rebuild {n}")


def test_restore_table_decodes_only_its_own_state() -> None:
    data, expected = two_state_file()
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(
        None, MAXP, meta=StateMetaInfo("a")
    )
    assert restore_table(table, [data]) == len(expected)
    assert {(e.key, e.namespace): e.state for e in table} == expected


@pytest.mark.parametrize("form", ["bytes", "bytearray", "stream", "list", "generator"])
def test_restore_table_takes_one_file_or_many(form: str) -> None:
    data, expected = two_state_file()
    given: Any = {
        "bytes": data,
        "bytearray": bytearray(data),
        "stream": io.BytesIO(data),
        "list": [data],
        "generator": (d for d in [data]),
    }[form]
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(
        KeyGroupRange(0, 7), MAXP, meta=StateMetaInfo("a")
    )
    mine = {kn: s for kn, s in expected.items() if kg(kn[0]) <= 7}
    assert restore_table(table, given) == len(mine)
    assert {(e.key, e.namespace): e.state for e in table} == mine
    for entry in table:  # each entry in its own key group
        assert table.contains_key(entry.key, entry.namespace, key_group=kg(entry.key))


def test_restore_table_refuses_what_is_not_a_file() -> None:
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(
        None, MAXP, meta=StateMetaInfo("a")
    )
    not_a_file: Any = 42
    assert message(InvalidArgumentError, lambda: restore_table(table, not_a_file)) == (
        "expected snapshot files (bytes or binary streams, or an iterable of them), got int"
    )
    assert len(table) == 0


def test_a_stream_without_seekable_is_read_into_memory() -> None:
    data, expected = two_state_file()

    class ReadOnly:
        """Only ``read``: no ``seekable``, ``seek`` or ``tell``."""

        def __init__(self, payload: bytes) -> None:
            self._inner = io.BytesIO(payload)

        def read(self, size: int = -1) -> bytes:
            return self._inner.read(size)

    stream: Any = ReadOnly(data)  # read_snapshot is typed for IO[bytes]; read() is all it needs
    restored = read_snapshot(stream, KeyGroupRange(0, MAXP - 1), states={"a"})
    assert {(k, n): s for _, k, n, s in restored.entries("a")} == expected


def test_restored_snapshot_size_of_an_absent_state_is_zero() -> None:
    data, expected = two_state_file()
    restored = read_snapshot(data, KeyGroupRange(0, MAXP - 1), states={"a"})
    assert restored.size("a") == len(expected)
    assert restored.size("b") == 0 and restored.size("never") == 0
    assert RestoredSnapshot(KeyGroupRange(0, 3), MAXP).size("a") == 0


# ----------------------------------------------------------- keyed states


def test_empty_map_state_views_are_empty_lists() -> None:
    with HeapKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP) as b:
        state = b.get_state(MapStateDescriptor("map"))
        b.set_current_key(1)
        assert state.keys() == [] and state.values() == [] and state.items() == []
        state.put_all({"u": 1, "v": 2})
        assert state.keys() == ["u", "v"] and state.values() == [1, 2]
        assert message(InvalidArgumentError, lambda: state.put_all([("w", 3)])) == (  # type: ignore[arg-type]
            "expected a mapping of user keys to values, got list"
        )
        assert state.items() == [("u", 1), ("v", 2)]


#: The contract of VOID_NAMESPACE, whichever type it is: one instance that
#: pickle, copy, deepcopy and the value codec give back as itself, hash 99,
#: equal to itself only; prints the checks it passed.
VOID_CONTRACT = """
import copy, pickle
from cowstate import VOID_NAMESPACE as V
from cowstate.keyed_state import VoidNamespace
from cowstate.serializers import DefaultSerializer
assert repr(V) == "VOID_NAMESPACE" and str(V) == "VOID_NAMESPACE"
assert VoidNamespace() is V and type(V) is VoidNamespace
assert hash(V) == 99 and V == V and not V != V
assert V != 99 and V != "VOID_NAMESPACE" and V != None and not V == object()
for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
    assert pickle.loads(pickle.dumps(V, protocol)) is V
    assert pickle.loads(pickle.dumps([V, (V,)], protocol))[1][0] is V
assert copy.copy(V) is V and copy.deepcopy({"n": [V]})["n"][0] is V
codec = DefaultSerializer()
assert codec.deserialize(codec.serialize(V)) is V
assert codec.deserialize(codec.serialize((1, V)))[1] is V
print(type(V).__module__, type(V).__qualname__, bool(type(V).__flags__ & (1 << 14)))
"""


def test_void_namespace_is_one_named_value_the_collector_never_tracks() -> None:
    # Issue 28: a Python class is always a GC type, so every map entry holding
    # VOID_NAMESPACE counted for a full collection; cowstate._void's type is not.
    exec(VOID_CONTRACT, {})
    assert not type(VOID_NAMESPACE).__flags__ & (1 << 14)  # Py_TPFLAGS_HAVE_GC
    assert not gc.is_tracked(VOID_NAMESPACE) and gc.get_referents(VOID_NAMESPACE) == []
    with pytest.raises(TypeError):
        type("Sub", (type(VOID_NAMESPACE),), {})  # one instance: no subclasses
    with pytest.raises(TypeError, match="takes no arguments"):
        type(VOID_NAMESPACE)(1)  # type: ignore[call-arg]  # the refusal under test


def test_without_the_extension_void_namespace_keeps_its_contract() -> None:
    # cowstate._void not built: the Python singleton, a GC type, same contract.
    code = "import sys; sys.modules['cowstate._void'] = None\n" + VOID_CONTRACT
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cowstate.keyed_state", "PythonVoidNamespace", "True"]


# ------------------------------------------------------------ descriptors


# It absorbed test_descriptors_name_each_bad_field (descriptors StateDescriptor /
# ReducingStateDescriptor / AggregatingStateDescriptor.__post_init__, the checks
# and their messages): a serializer given by position, a reduce function missing.
@pytest.mark.kills(module="cowstate.descriptors")
def test_descriptor_messages() -> None:
    assert message(InvalidArgumentError, lambda: ValueStateDescriptor("")) == (
        "expected a non-empty str state name, got ''"
    )
    assert message(InvalidArgumentError, lambda: ListStateDescriptor(3)) == (  # type: ignore[arg-type]
        "expected a non-empty str state name, got 3"
    )
    assert message(InvalidArgumentError, lambda: ValueStateDescriptor("v", serializer=1)) == (  # type: ignore[arg-type]
        "expected a serializer with copy/serialize/deserialize for state 'v', got int"
    )
    assert message(InvalidArgumentError, lambda: ListStateDescriptor("l", 5)) == (  # type: ignore[arg-type]
        "expected a serializer with copy/serialize/deserialize for state 'l', got int"
    )
    assert message(InvalidArgumentError, lambda: ReducingStateDescriptor("r")) == (
        "expected a callable reduce_function for reducing state 'r', got NoneType"
    )
    not_a_function: Any = 5
    assert message(
        InvalidArgumentError, lambda: ReducingStateDescriptor("r", reduce_function=not_a_function)
    ) == ("expected a callable reduce_function for reducing state 'r', got int")
    assert message(InvalidArgumentError, lambda: AggregatingStateDescriptor("g")) == (
        "expected an aggregate_function with create_accumulator/add/get_result/merge for "
        "aggregating state 'g', got NoneType"
    )
    not_an_aggregate: Any = max
    assert message(
        InvalidArgumentError,
        lambda: AggregatingStateDescriptor("g", aggregate_function=not_an_aggregate),
    ) == (
        "expected an aggregate_function with create_accumulator/add/get_result/merge for "
        "aggregating state 'g', got builtin_function_or_method"
    )
    good = AggregatingStateDescriptor("g", aggregate_function=SumCount())
    assert good.name == "g" and good.kind == "aggregating"
    assert ReducingStateDescriptor("r", reduce_function=max).kind == "reducing"
    reducing: ReducingStateDescriptor[int] = ReducingStateDescriptor("r", reduce_function=max)
    assert reducing.reduce_function is max
    assert ValueStateDescriptor("v").name == "v"


# It absorbed test_state_meta_info_names_each_bad_field (state_meta
# StateMetaInfo.__post_init____mutmut_1..35): every field's refusal.
@pytest.mark.kills(module="cowstate.state_meta")
def test_state_meta_info_messages() -> None:
    assert message(InvalidArgumentError, lambda: StateMetaInfo("")) == (
        "expected a non-empty str state name, got ''"
    )
    assert message(InvalidArgumentError, lambda: StateMetaInfo(None)) == (  # type: ignore[arg-type]
        "expected a non-empty str state name, got None"
    )
    assert message(InvalidArgumentError, lambda: StateMetaInfo(name=3)) == (  # type: ignore[arg-type]
        "expected a non-empty str state name, got 3"
    )
    assert message(InvalidArgumentError, lambda: StateMetaInfo(kind="x")) == (  # type: ignore[arg-type]
        f"expected a state kind in {tuple(kind.value for kind in StateKind)}, got 'x'"
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


# ----------------------------------- state_meta: the meta info and the formats


@pytest.mark.kills(module="cowstate.state_meta")
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


@pytest.mark.kills(module="cowstate.state_meta")
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


@pytest.mark.kills(module="cowstate.state_meta")
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


@pytest.mark.kills(module="cowstate.state_meta")
def test_snapshot_formats_repr_as_their_plain_values() -> None:
    # state_meta SnapshotFormat.__repr__mutmut_1 (repr(None) for every format).
    assert [repr(f) for f in SnapshotFormat] == [
        "'heap'",
        "'canonical'",
        "'rocksdb-native'",
        "'heap-delta'",
        "'heap-removals'",
    ]
    assert repr([SnapshotFormat.CANONICAL]) == "['canonical']"


# ------------------------------------------ nested maps: serializers, fail-fast


def test_nested_table_copies_at_snapshot_with_its_state_serializer() -> None:
    """A deep copy by default; none under ``ImmutableSerializer`` (the caller's
    promise), so the table must hand its meta's serializer to each map."""
    copying: NestedMapsStateTable[int, str, list[int]] = NestedMapsStateTable(None, MAXP)
    trusting: NestedMapsStateTable[int, str, list[int]] = NestedMapsStateTable(
        None, MAXP, meta=StateMetaInfo(state_serializer=ImmutableSerializer())
    )
    for table in (copying, trusting):
        table.put(1, "ns", [1])
    with copying.snapshot() as a, trusting.snapshot() as b:
        copied, shared = next(iter(a)).state, next(iter(b)).state
    assert copied == [1] and copied is not copying.get(1, "ns")
    assert shared is trusting.get(1, "ns")
    plain, immutable = (
        NestedStateMap[Any, Any, Any](),
        NestedStateMap[Any, Any, Any](ImmutableSerializer()),
    )
    for m in (plain, immutable):
        m.put(1, "ns", [1])
    assert plain.copy_entries()[0].state is not plain.get(1, "ns")
    assert immutable.copy_entries()[0].state is immutable.get(1, "ns")
    assert isinstance(plain.serializer, DefaultSerializer)


# It absorbed test_set_meta_info_names_what_it_got_and_reaches_every_map
# (table_base TableBase.set_meta_info__mutmut_1..5).
@pytest.mark.kills(module="cowstate.table_base")
def test_set_meta_info_message() -> None:
    table: NestedMapsStateTable[Any, Any, Any] = NestedMapsStateTable(None, MAXP)
    assert message(InvalidArgumentError, lambda: table.set_meta_info("meta")) == (  # type: ignore[arg-type]
        "expected a StateMetaInfo, got str"
    )
    assert message(InvalidArgumentError, lambda: table.set_meta_info(3)) == (  # type: ignore[arg-type]
        "expected a StateMetaInfo, got int"
    )
    two: NestedMapsStateTable[int, str, int] = NestedMapsStateTable(KeyGroupRange(0, 1), 2)
    serializer = ImmutableSerializer()
    meta = StateMetaInfo("renamed", state_serializer=serializer)
    two.set_meta_info(meta)
    assert two.meta is meta
    assert two.serializer is serializer
    assert two.state_map(0).serializer is serializer
    assert two.state_map(1).serializer is serializer


def test_nested_map_refuses_none_word_for_word() -> None:
    m = NestedStateMap[Any, Any, Any]()
    assert message(NoneStateError, lambda: m.put(1, "ns", None)) == (
        "expected a state for put(1, 'ns'), got None; None means absent, use remove() to unmap"
    )
    assert len(m) == 0


def test_nested_map_iteration_fails_fast_word_for_word() -> None:
    m = NestedStateMap[Any, Any, Any]()
    m.put(1, "ns", 1)
    m.put(0, "ns", 0)
    m.remove(0, "ns")  # a removal just before the walk
    it = iter(m)
    next(it)
    m.remove(1, "ns")  # the walk's only entry, removed
    assert message(ConcurrentModificationError, lambda: next(it)) == (
        "expected no mapping added or removed while iterating the map"
    )
    m.put(1, "ns", 1)
    m.put(2, "ns", 2)
    it = iter(m)
    m.put(3, "ns", 3)  # before the first step
    assert message(ConcurrentModificationError, lambda: next(it)) == (
        "expected no mapping added or removed while iterating the map"
    )
    it = iter(m)
    next(it)
    m.remove(3, "ns")  # during the walk
    assert message(ConcurrentModificationError, lambda: next(it)) == (
        "expected no mapping added or removed while iterating the map"
    )


# ------------------------------------------------------------ what they print


def test_reprs_name_what_they_hold() -> None:
    table: CopyOnWriteStateTable[int, str, int] = CopyOnWriteStateTable(
        KeyGroupRange(2, 5), MAXP, meta=StateMetaInfo("counts")
    )
    table.put(keys_in(3)[0], "ns", 1)
    assert repr(table) == "<CopyOnWriteStateTable 'counts' KeyGroupRange(2, 5) of 16 size=1>"
    snap = table.snapshot()
    assert repr(snap) == (
        "<CopyOnWriteStateTableSnapshot 'counts' #1 KeyGroupRange(2, 5), 4 key groups open>"
    )
    snap.release_key_group(2)
    assert repr(snap).endswith("3 key groups open>")
    snap.release()
    with HeapKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP) as b:
        state = b.get_state(ListStateDescriptor("events"))
        assert repr(state) == "<ListState 'events'>"
        assert repr(b) == "<HeapKeyedStateBackend KeyGroupRange(0, 15) of 16, states ['events']>"


def test_nested_map_keys_of_one_namespace() -> None:
    m = NestedStateMap[Any, Any, Any]()
    for key, namespace in [(1, "a"), (2, "b"), (3, "a")]:
        m.put(key, namespace, key)
    assert sorted(m.keys("a")) == [1, 3] and list(m.keys("c")) == []


def test_snapshot_metadata_finds_a_state_by_name() -> None:
    data, _ = two_state_file()
    metadata = SnapshotReader(data).metadata
    found = metadata.state("b")
    assert found is not None and found.name == "b"
    assert metadata.state("never") is None


# It absorbed test_a_set_key_is_refused_as_unhashable_by_every_table (state_table
# StateTable._route__mutmut_16): the message of a set key, word for word.
@pytest.mark.kills(module="cowstate.state_table")
@pytest.mark.parametrize("implementation", BACKENDS, ids=repr)
def test_every_table_refuses_an_unhashable_key_alike(implementation: BackendImplementation) -> None:
    """The heap tables and the RocksDB table raise the same error for a set key
    (the heap tables used to let the key-group assignment refuse it first)."""
    backend = implementation.factory(KeyGroupRange(0, MAXP - 1), MAXP)
    try:
        backend.get_state(ValueStateDescriptor("v"))
        table = backend.table("v")
        call: Callable[[], object]
        for call in (
            lambda: table.put({1}, "n", 1),
            lambda: table.get({1}, "n"),
            lambda: table.remove([1], "n"),
        ):
            with pytest.raises(UnhashableKeyError, match="expected a hashable key, got"):
                call()
        assert message(UnhashableKeyError, lambda: table.put({1}, "n", 1)) == (
            "expected a hashable key, got set {1}"
        )
        assert len(table) == 0
    finally:
        backend.close()


# ----------------------------------- state_table: the nested tables' old names


@pytest.mark.kills(module="cowstate.state_table")
def test_state_table_still_exports_the_nested_tables_names() -> None:
    # state_table __getattr__mutmut_1..14 (a name no longer found, looked up
    # elsewhere, or the lookup broken).
    assert state_table.NestedMapsStateTable is nested_table.NestedMapsStateTable
    assert state_table.NestedMapsStateTableSnapshot is nested_table.NestedMapsStateTableSnapshot
    assert state_table.NestedStateMap is nested_table.NestedStateMap


@pytest.mark.kills(module="cowstate.state_table")
def test_state_table_names_a_missing_attribute_like_any_module() -> None:
    # state_table __getattr__mutmut_1 (every other name sent to nested_table) and
    # __getattr__mutmut_15 (the AttributeError without its message).
    with pytest.raises(AttributeError) as info:
        _ = state_table.NoSuchTable
    assert type(info.value) is AttributeError
    assert str(info.value) == "module 'cowstate.state_table' has no attribute 'NoSuchTable'"
