"""The RocksDB scan (``cowstate.rocksdb.table.scan``): every read of the
RocksDB backend goes through it, in chunks between a lower and an upper bound.

- what a stopped scan says: RocksDB reads check the iterator's status (issue
  15). A RocksDB iterator that meets a corrupt block just becomes invalid, as
  at the end of its range, so a loop on ``valid()`` alone ends early and
  returns fewer entries; ``scan`` checks ``RdictIter.status()``: corruption is
  a ``CorruptStorageError`` (a ``CorruptCheckpointError`` in a restore, a
  failed snapshot in a canonical savepoint) naming its bound and the last key
  read, never a shorter result. The corruption is real: bytes flipped in the
  middle of a real SST file. Each test also runs the broken variant (the
  status check switched off) and shows the silent loss the check prevents.
- bounds and chunks: the upper bound is given to RocksDB and checked again
  where a binding ignores it; each native iterator reads one chunk.

The tests marked ``kills`` were written to kill mutants of the module
(``make mutate SCOPE=checkpoint``); their comments name the mutants.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from restore_support import corrupt_database, corrupt_key, dump, flip, group_of, raw_database, rocks
from rocksdict import Rdict, ReadOptions

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.errors import CorruptCheckpointError, CorruptStorageError, SnapshotWriteError
from cowstate.key_groups import KeyGroupRange
from cowstate.rocksdb import table as rocks_table
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.rocksdb.table import check_status, scan

ENTRIES = 20_000
LOW, HIGH, MIDDLE = KeyGroupRange(0, 7), KeyGroupRange(8, 15), KeyGroupRange(4, 11)


def without_status_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken variant: scan loops on valid() alone, as before the fix."""
    monkeypatch.setattr(rocks_table, "check_status", lambda *args: None)


@pytest.fixture
def corrupt_db(tmp_path: Path) -> Iterator[Rdict]:
    """A database of ``ENTRIES`` entries in one SST with a flipped data byte."""
    db = corrupt_database(tmp_path / "db", ENTRIES)
    yield db
    db.close()


def test_a_scan_over_a_corrupt_block_raises(corrupt_db: Rdict) -> None:
    with pytest.raises(CorruptStorageError, match="Corruption") as excinfo:
        list(scan(corrupt_db, b"", b"\xff\xff"))
    assert "expected RocksDB to read every entry" in str(excinfo.value)


def test_without_the_status_check_the_scan_is_silently_short(
    corrupt_db: Rdict, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_status_check(monkeypatch)
    read = list(scan(corrupt_db, b"", b"\xff\xff"))
    assert 0 < len(read) < ENTRIES  # no error: entries just missing


# ---------------------------------------------------- what a stopped scan says


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_scan_stopped_by_corruption_names_its_bound_and_last_key(corrupt_db: Rdict) -> None:
    # table.scan 23 (the bound the message names dropped), 28 (the start of
    # the chunk named instead of the last key read), 32 (the last value named).
    keys = {corrupt_key(i) for i in range(ENTRIES)}
    with pytest.raises(CorruptStorageError) as excinfo:
        list(scan(corrupt_db, b"", b"\xff\xff", chunk=100_000))
    message = str(excinfo.value)
    prefix = "expected RocksDB to read every entry up to ffff, it stopped after "
    assert message.startswith(prefix)
    last = bytes.fromhex(message.removeprefix(prefix).split(":", 1)[0])
    assert last in keys  # a key read before the corrupt block, not its value


class _FailingIterator:
    def status(self) -> None:
        raise RuntimeError("Corruption: block checksum mismatch")


# table.check_status 1-6 (the bound the message names: "the end" without an
# upper bound, the bound's bytes with one).
@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_an_iterator_that_stopped_on_an_error_names_where_and_why() -> None:
    for upper, bound in ((None, "the end"), (b"\x00\x07", "0007")):
        with pytest.raises(CorruptStorageError) as excinfo:
            check_status(_FailingIterator(), b"\x00\x01", upper)  # type: ignore[arg-type]
        assert str(excinfo.value) == (
            f"expected RocksDB to read every entry up to {bound}, it stopped after 0001: "
            "Corruption: block checksum mismatch"
        )


# ---------------------------------------------------------------- restores


def job(root: Path) -> tuple[list[KeyedStateHandle], dict[Any, Any]]:
    """Checkpoints of two subtasks (LOW, HIGH) holding ``ENTRIES`` entries, and
    what a backend of MIDDLE restores from them."""
    handles = []
    expected: dict[Any, Any] = {}
    for key_group_range in (LOW, HIGH):
        backend = rocks(root / "local", key_group_range)
        table = backend.table("value")
        for key in range(ENTRIES):
            if group_of(key) in key_group_range:
                table.put(key, "a", f"value-{key:08d}-{'x' * 24}")
                if group_of(key) in MIDDLE:
                    expected[key, "a"] = f"value-{key:08d}-{'x' * 24}"
        location = SnapshotLocation(FileSystem(), str(root / "chk-1"), str(root / "shared"))
        handles.append(backend.snapshot_to(1, location, SnapshotOptions()).result(60))
        backend.close()
    return handles, expected


def source_of(root: Path) -> SnapshotSource:
    """Where the checkpoint ``job(root)`` wrote resolves its relative paths."""
    return SnapshotSource(FileSystem(), str(root / "chk-1"))


def with_corrupt_sst(handle: KeyedStateHandle, root: Path) -> KeyedStateHandle:
    """``handle`` after a byte of its largest SST flipped, its size and CRC32
    updated to match: the files verify, RocksDB's block checksum does not."""
    sst = max(
        (f for f in handle.files if (f.local_name or "").endswith(".sst")), key=lambda f: f.size
    )
    path = Path(source_of(root).path(sst))
    flip(path, 0.25)  # a data block of key groups 8-11 (the SST holds 8-15 in order)
    data = path.read_bytes()
    fixed = sst.model_copy(update={"crc32": zlib.crc32(data), "size": len(data)})
    files = tuple(fixed if f is sst else f for f in handle.files)
    return handle.model_copy(update={"files": files})


def test_a_rescaling_restore_refuses_a_corrupt_sst(tmp_path: Path) -> None:
    handles, _ = job(tmp_path)
    handles[1] = with_corrupt_sst(handles[1], tmp_path)  # the handle a MIDDLE restore copies from
    target = rocks(tmp_path / "local", MIDDLE)
    target.table("value").put(next(k for k in range(99) if group_of(k) in MIDDLE), "m", "mine")
    before = dump(target)
    with pytest.raises(CorruptCheckpointError, match="to read back whole") as excinfo:
        target.restore_from(handles, source_of(tmp_path))
    assert isinstance(excinfo.value.__cause__, CorruptStorageError)
    assert dump(target) == before
    target.close()


def test_without_the_status_check_a_rescaling_restore_loses_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handles, expected = job(tmp_path)
    handles[1] = with_corrupt_sst(handles[1], tmp_path)
    without_status_check(monkeypatch)
    target = rocks(tmp_path / "local", MIDDLE)
    target.restore_from(handles, source_of(tmp_path))  # no error ...
    got = dump(target)["value"]
    assert set(got) < set(expected)  # ... and entries are missing
    target.close()


def test_the_control_rescaling_restore_restores_everything(tmp_path: Path) -> None:
    handles, expected = job(tmp_path)
    target = rocks(tmp_path / "local", MIDDLE)
    target.restore_from(handles, source_of(tmp_path))
    assert dump(target)["value"] == expected
    target.close()


# ------------------------------------------------------ canonical savepoints


def corrupt_live_backend(root: Path) -> RocksDBKeyedStateBackend:
    """A backend whose live SST (flushed by a checkpoint) has a flipped byte."""
    backend = rocks(root / "local")
    table = backend.table("value")
    for key in range(ENTRIES):
        table.put(key, "a", pickle.dumps(key) * 4)
    location = SnapshotLocation(FileSystem(), str(root / "chk-1"), str(root / "shared"))
    backend.snapshot_to(1, location, SnapshotOptions()).result(60)
    [sst] = sorted(backend.db_path.glob("*.sst"), key=lambda p: p.stat().st_size)[-1:]
    flip(sst, 0.5)
    return backend


def canonical_savepoint(backend: RocksDBKeyedStateBackend, directory: Path) -> KeyedStateHandle:
    location = SnapshotLocation(FileSystem(), str(directory), None)
    options = SnapshotOptions(kind="savepoint", format="canonical")
    return backend.snapshot_to(2, location, options).result(60)


def test_a_canonical_savepoint_of_a_corrupt_database_fails(tmp_path: Path) -> None:
    backend = corrupt_live_backend(tmp_path)
    with pytest.raises(SnapshotWriteError) as excinfo:
        canonical_savepoint(backend, tmp_path / "sp")
    assert isinstance(excinfo.value.__cause__, CorruptStorageError)
    backend.close()


def test_without_the_status_check_a_canonical_savepoint_is_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = corrupt_live_backend(tmp_path)
    without_status_check(monkeypatch)
    handle = canonical_savepoint(backend, tmp_path / "sp")  # written, no error ...
    restored = rocks(tmp_path / "local")
    restored.restore_from([handle], SnapshotSource(FileSystem(), str(tmp_path / "sp")))
    assert 0 < restored.num_state_entries() < ENTRIES  # ... and short
    restored.close()
    backend.close()


# ----------------------------------------------------------- bounds and chunks


class _Recording:
    """A column family whose iterators record the keys they hand out, one list
    per native iterator; ``honour_bounds=False`` drops the read options, as a
    binding that ignored the upper bound would."""

    def __init__(self, cf: Rdict, honour_bounds: bool = True) -> None:
        self.cf = cf
        self.honour_bounds = honour_bounds
        self.read: list[list[bytes]] = []

    def iter(self, read_options: ReadOptions) -> _RecordingIterator:
        keys: list[bytes] = []
        self.read.append(keys)
        inner = self.cf.iter(read_options if self.honour_bounds else ReadOptions())
        return _RecordingIterator(inner, keys)


class _RecordingIterator:
    def __init__(self, inner: Any, keys: list[bytes]) -> None:
        self.inner, self.keys = inner, keys

    def seek(self, key: bytes) -> None:
        self.inner.seek(key)

    def valid(self) -> bool:
        return bool(self.inner.valid())

    def key(self) -> bytes:
        key: bytes = self.inner.key()
        self.keys.append(key)
        return key

    def value(self) -> bytes:
        value: bytes = self.inner.value()
        return value

    def next(self) -> None:
        self.inner.next()

    def status(self) -> None:
        self.inner.status()


def scan_through(
    recording: _Recording, lower: bytes, upper: bytes | None, chunk: int
) -> list[tuple[bytes, bytes]]:
    """Everything ``scan`` reads through ``recording`` (a column family getter)."""
    return list(scan(lambda: recording, lower, upper, chunk))  # type: ignore[arg-type, return-value]


SCANNED = [b"a", b"a\x00", b"aB", b"b", b"c", b"c\x01", b"d", b"e"]


@pytest.fixture
def scanned(tmp_path: Path) -> Iterator[Rdict]:
    """A raw-mode database holding the keys :data:`SCANNED` (value: the key upper-cased)."""
    database = raw_database(tmp_path / "db")
    for key in SCANNED:
        database.put(key, key.upper())
    yield database
    database.close()


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_scan_stops_at_its_upper_bound_inside_rocksdb_chunk_by_chunk(scanned: Rdict) -> None:
    # table.scan 4, 5, 10 (the upper bound not given to RocksDB: the iterator
    # reads the first key past it), 14 (a native iterator reading chunk + 1
    # entries), 39 (the next chunk seeking past keys that extend the last one).
    recording = _Recording(scanned)
    read = scan_through(recording, b"a", b"d", chunk=2)
    assert read == [(k, k.upper()) for k in SCANNED if b"a" <= k < b"d"]
    assert [len(keys) for keys in recording.read] == [2, 2, 2, 0]
    assert all(key < b"d" for keys in recording.read for key in keys)
    to_the_end = _Recording(scanned)
    assert [k for k, _ in scan_through(to_the_end, b"c", None, chunk=1)] == [
        b"c",
        b"c\x01",
        b"d",
        b"e",
    ]
    assert [len(keys) for keys in to_the_end.read] == [1, 1, 1, 1, 0]


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_scan_stops_at_its_upper_bound_where_rocksdb_does_not(scanned: Rdict) -> None:
    # table.scan 18 (the key equal to the upper bound taken), 19 (the chunk
    # dropped when a key past the bound ends it).
    for chunk in (2, 100):
        ignoring = _Recording(scanned, honour_bounds=False)
        read = scan_through(ignoring, b"a\x00", b"c\x01", chunk=chunk)
        assert [k for k, _ in read] == [b"a\x00", b"aB", b"b", b"c"]
