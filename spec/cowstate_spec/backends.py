"""Every keyed state backend the backend state machine checks, and the
states it registers on them (one of each kind: ``cowstate_spec.kinds``).

Adding a backend to the whole suite costs one line in :data:`BACKENDS`: a
name, a factory ``(key_group_range, max_parallelism) -> backend``, and how to
read a completed snapshot back as plain dicts (``read``).
"""

from __future__ import annotations

import atexit
import functools
import io
import os
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.descriptors import StateDescriptor
from cowstate.heap_backend import HeapKeyedStateBackend, KeyedStateSnapshotResult
from cowstate.heap_incremental import IncrementalOptions
from cowstate.key_groups import KeyGroupRange
from cowstate.nested_table import NestedMapsStateTable
from cowstate.snapshot import read_snapshot
from cowstate.state_table import CopyOnWriteStateTable, TableFactory
from cowstate_spec.implementations import PureMapsTable
from cowstate_spec.kinds import KINDS, SumCount, add_ints

__all__ = [
    "BACKENDS",
    "DESCRIPTORS",
    "HEAP_INCREMENTAL",
    "MACHINE_INCREMENTAL",
    "BackendImplementation",
    "GatedStream",
    "SumCount",
    "WriteGate",
    "add_ints",
    "backend_named",
    "cleanup_rocksdb_snapshots",
    "heap_backend",
    "heap_incremental_backend",
    "read_heap_snapshot",
    "read_rocksdb_snapshot",
    "rocksdb_backend",
    "snapshot_heap",
    "snapshot_rocksdb",
]

#: ``{state name: {(key, namespace): state}}``
Contents = dict[str, dict[tuple[Any, Any], Any]]


#: One state of each kind (``cowstate_spec.kinds``), registered on every
#: backend under test, by its name (the kind's).
DESCRIPTORS: dict[str, StateDescriptor] = {name: k.descriptor for name, k in KINDS.items()}


class WriteGate:
    """Lets an asynchronous writer make one write per owner operation.

    The writer's stream calls :meth:`pass_through` before every write and
    waits there until the owner thread, which calls :meth:`tick` at the start
    of every operation, grants it a write -- so every snapshot is written
    while the owner keeps operating, block by block. :meth:`open` lets every
    writer run to the end (before waiting for one); :meth:`close` gates again.
    :meth:`await_writer` lets the owner wait until a writer stands at the gate,
    so that a driver grants each write to a writer already waiting for it
    (credits granted earlier would let the writer pass gates unobserved).
    """

    def __init__(self, timeout: float = 60.0) -> None:
        self._condition = threading.Condition()
        self._credits = 0
        self._open = False
        self._timeout = timeout
        self._blocked = 0  # writers waiting in pass_through now

    def tick(self) -> None:
        with self._condition:
            self._credits += 1
            self._condition.notify_all()

    def open(self) -> None:
        with self._condition:
            self._open = True
            self._condition.notify_all()

    def close(self) -> None:
        with self._condition:
            self._open = False
            self._credits = 0

    def await_writer(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait until a writer waits at the gate with no credit left to take
        (True), or ``done()`` (False); TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while not (self._blocked > 0 and self._credits == 0):
                if done():
                    return False
                if time.monotonic() > deadline:
                    raise TimeoutError("the owner waited for a writer for too long")
                self._condition.wait(timeout=0.001)
            return True

    def pass_through(self) -> None:
        with self._condition:
            self._blocked += 1
            self._condition.notify_all()
            try:
                if not self._condition.wait_for(
                    lambda: self._open or self._credits > 0, timeout=self._timeout
                ):
                    raise TimeoutError("the writer waited for the owner for too long")
            finally:
                self._blocked -= 1
            if not self._open:
                self._credits -= 1


class GatedStream(io.BytesIO):
    """A snapshot stream that passes ``gate`` before each write and gives up
    the GIL, so the owner runs between the writer's blocks."""

    def __init__(self, gate: WriteGate) -> None:
        super().__init__()
        self._gate = gate

    def write(self, data: Any) -> int:
        self._gate.pass_through()
        time.sleep(0)
        return super().write(data)


def snapshot_heap(backend: Any, checkpoint_id: int, gate: WriteGate) -> Any:
    """Start a heap backend's snapshot into a gated in-memory stream."""
    return backend.snapshot(checkpoint_id, functools.partial(GatedStream, gate))


def read_heap_snapshot(result: KeyedStateSnapshotResult, backend: Any) -> Contents:
    """The contents of a heap snapshot file, decoded for the full key-group range."""
    if result.handle is None:
        return {}
    restored = read_snapshot(
        result.handle.getvalue(),
        KeyGroupRange(0, backend.max_parallelism - 1),
        max_parallelism=backend.max_parallelism,
    )
    return {
        name: {(key, namespace): state for _, key, namespace, state in restored.entries(name)}
        for name in restored.metas
    }


@dataclass(frozen=True)
class BackendImplementation:
    """How to make one backend, start its snapshots, and read them back.

    ``snapshot(backend, checkpoint_id, gate)`` starts an asynchronous snapshot
    whose writes pass ``gate``; ``read(result, backend)`` decodes a completed
    one as ``{state name: {(key, namespace): state}}``. ``mutations_persist``
    is true where a state object a handle returns is the stored one (the heap:
    mutating it in place changes the state until the next snapshot); false
    where it is a copy (RocksDB: mutating it must change nothing).
    """

    name: str
    factory: Callable[[KeyGroupRange, int], Any]
    read: Callable[[Any, Any], Contents] = read_heap_snapshot
    snapshot: Callable[[Any, int, WriteGate], Any] = snapshot_heap
    mutations_persist: bool = True
    #: The backend's maps track changes (the backend machine checks them:
    #: ``cowstate_spec.backend_machine.ChangeTracking``).
    tracks_changes: bool = False
    #: The share of the profile's examples the backend machine runs on it, its
    #: hostile form the same share of its own (a backend slow to step runs fewer).
    example_share: float = 1.0

    def __repr__(self) -> str:
        return self.name


#: The bounds of the storage machine's heap incremental checkpoints: small, so
#: chains are cut by their length (3 deltas) and removal logs overflow (4
#: records per key group and state) within a run.
MACHINE_INCREMENTAL = IncrementalOptions(max_deltas=3, removal_limit=4)


def heap_incremental_backend(
    key_groups: KeyGroupRange,
    max_parallelism: int,
    backend_class: type[HeapKeyedStateBackend] = HeapKeyedStateBackend,
    options: IncrementalOptions = MACHINE_INCREMENTAL,
) -> HeapKeyedStateBackend:
    """A heap backend with incremental checkpoints over the default maps (the
    C map where built; both maps track changes) of 4 buckets per key group,
    bounded by :data:`MACHINE_INCREMENTAL` (``backend_class``: a broken one the
    storage machine must catch)."""
    return backend_class(
        key_groups,
        max_parallelism,
        functools.partial(CopyOnWriteStateTable, initial_capacity=4),
        incremental=options,
    )


def heap_backend(
    table: TableFactory, key_groups: KeyGroupRange, max_parallelism: int
) -> HeapKeyedStateBackend:
    """A heap backend whose tables start with 4 buckets per key group (the test
    knob that makes chains and incremental rehashes common)."""
    return HeapKeyedStateBackend(
        key_groups, max_parallelism, functools.partial(table, initial_capacity=4)
    )


# ------------------------------------------------------------------- RocksDB
#
# The RocksDB backend snapshots into a SnapshotLocation (its files: SSTs,
# MANIFEST, ...) instead of one stream; the machine reads a snapshot back by
# restoring its handle into a fresh backend. Everything lives under one
# temporary root per process, on tmpfs (/dev/shm) when it has room: RocksDB
# fsyncs its MANIFEST and OPTIONS on every open, column family and
# checkpoint, which on a disk makes the machine ~2.5x slower with the very
# same code paths. Backends keep their instance directory under the root and
# delete it on close. A snapshot's directory lives as long as its handle: it
# is deleted when the handle is garbage-collected (the machine drops its
# handles when a run ends), when the snapshot fails or is cancelled, and at
# interpreter exit at the latest (weakref.finalize; the root too, through
# atexit). ``cleanup_rocksdb_snapshots()`` deletes them all at once.

_ROCKSDB_ROOT: list[str] = []
_TMPFS = "/dev/shm"
_TMPFS_NEEDED = 256 << 20  # a container's 64 MB /dev/shm is not enough room


def _rocksdb_snapshot_root() -> str:
    """The per-process root of the machine's RocksDB directories (made on first use)."""
    if not _ROCKSDB_ROOT:
        on_tmpfs = (
            os.path.isdir(_TMPFS)
            and os.access(_TMPFS, os.W_OK)
            and shutil.disk_usage(_TMPFS).free >= _TMPFS_NEEDED
        )
        root = tempfile.mkdtemp(
            prefix="cowstate-machine-rocksdb-", dir=_TMPFS if on_tmpfs else None
        )
        _ROCKSDB_ROOT.append(root)
        atexit.register(shutil.rmtree, root, True)
    return _ROCKSDB_ROOT[0]


def cleanup_rocksdb_snapshots() -> None:
    """Delete the root: every snapshot directory the RocksDB functions made (close
    the backends first)."""
    if _ROCKSDB_ROOT:
        shutil.rmtree(_ROCKSDB_ROOT.pop(), ignore_errors=True)


def compact_level_zero(backend: Any, files: int) -> None:
    """Compact, synchronously, every column family of a RocksDB ``backend``
    that has ``files`` or more level-0 files: what RocksDB's own trigger would
    do in the background, at a moment the caller chooses. Other backends: no-op."""
    db = getattr(backend, "_db", None)
    if db is None or not hasattr(db, "compact_range"):
        return
    for name in sorted(backend._column_families):
        family = db.get_column_family(name)
        if family.property_int_value("rocksdb.num-files-at-level0") >= files:
            family.compact_range(None, None)


def rocksdb_backend(
    key_groups: KeyGroupRange,
    max_parallelism: int,
    *,
    auto_compactions: bool = True,
) -> Any:
    """A RocksDB backend with its instance directory under the root (removed on close).

    ``auto_compactions=False`` is the storage machine's knob: RocksDB's
    background compactions finish at times no test controls, so which SST
    files a checkpoint uploads (and where an armed fault fires) would depend
    on timing; that machine compacts by hand instead
    (:func:`compact_level_zero`).

    ``cowstate.rocksdb`` is imported here, not at the top: rocksdict is an
    optional dependency (the ``rocksdb`` extra) and the heap backends' users
    of this module must not need it.
    """
    from rocksdict import Options

    from cowstate.rocksdb import RocksDBKeyedStateBackend

    options = None
    if not auto_compactions:
        options = Options(raw_mode=True)
        options.set_keep_log_file_num(1)
        options.set_disable_auto_compactions(True)
    return RocksDBKeyedStateBackend(
        key_groups,
        max_parallelism,
        options=options,
        local_dir=os.path.join(_rocksdb_snapshot_root(), "backends"),
    )


def backend_named(name: str) -> BackendImplementation:
    """The implementation of ``BACKENDS`` called ``name``."""
    for implementation in BACKENDS:
        if implementation.name == name:
            return implementation
    raise KeyError(f"expected a backend of {[b.name for b in BACKENDS]}, got {name!r}")


#: Where each handle of ``snapshot_rocksdb`` was written (its relative paths resolve there).
#: By ``id(handle)`` (equal handles of two snapshots are two entries): the
#: handle (weakly) and its directory; an entry leaves with its handle.
_SNAPSHOT_DIRECTORIES: dict[int, tuple[weakref.ref[Any], str]] = {}


#: The same directories by (backend uid, checkpoint id), registered when the
#: snapshot starts: ``result()`` may return before ``done`` below has run (a
#: future wakes its waiters before it calls its callbacks).
_STARTED_DIRECTORIES: dict[tuple[str, int], str] = {}


def _directory_of(handle: Any) -> str | None:
    entry = _SNAPSHOT_DIRECTORIES.get(id(handle))
    if entry is not None and entry[0]() is handle:
        return entry[1]
    started = (getattr(handle, "backend_uid", None), getattr(handle, "checkpoint_id", None))
    return _STARTED_DIRECTORIES.get(started)  # type: ignore[arg-type]


def snapshot_rocksdb(backend: Any, checkpoint_id: int, gate: WriteGate) -> Any:
    """Start a full RocksDB checkpoint into a fresh directory whose every write
    passes ``gate`` (the future's result is the handle)."""

    def hook(event: str, *_: Any) -> None:
        if event == "write":
            gate.pass_through()
            time.sleep(0)

    directory = os.path.join(
        _rocksdb_snapshot_root(), "snapshots", f"{checkpoint_id}-{uuid.uuid4().hex}"
    )
    location = SnapshotLocation(
        FileSystem(hooks=hook), os.path.join(directory, "chk"), os.path.join(directory, "shared")
    )
    _STARTED_DIRECTORIES[(backend.backend_uid, checkpoint_id)] = os.path.join(directory, "chk")
    future: Future[Any] = backend.snapshot_to(
        checkpoint_id, location, SnapshotOptions(kind="checkpoint", full=True)
    )

    def done(finished: Future[Any]) -> None:
        if finished.cancelled() or finished.exception() is not None:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            handle = finished.result()
            key = id(handle)
            _SNAPSHOT_DIRECTORIES[key] = (weakref.ref(handle), os.path.join(directory, "chk"))
            weakref.finalize(handle, _SNAPSHOT_DIRECTORIES.pop, key, None)
            weakref.finalize(finished.result(), shutil.rmtree, directory, True)

    future.add_done_callback(done)
    return future


def restore_results(backend: Any, results: list[Any]) -> None:
    """``backend.restore(results)``: heap snapshot results as they are, RocksDB
    handles of ``snapshot_rocksdb`` from the directory they were written to."""
    handles = [r for r in results if _is_handle(r)]
    if handles:
        (directory,) = {_directory_of(h) for h in handles}
        assert directory is not None
        backend.restore(results, SnapshotSource(FileSystem(), directory))
    else:
        backend.restore(results)


def _is_handle(result: Any) -> bool:
    return _directory_of(result) is not None


def read_rocksdb_snapshot(result: Any, backend: Any) -> Contents:
    """The contents of a RocksDB snapshot handle, restored into a fresh backend of
    ``backend``'s key-group range and max parallelism."""
    with rocksdb_backend(backend.key_group_range, backend.max_parallelism) as fresh:
        directory = _directory_of(result)
        assert directory is not None, "a RocksDB handle of snapshot_rocksdb"
        fresh.restore_from([result], SnapshotSource(FileSystem(), directory))
        return {
            name: {(key, namespace): state for key, namespace, state in fresh.entries(name)}
            for name in fresh.state_names
        }


#: The backend machine's heap backend with incremental checkpoints (not in
#: :data:`BACKENDS`: its own test, over the full range, for the CI budget):
#: removal logs of 64 records, so the machine checks removals mostly.
HEAP_INCREMENTAL = BackendImplementation(
    "heap-incremental",
    functools.partial(
        heap_incremental_backend, options=IncrementalOptions(max_deltas=3, removal_limit=64)
    ),
    tracks_changes=True,
)

BACKENDS: list[BackendImplementation] = [
    BackendImplementation(
        "heap-cow",  # over cowstate.CopyOnWriteStateMap: the C map
        functools.partial(heap_backend, CopyOnWriteStateTable),
    ),
    BackendImplementation(
        "heap-cow-pure",  # over the pure-Python map
        functools.partial(heap_backend, PureMapsTable),
    ),
    BackendImplementation("heap-nested", functools.partial(heap_backend, NestedMapsStateTable)),
    BackendImplementation(
        "rocksdb",
        rocksdb_backend,
        read=read_rocksdb_snapshot,
        snapshot=snapshot_rocksdb,
        mutations_persist=False,
        example_share=1 / 2,  # a database opened per snapshot and restore: 3x a heap's step
    ),
]
