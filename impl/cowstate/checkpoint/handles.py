"""What a checkpoint or savepoint records: file handles, keyed state handles, the
``_metadata`` document, and the options a backend snapshots with.

Every model is pydantic and serializes to JSON; ``_metadata`` is a
:class:`CheckpointMetadata`, sealed with a checksum
(:mod:`~cowstate.checkpoint.sealed`), written by
:mod:`~cowstate.checkpoint.metadata` and verified before use
(:mod:`~cowstate.checkpoint.verify`). A file handle's path is always
relative (:mod:`~cowstate.checkpoint.paths`). Scopes follow Flink:

- ``exclusive``: owned by exactly one snapshot, inside its directory
  (``chk-<id>/`` or the savepoint directory); the path is relative to it;
- ``shared``: in a job's ``shared/`` directory, possibly referenced by
  several checkpoints; the path is ``<job id>/shared/<name>``, relative to
  the storage root; only the shared-state registry deletes it.

Format version 2 (version 1 held absolute paths and no checksum; it is
refused with :class:`~cowstate.errors.UnsupportedMetadataVersionError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cowstate.state_meta import SnapshotFormat, StateMetadata

__all__ = [
    "METADATA_FILE",
    "METADATA_KIND",
    "METADATA_VERSION",
    "CheckpointMetadata",
    "FileHandle",
    "KeyedStateHandle",
    "RestoreMode",
    "RestoreRecord",
    "SnapshotOptions",
    "StateInfo",
]

METADATA_FILE = "_metadata"
#: The version of the ``_metadata`` document, in its body and its seal.
METADATA_VERSION = 2
#: The kind its seal names (:mod:`~cowstate.checkpoint.sealed`).
METADATA_KIND = "metadata"

BackendName = Literal["heap", "rocksdb"]

#: The record of one state in a handle is the snapshot file's
#: (:class:`~cowstate.state_meta.StateMetadata`); the old name stays for callers.
StateInfo = StateMetadata


class RestoreMode(StrEnum):
    """Who owns the files of the snapshot a job starts from (Flink's FLIP-193)."""

    #: The job owns it: it is subsumed and deleted like the job's own checkpoints.
    CLAIM = "claim"
    #: The user owns it: never deleted, and the first checkpoint is full so that
    #: nothing depends on it afterwards.
    NO_CLAIM = "no-claim"
    #: Nobody owns it: later checkpoints may build on its files, which are
    #: never deleted.
    LEGACY = "legacy"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FileHandle(_Model):
    """One file of a snapshot."""

    #: Relative: to the snapshot directory (exclusive), to the storage root (shared).
    path: str
    size: int = Field(ge=0)
    crc32: int = Field(ge=0, lt=1 << 32)
    scope: Literal["exclusive", "shared"]
    #: The backend's own name of the file (RocksDB: ``000012.sst``, ``CURRENT``).
    local_name: str | None = None


class KeyedStateHandle(_Model):
    """The keyed state of one subtask in one snapshot."""

    backend: BackendName
    format: SnapshotFormat
    key_group_range: tuple[int, int]
    max_parallelism: int = Field(ge=1, le=1 << 15)
    checkpoint_id: int = Field(ge=0)
    key_serializer: str
    states: tuple[StateMetadata, ...]
    files: tuple[FileHandle, ...]
    #: Bytes this snapshot uploaded (an incremental checkpoint reuses the rest).
    checkpointed_size: int = Field(ge=0)
    #: Bytes of every file the handle references.
    full_size: int = Field(ge=0)
    #: The RocksDB instance lineage the handle's files come from.
    backend_uid: str | None = None

    @property
    def shared_files(self) -> tuple[FileHandle, ...]:
        return tuple(f for f in self.files if f.scope == "shared")


class RestoreRecord(_Model):
    """What a job was started from (``<job>/_restore``, and every checkpoint's
    ``restored_from``): recovery falls back to it, and only believes a
    ``_restore`` its newest checkpoint confirms."""

    directory: str
    mode: RestoreMode
    checkpoint_id: int
    kind: str
    #: CLAIM only: the token of the claim marker written into ``directory``.
    token: str = Field(default="", pattern=r"^[0-9a-f]{0,32}$")
    #: CLAIM only, in a checkpoint's ``restored_from``: this checkpoint
    #: subsumed the claimed snapshot (or an earlier one did), so the claimed
    #: files the job's checkpoints use are the job's (coordinator rule 8).
    settled: bool = False

    @property
    def settled_claim(self) -> bool:
        """A CLAIM the job has settled: it holds whatever its checkpoints still
        use of the claimed snapshot, marker or not (coordinator rule 8)."""
        return self.settled and self.mode is RestoreMode.CLAIM


class CheckpointMetadata(_Model):
    """The ``_metadata`` document: written last, it makes a snapshot visible."""

    format_version: Literal[2] = 2
    job_id: str
    checkpoint_id: int = Field(ge=0)
    kind: Literal["checkpoint", "savepoint"]
    #: For a savepoint: ``native`` (the backend's own files) or ``canonical``.
    savepoint_format: Literal["native", "canonical"] | None = None
    max_parallelism: int = Field(ge=1, le=1 << 15)
    timestamp: float
    subtasks: tuple[KeyedStateHandle, ...]
    #: Shared files this checkpoint uses that its job does not own (files of a
    #: snapshot restored in LEGACY mode): a job that CLAIMs this checkpoint
    #: does not own them either.
    disowned: tuple[str, ...] = ()
    #: For a checkpoint: the snapshot its job was started from (None: started
    #: empty). Recovery compares it with ``<job>/_restore`` before it reads the
    #: snapshot that names: a ``_restore`` the checkpoints do not confirm is
    #: never followed.
    restored_from: RestoreRecord | None = None

    @property
    def files(self) -> tuple[FileHandle, ...]:
        return tuple(f for handle in self.subtasks for f in handle.files)


@dataclass(frozen=True)
class SnapshotOptions:
    """How a backend takes one snapshot (Flink's snapshot type and sharing strategy).

    ``kind="checkpoint"``: incremental on top of the last confirmed checkpoint
    unless ``full`` (FORWARD_BACKWARD, or FORWARD when full). ``kind="savepoint"``:
    NO_SHARING -- every file exclusive in the savepoint directory, nothing
    reused, nothing recorded as a base -- in the ``native`` or ``canonical``
    format.
    """

    kind: Literal["checkpoint", "savepoint"] = "checkpoint"
    format: Literal["native", "canonical"] = "native"
    full: bool = False

    @property
    def reuses_files(self) -> bool:
        """May this snapshot reference files of the last confirmed checkpoint?"""
        return self.kind == "checkpoint" and not self.full

    @property
    def is_savepoint(self) -> bool:
        return self.kind == "savepoint"
