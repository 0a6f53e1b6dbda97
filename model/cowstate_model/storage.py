"""``ReferenceStorage``: the meaning of checkpoints and savepoints.

Every snapshot is the logical contents of the job's state at its synchronous
moment -- ``{state name: {(key, namespace): state}}`` -- and the model says
which snapshots exist:

- a checkpoint exists from its completion until ``num_retained`` newer ones
  completed (the oldest goes first); a pending checkpoint never exists, and
  completing checkpoint N drops every pending one older than N;
- a savepoint exists from its completion until the user deletes it, or, if a
  job restored it in CLAIM mode, until that job subsumes it;
- when a job is restored from a snapshot, the old job stops: its pending
  checkpoints are gone and its retained ones stay where they are (nobody
  deletes them any more); CLAIM moves the source into the new job's retained
  list, NO_CLAIM and LEGACY leave it where it was;
- after a crash the job recovers to its newest retained checkpoint, or else
  to the snapshot it was restored from, or else to nothing;
- a power loss that tears the newest checkpoint's ``_metadata`` ends that
  checkpoint: the next recovery falls back to the one before it.

Snapshots are named by where they live (``chk-<id>`` directories of a job,
savepoint directories), as strings the caller chooses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Contents", "ReferenceStorage", "Snapshot"]

Contents = Mapping[str, Mapping[tuple[Any, Any], Any]]


@dataclass(frozen=True)
class Snapshot:
    """One snapshot: its id, where it lives, and what it holds."""

    checkpoint_id: int
    directory: str
    contents: Contents
    kind: str = "checkpoint"  # or "savepoint"


@dataclass
class ReferenceStorage:
    """Which snapshots exist, and what each one holds (see the module doc)."""

    num_retained: int
    pending: dict[int, Snapshot] = field(default_factory=dict)
    retained: list[Snapshot] = field(default_factory=list)
    savepoints: dict[str, Snapshot] = field(default_factory=dict)
    #: Retained checkpoints of jobs that stopped: still on disk, still restorable.
    orphaned: dict[str, Snapshot] = field(default_factory=dict)
    #: What the running job was restored from, and the mode.
    restored_from: tuple[Snapshot, str] | None = None

    # ---------------------------------------------------------- checkpoints

    def trigger(self, snapshot: Snapshot) -> None:
        self.pending[snapshot.checkpoint_id] = snapshot

    def complete(self, checkpoint_id: int) -> None:
        self.retained.append(self.pending.pop(checkpoint_id))
        for older in [i for i in self.pending if i < checkpoint_id]:
            del self.pending[older]
        while len(self.retained) > self.num_retained:
            self.retained.pop(0)

    def abort(self, checkpoint_id: int) -> None:
        del self.pending[checkpoint_id]

    # ----------------------------------------------------------- savepoints

    def savepoint(self, snapshot: Snapshot) -> None:
        self.savepoints[snapshot.directory] = snapshot

    def delete_savepoint(self, directory: str) -> None:
        del self.savepoints[directory]

    # ------------------------------------------------------ restore, crash

    def restore(self, directory: str, mode: str) -> Snapshot:
        """A new job starts from the snapshot in ``directory``; returns it."""
        source = self.existing()[directory]
        for snapshot in self.retained:
            self.orphaned[snapshot.directory] = snapshot
        self.pending.clear()
        self.retained = []
        if mode == "claim":
            self.savepoints.pop(directory, None)
            self.orphaned.pop(directory, None)
            self.retained = [source]
        self.restored_from = (source, mode)
        return source

    def tear_newest(self) -> Snapshot:
        """A power loss tore the newest checkpoint's ``_metadata``: it no longer
        exists (recovery falls back to the one before it)."""
        return self.retained.pop()

    def crash(self) -> Contents:
        """The job crashed: what it recovers to."""
        self.pending.clear()
        if self.retained:
            return self.retained[-1].contents
        if self.restored_from is not None:
            return self.restored_from[0].contents
        return {}

    # ------------------------------------------------------------- queries

    def existing(self) -> dict[str, Snapshot]:
        """Every snapshot that exists, by directory."""
        found = dict(self.orphaned)
        found.update(self.savepoints)
        found.update((s.directory, s) for s in self.retained)
        return found

    def is_owned_by_the_job(self, directory: str) -> bool:
        return any(s.directory == directory for s in self.retained)
