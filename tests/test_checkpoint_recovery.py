"""Recovery (``cowstate.checkpoint.recovery``, steps R1-R5 of
:meth:`CheckpointCoordinator.recover`): rebuilding a coordinator after a crash
from what is on disk.

- R2, R3: the restore record -- torn, naming what the job owns, naming a
  snapshot the checkpoints do not confirm, on another file system, taken over
  by another job's claim -- is followed only as far as the checkpoints say,
  and every record or checkpoint passed over is reported with its reason;
  with no checkpoint that verifies, recovery stops naming the five newest;
- R5: what recovery keeps -- never a file the snapshot it started from uses,
  the counter past every id handed out (a crash while it is rewritten leaves
  the old one);
- R1: an interrupted savepoint -- its torn intent reported and deleted, its
  directory removed only when it carries the savepoint's own marker and holds
  no snapshot below;
- regressions: a job whose only snapshot is gone is not recovered empty.

They recover real coordinators from real storage in ``tmp_path`` (heap
subtasks of :mod:`restore_support`, RocksDB where shared files matter, one
subtask owning every key group; ``memory://`` for another file system), and
crash them through the file system's test hooks. The recovery rules seen
through whole jobs (falling back past torn metadata, savepoints that are
safe) are in ``test_restore_trust.py``. The tests are marked ``kills``: they
were written to kill mutants of the module (``make mutate SCOPE=checkpoint``),
named in their comments.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs_support import Crash, Hook, Jobs
from restore_support import dump, fill

from cowstate.checkpoint.coordinator import SAVEPOINT_MARKER, CheckpointCoordinator
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import METADATA_FILE, RestoreMode, RestoreRecord
from cowstate.checkpoint.recovery import RecoveryReport, Skipped
from cowstate.checkpoint.storage import SavepointIntent
from cowstate.errors import CorruptCheckpointError
from cowstate.keyed_backend import AbstractKeyedStateBackend


def crash_on(operation: str, matches: Callable[[str, Any], bool]) -> Hook:
    """A hook that crashes the first ``operation`` whose ``(path, data)`` match."""

    def hook(op: str, path: str, data: Any) -> None:
        if op == operation and matches(path, data):
            raise Crash(f"{op} {path}")

    return hook


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    with Jobs(tmp_path, restore_root="root") as made:
        yield made


def checkpoint(coordinator: CheckpointCoordinator) -> int:
    return coordinator.complete_checkpoint(coordinator.trigger_checkpoint()).checkpoint_id


def report_of(coordinator: CheckpointCoordinator) -> RecoveryReport:
    assert coordinator.recovery is not None
    return coordinator.recovery


def contents_of(coordinator: CheckpointCoordinator) -> dict[str, Any]:
    """What the coordinator's one subtask holds."""
    [backend] = coordinator.backends
    assert isinstance(backend, AbstractKeyedStateBackend)
    return dump(backend)


def savepoint(jobs: Jobs, directory: str) -> dict[str, Any]:
    """A savepoint of 20 keys (id 1) into ``directory``, taken by a job of its own
    (``source-root/source``); returns the contents it holds."""
    backend = jobs.heap()
    fill(backend, range(20))
    jobs.new(backend, "source-root", "source").trigger_savepoint(directory)
    return dump(backend)


def torn(path: Path, kind: str, version: int) -> str:
    """Tear the sealed document at ``path``; returns what reading it says."""
    path.write_bytes(b"torn")
    return (
        f"expected {str(path)!r} to end with its seal line '#cowstate {kind} v{version} "
        "sha256=...', got b'torn' (4 bytes): the file is torn, truncated or not a cowstate "
        "document"
    )


def nothing_restored(job_id: str, reasons: list[str]) -> str:
    return (
        f"expected a checkpoint of job {job_id!r} that verifies, none does "
        f"({'; '.join(reasons)}); nothing was restored or deleted"
    )


# ------------------------------------------------- R2, R3: the restore record


# run__mutmut_8 (the skipped entry None), __mutmut_9 (its directory None),
# __mutmut_10 (its reason None), __mutmut_11/12 (one argument), __mutmut_13
# (`job_dir - "/_restore"`), __mutmut_14/15 (another file's name), __mutmut_16
# (`str(None)`), __mutmut_17 (`record, source_broken = None`), __mutmut_18
# (a torn _restore not counted as a broken source: recovery started empty).
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_torn_restore_record_stops_recovery_naming_the_file(jobs: Jobs, tmp_path: Path) -> None:
    directory = str(tmp_path / "sp")
    contents = savepoint(jobs, directory)
    jobs.restore(directory, RestoreMode.NO_CLAIM)
    job_dir = tmp_path / "root" / "job"
    reason = torn(job_dir / "_restore", "restore", 1)
    before = sorted(p.name for p in job_dir.iterdir())
    with pytest.raises(CorruptCheckpointError) as caught:
        jobs.recover()
    assert str(caught.value) == nothing_restored("job", [f"{job_dir}/_restore: {reason}"])
    assert sorted(p.name for p in job_dir.iterdir()) == before
    assert (job_dir / "_restore").read_bytes() == b"torn"
    again = jobs.restore(directory, RestoreMode.NO_CLAIM, root="again")  # the savepoint is intact
    assert contents_of(again) == contents


# run__mutmut_8..16: with a checkpoint of its own the job recovers from it and
# reports the torn _restore it could not read.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_torn_restore_record_beside_a_checkpoint_is_reported_and_passed_over(
    jobs: Jobs, tmp_path: Path
) -> None:
    backend = jobs.heap()
    fill(backend, range(20))
    checkpoint(jobs.new(backend))
    job_dir = tmp_path / "root" / "job"
    reason = torn(job_dir / "_restore", "restore", 1)
    recovered = jobs.recover()
    assert report_of(recovered).skipped == [Skipped(f"{job_dir}/_restore", reason)]
    assert report_of(recovered).restored_from == f"{job_dir}/chk-1"
    assert contents_of(recovered) == dump(backend)


# run__mutmut_50 (the UnsafePathError's message None), __mutmut_58 (the skipped
# entry's directory None): a _restore naming a snapshot inside what the job owns.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_restore_record_naming_what_the_job_owns_stops_recovery_naming_it(
    jobs: Jobs, tmp_path: Path
) -> None:
    storage = jobs.storage()
    owned = f"{storage.job_dir}/chk-7"
    record = RestoreRecord(
        directory=owned, mode=RestoreMode.CLAIM, checkpoint_id=7, kind="checkpoint", token="ab"
    )
    storage.write_restore_record(record)
    with pytest.raises(CorruptCheckpointError) as caught:
        jobs.recover()
    assert str(caught.value) == nothing_restored(
        "job",
        [f"{owned}: expected _restore to name a snapshot outside what the job owns, got {owned!r}"],
    )
    assert storage.read_restore_record() == record


# run__mutmut_48 ("XXforeignXX"), __mutmut_49 ("FOREIGN"): a snapshot on another
# file system was taken for one inside the job, and recovery refused it.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_job_restored_from_another_file_system_recovers_from_it(
    jobs: Jobs, tmp_path: Path
) -> None:
    root = f"memory://cowstate-recovery-{uuid.uuid4().hex}"
    directory = f"{root}/savepoints/sp"
    try:
        contents = savepoint(jobs, directory)
        jobs.restore(directory, RestoreMode.NO_CLAIM)
        recovered = jobs.recover()
        assert report_of(recovered).restored_from == directory
        assert report_of(recovered).skipped == []
        assert contents_of(recovered) == contents
        assert FileSystem().exists(f"{directory}/{METADATA_FILE}")
    finally:
        FileSystem().delete_dir(root)


# _confirmed__mutmut_7 (`repr(lineage.directory)` of no lineage), __mutmut_9
# ("XXnothingXX"), __mutmut_10 ("NOTHING").
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_restore_record_a_fresh_job_never_had_is_reported_and_not_followed(
    jobs: Jobs, tmp_path: Path
) -> None:
    backend = jobs.heap()
    fill(backend, range(20))
    checkpoint(jobs.new(backend))
    storage = jobs.storage()
    forged = str(tmp_path / "elsewhere")
    storage.write_restore_record(
        RestoreRecord(
            directory=forged, mode=RestoreMode.NO_CLAIM, checkpoint_id=9, kind="savepoint"
        )
    )
    recovered = jobs.recover()
    assert report_of(recovered).skipped == [
        Skipped(
            f"{storage.job_dir}/_restore",
            "expected _restore to name what checkpoint 1 says the job started from (nothing), "
            f"it names {forged!r} in no-claim mode: not followed",
        )
    ]
    assert recovered.restored_from is None
    assert contents_of(recovered) == dump(backend)
    assert checkpoint(recovered) == 2


# run__mutmut_56 (`restored_metadata = ""` for a snapshot gone), __mutmut_121
# (`record is not None or restored_metadata is not None`: adopted a snapshot
# gone), _delete_garbage__mutmut_13 (`or`), __mutmut_15 (`restored is None`):
# each crashed on the metadata of a CLAIMed snapshot the job had subsumed.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_job_recovers_after_subsuming_the_snapshot_it_claimed(jobs: Jobs, tmp_path: Path) -> None:
    directory = str(tmp_path / "sp")
    savepoint(jobs, directory)
    backend = jobs.heap()
    claimed = jobs.restore(directory, RestoreMode.CLAIM, backend)
    fill(backend, range(10, 30), tag="later")
    assert checkpoint(claimed) == 2  # subsumes the claimed savepoint (id 1): deleted
    assert not (tmp_path / "sp" / METADATA_FILE).exists()
    record = claimed.restored_from
    recovered = jobs.recover()
    assert report_of(recovered) == RecoveryReport(
        restored_from=f"{claimed.storage.job_dir}/chk-2", skipped=[], removed_savepoint=None
    )
    assert recovered.restored_from == record
    assert contents_of(recovered) == dump(backend)
    assert [c.checkpoint_id for c in recovered.completed_checkpoints] == [2]


# run__mutmut_126 (`has_own_checkpoints=None`), __mutmut_130 (`chosen is None`):
# whether the first checkpoint after a NO_CLAIM restore must be full.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_recovery_forces_a_full_checkpoint_only_until_the_job_has_one_of_its_own(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = str(tmp_path / "sp")
    contents = savepoint(jobs, directory)
    assert jobs.restore(directory, RestoreMode.NO_CLAIM).force_full
    recovered = jobs.recover()
    assert report_of(recovered).restored_from == directory
    assert contents_of(recovered) == contents
    assert recovered.force_full  # nothing of its own yet: the next checkpoint is full
    checkpoint(recovered)
    assert not recovered.force_full
    again = jobs.recover()
    assert report_of(again).restored_from == f"{recovered.storage.job_dir}/chk-2"
    assert not again.force_full  # it has a checkpoint of its own to build on


# run__mutmut_133 (the entry's directory None), __mutmut_137/138/140/141 (its
# reason changed): a CLAIM another job took over since.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_claim_taken_over_by_another_job_is_reported_as_not_owned(
    jobs: Jobs, tmp_path: Path
) -> None:
    directory = str(tmp_path / "sp")
    contents = savepoint(jobs, directory)
    jobs.restore(directory, RestoreMode.CLAIM)
    jobs.restore(directory, RestoreMode.CLAIM, root="other-root")  # revokes the first claim
    before = sorted(p.name for p in (tmp_path / "sp").iterdir())
    recovered = jobs.recover()
    assert report_of(recovered).skipped == [
        Skipped(
            directory,
            "restored in CLAIM mode, but the directory holds no claim marker of this job: "
            "its files are not owned and never deleted",
        )
    ]
    assert report_of(recovered).restored_from == directory
    assert recovered.unconfirmed_claim == directory
    assert contents_of(recovered) == contents
    assert sorted(p.name for p in (tmp_path / "sp").iterdir()) == before


# _try_restore__mutmut_6 (the entry None), __mutmut_7 (its directory None),
# __mutmut_8 (its reason None), __mutmut_11 (`type(None).__name__`).
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_checkpoint_whose_file_is_corrupt_is_passed_over_naming_the_error(
    jobs: Jobs, tmp_path: Path
) -> None:
    backend = jobs.heap()
    job = jobs.new(backend, num_retained=2)
    fill(backend, range(20), tag="first")
    checkpoint(job)
    first = dump(backend)
    fill(backend, range(20), tag="second")
    checkpoint(job)
    data = tmp_path / "root" / "job" / "chk-2" / "keyed-state-0-15"
    good = data.read_bytes()
    data.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    recovered = jobs.recover(num_retained=2)
    [skipped] = report_of(recovered).skipped
    assert skipped.directory == f"{job.storage.job_dir}/chk-2"
    assert skipped.reason.startswith(f"CorruptCheckpointError: expected {str(data)!r} to hold ")
    assert report_of(recovered).restored_from == f"{job.storage.job_dir}/chk-1"
    assert contents_of(recovered) == first


# run__mutmut_118 (the reasons joined with "XX; XX"), __mutmut_119 (six reasons
# instead of five): six torn checkpoints, newest first.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_no_checkpoint_that_verifies_stops_recovery_naming_the_five_newest(
    jobs: Jobs, tmp_path: Path
) -> None:
    job = jobs.new(num_retained=6)
    for _ in range(6):
        checkpoint(job)
    job_dir = tmp_path / "root" / "job"
    reasons = [
        f"{job_dir}/chk-{i}: {torn(job_dir / f'chk-{i}' / METADATA_FILE, 'metadata', 2)}"
        for i in range(6, 0, -1)
    ]
    before = sorted(str(p) for p in job_dir.rglob("*"))
    with pytest.raises(CorruptCheckpointError) as caught:
        jobs.recover()
    assert str(caught.value) == nothing_restored("job", reasons[:5])
    assert sorted(str(p) for p in job_dir.rglob("*")) == before


# --------------------------------------------------- R5: what recovery keeps


# run__mutmut_154 (`_delete_garbage(None, ...)`), __mutmut_155 (`(record, None)`),
# _delete_garbage__mutmut_14 (`record is None and ...`): the snapshot the job
# was restored from was not kept, so recovery deleted the shared files it
# uses that lie in the job's own shared/ (a checkpoint moved out of chk-1/).
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_recovery_never_deletes_a_file_the_snapshot_it_started_from_uses(
    jobs: Jobs, tmp_path: Path
) -> None:
    backend = jobs.rocks()
    fill(backend, range(20))
    checkpoint(jobs.new(backend))
    contents = dump(backend)
    shared = sorted((tmp_path / "root" / "job" / "shared").iterdir())
    assert shared  # RocksDB's SSTs
    kept = tmp_path / "root" / "kept" / "chk-1"
    kept.parent.mkdir()
    shutil.move(tmp_path / "root" / "job" / "chk-1", kept)
    jobs.restore(str(kept), RestoreMode.NO_CLAIM, jobs.rocks())
    recovered = jobs.recover(jobs.rocks())
    assert report_of(recovered).restored_from == str(kept)
    assert sorted((tmp_path / "root" / "job" / "shared").iterdir()) == shared
    again = jobs.recover(jobs.rocks())
    assert report_of(again).restored_from == str(kept)
    assert contents_of(again) == contents


# run__mutmut_158 (`write_counter(None)`): the counter became "None", and the
# next recovery handed out a savepoint's id again.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_recovery_keeps_the_counter_past_a_savepoint_id(jobs: Jobs, tmp_path: Path) -> None:
    job = jobs.new()
    checkpoint(job)
    assert job.trigger_savepoint(str(tmp_path / "sp")).checkpoint_id == 2
    jobs.recover()
    assert (tmp_path / "root" / "job" / "_counter").read_bytes() == b"2"
    assert checkpoint(jobs.recover()) == 3


# _delete_garbage__mutmut_8 ("XX_counterXX"), __mutmut_9 ("_COUNTER"): recovery
# deleted _counter before rewriting it, so a crash in between lost it.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_crash_while_recovery_rewrites_the_counter_leaves_the_old_one(
    jobs: Jobs, tmp_path: Path
) -> None:
    job = jobs.new()
    checkpoint(job)
    job.trigger_savepoint(str(tmp_path / "sp"))
    counter = tmp_path / "root" / "job" / "_counter"
    with pytest.raises(Crash):
        jobs.recover(hooks=crash_on("rename", lambda _, target: target == str(counter)))
    assert counter.read_bytes() == b"2"
    assert checkpoint(jobs.recover()) == 3


# ------------------------------------------------ R1: an interrupted savepoint


# _finish_interrupted_savepoint__mutmut_3 (the entry None), __mutmut_4 (its
# directory None), __mutmut_5 (its reason None), __mutmut_6/7 (one argument),
# __mutmut_8 (`str(None)`), __mutmut_9 (`delete(None)`).
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_torn_savepoint_intent_is_reported_and_deleted(jobs: Jobs, tmp_path: Path) -> None:
    backend = jobs.heap()
    fill(backend, range(20))
    checkpoint(jobs.new(backend))
    intent = tmp_path / "root" / "job" / "_savepoint"
    reason = torn(intent, "savepoint", 1)
    recovered = jobs.recover()
    assert report_of(recovered) == RecoveryReport(
        restored_from=f"{recovered.storage.job_dir}/chk-1",
        skipped=[Skipped(str(intent), reason)],
        removed_savepoint=None,
    )
    assert not intent.exists()
    assert contents_of(recovered) == dump(backend)


# _finish_interrupted_savepoint__mutmut_11 (`removed = ""`), __mutmut_13
# (`relation(...) in (...) or is_dir(...)`: a directory never made was reported
# removed).
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_savepoint_interrupted_before_its_directory_was_made_removes_nothing(
    jobs: Jobs, tmp_path: Path
) -> None:
    storage = jobs.storage()
    directory = str(tmp_path / "sp")
    storage.write_savepoint_intent(SavepointIntent(directory=directory, token=uuid.uuid4().hex))
    recovered = jobs.recover()
    assert report_of(recovered) == RecoveryReport()
    assert report_of(recovered).removed_savepoint is None
    assert not Path(storage.savepoint_intent_path).exists()
    assert not (tmp_path / "sp").exists()


# _finish_interrupted_savepoint__mutmut_13 (`or`): an intent naming what the job
# owns is never acted on, whatever that directory holds; it is reported.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_savepoint_intent_naming_the_job_directory_is_ignored(jobs: Jobs, tmp_path: Path) -> None:
    backend = jobs.heap()
    fill(backend, range(20))
    checkpoint(jobs.new(backend))
    storage = jobs.storage()
    storage.write_savepoint_intent(SavepointIntent(directory=storage.job_dir, token="0" * 32))
    recovered = jobs.recover()
    reason = (
        f"expected the savepoint intent to name a directory outside what job 'job' owns, it "
        f"names {storage.job_dir!r} (job directory): not followed"
    )
    assert report_of(recovered) == RecoveryReport(
        restored_from=f"{storage.job_dir}/chk-1",
        skipped=[Skipped(storage.savepoint_intent_path, reason)],
        removed_savepoint=None,
    )
    assert not Path(storage.savepoint_intent_path).exists()
    assert contents_of(recovered) == dump(backend)


# _finish_interrupted_savepoint__mutmut_41 (`join(METADATA_FILE)`: a completed
# savepoint taken for one holding a snapshot below), __mutmut_43
# (`delete(None)`): the savepoint completed, the crash came before its marker went.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_completed_savepoint_loses_only_its_marker(jobs: Jobs, tmp_path: Path) -> None:
    backend = jobs.heap()
    fill(backend, range(20))
    job = jobs.new(backend, hooks=crash_on("delete", lambda p, _: SAVEPOINT_MARKER in p))
    directory = tmp_path / "sp"
    with pytest.raises(Crash):
        job.trigger_savepoint(str(directory))
    [marker] = [p.name for p in directory.iterdir() if p.name.startswith(SAVEPOINT_MARKER)]
    recovered = jobs.recover()
    assert report_of(recovered) == RecoveryReport()
    assert sorted(p.name for p in directory.iterdir()) == [METADATA_FILE, "keyed-state-0-15"]
    assert not Path(recovered.storage.savepoint_intent_path).exists()
    restored = jobs.restore(str(directory), RestoreMode.NO_CLAIM, root="again")
    assert contents_of(restored) == dump(backend)
    assert marker not in {p.name for p in directory.iterdir()}


# _finish_interrupted_savepoint__mutmut_18 ("XXforeignXX"), __mutmut_19
# ("FOREIGN"): an interrupted savepoint on another file system was left behind.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_savepoint_interrupted_on_another_file_system_is_removed(jobs: Jobs) -> None:
    root = f"memory://cowstate-recovery-{uuid.uuid4().hex}"
    directory = f"{root}/savepoints/sp"
    filesystem = FileSystem()
    try:
        backend = jobs.heap()
        fill(backend, range(20))
        job = jobs.new(
            backend,
            hooks=crash_on("rename", lambda _, target: target == f"{directory}/{METADATA_FILE}"),
        )
        with pytest.raises(Crash):
            job.trigger_savepoint(directory)
        assert filesystem.list_dir(directory)  # the marker and the subtask's file
        recovered = jobs.recover()
        assert report_of(recovered) == RecoveryReport(removed_savepoint=directory)
        assert not filesystem.exists(directory)
        assert not Path(recovered.storage.savepoint_intent_path).exists()
    finally:
        filesystem.delete_dir(root)


# _finish_interrupted_savepoint__mutmut_33 (`holds_a_snapshot = None`: the
# directory was removed with the snapshot below it), __mutmut_44 (the entry
# None), __mutmut_45 (its directory None), __mutmut_46 (its reason None),
# __mutmut_49/50 (its reason changed).
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_an_interrupted_savepoint_holding_a_snapshot_below_is_kept_and_reported(
    jobs: Jobs, tmp_path: Path
) -> None:
    backend = jobs.heap()
    fill(backend, range(20))
    directory = tmp_path / "sp"
    job = jobs.new(
        backend,
        hooks=crash_on("rename", lambda _, target: target == str(directory / METADATA_FILE)),
    )
    with pytest.raises(Crash):
        job.trigger_savepoint(str(directory))
    contents = savepoint(jobs, str(directory / "inner"))  # another job's, in there since
    before = sorted(str(p) for p in directory.rglob("*"))
    recovered = jobs.recover()
    assert report_of(recovered) == RecoveryReport(
        skipped=[
            Skipped(str(directory), "the savepoint intent names a directory holding a snapshot")
        ]
    )
    assert sorted(str(p) for p in directory.rglob("*")) == before
    assert not Path(recovered.storage.savepoint_intent_path).exists()
    inner = jobs.restore(str(directory / "inner"), RestoreMode.NO_CLAIM, root="again")
    assert contents_of(inner) == contents


# _finish_interrupted_savepoint__mutmut_28 (`lstrip("XX.XX")`): only the marker
# counts, not a file whose name merely ends like it; the directory is reported.
@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_directory_without_the_marker_itself_is_never_removed(jobs: Jobs, tmp_path: Path) -> None:
    storage = jobs.storage()
    token = uuid.uuid4().hex
    directory = tmp_path / "sp"
    directory.mkdir()
    (directory / f"X{SAVEPOINT_MARKER}{token}").write_bytes(b"not the marker")
    storage.write_savepoint_intent(SavepointIntent(directory=str(directory), token=token))
    recovered = jobs.recover()
    reason = (
        f"expected the directory of the savepoint intent to hold its marker "
        f"'{SAVEPOINT_MARKER}{token}', it holds none: not touched"
    )
    assert report_of(recovered) == RecoveryReport(skipped=[Skipped(str(directory), reason)])
    assert [p.name for p in directory.iterdir()] == [f"X{SAVEPOINT_MARKER}{token}"]
    assert not Path(storage.savepoint_intent_path).exists()


# ------------------------------------------------------- regressions (R2, R3)


@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_job_whose_only_snapshot_is_gone_is_not_recovered_empty(
    jobs: Jobs, tmp_path: Path
) -> None:
    # Regression: a job restored in NO_CLAIM mode, whose savepoint its owner
    # deleted before the job's first checkpoint, recovered with empty state
    # and an empty report. Without a checkpoint of its own the snapshot held
    # the job's whole state: it is a candidate passed over (R2), and none
    # restoring is an error that deletes nothing (R3).
    directory = str(tmp_path / "sp")
    savepoint(jobs, directory)
    restored = jobs.restore(directory, RestoreMode.NO_CLAIM)
    restored.delete_savepoint(directory)
    job_files = sorted(p for p in (tmp_path / "root").rglob("*"))
    with pytest.raises(CorruptCheckpointError) as caught:
        jobs.recover()
    # run__mutmut_60/63: the reason is what reading its _metadata said
    assert f"{directory}: expected a completed checkpoint or savepoint in {directory!r}" in str(
        caught.value
    )
    assert str(caught.value).endswith("nothing was restored or deleted")
    assert sorted(p for p in (tmp_path / "root").rglob("*")) == job_files


@pytest.mark.kills(module="cowstate.checkpoint.recovery")
def test_a_job_with_a_checkpoint_of_its_own_recovers_without_its_deleted_savepoint(
    jobs: Jobs, tmp_path: Path
) -> None:
    # The other side of the rule above: after its first checkpoint a NO_CLAIM
    # job no longer needs the savepoint, and its owner may delete it.
    directory = str(tmp_path / "sp")
    expected = savepoint(jobs, directory)
    restored = jobs.restore(directory, RestoreMode.NO_CLAIM)
    checkpoint(restored)
    restored.delete_savepoint(directory)
    backend = jobs.heap()
    report = report_of(jobs.recover(backend))
    assert report.restored_from is not None and report.restored_from.endswith("chk-2")
    assert dump(backend) == expected
