"""The checkpoint coordinator: ids, pending and completed checkpoints, retention,
savepoints, restore modes and recovery (Flink's ``CheckpointCoordinator`` and
completed-checkpoint store, for the keyed state of one job's subtasks).

Lifecycle of checkpoint N::

    trigger_checkpoint()      next id from the one counter (checkpoints and
                              savepoints alike); every subtask's
                              backend.snapshot_to(N, location, options) takes
                              its synchronous part, and its writer thread
                              writes into chk-N/ and shared/ and makes the
                              subtask's KeyedStateHandle
                              (:mod:`~cowstate.checkpoint.protocol`)
    complete_checkpoint(N)    wait for every subtask's handle (acknowledge),
                              write chk-N/_metadata (write_metadata:
                              :mod:`~cowstate.checkpoint.metadata`) -- now N
                              exists -- register its shared files, abort
                              older pending checkpoints, subsume beyond
                              num_retained, confirm N to the backends
    abort_checkpoint(N)       cancel the writers, delete exactly what N wrote
                              (never a file a completed checkpoint uses), tell
                              the backends to drop N

The walk of checkpoint N from ``trigger_checkpoint`` to the sealed
``_metadata``, one heap subtask: each hop a call into another function of
cowstate's (not walked: argument checks, records' constructors, the insides
of a table snapshot, of the snapshot file's writer and of a file stream).
19 hops in 11 files (before the one checkpoint surface: 21 hops in 11 files,
the heap backend entered three times through two ``functools.partial`` and
a future adapter's callback); ``tests/test_checkpoint_rules.py`` traces it::

    caller  coordinator.py        CheckpointCoordinator.trigger_checkpoint
     1      storage.py            CheckpointStorage.checkpoint_location
     2      heap_backend.py       HeapKeyedStateBackend.snapshot_to
     3      heap_backend.py       HeapKeyedStateBackend._snapshot_tables
     4      state_table.py        CopyOnWriteStateTable.snapshot
     5      keyed_backend.py      AbstractKeyedStateBackend._start_async
     6  w   keyed_backend.py      AbstractKeyedStateBackend._run_async
     7  w   heap_backend.py       HeapKeyedStateBackend._write_to
     8  w   location.py           SnapshotLocation.exclusive_stream
     9  w   writer.py             write_snapshot
    10  w   location.py           LocationStream.close_and_get_handle
    11  w   heap_backend.py       HeapKeyedStateBackend._handle_of
    12      coordinator.py        CheckpointCoordinator.complete_checkpoint
    13      coordinator.py        CheckpointCoordinator.acknowledge
    14      coordinator.py        _every_subtask
    15      metadata.py           write_metadata
    16      metadata.py           render_metadata
    17      verify.py             verify_metadata
    18      sealed.py             seal
    19      filesystem.py         FileSystem.write_bytes

(``w``: on the backend's writer thread; the rest on the caller's. Hop 12 is
the caller's second call; 13 waits for the future that hop 6 resolves.)

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
   A failed savepoint likewise deletes its files and marker, and its
   directory only if it created it -- at its real path, so never a link
   nor a directory the user made -- and a deletion that fails too leaves
   the intent for recovery; the caller sees the savepoint's own error.
5. Subsuming a checkpoint deletes its exclusive files and exactly the shared
   files no retained checkpoint uses (:class:`~cowstate.checkpoint.registry.SharedStateRegistry`)
   and no pending checkpoint may use. A pending checkpoint may reuse any
   shared file retained when it was triggered (rule 1: the last confirmed
   checkpoint's), exactly those its handles name once it is acknowledged;
   a file subsumed while a pending checkpoint may use it is kept
   (``deferred``) and deleted once that checkpoint completes without it or
   is aborted.
6. Deleting a savepoint never breaks a retained checkpoint (no checkpoint
   references a savepoint file); checkpointing and recovery never delete a
   savepoint file (savepoints are not in the store, unless CLAIMed, and a
   savepoint directory may not lie inside what the job owns).
7. Restore modes: CLAIM -- the restored snapshot joins the store, owned, and
   is subsumed like a checkpoint; NO_CLAIM -- its files are never deleted,
   the first successful checkpoint is full (``force_full``: the backends
   restore a checkpoint as their incremental base in every mode, and a forced
   full checkpoint uploads everything instead of reusing it), and a failed
   one leaves the next full too; LEGACY -- later checkpoints may build on its
   files, which are never deleted.

8. Deletion is confined: the coordinator deletes only inside what the job
   owns (``chk-<id>/``, ``shared/``, its own files of the job directory;
   :meth:`CheckpointStorage.owns`), plus the files a CLAIMed snapshot's
   verified ``_metadata`` lists -- and those only while the snapshot's
   directory holds the claim marker ``.cowstate-claimed-<token>`` that
   :meth:`CheckpointCoordinator.restore` wrote there with the token of the
   job's ``_restore`` record: a record forged or copied to name another
   snapshot in CLAIM mode finds no marker and owns nothing. A second CLAIM
   of the same snapshot (by another job) replaces the marker: one owner at
   a time, and the earlier job no longer deletes it. Subsuming the claimed
   snapshot deletes its files and marker and *settles* the claim: the
   claimed shared files the job's checkpoints still use are the job's from
   then on. The checkpoint whose completion settles it records that in its
   ``_metadata`` (``restored_from.settled``, as do the ones after), so
   recovery knows it once the marker is gone. Anything else a
   registry or document names is left alone and reported in
   ``refused_deletions``.
9. Nothing is deleted before what replaces it is verified: recovery restores
   first, then subsumes and collects garbage.
10. A subtask holding no key group (an empty key-group range: an operator
    its split left none) holds no keyed state, so its backend is never asked
    to snapshot or restore. Its handle in every checkpoint and savepoint is
    the empty one -- no state, no file; the backend, format and key
    serializer of the others (M4, M9 of :mod:`~cowstate.checkpoint.verify`)
    -- and a restore or recovery leaves it as it is while the others
    restore. The constructor, ``restore`` and ``recover`` take such subtasks
    beside those holding every key group between them.

Arguments. Every path, name, id and number a caller gives is checked before
anything is read or written (P5 of :mod:`~cowstate.checkpoint.paths` for
paths and names): a bad one is an :class:`InvalidArgumentError` saying what
was expected and what came. A directory the job records to find again --
a savepoint's, the snapshot it is restored from -- is recorded by its
absolute real path (P6), never by a name relative to the working directory.

Recovery (:meth:`CheckpointCoordinator.recover`, steps R1-R5 in
:mod:`~cowstate.checkpoint.recovery`) rebuilds a coordinator after a crash
from what is on disk. It tries the completed checkpoints newest first
(then the snapshot the job was restored from): the first whose ``_metadata``
and files verify and restore into every backend (all or nothing) wins; each
one passed over is reported in :attr:`CheckpointCoordinator.recovery` with the
reason. A configuration error (a serializer or max-parallelism mismatch) is
not corruption and stops recovery at once. Only then does it rebuild the
store and registry, and delete what the job owns and no retained checkpoint
uses: unfinished and passed-over checkpoints, temporary files, uploads of
failed checkpoints, an interrupted savepoint (only if its directory carries
the savepoint's own marker). If checkpoints exist but none verifies, it raises
and deletes nothing.

The coordinator runs on one thread; the backends write on their own.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Literal

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import (
    METADATA_FILE,
    CheckpointMetadata,
    KeyedStateHandle,
    RestoreMode,
    SnapshotOptions,
)
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.checkpoint.metadata import write_metadata
from cowstate.checkpoint.paths import check_argument
from cowstate.checkpoint.protocol import CheckpointingBackend, PreparedRestore, overlapping
from cowstate.checkpoint.recovery import Recovery, RecoveryReport, Skipped
from cowstate.checkpoint.registry import SharedStateRegistry
from cowstate.checkpoint.storage import (
    CLAIM_MARKER,
    SAVEPOINT_MARKER,
    CheckpointStorage,
    RestoreRecord,
    SavepointIntent,
    read_metadata,
)
from cowstate.errors import (
    CheckpointError,
    CowStateError,
    InvalidArgumentError,
    UnknownCheckpointError,
    UnsafePathError,
)
from cowstate.key_groups import KeyGroupRange
from cowstate.snapshot.compat import check_max_parallelism

__all__ = [
    "SAVEPOINT_MARKER",
    "CheckpointCoordinator",
    "CompletedCheckpoint",
    "PendingCheckpoint",
    "Recovery",
    "RecoveryReport",
    "Skipped",
    "claim_marker",
]


@dataclass
class PendingCheckpoint:
    """A triggered checkpoint whose subtasks are writing (or have written)."""

    checkpoint_id: int
    location: SnapshotLocation
    options: SnapshotOptions
    #: One per subtask that holds key groups (rule 10), in the order of ``indices``.
    futures: list[Future[KeyedStateHandle]]
    acknowledged: dict[int, KeyedStateHandle] = field(default_factory=dict)
    #: The shared paths retained when it was triggered: all it may reuse (rule 5).
    reusable: frozenset[str] = frozenset()
    #: The index among the job's subtasks of each future's subtask.
    indices: list[int] = field(default_factory=list)

    @property
    def is_acknowledged(self) -> bool:
        return len(self.acknowledged) == len(self.futures)

    def may_use(self, filesystem: FileSystem) -> frozenset[str]:
        """The retained shared paths it may reference (rule 5): once
        acknowledged, the ones its handles name; before, or if a handle names
        an unconfined file, every one it could have reused."""
        if not self.is_acknowledged:
            return self.reusable
        source = SnapshotSource(filesystem, self.location.directory)
        try:
            named = {
                source.lexical_path(f)
                for handle in self.acknowledged.values()
                for f in handle.shared_files
            }
        except CowStateError:
            return self.reusable
        return self.reusable & named


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint in the store: where it is and whether the job owns its files."""

    checkpoint_id: int
    directory: str
    metadata: CheckpointMetadata
    #: Owned snapshots are deleted when subsumed (the job's own checkpoints, and
    #: a snapshot restored in CLAIM mode).
    owned: bool = True

    def source(self, filesystem: FileSystem) -> SnapshotSource:
        return SnapshotSource(filesystem, self.directory)

    def shared_paths(self, filesystem: FileSystem) -> list[str]:
        """The resolved paths of the shared files it uses (the registry's keys)."""
        source = self.source(filesystem)
        return sorted({source.lexical_path(f) for f in self.metadata.files if f.scope == "shared"})


class CheckpointCoordinator:
    """Checkpoints and savepoints of one job's subtasks (see the module doc)."""

    #: The registry of shared files (a subclass may bring another).
    registry_class: type[SharedStateRegistry] = SharedStateRegistry
    #: What ``recover`` runs (a subclass may bring another).
    recovery_class: type[Recovery] = Recovery

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
        _check_timeout(timeout, "a timeout in seconds > 0", positive=True)
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
        #: What ``recover`` did (None for a coordinator that did not recover).
        self.recovery: RecoveryReport | None = None
        #: Resolved paths outside what the job owns that the coordinator may
        #: delete: the listed files of snapshots restored in CLAIM mode (rule 8).
        self._claimed: set[str] = set()
        #: A CLAIM record whose snapshot holds no claim marker (rule 8): the
        #: snapshot's files are treated as not owned, never deleted.
        self.unconfirmed_claim: str | None = None
        #: Paths a registry or document asked to delete and rule 8 refused.
        self.refused_deletions: list[str] = []
        #: Shared paths no retained checkpoint uses that a pending one may (rule 5).
        self.deferred: set[str] = set()

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
        pending = PendingCheckpoint(
            checkpoint_id, location, options, [], reusable=self.registry.paths
        )
        self._pending[checkpoint_id] = pending
        try:
            for index, backend in enumerate(self.backends):
                if len(backend.key_group_range):  # rule 10: one that holds none is not asked
                    pending.futures.append(backend.snapshot_to(checkpoint_id, location, options))
                    pending.indices.append(index)
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
        _check_timeout(timeout, "a timeout in seconds >= 0 or None")
        done, not_done = wait(pending.futures, timeout=self.timeout if timeout is None else timeout)
        failure: BaseException | None = None
        if not_done:
            failure = TimeoutError(f"{len(not_done)} subtasks did not finish in time")
        for index, future in enumerate(pending.futures):
            if future in done and failure is None:
                if future.cancelled():
                    failure = CheckpointError(f"subtask {pending.indices[index]} was cancelled")
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
        self._release_deferred()  # it now names what it uses (rule 5)

    def complete_checkpoint(
        self, checkpoint_id: int, timeout: float | None = None
    ) -> CompletedCheckpoint:
        """Acknowledge, write ``_metadata``, register, subsume, confirm (module doc)."""
        pending = self._pending_checkpoint(checkpoint_id)
        _check_timeout(timeout, "a timeout in seconds >= 0 or None")
        if not pending.is_acknowledged:
            self.acknowledge(checkpoint_id, timeout)
        subtasks = _every_subtask(
            self.backends, [pending.acknowledged[i] for i in range(len(pending.futures))]
        )
        source = SnapshotSource(self.storage.filesystem, pending.location.directory)
        try:
            disowned = sorted(
                {
                    f.path
                    for h in subtasks
                    for f in h.shared_files
                    if not self.registry.is_owned(source.lexical_path(f))
                }
            )
        except CowStateError as exc:
            self.abort_checkpoint(checkpoint_id)
            raise CheckpointError(
                f"expected checkpoint {checkpoint_id}'s handles to name confined files, got "
                f"{type(exc).__name__}: {exc}; the checkpoint was aborted"
            ) from exc
        restored_from = self.restored_from
        if restored_from is not None and self._settles_claim():  # rule 8
            restored_from = restored_from.model_copy(update={"settled": True})
        metadata = CheckpointMetadata(
            job_id=self.storage.job_id,
            checkpoint_id=checkpoint_id,
            kind="checkpoint",
            max_parallelism=self.max_parallelism,
            timestamp=time.time(),
            subtasks=subtasks,
            disowned=tuple(disowned),
            restored_from=restored_from,
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
        self.restored_from = restored_from
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
        pending = self._pending_checkpoint(checkpoint_id)
        del self._pending[checkpoint_id]
        for future in pending.futures:
            future.cancel()
        wait(pending.futures, timeout=self.timeout)  # writers stop touching files
        pending.location.discard()
        self.storage.filesystem.delete_dir(pending.location.directory)
        self._release_deferred()  # what it kept (rule 5)
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

        ``directory`` must be new (absent or empty) and outside what the job
        owns (``CheckpointStorage.savepoint_location``). It is written at its
        real path (links resolved once, before anything is written). Its id
        comes from the same counter as checkpoints; every file is exclusive
        and relative, it is not registered and not in the store. While it is
        written, the job directory's ``_savepoint`` intent (that real path,
        P6) and the directory's marker file carry one token, so recovery can
        remove an interrupted savepoint and nothing else (R1). On failure
        what it wrote is deleted -- its files and marker, and the directory
        only if the savepoint created it -- and :class:`CheckpointError`
        raised with the cause (a deletion that fails too is named in it, and
        the intent is kept for recovery to finish).
        """
        if savepoint_format not in ("canonical", "native"):
            raise InvalidArgumentError(
                f"expected a savepoint format 'canonical' or 'native', got {savepoint_format!r}"
            )
        _check_timeout(timeout, "a timeout in seconds >= 0 or None")
        given = self.storage.savepoint_location(directory)  # a name, not the job's, new
        recorded = self.storage.recorded_directory(given.directory, "a savepoint directory")
        filesystem = self.storage.filesystem
        location = SnapshotLocation(filesystem, recorded, None)  # where the intent says
        created = not filesystem.exists(recorded)  # else the user's: it stays (rule 4)
        options = SnapshotOptions(kind="savepoint", format=savepoint_format)
        futures: list[Future[KeyedStateHandle]] = []
        token = uuid.uuid4().hex
        marker = filesystem.join(recorded, SAVEPOINT_MARKER + token)
        checkpoint_id = self._last_id + 1
        try:
            checkpoint_id = self._next_id()
            self.storage.write_savepoint_intent(SavepointIntent(directory=recorded, token=token))
            filesystem.create_empty(marker)  # no temporary name: R1 looks for this name only
            for backend in self.backends:
                if len(backend.key_group_range):  # rule 10
                    futures.append(backend.snapshot_to(checkpoint_id, location, options))
            _done, not_done = wait(futures, timeout=self.timeout if timeout is None else timeout)
            if not_done:
                raise TimeoutError(f"{len(not_done)} subtasks did not finish in time")
            metadata = CheckpointMetadata(
                job_id=self.storage.job_id,
                checkpoint_id=checkpoint_id,
                kind="savepoint",
                savepoint_format=savepoint_format,
                max_parallelism=self.max_parallelism,
                timestamp=time.time(),
                subtasks=_every_subtask(self.backends, [future.result() for future in futures]),
            )
            write_metadata(filesystem, recorded, metadata)
        except Exception as exc:
            for future in futures:
                future.cancel()
            wait(futures, timeout=self.timeout)
            left = _discard_savepoint(self.storage, location, marker, created=created)
            raise CheckpointError(
                f"expected savepoint {checkpoint_id} in {directory!r}, got "
                f"{type(exc).__name__}: {exc}; "
                + (
                    "what it wrote was deleted"
                    if not left
                    else f"what it wrote was deleted but for {'; '.join(left)} (its intent is "
                    "kept: recovery removes the savepoint if its marker is left)"
                )
            ) from exc
        filesystem.delete(marker)
        filesystem.delete(self.storage.savepoint_intent_path)
        for backend in self.backends:  # rule 3: ignored by the backends
            backend.notify_checkpoint_complete(checkpoint_id)
        return metadata

    def delete_savepoint(self, directory: str) -> None:
        """Delete a savepoint directory (the user's call: the job never needs it),
        once its ``_metadata`` verifies as a savepoint outside what the job owns."""
        if not isinstance(directory, str) or not directory.strip("/"):
            raise InvalidArgumentError(f"expected a savepoint directory, got {directory!r}")
        check_argument(directory, "a savepoint directory")  # P5
        filesystem = self.storage.filesystem
        metadata = read_metadata(filesystem, directory)
        if metadata.kind != "savepoint":
            raise InvalidArgumentError(
                f"expected a savepoint directory, {directory!r} holds checkpoint "
                f"{metadata.checkpoint_id}"
            )
        if any(self.storage.is_same_directory(c.directory, directory) for c in self._completed):
            raise InvalidArgumentError(
                f"expected a savepoint the job does not own, {directory!r} was restored in "
                "CLAIM mode and is retained as a checkpoint"
            )
        if self.storage.relation(directory) not in ("outside", "foreign"):
            raise UnsafePathError(
                f"expected a savepoint directory outside what job {self.storage.job_id!r} "
                f"owns, got {directory!r}"
            )
        filesystem.delete_dir(directory)

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
        parallelism: rescaling), all or nothing. CLAIM puts the snapshot in
        the store, owned; NO_CLAIM forces the first checkpoint to be full and
        never touches the snapshot; LEGACY lets later checkpoints build on its
        files and never deletes them. A checkpoint under another storage root
        is never built on (its shared paths resolve against its own root).
        ``directory`` is read, claimed and recorded in ``_restore`` at its
        real path (P6: links resolved once, here), so recovery from any
        working directory finds the same snapshot.
        """
        if not isinstance(directory, str) or not directory:
            raise InvalidArgumentError(f"expected a snapshot directory, got {directory!r}")
        check_argument(directory, "a snapshot directory")  # P5
        if not isinstance(mode, RestoreMode):
            raise InvalidArgumentError(
                f"expected a RestoreMode (CLAIM, NO_CLAIM, LEGACY), got {mode!r}"
            )
        # The constructor checks storage, backends and num_retained, and writes nothing.
        coordinator = cls(storage, backends, num_retained=num_retained, timeout=timeout)
        # P6: read and record the snapshot at its real path, never one relative to
        # the working directory of whoever recovers the job later
        directory = storage.recorded_directory(directory, "a snapshot directory")
        metadata = read_metadata(storage.filesystem, directory)
        if storage.checkpoint_ids_on_disk() or storage.read_restore_record() is not None:
            raise InvalidArgumentError(
                f"expected a new job directory to restore into, {storage.job_dir!r} already "
                "holds checkpoints of a job: recover() it, or use another job id"
            )
        record = RestoreRecord(
            directory=directory,
            mode=mode,
            checkpoint_id=metadata.checkpoint_id,
            kind=metadata.kind,
            token=uuid.uuid4().hex if mode is RestoreMode.CLAIM else "",
        )
        coordinator._check_max_parallelism(metadata)
        marker = claim_marker(storage.filesystem, record)
        if marker is not None:  # rule 8: the claim, recorded where the files are
            storage.filesystem.write_bytes(marker, b"")
        try:
            coordinator._restore_from(record.directory, metadata)
        except BaseException:
            if marker is not None:
                storage.filesystem.delete(marker)
            raise
        if marker is not None:  # rule 8: one owner at a time; an older claim is revoked
            for path in storage.filesystem.list_dir(record.directory):
                name = storage.filesystem.name(path)
                if name.startswith(CLAIM_MARKER) and path != marker:
                    storage.filesystem.delete(path)
        coordinator._adopt(record, metadata, has_own_checkpoints=False)
        coordinator._last_id = max(coordinator._last_id, metadata.checkpoint_id)
        storage.write_counter(coordinator._last_id)
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
        """Rebuild after a crash from what is on disk (module doc): restore the
        backends from the newest checkpoint that verifies, else from the
        snapshot the job was restored from, else -- a job that never
        checkpointed nor was restored -- leave them empty (none of them
        restoring is a ``CorruptCheckpointError``, R3); then clean up.
        ``coordinator.recovery`` says what was restored and skipped."""
        coordinator = cls(storage, backends, num_retained=num_retained, timeout=timeout)
        coordinator.recovery = coordinator.recovery_class(coordinator).run()
        return coordinator

    # -------------------------------------------------------- private helpers

    def _check_max_parallelism(self, metadata: CheckpointMetadata) -> None:
        check_max_parallelism(self.max_parallelism, metadata.max_parallelism, of_job=True)  # C1

    def _restore_from(self, directory: str, metadata: CheckpointMetadata) -> None:
        """Restore every backend from the snapshot in ``directory``, building on it
        only if it is a checkpoint under this job's storage root."""
        source = SnapshotSource(self.storage.filesystem, directory)
        same_root = metadata.kind == "checkpoint" and self.storage.is_storage_root(
            source.storage_root
        )
        _restore_backends(self.backends, metadata, source, incremental_base=same_root)

    def _adopt(
        self, record: RestoreRecord, metadata: CheckpointMetadata, *, has_own_checkpoints: bool
    ) -> None:
        """Take the snapshot the job started from into account (rule 7): CLAIM
        puts it in the store, owned, with its listed files deletable (rule 8);
        otherwise its shared files are never deleted."""
        filesystem = self.storage.filesystem
        source = SnapshotSource(filesystem, record.directory)
        paths = [source.lexical_path(f) for f in metadata.files]
        marker = claim_marker(filesystem, record)
        if marker is not None and filesystem.exists(marker):  # rule 8
            self._claimed.update(paths)
            self._claimed.add(filesystem.join(record.directory, METADATA_FILE))
            self._claimed.add(marker)
            self._retain(CompletedCheckpoint(metadata.checkpoint_id, record.directory, metadata))
        else:
            if record.mode is RestoreMode.CLAIM:  # no marker: a claim nobody made here
                self.unconfirmed_claim = record.directory
            self.registry.disown(paths)
            if not has_own_checkpoints:
                self.force_full = record.mode is RestoreMode.NO_CLAIM

    def _retain(self, completed: CompletedCheckpoint) -> None:
        """Put ``completed`` in the store: register its shared files (rule 5) and
        never delete those its job does not own (rule 7)."""
        filesystem = self.storage.filesystem
        source = completed.source(filesystem)
        self.registry.register(completed.checkpoint_id, completed.shared_paths(filesystem))
        self.registry.disown(
            filesystem.join(source.storage_root, path) for path in completed.metadata.disowned
        )
        self._completed.append(completed)
        record = self.restored_from
        if record is not None and record.settled_claim:
            # rule 8: a settled claim -- the claimed files this checkpoint uses (those
            # outside the job, not disowned) are the job's; recovery learns it here
            self._claimed.update(
                path
                for path in completed.shared_paths(filesystem)
                if not self.storage.owns(path) and self.registry.is_owned(path)
            )

    def _next_id(self) -> int:
        self._last_id += 1
        self.storage.write_counter(self._last_id)
        return self._last_id

    def _pending_checkpoint(self, checkpoint_id: int) -> PendingCheckpoint:
        if type(checkpoint_id) is not int:
            raise InvalidArgumentError(
                f"expected a checkpoint id (an int), got {type(checkpoint_id).__name__} "
                f"{checkpoint_id!r}"
            )
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            raise UnknownCheckpointError(
                f"expected a pending checkpoint id ({sorted(self._pending) or 'none'}), got "
                f"{checkpoint_id}"
            )
        return pending

    def _subsume(self) -> None:
        """Drop the oldest checkpoints beyond ``num_retained`` (rules 5 and 8)."""
        filesystem = self.storage.filesystem
        while len(self._completed) > self.num_retained:
            oldest = self._completed.pop(0)
            self.deferred.update(self.registry.unregister(oldest.checkpoint_id))
            self._release_deferred()  # what no pending checkpoint may reuse, now
            if not oldest.owned:
                continue
            if self.storage.owns(oldest.directory):
                filesystem.delete_dir(oldest.directory)
            elif self._claim_holds():  # a CLAIMed snapshot elsewhere: its listed files only
                # Its marker goes with it; the shared files later checkpoints still
                # use stay claimed (rule 8), so the claim is settled from here on --
                # and every later _metadata says so (here too when recovery, keeping
                # fewer checkpoints, subsumes it: no completion predicted that).
                if self.restored_from is not None:
                    self.restored_from = self.restored_from.model_copy(update={"settled": True})
                _delete_snapshot_files(
                    filesystem, oldest.directory, oldest.metadata, allowed=self._claimed
                )
            else:  # claimed since by another job (rule 8)
                self.refused_deletions.append(oldest.directory)

    def _release_deferred(self) -> None:
        """Delete the deferred paths no retained or pending checkpoint uses (rule 5)."""
        filesystem = self.storage.filesystem
        self.deferred -= self.registry.paths  # a completed checkpoint reused them
        pending_uses = [pending.may_use(filesystem) for pending in self._pending.values()]
        for path in sorted(self.deferred.difference(*pending_uses)):
            self.deferred.discard(path)
            self._delete(path)

    def _delete(self, path: str) -> None:
        """Delete a file if rule 8 lets the job delete it; else record the refusal."""
        if self.storage.owns(path) or (path in self._claimed and self._claim_holds()):
            self.storage.filesystem.delete(path)
        else:
            self.refused_deletions.append(path)

    def _settles_claim(self) -> bool:
        """Does completing one more checkpoint subsume the snapshot this job
        CLAIMed while the claim holds, settling it (rule 8)? (What
        :meth:`_subsume` will do, asked before ``_metadata`` is written.)"""
        record = self.restored_from
        if record is None or record.mode is not RestoreMode.CLAIM or record.settled:
            return False
        subsumed = self._completed[: max(0, len(self._completed) + 1 - self.num_retained)]
        return (
            any(c.directory == record.directory and c.owned for c in subsumed)
            and not self.storage.owns(record.directory)
            and self._claim_holds()
        )

    def _claim_holds(self) -> bool:
        """Does the snapshot this job CLAIMed still hold its claim marker, or did
        this job settle the claim (rule 8)?"""
        record = self.restored_from
        if record is not None and record.settled_claim:
            return True
        marker = None if record is None else claim_marker(self.storage.filesystem, record)
        return (
            marker is not None
            and marker in self._claimed
            and self.storage.filesystem.exists(marker)
        )


def _check_timeout(timeout: object, expected: str, *, positive: bool = False) -> None:
    """Refuse a timeout that is not ``expected``: None (unless ``positive``: the
    coordinator's own), else a finite number of seconds, >= 0 or > 0."""
    if timeout is None and not positive:
        return
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout < 0
        or (positive and timeout == 0)
    ):
        raise InvalidArgumentError(f"expected {expected}, got {timeout!r}")


def _check_backends(backends: Sequence[CheckpointingBackend]) -> None:
    if isinstance(backends, str | bytes) or not isinstance(backends, Sequence):
        raise InvalidArgumentError(
            f"expected a sequence of backends (one per subtask), got {type(backends).__name__}"
        )
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
    # Which key groups, not how many: the ranges that hold key groups, in order,
    # are disjoint and follow one another from 0 to max_p - 1. An empty range
    # holds none and sorts anywhere: compared as a neighbour, it parted two
    # overlapping ranges, whose sizes then made up for key groups nobody held.
    owned = [r for r in ranges if len(r)]
    for left, right in itertools.pairwise(owned):
        if len(left.intersection(right)):
            raise InvalidArgumentError(
                f"expected disjoint key-group ranges, got {left!r} and {right!r}"
            )
    (max_p,) = max_parallelism
    bounds = [0, *(r.end_key_group + 1 for r in owned)]
    if [r.start_key_group for r in owned] != bounds[:-1] or bounds[-1] != max_p:
        raise InvalidArgumentError(
            f"expected the subtasks' key-group ranges to cover all {max_p} key groups (a job's "
            f"subtasks own every key group), got {sum(len(r) for r in ranges)}: {ranges!r}"
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
            if not len(backend.key_group_range):  # rule 10: nothing to restore, or to change
                continue
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


def _every_subtask(
    backends: Sequence[CheckpointingBackend], handles: Sequence[KeyedStateHandle]
) -> tuple[KeyedStateHandle, ...]:
    """The handle of every subtask, in order (rule 10): ``handles`` are those of
    the subtasks holding key groups; one holding none has the empty handle --
    no state, no file -- of the same backend, format and key serializer (M9)."""
    written = iter(handles)
    like = handles[0]  # some subtask holds key groups (the constructor's check)
    every = []
    for backend in backends:
        key_groups = backend.key_group_range
        if len(key_groups):
            every.append(next(written))
            continue
        every.append(
            KeyedStateHandle(
                backend=like.backend,
                format=like.format,
                key_group_range=(key_groups.start_key_group, key_groups.end_key_group),
                max_parallelism=like.max_parallelism,
                checkpoint_id=like.checkpoint_id,
                key_serializer=like.key_serializer,
                states=(),
                files=(),
                checkpointed_size=0,
                full_size=0,
            )
        )
    return tuple(every)


def _discard_savepoint(
    storage: CheckpointStorage, location: SnapshotLocation, marker: str, *, created: bool
) -> list[str]:
    """Delete what a failed savepoint wrote: every file its ``location`` recorded,
    its ``marker``, and its directory if the savepoint ``created`` it and no
    file is left there (by its real path: never a link, nor a directory the
    user made); then its intent, unless something stays. Raises nothing:
    returns what stays, each with the error that kept it."""
    filesystem = storage.filesystem
    left: list[str] = []

    def attempt(what: str, delete: Callable[[], None]) -> None:
        try:
            delete()
        except Exception as exc:  # the savepoint's own error is the one to raise
            left.append(f"{what} ({type(exc).__name__}: {exc})")

    for path in location.written:
        attempt(repr(path), functools.partial(filesystem.delete, path))
    attempt(repr(marker), functools.partial(filesystem.delete, marker))
    if created:
        attempt(
            repr(location.directory),
            functools.partial(_remove_if_empty, storage, location.directory),
        )
    if not left:
        attempt("its intent", functools.partial(filesystem.delete, storage.savepoint_intent_path))
    return left


def _remove_if_empty(storage: CheckpointStorage, directory: str) -> None:
    if storage.filesystem.exists(directory) and not storage.filesystem.list_files(directory):
        storage.filesystem.delete_dir(directory)


def claim_marker(filesystem: FileSystem, record: RestoreRecord) -> str | None:
    """The path of the claim marker of a CLAIM ``record`` (rule 8), else None."""
    if record.mode is not RestoreMode.CLAIM or not record.token:
        return None
    return filesystem.join(record.directory, f"{CLAIM_MARKER}{record.token}")


def _delete_snapshot_files(
    filesystem: FileSystem,
    directory: str,
    metadata: CheckpointMetadata,
    allowed: set[str],
) -> None:
    """Delete a CLAIMed snapshot's exclusive files, then its ``_metadata`` and
    claim marker, then the directories left empty -- never anything its document does not list,
    and only paths in ``allowed`` (rule 8)."""
    source = SnapshotSource(filesystem, directory)
    paths = [source.lexical_path(f) for f in metadata.files if f.scope == "exclusive"]
    paths.append(filesystem.join(directory, METADATA_FILE))
    paths += [  # its claim marker, last with the _metadata
        p
        for p in allowed
        if filesystem.parent(p) == directory.rstrip("/")
        and filesystem.name(p).startswith(CLAIM_MARKER)
    ]
    for path in paths:
        if path in allowed:
            filesystem.delete(path)
    parents = sorted({filesystem.parent(p) for p in paths}, key=len, reverse=True)
    for parent in parents:
        if (
            parent.startswith(directory)
            and filesystem.exists(parent)
            and not filesystem.list_dir(parent)
        ):
            filesystem.delete_dir(parent)
