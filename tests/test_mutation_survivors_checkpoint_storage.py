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

import importlib
import io
import shutil
import uuid
import zlib
from pathlib import Path
from typing import IO, Any

import pytest
from restore_support import heap

from cowstate.checkpoint import paths, sealed
from cowstate.checkpoint import storage as storage_module
from cowstate.checkpoint.coordinator import CheckpointCoordinator
from cowstate.checkpoint.filesystem import TEMP_SUFFIX, FileSystem, is_temporary
from cowstate.checkpoint.handles import RestoreMode, RestoreRecord
from cowstate.checkpoint.storage import (
    CheckpointStorage,
    OnDisk,
    SavepointIntent,
    read_metadata,
)
from cowstate.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidArgumentError,
    MetadataChecksumError,
    StorageUnavailableError,
    UnsafePathError,
)

#: Until these tests move beside the tests of what they pin.
pytestmark = [
    pytest.mark.kills(module="cowstate.checkpoint.filesystem"),
    pytest.mark.kills(module="cowstate.checkpoint.paths"),
    pytest.mark.kills(module="cowstate.checkpoint.storage"),
]

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


class _Reads(io.BufferedReader):
    """A local file that records the size of every read."""

    def __init__(self, path: str, sizes: list[int | None]) -> None:
        super().__init__(io.FileIO(path, "rb"))
        self.sizes = sizes

    def read(self, size: int | None = -1) -> bytes:
        self.sizes.append(size)
        return super().read(size)


def test_download_reads_in_chunks_of_one_mebibyte_and_checks_the_whole_file(
    tmp_path: Path,
) -> None:
    # filesystem.FileSystem.download__mutmut_12 (`read(None)`: the whole file
    # in memory as one chunk), __mutmut_17 (the CRC of the last chunk only),
    # __mutmut_18 (the size of the last chunk only).
    data = bytes(range(256)) * ((1 << 20) // 256) + b"tail"
    remote = tmp_path / "remote.sst"
    remote.write_bytes(data)
    sizes: list[int | None] = []

    class Recording(FileSystem):
        def open(self, path: str) -> IO[bytes]:
            return _Reads(path, sizes)

    local = tmp_path / "local.sst"
    Recording().download(str(remote), local, size=len(data), crc32=zlib.crc32(data))
    assert local.read_bytes() == data
    assert sizes == [1 << 20] * 3  # a full chunk, the tail, the end


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


@pytest.mark.parametrize("where", ["local", "memory"])
def test_list_dir_keeps_every_name_as_it_is(tmp_path: Path, where: str) -> None:
    # filesystem.FileSystem.list_dir__mutmut_6, 8 (the directory's trailing
    # space or X cut from the paths), 15, 16, 18 (an entry's trailing space or
    # X cut, or its leading slash: the whole path for a name), 20, 22
    # (`detail` not False: memory:// lists dicts).
    filesystem = FileSystem()
    base = str(tmp_path) if where == "local" else f"memory://cowstate-tests/{uuid.uuid4().hex}"
    names = ["a ", "bX", "sub"]
    for directory in (f"{base}/job ", f"{base}/jobX"):
        for name in names[:2]:
            filesystem.write_bytes(f"{directory}/{name}", b"x")
        filesystem.write_bytes(f"{directory}/sub/inner", b"x")
        assert filesystem.list_dir(directory) == [f"{directory}/{n}" for n in names]
        assert filesystem.list_dir(f"{directory}/") == [f"{directory}/{n}" for n in names]
    assert filesystem.list_dir(f"{base}/absent") == []


def test_list_dir_takes_an_object_stores_directory_entries_by_their_name(
    tmp_path: Path,
) -> None:
    # filesystem.FileSystem.list_dir__mutmut_16 (`lstrip("/")` for `rstrip`):
    # object stores (s3fs, gcsfs) list a "directory" with a trailing slash,
    # which the local and memory file systems never do.
    from fsspec.implementations.memory import MemoryFileSystem

    class Slashed(MemoryFileSystem):  # type: ignore[misc]
        def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
            entries = super().ls(path, detail=True, **kwargs)
            return [e["name"] + ("/" if e["type"] == "directory" else "") for e in entries]

    class OnSlashed(FileSystem):
        def _fs(self, path: str) -> tuple[Any, str]:
            _, p = super()._fs(path)
            return Slashed(), p

    base = f"memory://cowstate-tests/{uuid.uuid4().hex}"
    filesystem = OnSlashed()
    filesystem.write_bytes(f"{base}/job/chk-3/_metadata", b"{}")
    filesystem.write_bytes(f"{base}/job/_counter", b"3")
    assert filesystem.list_dir(f"{base}/job") == [f"{base}/job/_counter", f"{base}/job/chk-3"]


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


def test_list_files_keeps_the_directory_name_as_given(tmp_path: Path) -> None:
    # filesystem.FileSystem.list_files__mutmut_6 (`directory.rstrip(None)`): a
    # name's trailing space was cut from the paths; __mutmut_10
    # (`p.rstrip(None)`): one space too many; __mutmut_8 (`rstrip("XX/XX")`):
    # a name's trailing X was cut; __mutmut_12: one X too many.
    spaced = tmp_path / "job "
    (spaced / "chk-1").mkdir(parents=True)
    (spaced / "_counter").write_bytes(b"1")
    (spaced / "chk-1" / "_metadata").write_bytes(b"{}")
    crossed = tmp_path / "chkX"
    crossed.mkdir()
    (crossed / "data").write_bytes(b"x")
    filesystem = FileSystem()
    assert filesystem.list_files(str(spaced)) == [
        f"{spaced}/_counter",
        f"{spaced}/chk-1/_metadata",
    ]
    assert filesystem.list_files(f"{crossed}/") == [f"{crossed}/data"]
    assert filesystem.list_files(f"file://{crossed}") == [f"file://{crossed}/data"]


def test_delete_dir_tells_the_hooks_what_it_deletes(tmp_path: Path) -> None:
    # filesystem.FileSystem.delete_dir__mutmut_2/3/7/8: the hooks were called
    # with None, or another operation's name, instead of ("delete", path, None).
    events: list[tuple[str, str, Any]] = []

    def hooks(event: str, path: str, payload: Any) -> None:
        events.append((event, path, payload))

    directory = tmp_path / "chk-1"
    (directory / "sub").mkdir(parents=True)
    (directory / "sub" / "file").write_bytes(b"x")
    filesystem = FileSystem(hooks)
    filesystem.delete_dir(str(directory))
    filesystem.delete_dir(str(tmp_path / "absent"))
    assert not directory.exists()
    assert events == [("delete", str(directory), None), ("delete", str(tmp_path / "absent"), None)]


def test_name_and_parent_drop_only_trailing_slashes() -> None:
    # filesystem.FileSystem.name 2-4, parent 2, 4 (whitespace or "X" stripped
    # instead of the trailing "/", or the leading "/" instead).
    assert FileSystem.name("/data/BOX/") == "BOX"
    assert FileSystem.name("/data/BOX") == "BOX"
    assert FileSystem.name("memory://root/chk-1//") == "chk-1"
    assert FileSystem.parent("/data/X/") == "/data"
    assert FileSystem.parent("/data/X//") == "/data"
    assert FileSystem.parent("memory://root/job/") == "memory://root"


def test_opening_a_missing_file_names_the_file(tmp_path: Path) -> None:
    # filesystem.FileSystem.open 3 (the message named None).
    missing = str(tmp_path / "missing")
    with pytest.raises(CheckpointNotFoundError) as caught:
        FileSystem().open(missing)
    assert str(caught.value) == f"expected a file at {missing!r}, found none"


def test_makedirs_fsyncs_each_new_directorys_parent_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # filesystem.FileSystem.makedirs 3 (local and remote swapped: no fsync on
    # a local disk), 12 (a relative name's empty parent made too), 17, 18 (the
    # wrong directory fsynced: "." for a parent, a bogus one for none).
    events: list[tuple[str, str]] = []

    def hooks(event: str, path: str, payload: Any) -> None:
        events.append((event, path))

    filesystem = FileSystem(hooks)
    filesystem.makedirs(str(tmp_path / "a" / "b"))
    filesystem.makedirs(str(tmp_path / "a" / "b"))  # exists: nothing to make durable
    assert (tmp_path / "a" / "b").is_dir()
    assert events == [("fsync", str(tmp_path)), ("fsync", str(tmp_path / "a"))]
    events.clear()
    monkeypatch.chdir(tmp_path)
    filesystem.makedirs("fresh")
    assert (tmp_path / "fresh").is_dir()
    assert events == [("fsync", ".")]


def test_makedirs_on_an_object_store_makes_the_directory_there(tmp_path: Path) -> None:
    # filesystem.FileSystem.makedirs 3 (a remote path made with os.mkdir).
    url = f"memory://{uuid.uuid4().hex}/made/here"
    filesystem = FileSystem()
    filesystem.makedirs(url)
    assert filesystem.is_dir(url)


def test_writing_to_a_closed_atomic_stream_is_refused_naming_it(tmp_path: Path) -> None:
    # filesystem.AtomicOutputStream._open 2 (the message dropped).
    path = str(tmp_path / "file")
    stream = FileSystem().create(path)
    stream.write(b"data")
    stream.close_and_get_handle()
    with pytest.raises(InvalidArgumentError) as caught:
        stream.write(b"more")
    assert str(caught.value) == f"expected an open stream for {path!r}, it was closed"
    assert (tmp_path / "file").read_bytes() == b"data"


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "of 1 to 255 characters, got 0"),
        ("../escape", "inside the snapshot"),
        (5, "as a string, got 5"),
    ],
)
def test_an_unsafe_exclusive_path_is_refused_naming_an_exclusive_file(path: Any, why: str) -> None:
    # paths.check_exclusive_path 2, 5, 6 (the role the message names).
    with pytest.raises(UnsafePathError) as caught:
        paths.check_exclusive_path(path)
    assert "path of an exclusive file" in str(caught.value)
    assert why in str(caught.value)


def test_an_exclusive_path_of_up_to_255_characters_and_8_components_is_taken() -> None:
    # paths._components 3, 5 (the length bound: none, or 255 refused), 10 (8
    # components refused), 15, 16 ("." or ".." taken as a name).
    longest = "/".join(["a" * 31] * 8)  # 255 characters, 8 components
    assert len(longest) == paths.MAX_LENGTH == 255
    assert paths.check_exclusive_path(longest) == longest
    assert paths.check_exclusive_path("a/b/c/d/e/f/g/h") == "a/b/c/d/e/f/g/h"
    assert paths.check_exclusive_path("chk-1/.hidden..name") == "chk-1/.hidden..name"
    refused = {
        "a" * 256: "expected the path of an exclusive file of 1 to 255 characters, got 256",
        "a/b/c/d/e/f/g/h/i": (
            "expected the path of an exclusive file of at most 8 components, got 9 in "
            "'a/b/c/d/e/f/g/h/i'"
        ),
    }
    deep = "/".join(["d" * 12] * 9)  # 116 characters: the message shows the first 80
    refused[deep] = (
        f"expected the path of an exclusive file of at most 8 components, got 9 in {deep[:80]!r}"
    )
    for name in ("a/./b", "a/../b", ".", ".."):
        refused[name] = (
            "expected a relative path of an exclusive file inside the snapshot (letters, "
            "digits, '.', '_', '-' between '/'; no '..', no scheme, not absolute), got "
            f"{name!r}"
        )
    for path, message in refused.items():
        with pytest.raises(UnsafePathError) as caught:
            paths.check_exclusive_path(path)
        assert str(caught.value) == message


def test_join_drops_the_trailing_slashes_of_its_base_but_keeps_the_root() -> None:
    # filesystem.FileSystem.join 4 (the base kept with its trailing slashes).
    assert FileSystem.join("/a//", "b") == "/a/b"
    assert FileSystem.join("/", "b") == "/b"
    assert FileSystem.join("memory://x//", "b", "c") == "memory://x/b/c"


def test_a_path_that_reaches_no_file_system_is_refused_saying_why() -> None:
    # filesystem.FileSystem._fs 1 (only a value both falsy and not a string
    # refused), 4, 7 (the messages dropped), 9 (the error type named None).
    refused: dict[Any, tuple[type[Exception], str]] = {
        "": (InvalidArgumentError, "expected a path or URL, got ''"),
        5: (InvalidArgumentError, "expected a path or URL, got 5"),
        "nosuch://x": (
            InvalidArgumentError,
            "expected a path or URL of a known file system, got 'nosuch://x': Protocol not "
            "known: nosuch",
        ),
        # An FTP file system connects when it is made: a closed port refuses it.
        "ftp://127.0.0.1:1/x": (
            StorageUnavailableError,
            "expected to reach the file system of 'ftp://127.0.0.1:1/x', got "
            "ConnectionRefusedError: [Errno 111] Connection refused",
        ),
    }
    for path, (error, message) in refused.items():
        with pytest.raises(error) as caught:
            FileSystem().exists(path)
        assert str(caught.value) == message


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


def test_relation_names_the_job_directory_what_holds_it_and_the_job_files(
    tmp_path: Path,
) -> None:
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


def test_a_sibling_of_the_root_named_with_a_trailing_space_does_not_hold_the_job(
    tmp_path: Path,
) -> None:
    # storage.CheckpointStorage.relation__mutmut_19 (`rstrip(None)`): the
    # trailing space was cut, so "root " was taken for the directory above "root/job".
    storage = _storage(tmp_path)
    assert storage.relation(storage.root + " ") == "outside"
    assert storage.relation(storage.job_dir + " ") == "outside"


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


@pytest.mark.parametrize("directory", ["", None])
def test_reading_the_metadata_of_no_directory_is_refused_naming_it(directory: Any) -> None:
    # storage.read_metadata__mutmut_1 (`and`): "" went on to be looked up as a
    # directory; __mutmut_4: the message was None.
    with pytest.raises(InvalidArgumentError) as caught:
        read_metadata(FileSystem(), directory)
    assert type(caught.value) is InvalidArgumentError
    assert str(caught.value) == f"expected a snapshot directory, got {directory!r}"


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


# sealed.seal__mutmut_3 (`rstrip(None)`), __mutmut_4 (`lstrip`), __mutmut_5
# (`rstrip(b"XX\nXX")`): the seal drops only the body's trailing newlines;
# leading newlines, trailing blanks and a trailing X are content.
@pytest.mark.parametrize(
    ("body", "content"),
    [(b"\n{} \t", b"\n{} \t\n"), (b"{}X\n\n", b"{}X\n"), (b"{}", b"{}\n")],
    ids=["leading-newline-trailing-blanks", "trailing-x-then-newlines", "bare"],
)
def test_a_sealed_body_keeps_everything_but_its_trailing_newlines(
    body: bytes, content: bytes
) -> None:
    data = sealed.seal("metadata", 2, body)
    assert data.startswith(content)
    assert data[len(content) :].startswith(b"#cowstate metadata v2 sha256=")
    assert sealed.unseal(data, "metadata", 2, "the test document") == content


# storage.read_counter__mutmut_20 (`decode("ascii")`: a counter of other bytes
# raised UnicodeDecodeError), __mutmut_22 (`limit=None`: a huge counter file
# read whole): a counter that is not a short decimal is ignored, and at most
# its first 21 bytes are read.
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


# storage.CheckpointStorage.__init__ 1 (`and`: an empty root taken, a non-str
# one failing later), 4 (message None), 16, 18 (a root's trailing blank or X
# cut), 19 (the root "/" became "XX/XX").
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


def test_read_bytes_without_a_limit_reads_the_whole_file(tmp_path: Path) -> None:
    # filesystem.FileSystem.read_bytes__mutmut_2 (`read(limit + 1)` with no limit).
    path = tmp_path / "data"
    path.write_bytes(b"x" * 100_000)
    assert FileSystem().read_bytes(str(path)) == b"x" * 100_000
    assert FileSystem().read_bytes(str(path), limit=10) == b"x" * 11


# paths.check_shared_path 3, 6 (the role the refusal names dropped or mangled).
def test_an_unsafe_shared_path_is_refused_naming_a_shared_file() -> None:
    with pytest.raises(UnsafePathError) as caught:
        paths.check_shared_path(7)  # type: ignore[arg-type]
    assert str(caught.value) == "expected the path of a shared file as a string, got 7"


def test_a_file_that_fails_while_read_is_corrupt_naming_the_error(tmp_path: Path) -> None:
    # filesystem.FileSystem.read_bytes 8, 9 (the message dropped or naming NoneType).
    class Failing(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            raise OSError("Input/output error")

    class Broken(FileSystem):
        def open(self, path: str) -> IO[bytes]:
            return Failing(b"data")

    with pytest.raises(CorruptCheckpointError) as caught:
        Broken().read_bytes("/job/_counter")
    assert str(caught.value) == "expected to read '/job/_counter', got OSError: Input/output error"


# paths.check_shared_path 8, 9, 18 (a path of another form, or whose first
# component is no job id, taken), 19 (the refusal's message dropped).
@pytest.mark.parametrize(
    "path", ["job/other/x.sst", "job/shared/x/y.sst", "job/x.sst", ".job/shared/x.sst"]
)
def test_a_shared_path_must_be_a_job_ids_shared_file(path: str) -> None:
    with pytest.raises(UnsafePathError) as caught:
        paths.check_shared_path(path)
    assert str(caught.value) == (
        f"expected a shared file path of the form '<job id>/shared/<name>', got {path!r}"
    )
    assert paths.check_shared_path("job-1/shared/x.sst") == "job-1/shared/x.sst"
