"""The asynchronous part of a RocksDB snapshot (the snapshot strategy).

The synchronous part (in :mod:`cowstate.rocksdb.backend`) takes a local
RocksDB checkpoint and captures a :class:`SnapshotJob`; :func:`write` runs on
the writer thread and turns it into a
:class:`~cowstate.checkpoint.handles.KeyedStateHandle`:

- :func:`upload`: a checkpoint (SSTs reused from the base or uploaded shared,
  the rest exclusive; the checkpoint's SST map goes to ``job.ssts``) or a
  native savepoint (every file exclusive);
- :func:`write_canonical`: a canonical savepoint, one snapshot file read
  key group by key group from the local checkpoint.

Cancellation is checked before every file and every key group.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cowstate.checkpoint.handles import FileHandle, KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation
from cowstate.errors import (
    SnapshotCancelledError,
)
from cowstate.key_groups import KeyGroupRange
from cowstate.keyed_backend import SnapshotFuture
from cowstate.rocksdb.db import open_read_only
from cowstate.rocksdb.table import (
    decode_rocks_key,
    key_group_prefix,
    scan,
)
from cowstate.snapshot import (
    RawEntry,
    SnapshotMetadata,
    SnapshotWriter,
)
from cowstate.state_meta import SnapshotFormat, StateMetadata

__all__ = [
    "KeyGroupCursor",
    "SnapshotJob",
    "StateSnapshot",
    "handle_of",
    "subtask_prefix",
    "upload",
    "write",
    "write_canonical",
]


@dataclass(frozen=True)
class StateSnapshot:
    """One state as the synchronous part saw it."""

    info: StateMetadata
    column_family: str


@dataclass(frozen=True)
class SnapshotJob:
    """Everything the writer needs, captured in the synchronous part."""

    checkpoint_id: int
    options: SnapshotOptions
    location: SnapshotLocation
    local_dir: Path
    base: dict[str, FileHandle]
    states: tuple[StateSnapshot, ...]
    key_serializer: str
    backend_uid: str
    generation: int
    key_group_range: KeyGroupRange
    max_parallelism: int
    #: The SSTs a checkpoint references (local name -> handle), filled by the writer.
    ssts: dict[str, FileHandle] = field(default_factory=dict)


class KeyGroupCursor:
    """Raw entries of one column family, handed out key group by key group."""

    def __init__(self, entries: Iterator[tuple[bytes, bytes]]) -> None:
        self._entries = entries
        self._next: tuple[int, RawEntry] | None = None
        self._advance()

    def take(self, key_group: int) -> list[RawEntry]:
        """The ``(namespace, key, state)`` entries of ``key_group`` (ascending calls)."""
        out: list[RawEntry] = []
        while self._next is not None and self._next[0] <= key_group:
            if self._next[0] == key_group:
                out.append(self._next[1])
            self._advance()
        return out

    def close(self) -> None:
        close = getattr(self._entries, "close", None)
        if close is not None:
            close()
        self._next = None

    def _advance(self) -> None:
        item = next(self._entries, None)
        if item is None:
            self._next = None
            return
        key_group, key, namespace = decode_rocks_key(item[0])
        self._next = (key_group, (namespace, key, item[1]))


def subtask_prefix(key_group_range: KeyGroupRange) -> str:
    """The directory of a subtask's exclusive RocksDB files in a snapshot."""
    return f"rocksdb-{key_group_range.start_key_group}-{key_group_range.end_key_group}"


def write(job: SnapshotJob, future: SnapshotFuture[KeyedStateHandle]) -> KeyedStateHandle:
    """The asynchronous part (writer thread; see ``_start_async``)."""
    if job.options.is_savepoint and job.options.format == "canonical":
        return write_canonical(future, job)
    return upload(future, job)


def upload(future: SnapshotFuture[KeyedStateHandle], job: SnapshotJob) -> KeyedStateHandle:
    """A native checkpoint or savepoint: the local checkpoint's files (a
    checkpoint's SSTs also go to ``job.ssts``)."""
    shared = not job.options.is_savepoint
    prefix = subtask_prefix(job.key_group_range)
    files: list[FileHandle] = []
    record = job.ssts
    uploaded = 0
    for name in sorted(os.listdir(job.local_dir)):
        path = job.local_dir / name
        if not path.is_file():
            continue
        if future.cancel_requested.is_set():
            raise SnapshotCancelledError(
                f"snapshot {job.checkpoint_id} cancelled before {name} was uploaded"
            )
        if name.endswith(".sst"):
            reused = job.base.get(name)
            if reused is not None and reused.size == path.stat().st_size:
                handle = reused
            elif shared:
                handle = job.location.upload(path, scope="shared", local_name=name)
                uploaded += handle.size
            else:
                handle = job.location.upload(
                    path, scope="exclusive", local_name=name, name=f"{prefix}/{name}"
                )
                uploaded += handle.size
            if shared:
                record[name] = handle
        else:
            handle = job.location.upload(
                path, scope="exclusive", local_name=name, name=f"{prefix}/{name}"
            )
            uploaded += handle.size
        files.append(handle)
    return handle_of(job, SnapshotFormat.ROCKSDB_NATIVE, tuple(files), uploaded)


def write_canonical(future: SnapshotFuture[KeyedStateHandle], job: SnapshotJob) -> KeyedStateHandle:
    """A canonical savepoint: one snapshot file read from the local checkpoint."""
    r = job.key_group_range
    metadata = SnapshotMetadata(
        format=SnapshotFormat.CANONICAL,
        max_parallelism=job.max_parallelism,
        key_group_range=(r.start_key_group, r.end_key_group),
        key_serializer=job.key_serializer,
        states=tuple(s.info for s in job.states),
    )
    stream = job.location.exclusive_stream(f"keyed-state-{r.start_key_group}-{r.end_key_group}")
    try:
        db = open_read_only(job.local_dir)
        cursors: list[KeyGroupCursor] = []
        try:
            for state in job.states:
                cursors.append(
                    KeyGroupCursor(
                        scan(
                            db.get_column_family(state.column_family),
                            key_group_prefix(r.start_key_group),
                            key_group_prefix(r.end_key_group + 1),
                        )
                    )
                )
            writer = SnapshotWriter(stream, metadata)
            for key_group in r:
                if future.cancel_requested.is_set():
                    raise SnapshotCancelledError(
                        f"snapshot {job.checkpoint_id} cancelled before key group "
                        f"{key_group} was written"
                    )
                writer.write_key_group(
                    key_group,
                    {state_id: cursor.take(key_group) for state_id, cursor in enumerate(cursors)},
                )
            writer.finish()
        finally:
            for cursor in cursors:
                cursor.close()
            cursors.clear()
            db.close()
        written = stream.close_and_get_handle()
    except BaseException:
        with contextlib.suppress(Exception):
            stream.discard()
        raise
    return handle_of(job, SnapshotFormat.CANONICAL, (written,), written.size)


def handle_of(
    job: SnapshotJob, snapshot_format: SnapshotFormat, files: tuple[FileHandle, ...], uploaded: int
) -> KeyedStateHandle:
    r = job.key_group_range
    return KeyedStateHandle(
        backend="rocksdb",
        format=snapshot_format,
        key_group_range=(r.start_key_group, r.end_key_group),
        max_parallelism=job.max_parallelism,
        checkpoint_id=job.checkpoint_id,
        key_serializer=job.key_serializer,
        states=tuple(s.info for s in job.states),
        files=files,
        checkpointed_size=uploaded,
        full_size=sum(f.size for f in files),
        backend_uid=job.backend_uid,
    )
