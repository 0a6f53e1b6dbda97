"""Checkpoint storage: the directory layout of a job, and reading and writing
``_metadata``.

A storage is rooted at a local path or any fsspec URL; each job has its own
directory::

    <root>/<job_id>/
        chk-<id>/            one completed (or in-flight) checkpoint
            _metadata        written last, atomically: the checkpoint exists iff it does
            keyed-state-..   exclusive files (heap snapshot files, RocksDB MANIFEST, ...)
        shared/              shared files (RocksDB SSTs), each under a fresh name
        _counter             the last checkpoint or savepoint id handed out
        _restore             what the job was started from, and in which mode
        _savepoint           the directory of a savepoint being written (recovery
                             deletes it if the savepoint never completed)

Savepoints live in directories the user names, anywhere: their ``_metadata``
lists every file relative to that directory.

Every write is atomic (a temporary name, then a rename): a crash at any
moment leaves every completed checkpoint readable, plus at most some
temporary and unreferenced files that :meth:`CheckpointStorage.garbage`
recovery (``CheckpointCoordinator.recover``) deletes.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, ValidationError

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import METADATA_FILE, CheckpointMetadata, RestoreMode
from cowstate.checkpoint.location import SnapshotLocation
from cowstate.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidArgumentError,
)

__all__ = [
    "CheckpointStorage",
    "RestoreRecord",
    "read_metadata",
    "write_metadata",
]

_CHECKPOINT_DIR = re.compile(r"chk-(\d+)$")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*$")


class RestoreRecord(BaseModel):
    """What a job was started from (kept so recovery can fall back to it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    directory: str
    mode: RestoreMode
    checkpoint_id: int
    kind: str


class CheckpointStorage:
    """The checkpoints of one job under ``<root>/<job_id>/``."""

    def __init__(self, root: str, job_id: str, filesystem: FileSystem | None = None) -> None:
        if not isinstance(root, str) or not root:
            raise InvalidArgumentError(f"expected a root path or URL, got {root!r}")
        if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
            raise InvalidArgumentError(
                f"expected a job id of letters, digits, '.', '_' and '-', got {job_id!r}"
            )
        self.filesystem = filesystem if filesystem is not None else FileSystem()
        self.root = root.rstrip("/") or "/"
        self.job_id = job_id
        self.job_dir = self.filesystem.join(self.root, job_id)
        self.shared_dir = self.filesystem.join(self.job_dir, "shared")

    # ----------------------------------------------------------------- paths

    def checkpoint_dir(self, checkpoint_id: int) -> str:
        return self.filesystem.join(self.job_dir, f"chk-{checkpoint_id}")

    def checkpoint_location(self, checkpoint_id: int) -> SnapshotLocation:
        """Exclusive files in ``chk-<id>/``, shared ones in ``shared/``, absolute paths."""
        return SnapshotLocation(
            self.filesystem, self.checkpoint_dir(checkpoint_id), self.shared_dir, relative=False
        )

    def savepoint_location(self, directory: str) -> SnapshotLocation:
        """Everything in ``directory``, exclusive, relative paths; the directory
        must not hold a snapshot already."""
        if self.filesystem.exists(self.filesystem.join(directory, METADATA_FILE)):
            raise InvalidArgumentError(
                f"expected a new savepoint directory, {directory!r} already holds a snapshot"
            )
        return SnapshotLocation(self.filesystem, directory, None, relative=True)

    # --------------------------------------------------------------- counter

    def read_counter(self) -> int:
        """The last checkpoint or savepoint id handed out (0 if none)."""
        path = self.filesystem.join(self.job_dir, "_counter")
        if not self.filesystem.exists(path):
            return 0
        text = self.filesystem.read_bytes(path).decode("ascii", "replace")
        if not text.isdigit():
            raise CorruptCheckpointError(f"expected a checkpoint id in {path!r}, got {text!r}")
        return int(text)

    def write_counter(self, last_id: int) -> None:
        self.filesystem.write_bytes(
            self.filesystem.join(self.job_dir, "_counter"), str(last_id).encode("ascii")
        )

    # --------------------------------------------------------------- restore

    def read_restore_record(self) -> RestoreRecord | None:
        path = self.filesystem.join(self.job_dir, "_restore")
        if not self.filesystem.exists(path):
            return None
        try:
            return RestoreRecord.model_validate_json(self.filesystem.read_bytes(path))
        except ValidationError as exc:
            raise CorruptCheckpointError(f"expected a restore record in {path!r}: {exc}") from None

    def write_restore_record(self, record: RestoreRecord) -> None:
        self.filesystem.write_bytes(
            self.filesystem.join(self.job_dir, "_restore"), record.model_dump_json().encode("utf-8")
        )

    # ------------------------------------------------------------- scanning

    def checkpoint_ids_on_disk(self) -> list[int]:
        """Ids of every ``chk-<id>`` directory, complete or not (ascending)."""
        ids = []
        for entry in self.filesystem.list_dir(self.job_dir):
            match = _CHECKPOINT_DIR.match(self.filesystem.name(entry))
            if match:
                ids.append(int(match.group(1)))
        return sorted(ids)

    def completed_checkpoints(self) -> list[CheckpointMetadata]:
        """Every checkpoint whose ``_metadata`` is on disk (ascending id)."""
        found = []
        for checkpoint_id in self.checkpoint_ids_on_disk():
            directory = self.checkpoint_dir(checkpoint_id)
            if self.filesystem.exists(self.filesystem.join(directory, METADATA_FILE)):
                metadata = read_metadata(self.filesystem, directory)
                if metadata.kind != "checkpoint" or metadata.checkpoint_id != checkpoint_id:
                    raise CorruptCheckpointError(
                        f"expected checkpoint {checkpoint_id} in {directory!r}, its _metadata "
                        f"describes {metadata.kind} {metadata.checkpoint_id}"
                    )
                found.append(metadata)
        return found

    def files(self) -> list[str]:
        """Every file under the job directory."""
        return self.filesystem.list_files(self.job_dir)

    def __repr__(self) -> str:
        return f"<CheckpointStorage {self.job_dir!r}>"


def read_metadata(filesystem: FileSystem, directory: str) -> CheckpointMetadata:
    """The ``_metadata`` of the snapshot in ``directory``.

    :class:`CheckpointNotFoundError` when the directory or its ``_metadata``
    is missing (an unfinished or deleted snapshot); :class:`CorruptCheckpointError`
    when it is not a valid document.
    """
    path = filesystem.join(directory, METADATA_FILE)
    if not filesystem.exists(path):
        where = (
            "the directory does not exist"
            if not filesystem.exists(directory)
            else "it holds no _metadata (unfinished, or not a snapshot)"
        )
        raise CheckpointNotFoundError(
            f"expected a completed checkpoint or savepoint in {directory!r}, but {where}"
        )
    raw = filesystem.read_bytes(path)
    try:
        return CheckpointMetadata.model_validate_json(raw)
    except ValidationError as exc:
        raise CorruptCheckpointError(
            f"expected a valid _metadata document in {directory!r}, got: {exc}"
        ) from None


def write_metadata(filesystem: FileSystem, directory: str, metadata: CheckpointMetadata) -> str:
    """Write ``_metadata`` atomically; the snapshot becomes visible. Returns its path."""
    path = filesystem.join(directory, METADATA_FILE)
    filesystem.write_bytes(path, metadata.model_dump_json(indent=1).encode("utf-8"))
    return path
