"""Tests that kill mutants of the ``checkpoint`` mutation scope (``make mutate
SCOPE=checkpoint``) in its coordinator module, ``cowstate.checkpoint.coordinator``,
that the scope's other killer tests let through or never reach.

Each test is named after what it pins; the mutants it was written for are
named in its comment. They run real coordinators over real storage in
``tmp_path`` (heap and RocksDB subtasks of :mod:`restore_support`, one subtask
owning every key group), inject failures and stuck writers through the file
system's test hooks, and are part of the normal suite.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from jobs_support import Crash, Jobs
from restore_support import FULL, MAX_P, SER, VALUE, dump, fill, group_of, heap

from cowstate.checkpoint.coordinator import (
    SAVEPOINT_MARKER,
    CheckpointCoordinator,
    _restore_backends,
)
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import (
    METADATA_FILE,
    CheckpointMetadata,
    FileHandle,
    KeyedStateHandle,
    RestoreMode,
    SnapshotOptions,
)
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.checkpoint.storage import CLAIM_MARKER, RestoreRecord
from cowstate.errors import (
    CheckpointError,
    CorruptCheckpointError,
    InvalidArgumentError,
    KeyGroupMismatchError,
    MaxParallelismMismatchError,
    UnknownCheckpointError,
    UnsafePathError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import KeyGroupRange

#: Until these tests move beside the tests of what they pin.
pytestmark = [
    pytest.mark.kills(module="cowstate.checkpoint.coordinator"),
]

#: A subtask of these tests.


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    made = Jobs(tmp_path)
    try:
        yield made
    finally:
        made.close()


def checkpoint(coordinator: CheckpointCoordinator) -> CheckpointMetadata:
    return coordinator.complete_checkpoint(coordinator.trigger_checkpoint()).metadata


def savepoint(jobs: Jobs, directory: Path, *, checkpoints: int = 0) -> CheckpointMetadata:
    """A savepoint of 20 keys into ``directory``, taken by a job of its own after
    ``checkpoints`` checkpoints (so its id is ``checkpoints + 1``)."""
    backend = jobs.heap()
    fill(backend, range(20))
    coordinator = jobs.new(backend, "source-root", "source")
    for _ in range(checkpoints):
        checkpoint(coordinator)
    return coordinator.trigger_savepoint(str(directory))


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ----------------------------------------------------- coordinator: checkpoints


# _pending_checkpoint__mutmut_5 (`sorted(...) and 'none'`), __mutmut_7
# ('XXnoneXX'), __mutmut_8 ('NONE'); the message abort_checkpoint had its own
# copy of (abort_checkpoint__mutmut_6, 7, 9).
@pytest.mark.parametrize(
    "step", ["abort_checkpoint", "acknowledge", "complete_checkpoint", "pending_location"]
)
def test_a_step_on_an_unknown_checkpoint_names_the_pending_ids(jobs: Jobs, step: str) -> None:
    coordinator = jobs.new()
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
def test_a_coordinator_refuses_its_subtasks_naming_what_is_wrong(jobs: Jobs) -> None:
    storage = jobs.storage()
    low, high = KeyGroupRange(0, MAX_P // 2 - 1), KeyGroupRange(MAX_P // 2, MAX_P - 1)
    other = HeapKeyedStateBackend(high, MAX_P * 2, key_serializer=SER, namespace_serializer=SER)
    refused: list[tuple[list[Any], str]] = [
        ([], "expected at least one backend (subtask), got none"),
        ([object()], "expected backends with snapshot_to/restore_from, got object"),
        (
            [jobs.heap(), other],
            f"expected one max parallelism for every subtask, got [{MAX_P}, {MAX_P * 2}]",
        ),
        (
            [heap(low)],
            f"expected the subtasks' key-group ranges to cover all {MAX_P} key groups (a "
            f"job's subtasks own every key group), got {MAX_P // 2}: [{low!r}]",
        ),
    ]
    for backends, message in refused:
        with pytest.raises(InvalidArgumentError) as caught:
            CheckpointCoordinator(storage, backends)
        assert str(caught.value) == message
    other.close()


# trigger_checkpoint__mutmut_2 (message None), __mutmut_3 (`type(None).__name__`).
def test_a_checkpoint_whose_counter_cannot_be_written_names_the_cause(jobs: Jobs) -> None:
    armed = threading.Event()

    def full_disk(operation: str, path: str, data: Any) -> None:
        if armed.is_set() and operation == "write" and path.endswith("/_counter"):
            raise OSError("no space left on device")

    coordinator = jobs.new(hooks=full_disk)
    checkpoint(coordinator)
    armed.set()
    with pytest.raises(CheckpointError) as caught:
        coordinator.trigger_checkpoint()
    assert str(caught.value) == (
        "expected to trigger a checkpoint, got OSError: no space left on device"
    )
    assert coordinator.pending_checkpoints == []


class _Refusing(HeapKeyedStateBackend):
    """A heap subtask that refuses to start a snapshot."""

    def snapshot_to(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        raise CheckpointError("the subtask is shutting down")


# trigger_checkpoint__mutmut_30 (`abort_checkpoint(None)`: UnknownCheckpointError
# instead), __mutmut_31 (message None), __mutmut_32 (`type(None).__name__`).
def test_a_checkpoint_a_subtask_refuses_to_start_is_aborted_and_names_the_cause(
    jobs: Jobs,
) -> None:
    backend = _Refusing(KeyGroupRange(0, MAX_P - 1), MAX_P, key_serializer=SER)
    try:
        coordinator = jobs.new(backend)
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
    """A heap subtask whose snapshot is cancelled before it runs (its writer
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
def test_a_checkpoint_whose_subtask_was_cancelled_fails_naming_the_subtask(
    jobs: Jobs,
) -> None:
    backend = _Cancelled(KeyGroupRange(0, MAX_P - 1), MAX_P, key_serializer=SER)
    try:
        coordinator = jobs.new(backend)
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
def test_a_checkpoint_two_subtasks_fail_names_the_first_failure(jobs: Jobs) -> None:
    def broken_disks(operation: str, path: str, data: Any) -> None:
        if operation == "write" and "/keyed-state-0-7" in path:
            raise OSError("disk 0 failed")
        if operation == "write" and "/keyed-state-8-15" in path:
            raise OSError("disk 1 failed")

    low = heap(KeyGroupRange(0, 7))
    high = heap(KeyGroupRange(8, 15))
    try:
        fill(low, [k for k in range(40) if group_of(k) <= 7])
        fill(high, [k for k in range(40) if group_of(k) >= 8])
        storage = jobs.storage(hooks=broken_disks)
        coordinator = jobs.keep(CheckpointCoordinator(storage, [high, low]))
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


# __repr____mutmut_1: no killer test printed a coordinator.
def test_a_coordinator_shows_its_job_its_retained_and_its_pending_checkpoints(
    jobs: Jobs,
) -> None:
    coordinator = jobs.new()
    checkpoint(coordinator)
    pending = coordinator.trigger_checkpoint()
    assert repr(coordinator) == (
        f"<CheckpointCoordinator {coordinator.storage.job_dir!r} retained [1] pending [{pending}]>"
    )
    coordinator.complete_checkpoint(pending)


# ------------------------------------------------------ coordinator: savepoints


# trigger_savepoint__mutmut_8: the message was None.
def test_a_savepoint_of_an_unknown_format_names_both_formats(jobs: Jobs, tmp_path: Path) -> None:
    coordinator = jobs.new()
    with pytest.raises(InvalidArgumentError) as caught:
        coordinator.trigger_savepoint(str(tmp_path / "sp"), "binary")  # type: ignore[arg-type]
    assert str(caught.value) == (
        "expected a savepoint format 'canonical' or 'native', got 'binary'"
    )


# trigger_savepoint__mutmut_27 (the id None), __mutmut_28 (`_last_id - 1`),
# __mutmut_29 (`_last_id + 2`): the id the error names when no id could be
# handed out (the counter cannot be written); __mutmut_92, __mutmut_93: the message.
def test_a_savepoint_whose_counter_cannot_be_written_names_the_next_id(
    jobs: Jobs, tmp_path: Path
) -> None:
    armed = threading.Event()

    def full_disk(operation: str, path: str, data: Any) -> None:
        if armed.is_set() and operation == "write" and path.endswith("/_counter"):
            raise OSError("no space left on device")

    coordinator = jobs.new(hooks=full_disk)
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
def test_an_interrupted_savepoint_leaves_an_empty_marker_named_by_its_intent(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"

    def crash_at_the_metadata(operation: str, path: str, data: Any) -> None:
        if operation == "write" and path == f"{directory}/{METADATA_FILE}":
            raise Crash(path)

    coordinator = jobs.new(hooks=crash_at_the_metadata)
    with pytest.raises(Crash):
        coordinator.trigger_savepoint(str(directory))
    intent = coordinator.storage.read_savepoint_intent()
    assert intent is not None and intent.directory == str(directory)
    marker = directory / (SAVEPOINT_MARKER + intent.token)
    assert marker.read_bytes() == b""
    recovered = jobs.recover()
    assert recovered.recovery is not None
    assert recovered.recovery.removed_savepoint == str(directory)
    assert not directory.exists()


# _remove_if_empty__mutmut_3 (`exists and list_files`): the empty directory of
# a failed savepoint stayed.
def test_a_failed_savepoint_removes_the_directory_it_made_and_its_intent(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "savepoints" / "sp"

    def refuse_the_metadata(operation: str, path: str, data: Any) -> None:
        if operation == "write" and path == f"{directory}/{METADATA_FILE}":
            raise OSError("read-only file system")

    coordinator = jobs.new(hooks=refuse_the_metadata)
    with pytest.raises(CheckpointError, match="got OSError: read-only file system"):
        coordinator.trigger_savepoint(str(directory))
    assert not directory.exists()
    assert (tmp_path / "savepoints").exists()
    assert coordinator.storage.read_savepoint_intent() is None


# _remove_if_empty__mutmut_1 (`exists or ...`): removed the directory with a
# file another writer had put there meanwhile.
def test_a_failed_savepoint_never_deletes_a_file_it_did_not_write(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"

    def another_writer_then_failure(operation: str, path: str, data: Any) -> None:
        if operation == "write" and path == f"{directory}/{METADATA_FILE}":
            (directory / "theirs.txt").write_text("not the savepoint's")
            raise OSError("read-only file system")

    coordinator = jobs.new(hooks=another_writer_then_failure)
    with pytest.raises(CheckpointError, match="what it wrote was deleted"):
        coordinator.trigger_savepoint(str(directory))
    assert names(directory) == ["theirs.txt"]


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
    """A heap subtask of 20 keys whose writer stops where ``blocked`` says."""
    executor = _StartedExecutor(blocked)
    backend = HeapKeyedStateBackend(
        KeyGroupRange(0, MAX_P - 1),
        MAX_P,
        key_serializer=SER,
        namespace_serializer=SER,
        executor=executor,
    )
    backend.get_state(VALUE)
    fill(backend, range(20))
    return backend, executor


# trigger_savepoint__mutmut_50/52 (no timeout: waited for the stuck writer),
# __mutmut_55 (the timeouts swapped: None), __mutmut_56 (TimeoutError(None)),
# __mutmut_85 (the cleanup waited for the writer without a timeout),
# __mutmut_92 (message None), __mutmut_93 (`type(None).__name__`).
def test_a_savepoint_times_out_on_a_stuck_subtask_and_leaves_its_writer_alone(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    blocked = _Blocked(directory)
    backend, executor = _stuck_backend(blocked)
    try:
        coordinator = jobs.new(backend, hooks=blocked.hook, timeout=0.05)
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


# abort_checkpoint__mutmut_12 (`timeout=None`), __mutmut_14 (no timeout): the
# abort waited for a stuck writer instead of at most the coordinator's timeout.
def test_aborting_a_checkpoint_waits_for_a_stuck_subtask_at_most_the_timeout(
    jobs: Jobs, tmp_path: Path
) -> None:
    blocked = _Blocked(tmp_path / "root" / "job" / "chk-1")
    backend, executor = _stuck_backend(blocked)
    try:
        coordinator = jobs.new(backend, hooks=blocked.hook, timeout=0.05)
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
def test_a_checkpoint_waits_for_a_stuck_subtask_at_most_the_coordinators_timeout(
    jobs: Jobs, tmp_path: Path
) -> None:
    blocked = _Blocked(tmp_path / "root" / "job" / "chk-1")
    backend, executor = _stuck_backend(blocked)
    try:
        coordinator = jobs.new(backend, hooks=blocked.hook, timeout=0.05)
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
@pytest.mark.parametrize("step", ["acknowledge", "complete_checkpoint"])
def test_a_timeout_given_to_a_checkpoint_step_overrides_the_coordinators(
    jobs: Jobs, tmp_path: Path, step: str
) -> None:
    blocked = _Blocked(tmp_path / "root" / "job" / "chk-1")
    backend, executor = _stuck_backend(blocked)
    _released_on_cancel(blocked, backend)
    try:
        coordinator = jobs.new(backend, hooks=blocked.hook, timeout=60.0)
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


class _Noticed(HeapKeyedStateBackend):
    """A heap subtask that records the completion notices it gets."""

    def __init__(self) -> None:
        super().__init__(
            KeyGroupRange(0, MAX_P - 1), MAX_P, key_serializer=SER, namespace_serializer=SER
        )
        self.get_state(VALUE)
        self.completed: list[int] = []

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed.append(checkpoint_id)
        super().notify_checkpoint_complete(checkpoint_id)


# trigger_savepoint__mutmut_96: the notice after a savepoint named None (rule 3:
# the backends hear of the savepoint's id, and ignore it).
def test_every_subtask_hears_of_a_completed_savepoint_by_its_id(jobs: Jobs, tmp_path: Path) -> None:
    backend = _Noticed()
    coordinator = jobs.new(backend)
    try:
        checkpoint(coordinator)
        metadata = coordinator.trigger_savepoint(str(tmp_path / "sp"))
        assert metadata.checkpoint_id == 2
        assert backend.completed == [1, 2]
    finally:
        backend.close()


# delete_savepoint__mutmut_10: the message was None.
def test_deleting_a_checkpoint_as_a_savepoint_is_refused_naming_it(jobs: Jobs) -> None:
    coordinator = jobs.new()
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
def test_a_claimed_savepoint_is_not_deleted_as_a_savepoint_however_it_is_named(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "savepoints" / "sp-X"
    savepoint(jobs, directory)
    coordinator = jobs.restore(str(directory), RestoreMode.CLAIM)
    named = f"{directory}/"
    with pytest.raises(InvalidArgumentError) as caught:
        coordinator.delete_savepoint(named)
    assert str(caught.value) == (
        f"expected a savepoint the job does not own, {named!r} was restored in CLAIM mode "
        "and is retained as a checkpoint"
    )
    assert (directory / METADATA_FILE).exists()


# delete_savepoint__mutmut_26: the message was None.
def test_deleting_a_savepoint_inside_what_the_job_owns_is_refused(
    jobs: Jobs, tmp_path: Path
) -> None:
    coordinator = jobs.new()
    source = tmp_path / "sp"
    savepoint(jobs, source)
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
def test_a_savepoint_on_another_file_system_is_deleted(jobs: Jobs) -> None:
    root = f"memory://cowstate-coordinator-{uuid.uuid4().hex}"
    directory = f"{root}/savepoints/sp"
    filesystem = FileSystem()
    try:
        backend = jobs.heap()
        fill(backend, range(20))
        coordinator = jobs.new(backend)
        coordinator.trigger_savepoint(directory)
        assert filesystem.exists(f"{directory}/{METADATA_FILE}")
        coordinator.delete_savepoint(directory)
        assert not filesystem.exists(directory)
    finally:
        filesystem.delete_dir(root)


# --------------------------------------------------------- coordinator: restore


# restore__mutmut_1 (num_retained 2), __mutmut_2 (timeout 601),
# __mutmut_9 (timeout None), __mutmut_13 (the timeout not passed on).
def test_restore_keeps_one_checkpoint_and_waits_600_s_unless_told_otherwise(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    savepoint(jobs, directory)
    default = jobs.restore(str(directory), RestoreMode.NO_CLAIM)
    assert (default.num_retained, default.timeout) == (1, 600.0)
    checkpoint(default)
    checkpoint(default)
    assert [c.checkpoint_id for c in default.completed_checkpoints] == [3]
    chosen = jobs.restore(
        str(directory), RestoreMode.NO_CLAIM, root="chosen", num_retained=3, timeout=5.0
    )
    assert (chosen.num_retained, chosen.timeout) == (3, 5.0)


# restore__mutmut_4: the message was None.
def test_restore_in_an_unknown_mode_names_the_modes(jobs: Jobs, tmp_path: Path) -> None:
    directory = tmp_path / "sp"
    savepoint(jobs, directory)
    with pytest.raises(InvalidArgumentError) as caught:
        jobs.restore(str(directory), "CLAIM")  # type: ignore[arg-type]
    assert str(caught.value) == "expected a RestoreMode (CLAIM, NO_CLAIM, LEGACY), got 'CLAIM'"


# restore__mutmut_22, __mutmut_23: the end of the message changed.
def test_restore_into_a_job_directory_with_checkpoints_says_what_to_do(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    savepoint(jobs, directory)
    checkpoint(jobs.new(root="restored"))
    job_dir = str(tmp_path / "restored" / "job")
    with pytest.raises(InvalidArgumentError) as caught:
        jobs.restore(str(directory), RestoreMode.NO_CLAIM)
    assert str(caught.value) == (
        f"expected a new job directory to restore into, {job_dir!r} already holds "
        "checkpoints of a job: recover() it, or use another job id"
    )


# restore__mutmut_35 (`rstrip(None)`), __mutmut_37 (`rstrip("XX/XX")`): the
# record named the directory with its trailing slash, or without its trailing X.
def test_restore_records_the_directory_without_its_trailing_slash(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "savepoints" / "sp-X"
    savepoint(jobs, directory)
    coordinator = jobs.restore(f"{directory}/", RestoreMode.NO_CLAIM)
    assert coordinator.restored_from is not None
    assert coordinator.restored_from.directory == str(directory)
    assert coordinator.storage.read_restore_record() == coordinator.restored_from


# restore__mutmut_39: NO_CLAIM and LEGACY records carried a token too.
@pytest.mark.parametrize("mode", [RestoreMode.NO_CLAIM, RestoreMode.LEGACY])
def test_only_a_claim_carries_a_token(jobs: Jobs, tmp_path: Path, mode: RestoreMode) -> None:
    directory = tmp_path / "sp"
    savepoint(jobs, directory)
    coordinator = jobs.restore(str(directory), mode)
    assert coordinator.restored_from is not None
    assert coordinator.restored_from.token == ""
    assert not any(name.startswith(CLAIM_MARKER) for name in names(directory))


# restore__mutmut_53: the claim marker held b"XXXX";
# _adopt__mutmut_25: the claimed snapshot was retained under the id None.
def test_a_claim_retains_the_snapshot_under_its_id_and_leaves_an_empty_marker(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    metadata = savepoint(jobs, directory, checkpoints=2)
    coordinator = jobs.restore(str(directory), RestoreMode.CLAIM)
    record = coordinator.restored_from
    assert record is not None and len(record.token) == 32
    assert (directory / (CLAIM_MARKER + record.token)).read_bytes() == b""
    [retained] = coordinator.completed_checkpoints
    assert (retained.checkpoint_id, retained.directory) == (3, str(directory))
    assert retained.metadata == metadata


# restore__mutmut_80: the counter was written as "None".
def test_restore_moves_the_counter_to_the_restored_id(jobs: Jobs, tmp_path: Path) -> None:
    directory = tmp_path / "sp"
    savepoint(jobs, directory, checkpoints=2)
    coordinator = jobs.restore(str(directory), RestoreMode.NO_CLAIM)
    assert Path(coordinator.storage.job_dir, "_counter").read_text() == "3"
    assert coordinator.storage.read_counter() == 3
    assert checkpoint(coordinator).checkpoint_id == 4


# restore__mutmut_59 (`delete(None)`): a CLAIM whose restore failed kept its
# marker (or failed with another error than the restore's).
def test_a_claim_whose_restore_fails_removes_its_marker_and_writes_nothing(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    savepoint(jobs, directory)
    data = directory / "keyed-state-0-15"
    corrupt = bytearray(data.read_bytes())
    corrupt[len(corrupt) // 2] ^= 0xFF
    data.write_bytes(bytes(corrupt))
    before = names(directory)
    with pytest.raises(CorruptCheckpointError):
        jobs.restore(str(directory), RestoreMode.CLAIM)
    assert names(directory) == before
    assert not (tmp_path / "restored" / "job").exists()


# ------------------------------------------- coordinator: claims and deletion


def rocks_checkpoint(jobs: Jobs, root: str, job_id: str) -> CheckpointMetadata:
    """A RocksDB checkpoint of 20 keys (shared SST files) of its own job."""
    backend = jobs.rocks()
    fill(backend, range(20))
    return checkpoint(jobs.new(backend, root, job_id))


# _delete__mutmut_3 (`path in claimed or claim_holds`): deleted the files of a
# claim another job has revoked since; _delete__mutmut_6: the refusals named None.
def test_a_revoked_claim_refuses_every_deletion_and_names_each_path(
    jobs: Jobs, tmp_path: Path
) -> None:
    rocks_checkpoint(jobs, "first-root", "first")
    directory = str(tmp_path / "first-root" / "first" / "chk-1")
    claimed = jobs.restore(directory, RestoreMode.CLAIM, jobs.rocks(), root="claims")
    jobs.restore(directory, RestoreMode.CLAIM, jobs.rocks(), root="claims-later")
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
def test_shared_files_of_a_settled_claim_are_deleted_once_no_checkpoint_uses_them(
    jobs: Jobs, tmp_path: Path
) -> None:
    rocks_checkpoint(jobs, "root", "first")
    directory = str(tmp_path / "root" / "first" / "chk-1")
    backend = jobs.rocks()
    claimed = jobs.restore(directory, RestoreMode.CLAIM, backend, root="root", job_id="second")
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
def test_a_no_claim_record_never_claims_even_with_a_token_and_its_marker(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    metadata = savepoint(jobs, directory)
    token = "ab" * 16
    (directory / (CLAIM_MARKER + token)).write_bytes(b"")
    before = names(directory)
    jobs.storage().write_restore_record(
        RestoreRecord(
            directory=str(directory),
            mode=RestoreMode.NO_CLAIM,
            checkpoint_id=metadata.checkpoint_id,
            kind="savepoint",
            token=token,
        )
    )
    recovered = jobs.recover()
    assert recovered.completed_checkpoints == []
    assert recovered.force_full  # NO_CLAIM: the first checkpoint is full
    checkpoint(recovered)
    checkpoint(recovered)
    assert names(directory) == before


# _delete_snapshot_files__mutmut_21 (`rstrip(None)`: a name's trailing space),
# __mutmut_23 (`rstrip("XX/XX")`: a name's trailing X): the claim marker was not
# taken for the snapshot's own, so it stayed, and with it the directory.
@pytest.mark.parametrize("name", ["sp-X", "sp "], ids=["trailing-x", "trailing-space"])
def test_a_subsumed_claimed_savepoint_goes_whole_whatever_its_name_ends_with(
    jobs: Jobs, tmp_path: Path, name: str
) -> None:
    directory = tmp_path / "savepoints" / name
    savepoint(jobs, directory)
    claimed = jobs.restore(str(directory), RestoreMode.CLAIM)
    assert any(n.startswith(CLAIM_MARKER) for n in names(directory))
    checkpoint(claimed)
    assert not directory.exists()
    assert claimed.refused_deletions == []


# _delete_snapshot_files__mutmut_37 (`... or not list_dir(parent)`), __mutmut_38
# (`startswith(directory) or ...`): a directory still holding files its
# document does not list was deleted with them.
def test_a_subsumed_claimed_savepoint_leaves_the_files_it_does_not_list(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    savepoint(jobs, directory)
    (directory / "notes.txt").write_text("the user's")
    claimed = jobs.restore(str(directory), RestoreMode.CLAIM)
    checkpoint(claimed)
    assert names(directory) == ["notes.txt"]


# _delete_snapshot_files__mutmut_18 (`parent == directory or marker`): every
# claimed file directly in the snapshot's directory went with it -- here the
# shared SSTs a retained checkpoint still uses. A checkpoint's shared files lie
# in its directory when that directory is ``<root>/<job>/shared`` itself.
def test_a_subsumed_claimed_checkpoint_never_deletes_shared_files_still_in_use(
    jobs: Jobs, tmp_path: Path
) -> None:
    rocks_checkpoint(jobs, "root", "first")
    directory = tmp_path / "root" / "first" / "shared"
    shutil.copytree(tmp_path / "root" / "first" / "chk-1", directory, dirs_exist_ok=True)
    backend = jobs.rocks()
    claimed = jobs.restore(str(directory), RestoreMode.CLAIM, backend, root="root", job_id="second")
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
    fresh = jobs.rocks()
    recovered = jobs.recover(fresh, root="root", job_id="second")
    assert recovered.recovery is not None
    assert recovered.recovery.restored_from == reusing.directory
    assert recovered.recovery.skipped == []
    assert dump(fresh) == contents


# _restore_from__mutmut_7 (`kind == "checkpoint" or same root`): a checkpoint
# under another storage root was built on, and the new job's checkpoint named
# SSTs that do not exist under its own root.
@pytest.mark.parametrize("mode", [RestoreMode.CLAIM, RestoreMode.LEGACY])
def test_a_checkpoint_of_another_storage_root_is_never_built_on(
    jobs: Jobs, tmp_path: Path, mode: RestoreMode
) -> None:
    rocks_checkpoint(jobs, "first-root", "first")
    directory = str(tmp_path / "first-root" / "first" / "chk-1")
    restored = jobs.restore(directory, mode, jobs.rocks(), root="other-root")
    checkpoint(restored)
    latest = restored.latest_checkpoint
    assert latest is not None
    shared = latest.shared_paths(restored.storage.filesystem)
    assert shared and all(p.startswith(f"{restored.storage.shared_dir}/") for p in shared)
    assert all(Path(p).exists() for p in shared)
    assert latest.metadata.disowned == ()


# _check_max_parallelism__mutmut_2: the message was None.
def test_a_snapshot_of_another_max_parallelism_is_refused_naming_both(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = tmp_path / "sp"
    savepoint(jobs, directory)
    wider = HeapKeyedStateBackend(KeyGroupRange(0, 31), 32)
    try:
        with pytest.raises(MaxParallelismMismatchError) as caught:
            jobs.restore(str(directory), RestoreMode.NO_CLAIM, wider)
        assert str(caught.value) == (
            "expected a snapshot of max parallelism 32, got one of 16: the number of key "
            "groups cannot change"
        )
    finally:
        wider.close()


# --------------------------------------------------------- coordinator: recover


# recover__mutmut_1 (num_retained 2), __mutmut_2 (timeout 601),
# __mutmut_7 (timeout None), __mutmut_11 (the timeout not passed on).
def test_recover_keeps_one_checkpoint_and_waits_600_s_unless_told_otherwise(
    jobs: Jobs,
) -> None:
    coordinator = jobs.new()
    checkpoint(coordinator)
    checkpoint(coordinator)
    default = jobs.recover()
    assert (default.num_retained, default.timeout) == (1, 600.0)
    assert [c.checkpoint_id for c in default.completed_checkpoints] == [2]
    chosen = jobs.recover(num_retained=3, timeout=5.0)
    assert (chosen.num_retained, chosen.timeout) == (3, 5.0)


# _restore_backends__mutmut_21 (`suppress(None)`: a failing discard became a
# TypeError): the first error is the one reported, and every prepared restore
# is discarded.
def test_a_discard_that_fails_does_not_hide_the_error_or_stop_the_other_discards() -> None:
    log: list[str] = []

    class Staged:
        def __init__(self, name: str) -> None:
            self.name = name

        def commit(self) -> None:
            log.append(f"commit {self.name}")

        def discard(self) -> None:
            log.append(f"discard {self.name}")
            if self.name == "0":
                raise OSError("the staging directory is gone")

    class Backend:
        def __init__(self, name: str, fail: bool) -> None:
            self.name, self.fail = name, fail
            self.key_group_range = KeyGroupRange(0, MAX_P - 1)

        def prepare_restore(self, *args: Any, **kwargs: Any) -> Staged:
            if self.fail:
                raise KeyGroupMismatchError("expected ..., got a broken file")
            return Staged(self.name)

    metadata = SimpleNamespace(subtasks=())
    source = SnapshotSource(FileSystem(), "/")
    backends = [Backend("0", False), Backend("1", False), Backend("2", True)]
    with pytest.raises(KeyGroupMismatchError, match="got a broken file"):
        _restore_backends(backends, metadata, source, incremental_base=False)  # type: ignore[arg-type]
    assert log == ["discard 0", "discard 1"]


# PendingCheckpoint.may_use__mutmut_9 (`reusable | named`: an acknowledged
# pending checkpoint kept every retained file, not just those it names),
# _release_deferred__mutmut_7 (`discard(None)`: deleted paths stayed deferred).
def test_an_acknowledged_checkpoint_that_reuses_nothing_keeps_nothing(jobs: Jobs) -> None:
    backend = jobs.rocks()
    fill(backend, range(20))
    coordinator = jobs.new(backend)
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
def test_a_checkpoint_whose_handle_names_an_unconfined_file_is_aborted_naming_why(
    jobs: Jobs, tmp_path: Path
) -> None:
    backend = _Unconfined(FULL, MAX_P, key_serializer=SER, namespace_serializer=SER)
    coordinator = jobs.new(jobs.keep_backend(backend))
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
def test_a_checkpoint_whose_metadata_cannot_be_written_is_aborted_naming_the_cause(
    jobs: Jobs, tmp_path: Path
) -> None:
    def full_disk(operation: str, path: str, data: Any) -> None:
        if METADATA_FILE in path and operation not in ("exists", "read", "delete"):
            raise OSError("No space left on device")

    coordinator = jobs.new(hooks=full_disk)
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


# _settles_claim__mutmut_6 (`return True` for any record but an unsettled
# CLAIM): a NO_CLAIM job's checkpoints said a claim was settled;
# complete_checkpoint__mutmut_72 (`force_full = None`).
def test_a_no_claim_job_never_says_a_claim_is_settled(jobs: Jobs, tmp_path: Path) -> None:
    directory = tmp_path / "sp"
    savepoint(jobs, directory)
    restored = jobs.restore(str(directory), RestoreMode.NO_CLAIM)
    assert restored.force_full is True
    metadata = checkpoint(restored)
    assert metadata.restored_from is not None
    assert metadata.restored_from.mode is RestoreMode.NO_CLAIM
    assert metadata.restored_from.settled is False
    assert restored.force_full is False


# __init__ 2 (timeout 601 s), 4, 5 (the refusal of a storage that is not one),
# 24 (force_full None), 27 (recovery "").
def test_a_new_coordinator_states_its_defaults_and_refuses_a_storage_that_is_not_one(
    jobs: Jobs,
) -> None:
    coordinator = CheckpointCoordinator(jobs.storage(), [jobs.heap()])
    assert coordinator.timeout == 600.0
    assert coordinator.num_retained == 1
    assert coordinator.force_full is False
    assert coordinator.recovery is None
    assert coordinator.deferred == set()
    with pytest.raises(InvalidArgumentError) as caught:
        CheckpointCoordinator("root", [jobs.heap()])  # type: ignore[arg-type]
    assert str(caught.value) == "expected a CheckpointStorage, got str"


# _retain__mutmut_12, 13 (a retained checkpoint's disowned files joined with
# nothing or without their path: the registry did not know them as not
# owned): a job that CLAIMs a checkpoint built on a LEGACY snapshot's files
# deleted those files -- another job's -- once it no longer used them.
def test_a_claimed_checkpoints_legacy_files_are_never_deleted_by_its_new_owner(
    jobs: Jobs, tmp_path: Path
) -> None:
    rocks_checkpoint(jobs, "root", "first")
    first = str(tmp_path / "root" / "first" / "chk-1")
    legacy_job = jobs.restore(first, RestoreMode.LEGACY, jobs.rocks(), root="root", job_id="b")
    built_on = checkpoint(legacy_job)  # builds on the first job's SSTs
    assert built_on.disowned
    legacy = [f"{tmp_path}/root/{p}" for p in built_on.disowned]
    second = str(tmp_path / "root" / "b" / f"chk-{built_on.checkpoint_id}")
    claiming = jobs.restore(second, RestoreMode.CLAIM, jobs.rocks(), root="root", job_id="c")
    claiming.force_full = True
    checkpoint(claiming)  # subsumes the claimed checkpoint, uses none of its files
    assert not Path(second).exists()
    assert all(Path(p).exists() for p in legacy)
    assert claiming.refused_deletions == []
