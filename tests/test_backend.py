"""The heap keyed state backend: states, registration, asynchronous snapshots
(success, failure, cancellation and what each releases), restore and its
refusals, with the Flink bugs the design answers (FLINK-6207, -9060, -9269,
-13469) as named regression tests."""

from __future__ import annotations

import copy
import gc
import io
import random
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
from cowstate.keyed_state import VOID_NAMESPACE, AggregatingState, ListState
from cowstate.maps import c_map_class
from cowstate.nested_table import NestedMapsStateTable
from cowstate.serializers import ImmutableSerializer, IntSerializer, StringSerializer
from cowstate.snapshot import SnapshotReader, read_snapshot
from cowstate.state_table import CopyOnWriteStateTable
from cowstate_model.backend import ReferenceKeyedStateBackend
from cowstate_spec.backends import BACKENDS, BackendImplementation, SumCount, add_ints
from cowstate_spec.cmap_view import MAP_CLASSES, MapView

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
