"""The heap keyed state backend: named keyed states in state tables, with
asynchronous snapshots (Flink's ``HeapKeyedStateBackend``).

The state API (key context, registration, handles) is
:class:`~cowstate.keyed_backend.AbstractKeyedStateBackend`'s. Each state gets a
table from ``table_factory``: :class:`~cowstate.state_table.CopyOnWriteStateTable`
by default, :class:`~cowstate.state_table.NestedMapsStateTable` for synchronous
snapshots.

A checkpoint has two parts::

    owner thread                          writer thread (one per backend)
    ------------                          -------------------------------
    snapshot(id, stream_factory)
      sync: table.snapshot() for every
      state, in registration order  --->  stream = stream_factory()
      returns a SnapshotFuture            for kg in range (ascending):
    keeps processing: puts, gets,           if cancelled: stop
    mutations in place ...                  write kg of every state
    (copy-on-write keeps the                release kg's map snapshots
     snapshot's view intact)              write the index; close_and_get_handle()
                                          release everything left, in all cases

Everything the writer needs (table snapshots with duplicated serializers,
state ids, meta info) is captured in the synchronous part (FLINK-9269,
FLINK-6207), so registering states or changing serializers afterwards does
not reach a running writer. Every map snapshot is released when its key group
is written, and all that remain when the write succeeds, fails or is
cancelled (FLINK-13469): the copy-on-write maps stop copying.

``restore(snapshot_streams)`` rebuilds every state for this backend's
key-group range from snapshot files, possibly written by backends with other
ranges (rescaling). All files are decoded and checked before any table
changes, so a bad file leaves the backend as it was.
"""

from __future__ import annotations

import contextlib
import functools
import io
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import IO, Any

from cowstate.checkpoint.handles import FileHandle, KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.checkpoint.protocol import map_future, overlapping
from cowstate.errors import (
    IncompatibleSnapshotError,
    InvalidArgumentError,
)
from cowstate.key_groups import KeyGroupRange
from cowstate.keyed_backend import AbstractKeyedStateBackend, SnapshotFuture
from cowstate.serializers import StateSerializer, serializer_identifier
from cowstate.snapshot import (
    BinaryWriter,
    RestoredSnapshot,
    SnapshotFileInfo,
    read_snapshot,
    write_snapshot,
)
from cowstate.state_meta import SnapshotFormat, StateMetaInfo
from cowstate.state_table import (
    CopyOnWriteStateTable,
    StateTable,
    StateTableSnapshot,
    TableFactory,
)

__all__ = [
    "HEAP_FORMAT",
    "HeapKeyedStateBackend",
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

    # -------------------------------------------------------------- snapshots

    def snapshot(
        self,
        checkpoint_id: int,
        stream_factory: StreamFactory,
        *,
        snapshot_format: SnapshotFormat = HEAP_FORMAT,
    ) -> SnapshotFuture[KeyedStateSnapshotResult]:
        """Take the synchronous part now; the returned future writes the rest.

        ``stream_factory()`` is called on the writer thread. The result's
        ``handle`` is ``stream.close_and_get_handle()`` when the stream has
        it, else the stream (rewound ``BytesIO`` callers can read).
        ``snapshot_format`` is recorded in the file: ``"heap"`` (the heap's native
        format) or ``"canonical"`` (a canonical savepoint, any backend restores it).
        """
        self._check_open()
        if snapshot_format not in RESTORABLE_FORMATS:
            raise InvalidArgumentError(
                f"expected a snapshot format in {sorted(RESTORABLE_FORMATS)}, got "
                f"{snapshot_format!r}"
            )
        if type(checkpoint_id) is not int or checkpoint_id < 0:
            raise InvalidArgumentError(f"expected a checkpoint id >= 0, got {checkpoint_id!r}")
        if not callable(stream_factory):
            raise InvalidArgumentError(
                f"expected a callable stream factory, got {type(stream_factory).__name__}"
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

        if not taken:  # an empty backend writes nothing
            future: SnapshotFuture[KeyedStateSnapshotResult] = SnapshotFuture(
                checkpoint_id, release
            )
            future.set_running_or_notify_cancel()
            future.set_result(
                KeyedStateSnapshotResult(checkpoint_id, self.key_group_range, None, None)
            )
            return future
        return self._start_async(
            checkpoint_id,
            functools.partial(self._write, taken, stream_factory, snapshot_format),
            cleanup=release,
            failure="its resources were released",
        )

    # ------------------------------------------------ checkpoints and savepoints

    def snapshot_to(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        """A snapshot file in ``location`` (always full: the heap shares nothing
        between checkpoints); canonical for a canonical savepoint, else heap."""
        snapshot_format = (
            SnapshotFormat.CANONICAL
            if options.is_savepoint and options.format == "canonical"
            else HEAP_FORMAT
        )
        r = self.key_group_range
        name = f"keyed-state-{r.start_key_group}-{r.end_key_group}"
        inner = self.snapshot(
            checkpoint_id,
            functools.partial(location.exclusive_stream, name),
            snapshot_format=snapshot_format,
        )
        return map_future(inner, functools.partial(self._handle_of, snapshot_format))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Nothing to do: heap snapshots never build on earlier ones."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Nothing to do: heap snapshots never build on earlier ones."""

    def restore_from(
        self,
        handles: Sequence[KeyedStateHandle],
        source: SnapshotSource,
        *,
        incremental_base: bool = False,
    ) -> None:
        """Restore from the heap or canonical handles of one snapshot (only those
        meeting this backend's key groups are read; each file is checked
        against its size and CRC32 first)."""
        handles = list(handles)
        self._check_formats(handles)
        mine = overlapping(handles, self.key_group_range)
        self._check_handles(mine)
        self.restore([source.read(f) for handle in mine for f in handle.files])

    def _handle_of(
        self, snapshot_format: SnapshotFormat, result: KeyedStateSnapshotResult
    ) -> KeyedStateHandle:
        r = self.key_group_range
        files: tuple[FileHandle, ...] = () if result.handle is None else (result.handle,)
        size = sum(f.size for f in files)
        states = () if result.info is None else result.info.metadata.states
        return KeyedStateHandle(
            backend="heap",
            format=snapshot_format,
            key_group_range=(r.start_key_group, r.end_key_group),
            max_parallelism=self.max_parallelism,
            checkpoint_id=result.checkpoint_id,
            key_serializer=serializer_identifier(self._key_serializer),
            states=states,
            files=files,
            checkpointed_size=size,
            full_size=size,
        )

    def restore(self, snapshot_streams: Iterable[Any]) -> None:
        """Rebuild every state for this backend's key groups from snapshot files.

        Each item is the bytes of a file, a binary stream, a
        :class:`KeyedStateSnapshotResult`, or a handle with ``open()``. States
        in the files replace the tables of the same name; registered states
        absent from the files become empty. Nothing changes unless every file
        decodes and matches this backend (max parallelism, key and namespace
        serializers, kinds and serializers of registered states).
        """
        self._check_open()
        metas = self._registered_metas()
        restored = RestoredSnapshot(self.key_group_range, self.max_parallelism)
        for item in snapshot_streams:
            read_snapshot(
                _open_snapshot(item),
                self.key_group_range,
                max_parallelism=self.max_parallelism,
                metas=metas,
                key_serializer=self._key_serializer,
                into=restored,
                namespace_serializer=self._namespace_serializer,
            )
        foreign = restored.formats - RESTORABLE_FORMATS
        if foreign:
            raise IncompatibleSnapshotError(
                f"expected a heap or canonical snapshot, got format {sorted(foreign)}: a "
                "native snapshot of another backend; restore from a canonical savepoint"
            )
        for name, meta in restored.metas.items():
            self._check_namespace_serializer(
                name, serializer_identifier(meta.namespace_serializer), "file"
            )
        tables: dict[str, StateTable[Any, Any, Any]] = {}
        for name, meta in restored.metas.items():
            table = self._new_table(metas.get(name, meta))
            for key_group, key, namespace, state in restored.entries(name):
                table.put(key, namespace, state, key_group=key_group)
            tables[name] = table
        self._install_tables(tables, metas)  # every file decoded: swap them in

    def __enter__(self) -> HeapKeyedStateBackend:
        return self

    # -------------------------------------------------------- private helpers

    def _write(
        self,
        snapshots: list[StateTableSnapshot[Any, Any, Any]],
        stream_factory: StreamFactory,
        snapshot_format: SnapshotFormat,
        future: SnapshotFuture[KeyedStateSnapshotResult],
    ) -> KeyedStateSnapshotResult:
        """The asynchronous part (writer thread; see ``_start_async``)."""
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

    def _new_table(self, meta: StateMetaInfo) -> StateTable[Any, Any, Any]:
        return self._table_factory(
            self.key_group_range,
            self.max_parallelism,
            meta=meta,
            key_serializer=self._key_serializer,
        )


def _open_snapshot(item: Any) -> IO[bytes] | bytes:
    """The bytes or stream of one snapshot to restore."""
    if isinstance(item, KeyedStateSnapshotResult):
        item = item.handle
    if isinstance(item, bytes | bytearray | memoryview):
        return bytes(item)
    if isinstance(item, io.BytesIO):
        return item.getvalue()
    opener = getattr(item, "open", None)
    if callable(opener):
        return opener()  # type: ignore[no-any-return]
    if hasattr(item, "read"):
        return item  # type: ignore[no-any-return]
    raise InvalidArgumentError(
        f"expected snapshot bytes, a binary stream, a snapshot result or a handle with "
        f"open(), got {type(item).__name__}"
    )


def _discard(stream: BinaryWriter | None) -> None:
    discard = getattr(stream, "discard", None)
    if discard is not None:
        with contextlib.suppress(Exception):  # the write's own error is the one to report
            discard()
