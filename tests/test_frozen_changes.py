"""Frozen changes (I6 of ``cowstate.heap_incremental``): a heap delta's
synchronous part holds each key group's changes apart from its map snapshot
(``freeze_changes`` of the C writer, ``_writer.c``'s "Frozen changes") and
releases that snapshot, so the owner copies nothing for the delta while it is
written -- but only values that can never change are held so.

The C writer's differential (tests/test_snapshot_io.py, ``check_delta_file``)
writes frozen deltas beside open ones, byte for byte, with the owner's writes
in between; its planted ``writer-freezes-a-mutable-state`` must fail it. These
tests pin what is frozen and what is refused, the snapshot each leaves open,
the errors, and the backend's synchronous part.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from cowstate import VOID_NAMESPACE
from cowstate.checkpoint import CheckpointCoordinator, CheckpointStorage, RestoreMode
from cowstate.descriptors import ValueStateDescriptor
from cowstate.errors import InvalidArgumentError
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.heap_incremental import IncrementalOptions
from cowstate.introspection import describe
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.serializers import PickleSerializer
from cowstate.snapshot import ccodec
from cowstate.state_table import CopyOnWriteStateTable, CopyOnWriteStateTableSnapshot

pytestmark = pytest.mark.skipif(
    ccodec.CODEC is None or ccodec.CODEC.snapshot_type() is None,
    reason="the C codec or the C map is not built, or COWSTATE_PURE_PYTHON is set "
    "(tests/test_c_codec.py and tests/test_implementations.py fail then)",
)

MAXP = 4
RANGE = KeyGroupRange(0, MAXP - 1)
Table = CopyOnWriteStateTable[Any, Any, Any]


class SubInt(int):
    """An int of a subclass: its instances may carry a mutable __dict__."""


def codec() -> ccodec.Codec:
    assert ccodec.CODEC is not None
    return ccodec.CODEC


def tracked_table(n: int = 200) -> tuple[Table, tuple[int, ...]]:
    """A table of ``n`` int mappings whose maps track changes, and the map
    versions of the base snapshot taken (and released) right after."""
    table: Table = CopyOnWriteStateTable(RANGE, MAXP)
    for key in range(n):
        table.put(key, VOID_NAMESPACE, key)
    for key_group in RANGE:
        table.state_map(key_group).track_changes()  # type: ignore[attr-defined]
    base = table.snapshot()
    versions = base.map_versions()
    base.release()
    return table, versions


def delta_snapshot(
    table: Table, versions: tuple[int, ...]
) -> CopyOnWriteStateTableSnapshot[Any, Any, Any]:
    snap = table.snapshot()
    snap.only_changed_since(versions)
    return snap


def freeze(snap: CopyOnWriteStateTableSnapshot[Any, Any, Any]) -> int:
    c = codec()
    snap_type = c.snapshot_type()
    assert snap_type is not None
    return snap.freeze_changes(c.freeze_changes, snap_type)


def items_by_key_group(snap: Any) -> dict[int, list[tuple[Any, Any, Any]]]:
    return {kg: list(snap.key_group_items(kg)) for kg in RANGE}


def test_a_frozen_key_group_reads_its_changes_as_of_the_snapshot_after_the_owner_writes() -> None:
    table, versions = tracked_table()
    for key in range(0, 200, 3):
        table.put(key, VOID_NAMESPACE, -key)
    for key in range(1, 200, 9):
        table.remove(key, VOID_NAMESPACE)
    table.put(500, VOID_NAMESPACE, (1, ("two", b"3")))
    frozen, kept = delta_snapshot(table, versions), delta_snapshot(table, versions)
    maps = frozen.map_snapshots()
    assert freeze(frozen) == MAXP
    assert all(m.is_released for m in maps)  # type: ignore[union-attr]
    assert all(type(m) is codec().FrozenChanges for m in frozen.map_snapshots())
    expected = items_by_key_group(kept)
    assert sum(map(len, expected.values())) == len(range(0, 200, 3)) + 1
    for key in range(200):  # the owner goes on: every mapping changed again
        table.put(key, VOID_NAMESPACE, key * 7)
    table.remove(500, VOID_NAMESPACE)
    assert items_by_key_group(frozen) == expected
    for key_group in RANGE:
        assert frozen.size_of_key_group(key_group) == len(expected[key_group])
        entries = [tuple(e) for e in frozen.key_group_entries(key_group)]
        assert entries == expected[key_group]
    frozen.release()
    kept.release()


def test_freezing_releases_the_map_snapshots_so_the_owner_copies_nothing() -> None:
    table, versions = tracked_table()
    table.put(3, VOID_NAMESPACE, 33)
    snap = delta_snapshot(table, versions)
    assert all(describe(table.state_map(kg)).open_versions for kg in RANGE)
    freeze(snap)
    assert all(not describe(table.state_map(kg)).open_versions for kg in RANGE)
    snap.release()  # releasing a frozen snapshot releases nothing twice
    assert snap.is_released


MUTABLE_OR_UNKNOWN = {
    "list": [1],
    "dict": {"k": 1},
    "set": {1},
    "frozenset": frozenset({1}),
    "bytearray": bytearray(b"x"),
    "int subclass": SubInt(5),
    "tuple holding a list": (1, (2, [3])),
    "tuple nested 9 deep": (((((((((1,),),),),),),),),),
}
IMMUTABLE = {
    "None": None,
    "bool": True,
    "big int": 2**100,
    "float": 1.5,
    "str": "é",
    "bytes": b"x",
    "tuple nested 8 deep": ((((((((1,),),),),),),),),
    "VOID_NAMESPACE": VOID_NAMESPACE,
}


def changed_keys_in_walk_order(
    table: Table, versions: tuple[int, ...], key_group: int
) -> list[Any]:
    probe = delta_snapshot(table, versions)
    keys = [key for key, _, _ in probe.key_group_items(key_group)]
    probe.release()
    return keys


@pytest.mark.parametrize("value", sorted(MUTABLE_OR_UNKNOWN))
@pytest.mark.parametrize("at", ["first", "middle", "last"])
def test_a_key_group_whose_changes_hold_a_value_that_may_change_keeps_its_snapshot(
    value: str, at: str
) -> None:
    """The value as the state of the first, the middle or the last change of
    key group 1 (in the walk's order): that key group stays a snapshot (rule S
    keeps copying its states), the others are frozen."""
    table, versions = tracked_table()
    for key in range(0, 200, 2):
        table.put(key, VOID_NAMESPACE, -key)
    keys = changed_keys_in_walk_order(table, versions, 1)
    chosen = keys[{"first": 0, "middle": len(keys) // 2, "last": len(keys) - 1}[at]]
    table.put(chosen, VOID_NAMESPACE, MUTABLE_OR_UNKNOWN[value])
    assert changed_keys_in_walk_order(table, versions, 1) == keys  # the same order
    snap = delta_snapshot(table, versions)
    expected = items_by_key_group(snap)
    assert freeze(snap) == MAXP - 1
    maps = snap.map_snapshots()
    assert type(maps[1]) is not codec().FrozenChanges and not maps[1].is_released  # type: ignore[union-attr]
    assert all(type(maps[i]) is codec().FrozenChanges for i in (0, 2, 3))
    assert describe(table.state_map(1)).open_versions
    got = table.get(chosen, VOID_NAMESPACE)
    if isinstance(got, list):
        got.append(99)  # after a get: rule S copied it for the open snapshot
    assert items_by_key_group(snap) == expected
    snap.release()


@pytest.mark.parametrize("value", sorted(IMMUTABLE))
def test_every_value_that_can_never_change_is_frozen(value: str) -> None:
    """The set's other side: the same count of kinds, each frozen, as a state
    and (but VOID_NAMESPACE, the keys' namespace here) as a namespace."""
    table, versions = tracked_table()
    state = IMMUTABLE[value]
    table.put(7, VOID_NAMESPACE, (None,) if state is None else state)  # None is no state
    if value not in ("VOID_NAMESPACE", "None"):  # None is no namespace
        table.put(8, IMMUTABLE[value], 8)
    snap = delta_snapshot(table, versions)
    expected = items_by_key_group(snap)
    assert freeze(snap) == MAXP
    assert items_by_key_group(snap) == expected
    snap.release()


def test_a_key_or_namespace_that_could_change_keeps_its_key_group_snapshot() -> None:
    """A key of an int subclass (its serializer pickles) and a frozenset
    namespace, each the one change of a table: that key group keeps its
    snapshot, the others are frozen (with nothing)."""
    keyed: Table = CopyOnWriteStateTable(RANGE, MAXP, key_serializer=PickleSerializer())
    for key_group in RANGE:
        keyed.state_map(key_group).track_changes()  # type: ignore[attr-defined]
    versions = keyed.snapshot().map_versions()
    keyed.put(SubInt(5), VOID_NAMESPACE, 1)
    spaced, spaced_versions = tracked_table(0)
    spaced.put(5, frozenset({1, 2}), 1)
    for table, since in ((keyed, versions), (spaced, spaced_versions)):
        snap = delta_snapshot(table, since)
        assert freeze(snap) == MAXP - 1
        kept = snap.map_snapshots()[assign_to_key_group(5, MAXP)]
        assert not kept.is_released  # type: ignore[union-attr]
        snap.release()


def test_freezing_a_snapshot_that_reads_everything_is_refused() -> None:
    table, _ = tracked_table()
    snap = table.snapshot()
    with pytest.raises(
        InvalidArgumentError, match="expected a table snapshot set to only_changed_since"
    ):
        freeze(snap)
    assert not snap.is_released
    assert all(not m.is_released for m in snap.map_snapshots())  # type: ignore[union-attr]
    snap.release()


def test_freeze_changes_refuses_what_is_not_an_open_c_map_snapshot() -> None:
    table, versions = tracked_table()
    snap = table.state_map(0).snapshot()
    c = codec()
    with pytest.raises(TypeError, match="expected a C map snapshot, got list"):
        c.freeze_changes([], versions[0])
    with pytest.raises(TypeError, match="expected an int base version, got str"):
        c.freeze_changes(snap, "1")  # type: ignore[arg-type]
    snap.release()
    with pytest.raises(ValueError, match="expected an open C map snapshot, got a released one"):
        c.freeze_changes(snap, versions[0])


@pytest.mark.parametrize("at", [0, 2, 4])
def test_flat_removals_refuses_an_item_that_is_not_a_pair_naming_where(at: int) -> None:
    pairs: list[Any] = [(k, VOID_NAMESPACE) for k in range(5)]
    pairs[at] = (at,)
    with pytest.raises(
        TypeError, match=re.escape(f"expected (key, namespace) pairs, got tuple at {at}")
    ):
        codec().flat_removals(pairs)


def test_flat_removals_puts_each_pair_with_an_empty_state() -> None:
    pairs = [(1, VOID_NAMESPACE), ("two", "ns")]
    assert list(codec().flat_removals(pairs)) == [1, VOID_NAMESPACE, b"", "two", "ns", b""]
    assert len(codec().flat_removals([])) == 0
    with pytest.raises(TypeError, match="takes one list"):
        codec().flat_removals(tuple(pairs))  # type: ignore[arg-type]


@pytest.mark.parametrize("freeze_changes", [1, None, "yes"])
def test_incremental_options_refuse_a_freeze_changes_that_is_not_a_bool(
    freeze_changes: Any,
) -> None:
    with pytest.raises(
        InvalidArgumentError,
        match=re.escape(f"expected freeze_changes True or False, got {freeze_changes!r}"),
    ):
        IncrementalOptions(freeze_changes=freeze_changes)


VALUE: ValueStateDescriptor[Any] = ValueStateDescriptor("value")
LISTS: ValueStateDescriptor[Any] = ValueStateDescriptor("lists")


def test_a_heap_delta_of_immutable_states_leaves_no_map_snapshot_open_after_its_sync_part(
    tmp_path: Any,
) -> None:
    """Right after trigger_checkpoint (the writer may not have run): no map of
    the int state has an open snapshot, the list state's changed key group
    keeps one; the owner then changes every key, and the delta restores what
    the backend held at the trigger."""
    backend = HeapKeyedStateBackend(RANGE, MAXP, incremental=IncrementalOptions())
    coordinator = CheckpointCoordinator(CheckpointStorage(str(tmp_path), "job"), [backend])
    value, lists = backend.get_state(VALUE), backend.get_state(LISTS)
    for key in range(100):
        backend.set_current_key(key)
        value.update(key)
    backend.set_current_key(0)
    lists.update([0])
    coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
    for key in range(0, 100, 5):
        backend.set_current_key(key)
        value.update(-key)
    backend.set_current_key(0)
    lists.update([1])
    expected = {key: -key if key % 5 == 0 else key for key in range(100)}
    checkpoint_id = coordinator.trigger_checkpoint()
    ints = backend.table(VALUE.name)
    assert all(not describe(ints.state_map(kg)).open_versions for kg in RANGE)
    list_table = backend.table(LISTS.name)
    assert describe(list_table.state_map(assign_to_key_group(0, MAXP))).open_versions
    for key in range(100):
        backend.set_current_key(key)
        value.update(1000 + key)
    backend.set_current_key(0)
    lists.value().append(2)
    done = coordinator.complete_checkpoint(checkpoint_id)
    assert len(done.metadata.subtasks[0].files) == 3  # a delta
    restored = HeapKeyedStateBackend(RANGE, MAXP, incremental=IncrementalOptions())
    restored_value, restored_lists = restored.get_state(VALUE), restored.get_state(LISTS)
    restoring = CheckpointCoordinator.restore(
        CheckpointStorage(str(tmp_path), "job-2"),
        [restored],
        coordinator.storage.checkpoint_dir(checkpoint_id),
        RestoreMode.NO_CLAIM,
    )
    got = {}
    for key in range(100):
        restored.set_current_key(key)
        got[key] = restored_value.value()
    assert got == expected
    restored.set_current_key(0)
    assert restored_lists.value() == [1]
    restoring.close()
    coordinator.close()
