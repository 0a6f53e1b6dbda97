"""Checkpoints and savepoints: storage, the shared-state registry, the coordinator.

- :mod:`~cowstate.checkpoint.coordinator`: ``CheckpointCoordinator`` (ids,
  pending / completed checkpoints, retention, savepoints, restore modes,
  recovery) and the rules it keeps, in its docstring;
- :mod:`~cowstate.checkpoint.recovery`: what ``recover()`` does after a crash (R1-R5);
- :mod:`~cowstate.checkpoint.storage`: a job's layout, what the job owns, reading ``_metadata``;
- :mod:`~cowstate.checkpoint.metadata`: writing ``_metadata`` (verified, sealed, atomic);
- :mod:`~cowstate.checkpoint.registry`: which retained checkpoints use each shared file;
- :mod:`~cowstate.checkpoint.handles`: file and keyed-state handles, the ``_metadata`` model;
- :mod:`~cowstate.checkpoint.sealed`: the checksum seal of ``_metadata`` and the job's documents;
- :mod:`~cowstate.checkpoint.verify`: the consistency checks M1-M9 of a ``_metadata``;
- :mod:`~cowstate.checkpoint.paths`: names read from files and confined paths, rules P1-P6;
- :mod:`~cowstate.checkpoint.location`: where a snapshot writes, and reads from;
- :mod:`~cowstate.checkpoint.filesystem`: atomic, durable writes over fsspec;
- :mod:`~cowstate.checkpoint.protocol`: what a backend must offer;
- :mod:`~cowstate.checkpoint.inspect`: ``cowstate savepoint inspect``.

Trust model. Everything read back from a checkpoint directory may be corrupt
or hostile. Before anything is restored: ``_metadata``'s seal, schema and
consistency (M1-M9) are verified; every name read from a file passes one
check before a file-system call sees it (P5); every path is resolved inside
the snapshot's directory or its job's ``shared/`` directory (P1-P4), so no
file outside is ever opened; every file's size and CRC32 are checked; every
subtask is prepared before any is committed. Deletion is confined to what
the job owns (``chk-<id>/``, ``shared/``, its bookkeeping files) plus the
listed files of a CLAIMed snapshot and the directory of a savepoint a crash
interrupted that holds the marker the savepoint wrote (R1; its intent names
it by its real path, P6) and what a failed savepoint wrote (its directory
only if it created it); completed savepoints are never deleted by
checkpointing or recovery. The seal detects accidents, not attackers:
whoever can write the directory can make a restore return wrong state from
confined files, never read, run or delete anything outside the roots --
except through ``_restore``, which names the snapshot the job started from
wherever it lives, by its absolute real path (P6: a relative, un-normal or
linked one is reported and never followed). Recovery follows it only as the
job's newest checkpoint that verifies confirms it (``restored_from``), so a
forged one is followed only before the job's first checkpoint (or beside a
resealed ``_metadata``), and then only read: a CLAIMed snapshot's files are
deleted only while its directory holds the claim marker the CLAIM restore
wrote there.
"""

from cowstate.checkpoint.coordinator import (
    CheckpointCoordinator,
    CompletedCheckpoint,
    PendingCheckpoint,
)
from cowstate.checkpoint.filesystem import AtomicOutputStream, FileSystem
from cowstate.checkpoint.handles import (
    METADATA_FILE,
    CheckpointMetadata,
    FileHandle,
    KeyedStateHandle,
    RestoreMode,
    SnapshotOptions,
    StateInfo,
)
from cowstate.checkpoint.inspect import format_report, inspect_snapshot
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.checkpoint.protocol import CheckpointingBackend
from cowstate.checkpoint.registry import SharedStateRegistry
from cowstate.checkpoint.storage import CheckpointStorage, read_metadata

__all__ = [
    "METADATA_FILE",
    "AtomicOutputStream",
    "CheckpointCoordinator",
    "CheckpointMetadata",
    "CheckpointStorage",
    "CheckpointingBackend",
    "CompletedCheckpoint",
    "FileHandle",
    "FileSystem",
    "KeyedStateHandle",
    "PendingCheckpoint",
    "RestoreMode",
    "SharedStateRegistry",
    "SnapshotLocation",
    "SnapshotOptions",
    "SnapshotSource",
    "StateInfo",
    "format_report",
    "inspect_snapshot",
    "read_metadata",
]
