"""The storage layout (``cowstate.checkpoint.storage``): where a job's
checkpoints, shared files and documents live, and what the job owns.

- the layout: a storage root (kept as given, less its trailing slashes), the
  job directory below it; ``relation`` tells the job directory, what holds
  it, what the job owns (``chk-<id>/``, ``shared/``, ``_counter``,
  ``_restore``, ``_savepoint``), what lies outside, and a directory on
  another file system ("foreign", told apart by the file system's class);
- on disk: the checkpoints found (a directory of another checkpoint or job is
  a problem by its id, a linked one is not the job's), the unfinished writes,
  the counter (foreign bytes ignored, never read whole);
- savepoint directories: named, outside what the job owns, new or empty, on
  any file system;
- documents: the savepoint intent, the restore record and ``_metadata`` are
  read at most one byte past the size limit and checked against their schema,
  the messages naming what and where.

The tests marked ``kills`` were written to kill mutants of the module
(``make mutate SCOPE=checkpoint``); their comments name the mutants.
"""

from __future__ import annotations

import importlib
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from restore_support import heap

from cowstate.checkpoint import sealed
from cowstate.checkpoint import storage as storage_module
from cowstate.checkpoint.coordinator import CheckpointCoordinator
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import RestoreMode, RestoreRecord
from cowstate.checkpoint.storage import CheckpointStorage, OnDisk, SavepointIntent, read_metadata
from cowstate.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidArgumentError,
    MetadataChecksumError,
    UnsafePathError,
)


def _storage(tmp_path: Path) -> CheckpointStorage:
    return CheckpointStorage(str(tmp_path / "root"), "job")


# ------------------------------------------------------------------ the layout


# storage.CheckpointStorage.__init__ 1 (`and`: an empty root taken, a non-str
# one failing later), 4 (message None), 16, 18 (a root's trailing blank or X
# cut), 19 (the root "/" became "XX/XX").
@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_storage_root_is_refused_unless_a_name_and_kept_as_it_is(tmp_path: Path) -> None:
    for root in ("", 7, None):
        with pytest.raises(InvalidArgumentError) as caught:
            CheckpointStorage(root, "job")  # type: ignore[arg-type]
        assert str(caught.value) == f"expected a root path or URL, got {root!r}"
    for name in ("root ", "rootX"):
        storage = CheckpointStorage(f"{tmp_path}/{name}/", "job")
        assert storage.root == f"{tmp_path}/{name}"
        assert storage.job_dir == f"{tmp_path}/{name}/job"
    top = CheckpointStorage("/", "job")
    assert (top.root, top.job_dir, top.shared_dir) == ("/", "/job", "/job/shared")


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_relation_names_the_job_directory_what_holds_it_and_the_job_files(tmp_path: Path) -> None:
    # storage.CheckpointStorage.relation__mutmut_13/14 ("job directory"),
    # __mutmut_27/28 ("holds the job directory"), __mutmut_61/62 ("owned"):
    # the relation was spelled otherwise; __mutmut_55..60: the job's _counter,
    # _restore or _savepoint file was taken for a file outside what it owns.
    storage = _storage(tmp_path)
    job = storage.job_dir
    assert storage.relation(job) == "job directory"
    assert storage.relation(storage.root) == "holds the job directory"
    assert storage.relation("/") == "holds the job directory"
    for name in ("_counter", "_restore", "_savepoint"):
        assert storage.relation(f"{job}/{name}") == "owned"
        assert storage.owns(f"{job}/{name}")
    assert storage.relation(f"{job}/_other") == "outside"
    assert storage.relation(storage.checkpoint_dir(4)) == "owned"


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_sibling_of_the_root_named_with_a_trailing_space_does_not_hold_the_job(
    tmp_path: Path,
) -> None:
    # storage.CheckpointStorage.relation__mutmut_19 (`rstrip(None)`): the
    # trailing space was cut, so "root " was taken for the directory above "root/job".
    storage = _storage(tmp_path)
    assert storage.relation(storage.root + " ") == "outside"
    assert storage.relation(storage.job_dir + " ") == "outside"


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_paths_on_another_file_system_compare_by_their_exact_names() -> None:
    # storage.CheckpointStorage._normalized__mutmut_12 (`strip(None)`): a
    # trailing space was cut, so "job " was the job directory; __mutmut_14
    # (`strip("XX/XX")`): a trailing X was cut, so "jobX" was the job directory.
    base = f"memory://cowstate-tests/{uuid.uuid4().hex}"
    storage = CheckpointStorage(f"{base}/root", "job")
    assert storage.relation(f"{base}/root/job") == "job directory"
    assert storage.relation(f"{base}/root/job/") == "job directory"
    assert storage.relation(f"{base}/root/job ") == "outside"
    assert storage.relation(f"{base}/root/jobX") == "outside"
    assert storage.relation(f"{base}/root/job/chk-1") == "owned"
    assert storage.relation(f"{base}/root") == "holds the job directory"
    assert storage.is_storage_root(f"{base}/root/")
    assert not storage.is_storage_root(f"{base}/rootX")


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_another_file_system_class_of_the_same_protocol_is_foreign(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # storage.CheckpointStorage._normalized__mutmut_9 (`type(None)`): file
    # systems were told apart by their protocol alone, so another class
    # speaking "memory" (with its own store) was taken for the job's.
    from fsspec.implementations.memory import MemoryFileSystem

    other_memory = type(
        "OtherMemoryFileSystem", (MemoryFileSystem,), {"store": {}, "pseudo_dirs": [""]}
    )
    registry = importlib.import_module(
        "fsspec.registry"
    )._registry  # the module, not fsspec.registry
    monkeypatch.setitem(registry, "cowstateothermem", other_memory)
    base = f"memory://cowstate-tests/{uuid.uuid4().hex}"
    storage = CheckpointStorage(f"{base}/root", "job")
    assert storage.relation(f"cowstateothermem://{base[len('memory://') :]}/sp") == "foreign"
    assert storage.relation(f"{base}/sp") == "outside"


# --------------------------------------------------------------------- on disk


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_linked_checkpoint_directory_is_not_the_jobs(tmp_path: Path) -> None:
    # storage.CheckpointStorage.checkpoint_ids_on_disk__mutmut_6 (no local
    # path looked up), __mutmut_11 (`local is None and ...`): a chk-<id>
    # symlink counted as the job's own checkpoint.
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    (tmp_path / "root" / "job" / "chk-2").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / "job" / "chk-9").symlink_to(tmp_path / "elsewhere")
    assert storage.checkpoint_ids_on_disk() == [2]
    assert storage.read_counter() == 2


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_checkpoint_directory_of_another_checkpoint_or_job_is_a_problem_by_its_id(
    tmp_path: Path,
) -> None:
    # storage.CheckpointStorage.checkpoints_on_disk__mutmut_9 (`and`): chk-2
    # holding checkpoint 1's _metadata was taken for checkpoint 2; __mutmut_14
    # and 16: the problems' messages were None; __mutmut_18: a problem's
    # checkpoint id was None.
    storage = _storage(tmp_path)
    backend = heap()
    coordinator = CheckpointCoordinator(storage, [backend])
    try:
        completed = coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
    finally:
        coordinator.close()
        backend.close()
    first = storage.checkpoint_dir(1)
    shutil.copytree(first, storage.checkpoint_dir(2))
    other = CheckpointStorage(storage.root, "other")
    shutil.copytree(first, other.checkpoint_dir(1))

    found = storage.checkpoints_on_disk()
    assert [(c.checkpoint_id, c.directory) for c in found] == [
        (1, first),
        (2, storage.checkpoint_dir(2)),
    ]
    assert found[0] == OnDisk(1, first, completed.metadata, None)
    assert found[1].metadata is None
    assert type(found[1].problem) is CorruptCheckpointError
    assert str(found[1].problem) == (
        f"expected checkpoint 2 in {storage.checkpoint_dir(2)!r}, its _metadata describes "
        "checkpoint 1"
    )
    assert storage.completed_checkpoints() == [completed.metadata]

    [alien] = other.checkpoints_on_disk()
    assert (alien.checkpoint_id, alien.directory, alien.metadata) == (
        1,
        other.checkpoint_dir(1),
        None,
    )
    assert type(alien.problem) is CorruptCheckpointError
    assert str(alien.problem) == (
        f"expected a checkpoint of job 'other' in {other.checkpoint_dir(1)!r}, its _metadata "
        "names job 'job'"
    )


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_temporary_files_lists_only_unfinished_writes_in_the_job_directory(tmp_path: Path) -> None:
    # storage.CheckpointStorage.temporary_files__mutmut_1/2: no killer test
    # runs temporary_files().
    storage = _storage(tmp_path)
    storage.write_counter(3)
    storage.filesystem.write_bytes(storage.filesystem.join(storage.job_dir, ".keep"), b"")
    stream = storage.filesystem.create(storage.filesystem.join(storage.job_dir, "_counter"))
    try:
        stream.write(b"4")
        assert storage.temporary_files() == [stream.temp]
        assert storage.filesystem.name(stream.temp).startswith("._counter.")
    finally:
        stream.discard()
    assert storage.temporary_files() == []
    assert storage.read_counter() == 3


# storage.read_counter__mutmut_20 (`decode("ascii")`: a counter of other bytes
# raised UnicodeDecodeError), __mutmut_22 (`limit=None`: a huge counter file
# read whole): a counter that is not a short decimal is ignored, and at most
# its first 21 bytes are read.
@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_counter_of_foreign_bytes_is_ignored_and_never_read_whole(tmp_path: Path) -> None:
    limits: list[int | None] = []

    class Recording(FileSystem):
        def read_bytes(self, path: str, limit: int | None = None) -> bytes:
            limits.append(limit)
            return super().read_bytes(path, limit)

    storage = CheckpointStorage(str(tmp_path / "root"), "job", Recording())
    storage.write_counter(4)
    (tmp_path / "root" / "job" / "chk-2").mkdir()
    counter = tmp_path / "root" / "job" / "_counter"
    assert storage.read_counter() == 4
    counter.write_bytes(b"\xff7")
    assert storage.read_counter() == 2  # the chk-2 on disk
    counter.write_bytes(b"9" * 10_000)
    assert storage.read_counter() == 2
    assert limits == [20, 20, 20]


# ------------------------------------------------------- savepoint directories


@pytest.mark.kills(module="cowstate.checkpoint.storage")
@pytest.mark.parametrize("directory", ["", "/", "//"])
def test_a_savepoint_directory_of_no_name_is_refused_naming_it(
    tmp_path: Path, directory: str
) -> None:
    # storage.CheckpointStorage.savepoint_location__mutmut_1 (`and`), __mutmut_4
    # (`strip(None)`): '/' went on to be refused as a path holding the job;
    # __mutmut_6: the message was None.
    with pytest.raises(InvalidArgumentError) as caught:
        _storage(tmp_path).savepoint_location(directory)
    assert type(caught.value) is InvalidArgumentError
    assert str(caught.value) == f"expected a savepoint directory, got {directory!r}"


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_savepoint_directory_that_is_not_a_string_is_refused(tmp_path: Path) -> None:
    # storage.CheckpointStorage.savepoint_location__mutmut_1: AttributeError.
    with pytest.raises(InvalidArgumentError) as caught:
        _storage(tmp_path).savepoint_location(None)  # type: ignore[arg-type]
    assert str(caught.value) == "expected a savepoint directory, got None"


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_relative_savepoint_directory_of_any_letters_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # storage.CheckpointStorage.savepoint_location__mutmut_5 (`strip("XX/XX")`):
    # a directory named only by X's was taken for an empty name; __mutmut_10
    # (`rstrip("XX/XX")`) cut it to nothing.
    monkeypatch.chdir(tmp_path)
    assert _storage(tmp_path).savepoint_location("XX").directory == "XX"
    assert _storage(tmp_path).savepoint_location("XX/").directory == "XX"


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_savepoint_directory_loses_only_its_trailing_slashes(tmp_path: Path) -> None:
    # storage.CheckpointStorage.savepoint_location__mutmut_10 (`rstrip("XX/XX")`):
    # cut a trailing X off the directory's name.
    directory = str(tmp_path / "spX")
    location = _storage(tmp_path).savepoint_location(directory + "//")
    assert location.directory == directory
    assert location.shared_directory is None


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_refused_savepoint_directory_is_named_without_its_trailing_slash(tmp_path: Path) -> None:
    # storage.CheckpointStorage.savepoint_location__mutmut_8 (`rstrip(None)`):
    # the messages named the directory with its trailing slash.
    storage = _storage(tmp_path)
    owned = storage.checkpoint_dir(1)
    with pytest.raises(UnsafePathError) as caught:
        storage.savepoint_location(owned + "/")
    assert str(caught.value) == (
        "expected a savepoint directory outside what job 'job' owns (its chk-<id>/ and "
        f"shared/ directories), got {owned!r} (owned)"
    )
    full = tmp_path / "full"
    full.mkdir()
    (full / "file").write_bytes(b"x")
    with pytest.raises(InvalidArgumentError) as refused:
        storage.savepoint_location(str(full) + "/")
    assert str(refused.value) == (
        f"expected a new (absent or empty) savepoint directory, {str(full)!r} already holds files"
    )


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_savepoint_may_go_to_another_file_system(tmp_path: Path) -> None:
    # storage.CheckpointStorage.savepoint_location__mutmut_18/19: a directory on
    # another file system ("foreign") was refused.
    storage = _storage(tmp_path)
    directory = f"memory://cowstate-tests/{uuid.uuid4().hex}/sp-1"
    assert storage.relation(directory) == "foreign"
    location = storage.savepoint_location(directory)
    assert location.directory == directory
    assert location.shared_directory is None


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_an_existing_empty_savepoint_directory_is_taken_and_a_file_is_not(tmp_path: Path) -> None:
    # storage.CheckpointStorage.savepoint_location__mutmut_24 (`is_dir(...) or`):
    # refused every existing directory, empty ones included.
    storage = _storage(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert storage.savepoint_location(str(empty)).directory == str(empty)
    a_file = tmp_path / "file"
    a_file.write_bytes(b"")
    with pytest.raises(InvalidArgumentError, match="already holds files"):
        storage.savepoint_location(str(a_file))


# ------------------------------------------------------------------- documents


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_an_oversized_savepoint_intent_is_refused_after_reading_one_byte_too_many(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # storage.CheckpointStorage.read_savepoint_intent__mutmut_6/8 (no `limit`):
    # read the whole file, however large; __mutmut_14/26: the message named
    # None instead of the file. The limit is lowered so the file stays small.
    monkeypatch.setattr(storage_module, "MAX_DOCUMENT_SIZE", 100)
    monkeypatch.setattr(sealed, "MAX_DOCUMENT_SIZE", 100)
    storage = _storage(tmp_path)
    storage.filesystem.write_bytes(storage.savepoint_intent_path, b"x" * 500)
    with pytest.raises(MetadataChecksumError) as caught:
        storage.read_savepoint_intent()
    assert str(caught.value) == (
        f"expected {storage.savepoint_intent_path!r} of at most 100 bytes, got more"
    )


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_savepoint_intent_of_another_schema_is_corrupt_naming_what_and_where(
    tmp_path: Path,
) -> None:
    # storage.CheckpointStorage.read_savepoint_intent__mutmut_13/24/25: the
    # message's "a savepoint intent" was None or changed.
    storage = _storage(tmp_path)
    storage.filesystem.write_bytes(
        storage.savepoint_intent_path, sealed.seal("savepoint", 1, b'{"directory": "/sp"}')
    )
    with pytest.raises(CorruptCheckpointError) as caught:
        storage.read_savepoint_intent()
    assert str(caught.value) == (
        f"expected a savepoint intent in {storage.savepoint_intent_path!r}, got: token: "
        "Field required"
    )
    intent = SavepointIntent(directory="/sp", token="ab" * 16)
    storage.write_savepoint_intent(intent)
    assert storage.read_savepoint_intent() == intent


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_an_oversized_restore_record_is_refused_after_reading_one_byte_too_many(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # storage.CheckpointStorage.read_restore_record__mutmut_12/14 (`limit=None`,
    # no `limit`): read the whole file, however large. The limit is lowered so
    # the file stays small.
    monkeypatch.setattr(storage_module, "MAX_DOCUMENT_SIZE", 100)
    monkeypatch.setattr(sealed, "MAX_DOCUMENT_SIZE", 100)
    storage = _storage(tmp_path)
    path = storage.filesystem.join(storage.job_dir, "_restore")
    storage.filesystem.write_bytes(path, b"x" * 500)
    with pytest.raises(MetadataChecksumError) as caught:
        storage.read_restore_record()
    assert str(caught.value) == f"expected {path!r} of at most 100 bytes, got more"


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_a_restore_record_of_another_schema_is_corrupt_naming_what_and_where(
    tmp_path: Path,
) -> None:
    # storage.CheckpointStorage.read_restore_record__mutmut_19/30/31: the
    # message's "a restore record" was None or changed; __mutmut_20: the file
    # was named None.
    storage = _storage(tmp_path)
    assert storage.read_restore_record() is None
    path = storage.filesystem.join(storage.job_dir, "_restore")
    storage.filesystem.write_bytes(path, sealed.seal("restore", 1, b'{"directory": "/sp"}'))
    with pytest.raises(CorruptCheckpointError) as caught:
        storage.read_restore_record()
    assert str(caught.value) == (
        f"expected a restore record in {path!r}, got: mode: Field required; checkpoint_id: "
        "Field required; kind: Field required"
    )
    record = RestoreRecord(
        directory="/sp", mode=RestoreMode.NO_CLAIM, checkpoint_id=3, kind="savepoint"
    )
    storage.write_restore_record(record)
    assert storage.read_restore_record() == record


@pytest.mark.kills(module="cowstate.checkpoint.storage")
@pytest.mark.parametrize("directory", ["", None])
def test_reading_the_metadata_of_no_directory_is_refused_naming_it(directory: Any) -> None:
    # storage.read_metadata__mutmut_1 (`and`): "" went on to be looked up as a
    # directory; __mutmut_4: the message was None.
    with pytest.raises(InvalidArgumentError) as caught:
        read_metadata(FileSystem(), directory)
    assert type(caught.value) is InvalidArgumentError
    assert str(caught.value) == f"expected a snapshot directory, got {directory!r}"


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_reading_missing_metadata_says_whether_the_directory_exists(tmp_path: Path) -> None:
    # storage.read_metadata__mutmut_15/19: the messages' reasons were changed.
    missing = str(tmp_path / "absent")
    with pytest.raises(CheckpointNotFoundError) as caught:
        read_metadata(FileSystem(), missing)
    assert str(caught.value) == (
        f"expected a completed checkpoint or savepoint in {missing!r}, but the directory "
        "does not exist"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointNotFoundError) as unfinished:
        read_metadata(FileSystem(), str(empty))
    assert str(unfinished.value) == (
        f"expected a completed checkpoint or savepoint in {str(empty)!r}, but it holds no "
        "_metadata (unfinished, or not a snapshot)"
    )


@pytest.mark.kills(module="cowstate.checkpoint.storage")
def test_oversized_metadata_is_refused_after_reading_one_byte_too_many(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # storage.read_metadata__mutmut_27/29 (`limit=None`, no `limit`): read the
    # whole file, however large. The limit is lowered so the file stays small.
    monkeypatch.setattr(storage_module, "MAX_DOCUMENT_SIZE", 100)
    monkeypatch.setattr(sealed, "MAX_DOCUMENT_SIZE", 100)
    path = tmp_path / "_metadata"
    path.write_bytes(b"x" * 500)
    with pytest.raises(MetadataChecksumError) as caught:
        read_metadata(FileSystem(), str(tmp_path))
    assert str(caught.value) == f"expected {str(path)!r} of at most 100 bytes, got more"
