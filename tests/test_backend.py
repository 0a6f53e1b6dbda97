"""The heap keyed state backend: states, registration, asynchronous snapshots
(success, failure, cancellation and what each releases), restore and its
refusals, with the Flink bugs the design answers (FLINK-6207, -9060, -9269,
-13469) as named regression tests; the key context and the state handles of
``cowstate.keyed_state`` word for word (the tests marked ``kills``, written to
kill that module's mutants, ``make mutate SCOPE=tables``, named in their
comments)."""

from __future__ import annotations

import copy
import io
import random
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cowstate.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from cowstate.errors import (
    BackendClosedError,
    IncompatibleSnapshotError,
    InvalidArgumentError,
    KeyGroupOutOfRangeError,
    KeyTypeMismatchError,
    MaxParallelismMismatchError,
    NoCurrentKeyError,
    NoneStateError,
    SerializerMismatchError,
    SnapshotCancelledError,
    SnapshotFormatError,
    SnapshotWriteError,
    StateRegistrationError,
    TransformFunctionError,
    UnhashableKeyError,
    UnknownStateError,
)
from cowstate.heap_backend import HeapKeyedStateBackend, KeyedStateSnapshotResult
from cowstate.introspection import describe
from cowstate.key_groups import (
    KeyGroupRange,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from cowstate.key_types import KeyTypes
from cowstate.keyed_state import (
    VOID_NAMESPACE,
    AggregatingState,
    KeyContext,
    ListState,
    StateHolder,
    ValueState,
)
from cowstate.nested_table import NestedMapsStateTable
from cowstate.serializers import (
    DefaultSerializer,
    ImmutableSerializer,
    IntSerializer,
    LongSerializer,
    StringSerializer,
)
from cowstate.snapshot import SnapshotReader, read_snapshot
from cowstate.state_meta import StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable
from cowstate_model.backend import ReferenceKeyedStateBackend
from cowstate_spec.backends import BACKENDS, BackendImplementation, SumCount, add_ints
from cowstate_spec.cmap_view import MAP_CLASSES

FULL = KeyGroupRange(0, 127)
VALUE: ValueStateDescriptor[list[int]] = ValueStateDescriptor("value", default=[])
LIST = ListStateDescriptor("list")
MAP = MapStateDescriptor("map")
REDUCING: ReducingStateDescriptor[int] = ReducingStateDescriptor(
    "reducing", reduce_function=add_ints
)
AGGREGATING = AggregatingStateDescriptor("aggregating", aggregate_function=SumCount())


@pytest.fixture
def backend() -> Iterator[HeapKeyedStateBackend]:
    b = HeapKeyedStateBackend(FULL, 128)
    yield b
    b.close()


def dump(b: HeapKeyedStateBackend) -> dict[str, dict[tuple[Any, Any], Any]]:
    return {name: {(k, n): s for k, n, s in b.table(name)} for name in b.state_names}


def open_versions(b: HeapKeyedStateBackend) -> set[int]:
    """Every snapshot version still open in any copy-on-write map of ``b``."""
    versions: set[int] = set()
    for name in b.state_names:
        table = b.table(name)
        for kg in table.key_group_range:
            m = table.state_map(kg)
            if isinstance(m, MAP_CLASSES):
                versions |= describe(m).open_versions
    return versions


def fill(b: HeapKeyedStateBackend, keys: range = range(200)) -> None:
    value, lst = b.get_state(VALUE), b.get_state(LIST)
    for key in keys:
        b.set_current_key(key)
        value.update([key])
        lst.add_all([key, -key])


def written(result: KeyedStateSnapshotResult) -> dict[str, dict[tuple[Any, Any], Any]]:
    restored = read_snapshot(result.handle.getvalue(), KeyGroupRange(0, 127))
    return {name: {(k, n): s for _, k, n, s in restored.entries(name)} for name in restored.metas}


class GatedStream(io.BytesIO):
    """Blocks its first write until ``go`` is set; ``discard`` is recorded."""

    def __init__(self, go: threading.Event, started: threading.Event | None = None) -> None:
        super().__init__()
        self.go = go
        self.started = started
        self.discarded = False

    def write(self, data: Any) -> int:
        if self.started is not None:
            self.started.set()
        assert self.go.wait(10), "the test never let the writer go"
        return super().write(data)

    def discard(self) -> None:
        self.discarded = True


# ------------------------------------------------------------------- states


@pytest.fixture(params=BACKENDS, ids=repr)
def any_backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A backend of every implementation the suite checks (heap tables, RocksDB)."""
    implementation: BackendImplementation = request.param
    b = implementation.factory(FULL, 128)
    yield b
    b.close()


def test_each_state_kind_at_key_and_namespace(any_backend: Any) -> None:
    backend = any_backend
    value, lst, m = backend.get_state(VALUE), backend.get_state(LIST), backend.get_state(MAP)
    reducing, aggregating = backend.get_state(REDUCING), backend.get_state(AGGREGATING)
    backend.set_current_key("alice")
    assert value.value() == [] and lst.get() == [] and m.is_empty()
    assert reducing.get() is None and aggregating.get() is None
    value.update([1])
    lst.add(1)
    lst.add_all([2, 3])
    m.put("x", 1)
    m.put_all({"y": 2})
    reducing.add(5)
    reducing.add(6)
    aggregating.add(4)
    aggregating.add(6)
    backend.set_current_namespace("window-2")
    assert value.value() == [] and lst.get() == [] and reducing.get() is None
    value.update([2])
    backend.set_current_namespace(VOID_NAMESPACE)
    assert value.value() == [1] and lst.get() == [1, 2, 3]
    assert sorted(m.items()) == [("x", 1), ("y", 2)] and m.contains("x") and m.get("z") is None
    assert sorted(m.keys()) == ["x", "y"] and sorted(m.values()) == [1, 2]
    assert reducing.get() == 11 and aggregating.get() == (10, 2)
    backend.set_current_key("bob")
    assert value.value() == [] and lst.get() == []
    assert backend.get_keys("value", VOID_NAMESPACE) == ["alice"]
    assert backend.get_keys("value", "window-2") == ["alice"]
    assert backend.num_state_entries() == 6
    backend.set_current_key("alice")
    m.remove("x")
    m.remove("y")  # the last user key clears the state
    assert m.is_empty() and backend.num_state_entries() == 5
    value.update(None)
    lst.update([])
    assert backend.num_state_entries() == 3


def test_none_means_absent(backend: HeapKeyedStateBackend) -> None:
    value, lst, m = backend.get_state(VALUE), backend.get_state(LIST), backend.get_state(MAP)
    backend.set_current_key(1)
    value.update([1])
    value.update(None)  # Flink: update(null) clears
    lst.update([1, 2])
    lst.update([])  # an empty list clears
    m.put("k", 1)
    m.remove("k")  # removing the last user key clears
    assert backend.num_state_entries() == 0
    with pytest.raises(NoneStateError, match="expected an element to add to list state"):
        lst.add(None)
    with pytest.raises(NoneStateError, match="got None in"):
        lst.add_all([1, None])
    assert lst.get() == [] and backend.num_state_entries() == 0


def test_value_default_is_copied(backend: HeapKeyedStateBackend) -> None:
    value = backend.get_state(VALUE)
    backend.set_current_key(1)
    value.value().append("mutated")
    assert value.value() == [] and VALUE.default == []


def test_reduce_function_errors_change_nothing(backend: HeapKeyedStateBackend) -> None:
    def fails(a: int, b: int) -> int:
        raise ArithmeticError("no")

    reducing = backend.get_state(ReducingStateDescriptor("r", reduce_function=fails))
    backend.set_current_key(1)
    reducing.add(1)
    with pytest.raises(TransformFunctionError, match="ArithmeticError: no"):
        reducing.add(2)
    assert reducing.get() == 1


def test_key_context_errors(backend: HeapKeyedStateBackend) -> None:
    value = backend.get_state(VALUE)
    with pytest.raises(NoCurrentKeyError, match="call set_current_key"):
        value.value()
    with pytest.raises(NoCurrentKeyError):
        _ = backend.current_key_group
    with pytest.raises(UnhashableKeyError, match="expected a hashable key, got list"):
        backend.set_current_key([1])
    with pytest.raises(InvalidArgumentError, match="expected a key, got None"):
        backend.set_current_key(None)
    with pytest.raises(InvalidArgumentError, match="use VOID_NAMESPACE"):
        backend.set_current_namespace(None)
    backend.set_current_key(7)
    assert backend.current_key == 7 and backend.current_key_group == assign_to_key_group(7, 128)
    m = backend.get_state(MAP)
    with pytest.raises(UnhashableKeyError, match="expected a hashable user key"):
        m.put(["u"], 1)  # type: ignore[arg-type]  # the unhashable key under test
    assert m.is_empty()


def test_keys_outside_the_backend_are_refused_at_set_current_key() -> None:
    key_groups = compute_key_group_range_for_operator_index(128, 4, 1)
    with HeapKeyedStateBackend(key_groups, 128) as b:
        value = b.get_state(VALUE)
        outside = next(k for k in range(100) if assign_to_key_group(k, 128) not in key_groups)
        inside = next(k for k in range(100) if assign_to_key_group(k, 128) in key_groups)
        b.set_current_key(inside)
        with pytest.raises(KeyGroupOutOfRangeError, match="expected a key group in"):
            b.set_current_key(outside)
        assert b.current_key == inside  # the current key did not change
        value.update([1])
        assert b.num_state_entries() == 1


def test_registration_must_describe_the_same_state(backend: HeapKeyedStateBackend) -> None:
    first = backend.get_state(VALUE)
    assert backend.get_state(ValueStateDescriptor("value", default=[])).name == first.name
    with pytest.raises(
        StateRegistrationError, match="registered again as a value state, got a list state"
    ):
        backend.get_state(ListStateDescriptor("value"))
    with pytest.raises(
        StateRegistrationError,
        match="with serializer 'cowstate-value', got 'cowstate-value-immutable'",
    ):
        backend.get_state(ValueStateDescriptor("value", serializer=ImmutableSerializer()))
    with pytest.raises(UnknownStateError, match="expected a registered state name"):
        backend.table("nope")
    with pytest.raises(InvalidArgumentError, match="expected a state descriptor"):
        backend.get_state("value")  # type: ignore[call-overload]
    assert backend.state_names == ["value"]


def test_bad_backend_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match=r"inside \[0, 9\]"):
        HeapKeyedStateBackend(KeyGroupRange(0, 10), 10)
    with pytest.raises(InvalidArgumentError, match="expected a KeyGroupRange"):
        HeapKeyedStateBackend((0, 9), 10)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="expected max_parallelism"):
        HeapKeyedStateBackend(KeyGroupRange(0, 9), 0)


# ------------------------ the key context and the state handles, word for word


@pytest.mark.kills(module="cowstate.keyed_state")
def test_void_namespace_hashes_as_flinks_void_namespace() -> None:
    # keyed_state.xǁVoidNamespaceǁ__hash__ 1: VoidNamespace.hashCode() is 99.
    assert hash(VOID_NAMESPACE) == 99


@pytest.mark.kills(module="cowstate.keyed_state")
def test_a_fresh_key_context_has_no_key_no_key_group_and_the_void_namespace() -> None:
    # keyed_state.xǁKeyContextǁ__init__ 1-9.
    serializer = DefaultSerializer()
    context = KeyContext(FULL, 128, serializer)
    assert context.key_group_range is FULL
    assert context.max_parallelism == 128
    assert context.key_serializer is serializer
    assert type(context.key_types) is KeyTypes
    assert context.key_group == -1
    assert context.namespace is VOID_NAMESPACE
    with pytest.raises(NoCurrentKeyError) as caught:
        _ = context.key
    assert str(caught.value) == (
        "expected a current key, got none: call set_current_key(key) before using keyed state"
    )


@pytest.mark.kills(module="cowstate.keyed_state")
def test_set_key_hashes_with_the_contexts_key_serializer() -> None:
    # keyed_state.xǁKeyContextǁset_key 7-13, 16, 17, __init__ 3: with LongSerializer
    # keys, -1 is a Long (hash 0, key group 94), not an Integer (key group 80).
    context = KeyContext(FULL, 128, LongSerializer())
    context.set_key(-1)
    assert (context.key, context.key_group) == (-1, 94)
    b = HeapKeyedStateBackend(FULL, 128, key_serializer=LongSerializer())
    try:
        b.set_current_key(-1)
        assert (b.current_key, b.current_key_group) == (-1, 94)
        b.set_current_key(3)
        assert (b.current_key, b.current_key_group) == (3, 113)
    finally:
        b.close()


@pytest.mark.kills(module="cowstate.keyed_state")
def test_set_key_refuses_none_and_unhashable_keys_and_keeps_no_key() -> None:
    # keyed_state.xǁKeyContextǁset_key 1-6.
    context = KeyContext(FULL, 128, DefaultSerializer())
    with pytest.raises(InvalidArgumentError) as caught:
        context.set_key(None)
    assert str(caught.value) == "expected a key, got None; a key must not be None"
    with pytest.raises(UnhashableKeyError) as unhashable:
        context.set_key([1])
    assert str(unhashable.value) == "expected a hashable key, got list [1]"
    with pytest.raises(NoCurrentKeyError):
        _ = context.key
    context.set_key("k")
    assert context.key == "k"


@pytest.mark.kills(module="cowstate.keyed_state")
def test_set_key_fixes_the_key_type_only_for_a_key_in_range() -> None:
    # keyed_state.xǁKeyContextǁset_key 14, 15: the range is checked first, and the
    # first key admitted fixes the type (True after 1 is refused).
    context = KeyContext(KeyGroupRange(0, 63), 128, DefaultSerializer())
    with pytest.raises(KeyGroupOutOfRangeError, match=re.escape("got key group 94;")):
        context.set_key(0)
    context.set_key("hello")  # key group 35: str is now the key type
    assert (context.key, context.key_group) == ("hello", 35)
    with pytest.raises(KeyTypeMismatchError) as caught:
        context.set_key(4)  # key group 7, in range, but an int
    assert str(caught.value) == "expected a key of type str (fixed by the first key), got int: 4"
    ints = KeyContext(FULL, 128, DefaultSerializer())
    ints.set_key(1)
    with pytest.raises(KeyTypeMismatchError) as caught:
        ints.set_key(True)
    assert str(caught.value) == (
        "expected a key of type int (fixed by the first key), got bool: True"
    )
    assert (ints.key, ints.key_group) == (1, 86)


@pytest.mark.kills(module="cowstate.keyed_state")
def test_set_namespace_refuses_none_and_unhashable_namespaces_word_for_word() -> None:
    # keyed_state.xǁKeyContextǁset_namespace 1-12.
    context = KeyContext(FULL, 128, DefaultSerializer())
    context.set_namespace("window-1")
    assert context.namespace == "window-1"
    with pytest.raises(InvalidArgumentError) as caught:
        context.set_namespace(None)
    assert str(caught.value) == (
        "expected a namespace, got None; use VOID_NAMESPACE for state without one"
    )
    with pytest.raises(UnhashableKeyError) as unhashable:
        context.set_namespace(["n"])
    assert str(unhashable.value) == "expected a hashable namespace, got list ['n']"
    assert context.namespace == "window-1"
    context.set_namespace(VOID_NAMESPACE)
    assert context.namespace is VOID_NAMESPACE


@pytest.mark.kills(module="cowstate.keyed_state")
def test_handles_route_by_the_contexts_key_group() -> None:
    # keyed_state.xǁKeyedStateǁclear 1-7, _get 1-7, _put 1-9, _transform 1-11,
    # xǁStateHolderǁ__init__ 1, 2: a handle passes the key group set_current_key
    # computed; the table does not hash again. Seen with a table that would hash
    # -1 as an Integer (key group 80) under a context hashing it as a Long (94).
    context = KeyContext(FULL, 128, LongSerializer())
    table: CopyOnWriteStateTable[Any, Any, Any] = CopyOnWriteStateTable(
        FULL, 128, meta=StateMetaInfo(name="v"), key_serializer=IntSerializer()
    )
    value = ValueState(context, StateHolder(ValueStateDescriptor("v"), table))
    items = ListState(context, StateHolder(ListStateDescriptor("v"), table))
    context.set_key(-1)
    context.set_namespace("ns")
    value.update("x")
    assert list(table.entries_in_key_group(94)) == [(-1, "ns", "x")]
    assert list(table.entries_in_key_group(80)) == []
    assert table.get(-1, "ns", key_group=94) == "x"
    assert value.value() == "x"
    value.clear()
    assert list(table.entries_in_key_group(94)) == []
    items.add("a")
    items.add("b")
    assert list(table.entries_in_key_group(94)) == [(-1, "ns", ["a", "b"])]
    assert items.get() == ["a", "b"]
    table.put(-1, "ns", ["c"], key_group=80)  # where the table itself would route -1
    assert items.get() == ["a", "b"]


@pytest.mark.kills(module="cowstate.keyed_state")
def test_value_state_default_is_a_copy_and_none_clears(backend: HeapKeyedStateBackend) -> None:
    # keyed_state.xǁValueStateǁvalue 1-8, update 1, 2.
    descriptor: ValueStateDescriptor[list[int]] = ValueStateDescriptor("value", default=[1])
    state = backend.get_state(descriptor)
    backend.set_current_key("k")
    first = state.value()
    assert first == [1] and first is not descriptor.default
    first.append(2)
    assert state.value() == [1]
    assert descriptor.default == [1]
    state.update([7])
    assert state.value() == [7]
    assert backend.num_state_entries() == 1
    state.update(None)
    assert backend.num_state_entries() == 0
    assert state.value() == [1]
    plain = backend.get_state(ValueStateDescriptor("plain"))
    assert plain.value() is None


class _ListCopySerializer:
    """A user serializer of list states: ``copy`` takes only lists."""

    def copy(self, state: Any) -> Any:
        if type(state) is not list:
            raise TypeError(f"expected a list, got {type(state).__name__}")
        return list(state)

    def serialize(self, state: Any) -> bytes:
        return DefaultSerializer().serialize(state)

    def deserialize(self, data: bytes) -> Any:
        return DefaultSerializer().deserialize(data)


@pytest.mark.kills(module="cowstate.keyed_state")
def test_an_absent_value_without_default_never_reaches_the_serializer(
    backend: HeapKeyedStateBackend,
) -> None:
    # keyed_state.xǁValueStateǁvalue 5: no default, so nothing to copy.
    state = backend.get_state(ValueStateDescriptor("v", serializer=_ListCopySerializer()))
    backend.set_current_key("k")
    assert state.value() is None


@pytest.mark.kills(module="cowstate.keyed_state")
def test_list_state_get_add_add_all_and_update(backend: HeapKeyedStateBackend) -> None:
    # keyed_state.xǁListStateǁget 1-4, add 1-6, add_all 1-6, update 1-3,
    # _checked 1-7, x__extend 1, 2.
    state = backend.get_state(ListStateDescriptor("list"))
    backend.set_current_key("k")
    assert state.get() == [] and type(state.get()) is list
    state.add("a")
    state.add("b")
    assert state.get() == ["a", "b"]
    state.add_all(("c", "d"))
    assert state.get() == ["a", "b", "c", "d"]
    state.add_all([])
    assert state.get() == ["a", "b", "c", "d"]
    with pytest.raises(NoneStateError) as caught:
        state.add(None)
    assert str(caught.value) == "expected an element to add to list state 'list', got None"
    with pytest.raises(NoneStateError) as caught:
        state.add_all(["e", None])
    assert str(caught.value) == (
        "expected elements for list state 'list', got None in ['e', None]; nothing was added"
    )
    assert state.get() == ["a", "b", "c", "d"]
    state.update(iter(["x"]))
    assert state.get() == ["x"]
    state.update([])
    assert backend.num_state_entries() == 0
    state.add_all(["y", "z"])  # absent: the new list is stored
    assert state.get() == ["y", "z"]


@pytest.mark.kills(module="cowstate.keyed_state")
def test_map_state_reads_writes_and_removes(backend: HeapKeyedStateBackend) -> None:
    # keyed_state.xǁMapStateǁget 1-6, put 1-5, remove 1-11, contains 1-5,
    # items 1-5, is_empty 1, 2, x__update 1, 2, x__check_user_key 1-3.
    state = backend.get_state(MapStateDescriptor("map"))
    backend.set_current_key("k")
    assert state.get("a") is None
    assert state.contains("a") is False
    assert state.items() == []
    assert state.is_empty() is True
    state.remove("a")  # absent: nothing to do
    state.put("a", 1)
    state.put("b", 2)
    assert (state.get("a"), state.get("b"), state.get("c")) == (1, 2, None)
    assert (state.contains("a"), state.contains("c")) == (True, False)
    assert state.items() == [("a", 1), ("b", 2)]
    assert state.is_empty() is False
    state.remove("c")  # not there: both stay
    assert state.items() == [("a", 1), ("b", 2)]
    state.remove("a")  # one of two: the other stays
    assert state.items() == [("b", 2)]
    assert backend.num_state_entries() == 1
    state.remove("b")  # the last one: the state is cleared
    assert backend.num_state_entries() == 0
    assert state.is_empty() is True
    unhashable: Any = ["u"]
    for call in (
        lambda: state.get(unhashable),
        lambda: state.put(unhashable, 1),
        lambda: state.remove(unhashable),
        lambda: state.contains(unhashable),
    ):
        with pytest.raises(UnhashableKeyError) as caught:
            call()
        assert str(caught.value) == "expected a hashable user key, got list ['u']"


@pytest.mark.kills(module="cowstate.keyed_state")
def test_reducing_state_folds_and_refuses_none(backend: HeapKeyedStateBackend) -> None:
    # keyed_state.xǁReducingStateǁadd 1-6, _reduce 1-7.
    state = backend.get_state(ReducingStateDescriptor("reducing", reduce_function=add_ints))
    backend.set_current_key("k")
    assert state.get() is None
    state.add(2)
    assert state.get() == 2
    state.add(5)
    assert state.get() == 7
    with pytest.raises(NoneStateError) as caught:
        state.add(None)
    assert str(caught.value) == "expected a value to add to reducing state 'reducing', got None"
    assert state.get() == 7


@pytest.mark.kills(module="cowstate.keyed_state")
def test_aggregating_state_folds_into_one_accumulator(backend: HeapKeyedStateBackend) -> None:
    # keyed_state.xǁAggregatingStateǁget 1-5, add 1-4, _fold 1-7, _function 1, 2.
    state = backend.get_state(
        AggregatingStateDescriptor("aggregating", aggregate_function=SumCount())
    )
    backend.set_current_key("k")
    assert state.get() is None
    state.add(3)
    assert state.get() == (3, 1)
    state.add(4)
    assert state.get() == (7, 2)


# ---------------------------------------------------------------- snapshots


@pytest.mark.parametrize(
    "table", [CopyOnWriteStateTable, NestedMapsStateTable], ids=lambda t: t.__name__
)
def test_snapshot_writes_the_synchronous_moment(table: Any) -> None:
    with HeapKeyedStateBackend(FULL, 128, table) as b:
        fill(b)
        expected = copy.deepcopy(dump(b))
        go = threading.Event()
        future = b.snapshot(1, lambda: GatedStream(go))
        value, lst = b.get_state(VALUE), b.get_state(LIST)
        for key in range(0, 200, 3):  # the owner keeps going
            b.set_current_key(key)
            value.value().append("later")
            lst.add("later")
            value.update(None) if key % 2 else None
        go.set()
        result = future.result(10)
        assert written(result) == expected
        assert result.checkpoint_id == 1 and result.size == len(result.handle.getvalue())
        assert result.info is not None and result.info.entries == 400
        assert open_versions(b) == set() and b.pending_snapshots == 0


def test_empty_backend_snapshot_has_no_handle(backend: HeapKeyedStateBackend) -> None:
    result = backend.snapshot(3, io.BytesIO).result(10)
    assert result.handle is None and result.info is None and result.size == 0
    backend.restore([result])  # restore([]) is refused: tests/test_all_or_nothing_restore.py
    assert backend.num_state_entries() == 0


def test_snapshot_released_on_cancel_before_start(backend: HeapKeyedStateBackend) -> None:
    """The writer thread is busy with a first snapshot; the second one is
    cancelled before it starts: it never runs and releases at once."""
    fill(backend)
    go, started = threading.Event(), threading.Event()
    first = backend.snapshot(1, lambda: GatedStream(go, started))
    assert started.wait(10)
    second = backend.snapshot(2, io.BytesIO)
    assert open_versions(backend) == {1, 2}
    assert second.cancel() and second.cancelled()
    assert open_versions(backend) == {1}
    go.set()
    assert written(first.result(10))["value"]
    assert open_versions(backend) == set()


def test_snapshot_released_on_cancel_while_writing(backend: HeapKeyedStateBackend) -> None:
    fill(backend)
    go, started = threading.Event(), threading.Event()
    streams: list[GatedStream] = []

    def factory() -> GatedStream:
        streams.append(GatedStream(go, started))
        return streams[-1]

    future = backend.snapshot(1, factory)
    assert started.wait(10)
    assert future.cancel()  # running: stops before the next key group
    go.set()
    with pytest.raises(SnapshotCancelledError, match="cancelled before key group"):
        future.result(10)
    assert open_versions(backend) == set() and streams[0].discarded


def test_snapshot_failure_is_reported_and_releases(backend: HeapKeyedStateBackend) -> None:
    fill(backend)

    def no_stream() -> io.BytesIO:
        raise PermissionError("read-only file system")

    future = backend.snapshot(1, no_stream)
    with pytest.raises(SnapshotWriteError, match="PermissionError: read-only") as error:
        future.result(10)
    assert isinstance(error.value.__cause__, PermissionError)
    assert open_versions(backend) == set()

    class Failing(io.BytesIO):
        discarded = False

        def write(self, data: Any) -> int:
            if self.tell() > 1000:
                raise OSError("disk full")
            return super().write(data)

        def discard(self) -> None:
            Failing.discarded = True

    with pytest.raises(SnapshotWriteError, match="disk full"):
        backend.snapshot(2, Failing).result(10)
    assert Failing.discarded and open_versions(backend) == set()
    assert written(backend.snapshot(3, io.BytesIO).result(10)) == dump(backend)


@pytest.mark.parametrize("outcome", ["success", "failure", "cancel"])
def test_snapshot_released_before_its_future_resolves(
    backend: HeapKeyedStateBackend, outcome: str
) -> None:
    """Regression: the writer left the pending set in a done callback, which
    runs after ``result()`` has woken its waiters, so a caller could see its
    finished snapshot still pending (the backend machine's
    ``snapshots_released_when_written`` caught it under mutmut's slower
    trampolines). The knob: leaving the pending set stalls for up to 0.5 s;
    the caller must nevertheless find the snapshot gone when ``result()``
    returns."""
    fill(backend)
    go, started, checked = threading.Event(), threading.Event(), threading.Event()

    class StallingSet(set):  # type: ignore[type-arg]
        def discard(self, item: Any) -> None:
            checked.wait(0.5)
            super().discard(item)

    backend._pending = StallingSet(backend._pending)

    class Stream(GatedStream):
        def write(self, data: Any) -> int:
            count = super().write(data)
            if outcome == "failure" and self.tell() > 1000:
                raise OSError("disk full")
            return count

    future = backend.snapshot(1, lambda: Stream(go, started))
    assert started.wait(10)
    if outcome == "cancel":
        assert future.cancel()
    go.set()
    try:
        if outcome == "success":
            assert written(future.result(10)) == dump(backend)
        else:
            with pytest.raises((SnapshotWriteError, SnapshotCancelledError)):
                future.result(10)
        assert (open_versions(backend), backend.pending_snapshots) == (set(), 0)
    finally:
        checked.set()


def test_snapshot_arguments(backend: HeapKeyedStateBackend) -> None:
    with pytest.raises(InvalidArgumentError, match="expected a checkpoint id >= 0"):
        backend.snapshot(-1, io.BytesIO)
    with pytest.raises(InvalidArgumentError, match="expected a callable stream factory"):
        backend.snapshot(1, io.BytesIO())  # type: ignore[arg-type]


def test_state_registered_during_async_write_is_not_in_it_flink_9269(
    backend: HeapKeyedStateBackend,
) -> None:
    """FLINK-9269: the writer uses what the synchronous part captured, so a
    state registered while it runs is neither written nor in its way."""
    fill(backend)
    go = threading.Event()
    futures = [backend.snapshot(i, lambda: GatedStream(go)) for i in range(3)]
    late = backend.get_state(ListStateDescriptor("late"))
    backend.set_current_key(1)
    late.add("x")
    go.set()
    for future in futures:
        assert set(written(future.result(10))) == {"value", "list"}
    assert "late" in written(backend.snapshot(9, io.BytesIO).result(10))


def test_serializer_changed_after_snapshot_is_not_used_flink_6207() -> None:
    with HeapKeyedStateBackend(FULL, 128) as b:
        fill(b)
        go = threading.Event()
        future = b.snapshot(1, lambda: GatedStream(go))
        table = b.table("value")
        table.serializer = IntSerializer()  # would fail on list states
        go.set()
        assert written(future.result(10))["value"][(5, VOID_NAMESPACE)] == [5]


def test_get_keys_is_a_list_so_states_may_change_while_walking_flink_9060(
    backend: HeapKeyedStateBackend,
) -> None:
    fill(backend)
    value = backend.get_state(VALUE)
    for key in backend.get_keys("value", VOID_NAMESPACE):
        backend.set_current_key(key)
        value.clear()
    assert len(backend.table("value")) == 0


def test_close_cancels_and_refuses_more_work() -> None:
    b = HeapKeyedStateBackend(FULL, 128)
    fill(b)
    go, started = threading.Event(), threading.Event()
    first = b.snapshot(1, lambda: GatedStream(go, started))
    assert started.wait(10)
    queued = b.snapshot(2, io.BytesIO)
    threading.Timer(0.05, go.set).start()
    b.close()
    assert queued.cancelled()
    with pytest.raises(SnapshotCancelledError):
        first.result(10)
    assert open_versions(b) == set()
    with pytest.raises(BackendClosedError, match="expected an open backend"):
        b.snapshot(3, io.BytesIO)
    b.close()  # idempotent


def test_owner_and_writer_race_on_a_large_backend() -> None:
    """50,000 mappings written while the owner changes them 100,000 times, with
    a thread switch every microsecond: the file is the synchronous moment."""
    rng = random.Random(7)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with HeapKeyedStateBackend(FULL, 128) as b:
            model = ReferenceKeyedStateBackend(range(128), 128, default_namespace=VOID_NAMESPACE)
            states: list[tuple[ListState | AggregatingState, Any]] = [
                (b.get_state(LIST), model.get_state(LIST)),
                (b.get_state(AGGREGATING), model.get_state(AGGREGATING)),
            ]
            for key in range(25_000):
                b.set_current_key(key)
                model.set_current_key(key)
                for impl, ref in states:
                    impl.add(key)
                    ref.add(key)
            future = b.snapshot(1, io.BytesIO)
            expected = model.snapshot(1).result()
            for _ in range(50_000):
                key = rng.randrange(30_000)
                b.set_current_key(key)
                model.set_current_key(key)
                for impl, ref in states:
                    impl.add(-1)
                    ref.add(-1)
            result = future.result(60)
            assert written(result) == {name: dict(c) for name, c in expected.states.items()}
            assert dump(b) == {name: model.contents(name) for name in b.state_names}
    finally:
        sys.setswitchinterval(previous)


# ------------------------------------------------------------------ restore


def snapshot_bytes(b: HeapKeyedStateBackend) -> bytes:
    return bytes(b.snapshot(1, io.BytesIO).result(10).handle.getvalue())


@pytest.mark.parametrize(("old", "new"), [(2, 5), (4, 3), (1, 3), (3, 1)])
def test_key_group_snapshot_restore_rescaling(old: int, new: int) -> None:
    """StateBackendTestBase.testKeyGroupSnapshotRestore (maxP 10): every key is
    visible exactly in the backend that owns its key group."""
    files = []
    expected: dict[tuple[Any, Any], Any] = {}
    for operator in range(old):
        key_groups = compute_key_group_range_for_operator_index(10, old, operator)
        with HeapKeyedStateBackend(key_groups, 10) as b:
            value = b.get_state(ValueStateDescriptor("v"))
            for key in range(300):
                if assign_to_key_group(key, 10) in key_groups:
                    b.set_current_key(key)
                    value.update(f"v{key}")
                    expected[(key, VOID_NAMESPACE)] = f"v{key}"
            files.append(snapshot_bytes(b))
    seen: dict[tuple[Any, Any], Any] = {}
    for operator in range(new):
        key_groups = compute_key_group_range_for_operator_index(10, new, operator)
        with HeapKeyedStateBackend(key_groups, 10, NestedMapsStateTable) as b:
            b.restore(files)
            value = b.get_state(ValueStateDescriptor("v"))
            for (key, namespace), state in dump(b)["v"].items():
                assert assign_to_key_group(key, 10) in key_groups
                assert (key, namespace) not in seen
                seen[(key, namespace)] = state
                b.set_current_key(key)
                assert value.value() == state
    assert seen == expected


def test_restored_state_is_registered_by_its_first_descriptor() -> None:
    with HeapKeyedStateBackend(FULL, 128) as source:
        fill(source)
        data = snapshot_bytes(source)
    with HeapKeyedStateBackend(FULL, 128) as b:
        b.restore([data])
        assert b.state_names == ["value", "list"]
        with pytest.raises(StateRegistrationError, match="got a map state descriptor"):
            b.get_state(MapStateDescriptor("list"))
        lst = b.get_state(LIST)
        b.set_current_key(3)
        assert lst.get() == [3, -3]


def corruptions(data: bytes) -> list[tuple[bytes, type[Exception]]]:
    reader = SnapshotReader(data)
    block = next(iter(reader.offsets.values()))
    flipped = bytearray(data)
    flipped[block + 20] ^= 0x01
    return [
        (data[:-3], SnapshotFormatError),
        (b"NOTSNAPS" + data[8:], SnapshotFormatError),
        (bytes(flipped), SnapshotFormatError),
    ]


def test_restore_refusals_leave_the_backend_as_it_was() -> None:
    with HeapKeyedStateBackend(FULL, 128) as source:
        fill(source, range(50))
        good = snapshot_bytes(source)
    with HeapKeyedStateBackend(KeyGroupRange(0, 9), 10) as other:
        fill(other, range(10))
        other_max_parallelism = snapshot_bytes(other)
    with HeapKeyedStateBackend(FULL, 128, key_serializer=StringSerializer()) as strings:
        value = strings.get_state(VALUE)
        strings.set_current_key("k")
        value.update([1])
        string_keys = snapshot_bytes(strings)

    with HeapKeyedStateBackend(FULL, 128) as b:
        fill(b, range(100, 130))
        before = copy.deepcopy(dump(b))
        cases: list[tuple[list[Any], type[Exception]]] = [
            ([good, data], error) for data, error in corruptions(good)
        ]
        cases += [
            ([good, other_max_parallelism], MaxParallelismMismatchError),
            ([string_keys], SerializerMismatchError),
            ([good, 42], InvalidArgumentError),
        ]
        for files, error in cases:
            with pytest.raises(error):
                b.restore(files)
            assert dump(b) == before
        b.restore([good])
        assert dump(b) == dump_of(good)


def dump_of(data: bytes) -> dict[str, dict[tuple[Any, Any], Any]]:
    restored = read_snapshot(data, FULL)
    return {name: {(k, n): s for _, k, n, s in restored.entries(name)} for name in restored.metas}


def test_restore_refuses_another_kind_for_a_registered_state() -> None:
    with HeapKeyedStateBackend(FULL, 128) as source:
        fill(source, range(20))
        data = snapshot_bytes(source)
    with HeapKeyedStateBackend(FULL, 128) as b:
        m = b.get_state(MapStateDescriptor("list"))
        b.set_current_key(1)
        m.put("k", "v")
        with pytest.raises(SerializerMismatchError, match="of kind 'map', the file holds kind"):
            b.restore([data])
        assert dump(b) == {"list": {(1, VOID_NAMESPACE): {"k": "v"}}}


def test_restore_refuses_a_native_snapshot_of_another_backend() -> None:
    """A file whose format is not heap or canonical (say, another backend's native
    format) is refused with IncompatibleSnapshotError."""
    from cowstate.snapshot import SnapshotMetadata, SnapshotWriter

    out = io.BytesIO()
    SnapshotWriter(
        out,
        SnapshotMetadata(
            format="rocksdb-native",
            max_parallelism=128,
            key_group_range=(0, 127),
            key_serializer="cowstate-value",
            states=(),
        ),
    ).finish()
    with HeapKeyedStateBackend(FULL, 128) as b:
        fill(b, range(5))
        before = dump(b)
        with pytest.raises(IncompatibleSnapshotError, match="restore from a canonical savepoint"):
            b.restore([out.getvalue()])
        assert dump(b) == before
