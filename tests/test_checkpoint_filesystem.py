"""The checkpoint file system (``cowstate.checkpoint.filesystem``): local
paths and fsspec URLs behind one small interface, with atomic and durable
writes.

- names: which names are unfinished writes (hidden, ending in the temporary
  suffix); ``name``, ``parent`` and ``join`` drop trailing slashes only; a
  path that reaches no file system is refused saying why;
- reading: a missing file is named; ``read_bytes`` reads the whole file, or
  one byte past its limit (so the caller sees "more"); a failing read is a
  ``CorruptCheckpointError``;
- atomic streams: written to a temporary file and renamed when closed;
  dropped unclosed, they leave nothing; closed, they refuse writes;
- upload and download: in chunks of one MiB, the whole file's size and CRC;
- listing: ``list_dir`` and ``list_files`` keep every name as it is (trailing
  blanks and letters, object stores' directory entries);
- directories: ``makedirs`` fsyncs each new directory's parent once;
  ``delete_dir`` tells the hooks.

They run on real files (``tmp_path``) and fsspec's in-memory file system.
The tests marked ``kills`` were written to kill mutants of the module
(``make mutate SCOPE=checkpoint``); their comments name the mutants. (The
atomic writes of a whole checkpoint, a crash at any write and the fsync
order are tested through the coordinator: ``test_checkpoint_rules.py``,
``test_restore_trust.py``.)
"""

from __future__ import annotations

import io
import uuid
import zlib
from pathlib import Path
from typing import IO, Any

import fsspec
import pytest

from cowstate.checkpoint.filesystem import TEMP_SUFFIX, FileSystem, is_temporary
from cowstate.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidArgumentError,
    StorageUnavailableError,
)

# ----------------------------------------------------------------------- names


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
def test_only_a_hidden_name_ending_in_the_temporary_suffix_is_temporary() -> None:
    # filesystem.is_temporary__mutmut_3 (`or`): took every dot-file, and every
    # name ending in .inprogress, for an unfinished write.
    assert is_temporary(f"/job/._counter.abc{TEMP_SUFFIX}")
    assert not is_temporary("/job/.cowstate-claimed-0123")
    assert not is_temporary(f"/job/chk-1/data{TEMP_SUFFIX}")
    assert not is_temporary("/job/_counter")


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
def test_name_and_parent_drop_only_trailing_slashes() -> None:
    # filesystem.FileSystem.name 2-4, parent 2, 4 (whitespace or "X" stripped
    # instead of the trailing "/", or the leading "/" instead).
    assert FileSystem.name("/data/BOX/") == "BOX"
    assert FileSystem.name("/data/BOX") == "BOX"
    assert FileSystem.name("memory://root/chk-1//") == "chk-1"
    assert FileSystem.parent("/data/X/") == "/data"
    assert FileSystem.parent("/data/X//") == "/data"
    assert FileSystem.parent("memory://root/job/") == "memory://root"


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
def test_join_drops_the_trailing_slashes_of_its_base_but_keeps_the_root() -> None:
    # filesystem.FileSystem.join 4 (the base kept with its trailing slashes).
    assert FileSystem.join("/a//", "b") == "/a/b"
    assert FileSystem.join("/", "b") == "/b"
    assert FileSystem.join("memory://x//", "b", "c") == "memory://x/b/c"


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
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


# --------------------------------------------------------------------- reading


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
def test_the_size_of_a_missing_file_names_the_file(tmp_path: Path) -> None:
    # filesystem.FileSystem.size__mutmut_3: the message named None.
    missing = str(tmp_path / "missing")
    with pytest.raises(CheckpointNotFoundError) as caught:
        FileSystem().size(missing)
    assert str(caught.value) == f"expected a file at {missing!r}, found none"


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
def test_opening_a_missing_file_names_the_file(tmp_path: Path) -> None:
    # filesystem.FileSystem.open 3 (the message named None).
    missing = str(tmp_path / "missing")
    with pytest.raises(CheckpointNotFoundError) as caught:
        FileSystem().open(missing)
    assert str(caught.value) == f"expected a file at {missing!r}, found none"


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
def test_read_bytes_without_a_limit_reads_the_whole_file(tmp_path: Path) -> None:
    # filesystem.FileSystem.read_bytes__mutmut_2 (`read(limit + 1)` with no limit).
    path = tmp_path / "data"
    path.write_bytes(b"x" * 100_000)
    assert FileSystem().read_bytes(str(path)) == b"x" * 100_000
    assert FileSystem().read_bytes(str(path), limit=10) == b"x" * 11


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
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


# -------------------------------------------------------------- atomic streams


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
def test_an_atomic_stream_is_writable(tmp_path: Path) -> None:
    # filesystem.AtomicOutputStream.writable__mutmut_1
    stream = FileSystem().create(str(tmp_path / "f"))
    try:
        assert stream.writable() is True
    finally:
        stream.discard()


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
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


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
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


# --------------------------------------------------------- upload and download


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
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


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
def test_a_failed_upload_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "remote").mkdir()
    with pytest.raises(FileNotFoundError):
        FileSystem().upload(tmp_path / "absent", str(tmp_path / "remote" / "x"))
    assert list((tmp_path / "remote").iterdir()) == []


class _Reads(io.BufferedReader):
    """A local file that records the size of every read."""

    def __init__(self, path: str, sizes: list[int | None]) -> None:
        super().__init__(io.FileIO(path, "rb"))
        self.sizes = sizes

    def read(self, size: int | None = -1) -> bytes:
        self.sizes.append(size)
        return super().read(size)


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
def test_download_reads_in_chunks_of_one_mebibyte_and_checks_the_whole_file(tmp_path: Path) -> None:
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


# --------------------------------------------------------------------- listing


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
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


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
def test_list_dir_takes_an_object_stores_directory_entries_by_their_name(tmp_path: Path) -> None:
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


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
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
    assert filesystem.list_files(str(spaced)) == [f"{spaced}/_counter", f"{spaced}/chk-1/_metadata"]
    assert filesystem.list_files(f"{crossed}/") == [f"{crossed}/data"]
    assert filesystem.list_files(f"file://{crossed}") == [f"file://{crossed}/data"]


# ----------------------------------------------------------------- directories


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
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


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
def test_makedirs_on_an_object_store_makes_the_directory_there(tmp_path: Path) -> None:
    # filesystem.FileSystem.makedirs 3 (a remote path made with os.mkdir).
    url = f"memory://{uuid.uuid4().hex}/made/here"
    filesystem = FileSystem()
    filesystem.makedirs(url)
    assert filesystem.is_dir(url)


@pytest.mark.kills(module="cowstate.checkpoint.filesystem")
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


@pytest.mark.parametrize(
    "path", ["/tmp/x", "relative/dir/", "./a/../b", "/tmp/a b/c", "~/x", "memory://bucket/x"]
)
def test_a_path_resolves_to_what_fsspec_resolves_it_to(path: str) -> None:
    # Plain local paths skip fsspec's URL parsing (the most of a restore's path
    # checks): the file system and the path must be fsspec's all the same.
    # (The same class: fsspec's instance cache may since have been cleared.)
    fs, resolved = FileSystem()._fs(path)
    expected_fs, expected = fsspec.core.url_to_fs(path)
    assert (type(fs), fs.storage_options, resolved) == (
        type(expected_fs),
        expected_fs.storage_options,
        expected,
    )
