"""The heap keyed state backend: named keyed states in state tables, with
asynchronous snapshots (Flink's ``HeapKeyedStateBackend``).

The state API (key context, registration, handles) is
:class:`~cowstate.keyed_backend.AbstractKeyedStateBackend`'s. Each state gets a
table from ``table_factory``: :class:`~cowstate.state_table.CopyOnWriteStateTable`
by default, :class:`~cowstate.state_table.NestedMapsStateTable` for synchronous
snapshots.

A checkpoint (``snapshot_to(id, location, options)``, what the checkpoint
coordinator calls) has two parts::

    owner thread                          writer thread (one per backend)
    ------------                          -------------------------------
    snapshot_to(id, location, options)
      sync: table.snapshot() for every
      state, in registration order  --->  _write_to:
      returns a SnapshotFuture              stream = location.exclusive_stream(name)
    keeps processing: puts, gets,           for kg in range (ascending):
    mutations in place ...                    if cancelled: stop
    (copy-on-write keeps the                  write kg of every state
     snapshot's view intact)                  release kg's map snapshots
                                            write the index; close_and_get_handle()
                                            the future's result: a KeyedStateHandle
                                          release everything left, in all cases

Everything the writer needs (table snapshots with duplicated serializers,
state ids, meta info, the file's name) is captured in the synchronous part
(FLINK-9269, FLINK-6207), so registering states or changing serializers
afterwards does not reach a running writer. Every map snapshot is released
when its key group is written, and all that remain when the write succeeds,
fails or is cancelled (FLINK-13469): the copy-on-write maps stop copying.

With ``incremental=True`` (or :class:`~cowstate.heap_incremental.IncrementalOptions`)
a checkpoint taken by ``snapshot_to`` is a chain of shared files -- a full
base, then deltas of what changed since the last confirmed checkpoint -- and
a restore folds it (:mod:`cowstate.heap_incremental`, rules I1-I5: when a
checkpoint is full, what a restore checks). Every table's maps then track
changes (rules T and D of :mod:`cowstate.state_map`, which the C map follows
too); a table whose maps cannot (the nested table) makes every checkpoint
full. Savepoints and ``snapshot`` are as
without it.

``snapshot(id, stream_factory)`` is the same snapshot into a stream of the
caller's (``io.BytesIO`` for one in memory): the same synchronous part, the
same file written by ``_write``, a :class:`KeyedStateSnapshotResult` instead
of a handle.

``prepare_restore(handles, source)`` rebuilds every state for this backend's
key-group range from the snapshot files of a checkpoint or savepoint,
possibly written by backends with other ranges (rescaling), and returns a
:class:`HeapPreparedRestore` (``restore_from`` commits it at once);
``restore(snapshot_streams)`` does the same from files the caller holds
(bytes, streams, snapshot results) and commits. Both go the same way, and a
bad file leaves the backend exactly as it was:

1. every file's metadata is checked first (format, max parallelism, key and
   namespace serializers: C6, C1-C3 of :mod:`cowstate.snapshot.compat`; with
   handles, each file against its handle), so no byte is decoded from a file
   the backend would refuse;
2. every file is parsed and decoded in one pass per key group
   (:meth:`~cowstate.snapshot.reader.SnapshotReader.decode_key_group`; a
   namespace is decoded once per distinct bytes), every entry checked
   (E1-E3 of :mod:`cowstate.snapshot.checks`);
3. new tables are built beside the live ones, each key group's map sized for
   its entries (for the table classes of :mod:`cowstate.state_table`) and
   filled directly; a ``put`` that did not insert is a mapping given twice
   (E4);
4. ``commit()`` swaps the new tables in (registered states absent from the
   files become empty, their empty tables made in step 3): no I/O, no
   decoding, nothing that fails on checked data.
"""

from __future__ import annotations

import contextlib
import functools
import io
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import IO, Any, Protocol, TypeVar, cast

from cowstate.arithmetic import DEFAULT_CAPACITY, clamp_capacity
from cowstate.checkpoint.handles import FileHandle, KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import LocationStream, SnapshotLocation, SnapshotSource
from cowstate.collector import paused_collector
from cowstate.errors import (
    InvalidArgumentError,
    KeyGroupMismatchError,
)
from cowstate.heap_incremental import (
    Chain,
    IncrementalOptions,
    Removals,
    check_chain,
    check_chain_base,
    check_chain_handle,
    fold_deltas,
    held_removals,
    read_removals,
    write_removals,
)
from cowstate.key_groups import KeyGroupRange
from cowstate.key_types import KeyTypes
from cowstate.keyed_backend import AbstractKeyedStateBackend, SnapshotFuture, StagedRestore
from cowstate.serializers import StateSerializer, serializer_identifier
from cowstate.snapshot import (
    BinaryWriter,
    RestoredSnapshot,
    SnapshotFileInfo,
    SnapshotReader,
    ccodec,
    read_snapshot,
    write_snapshot,
)
from cowstate.snapshot.checks import DecodedBlock, check_key_types, duplicate_error
from cowstate.snapshot.compat import check_heap_file_format
from cowstate.snapshot.format import SnapshotMetadata
from cowstate.state_meta import SnapshotFormat, StateMetadata, StateMetaInfo
from cowstate.state_table import (
    CopyOnWriteStateTable,
    CopyOnWriteStateTableSnapshot,
    StateTable,
    StateTableSnapshot,
    TableFactory,
)

__all__ = [
    "HEAP_FORMAT",
    "HeapKeyedStateBackend",
    "HeapPreparedRestore",
    "KeyedStateSnapshotResult",
    "SnapshotFuture",
    "StreamFactory",
]

#: The format heap snapshots record; canonical files restore too.
HEAP_FORMAT = SnapshotFormat.HEAP
RESTORABLE_FORMATS = frozenset({SnapshotFormat.HEAP, SnapshotFormat.CANONICAL})

#: Makes the stream a snapshot is written to (called on the writer thread).
#: If the stream has ``close_and_get_handle()``, its result becomes the
#: snapshot's handle; if it has ``discard()``, a failed write calls it.
StreamFactory = Callable[[], BinaryWriter]
R = TypeVar("R")


@dataclass(frozen=True)
class KeyedStateSnapshotResult:
    """A completed snapshot: where it went and what it holds.

    ``handle`` is what the stream's ``close_and_get_handle()`` returned, or
    the stream itself; both are ``None`` for a backend without states.
    """

    checkpoint_id: int
    key_group_range: KeyGroupRange
    info: SnapshotFileInfo | None
    handle: Any

    @property
    def size(self) -> int:
        return 0 if self.info is None else self.info.size


class HeapKeyedStateBackend(AbstractKeyedStateBackend[StateTable[Any, Any, Any]]):
    """Keyed state on the heap for the key groups of ``key_group_range``."""

    backend_name = "heap"
    native_format = HEAP_FORMAT

    def __init__(
        self,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        table_factory: TableFactory = CopyOnWriteStateTable,
        *,
        key_serializer: StateSerializer | None = None,
        namespace_serializer: StateSerializer | None = None,
        executor: Executor | None = None,
        incremental: IncrementalOptions | bool = False,
    ) -> None:
        super().__init__(
            key_group_range,
            max_parallelism,
            key_serializer=key_serializer,
            namespace_serializer=namespace_serializer,
            executor=executor,
            writer_thread_name="cowstate-snapshot",
        )
        if not callable(table_factory):
            raise InvalidArgumentError(
                f"expected a table factory, got {type(table_factory).__name__}"
            )
        self._table_factory = table_factory
        if incremental is True:
            incremental = IncrementalOptions()
        if incremental is not False and not isinstance(incremental, IncrementalOptions):
            raise InvalidArgumentError(
                f"expected incremental=True, False or IncrementalOptions, got {incremental!r}"
            )
        #: None: every checkpoint full and exclusive (heap_incremental's I1-I5 off).
        self._incremental: IncrementalOptions | None = incremental or None
        # Candidate bases (written, not yet confirmed), the confirmed base, the
        # aborted ids, and the restore generation that voids both (under the lock).
        self._written: dict[int, Chain] = {}
        self._base: Chain | None = None
        self._aborted: set[int] = set()
        self._generation = 0

    @property
    def incremental(self) -> IncrementalOptions | None:
        """The bounds of incremental checkpoints, or None when every one is full."""
        return self._incremental

    @property
    def base_chain(self) -> Chain | None:
        """The confirmed checkpoint the next incremental checkpoint builds on."""
        with self._lock:
            return self._base

    # ------------------------------------------------ checkpoints and savepoints

    def snapshot_to(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        """Take the synchronous part now; the future writes one snapshot file into
        ``location`` and gives its handle. The file is canonical for a canonical
        savepoint, else heap. With incremental checkpoints a checkpoint is a
        chain of shared files instead (:mod:`cowstate.heap_incremental`); a
        savepoint is always one exclusive file (I1)."""
        self._check_snapshot_to(checkpoint_id, location, options)
        if self._incremental is not None and not options.is_savepoint:
            return self._checkpoint_chain(checkpoint_id, location, options)
        snapshot_format = (
            SnapshotFormat.CANONICAL
            if options.is_savepoint and options.format == "canonical"
            else HEAP_FORMAT
        )
        snapshots = self._snapshot_tables()
        if not snapshots:  # an empty backend writes nothing
            return _done(checkpoint_id, self._handle_of(checkpoint_id, snapshot_format, (), ()))
        r = self.key_group_range
        return self._start_async(
            checkpoint_id,
            functools.partial(
                self._write_to,
                snapshots,
                location,
                f"keyed-state-{r.start_key_group}-{r.end_key_group}",
                snapshot_format,
            ),
            cleanup=functools.partial(_release, snapshots),
            failure="its resources were released",
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is confirmed: with incremental
        checkpoints its chain becomes the base (I1); unknown and older ids
        are ignored."""
        with self._lock:
            chain = self._written.get(checkpoint_id)
            if chain is None or (
                self._base is not None and checkpoint_id <= self._base.checkpoint_id
            ):
                return
            self._base = chain
            for older in [n for n in self._written if n <= checkpoint_id]:
                del self._written[older]
            self._aborted = {n for n in self._aborted if n > checkpoint_id}

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete: it is no base (now,
        or when its writer finishes)."""
        with self._lock:
            if self._base is not None and checkpoint_id == self._base.checkpoint_id:
                return  # confirmed: it cannot abort
            self._written.pop(checkpoint_id, None)
            self._aborted.add(checkpoint_id)

    def prepare_restore(
        self,
        handles: Sequence[KeyedStateHandle],
        source: SnapshotSource,
        *,
        incremental_base: bool = False,
    ) -> HeapPreparedRestore:
        """Read, verify and decode the heap or canonical handles of one snapshot
        into new tables, changing nothing; ``commit()`` installs them.

        Reads only the handles meeting this backend's key groups (each key
        group in one handle only); each file is checked against its handle's
        size and CRC32 and must hold the handle's key groups, format and
        states. A handle of an incremental checkpoint lists a chain, checked
        and folded (I3-I5 of :mod:`cowstate.heap_incremental`).
        ``incremental_base`` is ignored: after any restore the first
        checkpoint is full (I2).
        """
        mine = self._handles_to_read(handles, source)
        self._check_handles(mine)
        readers: list[SnapshotReader] = []
        chains: list[list[SnapshotReader]] = []
        fs = source.filesystem
        job = fs.name(fs.parent(source.directory))
        for handle in mine:
            if handle.format is SnapshotFormat.HEAP and len(handle.files) > 1:
                where = f"the handle of key groups {list(handle.key_group_range)}"
                check_chain_handle(handle, job, where)  # I4: before reading a file
                chain = [SnapshotReader(source.read(file)) for file in handle.files]
                check_chain(handle, chain, job, where)
                chains.append(chain)
                continue
            for file in handle.files:
                reader = SnapshotReader(source.read(file))
                self._check_file_of(handle, source.path(file), reader.metadata)
                check_chain_base(handle, reader.metadata, source.path(file))  # I3
                readers.append(reader)
        return self._prepare(readers, chains)

    # ------------------------------------------------------------- reclamation

    @property
    def pending_reclaim(self) -> int:
        """Map entries a checkpoint's writer released and left to the owner to
        free (rule G of ``_cmap.c``): each keyed write frees up to 4 of them,
        so the writer's thread never stops the owner to free them."""
        return sum(getattr(h.table, "pending_reclaim", 0) for h in self._holders.values())

    def reclaim(self) -> int:
        """Free every entry :attr:`pending_reclaim` counts now (an owner about
        to go idle returns the memory at once); the count freed."""
        tables = [h.table for h in self._holders.values()]
        return sum(t.reclaim() for t in tables if hasattr(t, "reclaim"))

    # ------------------------------------------- snapshots in the caller's streams

    def snapshot(
        self,
        checkpoint_id: int,
        stream_factory: StreamFactory,
        *,
        snapshot_format: SnapshotFormat = HEAP_FORMAT,
    ) -> SnapshotFuture[KeyedStateSnapshotResult]:
        """:meth:`snapshot_to`'s snapshot file written into ``stream_factory()``
        (called on the writer thread) instead of a checkpoint location.

        The result's ``handle`` is ``stream.close_and_get_handle()`` when the
        stream has it, else the stream (rewound ``BytesIO`` callers can read);
        :meth:`restore` takes the result. ``snapshot_format`` is recorded in
        the file: ``"heap"`` (the heap's native format) or ``"canonical"`` (a
        canonical savepoint, any backend restores it).
        """
        self._check_open()
        if snapshot_format not in RESTORABLE_FORMATS:
            raise InvalidArgumentError(
                f"expected a snapshot format in {sorted(RESTORABLE_FORMATS)}, got "
                f"{snapshot_format!r}"
            )
        self._check_checkpoint_id(checkpoint_id)
        if not callable(stream_factory):
            raise InvalidArgumentError(
                f"expected a callable stream factory, got {type(stream_factory).__name__}"
            )
        snapshots = self._snapshot_tables()
        if not snapshots:  # an empty backend writes nothing
            return _done(
                checkpoint_id,
                KeyedStateSnapshotResult(checkpoint_id, self.key_group_range, None, None),
            )
        return self._start_async(
            checkpoint_id,
            functools.partial(self._write, snapshots, stream_factory, snapshot_format),
            cleanup=functools.partial(_release, snapshots),
            failure="its resources were released",
        )

    def restore(self, snapshot_streams: Iterable[Any]) -> None:
        """Rebuild every state for this backend's key groups from snapshot files
        the caller holds: :meth:`prepare_restore` and ``commit()`` in one.

        Each item is the bytes of a file, a binary stream, a
        :class:`KeyedStateSnapshotResult` (that of a backend without states
        holds no file: it restores to empty states), or a handle with
        ``open()``. States in the files replace the tables of the same name;
        registered states absent from the files become empty. Everything is
        read, checked (max parallelism, formats, key and namespace serializers,
        kinds and serializers of registered states: C1-C7 of
        :mod:`cowstate.snapshot.compat`; the contents: E1-E6 of
        :mod:`cowstate.snapshot.checks`) and decoded into new tables before any
        table changes: on any error the backend is exactly as it was.

        At least one item is required: ``restore([])`` raises
        :class:`~cowstate.errors.InvalidArgumentError` rather than empty every
        state (restore an empty backend's snapshot result to do that).
        """
        self._check_open()
        if isinstance(snapshot_streams, bytes | bytearray | memoryview | str) or not isinstance(
            snapshot_streams, Iterable
        ):
            raise InvalidArgumentError(
                f"expected an iterable of snapshots (bytes, binary streams, snapshot results "
                f"or handles with open()), got {type(snapshot_streams).__name__}"
            )
        items = list(snapshot_streams)
        if not items:
            raise InvalidArgumentError(
                "expected at least one snapshot to restore from, got none: restore([]) would "
                "empty every state; restore the snapshot result of an empty backend for that"
            )
        with contextlib.ExitStack() as opened:
            snapshots = [_open_snapshot(item, opened) for item in items]
            prepared = self._prepare([s for s in snapshots if s is not None])
        prepared.commit()

    def __enter__(self) -> HeapKeyedStateBackend:
        return self

    # -------------------------------------------------------- private helpers

    def _snapshot_tables(self) -> list[StateTableSnapshot[Any, Any, Any]]:
        """The synchronous part of a snapshot: every state's table snapshot, in
        registration order (the state ids); all of them, or none released."""
        taken: list[StateTableSnapshot[Any, Any, Any]] = []
        try:
            for holder in self._holders.values():
                taken.append(holder.table.snapshot())
        except BaseException:
            _release(taken)
            raise
        return taken

    def _write_to(
        self,
        snapshots: list[StateTableSnapshot[Any, Any, Any]],
        location: SnapshotLocation,
        name: str,
        snapshot_format: SnapshotFormat,
        future: SnapshotFuture[KeyedStateHandle],
    ) -> KeyedStateHandle:
        """The asynchronous part of :meth:`snapshot_to` (writer thread; see
        ``_start_async``): the file ``name`` in ``location``, and its handle."""
        stream: LocationStream | None = None
        try:
            stream = location.exclusive_stream(name)
            info = write_snapshot(
                snapshots, stream, snapshot_format=snapshot_format, cancel=future.cancel_requested
            )
            file = stream.close_and_get_handle()
        except BaseException:
            _discard(stream)
            raise
        return self._handle_of(future.checkpoint_id, snapshot_format, info.metadata.states, (file,))

    def _write(
        self,
        snapshots: list[StateTableSnapshot[Any, Any, Any]],
        stream_factory: StreamFactory,
        snapshot_format: SnapshotFormat,
        future: SnapshotFuture[KeyedStateSnapshotResult],
    ) -> KeyedStateSnapshotResult:
        """The asynchronous part of :meth:`snapshot` (writer thread; see
        ``_start_async``): the file in ``stream_factory()``."""
        stream: BinaryWriter | None = None
        try:
            stream = stream_factory()
            info = write_snapshot(
                snapshots, stream, snapshot_format=snapshot_format, cancel=future.cancel_requested
            )
            close = getattr(stream, "close_and_get_handle", None)
            handle = close() if close is not None else stream
            if isinstance(handle, io.BytesIO):
                handle.seek(0)
            return KeyedStateSnapshotResult(
                future.checkpoint_id, self.key_group_range, info, handle
            )
        except BaseException:
            _discard(stream)
            raise

    def _handle_of(
        self,
        checkpoint_id: int,
        snapshot_format: SnapshotFormat,
        states: tuple[StateMetadata, ...],
        files: tuple[FileHandle, ...],
    ) -> KeyedStateHandle:
        """The handle of a heap snapshot: ``files`` (none, or its one file) holding
        ``states``."""
        r = self.key_group_range
        size = sum(f.size for f in files)
        return KeyedStateHandle(
            backend="heap",
            format=snapshot_format,
            key_group_range=(r.start_key_group, r.end_key_group),
            max_parallelism=self.max_parallelism,
            checkpoint_id=checkpoint_id,
            key_serializer=serializer_identifier(self._key_serializer),
            states=states,
            files=files,
            checkpointed_size=size,
            full_size=size,
        )

    def _prepare(
        self,
        snapshots: Sequence[SnapshotReader | IO[bytes] | bytes],
        chains: Sequence[Sequence[SnapshotReader]] = (),
    ) -> HeapPreparedRestore:
        """Check every file's metadata, then decode every file (and fold every
        chain: I5) and fill new tables (the backend unchanged; see :meth:`restore`),
        the cyclic garbage collector paused meanwhile (:mod:`cowstate.collector`:
        nothing a restore makes is garbage before it ends, and each automatic
        collection would walk the decoded columns)."""
        with paused_collector():
            return self._decode_and_fill(snapshots, chains)

    def _decode_and_fill(
        self,
        snapshots: Sequence[SnapshotReader | IO[bytes] | bytes],
        chains: Sequence[Sequence[SnapshotReader]],
    ) -> HeapPreparedRestore:
        """:meth:`_prepare`'s work."""
        readers = [s if isinstance(s, SnapshotReader) else SnapshotReader(s) for s in snapshots]
        removed: list[tuple[str, int, list[Any]]] = []
        added: list[tuple[str, int, list[Any]]] = []  # the deltas' keys
        chain_deltas: list[list[tuple[Removals, RestoredSnapshot]]] = []
        try:
            for chain in chains:  # every file's metadata before any byte is decoded
                for reader in chain:
                    header = reader.metadata
                    self._check_snapshot(header.max_parallelism, header.key_serializer, "file")
                    for state in header.states:
                        self._check_namespace_serializer(
                            state.name, state.namespace_serializer, "file"
                        )
            for reader in readers:  # every file's metadata before any byte is decoded
                header = reader.metadata
                check_heap_file_format(header.format)  # C6
                # C1, C2, and C3 for every state
                self._check_snapshot(header.max_parallelism, header.key_serializer, "file")
                for state in header.states:
                    self._check_namespace_serializer(state.name, state.namespace_serializer, "file")
            metas = self._registered_metas()
            restored = RestoredSnapshot(self.key_group_range, self.max_parallelism)
            for reader in readers:
                read_snapshot(
                    reader,
                    self.key_group_range,
                    max_parallelism=self.max_parallelism,
                    metas=metas,
                    key_serializer=self._key_serializer,
                    into=restored,
                    namespace_serializer=self._namespace_serializer,
                )
            for chain in chains:
                base, deltas = self._decode_chain(chain, metas)
                _merge(restored, base)
                for _, delta in deltas:  # a state new since the base is in its deltas only
                    restored.all_states |= delta.all_states
                    for name, meta in delta.metas.items():
                        restored.metas.setdefault(name, meta)
                    added += [
                        (name, key_group, block.keys)
                        for name, groups in delta.blocks.items()
                        for key_group, block in groups.items()
                    ]
                chain_deltas.append(deltas)
                removed += [
                    (name, key_group, [key for key, _ in pairs])
                    for removals, _ in deltas
                    for name, groups in removals.items()
                    for key_group, pairs in groups.items()
                ]
        finally:
            for reader in readers:
                reader.rewind()
            for chain in chains:
                for reader in chain:
                    reader.rewind()
        key_types = self._context.key_types.copy()  # E6, committed with the tables
        for name, blocks in restored.blocks.items():
            for key_group, block in blocks.items():
                check_key_types(name, key_group, block.keys, key_types)
        for name, key_group, keys in added + removed:  # a removal's key is a key too (I4)
            check_key_types(name, key_group, keys, key_types)
        # every chain's deltas, chain after chain: chains hold disjoint key groups
        folded = [delta for deltas in chain_deltas for delta in deltas]
        tables: dict[str, StateTable[Any, Any, Any]] = {}
        for name, meta in restored.metas.items():
            tables[name] = self._filled_table(
                metas.get(name, meta), restored.blocks.pop(name, {}), folded
            )
        for name, holder in self._holders.items():  # registered, absent: empty
            if name not in tables:
                tables[name] = self._new_table(metas.get(name, holder.table.meta))
        staged = {name: table.meta for name, table in tables.items()}
        return HeapPreparedRestore(self, tables, staged, key_types)

    def _filled_table(
        self,
        meta: StateMetaInfo,
        blocks: dict[int, DecodedBlock],
        deltas: Sequence[tuple[Removals, RestoredSnapshot]] = (),
    ) -> StateTable[Any, Any, Any]:
        """A new table of ``meta`` holding ``blocks`` (key group -> entries, all
        checked but E4), its maps sized for them; refuses a duplicate mapping.
        Each key group's map, once filled, gets its part of ``deltas`` (the
        chains' deltas, each chain's in order: I5, :func:`fold_deltas`)."""
        table = self._restored_table(meta, [len(block) for block in blocks.values()])
        name = meta.name
        for key_group in table.key_group_range if deltas else blocks:
            state_map = table.state_map(key_group)  # a fresh table: straight into its map
            block = blocks.get(key_group)
            if block is not None:
                put = state_map.put
                for key, namespace, state in zip(
                    block.keys, block.namespaces, block.states, strict=True
                ):
                    if not put(key, namespace, state):
                        raise duplicate_error(name, key_group, key, namespace)
            if deltas:
                fold_deltas(deltas, name, key_group, state_map)
        return table

    def _restored_table(self, meta: StateMetaInfo, sizes: list[int]) -> StateTable[Any, Any, Any]:
        """A new table for ``sizes`` entries per key group: a table class of ours
        is asked for maps that need not grow (any other factory as it is)."""
        factory = self._table_factory
        if not sizes or not (isinstance(factory, type) and issubclass(factory, StateTable)):
            return self._new_table(meta)
        groups = len(self.key_group_range)
        capacity = _capacity_for(max(sizes))
        if capacity * groups > 4 * sum(sizes) + DEFAULT_CAPACITY * groups:  # skewed: not all
            capacity = _capacity_for(-(-sum(sizes) // groups))
        return self._tracked(
            factory(
                self.key_group_range,
                self.max_parallelism,
                meta=meta,
                key_serializer=self._key_serializer,
                initial_capacity=max(capacity, DEFAULT_CAPACITY),
            )
        )

    def _new_table(self, meta: StateMetaInfo) -> StateTable[Any, Any, Any]:
        return self._tracked(
            self._table_factory(
                self.key_group_range,
                self.max_parallelism,
                meta=meta,
                key_serializer=self._key_serializer,
            )
        )

    def _tracked(self, table: StateTable[Any, Any, Any]) -> StateTable[Any, Any, Any]:
        """``table`` with every map tracking changes, where incremental
        checkpoints are on and its maps can (rules T and D of
        :mod:`cowstate.state_map`; others make every checkpoint full: I2)."""
        options = self._incremental
        if options is not None and isinstance(table, CopyOnWriteStateTable):
            for key_group in table.key_group_range:
                track = getattr(table.state_map(key_group), "track_changes", None)
                if track is not None:
                    track(options.removal_limit)
        return table

    # ------------------------------------------------ incremental checkpoints

    def _checkpoint_chain(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        """An incremental checkpoint (:mod:`cowstate.heap_incremental`): the
        synchronous part takes every table's snapshot, the map versions and,
        for a delta, every map's removals since the base; the writer writes a
        full shared file or a delta's two."""
        self._check_open()
        if type(checkpoint_id) is not int or checkpoint_id < 0:
            raise InvalidArgumentError(f"expected a checkpoint id >= 0, got {checkpoint_id!r}")
        if location.shared_directory is None:
            raise InvalidArgumentError(
                "expected a checkpoint location with a shared directory for the heap chain, "
                "got one without (a savepoint location?)"
            )
        taken: list[StateTableSnapshot[Any, Any, Any]] = []
        try:
            for holder in self._holders.values():
                taken.append(holder.table.snapshot())
        except BaseException:
            for snap in taken:
                snap.release()
            raise

        def release() -> None:
            for snap in taken:
                snap.release()

        try:
            states = tuple(snap.meta.metadata(i) for i, snap in enumerate(taken))
            versions = {
                snap.meta.name: snap.map_versions()
                for snap in taken
                if isinstance(snap, CopyOnWriteStateTableSnapshot)
            }
            with self._lock:
                base = self._base if options.reuses_files else None
                generation = self._generation
            plan = self._delta_plan(base, taken, states, generation)
        except BaseException:
            release()
            raise
        chains: list[Chain] = []  # what the writer wrote, for _record

        def write(future: SnapshotFuture[KeyedStateHandle]) -> KeyedStateHandle:
            handle, chain = self._write_chain(
                taken, location, base, plan, states, versions, generation, future
            )
            chains.append(chain)
            return handle

        return self._start_async(
            checkpoint_id,
            write,
            cleanup=release,
            failure="its resources were released",
            commit=lambda handle: self._record((handle, chains[0])),
        )

    def _delta_plan(
        self,
        base: Chain | None,
        taken: Sequence[StateTableSnapshot[Any, Any, Any]],
        states: tuple[StateMetadata, ...],
        generation: int,
    ) -> list[dict[int, Sequence[Any]]] | None:
        """The removals per state (by id) and key group of a delta against
        ``base`` (as :func:`held_removals` holds them), with every table
        snapshot set to read only what changed and its changes frozen (I6,
        unless ``freeze_changes`` is off); or None: this checkpoint is full
        (I2). Owner's thread, right after the snapshots were taken."""
        options = self._incremental
        assert options is not None
        if (
            base is None
            or base.generation != generation
            or not base.extends(states)
            or base.deltas >= options.max_deltas
            or base.delta_bytes > options.max_delta_ratio * base.base_bytes
        ):
            return None
        removals: list[dict[int, Sequence[Any]]] = []
        for snap in taken:
            table = self._holders[snap.meta.name].table
            if (
                not isinstance(snap, CopyOnWriteStateTableSnapshot)
                or snap.meta.snapshot_transformer is not None
            ):
                return None
            since = base.versions.get(snap.meta.name)
            groups: dict[int, Sequence[Any]] = {}
            if since is not None:
                for index, key_group in enumerate(snap.key_group_range):
                    of_map = getattr(table.state_map(key_group), "removals_since", None)
                    pairs = None if of_map is None else of_map(since[index])
                    if pairs is None:
                        return None
                    if pairs:
                        groups[key_group] = held_removals(pairs)
            removals.append(groups)
        codec = ccodec.CODEC
        snap_type = None if codec is None else codec.snapshot_type()
        freeze = (
            None
            if codec is None or snap_type is None or not options.freeze_changes
            else (codec.freeze_changes, snap_type)
        )
        for snap in taken:  # a delta it is: read only the changes, trim the logs
            base_versions = base.versions.get(snap.meta.name)
            if base_versions is None:
                continue  # a state new since the base: written whole
            assert isinstance(snap, CopyOnWriteStateTableSnapshot)
            snap.only_changed_since(base_versions)
            if freeze is not None:  # I6: the owner copies nothing for this delta
                snap.freeze_changes(*freeze)
            table = self._holders[snap.meta.name].table
            for index, key_group in enumerate(snap.key_group_range):
                # a tracking map (I2: only tables of maps that track reach here)
                tracking = cast(_TrackingMap, table.state_map(key_group))
                tracking.trim_removals(base_versions[index])
        return removals

    def _write_chain(
        self,
        taken: list[StateTableSnapshot[Any, Any, Any]],
        location: SnapshotLocation,
        base: Chain | None,
        removals: list[dict[int, Sequence[Any]]] | None,
        states: tuple[StateMetadata, ...],
        versions: dict[str, tuple[int, ...]],
        generation: int,
        future: SnapshotFuture[KeyedStateHandle],
    ) -> tuple[KeyedStateHandle, Chain]:
        """The asynchronous part of an incremental checkpoint (writer thread):
        a full shared file, or a delta's changes and removals (I3: each names
        its parent)."""
        r = self.key_group_range
        suffix = f"{r.start_key_group}-{r.end_key_group}"
        key_serializer = serializer_identifier(self._key_serializer)
        serializers = [(snap.key_serializer, snap.meta.namespace_serializer) for snap in taken]
        stream = None
        try:
            if removals is None or base is None:
                stream = location.shared_stream(f"keyed-state-{suffix}")
                write_snapshot(
                    taken,
                    stream,
                    cancel=future.cancel_requested,
                    checkpoint_id=future.checkpoint_id,  # I3
                )
                files: tuple[FileHandle, ...] = (stream.close_and_get_handle(),)
                new = files
                deltas, delta_bytes = 0, 0
            else:
                stream = location.shared_stream(f"heap-delta-{suffix}")
                write_snapshot(
                    taken,
                    stream,
                    snapshot_format=SnapshotFormat.HEAP_DELTA,
                    cancel=future.cancel_requested,
                    parent=base.parent,
                    checkpoint_id=future.checkpoint_id,
                )
                changes = stream.close_and_get_handle()
                stream = location.shared_stream(f"heap-removals-{suffix}")
                metadata = SnapshotMetadata(
                    format=SnapshotFormat.HEAP_REMOVALS,
                    max_parallelism=self.max_parallelism,
                    key_group_range=(r.start_key_group, r.end_key_group),
                    key_serializer=key_serializer,
                    states=states,
                    parent=(changes.size, changes.crc32),
                    checkpoint_id=future.checkpoint_id,
                )
                write_removals(stream, metadata, removals, serializers)
                new = (changes, stream.close_and_get_handle())
                files = base.files + new
                deltas = base.deltas + 1
                delta_bytes = base.delta_bytes + sum(f.size for f in new)
        except BaseException:
            _discard(stream)
            raise
        handle = KeyedStateHandle(
            backend="heap",
            format=HEAP_FORMAT,
            key_group_range=(r.start_key_group, r.end_key_group),
            max_parallelism=self.max_parallelism,
            checkpoint_id=future.checkpoint_id,
            key_serializer=key_serializer,
            states=states,
            files=files,
            checkpointed_size=sum(f.size for f in new),
            full_size=sum(f.size for f in files),
        )
        chain = Chain(
            future.checkpoint_id, files, versions, states, generation, deltas, delta_bytes
        )
        return handle, chain

    def _record(self, written: tuple[KeyedStateHandle, Chain]) -> None:
        """Keep a written checkpoint's chain as a candidate base (under the lock):
        not one aborted, superseded or of an earlier restore generation."""
        chain = written[1]
        if (
            chain.generation == self._generation
            and chain.checkpoint_id not in self._aborted
            and (self._base is None or chain.checkpoint_id > self._base.checkpoint_id)
        ):
            self._written[chain.checkpoint_id] = chain

    def _restored(self) -> None:
        """A restore was committed: no base any more (I2: the next is full)."""
        with self._lock:
            self._generation += 1
            self._base = None
            self._written.clear()
            self._aborted.clear()

    def _decode_chain(
        self, chain: Sequence[SnapshotReader], metas: dict[str, StateMetaInfo]
    ) -> tuple[RestoredSnapshot, list[tuple[Removals, RestoredSnapshot]]]:
        """Decode and check every file of a checked chain (I4): its base, and
        each delta's removals and changes."""
        decode = functools.partial(
            read_snapshot,
            key_group_range=self.key_group_range,
            max_parallelism=self.max_parallelism,
            metas=metas,
            key_serializer=self._key_serializer,
            namespace_serializer=self._namespace_serializer,
        )
        base = decode(chain[0])
        deltas: list[tuple[Removals, RestoredSnapshot]] = []
        for index in range(1, len(chain), 2):
            removals = read_removals(
                chain[index + 1],
                self.key_group_range,
                metas,
                self._key_serializer,
                self._namespace_serializer,
            )
            deltas.append((removals, decode(chain[index])))
        return base, deltas


def _open_snapshot(item: Any, opened: contextlib.ExitStack) -> IO[bytes] | bytes | None:
    """The bytes or stream of one snapshot to restore (None: an empty backend's
    snapshot, no file); a stream opened here is closed by ``opened``."""
    if isinstance(item, KeyedStateSnapshotResult):
        if item.handle is None:
            return None
        item = item.handle
    if isinstance(item, bytes | bytearray | memoryview):
        return bytes(item)
    if isinstance(item, io.BytesIO):
        return item.getvalue()
    opener = getattr(item, "open", None)
    if callable(opener):
        stream: IO[bytes] = opener()
        close = getattr(stream, "close", None)
        if callable(close):
            opened.callback(close)
        return stream
    if hasattr(item, "read"):
        readable: IO[bytes] = item
        return readable
    raise InvalidArgumentError(
        f"expected snapshot bytes, a binary stream, a snapshot result or a handle with "
        f"open(), got {type(item).__name__}"
    )


class _TrackingMap(Protocol):
    """A map that tracks changes (rules T and D of :mod:`cowstate.state_map`)."""

    def trim_removals(self, version: int) -> None: ...


def _merge(restored: RestoredSnapshot, folded: RestoredSnapshot) -> None:
    """Add a folded chain's key groups to ``restored`` (each key group from one
    handle only)."""
    overlap = restored.key_groups & folded.key_groups
    if overlap:
        raise KeyGroupMismatchError(
            f"expected every key group in one snapshot file only, got key groups "
            f"{sorted(overlap)[:5]} in two"
        )
    restored.key_groups |= folded.key_groups
    restored.all_states |= folded.all_states
    for name, meta in folded.metas.items():
        restored.metas.setdefault(name, meta)
        target = restored.blocks.setdefault(name, {})
        for key_group, block in folded.blocks.get(name, {}).items():
            target[key_group] = block


def _capacity_for(entries: int) -> int:
    """The map capacity holding ``entries`` without growing (load factor 3/4)."""
    return clamp_capacity(entries + entries // 3 + 1)


class HeapPreparedRestore(StagedRestore):
    """A heap restore verified and decoded into new tables, not installed yet
    (:meth:`HeapKeyedStateBackend.prepare_restore`): ``commit()`` swaps the
    tables in (no I/O, no decoding), ``discard()`` drops them."""

    def __init__(
        self,
        backend: HeapKeyedStateBackend,
        tables: dict[str, StateTable[Any, Any, Any]],
        metas: dict[str, StateMetaInfo],
        key_types: KeyTypes,
    ) -> None:
        super().__init__(backend, key_types, metas)
        self._heap = backend
        self._tables = tables

    def _apply(self) -> None:
        tables, self._tables = self._tables, {}
        self._heap._install_tables(tables, self._metas)
        self._heap._restored()

    def _drop(self) -> None:
        self._tables = {}


def _discard(stream: BinaryWriter | None) -> None:
    discard = getattr(stream, "discard", None)
    if discard is not None:
        with contextlib.suppress(Exception):  # the write's own error is the one to report
            discard()


def _done(checkpoint_id: int, result: R) -> SnapshotFuture[R]:
    """The future of a snapshot with nothing to write: done already."""
    future: SnapshotFuture[R] = SnapshotFuture(checkpoint_id, lambda: None)
    future.start()
    future.set_result(result)
    return future


def _release(snapshots: list[StateTableSnapshot[Any, Any, Any]]) -> None:
    for snap in snapshots:
        snap.release()
