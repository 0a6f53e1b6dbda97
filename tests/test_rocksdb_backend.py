"""The RocksDB keyed state backend on a real embedded RocksDB: the state API, the
table's argument checks, incremental checkpoints and the base rules (Flink's
RocksIncrementalSnapshotStrategyTest scenarios), native and canonical
savepoints, restores with rescaling between backends, refusals that leave
the backend as it was, and cancellation and failure releasing everything;
what construction, ``restore`` and ``snapshot_to`` refuse and say, word for
word. The tests marked ``kills`` were written to kill mutants of
``cowstate.rocksdb.backend`` (``make mutate SCOPE=checkpoint``; their comments
name the mutants); they use the restore tests' backends
(:mod:`restore_support`: 16 key groups, trusted-pickle serializers)."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import restore_support
from rocksdict import Checkpoint, Options, Rdict

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import (
    FileHandle,
    KeyedStateHandle,
    SnapshotOptions,
    StateInfo,
)
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.checkpoint.protocol import CheckpointingBackend
from cowstate.checkpoint.storage import CheckpointStorage
from cowstate.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from cowstate.errors import (
    BackendClosedError,
    CorruptCheckpointError,
    IncompatibleSnapshotError,
    InvalidArgumentError,
    KeyGroupOutOfRangeError,
    KeyTypeMismatchError,
    MaxParallelismMismatchError,
    MixedKeyTypesError,
    NoneStateError,
    SerializerMismatchError,
    SnapshotCancelledError,
    SnapshotFormatError,
    SnapshotWriteError,
    StateRegistrationError,
    TransformFunctionError,
    UnhashableKeyError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import (
    KeyGroupRange,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from cowstate.keyed_backend import AbstractKeyedStateBackend
from cowstate.keyed_state import VOID_NAMESPACE
from cowstate.rocksdb import backend as rocks_backend
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend, column_family_name
from cowstate.rocksdb.table import RocksDBStateTable, decode_rocks_key, encode_rocks_key
from cowstate.serializers import IntSerializer, StringSerializer
from cowstate.state_meta import SnapshotFormat
from cowstate_spec.backends import SumCount, add_ints

MAX_P = 128
FULL = KeyGroupRange(0, MAX_P - 1)
VALUE: ValueStateDescriptor[Any] = ValueStateDescriptor("value", default=[])
LIST = ListStateDescriptor("list")
MAP = MapStateDescriptor("map")
REDUCING: ReducingStateDescriptor[int] = ReducingStateDescriptor(
    "reducing", reduce_function=add_ints
)
AGGREGATING = AggregatingStateDescriptor("aggregating", aggregate_function=SumCount())
ALL = (VALUE, LIST, MAP, REDUCING, AGGREGATING)

Contents = dict[str, dict[tuple[Any, Any], Any]]
Factory = Callable[..., RocksDBKeyedStateBackend]
FS = FileSystem()


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Factory]:
    """Makes backends under ``tmp_path``; closes them all at the end."""
    made: list[RocksDBKeyedStateBackend] = []

    def factory(
        key_group_range: KeyGroupRange = FULL, max_parallelism: int = MAX_P, **kwargs: Any
    ) -> RocksDBKeyedStateBackend:
        kwargs.setdefault("local_dir", tmp_path / "local")
        backend = RocksDBKeyedStateBackend(key_group_range, max_parallelism, **kwargs)
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend.close()


@pytest.fixture
def backend(make: Factory) -> RocksDBKeyedStateBackend:
    return make()


def checkpoint_location(
    root: Path, checkpoint_id: int, filesystem: FileSystem = FS
) -> SnapshotLocation:
    return SnapshotLocation(filesystem, str(root / f"chk-{checkpoint_id}"), str(root / "shared"))


def savepoint_location(directory: Path) -> SnapshotLocation:
    return SnapshotLocation(FS, str(directory), None)


def source(directory: Path) -> SnapshotSource:
    return SnapshotSource(FS, str(directory))


def checkpoint(
    b: RocksDBKeyedStateBackend, root: Path, checkpoint_id: int, *, full: bool = False
) -> KeyedStateHandle:
    options = SnapshotOptions(kind="checkpoint", full=full)
    return b.snapshot_to(checkpoint_id, checkpoint_location(root, checkpoint_id), options).result(
        timeout=30
    )


def savepoint(
    b: AbstractKeyedStateBackend[Any],
    directory: Path,
    checkpoint_id: int,
    savepoint_format: Any = "native",
) -> KeyedStateHandle:
    options = SnapshotOptions(kind="savepoint", format=savepoint_format)
    assert isinstance(b, CheckpointingBackend)
    return b.snapshot_to(checkpoint_id, savepoint_location(directory), options).result(timeout=30)


def dump(b: AbstractKeyedStateBackend[Any]) -> Contents:
    return {name: {(k, n): s for k, n, s in b.entries(name)} for name in b.state_names}


def fill(b: AbstractKeyedStateBackend[Any], keys: range = range(300), *, tag: int = 0) -> None:
    """One entry per key in each of the five states (two namespaces for values)."""
    value, lst, m = b.get_state(VALUE), b.get_state(LIST), b.get_state(MAP)
    reducing, aggregating = b.get_state(REDUCING), b.get_state(AGGREGATING)
    for key in keys:
        if assign_to_key_group(key, b.max_parallelism) not in b.key_group_range:
            continue
        b.set_current_key(key)
        b.set_current_namespace(VOID_NAMESPACE)
        value.update([key, tag])
        lst.add_all([key, -key])
        m.put(f"u{key % 3}", key)
        reducing.add(key)
        aggregating.add(key)
        b.set_current_namespace("w")
        value.update(key + tag)


def change_a_few(b: AbstractKeyedStateBackend[Any], keys: range = range(5)) -> None:
    value = b.get_state(VALUE)
    for key in keys:
        b.set_current_key(key)
        b.set_current_namespace(VOID_NAMESPACE)
        value.update(["changed", key])


def ssts(handle: KeyedStateHandle) -> dict[str, FileHandle]:
    return {
        f.local_name: f
        for f in handle.files
        if f.local_name is not None and f.local_name.endswith(".sst")
    }


def owned(contents: Contents, key_group_range: KeyGroupRange) -> Contents:
    return {
        name: {
            kn: s
            for kn, s in states.items()
            if assign_to_key_group(kn[0], MAX_P) in key_group_range
        }
        for name, states in contents.items()
    }


def snapshot_files(root: Path) -> list[str]:
    """Every file of the snapshot directories the tests use under ``root``."""
    return [path for name in ("chk-1", "shared", "sp") for path in FS.list_files(str(root / name))]


def open_files_under(path: Path) -> list[str]:
    """The files under ``path`` this process holds open (Linux's /proc)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(path)):
                found.append(target)
    return found


class Blocker:
    """A FileSystem hook that holds the writer at its ``at``-th write until
    released, and optionally fails there instead."""

    def __init__(self, at: int = 1, fail: bool = False) -> None:
        self.at = at
        self.fail = fail
        self.writes = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, event: str, *args: Any) -> None:
        if event != "write":
            return
        self.writes += 1
        if self.writes == self.at:
            self.entered.set()
            if self.fail:
                raise OSError("disk full (injected)")
            assert self.release.wait(20), "the test never released the writer"


# ------------------------------------------------------------------- states


def test_returned_states_are_copies(backend: RocksDBKeyedStateBackend) -> None:
    value, lst, m = backend.get_state(VALUE), backend.get_state(LIST), backend.get_state(MAP)
    aggregating = backend.get_state(AGGREGATING)
    backend.set_current_key(1)
    value.update([1])
    lst.add(1)
    m.put("k", [1])
    aggregating.add(3)
    value.value().append("mutated")
    lst.get().append("mutated")
    m.get("k").append("mutated")
    value.value().clear()
    assert value.value() == [1] and lst.get() == [1] and m.get("k") == [1]
    assert value.value() is not value.value()
    table = backend.table("aggregating")
    assert isinstance(table, RocksDBStateTable)
    stored = table.get(1, VOID_NAMESPACE)
    assert stored == [3, 1]
    stored[0] = 99
    assert aggregating.get() == (3, 1)
    assert VALUE.default == []  # the default is copied too


def test_registration_conflicts(backend: RocksDBKeyedStateBackend) -> None:
    backend.get_state(VALUE)
    with pytest.raises(StateRegistrationError, match="as a value state, got a list state"):
        backend.get_state(ListStateDescriptor("value"))
    with pytest.raises(StateRegistrationError, match="serializer 'cowstate-value', got 'utf8'"):
        backend.get_state(ValueStateDescriptor("value", serializer=StringSerializer()))
    backend.get_state(ValueStateDescriptor("value"))  # same kind and serializer
    assert backend.state_names == ["value"]


def test_one_column_family_per_state(backend: RocksDBKeyedStateBackend) -> None:
    for descriptor in ALL:
        backend.get_state(descriptor)
    backend.get_state(ValueStateDescriptor("odd name/é"))
    from rocksdict import Rdict

    families = set(Rdict.list_cf(str(backend.db_path), Options(raw_mode=True)))
    expected = {column_family_name(d.name) for d in ALL} | {
        "default",
        column_family_name("odd name/é"),
    }
    assert families == expected
    assert column_family_name("value") == "state.value"
    assert column_family_name("odd name/é").startswith("state-hex.")
    assert column_family_name("default") != "default"


def test_key_layout_makes_key_groups_contiguous() -> None:
    keys = [
        encode_rocks_key(kg, key, ns)
        for kg, key, ns in [(3, b"zz", b""), (1, b"\xff" * 9, b"n"), (2, b"", b"x"), (1, b"a", b"")]
    ]
    assert [decode_rocks_key(k)[0] for k in sorted(keys)] == [1, 1, 2, 3]
    assert decode_rocks_key(encode_rocks_key(7, b"key", b"ns")) == (7, b"key", b"ns")
    assert decode_rocks_key(encode_rocks_key(7, b"", b"key")) == (7, b"", b"key")


def test_table_api_and_its_refusals(backend: RocksDBKeyedStateBackend) -> None:
    backend.get_state(VALUE)
    table = backend.table("value")
    assert isinstance(table, RocksDBStateTable)
    assert table.key_group_range == FULL and table.max_parallelism == MAX_P
    assert table.meta.name == "value" and table.key_serializer is backend.key_serializer
    table.put("a", "ns", 1)
    assert table.put_and_get_old("a", "ns", 2) == 1
    assert table.put_and_get_old("b", "ns", 3) is None
    table.put("a", "other", 4)
    assert table.contains_key("a", "ns") and ("a", "ns") in table
    assert not table.contains_key("z", "ns")
    assert len(table) == 3 and table.size_of_namespace("ns") == 2
    assert sorted(table.keys("ns")) == ["a", "b"]
    groups = [table.key_group_of(e.key) for e in table]
    assert groups == sorted(groups)  # key-group order
    assert table.remove_and_get_old("b", "ns") == 3
    assert table.remove_and_get_old("b", "ns") is None
    table.remove("nothing", "ns")

    def plus(old: Any, value: int) -> Any:
        return old + value

    table.transform("a", "ns", 10, plus)
    assert table.get("a", "ns") == 12
    kg = table.key_group_of("a")
    assert [e.key for e in table.entries_in_key_group(kg)] == ["a", "a"]

    def boom(old: Any, v: Any) -> Any:
        raise ArithmeticError("no")

    with pytest.raises(TransformFunctionError, match="ArithmeticError: no"):
        table.transform("a", "ns", 1, boom)
    with pytest.raises(NoneStateError, match="the mapping is unchanged"):
        table.transform("a", "ns", 1, lambda old, v: None)
    assert table.get("a", "ns") == 12
    with pytest.raises(InvalidArgumentError, match="expected a key, got None"):
        table.get(None, "ns")
    with pytest.raises(NoneStateError, match="use remove"):
        table.put("a", "ns", None)
    with pytest.raises(UnhashableKeyError, match="hashable key, got list"):
        table.put(["a"], "ns", 1)
    with pytest.raises(UnhashableKeyError, match="hashable namespace, got dict"):
        table.get("a", {})
    with pytest.raises(KeyGroupOutOfRangeError, match="key group 200"):
        table.get("a", "ns", key_group=200)
    with pytest.raises(InvalidArgumentError, match="int key_group, got str"):
        table.get("a", "ns", key_group="1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="a \\(key, namespace\\) tuple"):
        _ = "a" in table
    with pytest.raises(InvalidArgumentError, match="StateMetaInfo"):
        table.set_meta_info("meta")  # type: ignore[arg-type]
    assert len(table) == 2 and table.get("a", "other") == 4


def test_keys_outside_a_sub_range_are_refused(make: Factory) -> None:
    b = make(KeyGroupRange(0, 63))
    value = b.get_state(VALUE)
    outside = next(k for k in range(100) if assign_to_key_group(k, MAX_P) >= 64)
    with pytest.raises(KeyGroupOutOfRangeError):
        b.set_current_key(outside)
    table = b.table("value")
    with pytest.raises(KeyGroupOutOfRangeError):
        table.put(outside, VOID_NAMESPACE, 1)
    inside = next(k for k in range(100) if assign_to_key_group(k, MAX_P) < 64)
    b.set_current_key(inside)
    value.update(1)
    assert dump(b) == {"value": {(inside, VOID_NAMESPACE): 1}}


# It absorbed test_options_of_another_type_are_refused_naming_it: backend.__init__
# 19 (the type the refusal of options names).
@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_options_without_raw_mode_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="raw_mode=True"):
        RocksDBKeyedStateBackend(FULL, MAX_P, local_dir=tmp_path, options=Options())
    assert os.listdir(tmp_path) == []
    with pytest.raises(InvalidArgumentError, match=r"rocksdict.Options"):
        RocksDBKeyedStateBackend(FULL, MAX_P, options="fast")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError) as excinfo:
        RocksDBKeyedStateBackend(FULL, MAX_P, local_dir=tmp_path / "local", options="raw")  # type: ignore[arg-type]
    assert str(excinfo.value) == "expected rocksdict.Options(raw_mode=True) or None, got str"
    assert not (tmp_path / "local").exists() or not any((tmp_path / "local").iterdir())


def test_close_releases_everything_and_refuses_more_work(tmp_path: Path) -> None:
    b = RocksDBKeyedStateBackend(FULL, MAX_P)
    local = b.instance_path.parent
    fill(b, range(20))
    table = b.table("value")
    entries = iter(table)  # an unfinished iteration holds nothing
    next(entries)
    assert local.exists()
    b.close()
    b.close()  # idempotent
    assert not local.exists()  # the backend's own temp dir is gone
    with pytest.raises(BackendClosedError, match="replaced by a restore"):
        table.get(1, VOID_NAMESPACE)
    with pytest.raises(BackendClosedError):
        b.get_state(ValueStateDescriptor("new"))
    with pytest.raises(BackendClosedError):
        b.snapshot_to(1, checkpoint_location(tmp_path, 1), SnapshotOptions())
    with pytest.raises(BackendClosedError):
        b.restore([], source(tmp_path))
    kept = RocksDBKeyedStateBackend(FULL, MAX_P, local_dir=tmp_path / "mine")
    kept.close()
    assert os.listdir(tmp_path / "mine") == []  # a given local_dir stays, emptied


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_close_and_restore_release_every_file(make: Factory, tmp_path: Path) -> None:
    b = make()
    fill(b, range(100))
    handle = checkpoint(b, tmp_path, 1)
    old_table = b.table("value")
    entries = iter(old_table)
    next(entries)  # an unfinished iteration
    old = b.db_path
    assert open_files_under(old)
    b.restore_from([handle], source(tmp_path / "chk-1"))
    assert open_files_under(old) == [] and not old.exists()
    with pytest.raises(BackendClosedError, match="replaced by a restore"):
        iter(old_table)  # the restore replaced it
    assert len(list(entries)) == 199  # the chunk it had read stays readable
    assert b.table("value") is not old_table and open_files_under(b.db_path)
    instance = b.instance_path
    b.close()
    assert open_files_under(instance) == [] and not instance.exists()
    dropped = RocksDBKeyedStateBackend(FULL, MAX_P)
    fill(dropped, range(10))
    directory = dropped.instance_path.parent
    del dropped  # never closed: the finalizer cleans up
    gc.collect()
    assert not directory.exists()


def test_custom_serializers_round_trip(make: Factory, tmp_path: Path) -> None:
    b = make(key_serializer=IntSerializer(), namespace_serializer=StringSerializer())
    value = b.get_state(ValueStateDescriptor("v", serializer=StringSerializer()))
    for key in range(50):
        b.set_current_key(key)
        b.set_current_namespace(f"ns{key % 2}")
        value.update(f"s{key}")
    handle = savepoint(b, tmp_path / "sp", 1, "canonical")
    assert handle.key_serializer == "int32" and handle.states[0].state_serializer == "utf8"
    heap = HeapKeyedStateBackend(
        FULL, MAX_P, key_serializer=IntSerializer(), namespace_serializer=StringSerializer()
    )
    heap.get_state(ValueStateDescriptor("v", serializer=StringSerializer()))
    heap.restore_from([handle], source(tmp_path / "sp"))
    assert dump(heap) == dump(b) and len(dump(b)["v"]) == 50
    plain = make()
    with pytest.raises(SerializerMismatchError, match=r"key serializer 'cowstate-value'.*'int32'"):
        plain.restore_from([handle], source(tmp_path / "sp"))


# ------------------------- a backend's directories, from construction to close


# backend.__init__ 37-39 (the temporary directory's prefix), 44 (the
# instance directory's name).
@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_backend_without_a_local_dir_makes_a_named_temporary_one() -> None:
    backend = RocksDBKeyedStateBackend(restore_support.FULL, restore_support.MAX_P)
    try:
        instance = backend.instance_path
        assert instance.parent.parent == Path(tempfile.gettempdir()).absolute()
        assert instance.parent.name.startswith("cowstate-rocksdb-")
        assert re.fullmatch(r"cowstate-rocksdb-[0-9a-f]{12}", instance.name)
    finally:
        backend.close()
    assert not instance.parent.exists()


# backend.__init__ 53 (the first confirmed id before any: -1 says none).
@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_fresh_backend_has_no_confirmed_checkpoint(tmp_path: Path) -> None:
    backend = restore_support.rocks(tmp_path / "local")
    try:
        assert backend.last_completed_checkpoint_id == -1
        assert backend.incremental_base == {}
    finally:
        backend.close()


# backend._release_resources 1 (closing a database that cannot flush raises
# instead of the close going on to release the rest).
@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_backend_whose_local_directory_vanished_still_closes(tmp_path: Path) -> None:
    backend = restore_support.rocks(tmp_path / "local")
    restore_support.fill(
        backend, range(50)
    )  # in the memtable: closing flushes it (writes skip the WAL)
    table = backend.table("value")
    shutil.rmtree(tmp_path / "local")
    backend.close()
    with pytest.raises(BackendClosedError):
        table.get(1, "a")
    assert not (tmp_path / "local").exists()


# backend.__init__ 72, 76 (the finalizer of a backend dropped without close()
# given no instance directory to remove).
@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_backend_dropped_without_close_leaves_no_directory(tmp_path: Path) -> None:
    local = tmp_path / "local"
    backend = restore_support.rocks(local)
    restore_support.fill(backend, range(20))
    instance = backend.instance_path
    assert instance.is_dir()
    del backend
    gc.collect()
    assert not instance.exists()
    assert local.is_dir()  # the caller's directory stays


# ---------------------------------------------------- incremental checkpoints


def test_first_checkpoint_full_then_only_new_ssts(
    backend: RocksDBKeyedStateBackend, tmp_path: Path
) -> None:
    fill(backend, range(2000))
    first = checkpoint(backend, tmp_path, 1)
    assert first.backend == "rocksdb" and first.format == "rocksdb-native"
    assert first.checkpointed_size == first.full_size > 0
    assert first.backend_uid == backend.backend_uid
    assert [s.name for s in first.states] == [d.name for d in ALL]
    first_ssts = ssts(first)
    assert len(first_ssts) == 5  # one flushed SST per column family
    assert all(
        f.scope == "shared" and f.path.startswith(f"{tmp_path.name}/shared/")
        for f in first_ssts.values()
    )
    private = [f for f in first.files if f not in first_ssts.values()]
    assert {f.local_name for f in private} >= {"CURRENT"}
    assert any((f.local_name or "").startswith("MANIFEST-") for f in private)
    assert all(f.scope == "exclusive" and f.path.startswith("rocksdb-0-127/") for f in private)
    assert os.listdir(backend.local_checkpoints_path) == []
    backend.notify_checkpoint_complete(1)
    assert backend.incremental_base == first_ssts

    change_a_few(backend)
    second = checkpoint(backend, tmp_path, 2)
    second_ssts = ssts(second)
    reused = {n: f for n, f in second_ssts.items() if n in first_ssts}
    assert reused == first_ssts  # nothing compacted: all five reused
    assert all(second_ssts[n] is first_ssts[n] for n in reused)  # the base's own handles
    new = set(second_ssts) - set(first_ssts)
    assert len(new) == 1  # only the value state's flush
    uploaded = sum(f.size for f in second.files if f.local_name not in first_ssts)
    assert second.checkpointed_size == uploaded < second.full_size
    assert second.full_size == sum(f.size for f in second.files)
    assert second.checkpointed_size < first.checkpointed_size
    restored = RocksDBKeyedStateBackend(FULL, MAX_P, local_dir=tmp_path / "r")
    try:
        restored.restore_from([second], source(tmp_path / "chk-2"))
        assert dump(restored) == dump(backend)
    finally:
        restored.close()


def test_pending_checkpoint_is_never_a_base(
    backend: RocksDBKeyedStateBackend, tmp_path: Path
) -> None:
    fill(backend, range(200))
    first = checkpoint(backend, tmp_path, 1)  # never confirmed
    change_a_few(backend)
    second = checkpoint(backend, tmp_path, 2)
    assert backend.incremental_base == {}
    assert not {f.path for f in second.shared_files} & {f.path for f in first.shared_files}
    assert second.checkpointed_size == second.full_size
    assert backend.recorded_checkpoints == [1, 2]


def test_aborted_checkpoint_is_dropped_and_never_a_base(
    backend: RocksDBKeyedStateBackend, tmp_path: Path
) -> None:
    fill(backend, range(200))
    first = checkpoint(backend, tmp_path, 1)
    backend.notify_checkpoint_complete(1)
    change_a_few(backend)
    second = checkpoint(backend, tmp_path, 2)
    backend.notify_checkpoint_aborted(2)
    assert backend.recorded_checkpoints == [1]
    backend.notify_checkpoint_complete(2)  # unknown now: ignored
    assert backend.last_completed_checkpoint_id == 1
    change_a_few(backend, range(5, 8))
    third = checkpoint(backend, tmp_path, 3)
    second_only = set(ssts(second)) - set(ssts(first))
    assert second_only and all(ssts(third)[n] is not ssts(second)[n] for n in second_only)
    assert {n: f for n, f in ssts(third).items() if f in ssts(first).values()} == ssts(first)
    backend.notify_checkpoint_aborted(1)  # a confirmed one cannot abort
    assert backend.incremental_base == ssts(first)


def test_abort_before_the_writer_finishes_drops_the_record(make: Factory, tmp_path: Path) -> None:
    b = make()
    fill(b, range(50))
    blocker = Blocker()
    future = b.snapshot_to(
        1, checkpoint_location(tmp_path, 1, FileSystem(hooks=blocker)), SnapshotOptions()
    )
    assert blocker.entered.wait(10)
    b.notify_checkpoint_aborted(1)
    blocker.release.set()
    future.result(timeout=10)
    b.notify_checkpoint_complete(1)
    assert b.recorded_checkpoints == [] and b.incremental_base == {}


def test_savepoint_never_changes_the_base(
    backend: RocksDBKeyedStateBackend, tmp_path: Path
) -> None:
    """Flink's RocksIncrementalSnapshotStrategyTest: checkpoint, savepoint,
    checkpoint -- the last reuses what it would have without the savepoint."""
    fill(backend, range(300))
    first = checkpoint(backend, tmp_path, 1)
    backend.notify_checkpoint_complete(1)
    change_a_few(backend)
    savepoint(backend, tmp_path / "sp-2", 2)
    savepoint(backend, tmp_path / "sp-3", 3, "canonical")
    backend.notify_checkpoint_complete(2)  # stop-with-savepoint: ignored
    backend.notify_checkpoint_complete(3)
    assert backend.last_completed_checkpoint_id == 1
    assert backend.recorded_checkpoints == [1]
    assert backend.incremental_base == ssts(first)
    change_a_few(backend, range(5, 9))
    fourth = checkpoint(backend, tmp_path, 4)
    reused = {n: f for n, f in ssts(fourth).items() if f in ssts(first).values()}
    assert reused == ssts(first)
    resolved = {source(tmp_path / "chk-4").path(f) for f in fourth.files}
    assert all(p.startswith((str(tmp_path / "chk-4"), str(tmp_path / "shared"))) for p in resolved)
    assert all(f.path.startswith(("rocksdb-", f"{tmp_path.name}/shared/")) for f in fourth.files)
    assert fourth.checkpointed_size < fourth.full_size


def test_older_completion_notice_is_ignored(
    backend: RocksDBKeyedStateBackend, tmp_path: Path
) -> None:
    fill(backend, range(100))
    checkpoint(backend, tmp_path, 1)
    change_a_few(backend)
    second = checkpoint(backend, tmp_path, 2)
    backend.notify_checkpoint_complete(2)
    backend.notify_checkpoint_complete(1)
    assert backend.last_completed_checkpoint_id == 2
    assert backend.incremental_base == ssts(second)
    assert backend.recorded_checkpoints == [2]


def test_full_checkpoint_uploads_everything_and_becomes_a_base(
    backend: RocksDBKeyedStateBackend, tmp_path: Path
) -> None:
    fill(backend, range(200))
    first = checkpoint(backend, tmp_path, 1)
    backend.notify_checkpoint_complete(1)
    change_a_few(backend)
    full = checkpoint(backend, tmp_path, 2, full=True)
    assert full.checkpointed_size == full.full_size
    assert not {f.path for f in full.shared_files} & {f.path for f in first.shared_files}
    assert set(ssts(first)) < set(ssts(full))  # same local files, uploaded again
    assert backend.incremental_base == ssts(first)  # not a base until confirmed
    backend.notify_checkpoint_complete(2)
    assert backend.incremental_base == ssts(full)
    change_a_few(backend, range(5, 7))
    third = checkpoint(backend, tmp_path, 3)
    assert {n: f for n, f in ssts(third).items() if f in ssts(full).values()} == ssts(full)
    assert not {f.path for f in third.shared_files} & {f.path for f in first.shared_files}


# ------------------------------------------------------------ native savepoints


def test_native_savepoint_is_exclusive_relative_and_movable(
    backend: RocksDBKeyedStateBackend, make: Factory, tmp_path: Path
) -> None:
    fill(backend, range(300))
    handle = savepoint(backend, tmp_path / "sp", 7)
    assert handle.format == "rocksdb-native" and handle.shared_files == ()
    assert handle.checkpointed_size == handle.full_size
    assert ssts(handle)
    for f in handle.files:
        assert f.scope == "exclusive" and f.path.startswith("rocksdb-0-127/")
    assert backend.recorded_checkpoints == []
    shutil.move(str(tmp_path / "sp"), str(tmp_path / "moved"))
    restored = make()
    restored.restore_from([handle], source(tmp_path / "moved"), incremental_base=True)
    assert dump(restored) == dump(backend)
    assert restored.incremental_base == {}  # no shared files: no base
    half = make(KeyGroupRange(64, 127))  # rescaling from a savepoint
    half.restore_from([handle], source(tmp_path / "moved"))
    assert dump(half) == owned(dump(backend), KeyGroupRange(64, 127))
    again = checkpoint(restored, tmp_path, 8)
    assert again.checkpointed_size == again.full_size
    assert not any(f.path.startswith(("moved", "/")) for f in again.files)


# ---------------------------------------------------- canonical savepoints


def rocksdb_savepoints(
    make: Factory, tmp_path: Path, parallelism: int, keys: range
) -> tuple[list[KeyedStateHandle], Contents]:
    handles: list[KeyedStateHandle] = []
    contents: Contents = {}
    for index in range(parallelism):
        kgs = compute_key_group_range_for_operator_index(MAX_P, parallelism, index)
        b = make(kgs)
        fill(b, keys)
        handles.append(savepoint(b, tmp_path / "sp", 1, "canonical"))
        for name, states in dump(b).items():
            contents.setdefault(name, {}).update(states)
    return handles, contents


def heap_savepoints(
    tmp_path: Path, parallelism: int, keys: range
) -> tuple[list[KeyedStateHandle], Contents]:
    handles: list[KeyedStateHandle] = []
    contents: Contents = {}
    for index in range(parallelism):
        kgs = compute_key_group_range_for_operator_index(MAX_P, parallelism, index)
        with HeapKeyedStateBackend(kgs, MAX_P) as b:
            fill(b, keys)
            handles.append(savepoint(b, tmp_path / "sp", 1, "canonical"))
            for name, states in dump(b).items():
                contents.setdefault(name, {}).update(states)
    return handles, contents


RESCALINGS = [(1, 2), (2, 1), (2, 3)]


@pytest.mark.parametrize(("old", "new"), RESCALINGS, ids=lambda p: str(p))
def test_canonical_rocksdb_savepoint_into_heap_with_rescaling(
    make: Factory, tmp_path: Path, old: int, new: int
) -> None:
    handles, contents = rocksdb_savepoints(make, tmp_path, old, range(400))
    assert all(h.backend == "rocksdb" and h.format == "canonical" for h in handles)
    assert len(contents["value"]) == 800
    for index in range(new):
        kgs = compute_key_group_range_for_operator_index(MAX_P, new, index)
        with HeapKeyedStateBackend(kgs, MAX_P) as heap:
            for d in ALL:
                heap.get_state(d)
            heap.restore_from(handles, source(tmp_path / "sp"))
            assert dump(heap) == owned(contents, kgs)


@pytest.mark.parametrize(("old", "new"), RESCALINGS, ids=lambda p: str(p))
def test_canonical_heap_savepoint_into_rocksdb_with_rescaling(
    make: Factory, tmp_path: Path, old: int, new: int
) -> None:
    handles, contents = heap_savepoints(tmp_path, old, range(400))
    seen: Contents = {}
    for index in range(new):
        kgs = compute_key_group_range_for_operator_index(MAX_P, new, index)
        b = make(kgs)
        b.get_state(VALUE)  # registered before the restore
        b.restore_from(handles, source(tmp_path / "sp"), incremental_base=True)
        assert dump(b) == owned(contents, kgs)
        assert b.incremental_base == {}
        for name, states in dump(b).items():
            assert not set(states) & set(seen.get(name, {}))  # each key in one backend
            seen.setdefault(name, {}).update(states)
        reducing = b.get_state(REDUCING)  # restored states work as before
        key = next(k for k, _ in contents["reducing"] if assign_to_key_group(k, MAX_P) in kgs)
        b.set_current_key(key)
        reducing.add(1000)
        assert reducing.get() == contents["reducing"][(key, VOID_NAMESPACE)] + 1000
    assert {n: len(s) for n, s in seen.items()} == {n: len(s) for n, s in contents.items()}


def test_canonical_round_trip_between_rocksdb_backends(make: Factory, tmp_path: Path) -> None:
    source_backend = make()
    fill(source_backend, range(300))
    handle = savepoint(source_backend, tmp_path / "sp", 1, "canonical")
    assert handle.checkpointed_size == handle.full_size == handle.files[0].size
    target = make()
    target.restore_from([handle], source(tmp_path / "sp"))
    assert dump(target) == dump(source_backend)


# ------------------------------------------------------ incompatible formats


def test_native_rocksdb_handle_is_refused_by_the_heap(
    backend: RocksDBKeyedStateBackend, tmp_path: Path
) -> None:
    fill(backend, range(50))
    handle = savepoint(backend, tmp_path / "sp", 1)
    with HeapKeyedStateBackend(FULL, MAX_P) as heap:
        fill(heap, range(10), tag=1)
        before = dump(heap)
        with pytest.raises(
            IncompatibleSnapshotError,
            match=r"rocksdb-native snapshot of the rocksdb backend.*canonical",
        ):
            heap.restore_from([handle], source(tmp_path / "sp"))
        assert dump(heap) == before


def test_heap_handle_is_refused_by_rocksdb(
    backend: RocksDBKeyedStateBackend, tmp_path: Path
) -> None:
    with HeapKeyedStateBackend(FULL, MAX_P) as heap:
        fill(heap, range(50))
        handle = heap.snapshot_to(1, checkpoint_location(tmp_path, 1), SnapshotOptions()).result(
            timeout=10
        )
    fill(backend, range(10), tag=1)
    before = dump(backend)
    db_path = backend.db_path
    with pytest.raises(
        IncompatibleSnapshotError, match=r"heap snapshot of the heap backend.*canonical savepoint"
    ):
        backend.restore_from([handle], source(tmp_path / "chk-1"))
    assert dump(backend) == before and backend.db_path == db_path


# --------------------------------------------------- restores and rescaling


def checkpoints_of(
    make: Factory, tmp_path: Path, parallelism: int, keys: range
) -> tuple[list[KeyedStateHandle], Contents]:
    handles: list[KeyedStateHandle] = []
    contents: Contents = {}
    for index in range(parallelism):
        kgs = compute_key_group_range_for_operator_index(MAX_P, parallelism, index)
        b = make(kgs)
        fill(b, keys)
        handles.append(checkpoint(b, tmp_path, 1))
        for name, states in dump(b).items():
            contents.setdefault(name, {}).update(states)
    return handles, contents


@pytest.mark.parametrize(("old", "new"), [(1, 2), (3, 2)], ids=lambda p: str(p))
def test_rescaling_restore_from_checkpoints(
    make: Factory, tmp_path: Path, old: int, new: int
) -> None:
    handles, contents = checkpoints_of(make, tmp_path, old, range(600))
    seen: Contents = {}
    for index in range(new):
        kgs = compute_key_group_range_for_operator_index(MAX_P, new, index)
        b = make(kgs)
        b.restore_from(handles, source(tmp_path / "chk-1"), incremental_base=True)
        mine = dump(b)
        assert mine == owned(contents, kgs)
        for name, states in mine.items():
            assert all(assign_to_key_group(k, MAX_P) in kgs for k, _ in states)
            assert not set(states) & set(seen.get(name, {}))
            seen.setdefault(name, {}).update(states)
        assert b.incremental_base == {}  # rescaled: no base
        assert b.backend_uid not in {h.backend_uid for h in handles}
        first = checkpoint(b, tmp_path / f"after-{index}", 2)
        assert first.checkpointed_size == first.full_size
        for table_name in b.state_names:  # the dropped ranges stay dropped
            assert {k for k, _, _ in b.entries(table_name)} == {
                k for k, _ in owned(contents, kgs)[table_name]
            }
    assert seen == contents


def test_rescaling_drops_the_other_key_groups_so_nothing_comes_back(
    make: Factory, tmp_path: Path
) -> None:
    """Keys outside a rescaled backend's range must leave its database: else a
    later merge (2 -> 1) takes them from its files after their owner removed them."""
    whole = make()
    fill(whole, range(200))
    before = checkpoint(whole, tmp_path / "a", 1)
    low = make(KeyGroupRange(0, 63))
    high = make(KeyGroupRange(64, 127))
    for b in (low, high):
        b.restore_from([before], source(tmp_path / "a" / "chk-1"))
    gone = next(k for k in range(200) if assign_to_key_group(k, MAX_P) >= 64)
    high.set_current_key(gone)
    for d in ALL:
        high.get_state(d).clear()
    high.set_current_namespace("w")
    high.get_state(VALUE).clear()
    merged = make()
    merged.restore_from(  # one checkpoint of two subtasks: one directory
        [checkpoint(low, tmp_path / "b", 2), checkpoint(high, tmp_path / "b", 2)],
        source(tmp_path / "b" / "chk-2"),
    )
    expected = {
        name: {kn: s for kn, s in states.items() if kn[0] != gone}
        for name, states in dump(whole).items()
    }
    assert dump(merged) == expected


def test_restore_with_the_same_range_seeds_the_base(make: Factory, tmp_path: Path) -> None:
    original = make()
    fill(original, range(300))
    handle = checkpoint(original, tmp_path, 5)
    claimed = make()
    claimed.restore_from([handle], source(tmp_path / "chk-5"), incremental_base=True)
    assert dump(claimed) == dump(original)
    assert claimed.incremental_base == ssts(handle)
    assert claimed.last_completed_checkpoint_id == 5
    assert claimed.backend_uid == handle.backend_uid
    change_a_few(claimed)
    after = checkpoint(claimed, tmp_path, 6)
    assert {n: f for n, f in ssts(after).items() if f in ssts(handle).values()} == ssts(handle)
    assert after.checkpointed_size < after.full_size
    claimed.notify_checkpoint_complete(6)
    assert claimed.incremental_base == ssts(after)
    no_claim = make()
    no_claim.restore_from([handle], source(tmp_path / "chk-5"), incremental_base=False)
    assert no_claim.incremental_base == {}
    fresh = checkpoint(no_claim, tmp_path, 7)
    assert fresh.checkpointed_size == fresh.full_size


def test_restore_replaces_states_and_keeps_registered_ones(make: Factory, tmp_path: Path) -> None:
    original = make()
    original.get_state(VALUE)
    original.set_current_key(1)
    original.get_state(VALUE).update([1])
    handle = checkpoint(original, tmp_path, 1)
    target = make()
    other = target.get_state(ValueStateDescriptor("other"))
    target.set_current_key(2)
    other.update("gone")
    value = target.get_state(VALUE)
    target.restore([handle], source(tmp_path / "chk-1"))
    assert target.state_names == ["other", "value"]
    assert dump(target) == {"other": {}, "value": {(1, VOID_NAMESPACE): [1]}}
    target.set_current_key(1)
    assert value.value() == [1]  # a handle taken before still works


def test_pending_snapshot_of_a_replaced_database_never_becomes_a_base(
    make: Factory, tmp_path: Path
) -> None:
    b = make()
    fill(b, range(50))
    handle = checkpoint(b, tmp_path, 1)
    blocker = Blocker()
    future = b.snapshot_to(
        2, checkpoint_location(tmp_path, 2, FileSystem(hooks=blocker)), SnapshotOptions()
    )
    assert blocker.entered.wait(10)
    b.restore_from([handle], source(tmp_path / "chk-1"), incremental_base=True)
    blocker.release.set()
    future.result(timeout=10)
    b.notify_checkpoint_complete(2)
    assert b.last_completed_checkpoint_id == 1 and b.recorded_checkpoints == [1]


# ------------------------------------------- refusals leave the backend as it was


def test_truncated_file_is_corrupt_and_changes_nothing(make: Factory, tmp_path: Path) -> None:
    original = make()
    fill(original, range(300))
    handle = checkpoint(original, tmp_path, 1)
    target = make()
    fill(target, range(20), tag=9)
    before, db_path = dump(target), target.db_path
    largest = max(ssts(handle).values(), key=lambda f: f.size)
    with open(source(tmp_path / "chk-1").path(largest), "r+b") as f:
        f.truncate(largest.size // 2)
    with pytest.raises(CorruptCheckpointError, match=f"expected .* {largest.size} bytes"):
        target.restore_from([handle], source(tmp_path / "chk-1"), incremental_base=True)
    assert dump(target) == before and target.db_path == db_path
    assert sorted(p.name for p in target.instance_path.iterdir()) == [
        "checkpoints",
        db_path.name,
    ]  # the restore's scratch is gone
    assert target.incremental_base == {}


def test_files_that_do_not_open_as_a_database_are_corrupt(make: Factory, tmp_path: Path) -> None:
    original = make()
    fill(original, range(100))
    handle = checkpoint(original, tmp_path, 1)
    without_current = handle.model_copy(
        update={"files": tuple(f for f in handle.files if f.local_name != "CURRENT")}
    )
    target = make()
    fill(target, range(10))
    before = dump(target)
    with pytest.raises(CorruptCheckpointError, match="CURRENT"):
        target.restore_from([without_current], source(tmp_path / "chk-1"))
    assert dump(target) == before
    for f in ssts(handle).values():  # RocksDB deleted nothing
        assert Path(source(tmp_path / "chk-1").path(f)).stat().st_size == f.size


def test_mismatches_are_refused_before_anything_changes(make: Factory, tmp_path: Path) -> None:
    original = make()
    fill(original, range(100))
    handle = checkpoint(original, tmp_path, 1)
    target = make()
    target.get_state(ValueStateDescriptor("list"))  # registered as another kind
    fill_value = target.get_state(VALUE)
    target.set_current_key(3)
    fill_value.update(["mine"])
    before = dump(target)
    with pytest.raises(SerializerMismatchError, match=r"'list' of kind 'value'.*kind 'list'"):
        target.restore_from([handle], source(tmp_path / "chk-1"))
    assert dump(target) == before
    other_p = make(KeyGroupRange(0, 255), 256)
    with pytest.raises(MaxParallelismMismatchError, match="max parallelism 256, got one of 128"):
        other_p.restore_from([handle], source(tmp_path / "chk-1"))
    strings = make(namespace_serializer=StringSerializer())
    with pytest.raises(SerializerMismatchError, match="namespace serializer 'utf8'"):
        strings.restore_from([handle], source(tmp_path / "chk-1"))
    fake = handle.model_copy(
        update={
            "states": (
                *handle.states,
                StateInfo(
                    id=len(handle.states),
                    name="custom",
                    kind="value",
                    namespace_serializer="cowstate-value",
                    state_serializer="my.Serializer",
                ),
            )
        }
    )
    plain = make()
    fill(plain, range(10))
    plain_before = dump(plain)
    with pytest.raises(SerializerMismatchError, match="register the state's descriptor"):
        plain.restore_from([fake], source(tmp_path / "chk-1"))
    assert dump(plain) == plain_before and dump(target) == before
    assert os.listdir(target.local_checkpoints_path) == []


# ---------------------------------- restore: what it refuses and what it keeps


@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_restore_refuses_a_single_handle_or_a_non_iterable_naming_its_type(
    tmp_path: Path,
) -> None:
    # backend.restore 1 (`and`: a lone handle iterated as its fields, an int
    # failing in list()), 3 (message None), 4 (`type(None)` named).
    handle = restore_support.handle_for(
        tmp_path / "sp" / "file",
        restore_support.crafted(restore_support.by_group(restore_support.RESTORED_ENTRIES)),
    )
    backend = restore_support.rocks(tmp_path / "local")
    try:
        restore_support.fill(backend, range(100, 110), tag="mine")
        before = restore_support.dump(backend)
        with pytest.raises(InvalidArgumentError) as excinfo:
            backend.restore(handle, restore_support.ABSOLUTE)  # type: ignore[arg-type]
        assert str(excinfo.value) == (
            "expected an iterable of KeyedStateHandles, got KeyedStateHandle"
        )
        with pytest.raises(InvalidArgumentError) as excinfo:
            backend.restore(5, restore_support.ABSOLUTE)  # type: ignore[arg-type]
        assert str(excinfo.value) == "expected an iterable of KeyedStateHandles, got int"
        assert restore_support.dump(backend) == before
    finally:
        backend.close()


@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_restore_without_a_source_is_refused_saying_what_it_needs(tmp_path: Path) -> None:
    # backend.restore 14-20 (the message of a restore without a SnapshotSource).
    handle = restore_support.handle_for(
        tmp_path / "sp" / "file",
        restore_support.crafted(restore_support.by_group(restore_support.RESTORED_ENTRIES)),
    )
    backend = restore_support.rocks(tmp_path / "local")
    try:
        restore_support.fill(backend, range(100, 110), tag="mine")
        before = restore_support.dump(backend)
        with pytest.raises(InvalidArgumentError) as excinfo:
            backend.restore([handle])
        assert str(excinfo.value) == (
            "expected the SnapshotSource of the snapshot's directory (handles' paths are "
            "relative to it), got None"
        )
        assert restore_support.dump(backend) == before
    finally:
        backend.close()


@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_the_handles_of_two_formats_are_refused_naming_both(tmp_path: Path) -> None:
    # backend.prepare_restore 10, 11 (two formats taken, or the message dropped).
    low = KeyGroupRange(0, 7)
    blocks = {
        kg: rows
        for kg, rows in restore_support.by_group(restore_support.RESTORED_ENTRIES).items()
        if kg in low
    }
    handle = restore_support.handle_for(
        tmp_path / "sp" / "file", restore_support.crafted(blocks, key_group_range=low)
    )
    handle = handle.model_copy(update={"key_group_range": (0, 7)})
    native = handle.model_copy(
        update={
            "format": SnapshotFormat.ROCKSDB_NATIVE,
            "backend": "rocksdb",
            "key_group_range": (8, 15),
        }
    )
    backend = restore_support.rocks(tmp_path / "local")
    try:
        with pytest.raises(IncompatibleSnapshotError) as excinfo:
            backend.prepare_restore([handle, native], restore_support.ABSOLUTE)
        formats = sorted({handle.format, native.format})
        assert str(excinfo.value) == (
            f"expected the handles of one snapshot (one format), got formats {formats}"
        )
    finally:
        backend.close()


@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_canonical_file_of_other_key_groups_than_its_handle_is_refused_by_path(
    tmp_path: Path,
) -> None:
    # backend._check_file 2 (the file's path passed as None: the message named
    # None instead of the file).
    low = KeyGroupRange(0, 7)
    blocks = {
        kg: rows
        for kg, rows in restore_support.by_group(restore_support.RESTORED_ENTRIES).items()
        if kg in low
    }
    assert blocks  # the file holds entries
    file = tmp_path / "sp" / "file"
    handle = restore_support.handle_for(
        file, restore_support.crafted(blocks, key_group_range=low)
    )  # says key groups 0-15
    backend = restore_support.rocks(tmp_path / "local")
    try:
        restore_support.fill(backend, range(100, 110), tag="mine")
        before = restore_support.dump(backend)
        with pytest.raises(SnapshotFormatError) as excinfo:
            backend.restore([handle], restore_support.ABSOLUTE)
        assert str(excinfo.value) == (
            f"expected {str(file)!r} to hold key groups [0, 15] in format canonical of max "
            f"parallelism {restore_support.MAX_P} with key serializer 'tests.trusted-pickle' "
            f"as its handle says, the file holds key groups [0, 7] in format canonical of max "
            f"parallelism {restore_support.MAX_P} with key serializer 'tests.trusted-pickle'"
        )
        assert restore_support.dump(backend) == before
    finally:
        backend.close()


@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_restore_of_keys_of_another_type_than_the_backends_is_refused(
    tmp_path: Path,
) -> None:
    # backend.prepare_restore 25, 30 (the backend's key type not given to the
    # restorer: str keys restored into a backend whose keys are ints).
    handle = restore_support.handle_for(
        tmp_path / "sp" / "file",
        restore_support.crafted(restore_support.by_group([(f"k{k}", "a", k) for k in range(5)])),
    )
    backend = restore_support.rocks(tmp_path / "local")
    try:
        restore_support.fill(backend, range(3))  # fixes int keys
        before = restore_support.dump(backend)
        with pytest.raises(MixedKeyTypesError, match="got str: 'k0'"):
            backend.restore([handle], restore_support.ABSOLUTE)
        assert restore_support.dump(backend) == before
    finally:
        backend.close()


@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_restore_fixes_the_key_type_of_a_fresh_backend(tmp_path: Path) -> None:
    # backend.RocksDBPreparedRestore.__init__ 2 (the restored key type not
    # passed: a fresh backend restored with int keys took a str key).
    handle = restore_support.handle_for(
        tmp_path / "sp" / "file",
        restore_support.crafted(restore_support.by_group(restore_support.RESTORED_ENTRIES)),
    )
    backend = restore_support.rocks(tmp_path / "local")
    try:
        backend.restore([handle], restore_support.ABSOLUTE)
        with pytest.raises(KeyTypeMismatchError) as excinfo:
            backend.set_current_key("a")
        assert str(excinfo.value) == (
            "expected a key of type int (fixed by the first key), got str: 'a'"
        )
    finally:
        backend.close()


@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_restore_survives_a_local_database_directory_already_gone(tmp_path: Path) -> None:
    # backend._swap 30, 32, 33 (`rmtree` of the replaced database's directory
    # without ignore_errors: the restore failed after it had swapped).
    handle = restore_support.handle_for(
        tmp_path / "sp" / "file",
        restore_support.crafted(restore_support.by_group(restore_support.RESTORED_ENTRIES)),
    )
    backend = restore_support.rocks(tmp_path / "local")
    try:
        old = Path(backend._db_path)
        restore_support.fill(backend, range(100, 110), tag="mine")
        shutil.rmtree(old)  # an operator's clean-up of the working directory
        backend.restore([handle], restore_support.ABSOLUTE)
        assert restore_support.dump(backend)["value"] == {
            (k, n): s for k, n, s in restore_support.RESTORED_ENTRIES
        }
    finally:
        backend.close()


def _rocks_with(local: Path, executor: ThreadPoolExecutor) -> RocksDBKeyedStateBackend:
    backend = RocksDBKeyedStateBackend(
        restore_support.FULL,
        restore_support.MAX_P,
        local_dir=local,
        key_serializer=restore_support.SER,
        namespace_serializer=restore_support.SER,
        executor=executor,
    )
    backend.get_state(restore_support.VALUE)
    return backend


@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_checkpoint_written_across_two_restores_never_becomes_the_base(tmp_path: Path) -> None:
    # backend._swap 15 (`_generation = 1`: the second restore left the
    # generation the first one set, so a checkpoint taken between them and
    # written after the second was recorded as a base of the new database),
    # 22, 23 (an unseeded restore's last confirmed checkpoint not -1).
    handle = restore_support.handle_for(
        tmp_path / "sp" / "file",
        restore_support.crafted(restore_support.by_group(restore_support.RESTORED_ENTRIES)),
    )
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    executor = ThreadPoolExecutor(max_workers=1)
    backend = _rocks_with(tmp_path / "local", executor)
    try:
        backend.restore([handle], restore_support.ABSOLUTE)
        assert backend.last_completed_checkpoint_id == -1
        release = threading.Event()
        executor.submit(release.wait, 10)  # the writer is busy elsewhere
        future = backend.snapshot_to(
            5, storage.checkpoint_location(5), SnapshotOptions(kind="checkpoint")
        )
        backend.restore(
            [handle], restore_support.ABSOLUTE
        )  # a new database under the queued writer
        release.set()
        future.result(timeout=30)
        backend.notify_checkpoint_complete(5)
        assert backend.last_completed_checkpoint_id == -1
        assert backend.incremental_base == {}
    finally:
        backend.close()
        executor.shutdown(wait=True)


@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_native_restore_is_no_incremental_base_unless_asked(tmp_path: Path) -> None:
    # backend.prepare_restore 1 (`incremental_base=True` by default: a restore
    # that did not ask took the snapshot's SSTs as its base).
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    source_backend = restore_support.rocks(tmp_path / "source")
    backend = restore_support.rocks(tmp_path / "local")
    try:
        restore_support.fill(source_backend, range(20))
        location = storage.checkpoint_location(3)
        handle = source_backend.snapshot_to(3, location, SnapshotOptions(kind="checkpoint")).result(
            timeout=30
        )
        source = SnapshotSource(FileSystem(), location.directory)
        backend.prepare_restore([handle], source).commit()
        assert backend.last_completed_checkpoint_id == -1
        assert backend.incremental_base == {}
        assert restore_support.dump(backend) == restore_support.dump(source_backend)
        backend.prepare_restore([handle], source, incremental_base=True).commit()
        assert backend.last_completed_checkpoint_id == 3
    finally:
        source_backend.close()
        backend.close()


# ------------------------------------------------- cancellation and failure


def test_cancel_before_the_writer_starts_releases_the_local_checkpoint(
    make: Factory, tmp_path: Path
) -> None:
    busy = threading.Event()
    executor = ThreadPoolExecutor(max_workers=1)
    try:
        executor.submit(busy.wait, 10)  # the writer is busy elsewhere
        b = make(executor=executor)
        fill(b, range(50))
        future = b.snapshot_to(1, checkpoint_location(tmp_path, 1), SnapshotOptions())
        assert len(os.listdir(b.local_checkpoints_path)) == 1
        assert b.pending_snapshots == 1
        assert future.cancel() and future.cancelled()
        assert os.listdir(b.local_checkpoints_path) == []
        assert b.pending_snapshots == 0
        busy.set()
        executor.submit(lambda: None).result(timeout=10)  # the writer saw the cancel
        assert b.recorded_checkpoints == []
        assert not (tmp_path / "chk-1").exists() and not (tmp_path / "shared").exists()
    finally:
        busy.set()
        executor.shutdown(wait=True)


@pytest.mark.parametrize("kind", ["checkpoint", "native", "canonical"])
def test_cancel_while_writing_releases_everything(make: Factory, tmp_path: Path, kind: str) -> None:
    b = make()
    fill(b, range(200))
    blocker = Blocker(at=2)
    filesystem = FileSystem(hooks=blocker)
    if kind == "checkpoint":
        location = checkpoint_location(tmp_path, 1, filesystem)
        options = SnapshotOptions()
    else:
        location = SnapshotLocation(filesystem, str(tmp_path / "sp"), None)
        options = SnapshotOptions(kind="savepoint", format=kind)  # type: ignore[arg-type]
    future = b.snapshot_to(1, location, options)
    assert blocker.entered.wait(10)
    assert future.cancel()
    blocker.release.set()
    with pytest.raises(SnapshotCancelledError, match="cancelled before"):
        future.result(timeout=10)
    assert os.listdir(b.local_checkpoints_path) == []
    assert b.pending_snapshots == 0 and b.recorded_checkpoints == []
    assert location.written  # partial uploads: the caller's
    location.discard()
    assert snapshot_files(tmp_path) == []


@pytest.mark.parametrize("kind", ["checkpoint", "canonical"])
def test_write_failure_is_reported_and_releases_everything(
    make: Factory, tmp_path: Path, kind: str
) -> None:
    b = make()
    fill(b, range(200))
    blocker = Blocker(at=3, fail=True)
    filesystem = FileSystem(hooks=blocker)
    if kind == "checkpoint":
        location = checkpoint_location(tmp_path, 1, filesystem)
        options = SnapshotOptions()
    else:
        location = SnapshotLocation(filesystem, str(tmp_path / "sp"), None)
        options = SnapshotOptions(kind="savepoint", format="canonical")
    future = b.snapshot_to(1, location, options)
    with pytest.raises(SnapshotWriteError, match="OSError: disk full") as caught:
        future.result(timeout=10)
    assert isinstance(caught.value.__cause__, OSError)
    assert os.listdir(b.local_checkpoints_path) == []
    assert b.pending_snapshots == 0 and b.recorded_checkpoints == []
    b.notify_checkpoint_complete(1)
    assert b.incremental_base == {}
    location.discard()
    assert snapshot_files(tmp_path) == []


def test_close_cancels_a_running_snapshot(tmp_path: Path) -> None:
    b = RocksDBKeyedStateBackend(FULL, MAX_P, local_dir=tmp_path / "local")
    fill(b, range(100))
    blocker = Blocker()
    future: Future[KeyedStateHandle] = b.snapshot_to(
        1, checkpoint_location(tmp_path, 1, FileSystem(hooks=blocker)), SnapshotOptions()
    )
    assert blocker.entered.wait(10)
    threading.Timer(0.2, blocker.release.set).start()
    b.close()
    with pytest.raises(SnapshotCancelledError):
        future.result(timeout=10)
    assert not b.instance_path.exists()


def test_snapshot_is_the_synchronous_moment(make: Factory, tmp_path: Path) -> None:
    b = make()
    fill(b, range(100))
    expected = dump(b)
    blocker = Blocker()
    future = b.snapshot_to(
        1, checkpoint_location(tmp_path, 1, FileSystem(hooks=blocker)), SnapshotOptions()
    )
    assert blocker.entered.wait(10)
    fill(b, range(100, 200), tag=5)  # the owner keeps writing
    change_a_few(b)
    b.get_state(ValueStateDescriptor("late"))  # and registers a state
    blocker.release.set()
    handle = future.result(timeout=10)
    assert [s.name for s in handle.states] == [d.name for d in ALL]
    restored = make()
    restored.restore_from([handle], source(tmp_path / "chk-1"))
    assert dump(restored) == expected


# It absorbed test_a_snapshot_is_refused_a_location_or_options_it_cannot_use:
# backend.snapshot_to 9, 11, 12 (the refusals of a location or options of
# another type), 17, 18, 20, 21 (a checkpoint into a location without a
# shared directory): the messages word for word.
@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_snapshot_arguments_are_checked(backend: RocksDBKeyedStateBackend, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="checkpoint id >= 0"):
        backend.snapshot_to(-1, checkpoint_location(tmp_path, 1), SnapshotOptions())
    options = SnapshotOptions(kind="checkpoint")
    refused: list[tuple[Any, Any, str]] = [
        (str(tmp_path), options, "expected a SnapshotLocation, got str"),
        (checkpoint_location(tmp_path, 1), "full", "expected SnapshotOptions, got str"),
        (
            savepoint_location(tmp_path / "sp"),
            options,
            "expected a checkpoint location with a shared directory for the SST files, "
            "got one without (a savepoint location?)",
        ),
    ]
    for where, how, message in refused:
        with pytest.raises(InvalidArgumentError) as excinfo:
            backend.snapshot_to(1, where, how)
        assert str(excinfo.value) == message
    assert os.listdir(backend.local_checkpoints_path) == []
    assert isinstance(backend, CheckpointingBackend)


# ------------- snapshot_to: checkpoint ids, and what a failure leaves and says


@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_checkpoint_zero_is_a_checkpoint(tmp_path: Path) -> None:
    # backend.snapshot_to 4 (`checkpoint_id <= 0` refused id 0, which the
    # handles allow).
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    backend = restore_support.rocks(tmp_path / "local")
    try:
        restore_support.fill(backend, range(5))
        handle = backend.snapshot_to(
            0, storage.checkpoint_location(0), SnapshotOptions(kind="checkpoint")
        ).result(timeout=30)
        assert handle.checkpoint_id == 0
    finally:
        backend.close()


# backend.snapshot_to 23 (the local checkpoint directory not named after its
# checkpoint), 28 (its half-made ``.tmp`` left behind), 29-31 (the message).
@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_local_checkpoint_rocksdb_cannot_take_is_refused_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    backend = restore_support.rocks(tmp_path / "local")
    restore_support.fill(backend, range(50))
    checkpoints = Path(backend.local_checkpoints_path)
    checkpoints.mkdir(exist_ok=True)
    # A dangling link is no existing directory to the backend, but RocksDB's
    # final rename of ``chk-1.tmp`` onto it fails.
    (checkpoints / "chk-1").symlink_to(tmp_path / "nowhere" / "chk-1")
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    try:
        with pytest.raises(SnapshotWriteError) as excinfo:
            backend.snapshot_to(
                1, storage.checkpoint_location(1), SnapshotOptions(kind="checkpoint")
            )
        message = str(excinfo.value)
        where = checkpoints / "chk-1"
        assert message.startswith(
            f"expected RocksDB to take local checkpoint 1 in {str(where)!r}, got Exception: "
        )
        assert "Not a directory" in message
        assert sorted(p.name for p in checkpoints.iterdir()) == ["chk-1"]  # no chk-1.tmp
        assert backend.pending_snapshots == 0
        location = storage.checkpoint_location(2)
        handle = backend.snapshot_to(2, location, SnapshotOptions(kind="checkpoint")).result(30)
        restored = restore_support.rocks(tmp_path / "restored")
        try:
            restored.restore([handle], SnapshotSource(FileSystem(), location.directory))
            assert restore_support.dump(restored) == restore_support.dump(backend)
        finally:
            restored.close()
    finally:
        backend.close()


class _SyncFails:
    """RocksDB's checkpoint, failing after it renamed its directory into place:
    what a failed fsync of the new directory does (the one failure after which
    RocksDB leaves files behind; a disk this test cannot break)."""

    def __init__(self, db: Rdict) -> None:
        self._checkpoint = Checkpoint(db)

    def create_checkpoint(self, path: str) -> None:
        self._checkpoint.create_checkpoint(path)
        del self._checkpoint
        raise OSError("IO error: While fsync: a directory: Input/output error")


# backend.snapshot_to 28 (the local checkpoint left behind by a failure after
# RocksDB made it).
@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_local_checkpoint_that_fails_once_made_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = restore_support.rocks(tmp_path / "local")
    restore_support.fill(backend, range(50))
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    monkeypatch.setattr(rocks_backend, "Checkpoint", _SyncFails)
    try:
        with pytest.raises(SnapshotWriteError, match="got OSError: IO error: While fsync"):
            backend.snapshot_to(
                1, storage.checkpoint_location(1), SnapshotOptions(kind="checkpoint")
            )
        assert list(Path(backend.local_checkpoints_path).iterdir()) == []
    finally:
        backend.close()


# backend.snapshot_to 73 (the snapshot the failure names), 76, 91, 92 (what
# the failure says became of the local checkpoint).
@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_a_failed_upload_names_its_snapshot_and_the_deleted_local_checkpoint(
    tmp_path: Path,
) -> None:
    def disk_full(op: str, path: str, data: bytes | None) -> None:
        if op == "write" and "/shared/" in path:
            raise OSError("disk full")

    backend = restore_support.rocks(tmp_path / "local")
    restore_support.fill(backend, range(50))
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem(hooks=disk_full))
    try:
        future = backend.snapshot_to(
            7, storage.checkpoint_location(7), SnapshotOptions(kind="checkpoint")
        )
        with pytest.raises(SnapshotWriteError) as excinfo:
            future.result(30)
        assert str(excinfo.value) == (
            "expected snapshot 7 to be written, got OSError: disk full; its local "
            "checkpoint was deleted"
        )
        assert list(Path(backend.local_checkpoints_path).iterdir()) == []
    finally:
        backend.close()


# backend.__init__ 6, 12-14 (the writer thread's name).
@pytest.mark.kills(module="cowstate.rocksdb.backend")
def test_the_snapshot_writer_thread_is_named_for_rocksdb(tmp_path: Path) -> None:
    names: list[str] = []

    def record(op: str, path: str, data: bytes | None) -> None:
        names.append(threading.current_thread().name)

    backend = restore_support.rocks(tmp_path / "local")
    restore_support.fill(backend, range(50))
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem(hooks=record))
    try:
        backend.snapshot_to(
            1, storage.checkpoint_location(1), SnapshotOptions(kind="checkpoint")
        ).result(30)
    finally:
        backend.close()
    assert names
    assert {name.rsplit("_", 1)[0] for name in names} == {"cowstate-rocksdb-snapshot"}
