"""Where one snapshot's files go (:class:`SnapshotLocation`) and where a restore
reads them from (:class:`SnapshotSource`).

A checkpoint's location writes exclusive files into ``<root>/<job>/chk-<id>/``
and shared files into ``<root>/<job>/shared/`` under a fresh physical name
(``<uuid>-<local name>``: two uploads of the same local file are two files,
Flink's FLINK-29913). A savepoint's location writes everything into the
savepoint directory, exclusive. Every handle's path is relative
(:mod:`~cowstate.checkpoint.paths`): an exclusive file's to the snapshot
directory, a shared file's (``<job>/shared/<name>``) to the storage root, so
a savepoint directory -- or a whole storage root -- can be moved.

A location remembers every path it wrote (temporary names included), so an
aborted or failed snapshot can delete exactly its own uploads
(:meth:`SnapshotLocation.discard`) and never a file another snapshot uses.
Backends call it from their writer threads; it is thread-safe.

A source resolves a handle's path only inside its roots (P1-P5 of
:mod:`~cowstate.checkpoint.paths`) and checks every file it reads against
the handle's size and CRC32.
"""

from __future__ import annotations

import os
import threading
import uuid
import zlib
from typing import IO, Literal

from cowstate.checkpoint.filesystem import AtomicOutputStream, FileSystem, WrittenFile
from cowstate.checkpoint.handles import FileHandle
from cowstate.checkpoint.paths import check_exclusive_path, check_shared_path, is_inside
from cowstate.errors import CorruptCheckpointError, InvalidArgumentError, UnsafePathError

__all__ = ["LocationStream", "SnapshotLocation", "SnapshotSource"]

Scope = Literal["exclusive", "shared"]


class SnapshotLocation:
    """The directories one snapshot writes to, and what it wrote there."""

    def __init__(
        self, filesystem: FileSystem, directory: str, shared_directory: str | None = None
    ) -> None:
        """``shared_directory``: ``<root>/<job>/shared`` of a checkpoint (beside its
        ``chk-<id>`` directory), None for a savepoint."""
        self.filesystem = filesystem
        self.directory = directory.rstrip("/")
        self.shared_directory = None if shared_directory is None else shared_directory.rstrip("/")
        self._shared_job: str | None = None
        if self.shared_directory is not None:
            job_dir = filesystem.parent(self.shared_directory)
            if filesystem.name(self.shared_directory) != "shared" or (
                filesystem.parent(self.directory) != job_dir
            ):
                raise InvalidArgumentError(
                    f"expected a checkpoint directory and '<job>/shared' side by side, got "
                    f"{self.directory!r} and {self.shared_directory!r}"
                )
            self._shared_job = filesystem.name(job_dir)
        self._written: list[str] = []
        self._lock = threading.Lock()

    @property
    def written(self) -> list[str]:
        """Every path this location wrote or began to write (temporary names too)."""
        with self._lock:
            return list(self._written)

    def exclusive_stream(self, name: str) -> LocationStream:
        """An atomic stream for the exclusive file ``name`` of this snapshot."""
        _check_name(name)
        path = self.filesystem.join(self.directory, name)
        stream = self.filesystem.create(path)
        self._record(stream.temp, path)
        return LocationStream(self, stream, name)

    def shared_stream(self, name: str) -> LocationStream:
        """An atomic stream for a new shared file of this checkpoint, under a
        fresh physical name (``<uuid>-<name>``) in ``<job>/shared``."""
        if self.shared_directory is None:
            raise InvalidArgumentError(
                "expected a checkpoint location: a savepoint shares nothing, got a shared "
                f"file {name!r}"
            )
        _check_name(name)
        path = self.filesystem.join(self.shared_directory, f"{uuid.uuid4().hex}-{name}")
        stream = self.filesystem.create(path)
        self._record(stream.temp, path)
        return LocationStream(self, stream, name, "shared")

    def upload(
        self,
        local_path: str | os.PathLike[str],
        *,
        scope: Scope,
        local_name: str,
        name: str | None = None,
    ) -> FileHandle:
        """Copy a local file into this snapshot: ``exclusive`` as ``name`` (default
        ``local_name``), or ``shared`` under a fresh physical name."""
        if scope == "shared":
            if self.shared_directory is None:
                raise InvalidArgumentError(
                    "expected an exclusive file: a savepoint shares nothing, got scope 'shared'"
                )
            path = self.filesystem.join(
                self.shared_directory, f"{uuid.uuid4().hex}-{name or local_name}"
            )
        else:
            _check_name(name or local_name)
            path = self.filesystem.join(self.directory, name or local_name)
        self._record(path)
        stream = self.filesystem.create(path)
        self._record(stream.temp)
        try:
            with open(local_path, "rb") as source:
                while chunk := source.read(1 << 20):
                    stream.write(chunk)
        except BaseException:
            stream.discard()
            raise
        return self.handle(stream.close_and_get_handle(), scope, local_name)

    def handle(self, written: WrittenFile, scope: Scope, local_name: str | None) -> FileHandle:
        """The handle of a file this location wrote (its path relative, P1-P2)."""
        path = written.path
        base = self.directory if scope == "exclusive" else self.shared_directory
        if base is None or not path.startswith(base + "/"):
            raise InvalidArgumentError(f"expected a {scope} file inside {base!r}, got {path!r}")
        path = path[len(base) + 1 :]
        if scope == "shared":
            path = check_shared_path(f"{self._shared_job}/shared/{path}")
        else:
            check_exclusive_path(path)
        return FileHandle(
            path=path,
            size=written.size,
            crc32=written.crc32,
            scope=scope,
            local_name=local_name,
        )

    def discard(self) -> None:
        """Delete everything this location wrote (an aborted or failed snapshot)."""
        for path in self.written:
            self.filesystem.delete(path)

    def _record(self, *paths: str) -> None:
        with self._lock:
            self._written.extend(paths)


class LocationStream:
    """A file being written (exclusive, or shared); ``close_and_get_handle()``
    gives its handle."""

    def __init__(
        self,
        location: SnapshotLocation,
        stream: AtomicOutputStream,
        name: str,
        scope: Scope = "exclusive",
    ) -> None:
        self._location = location
        self._stream = stream
        self._name = name
        self._scope: Scope = scope

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self._stream.write(data)

    def flush(self) -> None:
        self._stream.flush()

    def tell(self) -> int:
        return self._stream.tell()

    def writable(self) -> bool:
        return True

    def close_and_get_handle(self) -> FileHandle:
        return self._location.handle(self._stream.close_and_get_handle(), self._scope, self._name)

    def discard(self) -> None:
        self._stream.discard()


class SnapshotSource:
    """Reads the files of one completed snapshot, given the directory of its
    ``_metadata``: exclusive paths resolve against it, shared ones against the
    storage root two levels up (``<root>/<job>/chk-<id>``), confined (P1-P5)."""

    def __init__(self, filesystem: FileSystem, directory: str) -> None:
        self.filesystem = filesystem
        self.directory = directory.rstrip("/") or "/"

    @property
    def storage_root(self) -> str:
        """Where shared paths resolve: the parent of the checkpoint's job directory."""
        return self.filesystem.parent(self.filesystem.parent(self.directory))

    def lexical_path(self, handle: FileHandle) -> str:
        """Where ``handle``'s file is named to be (P1, P2 checked; links not
        followed): the name bookkeeping compares and deletes -- deleting it
        removes a link, never its target. Opens go through :meth:`path`."""
        if handle.scope == "shared":
            return self.filesystem.join(self.storage_root, check_shared_path(handle.path))
        return self.filesystem.join(self.directory, check_exclusive_path(handle.path))

    def path(self, handle: FileHandle) -> str:
        """The confined path of ``handle``'s file to open (P1-P3;
        :class:`UnsafePathError` if none)."""
        path = self.lexical_path(handle)
        local = self.filesystem.local_path(path)
        if local is None:
            return path
        if handle.scope == "shared":  # the real storage root, then <job>/shared literally
            root_local = self.filesystem.local_path(self.storage_root)
            assert root_local is not None
            job = handle.path.split("/")[0]
            real_root = os.path.join(os.path.realpath(root_local), job, "shared")
        else:
            directory_local = self.filesystem.local_path(self.directory)
            assert directory_local is not None
            real_root = os.path.realpath(directory_local)
        if not is_inside(local, real_root):
            raise UnsafePathError(
                f"expected {handle.path!r} to stay inside {real_root!r}, it is a link to "
                f"{os.path.realpath(local)!r}"
            )
        return path

    def open(self, handle: FileHandle) -> IO[bytes]:
        return self.filesystem.open(self.path(handle))

    def read(self, handle: FileHandle) -> bytes:
        """The file's bytes, checked against the handle's size (before reading)
        and CRC32."""
        path = self.path(handle)
        actual = self.filesystem.size(path)
        if actual != handle.size:
            raise CorruptCheckpointError(
                f"expected {path!r} to hold {handle.size} bytes, it holds {actual}"
            )
        data = self.filesystem.read_bytes(path, limit=handle.size)
        crc = zlib.crc32(data)
        if (len(data), crc) != (handle.size, handle.crc32):
            raise CorruptCheckpointError(
                f"expected {path!r} to hold {handle.size} bytes with CRC32 "
                f"{handle.crc32:#010x}, got {len(data)} bytes with CRC32 {crc:#010x}"
            )
        return data

    def verify(self, handle: FileHandle) -> None:
        """Check the file against the handle's size and CRC32 without keeping it."""
        path = self.path(handle)
        crc = 0
        size = 0
        with self.filesystem.open(path) as stream:
            try:
                while chunk := stream.read(1 << 20):
                    crc = zlib.crc32(chunk, crc)
                    size += len(chunk)
                    if size > handle.size:
                        break
            except OSError as exc:
                raise CorruptCheckpointError(
                    f"expected to read {path!r}, got {type(exc).__name__}: {exc}"
                ) from None
        if (size, crc) != (handle.size, handle.crc32):
            raise CorruptCheckpointError(
                f"expected {path!r} to hold {handle.size} bytes with CRC32 "
                f"{handle.crc32:#010x}, got {'more than ' if size > handle.size else ''}"
                f"{size} bytes with CRC32 {crc:#010x}"
            )

    def download(self, handle: FileHandle, local_path: str | os.PathLike[str]) -> None:
        """Copy the file to ``local_path``, checked against its size and CRC32."""
        self.filesystem.download(
            self.path(handle), local_path, size=handle.size, crc32=handle.crc32
        )


def _check_name(name: str) -> None:
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise InvalidArgumentError(f"expected a file name inside the snapshot, got {name!r}")
