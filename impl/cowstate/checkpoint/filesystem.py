"""The file system checkpoints live on: a thin, atomic layer over fsspec.

A :class:`FileSystem` is rooted nowhere: it takes absolute paths or URLs
(``/data/ckpt``, ``file:///data/ckpt``, ``memory://ckpt``, ``s3://bucket/x``
with s3fs installed) and resolves each with ``fsspec.core.url_to_fs``.

Every write is atomic: :meth:`FileSystem.create` returns an
:class:`AtomicOutputStream` that writes to a hidden temporary name beside the
target (``.<name>.<random>.inprogress``), and only ``close_and_get_handle()``
flushes, closes and renames it into place. A crash before that leaves at
most a temporary file, which readers never take for the real one and
recovery deletes. The stream computes the size and CRC32 of what it wrote.

Durability. On a local file system the temporary file is ``fsync``-ed before
the rename, and its directory after it (and a directory's parent after the
directory is created), so a power loss leaves either the old state or the
complete new file -- never an empty ``_metadata`` under the final name. On
an object store (s3, gcs, ...) there is no rename and no fsync: a file
becomes visible complete when its upload finishes (a PUT is atomic), and
fsspec's ``mv`` copies then deletes, so a crash can leave a complete copy
under both names, never a partial one; the seal of ``_metadata`` catches
anything else.

Errors. A read of a missing file raises
:class:`~cowstate.errors.CheckpointNotFoundError`; any other ``OSError`` of a
read (a directory where a file should be, no permission) raises
:class:`~cowstate.errors.CorruptCheckpointError`, naming the path. A URL of a
protocol fsspec does not know raises
:class:`~cowstate.errors.InvalidArgumentError`; a remote file system that cannot
be reached, :class:`~cowstate.errors.StorageUnavailableError`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import posixpath
import uuid
import zlib
from collections.abc import Iterator
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from cowstate.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidArgumentError,
    StorageUnavailableError,
)

__all__ = [
    "TEMP_SUFFIX",
    "AtomicOutputStream",
    "FileSystem",
    "WrittenFile",
    "is_temporary",
]

TEMP_SUFFIX = ".inprogress"
_COPY_CHUNK = 1 << 20


def is_temporary(path: str) -> bool:
    """True for the temporary name of an unfinished atomic write."""
    name = posixpath.basename(path)
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


class WrittenFile:
    """Where an atomic write ended up, with its size and CRC32."""

    __slots__ = ("crc32", "path", "size")

    def __init__(self, path: str, size: int, crc32: int) -> None:
        self.path = path
        self.size = size
        self.crc32 = crc32

    def __repr__(self) -> str:
        return f"WrittenFile({self.path!r}, size={self.size}, crc32={self.crc32:#010x})"


class FileSystem:
    """Absolute paths and URLs on any fsspec file system, with atomic writes.

    ``hooks`` (tests only) is called with ``("write", path, data)`` before
    each chunk is written, ``("rename", temp, final)`` before each rename and
    ``("delete", path, None)`` before each deletion and ``("fsync", path, None)``
    before each fsync of a file or directory; it may raise to inject a failure
    or a crash.
    """

    def __init__(self, hooks: Any = None) -> None:
        self._hooks = hooks

    # ----------------------------------------------------------------- paths

    @staticmethod
    def join(base: str, *parts: str) -> str:
        return posixpath.join(base.rstrip("/") if base != "/" else base, *parts)

    @staticmethod
    def name(path: str) -> str:
        return posixpath.basename(path.rstrip("/"))

    @staticmethod
    def parent(path: str) -> str:
        return posixpath.dirname(path.rstrip("/"))

    # ----------------------------------------------------------------- reads

    def exists(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.exists(p))

    def is_dir(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.isdir(p))

    def size(self, path: str) -> int:
        """The size of the file ``path`` (:class:`CheckpointNotFoundError` if missing)."""
        fs, p = self._fs(path)
        with _read_errors(path):
            return int(fs.size(p))

    def open(self, path: str) -> IO[bytes]:
        """Open ``path`` for reading (:class:`CheckpointNotFoundError` if missing)."""
        fs, p = self._fs(path)
        with _read_errors(path):
            stream: IO[bytes] = fs.open(p, "rb")
        return stream

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        """The bytes of ``path``; with ``limit``, at most ``limit + 1`` of them
        (a caller refusing larger files need not read them whole)."""
        with self.open(path) as stream:
            try:
                return stream.read() if limit is None else stream.read(limit + 1)
            except OSError as exc:
                raise CorruptCheckpointError(
                    f"expected to read {path!r}, got {type(exc).__name__}: {exc}"
                ) from None

    def is_local(self, path: str) -> bool:
        """True if ``path`` is on the local file system (symlinks and fsync apply)."""
        fs, _ = self._fs(path)
        return isinstance(fs, LocalFileSystem)

    def local_path(self, path: str) -> str | None:
        """The operating-system path of a local ``path``, else None."""
        fs, p = self._fs(path)
        return str(p) if isinstance(fs, LocalFileSystem) else None

    def list_files(self, directory: str) -> list[str]:
        """Every file under ``directory``, recursively, as full paths (sorted);
        empty if the directory does not exist."""
        fs, p = self._fs(directory)
        if not fs.exists(p):
            return []
        prefix = directory.rstrip("/")
        root = p.rstrip("/")
        found = fs.find(p, withdirs=False)
        return sorted(prefix + str(f)[len(root) :] for f in found)

    def list_dir(self, directory: str) -> list[str]:
        """The entries directly under ``directory`` (full paths, sorted)."""
        fs, p = self._fs(directory)
        if not fs.exists(p):
            return []
        prefix = directory.rstrip("/")
        return sorted(
            self.join(prefix, posixpath.basename(str(e).rstrip("/")))
            for e in fs.ls(p, detail=False)
        )

    # ---------------------------------------------------------------- writes

    def makedirs(self, path: str) -> None:
        """Create ``path`` and its missing parents. On a local disk each
        directory's entry is made durable (its parent fsynced) by whoever
        created it -- exactly once, however many writers race to create it."""
        fs, p = self._fs(path)
        if not isinstance(fs, LocalFileSystem):
            fs.makedirs(p, exist_ok=True)
            return
        if os.path.isdir(p):
            return
        parent = self.parent(path)
        if parent and parent != path:
            self.makedirs(parent)
        try:
            os.mkdir(p)
        except FileExistsError:
            return  # another writer created it (and fsyncs its parent)
        self.fsync_dir(parent or ".")

    def fsync_dir(self, directory: str) -> None:
        """Make a local directory's entries durable (no-op elsewhere)."""
        local = self.local_path(directory)
        if local is None:
            return
        if self._hooks is not None:
            self._hooks("fsync", directory, None)
        fd = os.open(local, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def create(self, path: str) -> AtomicOutputStream:
        """An atomic stream that becomes ``path`` on ``close_and_get_handle()``."""
        self.makedirs(self.parent(path))
        temp = self.join(self.parent(path), f".{self.name(path)}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
        return AtomicOutputStream(self, path, temp)

    def write_bytes(self, path: str, data: bytes) -> WrittenFile:
        stream = self.create(path)
        try:
            stream.write(data)
        except BaseException:
            stream.discard()
            raise
        return stream.close_and_get_handle()

    def create_empty(self, path: str) -> None:
        """Create the empty file ``path`` directly, without a temporary name (a
        marker): an empty file is whole once it exists, so a crash leaves it
        or nothing under its own name. Durable on a local disk (its directory
        fsynced); an existing file is left as it is."""
        self._write_hook(path, b"")
        self.makedirs(self.parent(path))
        fs, p = self._fs(path)
        fs.touch(p, truncate=False)
        self.fsync_dir(self.parent(path))

    def upload(self, local_path: str | os.PathLike[str], path: str) -> WrittenFile:
        """Copy a local file to ``path`` atomically."""
        stream = self.create(path)
        try:
            with open(local_path, "rb") as source:
                while chunk := source.read(_COPY_CHUNK):
                    stream.write(chunk)
        except BaseException:
            stream.discard()
            raise
        return stream.close_and_get_handle()

    def download(
        self, path: str, local_path: str | os.PathLike[str], *, size: int, crc32: int
    ) -> None:
        """Copy ``path`` to a local file, checking its size and CRC32."""
        crc = 0
        written = 0
        with self.open(path) as source, open(local_path, "wb") as target:
            while chunk := source.read(_COPY_CHUNK):
                crc = zlib.crc32(chunk, crc)
                written += len(chunk)
                target.write(chunk)
        if (written, crc) != (size, crc32):
            os.unlink(local_path)
            raise CorruptCheckpointError(
                f"expected {path!r} to hold {size} bytes with CRC32 {crc32:#010x}, got "
                f"{written} bytes with CRC32 {crc:#010x}"
            )

    def delete(self, path: str) -> None:
        """Delete a file (absent files are fine)."""
        if self._hooks is not None:
            self._hooks("delete", path, None)
        fs, p = self._fs(path)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(p)

    def delete_dir(self, path: str) -> None:
        """Delete a directory and everything in it (absent is fine)."""
        if self._hooks is not None:
            self._hooks("delete", path, None)
        fs, p = self._fs(path)
        if fs.exists(p):
            fs.rm(p, recursive=True)

    def rename(self, source: str, target: str) -> None:
        if self._hooks is not None:
            self._hooks("rename", source, target)
        fs, p = self._fs(source)
        _, q = self._fs(target)
        fs.mv(p, q)

    # ------------------------------------------------------ private helpers

    def _fs(self, path: str) -> tuple[Any, str]:
        if not isinstance(path, str) or not path:
            raise InvalidArgumentError(f"expected a path or URL, got {path!r}")
        if "://" not in path and "::" not in path:
            # A plain local path: what url_to_fs gives for it (the cached local
            # file system, the path made absolute), without its URL parsing,
            # which was the most of a restore's path checks.
            local = _local_file_system()
            return local, local._strip_protocol(path)
        try:
            fs, p = fsspec.core.url_to_fs(path)
        except (ValueError, ImportError) as exc:  # an unknown protocol, or not installed
            raise InvalidArgumentError(
                f"expected a path or URL of a known file system, got {path!r}: {exc}"
            ) from None
        except OSError as exc:  # a remote file system that connects on creation
            raise StorageUnavailableError(
                f"expected to reach the file system of {path!r}, got {type(exc).__name__}: {exc}"
            ) from None
        return fs, p

    def _write_hook(self, path: str, data: bytes) -> None:
        if self._hooks is not None:
            self._hooks("write", path, data)

    def _fsync_hook(self, path: str) -> None:
        if self._hooks is not None:
            self._hooks("fsync", path, None)


@contextlib.contextmanager
def _read_errors(path: str) -> Iterator[None]:
    """A read's ``OSError`` as the module doc says: missing, or not readable."""
    try:
        yield
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"expected a file at {path!r}, found none") from None
    except OSError as exc:
        raise CorruptCheckpointError(
            f"expected a readable file at {path!r}, got {type(exc).__name__}: {exc}"
        ) from None


class AtomicOutputStream:
    """Writes a file under a temporary name; ``close_and_get_handle()`` renames it.

    ``discard()`` removes the temporary file instead (a failed or cancelled
    write). The size and CRC32 of what was written are tracked as it goes.
    """

    def __init__(self, filesystem: FileSystem, path: str, temp: str) -> None:
        self.path = path
        self.temp = temp
        self._filesystem = filesystem
        fs, p = filesystem._fs(temp)
        self._stream: IO[bytes] | None = fs.open(p, "wb")
        self._size = 0
        self._crc = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        stream = self._open()
        chunk = bytes(data)
        self._filesystem._write_hook(self.path, chunk)
        stream.write(chunk)
        self._size += len(chunk)
        self._crc = zlib.crc32(chunk, self._crc)
        return len(chunk)

    def flush(self) -> None:
        self._open().flush()

    def tell(self) -> int:
        return self._size

    def writable(self) -> bool:
        return True

    def close_and_get_handle(self) -> WrittenFile:
        """Flush, fsync, close and rename into place, then fsync the directory
        (local file systems; see the module doc): the file is then visible
        and durable."""
        stream = self._open()
        stream.flush()
        if self._filesystem.is_local(self.temp):  # a local file: it has a descriptor
            self._filesystem._fsync_hook(self.temp)
            os.fsync(stream.fileno())
        stream.close()
        self._stream = None
        self._filesystem.rename(self.temp, self.path)
        self._filesystem.fsync_dir(self._filesystem.parent(self.path))
        return WrittenFile(self.path, self._size, self._crc)

    def discard(self) -> None:
        """Drop what was written (idempotent)."""
        if self._stream is not None:
            try:
                self._stream.close()
            finally:
                self._stream = None
        self._filesystem.delete(self.temp)

    def __enter__(self) -> AtomicOutputStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._stream is not None:
            self.discard()

    def _open(self) -> IO[bytes]:
        if self._stream is None:
            raise InvalidArgumentError(f"expected an open stream for {self.path!r}, it was closed")
        return self._stream


@functools.cache
def _local_file_system() -> Any:
    """fsspec's local file system (one instance: fsspec caches it too)."""
    return fsspec.filesystem("file")
