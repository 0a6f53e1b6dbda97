"""RocksDB reads check the iterator's status (issue 15): a RocksDB iterator that
meets a corrupt block just becomes invalid, as at the end of its range, so a
loop on ``valid()`` alone ends early and returns fewer entries. Every read goes
through ``cowstate.rocksdb.table.scan``, which checks ``RdictIter.status()``:
corruption is a ``CorruptStorageError`` (a ``CorruptCheckpointError`` in a
restore, a failed snapshot in a canonical savepoint), never a shorter result.

The corruption is real: bytes flipped in the middle of a real SST file. Each
test also runs the broken variant (the status check switched off) and shows
the silent loss the check prevents.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from restore_support import corrupt_database, dump, flip, group_of, rocks
from rocksdict import Rdict

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.errors import CorruptCheckpointError, CorruptStorageError, SnapshotWriteError
from cowstate.key_groups import KeyGroupRange
from cowstate.rocksdb import table as rocks_table
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.rocksdb.table import scan

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
