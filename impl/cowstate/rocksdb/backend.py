"""The RocksDB keyed state backend: the heap backend's state API over an embedded
RocksDB (through ``rocksdict``), with incremental checkpoints, native and
canonical savepoints, and restores with rescaling (Flink's
``RocksDBKeyedStateBackend`` and ``RocksIncrementalSnapshotStrategy``).

This docstring is the design of the whole :mod:`cowstate.rocksdb` package;
the backend class keeps the state API, the base bookkeeping, the synchronous
part of snapshots and the restore decisions. The asynchronous part is
:mod:`cowstate.rocksdb.snapshot`, building restored databases
:mod:`cowstate.rocksdb.restore`, the instance directory and database helpers
:mod:`cowstate.rocksdb.db`, the table and key layout :mod:`cowstate.rocksdb.table`.

Storage
=======

One RocksDB instance per backend, opened in raw mode (keys and values are the
bytes we give), in ``<local_dir>/cowstate-rocksdb-<uuid>/db-<uuid>/``. Each
registered state gets its own column family (``state.<name>``, or
``state-hex.<hex of the UTF-8 name>`` for names with other characters than
``[A-Za-z0-9_.-]``), created on registration. Writes skip the write-ahead
log: durability comes from checkpoints, as in Flink. The key layout
(:mod:`cowstate.rocksdb.table`)::

    +----------+--------------+-----------------+-----------------+   value:
    | kg (2 B) | len(key) 4 B | key bytes       | namespace bytes |   state bytes
    +----------+--------------+-----------------+-----------------+
     big-endian, so the keys of key groups [a, b] are exactly the byte range
     [a.to_bytes(2), (b + 1).to_bytes(2)) of every column family

so a key-group range is one contiguous key range: one seek to read it, one
``delete_range`` to drop it. The bytes are the serializers' own (key
serializer, namespace serializer, state serializer), so the canonical
snapshot format (:mod:`cowstate.snapshot`) is written and read without
deserializing anything.

Snapshots (``snapshot_to``)
===========================

1. Synchronous part, on the caller's (owner's) thread:

   a. ``Checkpoint(db).create_checkpoint(<instance>/checkpoints/chk-<id>)``:
      RocksDB flushes the memtables of every column family, then hard-links
      the live SST files and copies MANIFEST, CURRENT, OPTIONS (and a
      0-byte WAL) into the directory. Writes made afterwards never reach it.
   b. Capture what the writer needs: the state meta info (names, kinds,
      serializer identifiers, column families, in registration order), the
      backend UID, the restore generation, and -- under the lock -- the
      *base*: the SST map of the last **confirmed** checkpoint for a regular
      checkpoint, nothing for a full checkpoint or a savepoint.

2. Asynchronous part, on the backend's single writer thread:

   - checkpoint (native format): every ``*.sst`` whose name is in the base
     (with the same size) is referenced by the base's own ``FileHandle``;
     every other SST is uploaded as a **shared** file; every other file
     (MANIFEST-*, CURRENT, OPTIONS-*, the WAL, rocksdict-config.json) is
     uploaded **exclusive** as ``rocksdb-<start>-<end>/<name>`` (unique per
     subtask). The SST map ``{local name: FileHandle}`` of the checkpoint is
     recorded as a candidate base *before* the future completes.
   - native savepoint: the same files, every one uploaded exclusive under
     ``rocksdb-<start>-<end>/`` (relative handles if the location is), nothing
     reused, nothing recorded: a savepoint never changes the base.
   - canonical savepoint: the local checkpoint is opened read-only as a second
     RocksDB, every column family is read in key order, key group by key
     group, and written as ONE snapshot file ``keyed-state-<start>-<end>``
     (format ``canonical``) any backend restores.

   The handle reports ``checkpointed_size`` (bytes this snapshot uploaded)
   beside ``full_size`` (bytes of every file it references). Whatever
   happens -- success, failure (:class:`~cowstate.errors.SnapshotWriteError`
   with the cause), or cancellation (checked before every file and every key
   group; :class:`~cowstate.errors.SnapshotCancelledError`) -- the local
   checkpoint directory is deleted before the future completes. Partial
   uploads stay in the location for its owner to ``discard()``.

The base rules
==============

- ``notify_checkpoint_complete(n)``: if ``n`` was recorded and is newer than
  the last confirmed checkpoint, it becomes the base and older records are
  dropped. Unknown ids (savepoints, aborted or failed checkpoints, ids of
  another restore generation) and older ids are ignored (FLINK-23949).
- ``notify_checkpoint_aborted(n)``: its record is dropped (also if its
  writer finishes later).
- A pending, aborted or failed checkpoint is never a base (FLINK-25395); a
  full checkpoint reuses nothing but, once confirmed, is a base.
- After a restore the previous records are void (another database). A
  non-rescaling restore (exactly one handle, with this backend's key-group
  range) of a *checkpoint* with ``incremental_base=True`` seeds the base with
  that handle's shared SSTs and keeps its backend UID; any other restore
  (rescaling, ``incremental_base=False``, a native savepoint -- it has no
  shared files, a canonical snapshot) leaves no base: the first checkpoint
  is full.

Restores (``prepare_restore``, then ``commit()``)
=================================================

1. Refuse no handles, a heap snapshot
   (:class:`~cowstate.errors.IncompatibleSnapshotError`: take a canonical
   savepoint to change backends) and mixed formats; keep the handles whose
   key groups meet this backend's (``overlapping``), each key group in one
   handle only.
2. Check every handle against this backend: max parallelism, key serializer,
   namespace serializer, and kind and state serializer of registered states
   (C1-C5 of :mod:`cowstate.snapshot.compat`; formats are C6).
3. Build the new database in a fresh directory, never touching the live one:

   - canonical: read each file (size and CRC32 checked), validate its
     metadata (and that it holds what its handle says), decode and check
     every entry of this backend's key groups (E1-E6 of
     :mod:`cowstate.snapshot.checks`), and write the raw entries with
     ``WriteBatch`` into new column families;
   - native: download each handle's files under their local names (size and
     CRC32 checked: :class:`~cowstate.errors.CorruptCheckpointError`), open
     with ``create_if_missing=False`` and every column family. One handle of
     the same range is the new database as it is. Otherwise (rescaling) the
     handle sharing most key groups is opened read-write and everything
     outside this backend's range is dropped with ``delete_range`` in every
     column family; every other handle is opened read-only and the keys of
     this range are copied over (``seek`` + upper bound), each entry decoded
     and checked (E1-E3), then it is closed and deleted. Reads check the
     iterator's status: a corrupt block is a
     :class:`~cowstate.errors.CorruptCheckpointError`, never fewer entries.

   Every state the backend has gets its column family in the new database.
   Steps 1-3 are ``prepare_restore``, which returns a
   :class:`RocksDBPreparedRestore` holding the new database.

4. Only then swap (``commit()``; ``restore_from`` is prepare and commit):
   the old tables are detached, the old database is closed and deleted,
   every restored state gets a table (registered states missing from the
   snapshot become empty), and the base is reset as above. Any failure
   before the swap -- or ``discard()`` -- deletes what was built and leaves
   the backend exactly as it was.

Thread model
============

The owner thread does everything but the asynchronous part: state access,
``snapshot_to``'s synchronous part, ``notify_*``, restores and ``close``.
The writer thread (one per backend, or the given executor) touches only its
local checkpoint directory (hard links: independent of later writes,
compactions and restores of the live database) and the location. They
share the base bookkeeping and the set of pending snapshots, under one lock.
``close()`` requests every pending snapshot to stop, waits for the writer,
detaches every table and releases every column family, iterator and
checkpoint object before closing the database (rocksdict keeps a database
open while any of them lives), then deletes the instance directory (and
``local_dir`` when the backend made it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

from rocksdict import Checkpoint, Options

from cowstate.checkpoint.handles import FileHandle, KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.errors import (
    InvalidArgumentError,
    SnapshotWriteError,
)
from cowstate.key_groups import KeyGroupRange
from cowstate.key_types import KeyTypes
from cowstate.keyed_backend import AbstractKeyedStateBackend, SnapshotFuture, StagedRestore
from cowstate.rocksdb.db import (
    Database,
    InstanceDirectory,
    check_raw_mode,
    column_family_name,
    remove_local_checkpoint,
    remove_trees,
)
from cowstate.rocksdb.restore import Restorer
from cowstate.rocksdb.snapshot import SnapshotJob, StateSnapshot, write
from cowstate.rocksdb.table import (
    RocksDBStateTable,
)
from cowstate.serializers import StateSerializer, serializer_identifier
from cowstate.snapshot import SnapshotMetadata
from cowstate.snapshot.compat import check_one_format
from cowstate.state_meta import SnapshotFormat, StateMetaInfo

__all__ = [
    "NATIVE_FORMAT",
    "RocksDBKeyedStateBackend",
    "RocksDBPreparedRestore",
    "RocksDBSnapshotFuture",
    "column_family_name",
]

#: The handle format of RocksDB checkpoints and native savepoints.
NATIVE_FORMAT = SnapshotFormat.ROCKSDB_NATIVE
CANONICAL_FORMAT = SnapshotFormat.CANONICAL


#: The future of a RocksDB snapshot (cancellation as for the heap backend).
RocksDBSnapshotFuture = SnapshotFuture[KeyedStateHandle]


class RocksDBKeyedStateBackend(AbstractKeyedStateBackend[RocksDBStateTable[Any, Any, Any]]):
    """Keyed state in an embedded RocksDB for the key groups of ``key_group_range``.

    ``local_dir`` holds the instance directory (database, local checkpoints,
    restore scratch); by default a fresh temporary directory, removed on
    close. ``options`` must be ``rocksdict.Options(raw_mode=True)``; the
    backend sets ``create_if_missing`` and ``create_missing_column_families``
    on it. See the module doc for the design.
    """

    backend_name = "rocksdb"
    native_format = NATIVE_FORMAT

    def __init__(
        self,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        *,
        local_dir: str | os.PathLike[str] | None = None,
        key_serializer: StateSerializer | None = None,
        namespace_serializer: StateSerializer | None = None,
        executor: Executor | None = None,
        options: Options | None = None,
    ) -> None:
        super().__init__(
            key_group_range,
            max_parallelism,
            key_serializer=key_serializer,
            namespace_serializer=namespace_serializer,
            executor=executor,
            writer_thread_name="cowstate-rocksdb-snapshot",
        )
        if options is not None and not isinstance(options, Options):
            raise InvalidArgumentError(
                f"expected rocksdict.Options(raw_mode=True) or None, got {type(options).__name__}"
            )
        if options is None:
            options = Options(raw_mode=True)
            options.set_keep_log_file_num(1)
        options.create_missing_column_families(True)
        options.create_if_missing(True)
        self._options = options
        self._own_local_dir = local_dir is None
        self._local_dir = Path(
            tempfile.mkdtemp(prefix="cowstate-rocksdb-")
            if local_dir is None
            else os.fspath(local_dir)
        ).absolute()
        self._root = self._local_dir / f"cowstate-rocksdb-{uuid.uuid4().hex[:12]}"
        self._instance = InstanceDirectory(self._root, options)
        self._uploaded: dict[int, dict[str, FileHandle]] = {}
        self._last_completed = -1
        self._aborted: set[int] = set()
        self._generation = 0
        self._backend_uid = uuid.uuid4().hex
        self._tables: list[RocksDBStateTable[Any, Any, Any]] = []
        try:
            self._root.mkdir(parents=True)
            (self._root / "checkpoints").mkdir()
            built = self._instance.open_fresh()
            check_raw_mode(built)
        except BaseException:
            self._remove_directories()
            raise
        self._db = built.db
        self._db_path = built.path
        self._column_families = built.column_families
        # A backend dropped without close() still leaves no directory behind.
        self._finalizer = weakref.finalize(
            self, remove_trees, self._root, self._local_dir if self._own_local_dir else None
        )

    # ------------------------------------------------------------ inspection

    @property
    def instance_path(self) -> Path:
        """The directory of this backend's database, local checkpoints and scratch."""
        return self._root

    @property
    def db_path(self) -> Path:
        """The directory of the live database."""
        return self._db_path

    @property
    def local_checkpoints_path(self) -> Path:
        """Where the synchronous part puts local checkpoints (empty when none runs)."""
        return self._instance.checkpoints

    @property
    def backend_uid(self) -> str:
        """The lineage of the database's files (reused by a non-rescaling restore)."""
        return self._backend_uid

    @property
    def last_completed_checkpoint_id(self) -> int:
        """The last confirmed checkpoint whose SSTs are the base (-1: none)."""
        with self._lock:
            return self._last_completed

    @property
    def incremental_base(self) -> dict[str, FileHandle]:
        """The SSTs the next regular checkpoint may reuse (local name -> handle)."""
        with self._lock:
            return dict(self._uploaded.get(self._last_completed, {}))

    @property
    def recorded_checkpoints(self) -> list[int]:
        """The checkpoints whose SST maps are kept (candidates for the base)."""
        with self._lock:
            return sorted(self._uploaded)

    def __enter__(self) -> RocksDBKeyedStateBackend:
        return self

    # ------------------------------------------------ checkpoints and savepoints

    def snapshot_to(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        """Take the synchronous part now; the future uploads and gives the handle
        (see the module doc for what each kind of snapshot writes)."""
        self._check_snapshot_to(checkpoint_id, location, options)
        if not options.is_savepoint and location.shared_directory is None:
            raise InvalidArgumentError(
                "expected a checkpoint location with a shared directory for the SST files, "
                "got one without (a savepoint location?)"
            )
        local_dir = self._instance.new_local_checkpoint_dir(checkpoint_id)
        try:
            checkpoint = Checkpoint(self._db)
            try:
                checkpoint.create_checkpoint(str(local_dir))
            finally:
                del checkpoint  # it keeps the database open
        except Exception as exc:
            remove_local_checkpoint(local_dir)
            raise SnapshotWriteError(
                f"expected RocksDB to take local checkpoint {checkpoint_id} in "
                f"{str(local_dir)!r}, got {type(exc).__name__}: {exc}"
            ) from exc
        states = tuple(
            StateSnapshot(holder.table.meta.metadata(state_id), column_family_name(name))
            for state_id, (name, holder) in enumerate(self._holders.items())
        )
        with self._lock:
            base = (
                dict(self._uploaded.get(self._last_completed, {})) if options.reuses_files else {}
            )
            job = SnapshotJob(
                checkpoint_id,
                options,
                location,
                local_dir,
                base,
                states,
                serializer_identifier(self._key_serializer),
                self._backend_uid,
                self._generation,
                self.key_group_range,
                self.max_parallelism,
            )
        return self._start_async(
            checkpoint_id,
            functools.partial(write, job),
            cleanup=functools.partial(remove_local_checkpoint, local_dir),
            failure="its local checkpoint was deleted",
            commit=functools.partial(self._record, job),
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is confirmed: its SSTs become the base.
        Unknown ids (savepoints, aborted or failed checkpoints) and ids older
        than the last confirmed one are ignored."""
        with self._lock:
            if checkpoint_id not in self._uploaded or checkpoint_id <= self._last_completed:
                return
            self._last_completed = checkpoint_id
            for older in [n for n in self._uploaded if n < checkpoint_id]:
                del self._uploaded[older]
            self._aborted = {n for n in self._aborted if n > checkpoint_id}

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete: drop its record (now,
        or when its writer finishes)."""
        with self._lock:
            if checkpoint_id == self._last_completed:
                return  # confirmed: it cannot abort
            self._uploaded.pop(checkpoint_id, None)
            if checkpoint_id > self._last_completed:
                self._aborted.add(checkpoint_id)

    def prepare_restore(
        self,
        handles: Sequence[KeyedStateHandle],
        source: SnapshotSource,
        *,
        incremental_base: bool = False,
    ) -> RocksDBPreparedRestore:
        """Build the database of the handles of one snapshot (RocksDB native or
        canonical) beside the live one, every check done, changing nothing;
        ``commit()`` switches to it (see the module doc)."""
        mine = self._handles_to_read(handles, source)
        formats = sorted({h.format for h in handles})
        check_one_format(formats)  # C6
        metas = self._check_handles(mine)
        same_range = (
            len(mine) == 1 and KeyGroupRange.of(*mine[0].key_group_range) == self.key_group_range
        )
        restorer = Restorer(
            self._instance,
            self.key_group_range,
            self.max_parallelism,
            self._key_serializer,
            self._context.key_types.copy(),  # E6: committed with the database
        )
        seed: tuple[int, dict[str, FileHandle]] | None = None
        backend_uid = uuid.uuid4().hex
        if formats == [CANONICAL_FORMAT]:
            built = restorer.from_canonical(mine, source, metas, self._check_file)
        else:
            built = restorer.from_native(mine, source, metas, same_range)
            if same_range:
                handle = mine[0]
                backend_uid = handle.backend_uid or backend_uid
                shared = {f.local_name: f for f in handle.shared_files if f.local_name}
                if incremental_base and shared:
                    seed = (handle.checkpoint_id, shared)
        try:  # every state the backend will have gets its column family now
            for name in self._holders:
                self._instance.ensure_column_family(built, column_family_name(name))
        except BaseException:
            built.discard()
            raise
        return RocksDBPreparedRestore(self, built, metas, seed, backend_uid, restorer.key_types)

    def restore(
        self, handles: Iterable[KeyedStateHandle], source: SnapshotSource | None = None
    ) -> None:
        """``restore_from(handles, source)`` without an incremental base (``source``:
        the snapshot's directory, where its relative paths resolve). At
        least one handle is required (``restore([])`` raises
        :class:`~cowstate.errors.InvalidArgumentError` instead of emptying
        every state)."""
        self._check_open()
        if isinstance(handles, KeyedStateHandle) or not isinstance(handles, Iterable):
            raise InvalidArgumentError(
                f"expected an iterable of KeyedStateHandles, got {type(handles).__name__}"
            )
        handles = list(handles)
        if not handles:
            raise InvalidArgumentError(
                "expected at least one handle to restore from, got none: restore([]) would "
                "empty every state"
            )
        if source is None:
            raise InvalidArgumentError(
                "expected the SnapshotSource of the snapshot's directory (handles' paths are "
                "relative to it), got None"
            )
        self.restore_from(handles, source)

    def _release_resources(self) -> None:
        """Close and delete the database (no writer runs any more)."""
        self._detach_tables()
        with contextlib.suppress(Exception):
            self._db.close()
        self._remove_directories()

    # ------------------------------------------------------------- tables

    def _new_table(self, meta: StateMetaInfo) -> RocksDBStateTable[Any, Any, Any]:
        self._check_open()
        name = column_family_name(meta.name)
        if name in self._column_families:
            cf = self._db.get_column_family(name)
        else:
            cf = self._db.create_column_family(name, self._options)
            self._column_families.add(name)
        table: RocksDBStateTable[Any, Any, Any] = RocksDBStateTable(
            cf,
            self.key_group_range,
            self.max_parallelism,
            meta=meta,
            key_serializer=self._key_serializer,
        )
        del cf
        self._tables.append(table)
        return table

    def _detach_tables(self) -> None:
        for table in self._tables:
            table.detach()
        self._tables.clear()

    # ------------------------------------------------- writer bookkeeping

    def _record(self, job: SnapshotJob, handle: KeyedStateHandle) -> None:
        """Keep a written checkpoint's SSTs as a candidate base (under the lock):
        not a savepoint's, nor one aborted, superseded or of an older database."""
        if (
            not job.options.is_savepoint
            and job.generation == self._generation
            and job.checkpoint_id not in self._aborted
            and job.checkpoint_id > self._last_completed
        ):
            self._uploaded[job.checkpoint_id] = job.ssts

    # ------------------------------------------------------------- restores

    def _check_file(
        self,
        handle: KeyedStateHandle,
        path: str,
        metadata: SnapshotMetadata,
        metas: dict[str, StateMetaInfo],
    ) -> None:
        """A canonical file (at ``path``, of ``handle``) this backend restores: it
        holds what its handle says, and its states' meta info go to ``metas``."""
        self._check_file_of(handle, path, metadata)
        self._check_snapshot(metadata.max_parallelism, metadata.key_serializer, "file")
        for state in metadata.states:
            self._restored_meta(state, metas)

    def _swap(
        self,
        built: Database,
        metas: dict[str, StateMetaInfo],
        seed: tuple[int, dict[str, FileHandle]] | None,
        backend_uid: str,
    ) -> None:
        """Make ``built`` the live database (everything was checked)."""
        registered = self._registered_metas()
        old_db, old_path = self._db, self._db_path
        self._detach_tables()
        self._db, self._db_path, self._column_families = built.db, built.path, built.column_families
        tables = {name: self._new_table(registered.get(name, meta)) for name, meta in metas.items()}
        self._install_tables(dict(tables), registered)
        with self._lock:
            self._generation += 1
            self._aborted = set()
            self._backend_uid = backend_uid
            if seed is None:
                self._uploaded, self._last_completed = {}, -1
            else:
                self._uploaded, self._last_completed = {seed[0]: seed[1]}, seed[0]
        with contextlib.suppress(Exception):
            old_db.close()
        del old_db
        shutil.rmtree(old_path, ignore_errors=True)

    # ------------------------------------------------------ private helpers

    def _remove_directories(self) -> None:
        remove_trees(self._root, self._local_dir if self._own_local_dir else None)


class RocksDBPreparedRestore(StagedRestore):
    """A RocksDB restore built and checked in a database beside the live one
    (:meth:`RocksDBKeyedStateBackend.prepare_restore`): ``commit()`` switches
    the backend to it (the old database is closed and deleted),
    ``discard()`` closes and deletes it."""

    def __init__(
        self,
        backend: RocksDBKeyedStateBackend,
        built: Database,
        metas: dict[str, StateMetaInfo],
        seed: tuple[int, dict[str, FileHandle]] | None,
        backend_uid: str,
        key_types: KeyTypes | None = None,
    ) -> None:
        super().__init__(backend, key_types, metas)
        self._rocks = backend
        self._built = built
        self._seed = seed
        self._backend_uid = backend_uid

    @property
    def path(self) -> Path:
        """The directory of the staged database."""
        return self._built.path

    def _apply(self) -> None:
        self._rocks._swap(self._built, self._metas, seed=self._seed, backend_uid=self._backend_uid)

    def _drop(self) -> None:
        self._built.discard()
