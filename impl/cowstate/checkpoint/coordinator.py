"""The checkpoint coordinator: ids, pending and completed checkpoints, retention,
savepoints, restore modes and recovery (Flink's ``CheckpointCoordinator`` and
completed-checkpoint store, for the keyed state of one job's subtasks).

Lifecycle of checkpoint N::

    trigger_checkpoint()      next id from the one counter (checkpoints and
                              savepoints alike); every subtask's backend takes
                              its synchronous part and starts writing into
                              chk-N/ and shared/
    complete_checkpoint(N)    wait for every subtask (acknowledge), write
                              chk-N/_metadata -- now N exists -- register its
                              shared files, abort older pending checkpoints,
                              subsume beyond num_retained, confirm N to the backends
    abort_checkpoint(N)       cancel the writers, delete exactly what N wrote
                              (never a file a completed checkpoint uses), tell
                              the backends to drop N

The rules, each with a test (``tests/test_checkpoint_rules.py``):

1. Checkpoint N may reference shared files only of the last *confirmed*
   checkpoint: the backends hear of N only once ``_metadata`` is written,
   never of a pending, aborted or failed checkpoint, and savepoints are never
   recorded as a base.
2. A savepoint never changes the incremental base: it shares nothing and is
   recorded nowhere, so the checkpoint after it reuses what the one before it
   would have.
3. A completion notice for an unknown id (a savepoint) or an older id is
   ignored by the backends; an aborted checkpoint's record is dropped.
4. Aborting or failing a checkpoint deletes only its own uploads (the
   location's record of what it wrote), never a file a completed checkpoint uses.
5. Subsuming a checkpoint deletes its exclusive files and exactly the shared
   files no retained checkpoint uses (:class:`~cowstate.checkpoint.registry.SharedStateRegistry`).
6. Deleting a savepoint never breaks a retained checkpoint (no checkpoint
   references a savepoint file); subsuming checkpoints never deletes a
   savepoint file (savepoints are not in the store, unless CLAIMed).
7. Restore modes: CLAIM -- the restored snapshot joins the store, owned, and
   is subsumed like a checkpoint; NO_CLAIM -- its files are never deleted,
   the first successful checkpoint is full (``force_full``: the backends
   restore a checkpoint as their incremental base in every mode, and a forced
   full checkpoint uploads everything instead of reusing it), and a failed
   one leaves the next full too; LEGACY -- later checkpoints may build on its
   files, which are never deleted.

Recovery (:meth:`CheckpointCoordinator.recover`) rebuilds a coordinator after a
crash from what is on disk: the newest retained completed checkpoints (or the
snapshot the job was restored from), the registry, the counter; it deletes
every other file of the job directory (unfinished checkpoints, temporary
files, uploads of failed checkpoints) and restores the backends.

The coordinator runs on one thread; the backends write on their own.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Literal

from cowstate.checkpoint.handles import (
    METADATA_FILE,
    CheckpointMetadata,
    KeyedStateHandle,
    RestoreMode,
    SnapshotOptions,
)
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.checkpoint.protocol import CheckpointingBackend, PreparedRestore, overlapping
from cowstate.checkpoint.registry import SharedStateRegistry
from cowstate.checkpoint.storage import (
    CheckpointStorage,
    RestoreRecord,
    read_metadata,
    write_metadata,
)
from cowstate.errors import (
    CheckpointError,
    InvalidArgumentError,
    MaxParallelismMismatchError,
    UnknownCheckpointError,
)
from cowstate.key_groups import KeyGroupRange

__all__ = ["CheckpointCoordinator", "CompletedCheckpoint", "PendingCheckpoint"]


@dataclass
class PendingCheckpoint:
    """A triggered checkpoint whose subtasks are writing (or have written)."""

    checkpoint_id: int
    location: SnapshotLocation
    options: SnapshotOptions
    futures: list[Future[KeyedStateHandle]]
    acknowledged: dict[int, KeyedStateHandle] = field(default_factory=dict)

    @property
    def is_acknowledged(self) -> bool:
        return len(self.acknowledged) == len(self.futures)


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint in the store: where it is and whether the job owns its files."""

    checkpoint_id: int
    directory: str
    metadata: CheckpointMetadata
    #: Owned snapshots are deleted when subsumed (the job's own checkpoints, and
    #: a snapshot restored in CLAIM mode).
    owned: bool = True

    @property
    def shared_paths(self) -> list[str]:
        return sorted({f.path for f in self.metadata.files if f.scope == "shared"})


class CheckpointCoordinator:
    """Checkpoints and savepoints of one job's subtasks (see the module doc)."""

    #: The registry of shared files (a subclass may bring another).
    registry_class: type[SharedStateRegistry] = SharedStateRegistry

    def __init__(
        self,
        storage: CheckpointStorage,
        backends: Sequence[CheckpointingBackend],
        *,
        num_retained: int = 1,
        timeout: float = 600.0,
    ) -> None:
        if not isinstance(storage, CheckpointStorage):
            raise InvalidArgumentError(
                f"expected a CheckpointStorage, got {type(storage).__name__}"
            )
        if type(num_retained) is not int or num_retained < 1:
            raise InvalidArgumentError(f"expected num_retained >= 1, got {num_retained!r}")
        _check_backends(backends)
        self.storage = storage
        self.backends = list(backends)
        self.max_parallelism = self.backends[0].max_parallelism
        self.num_retained = num_retained
        self.timeout = timeout
        self.registry = self.registry_class()
        self._completed: list[CompletedCheckpoint] = []
        self._pending: dict[int, PendingCheckpoint] = {}
        self._last_id = storage.read_counter()
        #: NO_CLAIM: every checkpoint is full until one completes.
        self.force_full = False
        self.restored_from: RestoreRecord | None = None

    # ----------------------------------------------------------- checkpoints

    def trigger_checkpoint(self) -> int:
        """Start checkpoint N on every subtask; returns N.

        If it cannot start (the counter cannot be written, a backend refuses),
        whatever it began is aborted and :class:`CheckpointError` raised.
        """
        try:
            checkpoint_id = self._next_id()
        except Exception as exc:
            raise CheckpointError(
                f"expected to trigger a checkpoint, got {type(exc).__name__}: {exc}"
            ) from exc
        location = self.storage.checkpoint_location(checkpoint_id)
        options = SnapshotOptions(kind="checkpoint", full=self.force_full)
        pending = PendingCheckpoint(checkpoint_id, location, options, [])
        self._pending[checkpoint_id] = pending
        try:
            for backend in self.backends:
                pending.futures.append(backend.snapshot_to(checkpoint_id, location, options))
        except Exception as exc:
            self.abort_checkpoint(checkpoint_id)
            raise CheckpointError(
                f"expected every subtask to start checkpoint {checkpoint_id}, got "
                f"{type(exc).__name__}: {exc}; the checkpoint was aborted"
            ) from exc
        return checkpoint_id

    def acknowledge(self, checkpoint_id: int, timeout: float | None = None) -> None:
        """Wait until every subtask of ``checkpoint_id`` wrote its part.

        A subtask that failed fails the checkpoint: it is aborted (its uploads
        deleted) and :class:`CheckpointError` raised with the cause.
        """
        pending = self._pending_checkpoint(checkpoint_id)
        done, not_done = wait(pending.futures, timeout=self.timeout if timeout is None else timeout)
        failure: BaseException | None = None
        if not_done:
            failure = TimeoutError(f"{len(not_done)} subtasks did not finish in time")
        for index, future in enumerate(pending.futures):
            if future in done and failure is None:
                if future.cancelled():
                    failure = CheckpointError(f"subtask {index} was cancelled")
                elif future.exception() is not None:
                    failure = future.exception()
                else:
                    pending.acknowledged[index] = future.result()
        if failure is not None:
            self.abort_checkpoint(checkpoint_id)
            raise CheckpointError(
                f"expected every subtask to write checkpoint {checkpoint_id}, got "
                f"{type(failure).__name__}: {failure}; the checkpoint was aborted"
            ) from failure

    def complete_checkpoint(
        self, checkpoint_id: int, timeout: float | None = None
    ) -> CompletedCheckpoint:
        """Acknowledge, write ``_metadata``, register, subsume, confirm (module doc)."""
        pending = self._pending_checkpoint(checkpoint_id)
        if not pending.is_acknowledged:
            self.acknowledge(checkpoint_id, timeout)
        subtasks = tuple(pending.acknowledged[i] for i in range(len(self.backends)))
        metadata = CheckpointMetadata(
            job_id=self.storage.job_id,
            checkpoint_id=checkpoint_id,
            kind="checkpoint",
            max_parallelism=self.max_parallelism,
            timestamp=time.time(),
            subtasks=subtasks,
            disowned=tuple(
                sorted(
                    {
                        f.path
                        for h in subtasks
                        for f in h.shared_files
                        if not self.registry.is_owned(f.path)
                    }
                )
            ),
        )
        try:
            write_metadata(self.storage.filesystem, pending.location.directory, metadata)
        except BaseException as exc:
            self.abort_checkpoint(checkpoint_id)
            raise CheckpointError(
                f"expected checkpoint {checkpoint_id}'s _metadata to be written, got "
                f"{type(exc).__name__}: {exc}; the checkpoint was aborted"
            ) from exc
        del self._pending[checkpoint_id]
        completed = CompletedCheckpoint(checkpoint_id, pending.location.directory, metadata)
        self._retain(completed)  # rule 5
        for older in [i for i in self._pending if i < checkpoint_id]:
            self.abort_checkpoint(older)  # subsumed while pending
        self._subsume()
        self.force_full = False  # rule 7, NO_CLAIM
        for backend in self.backends:  # rule 1: confirmed only now
            backend.notify_checkpoint_complete(checkpoint_id)
        return completed

    def abort_checkpoint(self, checkpoint_id: int) -> None:
        """Cancel checkpoint ``checkpoint_id`` and delete exactly what it wrote (rule 4)."""
        pending = self._pending.pop(checkpoint_id, None)
        if pending is None:
            raise UnknownCheckpointError(
                f"expected a pending checkpoint id ({sorted(self._pending) or 'none'}), got "
                f"{checkpoint_id}"
            )
        for future in pending.futures:
            future.cancel()
        wait(pending.futures, timeout=self.timeout)  # writers stop touching files
        pending.location.discard()
        self.storage.filesystem.delete_dir(pending.location.directory)
        for backend in self.backends:
            backend.notify_checkpoint_aborted(checkpoint_id)  # rule 3

    # ------------------------------------------------------------ savepoints

    def trigger_savepoint(
        self,
        directory: str,
        savepoint_format: Literal["canonical", "native"] = "canonical",
        timeout: float | None = None,
    ) -> CheckpointMetadata:
        """Take a savepoint into ``directory`` and wait for it (rules 2 and 6).

        Its id comes from the same counter as checkpoints; every file is
        exclusive and relative, it is not registered and not in the store. On
        failure everything written is deleted and :class:`CheckpointError` raised.
        """
        if savepoint_format not in ("canonical", "native"):
            raise InvalidArgumentError(
                f"expected a savepoint format 'canonical' or 'native', got {savepoint_format!r}"
            )
        location = self.storage.savepoint_location(directory)
        options = SnapshotOptions(kind="savepoint", format=savepoint_format)
        futures: list[Future[KeyedStateHandle]] = []
        intent = self.storage.filesystem.join(self.storage.job_dir, "_savepoint")
        checkpoint_id = self._last_id + 1
        try:
            checkpoint_id = self._next_id()
            self.storage.filesystem.write_bytes(intent, location.directory.encode("utf-8"))
            for backend in self.backends:
                futures.append(backend.snapshot_to(checkpoint_id, location, options))
            _done, not_done = wait(futures, timeout=self.timeout if timeout is None else timeout)
            if not_done:
                raise TimeoutError(f"{len(not_done)} subtasks did not finish in time")
            handles = tuple(future.result() for future in futures)
            metadata = CheckpointMetadata(
                job_id=self.storage.job_id,
                checkpoint_id=checkpoint_id,
                kind="savepoint",
                savepoint_format=savepoint_format,
                max_parallelism=self.max_parallelism,
                timestamp=time.time(),
                subtasks=handles,
            )
            write_metadata(self.storage.filesystem, location.directory, metadata)
        except Exception as exc:
            for future in futures:
                future.cancel()
            wait(futures, timeout=self.timeout)
            location.discard()
            _remove_if_empty(self.storage, location.directory)
            raise CheckpointError(
                f"expected savepoint {checkpoint_id} in {directory!r}, got "
                f"{type(exc).__name__}: {exc}; what it wrote was deleted"
            ) from exc
        finally:
            self.storage.filesystem.delete(intent)
        for backend in self.backends:  # rule 3: ignored by the backends
            backend.notify_checkpoint_complete(checkpoint_id)
        return metadata

    def delete_savepoint(self, directory: str) -> None:
        """Delete a savepoint directory (the user's call: the job never needs it)."""
        metadata = read_metadata(self.storage.filesystem, directory)
        if metadata.kind != "savepoint":
            raise InvalidArgumentError(
                f"expected a savepoint directory, {directory!r} holds checkpoint "
                f"{metadata.checkpoint_id}"
            )
        if any(c.directory == directory.rstrip("/") for c in self._completed):
            raise InvalidArgumentError(
                f"expected a savepoint the job does not own, {directory!r} was restored in "
                "CLAIM mode and is retained as a checkpoint"
            )
        self.storage.filesystem.delete_dir(directory)

    # --------------------------------------------------------------- queries

    @property
    def completed_checkpoints(self) -> list[CompletedCheckpoint]:
        """The retained checkpoints, oldest first."""
        return list(self._completed)

    @property
    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        return self._completed[-1] if self._completed else None

    @property
    def pending_checkpoints(self) -> list[int]:
        return sorted(self._pending)

    def pending_location(self, checkpoint_id: int) -> SnapshotLocation:
        return self._pending_checkpoint(checkpoint_id).location

    def close(self) -> None:
        """Abort every pending checkpoint."""
        for checkpoint_id in list(self._pending):
            self.abort_checkpoint(checkpoint_id)

    def __repr__(self) -> str:
        return (
            f"<CheckpointCoordinator {self.storage.job_dir!r} retained "
            f"{[c.checkpoint_id for c in self._completed]} pending "
            f"{sorted(self._pending)}>"
        )

    # ------------------------------------------------------ restore, recover

    @classmethod
    def restore(
        cls,
        storage: CheckpointStorage,
        backends: Sequence[CheckpointingBackend],
        directory: str,
        mode: RestoreMode,
        *,
        num_retained: int = 1,
        timeout: float = 600.0,
    ) -> CheckpointCoordinator:
        """Start a job from the checkpoint or savepoint in ``directory`` (rule 7).

        Every subtask restores the handles meeting its key groups (any
        parallelism: rescaling). CLAIM puts the snapshot in the store, owned;
        NO_CLAIM forces the first checkpoint to be full and never touches the
        snapshot; LEGACY lets later checkpoints build on its files and never
        deletes them.
        """
        if not isinstance(mode, RestoreMode):
            raise InvalidArgumentError(
                f"expected a RestoreMode (CLAIM, NO_CLAIM, LEGACY), got {mode!r}"
            )
        metadata = read_metadata(storage.filesystem, directory)
        if storage.checkpoint_ids_on_disk() or storage.read_restore_record() is not None:
            raise InvalidArgumentError(
                f"expected a new job directory to restore into, {storage.job_dir!r} already "
                "holds checkpoints of a job: recover() it, or use another job id"
            )
        coordinator = cls(storage, backends, num_retained=num_retained, timeout=timeout)
        record = RestoreRecord(
            directory=directory.rstrip("/"),
            mode=mode,
            checkpoint_id=metadata.checkpoint_id,
            kind=metadata.kind,
        )
        coordinator._start_from(record.directory, metadata, mode)
        storage.write_restore_record(record)
        coordinator.restored_from = record
        return coordinator

    @classmethod
    def recover(
        cls,
        storage: CheckpointStorage,
        backends: Sequence[CheckpointingBackend],
        *,
        num_retained: int = 1,
        timeout: float = 600.0,
    ) -> CheckpointCoordinator:
        """Rebuild after a crash from what is on disk (module doc) and restore the
        backends from the newest retained checkpoint, or else from the snapshot
        the job was restored from, or else leave them empty."""
        coordinator = cls(storage, backends, num_retained=num_retained, timeout=timeout)
        coordinator._recover()
        return coordinator

    # -------------------------------------------------------- private helpers

    def _recover(self) -> None:
        """``recover``'s work on the new coordinator."""
        storage = self.storage
        self._delete_interrupted_savepoint()
        record = storage.read_restore_record()
        self.restored_from = record
        own = storage.completed_checkpoints()
        retained = own[-self.num_retained :]
        if record is not None:
            self._last_id = max(self._last_id, record.checkpoint_id)
        if own:
            self._last_id = max(self._last_id, own[-1].checkpoint_id)
        # The restored snapshot: still in the store (CLAIM, nothing newer subsumed it)?
        if record is not None and storage.filesystem.exists(
            storage.filesystem.join(record.directory, METADATA_FILE)
        ):
            restored = read_metadata(storage.filesystem, record.directory)
            if record.mode is RestoreMode.CLAIM:
                self._retain(
                    CompletedCheckpoint(restored.checkpoint_id, record.directory, restored)
                )
            else:
                self.registry.disown(f.path for f in restored.files if not f.relative)
            if not own:
                self.force_full = record.mode is RestoreMode.NO_CLAIM
        for metadata in retained:
            self._retain(
                CompletedCheckpoint(
                    metadata.checkpoint_id, storage.checkpoint_dir(metadata.checkpoint_id), metadata
                )
            )
        # A CLAIMed snapshot the crash caught while it was being subsumed: finish that.
        self._subsume()
        self._delete_garbage(record)
        latest = self.latest_checkpoint
        if latest is not None:  # the job's own, or the CLAIMed snapshot
            source = SnapshotSource(storage.filesystem, latest.directory)
            _restore_backends(
                self.backends,
                latest.metadata,
                source,
                incremental_base=latest.metadata.kind == "checkpoint",
            )
        elif record is not None:
            restored = read_metadata(storage.filesystem, record.directory)
            source = SnapshotSource(storage.filesystem, record.directory)
            _restore_backends(
                self.backends, restored, source, incremental_base=restored.kind == "checkpoint"
            )
        storage.write_counter(self._last_id)

    def _start_from(self, directory: str, metadata: CheckpointMetadata, mode: RestoreMode) -> None:
        if metadata.max_parallelism != self.max_parallelism:
            raise MaxParallelismMismatchError(
                f"expected a snapshot of max parallelism {self.max_parallelism}, got one of "
                f"{metadata.max_parallelism}: the number of key groups cannot change"
            )
        source = SnapshotSource(self.storage.filesystem, directory)
        _restore_backends(
            self.backends, metadata, source, incremental_base=metadata.kind == "checkpoint"
        )
        self._last_id = max(self._last_id, metadata.checkpoint_id)
        self.storage.write_counter(self._last_id)
        if mode is RestoreMode.CLAIM:
            completed = CompletedCheckpoint(metadata.checkpoint_id, directory, metadata)
            self.registry.register(metadata.checkpoint_id, completed.shared_paths)
            self.registry.disown(metadata.disowned)  # not its job's to give away
            self._completed.append(completed)
        else:
            self.registry.disown(f.path for f in metadata.files if not f.relative)
            self.force_full = mode is RestoreMode.NO_CLAIM

    def _retain(self, completed: CompletedCheckpoint) -> None:
        """Put ``completed`` in the store: register its shared files (rule 5) and
        never delete those its job does not own (rule 7)."""
        self.registry.register(completed.checkpoint_id, completed.shared_paths)
        self.registry.disown(completed.metadata.disowned)
        self._completed.append(completed)

    def _next_id(self) -> int:
        self._last_id += 1
        self.storage.write_counter(self._last_id)
        return self._last_id

    def _pending_checkpoint(self, checkpoint_id: int) -> PendingCheckpoint:
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            raise UnknownCheckpointError(
                f"expected a pending checkpoint id ({sorted(self._pending) or 'none'}), got "
                f"{checkpoint_id}"
            )
        return pending

    def _subsume(self) -> None:
        """Drop the oldest checkpoints beyond ``num_retained`` (rule 5)."""
        filesystem = self.storage.filesystem
        while len(self._completed) > self.num_retained:
            oldest = self._completed.pop(0)
            for path in self.registry.unregister(oldest.checkpoint_id):
                filesystem.delete(path)
            if oldest.owned:
                filesystem.delete_dir(oldest.directory)

    def _delete_garbage(self, record: RestoreRecord | None) -> None:
        """Delete every file of the job directory no retained checkpoint (nor the
        snapshot the job was restored from) uses."""
        filesystem = self.storage.filesystem
        keep = {
            self.storage.filesystem.join(self.storage.job_dir, name)
            for name in ("_counter", "_restore")
        }
        snapshots = [(c.directory, c.metadata) for c in self._completed]
        if record is not None and filesystem.exists(
            filesystem.join(record.directory, METADATA_FILE)
        ):
            snapshots.append((record.directory, read_metadata(filesystem, record.directory)))
        for directory, metadata in snapshots:
            keep.add(filesystem.join(directory, METADATA_FILE))
            keep.update(SnapshotSource(filesystem, directory).path(f) for f in metadata.files)
        for path in self.storage.files():
            if path not in keep:
                filesystem.delete(path)
        for checkpoint_id in self.storage.checkpoint_ids_on_disk():
            directory = self.storage.checkpoint_dir(checkpoint_id)
            if not filesystem.list_files(directory):
                filesystem.delete_dir(directory)

    def _delete_interrupted_savepoint(self) -> None:
        """A savepoint a crash interrupted left a directory without ``_metadata``:
        not a savepoint, so recovery deletes it."""
        filesystem = self.storage.filesystem
        intent = filesystem.join(self.storage.job_dir, "_savepoint")
        if filesystem.exists(intent):
            directory = filesystem.read_bytes(intent).decode("utf-8")
            if not filesystem.exists(filesystem.join(directory, METADATA_FILE)):
                filesystem.delete_dir(directory)
            filesystem.delete(intent)


def _check_backends(backends: Sequence[CheckpointingBackend]) -> None:
    if not backends:
        raise InvalidArgumentError("expected at least one backend (subtask), got none")
    for backend in backends:
        if not isinstance(backend, CheckpointingBackend):
            raise InvalidArgumentError(
                f"expected backends with snapshot_to/restore_from, got {type(backend).__name__}"
            )
    max_parallelism = {b.max_parallelism for b in backends}
    if len(max_parallelism) != 1:
        raise InvalidArgumentError(
            f"expected one max parallelism for every subtask, got {sorted(max_parallelism)}"
        )
    ranges = sorted((b.key_group_range for b in backends), key=lambda r: r.start_key_group)
    for left, right in itertools.pairwise(ranges):
        if len(left.intersection(right)):
            raise InvalidArgumentError(
                f"expected disjoint key-group ranges, got {left!r} and {right!r}"
            )


def _restore_backends(
    backends: Sequence[CheckpointingBackend],
    metadata: CheckpointMetadata,
    source: SnapshotSource,
    *,
    incremental_base: bool,
) -> None:
    """Restore every subtask from the handles meeting its key groups, all or
    nothing: prepare every subtask's restore (read, verify, stage; no backend
    changes), then commit them all; on any error every prepared restore is
    discarded and every backend is as it was. A subtask builds incrementally
    on the handles only without rescaling."""
    prepared: list[PreparedRestore] = []
    try:
        for backend in backends:
            mine = overlapping(metadata.subtasks, backend.key_group_range)
            same_range = (
                len(mine) == 1
                and KeyGroupRange.of(*mine[0].key_group_range) == backend.key_group_range
            )
            prepared.append(
                backend.prepare_restore(
                    mine, source, incremental_base=incremental_base and same_range
                )
            )
    except BaseException:
        for staged in prepared:
            with contextlib.suppress(Exception):  # the first error is the one to report
                staged.discard()
        raise
    for staged in prepared:  # cheap, in memory, on verified data
        staged.commit()


def _remove_if_empty(storage: CheckpointStorage, directory: str) -> None:
    if storage.filesystem.exists(directory) and not storage.filesystem.list_files(directory):
        storage.filesystem.delete_dir(directory)
