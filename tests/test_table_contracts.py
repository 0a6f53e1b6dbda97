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
"""

from __future__ import annotations

import gc
import io
import pickle
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import TABLES, Tables, table_types

from cowstate.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from cowstate.errors import (
    ConcurrentModificationError,
    ForeignSnapshotError,
    InvalidArgumentError,
    NoneStateError,
    TransformFunctionError,
    UnhashableKeyError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
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
from cowstate.state_meta import StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable
from cowstate_spec.backends import BACKENDS, BackendImplementation, SumCount

MAXP = 16


def message(exc_type: type[Exception], call: Any) -> str:
    with pytest.raises(exc_type) as info:
        call()
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


def test_state_meta_info_messages() -> None:
    assert message(InvalidArgumentError, lambda: StateMetaInfo("")) == (
        "expected a non-empty str state name, got ''"
    )
    assert message(InvalidArgumentError, lambda: StateMetaInfo(None)) == (  # type: ignore[arg-type]
        "expected a non-empty str state name, got None"
    )


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


def test_set_meta_info_message() -> None:
    table: NestedMapsStateTable[Any, Any, Any] = NestedMapsStateTable(None, MAXP)
    assert message(InvalidArgumentError, lambda: table.set_meta_info("meta")) == (  # type: ignore[arg-type]
        "expected a StateMetaInfo, got str"
    )


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
        assert len(table) == 0
    finally:
        backend.close()
