"""One rule for equal keys of different types (issue 17, ``cowstate.key_types``).

``1 == 1.0 == True`` and ``0.0 == -0.0`` in Python, with equal hashes; in
Flink they are different keys (other key groups, other bytes). A backend and
its tables hold one key type (K1), a table on its own one type per domain
(K4), NaN and -0.0 are never keys (K3), a restore keeps the rule (K5), and the
bare map is a dict. Heap and RocksDB must give the same answer for each.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pytest
from restore_support import VALUE, crafted, group_of, handle_for, heap, rocks

from cowstate import (
    VOID_NAMESPACE,
    CopyOnWriteStateTable,
    HeapKeyedStateBackend,
    KeyGroupRange,
    ValueStateDescriptor,
)
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.location import SnapshotSource
from cowstate.errors import (
    AmbiguousKeyError,
    CowStateError,
    InvalidArgumentError,
    KeyTypeMismatchError,
    MixedKeyTypesError,
    NoCurrentKeyError,
    SnapshotEntryError,
)
from cowstate.key_groups import assign_to_key_group
from cowstate.key_types import KeyTypes, key_domain, key_signature
from cowstate.nested_table import NestedMapsStateTable
from cowstate.rocksdb import RocksDBKeyedStateBackend
from cowstate.snapshot.restore import restore_table
from cowstate.state_map import CopyOnWriteStateMap as PureMap
from cowstate_model.state_map import ReferenceStateMap

NAN = float("nan")
VALUE_STATE: ValueStateDescriptor[Any] = ValueStateDescriptor("v")

# ------------------------------------------------------------------ signatures


@pytest.mark.parametrize(
    ("key", "signature", "domain"),
    [
        (1, "int", "number"),
        (2**70, "int", "number"),
        (True, "bool", "number"),
        (1.0, "float", "number"),
        (0.0, "float", "number"),
        ("a", "str", "str"),
        (b"a", "bytes", "bytes"),
        ((1, "a"), "tuple[int, str]", "tuple[number, str]"),
        ((1.0, "a"), "tuple[float, str]", "tuple[number, str]"),
        ((1, None), "tuple[int, None]", "tuple[number, None]"),
        ((), "tuple[()]", "tuple[()]"),
        (((1,), 2.5), "tuple[tuple[int], float]", "tuple[tuple[number], number]"),
        (
            VOID_NAMESPACE,
            "cowstate.keyed_state.VoidNamespace",
            "cowstate.keyed_state.VoidNamespace",
        ),
    ],
)
def test_signature_and_domain(key: Any, signature: str, domain: str) -> None:
    assert key_signature(key) == signature
    assert key_domain(key) == domain


@pytest.mark.parametrize("key", [NAN, -0.0, (1, NAN), ("a", (-0.0,)), -NAN])
def test_nan_and_negative_zero_are_never_keys(key: Any) -> None:
    with pytest.raises(AmbiguousKeyError, match=r"NaN|-0\.0") as info:
        key_signature(key)
    assert isinstance(info.value, InvalidArgumentError)
    if isinstance(key, tuple):
        assert "inside the key" in str(info.value)


def test_one_type_refuses_every_other_and_names_both() -> None:
    types = KeyTypes()
    assert types.signature is None
    types.admit(1)
    assert types.signature == "int"
    for other in (True, 1.0, "1", (1,)):
        with pytest.raises(KeyTypeMismatchError) as info:
            types.check(other)
        assert (
            f"expected a key of type int (fixed by the first key), got {key_signature(other)}"
            in str(info.value)
        )
    assert types.signature == "int"  # a refusal fixes nothing


def test_per_domain_types_keep_apart_only_what_can_be_equal() -> None:
    types = KeyTypes(per_domain=True)
    for key in (1, "a", b"b", (1, "x"), ("x", 1)):
        types.admit(key)
    for other in (True, 1.0, (1.0, "x"), ("x", False)):
        with pytest.raises(KeyTypeMismatchError, match="of its kind"):
            types.check(other)
    copied = types.copy()  # what a restore stages on: the same rule, its own state
    with pytest.raises(KeyTypeMismatchError):
        copied.check(2.5)
    copied.admit(VOID_NAMESPACE)
    assert "VoidNamespace" in repr(copied) and "VoidNamespace" not in repr(types)


# ----------------------------------------------------- the bare map: a dict


@pytest.mark.parametrize("map_class", [PureMap, ReferenceStateMap], ids=["pure", "model"])
def test_the_map_keeps_the_first_key_of_equal_keys(map_class: Any) -> None:
    from cowstate.maps import CopyOnWriteStateMap

    for cls in {map_class, CopyOnWriteStateMap}:
        m = cls()
        m.put(1, 0, "a")
        assert m.put(True, 0, "b") is False  # the same mapping, replaced
        m.put(1.0, 0, "c")
        m.put(0.0, 0, "z")
        m.put(-0.0, 0, "y")
        keys = {(type(k), k): s for k, _, s in m}
        assert keys == {(int, 1): "c", (float, 0.0): "y"}, cls


# ------------------------------------------- heap and RocksDB agree on keys

MIXED_SEQUENCES = [
    [1, 1.0, True],
    [True, 1, 1.0],
    [1.0, True, 1],
    [0, 0.0, -0.0, False],
    [0.0, -0.0, 0, False],
    [False, 0, 0.0],
    [NAN, 1.0, NAN],
    [(1, "a"), (1.0, "a"), (True, "a")],
    [(1.0, "a"), (1, "a")],
    ["a", 1, "b"],
]


def _run(backend: Any, keys: list[Any]) -> tuple[list[str], list[tuple[type, Any]], Any]:
    """Set each key, update and read a value: what happened, what is stored."""
    state = backend.get_state(VALUE_STATE)
    outcomes = []
    for index, key in enumerate(keys):
        try:
            backend.set_current_key(key)
            state.update(index)
            outcomes.append(f"ok {state.value()}")
        except CowStateError as exc:
            outcomes.append(type(exc).__name__)
    stored = sorted(((type(k), repr(k)) for k, _, _ in backend.entries("v")), key=lambda t: t[1])
    try:
        current: Any = (type(backend.current_key), repr(backend.current_key))
    except NoCurrentKeyError:
        current = None
    return outcomes, stored, current


@pytest.mark.parametrize("max_parallelism", [1, 2, 3, 128])
@pytest.mark.parametrize("keys", MIXED_SEQUENCES, ids=repr)
def test_heap_and_rocksdb_agree_on_equal_keys(
    keys: list[Any], max_parallelism: int, tmp_path: Path
) -> None:
    full = KeyGroupRange(0, max_parallelism - 1)
    with HeapKeyedStateBackend(full, max_parallelism) as on_heap:
        heap_result = _run(on_heap, keys)
    with RocksDBKeyedStateBackend(full, max_parallelism, local_dir=tmp_path) as in_rocks:
        rocks_result = _run(in_rocks, keys)
    assert heap_result == rocks_result
    outcomes, stored, _ = heap_result
    # The rule itself: the first admissible key fixes the type; every other
    # type is refused, NaN and -0.0 always; one entry per accepted key.
    fixed = None
    for key, outcome in zip(keys, outcomes, strict=True):
        if isinstance(key, float) and (math.isnan(key) or math.copysign(1, key) < 0):
            assert outcome == "AmbiguousKeyError"
        elif fixed is None or key_signature(key) == fixed:
            fixed = key_signature(key)
            assert outcome.startswith("ok")
        else:
            assert outcome == "KeyTypeMismatchError"
    assert len(stored) == len(
        {repr(k) for k, o in zip(keys, outcomes, strict=True) if o.startswith("ok")}
    )
    assert {t for t, _ in stored} <= {type(k) for k in keys}
    assert len({t for t, _ in stored}) <= 1


@pytest.mark.parametrize("backend_kind", ["heap", "rocksdb"])
def test_a_refused_key_changes_nothing(backend_kind: str, tmp_path: Path) -> None:
    full = KeyGroupRange(0, 0)
    backend: Any = (
        HeapKeyedStateBackend(full, 1)
        if backend_kind == "heap"
        else RocksDBKeyedStateBackend(full, 1, local_dir=tmp_path)
    )
    with backend:
        state = backend.get_state(VALUE_STATE)
        backend.set_current_key(1)
        state.update("one")
        for other in (True, 1.0, -0.0, NAN):
            with pytest.raises((KeyTypeMismatchError, AmbiguousKeyError)):
                backend.set_current_key(other)
            assert type(backend.current_key) is int and backend.current_key == 1
            assert state.value() == "one"
        # Not even a table reached directly takes another type: it shares the rule.
        with pytest.raises(KeyTypeMismatchError):
            backend.table("v").put(True, VOID_NAMESPACE, "true")
        with pytest.raises(KeyTypeMismatchError):
            backend.table("v").get(1.0, VOID_NAMESPACE)
        assert [(type(k), k, s) for k, _, s in backend.entries("v")] == [(int, 1, "one")]


# ---------------------------------------------------------------- the tables


def test_tables_on_their_own_agree(tmp_path: Path) -> None:
    """A heap table, a nested table and a RocksDB table (one of a backend's,
    given a table's own key types) answer every put alike."""
    rocks_backend = RocksDBKeyedStateBackend(KeyGroupRange(0, 1), 2, local_dir=tmp_path)
    rocks_table = rocks_backend._new_table(rocks_backend._meta_for(VALUE_STATE))
    assert rocks_table.key_types.per_domain  # not shared: made outside get_state
    tables: list[Any] = [
        CopyOnWriteStateTable(KeyGroupRange(0, 1), 2),
        NestedMapsStateTable(KeyGroupRange(0, 1), 2),
        rocks_table,
    ]
    try:
        answers = []
        for table in tables:
            row = []
            for key in (1, True, "a", 1.0, (1, "a"), (1.0, "a"), -0.0, NAN):
                for key_group in (None, assign_to_key_group(key, 2) if key == key else None):
                    try:
                        table.put(key, "n", str(key), key_group=key_group)
                        row.append("ok")
                    except CowStateError as exc:
                        row.append(type(exc).__name__)
            entries = sorted((type(k).__name__, repr(k), s) for k, _, s in table)
            answers.append((row, entries))
        assert answers[0] == answers[1] == answers[2]
        row, entries = answers[0]
        assert entries == [
            ("int", "1", "1"),
            ("str", "'a'", "a"),
            ("tuple", "(1, 'a')", "(1, 'a')"),
        ]
        assert row.count("KeyTypeMismatchError") == 6 and row.count("AmbiguousKeyError") == 4
    finally:
        rocks_backend.close()


# --------------------------------------------------------- snapshot, restore


def test_the_rule_survives_snapshot_and_restore(tmp_path: Path) -> None:
    full = KeyGroupRange(0, 7)
    with HeapKeyedStateBackend(full, 8) as source:
        state = source.get_state(VALUE_STATE)
        for key in (1, 2, 3):
            source.set_current_key(key)
            state.update(key)
        result = source.snapshot(1, io.BytesIO).result()
    with HeapKeyedStateBackend(full, 8) as restored:
        restored.restore([result])
        with pytest.raises(KeyTypeMismatchError, match="expected a key of type int"):
            restored.set_current_key(True)
        restored.set_current_key(1)
        assert restored.get_state(VALUE_STATE).value() == 1
    with HeapKeyedStateBackend(full, 8) as typed_str:  # another type fixed already
        typed_str.set_current_key("a")
        typed_str.get_state(VALUE_STATE).update("x")
        with pytest.raises(MixedKeyTypesError, match="expected a key of type str"):
            typed_str.restore([result])
        assert [(k, s) for k, _, s in typed_str.entries("v")] == [("a", "x")]
        typed_str.set_current_key("b")  # still str


def _mixed_file(entries: list[tuple[Any, Any, Any]]) -> bytes:
    blocks: dict[int, list[tuple[Any, Any, Any]]] = {}
    for entry in entries:
        blocks.setdefault(group_of(entry[0]), []).append(entry)
    return crafted(blocks)


@pytest.mark.parametrize(
    "entries",
    [
        [(1, "a", "x"), (True, "a", "y")],
        [(1, "a", "x"), ("s", "a", "y")],  # one backend, one type: refused too
        [(1.0, "a", "x"), (NAN, "a", "y")],
        [(0.0, "a", "x"), (-0.0, "a", "y")],
        [((1, "k"), "a", "x"), ((1.0, "k"), "a", "y")],
    ],
    ids=repr,
)
def test_a_file_of_mixed_key_types_restores_nowhere(
    entries: list[tuple[Any, Any, Any]], tmp_path: Path
) -> None:
    data = _mixed_file(entries)
    handle = handle_for(tmp_path / "snap" / "file", data)
    source = SnapshotSource(FileSystem(), "/")
    refusals = []
    for backend in (heap(), rocks(tmp_path / "rocks")):
        with backend:
            with pytest.raises(MixedKeyTypesError) as info:
                backend.restore_from([handle], source)
            assert isinstance(info.value, SnapshotEntryError)
            assert "expected the keys of a restore to be of one type" in str(info.value)
            assert list(backend.entries("value")) == []
            backend.set_current_key("any type still")  # the refused restore fixed none
            refusals.append(type(info.value))
    assert refusals == [MixedKeyTypesError, MixedKeyTypesError]


def test_restore_table_keeps_the_rule(tmp_path: Path) -> None:
    data = _mixed_file([(1, "a", "x"), (2, "a", "y")])
    table: CopyOnWriteStateTable[Any, Any, Any] = CopyOnWriteStateTable(
        KeyGroupRange(0, 15), 16, meta=heap().table("value").meta, key_serializer=VALUE.serializer
    )
    table.put(True, "a", "t")
    with pytest.raises(MixedKeyTypesError):
        restore_table(table, data)
    assert [(type(k), k) for k, _, _ in table] == [(bool, True)]
    other: CopyOnWriteStateTable[Any, Any, Any] = CopyOnWriteStateTable(
        KeyGroupRange(0, 15), 16, meta=table.meta, key_serializer=VALUE.serializer
    )
    assert restore_table(other, data) == 2
    with pytest.raises(KeyTypeMismatchError):
        other.put(1.0, "a", "f")


@pytest.mark.parametrize("rescale", [False, True], ids=["same-range", "rescaled"])
def test_rocksdb_native_restore_takes_the_key_type_of_its_files(rescale: bool) -> None:
    """A native RocksDB restore keeps the files as they are (no key decoded when the
    range is the same): the first key of each state still fixes the type."""
    from cowstate_spec.backends import BACKENDS, WriteGate, restore_results

    rocksdb = next(b for b in BACKENDS if b.name == "rocksdb")
    gate = WriteGate(timeout=60.0)
    gate.open()
    with rocksdb.factory(KeyGroupRange(0, 7), 8) as source:
        state = source.get_state(VALUE_STATE)
        for key in (1.0, 2.5, 4.25):
            source.set_current_key(key)
            state.update(key)
        result = rocksdb.snapshot(source, 1, gate).result(timeout=60)
        target_range = KeyGroupRange(0, 3) if rescale else KeyGroupRange(0, 7)
        with rocksdb.factory(target_range, 8) as target:
            restore_results(target, [result])
            restored = {k for k, _, _ in target.entries("v")}
            assert restored and all(type(k) is float for k in restored)
            owned = next(k for k in range(100) if assign_to_key_group(k, 8) in target_range)
            with pytest.raises(KeyTypeMismatchError, match="expected a key of type float"):
                target.set_current_key(owned)
        with rocksdb.factory(KeyGroupRange(0, 7), 8) as typed_int:
            typed_int.set_current_key(1)
            with pytest.raises(MixedKeyTypesError):
                restore_results(typed_int, [result])
            typed_int.set_current_key(2)
