"""Restore you can trust: every case class of issue 15 that concerns checkpoint
directories, each as a regression test named after what it fixes.

A job here is two heap or RocksDB subtasks over ``<tmp>/root/job``; a canary
file and directory outside the storage root must never be read or deleted.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cowstate.checkpoint.coordinator import SAVEPOINT_MARKER, CheckpointCoordinator
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import (
    METADATA_FILE,
    CheckpointMetadata,
    RestoreMode,
    RestoreRecord,
)
from cowstate.checkpoint.inspect import inspect_snapshot
from cowstate.checkpoint.sealed import seal
from cowstate.checkpoint.storage import (
    CLAIM_MARKER,
    CheckpointStorage,
    SavepointIntent,
    read_metadata,
)
from cowstate.checkpoint.verify import METADATA_KIND
from cowstate.descriptors import ValueStateDescriptor
from cowstate.errors import (
    CorruptCheckpointError,
    CowStateError,
    InconsistentMetadataError,
    MetadataChecksumError,
    UnsafePathError,
    UnsupportedMetadataVersionError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import assign_to_key_group, compute_key_group_range_for_operator_index
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend

MAXP = 16
VALUE: ValueStateDescriptor[Any] = ValueStateDescriptor("value")
BACKENDS = {"heap": HeapKeyedStateBackend, "rocksdb": RocksDBKeyedStateBackend}
EITHER = pytest.mark.parametrize("kind", sorted(BACKENDS))


class Job:
    """Two subtasks of one backend kind and their coordinator."""

    def __init__(self, root: Path, kind: str, *, retained: int = 1, how: Any = None) -> None:
        self.root = root
        self.storage = CheckpointStorage(str(root), "job", FileSystem())
        self.backends = [
            BACKENDS[kind](compute_key_group_range_for_operator_index(MAXP, 2, i), MAXP)
            for i in range(2)
        ]
        for backend in self.backends:
            backend.get_state(VALUE)
        if how is None:
            self.coordinator = CheckpointCoordinator(
                self.storage, self.backends, num_retained=retained
            )
        elif how == "recover":
            self.coordinator = CheckpointCoordinator.recover(
                self.storage, self.backends, num_retained=retained
            )
        else:
            directory, mode = how
            self.coordinator = CheckpointCoordinator.restore(
                self.storage, self.backends, directory, mode, num_retained=retained
            )

    def put(self, keys: range, value: Any) -> None:
        for key in keys:
            group = assign_to_key_group(key, MAXP)
            backend = next(b for b in self.backends if group in b.key_group_range)
            backend.set_current_key(key)
            backend.get_state(VALUE).update(value)

    def contents(self) -> dict[Any, Any]:
        return {k: s for b in self.backends for k, _, s in b.entries("value")}

    def checkpoint(self) -> str:
        completed = self.coordinator.complete_checkpoint(self.coordinator.trigger_checkpoint())
        return completed.directory

    def close(self) -> None:
        self.coordinator.close()
        for backend in self.backends:
            backend.close()


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    """A file and a directory outside the storage root, never to be touched."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret").write_text("do not read")
    (outside / "dir" / "file").write_text("do not delete")
    yield outside
    assert (outside / "secret").read_text() == "do not read"
    assert (outside / "dir" / "file").read_text() == "do not delete"


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path the checkpoint layer opens for reading, in order."""
    paths: list[str] = []
    original = FileSystem.open

    def recording(self: FileSystem, path: str) -> Any:
        paths.append(path)
        return original(self, path)

    monkeypatch.setattr(FileSystem, "open", recording)
    return paths


def reseal(directory: str, edit: Any) -> None:
    """Rewrite ``directory``'s ``_metadata`` through ``edit(document)`` with a valid
    seal: what an attacker who can write the file produces."""
    path = Path(directory, METADATA_FILE)
    body = path.read_bytes()
    body = body[: body.rindex(b"#cowstate")]
    document = json.loads(body)
    edit(document)
    path.write_bytes(seal(METADATA_KIND, 2, json.dumps(document).encode()))


def _list_a_file_twice(subtask: dict[str, Any]) -> None:
    subtask["files"].append(subtask["files"][0])
    subtask["full_size"] += subtask["files"][0]["size"]


def fresh_backends(kind: str) -> list[Any]:
    backends = [
        BACKENDS[kind](compute_key_group_range_for_operator_index(MAXP, 2, i), MAXP)
        for i in range(2)
    ]
    for backend in backends:
        backend.get_state(VALUE)
    return backends


# ------------------------------------------------------------ metadata integrity


@EITHER
def test_metadata_edited_without_resealing_is_refused_before_anything_is_restored(
    tmp_path: Path, kind: str
) -> None:
    job = Job(tmp_path / "root", kind)
    job.put(range(30), "a")
    directory = job.checkpoint()
    path = Path(directory, METADATA_FILE)
    text = path.read_text()
    path.write_text(text.replace('"key_group_range": [\n    0,', '"key_group_range": [\n    1,', 1))
    target = fresh_backends(kind)
    storage = CheckpointStorage(str(tmp_path / "root"), "other")
    with pytest.raises(MetadataChecksumError, match="SHA-256"):
        CheckpointCoordinator.restore(storage, target, directory, RestoreMode.CLAIM)
    assert all(list(b.entries("value")) == [] for b in target)
    job.close()


def test_torn_and_unknown_version_metadata_are_precise_errors(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap")
    directory = job.checkpoint()
    path = Path(directory, METADATA_FILE)
    good = path.read_bytes()
    for torn in (b"", good[: len(good) // 2], good[:-1]):
        path.write_bytes(torn)
        with pytest.raises(MetadataChecksumError):
            read_metadata(FileSystem(), directory)
    path.write_bytes(good.replace(b"#cowstate metadata v2", b"#cowstate metadata v9"))
    with pytest.raises(UnsupportedMetadataVersionError, match="version 9"):
        read_metadata(FileSystem(), directory)
    job.close()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["subtasks"][1].update(key_group_range=[5, 15]), "disjoint ranges"),
        (lambda d: d["subtasks"][1].update(key_group_range=[8, 14]), "cover every key group"),
        (lambda d: d["subtasks"][0].update(max_parallelism=32), "max parallelism"),
        (lambda d: d["subtasks"][0].update(checkpoint_id=7), "belong to checkpoint"),
        (lambda d: d.update(checkpoint_id=0), "checkpoint id >= 1"),
        (lambda d: d["subtasks"][0].update(full_size=1), "full_size"),
        (lambda d: _list_a_file_twice(d["subtasks"][0]), "listed twice"),
        (lambda d: d.update(kind="savepoint"), "savepoint format exactly"),
        (lambda d: d.update(disowned=["job/shared/x"]), "disowned"),
        (lambda d: d.update(job_id="../x"), "job id"),
        (lambda d: d["subtasks"][0].update(files=[], full_size=0), "expected files in subtask"),
        (
            lambda d: (
                d["subtasks"][0].update(key_group_range=[0, 15]),
                d["subtasks"][1].update(key_group_range=[16, 15]),
            ),
            "holds no key group, to hold no state",
        ),
        (
            lambda d: d["subtasks"][1]["states"][0].update(state_serializer="int32"),
            "one kind and serializers in every subtask",
        ),
        (lambda d: d["subtasks"][1].update(key_serializer="utf8"), "one key serializer"),
    ],
)
def test_a_resealed_document_that_contradicts_itself_is_refused(
    tmp_path: Path, edit: Any, message: str
) -> None:
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    directory = job.checkpoint()
    reseal(directory, edit)
    with pytest.raises(InconsistentMetadataError, match=message):
        read_metadata(FileSystem(), directory)
    job.close()


def _native_checkpoint(root: Path) -> str:
    """A closed RocksDB job's native checkpoint with two flushed SST files per subtask."""
    job = Job(root, "rocksdb", retained=2)
    job.put(range(30), "a")
    job.checkpoint()
    job.put(range(30, 60), "b")
    directory = job.checkpoint()
    job.close()
    return directory


def _resealed_file(directory: str, path: Path, data: bytes) -> None:
    """Replace ``path`` (a file of the snapshot) by ``data``, resealing its size and CRC."""
    path.write_bytes(data)

    def edit(document: dict[str, Any]) -> None:
        for subtask in document["subtasks"]:
            for f in subtask["files"]:
                if Path(directory, f["path"]) == path:  # an exclusive file of the snapshot
                    f.update(size=len(data), crc32=zlib.crc32(data))
            subtask["full_size"] = sum(f["size"] for f in subtask["files"])
            subtask["checkpointed_size"] = min(subtask["checkpointed_size"], subtask["full_size"])

    reseal(directory, edit)


@pytest.mark.parametrize(
    "damage", ["older manifest", "manifest cut short", "current cut", "handle drops an sst"]
)
def test_rocksdb_native_files_that_disagree_with_their_handle_are_refused(
    tmp_path: Path, damage: str
) -> None:
    """N1-N3: a MANIFEST cut short opens as an older, smaller database without an
    error; a broken CURRENT fails to open with RocksDB's own exception; a handle
    that no longer lists an SST file. Each a CorruptCheckpointError, nothing
    restored (size and CRC resealed, so only the contents can tell)."""
    directory = _native_checkpoint(tmp_path / "root")
    files = sorted(p for p in Path(directory).rglob("*") if p.is_file())
    files += sorted((tmp_path / "root" / "job" / "shared").glob("*.sst"))  # incremental: shared
    if damage == "handle drops an sst":
        dropped = next(p for p in files if p.suffix == ".sst")

        def edit(document: dict[str, Any]) -> None:
            for subtask in document["subtasks"]:
                subtask["files"] = [
                    f for f in subtask["files"] if Path(f["path"]).name != dropped.name
                ]
                subtask["full_size"] = sum(f["size"] for f in subtask["files"])
                subtask["checkpointed_size"] = min(
                    subtask["checkpointed_size"], subtask["full_size"]
                )

        reseal(directory, edit)
    elif damage == "older manifest":  # chk-1's MANIFEST under chk-2's name: chk-1's database
        victim = next(p for p in files if p.name.startswith("MANIFEST"))
        older = Path(directory).parent / "chk-1" / victim.parent.name
        source = next(older.glob("MANIFEST*"))  # retained: _native_checkpoint keeps two
        _resealed_file(directory, victim, source.read_bytes())
    else:
        name = "MANIFEST" if damage == "manifest cut short" else "CURRENT"
        victim = next(p for p in files if p.name.startswith(name))
        data = victim.read_bytes()
        _resealed_file(directory, victim, data[: len(data) // 2])
    backends = fresh_backends("rocksdb")
    storage = CheckpointStorage(str(tmp_path / "other"), "job", FileSystem())
    with pytest.raises(CorruptCheckpointError):
        CheckpointCoordinator.restore(storage, backends, directory, RestoreMode.NO_CLAIM)
    assert [list(b.entries("value")) for b in backends] == [[], []]
    for backend in backends:
        backend.close()


# ------------------------------------------------------------------ confined paths


@EITHER
@pytest.mark.parametrize(
    "path",
    [
        "/etc/hostname",
        "../../../outside/secret",
        "ftp://127.0.0.1:1/x",
        "file:///etc/hostname",
        "a/../../outside/secret",
        "",
        "a//b",
        "a\\b",
    ],
)
def test_paths_that_leave_the_snapshot_are_refused_before_any_file_is_opened(
    tmp_path: Path, canary: Path, opened: list[str], kind: str, path: str
) -> None:
    job = Job(tmp_path / "root", kind)
    job.put(range(30), "a")
    directory = job.checkpoint()
    job.close()

    def point_away(document: dict[str, Any]) -> None:
        document["subtasks"][0]["files"][0]["path"] = path

    reseal(directory, point_away)
    opened.clear()
    target = fresh_backends(kind)
    storage = CheckpointStorage(str(tmp_path / "root"), "new")
    for mode in RestoreMode:
        with pytest.raises(UnsafePathError):
            CheckpointCoordinator.restore(storage, target, directory, mode)
    with pytest.raises(UnsafePathError):
        inspect_snapshot(directory)
    assert opened == [os.path.join(directory, METADATA_FILE)] * (len(RestoreMode) + 1)
    assert all(list(b.entries("value")) == [] for b in target)


def test_a_symlink_out_of_the_snapshot_is_refused(
    tmp_path: Path, canary: Path, opened: list[str]
) -> None:
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    directory = job.checkpoint()
    job.close()
    metadata = read_metadata(FileSystem(), directory)
    victim = Path(directory, metadata.files[0].path)
    victim.unlink()
    victim.symlink_to(canary / "secret")
    opened.clear()
    with pytest.raises(UnsafePathError, match="link"):
        CheckpointCoordinator.restore(
            CheckpointStorage(str(tmp_path / "root"), "new"),
            fresh_backends("heap"),
            directory,
            RestoreMode.NO_CLAIM,
        )
    assert str(victim) not in opened


def test_claim_never_deletes_outside_what_the_job_owns(tmp_path: Path, canary: Path) -> None:
    """A CLAIMed checkpoint is subsumed: only its own listed files go."""
    old = Job(tmp_path / "root", "rocksdb")
    old.put(range(100), "a")
    directory = old.checkpoint()
    old.close()
    new = Job(tmp_path / "root2", "rocksdb", how=(directory, RestoreMode.CLAIM))
    for round_ in range(3):
        new.put(range(round_ * 10, round_ * 10 + 10), round_)
        new.checkpoint()
    assert not Path(directory, METADATA_FILE).exists()  # subsumed, as CLAIM says
    assert new.coordinator.refused_deletions == []
    new.close()


# -------------------------------------------------------------- savepoints are safe


@EITHER
def test_recover_never_deletes_a_savepoint_inside_the_job_directory(
    tmp_path: Path, kind: str
) -> None:
    job = Job(tmp_path / "root", kind)
    job.put(range(30), "a")
    job.checkpoint()
    savepoint = os.path.join(job.storage.job_dir, "savepoints", "sp-1")
    job.coordinator.trigger_savepoint(savepoint)
    before = sorted(p.name for p in Path(savepoint).rglob("*"))
    job.close()
    recovered = Job(tmp_path / "root", kind, how="recover")
    assert sorted(p.name for p in Path(savepoint).rglob("*")) == before
    assert METADATA_FILE in before
    read_metadata(FileSystem(), savepoint)  # still a savepoint
    recovered.checkpoint()
    recovered.checkpoint()  # subsumption leaves it too
    assert sorted(p.name for p in Path(savepoint).rglob("*")) == before
    recovered.close()


def test_a_savepoint_directory_inside_what_the_job_owns_is_refused(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap")
    chk = job.checkpoint()
    for directory in (
        os.path.join(chk, "sp"),
        os.path.join(job.storage.job_dir, "shared", "sp"),
        job.storage.job_dir,
        str(tmp_path / "root"),
    ):
        with pytest.raises(UnsafePathError, match="outside what job 'job' owns"):
            job.coordinator.trigger_savepoint(directory)
    job.close()


@pytest.mark.parametrize("target", ["outside", "savepoints root", "job directory"])
def test_recover_ignores_a_savepoint_intent_naming_a_directory_it_did_not_create(
    tmp_path: Path, canary: Path, target: str
) -> None:
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    job.checkpoint()
    older = str(tmp_path / "savepoints" / "sp-1")
    job.coordinator.trigger_savepoint(older)
    job.close()
    named = {
        "outside": str(canary / "dir"),
        "savepoints root": str(tmp_path / "savepoints"),
        "job directory": job.storage.job_dir,
    }[target]
    job.storage.write_savepoint_intent(SavepointIntent(directory=named, token="f" * 32))
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert recovered.contents() == {k: "a" for k in range(30)}
    read_metadata(FileSystem(), older)
    assert not Path(job.storage.savepoint_intent_path).exists()
    recovered.close()


def test_recover_removes_an_interrupted_savepoint_and_nothing_else(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    job.checkpoint()
    older = str(tmp_path / "savepoints" / "sp-1")
    job.coordinator.trigger_savepoint(older)
    interrupted = tmp_path / "savepoints" / "sp-2"
    interrupted.mkdir()
    (interrupted / (SAVEPOINT_MARKER + "a" * 32)).write_bytes(b"")
    (interrupted / "keyed-state-0-7").write_bytes(b"partial")
    job.storage.write_savepoint_intent(SavepointIntent(directory=str(interrupted), token="a" * 32))
    job.close()
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert not interrupted.exists()
    assert recovered.coordinator.recovery is not None
    assert recovered.coordinator.recovery.removed_savepoint == str(interrupted)
    read_metadata(FileSystem(), older)
    recovered.close()


def test_a_savepoint_into_a_directory_that_holds_files_is_refused(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap")
    job.coordinator.trigger_savepoint(str(tmp_path / "savepoints" / "sp-1"))
    with pytest.raises(CowStateError, match="already holds files"):
        job.coordinator.trigger_savepoint(str(tmp_path / "savepoints"))
    read_metadata(FileSystem(), str(tmp_path / "savepoints" / "sp-1"))
    job.close()


# ---------------------------------------------------------------- recovery falls back


@EITHER
def test_recover_falls_back_past_a_torn_newest_metadata(tmp_path: Path, kind: str) -> None:
    job = Job(tmp_path / "root", kind, retained=2)
    job.put(range(30), "one")
    job.checkpoint()
    first = job.contents()
    job.put(range(10), "two")
    newest = job.checkpoint()
    job.close()
    Path(newest, METADATA_FILE).write_bytes(b"")  # a power loss before the data landed
    recovered = Job(tmp_path / "root", kind, retained=2, how="recover")
    assert recovered.contents() == first
    report = recovered.coordinator.recovery
    assert report is not None and report.restored_from is not None
    assert report.restored_from.endswith("chk-1")
    assert [s.directory for s in report.skipped] == [newest]
    assert "seal" in report.skipped[0].reason
    recovered.put(range(5), "three")
    recovered.checkpoint()  # the job goes on
    recovered.close()


@EITHER
def test_recover_verifies_before_it_deletes_anything(tmp_path: Path, kind: str) -> None:
    """num_retained=1, chk-2 and chk-3 on disk, chk-3 missing a file: chk-2 is
    restored (it was not deleted first)."""
    job = Job(tmp_path / "root", kind, retained=2)
    job.put(range(30), "one")
    job.checkpoint()
    job.put(range(10), "two")
    second = job.checkpoint()
    expected = job.contents()
    job.put(range(10), "three")
    third = job.checkpoint()
    job.close()
    victim = next(p for p in Path(third).rglob("*") if p.is_file() and p.name != METADATA_FILE)
    victim.unlink()
    recovered = Job(tmp_path / "root", kind, retained=1, how="recover")
    assert recovered.contents() == expected
    assert Path(second, METADATA_FILE).exists()
    assert not Path(third).exists()  # passed over, then collected
    recovered.close()


def test_recover_restores_the_newest_when_an_older_metadata_is_damaged(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap", retained=2)
    job.put(range(30), "one")
    older = job.checkpoint()
    job.put(range(10), "two")
    job.checkpoint()
    expected = job.contents()
    job.close()
    Path(older, METADATA_FILE).write_text("garbage")
    recovered = Job(tmp_path / "root", "heap", retained=1, how="recover")
    assert recovered.contents() == expected
    recovered.close()


def test_recover_with_no_checkpoint_that_verifies_raises_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "one")
    only = job.checkpoint()
    job.close()
    Path(only, METADATA_FILE).write_text("{}")
    before = sorted(str(p) for p in (tmp_path / "root").rglob("*"))
    with pytest.raises(CorruptCheckpointError, match="none does"):
        Job(tmp_path / "root", "heap", how="recover")
    assert sorted(str(p) for p in (tmp_path / "root").rglob("*")) == before


def _started_from_a_savepoint(root: Path, kind: str) -> tuple[Job, str, str, dict[Any, Any]]:
    """A job restored (NO_CLAIM) from savepoint sp-1 with one checkpoint of its
    own, closed; also a second savepoint sp-2 with other contents. Returns the
    job, both savepoints and the checkpoint's contents."""
    first = Job(root / "first", kind)
    first.put(range(30), "one")
    sp1 = str(root / "savepoints" / "sp-1")
    first.coordinator.trigger_savepoint(sp1)
    first.put(range(30), "other")
    sp2 = str(root / "savepoints" / "sp-2")
    first.coordinator.trigger_savepoint(sp2)
    first.close()
    job = Job(root / "second", kind, how=(sp1, RestoreMode.NO_CLAIM))
    job.put(range(5), "mine")
    job.checkpoint()
    expected = job.contents()
    job.close()
    return job, sp1, sp2, expected


@EITHER
@pytest.mark.parametrize("named", ["another savepoint", "another protocol", "claim mode"])
def test_recover_never_follows_a_restore_record_its_checkpoints_do_not_confirm(
    tmp_path: Path, kind: str, named: str, opened: list[str]
) -> None:
    """A forged ``_restore`` (validly sealed) naming another snapshot, a server
    of another protocol, or the right snapshot in CLAIM mode: recovery restores
    the job's own checkpoint, reports the record and never reads what it names
    (or connects anywhere); the savepoints keep every file."""
    job, sp1, sp2, expected = _started_from_a_savepoint(tmp_path, kind)
    directory, mode = {
        "another savepoint": (sp2, RestoreMode.NO_CLAIM),
        "another protocol": ("ftp://127.0.0.1:1/x", RestoreMode.NO_CLAIM),
        "claim mode": (sp1, RestoreMode.CLAIM),
    }[named]
    before = {sp: sorted(p.name for p in Path(sp).rglob("*")) for sp in (sp1, sp2)}
    job.storage.write_restore_record(
        RestoreRecord(directory=directory, mode=mode, checkpoint_id=1, kind="savepoint")
    )
    opened.clear()
    recovered = Job(tmp_path / "second", kind, how="recover")
    assert recovered.contents() == expected
    assert not [p for p in opened if p.startswith((sp2, "ftp:"))]
    report = recovered.coordinator.recovery
    assert report is not None
    (skipped,) = [s for s in report.skipped if s.directory.endswith("/_restore")]
    assert "not followed" in skipped.reason and repr(sp1) in skipped.reason
    assert recovered.coordinator.restored_from is not None
    assert recovered.coordinator.restored_from.directory == sp1  # the checkpoint's record
    recovered.put(range(3), "later")
    recovered.checkpoint()
    recovered.checkpoint()
    recovered.close()
    assert {sp: sorted(p.name for p in Path(sp).rglob("*")) for sp in (sp1, sp2)} == before


@EITHER
def test_a_claim_deletes_the_claimed_snapshot_only_with_its_marker(
    tmp_path: Path, kind: str
) -> None:
    """A real CLAIM writes its marker into the snapshot and, once subsumed,
    removes the snapshot whole (marker included). A forged CLAIM record in a
    job without checkpoints (believed: nothing can confirm it) restores, but
    the named savepoint has no marker, so no checkpoint ever deletes it."""
    first = Job(tmp_path / "first", kind)
    first.put(range(30), "one")
    claimed = str(tmp_path / "savepoints" / "sp-1")
    first.coordinator.trigger_savepoint(claimed)
    other = str(tmp_path / "savepoints" / "sp-2")
    first.coordinator.trigger_savepoint(other)
    first.close()
    job = Job(tmp_path / "claims", kind, how=(claimed, RestoreMode.CLAIM))
    record = job.coordinator.restored_from
    assert record is not None and len(record.token) == 32
    assert Path(claimed, CLAIM_MARKER + record.token).exists()
    job.put(range(3), "x")
    job.checkpoint()
    job.close()
    assert not Path(claimed).exists()  # subsumed: every listed file, _metadata and marker

    forged = Job(tmp_path / "forged", kind)
    forged.close()
    before = sorted(p.name for p in Path(other).rglob("*"))
    forged.storage.write_restore_record(
        RestoreRecord(
            directory=other,
            mode=RestoreMode.CLAIM,
            checkpoint_id=1,
            kind="savepoint",
            token="a" * 32,
        )
    )
    recovered = Job(tmp_path / "forged", kind, how="recover")
    assert recovered.contents() == {k: "one" for k in range(30)}
    report = recovered.coordinator.recovery
    assert report is not None
    assert any("no claim marker" in s.reason for s in report.skipped), report.skipped
    recovered.put(range(3), "y")
    recovered.checkpoint()
    recovered.checkpoint()
    recovered.close()
    assert sorted(p.name for p in Path(other).rglob("*")) == before


def test_a_second_claim_of_a_snapshot_revokes_the_first(tmp_path: Path) -> None:
    """Two jobs CLAIM one savepoint: the second's marker replaces the first's,
    so the first job never deletes it and the second removes it whole."""
    first = Job(tmp_path / "first", "heap")
    first.put(range(30), "one")
    claimed = str(tmp_path / "savepoints" / "sp-1")
    first.coordinator.trigger_savepoint(claimed)
    first.close()
    earlier = Job(tmp_path / "earlier", "heap", how=(claimed, RestoreMode.CLAIM))
    later = Job(tmp_path / "later", "heap", how=(claimed, RestoreMode.CLAIM))
    assert later.coordinator.restored_from is not None
    markers = [p.name for p in Path(claimed).iterdir() if p.name.startswith(CLAIM_MARKER)]
    assert markers == [CLAIM_MARKER + later.coordinator.restored_from.token]
    earlier.checkpoint()
    earlier.checkpoint()  # subsumes the claimed savepoint: not its owner any more
    earlier.close()
    assert Path(claimed, METADATA_FILE).exists()
    assert earlier.coordinator.refused_deletions
    later.checkpoint()
    later.close()
    assert not Path(claimed).exists()


def test_a_lost_restore_record_is_taken_from_the_newest_checkpoint(tmp_path: Path) -> None:
    job, sp1, _sp2, expected = _started_from_a_savepoint(tmp_path, "heap")
    Path(job.storage.job_dir, "_restore").unlink()
    recovered = Job(tmp_path / "second", "heap", how="recover")
    assert recovered.contents() == expected
    record = recovered.coordinator.restored_from
    assert record is not None and (record.directory, record.mode) == (sp1, RestoreMode.NO_CLAIM)
    latest = recovered.coordinator.latest_checkpoint
    assert latest is not None and latest.metadata.restored_from == record
    recovered.close()


def test_a_restore_record_of_an_unreachable_file_system_is_a_clean_error(tmp_path: Path) -> None:
    """No checkpoint of its own: ``_restore`` is believed, and a server that
    refuses the connection is a cowstate error, nothing restored or deleted."""
    job = Job(tmp_path / "root", "heap")
    job.storage.write_restore_record(
        RestoreRecord(
            directory="ftp://127.0.0.1:1/x",
            mode=RestoreMode.NO_CLAIM,
            checkpoint_id=1,
            kind="savepoint",
        )
    )
    job.close()
    before = sorted(str(p) for p in (tmp_path / "root").rglob("*"))
    with pytest.raises(CorruptCheckpointError, match=r"StorageUnavailableError|reach"):
        Job(tmp_path / "root", "heap", how="recover")
    assert sorted(str(p) for p in (tmp_path / "root").rglob("*")) == before


def test_a_torn_counter_never_hands_out_an_id_twice(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap")
    job.checkpoint()
    job.checkpoint()
    job.close()
    Path(job.storage.job_dir, "_counter").write_text("")
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert re.search(r"chk-3$", recovered.checkpoint())
    recovered.close()


# ---------------------------------------------------------------------- durability


def test_every_published_file_is_fsynced_before_its_rename_and_its_directory_after(
    tmp_path: Path,
) -> None:
    events: list[tuple[str, str]] = []

    def record(operation: str, path: str, _data: bytes | None) -> None:
        if operation != "write":
            events.append((operation, path))

    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem(hooks=record))
    backends = fresh_backends("heap")
    coordinator = CheckpointCoordinator(storage, backends)
    backends[0].set_current_key(1)
    backends[0].get_state(VALUE).update(1)
    coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
    renames = [i for i, (op, _) in enumerate(events) if op == "rename"]
    assert len(renames) >= 3  # counter, the subtasks' files, _metadata
    for i in renames:
        temp = events[i][1]
        assert ("fsync", temp) in events[:i], f"{temp} renamed before it was fsynced"
        final_dir = os.path.dirname(temp)
        assert ("fsync", final_dir) in events[i + 1 :], f"{final_dir} not fsynced after rename"


def test_metadata_of_the_current_format_round_trips(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "rocksdb")
    job.put(range(30), "a")
    directory = job.checkpoint()
    metadata = read_metadata(FileSystem(), directory)
    assert isinstance(metadata, CheckpointMetadata) and metadata.format_version == 2
    assert all(not f.path.startswith("/") for f in metadata.files)
    assert {f.path.split("/")[0] for f in metadata.files if f.scope == "shared"} == {"job"}
    job.close()
