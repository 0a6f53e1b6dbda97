"""The heap keyed state backend: states, registration, asynchronous snapshots
(success, failure, cancellation and what each releases), restore and its
refusals, with the Flink bugs the design answers (FLINK-6207, -9060, -9269,
-13469) as named regression tests; the key context and the state handles of
``cowstate.keyed_state`` word for word (the tests marked ``kills``, written to
kill that module's mutants, ``make mutate SCOPE=tables``, named in their
comments); and, word for word, what the writer thread, ``snapshot`` and
``snapshot_to`` take and return, and what a restore takes, refuses (its
handles, its files, its items) and leaves: the two phases, the restored
tables' capacities, the states restored or registered around it. Those tests
(marked ``kills`` for ``cowstate.keyed_backend`` and ``cowstate.heap_backend``)
use the restore tests' backends and crafted canonical files
(:mod:`restore_support`: 16 key groups, trusted-pickle serializers, the
handles' paths absolute under ``restore_support.ABSOLUTE``)."""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import io
import random
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures._base import _Waiter
from pathlib import Path
from typing import Any

import pytest
import restore_support
from restore_support import (
    ABSOLUTE,
    MAX_P,
    RESTORED_ENTRIES,
    SER,
    by_group,
    crafted,
    crafted_raw,
    group_of,
    handle_for,
    heap,
    metadata_of,
    raw_blocks,
    rocks,
)
from restore_support import STATE_META as META

from cowstate import heap_backend, keyed_state
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.descriptors import (
    AggregatingState,
    AggregatingStateDescriptor,
    ListState,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueState,
    ValueStateDescriptor,
)
from cowstate.errors import (
    BackendClosedError,
    ConcurrentModificationError,
    CowStateError,
    DuplicateMappingError,
    IncompatibleSnapshotError,
    InvalidArgumentError,
    KeyGroupMismatchError,
    KeyGroupOutOfRangeError,
    KeyTypeMismatchError,
    MaxParallelismMismatchError,
    MixedKeyTypesError,
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
from cowstate.heap_backend import (
    HeapKeyedStateBackend,
    HeapPreparedRestore,
    KeyedStateSnapshotResult,
)
from cowstate.introspection import describe
from cowstate.key_groups import (
    KeyGroupRange,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from cowstate.key_types import KeyTypes
from cowstate.keyed_state import VOID_NAMESPACE, KeyContext, StateHolder
from cowstate.maps import FORCED_PURE, c_map_class
from cowstate.nested_table import NestedMapsStateTable
from cowstate.serializers import (
    DefaultSerializer,
    ImmutableSerializer,
    IntSerializer,
    LongSerializer,
    StateSerializer,
    StringSerializer,
    serializer_identifier,
)
from cowstate.snapshot import SnapshotReader, SnapshotWriter, compat, read_snapshot
from cowstate.state_map import CopyOnWriteStateMap as PurePythonMap
from cowstate.state_meta import SnapshotFormat, StateKind, StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable, StateTable
from cowstate_model.backend import ReferenceKeyedStateBackend
from cowstate_spec.backends import BACKENDS, BackendImplementation, SumCount, add_ints
from cowstate_spec.cmap_view import MAP_CLASSES, MapView

try:
    from cowstate import _keygroups
except ImportError:  # not built: the checked path only
    _keygroups = None  # type: ignore[assignment]

FULL = KeyGroupRange(0, 127)
VALUE: ValueStateDescriptor[list[int]] = ValueStateDescriptor("value", default=[])
LIST = ListStateDescriptor("list")
MAP = MapStateDescriptor("map")
REDUCING: ReducingStateDescriptor[int] = ReducingStateDescriptor(
    "reducing", reduce_function=add_ints
)
AGGREGATING = AggregatingStateDescriptor("aggregating", aggregate_function=SumCount())

#: The restore tests' crafted files (:mod:`restore_support`): their handles' paths
#: are absolute, read through ROOT; they hold ENTRIES, which restore to RESTORED.
ROOT = ABSOLUTE
ENTRIES = RESTORED_ENTRIES
RESTORED = {"value": {(k, ns): state for k, ns, state in ENTRIES}}


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
        backend.get_state("value")  # type: ignore[arg-type]
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


# ---------------------------------- the direct route (D1-D3 of cowstate.keyed_state)


def python_frames_before_the_map(maps: Sequence[Any], call: Any, *args: Any) -> int | None:
    """How many Python frames, ``call``'s own included, are on the stack when
    ``call(*args)`` first calls a method of one of ``maps`` (a C method, or a
    pure map's Python method); ``None`` if it never does."""
    ids = {id(m) for m in maps}
    depth = 0
    reached: list[int] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal depth
        if event == "call":
            if id(frame.f_locals.get("self")) in ids:
                reached.append(depth)
            depth += 1
        elif event == "return":
            depth -= 1
        elif event == "c_call" and id(getattr(arg, "__self__", None)) in ids:
            reached.append(depth)

    sys.setprofile(profile)
    try:
        call(*args)
    finally:
        sys.setprofile(None)
    return reached[0] if reached else None


def python_calls(call: Any, *args: Any) -> list[tuple[str, str]]:
    """``(file name, function name)`` of every Python function ``call(*args)``
    runs below its own frame, and ``("C", name)`` of every C function."""
    calls: list[tuple[str, str]] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append((Path(frame.f_code.co_filename).name, frame.f_code.co_name))
        elif event == "c_call":
            calls.append(("C", getattr(arg, "__name__", "?")))

    sys.setprofile(profile)
    try:
        call(*args)
    finally:
        sys.setprofile(None)
    return [c for c in calls[1:] if c != ("C", "setprofile")]


def test_the_direct_route_routes_by_the_contexts_key_group_too() -> None:
    # D2, D3: the same as test_handles_route_by_the_contexts_key_group, with the
    # holder of a backend (its context given, the table on the context's key
    # types): the handles call the map of key group 94 directly.
    context = KeyContext(FULL, 128, LongSerializer())
    table: CopyOnWriteStateTable[Any, Any, Any] = CopyOnWriteStateTable(
        FULL, 128, meta=StateMetaInfo(name="v"), key_serializer=IntSerializer()
    )
    table.key_types = context.key_types
    value = ValueState(context, StateHolder(ValueStateDescriptor("v"), table, context))
    items = ListState(context, StateHolder(ListStateDescriptor("v"), table, context))
    context.set_key(-1)
    context.set_namespace("ns")
    assert python_frames_before_the_map([table.state_map(94)], value.update, "x") == 1
    assert list(table.entries_in_key_group(94)) == [(-1, "ns", "x")]
    assert list(table.entries_in_key_group(80)) == []
    assert value.value() == "x"
    value.clear()
    assert list(table.entries_in_key_group(94)) == []
    items.add("a")
    items.add("b")
    assert list(table.entries_in_key_group(94)) == [(-1, "ns", ["a", "b"])]
    table.put(-1, "ns", ["c"], key_group=80)  # where the table itself would route -1
    assert items.get() == ["a", "b"]
    own: CopyOnWriteStateTable[Any, Any, Any] = CopyOnWriteStateTable(
        FULL, 128, meta=StateMetaInfo(name="w")
    )  # its own key types
    assert StateHolder(None, own, context).routes == [None] * 129


#: Issue 28's keyed operations: (descriptor, the call on its handle).
KEYED_OPERATIONS: dict[str, tuple[Any, Any]] = {
    "ValueState.value": (VALUE, lambda s: (s.value,)),
    "ValueState.update": (VALUE, lambda s: (s.update, [2])),
    "ListState.add": (LIST, lambda s: (s.add, 2)),
    "ListState.get": (LIST, lambda s: (s.get,)),
    "MapState.get": (MAP, lambda s: (s.get, "u")),
    "MapState.put": (MAP, lambda s: (s.put, "u", 2)),
}


@pytest.mark.parametrize("maps", ["c", "python"])
@pytest.mark.parametrize("operation", list(KEYED_OPERATIONS))
@pytest.mark.parametrize("fresh", [False, True], ids=["existing", "new mapping"])
def test_each_keyed_operation_reaches_the_map_within_two_python_frames(
    operation: str, maps: str, fresh: bool
) -> None:
    # Issue 28: ValueState.value/update, ListState.add/get, MapState.get/put
    # crossed three Python frames (handle, _get/_put/_transform, table) before
    # the map, plus the table's _route and key type checks on the way.
    map_class = c_map_class() if maps == "c" else PurePythonMap
    if map_class is None:
        pytest.skip("the C map is not built")
    factory = type("Table", (CopyOnWriteStateTable,), {"map_class": map_class})
    with HeapKeyedStateBackend(FULL, 128, factory) as b:
        descriptor, call = KEYED_OPERATIONS[operation]
        state = b.get_state(descriptor)
        b.set_current_key(1)
        if descriptor is MAP:
            state.put("u", 1)
        else:
            state.update([1])
        b.set_current_key(2 if fresh else 1)
        table = b.table(descriptor.name)
        depth = python_frames_before_the_map([table.state_map(kg) for kg in FULL], *call(state))
        assert depth is not None and depth <= 2, (operation, depth)


def test_a_keyed_update_checks_the_key_type_once_and_hashes_in_c() -> None:
    # D1: after the first key fixed int, set_current_key takes the key in one
    # check (no KeyTypes call at all) and hashes it in C; value() and update()
    # check nothing again. Before issue 28: KeyTypes.admit in set_key, check in
    # the table's _route for value(), check and admit for update(), and the
    # key group hashed in Python.
    with HeapKeyedStateBackend(FULL, 128) as b:
        state = b.get_state(ValueStateDescriptor("v", default=0))
        first_calls = python_calls(b.set_current_key, 1)  # the first key: the checked path
        assert ("key_types.py", "admit") in first_calls
        key = 12345
        b.set_current_key(key)
        state.update(1)
        setting = python_calls(b.set_current_key, key)
        reading = python_calls(state.value)
        writing = python_calls(state.update, 2)
        c_hashes = keyed_state.key_group_of is getattr(_keygroups, "key_group", None)
        assert c_hashes is not (FORCED_PURE or _keygroups is None)
        # COWSTATE_PURE_PYTHON=1 or no C: every key takes the checked path, one admit
        checks = [c for c in setting if c[0] == "key_types.py"]
        assert checks == ([] if c_hashes else [("key_types.py", "admit")]), setting
        for calls in (reading, writing):
            assert not [c for c in calls if c[0] in ("key_types.py", "state_table.py")], calls
        if c_hashes:
            assert setting == [("C", "key_group")]
        assert (b.current_key, b.current_key_group) == (key, assign_to_key_group(key, 128))
        assert state.value() == 2


#: Keys a backend whose key type is int refuses (a key of another type, one it
#: cannot hash or map, one outside its key groups 0-63), each as
#: ``KeyContext.set_key`` (the checked path) refuses it.
REFUSED_KEYS: dict[str, Any] = {
    "bool after int": True,
    "float after int": 1.0,
    "str after int": "1",
    "None": None,
    "unhashable": [1],
    "nan": float("nan"),
    "tuple after int": (1,),
    "int outside the range": next(k for k in range(100) if assign_to_key_group(k, 128) > 63),
}


@pytest.mark.parametrize("position", [0, 2, 4], ids=["first", "middle", "last"])
@pytest.mark.parametrize("refused", list(REFUSED_KEYS))
def test_set_current_key_refuses_a_bad_key_as_the_checked_path_wherever_it_comes(
    refused: str, position: int
) -> None:
    half = KeyGroupRange(0, 63)
    good = [k for k in range(100) if assign_to_key_group(k, 128) <= 63][:5]
    reference = KeyContext(half, 128, DefaultSerializer())
    reference.set_key(good[0])
    with pytest.raises(CowStateError) as expected:
        reference.set_key(REFUSED_KEYS[refused])
    keys: list[Any] = list(good)
    keys[position] = REFUSED_KEYS[refused]
    with HeapKeyedStateBackend(half, 128) as b:
        state = b.get_state(ValueStateDescriptor("v"))
        b.set_current_key(good[-1])  # the key type is int before the first key below
        state.update("first")
        for i, key in enumerate(keys):
            if i != position:
                b.set_current_key(key)
                state.update(i)
                continue
            before = (b.current_key, b.current_key_group, dump(b))
            with pytest.raises(CowStateError) as caught:
                b.set_current_key(key)
            assert type(caught.value) is type(expected.value)
            assert str(caught.value) == str(expected.value)
            assert (b.current_key, b.current_key_group, dump(b)) == before
            assert state.value() == ("first" if i == 0 else i - 1)


def test_a_key_c_does_not_hash_takes_the_checked_path_and_the_direct_route() -> None:
    # D1: an int beyond int64 (hashed through the serializer's bytes), a tuple
    # and a float are made current by KeyContext.set_key; their handles then
    # route directly, to the key group Python computes.
    for key in (2**70, (1, "a"), 1.5):
        with HeapKeyedStateBackend(FULL, 128) as b:
            state = b.get_state(ValueStateDescriptor("v"))
            b.set_current_key(key)
            kg = assign_to_key_group(key, 128)
            assert b.current_key_group == kg and b._context.index == kg
            b.set_current_key(key)  # the second time too (admitted, not plain)
            state.update("x")
            assert list(b.table("v").entries_in_key_group(kg)) == [(key, VOID_NAMESPACE, "x")]
            assert python_frames_before_the_map([b.table("v").state_map(kg)], state.value) == 1


def test_the_direct_route_follows_a_restore_to_the_new_table() -> None:
    # D2: a restore swaps the table; the handle taken before it reads the new
    # table's maps (routes are rebuilt when the holder's table is set).
    with HeapKeyedStateBackend(FULL, 128) as b:
        state = b.get_state(ValueStateDescriptor("v"))
        b.set_current_key(7)
        state.update("snapshotted")
        result = b.snapshot(1, io.BytesIO).result(30)
        state.update("after")
        old_table = b.table("v")
        b.restore([result])
        assert b.table("v") is not old_table
        assert state.value() == "snapshotted"
        state.update("new")
        assert b.table("v").get(7, VOID_NAMESPACE) == "new"
        assert old_table.get(7, VOID_NAMESPACE) == "after"


#: A write through each handle that adds a mapping (at key 99) or removes one
#: (``clear`` at key 1): (descriptor, the write).
WRITES: dict[str, tuple[Any, Any]] = {
    "ValueState.update": (VALUE, lambda s: s.update([1])),
    "ListState.add": (LIST, lambda s: s.add(1)),
    "MapState.put": (MAP, lambda s: s.put("u", 1)),
    "ValueState.clear": (VALUE, lambda s: s.clear()),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_mapping_added_or_removed_by_the_direct_route_fails_the_tables_iterators(
    write: str,
) -> None:
    # D3: the handle tells the table (count_modification), as the table's own
    # put, transform and remove do; without it the iterator would go on.
    descriptor, change = WRITES[write]
    with HeapKeyedStateBackend(FULL, 128) as b:
        state = b.get_state(descriptor)
        for key in range(3):
            b.set_current_key(key)
            if descriptor is MAP:
                state.put("u", key)
            else:
                state.update([key])
        entries = b.entries(descriptor.name)
        next(entries)
        b.set_current_key(1 if write.endswith("clear") else 99)
        change(state)
        with pytest.raises(ConcurrentModificationError):
            list(entries)


class _CountingPuts(CopyOnWriteStateTable[Any, Any, Any]):
    """A table with its own put: no direct route, its put runs."""

    puts = 0

    def put(self, key: Any, namespace: Any, state: Any, *, key_group: int | None = None) -> bool:
        type(self).puts += 1
        return super().put(key, namespace, state, key_group=key_group)


def test_a_table_that_overrides_a_keyed_operation_gets_no_direct_route() -> None:
    # D2: direct_route is None for such a class, so its own operation runs.
    _CountingPuts.puts = 0
    with HeapKeyedStateBackend(FULL, 128, _CountingPuts) as b:
        state = b.get_state(ValueStateDescriptor("v"))
        b.set_current_key(3)
        state.update("x")
        assert _CountingPuts.puts == 1
        assert b.table("v").direct_route() is None
    with HeapKeyedStateBackend(FULL, 128) as plain:
        plain.get_state(VALUE)
        assert plain.table("value").direct_route() is not None


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


# ------------------------------------------------------ the garbage collector


def test_a_backend_of_int_and_str_states_costs_the_collector_nothing() -> None:
    # Issue 28: VOID_NAMESPACE, the namespace of every state below, was of a GC
    # type, so every entry counted as holding a container (the C map's
    # invariant 12) and a full collection walked them all. As the bare C map's
    # test (tests/test_implementations.py): an entry of int or str key,
    # namespace and state holds no GC type, and the collector visits nothing of
    # the map but its serializer.
    ints: ValueStateDescriptor[int] = ValueStateDescriptor("ints")
    strs: ReducingStateDescriptor[str] = ReducingStateDescriptor(
        "strs", reduce_function=lambda a, b: a + b
    )
    with HeapKeyedStateBackend(FULL, 128) as b:
        value, reducing = b.get_state(ints), b.get_state(strs)
        lst, mapping = b.get_state(LIST), b.get_state(MAP)
        for key in range(2000):
            b.set_current_key(key)
            value.update(key * 1000)
            reducing.add(f"s{key}")
            if key % 4 == 0:
                lst.add(key)
                mapping.put(key, key)

        def maps(name: str) -> list[Any]:
            found = [b.table(name).state_map(kg) for kg in FULL]
            c_map = c_map_class()
            if c_map is None or not all(isinstance(m, c_map) for m in found):
                pytest.skip("the heap tables hold no C maps here (not built, or forced pure)")
            return found

        for name in ("ints", "strs"):
            assert sum(len(m) for m in maps(name)) == 2000
            for m in maps(name):
                assert MapView(m).gc_entries == 0, name
                assert gc.get_referents(m) == [m.serializer], name
        # A list or dict state is a container (a dict of ints too, though CPython
        # untracks it: the map counts types), so each such entry counts and its
        # state is visited; so is a namespace of a GC type, a tuple.
        for name, kind in (("list", list), ("map", dict)):
            assert sum(MapView(m).gc_entries for m in maps(name)) == 500
            visited = [r for m in maps(name) for r in gc.get_referents(m) if type(r) is kind]
            assert len(visited) == 500
        b.set_current_key(7)
        b.set_current_namespace(("window", 1))
        value.update(1)
        assert sum(MapView(m).gc_entries for m in maps("ints")) == 1


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


# ------------------------------------------------ snapshots: the writer thread


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_an_executor_that_is_not_one_is_refused() -> None:
    # keyed_backend.AbstractKeyedStateBackend.__init__ 7-11.
    with pytest.raises(InvalidArgumentError) as excinfo:
        HeapKeyedStateBackend(restore_support.FULL, MAX_P, executor=42)  # type: ignore[arg-type]
    assert str(excinfo.value) == "expected a concurrent.futures.Executor or None, got int"


def _recording(
    threads: list[threading.Thread],
    go: threading.Event | None = None,
    entered: threading.Event | None = None,
) -> Any:
    """A stream factory noting the thread it runs on (the writer's) and setting
    ``entered``, then waiting for ``go`` when given."""

    def factory() -> io.BytesIO:
        threads.append(threading.current_thread())
        if entered is not None:
            entered.set()
        if go is not None:
            assert go.wait(30)
        return io.BytesIO()

    return factory


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_callers_executor_writes_the_snapshots_and_outlives_the_backend() -> None:
    # keyed_backend.AbstractKeyedStateBackend.__init__ 9, 28-31 and close 7:
    # the caller's executor is used, its pending writes waited for on close,
    # and it is never shut down.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="caller") as executor:
        backend = HeapKeyedStateBackend(
            restore_support.FULL,
            MAX_P,
            key_serializer=SER,
            namespace_serializer=SER,
            executor=executor,
        )
        backend.get_state(restore_support.VALUE)
        restore_support.fill(backend, range(10))
        threads: list[threading.Thread] = []
        assert backend.snapshot(1, _recording(threads)).result(30).info is not None
        go = threading.Event()
        pending = backend.snapshot(2, _recording(threads, go))
        errors: list[BaseException] = []

        def close() -> None:
            try:
                backend.close()
            except BaseException as exc:
                errors.append(exc)

        closer = threading.Thread(target=close)
        closer.start()
        go.set()  # the pending write (cancelled or not) may now finish
        closer.join(30)
        assert not closer.is_alive()
        assert errors == []
        assert pending.done()
        assert backend.pending_snapshots == 0
        assert {t.name for t in threads} == {"caller_0"}
        assert executor.submit(lambda: "still open").result(30) == "still open"


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_backend_writes_on_one_thread_of_its_own_which_close_ends() -> None:
    # keyed_backend.AbstractKeyedStateBackend.__init__ 28-36 and close 5-6: one
    # writer thread per backend (a second snapshot waits for the first), named
    # after the backend, joined by close().
    before = set(threading.enumerate())
    backend = heap()
    restore_support.fill(backend, range(10))
    go = threading.Event()
    threads: list[threading.Thread] = []
    first = backend.snapshot(1, _recording(threads, go))
    second = backend.snapshot(2, _recording(threads))
    started = [t for t in threading.enumerate() if t not in before]
    go.set()
    assert first.result(30).checkpoint_id == 1
    assert second.result(30).checkpoint_id == 2
    assert [t.name for t in started] == ["cowstate-snapshot_0"]
    assert threads == started * 2
    backend.close()
    assert not started[0].is_alive()


class _PendingWhenResolved(_Waiter):
    """A ``concurrent.futures`` waiter (the kind ``wait()`` and
    ``as_completed()`` install): told inside ``set_result`` /
    ``set_exception``, before the future's done callbacks run, what the
    backend then counts as pending."""

    def __init__(self, backend: HeapKeyedStateBackend) -> None:
        super().__init__()
        self.backend = backend
        self.seen: list[int] = []

    def add_result(self, future: Future[Any]) -> None:
        self.seen.append(self.backend.pending_snapshots)

    def add_exception(self, future: Future[Any]) -> None:
        self.seen.append(self.backend.pending_snapshots)

    def add_cancelled(self, future: Future[Any]) -> None:
        self.seen.append(self.backend.pending_snapshots)


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_snapshot_is_no_longer_pending_when_whoever_waits_for_it_wakes() -> None:
    # keyed_backend._run_async__mutmut_13 (the writer discards None instead of
    # its future): the done callback forgets the future only after set_result
    # has woken every waiter, so a thread woken by the result could still count
    # the snapshot as pending (documented: cleanup runs "*before* the future
    # resolves, so whoever waits finds ... the snapshot no longer pending").
    # The waiter below is called by set_result itself, deterministically in
    # the window a woken thread would see.
    backend = heap()
    restore_support.fill(backend, range(10))
    go, entered = threading.Event(), threading.Event()
    future = backend.snapshot(1, _recording([], go, entered))
    assert entered.wait(30)
    waiter = _PendingWhenResolved(backend)
    with future._condition:  # where concurrent.futures.wait() registers its waiters
        future._waiters.append(waiter)
    go.set()
    assert future.result(30).info is not None
    assert waiter.seen == [0]
    backend.close()


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_cancelling_a_queued_or_a_running_snapshot_says_it_worked() -> None:
    # keyed_backend.SnapshotFuture.cancel 1-2 and __init__ 1-3, _start_async
    # 1-7 (what is pending, and forgotten once cancelled): cancelled before
    # its writer starts, a snapshot is cancelled outright and releases its
    # resources; while it runs, cancel() is still accepted and the writer stops.
    backend = heap()
    restore_support.fill(backend, range(10))
    go, entered = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    running = backend.snapshot(1, _recording(threads, go, entered))
    assert entered.wait(30)  # the writer runs it (and waits for go)
    queued = backend.snapshot(2, io.BytesIO)
    assert queued.checkpoint_id == 2
    assert backend.pending_snapshots == 2
    assert queued.cancel() is True
    assert queued.cancelled()
    assert running.cancel() is True
    assert not running.cancelled()
    go.set()
    with pytest.raises(SnapshotCancelledError) as excinfo:
        running.result(30)
    assert str(excinfo.value) == "snapshot cancelled before key group 0 was written"
    assert backend.pending_snapshots == 0
    backend.close()


# -------------------------------------- snapshots: arguments, results, handles


@pytest.mark.kills(module="cowstate.heap_backend")
def test_snapshot_refuses_a_format_no_heap_backend_restores() -> None:
    # heap_backend.HeapKeyedStateBackend.snapshot 1-3.
    backend = heap()
    with pytest.raises(InvalidArgumentError) as excinfo:
        backend.snapshot(1, io.BytesIO, snapshot_format=SnapshotFormat.ROCKSDB_NATIVE)
    assert str(excinfo.value) == (
        "expected a snapshot format in ['canonical', 'heap'], got 'rocksdb-native'"
    )
    backend.close()


@pytest.mark.kills(module="cowstate.heap_backend")
def test_snapshot_ids_are_ints_from_zero() -> None:
    # heap_backend.HeapKeyedStateBackend.snapshot 4-13: 0 is an id, -1 and True
    # are not; the refusals name what they got.
    backend = heap()
    restore_support.fill(backend, range(10))
    assert backend.snapshot(0, io.BytesIO).result(30).checkpoint_id == 0
    for bad in (-1, True, 1.0):
        with pytest.raises(InvalidArgumentError) as excinfo:
            backend.snapshot(bad, io.BytesIO)  # type: ignore[arg-type]
        assert str(excinfo.value) == f"expected a checkpoint id >= 0, got {bad!r}"
    with pytest.raises(InvalidArgumentError) as refused:
        backend.snapshot(1, 42)  # type: ignore[arg-type]
    assert str(refused.value) == "expected a callable stream factory, got int"
    assert backend.pending_snapshots == 0
    backend.close()


@pytest.mark.kills(module="cowstate.heap_backend")
def test_a_table_factory_must_be_callable() -> None:
    # heap_backend.HeapKeyedStateBackend.__init__ 15-19.
    with pytest.raises(InvalidArgumentError) as excinfo:
        HeapKeyedStateBackend(restore_support.FULL, MAX_P, 42)  # type: ignore[arg-type]
    assert str(excinfo.value) == "expected a table factory, got int"


@pytest.mark.kills(module="cowstate.heap_backend")
def test_a_snapshot_result_in_memory_is_rewound() -> None:
    # heap_backend.HeapKeyedStateBackend._write 20-33: a BytesIO handle reads
    # from its first byte, the snapshot file the result's info describes; the
    # result names the checkpoint and the backend's key groups.
    backend = heap()
    restore_support.fill(backend, range(10))
    result = backend.snapshot(1, io.BytesIO).result(30)
    backend.close()
    assert (result.checkpoint_id, result.key_group_range) == (1, restore_support.FULL)
    assert isinstance(result.handle, io.BytesIO)
    assert result.handle.tell() == 0
    data = result.handle.read()
    assert result.info is not None
    assert len(data) == result.info.size == result.size
    assert data[:8] == b"\x89CWSNAP\n"


class _BrokenStream(io.BytesIO):
    """A stream whose writes fail, with ``discard()`` (that may fail too)."""

    def __init__(self, discard_fails: bool = False) -> None:
        super().__init__()
        self.discarded = 0
        self.discard_fails = discard_fails

    def write(self, data: Any) -> int:
        raise OSError("disk full")

    def discard(self) -> None:
        self.discarded += 1
        if self.discard_fails:
            raise OSError("cannot discard either")


@pytest.mark.kills(module="cowstate.keyed_backend")
@pytest.mark.kills(module="cowstate.heap_backend")
@pytest.mark.parametrize("discard_fails", [False, True])
def test_a_failed_write_discards_its_stream_and_names_the_writes_error(
    discard_fails: bool,
) -> None:
    # heap_backend.HeapKeyedStateBackend._write 34, _discard 1-10, snapshot
    # 45-46 and keyed_backend._run_async 5-8: the stream is discarded once, a
    # failing discard does not hide the write's error, the message word for word.
    backend = heap()
    restore_support.fill(backend, range(10))
    before = restore_support.dump(backend)
    stream = _BrokenStream(discard_fails)
    future = backend.snapshot(5, lambda: stream)
    with pytest.raises(SnapshotWriteError) as excinfo:
        future.result(30)
    assert str(excinfo.value) == (
        "expected snapshot 5 to be written, got OSError: disk full; its resources were released"
    )
    cause = excinfo.value.__cause__
    assert type(cause) is OSError and str(cause) == "disk full"
    assert stream.discarded == 1
    assert backend.pending_snapshots == 0
    assert restore_support.dump(backend) == before
    backend.close()


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_closed_backend_refuses_snapshots_and_restores() -> None:
    # keyed_backend.AbstractKeyedStateBackend._check_open 1-3.
    backend = heap()
    backend.close()
    for call in (
        lambda: backend.snapshot(1, io.BytesIO),
        lambda: backend.restore([crafted(by_group(ENTRIES))]),
        lambda: backend.prepare_restore([], ROOT),
    ):
        with pytest.raises(BackendClosedError) as excinfo:
            call()
        assert str(excinfo.value) == "expected an open backend, got one that was closed"


@pytest.mark.kills(module="cowstate.heap_backend")
def test_a_checkpoint_of_a_backend_without_states_is_a_handle_without_files(
    tmp_path: Path,
) -> None:
    # heap_backend.HeapKeyedStateBackend._handle_of 3 and 9 (a result without a
    # file and without info: no file, no states, size 0).
    bare = HeapKeyedStateBackend(
        restore_support.FULL, MAX_P, key_serializer=SER, namespace_serializer=SER
    )
    job = tmp_path / "job"
    location = SnapshotLocation(FileSystem(), str(job / "chk-3"), str(job / "shared"))
    handle = bare.snapshot_to(3, location, SnapshotOptions()).result(30)
    bare.close()
    assert handle.backend == "heap"
    assert handle.format == "heap"
    assert handle.key_group_range == (0, MAX_P - 1)
    assert handle.max_parallelism == MAX_P
    assert handle.checkpoint_id == 3
    assert handle.key_serializer == SER.identifier
    assert handle.states == ()
    assert handle.files == ()
    assert (handle.checkpointed_size, handle.full_size) == (0, 0)
    backend = heap()
    restore_support.fill(backend, range(10))
    backend.restore_from([handle], SnapshotSource(FileSystem(), str(job / "chk-3")))
    assert restore_support.dump(backend) == {"value": {}}
    backend.close()


@pytest.mark.kills(module="cowstate.heap_backend")
@pytest.mark.parametrize(
    ("options", "snapshot_format"),
    [
        (SnapshotOptions(), "heap"),
        (SnapshotOptions(format="canonical"), "heap"),  # a checkpoint is never canonical
        (SnapshotOptions(kind="savepoint"), "heap"),
        (SnapshotOptions(kind="savepoint", format="canonical"), "canonical"),
    ],
    ids=["checkpoint", "checkpoint-canonical", "native-savepoint", "canonical-savepoint"],
)
def test_only_a_canonical_savepoint_is_written_canonical(
    options: SnapshotOptions, snapshot_format: str, tmp_path: Path
) -> None:
    # heap_backend.HeapKeyedStateBackend.snapshot_to 1-28 and _handle_of 1-34:
    # the format the file and its handle record, the file's name, and every
    # field of the handle of a backend with state.
    source = heap(KeyGroupRange(4, 11))
    restore_support.fill(source, range(40))
    expected = restore_support.dump(source)
    location = SnapshotLocation(FileSystem(), str(tmp_path / "sp"), None)
    handle = source.snapshot_to(7, location, options).result(30)
    source.close()
    assert (handle.backend, handle.format) == ("heap", snapshot_format)
    assert handle.key_group_range == (4, 11)
    assert (handle.max_parallelism, handle.checkpoint_id) == (MAX_P, 7)
    assert handle.key_serializer == SER.identifier
    assert handle.states == (META,)
    (file,) = handle.files
    assert (file.path, file.scope) == ("keyed-state-4-11", "exclusive")
    written = (tmp_path / "sp" / "keyed-state-4-11").read_bytes()
    assert file.size == len(written) > 0
    assert (handle.checkpointed_size, handle.full_size) == (file.size, file.size)
    target = heap(KeyGroupRange(4, 11))
    target.restore_from([handle], SnapshotSource(FileSystem(), str(tmp_path / "sp")))
    assert restore_support.dump(target) == expected
    target.close()


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


def collections_while_decoding(restore: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> int:
    """How many collections the cyclic collector began while ``restore()``
    decoded its files and filled its tables (``_decode_and_fill``)."""
    inside = [False]
    started: list[int] = []
    decode_and_fill = HeapKeyedStateBackend._decode_and_fill

    def watched(self: HeapKeyedStateBackend, *args: Any) -> Any:
        inside[0] = True
        try:
            return decode_and_fill(self, *args)
        finally:
            inside[0] = False

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and inside[0]:
            started.append(info["generation"])

    with monkeypatch.context() as patched:
        patched.setattr(HeapKeyedStateBackend, "_decode_and_fill", watched)
        gc.callbacks.append(count)
        try:
            restore()
        finally:
            gc.callbacks.remove(count)
    return len(started)


def test_a_restore_decodes_and_fills_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # cowstate.collector: decoding 2,000 list states (each a tracked
    # allocation) runs automatic collections unless the collector is paused,
    # on success and on a refusal, and the collector is on again after each.
    assert gc.isenabled()
    with HeapKeyedStateBackend(FULL, 128) as source:
        fill(source, range(1000))
        good = snapshot_bytes(source)
    flipped, error = corruptions(good)[2]  # a block's byte: refused while decoding
    with HeapKeyedStateBackend(FULL, 128) as b:
        assert collections_while_decoding(lambda: b.restore([good]), monkeypatch) == 0
        assert gc.isenabled()
        assert dump(b) == dump_of(good)
        with pytest.raises(error, match="CRC"):
            collections_while_decoding(lambda: b.restore([flipped]), monkeypatch)
        assert gc.isenabled()
        assert dump(b) == dump_of(good)
        # the control: the same restore, not paused, meets collections
        monkeypatch.setattr(heap_backend, "paused_collector", contextlib.nullcontext)
        assert collections_while_decoding(lambda: b.restore([good]), monkeypatch) > 0
        assert dump(b) == dump_of(good)


def test_a_restore_leaves_a_collector_that_was_off_off() -> None:
    with HeapKeyedStateBackend(FULL, 128) as source:
        fill(source, range(20))
        good = snapshot_bytes(source)
    gc.disable()
    try:
        with HeapKeyedStateBackend(FULL, 128) as b:
            b.restore([good])
            assert not gc.isenabled()
    finally:
        gc.enable()


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


# -------------------------- restore: the two phases (prepare, commit, discard)


def _prepared(
    tmp_path: Path,
) -> tuple[HeapKeyedStateBackend, HeapPreparedRestore, dict[str, Any]]:
    """A backend holding its own state, a restore of :data:`ENTRIES` prepared into
    it (from a canonical file in ``tmp_path``), and the backend's contents."""
    backend = heap()
    restore_support.fill(backend, range(100, 110), tag="mine")
    handle = handle_for(tmp_path / "sp" / "file", crafted(by_group(ENTRIES)))
    before = restore_support.dump(backend)
    staged = backend.prepare_restore([handle], ROOT)
    assert restore_support.dump(backend) == before  # preparing changes nothing
    return backend, staged, before


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_discarded_restore_cannot_be_committed(tmp_path: Path) -> None:
    # keyed_backend.StagedRestore.discard 1-6 (no killer test discarded a
    # prepared restore): the status it leaves, and the refusal naming it.
    backend, staged, before = _prepared(tmp_path)
    assert staged.status == "prepared"
    staged.discard()
    assert staged.status == "discarded"
    with pytest.raises(InvalidArgumentError) as excinfo:
        staged.commit()
    assert type(excinfo.value) is InvalidArgumentError
    assert str(excinfo.value) == (
        "expected a prepared restore to commit, got one already discarded"
    )
    assert staged.status == "discarded"
    assert restore_support.dump(backend) == before
    backend.close()


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_discarding_a_committed_restore_keeps_what_it_installed(tmp_path: Path) -> None:
    # keyed_backend.StagedRestore.discard 1 (`!=`: discarding a committed
    # restore would mark it discarded).
    backend, staged, _ = _prepared(tmp_path)
    staged.commit()
    assert staged.status == "committed"
    staged.discard()
    assert staged.status == "committed"
    assert restore_support.dump(backend) == RESTORED
    with pytest.raises(InvalidArgumentError) as excinfo:
        staged.commit()
    assert str(excinfo.value) == (
        "expected a prepared restore to commit, got one already committed"
    )
    backend.close()


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_restore_committed_into_a_closed_backend_is_discarded(tmp_path: Path) -> None:
    # keyed_backend.StagedRestore.discard 1-6, through commit()'s discard of a
    # restore whose backend was closed meanwhile.
    backend, staged, before = _prepared(tmp_path)
    backend.close()
    with pytest.raises(BackendClosedError) as excinfo:
        staged.commit()
    assert str(excinfo.value) == (
        "expected an open backend to commit the restore into, got one that was closed"
    )
    assert staged.status == "discarded"
    assert restore_support.dump(backend) == before
    with pytest.raises(InvalidArgumentError) as again:
        staged.commit()
    assert str(again.value) == "expected a prepared restore to commit, got one already discarded"


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_committed_restore_fixes_the_key_type_and_a_discarded_one_does_not(
    tmp_path: Path,
) -> None:
    # keyed_backend.StagedRestore.__init__ 5 and commit 11-12: the restored keys'
    # type (K1/K5 of cowstate.key_types) becomes the backend's at the commit.
    handle = handle_for(tmp_path / "sp" / "file", crafted(by_group(ENTRIES)))
    discarded = heap()
    discarded.prepare_restore([handle], ROOT).discard()
    discarded.set_current_key("text")  # no key type fixed yet
    assert discarded.current_key == "text"
    discarded.close()
    backend = heap()
    backend.prepare_restore([handle], ROOT).commit()
    with pytest.raises(KeyTypeMismatchError) as excinfo:
        backend.set_current_key("text")
    assert str(excinfo.value) == (
        "expected a key of type int (fixed by the first key), got str: 'text'"
    )
    backend.set_current_key(3)
    assert backend.current_key == 3
    backend.close()


@pytest.mark.kills(module="cowstate.heap_backend")
def test_a_state_registered_between_prepare_and_commit_is_emptied_by_the_commit(
    tmp_path: Path,
) -> None:
    # heap_backend.HeapKeyedStateBackend._decode_and_fill 78 (the registered metas the
    # commit makes the empty tables of states absent from the files with).
    backend, staged, _ = _prepared(tmp_path)
    late: ValueStateDescriptor[int] = ValueStateDescriptor("late")
    state = backend.get_state(late)
    backend.set_current_key(1)
    state.update(1)
    staged.commit()
    assert restore_support.dump(backend) == {**RESTORED, "late": {}}
    meta = backend.table("late").meta
    assert (meta.name, meta.kind, meta.state_serializer) == ("late", "value", late.serializer)
    backend.close()


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_restore_from_a_rocksdb_checkpoint_does_not_make_it_the_incremental_base(
    tmp_path: Path,
) -> None:
    # keyed_backend.AbstractKeyedStateBackend.restore_from 1, 4, 7 (`incremental_base`
    # defaults to False: only the coordinator restoring its own checkpoint asks
    # for a base) and _run_async 9-12 (a successful write's `commit`, RocksDB's
    # record of the SSTs it uploaded).
    job = tmp_path / "job"
    source = rocks(tmp_path / "local-1")
    restore_support.fill(source, range(40))
    location = SnapshotLocation(FileSystem(), str(job / "chk-1"), str(job / "shared"))
    handle = source.snapshot_to(1, location, SnapshotOptions()).result(30)
    assert source.recorded_checkpoints == [1]  # its SSTs, recorded on success
    expected = restore_support.dump(source)
    source.close()
    assert handle.shared_files  # SSTs a base could reuse
    target = rocks(tmp_path / "local-2")
    target.restore_from([handle], SnapshotSource(FileSystem(), str(job / "chk-1")))
    assert restore_support.dump(target) == expected
    assert target.incremental_base == {}
    target.close()
    based = rocks(tmp_path / "local-3")  # the control: asked for, the base is seeded
    based.restore_from(
        [handle], SnapshotSource(FileSystem(), str(job / "chk-1")), incremental_base=True
    )
    assert sorted(based.incremental_base) == sorted(
        f.local_name for f in handle.shared_files if f.local_name
    )
    based.close()


# ------------------------------ restore: the handles it refuses, word for word


def _refusal(handles: Any, source: Any = ROOT) -> tuple[type[Exception], str]:
    """The type and message of the error ``prepare_restore(handles, source)``
    raises on a backend holding state, which it must leave as it was."""
    backend = heap()
    restore_support.fill(backend, range(100, 110), tag="mine")
    before = restore_support.dump(backend)
    with pytest.raises(Exception) as excinfo:
        backend.prepare_restore(handles, source)
    assert restore_support.dump(backend) == before
    backend.close()
    return type(excinfo.value), str(excinfo.value)


def _handle(tmp_path: Path, name: str = "file", **changes: Any) -> KeyedStateHandle:
    """The handle of a real canonical file of :data:`ENTRIES`, with ``changes``."""
    handle = handle_for(tmp_path / "sp" / name, crafted(by_group(ENTRIES)))
    return handle.model_copy(update=changes)


def _halves(tmp_path: Path, low: Sequence[Any], high: Sequence[Any]) -> list[KeyedStateHandle]:
    """Handles of key groups 0-7 (listing states ``low``) and 8-15 (``high``)."""
    out = []
    for name, (start, end), states in (("low", (0, 7), low), ("high", (8, 15), high)):
        part = KeyGroupRange(start, end)
        blocks = {kg: rows for kg, rows in by_group(ENTRIES).items() if kg in part}
        data = crafted(blocks, key_group_range=part)
        handle = handle_for(tmp_path / "sp" / name, data, key_group_range=part)
        out.append(handle.model_copy(update={"states": tuple(states)}))
    return out


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_restore_needs_a_snapshot_source(tmp_path: Path) -> None:
    # keyed_backend._handles_to_read 1-3.
    assert _refusal([_handle(tmp_path)], str(tmp_path)) == (
        InvalidArgumentError,
        "expected a SnapshotSource, got str",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_restore_needs_a_sequence_of_handles(tmp_path: Path) -> None:
    # keyed_backend._handles_to_read 4-9: one handle given bare, a set of handles.
    handle = _handle(tmp_path)
    assert _refusal(handle) == (
        InvalidArgumentError,
        "expected a sequence of KeyedStateHandles, got KeyedStateHandle",
    )
    assert _refusal({handle}) == (
        InvalidArgumentError,
        "expected a sequence of KeyedStateHandles, got set",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_restore_from_no_handles_is_refused() -> None:
    # keyed_backend._handles_to_read 10-15.
    assert _refusal([]) == (
        InvalidArgumentError,
        "expected the handles of a snapshot to restore from, got none: a restore from "
        "nothing would empty every state",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_only_keyed_state_handles_restore(tmp_path: Path) -> None:
    # keyed_backend._check_formats 1-3.
    assert _refusal([_handle(tmp_path), 42]) == (
        InvalidArgumentError,
        "expected KeyedStateHandles, got int",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_native_handle_of_another_backend_is_refused(tmp_path: Path) -> None:
    # keyed_backend._check_formats 4-11: a canonical handle before it (not the
    # end of the checks), a native rocksdb one, a heap format claimed by rocksdb.
    canonical = _handle(tmp_path)
    native = _handle(tmp_path, "native", backend="rocksdb", format=SnapshotFormat.ROCKSDB_NATIVE)
    assert _refusal([canonical, native]) == (
        IncompatibleSnapshotError,
        "expected a heap snapshot or a canonical savepoint, got a rocksdb-native snapshot "
        "of the rocksdb backend: the heap backend cannot read the rocksdb backend's own "
        "format; take a canonical savepoint of it to change backends",
    )
    claimed = _handle(tmp_path, "claimed", backend="rocksdb", format=SnapshotFormat.HEAP)
    assert _refusal([claimed]) == (
        IncompatibleSnapshotError,
        "expected a heap snapshot or a canonical savepoint, got a heap snapshot of the "
        "rocksdb backend: the heap backend cannot read the rocksdb backend's own format; "
        "take a canonical savepoint of it to change backends",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_handle_of_another_max_parallelism_is_refused(tmp_path: Path) -> None:
    # keyed_backend._check_snapshot 1-2, through _handles_to_read 17.
    assert _refusal([_handle(tmp_path, max_parallelism=32)]) == (
        MaxParallelismMismatchError,
        f"expected a snapshot of max parallelism {MAX_P}, got one of 32: the number of "
        "key groups cannot change on restore",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_handle_of_another_key_serializer_is_refused(tmp_path: Path) -> None:
    # keyed_backend._check_snapshot 3-6 and _handles_to_read 18-24 (the "snapshot"
    # the message names).
    assert _refusal([_handle(tmp_path, key_serializer="utf8")]) == (
        SerializerMismatchError,
        "expected the key serializer 'tests.trusted-pickle', the snapshot was written with 'utf8'",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_key_group_in_two_handles_is_refused_naming_both(tmp_path: Path) -> None:
    # keyed_backend._handles_to_read 30-42.
    low, high = _halves(tmp_path, [META], [META])
    wide = high.model_copy(update={"key_group_range": (4, 15)})
    assert _refusal([low, wide]) == (
        KeyGroupMismatchError,
        "expected every key group in one handle only, got key group 4 in the handles of "
        "[0, 7] and [4, 15]",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_handle_listing_states_without_files_is_refused(tmp_path: Path) -> None:
    # keyed_backend._check_handles 10-13.
    assert _refusal([_handle(tmp_path, files=())]) == (
        SnapshotFormatError,
        "expected the files of the handle of key groups [0, 15], which lists states "
        "['value'], got a handle without files",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_handle_of_another_namespace_serializer_is_refused(tmp_path: Path) -> None:
    # keyed_backend._restored_meta 2-9 and _check_namespace_serializer 1-4.
    state = META.model_copy(update={"namespace_serializer": "utf8"})
    assert _refusal([_handle(tmp_path, states=(state,))]) == (
        SerializerMismatchError,
        "expected state 'value' with the backend's namespace serializer "
        "'tests.trusted-pickle', the snapshot uses 'utf8'",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_handle_of_another_kind_for_a_registered_state_is_refused(tmp_path: Path) -> None:
    # keyed_backend._restored_meta 12-23 (the registered descriptor's kind).
    state = META.model_copy(update={"kind": "list"})
    assert _refusal([_handle(tmp_path, states=(state,))]) == (
        SerializerMismatchError,
        "expected state 'value' of kind 'value', the snapshot holds kind 'list'",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_handle_of_another_serializer_for_a_registered_state_is_refused(
    tmp_path: Path,
) -> None:
    # keyed_backend._restored_meta 24-27 (the registered descriptor's serializer).
    state = META.model_copy(update={"state_serializer": "utf8"})
    assert _refusal([_handle(tmp_path, states=(state,))]) == (
        SerializerMismatchError,
        "expected the state serializer of 'value' to be 'tests.trusted-pickle', the "
        "snapshot was written with 'utf8'",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_handles_disagreeing_on_an_unregistered_states_kind_are_refused(tmp_path: Path) -> None:
    # keyed_backend._restored_meta 10-11, 21-23, 28-41 and _check_handles 1, 14-17:
    # the first handle's state is what the second is checked against.
    extra = META.model_copy(update={"id": 1, "name": "extra", "state_serializer": "utf8"})
    listed = extra.model_copy(update={"kind": "list"})
    assert _refusal(_halves(tmp_path, [META, extra], [META, listed])) == (
        SerializerMismatchError,
        "expected state 'extra' of kind 'value', the snapshot holds kind 'list'",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_handles_disagreeing_on_an_unregistered_states_serializer_are_refused(
    tmp_path: Path,
) -> None:
    # keyed_backend._restored_meta 24-27, 32, 36-37: the serializer the first
    # handle names, made from its identifier.
    extra = META.model_copy(update={"id": 1, "name": "extra", "state_serializer": "utf8"})
    other = extra.model_copy(update={"state_serializer": "int64"})
    assert _refusal(_halves(tmp_path, [META, extra], [META, other])) == (
        SerializerMismatchError,
        "expected the state serializer of 'extra' to be 'utf8', the snapshot was written "
        "with 'int64'",
    )


@pytest.mark.kills(module="cowstate.keyed_backend")
@pytest.mark.kills(module="cowstate.heap_backend")
def test_a_file_of_other_key_groups_than_its_handle_is_refused_by_path(tmp_path: Path) -> None:
    # keyed_backend.AbstractKeyedStateBackend._check_file_of 6-16 (the message,
    # word for word: every field of the handle and of the file) and
    # heap_backend.HeapKeyedStateBackend.prepare_restore 13 (the path it names).
    low = KeyGroupRange(0, 7)
    entries = [e for e in ENTRIES if e[0] in (0, 1, 2, 3, 4, 5, 6)]
    blocks = {kg: rows for kg, rows in by_group(entries).items() if kg in low}
    assert blocks  # the file holds entries
    data = crafted(blocks, key_group_range=low)
    file = tmp_path / "chk" / "file"
    handle = handle_for(file, data)  # says key groups 0-15
    backend = heap()
    restore_support.fill(backend, range(100, 110), tag="mine")
    before = restore_support.dump(backend)
    with pytest.raises(SnapshotFormatError) as excinfo:
        backend.prepare_restore([handle], ROOT)
    assert type(excinfo.value) is SnapshotFormatError
    assert str(excinfo.value) == (
        f"expected {str(file)!r} to hold key groups [0, 15] in format canonical of max "
        f"parallelism {MAX_P} with key serializer 'tests.trusted-pickle' as its handle "
        f"says, the file holds key groups [0, 7] in format canonical of max parallelism "
        f"{MAX_P} with key serializer 'tests.trusted-pickle'"
    )
    assert restore_support.dump(backend) == before
    backend.close()


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_file_of_other_states_than_its_handle_is_refused_by_path(tmp_path: Path) -> None:
    # keyed_backend.AbstractKeyedStateBackend._check_file_of 20 (the message of
    # a file whose states are not its handle's: here another namespace serializer).
    blocks = raw_blocks(crafted(by_group(ENTRIES)))
    data = crafted_raw(blocks, namespace_serializer="tests.other-namespaces")
    file = tmp_path / "chk" / "file"
    handle = handle_for(file, data)  # lists state "value" with SER's namespaces
    backend = heap()
    restore_support.fill(backend, range(100, 110), tag="mine")
    before = restore_support.dump(backend)
    with pytest.raises(SnapshotFormatError) as excinfo:
        backend.restore_from([handle], ROOT)
    assert type(excinfo.value) is SnapshotFormatError
    assert str(excinfo.value) == (
        f"expected {str(file)!r} to hold the states its handle lists ['value'], the file "
        "holds ['value'] (or other ids, kinds or serializers)"
    )
    assert restore_support.dump(backend) == before
    backend.close()


_LIST, _VALUE = StateKind.LIST, StateKind.VALUE
#: Each rule of cowstate.snapshot.compat: the call with equal values, the
#: values that differ, the error, its message (expected first, then what came).
_COMPAT_RULES: list[tuple[Callable[..., None], tuple[Any, ...], tuple[Any, ...], type, str]] = [
    (
        compat.check_max_parallelism,
        (8, 8),
        (8, 16),
        MaxParallelismMismatchError,
        "expected a snapshot of max parallelism 8, got one of 16: the number of key groups "
        "cannot change on restore",
    ),
    (
        compat.check_key_serializer,
        ("a", "a", "file"),
        ("a", "b", "file"),
        SerializerMismatchError,
        "expected the key serializer 'a', the file was written with 'b'",
    ),
    (
        compat.check_namespace_serializer,
        ("s", "a", "a", "snapshot"),
        ("s", "a", "b", "snapshot"),
        SerializerMismatchError,
        "expected state 's' with the backend's namespace serializer 'a', the snapshot uses 'b'",
    ),
    (
        compat.check_kind,
        ("s", _LIST, _LIST, "file"),
        ("s", _LIST, _VALUE, "file"),
        SerializerMismatchError,
        "expected state 's' of kind 'list', the file holds kind 'value'",
    ),
    (
        compat.check_serializer,
        ("the key serializer", "a", "a", "file"),
        ("the key serializer", "a", "b", "file"),
        SerializerMismatchError,
        "expected the key serializer to be 'a', the file was written with 'b'",
    ),
    (
        compat.check_same_max_parallelism,
        (8, 8),
        (8, 16),
        MaxParallelismMismatchError,
        "expected every file to have max parallelism 8, got 16",
    ),
    (
        compat.check_same_key_serializer,
        ("a", "a"),
        ("a", "b"),
        SerializerMismatchError,
        "expected every file to use key serializer 'a', got 'b'",
    ),
]


@pytest.mark.parametrize(
    ("rule", "same", "other", "error", "message"),
    _COMPAT_RULES,
    ids=[rule[0].__name__ for rule in _COMPAT_RULES],
)
def test_a_compatibility_rule_passes_equal_values_and_refuses_another(
    rule: Callable[..., None],
    same: tuple[Any, ...],
    other: tuple[Any, ...],
    error: type,
    message: str,
) -> None:
    # The C rules both backends, read_snapshot and the coordinator call: the
    # same value passes, another is refused naming both (the paths that call
    # them pin the same messages above and in test_snapshot_io.py).
    rule(*same)
    with pytest.raises(error) as excinfo:
        rule(*other)
    assert type(excinfo.value) is error and str(excinfo.value) == message


def test_the_coordinators_max_parallelism_rule_speaks_of_the_job() -> None:
    # C1 for a job's _metadata (CheckpointCoordinator.restore, recover): the
    # same rule, its message without "on restore" (test_checkpoint_rules.py).
    compat.check_max_parallelism(8, 8, of_job=True)
    with pytest.raises(MaxParallelismMismatchError) as excinfo:
        compat.check_max_parallelism(8, 16, of_job=True)
    assert str(excinfo.value) == (
        "expected a snapshot of max parallelism 8, got one of 16: the number of key groups "
        "cannot change"
    )


def test_the_format_rules_take_their_own_formats_and_canonical_only() -> None:
    # C6: a backend's own native handles and canonical ones; one format per
    # restore; heap files heap or canonical; a canonical savepoint's files canonical.
    heap_rule = functools.partial(
        compat.check_handle_format, backend_name="heap", native_format=SnapshotFormat.HEAP
    )
    heap_rule(SnapshotFormat.HEAP, "heap")
    heap_rule(SnapshotFormat.CANONICAL, "rocksdb")
    for refused, backend in [
        (SnapshotFormat.ROCKSDB_NATIVE, "rocksdb"),
        (SnapshotFormat.HEAP, "rocksdb"),  # the heap's format claimed by another backend
    ]:
        with pytest.raises(IncompatibleSnapshotError, match="take a canonical savepoint"):
            heap_rule(refused, backend)
    compat.check_one_format([SnapshotFormat.CANONICAL])
    with pytest.raises(IncompatibleSnapshotError, match="one format"):
        compat.check_one_format([SnapshotFormat.CANONICAL, SnapshotFormat.ROCKSDB_NATIVE])
    compat.check_heap_file_format(SnapshotFormat.HEAP)
    compat.check_heap_file_format(SnapshotFormat.CANONICAL)
    with pytest.raises(IncompatibleSnapshotError, match="heap or canonical"):
        compat.check_heap_file_format(SnapshotFormat.ROCKSDB_NATIVE)
    compat.check_canonical_file_format(SnapshotFormat.CANONICAL, "f")
    with pytest.raises(IncompatibleSnapshotError) as excinfo:
        compat.check_canonical_file_format(SnapshotFormat.HEAP, "f")
    assert str(excinfo.value) == (
        f"expected a canonical snapshot file, got format {SnapshotFormat.HEAP!r} in 'f': "
        "restore a canonical savepoint"
    )


# --------------------- restore: the items and files restore() takes or refuses


def _restore_refusal(items: Any) -> tuple[type[Exception], str]:
    """The type and message of the error ``restore(items)`` raises on a backend
    holding state, which it must leave as it was."""
    backend = heap()
    restore_support.fill(backend, range(100, 110), tag="mine")
    before = restore_support.dump(backend)
    with pytest.raises(Exception) as excinfo:
        backend.restore(items)
    assert restore_support.dump(backend) == before
    backend.close()
    return type(excinfo.value), str(excinfo.value)


@pytest.mark.kills(module="cowstate.heap_backend")
def test_restore_needs_an_iterable_of_snapshots() -> None:
    # heap_backend.HeapKeyedStateBackend.restore 1-4: the bytes of one file
    # given bare (iterable, refused), and a number (not iterable).
    data = crafted(by_group(ENTRIES))
    expected = (
        "expected an iterable of snapshots (bytes, binary streams, snapshot results or "
        "handles with open()), got {}"
    )
    assert _restore_refusal(data) == (InvalidArgumentError, expected.format("bytes"))
    assert _restore_refusal(42) == (InvalidArgumentError, expected.format("int"))


@pytest.mark.kills(module="cowstate.heap_backend")
def test_restore_from_no_snapshots_is_refused() -> None:
    # heap_backend.HeapKeyedStateBackend.restore 5-12.
    assert _restore_refusal(iter([])) == (
        InvalidArgumentError,
        "expected at least one snapshot to restore from, got none: restore([]) would "
        "empty every state; restore the snapshot result of an empty backend for that",
    )


@pytest.mark.kills(module="cowstate.heap_backend")
def test_restore_refuses_what_is_not_a_snapshot() -> None:
    # heap_backend._open_snapshot 30-31.
    assert _restore_refusal([crafted(by_group(ENTRIES)), 42]) == (
        InvalidArgumentError,
        "expected snapshot bytes, a binary stream, a snapshot result or a handle with "
        "open(), got int",
    )


class _SnapshotFile:
    """A snapshot file on disk, as a handle with ``open()``: the binary streams
    it opened, to see them closed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.opened: list[io.BufferedReader] = []

    def open(self) -> io.BufferedReader:
        stream = open(self.path, "rb")  # noqa: SIM115 - restore() closes it
        self.opened.append(stream)
        return stream


class _SnapshotBytes:
    """A handle whose ``open()`` gives the file's bytes (no stream to close)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def open(self) -> bytes:
        return self.data


@pytest.mark.kills(module="cowstate.heap_backend")
def test_every_kind_of_snapshot_item_restores(tmp_path: Path) -> None:
    # heap_backend._open_snapshot 1-29 and restore 13-20: a result without a
    # file (nothing), bytearray and memoryview bytes, a handle with open()
    # (its stream closed after the restore; or bytes, nothing to close), a
    # binary stream, each restoring the same key groups; and
    # heap_backend.HeapKeyedStateBackend.snapshot 16-28 (an empty backend's
    # snapshot, resolved at once).
    low, high = KeyGroupRange(0, 7), KeyGroupRange(8, 15)
    parts = {
        part: crafted(
            {kg: rows for kg, rows in by_group(ENTRIES).items() if kg in part},
            key_group_range=part,
        )
        for part in (low, high)
    }
    bare = HeapKeyedStateBackend(
        restore_support.FULL, MAX_P, key_serializer=SER, namespace_serializer=SER
    )
    future = bare.snapshot(4, io.BytesIO)  # nothing to write: done at once
    assert (future.checkpoint_id, future.done()) == (4, True)
    empty = future.result(30)
    bare.close()
    assert (empty.checkpoint_id, empty.key_group_range) == (4, restore_support.FULL)
    assert (empty.handle, empty.info, empty.size) == (None, None, 0)
    path = tmp_path / "high"
    path.write_bytes(parts[high])
    on_disk = _SnapshotFile(path)
    for items in (
        [empty, bytearray(parts[low]), memoryview(parts[high])],
        [on_disk, parts[low]],
        [io.BufferedReader(io.BytesIO(parts[high])), memoryview(parts[low]), empty],
        [_SnapshotBytes(parts[low]), _SnapshotBytes(parts[high])],
    ):
        backend = heap()
        restore_support.fill(backend, range(100, 110), tag="mine")
        backend.restore(items)
        assert restore_support.dump(backend) == RESTORED
        backend.close()
    (stream,) = on_disk.opened
    assert stream.closed
    backend = heap()
    restore_support.fill(backend, range(100, 110), tag="mine")
    backend.restore([empty])
    assert restore_support.dump(backend) == {"value": {}}
    backend.close()


def _file_with(**changes: Any) -> bytes:
    """A canonical file of :data:`ENTRIES` whose metadata has ``changes``."""
    stream = io.BytesIO()
    writer = SnapshotWriter(stream, metadata_of().model_copy(update=changes))
    for kg, rows in sorted(raw_blocks(crafted(by_group(ENTRIES))).items()):
        writer.write_key_group(kg, {0: rows})
    writer.finish()
    return stream.getvalue()


@pytest.mark.kills(module="cowstate.heap_backend")
def test_restore_refuses_another_backends_native_file_by_its_format() -> None:
    # heap_backend.HeapKeyedStateBackend._decode_and_fill 6-9.
    data = _file_with(format=SnapshotFormat.ROCKSDB_NATIVE)
    assert _restore_refusal([data]) == (
        IncompatibleSnapshotError,
        "expected a heap or canonical snapshot, got format 'rocksdb-native': a native "
        "snapshot of another backend; restore from a canonical savepoint",
    )


@pytest.mark.kills(module="cowstate.heap_backend")
def test_restore_refuses_a_file_of_another_key_serializer_naming_the_file() -> None:
    # heap_backend.HeapKeyedStateBackend._decode_and_fill 10-17 ("the file", not "the snapshot").
    assert _restore_refusal([_file_with(key_serializer="utf8")]) == (
        SerializerMismatchError,
        "expected the key serializer 'tests.trusted-pickle', the file was written with 'utf8'",
    )
    assert _restore_refusal([_file_with(max_parallelism=32)]) == (
        MaxParallelismMismatchError,
        f"expected a snapshot of max parallelism {MAX_P}, got one of 32: the number of "
        "key groups cannot change on restore",
    )


@pytest.mark.kills(module="cowstate.heap_backend")
def test_restore_refuses_a_file_of_another_namespace_serializer_naming_the_file() -> None:
    # heap_backend.HeapKeyedStateBackend._decode_and_fill 18-25.
    blocks = raw_blocks(crafted(by_group(ENTRIES)))
    data = crafted_raw(blocks, namespace_serializer="utf8")
    assert _restore_refusal([crafted(by_group(ENTRIES)), data]) == (
        SerializerMismatchError,
        "expected state 'value' with the backend's namespace serializer "
        "'tests.trusted-pickle', the file uses 'utf8'",
    )


@pytest.mark.kills(module="cowstate.heap_backend")
def test_a_mapping_given_twice_is_refused_naming_state_key_namespace_and_key_group() -> None:
    # heap_backend.HeapKeyedStateBackend._filled_table 17-31 (E4's message,
    # word for word).
    blocks = by_group(ENTRIES)
    blocks[group_of(7)].append((7, "a", "again"))
    assert _restore_refusal([crafted(blocks)]) == (
        DuplicateMappingError,
        "expected each (key, namespace) once per state, state 'value' holds (7, 'a') "
        f"twice in key group {group_of(7)}",
    )


@pytest.mark.kills(module="cowstate.heap_backend")
def test_a_restore_of_keys_of_another_type_is_refused_naming_state_and_key_group() -> None:
    # heap_backend.HeapKeyedStateBackend._decode_and_fill 46-54 (E6's message).
    entries = [(f"k{i}", "a", i) for i in range(3)]
    first = min(by_group(entries))
    backend = heap()
    backend.set_current_key(1)  # int keys from now on
    before = restore_support.dump(backend)
    with pytest.raises(MixedKeyTypesError) as excinfo:
        backend.restore([crafted(by_group(entries))])
    key = next(k for k, _, _ in entries if group_of(k) == first)
    assert str(excinfo.value) == (
        "expected the keys of a restore to be of one type, without NaN or -0.0, state "
        f"'value', key group {first} has str {key!r}: expected a key of type int (fixed "
        f"by the first key), got str: {key!r}"
    )
    assert restore_support.dump(backend) == before
    backend.close()


# -------------------------- restore: the states restored, registered or absent


@pytest.mark.kills(module="cowstate.heap_backend")
def test_a_restored_state_absent_from_the_next_restore_keeps_its_kind_and_serializer() -> None:
    # heap_backend.HeapKeyedStateBackend._decode_and_fill 69-75: a state restored but
    # never registered, absent from the next restore's files, becomes empty
    # with the meta info it was restored with.
    source = HeapKeyedStateBackend(restore_support.FULL, MAX_P)
    counts: ValueStateDescriptor[int] = ValueStateDescriptor("counts")
    state = source.get_state(counts)
    for key in range(10):
        source.set_current_key(key)
        state.update(key * key)
    with_counts = source.snapshot(1, io.BytesIO).result(30)
    source.close()
    empty = HeapKeyedStateBackend(restore_support.FULL, MAX_P)
    without = empty.snapshot(1, io.BytesIO).result(30)
    empty.close()
    backend = HeapKeyedStateBackend(restore_support.FULL, MAX_P)
    backend.restore([with_counts])
    assert {e.key: e.state for e in backend.entries("counts")} == {k: k * k for k in range(10)}
    backend.restore([without])
    assert backend.state_names == ["counts"]
    assert list(backend.entries("counts")) == []
    meta = backend.table("counts").meta
    assert (meta.name, meta.kind) == ("counts", "value")
    assert serializer_identifier(meta.state_serializer) == "cowstate-value"
    restored = backend.get_state(counts)
    backend.set_current_key(3)
    assert restored.value() is None
    restored.update(7)
    assert [(e.key, e.state) for e in backend.entries("counts")] == [(3, 7)]
    backend.close()


@pytest.mark.kills(module="cowstate.heap_backend")
def test_a_registered_state_absent_from_the_snapshot_is_empty_after_the_restore() -> None:
    # heap_backend._prepare__mutmut_70 (None staged for a registered state the
    # files do not hold): the prepare stages an empty table for it, and the
    # restore replaces what the state held with nothing.
    source = heap()
    restore_support.fill(source, range(10))
    snapshot = io.BytesIO()
    assert source.snapshot(1, lambda: snapshot).result(30).info is not None
    source.close()
    target = heap()
    extra = target.get_state(ValueStateDescriptor("extra", SER))
    target.set_current_key(3)
    extra.update("before the restore")
    target.restore([snapshot.getvalue()])
    assert sorted(target.state_names) == ["extra", "value"]
    assert list(target.entries("extra")) == []
    target.set_current_key(3)
    assert extra.value() is None
    assert restore_support.dump(target)["value"] == {
        (key, ns): state for key in range(10) for ns, state in (("a", f"v{key}"), ("b", [key]))
    }
    target.close()


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_an_unknown_state_name_is_refused_with_the_registered_ones() -> None:
    # keyed_backend.AbstractKeyedStateBackend._holder 1-9, table 1, entries 1-2,
    # get_keys 1-3: the names listed, "none" before any.
    backend = HeapKeyedStateBackend(restore_support.FULL, MAX_P)
    with pytest.raises(UnknownStateError) as excinfo:
        backend.table("nope")
    assert str(excinfo.value) == "expected a registered state name (none), got 'nope'"
    backend.get_state(ValueStateDescriptor("a"))
    state = backend.get_state(ValueStateDescriptor("b"))
    backend.set_current_key(1)
    backend.set_current_namespace("ns")
    state.update(5)
    for call in (backend.table, backend.entries, lambda name: backend.get_keys(name, "ns")):
        with pytest.raises(UnknownStateError) as refused:
            call("nope")
        assert str(refused.value) == "expected a registered state name (a, b), got 'nope'"
    assert backend.get_keys("b", "ns") == [1]
    assert backend.get_keys("b", "other") == []
    assert [(e.key, e.namespace, e.state) for e in backend.entries("b")] == [(1, "ns", 5)]
    assert backend.table("b").meta.name == "b"
    assert backend.num_state_entries() == 1
    backend.close()


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_restored_state_registered_later_takes_the_descriptors_serializer(
    tmp_path: Path,
) -> None:
    # keyed_backend.AbstractKeyedStateBackend.get_state 23-26: a state restored
    # before its descriptor was registered gets the descriptor's meta info when
    # it is, and is checked against it by the next restore.
    source = HeapKeyedStateBackend(restore_support.FULL, MAX_P)
    counts: ValueStateDescriptor[int] = ValueStateDescriptor("counts")
    state = source.get_state(counts)
    for key in range(10):
        source.set_current_key(key)
        state.update(key)
    job = tmp_path / "job"
    location = SnapshotLocation(FileSystem(), str(job / "chk-1"), str(job / "shared"))
    handle = source.snapshot_to(1, location, SnapshotOptions()).result(30)
    source.close()
    source_dir = SnapshotSource(FileSystem(), str(job / "chk-1"))
    backend = HeapKeyedStateBackend(restore_support.FULL, MAX_P)
    backend.restore_from([handle], source_dir)
    restored_meta = backend.table("counts").meta
    assert restored_meta.state_serializer is not counts.serializer
    registered = backend.get_state(counts)
    assert backend.table("counts").meta.state_serializer is counts.serializer
    backend.set_current_key(4)
    assert registered.value() == 4
    (meta,) = handle.states
    other = handle.model_copy(
        update={"states": (meta.model_copy(update={"state_serializer": "utf8"}),)}
    )
    before = {e.key: e.state for e in backend.entries("counts")}
    with pytest.raises(SerializerMismatchError) as excinfo:
        backend.restore_from([other], source_dir)
    assert str(excinfo.value) == (
        "expected the state serializer of 'counts' to be 'cowstate-value', the snapshot "
        "was written with 'utf8'"
    )
    assert {e.key: e.state for e in backend.entries("counts")} == before
    backend.close()


@pytest.mark.kills(module="cowstate.heap_backend")
def test_restored_tables_are_the_backends_own_even_without_entries_here() -> None:
    # heap_backend.HeapKeyedStateBackend._restored_table 2, 10, 28-36 and
    # _new_table: a restored table (one with entries in this backend's key
    # groups, one without) has the backend's key groups, max parallelism, key
    # serializer and the state's meta info; its next snapshot says so and restores.
    def backend(key_groups: KeyGroupRange) -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(key_groups, MAX_P, key_serializer=LongSerializer())

    low, high = KeyGroupRange(0, 7), KeyGroupRange(8, 15)
    source = backend(restore_support.FULL)
    v = source.get_state(ValueStateDescriptor("v"))
    w = source.get_state(ValueStateDescriptor("w"))
    for key in range(-20, 20):
        source.set_current_key(key)
        v.update(key)
        if source.current_key_group in high:
            w.update(-key)
    result = source.snapshot(1, io.BytesIO).result(30)
    source.close()
    target = backend(low)
    target.restore([result])
    expected = {
        name: {(e.key, e.namespace): e.state for e in target.entries(name)} for name in "vw"
    }
    assert expected["v"] and not expected["w"]
    for name in ("v", "w"):
        table = target.table(name)
        assert (table.key_group_range, table.max_parallelism) == (low, MAX_P)
        assert (table.meta.name, table.meta.kind) == (name, "value")
        assert all(table.key_group_of(key) in low for key, _ in expected["v"])
    again = target.snapshot(2, io.BytesIO).result(30)
    target.close()
    assert again.info is not None
    metadata = again.info.metadata
    assert (metadata.key_serializer, metadata.key_group_range) == ("int64", (0, 7))
    assert [state.name for state in metadata.states] == ["v", "w"]
    copy = backend(low)
    copy.restore([again])
    assert {
        name: {(e.key, e.namespace): e.state for e in copy.entries(name)} for name in "vw"
    } == expected
    copy.close()


@pytest.mark.kills(module="cowstate.heap_backend")
def test_an_unregistered_state_restores_with_the_backends_namespace_serializer() -> None:
    # heap_backend.HeapKeyedStateBackend._decode_and_fill 38 and 45: namespaces of a
    # state no descriptor names are read with the backend's namespace serializer
    # (a file cannot choose one: this one is not even built in).
    def backend() -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(
            restore_support.FULL, MAX_P, key_serializer=SER, namespace_serializer=SER
        )

    source = backend()
    counts: ValueStateDescriptor[int] = ValueStateDescriptor("counts")
    state = source.get_state(counts)
    for key in range(10):
        source.set_current_key(key)
        source.set_current_namespace(("window", key % 3))
        state.update(key)
    result = source.snapshot(1, io.BytesIO).result(30)
    source.close()
    target = backend()
    target.restore([result])
    assert {(e.key, e.namespace): e.state for e in target.entries("counts")} == {
        (k, ("window", k % 3)): k for k in range(10)
    }
    assert target.table("counts").meta.namespace_serializer is SER
    target.close()


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_state_registered_again_must_be_the_same_kind_and_serializer() -> None:
    # keyed_backend.AbstractKeyedStateBackend._check_same_state 1-8, get_state
    # 1-5 (what is not a descriptor) and __repr__ 1.
    backend = heap()
    with pytest.raises(StateRegistrationError) as kind:
        backend.get_state(ListStateDescriptor("value", serializer=SER))
    assert str(kind.value) == (
        "expected state 'value' to be registered again as a value state, got a list state "
        "descriptor"
    )
    with pytest.raises(StateRegistrationError) as serializer:
        backend.get_state(ValueStateDescriptor("value"))
    assert str(serializer.value) == (
        "expected state 'value' with serializer 'tests.trusted-pickle', got 'cowstate-value'"
    )
    with pytest.raises(InvalidArgumentError) as other:
        backend.get_state(42)  # type: ignore[arg-type]
    assert str(other.value) == "expected a state descriptor, got int"
    assert repr(backend) == (
        f"<HeapKeyedStateBackend KeyGroupRange(0, 15) of {MAX_P}, states ['value']>"
    )
    backend.close()


@pytest.mark.kills(module="cowstate.keyed_backend")
def test_a_state_handle_taken_before_a_restore_reads_the_restored_state(
    tmp_path: Path,
) -> None:
    # keyed_backend.AbstractKeyedStateBackend._install_tables 1-4: the restore
    # swaps the table of the registered state's holder, which the handles hold.
    backend, staged, _ = _prepared(tmp_path)
    handle = backend.get_state(restore_support.VALUE)
    staged.commit()
    backend.set_current_key(3)
    backend.set_current_namespace("a")
    assert handle.value() == "restored3"
    handle.update("changed")
    assert backend.get_state(restore_support.VALUE).value() == "changed"
    backend.close()


# ---------------------- restore: the restored tables' capacities and factories


@pytest.mark.kills(module="cowstate.heap_backend")
@pytest.mark.parametrize(("entries", "capacity"), [(95, 128), (194, 512)])
def test_a_restored_key_groups_map_holds_its_entries_without_growing(
    entries: int, capacity: int
) -> None:
    # heap_backend._capacity_for 3 and 5 (`entries - entries // 3`,
    # `entries // 4`: maps too small for what is put into them, which grow --
    # start an incremental rehash -- while the restore fills them). One key
    # group, so the capacity is that of its entries (no skew averaging).
    # 194 entries need 512 buckets (256 hold 3/4 * 256 + 1 = 193); 95 get the
    # default capacity.
    one = KeyGroupRange(0, 0)
    value: ValueStateDescriptor[int] = ValueStateDescriptor("v")
    source = HeapKeyedStateBackend(one, 1)
    state = source.get_state(value)
    for key in range(entries):
        source.set_current_key(key)
        state.update(key)
    result = source.snapshot(1, io.BytesIO).result(30)
    source.close()
    target = HeapKeyedStateBackend(one, 1)
    target.restore([result])
    internals = describe(target.table("v").state_map(0))
    assert (internals.capacity, internals.threshold) == (capacity, capacity * 3 // 4)
    assert not internals.is_rehashing
    assert internals.primary_size == entries
    assert {e.key: e.state for e in target.entries("v")} == {k: k for k in range(entries)}
    target.close()


def _keys_in(key_group: int, count: int, max_parallelism: int) -> list[int]:
    keys: list[int] = []
    key = 0
    while len(keys) < count:
        if assign_to_key_group(key, max_parallelism) == key_group:
            keys.append(key)
        key += 1
    return keys


@pytest.mark.kills(module="cowstate.heap_backend")
@pytest.mark.parametrize(
    ("sizes", "capacities"),
    [
        # 3 groups: 512 * 3 == 4 * 288 + 128 * 3, not skewed: every map is sized
        # for the biggest key group.
        ([288, 0, 0], [512, 512, 512]),
        # 3 groups: 512 * 3 > 4 * 240 + 128 * 3, skewed: every map sized for the
        # mean (80 entries: the default 128), the biggest grows.
        ([200, 40, 0], [None, 128, 128]),
        # 4 groups: skewed, the mean (325 entries) needs 512.
        ([1000, 100, 100, 100], [None, 512, 512, 512]),
    ],
    ids=["even", "skewed", "skewed-big-mean"],
)
def test_a_restored_table_sizes_its_maps_for_the_biggest_key_group_unless_skewed(
    sizes: list[int], capacities: list[int | None]
) -> None:
    # heap_backend.HeapKeyedStateBackend._restored_table 11-27 (the skew rule:
    # capacity * groups > 4 * entries + DEFAULT_CAPACITY * groups).
    groups = len(sizes)
    whole = KeyGroupRange(0, groups - 1)
    value: ValueStateDescriptor[int] = ValueStateDescriptor("v")
    source = HeapKeyedStateBackend(whole, groups)
    state = source.get_state(value)
    expected = {}
    for key_group, size in enumerate(sizes):
        for key in _keys_in(key_group, size, groups):
            source.set_current_key(key)
            state.update(key)
            expected[key] = key
    result = source.snapshot(1, io.BytesIO).result(30)
    source.close()
    target = HeapKeyedStateBackend(whole, groups)
    target.restore([result])
    for key_group, capacity in enumerate(capacities):
        if capacity is not None:
            internals = describe(target.table("v").state_map(key_group))
            assert (internals.capacity, internals.is_rehashing) == (capacity, False)
    assert {e.key: e.state for e in target.entries("v")} == expected
    target.close()


def _cow_table(
    key_group_range: KeyGroupRange,
    max_parallelism: int,
    *,
    meta: StateMetaInfo,
    key_serializer: StateSerializer,
) -> StateTable[Any, Any, Any]:
    """A table factory that is not a table class: it takes no ``initial_capacity``."""
    return CopyOnWriteStateTable(
        key_group_range, max_parallelism, meta=meta, key_serializer=key_serializer
    )


@pytest.mark.kills(module="cowstate.heap_backend")
def test_a_factory_function_makes_the_restored_tables_as_it_is() -> None:
    # heap_backend.HeapKeyedStateBackend._restored_table 2-9: only a table class
    # of ours is asked for an initial capacity.
    source = heap()
    restore_support.fill(source, range(40))
    expected = restore_support.dump(source)
    result = source.snapshot(1, io.BytesIO).result(30)
    source.close()
    backend = HeapKeyedStateBackend(
        restore_support.FULL, MAX_P, _cow_table, key_serializer=SER, namespace_serializer=SER
    )
    backend.get_state(restore_support.VALUE)
    backend.restore([result])
    assert restore_support.dump(backend) == expected
    table = backend.table("value")
    assert (table.meta.name, table.meta.state_serializer) == ("value", SER)
    assert describe(table.state_map(0)).capacity == 128
    backend.close()
