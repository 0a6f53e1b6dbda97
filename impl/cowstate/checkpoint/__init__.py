"""Checkpoints and savepoints: storage, the shared-state registry, the coordinator.

- :mod:`~cowstate.checkpoint.coordinator`: ``CheckpointCoordinator`` (ids,
  pending / completed checkpoints, retention, savepoints, restore modes,
  recovery) and the rules it keeps, in its docstring;
- :mod:`~cowstate.checkpoint.storage`: a job's directory layout, ``_metadata``;
- :mod:`~cowstate.checkpoint.registry`: which retained checkpoints use each shared file;
- :mod:`~cowstate.checkpoint.handles`: file and keyed-state handles, the ``_metadata`` model;
- :mod:`~cowstate.checkpoint.location`: where a snapshot writes, and reads from;
- :mod:`~cowstate.checkpoint.filesystem`: atomic writes over fsspec;
- :mod:`~cowstate.checkpoint.protocol`: what a backend must offer;
- :mod:`~cowstate.checkpoint.inspect`: ``cowstate savepoint inspect``.
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
