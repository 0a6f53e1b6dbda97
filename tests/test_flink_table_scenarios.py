"""Flink's state-table tests, ported (reference sections 9.2-9.4 and the
table-level edge cases of 9.6), plus the table's bad-input contract, which the
RocksDB table keeps too.

Each test names the Flink test it ports; the assertions are Flink's, restated
for cowstate's API (``release_key_group`` is Flink's release after
``writeStateInKeyGroup``).
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from typing import Any

import pytest
from conftest import TABLES, Tables, table_types

from cowstate.errors import (
    ConcurrentModificationError,
    CowStateError,
    ForeignSnapshotError,
    InvalidArgumentError,
    KeyGroupOutOfRangeError,
    NoneStateError,
    SnapshotReleasedError,
    UnhashableKeyError,
)
from cowstate.introspection import describe
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.nested_table import NestedMapsStateTable
from cowstate.serializers import DefaultSerializer
from cowstate.snapshot import read_snapshot, restore_table, write_snapshot
from cowstate.state_meta import StateKind, StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable, StateTable
from cowstate_model.key_groups import assign_to_key_group as plain_assign_to_key_group
from cowstate_model.state_table import ReferenceStateTable

TableClass = type[StateTable[Any, Any, Any]]


def contents(entries: Any) -> dict[tuple[Any, Any], Any]:
    return {(k, n): s for k, n, s in entries}


class CountingSerializer(DefaultSerializer):
    """Counts its copies (to see which serializer a map copies with)."""

    __slots__ = ("copies",)
    identifier = "pickle"

    def __init__(self) -> None:
        self.copies = 0

    def copy(self, state: Any) -> Any:
        self.copies += 1
        return super().copy(state)


class DisableableSerializer(DefaultSerializer):
    """Flink's test serializer: any use after ``disable()`` fails;
    ``duplicate()`` returns a fresh, enabled instance."""

    __slots__ = ("enabled",)
    identifier = "test-disableable"

    def __init__(self) -> None:
        self.enabled = True

    def disable(self) -> None:
        self.enabled = False

    def duplicate(self) -> DisableableSerializer:
        return DisableableSerializer()

    def serialize(self, state: Any) -> bytes:
        assert self.enabled, "a disabled serializer was used"
        return super().serialize(state)

    def deserialize(self, data: bytes | bytearray | memoryview) -> Any:
        assert self.enabled, "a disabled serializer was used"
        return super().deserialize(data)


# ------------------------------------------------------------ 9.2 CopyOnWriteStateTableTest


def test_serializer_after_meta_info_changed() -> None:
    """testSerializerAfterMetaInfoChanged (FLINK-26853): every map copies with the new one."""
    v1, v2 = CountingSerializer(), CountingSerializer()
    table: CopyOnWriteStateTable[int, int, list[int]] = CopyOnWriteStateTable(
        KeyGroupRange(0, 9), 10, meta=StateMetaInfo("s", state_serializer=v1)
    )
    for i in range(50):
        table.put(i, 0, [i])
    table.set_meta_info(StateMetaInfo("s", state_serializer=v2))
    assert all(table.state_map(kg).serializer is v2 for kg in range(10))
    assert table.serializer is v2
    with table.snapshot():
        for i in range(50):
            table.get(i, 0)  # rule S: copies through the serializer
    assert (v1.copies, v2.copies) == (0, 50)


def test_serializer_duplication_in_snapshot() -> None:
    """testSerializerDuplicationInSnapshot (FLINK-6207): the snapshot writes with the
    serializers it duplicated at the synchronous moment."""
    key_ser, ns_ser, state_ser = (DisableableSerializer() for _ in range(3))
    table: CopyOnWriteStateTable[int, int, int] = CopyOnWriteStateTable(
        KeyGroupRange(0, 0),
        1,
        key_serializer=key_ser,
        meta=StateMetaInfo("s", namespace_serializer=ns_ser, state_serializer=state_ser),
    )
    table.put(0, 0, 0, key_group=0)
    table.put(1, 0, 1, key_group=0)
    table.put(2, 1, 2, key_group=0)
    snapshot = table.snapshot()
    for serializer in (key_ser, ns_ser, state_ser):
        serializer.disable()
    out = io.BytesIO()
    write_snapshot(snapshot, out)  # would fail with the disabled originals
    restored = read_snapshot(
        out.getvalue(),
        KeyGroupRange(0, 0),
        key_serializer=DisableableSerializer(),
        metas={
            "s": StateMetaInfo(
                "s", StateKind.VALUE, DisableableSerializer(), DisableableSerializer()
            )
        },
    )
    assert sorted((k, n, s) for _, k, n, s in restored.entries("s")) == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 1, 2),
    ]


def float_table() -> CopyOnWriteStateTable[int, int, float]:
    rng = random.Random(42)
    table: CopyOnWriteStateTable[int, int, float] = CopyOnWriteStateTable(
        KeyGroupRange(0, 9), 10, meta=StateMetaInfo("floats")
    )
    for i in range(1000):
        table.put(i, rng.randrange(1 << 31), rng.random())
    return table


def open_versions(table: StateTable[Any, Any, Any]) -> list[frozenset[int]]:
    return [describe(table.state_map(kg)).open_versions for kg in table.key_group_range]


def test_release_for_successful_snapshot() -> None:
    """testReleaseForSuccessfulSnapshot: each key group's map snapshot is released as
    soon as that key group is written, and a final release is harmless."""
    table = float_table()
    snapshot = table.snapshot()
    assert open_versions(table) == [frozenset({1})] * 10  # versions are per key group

    seen: list[list[frozenset[int]]] = []

    class Watching(io.BytesIO):
        def write(self, data: Any) -> int:
            seen.append(open_versions(table))
            return super().write(data)

    write_snapshot(snapshot, Watching(), release=False, buffer_size=0)  # each block at once
    # Before the block of key group kg was written, kg was still open; after the
    # index, every key group had been released one by one.
    released_counts = [sum(1 for v in versions if not v) for versions in seen]
    assert released_counts == sorted(released_counts)
    assert set(released_counts) == set(range(11))
    assert open_versions(table) == [frozenset()] * 10
    snapshot.release()
    snapshot.release()
    assert open_versions(table) == [frozenset()] * 10 and snapshot.is_released


def test_release_for_failed_snapshot() -> None:
    """testReleaseForFailedSnapshot (FLINK-13469): key groups 0..4 written, the write
    fails; 5..9 still hold version 1 until the snapshot is released."""
    table = float_table()
    snapshot = table.snapshot()

    class FailingAfterFiveGroups(io.BytesIO):
        blocks = 0

        def write(self, data: Any) -> int:
            if snapshot.is_key_group_released(4):
                raise OSError("disk full")
            return super().write(data)

    with pytest.raises(OSError, match="disk full"):
        write_snapshot(snapshot, FailingAfterFiveGroups(), release=False, buffer_size=0)
    assert open_versions(table) == [frozenset()] * 5 + [frozenset({1})] * 5
    snapshot.release()
    assert open_versions(table) == [frozenset()] * 10

    # write_snapshot's own default releases everything on failure too.
    snapshot = table.snapshot()
    with pytest.raises(OSError, match="disk full"):
        write_snapshot(snapshot, FailingAfterFiveGroups())
    assert open_versions(table) == [frozenset()] * 10


# ------------------------------------------- 9.3 StateTableSnapshotCompatibilityTest


def test_check_compatible_serialization_formats() -> None:
    """checkCompatibleSerializationFormats: the copy-on-write and nested tables write
    and read the same format, both ways."""
    rng = random.Random(42)
    cow: CopyOnWriteStateTable[int, int, list[int]] = CopyOnWriteStateTable(
        KeyGroupRange(0, 0), 1, meta=StateMetaInfo("lists", StateKind.LIST)
    )
    for _ in range(100):
        state = [rng.randrange(100) for _ in range(rng.randrange(5))] or [0]
        cow.put(rng.randrange(10), rng.randrange(2), state, key_group=0)
    out = io.BytesIO()
    write_snapshot(cow.snapshot(), out)
    nested: NestedMapsStateTable[int, int, list[int]] = NestedMapsStateTable(
        KeyGroupRange(0, 0), 1, meta=StateMetaInfo("lists", StateKind.LIST)
    )
    restore_table(nested, [out.getvalue()])
    assert len(nested) == len(cow) and contents(nested) == contents(cow)
    for key, namespace, state in cow:
        assert nested.get(key, namespace, key_group=0) == state

    out = io.BytesIO()
    write_snapshot(nested.snapshot(), out)
    again: CopyOnWriteStateTable[int, int, list[int]] = CopyOnWriteStateTable(
        KeyGroupRange(0, 0), 1, meta=StateMetaInfo("lists", StateKind.LIST)
    )
    restore_table(again, [out.getvalue()])
    assert len(again) == len(nested) and contents(again) == contents(nested)


# -------------------------------------------------------- 9.4 NestedMapsStateTableTest


@pytest.mark.parametrize("table_type", table_types(snapshots=True), indirect=True, ids=repr)
def test_iterating_over_snapshot(table_type: Tables) -> None:
    """testIteratingOverSnapshot, on both tables."""
    table = table_type(KeyGroupRange(0, 127), 128)
    for i in range(1, 6):
        table.put(i, 1, [i])
    with table.snapshot() as snapshot:
        table.get(3, 1).append(99)
        table.remove(5, 1)
        assert contents(snapshot) == {(i, 1): [i] for i in range(1, 6)}


@pytest.mark.parametrize("table_type", table_types(snapshots=True), indirect=True, ids=repr)
def test_iterating_over_snapshot_with_transform(table_type: Tables) -> None:
    """testIteratingOverSnapshotWithTransform: 12 is dropped, the rest written + 2;
    the live table keeps its own values."""

    def transformer(state: int) -> int | None:
        return None if state == 12 else state + 2

    table = table_type(
        KeyGroupRange(0, 127), 128, meta=StateMetaInfo("longs", snapshot_transformer=transformer)
    )
    for key, value in zip(range(1, 6), range(10, 15), strict=True):
        table.put(key, 1, value)
    with table.snapshot() as snapshot:
        assert contents(snapshot) == {(1, 1): 12, (2, 1): 13, (4, 1): 15, (5, 1): 16}
    assert contents(table) == {(k, 1): k + 9 for k in range(1, 6)}


def test_transformer_never_touches_live_states() -> None:
    """A transformer gets the snapshot's objects and writes new ones; live states
    (and the snapshot's own objects) keep their identity and value."""

    def strip(state: list[int]) -> list[int] | None:
        return state[1:] or None

    table: CopyOnWriteStateTable[int, str, list[int]] = CopyOnWriteStateTable(
        meta=StateMetaInfo("lists", snapshot_transformer=strip)
    )
    originals = {i: [i, i + 1] for i in range(20)} | {20: [7]}
    for key, state in originals.items():
        table.put(key, "ns", state)
    with table.snapshot() as snapshot:
        written = contents(snapshot)
    assert written == {(k, "ns"): s[1:] for k, s in originals.items() if s[1:]}
    for key, state in originals.items():
        assert table.get(key, "ns") is state and state == originals[key]


# ------------------------------------------------------------ 9.6 table-level edges


@pytest.mark.parametrize("table_type", TABLES, indirect=True, ids=repr)
def test_routing_by_key_group(table_type: Tables) -> None:
    """Every key goes to the map of murmur(javaHash(key)) % maxP, at index kg - start
    (the RocksDB table: behind the key group's prefix)."""
    table = table_type(KeyGroupRange(3, 9), 16)
    keys = [
        k
        for k in [*range(200), *map(str, range(200))]
        if 3 <= plain_assign_to_key_group(k, 16) <= 9
    ]
    for key in keys:
        table.put(key, "ns", key)
    for kg in table.key_group_range:
        held = {k for k, _, _ in table.entries_in_key_group(kg)}
        assert held == {k for k in keys if plain_assign_to_key_group(k, 16) == kg}
    outside = next(k for k in range(200) if not 3 <= assign_to_key_group(k, 16) <= 9)
    kg = assign_to_key_group(outside, 16)
    with pytest.raises(
        KeyGroupOutOfRangeError,
        match=rf"expected a key group in KeyGroupRange\(3, 9\), got key group "
        rf"{kg}",
    ):
        table.put(outside, "ns", 1)
    assert len(table) == len(keys)


def test_versions_are_per_key_group() -> None:
    """Every map of a table counts its own versions, from 1."""
    table: CopyOnWriteStateTable[int, int, int] = CopyOnWriteStateTable(KeyGroupRange(0, 3), 4)
    first = table.snapshot()
    assert [describe(table.state_map(kg)).version for kg in range(4)] == [1, 1, 1, 1]
    first.release_key_group(2)
    table.state_map(2).snapshot().release()  # only key group 2 moves on
    second = table.snapshot()
    assert [describe(table.state_map(kg)).version for kg in range(4)] == [2, 2, 3, 2]
    assert [describe(table.state_map(kg)).open_versions for kg in range(4)] == [
        {1, 2},
        {1, 2},
        {3},
        {1, 2},
    ]
    first.release()
    second.release()


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("table_type", TABLES, indirect=True, ids=repr)
@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda t: t.put(None, "ns", 1), InvalidArgumentError),
        (lambda t: t.get(None, "ns"), InvalidArgumentError),
        (lambda t: t.put(1, "ns", None), NoneStateError),
        (lambda t: t.put(1, ["ns"], 1), UnhashableKeyError),
        (lambda t: t.put(1, "ns", 1, key_group="3"), InvalidArgumentError),
        (lambda t: t.put(1, "ns", 1, key_group=16), KeyGroupOutOfRangeError),
        (lambda t: t.remove(1, "ns", key_group=-1), KeyGroupOutOfRangeError),
        (lambda t: t.put(frozenset({1}), "ns", 1), InvalidArgumentError),
        (lambda t: t.put({1}, "ns", 1), UnhashableKeyError),
        (lambda t: t.get([1], "ns"), UnhashableKeyError),
        (lambda t: t.transform(1, "ns", 1, lambda old, v: None), NoneStateError),
        (lambda t: t.entries_in_key_group(99), KeyGroupOutOfRangeError),
        (lambda t: t.set_meta_info("meta"), InvalidArgumentError),
    ],
    ids=[
        "none-key",
        "get-none-key",
        "none-state",
        "unhashable-ns",
        "str-key-group",
        "key-group-past-end",
        "negative-key-group",
        "frozenset-key",
        "set-key",
        "get-list-key",
        "transform-none",
        "entries-outside",
        "bad-meta",
    ],
)
def test_bad_input_changes_nothing(
    table_type: Tables,
    call: Callable[[Any], Any],
    error: type[CowStateError],
) -> None:
    """Every table refuses the same input with the same error class, and keeps
    what it held."""
    table = table_type(KeyGroupRange(0, 15), 16)
    model = ReferenceStateTable(range(16), 16)
    for i in range(40):
        table.put(i, "ns", [i])
        model.put(i, "ns", [i])
    with pytest.raises(error):
        call(table)
    assert contents(table) == contents(model) and len(table) == len(model)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((KeyGroupRange(0, 8), 8), r"expected a key-group range inside \[0, 7\]"),
        (((0, 7), 8), "expected a KeyGroupRange, got tuple"),
        ((None, 0), "expected max_parallelism in 1..32768, got 0"),
        ((None, 40000), "expected max_parallelism in 1..32768, got 40000"),
    ],
)
def test_bad_table_arguments(args: tuple[Any, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        CopyOnWriteStateTable(*args)


def test_bad_meta_info() -> None:
    with pytest.raises(InvalidArgumentError, match="expected a state kind in"):
        StateMetaInfo("s", "set")  # type: ignore[arg-type]  # the bad kind under test
    with pytest.raises(InvalidArgumentError, match="expected a non-empty str state name"):
        StateMetaInfo("")
    with pytest.raises(InvalidArgumentError, match="expected a state_serializer with"):
        StateMetaInfo("s", state_serializer=object())  # type: ignore[arg-type]


@pytest.mark.parametrize("table_type", table_types(snapshots=True), indirect=True, ids=repr)
def test_snapshot_misuse(table_type: Tables) -> None:
    table, other = table_type(), table_type()
    table.put(1, "ns", [1])
    snapshot = table.snapshot()
    with pytest.raises(ForeignSnapshotError, match="one of another table"):
        other.release(snapshot)
    kg = table.key_group_of(1)
    snapshot.release_key_group(kg)
    snapshot.release_key_group(kg)  # idempotent
    with pytest.raises(SnapshotReleasedError, match=f"got key group {kg} of snapshot #1"):
        list(snapshot.key_group_entries(kg))
    with pytest.raises(SnapshotReleasedError):
        list(snapshot)
    table.release(snapshot)
    assert snapshot.is_released
    assert table.get(1, "ns") == [1]


@pytest.mark.parametrize("table_type", TABLES, indirect=True, ids=repr)
def test_iteration_is_fail_fast_across_key_groups(table_type: Tables) -> None:
    table = table_type(KeyGroupRange(0, 7), 8)
    for i in range(30):
        table.put(i, "ns", i)
    it = iter(table)
    first_key = next(it).key
    # A new mapping in a key group the iterator has not reached yet, or already left.
    table.put(1000 + first_key, "ns", 1)
    if table_type.capabilities.fail_fast:
        with pytest.raises(ConcurrentModificationError):
            list(it)
    else:  # RocksDB: the new mapping is seen or not; every other one exactly once
        rest = sorted(entry.key for entry in it)
        assert rest in (
            sorted(set(range(30)) - {first_key}),
            sorted({*range(30), 1000 + first_key} - {first_key}),
        )
    it = iter(table)
    next(it)
    table.put(0, "ns", 99)  # an update is allowed
    assert len(list(it)) == len(table) - 1
