"""Checkpoint storage and the coordinator: one named test per rule of
``cowstate.checkpoint.coordinator`` (and of the issue), on real files, with
the heap backend and the RocksDB backend.

Rules 1-5 are about files shared between checkpoints, so they run on RocksDB,
whose incremental checkpoints share SST files; the rest run on both.
"""

from __future__ import annotations

import copy
import functools
import io
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options

from cowstate.checkpoint.coordinator import CheckpointCoordinator
from cowstate.checkpoint.filesystem import FileSystem, is_temporary
from cowstate.checkpoint.handles import (
    METADATA_FILE,
    CheckpointMetadata,
    RestoreMode,
    SnapshotOptions,
)
from cowstate.checkpoint.inspect import format_report, inspect_snapshot
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.checkpoint.storage import CheckpointStorage, read_metadata
from cowstate.descriptors import ListStateDescriptor, ValueStateDescriptor
from cowstate.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    IncompatibleSnapshotError,
    InvalidArgumentError,
    MetadataChecksumError,
    UnknownCheckpointError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import (
    KeyGroupRange,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate_spec.cli import main as cowstate_main

MAXP = 16
VALUE: ValueStateDescriptor[Any] = ValueStateDescriptor("value")
LIST = ListStateDescriptor("list")
Factory = Callable[[KeyGroupRange, int], Any]


def heap(key_groups: KeyGroupRange, max_parallelism: int) -> Any:
    return HeapKeyedStateBackend(key_groups, max_parallelism)


def rocksdb(key_groups: KeyGroupRange, max_parallelism: int) -> Any:
    return RocksDBKeyedStateBackend(key_groups, max_parallelism)


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


def test_rule_1_checkpoint_references_only_the_last_confirmed_checkpoint(
    jobs: Any, tmp_path: Path
) -> None:
    job = jobs("job", rocksdb, parallelism=1)
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
        restored_contents(rocksdb, job.storage.checkpoint_dir(fourth.checkpoint_id))
        == job.contents()
    )


@pytest.mark.parametrize("savepoint_format", ["native", "canonical"])
def test_rule_2_a_savepoint_never_changes_the_incremental_base(
    jobs: Any, tmp_path: Path, savepoint_format: str
) -> None:
    """RocksIncrementalSnapshotStrategyTest: checkpoint 1 confirmed, a savepoint,
    checkpoint 3 is still incremental and reuses what it would have without it."""
    with_savepoint = jobs("a", rocksdb, parallelism=1)
    without = jobs("b", rocksdb, parallelism=1)
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


def test_rule_5_subsuming_deletes_exactly_the_unused_shared_files(
    jobs: Any, tmp_path: Path
) -> None:
    job = jobs("job", rocksdb, parallelism=1, num_retained=2)
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
