"""Checkpoint storage and the coordinator: one named test per rule of
``cowstate.checkpoint.coordinator`` (and of the issue), on real files, with
the heap backend and the RocksDB backend.

Rules 1-5 are about files shared between checkpoints, so they run on RocksDB,
whose incremental checkpoints share SST files; the rest run on both.

Beside the rules, what each step says and refuses, word for word: the
lifecycle of a checkpoint (trigger, acknowledge, complete, abort; their
timeouts), savepoints, the restore modes, claims and deletion, and recovery's
defaults. Those tests run jobs of one subtask owning every key group over
real storage (``small_jobs``, :mod:`jobs_support`), inject failures and stuck
writers through the file system's test hooks, and are marked ``kills``: they
were written to kill mutants of the coordinator (``make mutate
SCOPE=checkpoint``), named in their comments.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
import re
import shutil
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import redirect_stdout
from pathlib import Path
from types import FrameType
from typing import Any

import jobs_support
import pytest
import restore_support
from jobs_support import Jobs
from restore_support import FULL, MAX_P, SER, dump, fill, group_of
from rocksdict import Options

import cowstate.checkpoint.coordinator
from cowstate.checkpoint.coordinator import (
    SAVEPOINT_MARKER,
    CheckpointCoordinator,
)
from cowstate.checkpoint.filesystem import FileSystem, is_temporary
from cowstate.checkpoint.handles import (
    METADATA_FILE,
    CheckpointMetadata,
    FileHandle,
    KeyedStateHandle,
    RestoreMode,
    SnapshotOptions,
)
from cowstate.checkpoint.inspect import format_report, inspect_snapshot
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.checkpoint.storage import (
    CLAIM_MARKER,
    CheckpointStorage,
    RestoreRecord,
    read_metadata,
)
from cowstate.descriptors import ListStateDescriptor, ValueStateDescriptor
from cowstate.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    IncompatibleSnapshotError,
    InvalidArgumentError,
    MaxParallelismMismatchError,
    MetadataChecksumError,
    UnknownCheckpointError,
    UnsafePathError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.heap_incremental import IncrementalOptions
from cowstate.key_groups import (
    KeyGroupRange,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from cowstate.nested_table import NestedMapsStateTable
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.serializers import ImmutableSerializer
from cowstate.snapshot import read_snapshot
from cowstate.state_table import CopyOnWriteStateTable
from cowstate_spec.cli import main as cowstate_main
from cowstate_spec.implementations import C_MAP, PureMapsTable

MAXP = 16
VALUE: ValueStateDescriptor[Any] = ValueStateDescriptor("value")
LIST = ListStateDescriptor("list")
Factory = Callable[[KeyGroupRange, int], Any]


def heap(key_groups: KeyGroupRange, max_parallelism: int) -> Any:
    return HeapKeyedStateBackend(key_groups, max_parallelism)


def rocksdb(key_groups: KeyGroupRange, max_parallelism: int) -> Any:
    return RocksDBKeyedStateBackend(key_groups, max_parallelism)


def heap_incremental(key_groups: KeyGroupRange, max_parallelism: int) -> Any:
    """A heap subtask with incremental checkpoints over the default maps (the
    C map where built), which track changes."""
    return HeapKeyedStateBackend(key_groups, max_parallelism, incremental=True)


def heap_incremental_over_pure_maps(key_groups: KeyGroupRange, max_parallelism: int) -> Any:
    """The same over the pure maps, which track changes alike."""
    return HeapKeyedStateBackend(key_groups, max_parallelism, PureMapsTable, incremental=True)


#: The backends whose checkpoints share files (rules 1, 2 and 5).
SHARING = pytest.mark.parametrize(
    "factory", [rocksdb, heap_incremental], ids=["rocksdb", "heap-incremental"]
)


def rocksdb_without_compaction(key_groups: KeyGroupRange, max_parallelism: int) -> Any:
    """A RocksDB subtask whose SST files change only by flushes: which files a
    checkpoint reuses does not depend on when a background compaction runs."""
    options = Options(raw_mode=True)
    options.set_keep_log_file_num(1)
    options.set_disable_auto_compactions(True)
    return RocksDBKeyedStateBackend(key_groups, max_parallelism, options=options)


BOTH = pytest.mark.parametrize("factory", [heap, rocksdb], ids=["heap", "rocksdb"])


class Job:
    """A job's subtasks and coordinator, with helpers to change and read its state."""

    def __init__(
        self,
        root: Path,
        job_id: str,
        factory: Factory,
        parallelism: int = 2,
        *,
        num_retained: int = 1,
        filesystem: FileSystem | None = None,
        restore: tuple[str, RestoreMode] | None = None,
        recover: bool = False,
        ranges: list[KeyGroupRange] | None = None,
    ) -> None:
        """``ranges``: the subtasks' key groups (default: ``parallelism`` as Flink splits them)."""
        self.storage = CheckpointStorage(str(root), job_id, filesystem)
        if ranges is None:
            ranges = [
                compute_key_group_range_for_operator_index(MAXP, parallelism, i)
                for i in range(parallelism)
            ]
        self.backends = [factory(key_groups, MAXP) for key_groups in ranges]
        for backend in self.backends:
            backend.get_state(VALUE)
            backend.get_state(LIST)
        if restore is not None:
            self.coordinator = CheckpointCoordinator.restore(
                self.storage, self.backends, restore[0], restore[1], num_retained=num_retained
            )
        elif recover:
            self.coordinator = CheckpointCoordinator.recover(
                self.storage, self.backends, num_retained=num_retained
            )
        else:
            self.coordinator = CheckpointCoordinator(
                self.storage, self.backends, num_retained=num_retained
            )

    def put(self, keys: Any, value: Any) -> None:
        for key in keys:
            backend = next(
                b for b in self.backends if assign_to_key_group(key, MAXP) in b.key_group_range
            )
            backend.set_current_key(key)
            backend.get_state(VALUE).update(value)
            backend.get_state(LIST).add(value)

    def contents(self) -> dict[str, dict[Any, Any]]:
        """A deep copy of every state of every subtask, by key."""
        return copy.deepcopy(
            {
                name: {k: s for b in self.backends for k, _, s in b.entries(name)}
                for name in ("value", "list")
            }
        )

    def checkpoint(self) -> CheckpointMetadata:
        return self.coordinator.complete_checkpoint(self.coordinator.trigger_checkpoint()).metadata

    def close(self) -> None:
        self.coordinator.close()
        for backend in self.backends:
            backend.close()


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    made: list[Job] = []

    def make(job_id: str, factory: Factory = rocksdb, **options: Any) -> Job:
        made.append(Job(tmp_path / "root", job_id, factory, **options))
        return made[-1]

    yield make
    for job in made:
        job.close()


def shared(metadata: CheckpointMetadata) -> set[str]:
    """The shared files' paths as ``_metadata`` writes them (``<job>/shared/<name>``)."""
    return {f.path for f in metadata.files if f.scope == "shared"}


def resolved(metadata: CheckpointMetadata, directory: str) -> set[str]:
    """Every file of the snapshot in ``directory`` as a path on disk."""
    source = SnapshotSource(FileSystem(), directory)
    return {source.path(f) for f in metadata.files}


def files_under(path: Path) -> set[str]:
    return {str(p) for p in path.rglob("*") if p.is_file()}


def restored_contents(factory: Factory, directory: str) -> dict[str, dict[Any, Any]]:
    """What the snapshot in ``directory`` restores to, in one fresh subtask."""
    metadata = read_metadata(FileSystem(), directory)
    backend = factory(KeyGroupRange(0, MAXP - 1), MAXP)
    try:
        backend.restore_from(metadata.subtasks, SnapshotSource(FileSystem(), directory))
        return {name: {k: s for k, _, s in backend.entries(name)} for name in ("value", "list")}
    finally:
        backend.close()


# ------------------------------------------------------------- the flow


def _documented_walk() -> tuple[list[tuple[int, bool, str, str]], int, int]:
    """The numbered walk of the coordinator's docstring: (hop, on the writer
    thread, file, function) from the caller's line on, and the hops and files
    its sentence counts."""
    doc = cowstate.checkpoint.coordinator.__doc__ or ""
    walk = [
        (0 if number == "caller" else int(number), writer == "w", file, function)
        for number, writer, file, function in re.findall(
            r"^ +(caller|\d+) +(w)? +(\w+\.py) +([\w.]+)$", doc, flags=re.M
        )
    ]
    counted = re.search(r"^(\d+) hops in (\d+) files", doc, flags=re.M)
    assert counted is not None, "the docstring counts the walk's hops and files"
    return walk, int(counted[1]), int(counted[2])


def _in_order(wanted: list[tuple[str, str]], seen: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """What of ``wanted`` is not found in ``seen`` in that order (a subsequence)."""
    position = 0
    for hop in wanted:
        try:
            position = seen.index(hop, position) + 1
        except ValueError:
            return wanted[wanted.index(hop) :]
    return []


def test_the_documented_checkpoint_walk_is_the_path_a_checkpoint_takes(tmp_path: Path) -> None:
    """The coordinator's docstring numbers the calls from ``trigger_checkpoint``
    to the sealed ``_metadata``: a trace of one heap checkpoint makes each of
    them, in that order, on the thread it names; the counts it says are its own."""
    walk, hops, files = _documented_walk()
    assert [hop for hop, *_ in walk] == list(range(hops + 1))
    assert len({file for _, _, file, _ in walk}) == files
    impl = str(Path(cowstate.checkpoint.coordinator.__file__).parents[1]) + "/"
    backend = HeapKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP)
    backend.set_current_key(1)
    backend.get_state(VALUE).update(3)
    coordinator = CheckpointCoordinator(CheckpointStorage(str(tmp_path), "job"), [backend])
    calls: dict[bool, list[tuple[str, str]]] = {False: [], True: []}
    caller = threading.current_thread()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(impl):
            on_writer = threading.current_thread() is not caller
            calls[on_writer].append((Path(code.co_filename).name, code.co_qualname))

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        coordinator.close()
        backend.close()
    for on_writer in (False, True):
        wanted = [(file, function) for _, w, file, function in walk if w is on_writer]
        assert wanted, "the walk has hops on both threads"
        assert _in_order(wanted, calls[on_writer]) == [], f"writer thread: {on_writer}"


def test_a_walk_out_of_order_or_with_a_call_never_made_is_refused() -> None:
    seen = [("a.py", "f"), ("b.py", "g"), ("a.py", "h")]
    assert _in_order([("a.py", "f"), ("a.py", "h")], seen) == []
    assert _in_order([("a.py", "h"), ("b.py", "g")], seen) == [("b.py", "g")]
    assert _in_order([("a.py", "f"), ("c.py", "k")], seen) == [("c.py", "k")]


# ------------------------------------------------------------------ storage


@BOTH
def test_a_checkpoint_exists_only_once_its_metadata_is_written(
    jobs: Any, factory: Factory, tmp_path: Path
) -> None:
    job = jobs("job", factory)
    job.put(range(20), 1)
    checkpoint_id = job.coordinator.trigger_checkpoint()
    job.coordinator.acknowledge(checkpoint_id)
    directory = job.storage.checkpoint_dir(checkpoint_id)
    assert job.storage.completed_checkpoints() == []
    with pytest.raises(CheckpointNotFoundError, match="holds no _metadata"):
        read_metadata(job.storage.filesystem, directory)
    job.coordinator.complete_checkpoint(checkpoint_id)
    assert [m.checkpoint_id for m in job.storage.completed_checkpoints()] == [checkpoint_id]
    assert restored_contents(factory, directory) == job.contents()


def test_metadata_is_written_only_after_every_subtask_finished(jobs: Any, tmp_path: Path) -> None:
    """complete_checkpoint waits for the slowest subtask before _metadata."""
    go = threading.Event()

    def slow_writes(operation: str, path: str, data: bytes | None) -> None:
        if operation == "write" and "keyed-state-8-15" in path:
            assert go.wait(10)

    job = jobs("job", heap, filesystem=FileSystem(hooks=slow_writes))
    job.put(range(30), 1)
    checkpoint_id = job.coordinator.trigger_checkpoint()
    completing = threading.Thread(target=job.coordinator.complete_checkpoint, args=(checkpoint_id,))
    completing.start()
    completing.join(0.3)
    assert completing.is_alive()
    assert not Path(job.storage.checkpoint_dir(checkpoint_id), METADATA_FILE).exists()
    go.set()
    completing.join(10)
    assert Path(job.storage.checkpoint_dir(checkpoint_id), METADATA_FILE).exists()


def test_writes_are_atomic(tmp_path: Path) -> None:
    """A failure mid-write leaves only a temporary name, never the file itself."""
    calls = 0

    def fail_second_chunk(operation: str, path: str, data: bytes | None) -> None:
        nonlocal calls
        if operation == "write":
            calls += 1
            if calls == 2:
                raise OSError("disk full")

    filesystem = FileSystem(hooks=fail_second_chunk)
    target = str(tmp_path / "dir" / "file")
    stream = filesystem.create(target)
    stream.write(b"first")
    with pytest.raises(OSError, match="disk full"):
        stream.write(b"second")
    assert not Path(target).exists()
    leftovers = list((tmp_path / "dir").iterdir())
    assert len(leftovers) == 1 and is_temporary(str(leftovers[0]))
    stream.discard()
    assert list((tmp_path / "dir").iterdir()) == []


class Crash(Exception):
    pass


@BOTH
def test_a_crash_at_any_write_leaves_the_last_completed_checkpoint_restorable(
    tmp_path: Path, factory: Factory
) -> None:
    """Crash at every file-system operation of checkpoint 2 in turn: recovery
    always restores checkpoint 1 or 2 -- 2 exactly when its _metadata landed --
    and leaves no file no retained checkpoint uses."""
    operation = 0
    crash_at = 0

    def hooks(kind: str, path: str, data: bytes | None) -> None:
        nonlocal operation
        operation += 1
        if crash_at and operation >= crash_at:
            raise Crash(f"{kind} {path}")

    def run(root: Path, crash: int) -> tuple[Job, dict[str, Any], dict[str, Any], bool]:
        nonlocal crash_at, operation
        crash_at = 0
        job = Job(root, "job", factory, filesystem=FileSystem(hooks=hooks))
        job.put(range(40), "one")
        job.checkpoint()
        first = job.contents()
        job.put(range(20, 60), "two")
        second = job.contents()
        crash_at, operation = crash, 0
        try:
            job.checkpoint()
            finished = True
        except Exception as exc:
            finished = False
            assert any(isinstance(e, Crash) for e in _chain(exc)), exc
        crash_at = 0
        for backend in job.backends:
            backend.close()
        return job, first, second, finished

    *_, finished = run(tmp_path / "count", 0)
    total = operation  # file-system operations of checkpoint 2
    assert finished and total > 5
    for crash in range(1, total + 1):
        root = tmp_path / f"crash-at-{crash}"
        _, first, second, finished = run(root, crash)
        assert not finished
        recovered = Job(root, "job", factory, filesystem=FileSystem(), recover=True)
        landed = Path(recovered.storage.checkpoint_dir(2), METADATA_FILE).exists()
        assert recovered.contents() == (second if landed else first), crash
        retained = recovered.coordinator.completed_checkpoints
        keep = {str(Path(c.directory) / METADATA_FILE) for c in retained}.union(
            *(resolved(c.metadata, c.directory) for c in retained)
        )
        job_dir = Path(recovered.storage.job_dir)
        on_disk = files_under(job_dir) - {str(job_dir / "_counter")}
        assert on_disk == keep, (crash, sorted(on_disk ^ keep))
        recovered.close()
        shutil.rmtree(root)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def test_storage_on_an_fsspec_url() -> None:
    """The same job on memory:// -- checkpoint, savepoint, restore from both."""
    root = "memory://cowstate-test"
    FileSystem().delete_dir(root)
    storage = CheckpointStorage(root, "job")
    backends = [heap(KeyGroupRange(0, MAXP - 1), MAXP)]
    backends[0].get_state(VALUE)
    coordinator = CheckpointCoordinator(storage, backends)
    backends[0].set_current_key("k")
    backends[0].get_state(VALUE).update(42)
    checkpoint = coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
    coordinator.trigger_savepoint("memory://cowstate-test/savepoints/sp", "canonical")
    assert storage.filesystem.list_files(root) == sorted(
        [
            f"{root}/job/_counter",
            f"{root}/job/chk-1/_metadata",
            f"{root}/job/chk-1/keyed-state-0-15",
            f"{root}/savepoints/sp/_metadata",
            f"{root}/savepoints/sp/keyed-state-0-15",
        ]
    )
    for directory in (checkpoint.directory, f"{root}/savepoints/sp"):
        target = heap(KeyGroupRange(0, MAXP - 1), MAXP)
        CheckpointCoordinator.restore(
            CheckpointStorage(root, f"new-{len(directory)}"),
            [target],
            directory,
            RestoreMode.NO_CLAIM,
        )
        assert [s for _, _, s in target.entries("value")] == [42]


def test_missing_and_corrupt_snapshots_are_refused_and_change_nothing(jobs: Any) -> None:
    job = jobs("job", heap)
    job.put(range(10), 1)
    metadata = job.checkpoint()
    directory = job.storage.checkpoint_dir(metadata.checkpoint_id)
    target = jobs("target", heap, parallelism=1)
    target.put(range(3), "mine")
    before = target.contents()
    with pytest.raises(CheckpointNotFoundError, match="the directory does not exist"):
        CheckpointCoordinator.restore(
            CheckpointStorage(str(Path(directory).parent), "x"),
            target.backends,
            directory + "-missing",
            RestoreMode.CLAIM,
        )
    Path(directory, METADATA_FILE).write_text('{"not": "metadata"}')
    with pytest.raises(MetadataChecksumError, match="to end with its seal line"):
        read_metadata(FileSystem(), directory)
    assert target.contents() == before

    job.put(range(10), 2)
    metadata = job.checkpoint()
    directory = job.storage.checkpoint_dir(metadata.checkpoint_id)
    data_file = Path(SnapshotSource(FileSystem(), directory).path(metadata.files[0]))
    data_file.write_bytes(data_file.read_bytes()[:-10])  # truncated
    for backend in target.backends:
        with pytest.raises(CorruptCheckpointError, match=r"to hold \d+ bytes"):
            backend.restore_from(metadata.subtasks, SnapshotSource(FileSystem(), directory))
    assert target.contents() == before


def test_coordinator_argument_errors(jobs: Any, tmp_path: Path) -> None:
    job = jobs("job", heap)
    with pytest.raises(UnknownCheckpointError, match="expected a pending checkpoint id"):
        job.coordinator.complete_checkpoint(99)
    with pytest.raises(UnknownCheckpointError):
        job.coordinator.abort_checkpoint(99)
    with pytest.raises(InvalidArgumentError, match="expected num_retained >= 1"):
        CheckpointCoordinator(job.storage, job.backends, num_retained=0)
    overlapping = [heap(KeyGroupRange(0, 9), MAXP), heap(KeyGroupRange(5, 15), MAXP)]
    with pytest.raises(InvalidArgumentError, match="expected disjoint key-group ranges"):
        CheckpointCoordinator(job.storage, overlapping)
    with pytest.raises(InvalidArgumentError, match="expected a job id"):
        CheckpointStorage(str(tmp_path), "../escape")
    sp = str(tmp_path / "sp")
    job.coordinator.trigger_savepoint(sp)
    with pytest.raises(InvalidArgumentError, match="already holds files"):
        job.coordinator.trigger_savepoint(sp)
    job.checkpoint()
    with pytest.raises(InvalidArgumentError, match="expected a new job directory"):
        CheckpointCoordinator.restore(job.storage, job.backends, sp, RestoreMode.CLAIM)


# ------------------------------------------------------- bad arguments (P5)


def _as_shown(name: str) -> str:
    """``name`` as a refusal shows it: quoted, its first 80 characters."""
    return repr(name[:80]) + (f" (of {len(name)} characters)" if len(name) > 80 else "")


#: A path or URL no file system takes (or of no type one is), as an entry
#: point is given it: the value, and the refusal after "expected <what>".
BAD_NAMES: dict[str, tuple[Any, str]] = {
    "nul": (
        "/data/sp\x00-1",
        " without NUL or other control characters, got U+0000 at 8 in '/data/sp\\x00-1'",
    ),
    "newline": (
        "/data/sp-1\n",
        " without NUL or other control characters, got U+000A at 10 in '/data/sp-1\\n'",
    ),
    "overlong name": (
        "/data/" + "s" * 256,
        " with every name between '/' of at most 255 bytes, got one of 256 bytes: "
        + _as_shown("s" * 256),
    ),
    "overlong path": (
        "/" + ("d" * 200 + "/") * 20 + "d" * 75,
        " of at most 4095 bytes, got 4096 bytes: "
        + _as_shown("/" + ("d" * 200 + "/") * 20 + "d" * 75),
    ),
    "lone surrogate": (
        "/data/sp\udc80",
        " of valid Unicode, got the lone surrogate U+DC80 at 8 in '/data/sp\\udc80'",
    ),
    "empty": ("", ", got ''"),
    "wrong type": (7, ", got 7"),
    "bytes": (b"/data/sp-1", ", got b'/data/sp-1'"),
    "None": (None, ", got None"),
}


def _tree(root: Path) -> dict[str, bytes | str | None]:
    """Everything under ``root``: a file's bytes, a link's target, None for a directory."""
    return {
        str(p): p.read_bytes() if p.is_file() else (str(p.readlink()) if p.is_symlink() else None)
        for p in sorted(root.rglob("*"))
    }


def _refused(call: Callable[[], Any], message: str, root: Path) -> None:
    """``call()`` raises exactly ``InvalidArgumentError(message)`` and nothing
    under ``root`` (the working directory too) changes."""
    before = _tree(root)
    with pytest.raises(InvalidArgumentError) as caught:
        call()
    assert type(caught.value) is InvalidArgumentError
    assert str(caught.value) == message
    assert _tree(root) == before


STORAGE_ARGUMENTS: dict[str, tuple[dict[str, Any], str]] = {
    **{
        f"root {name}": ({"root": value}, f"expected a root path or URL{end}")
        for name, (value, end) in BAD_NAMES.items()
    },
    **{
        f"job id {name}": (
            {"job_id": value},
            f"expected a job id of 1 to 255 letters, digits, '.', '_' and '-' (the first a "
            f"letter or digit), got {_as_shown(value)}",
        )
        for name, value in {
            "nul": "job\x00",
            "newline": "job\n",
            "overlong": "j" * 256,
            "empty": "",
            "a path": "../escape",
            "a dot-file": ".job",
        }.items()
    },
    "job id wrong type": ({"job_id": 7}, "expected a job id (a string), got 7"),
    "job id None": ({"job_id": None}, "expected a job id (a string), got None"),
    "root and job id together overlong": (
        {"root": "/" + "/".join(["r" * 250] * 16), "job_id": "j" * 100},
        "expected the job directory (storage root/job id) of at most 4095 bytes, got 4117 "
        "bytes: " + _as_shown("/" + "/".join(["r" * 250] * 16) + "/" + "j" * 100),
    ),
    "file system": ({"filesystem": "local"}, "expected a FileSystem or None, got str"),
}


@pytest.mark.parametrize("case", sorted(STORAGE_ARGUMENTS))
def test_a_storage_refuses_a_root_or_job_id_no_file_system_takes(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: ``CheckpointStorage`` took a root holding a NUL byte, a job id
    of 300 letters or ending in a newline, and failed later with a raw
    ``ValueError`` or ``OSError`` (or wrote under that name). Each bad root,
    job id or file system is an ``InvalidArgumentError`` saying what was
    expected and what came, before anything is written."""
    arguments, message = STORAGE_ARGUMENTS[case]
    given = {"root": str(tmp_path / "root"), "job_id": "job", **arguments}
    monkeypatch.chdir(tmp_path)
    _refused(lambda: CheckpointStorage(**given), message, tmp_path)


SAVEPOINT_ARGUMENTS: dict[str, tuple[dict[str, Any], str]] = {
    **{
        f"directory {name}": ({"directory": value}, f"expected a savepoint directory{end}")
        for name, (value, end) in BAD_NAMES.items()
    },
    **{
        f"format {value!r}": (
            {"savepoint_format": value},
            f"expected a savepoint format 'canonical' or 'native', got {value!r}",
        )
        for value in (None, "", "Canonical", 7)
    },
    **{
        f"timeout {value!r}": (
            {"timeout": value},
            f"expected a timeout in seconds >= 0 or None, got {value!r}",
        )
        for value in ("1", -1, float("nan"), float("inf"), True)
    },
}


@pytest.mark.parametrize("case", sorted(SAVEPOINT_ARGUMENTS))
def test_a_savepoint_refuses_bad_arguments_before_anything_is_written(
    case: str, jobs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: ``trigger_savepoint("a\\0b")`` raised a raw ``ValueError``,
    and a timeout of ``"1"`` failed the savepoint only after its id, intent and
    marker were written. Each bad directory, format or timeout is an
    ``InvalidArgumentError`` before anything is written: the next savepoint
    takes the id this one would have."""
    arguments, message = SAVEPOINT_ARGUMENTS[case]
    job = jobs("job", heap)
    job.put(range(10), "a")
    monkeypatch.chdir(tmp_path)
    given = {"directory": str(tmp_path / "sp"), **arguments}
    _refused(lambda: job.coordinator.trigger_savepoint(**given), message, tmp_path)
    assert job.coordinator.trigger_savepoint(str(tmp_path / "sp")).checkpoint_id == 1


def _restore_arguments(directory: str, target: Job) -> dict[str, tuple[dict[str, Any], str]]:
    """Bad arguments of ``CheckpointCoordinator.restore`` (the others those of
    a restore of ``directory`` into ``target``'s subtasks), and the refusals."""
    return {
        **{
            f"directory {name}": ({"directory": value}, f"expected a snapshot directory{end}")
            for name, (value, end) in BAD_NAMES.items()
        },
        **_coordinator_arguments(target),
        **{
            f"mode {value!r}": (
                {"mode": value},
                f"expected a RestoreMode (CLAIM, NO_CLAIM, LEGACY), got {value!r}",
            )
            for value in (None, "claim", 7)
        },
    }


def _coordinator_arguments(target: Job) -> dict[str, tuple[dict[str, Any], str]]:
    """Bad arguments every way to make a coordinator shares, and the refusals."""
    return {
        "storage None": ({"storage": None}, "expected a CheckpointStorage, got NoneType"),
        "storage a path": ({"storage": "root/job"}, "expected a CheckpointStorage, got str"),
        "backends None": (
            {"backends": None},
            "expected a sequence of backends (one per subtask), got NoneType",
        ),
        "backends an int": (
            {"backends": 7},
            "expected a sequence of backends (one per subtask), got int",
        ),
        "backends a string": (
            {"backends": "ab"},
            "expected a sequence of backends (one per subtask), got str",
        ),
        "backends a set": (
            {"backends": set(target.backends)},
            "expected a sequence of backends (one per subtask), got set",
        ),
        "backends none": ({"backends": []}, "expected at least one backend (subtask), got none"),
        "backends of another kind": (
            {"backends": [*target.backends[:1], object()]},
            "expected backends with snapshot_to/restore_from, got object",
        ),
        **{
            f"num_retained {value!r}": (
                {"num_retained": value},
                f"expected num_retained >= 1, got {value!r}",
            )
            for value in (0, None, True, 1.0)
        },
        **{
            f"timeout {value!r}": (
                {"timeout": value},
                f"expected a timeout in seconds > 0, got {value!r}",
            )
            for value in (0, -1, "600", None, float("nan"), float("inf"), False)
        },
    }


def test_a_restore_refuses_bad_arguments_before_anything_is_read_or_written(
    jobs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a restore from a directory holding a NUL byte, or a name of
    300 bytes, said the directory does not exist; from a NUL byte inside
    a name the file system takes it raised a raw ``ValueError`` once the
    name got that far; a number for the backends a raw ``TypeError``; a
    timeout of ``"600"`` was taken. Each bad argument (one at a time, beside
    a valid restore's others) is an ``InvalidArgumentError`` before anything
    is read or written: the target's subtasks keep their state, no job
    directory appears, and the valid restore then works."""
    job = jobs("job", heap)
    job.put(range(10), "a")
    directory = job.storage.checkpoint_dir(job.checkpoint().checkpoint_id)
    target = jobs("target", heap)
    target.put(range(3), "mine")
    before = target.contents()
    storage = CheckpointStorage(str(tmp_path / "root"), "restored")
    monkeypatch.chdir(tmp_path)
    cases = _restore_arguments(directory, target)
    for arguments, message in cases.values():
        given = {
            "storage": storage,
            "backends": target.backends,
            "directory": directory,
            "mode": RestoreMode.NO_CLAIM,
            **arguments,
        }
        _refused(functools.partial(CheckpointCoordinator.restore, **given), message, tmp_path)
        assert target.contents() == before
    assert len(cases) == len(BAD_NAMES) + 3 + 8 + 4 + 7
    restored = CheckpointCoordinator.restore(
        storage, target.backends, directory, RestoreMode.NO_CLAIM
    )
    assert target.contents()["value"] == {k: "a" for k in range(10)}
    restored.close()


@pytest.mark.parametrize("how", ["recover", "a new coordinator"])
def test_recover_and_a_new_coordinator_refuse_bad_arguments_before_anything_changes(
    how: str, jobs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a number for the backends was a raw ``TypeError``, and a
    timeout of ``"600"``, 0 or NaN was taken (failing at the first
    checkpoint's wait, or aborting at once). Each bad argument is an
    ``InvalidArgumentError`` before recovery restores or deletes anything
    (an unfinished checkpoint it would delete stays)."""
    job = jobs("job", heap)
    job.put(range(10), "a")
    job.checkpoint()
    unfinished = Path(job.storage.checkpoint_dir(9))
    unfinished.mkdir()
    (unfinished / "keyed-state-0-7").write_bytes(b"partial")
    target = jobs("target", heap)
    make = CheckpointCoordinator.recover if how == "recover" else CheckpointCoordinator
    monkeypatch.chdir(tmp_path)
    for arguments, message in _coordinator_arguments(target).values():
        given = {"storage": job.storage, "backends": target.backends, **arguments}
        _refused(functools.partial(make, **given), message, tmp_path)
        assert target.contents() == {"value": {}, "list": {}}


@pytest.mark.parametrize(
    "step", ["acknowledge", "complete_checkpoint", "abort_checkpoint", "pending_location"]
)
def test_the_steps_of_a_checkpoint_refuse_a_bad_id_or_timeout_changing_nothing(
    step: str, jobs: Any, tmp_path: Path
) -> None:
    """Regression: a checkpoint id of an unhashable type (``[1]``) raised a raw
    ``TypeError``; ``True`` was taken for checkpoint 1; a timeout of ``"1"``
    failed (and aborted) the checkpoint with a ``TypeError``. Each is an
    ``InvalidArgumentError``; the checkpoint stays pending and completes."""
    job = jobs("job", heap)
    job.put(range(10), "a")
    pending = job.coordinator.trigger_checkpoint()
    job.coordinator.acknowledge(pending)  # its writers done: nothing changes on its own
    assert pending == 1
    refusals: list[tuple[dict[str, Any], str]] = [
        (
            {"checkpoint_id": value},
            f"expected a checkpoint id (an int), got {type(value).__name__} {value!r}",
        )
        for value in (True, 1.0, "1", None, [1])
    ]
    if step in ("acknowledge", "complete_checkpoint"):
        refusals += [
            ({"timeout": value}, f"expected a timeout in seconds >= 0 or None, got {value!r}")
            for value in ("1", -1, float("nan"), True)
        ]
    for arguments, message in refusals:
        given = {"checkpoint_id": pending, **arguments}
        _refused(functools.partial(getattr(job.coordinator, step), **given), message, tmp_path)
        assert job.coordinator.pending_checkpoints == [pending]
    assert job.coordinator.complete_checkpoint(pending).checkpoint_id == pending


@pytest.mark.parametrize("bad", sorted(BAD_NAMES))
def test_deleting_a_savepoint_refuses_a_directory_no_file_system_takes(
    bad: str, jobs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: ``delete_savepoint`` given a directory holding a NUL byte
    said it does not exist (as for a name of 300 bytes). It is an
    ``InvalidArgumentError`` naming what is wrong; nothing is deleted."""
    value, end = BAD_NAMES[bad]
    job = jobs("job", heap)
    job.coordinator.trigger_savepoint(str(tmp_path / "sp"))
    monkeypatch.chdir(tmp_path)
    _refused(
        lambda: job.coordinator.delete_savepoint(value),
        f"expected a savepoint directory{end}",
        tmp_path,
    )


INSPECT_ARGUMENTS: dict[str, tuple[dict[str, Any], str]] = {
    **{
        f"directory {name}": ({"directory": value}, f"expected a snapshot directory{end}")
        for name, (value, end) in BAD_NAMES.items()
    },
    "file system": ({"filesystem": "local"}, "expected a FileSystem or None, got str"),
    "verify": ({"verify": "yes"}, "expected verify to be True or False, got 'yes'"),
}


@pytest.mark.parametrize("case", sorted(INSPECT_ARGUMENTS))
def test_inspect_refuses_bad_arguments_before_anything_is_read(
    case: str, jobs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: inspecting a directory holding a NUL byte, or a name of 300
    bytes, said it does not exist; a file system of another type raised a raw
    ``AttributeError``. Each is an ``InvalidArgumentError`` naming what is
    wrong (and so from ``read_metadata``, which inspect and restore read
    ``_metadata`` with), before anything is read."""
    arguments, message = INSPECT_ARGUMENTS[case]
    job = jobs("job", heap)
    directory = job.storage.checkpoint_dir(job.checkpoint().checkpoint_id)
    given = {"directory": directory, **arguments}
    monkeypatch.chdir(tmp_path)
    _refused(lambda: inspect_snapshot(**given), message, tmp_path)
    if "verify" not in arguments:
        filesystem = given.get("filesystem", FileSystem())
        _refused(
            lambda: read_metadata(filesystem, given["directory"]),
            message.replace("FileSystem or None", "FileSystem"),
            tmp_path,
        )


#: Subtasks whose ranges hold as many key groups as there are, one twice and
#: another by none.
TWICE_AND_NONE = {
    "as-many-key-groups": [KeyGroupRange(0, 8), KeyGroupRange(8, 14)],
    "beside-an-empty-range": [KeyGroupRange(0, 7), KeyGroupRange.EMPTY, KeyGroupRange(5, 12)],
}


def subtasks_case(
    case: str, tmp: Path, coordinator: type[CheckpointCoordinator] = CheckpointCoordinator
) -> None:
    ranges = TWICE_AND_NONE[case]
    assert sum(len(r) for r in ranges) == MAXP
    job = Job(tmp / "root", "job", heap)
    job.put(range(60), "a")
    directory = job.coordinator.complete_checkpoint(job.coordinator.trigger_checkpoint()).directory
    job.close()
    backends = [heap(r, MAXP) for r in ranges]
    for backend in backends:
        backend.get_state(VALUE)
    storage = CheckpointStorage(str(tmp / "root"), "restored")
    message = f"expected disjoint key-group ranges, got {ranges[0]!r} and {ranges[-1]!r}"
    try:
        with pytest.raises(InvalidArgumentError) as caught:
            coordinator(storage, backends).close()
        assert str(caught.value) == message
        with pytest.raises(InvalidArgumentError) as caught:
            coordinator.restore(storage, backends, directory, RestoreMode.NO_CLAIM).close()
        assert str(caught.value) == message
        assert all(list(b.entries("value")) == [] for b in backends)
        assert not Path(storage.job_dir).exists()
    finally:
        for backend in backends:
            backend.close()


@pytest.mark.parametrize("case", list(TWICE_AND_NONE))
def test_subtasks_holding_a_key_group_twice_are_refused_whatever_they_add_up_to(
    case: str, tmp_path: Path
) -> None:
    """Subtasks whose ranges hold as many key groups as there are, one of them
    twice and another by none, are refused by a coordinator and its restore,
    before anything is restored. (Beside an empty range, which sorts anywhere,
    comparing neighbours missed the overlap: a coordinator took subtasks
    holding key groups 5-7 twice and 13-15 nowhere, and failed only when its
    first checkpoint's _metadata was verified.)"""
    subtasks_case(case, tmp_path)


@pytest.mark.parametrize(
    "ranges",
    [
        [KeyGroupRange(0, 7), KeyGroupRange(9, 15)],
        [KeyGroupRange(0, 7), KeyGroupRange.EMPTY, KeyGroupRange(9, 15)],
        [KeyGroupRange(1, 15)],
    ],
    ids=["between-two", "beside-an-empty-range", "the-first"],
)
def test_subtasks_that_leave_a_key_group_to_none_are_refused(
    tmp_path: Path, ranges: list[KeyGroupRange]
) -> None:
    backends = [heap(r, MAXP) for r in ranges]
    storage = CheckpointStorage(str(tmp_path / "root"), "job")
    with pytest.raises(InvalidArgumentError) as caught:
        CheckpointCoordinator(storage, backends)
    in_order = sorted(ranges, key=lambda r: r.start_key_group)
    assert str(caught.value) == (
        f"expected the subtasks' key-group ranges to cover all {MAXP} key groups (a job's "
        f"subtasks own every key group), got {MAXP - 1}: {in_order!r}"
    )
    for backend in backends:
        backend.close()


# -------------- the lifecycle of a checkpoint: what each step refuses and says


@pytest.fixture
def small_jobs(tmp_path: Path) -> Iterator[Jobs]:
    """Jobs of one subtask owning every key group (:mod:`jobs_support`), closed at the end."""
    with Jobs(tmp_path) as made:
        yield made


def checkpoint(coordinator: CheckpointCoordinator) -> CheckpointMetadata:
    return coordinator.complete_checkpoint(coordinator.trigger_checkpoint()).metadata


def savepoint(small_jobs: Jobs, directory: Path, *, checkpoints: int = 0) -> CheckpointMetadata:
    """A savepoint of 20 keys into ``directory``, taken by a job of its own after
    ``checkpoints`` checkpoints (so its id is ``checkpoints + 1``)."""
    backend = small_jobs.heap()
    fill(backend, range(20))
    coordinator = small_jobs.new(backend, "source-root", "source")
    for _ in range(checkpoints):
        checkpoint(coordinator)
    return coordinator.trigger_savepoint(str(directory))


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# _pending_checkpoint__mutmut_5 (`sorted(...) and 'none'`), __mutmut_7
# ('XXnoneXX'), __mutmut_8 ('NONE'); the message abort_checkpoint had its own
# copy of (abort_checkpoint__mutmut_6, 7, 9).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
@pytest.mark.parametrize(
    "step", ["abort_checkpoint", "acknowledge", "complete_checkpoint", "pending_location"]
)
def test_a_step_on_an_unknown_checkpoint_names_the_pending_ids(small_jobs: Jobs, step: str) -> None:
    coordinator = small_jobs.new()
    with pytest.raises(UnknownCheckpointError) as caught:
        getattr(coordinator, step)(7)
    assert str(caught.value) == "expected a pending checkpoint id (none), got 7"
    pending = coordinator.trigger_checkpoint()
    with pytest.raises(UnknownCheckpointError) as caught:
        getattr(coordinator, step)(7)
    assert str(caught.value) == f"expected a pending checkpoint id ([{pending}]), got 7"
    assert coordinator.pending_checkpoints == [pending]
    coordinator.complete_checkpoint(pending)


# _check_backends__mutmut_2..4, 6, 7, 11, 12, 25 (each refusal's message
# dropped, mangled or naming None).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_coordinator_refuses_its_subtasks_naming_what_is_wrong(small_jobs: Jobs) -> None:
    storage = small_jobs.storage()
    low, high = KeyGroupRange(0, MAX_P // 2 - 1), KeyGroupRange(MAX_P // 2, MAX_P - 1)
    other = HeapKeyedStateBackend(high, MAX_P * 2, key_serializer=SER, namespace_serializer=SER)
    refused: list[tuple[list[Any], str]] = [
        ([], "expected at least one backend (subtask), got none"),
        ([object()], "expected backends with snapshot_to/restore_from, got object"),
        (
            [small_jobs.heap(), other],
            f"expected one max parallelism for every subtask, got [{MAX_P}, {MAX_P * 2}]",
        ),
        (
            [restore_support.heap(low)],
            f"expected the subtasks' key-group ranges to cover all {MAX_P} key groups (a "
            f"job's subtasks own every key group), got {MAX_P // 2}: [{low!r}]",
        ),
    ]
    for backends, message in refused:
        with pytest.raises(InvalidArgumentError) as caught:
            CheckpointCoordinator(storage, backends)
        assert str(caught.value) == message
    other.close()


# __init__ 2 (timeout 601 s), 4, 5 (the refusal of a storage that is not one),
# 24 (force_full None), 27 (recovery "").
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_new_coordinator_states_its_defaults_and_refuses_a_storage_that_is_not_one(
    small_jobs: Jobs,
) -> None:
    coordinator = CheckpointCoordinator(small_jobs.storage(), [small_jobs.heap()])
    assert coordinator.timeout == 600.0
    assert coordinator.num_retained == 1
    assert coordinator.force_full is False
    assert coordinator.recovery is None
    assert coordinator.deferred == set()
    with pytest.raises(InvalidArgumentError) as caught:
        CheckpointCoordinator("root", [small_jobs.heap()])  # type: ignore[arg-type]
    assert str(caught.value) == "expected a CheckpointStorage, got str"


# __repr____mutmut_1: no killer test printed a coordinator.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_coordinator_shows_its_job_its_retained_and_its_pending_checkpoints(
    small_jobs: Jobs,
) -> None:
    coordinator = small_jobs.new()
    checkpoint(coordinator)
    pending = coordinator.trigger_checkpoint()
    assert repr(coordinator) == (
        f"<CheckpointCoordinator {coordinator.storage.job_dir!r} retained [1] pending [{pending}]>"
    )
    coordinator.complete_checkpoint(pending)


# trigger_checkpoint__mutmut_2 (message None), __mutmut_3 (`type(None).__name__`).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_checkpoint_whose_counter_cannot_be_written_names_the_cause(small_jobs: Jobs) -> None:
    armed = threading.Event()

    def full_disk(operation: str, path: str, data: Any) -> None:
        if armed.is_set() and operation == "write" and path.endswith("/_counter"):
            raise OSError("no space left on device")

    coordinator = small_jobs.new(hooks=full_disk)
    checkpoint(coordinator)
    armed.set()
    with pytest.raises(CheckpointError) as caught:
        coordinator.trigger_checkpoint()
    assert str(caught.value) == (
        "expected to trigger a checkpoint, got OSError: no space left on device"
    )
    assert coordinator.pending_checkpoints == []


class _Refusing(HeapKeyedStateBackend):
    """A restore_support.heap subtask that refuses to start a snapshot."""

    def snapshot_to(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        raise CheckpointError("the subtask is shutting down")


# trigger_checkpoint__mutmut_30 (`abort_checkpoint(None)`: UnknownCheckpointError
# instead), __mutmut_31 (message None), __mutmut_32 (`type(None).__name__`).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_checkpoint_a_subtask_refuses_to_start_is_aborted_and_names_the_cause(
    small_jobs: Jobs,
) -> None:
    backend = _Refusing(KeyGroupRange(0, MAX_P - 1), MAX_P, key_serializer=SER)
    try:
        coordinator = small_jobs.new(backend)
        with pytest.raises(CheckpointError) as caught:
            coordinator.trigger_checkpoint()
        assert type(caught.value) is CheckpointError
        assert str(caught.value) == (
            "expected every subtask to start checkpoint 1, got CheckpointError: the subtask "
            "is shutting down; the checkpoint was aborted"
        )
        assert coordinator.pending_checkpoints == []
        assert not Path(coordinator.storage.checkpoint_dir(1)).exists()
    finally:
        backend.close()


class _Cancelled(HeapKeyedStateBackend):
    """A restore_support.heap subtask whose snapshot is cancelled before it runs (its writer
    pool shut down with the task still queued)."""

    def snapshot_to(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        future: Future[KeyedStateHandle] = Future()
        future.cancel()
        future.set_running_or_notify_cancel()
        return future


# acknowledge__mutmut_18 (the cancellation not a failure: no error),
# __mutmut_19 (message None), __mutmut_26 (`type(None).__name__`).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_checkpoint_whose_subtask_was_cancelled_fails_naming_the_subtask(
    small_jobs: Jobs,
) -> None:
    backend = _Cancelled(KeyGroupRange(0, MAX_P - 1), MAX_P, key_serializer=SER)
    try:
        coordinator = small_jobs.new(backend)
        checkpoint_id = coordinator.trigger_checkpoint()
        with pytest.raises(CheckpointError) as caught:
            coordinator.complete_checkpoint(checkpoint_id)
        assert str(caught.value) == (
            f"expected every subtask to write checkpoint {checkpoint_id}, got CheckpointError: "
            "subtask 0 was cancelled; the checkpoint was aborted"
        )
        assert coordinator.pending_checkpoints == []
        assert coordinator.completed_checkpoints == []
    finally:
        backend.close()


# acknowledge__mutmut_15 (`future in done or failure is None`): every failed
# subtask overwrote the failure, and the error named the last one's cause.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_checkpoint_two_subtasks_fail_names_the_first_failure(small_jobs: Jobs) -> None:
    def broken_disks(operation: str, path: str, data: Any) -> None:
        if operation == "write" and "/keyed-state-0-7" in path:
            raise OSError("disk 0 failed")
        if operation == "write" and "/keyed-state-8-15" in path:
            raise OSError("disk 1 failed")

    low = restore_support.heap(KeyGroupRange(0, 7))
    high = restore_support.heap(KeyGroupRange(8, 15))
    try:
        fill(low, [k for k in range(40) if group_of(k) <= 7])
        fill(high, [k for k in range(40) if group_of(k) >= 8])
        storage = small_jobs.storage(hooks=broken_disks)
        coordinator = small_jobs.keep(CheckpointCoordinator(storage, [high, low]))
        checkpoint_id = coordinator.trigger_checkpoint()
        with pytest.raises(CheckpointError) as caught:
            coordinator.complete_checkpoint(checkpoint_id)
        assert str(caught.value) == (
            f"expected every subtask to write checkpoint {checkpoint_id}, got "
            f"SnapshotWriteError: expected snapshot {checkpoint_id} to be written, got "
            "OSError: disk 1 failed; its resources were released; the checkpoint was aborted"
        )
        assert not Path(storage.checkpoint_dir(checkpoint_id)).exists()
    finally:
        low.close()
        high.close()


class _Unconfined(HeapKeyedStateBackend):
    """A subtask whose handle names a shared file outside the storage root."""

    def snapshot_to(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        handle = super().snapshot_to(checkpoint_id, location, options).result(timeout=30)
        escaping = FileHandle(path="../../../outside.sst", size=1, crc32=0, scope="shared")
        future: Future[KeyedStateHandle] = Future()
        future.set_result(handle.model_copy(update={"files": (*handle.files, escaping)}))
        return future


# complete_checkpoint__mutmut_21 (`abort_checkpoint(None)`), 22, 23 (the message
# dropped or naming NoneType): a handle naming an unconfined file.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_checkpoint_whose_handle_names_an_unconfined_file_is_aborted_naming_why(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    backend = _Unconfined(FULL, MAX_P, key_serializer=SER, namespace_serializer=SER)
    coordinator = small_jobs.new(small_jobs.keep_backend(backend))
    pending = coordinator.trigger_checkpoint()
    with pytest.raises(CheckpointError) as caught:
        coordinator.complete_checkpoint(pending)
    message = str(caught.value)
    assert message.startswith(
        f"expected checkpoint {pending}'s handles to name confined files, got UnsafePathError: "
    )
    assert message.endswith("; the checkpoint was aborted")
    assert coordinator.pending_checkpoints == []
    assert not (tmp_path / "root" / "job" / f"chk-{pending}").exists()


# complete_checkpoint__mutmut_58 (`abort_checkpoint(None)`), 59, 60 (the message
# dropped or naming NoneType): the _metadata cannot be written.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_checkpoint_whose_metadata_cannot_be_written_is_aborted_naming_the_cause(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    def full_disk(operation: str, path: str, data: Any) -> None:
        if METADATA_FILE in path and operation not in ("exists", "read", "delete"):
            raise OSError("No space left on device")

    coordinator = small_jobs.new(hooks=full_disk)
    pending = coordinator.trigger_checkpoint()
    with pytest.raises(CheckpointError) as caught:
        coordinator.complete_checkpoint(pending)
    assert str(caught.value).startswith(
        f"expected checkpoint {pending}'s _metadata to be written, got OSError: "
    )
    assert str(caught.value).endswith("; the checkpoint was aborted")
    assert coordinator.pending_checkpoints == []
    assert coordinator.completed_checkpoints == []
    assert not (tmp_path / "root" / "job" / f"chk-{pending}").exists()


# ------------------------------------- the lifecycle of a checkpoint: timeouts


class _Blocked:
    """A subtask writer stopped at its first write into ``directory`` until
    ``release`` is set (at most 5 s): ``reached`` once it waits there,
    ``finished`` once it goes on."""

    def __init__(self, directory: Path) -> None:
        self.directory = f"{directory}/"
        self.reached = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def hook(self, operation: str, path: str, data: Any) -> None:
        if (
            operation == "write"
            and path.startswith(self.directory)
            and threading.current_thread().name.startswith("blocked-writer")
            and not self.reached.is_set()
        ):
            self.reached.set()
            self.release.wait(5.0)
            self.finished.set()


class _StartedExecutor(ThreadPoolExecutor):
    """One writer thread; ``submit`` returns once the writer is stopped in the
    hook, so the coordinator's wait always starts with the writer running."""

    def __init__(self, blocked: _Blocked) -> None:
        super().__init__(max_workers=1, thread_name_prefix="blocked-writer")
        self._blocked = blocked

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        self._blocked.reached.wait(5.0)
        return future


def _stuck_backend(blocked: _Blocked) -> tuple[HeapKeyedStateBackend, _StartedExecutor]:
    """A restore_support.heap subtask of 20 keys whose writer stops where ``blocked`` says."""
    executor = _StartedExecutor(blocked)
    backend = HeapKeyedStateBackend(
        KeyGroupRange(0, MAX_P - 1),
        MAX_P,
        key_serializer=SER,
        namespace_serializer=SER,
        executor=executor,
    )
    backend.get_state(restore_support.VALUE)
    fill(backend, range(20))
    return backend, executor


# abort_checkpoint__mutmut_12 (`timeout=None`), __mutmut_14 (no timeout): the
# abort waited for a stuck writer instead of at most the coordinator's timeout.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_aborting_a_checkpoint_waits_for_a_stuck_subtask_at_most_the_timeout(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    blocked = _Blocked(tmp_path / "root" / "job" / "chk-1")
    backend, executor = _stuck_backend(blocked)
    try:
        coordinator = small_jobs.new(backend, hooks=blocked.hook, timeout=0.05)
        checkpoint_id = coordinator.trigger_checkpoint()
        coordinator.abort_checkpoint(checkpoint_id)
        assert not blocked.finished.is_set()  # it returned while the writer was stuck
        assert coordinator.pending_checkpoints == []
        assert not Path(coordinator.storage.checkpoint_dir(checkpoint_id)).exists()
    finally:
        blocked.release.set()
        backend.close()
        executor.shutdown(wait=True)


# acknowledge__mutmut_5 (`timeout=None`), __mutmut_7 (no timeout), __mutmut_8
# (`... and False`: the given None), __mutmut_10 (`is not None`: the given None):
# waited for the stuck writer instead of the coordinator's timeout;
# __mutmut_12 (no failure: no error), __mutmut_13 (`TimeoutError(None)`).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_checkpoint_waits_for_a_stuck_subtask_at_most_the_coordinators_timeout(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    blocked = _Blocked(tmp_path / "root" / "job" / "chk-1")
    backend, executor = _stuck_backend(blocked)
    try:
        coordinator = small_jobs.new(backend, hooks=blocked.hook, timeout=0.05)
        checkpoint_id = coordinator.trigger_checkpoint()
        with pytest.raises(CheckpointError) as caught:
            coordinator.acknowledge(checkpoint_id)
        assert str(caught.value) == (
            f"expected every subtask to write checkpoint {checkpoint_id}, got TimeoutError: "
            "1 subtasks did not finish in time; the checkpoint was aborted"
        )
        assert not blocked.finished.is_set()  # it returned while the writer was stuck
        assert coordinator.pending_checkpoints == []
    finally:
        blocked.release.set()
        backend.close()
        executor.shutdown(wait=True)


def _released_on_cancel(blocked: _Blocked, backend: HeapKeyedStateBackend) -> None:
    """Makes the stuck writer of ``backend`` go on as soon as its snapshot is
    cancelled (an abort waits for the writers it cancels, up to the coordinator's
    timeout): the snapshot futures it returns release ``blocked`` first."""
    snapshot_to = backend.snapshot_to

    def snapshot_releasing_on_cancel(
        checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        future = snapshot_to(checkpoint_id, location, options)
        cancel = future.cancel

        def release_then_cancel() -> bool:
            blocked.release.set()
            return cancel()

        setattr(future, "cancel", release_then_cancel)  # noqa: B010 -- this future's own
        return future

    setattr(backend, "snapshot_to", snapshot_releasing_on_cancel)  # noqa: B010


# acknowledge__mutmut_9 (`... or True`), __mutmut_10 (`is not None`): the
# timeout given was ignored for the coordinator's; acknowledge__mutmut_5, __mutmut_7;
# complete_checkpoint__mutmut_5 (`acknowledge(id, None)`), __mutmut_7 (the
# timeout not passed on).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
@pytest.mark.parametrize("step", ["acknowledge", "complete_checkpoint"])
def test_a_timeout_given_to_a_checkpoint_step_overrides_the_coordinators(
    small_jobs: Jobs, tmp_path: Path, step: str
) -> None:
    blocked = _Blocked(tmp_path / "root" / "job" / "chk-1")
    backend, executor = _stuck_backend(blocked)
    _released_on_cancel(blocked, backend)
    try:
        coordinator = small_jobs.new(backend, hooks=blocked.hook, timeout=60.0)
        checkpoint_id = coordinator.trigger_checkpoint()
        with pytest.raises(CheckpointError) as caught:
            getattr(coordinator, step)(checkpoint_id, 0.05)
        assert str(caught.value) == (
            f"expected every subtask to write checkpoint {checkpoint_id}, got TimeoutError: "
            "1 subtasks did not finish in time; the checkpoint was aborted"
        )
        assert coordinator.pending_checkpoints == []
        assert coordinator.completed_checkpoints == []
    finally:
        blocked.release.set()
        backend.close()
        executor.shutdown(wait=True)


#: Subtasks of which three hold no key group: the first, one in the middle and the last.
WITH_EMPTY = [
    KeyGroupRange.EMPTY,
    KeyGroupRange(0, 7),
    KeyGroupRange.EMPTY,
    KeyGroupRange(8, 15),
    KeyGroupRange.EMPTY,
]


@BOTH
def test_subtasks_holding_no_key_group_checkpoint_to_an_empty_handle(
    factory: Factory, jobs: Any, tmp_path: Path
) -> None:
    """Regression: a subtask holding no key group (an operator its split left
    none) with registered states wrote a file listing its states, which M4
    refuses, so every checkpoint and savepoint of its job failed. Rule 10: it
    is asked nothing, and its handle is the empty one (no state, no file; the
    others' backend, format and key serializer). Its job checkpoints, takes
    savepoints of both formats, recovers, and its savepoints restore at the
    same and at another parallelism."""
    job = jobs("job", factory, ranges=WITH_EMPTY)
    job.put(range(40), "a")
    expected = job.contents()
    metadata = job.checkpoint()
    savepoints = {
        form: job.coordinator.trigger_savepoint(str(tmp_path / f"sp-{form}"), form)
        for form in ("canonical", "native")
    }
    for written in (metadata, *savepoints.values()):
        assert [h.key_group_range for h in written.subtasks] == [
            (r.start_key_group, r.end_key_group) for r in WITH_EMPTY
        ]
        holder = written.subtasks[1]
        for index in (0, 2, 4):
            empty = written.subtasks[index]
            assert (empty.states, empty.files, empty.full_size) == ((), (), 0)
            assert (empty.backend, empty.format, empty.key_serializer) == (
                holder.backend,
                holder.format,
                holder.key_serializer,
            )
    report = format_report(inspect_snapshot(job.storage.checkpoint_dir(1)))
    assert report.count("key groups 0..-1, 0 B") == 3
    job.close()
    recovered = jobs("job", factory, ranges=WITH_EMPTY, recover=True)
    assert recovered.contents() == expected
    recovered.put(range(5), "b")
    recovered.checkpoint()
    for form in ("canonical", "native"):
        for ranges in (WITH_EMPTY, None):
            restored = jobs(
                f"from-{form}-{len(ranges or [])}",
                factory,
                ranges=ranges,
                restore=(str(tmp_path / f"sp-{form}"), RestoreMode.NO_CLAIM),
            )
            assert restored.contents() == expected
            restored.checkpoint()


@BOTH
def test_subtasks_holding_no_key_group_restore_from_nothing(factory: Factory, jobs: Any) -> None:
    """Regression: restoring a job with subtasks holding no key group was
    refused ("expected the handles of a snapshot to restore from, got
    none"): no handle meets an empty range. Rule 10: such a subtask is not
    asked, and is left as it is (it can hold no keyed state); the others
    restore, all or nothing as before. A CLAIM restore of a checkpoint of
    parallelism 2, the job going on and recovering."""
    other = jobs("parallelism-two", factory)
    other.put(range(40), "c")
    directory = other.storage.checkpoint_dir(other.checkpoint().checkpoint_id)
    expected = other.contents()
    other.close()
    rescaled = jobs("rescaled", factory, ranges=WITH_EMPTY, restore=(directory, RestoreMode.CLAIM))
    assert rescaled.contents() == expected
    rescaled.put(range(3), "d")
    expected = rescaled.contents()
    rescaled.checkpoint()
    assert not Path(directory).exists()  # CLAIMed and subsumed
    rescaled.close()
    recovered = jobs("rescaled", factory, ranges=WITH_EMPTY, recover=True)
    assert recovered.contents() == expected


# -------------------------------------------------------------------- rules


@SHARING
def test_rule_1_checkpoint_references_only_the_last_confirmed_checkpoint(
    jobs: Any, tmp_path: Path, factory: Factory
) -> None:
    job = jobs("job", factory, parallelism=1)
    job.put(range(200), "a")
    first = job.checkpoint()
    job.put(range(10), "b")
    pending = job.coordinator.trigger_checkpoint()  # uploaded, never confirmed
    job.coordinator.acknowledge(pending)
    pending_uploads = {
        f.path
        for h in job.coordinator._pending[pending].acknowledged.values()
        for f in h.shared_files
    } - shared(first)
    assert pending_uploads
    job.put(range(10, 20), "c")
    third = job.checkpoint()  # completes, aborting `pending`
    assert not shared(third) & pending_uploads
    assert shared(third) & shared(first)  # still incremental on `first`
    assert not any((tmp_path / "root" / p).exists() for p in pending_uploads)
    job.put(range(20, 30), "d")
    aborted = job.coordinator.trigger_checkpoint()
    job.coordinator.acknowledge(aborted)
    aborted_uploads = {
        f.path
        for h in job.coordinator._pending[aborted].acknowledged.values()
        for f in h.shared_files
    } - shared(third)
    job.coordinator.abort_checkpoint(aborted)
    fourth = job.checkpoint()
    # Whatever the fourth reuses is the third's (compaction may have rewritten
    # the rest, which it then uploads anew), never an aborted upload.
    earlier = shared(first) | shared(third) | pending_uploads | aborted_uploads
    assert shared(fourth) & earlier <= shared(third)
    assert (
        restored_contents(factory, job.storage.checkpoint_dir(fourth.checkpoint_id))
        == job.contents()
    )


@SHARING
@pytest.mark.parametrize("savepoint_format", ["native", "canonical"])
def test_rule_2_a_savepoint_never_changes_the_incremental_base(
    jobs: Any, tmp_path: Path, savepoint_format: str, factory: Factory
) -> None:
    """RocksIncrementalSnapshotStrategyTest: checkpoint 1 confirmed, a savepoint,
    checkpoint 3 is still incremental and reuses what it would have without it."""
    with_savepoint = jobs("a", factory, parallelism=1)
    without = jobs("b", factory, parallelism=1)
    for job in (with_savepoint, without):
        job.put(range(300), "x")
        job.checkpoint()
        job.put(range(5), "y")
    savepoint = with_savepoint.coordinator.trigger_savepoint(str(tmp_path / "sp"), savepoint_format)
    assert all(f.scope == "exclusive" and not f.path.startswith("/") for f in savepoint.files)
    after = with_savepoint.checkpoint()
    plain = without.checkpoint()
    reused = {f.local_name for f in after.files if f.scope == "shared"} & {
        f.local_name for f in with_savepoint.coordinator.completed_checkpoints[0].metadata.files
    }
    assert reused
    assert {f.local_name for f in after.files if f.scope == "shared"} == {
        f.local_name for f in plain.files if f.scope == "shared"
    }
    handle = after.subtasks[0]
    assert handle.checkpointed_size < handle.full_size
    assert not any(str(tmp_path / "sp") in f.path for f in after.files)


def test_rule_3_unknown_older_and_aborted_notices(tmp_path: Path) -> None:
    backend = rocksdb(KeyGroupRange(0, MAXP - 1), MAXP)
    try:
        backend.get_state(VALUE)
        filesystem = FileSystem()

        def checkpoint(checkpoint_id: int) -> Any:
            backend.set_current_key(checkpoint_id)
            backend.get_state(VALUE).update(checkpoint_id)
            location = SnapshotLocation(
                filesystem,
                str(tmp_path / f"chk-{checkpoint_id}"),
                str(tmp_path / "shared"),
            )
            return backend.snapshot_to(checkpoint_id, location, SnapshotOptions()).result()

        checkpoint(1)
        backend.notify_checkpoint_complete(1)
        checkpoint(2)
        backend.notify_checkpoint_complete(7)  # a savepoint's id: unknown
        assert backend.last_completed_checkpoint_id == 1
        backend.notify_checkpoint_complete(2)
        backend.notify_checkpoint_complete(1)  # older: ignored
        assert backend.last_completed_checkpoint_id == 2
        checkpoint(3)
        backend.notify_checkpoint_aborted(3)
        assert 3 not in backend.recorded_checkpoints
        backend.notify_checkpoint_complete(3)  # its record is gone: ignored
        assert backend.last_completed_checkpoint_id == 2
    finally:
        backend.close()


def test_rule_4_aborting_or_failing_deletes_only_its_own_uploads(jobs: Any, tmp_path: Path) -> None:
    job = jobs("job", rocksdb, parallelism=1)
    job.put(range(300), "a")
    first = job.checkpoint()
    before = files_under(tmp_path / "root")
    job.put(range(50), "b")
    checkpoint_id = job.coordinator.trigger_checkpoint()
    job.coordinator.acknowledge(checkpoint_id)
    assert files_under(tmp_path / "root") > before  # it uploaded something
    job.coordinator.abort_checkpoint(checkpoint_id)
    assert files_under(tmp_path / "root") == before
    assert restored_contents(rocksdb, job.storage.checkpoint_dir(first.checkpoint_id))

    writes = 0

    def fail_late(operation: str, path: str, data: bytes | None) -> None:
        nonlocal writes
        if operation == "write" and "/shared/" not in path and "chk-" in path:
            writes += 1
            if writes == 3:
                raise OSError("disk full")

    failing = jobs("failing", rocksdb, parallelism=1, filesystem=FileSystem(hooks=fail_late))
    failing.put(range(300), "a")
    root_before = files_under(tmp_path / "root")
    with pytest.raises(CheckpointError, match="OSError: disk full"):
        failing.checkpoint()
    assert files_under(tmp_path / "root") == root_before | {
        str(Path(failing.storage.job_dir) / "_counter")
    }


@SHARING
def test_rule_5_subsuming_deletes_exactly_the_unused_shared_files(
    jobs: Any, tmp_path: Path, factory: Factory
) -> None:
    job = jobs("job", factory, parallelism=1, num_retained=2)
    metadata = []
    for round_ in range(5):
        job.put(range(round_ * 40, round_ * 40 + 200), round_)
        before = files_under(tmp_path / "root")
        metadata.append(job.checkpoint())
        after = files_under(tmp_path / "root")
        if round_ >= 2:
            subsumed = metadata[round_ - 2]
            retained = metadata[round_ - 1 :]
            used = set().union(*(shared(m) for m in retained))
            subsumed_dir = job.storage.checkpoint_dir(subsumed.checkpoint_id)
            root = tmp_path / "root"
            exclusive = {
                p for p in resolved(subsumed, subsumed_dir) if p.startswith(subsumed_dir)
            } | {str(Path(subsumed_dir) / METADATA_FILE)}
            expected_deleted = {str(root / p) for p in shared(subsumed) - used} | exclusive
            new_dir = job.storage.checkpoint_dir(metadata[round_].checkpoint_id)
            new = resolved(metadata[round_], new_dir) | {str(Path(new_dir) / METADATA_FILE)}
            assert before - after == expected_deleted
            assert after - before == new - before
            assert all((root / p).exists() for m in retained for p in shared(m))


# ------------------------------------- heap incremental checkpoints (issue 29)


def chain_names(metadata: CheckpointMetadata) -> list[list[str | None]]:
    """Each subtask's chain, by the files' local names."""
    return [[f.local_name for f in handle.files] for handle in metadata.subtasks]


def heap_bounded(max_deltas: int, removal_limit: int = 4096) -> Factory:
    def factory(key_groups: KeyGroupRange, max_parallelism: int) -> Any:
        options = IncrementalOptions(max_deltas=max_deltas, removal_limit=removal_limit)
        return HeapKeyedStateBackend(key_groups, max_parallelism, incremental=options)

    return factory


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_deltas": -1}, "expected max_deltas >= 0, got -1"),
        ({"max_deltas": 2.0}, "expected max_deltas >= 0, got 2.0"),
        ({"max_delta_ratio": float("nan")}, "expected max_delta_ratio >= 0, got nan"),
        ({"max_delta_ratio": "1"}, "expected max_delta_ratio >= 0, got '1'"),
        ({"removal_limit": 0}, "expected a removal limit >= 1, got 0"),
    ],
)
def test_incremental_options_refuse_bad_bounds_naming_what_came(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        IncrementalOptions(**options)


def test_a_heap_backend_refuses_incremental_that_is_not_a_bool_or_options() -> None:
    with pytest.raises(InvalidArgumentError, match="expected incremental=True, False or"):
        HeapKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP, incremental="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "factory", [heap_incremental, heap_incremental_over_pure_maps], ids=["default", "pure-maps"]
)
def test_a_heap_delta_holds_what_changed_since_the_confirmed_checkpoint(
    jobs: Any, factory: Factory
) -> None:
    # Over C maps the C snapshot writer encoded every mapping of a delta's
    # snapshots (it walks whole chunks): a delta then held everything.
    job = jobs("job", factory, parallelism=1)
    job.put(range(1000), "a")
    first = job.checkpoint()
    assert chain_names(first) == [["keyed-state-0-15"]]
    job.put(range(10), "b")
    [backend] = job.backends
    for key in range(20, 25):
        backend.set_current_key(key)
        backend.get_state(VALUE).clear()
    second = job.checkpoint()
    assert chain_names(second) == [["keyed-state-0-15", "heap-delta-0-15", "heap-removals-0-15"]]
    handle = second.subtasks[0]
    assert handle.files[0] == first.subtasks[0].files[0]  # the base, reused as it is
    assert handle.checkpointed_size == sum(f.size for f in handle.files[1:])
    assert handle.checkpointed_size < handle.files[0].size // 10
    directory = job.storage.checkpoint_dir(second.checkpoint_id)
    source = SnapshotSource(FileSystem(), directory)
    changes = read_snapshot(source.read(handle.files[1]), KeyGroupRange(0, MAXP - 1))
    assert {k for _, k, _, _ in changes.entries("value")} == set(range(10))
    assert {k for _, k, _, _ in changes.entries("list")} == set(range(10))
    assert restored_contents(factory, directory) == job.contents()


def _with_transformer(backend: HeapKeyedStateBackend) -> None:
    table = backend.table("value")
    table.set_meta_info(dataclasses.replace(table.meta, snapshot_transformer=lambda s: s))


def _with_another_serializer(backend: HeapKeyedStateBackend) -> None:
    table = backend.table("value")
    table.set_meta_info(dataclasses.replace(table.meta, state_serializer=ImmutableSerializer()))


def _overflowing_a_removal_log(backend: HeapKeyedStateBackend) -> None:
    """Three removals in one key group: one more than the log of 2 holds."""
    keys = [k for k in range(100) if assign_to_key_group(k, MAXP) == 5][:3]
    for key in keys:
        backend.set_current_key(key)
        backend.get_state(VALUE).clear()


#: I2 of cowstate.heap_incremental: what makes the next checkpoint full.
FULL_WHEN = {
    "a state has a snapshot transformer": _with_transformer,
    "a state of the base changed its serializer": _with_another_serializer,
    "a removal log overflowed": _overflowing_a_removal_log,
}


@pytest.mark.parametrize("case", sorted(FULL_WHEN))
def test_a_heap_checkpoint_is_full_when(jobs: Any, case: str) -> None:
    job = jobs("job", heap_bounded(10, removal_limit=2), parallelism=1)
    job.put(range(100), "a")
    job.checkpoint()
    job.put(range(2), "b")
    assert len(job.checkpoint().subtasks[0].files) == 3  # a delta: nothing in the way
    job.put(range(2, 4), "c")
    FULL_WHEN[case](job.backends[0])
    metadata = job.checkpoint()
    assert chain_names(metadata) == [["keyed-state-0-15"]]
    directory = job.storage.checkpoint_dir(metadata.checkpoint_id)
    restored = restored_contents(heap_bounded(10), directory)
    assert restored["value"] == job.contents()["value"]


def test_a_state_registered_after_the_base_is_written_whole_into_the_delta(jobs: Any) -> None:
    job = jobs("job", heap_incremental, parallelism=1)
    job.put(range(100), "a")
    job.checkpoint()
    [backend] = job.backends
    late: ValueStateDescriptor[Any] = ValueStateDescriptor("late")
    for key in range(7):
        backend.set_current_key(key)
        backend.get_state(late).update(key)
    job.put(range(2), "b")
    metadata = job.checkpoint()
    handle = metadata.subtasks[0]
    assert len(handle.files) == 3 and [s.name for s in handle.states] == ["value", "list", "late"]
    directory = job.storage.checkpoint_dir(metadata.checkpoint_id)
    source = SnapshotSource(FileSystem(), directory)
    changes = read_snapshot(source.read(handle.files[1]), KeyGroupRange(0, MAXP - 1))
    assert {k for _, k, _, _ in changes.entries("late")} == set(range(7))
    assert {k for _, k, _, _ in changes.entries("value")} == {0, 1}
    fresh = heap_incremental(KeyGroupRange(0, MAXP - 1), MAXP)
    try:
        fresh.restore_from(metadata.subtasks, source)
        assert {k: s for k, _, s in fresh.entries("late")} == {k: k for k in range(7)}
        assert {k: s for k, _, s in fresh.entries("value")} == job.contents()["value"]
    finally:
        fresh.close()


def test_a_heap_chain_at_its_limit_is_followed_by_a_full_checkpoint(
    jobs: Any, tmp_path: Path
) -> None:
    job = jobs("job", heap_bounded(2), parallelism=1)
    job.put(range(100), "a")
    chains = []
    for round_ in range(4):
        job.put(range(round_ * 3, round_ * 3 + 3), round_)
        chains.append(job.checkpoint())
    assert [len(handle.files) for m in chains for handle in m.subtasks] == [1, 3, 5, 1]
    # one retained: the full fourth leaves nothing of the old chain behind
    shared_dir = tmp_path / "root" / "job" / "shared"
    assert {p.name.split("-", 1)[1] for p in shared_dir.iterdir()} == {"keyed-state-0-15"}
    directory = job.storage.checkpoint_dir(chains[-1].checkpoint_id)
    assert restored_contents(heap_incremental, directory) == job.contents()


def test_a_heap_chain_whose_deltas_outweigh_its_base_is_followed_by_a_full_checkpoint(
    jobs: Any,
) -> None:
    job = jobs("job", heap_incremental, parallelism=1)
    sizes = []
    for round_ in range(4):
        job.put(range(100), round_)  # every mapping changes: a delta as large as a base
        sizes.append(len(job.checkpoint().subtasks[0].files))
    # max_delta_ratio 1.0: a delta of every mapping (and its removals file)
    # outweighs the base, so the checkpoint after it is full
    assert sizes == [1, 3, 1, 3]


@pytest.mark.skipif(
    C_MAP is None,
    reason="the C map is not built: test_the_c_map_is_built_and_chosen fails for that",
)
def test_the_default_heap_backend_tracks_changes_in_c_maps() -> None:
    backend = HeapKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP, incremental=True)
    backend.set_current_key(1)
    backend.get_state(VALUE).update(1)
    table = backend.table("value")
    assert isinstance(table, CopyOnWriteStateTable)
    maps: list[Any] = [table.state_map(kg) for kg in table.key_group_range]
    assert all(type(m) is C_MAP and m.tracking_since is not None for m in maps)
    backend.close()


def test_a_heap_backend_over_nested_tables_writes_every_checkpoint_full(jobs: Any) -> None:
    """The nested table's maps do not track changes (I2): incremental=True over
    it still writes one full file per checkpoint, which restores."""

    def over_nested_tables(key_groups: KeyGroupRange, max_parallelism: int) -> Any:
        return HeapKeyedStateBackend(
            key_groups, max_parallelism, NestedMapsStateTable, incremental=True
        )

    job = jobs("job", over_nested_tables, parallelism=1)
    for round_ in range(3):
        job.put(range(round_, 100), round_)
        metadata = job.checkpoint()
        assert chain_names(metadata) == [["keyed-state-0-15"]]
        assert metadata.subtasks[0].files[0].scope == "shared"
    directory = job.storage.checkpoint_dir(metadata.checkpoint_id)
    assert restored_contents(heap, directory) == job.contents()


@pytest.mark.parametrize("mode", [RestoreMode.NO_CLAIM, RestoreMode.CLAIM, RestoreMode.LEGACY])
def test_the_first_heap_checkpoint_after_any_restore_is_full(
    jobs: Any, tmp_path: Path, mode: RestoreMode
) -> None:
    job = jobs("job", heap_incremental, parallelism=1)
    job.put(range(100), "a")
    job.checkpoint()
    job.put(range(5), "b")
    directory = job.storage.checkpoint_dir(job.checkpoint().checkpoint_id)
    restored = jobs("restored", heap_incremental, parallelism=1, restore=(directory, mode))
    assert restored.contents() == job.contents()
    restored.put(range(3), "c")
    first = restored.checkpoint()
    assert chain_names(first) == [["keyed-state-0-15"]]
    assert all(f.path.startswith("restored/shared/") for f in first.files)
    restored.put(range(3, 6), "d")
    assert len(restored.checkpoint().subtasks[0].files) == 3


@pytest.mark.parametrize("parallelism", [1, 3])
def test_a_heap_chain_restores_into_other_key_group_ranges(
    jobs: Any, tmp_path: Path, parallelism: int
) -> None:
    job = jobs("job", heap_incremental, parallelism=2)
    job.put(range(200), "a")
    job.checkpoint()
    job.put(range(0, 200, 7), "b")
    for key in range(1, 200, 11):
        backend = next(
            b for b in job.backends if assign_to_key_group(key, MAXP) in b.key_group_range
        )
        backend.set_current_key(key)
        backend.get_state(LIST).clear()
    checkpoint = job.checkpoint()
    assert all(len(handle.files) == 3 for handle in checkpoint.subtasks)
    directory = job.storage.checkpoint_dir(checkpoint.checkpoint_id)
    rescaled = jobs(
        "rescaled",
        heap_incremental,
        parallelism=parallelism,
        restore=(directory, RestoreMode.NO_CLAIM),
    )
    assert rescaled.contents() == job.contents()


# ----------------------- rule 5: a pending checkpoint keeps only what it names


# PendingCheckpoint.may_use__mutmut_9 (`reusable | named`: an acknowledged
# pending checkpoint kept every retained file, not just those it names),
# _release_deferred__mutmut_7 (`discard(None)`: deleted paths stayed deferred).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_an_acknowledged_checkpoint_that_reuses_nothing_keeps_nothing(small_jobs: Jobs) -> None:
    backend = small_jobs.rocks()
    fill(backend, range(20))
    coordinator = small_jobs.new(backend)
    first, second = coordinator.trigger_checkpoint(), coordinator.trigger_checkpoint()
    coordinator.acknowledge(second)
    coordinator.complete_checkpoint(first)
    [base] = coordinator.completed_checkpoints
    kept = base.shared_paths(coordinator.storage.filesystem)
    coordinator.force_full = True  # the third reuses none of the first's SSTs
    third = coordinator.trigger_checkpoint()
    coordinator.acknowledge(third)
    coordinator.complete_checkpoint(second)
    assert [p for p in kept if Path(p).exists()] == []
    assert coordinator.deferred == set()
    coordinator.complete_checkpoint(third)


@BOTH
def test_rule_6_savepoints_and_checkpoints_never_break_each_other(
    jobs: Any, factory: Factory, tmp_path: Path
) -> None:
    job = jobs("job", factory)
    job.put(range(100), "a")
    job.checkpoint()
    sp = str(tmp_path / "sp")
    job.coordinator.trigger_savepoint(sp, "native")
    moment = job.contents()
    sp_files = files_under(Path(sp))
    for round_ in range(3):  # subsume past the savepoint
        job.put(range(round_ * 10, round_ * 10 + 30), round_)
        job.checkpoint()
    assert files_under(Path(sp)) == sp_files
    assert restored_contents(factory, sp) == moment
    job.coordinator.delete_savepoint(sp)
    assert not Path(sp).exists()
    latest = job.coordinator.latest_checkpoint
    assert latest is not None and restored_contents(factory, latest.directory) == job.contents()


# ----------------------- savepoints: taking, failing, deleting (rules 3 and 6)


# trigger_savepoint__mutmut_8: the message was None.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_savepoint_of_an_unknown_format_names_both_formats(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    coordinator = small_jobs.new()
    with pytest.raises(InvalidArgumentError) as caught:
        coordinator.trigger_savepoint(str(tmp_path / "sp"), "binary")  # type: ignore[arg-type]
    assert str(caught.value) == (
        "expected a savepoint format 'canonical' or 'native', got 'binary'"
    )


# trigger_savepoint__mutmut_27 (the id None), __mutmut_28 (`_last_id - 1`),
# __mutmut_29 (`_last_id + 2`): the id the error names when no id could be
# handed out (the counter cannot be written); __mutmut_92, __mutmut_93: the message.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_savepoint_whose_counter_cannot_be_written_names_the_next_id(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    armed = threading.Event()

    def full_disk(operation: str, path: str, data: Any) -> None:
        if armed.is_set() and operation == "write" and path.endswith("/_counter"):
            raise OSError("no space left on device")

    coordinator = small_jobs.new(hooks=full_disk)
    checkpoint(coordinator)
    checkpoint(coordinator)
    armed.set()
    directory = str(tmp_path / "sp")
    with pytest.raises(CheckpointError) as caught:
        coordinator.trigger_savepoint(directory)
    assert str(caught.value) == (
        f"expected savepoint 3 in {directory!r}, got OSError: no space left on device; "
        "what it wrote was deleted"
    )
    assert not Path(directory).exists()


# trigger_savepoint__mutmut_40: the marker held b"XXXX".
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_an_interrupted_savepoint_leaves_an_empty_marker_named_by_its_intent(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"

    def crash_at_the_metadata(operation: str, path: str, data: Any) -> None:
        if operation == "write" and path == f"{directory}/{METADATA_FILE}":
            raise jobs_support.Crash(path)

    coordinator = small_jobs.new(hooks=crash_at_the_metadata)
    with pytest.raises(jobs_support.Crash):
        coordinator.trigger_savepoint(str(directory))
    intent = coordinator.storage.read_savepoint_intent()
    assert intent is not None and intent.directory == str(directory)
    marker = directory / (SAVEPOINT_MARKER + intent.token)
    assert marker.read_bytes() == b""
    recovered = small_jobs.recover()
    assert recovered.recovery is not None
    assert recovered.recovery.removed_savepoint == str(directory)
    assert not directory.exists()


# _remove_if_empty__mutmut_3 (`exists and list_files`): the empty directory of
# a failed savepoint stayed.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_failed_savepoint_removes_the_directory_it_made_and_its_intent(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "savepoints" / "sp"

    def refuse_the_metadata(operation: str, path: str, data: Any) -> None:
        if operation == "write" and path == f"{directory}/{METADATA_FILE}":
            raise OSError("read-only file system")

    coordinator = small_jobs.new(hooks=refuse_the_metadata)
    with pytest.raises(CheckpointError, match="got OSError: read-only file system"):
        coordinator.trigger_savepoint(str(directory))
    assert not directory.exists()
    assert (tmp_path / "savepoints").exists()
    assert coordinator.storage.read_savepoint_intent() is None


# _remove_if_empty__mutmut_1 (`exists or ...`): removed the directory with a
# file another writer had put there meanwhile.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_failed_savepoint_never_deletes_a_file_it_did_not_write(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"

    def another_writer_then_failure(operation: str, path: str, data: Any) -> None:
        if operation == "write" and path == f"{directory}/{METADATA_FILE}":
            (directory / "theirs.txt").write_text("not the savepoint's")
            raise OSError("read-only file system")

    coordinator = small_jobs.new(hooks=another_writer_then_failure)
    with pytest.raises(CheckpointError, match="what it wrote was deleted"):
        coordinator.trigger_savepoint(str(directory))
    assert names(directory) == ["theirs.txt"]


# trigger_savepoint__mutmut_50/52 (no timeout: waited for the stuck writer),
# __mutmut_55 (the timeouts swapped: None), __mutmut_56 (TimeoutError(None)),
# __mutmut_85 (the cleanup waited for the writer without a timeout),
# __mutmut_92 (message None), __mutmut_93 (`type(None).__name__`).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_savepoint_times_out_on_a_stuck_subtask_and_leaves_its_writer_alone(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    blocked = _Blocked(directory)
    backend, executor = _stuck_backend(blocked)
    try:
        coordinator = small_jobs.new(backend, hooks=blocked.hook, timeout=0.05)
        with pytest.raises(CheckpointError) as caught:
            coordinator.trigger_savepoint(str(directory))
        assert str(caught.value) == (
            f"expected savepoint 1 in {str(directory)!r}, got TimeoutError: 1 subtasks did "
            "not finish in time; what it wrote was deleted"
        )
        assert not blocked.finished.is_set()  # it returned while the writer was stuck
        assert not directory.exists()  # its unfinished file deleted too
        assert coordinator.storage.read_savepoint_intent() is None
    finally:
        blocked.release.set()
        backend.close()
        executor.shutdown(wait=True)


class _Noticed(HeapKeyedStateBackend):
    """A restore_support.heap subtask that records the completion notices it gets."""

    def __init__(self) -> None:
        super().__init__(
            KeyGroupRange(0, MAX_P - 1), MAX_P, key_serializer=SER, namespace_serializer=SER
        )
        self.get_state(restore_support.VALUE)
        self.completed: list[int] = []

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed.append(checkpoint_id)
        super().notify_checkpoint_complete(checkpoint_id)


# trigger_savepoint__mutmut_96: the notice after a savepoint named None (rule 3:
# the backends hear of the savepoint's id, and ignore it).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_every_subtask_hears_of_a_completed_savepoint_by_its_id(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    backend = _Noticed()
    coordinator = small_jobs.new(backend)
    try:
        checkpoint(coordinator)
        metadata = coordinator.trigger_savepoint(str(tmp_path / "sp"))
        assert metadata.checkpoint_id == 2
        assert backend.completed == [1, 2]
    finally:
        backend.close()


# delete_savepoint__mutmut_10: the message was None.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_deleting_a_checkpoint_as_a_savepoint_is_refused_naming_it(small_jobs: Jobs) -> None:
    coordinator = small_jobs.new()
    checkpoint(coordinator)
    directory = coordinator.storage.checkpoint_dir(1)
    with pytest.raises(InvalidArgumentError) as caught:
        coordinator.delete_savepoint(directory)
    assert str(caught.value) == (
        f"expected a savepoint directory, {directory!r} holds checkpoint 1"
    )
    assert Path(directory, METADATA_FILE).exists()


# delete_savepoint__mutmut_13 (`rstrip(None)`), __mutmut_14 (`lstrip("/")`),
# __mutmut_15 (`rstrip("XX/XX")`: also strips a name's trailing X): a CLAIMed
# savepoint named with a trailing slash was not recognised and was deleted;
# __mutmut_16..19: the message.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_claimed_savepoint_is_not_deleted_as_a_savepoint_however_it_is_named(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "savepoints" / "sp-X"
    savepoint(small_jobs, directory)
    coordinator = small_jobs.restore(str(directory), RestoreMode.CLAIM)
    named = f"{directory}/"
    with pytest.raises(InvalidArgumentError) as caught:
        coordinator.delete_savepoint(named)
    assert str(caught.value) == (
        f"expected a savepoint the job does not own, {named!r} was restored in CLAIM mode "
        "and is retained as a checkpoint"
    )
    assert (directory / METADATA_FILE).exists()


# delete_savepoint__mutmut_26: the message was None.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_deleting_a_savepoint_inside_what_the_job_owns_is_refused(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    coordinator = small_jobs.new()
    source = tmp_path / "sp"
    savepoint(small_jobs, source)
    inside = Path(coordinator.storage.shared_dir, "sp")
    shutil.copytree(source, inside)  # a savepoint's files are relative: it reads anywhere
    with pytest.raises(UnsafePathError) as caught:
        coordinator.delete_savepoint(str(inside))
    assert str(caught.value) == (
        f"expected a savepoint directory outside what job 'job' owns, got {str(inside)!r}"
    )
    assert (inside / METADATA_FILE).exists()


# delete_savepoint__mutmut_24 ("XXforeignXX"), __mutmut_25 ("FOREIGN"): a
# savepoint on another file system (relation "foreign") was refused.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_savepoint_on_another_file_system_is_deleted(small_jobs: Jobs) -> None:
    root = f"memory://cowstate-coordinator-{uuid.uuid4().hex}"
    directory = f"{root}/savepoints/sp"
    filesystem = FileSystem()
    try:
        backend = small_jobs.heap()
        fill(backend, range(20))
        coordinator = small_jobs.new(backend)
        coordinator.trigger_savepoint(directory)
        assert filesystem.exists(f"{directory}/{METADATA_FILE}")
        coordinator.delete_savepoint(directory)
        assert not filesystem.exists(directory)
    finally:
        filesystem.delete_dir(root)


@BOTH
def test_rule_7_claim_owns_and_subsumes_the_restored_snapshot(
    jobs: Any, factory: Factory, tmp_path: Path
) -> None:
    old = jobs("old", factory)
    old.put(range(100), "a")
    old.checkpoint()
    source = old.coordinator.latest_checkpoint
    assert source is not None
    moment = old.contents()
    old.close()
    new = jobs("new", factory, restore=(source.directory, RestoreMode.CLAIM), parallelism=3)
    assert new.contents() == moment
    assert [c.directory for c in new.coordinator.completed_checkpoints] == [source.directory]
    new.put(range(10), "b")
    new.checkpoint()
    assert not Path(source.directory).exists()  # subsumed and deleted
    assert not any(
        Path(p).exists()
        for p in shared(source.metadata)
        if p not in shared(new.coordinator.completed_checkpoints[0].metadata)
    )


def test_rule_7_no_claim_first_checkpoint_is_full_and_never_deletes(
    jobs: Any, tmp_path: Path
) -> None:
    old = jobs("old", rocksdb, parallelism=1)
    old.put(range(300), "a")
    old.checkpoint()
    source = old.coordinator.latest_checkpoint
    assert source is not None
    source_files = files_under(Path(source.directory)) | resolved(source.metadata, source.directory)
    old.close()
    writes = 0

    def fail_once(operation: str, path: str, data: bytes | None) -> None:
        nonlocal writes
        if operation == "write" and "/new/chk-" in path:
            writes += 1
            if writes == 2:
                raise OSError("injected")

    new = jobs(
        "new",
        rocksdb_without_compaction,  # which SSTs are reused: never a compaction's timing
        parallelism=1,
        restore=(source.directory, RestoreMode.NO_CLAIM),
        filesystem=FileSystem(hooks=fail_once),
    )
    assert new.coordinator.force_full
    with pytest.raises(CheckpointError, match="injected"):
        new.checkpoint()  # a failed one: still full next
    assert new.coordinator.force_full
    previous: CheckpointMetadata | None = None
    for round_ in range(3):
        new.put(range(round_ * 5, round_ * 5 + 5), round_)
        metadata = new.checkpoint()
        handle = metadata.subtasks[0]
        if previous is None:
            assert handle.checkpointed_size == handle.full_size
            assert not shared(metadata) & shared(source.metadata)
            assert not new.coordinator.force_full
        else:  # incremental: every SST of the checkpoint before reused, only new files uploaded
            reused = shared(metadata) & shared(previous)
            assert reused and reused == shared(previous)
            assert shared(metadata) - reused  # this round's flush
            assert handle.checkpointed_size == sum(
                f.size for f in handle.files if f.path not in reused
            )
            assert handle.checkpointed_size < handle.full_size
        previous = metadata
    assert all(Path(p).exists() for p in source_files)  # never deleted


def test_rule_7_legacy_builds_on_restored_files_and_never_deletes_them(
    jobs: Any, tmp_path: Path
) -> None:
    old = jobs("old", rocksdb, parallelism=1)
    old.put(range(300), "a")
    old.checkpoint()
    source = old.coordinator.latest_checkpoint
    assert source is not None
    old.close()
    new = jobs("new", rocksdb, parallelism=1, restore=(source.directory, RestoreMode.LEGACY))
    new.put(range(5), "b")
    first = new.checkpoint()
    reused = shared(first) & shared(source.metadata)
    assert reused  # incremental on the restored files
    assert set(first.disowned) == reused
    for round_ in range(4):  # subsume it several times over
        new.put(range(round_ * 50, round_ * 50 + 100), round_)
        new.checkpoint()
    assert all((tmp_path / "root" / p).exists() for p in shared(source.metadata))
    assert Path(source.directory, METADATA_FILE).exists()


# ----------------- rule 7: the restore modes, what restore records and refuses


# restore__mutmut_1 (num_retained 2), __mutmut_2 (timeout 601),
# __mutmut_9 (timeout None), __mutmut_13 (the timeout not passed on).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_restore_keeps_one_checkpoint_and_waits_600_s_unless_told_otherwise(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    savepoint(small_jobs, directory)
    default = small_jobs.restore(str(directory), RestoreMode.NO_CLAIM)
    assert (default.num_retained, default.timeout) == (1, 600.0)
    checkpoint(default)
    checkpoint(default)
    assert [c.checkpoint_id for c in default.completed_checkpoints] == [3]
    chosen = small_jobs.restore(
        str(directory), RestoreMode.NO_CLAIM, root="chosen", num_retained=3, timeout=5.0
    )
    assert (chosen.num_retained, chosen.timeout) == (3, 5.0)


# restore__mutmut_4: the message was None.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_restore_in_an_unknown_mode_names_the_modes(small_jobs: Jobs, tmp_path: Path) -> None:
    directory = tmp_path / "sp"
    savepoint(small_jobs, directory)
    with pytest.raises(InvalidArgumentError) as caught:
        small_jobs.restore(str(directory), "CLAIM")  # type: ignore[arg-type]
    assert str(caught.value) == "expected a RestoreMode (CLAIM, NO_CLAIM, LEGACY), got 'CLAIM'"


# restore__mutmut_22, __mutmut_23: the end of the message changed.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_restore_into_a_job_directory_with_checkpoints_says_what_to_do(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    savepoint(small_jobs, directory)
    checkpoint(small_jobs.new(root="restored"))
    job_dir = str(tmp_path / "restored" / "job")
    with pytest.raises(InvalidArgumentError) as caught:
        small_jobs.restore(str(directory), RestoreMode.NO_CLAIM)
    assert str(caught.value) == (
        f"expected a new job directory to restore into, {job_dir!r} already holds "
        "checkpoints of a job: recover() it, or use another job id"
    )


# restore__mutmut_35 (`rstrip(None)`), __mutmut_37 (`rstrip("XX/XX")`): the
# record named the directory with its trailing slash, or without its trailing X.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_restore_records_the_directory_without_its_trailing_slash(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "savepoints" / "sp-X"
    savepoint(small_jobs, directory)
    coordinator = small_jobs.restore(f"{directory}/", RestoreMode.NO_CLAIM)
    assert coordinator.restored_from is not None
    assert coordinator.restored_from.directory == str(directory)
    assert coordinator.storage.read_restore_record() == coordinator.restored_from


# restore__mutmut_39: NO_CLAIM and LEGACY records carried a token too.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
@pytest.mark.parametrize("mode", [RestoreMode.NO_CLAIM, RestoreMode.LEGACY])
def test_only_a_claim_carries_a_token(small_jobs: Jobs, tmp_path: Path, mode: RestoreMode) -> None:
    directory = tmp_path / "sp"
    savepoint(small_jobs, directory)
    coordinator = small_jobs.restore(str(directory), mode)
    assert coordinator.restored_from is not None
    assert coordinator.restored_from.token == ""
    assert not any(name.startswith(CLAIM_MARKER) for name in names(directory))


# restore__mutmut_53: the claim marker held b"XXXX";
# adopt__mutmut_25 (was _adopt): the claimed snapshot was retained under the id None.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_claim_retains_the_snapshot_under_its_id_and_leaves_an_empty_marker(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    metadata = savepoint(small_jobs, directory, checkpoints=2)
    coordinator = small_jobs.restore(str(directory), RestoreMode.CLAIM)
    record = coordinator.restored_from
    assert record is not None and len(record.token) == 32
    assert (directory / (CLAIM_MARKER + record.token)).read_bytes() == b""
    [retained] = coordinator.completed_checkpoints
    assert (retained.checkpoint_id, retained.directory) == (3, str(directory))
    assert retained.metadata == metadata


# restore__mutmut_80: the counter was written as "None".
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_restore_moves_the_counter_to_the_restored_id(small_jobs: Jobs, tmp_path: Path) -> None:
    directory = tmp_path / "sp"
    savepoint(small_jobs, directory, checkpoints=2)
    coordinator = small_jobs.restore(str(directory), RestoreMode.NO_CLAIM)
    assert Path(coordinator.storage.job_dir, "_counter").read_text() == "3"
    assert coordinator.storage.read_counter() == 3
    assert checkpoint(coordinator).checkpoint_id == 4


# restore__mutmut_59 (`delete(None)`): a CLAIM whose restore failed kept its
# marker (or failed with another error than the restore's).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_claim_whose_restore_fails_removes_its_marker_and_writes_nothing(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    savepoint(small_jobs, directory)
    data = directory / "keyed-state-0-15"
    corrupt = bytearray(data.read_bytes())
    corrupt[len(corrupt) // 2] ^= 0xFF
    data.write_bytes(bytes(corrupt))
    before = names(directory)
    with pytest.raises(CorruptCheckpointError):
        small_jobs.restore(str(directory), RestoreMode.CLAIM)
    assert names(directory) == before
    assert not (tmp_path / "restored" / "job").exists()


# _settles_claim__mutmut_6 (`return True` for any record but an unsettled
# CLAIM): a NO_CLAIM job's checkpoints said a claim was settled;
# complete_checkpoint__mutmut_72 (`force_full = None`).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_no_claim_job_never_says_a_claim_is_settled(small_jobs: Jobs, tmp_path: Path) -> None:
    directory = tmp_path / "sp"
    savepoint(small_jobs, directory)
    restored = small_jobs.restore(str(directory), RestoreMode.NO_CLAIM)
    assert restored.force_full is True
    metadata = checkpoint(restored)
    assert metadata.restored_from is not None
    assert metadata.restored_from.mode is RestoreMode.NO_CLAIM
    assert metadata.restored_from.settled is False
    assert restored.force_full is False


# _restore_from__mutmut_7 (`kind == "checkpoint" or same root`): a checkpoint
# under another storage root was built on, and the new job's checkpoint named
# SSTs that do not exist under its own root.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
@pytest.mark.parametrize("mode", [RestoreMode.CLAIM, RestoreMode.LEGACY])
def test_a_checkpoint_of_another_storage_root_is_never_built_on(
    small_jobs: Jobs, tmp_path: Path, mode: RestoreMode
) -> None:
    rocks_checkpoint(small_jobs, "first-root", "first")
    directory = str(tmp_path / "first-root" / "first" / "chk-1")
    restored = small_jobs.restore(directory, mode, small_jobs.rocks(), root="other-root")
    checkpoint(restored)
    latest = restored.latest_checkpoint
    assert latest is not None
    shared = latest.shared_paths(restored.storage.filesystem)
    assert shared and all(p.startswith(f"{restored.storage.shared_dir}/") for p in shared)
    assert all(Path(p).exists() for p in shared)
    assert latest.metadata.disowned == ()


# _check_max_parallelism__mutmut_2: the message was None.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_snapshot_of_another_max_parallelism_is_refused_naming_both(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    savepoint(small_jobs, directory)
    wider = HeapKeyedStateBackend(KeyGroupRange(0, 31), 32)
    try:
        with pytest.raises(MaxParallelismMismatchError) as caught:
            small_jobs.restore(str(directory), RestoreMode.NO_CLAIM, wider)
        assert str(caught.value) == (
            "expected a snapshot of max parallelism 32, got one of 16: the number of key "
            "groups cannot change"
        )
    finally:
        wider.close()


# ------------------------------------- rule 8: claims and what the job deletes


def rocks_checkpoint(small_jobs: Jobs, root: str, job_id: str) -> CheckpointMetadata:
    """A RocksDB checkpoint of 20 keys (shared SST files) of its own job."""
    backend = small_jobs.rocks()
    fill(backend, range(20))
    return checkpoint(small_jobs.new(backend, root, job_id))


# _delete__mutmut_3 (`path in claimed or claim_holds`): deleted the files of a
# claim another job has revoked since; _delete__mutmut_6: the refusals named None.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_revoked_claim_refuses_every_deletion_and_names_each_path(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    rocks_checkpoint(small_jobs, "first-root", "first")
    directory = str(tmp_path / "first-root" / "first" / "chk-1")
    claimed = small_jobs.restore(directory, RestoreMode.CLAIM, small_jobs.rocks(), root="claims")
    small_jobs.restore(directory, RestoreMode.CLAIM, small_jobs.rocks(), root="claims-later")
    [snapshot] = claimed.completed_checkpoints
    shared = snapshot.shared_paths(claimed.storage.filesystem)
    assert shared  # RocksDB's SSTs; another root: the new job never builds on them
    before = sorted(str(p) for p in (tmp_path / "first-root").rglob("*"))
    checkpoint(claimed)  # subsumes the claimed checkpoint: no longer this job's
    assert claimed.refused_deletions == [*shared, directory]
    assert sorted(str(p) for p in (tmp_path / "first-root").rglob("*")) == before


# _claim_holds__mutmut_1 (False once settled): once the claimed checkpoint was
# subsumed (and its marker deleted with it), the shared files later
# checkpoints had kept using were refused instead of deleted.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_shared_files_of_a_settled_claim_are_deleted_once_no_checkpoint_uses_them(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    rocks_checkpoint(small_jobs, "root", "first")
    directory = str(tmp_path / "root" / "first" / "chk-1")
    backend = small_jobs.rocks()
    claimed = small_jobs.restore(
        directory, RestoreMode.CLAIM, backend, root="root", job_id="second"
    )
    filesystem = claimed.storage.filesystem
    [snapshot] = claimed.completed_checkpoints
    shared = snapshot.shared_paths(filesystem)
    contents = dump(backend)
    checkpoint(claimed)  # builds on the claimed SSTs (same storage root) ...
    reusing = claimed.latest_checkpoint
    assert reusing is not None and set(shared) <= set(reusing.shared_paths(filesystem))
    assert not Path(directory).exists()  # ... and subsumes the claimed one: settled
    assert all(Path(p).exists() for p in shared)
    claimed.force_full = True  # the next checkpoint reuses nothing
    checkpoint(claimed)
    assert claimed.refused_deletions == []
    assert not any(Path(p).exists() for p in shared)
    assert dump(backend) == contents


# claim_marker__mutmut_1 (`not CLAIM and not token`): a NO_CLAIM record that
# carries a token was taken for a claim wherever that token's marker lies, and
# the job deleted a snapshot it never claimed.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_no_claim_record_never_claims_even_with_a_token_and_its_marker(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    metadata = savepoint(small_jobs, directory)
    token = "ab" * 16
    (directory / (CLAIM_MARKER + token)).write_bytes(b"")
    before = names(directory)
    small_jobs.storage().write_restore_record(
        RestoreRecord(
            directory=str(directory),
            mode=RestoreMode.NO_CLAIM,
            checkpoint_id=metadata.checkpoint_id,
            kind="savepoint",
            token=token,
        )
    )
    recovered = small_jobs.recover()
    assert recovered.completed_checkpoints == []
    assert recovered.force_full  # NO_CLAIM: the first checkpoint is full
    checkpoint(recovered)
    checkpoint(recovered)
    assert names(directory) == before


# _delete_snapshot_files__mutmut_21 (`rstrip(None)`: a name's trailing space),
# __mutmut_23 (`rstrip("XX/XX")`: a name's trailing X): the claim marker was not
# taken for the snapshot's own, so it stayed, and with it the directory.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
@pytest.mark.parametrize("name", ["sp-X", "sp "], ids=["trailing-x", "trailing-space"])
def test_a_subsumed_claimed_savepoint_goes_whole_whatever_its_name_ends_with(
    small_jobs: Jobs, tmp_path: Path, name: str
) -> None:
    directory = tmp_path / "savepoints" / name
    savepoint(small_jobs, directory)
    claimed = small_jobs.restore(str(directory), RestoreMode.CLAIM)
    assert any(n.startswith(CLAIM_MARKER) for n in names(directory))
    checkpoint(claimed)
    assert not directory.exists()
    assert claimed.refused_deletions == []


# _delete_snapshot_files__mutmut_37 (`... or not list_dir(parent)`), __mutmut_38
# (`startswith(directory) or ...`): a directory still holding files its
# document does not list was deleted with them.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_subsumed_claimed_savepoint_leaves_the_files_it_does_not_list(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    savepoint(small_jobs, directory)
    (directory / "notes.txt").write_text("the user's")
    claimed = small_jobs.restore(str(directory), RestoreMode.CLAIM)
    checkpoint(claimed)
    assert names(directory) == ["notes.txt"]


# _delete_snapshot_files__mutmut_18 (`parent == directory or marker`): every
# claimed file directly in the snapshot's directory went with it -- here the
# shared SSTs a retained checkpoint still uses. A checkpoint's shared files lie
# in its directory when that directory is ``<root>/<job>/shared`` itself.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_subsumed_claimed_checkpoint_never_deletes_shared_files_still_in_use(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    rocks_checkpoint(small_jobs, "root", "first")
    directory = tmp_path / "root" / "first" / "shared"
    shutil.copytree(tmp_path / "root" / "first" / "chk-1", directory, dirs_exist_ok=True)
    backend = small_jobs.rocks()
    claimed = small_jobs.restore(
        str(directory), RestoreMode.CLAIM, backend, root="root", job_id="second"
    )
    filesystem = claimed.storage.filesystem
    [snapshot] = claimed.completed_checkpoints
    shared = snapshot.shared_paths(filesystem)
    assert shared and all(filesystem.parent(p) == str(directory) for p in shared)
    contents = dump(backend)
    checkpoint(claimed)  # builds on those SSTs, and subsumes the claimed checkpoint
    reusing = claimed.latest_checkpoint
    assert reusing is not None and set(shared) <= set(reusing.shared_paths(filesystem))
    assert all(Path(p).exists() for p in shared)
    assert not (directory / METADATA_FILE).exists()
    assert not any(n.startswith(CLAIM_MARKER) for n in names(directory))
    fresh = small_jobs.rocks()
    recovered = small_jobs.recover(fresh, root="root", job_id="second")
    assert recovered.recovery is not None
    assert recovered.recovery.restored_from == reusing.directory
    assert recovered.recovery.skipped == []
    assert dump(fresh) == contents


# _retain__mutmut_12, 13 (a retained checkpoint's disowned files joined with
# nothing or without their path: the registry did not know them as not
# owned): a job that CLAIMs a checkpoint built on a LEGACY snapshot's files
# deleted those files -- another job's -- once it no longer used them.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_claimed_checkpoints_legacy_files_are_never_deleted_by_its_new_owner(
    small_jobs: Jobs, tmp_path: Path
) -> None:
    rocks_checkpoint(small_jobs, "root", "first")
    first = str(tmp_path / "root" / "first" / "chk-1")
    legacy_job = small_jobs.restore(
        first, RestoreMode.LEGACY, small_jobs.rocks(), root="root", job_id="b"
    )
    built_on = checkpoint(legacy_job)  # builds on the first job's SSTs
    assert built_on.disowned
    legacy = [f"{tmp_path}/root/{p}" for p in built_on.disowned]
    second = str(tmp_path / "root" / "b" / f"chk-{built_on.checkpoint_id}")
    claiming = small_jobs.restore(
        second, RestoreMode.CLAIM, small_jobs.rocks(), root="root", job_id="c"
    )
    claiming.force_full = True
    checkpoint(claiming)  # subsumes the claimed checkpoint, uses none of its files
    assert not Path(second).exists()
    assert all(Path(p).exists() for p in legacy)
    assert claiming.refused_deletions == []


# ------------------------------------------------------------ formats, inspect


@pytest.mark.parametrize(
    ("source_factory", "target_factory"),
    [(heap, rocksdb), (rocksdb, heap)],
    ids=["heap-to-rocksdb", "rocksdb-to-heap"],
)
def test_canonical_savepoints_switch_backends_and_native_ones_are_refused(
    jobs: Any, tmp_path: Path, source_factory: Factory, target_factory: Factory
) -> None:
    old = jobs("old", source_factory, parallelism=2)
    old.put(range(150), "a")
    canonical, native = str(tmp_path / "canonical"), str(tmp_path / "native")
    old.coordinator.trigger_savepoint(canonical, "canonical")
    old.coordinator.trigger_savepoint(native, "native")
    for parallelism in (1, 3):
        new = jobs(
            f"new-{parallelism}",
            target_factory,
            parallelism=parallelism,
            restore=(canonical, RestoreMode.NO_CLAIM),
        )
        assert new.contents() == old.contents()
    target = jobs("refusing", target_factory, parallelism=1)
    target.put(range(3), "mine")
    before = target.contents()
    with pytest.raises(IncompatibleSnapshotError, match="canonical savepoint"):
        CheckpointCoordinator.restore(
            CheckpointStorage(str(tmp_path / "root"), "other"),
            target.backends,
            native,
            RestoreMode.NO_CLAIM,
        )
    assert target.contents() == before


@BOTH
def test_savepoints_are_relocatable(jobs: Any, factory: Factory, tmp_path: Path) -> None:
    """SavepointFormatITCase: move the directory, resume in CLAIM mode from there."""
    old = jobs("old", factory)
    old.put(range(80), "a")
    for savepoint_format in ("native", "canonical"):
        sp = tmp_path / f"sp-{savepoint_format}"
        old.coordinator.trigger_savepoint(str(sp), savepoint_format)
        moved = tmp_path / "elsewhere" / f"sp-{savepoint_format}"
        moved.parent.mkdir(exist_ok=True)
        shutil.move(str(sp), str(moved))
        new = jobs(f"new-{savepoint_format}", factory, restore=(str(moved), RestoreMode.CLAIM))
        assert new.contents() == old.contents()


def test_inspect_command_prints_what_a_snapshot_holds(jobs: Any, tmp_path: Path) -> None:
    job = jobs("job", rocksdb)
    job.put(range(50), "a")
    metadata = job.checkpoint()
    directory = job.storage.checkpoint_dir(metadata.checkpoint_id)
    report = format_report(inspect_snapshot(directory))
    assert f"checkpoint {metadata.checkpoint_id} of job 'job'" in report
    assert "rocksdb/rocksdb-native" in report and "key groups 0..7" in report
    assert "value (value, cowstate-value)" in report and "files: all present" in report
    out = io.StringIO()
    with redirect_stdout(out):
        assert cowstate_main(["savepoint", "inspect", directory]) == 0
    assert out.getvalue().strip() == report
    (tmp_path / "root" / next(iter(shared(metadata)))).unlink()
    with redirect_stdout(io.StringIO()):
        assert cowstate_main(["savepoint", "inspect", directory]) == 1
    assert "[MISSING]" in format_report(inspect_snapshot(directory))
    assert cowstate_main(["savepoint", "inspect", str(tmp_path / "nothing")]) == 2


def test_inspect_shows_a_heap_checkpoints_chain(jobs: Any) -> None:
    job = jobs("job", heap_incremental, parallelism=1, num_retained=3)
    job.put(range(300), "a")
    first = job.checkpoint()
    job.put(range(3), "b")
    job.checkpoint()
    job.put(range(3, 6), "c")
    third = job.checkpoint()
    handle = third.subtasks[0]
    report = format_report(inspect_snapshot(job.storage.checkpoint_dir(third.checkpoint_id)))
    sizes = [f.size for f in handle.files]
    assert handle.files[0] == first.subtasks[0].files[0]
    lines = report.splitlines()
    chain = next(line.strip() for line in lines if "chain:" in line)
    deltas = sum(sizes[1:])
    assert chain == f"chain: base {_kib(sizes[0])}, 2 delta(s) {_kib(deltas)}"
    roles = [line.rsplit("(", 1)[1].rstrip(")") for line in lines if "/shared/" in line]
    assert roles == [
        "base",
        "delta 1 changes",
        "delta 1 removals",
        "delta 2 changes",
        "delta 2 removals",
    ]
    plain = format_report(inspect_snapshot(job.storage.checkpoint_dir(first.checkpoint_id)))
    assert "chain:" not in plain and "(base)" not in plain  # a full one is one file


def _kib(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB"


@BOTH
def test_recovery_finishes_subsuming_a_claimed_snapshot(tmp_path: Path, factory: Factory) -> None:
    """A crash after the first own checkpoint's _metadata, while the CLAIMed
    snapshot it subsumes is being deleted: recovery deletes the rest of it."""
    old = Job(tmp_path / "root", "old", factory)
    old.put(range(60), "a")
    old.checkpoint()
    source = old.coordinator.latest_checkpoint
    assert source is not None
    old.close()
    crashed = False

    def crash_at_its_deletion(operation: str, path: str, data: bytes | None) -> None:
        nonlocal crashed
        if crashed or (operation == "delete" and path.startswith(source.directory)):
            crashed = True
            raise Crash(path)

    new = Job(
        tmp_path / "root",
        "new",
        factory,
        restore=(source.directory, RestoreMode.CLAIM),
        filesystem=FileSystem(hooks=crash_at_its_deletion),
    )
    new.put(range(10), "b")
    moment = new.contents()
    with pytest.raises(Exception) as error:
        new.checkpoint()
    assert any(isinstance(e, Crash) for e in _chain(error.value))
    assert Path(source.directory, METADATA_FILE).exists()  # the crash kept it
    for backend in new.backends:
        backend.close()
    recovered = Job(tmp_path / "root", "new", factory, recover=True)
    assert not Path(source.directory).exists()
    assert [c.directory for c in recovered.coordinator.completed_checkpoints] == [
        recovered.storage.checkpoint_dir(2)
    ]
    assert recovered.contents() == moment
    recovered.close()


# ------------------------------- rule 9 and recovery: defaults, all or nothing


# recover__mutmut_1 (num_retained 2), __mutmut_2 (timeout 601),
# __mutmut_7 (timeout None), __mutmut_11 (the timeout not passed on).
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_recover_keeps_one_checkpoint_and_waits_600_s_unless_told_otherwise(
    small_jobs: Jobs,
) -> None:
    coordinator = small_jobs.new()
    checkpoint(coordinator)
    checkpoint(coordinator)
    default = small_jobs.recover()
    assert (default.num_retained, default.timeout) == (1, 600.0)
    assert [c.checkpoint_id for c in default.completed_checkpoints] == [2]
    chosen = small_jobs.recover(num_retained=3, timeout=5.0)
    assert (chosen.num_retained, chosen.timeout) == (3, 5.0)
