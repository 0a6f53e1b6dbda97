"""Recovery after a crash: what :meth:`CheckpointCoordinator.recover` runs.

A :class:`Recovery` works on a fresh coordinator over the job's storage, in
five steps (cited as R1-R5):

R1. An interrupted savepoint. ``_savepoint`` names the directory a savepoint
    was being written to (as its real path) and a token; it is checked
    before anything else is done with it (P5, P6 of
    :mod:`~cowstate.checkpoint.paths`: no relative path, which would be
    resolved against the working directory). Recovery follows it only to a
    directory outside what the job owns, named by its own real path (no
    symbolic link at any level), and there it looks for one name only: the
    marker ``.cowstate-savepoint-<token>`` the savepoint created before it
    wrote anything else. Holding the marker, the directory is that
    savepoint's (absent or empty when it began): without ``_metadata`` (and
    no snapshot below) it goes; if the savepoint completed, only its marker
    does. Without the marker nothing there is listed, read or deleted -- an
    empty directory neither (a crash before the marker was made leaves at
    most that empty directory). An intent not followed (a file system that
    cannot be reached too: recovery goes on) and a directory left are
    reported; the intent is deleted.
R2. The candidates, newest first: the job's checkpoints whose ``_metadata``
    verifies, then the snapshot the job was restored from -- as the newest of
    those checkpoints records it (``restored_from``): a ``_restore`` it does
    not confirm is reported and never read (a forged one cannot point
    recovery at another snapshot, or at another protocol's server), a lost
    one is replaced by the checkpoint's record; only a job without a
    checkpoint of its own believes ``_restore`` as it is. Either way the
    snapshot is followed only to a directory named absolute and normal (P6:
    ``_restore`` is checked as it is read, a checkpoint's ``restored_from``
    here), outside what the job owns, by its own real path -- a restore
    records it so; a relative one (an earlier version recorded the name as
    given), one with ``..`` or one through a symbolic link is reported and
    never followed (no snapshot the job started from, then). The first that
    restores into every backend (all subtasks or none) wins; each one passed
    over is reported with its reason. Corruption (``CorruptCheckpointError``,
    ``CheckpointNotFoundError``, ``SnapshotFormatError``) passes over a
    candidate; a configuration error (a serializer or max-parallelism
    mismatch, an incompatible format) stops recovery at once. The snapshot
    the job was restored from may be gone (subsumed after a CLAIM, or deleted
    by its owner after the job's first checkpoint) only once the job has a
    checkpoint of its own: without one it held the job's whole state, and
    its absence is a candidate passed over (R3), never an empty start.
R3. If there were candidates (or broken checkpoints) and none restored:
    :class:`~cowstate.errors.CorruptCheckpointError`, nothing deleted.
R4. The store: the CLAIMed snapshot if it still exists, then the job's own
    checkpoints up to the one restored, registered in the shared-state
    registry.
R5. Only now, deletion (rules 5, 8, 9 of the coordinator): subsumption beyond
    ``num_retained``, then every file the job owns that no retained
    checkpoint (nor the restored-from snapshot) uses -- unfinished and
    passed-over checkpoints, temporary files, orphaned shared files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cowstate.checkpoint.handles import METADATA_FILE, CheckpointMetadata
from cowstate.checkpoint.location import SnapshotSource
from cowstate.checkpoint.paths import check_directory
from cowstate.checkpoint.storage import (
    SAVEPOINT_MARKER,
    OnDisk,
    RestoreRecord,
    SavepointIntent,
    read_metadata,
)
from cowstate.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    CowStateError,
    IncompatibleSnapshotError,
    MaxParallelismMismatchError,
    SerializerMismatchError,
    SnapshotFormatError,
    UnsafePathError,
)

if TYPE_CHECKING:
    from cowstate.checkpoint.coordinator import CheckpointCoordinator

__all__ = ["Recovery", "RecoveryReport", "Skipped"]


@dataclass(frozen=True)
class Skipped:
    """A snapshot recovery passed over, and why."""

    directory: str
    reason: str


@dataclass
class RecoveryReport:
    """What :meth:`CheckpointCoordinator.recover` did."""

    #: The directory the backends were restored from (None: left empty).
    restored_from: str | None = None
    #: Snapshots that did not verify or restore, newest first.
    skipped: list[Skipped] = field(default_factory=list)
    #: The interrupted savepoint directory it removed, if any.
    removed_savepoint: str | None = None


class Recovery:
    """R1-R5 over ``job``, a coordinator fresh from its constructor."""

    def __init__(self, job: CheckpointCoordinator) -> None:
        self.job = job

    def run(self) -> RecoveryReport:
        """R1-R5 (module doc); returns what was restored and skipped."""
        storage = self.job.storage
        report = RecoveryReport()
        report.removed_savepoint = self._finish_interrupted_savepoint(report)
        source_broken = False  # a snapshot the job started from that cannot be used
        try:
            record = storage.read_restore_record()
        except CowStateError as exc:
            report.skipped.append(Skipped(storage.job_dir + "/_restore", str(exc)))
            record, source_broken = None, True
        on_disk = storage.checkpoints_on_disk()
        broken = [
            c
            for c in on_disk
            if c.problem is not None and not isinstance(c.problem, CheckpointNotFoundError)
        ]
        for found in reversed(broken):
            report.skipped.append(Skipped(found.directory, str(found.problem)))
        own = [c for c in on_disk if c.metadata is not None]
        if own:  # R2: the newest checkpoint that verifies says what the job started from
            record = self._confirmed(record, own[-1], report)
        restored_metadata: CheckpointMetadata | None = None
        if record is not None:
            try:
                self._check_followed(record.directory)  # R2, P6
                restored_metadata = read_metadata(storage.filesystem, record.directory)
            except CheckpointNotFoundError as exc:
                # subsumed (CLAIM) or deleted by its owner: harmless once the job has a
                # checkpoint of its own; without one it held the job's only state (R3)
                restored_metadata = None
                if not own:
                    report.skipped.append(Skipped(record.directory, str(exc)))
                    source_broken = True
            except CowStateError as exc:
                report.skipped.append(Skipped(record.directory, str(exc)))
                record, source_broken = None, True
        self.job.restored_from = record
        if record is not None:
            self.job._last_id = max(self.job._last_id, record.checkpoint_id)
        # R2: newest first; the first that restores into every backend wins (rule 9).
        chosen: int | None = None
        for index in range(len(own) - 1, -1, -1):
            found = own[index]
            assert found.metadata is not None
            if self._try_restore(found.directory, found.metadata, report):
                chosen = index
                break
        if chosen is None and record is not None and restored_metadata is not None:
            # R2's fallback: the snapshot the job started from; if it fails too, R3
            # below raises (its metadata is readable, so it was the job's state)
            self._try_restore(record.directory, restored_metadata, report)
        if report.restored_from is None and (
            own or broken or source_broken or restored_metadata is not None
        ):
            reasons = "; ".join(f"{s.directory}: {s.reason}" for s in report.skipped[:5])
            raise CorruptCheckpointError(
                f"expected a checkpoint of job {storage.job_id!r} that verifies, none does "
                f"({reasons}); nothing was restored or deleted"
            )
        # R4: the store -- the CLAIMed snapshot (if still there), then the job's own
        # checkpoints up to the one restored; subsumption trims it.
        if record is not None and restored_metadata is not None:
            self.job._adopt(record, restored_metadata, has_own_checkpoints=chosen is not None)
            if self.job.unconfirmed_claim is not None:
                report.skipped.append(
                    Skipped(
                        record.directory,
                        "restored in CLAIM mode, but the directory holds no claim marker of "
                        "this job: its files are not owned and never deleted",
                    )
                )
        if chosen is not None:
            from cowstate.checkpoint.coordinator import CompletedCheckpoint  # no import cycle

            for found in own[: chosen + 1][-self.job.num_retained :]:
                assert found.metadata is not None
                self.job._retain(
                    CompletedCheckpoint(found.checkpoint_id, found.directory, found.metadata)
                )
        self.job._subsume()  # R5
        self._delete_garbage(record, restored_metadata)
        storage.write_counter(self.job._last_id)
        return report

    def _confirmed(
        self, record: RestoreRecord | None, newest: OnDisk, report: RecoveryReport
    ) -> RestoreRecord | None:
        """The snapshot the job started from, as ``newest`` (its newest checkpoint
        that verifies) records it: a ``_restore`` naming anything else is skipped
        unread (forged, or left by another job); a lost ``_restore`` is
        replaced by the checkpoint's record."""
        assert newest.metadata is not None
        lineage = newest.metadata.restored_from
        unsettled = None if lineage is None else lineage.model_copy(update={"settled": False})
        if record is not None and record != unsettled:  # _restore never says settled
            said = "nothing" if lineage is None else repr(lineage.directory)
            report.skipped.append(
                Skipped(
                    self.job.storage.job_dir + "/_restore",
                    f"expected _restore to name what checkpoint {newest.checkpoint_id} says the "
                    f"job started from ({said}), it names {record.directory!r} in "
                    f"{record.mode} mode: not followed",
                )
            )
        return lineage

    def _check_followed(self, directory: str) -> None:
        """R2: :class:`UnsafePathError` unless recovery may follow the snapshot
        the job was restored from to ``directory``: absolute and normal (P6:
        a ``_restore`` is checked as it is read, a checkpoint's
        ``restored_from`` here -- one written before P6 may be relative), outside
        what the job owns, and named by its own real path."""
        storage = self.job.storage
        check_directory(directory, "the directory the job was restored from")
        if storage.relation(directory) not in ("outside", "foreign"):
            raise UnsafePathError(
                f"expected _restore to name a snapshot outside what the job owns, got {directory!r}"
            )
        local = storage.filesystem.local_path(directory)
        if local is not None and os.path.realpath(local) != local:
            raise UnsafePathError(
                f"expected _restore to name a snapshot by its real path, {directory!r} leads "
                f"through a symbolic link to {os.path.realpath(local)!r}: not followed"
            )

    def _try_restore(
        self, directory: str, metadata: CheckpointMetadata, report: RecoveryReport
    ) -> bool:
        """Restore every backend from ``directory``; False (reported) if it is
        corrupt; configuration errors propagate."""
        try:
            self.job._check_max_parallelism(metadata)
            self.job._restore_from(directory, metadata)
        except (SerializerMismatchError, MaxParallelismMismatchError, IncompatibleSnapshotError):
            raise
        except (CorruptCheckpointError, CheckpointNotFoundError, SnapshotFormatError) as exc:
            report.skipped.append(Skipped(directory, f"{type(exc).__name__}: {exc}"))
            return False
        report.restored_from = directory
        return True

    def _finish_interrupted_savepoint(self, report: RecoveryReport) -> str | None:
        """R1: a savepoint a crash interrupted; returns the directory removed, if any."""
        storage = self.job.storage
        try:
            intent = storage.read_savepoint_intent()  # P5, P6
        except CowStateError as exc:
            report.skipped.append(Skipped(storage.savepoint_intent_path, str(exc)))
            storage.filesystem.delete(storage.savepoint_intent_path)
            return None
        if intent is None:
            return None
        removed = None
        try:
            refusal = self._unfollowed(intent)
            if refusal is None:
                removed = self._remove_unfinished(intent, report)
        except CowStateError as exc:  # a file system that cannot be reached, or is unknown
            refusal = f"{exc}: not followed"
        if refusal is not None:
            report.skipped.append(Skipped(storage.savepoint_intent_path, refusal))
        storage.filesystem.delete(storage.savepoint_intent_path)
        return removed

    def _unfollowed(self, intent: SavepointIntent) -> str | None:
        """Why R1 does not follow ``intent`` to its directory, or None: it must
        lie outside what the job owns and be named by its own real path."""
        storage = self.job.storage
        directory = intent.directory
        where = storage.relation(directory)
        if where not in ("outside", "foreign"):
            return (
                f"expected the savepoint intent to name a directory outside what job "
                f"{storage.job_id!r} owns, it names {directory!r} ({where}): not followed"
            )
        local = storage.filesystem.local_path(directory)
        if local is not None and os.path.realpath(local) != local:
            return (
                f"expected the savepoint intent to name a directory by its real path, "
                f"{directory!r} leads through a symbolic link to {os.path.realpath(local)!r}: "
                "not followed"
            )
        return None

    def _remove_unfinished(self, intent: SavepointIntent, report: RecoveryReport) -> str | None:
        """R1 in the directory of a followed ``intent``: nothing unless it holds
        the marker; then the marker (a completed savepoint) or the directory."""
        filesystem = self.job.storage.filesystem
        directory = intent.directory
        name = SAVEPOINT_MARKER + intent.token
        if not filesystem.exists(filesystem.join(directory, name)):
            if filesystem.exists(directory):
                report.skipped.append(
                    Skipped(
                        directory,
                        f"expected the directory of the savepoint intent to hold its marker "
                        f"{name!r}, it holds none: not touched",
                    )
                )
            return None
        if filesystem.exists(filesystem.join(directory, METADATA_FILE)):  # it completed
            filesystem.delete(filesystem.join(directory, name))
            return None
        if any(filesystem.name(p) == METADATA_FILE for p in filesystem.list_files(directory)):
            report.skipped.append(  # a completed snapshot below: never ours to remove
                Skipped(directory, "the savepoint intent names a directory holding a snapshot")
            )
            return None
        filesystem.delete_dir(directory)
        return directory

    def _delete_garbage(
        self, record: RestoreRecord | None, restored: CheckpointMetadata | None
    ) -> None:
        """Delete every file the job owns that no retained checkpoint (nor the
        snapshot the job was restored from) uses (rules 8 and 9)."""
        storage = self.job.storage
        filesystem = storage.filesystem
        keep = {filesystem.join(storage.job_dir, name) for name in ("_counter", "_restore")}
        snapshots = [(c.directory, c.metadata) for c in self.job._completed]
        if record is not None and restored is not None:
            snapshots.append((record.directory, restored))
        for directory, metadata in snapshots:
            source = SnapshotSource(filesystem, directory)
            keep.add(filesystem.join(directory, METADATA_FILE))
            keep.update(source.lexical_path(f) for f in metadata.files)
        for path in storage.files():
            if path not in keep and storage.owns(path):
                filesystem.delete(path)
        for checkpoint_id in storage.checkpoint_ids_on_disk():
            directory = storage.checkpoint_dir(checkpoint_id)
            if not filesystem.list_files(directory):
                filesystem.delete_dir(directory)
