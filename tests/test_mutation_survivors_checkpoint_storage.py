"""Tests that kill mutants of the ``checkpoint`` mutation scope (``make mutate
SCOPE=checkpoint``) in its storage modules -- ``cowstate.checkpoint.storage``,
``filesystem``, ``paths``, ``sealed``, ``registry`` and ``handles`` -- that the
scope's other killer tests let through or never reach.

Each test is named after what it pins; the mutants it was written for are
named in its comment. They run on real files (``tmp_path``, and fsspec's
in-memory file system for a storage on another file system) and are part of
the normal suite.
"""

from __future__ import annotations

import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest

from cowstate.checkpoint import sealed
from cowstate.checkpoint import storage as storage_module
from cowstate.checkpoint.filesystem import TEMP_SUFFIX, FileSystem, is_temporary
from cowstate.checkpoint.storage import CheckpointStorage, SavepointIntent
from cowstate.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidArgumentError,
    MetadataChecksumError,
    UnsafePathError,
)

# ---------------------------------------------------------------- filesystem


def test_only_a_hidden_name_ending_in_the_temporary_suffix_is_temporary() -> None:
    # filesystem.is_temporary__mutmut_3 (`or`): took every dot-file, and every
    # name ending in .inprogress, for an unfinished write.
    assert is_temporary(f"/job/._counter.abc{TEMP_SUFFIX}")
    assert not is_temporary("/job/.cowstate-claimed-0123")
    assert not is_temporary(f"/job/chk-1/data{TEMP_SUFFIX}")
    assert not is_temporary("/job/_counter")


def test_the_size_of_a_missing_file_names_the_file(tmp_path: Path) -> None:
    # filesystem.FileSystem.size__mutmut_3: the message named None.
    missing = str(tmp_path / "missing")
    with pytest.raises(CheckpointNotFoundError) as caught:
        FileSystem().size(missing)
    assert str(caught.value) == f"expected a file at {missing!r}, found none"


def test_upload_copies_a_local_file_in_chunks_of_one_mebibyte(tmp_path: Path) -> None:
    # filesystem.FileSystem.upload__mutmut_1..8 and 10 (no killer test uploads
    # through the file system itself: the locations copy on their own);
    # __mutmut_9 (`read(None)`): read the whole file into memory as one chunk.
    data = bytes(range(256)) * ((1 << 20) // 256) + b"tail"
    source = tmp_path / "local.sst"
    source.write_bytes(data)
    chunks: list[int] = []

    def hooks(event: str, path: str, payload: Any) -> None:
        if event == "write":
            chunks.append(len(payload))

    target = str(tmp_path / "remote" / "000012.sst")
    written = FileSystem(hooks).upload(source, target)
    assert (written.path, written.size, written.crc32) == (target, len(data), zlib.crc32(data))
    assert Path(target).read_bytes() == data
    assert chunks == [1 << 20, 4]
    assert sorted(p.name for p in (tmp_path / "remote").iterdir()) == ["000012.sst"]


def test_a_failed_upload_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "remote").mkdir()
    with pytest.raises(FileNotFoundError):
        FileSystem().upload(tmp_path / "absent", str(tmp_path / "remote" / "x"))
    assert list((tmp_path / "remote").iterdir()) == []


def test_an_atomic_stream_is_writable(tmp_path: Path) -> None:
    # filesystem.AtomicOutputStream.writable__mutmut_1
    stream = FileSystem().create(str(tmp_path / "f"))
    try:
        assert stream.writable() is True
    finally:
        stream.discard()


def test_leaving_an_unclosed_atomic_stream_discards_it(tmp_path: Path) -> None:
    # filesystem.AtomicOutputStream.__exit____mutmut_1 (`is None`): the
    # temporary file stayed behind, still open.
    filesystem = FileSystem()
    with filesystem.create(str(tmp_path / "dropped")) as stream:
        stream.write(b"partial")
        assert Path(stream.temp).exists()
    assert list(tmp_path.iterdir()) == []
    with filesystem.create(str(tmp_path / "kept")) as stream:
        stream.write(b"whole")
        stream.close_and_get_handle()
    assert [(p.name, p.read_bytes()) for p in tmp_path.iterdir()] == [("kept", b"whole")]


# ------------------------------------------------------------------- storage


def _storage(tmp_path: Path) -> CheckpointStorage:
    return CheckpointStorage(str(tmp_path / "root"), "job")


def test_temporary_files_lists_only_unfinished_writes_in_the_job_directory(
    tmp_path: Path,
) -> None:
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


def test_a_savepoint_directory_that_is_not_a_string_is_refused(tmp_path: Path) -> None:
    # storage.CheckpointStorage.savepoint_location__mutmut_1: AttributeError.
    with pytest.raises(InvalidArgumentError) as caught:
        _storage(tmp_path).savepoint_location(None)  # type: ignore[arg-type]
    assert str(caught.value) == "expected a savepoint directory, got None"


def test_a_relative_savepoint_directory_of_any_letters_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # storage.CheckpointStorage.savepoint_location__mutmut_5 (`strip("XX/XX")`):
    # a directory named only by X's was taken for an empty name; __mutmut_10
    # (`rstrip("XX/XX")`) cut it to nothing.
    monkeypatch.chdir(tmp_path)
    assert _storage(tmp_path).savepoint_location("XX").directory == "XX"
    assert _storage(tmp_path).savepoint_location("XX/").directory == "XX"


def test_a_savepoint_directory_loses_only_its_trailing_slashes(tmp_path: Path) -> None:
    # storage.CheckpointStorage.savepoint_location__mutmut_10 (`rstrip("XX/XX")`):
    # cut a trailing X off the directory's name.
    directory = str(tmp_path / "spX")
    location = _storage(tmp_path).savepoint_location(directory + "//")
    assert location.directory == directory
    assert location.shared_directory is None


def test_a_refused_savepoint_directory_is_named_without_its_trailing_slash(
    tmp_path: Path,
) -> None:
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


def test_a_savepoint_may_go_to_another_file_system(tmp_path: Path) -> None:
    # storage.CheckpointStorage.savepoint_location__mutmut_18/19: a directory on
    # another file system ("foreign") was refused.
    storage = _storage(tmp_path)
    directory = f"memory://cowstate-tests/{uuid.uuid4().hex}/sp-1"
    assert storage.relation(directory) == "foreign"
    location = storage.savepoint_location(directory)
    assert location.directory == directory
    assert location.shared_directory is None


def test_an_existing_empty_savepoint_directory_is_taken_and_a_file_is_not(
    tmp_path: Path,
) -> None:
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
    intent = SavepointIntent(directory="/sp", token="ab")
    storage.write_savepoint_intent(intent)
    assert storage.read_savepoint_intent() == intent
