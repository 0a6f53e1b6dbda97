"""Checkpoints and savepoints: storage, the shared-state registry, the coordinator."""

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
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource

__all__ = [
    "METADATA_FILE",
    "AtomicOutputStream",
    "CheckpointMetadata",
    "FileHandle",
    "FileSystem",
    "KeyedStateHandle",
    "RestoreMode",
    "SnapshotLocation",
    "SnapshotOptions",
    "SnapshotSource",
    "StateInfo",
]
