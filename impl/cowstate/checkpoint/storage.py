"""Checkpoint storage: the directory layout of a job, its bookkeeping files, and
reading ``_metadata`` (written by :mod:`~cowstate.checkpoint.metadata`).

A storage is rooted at a local path or any fsspec URL; each job has its own
directory::

    <root>/<job_id>/
        chk-<id>/            one completed (or in-flight) checkpoint
            _metadata        written last, atomically: the checkpoint exists iff it does
            keyed-state-..   exclusive files (heap snapshot files, RocksDB MANIFEST, ...)
        shared/              shared files (RocksDB SSTs), each under a fresh name
        _counter             the last checkpoint or savepoint id handed out
        _restore             what the job was started from (its real path), and in
                             which mode (sealed)
        _savepoint           the savepoint being written: its directory and a token
                             (sealed; see ``CheckpointCoordinator.trigger_savepoint``)
        anything else        not the job's: never deleted (a savepoint directory
                             such as ``savepoints/sp-1`` may live here)

The job *owns* ``chk-<id>/``, ``shared/`` and its own dot-files and
temporary files; checkpointing and recovery delete nothing else there
(plus, in CLAIM mode, the files a claimed snapshot's ``_metadata`` lists).

Savepoints live in directories the user names, anywhere but inside the
job's owned parts: their ``_metadata`` lists every file relative to that
directory. ``_metadata`` is sealed and verified (:mod:`~cowstate.checkpoint.verify`).

Every write is atomic (a temporary name, then a rename) and durable on local
file systems (fsync before and after the rename): a crash at any moment
leaves every completed checkpoint readable, plus at most some temporary and
unreferenced files that recovery (``CheckpointCoordinator.recover``) deletes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import fsspec
from pydantic import BaseModel, ConfigDict, Field

from cowstate.checkpoint.filesystem import FileSystem, is_temporary
from cowstate.checkpoint.handles import (
    METADATA_FILE,
    CheckpointMetadata,
    RestoreRecord,
)
from cowstate.checkpoint.location import SnapshotLocation
from cowstate.checkpoint.paths import (
    MAX_NAME_BYTES,
    check_argument,
    check_directory,
    shown,
)
from cowstate.checkpoint.sealed import MAX_DOCUMENT_SIZE, seal, unseal_model
from cowstate.checkpoint.verify import parse_metadata
from cowstate.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    CowStateError,
    InvalidArgumentError,
    UnsafePathError,
)

__all__ = [
    "CLAIM_MARKER",
    "SAVEPOINT_MARKER",
    "CheckpointStorage",
    "OnDisk",
    "RestoreRecord",
    "SavepointIntent",
    "read_metadata",
]

#: The prefix of the file a savepoint in progress keeps in its directory,
#: ``<prefix><token>`` (removed once its ``_metadata`` is written): recovery
#: removes an unfinished savepoint's directory only if it holds the marker
#: (or the marker's own unfinished temporary file) with the token of the
#: job's intent -- a random 128-bit token only that intent knows.
SAVEPOINT_MARKER = ".cowstate-savepoint-"
#: The name (plus the record's token) of the marker a CLAIM restore writes into
#: the claimed snapshot's directory (coordinator rule 8).
CLAIM_MARKER = ".cowstate-claimed-"
#: A checkpoint directory the job writes: ``chk-<id>``, the id in canonical ASCII
#: decimal (P5). A listed ``chk-007``, ``chk-1`` with a newline after it, or ``chk-``
#: with other Unicode digits is not one: not the job's, never read or deleted.
_CHECKPOINT_DIR = re.compile(r"chk-(0|[1-9][0-9]*)\Z")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


class SavepointIntent(BaseModel):
    """A savepoint being written: recovery removes it if it never completed, but
    only if the directory holds the marker with the same token."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Absolute and normal, a local one its real path (P6).
    directory: str
    #: The marker's: ``<directory>/.cowstate-savepoint-<token>`` (P6).
    token: str = Field(pattern=r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class OnDisk:
    """A ``chk-<id>`` directory found on disk: its verified ``_metadata``, or why not."""

    checkpoint_id: int
    directory: str
    metadata: CheckpointMetadata | None
    #: None if ``metadata`` verified; else what is wrong (no _metadata, corrupt, ...).
    problem: CowStateError | None


class CheckpointStorage:
    """The checkpoints of one job under ``<root>/<job_id>/``."""

    def __init__(self, root: str, job_id: str, filesystem: FileSystem | None = None) -> None:
        if not isinstance(root, str) or not root:
            raise InvalidArgumentError(f"expected a root path or URL, got {root!r}")
        check_argument(root, "a root path or URL")  # P5
        if not isinstance(job_id, str):
            raise InvalidArgumentError(f"expected a job id (a string), got {job_id!r}")
        if not _JOB_ID.match(job_id) or len(job_id) > MAX_NAME_BYTES:
            raise InvalidArgumentError(
                f"expected a job id of 1 to {MAX_NAME_BYTES} letters, digits, '.', '_' and '-' "
                f"(the first a letter or digit), got {shown(job_id)}"
            )
        if filesystem is not None and not isinstance(filesystem, FileSystem):
            raise InvalidArgumentError(
                f"expected a FileSystem or None, got {type(filesystem).__name__}"
            )
        self.filesystem = filesystem if filesystem is not None else FileSystem()
        self.root = root.rstrip("/") or "/"
        self.job_id = job_id
        self.job_dir = check_argument(  # P5: the root and the id together
            self.filesystem.join(self.root, job_id), "the job directory (storage root/job id)"
        )
        self.shared_dir = self.filesystem.join(self.job_dir, "shared")

    # ----------------------------------------------------------------- paths

    def checkpoint_dir(self, checkpoint_id: int) -> str:
        return self.filesystem.join(self.job_dir, f"chk-{checkpoint_id}")

    def checkpoint_location(self, checkpoint_id: int) -> SnapshotLocation:
        """Exclusive files in ``chk-<id>/``, shared ones in ``shared/`` (relative handles)."""
        return SnapshotLocation(
            self.filesystem, self.checkpoint_dir(checkpoint_id), self.shared_dir
        )

    def savepoint_location(self, directory: str) -> SnapshotLocation:
        """Everything in ``directory``, exclusive, relative paths.

        The directory must be new (absent or empty) and outside what the job
        owns -- not the job directory or one holding it, not inside ``chk-<id>/``
        or ``shared/`` -- so no cleanup of the job can ever reach a savepoint.
        """
        if not isinstance(directory, str) or not directory.strip("/"):
            raise InvalidArgumentError(f"expected a savepoint directory, got {directory!r}")
        directory = check_argument(directory, "a savepoint directory").rstrip("/")  # P5
        where = self.relation(directory)
        if where != "outside" and where != "foreign":
            raise UnsafePathError(
                f"expected a savepoint directory outside what job {self.job_id!r} owns "
                f"(its chk-<id>/ and shared/ directories), got {directory!r} ({where})"
            )
        if self.filesystem.exists(directory) and (
            not self.filesystem.is_dir(directory) or self.filesystem.list_dir(directory)
        ):
            raise InvalidArgumentError(
                f"expected a new (absent or empty) savepoint directory, {directory!r} already "
                "holds files"
            )
        return SnapshotLocation(self.filesystem, directory, None)

    def relation(self, path: str) -> str:
        """Where ``path`` lies relative to the job: ``"job directory"``, ``"holds the
        job directory"``, ``"owned"`` (inside chk-<id>/, shared/ or a dot-file of
        the job directory), ``"outside"`` (elsewhere, the job directory's other
        subdirectories included) or ``"foreign"`` (another file system)."""
        job = self._normalized(self.job_dir)
        other = self._normalized(path)
        if job[0] != other[0]:
            return "foreign"
        if other[1] == job[1]:
            return "job directory"
        if job[1].startswith(other[1].rstrip("/") + "/") or other[1] == "/":
            return "holds the job directory"
        if not other[1].startswith(job[1] + "/"):
            return "outside"
        first = other[1][len(job[1]) + 1 :].split("/")[0]
        if first == "shared" or _CHECKPOINT_DIR.match(first) or first.startswith("."):
            return "owned"
        if first in ("_counter", "_restore", "_savepoint"):
            return "owned"
        return "outside"

    def is_same_directory(self, path: str, other: str) -> bool:
        """True if ``path`` and ``other`` name one directory (links followed on
        local disks)."""
        return self._normalized(path) == self._normalized(other)

    def is_storage_root(self, path: str) -> bool:
        """True if ``path`` is this storage's root (links followed on local disks)."""
        return self._normalized(path) == self._normalized(self.root)

    def owns(self, path: str) -> bool:
        """True if the job may delete ``path``: inside its ``chk-<id>/`` or
        ``shared/`` directories, or one of its own files and temporary files."""
        return self.relation(path) == "owned"

    # --------------------------------------------------------------- counter

    def read_counter(self) -> int:
        """The last checkpoint or savepoint id handed out (0 if none): the
        ``_counter`` file, but never less than a ``chk-<id>`` on disk, so a torn
        or edited counter cannot hand out an id twice."""
        on_disk = max(self.checkpoint_ids_on_disk(), default=0)
        path = self.filesystem.join(self.job_dir, "_counter")
        if not self.filesystem.exists(path):
            return on_disk
        text = self.filesystem.read_bytes(path, limit=20)[:20].decode("ascii", "replace")
        return max(int(text), on_disk) if text.isdigit() and len(text) < 20 else on_disk

    def write_counter(self, last_id: int) -> None:
        self.filesystem.write_bytes(
            self.filesystem.join(self.job_dir, "_counter"), str(last_id).encode("ascii")
        )

    # --------------------------------------------------------------- restore

    def read_restore_record(self) -> RestoreRecord | None:
        path = self.filesystem.join(self.job_dir, "_restore")
        if not self.filesystem.exists(path):
            return None
        data = self.filesystem.read_bytes(path, limit=MAX_DOCUMENT_SIZE)
        record = unseal_model(data, "restore", 1, RestoreRecord, "a restore record", repr(path))
        check_directory(record.directory, f"the directory in {path!r}")  # P5, P6
        return record

    def write_restore_record(self, record: RestoreRecord) -> None:
        self.filesystem.write_bytes(
            self.filesystem.join(self.job_dir, "_restore"),
            seal("restore", 1, record.model_dump_json().encode("utf-8")),
        )

    # ------------------------------------------------------------ savepoints

    def recorded_directory(self, directory: str, what: str) -> str:
        """``directory`` (``what``: a savepoint's, as :meth:`savepoint_location`
        took it, or the snapshot a job is restored from) as the job records it
        in its ``_savepoint`` intent or ``_restore`` record (P6): a local one as
        its real path -- absolute, links resolved, so recovery never resolves
        it against another working directory -- another file system's URL as
        it is. :class:`InvalidArgumentError` if that is not absolute and
        normal: the job never records a directory its recovery would refuse."""
        local = self.filesystem.local_path(check_argument(directory, what))
        recorded = directory if local is None else os.path.realpath(local)
        try:
            return check_directory(recorded, what)
        except UnsafePathError as exc:
            raise InvalidArgumentError(str(exc)) from None

    @property
    def savepoint_intent_path(self) -> str:
        return self.filesystem.join(self.job_dir, "_savepoint")

    def read_savepoint_intent(self) -> SavepointIntent | None:
        path = self.savepoint_intent_path
        if not self.filesystem.exists(path):
            return None
        data = self.filesystem.read_bytes(path, limit=MAX_DOCUMENT_SIZE)
        intent = unseal_model(
            data, "savepoint", 1, SavepointIntent, "a savepoint intent", repr(path)
        )
        check_directory(intent.directory, f"the directory in {path!r}")  # P5, P6
        return intent

    def write_savepoint_intent(self, intent: SavepointIntent) -> None:
        self.filesystem.write_bytes(
            self.savepoint_intent_path,
            seal("savepoint", 1, intent.model_dump_json().encode("utf-8")),
        )

    # ------------------------------------------------------------- scanning

    def checkpoint_ids_on_disk(self) -> list[int]:
        """Ids of every ``chk-<id>`` directory, complete or not (ascending)."""
        ids = []
        for entry in self.filesystem.list_dir(self.job_dir):
            match = _CHECKPOINT_DIR.match(self.filesystem.name(entry))
            local = self.filesystem.local_path(entry)
            if match and not (local is not None and os.path.islink(local)):  # a link is not ours
                ids.append(int(match.group(1)))
        return sorted(ids)

    def checkpoints_on_disk(self) -> list[OnDisk]:
        """Every ``chk-<id>`` directory with its verified ``_metadata`` or the
        problem that stopped it (ascending id); never raises for their content."""
        found = []
        for checkpoint_id in self.checkpoint_ids_on_disk():
            directory = self.checkpoint_dir(checkpoint_id)
            try:
                metadata = read_metadata(self.filesystem, directory)
                if metadata.kind != "checkpoint" or metadata.checkpoint_id != checkpoint_id:
                    raise CorruptCheckpointError(
                        f"expected checkpoint {checkpoint_id} in {directory!r}, its _metadata "
                        f"describes {metadata.kind} {metadata.checkpoint_id}"
                    )
                if metadata.job_id != self.job_id:
                    raise CorruptCheckpointError(
                        f"expected a checkpoint of job {self.job_id!r} in {directory!r}, its "
                        f"_metadata names job {metadata.job_id!r}"
                    )
            except CowStateError as exc:
                found.append(OnDisk(checkpoint_id, directory, None, exc))
            else:
                found.append(OnDisk(checkpoint_id, directory, metadata, None))
        return found

    def completed_checkpoints(self) -> list[CheckpointMetadata]:
        """Every checkpoint whose ``_metadata`` is on disk and verifies (ascending id)."""
        return [c.metadata for c in self.checkpoints_on_disk() if c.metadata is not None]

    def temporary_files(self) -> list[str]:
        """Unfinished atomic writes directly in the job directory (``._counter.*``)."""
        return [p for p in self.filesystem.list_dir(self.job_dir) if is_temporary(p)]

    def files(self) -> list[str]:
        """Every file under the job directory."""
        return self.filesystem.list_files(self.job_dir)

    def __repr__(self) -> str:
        return f"<CheckpointStorage {self.job_dir!r}>"

    def _normalized(self, path: str) -> tuple[str, str]:
        """(file system, path) for comparisons: the real path on a local file
        system (links followed), fsspec's path elsewhere."""
        local = self.filesystem.local_path(path)
        if local is not None:
            return "local", os.path.realpath(local)
        fs, stripped = fsspec.core.url_to_fs(path)
        return f"{type(fs).__name__}:{fs.protocol}", "/" + str(stripped).strip("/")


def read_metadata(filesystem: FileSystem, directory: str) -> CheckpointMetadata:
    """The verified ``_metadata`` of the snapshot in ``directory``.

    :class:`CheckpointNotFoundError` when the directory or its ``_metadata``
    is missing (an unfinished or deleted snapshot); a
    :class:`CorruptCheckpointError` subclass when it fails its seal, its
    schema or its consistency checks (M1-M9 of :mod:`~cowstate.checkpoint.verify`).
    """
    if not isinstance(filesystem, FileSystem):
        raise InvalidArgumentError(f"expected a FileSystem, got {type(filesystem).__name__}")
    if not isinstance(directory, str) or not directory:
        raise InvalidArgumentError(f"expected a snapshot directory, got {directory!r}")
    check_argument(directory, "a snapshot directory")  # P5
    path = filesystem.join(directory, METADATA_FILE)
    if not filesystem.is_dir(directory) or not filesystem.exists(path):  # errors name `directory`
        if not filesystem.exists(directory):
            where = "the directory does not exist"
        elif not filesystem.is_dir(directory):
            where = "it is a file, not a directory" + (
                " (give the directory that holds it)"
                if filesystem.name(directory) == METADATA_FILE
                else ""
            )
        else:
            where = "it holds no _metadata (unfinished, or not a snapshot)"
        raise CheckpointNotFoundError(
            f"expected a completed checkpoint or savepoint in {directory!r}, but {where}"
        )
    return parse_metadata(filesystem.read_bytes(path, limit=MAX_DOCUMENT_SIZE), repr(path))
