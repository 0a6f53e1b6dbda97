"""Where one snapshot's files go (:class:`SnapshotLocation`) and where a restore
reads them from (:class:`SnapshotSource`).

A checkpoint's location writes exclusive files into ``<job>/chk-<id>/`` and
shared files into ``<job>/shared/`` under a fresh physical name
(``<uuid>-<local name>``: two uploads of the same local file are two files,
Flink's FLINK-29913), with absolute paths. A savepoint's location writes
everything into the savepoint directory, exclusive, with paths relative to
it, so the directory can be moved.

A location remembers every path it wrote (temporary names included), so an
aborted or failed snapshot can delete exactly its own uploads
(:meth:`SnapshotLocation.discard`) and never a file another snapshot uses.
Backends call it from their writer threads; it is thread-safe.
"""

from __future__ import annotations

import os
import threading
import uuid
import zlib
from typing import IO, Literal

from cowstate.checkpoint.filesystem import AtomicOutputStream, FileSystem, WrittenFile
from cowstate.checkpoint.handles import FileHandle
from cowstate.errors import CorruptCheckpointError, InvalidArgumentError

__all__ = ["LocationStream", "SnapshotLocation", "SnapshotSource"]

Scope = Literal["exclusive", "shared"]


class SnapshotLocation:
    """The directories one snapshot writes to, and what it wrote there."""

    def __init__(
        self,
        filesystem: FileSystem,
        directory: str,
        shared_directory: str | None,
        *,
        relative: bool,
    ) -> None:
        self.filesystem = filesystem
        self.directory = directory.rstrip("/")
        self.shared_directory = None if shared_directory is None else shared_directory.rstrip("/")
        self.relative = relative
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
        """The handle of a file this location wrote."""
        path = written.path
        if self.relative:
            prefix = self.directory + "/"
            if not path.startswith(prefix):
                raise InvalidArgumentError(
                    f"expected a file inside {self.directory!r} for a relative handle, got {path!r}"
                )
            path = path[len(prefix) :]
        return FileHandle(
            path=path,
            relative=self.relative,
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
    """An exclusive file being written; ``close_and_get_handle()`` gives its handle."""

    def __init__(self, location: SnapshotLocation, stream: AtomicOutputStream, name: str) -> None:
        self._location = location
        self._stream = stream
        self._name = name

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self._stream.write(data)

    def flush(self) -> None:
        self._stream.flush()

    def tell(self) -> int:
        return self._stream.tell()

    def writable(self) -> bool:
        return True

    def close_and_get_handle(self) -> FileHandle:
        return self._location.handle(self._stream.close_and_get_handle(), "exclusive", self._name)

    def discard(self) -> None:
        self._stream.discard()


class SnapshotSource:
    """Reads the files of one completed snapshot, given the directory of its
    ``_metadata`` (relative handles resolve against it)."""

    def __init__(self, filesystem: FileSystem, directory: str) -> None:
        self.filesystem = filesystem
        self.directory = directory.rstrip("/")

    def path(self, handle: FileHandle) -> str:
        if handle.relative:
            return self.filesystem.join(self.directory, handle.path)
        return handle.path

    def open(self, handle: FileHandle) -> IO[bytes]:
        return self.filesystem.open(self.path(handle))

    def read(self, handle: FileHandle) -> bytes:
        """The file's bytes, checked against the handle's size and CRC32."""
        data = self.filesystem.read_bytes(self.path(handle))
        crc = zlib.crc32(data)
        if (len(data), crc) != (handle.size, handle.crc32):
            raise CorruptCheckpointError(
                f"expected {self.path(handle)!r} to hold {handle.size} bytes with CRC32 "
                f"{handle.crc32:#010x}, got {len(data)} bytes with CRC32 {crc:#010x}"
            )
        return data

    def download(self, handle: FileHandle, local_path: str | os.PathLike[str]) -> None:
        """Copy the file to ``local_path``, checked against its size and CRC32."""
        self.filesystem.download(
            self.path(handle), local_path, size=handle.size, crc32=handle.crc32
        )


def _check_name(name: str) -> None:
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise InvalidArgumentError(f"expected a file name inside the snapshot, got {name!r}")
