"""Tests that kill mutants of the ``tables`` mutation scope (``make mutate
SCOPE=tables``) in its backend modules, ``cowstate.keyed_backend`` and
``cowstate.heap_backend``, that the scope's other killer tests let through or
never reach.

Each test is named after what it pins; the mutants it was written for are
named in its comment. They run on real snapshot files (crafted with the real
writer by :mod:`restore_support`, or written by a backend into real
checkpoint storage) and are part of the normal suite.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures._base import _Waiter
from pathlib import Path
from typing import Any

import pytest
from restore_support import (
    ABSOLUTE,
    FULL,
    MAX_P,
    RESTORED_ENTRIES,
    SER,
    VALUE,
    by_group,
    crafted,
    crafted_raw,
    dump,
    fill,
    group_of,
    handle_for,
    heap,
    metadata_of,
    raw_blocks,
    rocks,
)
from restore_support import STATE_META as META

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.descriptors import ListStateDescriptor, ValueStateDescriptor
from cowstate.errors import (
    BackendClosedError,
    DuplicateMappingError,
    IncompatibleSnapshotError,
    InvalidArgumentError,
    KeyGroupMismatchError,
    KeyTypeMismatchError,
    MaxParallelismMismatchError,
    MixedKeyTypesError,
    SerializerMismatchError,
    SnapshotCancelledError,
    SnapshotFormatError,
    SnapshotWriteError,
    StateRegistrationError,
    UnknownStateError,
)
from cowstate.heap_backend import HeapKeyedStateBackend, HeapPreparedRestore
from cowstate.introspection import describe
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.serializers import LongSerializer, StateSerializer, serializer_identifier
from cowstate.snapshot import SnapshotWriter
from cowstate.state_meta import SnapshotFormat, StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable, StateTable

#: Until these tests move beside the tests of what they pin.
pytestmark = [
    pytest.mark.kills(module="cowstate.keyed_backend"),
    pytest.mark.kills(module="cowstate.heap_backend"),
]

ROOT = ABSOLUTE
ENTRIES = RESTORED_ENTRIES
RESTORED = {"value": {(k, ns): state for k, ns, state in ENTRIES}}


def _prepared(
    tmp_path: Path,
) -> tuple[HeapKeyedStateBackend, HeapPreparedRestore, dict[str, Any]]:
    """A backend holding its own state, a restore of :data:`ENTRIES` prepared into
    it (from a canonical file in ``tmp_path``), and the backend's contents."""
    backend = heap()
    fill(backend, range(100, 110), tag="mine")
    handle = handle_for(tmp_path / "sp" / "file", crafted(by_group(ENTRIES)))
    before = dump(backend)
    staged = backend.prepare_restore([handle], ROOT)
    assert dump(backend) == before  # preparing changes nothing
    return backend, staged, before


# ------------------------------------------------------- staged restores


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
    assert dump(backend) == before
    backend.close()


def test_discarding_a_committed_restore_keeps_what_it_installed(tmp_path: Path) -> None:
    # keyed_backend.StagedRestore.discard 1 (`!=`: discarding a committed
    # restore would mark it discarded).
    backend, staged, _ = _prepared(tmp_path)
    staged.commit()
    assert staged.status == "committed"
    staged.discard()
    assert staged.status == "committed"
    assert dump(backend) == RESTORED
    with pytest.raises(InvalidArgumentError) as excinfo:
        staged.commit()
    assert str(excinfo.value) == (
        "expected a prepared restore to commit, got one already committed"
    )
    backend.close()


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
    assert dump(backend) == before
    with pytest.raises(InvalidArgumentError) as again:
        staged.commit()
    assert str(again.value) == "expected a prepared restore to commit, got one already discarded"


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


def test_restore_from_a_rocksdb_checkpoint_does_not_make_it_the_incremental_base(
    tmp_path: Path,
) -> None:
    # keyed_backend.AbstractKeyedStateBackend.restore_from 1, 4, 7 (`incremental_base`
    # defaults to False: only the coordinator restoring its own checkpoint asks
    # for a base) and _run_async 9-12 (a successful write's `commit`, RocksDB's
    # record of the SSTs it uploaded).
    job = tmp_path / "job"
    source = rocks(tmp_path / "local-1")
    fill(source, range(40))
    location = SnapshotLocation(FileSystem(), str(job / "chk-1"), str(job / "shared"))
    handle = source.snapshot_to(1, location, SnapshotOptions()).result(30)
    assert source.recorded_checkpoints == [1]  # its SSTs, recorded on success
    expected = dump(source)
    source.close()
    assert handle.shared_files  # SSTs a base could reuse
    target = rocks(tmp_path / "local-2")
    target.restore_from([handle], SnapshotSource(FileSystem(), str(job / "chk-1")))
    assert dump(target) == expected
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


# ------------------------------------------------- files against handles


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
    fill(backend, range(100, 110), tag="mine")
    before = dump(backend)
    with pytest.raises(SnapshotFormatError) as excinfo:
        backend.prepare_restore([handle], ROOT)
    assert type(excinfo.value) is SnapshotFormatError
    assert str(excinfo.value) == (
        f"expected {str(file)!r} to hold key groups [0, 15] in format canonical of max "
        f"parallelism {MAX_P} with key serializer 'tests.trusted-pickle' as its handle "
        f"says, the file holds key groups [0, 7] in format canonical of max parallelism "
        f"{MAX_P} with key serializer 'tests.trusted-pickle'"
    )
    assert dump(backend) == before
    backend.close()


def test_a_file_of_other_states_than_its_handle_is_refused_by_path(tmp_path: Path) -> None:
    # keyed_backend.AbstractKeyedStateBackend._check_file_of 20 (the message of
    # a file whose states are not its handle's: here another namespace serializer).
    blocks = raw_blocks(crafted(by_group(ENTRIES)))
    data = crafted_raw(blocks, namespace_serializer="tests.other-namespaces")
    file = tmp_path / "chk" / "file"
    handle = handle_for(file, data)  # lists state "value" with SER's namespaces
    backend = heap()
    fill(backend, range(100, 110), tag="mine")
    before = dump(backend)
    with pytest.raises(SnapshotFormatError) as excinfo:
        backend.restore_from([handle], ROOT)
    assert type(excinfo.value) is SnapshotFormatError
    assert str(excinfo.value) == (
        f"expected {str(file)!r} to hold the states its handle lists ['value'], the file "
        "holds ['value'] (or other ids, kinds or serializers)"
    )
    assert dump(backend) == before
    backend.close()


# ------------------------------------------------------ snapshot handles


def test_a_checkpoint_of_a_backend_without_states_is_a_handle_without_files(
    tmp_path: Path,
) -> None:
    # heap_backend.HeapKeyedStateBackend._handle_of 3 and 9 (a result without a
    # file and without info: no file, no states, size 0).
    bare = HeapKeyedStateBackend(FULL, MAX_P, key_serializer=SER, namespace_serializer=SER)
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
    fill(backend, range(10))
    backend.restore_from([handle], SnapshotSource(FileSystem(), str(job / "chk-3")))
    assert dump(backend) == {"value": {}}
    backend.close()


# ------------------------------------------------------ restored capacity


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


# ------------------------------------------------ handles a restore refuses


def _refusal(handles: Any, source: Any = ROOT) -> tuple[type[Exception], str]:
    """The type and message of the error ``prepare_restore(handles, source)``
    raises on a backend holding state, which it must leave as it was."""
    backend = heap()
    fill(backend, range(100, 110), tag="mine")
    before = dump(backend)
    with pytest.raises(Exception) as excinfo:
        backend.prepare_restore(handles, source)
    assert dump(backend) == before
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


def test_a_restore_needs_a_snapshot_source(tmp_path: Path) -> None:
    # keyed_backend._handles_to_read 1-3.
    assert _refusal([_handle(tmp_path)], str(tmp_path)) == (
        InvalidArgumentError,
        "expected a SnapshotSource, got str",
    )


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


def test_a_restore_from_no_handles_is_refused() -> None:
    # keyed_backend._handles_to_read 10-15.
    assert _refusal([]) == (
        InvalidArgumentError,
        "expected the handles of a snapshot to restore from, got none: a restore from "
        "nothing would empty every state",
    )


def test_only_keyed_state_handles_restore(tmp_path: Path) -> None:
    # keyed_backend._check_formats 1-3.
    assert _refusal([_handle(tmp_path), 42]) == (
        InvalidArgumentError,
        "expected KeyedStateHandles, got int",
    )


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


def test_a_handle_of_another_max_parallelism_is_refused(tmp_path: Path) -> None:
    # keyed_backend._check_snapshot 1-2, through _handles_to_read 17.
    assert _refusal([_handle(tmp_path, max_parallelism=32)]) == (
        MaxParallelismMismatchError,
        f"expected a snapshot of max parallelism {MAX_P}, got one of 32: the number of "
        "key groups cannot change on restore",
    )


def test_a_handle_of_another_key_serializer_is_refused(tmp_path: Path) -> None:
    # keyed_backend._check_snapshot 3-6 and _handles_to_read 18-24 (the "snapshot"
    # the message names).
    assert _refusal([_handle(tmp_path, key_serializer="utf8")]) == (
        SerializerMismatchError,
        "expected the key serializer 'tests.trusted-pickle', the snapshot was written with 'utf8'",
    )


def test_a_key_group_in_two_handles_is_refused(tmp_path: Path) -> None:
    # keyed_backend._handles_to_read 30-42.
    low, high = _halves(tmp_path, [META], [META])
    wide = high.model_copy(update={"key_group_range": (4, 15)})
    assert _refusal([low, wide]) == (
        KeyGroupMismatchError,
        "expected every key group in one handle only, got key group 4 in the handles of "
        "[0, 7] and [4, 15]",
    )


def test_a_handle_listing_states_without_files_is_refused(tmp_path: Path) -> None:
    # keyed_backend._check_handles 10-13.
    assert _refusal([_handle(tmp_path, files=())]) == (
        SnapshotFormatError,
        "expected the files of the handle of key groups [0, 15], which lists states "
        "['value'], got a handle without files",
    )


def test_a_handle_of_another_namespace_serializer_is_refused(tmp_path: Path) -> None:
    # keyed_backend._restored_meta 2-9 and _check_namespace_serializer 1-4.
    state = META.model_copy(update={"namespace_serializer": "utf8"})
    assert _refusal([_handle(tmp_path, states=(state,))]) == (
        SerializerMismatchError,
        "expected state 'value' with the backend's namespace serializer "
        "'tests.trusted-pickle', the snapshot uses 'utf8'",
    )


def test_a_handle_of_another_kind_for_a_registered_state_is_refused(tmp_path: Path) -> None:
    # keyed_backend._restored_meta 12-23 (the registered descriptor's kind).
    state = META.model_copy(update={"kind": "list"})
    assert _refusal([_handle(tmp_path, states=(state,))]) == (
        SerializerMismatchError,
        "expected state 'value' of kind 'value', the snapshot holds kind 'list'",
    )


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


def test_handles_disagreeing_on_an_unregistered_states_kind_are_refused(tmp_path: Path) -> None:
    # keyed_backend._restored_meta 10-11, 21-23, 28-41 and _check_handles 1, 14-17:
    # the first handle's state is what the second is checked against.
    extra = META.model_copy(update={"id": 1, "name": "extra", "state_serializer": "utf8"})
    listed = extra.model_copy(update={"kind": "list"})
    assert _refusal(_halves(tmp_path, [META, extra], [META, listed])) == (
        SerializerMismatchError,
        "expected state 'extra' of kind 'value', the snapshot holds kind 'list'",
    )


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


# ------------------------------------------------- snapshot_to's handles


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
    fill(source, range(40))
    expected = dump(source)
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
    assert dump(target) == expected
    target.close()


# ------------------------------------------------ restore()'s arguments


def _restore_refusal(items: Any) -> tuple[type[Exception], str]:
    """The type and message of the error ``restore(items)`` raises on a backend
    holding state, which it must leave as it was."""
    backend = heap()
    fill(backend, range(100, 110), tag="mine")
    before = dump(backend)
    with pytest.raises(Exception) as excinfo:
        backend.restore(items)
    assert dump(backend) == before
    backend.close()
    return type(excinfo.value), str(excinfo.value)


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


def test_restore_from_no_snapshots_is_refused() -> None:
    # heap_backend.HeapKeyedStateBackend.restore 5-12.
    assert _restore_refusal(iter([])) == (
        InvalidArgumentError,
        "expected at least one snapshot to restore from, got none: restore([]) would "
        "empty every state; restore the snapshot result of an empty backend for that",
    )


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
    bare = HeapKeyedStateBackend(FULL, MAX_P, key_serializer=SER, namespace_serializer=SER)
    future = bare.snapshot(4, io.BytesIO)  # nothing to write: done at once
    assert (future.checkpoint_id, future.done()) == (4, True)
    empty = future.result(30)
    bare.close()
    assert (empty.checkpoint_id, empty.key_group_range) == (4, FULL)
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
        fill(backend, range(100, 110), tag="mine")
        backend.restore(items)
        assert dump(backend) == RESTORED
        backend.close()
    (stream,) = on_disk.opened
    assert stream.closed
    backend = heap()
    fill(backend, range(100, 110), tag="mine")
    backend.restore([empty])
    assert dump(backend) == {"value": {}}
    backend.close()


# ----------------------------------------------- files restore() refuses


def _file_with(**changes: Any) -> bytes:
    """A canonical file of :data:`ENTRIES` whose metadata has ``changes``."""
    stream = io.BytesIO()
    writer = SnapshotWriter(stream, metadata_of().model_copy(update=changes))
    for kg, rows in sorted(raw_blocks(crafted(by_group(ENTRIES))).items()):
        writer.write_key_group(kg, {0: rows})
    writer.finish()
    return stream.getvalue()


def test_restore_refuses_another_backends_native_file_by_its_format() -> None:
    # heap_backend.HeapKeyedStateBackend._prepare 6-9.
    data = _file_with(format=SnapshotFormat.ROCKSDB_NATIVE)
    assert _restore_refusal([data]) == (
        IncompatibleSnapshotError,
        "expected a heap or canonical snapshot, got format 'rocksdb-native': a native "
        "snapshot of another backend; restore from a canonical savepoint",
    )


def test_restore_refuses_a_file_of_another_key_serializer_naming_the_file() -> None:
    # heap_backend.HeapKeyedStateBackend._prepare 10-17 ("the file", not "the snapshot").
    assert _restore_refusal([_file_with(key_serializer="utf8")]) == (
        SerializerMismatchError,
        "expected the key serializer 'tests.trusted-pickle', the file was written with 'utf8'",
    )
    assert _restore_refusal([_file_with(max_parallelism=32)]) == (
        MaxParallelismMismatchError,
        f"expected a snapshot of max parallelism {MAX_P}, got one of 32: the number of "
        "key groups cannot change on restore",
    )


def test_restore_refuses_a_file_of_another_namespace_serializer_naming_the_file() -> None:
    # heap_backend.HeapKeyedStateBackend._prepare 18-25.
    blocks = raw_blocks(crafted(by_group(ENTRIES)))
    data = crafted_raw(blocks, namespace_serializer="utf8")
    assert _restore_refusal([crafted(by_group(ENTRIES)), data]) == (
        SerializerMismatchError,
        "expected state 'value' with the backend's namespace serializer "
        "'tests.trusted-pickle', the file uses 'utf8'",
    )


def test_a_restored_state_absent_from_the_next_restore_keeps_its_kind_and_serializer() -> None:
    # heap_backend.HeapKeyedStateBackend._prepare 69-75: a state restored but
    # never registered, absent from the next restore's files, becomes empty
    # with the meta info it was restored with.
    source = HeapKeyedStateBackend(FULL, MAX_P)
    counts: ValueStateDescriptor[int] = ValueStateDescriptor("counts")
    state = source.get_state(counts)
    for key in range(10):
        source.set_current_key(key)
        state.update(key * key)
    with_counts = source.snapshot(1, io.BytesIO).result(30)
    source.close()
    empty = HeapKeyedStateBackend(FULL, MAX_P)
    without = empty.snapshot(1, io.BytesIO).result(30)
    empty.close()
    backend = HeapKeyedStateBackend(FULL, MAX_P)
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


# -------------------------------------------- restored tables, skewed or not


def _keys_in(key_group: int, count: int, max_parallelism: int) -> list[int]:
    keys: list[int] = []
    key = 0
    while len(keys) < count:
        if assign_to_key_group(key, max_parallelism) == key_group:
            keys.append(key)
        key += 1
    return keys


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


def test_a_factory_function_makes_the_restored_tables_as_it_is() -> None:
    # heap_backend.HeapKeyedStateBackend._restored_table 2-9: only a table class
    # of ours is asked for an initial capacity.
    source = heap()
    fill(source, range(40))
    expected = dump(source)
    result = source.snapshot(1, io.BytesIO).result(30)
    source.close()
    backend = HeapKeyedStateBackend(
        FULL, MAX_P, _cow_table, key_serializer=SER, namespace_serializer=SER
    )
    backend.get_state(VALUE)
    backend.restore([result])
    assert dump(backend) == expected
    table = backend.table("value")
    assert (table.meta.name, table.meta.state_serializer) == ("value", SER)
    assert describe(table.state_map(0)).capacity == 128
    backend.close()


# ------------------------------------------------------ the writer thread


def test_an_executor_that_is_not_one_is_refused() -> None:
    # keyed_backend.AbstractKeyedStateBackend.__init__ 7-11.
    with pytest.raises(InvalidArgumentError) as excinfo:
        HeapKeyedStateBackend(FULL, MAX_P, executor=42)  # type: ignore[arg-type]
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


def test_a_callers_executor_writes_the_snapshots_and_outlives_the_backend() -> None:
    # keyed_backend.AbstractKeyedStateBackend.__init__ 9, 28-31 and close 7:
    # the caller's executor is used, its pending writes waited for on close,
    # and it is never shut down.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="caller") as executor:
        backend = HeapKeyedStateBackend(
            FULL, MAX_P, key_serializer=SER, namespace_serializer=SER, executor=executor
        )
        backend.get_state(VALUE)
        fill(backend, range(10))
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


def test_a_backend_writes_on_one_thread_of_its_own_which_close_ends() -> None:
    # keyed_backend.AbstractKeyedStateBackend.__init__ 28-36 and close 5-6: one
    # writer thread per backend (a second snapshot waits for the first), named
    # after the backend, joined by close().
    before = set(threading.enumerate())
    backend = heap()
    fill(backend, range(10))
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


def test_a_snapshot_is_no_longer_pending_when_whoever_waits_for_it_wakes() -> None:
    # keyed_backend._run_async__mutmut_13 (the writer discards None instead of
    # its future): the done callback forgets the future only after set_result
    # has woken every waiter, so a thread woken by the result could still count
    # the snapshot as pending (documented: cleanup runs "*before* the future
    # resolves, so whoever waits finds ... the snapshot no longer pending").
    # The waiter below is called by set_result itself, deterministically in
    # the window a woken thread would see.
    backend = heap()
    fill(backend, range(10))
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


# ------------------------------------------------ snapshot()'s arguments


def test_snapshot_refuses_a_format_no_heap_backend_restores() -> None:
    # heap_backend.HeapKeyedStateBackend.snapshot 1-3.
    backend = heap()
    with pytest.raises(InvalidArgumentError) as excinfo:
        backend.snapshot(1, io.BytesIO, snapshot_format=SnapshotFormat.ROCKSDB_NATIVE)
    assert str(excinfo.value) == (
        "expected a snapshot format in ['canonical', 'heap'], got 'rocksdb-native'"
    )
    backend.close()


def test_snapshot_ids_are_ints_from_zero() -> None:
    # heap_backend.HeapKeyedStateBackend.snapshot 4-13: 0 is an id, -1 and True
    # are not; the refusals name what they got.
    backend = heap()
    fill(backend, range(10))
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


def test_a_table_factory_must_be_callable() -> None:
    # heap_backend.HeapKeyedStateBackend.__init__ 15-19.
    with pytest.raises(InvalidArgumentError) as excinfo:
        HeapKeyedStateBackend(FULL, MAX_P, 42)  # type: ignore[arg-type]
    assert str(excinfo.value) == "expected a table factory, got int"


def test_a_snapshot_result_in_memory_is_rewound() -> None:
    # heap_backend.HeapKeyedStateBackend._write 20-33: a BytesIO handle reads
    # from its first byte, the snapshot file the result's info describes; the
    # result names the checkpoint and the backend's key groups.
    backend = heap()
    fill(backend, range(10))
    result = backend.snapshot(1, io.BytesIO).result(30)
    backend.close()
    assert (result.checkpoint_id, result.key_group_range) == (1, FULL)
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


@pytest.mark.parametrize("discard_fails", [False, True])
def test_a_failed_write_discards_its_stream_and_names_the_writes_error(
    discard_fails: bool,
) -> None:
    # heap_backend.HeapKeyedStateBackend._write 34, _discard 1-10, snapshot
    # 45-46 and keyed_backend._run_async 5-8: the stream is discarded once, a
    # failing discard does not hide the write's error, the message word for word.
    backend = heap()
    fill(backend, range(10))
    before = dump(backend)
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
    assert dump(backend) == before
    backend.close()


def test_cancelling_a_queued_or_a_running_snapshot_says_it_worked() -> None:
    # keyed_backend.SnapshotFuture.cancel 1-2 and __init__ 1-3, _start_async
    # 1-7 (what is pending, and forgotten once cancelled): cancelled before
    # its writer starts, a snapshot is cancelled outright and releases its
    # resources; while it runs, cancel() is still accepted and the writer stops.
    backend = heap()
    fill(backend, range(10))
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


def test_a_registered_state_absent_from_the_snapshot_is_empty_after_the_restore() -> None:
    # heap_backend._prepare__mutmut_70 (None staged for a registered state the
    # files do not hold): the prepare stages an empty table for it, and the
    # restore replaces what the state held with nothing.
    source = heap()
    fill(source, range(10))
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
    assert dump(target)["value"] == {
        (key, ns): state for key in range(10) for ns, state in (("a", f"v{key}"), ("b", [key]))
    }
    target.close()


# ------------------------------------------------- states and their names


def test_an_unknown_state_name_is_refused_with_the_registered_ones() -> None:
    # keyed_backend.AbstractKeyedStateBackend._holder 1-9, table 1, entries 1-2,
    # get_keys 1-3: the names listed, "none" before any.
    backend = HeapKeyedStateBackend(FULL, MAX_P)
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


def test_a_restored_state_registered_later_takes_the_descriptors_serializer(
    tmp_path: Path,
) -> None:
    # keyed_backend.AbstractKeyedStateBackend.get_state 23-26: a state restored
    # before its descriptor was registered gets the descriptor's meta info when
    # it is, and is checked against it by the next restore.
    source = HeapKeyedStateBackend(FULL, MAX_P)
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
    backend = HeapKeyedStateBackend(FULL, MAX_P)
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


def test_restored_tables_are_the_backends_own_even_without_entries_here() -> None:
    # heap_backend.HeapKeyedStateBackend._restored_table 2, 10, 28-36 and
    # _new_table: a restored table (one with entries in this backend's key
    # groups, one without) has the backend's key groups, max parallelism, key
    # serializer and the state's meta info; its next snapshot says so and restores.
    def backend(key_groups: KeyGroupRange) -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(key_groups, MAX_P, key_serializer=LongSerializer())

    low, high = KeyGroupRange(0, 7), KeyGroupRange(8, 15)
    source = backend(FULL)
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


def test_a_restore_of_keys_of_another_type_is_refused_naming_state_and_key_group() -> None:
    # heap_backend.HeapKeyedStateBackend._prepare 46-54 (E6's message).
    entries = [(f"k{i}", "a", i) for i in range(3)]
    first = min(by_group(entries))
    backend = heap()
    backend.set_current_key(1)  # int keys from now on
    before = dump(backend)
    with pytest.raises(MixedKeyTypesError) as excinfo:
        backend.restore([crafted(by_group(entries))])
    key = next(k for k, _, _ in entries if group_of(k) == first)
    assert str(excinfo.value) == (
        "expected the keys of a restore to be of one type, without NaN or -0.0, state "
        f"'value', key group {first} has str {key!r}: expected a key of type int (fixed "
        f"by the first key), got str: {key!r}"
    )
    assert dump(backend) == before
    backend.close()


def test_an_unregistered_state_restores_with_the_backends_namespace_serializer() -> None:
    # heap_backend.HeapKeyedStateBackend._prepare 38 and 45: namespaces of a
    # state no descriptor names are read with the backend's namespace serializer
    # (a file cannot choose one: this one is not even built in).
    def backend() -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(FULL, MAX_P, key_serializer=SER, namespace_serializer=SER)

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


def test_a_state_registered_between_prepare_and_commit_is_emptied_by_the_commit(
    tmp_path: Path,
) -> None:
    # heap_backend.HeapKeyedStateBackend._prepare 78 (the registered metas the
    # commit makes the empty tables of states absent from the files with).
    backend, staged, _ = _prepared(tmp_path)
    late: ValueStateDescriptor[int] = ValueStateDescriptor("late")
    state = backend.get_state(late)
    backend.set_current_key(1)
    state.update(1)
    staged.commit()
    assert dump(backend) == {**RESTORED, "late": {}}
    meta = backend.table("late").meta
    assert (meta.name, meta.kind, meta.state_serializer) == ("late", "value", late.serializer)
    backend.close()


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
        backend.get_state(42)  # type: ignore[call-overload]
    assert str(other.value) == "expected a state descriptor, got int"
    assert repr(backend) == (
        f"<HeapKeyedStateBackend KeyGroupRange(0, 15) of {MAX_P}, states ['value']>"
    )
    backend.close()


def test_a_state_handle_taken_before_a_restore_reads_the_restored_state(
    tmp_path: Path,
) -> None:
    # keyed_backend.AbstractKeyedStateBackend._install_tables 1-4: the restore
    # swaps the table of the registered state's holder, which the handles hold.
    backend, staged, _ = _prepared(tmp_path)
    handle = backend.get_state(VALUE)
    staged.commit()
    backend.set_current_key(3)
    backend.set_current_namespace("a")
    assert handle.value() == "restored3"
    handle.update("changed")
    assert backend.get_state(VALUE).value() == "changed"
    backend.close()
