"""Restore you can trust: every case class of issue 15 that concerns checkpoint
directories, each as a regression test named after what it fixes.

A job here is two heap or RocksDB subtasks over ``<tmp>/root/job`` (three
where the checks of a ``_metadata`` document are tested with the offending
subtask or file first, in the middle and last); a canary file and directory
outside the storage root must never be read or deleted. The checks of RocksDB
native files against their handle (N1-N3) and of a snapshot file against its
handle are tested in every column family, and with sets of the same size and
another member.
"""

from __future__ import annotations

import copy
import errno
import functools
import io
import json
import os
import re
import shutil
import string
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jobs_support import Crash
from restore_support import (
    ABSOLUTE,
    SER,
    STATE_META,
    Registered,
    Targets,
    built_once,
    by_group,
    crafted,
    dump,
    fill,
    group_of,
    handle_for,
    heap,
    native_snapshot,
    staged_databases,
)

from cowstate.checkpoint import paths
from cowstate.checkpoint.coordinator import SAVEPOINT_MARKER, CheckpointCoordinator
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import (
    METADATA_FILE,
    CheckpointMetadata,
    FileHandle,
    KeyedStateHandle,
    RestoreMode,
    RestoreRecord,
)
from cowstate.checkpoint.inspect import inspect_snapshot
from cowstate.checkpoint.location import SnapshotSource
from cowstate.checkpoint.recovery import RecoveryReport, Skipped
from cowstate.checkpoint.sealed import seal
from cowstate.checkpoint.storage import (
    CLAIM_MARKER,
    CheckpointStorage,
    SavepointIntent,
    read_metadata,
)
from cowstate.checkpoint.verify import METADATA_KIND
from cowstate.cli import main as cowstate_main
from cowstate.descriptors import ValueStateDescriptor
from cowstate.errors import (
    CheckpointError,
    CorruptCheckpointError,
    CowStateError,
    DuplicateMappingError,
    InconsistentMetadataError,
    InvalidArgumentError,
    KeyGroupMismatchError,
    MetadataChecksumError,
    SnapshotEntryError,
    SnapshotFormatError,
    UnsafePathError,
    UnsupportedMetadataVersionError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.heap_incremental import Removals, fold_deltas
from cowstate.key_groups import (
    KeyGroupRange,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from cowstate.keyed_state import VOID_NAMESPACE
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.rocksdb.table import encode_rocks_key
from cowstate.serializers import DefaultSerializer
from cowstate.snapshot import RestoredSnapshot, SnapshotReader, SnapshotWriter
from cowstate.snapshot.checks import DecodedBlock
from cowstate.state_table import CopyOnWriteStateTable
from cowstate_spec.bad_layers import (
    CONFINEMENT,
    PATH_LAYER_BUGS,
    Confinement,
    LayerBug,
    bad_layer_confinement,
    identity,
)
from cowstate_spec.fuzz.chains import CHAIN_EDITS, set_chain_files
from cowstate_spec.profiles import hunt_settings

MAXP = 16
VALUE: ValueStateDescriptor[Any] = ValueStateDescriptor("value")
BACKENDS: dict[str, Callable[[KeyGroupRange, int], Any]] = {
    "heap": HeapKeyedStateBackend,
    "rocksdb": RocksDBKeyedStateBackend,
    # incremental checkpoints (issue 29) over the default maps (C), which track changes
    "heap-incremental": functools.partial(HeapKeyedStateBackend, incremental=True),
}
EITHER = pytest.mark.parametrize("kind", ["heap", "rocksdb"])


class Job:
    """Two subtasks (or ``parallelism``) of one backend kind and their coordinator."""

    def __init__(
        self,
        root: Path,
        kind: str,
        *,
        retained: int = 1,
        how: Any = None,
        parallelism: int = 2,
    ) -> None:
        self.root = root
        self.storage = CheckpointStorage(str(root), "job", FileSystem())
        self.backends = fresh_backends(kind, parallelism)
        if how is None:
            self.coordinator = CheckpointCoordinator(
                self.storage, self.backends, num_retained=retained
            )
        elif how == "recover":
            self.coordinator = CheckpointCoordinator.recover(
                self.storage, self.backends, num_retained=retained
            )
        else:
            directory, mode = how
            self.coordinator = CheckpointCoordinator.restore(
                self.storage, self.backends, directory, mode, num_retained=retained
            )

    def put(self, keys: range, value: Any) -> None:
        for key in keys:
            group = assign_to_key_group(key, MAXP)
            backend = next(b for b in self.backends if group in b.key_group_range)
            backend.set_current_key(key)
            backend.get_state(VALUE).update(value)

    def contents(self) -> dict[Any, Any]:
        return {k: s for b in self.backends for k, _, s in b.entries("value")}

    def checkpoint(self) -> str:
        completed = self.coordinator.complete_checkpoint(self.coordinator.trigger_checkpoint())
        return completed.directory

    def close(self) -> None:
        self.coordinator.close()
        for backend in self.backends:
            backend.close()


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    """A file and a directory outside the storage root, never to be touched."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret").write_text("do not read")
    (outside / "dir" / "file").write_text("do not delete")
    yield outside
    assert (outside / "secret").read_text() == "do not read"
    assert (outside / "dir" / "file").read_text() == "do not delete"


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path the checkpoint layer opens for reading, in order."""
    paths: list[str] = []
    original = FileSystem.open

    def recording(self: FileSystem, path: str) -> Any:
        paths.append(path)
        return original(self, path)

    monkeypatch.setattr(FileSystem, "open", recording)
    return paths


def reseal(directory: str, edit: Any) -> None:
    """Rewrite ``directory``'s ``_metadata`` through ``edit(document)`` with a valid
    seal: what an attacker who can write the file produces."""
    path = Path(directory, METADATA_FILE)
    body = path.read_bytes()
    body = body[: body.rindex(b"#cowstate")]
    document = json.loads(body)
    edit(document)
    path.write_bytes(seal(METADATA_KIND, 2, json.dumps(document).encode()))


def _list_a_file_twice(subtask: dict[str, Any]) -> None:
    subtask["files"].append(subtask["files"][0])
    subtask["full_size"] += subtask["files"][0]["size"]


def fresh_backends(kind: str, parallelism: int = 2) -> list[Any]:
    backends = [
        BACKENDS[kind](compute_key_group_range_for_operator_index(MAXP, parallelism, i), MAXP)
        for i in range(parallelism)
    ]
    for backend in backends:
        backend.get_state(VALUE)
    return backends


# ------------------------------------------------------------ metadata integrity


@EITHER
def test_metadata_edited_without_resealing_is_refused_before_anything_is_restored(
    tmp_path: Path, kind: str
) -> None:
    job = Job(tmp_path / "root", kind)
    job.put(range(30), "a")
    directory = job.checkpoint()
    path = Path(directory, METADATA_FILE)
    text = path.read_text()
    path.write_text(text.replace('"key_group_range": [\n    0,', '"key_group_range": [\n    1,', 1))
    target = fresh_backends(kind)
    storage = CheckpointStorage(str(tmp_path / "root"), "other")
    with pytest.raises(MetadataChecksumError, match="SHA-256"):
        CheckpointCoordinator.restore(storage, target, directory, RestoreMode.CLAIM)
    assert all(list(b.entries("value")) == [] for b in target)
    job.close()


def test_torn_and_unknown_version_metadata_are_precise_errors(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap")
    directory = job.checkpoint()
    path = Path(directory, METADATA_FILE)
    good = path.read_bytes()
    for torn in (b"", good[: len(good) // 2], good[:-1]):
        path.write_bytes(torn)
        with pytest.raises(MetadataChecksumError):
            read_metadata(FileSystem(), directory)
    path.write_bytes(good.replace(b"#cowstate metadata v2", b"#cowstate metadata v9"))
    with pytest.raises(UnsupportedMetadataVersionError, match="version 9"):
        read_metadata(FileSystem(), directory)
    job.close()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["subtasks"][1].update(key_group_range=[5, 15]), "disjoint ranges"),
        (lambda d: d["subtasks"][1].update(key_group_range=[8, 14]), "cover every key group"),
        (lambda d: d["subtasks"][0].update(max_parallelism=32), "max parallelism"),
        (lambda d: d["subtasks"][0].update(checkpoint_id=7), "belong to checkpoint"),
        (lambda d: d.update(checkpoint_id=0), "checkpoint id >= 1"),
        (lambda d: d["subtasks"][0].update(full_size=1), "full_size"),
        (lambda d: _list_a_file_twice(d["subtasks"][0]), "listed twice"),
        (lambda d: d.update(kind="savepoint"), "savepoint format exactly"),
        (lambda d: d.update(disowned=["job/shared/x"]), "disowned"),
        (lambda d: d.update(job_id="../x"), "job id"),
        (lambda d: d["subtasks"][0].update(files=[], full_size=0), "expected files in subtask"),
        (
            lambda d: (
                d["subtasks"][0].update(key_group_range=[0, 15]),
                d["subtasks"][1].update(key_group_range=[16, 15]),
            ),
            "holds no key group, to hold no state",
        ),
        (
            lambda d: d["subtasks"][1]["states"][0].update(state_serializer="int32"),
            "one kind and serializers in every subtask",
        ),
        (lambda d: d["subtasks"][1].update(key_serializer="utf8"), "one key serializer"),
    ],
)
def test_a_resealed_document_that_contradicts_itself_is_refused(
    tmp_path: Path, edit: Any, message: str
) -> None:
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    directory = job.checkpoint()
    reseal(directory, edit)
    with pytest.raises(InconsistentMetadataError, match=message):
        read_metadata(FileSystem(), directory)
    job.close()


# ------------------------------------------- every subtask, every file of a document
#
# M1-M9 (cowstate.checkpoint.verify) walk the subtasks of a document and the
# files of each: a check that looks at the first subtask or file only passes
# the tests above, whose offence stands where they put it. Each check is
# tested here with the offending item in the first, a middle and the last
# subtask of three (the files of the middle subtask: first, middle, last, and
# the last file of the last subtask: "last-block"), through
# CheckpointCoordinator.restore in CLAIM mode: the precise error, no file
# opened but _metadata, no claim marker left, the targets and the new job's
# storage unchanged. cowstate_spec.bad_checks plants "the first subtask (file)
# only" in each; tests/test_spec_catches_bad_checks.py requires these tests to
# fail on it where it misses. A set check is tested with the same count and
# another member (the ranges that cover the key groups, the disowned files).

SUBTASK_POSITIONS = ("first", "middle", "last")
FILE_POSITIONS = ("first", "middle", "last", "last-block")
Document = dict[str, Any]


class Resealable:
    """A closed job's checkpoint of three subtasks of ``kind`` (every key group
    holds state) and the backends restores are tried into (of ``targets``, the
    same kind unless given): a restore that changed them gets new ones."""

    def __init__(self, root: Path, kind: str, targets: str | None = None) -> None:
        self.root, self.kind = root, kind
        self.targets_kind = targets or kind
        job = Job(root / "root", kind, parallelism=3)
        job.put(range(60), "a")
        self.directory = job.checkpoint()
        job.close()
        self.metadata = Path(self.directory, METADATA_FILE)
        self.sealed = self.metadata.read_bytes()
        self.document: Document = json.loads(self.sealed[: self.sealed.rindex(b"#cowstate")])
        self.files = sorted(os.listdir(self.directory))
        #: How a refusal names the document.
        self.where = repr(str(self.metadata))
        self._targets: list[Any] = []
        self._baseline: list[Any] = []
        self._made = 0

    def targets(self) -> list[Any]:
        """Three backends holding state of their own, as they were made."""
        if self._targets and self._contents(self._targets) != self._baseline:
            self.close()
        if not self._targets:
            self._targets = fresh_backends(self.targets_kind, 3)
            for index, backend in enumerate(self._targets):
                for key in range(100, 160):
                    if assign_to_key_group(key, MAXP) in backend.key_group_range:
                        backend.set_current_key(key)
                        backend.get_state(VALUE).update(f"mine{index}")
            self._baseline = self._contents(self._targets)
        return self._targets

    def new_storage(self) -> CheckpointStorage:
        """The storage of a new job to restore into (nothing there yet)."""
        self._made += 1
        return CheckpointStorage(str(self.root / f"new-{self._made}"), "job", FileSystem())

    def close(self) -> None:
        for backend in self._targets:
            backend.close()
        self._targets = []

    @staticmethod
    def _contents(backends: list[Any]) -> list[Any]:
        return [sorted(b.entries("value")) for b in backends]


@pytest.fixture(scope="module")
def heap_document(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Resealable]:
    checkpoint = Resealable(tmp_path_factory.mktemp("heap-document"), "heap")
    yield checkpoint
    checkpoint.close()


@pytest.fixture(scope="module")
def rocks_document(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Resealable]:
    checkpoint = Resealable(tmp_path_factory.mktemp("rocks-document"), "rocksdb")
    yield checkpoint
    checkpoint.close()


def refused_document(
    checkpoint: Resealable,
    edit: Callable[[Document], None] | bytes,
    error: type[CowStateError],
    *says: str,
    coordinator: type[CheckpointCoordinator] = CheckpointCoordinator,
) -> None:
    """``checkpoint``'s document edited by ``edit`` and resealed (or ``edit``'s
    bytes as they are) is refused by a CLAIM restore with ``error`` saying
    ``says``, before any file but ``_metadata`` is opened; nothing changes."""
    if isinstance(edit, bytes):
        data = edit
    else:
        document = copy.deepcopy(checkpoint.document)
        edit(document)
        data = seal(METADATA_KIND, 2, json.dumps(document).encode())
    targets = checkpoint.targets()
    before = checkpoint._contents(targets)
    storage = checkpoint.new_storage()
    opened: list[str] = []
    original = FileSystem.open

    def recording(self: FileSystem, path: str) -> Any:
        opened.append(path)
        return original(self, path)

    checkpoint.metadata.write_bytes(data)
    try:
        with pytest.MonkeyPatch.context() as patch, pytest.raises(error) as excinfo:
            patch.setattr(FileSystem, "open", recording)
            coordinator.restore(storage, targets, checkpoint.directory, RestoreMode.CLAIM).close()
    finally:
        checkpoint.metadata.write_bytes(checkpoint.sealed)
        left = sorted(os.listdir(checkpoint.directory))
        for name in set(left) - set(checkpoint.files):  # a claim marker: the next case's
            os.remove(os.path.join(checkpoint.directory, name))
    assert type(excinfo.value) is error, repr(excinfo.value)
    for fragment in ("expected", *says):
        assert fragment in str(excinfo.value), (fragment, str(excinfo.value))
    assert opened == [str(checkpoint.metadata)], "a refused document had its files opened"
    assert checkpoint._contents(targets) == before, "a refused document changed the backends"
    assert left == checkpoint.files, "a refused document left a claim marker"
    assert not os.path.exists(storage.job_dir), "a refused document wrote the new job's storage"


def subtask_index(position: str) -> int:
    return {"first": 0, "middle": 1}.get(position, 2)


def file_index(position: str, files: list[Any]) -> tuple[int, int]:
    """(subtask, file) of ``position``: in the middle subtask, or last of the last."""
    if position == "last-block":
        return 2, len(files) - 1
    return 1, {"first": 0, "middle": len(files) // 2}.get(position, len(files) - 1)


def flipped_byte(checkpoint: Resealable, position: str) -> bytes:
    """The sealed document with one byte of its body changed at ``position``."""
    data = bytearray(checkpoint.sealed)
    body_end = checkpoint.sealed.rindex(b"#cowstate") - 1  # the body's last byte: its newline
    at = {"first": 0, "middle": body_end // 2}.get(position, body_end - 1)
    data[at] ^= 0x01
    return bytes(data)


def m1_case(
    position: str, checkpoint: Resealable, coordinator: Any = CheckpointCoordinator
) -> None:
    refused_document(
        checkpoint,
        flipped_byte(checkpoint, position),
        MetadataChecksumError,
        "to match its SHA-256",
        coordinator=coordinator,
    )


def m2_case(
    position: str, checkpoint: Resealable, coordinator: Any = CheckpointCoordinator
) -> None:
    def edit(document: Document) -> None:
        subtasks = document["subtasks"]
        if position == "last-block":
            subtasks[-1]["files"][-1]["planted"] = 1
        else:
            subtasks[subtask_index(position)]["planted"] = 1

    last_file = len(checkpoint.document["subtasks"][-1]["files"]) - 1
    where = (
        f"subtasks.2.files.{last_file}.planted"
        if position == "last-block"
        else f"subtasks.{subtask_index(position)}.planted"
    )
    refused_document(
        checkpoint, edit, CorruptCheckpointError, f"{where}: Extra inputs", coordinator=coordinator
    )


def m3_case(
    position: str, checkpoint: Resealable, coordinator: Any = CheckpointCoordinator
) -> None:
    job_id = {"first": "/job-id", "middle": "job/id", "last": "job-id/"}[position]
    refused_document(
        checkpoint,
        lambda document: document.update(job_id=job_id),
        InconsistentMetadataError,
        f"job id of letters, digits, '.', '_' and '-' in {checkpoint.where}, got {job_id!r}",
        coordinator=coordinator,
    )


def subtask_edit(position: str, edit: Callable[[Document], None]) -> Callable[[Document], None]:
    return lambda document: edit(document["subtasks"][subtask_index(position)])


def m4_cases() -> dict[str, tuple[Callable[[Document], None], str]]:
    """M4 per subtask: (edit of the subtask, what the refusal says); ``{i}`` the subtask."""

    def empty(subtask: Document) -> None:
        start = subtask["key_group_range"][0]
        subtask["key_group_range"] = [start, start - 1]

    return {
        "max parallelism": (
            lambda subtask: subtask.update(max_parallelism=2 * MAXP),
            f"expected subtask {{i}} of {{where}} to have max parallelism {MAXP}, got {2 * MAXP}",
        ),
        "range": (
            lambda subtask: subtask.update(key_group_range=[subtask["key_group_range"][0], MAXP]),
            f"expected subtask {{i}} of {{where}} to hold key groups inside [0, {MAXP - 1}]",
        ),
        "empty range": (
            empty,
            "expected subtask {i} of {where}, which holds no key group, to hold no state",
        ),
    }


def m4_case(
    check: str, position: str, checkpoint: Resealable, coordinator: Any = CheckpointCoordinator
) -> None:
    edit, says = m4_cases()[check]
    refused_document(
        checkpoint,
        subtask_edit(position, edit),
        InconsistentMetadataError,
        says.format(i=subtask_index(position), where=checkpoint.where),
        coordinator=coordinator,
    )


def m4_cover_case(
    position: str, checkpoint: Resealable, coordinator: Any = CheckpointCoordinator
) -> None:
    """A key group no subtask holds: the first, one between two subtasks, the last."""
    ranges = [list(s["key_group_range"]) for s in checkpoint.document["subtasks"]]
    if position == "first":
        ranges[0][0] += 1
        says = f"subtask 0's [1, {ranges[0][1]}] leaves key groups 0..0"
    elif position == "middle":
        ranges[1][0] += 1
        start = ranges[1][0]
        says = f"subtask 1's [{start}, {ranges[1][1]}] leaves key groups {start - 1}..{start - 1}"
    else:
        ranges[2][1] -= 1
        says = f"to cover every key group up to {MAXP - 1}, they end at {MAXP - 2}"

    def edit(document: Document) -> None:
        for subtask, key_groups in zip(document["subtasks"], ranges, strict=True):
            subtask["key_group_range"] = key_groups

    refused_document(checkpoint, edit, InconsistentMetadataError, says, coordinator=coordinator)


def m5_cases() -> dict[str, tuple[Callable[[Document], None], str]]:
    def twice(subtask: Document) -> None:
        subtask["states"].append(subtask["states"][0])

    def without_files(subtask: Document) -> None:
        subtask.update(files=[], full_size=0, checkpointed_size=0)

    return {
        "checkpoint id": (
            lambda subtask: subtask.update(checkpoint_id=7),
            "expected subtask {i} of {where} to belong to checkpoint 1, it says 7",
        ),
        "a state twice": (
            twice,
            "expected distinct state ids and names in subtask {i} of {where}, got ids [0, 0]",
        ),
        "no files": (without_files, "expected files in subtask {i} of {where}"),
        "full size": (
            lambda subtask: subtask.update(full_size=subtask["full_size"] + 1),
            "expected subtask {i} of {where} to have full_size = ",
        ),
    }


def m5_case(
    check: str, position: str, checkpoint: Resealable, coordinator: Any = CheckpointCoordinator
) -> None:
    edit, says = m5_cases()[check]
    refused_document(
        checkpoint,
        subtask_edit(position, edit),
        InconsistentMetadataError,
        says.format(i=subtask_index(position), where=checkpoint.where),
        coordinator=coordinator,
    )


def file_edit(
    position: str, edit: Callable[[Document, Document, int], None]
) -> Callable[[Document], None]:
    """``edit(document, subtask, file index)`` at ``position`` (:func:`file_index`)."""

    def edited(document: Document) -> None:
        subtask = document["subtasks"][2 if position == "last-block" else 1]
        index, at = file_index(position, subtask["files"])
        edit(document, document["subtasks"][index], at)

    return edited


def m6_path_case(
    position: str, checkpoint: Resealable, coordinator: Any = CheckpointCoordinator
) -> None:
    def edit(document: Document, subtask: Document, at: int) -> None:
        subtask["files"][at].update(path="../outside", scope="exclusive")

    refused_document(
        checkpoint,
        file_edit(position, edit),
        UnsafePathError,
        "'../outside'",
        coordinator=coordinator,
    )


def m6_savepoint_case(
    position: str, checkpoint: Resealable, coordinator: Any = CheckpointCoordinator
) -> None:
    """A savepoint (every file exclusive) with one shared file."""

    def edit(document: Document, subtask: Document, at: int) -> None:
        document.update(kind="savepoint", savepoint_format="native")
        for f in (f for s in document["subtasks"] for f in s["files"]):
            f["scope"] = "exclusive"
        planted = subtask["files"][at]
        planted.update(scope="shared", path=f"job/shared/{Path(planted['path']).name}")

    refused_document(
        checkpoint,
        file_edit(position, edit),
        InconsistentMetadataError,
        "expected only exclusive files in savepoint",
        coordinator=coordinator,
    )


def m7_case(
    position: str, checkpoint: Resealable, coordinator: Any = CheckpointCoordinator
) -> None:
    """A file listed twice: the first, a middle, the last file of the middle
    subtask listed again right after itself; the first subtask's first file
    again as the last subtask's last."""

    def edit(document: Document, subtask: Document, at: int) -> None:
        files = subtask["files"]
        if position == "last-block":
            files.append(copy.deepcopy(document["subtasks"][0]["files"][0]))
        else:
            files.insert(at + 1, copy.deepcopy(files[at]))
        subtask["full_size"] = sum(f["size"] for f in files)

    index = 2 if position == "last-block" else 1
    refused_document(
        checkpoint,
        file_edit(position, edit),
        InconsistentMetadataError,
        "is listed twice",
        f"(again in subtask {index})",
        coordinator=coordinator,
    )


def shared_paths(document: Document) -> list[str]:
    return [f["path"] for s in document["subtasks"] for f in s["files"] if f["scope"] == "shared"]


def m8_case(
    position: str, checkpoint: Resealable, coordinator: Any = CheckpointCoordinator
) -> None:
    """``disowned``: three paths, two of them shared files of the document."""
    stray = "job/shared/not-listed.sst"
    disowned = shared_paths(checkpoint.document)[:2]
    disowned.insert({"first": 0, "middle": 1}.get(position, 2), stray)
    refused_document(
        checkpoint,
        lambda document: document.update(disowned=disowned),
        InconsistentMetadataError,
        f"'disowned' in {checkpoint.where} to name shared files of the document, got [{stray!r}]",
        coordinator=coordinator,
    )


def m9_cases() -> dict[str, tuple[Callable[[Document], None], str]]:
    return {
        "key serializer": (
            lambda subtask: subtask.update(key_serializer="utf8"),
            "expected one key serializer for every subtask of {where}",
        ),
        "state schema": (
            lambda subtask: subtask["states"][0].update(state_serializer="int32"),
            "expected state 'value' to have one kind and serializers in every subtask of {where}",
        ),
    }


def m9_case(
    check: str, position: str, checkpoint: Resealable, coordinator: Any = CheckpointCoordinator
) -> None:
    edit, says = m9_cases()[check]
    refused_document(
        checkpoint,
        subtask_edit(position, edit),
        InconsistentMetadataError,
        says.format(where=checkpoint.where),
        coordinator=coordinator,
    )


@pytest.mark.parametrize("position", SUBTASK_POSITIONS)
def test_m1_refuses_a_byte_changed_anywhere_in_the_document(
    position: str, heap_document: Resealable
) -> None:
    m1_case(position, heap_document)


@pytest.mark.parametrize("position", FILE_POSITIONS)
def test_m2_refuses_an_unknown_field_in_any_subtask_or_file(
    position: str, heap_document: Resealable
) -> None:
    m2_case(position, heap_document)


@pytest.mark.parametrize("position", SUBTASK_POSITIONS)
def test_m3_refuses_a_job_id_with_a_character_out_of_place_anywhere(
    position: str, heap_document: Resealable
) -> None:
    m3_case(position, heap_document)


@pytest.mark.parametrize("position", SUBTASK_POSITIONS)
@pytest.mark.parametrize("check", list(m4_cases()))
def test_m4_refuses_a_subtask_out_of_the_key_groups_wherever_it_stands(
    check: str, position: str, heap_document: Resealable
) -> None:
    m4_case(check, position, heap_document)


@pytest.mark.parametrize("position", SUBTASK_POSITIONS)
def test_m4_refuses_a_key_group_no_subtask_holds_wherever_it_is(
    position: str, heap_document: Resealable
) -> None:
    m4_cover_case(position, heap_document)


@pytest.mark.parametrize("position", SUBTASK_POSITIONS)
@pytest.mark.parametrize("check", list(m5_cases()))
def test_m5_refuses_a_handle_that_contradicts_itself_wherever_it_stands(
    check: str, position: str, heap_document: Resealable
) -> None:
    m5_case(check, position, heap_document)


@pytest.mark.parametrize("position", FILE_POSITIONS)
def test_m6_refuses_a_path_out_of_the_snapshot_wherever_it_stands(
    position: str, rocks_document: Resealable
) -> None:
    m6_path_case(position, rocks_document)


@pytest.mark.parametrize("position", FILE_POSITIONS)
def test_m6_refuses_a_shared_file_in_a_savepoint_wherever_it_stands(
    position: str, rocks_document: Resealable
) -> None:
    m6_savepoint_case(position, rocks_document)


@pytest.mark.parametrize("position", FILE_POSITIONS)
def test_m7_refuses_a_file_listed_twice_wherever_it_stands(
    position: str, rocks_document: Resealable
) -> None:
    m7_case(position, rocks_document)


@pytest.mark.parametrize("position", SUBTASK_POSITIONS)
def test_m8_refuses_a_disowned_path_the_document_does_not_list_wherever_it_stands(
    position: str, rocks_document: Resealable
) -> None:
    m8_case(position, rocks_document)


@pytest.mark.parametrize("position", SUBTASK_POSITIONS)
@pytest.mark.parametrize("check", list(m9_cases()))
def test_m9_refuses_a_subtask_of_another_schema_wherever_it_stands(
    check: str, position: str, heap_document: Resealable
) -> None:
    m9_case(check, position, heap_document)


def m4_same_count_case(checkpoint: Resealable, coordinator: Any = CheckpointCoordinator) -> None:
    """Ranges of as many key groups as there are, one held twice and one by none."""
    ranges = [[0, 5], [5, 9], [11, 15]]
    assert sum(end - start + 1 for start, end in ranges) == MAXP

    def edit(document: Document) -> None:
        for subtask, key_groups in zip(document["subtasks"], ranges, strict=True):
            subtask["key_group_range"] = key_groups

    refused_document(
        checkpoint,
        edit,
        InconsistentMetadataError,
        "into disjoint ranges, subtask 1's [5, 9] overlaps",
        coordinator=coordinator,
    )


def test_m4_refuses_ranges_of_as_many_key_groups_that_overlap_and_leave_a_gap(
    heap_document: Resealable,
) -> None:
    m4_same_count_case(heap_document)


def m8_same_count_case(checkpoint: Resealable, coordinator: Any = CheckpointCoordinator) -> None:
    """As many disowned paths as shared files, one of them not the document's."""
    stray = "job/shared/not-listed.sst"
    disowned = [*shared_paths(checkpoint.document)[:-1], stray]
    refused_document(
        checkpoint,
        lambda document: document.update(disowned=disowned),
        InconsistentMetadataError,
        f"to name shared files of the document, got [{stray!r}]",
        coordinator=coordinator,
    )


def test_m8_refuses_as_many_disowned_paths_as_shared_files_with_one_not_listed(
    rocks_document: Resealable,
) -> None:
    m8_same_count_case(rocks_document)


def _native_checkpoint(root: Path) -> str:
    """A closed RocksDB job's native checkpoint with two flushed SST files per subtask."""
    job = Job(root, "rocksdb", retained=2)
    job.put(range(30), "a")
    job.checkpoint()
    job.put(range(30, 60), "b")
    directory = job.checkpoint()
    job.close()
    return directory


def _resealed_file(directory: str, path: Path, data: bytes) -> None:
    """Replace ``path`` (a file of the snapshot) by ``data``, resealing its size and CRC."""
    path.write_bytes(data)

    def edit(document: dict[str, Any]) -> None:
        for subtask in document["subtasks"]:
            for f in subtask["files"]:
                if Path(directory, f["path"]) == path:  # an exclusive file of the snapshot
                    f.update(size=len(data), crc32=zlib.crc32(data))
            subtask["full_size"] = sum(f["size"] for f in subtask["files"])
            subtask["checkpointed_size"] = min(subtask["checkpointed_size"], subtask["full_size"])

    reseal(directory, edit)


@pytest.mark.parametrize(
    "damage", ["older manifest", "manifest cut short", "current cut", "handle drops an sst"]
)
def test_rocksdb_native_files_that_disagree_with_their_handle_are_refused(
    tmp_path: Path, damage: str
) -> None:
    """N1-N3: a MANIFEST cut short opens as an older, smaller database without an
    error; a broken CURRENT fails to open with RocksDB's own exception; a handle
    that no longer lists an SST file. Each a CorruptCheckpointError, nothing
    restored (size and CRC resealed, so only the contents can tell)."""
    directory = _native_checkpoint(tmp_path / "root")
    files = sorted(p for p in Path(directory).rglob("*") if p.is_file())
    files += sorted((tmp_path / "root" / "job" / "shared").glob("*.sst"))  # incremental: shared
    if damage == "handle drops an sst":
        dropped = next(p for p in files if p.suffix == ".sst")

        def edit(document: dict[str, Any]) -> None:
            for subtask in document["subtasks"]:
                subtask["files"] = [
                    f for f in subtask["files"] if Path(f["path"]).name != dropped.name
                ]
                subtask["full_size"] = sum(f["size"] for f in subtask["files"])
                subtask["checkpointed_size"] = min(
                    subtask["checkpointed_size"], subtask["full_size"]
                )

        reseal(directory, edit)
    elif damage == "older manifest":  # chk-1's MANIFEST under chk-2's name: chk-1's database
        victim = next(p for p in files if p.name.startswith("MANIFEST"))
        older = Path(directory).parent / "chk-1" / victim.parent.name
        source = next(older.glob("MANIFEST*"))  # retained: _native_checkpoint keeps two
        _resealed_file(directory, victim, source.read_bytes())
    else:
        name = "MANIFEST" if damage == "manifest cut short" else "CURRENT"
        victim = next(p for p in files if p.name.startswith(name))
        data = victim.read_bytes()
        _resealed_file(directory, victim, data[: len(data) // 2])
    backends = fresh_backends("rocksdb")
    storage = CheckpointStorage(str(tmp_path / "other"), "job", FileSystem())
    with pytest.raises(CorruptCheckpointError):
        CheckpointCoordinator.restore(storage, backends, directory, RestoreMode.NO_CLAIM)
    assert [list(b.entries("value")) for b in backends] == [[], []]
    for backend in backends:
        backend.close()


# ------------------------------------------- RocksDB native files: every column family
#
# N1-N3 (cowstate.rocksdb.restore.check_native) compare a handle with the
# database its files open as: N2 each column family's first and last key
# (keys sort by key group) is tested with a key of a key group outside the
# handle's in the first, the middle and the last of three column families
# (below the range: the family's first key) and in the last one above it (its
# last key); N1 and N3 with sets of the same size and another member. The
# handles are a RocksDB backend's own native snapshot (files by the real
# writer, keys by the tests' pickle), the offending key written into its
# column family first; a handle's list of states or files is then edited as
# a resealed _metadata would.

NATIVE_RANGE = KeyGroupRange(4, 11)


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Targets]:
    shared = Targets(tmp_path_factory.mktemp("targets"))
    yield shared
    shared.close()


COLUMN_STATES = ("s0", "s1", "s2")


def refused_native(
    handle: KeyedStateHandle,
    source: SnapshotSource,
    root: Path,
    error: type[CowStateError],
    *says: str,
    cls: type[RocksDBKeyedStateBackend] = RocksDBKeyedStateBackend,
    targets: Targets | None = None,
) -> None:
    """A backend of the handle's key groups holding state of its own (one of
    ``targets``, if given) refuses to restore ``handle`` with ``error`` saying
    ``says``, and is as it was."""
    states: list[Registered] = [
        ValueStateDescriptor(state.name, serializer=SER) for state in handle.states
    ]
    if targets is None:
        shared = Targets(root / "targets")
        target, local = shared.get(NATIVE_RANGE, cls, states)
    else:
        target, local = targets.get(NATIVE_RANGE, cls, states)
    try:
        before = dump(target)
        with pytest.raises(error) as excinfo:
            target.restore_from([handle], source)
        assert type(excinfo.value) is error, repr(excinfo.value)
        for fragment in ("expected", *says):
            assert fragment in str(excinfo.value), (fragment, str(excinfo.value))
        assert dump(target) == before, "a refused restore changed the backend"
        assert staged_databases(local) == 1, "a refused restore left a database behind"
    finally:
        if targets is None:
            shared.close()


def n2_case(
    position: str,
    root: Path,
    cls: type[RocksDBKeyedStateBackend] = RocksDBKeyedStateBackend,
    targets: Targets | None = None,
) -> None:
    name = COLUMN_STATES[{"first": 0, "middle": 1}.get(position, 2)]
    key_group = NATIVE_RANGE.end_key_group + 2 if position == "last-block" else 2
    key = next(k for k in range(1000, 9999) if group_of(k) == key_group)

    def plant(backend: RocksDBKeyedStateBackend) -> None:
        rocks_key = encode_rocks_key(key_group, SER.serialize(key), SER.serialize("a"))
        backend.table(name)._column().put(rocks_key, SER.serialize("planted"))

    handle, source = built_once(
        ("n2", position),
        lambda: native_snapshot(
            root, NATIVE_RANGE, states=COLUMN_STATES, keys=range(60), plant=plant
        ),
    )
    refused_native(
        handle,
        source,
        root,
        KeyGroupMismatchError,
        f"column family 'state.{name}' holds keys of key groups",
        f"{key_group} to" if key_group < NATIVE_RANGE.start_key_group else f"to {key_group}",
        cls=cls,
        targets=targets,
    )


@pytest.mark.parametrize("position", ["first", "middle", "last", "last-block"])
def test_n2_refuses_a_key_outside_the_handles_key_groups_in_any_column_family(
    position: str, tmp_path: Path, targets: Targets
) -> None:
    n2_case(position, tmp_path, targets=targets)


def n1_same_count_case(
    root: Path, cls: type[RocksDBKeyedStateBackend] = RocksDBKeyedStateBackend
) -> None:
    """The handle names states value and y, the database holds value and x."""
    handle, source = built_once(
        "n1", lambda: native_snapshot(root, NATIVE_RANGE, states=("value", "x"))
    )
    renamed = tuple(
        state.model_copy(update={"name": "y"}) if state.name == "x" else state
        for state in handle.states
    )
    refused_native(
        handle.model_copy(update={"states": renamed}),
        source,
        root,
        CorruptCheckpointError,
        "to hold the column families of its handle's states ['state.value', 'state.y'], "
        "they hold ['state.value', 'state.x']",
        cls=cls,
    )


def test_n1_refuses_as_many_column_families_of_other_states_than_its_handle_names(
    tmp_path: Path,
) -> None:
    n1_same_count_case(tmp_path)


def n3_same_count_case(
    root: Path, cls: type[RocksDBKeyedStateBackend] = RocksDBKeyedStateBackend
) -> None:
    """The handle lists as many SST files as the database uses, another one:
    the SST the database uses is listed under a path that is no SST's (its
    local name the same), and a copy of it under another SST name."""

    def build() -> tuple[KeyedStateHandle, SnapshotSource, str]:
        handle, source = native_snapshot(root, NATIVE_RANGE)
        [sst] = [f for f in handle.files if f.path.endswith(".sst")]
        renamed = sst.model_copy(update={"path": sst.path.removesuffix(".sst") + ".bin"})
        extra = sst.model_copy(
            update={"path": sst.path.replace(".sst", "-extra.sst"), "local_name": "000999.sst"}
        )
        for file in (renamed, extra):
            shutil.copyfile(source.path(sst), source.path(file))
        files = (*(renamed if f is sst else f for f in handle.files), extra)
        full_size = handle.full_size + extra.size
        edited = handle.model_copy(update={"files": files, "full_size": full_size})
        return edited, source, str(sst.local_name)

    handle, source, live = built_once("n3", build)
    refused_native(
        handle,
        source,
        root,
        CorruptCheckpointError,
        f"to use exactly the 1 SST files its handle lists, it uses [{live!r}], "
        "the handle lists ['000999.sst']",
        cls=cls,
    )


def test_n3_refuses_as_many_native_files_as_its_handle_lists_but_other_ones(
    tmp_path: Path,
) -> None:
    n3_same_count_case(tmp_path)


# ------------------------------------------------ a file against its handle, same count


def file_states_case(root: Path, cls: type[HeapKeyedStateBackend] = HeapKeyedStateBackend) -> None:
    """The file holds state value, its handle lists state other."""
    data = crafted(by_group((k, "a", f"v{k}") for k in range(40)))
    other = (STATE_META.model_copy(update={"name": "other"}),)
    handle = handle_for(root / "sp" / "file", data).model_copy(update={"states": other})
    refused_file(
        handle,
        root,
        cls,
        "to hold the states its handle lists ['other'], the file holds ['value']",
    )


def file_key_groups_case(
    root: Path, cls: type[HeapKeyedStateBackend] = HeapKeyedStateBackend
) -> None:
    """The file holds key groups 0-7, its handle says 8-15."""
    low, high = KeyGroupRange(0, 7), KeyGroupRange(8, 15)
    entries = [(k, "a", f"v{k}") for k in range(40) if group_of(k) in low]
    data = crafted(by_group(entries), key_group_range=low)
    handle = handle_for(root / "sp" / "file", data, key_group_range=high)
    refused_file(
        handle,
        root,
        cls,
        "to hold key groups [8, 15] in format canonical",
        "holds key groups [0, 7]",
    )


def refused_file(
    handle: KeyedStateHandle, root: Path, cls: type[HeapKeyedStateBackend], *says: str
) -> None:
    target = heap(cls=cls)
    for state in handle.states:
        target.get_state(ValueStateDescriptor(state.name, serializer=SER))
    fill(target, range(100, 160), tag="mine")
    before = dump(target)
    with pytest.raises(SnapshotFormatError) as excinfo:
        target.restore_from([handle], ABSOLUTE)
    assert type(excinfo.value) is SnapshotFormatError, repr(excinfo.value)
    for fragment in says:
        assert fragment in str(excinfo.value), (fragment, str(excinfo.value))
    assert dump(target) == before
    target.close()


def test_a_file_of_as_many_states_as_its_handle_lists_but_other_ones_is_refused(
    tmp_path: Path,
) -> None:
    file_states_case(tmp_path)


def test_a_file_of_as_many_key_groups_as_its_handle_says_but_other_ones_is_refused(
    tmp_path: Path,
) -> None:
    file_key_groups_case(tmp_path)


# ------------------------------------------------------------------ confined paths


@EITHER
@pytest.mark.parametrize(
    "path",
    [
        "/etc/hostname",
        "../../../outside/secret",
        "ftp://127.0.0.1:1/x",
        "file:///etc/hostname",
        "a/../../outside/secret",
        "",
        "a//b",
        "a\\b",
    ],
)
def test_paths_that_leave_the_snapshot_are_refused_before_any_file_is_opened(
    tmp_path: Path, canary: Path, opened: list[str], kind: str, path: str
) -> None:
    job = Job(tmp_path / "root", kind)
    job.put(range(30), "a")
    directory = job.checkpoint()
    job.close()

    def point_away(document: dict[str, Any]) -> None:
        document["subtasks"][0]["files"][0]["path"] = path

    reseal(directory, point_away)
    opened.clear()
    target = fresh_backends(kind)
    storage = CheckpointStorage(str(tmp_path / "root"), "new")
    for mode in RestoreMode:
        with pytest.raises(UnsafePathError):
            CheckpointCoordinator.restore(storage, target, directory, mode)
    with pytest.raises(UnsafePathError):
        inspect_snapshot(directory)
    assert opened == [os.path.join(directory, METADATA_FILE)] * (len(RestoreMode) + 1)
    assert all(list(b.entries("value")) == [] for b in target)


def test_a_symlink_out_of_the_snapshot_is_refused(
    tmp_path: Path, canary: Path, opened: list[str]
) -> None:
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    directory = job.checkpoint()
    job.close()
    metadata = read_metadata(FileSystem(), directory)
    victim = Path(directory, metadata.files[0].path)
    victim.unlink()
    victim.symlink_to(canary / "secret")
    opened.clear()
    with pytest.raises(UnsafePathError, match="link"):
        CheckpointCoordinator.restore(
            CheckpointStorage(str(tmp_path / "root"), "new"),
            fresh_backends("heap"),
            directory,
            RestoreMode.NO_CLAIM,
        )
    assert str(victim) not in opened


# ------------------------------------------------ names read from files (P5, P6)


def tree(root: Path) -> dict[str, bytes | str | None]:
    """Everything under ``root``: a file's bytes, a link's target, None for a directory."""
    found: dict[str, bytes | str | None] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path)] = os.readlink(path)
        elif path.is_file():
            found[str(path)] = path.read_bytes()
        else:
            found[str(path)] = None
    return found


_ONE_NAME = " to be one name of letters, digits, '.', '_' and '-' (not '.' or '..', no '/'), got "
_CONTROL = " without NUL or other control characters, got "
_BYTES = " with every name between '/' of at most 255 bytes, got one of "

#: Every class of name P5 or P1 refuses as a file's local name (the name a
#: RocksDB restore downloads it under): the name, and the end of the refusal.
BAD_LOCAL_NAMES: dict[str, tuple[str, str]] = {
    "nul": ("000009\x00.sst", _CONTROL + "U+0000 at 6 in '000009\\x00.sst'"),
    "newline": ("CURRENT\n", _CONTROL + "U+000A at 7 in 'CURRENT\\n'"),
    "c1 control": ("OPTIONS\x85", _CONTROL + "U+0085 at 7 in 'OPTIONS\\x85'"),
    "300 characters": ("x" * 300, _BYTES + f"300 bytes: {'x' * 80!r} (of 300 characters)"),
    "256 bytes of 128 characters": (
        "é" * 128,
        _BYTES + f"256 bytes: {'é' * 80!r} (of 128 characters)",
    ),
    "empty": ("", ", got an empty name"),
    "a directory": ("a/000009.sst", _ONE_NAME + "'a/000009.sst'"),
    "parent": ("..", _ONE_NAME + "'..'"),
    "itself": (".", _ONE_NAME + "'.'"),
    "absolute": ("/etc/hostname", _ONE_NAME + "'/etc/hostname'"),
    "backslash": ("..\\x", _ONE_NAME + "'..\\\\x'"),
    "scheme": ("file:x", _ONE_NAME + "'file:x'"),
    "fullwidth solidus": ("a\uff0fb", _ONE_NAME + "'a\uff0fb'"),
    "one-dot leaders": ("\u2024\u2024", _ONE_NAME + "'\u2024\u2024'"),
}


@pytest.fixture(scope="module")
def native_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The storage root of a closed RocksDB job with one native checkpoint
    (``job/chk-1``) of two subtasks, each several files, exclusive and shared."""
    root = tmp_path_factory.mktemp("native") / "root"
    job = Job(root, "rocksdb")
    job.put(range(60), "a")
    job.checkpoint()
    job.close()
    return root


def _refused_everywhere(
    tmp_path: Path, kind: str, directory: str, message: str, opened: list[str], capsys: Any
) -> None:
    """``directory``'s snapshot is refused with ``message`` -- by a restore in every
    mode, by inspect and ``cowstate savepoint inspect``, and by recovering its job
    (R3, naming it) -- before any file but ``_metadata`` and ``_counter`` is
    opened; nothing on disk or in a backend changes."""
    before = tree(tmp_path)
    opened.clear()
    target = fresh_backends(kind)
    for mode in RestoreMode:
        with pytest.raises(UnsafePathError) as caught:
            CheckpointCoordinator.restore(
                CheckpointStorage(str(tmp_path / "new"), "new"), target, directory, mode
            )
        assert str(caught.value) == message
    with pytest.raises(UnsafePathError) as caught:
        inspect_snapshot(directory)
    assert str(caught.value) == message
    capsys.readouterr()
    assert cowstate_main(["savepoint", "inspect", directory]) == 2
    assert capsys.readouterr().err == f"cowstate savepoint inspect: {' '.join(message.split())}\n"
    storage = CheckpointStorage(str(Path(directory).parent.parent), Path(directory).parent.name)
    with pytest.raises(CorruptCheckpointError) as recovering:
        CheckpointCoordinator.recover(storage, target)
    assert f"({directory}: {message}); nothing was restored or deleted" in str(recovering.value)
    assert all(list(b.entries("value")) == [] for b in target)
    for backend in target:
        backend.close()
    assert tree(tmp_path) == before
    metadata = os.path.join(directory, METADATA_FILE)
    assert set(opened) <= {metadata, os.path.join(storage.job_dir, "_counter")}, opened


@pytest.mark.parametrize("bad", sorted(BAD_LOCAL_NAMES))
def test_a_local_name_no_file_system_takes_is_refused_before_any_file_is_opened(
    native_job: Path, tmp_path: Path, opened: list[str], capsys: Any, bad: str
) -> None:
    """Regression: a resealed local name holding a NUL byte, or of 300
    characters, escaped a RocksDB restore as a raw ``ValueError`` or
    ``OSError`` once other files were downloaded, and inspect took it. Every
    class of bad name (M6, P5), as the first, a middle or the last file in
    turn, is an ``UnsafePathError`` naming the file, before any file is opened."""
    name, refusal = BAD_LOCAL_NAMES[bad]
    shutil.copytree(native_job, tmp_path / "root", symlinks=True)
    directory = str(tmp_path / "root" / "job" / "chk-1")
    metadata = read_metadata(FileSystem(), directory)
    files = [(s, i) for s, h in enumerate(metadata.subtasks) for i in range(len(h.files))]
    position = sorted(BAD_LOCAL_NAMES).index(bad) % 3  # first, middle, last in turn
    subtask, index = files[[0, len(files) // 2, len(files) - 1][position]]
    victim = metadata.subtasks[subtask].files[index]

    def rename(document: dict[str, Any]) -> None:
        document["subtasks"][subtask]["files"][index]["local_name"] = name

    reseal(directory, rename)
    where = repr(os.path.join(directory, METADATA_FILE))
    what = f"the local name of {victim.scope} file {victim.path!r} in {where}"
    _refused_everywhere(tmp_path, "rocksdb", directory, f"expected {what}{refusal}", opened, capsys)


#: Every class of directory name P5 refuses (what ``_restore`` or a
#: checkpoint's ``restored_from`` may name): the name, and the end of the refusal.
BAD_DIRECTORIES: dict[str, tuple[str, str]] = {
    "nul": ("/data/sp\x00-1", _CONTROL + "U+0000 at 8 in '/data/sp\\x00-1'"),
    "newline": ("/data/sp-1\n", _CONTROL + "U+000A at 10 in '/data/sp-1\\n'"),
    "300-byte name": (
        "/data/" + "s" * 300,
        _BYTES + f"300 bytes: {'s' * 80!r} (of 300 characters)",
    ),
    "4121 bytes": (
        "/" + ("d" * 200 + "/") * 20 + "d" * 100,
        f" of at most 4095 bytes, got 4121 bytes: {('/' + 'd' * 200)[:80]!r} (of 4121 characters)",
    ),
    "empty": ("", ", got an empty name"),
}


@pytest.mark.parametrize("bad", sorted(BAD_DIRECTORIES))
def test_a_restored_from_directory_no_file_system_takes_is_refused_before_it_is_looked_at(
    tmp_path: Path, opened: list[str], capsys: Any, bad: str
) -> None:
    """Regression: a checkpoint resealed to say its job started from a
    directory holding a NUL byte made recovery raise a raw ``ValueError``;
    one with a 300-byte name was taken (and recovery went on). M6 (P5)
    refuses the document, whatever reads it."""
    name, refusal = BAD_DIRECTORIES[bad]
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    directory = job.checkpoint()
    job.close()

    def started_from(document: dict[str, Any]) -> None:
        document["restored_from"] = {
            "directory": name,
            "mode": "no-claim",
            "checkpoint_id": 1,
            "kind": "savepoint",
        }

    reseal(directory, started_from)
    where = repr(os.path.join(directory, METADATA_FILE))
    message = f"expected the directory of restored_from in {where}{refusal}"
    _refused_everywhere(tmp_path, "heap", directory, message, opened, capsys)


@pytest.mark.parametrize("bad", sorted(BAD_DIRECTORIES))
def test_a_restore_record_naming_a_directory_no_file_system_takes_is_never_followed(
    tmp_path: Path, opened: list[str], bad: str
) -> None:
    """Regression: a ``_restore`` naming a directory with a NUL byte made
    recovery raise a raw ``ValueError``; one with a 300-byte name was looked
    for. The job has no checkpoint, so the record held its state: recovery
    refuses (R3) naming what is wrong, nothing read past ``_restore``,
    nothing changed."""
    name, refusal = BAD_DIRECTORIES[bad]
    job = Job(tmp_path / "root", "heap")
    job.close()
    job.storage.write_restore_record(
        RestoreRecord(directory=name, mode=RestoreMode.CLAIM, checkpoint_id=1, kind="savepoint")
    )
    record = os.path.join(job.storage.job_dir, "_restore")
    before = tree(tmp_path)
    opened.clear()
    backends = fresh_backends("heap")
    with pytest.raises(CorruptCheckpointError) as caught:
        CheckpointCoordinator.recover(job.storage, backends)
    message = f"expected the directory in {record!r}{refusal}"
    assert f"({record}: {message}); nothing was restored or deleted" in str(caught.value)
    assert tree(tmp_path) == before
    assert set(opened) <= {record, os.path.join(job.storage.job_dir, "_counter")}, opened
    assert all(list(b.entries("value")) == [] for b in backends)


#: Every class of directory P6 (and P5) refuses in a ``_savepoint`` intent.
BAD_INTENT_DIRECTORIES: dict[str, tuple[str, str]] = {
    **BAD_DIRECTORIES,
    "relative": (
        "savepoints/sp-1",
        " to be absolute (a path from '/' or a URL), got 'savepoints/sp-1': it would be "
        "resolved against the working directory",
    ),
    "parent": (
        "/data/../sp-1",
        " to be normal (no empty, '.' or '..' name, no trailing '/'), got '/data/../sp-1'",
    ),
    "itself": (
        "/data/./sp-1",
        " to be normal (no empty, '.' or '..' name, no trailing '/'), got '/data/./sp-1'",
    ),
    "trailing slash": (
        "/data/sp-1/",
        " to be normal (no empty, '.' or '..' name, no trailing '/'), got '/data/sp-1/'",
    ),
    "empty name": (
        "/data//sp-1",
        " to be normal (no empty, '.' or '..' name, no trailing '/'), got '/data//sp-1'",
    ),
    "root": ("/", " to be normal (no empty, '.' or '..' name, no trailing '/'), got '/'"),
    "url with a parent": (
        "memory://data/../sp-1",
        " to be normal (no empty, '.' or '..' name, no trailing '/'), got 'memory://data/../sp-1'",
    ),
}


@pytest.mark.parametrize("bad", sorted(BAD_INTENT_DIRECTORIES))
def test_a_savepoint_intent_naming_a_directory_p6_refuses_is_reported_and_never_followed(
    tmp_path: Path, opened: list[str], bad: str
) -> None:
    """Regression: an intent naming a directory with a NUL byte made recovery
    raise a raw ``ValueError``; a relative one was resolved against the
    working directory. Each is reported and deleted, nothing else changes,
    and the job recovers its checkpoint."""
    name, refusal = BAD_INTENT_DIRECTORIES[bad]
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    job.checkpoint()
    job.close()
    intent = job.storage.savepoint_intent_path
    job.storage.write_savepoint_intent(SavepointIntent(directory=name, token="a" * 32))
    before = tree(tmp_path)
    del before[intent]
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert recovered.contents() == {k: "a" for k in range(30)}
    report = recovered.coordinator.recovery
    assert report is not None
    assert report.skipped == [Skipped(intent, f"expected the directory in {intent!r}{refusal}")]
    assert report.removed_savepoint is None
    assert tree(tmp_path) == before
    recovered.close()


@settings(deadline=None)
@given(
    name=st.one_of(
        st.text(st.characters(exclude_categories=()), max_size=20),
        st.builds(
            lambda char, count, tail: char * count + tail,
            st.sampled_from(["a", "\u00e9", "\u20ac", "\U0001f600"]),
            st.integers(60, 260),
            st.sampled_from(["", "/b", "\x00", "\ud800"]),
        ),
        st.builds(
            lambda count, extra: "/" + "/".join(["d" * 200] * count) + "/" + "e" * extra,
            st.integers(19, 20),
            st.integers(0, 100),
        ),
    )
)
def test_a_name_the_check_takes_reaches_the_file_system_without_a_raw_error(name: str) -> None:
    """P5 against the operating system: a name ``check_name`` takes never makes
    ``os.lstat`` raise ``ValueError``, ``UnicodeEncodeError`` or
    ``ENAMETOOLONG`` (what escaped a restore before), nor holds a control
    character."""
    try:
        paths.check_name(name, "a name")
    except UnsafePathError:
        return
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name), name
    try:
        os.lstat(name)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        assert exc.errno != errno.ENAMETOOLONG, name


def test_a_name_is_taken_up_to_the_limits_of_the_file_system_and_refused_past_them() -> None:
    """P5's bounds, in UTF-8 bytes: a name between '/' of 255 bytes and a
    whole name of 4095 are taken (the operating system looks them up); one
    byte more, a lone surrogate and each control character are refused."""
    at_limits = ["\u00e9" * 127 + "a", "/" + "/".join(["d" * 255] * 15) + "/" + "e" * 254]
    assert [len(n.encode()) for n in at_limits] == [255, 4095]
    for name in at_limits:
        assert paths.check_name(name, "a name") == name
        with pytest.raises(FileNotFoundError):
            os.lstat(name)
    past = {
        "\u00e9" * 128: "with every name between '/' of at most 255 bytes, got one of 256 bytes",
        at_limits[1] + "e": "of at most 4095 bytes, got 4096 bytes",
        "a\ud800b": "of valid Unicode, got the lone surrogate U+D800 at 1 in 'a\\ud800b'",
        "a\x7fb": "without NUL or other control characters, got U+007F at 1 in 'a\\x7fb'",
        "a\x9fb": "without NUL or other control characters, got U+009F at 1 in 'a\\x9fb'",
        "a\x1fb": "without NUL or other control characters, got U+001F at 1 in 'a\\x1fb'",
    }
    for name, why in past.items():
        with pytest.raises(UnsafePathError) as caught:
            paths.check_name(name, "a name")
        assert str(caught.value).startswith(f"expected a name {why}"), caught.value
    assert paths.check_name("a\xa0b", "a name") == "a\xa0b"  # no-break space: printable


# ------------------------------------ confinement, property-tested with hostile paths
#
# A tree of real directories, files and symbolic links whose names are what an
# attacker would choose -- siblings named like the roots (``chk-1-evil``,
# ``job-shared``, ``root-evil``), case variants, look-alikes of ``/`` and ``..``
# (U+FF0F, U+2024), NFC and NFD forms -- and links at every level (the snapshot
# directory itself, files and directories in it, in its subdirectory, in
# ``shared/``, to siblings, outside, back up, relative and absolute). A path is
# an entry of the tree edited up to twice (``..``, ``.``, an empty name, a
# sibling, a case variant or a look-alike put in or swapped in anywhere), maybe
# with trailing slashes, and each confinement function is held against an
# oracle that compares real paths name by name (``pathlib``), never strings. ``PATH_LAYER_BUGS`` of
# ``cowstate_spec.bad_layers`` plants the defects these properties must catch.

#: The files of the hostile tree (their directories are made with them).
HOSTILE_FILES = [
    "root/job/chk-1/f",
    "root/job/chk-1/d/f",
    "root/job/chk-1/d/e/f",
    "root/job/chk-1/\u00e9",  # NFC
    "root/job/chk-1/e\u0301x",  # NFD
    "root/job/chk-1/F",
    "root/job/shared/x.sst",
    "root/job/_counter",
    "root/job/.hidden",
    "root/job/chk-1-evil/secret",
    "root/job/chk-10/secret",
    "root/job/chk-1 /secret",
    "root/job/CHK-1/f",
    "root/job/chk-1\uff0fd/f",
    "root/job/\u2024\u2024/f",
    "root/job/shared-evil/secret",
    "root/job-evil/shared/secret",
    "root/job-shared/secret",
    "root/job_chk-1/secret",
    "root/job-.hidden/secret",
    "root/JOB/chk-1/f",
    "root-evil/job/shared/secret",
    "root-evil/job/chk-1/secret",
    "outside/secret",
]
#: Links: where each is (under the tree) -> its target (absolute under the
#: tree if it starts with '/', else relative to the link's directory).
HOSTILE_LINKS = {
    "link-root": "/root",
    "link-job": "/root/job",
    "link-snapshot": "/root/job/chk-1",
    "link-evil": "/root/job/chk-1-evil",
    "root/job/chk-1/up": "..",
    "root/job/chk-1/loop": "loop",
    "root/job/chk-1/d/back": "../f",
    "root/job/chk-1/d/evil": "../../chk-1-evil/secret",
    "root/job/shared/l-evil.sst": "/root/job/shared-evil/secret",
    "root/job/shared/l-in.sst": "x.sst",
    "root/job/shared/l-up.sst": "../chk-1/f",
}
for _target in [
    "/root/job/chk-1/f",
    "/root/job/chk-1/d",
    "/root/job/chk-1-evil",
    "/root/job/chk-1-evil/secret",
    "/root/job/chk-10/secret",
    "/root/job/chk-1 /secret",
    "/root/job-evil/shared",
    "/root/job-shared/secret",
    "/root-evil/job/shared/secret",
    "/outside",
    "/outside/secret",
]:
    HOSTILE_LINKS["root/job/chk-1/l" + _target.replace("/", "_").replace(" ", "-")] = _target
    HOSTILE_LINKS["root/job/chk-1/d/l" + _target.replace("/", "_").replace(" ", "-")] = _target

#: What an edit of a path puts in or swaps in: ``..`` and ``.`` anywhere, empty
#: names, the tree's siblings, case variants and look-alikes.
HOSTILE_PIECES = [
    *[".."] * 8,
    ".",
    "",
    "chk-1",
    "chk-1-evil",
    "chk-10",
    "chk-1 ",
    "CHK-1",
    "job",
    "job-evil",
    "job-shared",
    "job_chk-1",
    "JOB",
    "root-evil",
    "shared",
    "shared-evil",
    "\uff0f",
    "chk-1\uff0fd",
    "\u2024\u2024",
    "\u00e9",
    "e\u0301",
    "F",
    "a\\b",
    "x.sst",
]


@dataclass(frozen=True)
class HostileTree:
    """The tree's real base directory, and what is in it (relative paths, links
    not followed, plus one step into each linked directory)."""

    base: str
    #: Below the storage root's ``job/chk-1`` (the snapshot directory).
    in_snapshot: list[str]
    #: Below ``job/shared``, as shared paths (``job/shared/<name>``).
    in_shared: list[str]
    #: Below the base.
    in_base: list[str]

    @property
    def root(self) -> str:
        return os.path.join(self.base, "root")

    @property
    def snapshot(self) -> str:
        return os.path.join(self.base, "root", "job", "chk-1")


def _entries(directory: str) -> list[str]:
    found = []
    for here, dirs, files in os.walk(directory):
        relative = os.path.relpath(here, directory)
        for name in dirs + files:
            entry = name if relative == "." else f"{relative}/{name}"
            found.append(entry)
            if os.path.islink(os.path.join(here, name)) and os.path.isdir(os.path.join(here, name)):
                found += [f"{entry}/{n}" for n in sorted(os.listdir(os.path.join(here, name)))]
    return sorted(found)


@pytest.fixture(scope="module")
def hostile_tree(tmp_path_factory: pytest.TempPathFactory) -> HostileTree:
    base = os.path.realpath(tmp_path_factory.mktemp("hostile"))
    for name in HOSTILE_FILES:
        path = Path(base, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
    for name, target in HOSTILE_LINKS.items():
        Path(base, name).parent.mkdir(parents=True, exist_ok=True)
        Path(base, name).symlink_to(base + target if target.startswith("/") else target)
    return HostileTree(
        base,
        _entries(os.path.join(base, "root", "job", "chk-1")),
        [f"job/shared/{e}" for e in _entries(os.path.join(base, "root", "job", "shared"))],
        _entries(base),
    )


@st.composite
def hostile_paths(draw: st.DrawFn, entries: list[str]) -> str:
    """An entry of the tree edited up to twice -- a piece of
    :data:`HOSTILE_PIECES` put in or swapped in anywhere -- maybe with a
    trailing slash."""
    parts = draw(st.sampled_from(entries)).split("/")
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(parts)))
        piece = draw(st.sampled_from(HOSTILE_PIECES))
        if at == len(parts) or draw(st.booleans()):
            parts.insert(at, piece)
        else:
            parts[at] = piece
    return "/".join(parts) + draw(st.sampled_from(["", "", "", "", "", "/", "//"]))


def hostile_absolute_paths(tree: HostileTree) -> st.SearchStrategy[str]:
    """Absolute paths of the tree (or URLs of them), edited as :func:`hostile_paths`."""
    return st.builds(
        lambda scheme, relative: f"{scheme}{tree.base}/{relative}",
        st.sampled_from(["", "", "", "file://"]),
        hostile_paths(tree.in_base),
    )


def lexically_confined(path: str, scope: str) -> bool:
    """P1 (and P2 for a shared path), spelled out: the oracle of the lexical check."""
    parts = path.split("/")
    safe = set(string.ascii_letters + string.digits + "._-")
    valid = (
        0 < len(path) <= 255
        and len(parts) <= 8
        and all(part and part not in (".", "..") and set(part) <= safe for part in parts)
    )
    if scope == "shared":
        valid = valid and len(parts) == 3 and parts[1] == "shared" and parts[0][0].isalnum()
    return valid


def really_under(path: str, root: str) -> bool:
    """The oracle of P3: ``path``, links followed, is ``root`` or below it, name by name."""
    return Path(os.path.realpath(path)).is_relative_to(root)


#: One property over one draw of hostile inputs (``data``), for one confinement.
Property = Callable[[st.DataObject], None]


def source_confines(confinement: Confinement, tree: HostileTree) -> Property:
    """P1-P3 through a snapshot source: a path it resolves is exactly a path P1
    (P2) allows that, links followed, stays inside its root -- the snapshot
    directory as named (through a link, with trailing slashes, as a URL), or
    ``<storage root>/<job>/shared`` -- and any other is an ``UnsafePathError``."""

    def holds(data: st.DataObject) -> None:
        shared = data.draw(st.booleans())
        lead = data.draw(st.sampled_from(["", "", "", "", "/"]))
        path = lead + data.draw(hostile_paths(tree.in_shared if shared else tree.in_snapshot))
        named = data.draw(st.sampled_from(["", "/", "//", "link", "file"]))
        directory = {
            "link": os.path.join(tree.base, "link-snapshot"),
            "file": "file://" + tree.snapshot,
        }.get(named, tree.snapshot + named)
        local = directory.removeprefix("file://").rstrip("/")
        if shared:  # against the storage root two levels above the directory as named
            base = os.path.dirname(os.path.dirname(local))
            root = os.path.join(os.path.realpath(base), path.split("/")[0], "shared")
        else:
            base, root = local, os.path.realpath(local)
        scope = "shared" if shared else "exclusive"
        handle = FileHandle(path=path, size=0, crc32=0, scope=scope)
        try:
            resolved = confinement.source(FileSystem(), directory).path(handle)
        except UnsafePathError:
            resolved = None
        expected = lexically_confined(path, scope) and really_under(os.path.join(base, path), root)
        assert (resolved is not None) == expected, (path, scope, directory, resolved)
        assert resolved is None or resolved == f"{directory.rstrip('/')}/{path}" or shared

    return holds


def is_inside_compares_names(confinement: Confinement, tree: HostileTree) -> Property:
    """P3's test alone: ``is_inside(path, root)`` exactly when the real path is
    ``root`` or below it, name by name."""
    roots = [
        os.path.realpath(os.path.join(tree.base, r))
        for r in ("root/job/chk-1", "root/job/chk-1/d", "root/job", "root/job/shared", "root")
    ]

    def holds(data: st.DataObject) -> None:
        local = data.draw(hostile_absolute_paths(tree)).removeprefix("file://")
        root = data.draw(st.sampled_from(roots))
        assert confinement.is_inside(local, root) == really_under(local, root), (local, root)

    return holds


def relation_follows_real_paths(confinement: Confinement, tree: HostileTree) -> Property:
    """What the job owns (and so may delete): ``relation`` says so exactly for
    the real paths inside ``chk-<id>/``, ``shared/`` or a dot-file or
    bookkeeping file of the real job directory, name by name."""
    storage = confinement.storage(tree.root, "job")
    job = Path(os.path.realpath(storage.job_dir))

    def holds(data: st.DataObject) -> None:
        path = data.draw(hostile_absolute_paths(tree))
        # trailing slashes name the same directory (Python's realpath takes
        # ``loop//``, a link to itself, for "/")
        real = Path(os.path.realpath(path.removeprefix("file://").rstrip("/")))
        if real == job:
            expected = "job directory"
        elif job.is_relative_to(real):
            expected = "holds the job directory"
        elif real.is_relative_to(job):
            first = real.relative_to(job).parts[0]
            owned = (
                first in ("shared", "_counter", "_restore", "_savepoint")
                or first.startswith(".")
                or re.fullmatch(r"chk-(0|[1-9][0-9]*)", first, re.ASCII) is not None
            )
            expected = "owned" if owned else "outside"
        else:
            expected = "outside"
        assert storage.relation(path) == expected, (path, str(real))

    return holds


CONFINEMENT_PROPERTIES = [source_confines, is_inside_compares_names, relation_follows_real_paths]


def hold(properties: list[Property], run: settings) -> None:
    """Run ``properties`` under ``run``, each example drawing one of them."""

    @run
    @given(data=st.data())
    def every(data: st.DataObject) -> None:
        data.draw(st.sampled_from(properties))(data)

    every()


#: The properties' budget: the active profile's (120 examples under ``ci``).
PROPERTIES = settings(deadline=None)


def test_a_source_resolves_exactly_the_paths_that_stay_inside_their_root(
    hostile_tree: HostileTree,
) -> None:
    hold([source_confines(CONFINEMENT, hostile_tree)], PROPERTIES)


def test_is_inside_compares_real_paths_name_by_name(hostile_tree: HostileTree) -> None:
    hold([is_inside_compares_names(CONFINEMENT, hostile_tree)], PROPERTIES)


def test_what_the_job_owns_follows_real_paths_name_by_name(hostile_tree: HostileTree) -> None:
    hold([relation_follows_real_paths(CONFINEMENT, hostile_tree)], PROPERTIES)


#: Generation only, derandomized: a catch is the same every run. Each planted
#: bug breaks one property, drawn a third of the time; over 20 random seeds
#: each was caught in every run of 150 examples (the budget is twice that).
HUNT = hunt_settings(max_examples=300, stateful_step_count=1)


@pytest.mark.parametrize("bug", PATH_LAYER_BUGS, ids=lambda bug: bug.name)
def test_the_confinement_properties_catch_a_planted_path_bug(
    hostile_tree: HostileTree, bug: LayerBug
) -> None:
    broken = bad_layer_confinement(bug)
    with pytest.raises(AssertionError):
        hold([p(broken, hostile_tree) for p in CONFINEMENT_PROPERTIES], HUNT)


@pytest.mark.parametrize("bug", PATH_LAYER_BUGS, ids=lambda bug: bug.name)
def test_the_confinement_properties_pass_the_identity_rewrite(
    hostile_tree: HostileTree, bug: LayerBug
) -> None:
    control = bad_layer_confinement(identity(bug))
    hold(
        [p(control, hostile_tree) for p in CONFINEMENT_PROPERTIES], settings(HUNT, max_examples=60)
    )


def test_claim_never_deletes_outside_what_the_job_owns(tmp_path: Path, canary: Path) -> None:
    """A CLAIMed checkpoint is subsumed: only its own listed files go."""
    old = Job(tmp_path / "root", "rocksdb")
    old.put(range(100), "a")
    directory = old.checkpoint()
    old.close()
    new = Job(tmp_path / "root2", "rocksdb", how=(directory, RestoreMode.CLAIM))
    for round_ in range(3):
        new.put(range(round_ * 10, round_ * 10 + 10), round_)
        new.checkpoint()
    assert not Path(directory, METADATA_FILE).exists()  # subsumed, as CLAIM says
    assert new.coordinator.refused_deletions == []
    new.close()


# -------------------------------------------------------------- savepoints are safe


@EITHER
def test_recover_never_deletes_a_savepoint_inside_the_job_directory(
    tmp_path: Path, kind: str
) -> None:
    job = Job(tmp_path / "root", kind)
    job.put(range(30), "a")
    job.checkpoint()
    savepoint = os.path.join(job.storage.job_dir, "savepoints", "sp-1")
    job.coordinator.trigger_savepoint(savepoint)
    before = sorted(p.name for p in Path(savepoint).rglob("*"))
    job.close()
    recovered = Job(tmp_path / "root", kind, how="recover")
    assert sorted(p.name for p in Path(savepoint).rglob("*")) == before
    assert METADATA_FILE in before
    read_metadata(FileSystem(), savepoint)  # still a savepoint
    recovered.checkpoint()
    recovered.checkpoint()  # subsumption leaves it too
    assert sorted(p.name for p in Path(savepoint).rglob("*")) == before
    recovered.close()


def test_a_savepoint_directory_inside_what_the_job_owns_is_refused(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap")
    chk = job.checkpoint()
    for directory in (
        os.path.join(chk, "sp"),
        os.path.join(job.storage.job_dir, "shared", "sp"),
        job.storage.job_dir,
        str(tmp_path / "root"),
    ):
        with pytest.raises(UnsafePathError, match="outside what job 'job' owns"):
            job.coordinator.trigger_savepoint(directory)
    job.close()


@pytest.mark.parametrize("target", ["outside", "savepoints root", "job directory"])
def test_recover_ignores_a_savepoint_intent_naming_a_directory_it_did_not_create(
    tmp_path: Path, canary: Path, target: str
) -> None:
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    job.checkpoint()
    older = str(tmp_path / "savepoints" / "sp-1")
    job.coordinator.trigger_savepoint(older)
    job.close()
    named = {
        "outside": str(canary / "dir"),
        "savepoints root": str(tmp_path / "savepoints"),
        "job directory": job.storage.job_dir,
    }[target]
    job.storage.write_savepoint_intent(SavepointIntent(directory=named, token="f" * 32))
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert recovered.contents() == {k: "a" for k in range(30)}
    read_metadata(FileSystem(), older)
    assert not Path(job.storage.savepoint_intent_path).exists()
    recovered.close()


def test_recover_removes_an_interrupted_savepoint_and_nothing_else(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    job.checkpoint()
    older = str(tmp_path / "savepoints" / "sp-1")
    job.coordinator.trigger_savepoint(older)
    interrupted = tmp_path / "savepoints" / "sp-2"
    interrupted.mkdir()
    (interrupted / (SAVEPOINT_MARKER + "a" * 32)).write_bytes(b"")
    (interrupted / "keyed-state-0-7").write_bytes(b"partial")
    job.storage.write_savepoint_intent(SavepointIntent(directory=str(interrupted), token="a" * 32))
    job.close()
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert not interrupted.exists()
    assert recovered.coordinator.recovery is not None
    assert recovered.coordinator.recovery.removed_savepoint == str(interrupted)
    read_metadata(FileSystem(), older)
    recovered.close()


def listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every directory the checkpoint layer lists from now on."""
    listed: list[str] = []
    for method in ("list_dir", "list_files"):
        original = getattr(FileSystem, method)

        def recording(self: FileSystem, directory: str, original: Any = original) -> Any:
            listed.append(directory)
            return original(self, directory)

        monkeypatch.setattr(FileSystem, method, recording)
    return listed


def _no_marker(directory: Path | str, token: str) -> str:
    return (
        f"expected the directory of the savepoint intent to hold its marker "
        f"'{SAVEPOINT_MARKER}{token}', it holds none: not touched"
    )


@pytest.mark.parametrize("where", ["outside the root", "beside the job", "inside the job"])
def test_recover_never_deletes_an_empty_directory_a_forged_savepoint_intent_names(
    tmp_path: Path, where: str
) -> None:
    """Regression: an intent naming an empty directory -- outside the storage
    root, under another job's directory, or in the job's own directory but
    not owned -- had it deleted. Only a directory holding the intent's
    marker is the savepoint's; this one is reported and stays."""
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    job.checkpoint()
    job.close()
    empty = {
        "outside the root": tmp_path / "elsewhere" / "empty",
        "beside the job": tmp_path / "root" / "other-job" / "chk-1",
        "inside the job": tmp_path / "root" / "job" / "savepoints" / "sp-9",
    }[where]
    empty.mkdir(parents=True)
    token = "b" * 32
    job.storage.write_savepoint_intent(SavepointIntent(directory=str(empty), token=token))
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert empty.is_dir() and not list(empty.iterdir())
    assert recovered.coordinator.recovery == RecoveryReport(
        restored_from=str(Path(job.storage.job_dir, "chk-1")),
        skipped=[Skipped(str(empty), _no_marker(empty, token))],
    )
    assert not Path(job.storage.savepoint_intent_path).exists()
    recovered.close()


def test_recover_never_touches_a_directory_of_someone_elses_a_forged_intent_names(
    tmp_path: Path, canary: Path, opened: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory holding someone else's files, named by a forged intent:
    nothing in it is listed, read or deleted (the canary checks its files);
    recovery reports it."""
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    job.checkpoint()
    job.close()
    token = "c" * 32
    job.storage.write_savepoint_intent(SavepointIntent(directory=str(canary), token=token))
    listed = listings(monkeypatch)
    opened.clear()
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert recovered.coordinator.recovery == RecoveryReport(
        restored_from=str(Path(job.storage.job_dir, "chk-1")),
        skipped=[Skipped(str(canary), _no_marker(canary, token))],
    )
    assert not [p for p in [*opened, *listed] if p.startswith(str(canary))]
    assert sorted(p.name for p in canary.rglob("*")) == ["dir", "file", "secret"]
    recovered.close()


def test_recover_never_resolves_a_relative_savepoint_intent_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: an intent naming ``sp`` was resolved against the process's
    working directory, and a directory there holding the marker was deleted.
    A relative directory is refused (P6) and reported; ``sp`` stays."""
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    job.checkpoint()
    job.close()
    token = "d" * 32
    elsewhere = tmp_path / "cwd" / "sp"
    elsewhere.mkdir(parents=True)
    (elsewhere / f"{SAVEPOINT_MARKER}{token}").write_bytes(b"")
    job.storage.write_savepoint_intent(SavepointIntent(directory="sp", token=token))
    monkeypatch.chdir(tmp_path / "cwd")
    recovered = Job(tmp_path / "root", "heap", how="recover")
    intent = job.storage.savepoint_intent_path
    assert recovered.coordinator.recovery == RecoveryReport(
        restored_from=str(Path(job.storage.job_dir, "chk-1")),
        skipped=[
            Skipped(
                intent,
                f"expected the directory in {intent!r} to be absolute (a path from '/' or a "
                "URL), got 'sp': it would be resolved against the working directory",
            )
        ],
    )
    assert [p.name for p in elsewhere.iterdir()] == [f"{SAVEPOINT_MARKER}{token}"]
    recovered.close()


def test_recover_never_follows_a_savepoint_intent_through_a_symbolic_link(
    tmp_path: Path,
) -> None:
    """Regression: an intent naming a link to a directory holding its marker
    made recovery try to delete the link as a directory (a raw ``OSError``).
    A directory must be named by its real path (P6): reported, nothing touched."""
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    job.checkpoint()
    job.close()
    token = "e" * 32
    real = tmp_path / "savepoints" / "sp-1"
    real.mkdir(parents=True)
    (real / f"{SAVEPOINT_MARKER}{token}").write_bytes(b"")
    (real / "keyed-state-0-7").write_bytes(b"partial")
    link = tmp_path / "link"
    link.symlink_to(real)
    job.storage.write_savepoint_intent(SavepointIntent(directory=str(link), token=token))
    recovered = Job(tmp_path / "root", "heap", how="recover")
    intent = job.storage.savepoint_intent_path
    assert recovered.coordinator.recovery == RecoveryReport(
        restored_from=str(Path(job.storage.job_dir, "chk-1")),
        skipped=[
            Skipped(
                intent,
                f"expected the savepoint intent to name a directory by its real path, "
                f"{str(link)!r} leads through a symbolic link to {str(real)!r}: not followed",
            )
        ],
    )
    assert link.is_symlink()
    assert sorted(p.name for p in real.iterdir()) == [
        f"{SAVEPOINT_MARKER}{token}",
        "keyed-state-0-7",
    ]
    recovered.close()


@pytest.mark.parametrize(
    ("directory", "why"),
    [
        (
            "ftp://127.0.0.1:1/sp-1",
            "expected to reach the file system of 'ftp://127.0.0.1:1/sp-1', got "
            "ConnectionRefusedError: [Errno 111] Connection refused",
        ),
        (
            "nosuchprotocol://host/sp-1",
            "expected a path or URL of a known file system, got 'nosuchprotocol://host/sp-1': "
            "Protocol not known: nosuchprotocol",
        ),
    ],
)
def test_a_savepoint_intent_on_a_file_system_out_of_reach_is_reported_and_recovery_goes_on(
    tmp_path: Path, directory: str, why: str
) -> None:
    """Regression: a forged intent naming a server that refuses the connection,
    or an unknown protocol, made recovery fail (``StorageUnavailableError``,
    ``InvalidArgumentError``): the job could not recover at all. It is
    reported and deleted; the job recovers its checkpoint."""
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "a")
    job.checkpoint()
    job.close()
    job.storage.write_savepoint_intent(SavepointIntent(directory=directory, token="f" * 32))
    recovered = Job(tmp_path / "root", "heap", how="recover")
    intent = job.storage.savepoint_intent_path
    assert recovered.coordinator.recovery == RecoveryReport(
        restored_from=str(Path(job.storage.job_dir, "chk-1")),
        skipped=[Skipped(intent, f"{why}: not followed")],
    )
    assert recovered.contents() == {k: "a" for k in range(30)}
    assert not Path(intent).exists()
    recovered.close()


def test_recover_removes_a_savepoint_a_crash_interrupted_wherever_it_was_named_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A genuine interrupted savepoint is still cleaned up (R1), though it was
    named relative to another working directory and through a symbolic link:
    its intent records the real path, and recovery from elsewhere removes
    exactly that directory (its marker inside) and reports it."""
    (tmp_path / "real-savepoints").mkdir()
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "savepoints").symlink_to(tmp_path / "real-savepoints")
    monkeypatch.chdir(tmp_path / "cwd")

    def crash(operation: str, _path: str, target: Any) -> None:
        if operation == "rename" and str(target).endswith(f"sp-1/{METADATA_FILE}"):
            raise Crash("the process dies before the savepoint's _metadata lands")

    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem(hooks=crash))
    backends = fresh_backends("heap")
    coordinator = CheckpointCoordinator(storage, backends)
    with pytest.raises(Crash):
        coordinator.trigger_savepoint("savepoints/sp-1")
    for backend in backends:
        backend.close()
    real = tmp_path / "real-savepoints" / "sp-1"
    assert any(p.name.startswith(SAVEPOINT_MARKER) for p in real.iterdir())
    monkeypatch.chdir(tmp_path)
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert recovered.coordinator.recovery == RecoveryReport(removed_savepoint=str(real))
    assert not real.exists()
    assert (tmp_path / "cwd" / "savepoints").is_symlink()
    assert not Path(storage.savepoint_intent_path).exists()
    recovered.close()


def test_a_savepoint_directory_its_recovery_could_not_follow_is_refused_before_a_write(
    tmp_path: Path,
) -> None:
    """The intent records the savepoint directory absolute and normal (P6), so
    a URL with ``..`` (which a local path loses to its real path) is refused
    before the counter, the intent or the marker is written."""
    job = Job(tmp_path / "root", "heap")
    base = f"memory://cowstate-{uuid.uuid4().hex}"
    directory = f"{base}/savepoints/../sp-1"
    before = tree(tmp_path)
    with pytest.raises(InvalidArgumentError) as caught:
        job.coordinator.trigger_savepoint(directory)
    assert str(caught.value) == (
        f"expected a savepoint directory to be normal (no empty, '.' or '..' name, no "
        f"trailing '/'), got {directory!r}"
    )
    assert tree(tmp_path) == before and not FileSystem().exists(base)
    local = tmp_path / "savepoints" / ".." / "sp-1"  # its real path is normal: taken
    job.coordinator.trigger_savepoint(str(local))
    read_metadata(FileSystem(), str(tmp_path / "sp-1"))
    job.close()


def _refusing_the_metadata(operation: str, path: str, _data: Any) -> None:
    if operation == "write" and path.endswith(f"/{METADATA_FILE}"):
        raise OSError(errno.EROFS, "read-only file system")


@pytest.mark.parametrize(
    "named", ["a link to an empty directory", "a link to no directory yet", "an empty directory"]
)
def test_a_failed_savepoint_deletes_only_what_it_wrote_wherever_it_was_named(
    tmp_path: Path, canary: Path, named: str
) -> None:
    """Regression: a savepoint named through a symbolic link to an empty
    directory that failed removed the link as a directory -- a raw
    ``OSError`` ("Cannot call rmtree on a symbolic link") instead of its
    own error -- and one into an empty directory of the user's deleted that
    directory. It is written at its real path and deletes only what it
    wrote: its files, its marker, its directory only if it created it
    (through a link to no directory yet: the target, never the link)."""
    target = tmp_path / "savepoints" / "sp-1"
    given = tmp_path / "sp-link"
    if named == "an empty directory":
        target.mkdir(parents=True)
        given = target
    else:
        (tmp_path / "savepoints").mkdir()
        given.symlink_to(target)
        if named == "a link to an empty directory":
            target.mkdir()
    storage = CheckpointStorage(
        str(tmp_path / "root"), "job", FileSystem(hooks=_refusing_the_metadata)
    )
    backends = fresh_backends("heap")
    coordinator = CheckpointCoordinator(storage, backends)
    for key in range(30):
        group = assign_to_key_group(key, MAXP)
        backend = next(b for b in backends if group in b.key_group_range)
        backend.set_current_key(key)
        backend.get_state(VALUE).update("a")
    before = tree(tmp_path)
    with pytest.raises(CheckpointError) as caught:
        coordinator.trigger_savepoint(str(given))
    assert str(caught.value) == (
        f"expected savepoint 1 in {str(given)!r}, got OSError: [Errno {errno.EROFS}] read-only "
        "file system; what it wrote was deleted"
    )
    assert isinstance(caught.value.__cause__, OSError)
    after = tree(tmp_path)
    del after[str(tmp_path / "root" / "job" / "_counter")]  # the id it took
    del after[str(tmp_path / "root" / "job")]
    del after[str(tmp_path / "root")]
    assert after == before  # the link, the user's directory: as they were
    assert given.is_symlink() != (named == "an empty directory")
    assert target.is_dir() == (named != "a link to no directory yet")
    coordinator.close()
    for backend in backends:
        backend.close()


def test_a_failed_savepoint_whose_cleanup_fails_raises_its_own_error_and_keeps_its_intent(
    tmp_path: Path,
) -> None:
    """Regression: a deletion failing in a failed savepoint's cleanup escaped
    as a raw ``OSError`` in place of the savepoint's error, and its intent was
    lost. The caller sees the savepoint's error naming what stays; the intent
    stays, so recovery removes the savepoint (its marker is still there)."""
    marker_kept = False

    def failing(operation: str, path: str, data: Any) -> None:
        nonlocal marker_kept
        _refusing_the_metadata(operation, path, data)
        if operation == "delete" and SAVEPOINT_MARKER in path and not marker_kept:
            marker_kept = True
            raise PermissionError(errno.EACCES, "permission denied")

    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem(hooks=failing))
    backends = fresh_backends("heap")
    coordinator = CheckpointCoordinator(storage, backends)
    directory = tmp_path / "savepoints" / "sp-1"
    with pytest.raises(CheckpointError) as caught:
        coordinator.trigger_savepoint(str(directory))
    intent = storage.read_savepoint_intent()
    assert intent is not None and intent.directory == str(directory)
    marker = str(directory / (SAVEPOINT_MARKER + intent.token))
    assert str(caught.value) == (
        f"expected savepoint 1 in {str(directory)!r}, got OSError: [Errno {errno.EROFS}] "
        f"read-only file system; what it wrote was deleted but for {marker!r} "
        f"(PermissionError: [Errno {errno.EACCES}] permission denied) (its intent is kept: "
        "recovery removes the savepoint if its marker is left)"
    )
    assert isinstance(caught.value.__cause__, OSError)
    assert [p.name for p in directory.iterdir()] == [SAVEPOINT_MARKER + intent.token]
    coordinator.close()
    for backend in backends:
        backend.close()
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert recovered.coordinator.recovery == RecoveryReport(removed_savepoint=str(directory))
    assert not directory.exists()
    recovered.close()


def test_a_savepoint_named_with_trailing_slashes_is_written_at_its_real_path(
    tmp_path: Path,
) -> None:
    """A savepoint is written where its intent says (P6: absolute, normal): a
    trailing ``/`` of a local path or of a URL is not part of that name."""
    job = Job(tmp_path / "root", "heap")
    job.put(range(10), "a")
    url = f"memory://cowstate-{uuid.uuid4().hex}/savepoints/sp-1"
    for directory in (str(tmp_path / "savepoints" / "sp-1"), url):
        job.coordinator.trigger_savepoint(directory + "//")
        assert read_metadata(FileSystem(), directory).kind == "savepoint"
    job.close()


def test_a_savepoint_into_a_directory_that_holds_files_is_refused(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap")
    job.coordinator.trigger_savepoint(str(tmp_path / "savepoints" / "sp-1"))
    with pytest.raises(CowStateError, match="already holds files"):
        job.coordinator.trigger_savepoint(str(tmp_path / "savepoints"))
    read_metadata(FileSystem(), str(tmp_path / "savepoints" / "sp-1"))
    job.close()


# ---------------------------------------------------------------- recovery falls back


@EITHER
def test_recover_falls_back_past_a_torn_newest_metadata(tmp_path: Path, kind: str) -> None:
    job = Job(tmp_path / "root", kind, retained=2)
    job.put(range(30), "one")
    job.checkpoint()
    first = job.contents()
    job.put(range(10), "two")
    newest = job.checkpoint()
    job.close()
    Path(newest, METADATA_FILE).write_bytes(b"")  # a power loss before the data landed
    recovered = Job(tmp_path / "root", kind, retained=2, how="recover")
    assert recovered.contents() == first
    report = recovered.coordinator.recovery
    assert report is not None and report.restored_from is not None
    assert report.restored_from.endswith("chk-1")
    assert [s.directory for s in report.skipped] == [newest]
    assert "seal" in report.skipped[0].reason
    recovered.put(range(5), "three")
    recovered.checkpoint()  # the job goes on
    recovered.close()


@EITHER
def test_recover_verifies_before_it_deletes_anything(tmp_path: Path, kind: str) -> None:
    """num_retained=1, chk-2 and chk-3 on disk, chk-3 missing a file: chk-2 is
    restored (it was not deleted first)."""
    job = Job(tmp_path / "root", kind, retained=2)
    job.put(range(30), "one")
    job.checkpoint()
    job.put(range(10), "two")
    second = job.checkpoint()
    expected = job.contents()
    job.put(range(10), "three")
    third = job.checkpoint()
    job.close()
    victim = next(p for p in Path(third).rglob("*") if p.is_file() and p.name != METADATA_FILE)
    victim.unlink()
    recovered = Job(tmp_path / "root", kind, retained=1, how="recover")
    assert recovered.contents() == expected
    assert Path(second, METADATA_FILE).exists()
    assert not Path(third).exists()  # passed over, then collected
    recovered.close()


def test_recover_restores_the_newest_when_an_older_metadata_is_damaged(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap", retained=2)
    job.put(range(30), "one")
    older = job.checkpoint()
    job.put(range(10), "two")
    job.checkpoint()
    expected = job.contents()
    job.close()
    Path(older, METADATA_FILE).write_text("garbage")
    recovered = Job(tmp_path / "root", "heap", retained=1, how="recover")
    assert recovered.contents() == expected
    recovered.close()


def test_recover_with_no_checkpoint_that_verifies_raises_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path / "root", "heap")
    job.put(range(30), "one")
    only = job.checkpoint()
    job.close()
    Path(only, METADATA_FILE).write_text("{}")
    before = sorted(str(p) for p in (tmp_path / "root").rglob("*"))
    with pytest.raises(CorruptCheckpointError, match="none does"):
        Job(tmp_path / "root", "heap", how="recover")
    assert sorted(str(p) for p in (tmp_path / "root").rglob("*")) == before


def _started_from_a_savepoint(root: Path, kind: str) -> tuple[Job, str, str, dict[Any, Any]]:
    """A job restored (NO_CLAIM) from savepoint sp-1 with one checkpoint of its
    own, closed; also a second savepoint sp-2 with other contents. Returns the
    job, both savepoints and the checkpoint's contents."""
    first = Job(root / "first", kind)
    first.put(range(30), "one")
    sp1 = str(root / "savepoints" / "sp-1")
    first.coordinator.trigger_savepoint(sp1)
    first.put(range(30), "other")
    sp2 = str(root / "savepoints" / "sp-2")
    first.coordinator.trigger_savepoint(sp2)
    first.close()
    job = Job(root / "second", kind, how=(sp1, RestoreMode.NO_CLAIM))
    job.put(range(5), "mine")
    job.checkpoint()
    expected = job.contents()
    job.close()
    return job, sp1, sp2, expected


@EITHER
@pytest.mark.parametrize("named", ["another savepoint", "another protocol", "claim mode"])
def test_recover_never_follows_a_restore_record_its_checkpoints_do_not_confirm(
    tmp_path: Path, kind: str, named: str, opened: list[str]
) -> None:
    """A forged ``_restore`` (validly sealed) naming another snapshot, a server
    of another protocol, or the right snapshot in CLAIM mode: recovery restores
    the job's own checkpoint, reports the record and never reads what it names
    (or connects anywhere); the savepoints keep every file."""
    job, sp1, sp2, expected = _started_from_a_savepoint(tmp_path, kind)
    directory, mode = {
        "another savepoint": (sp2, RestoreMode.NO_CLAIM),
        "another protocol": ("ftp://127.0.0.1:1/x", RestoreMode.NO_CLAIM),
        "claim mode": (sp1, RestoreMode.CLAIM),
    }[named]
    before = {sp: sorted(p.name for p in Path(sp).rglob("*")) for sp in (sp1, sp2)}
    job.storage.write_restore_record(
        RestoreRecord(directory=directory, mode=mode, checkpoint_id=1, kind="savepoint")
    )
    opened.clear()
    recovered = Job(tmp_path / "second", kind, how="recover")
    assert recovered.contents() == expected
    assert not [p for p in opened if p.startswith((sp2, "ftp:"))]
    report = recovered.coordinator.recovery
    assert report is not None
    (skipped,) = [s for s in report.skipped if s.directory.endswith("/_restore")]
    assert "not followed" in skipped.reason and repr(sp1) in skipped.reason
    assert recovered.coordinator.restored_from is not None
    assert recovered.coordinator.restored_from.directory == sp1  # the checkpoint's record
    recovered.put(range(3), "later")
    recovered.checkpoint()
    recovered.checkpoint()
    recovered.close()
    assert {sp: sorted(p.name for p in Path(sp).rglob("*")) for sp in (sp1, sp2)} == before


@EITHER
def test_a_claim_deletes_the_claimed_snapshot_only_with_its_marker(
    tmp_path: Path, kind: str
) -> None:
    """A real CLAIM writes its marker into the snapshot and, once subsumed,
    removes the snapshot whole (marker included). A forged CLAIM record in a
    job without checkpoints (believed: nothing can confirm it) restores, but
    the named savepoint has no marker, so no checkpoint ever deletes it."""
    first = Job(tmp_path / "first", kind)
    first.put(range(30), "one")
    claimed = str(tmp_path / "savepoints" / "sp-1")
    first.coordinator.trigger_savepoint(claimed)
    other = str(tmp_path / "savepoints" / "sp-2")
    first.coordinator.trigger_savepoint(other)
    first.close()
    job = Job(tmp_path / "claims", kind, how=(claimed, RestoreMode.CLAIM))
    record = job.coordinator.restored_from
    assert record is not None and len(record.token) == 32
    assert Path(claimed, CLAIM_MARKER + record.token).exists()
    job.put(range(3), "x")
    job.checkpoint()
    job.close()
    assert not Path(claimed).exists()  # subsumed: every listed file, _metadata and marker

    forged = Job(tmp_path / "forged", kind)
    forged.close()
    before = sorted(p.name for p in Path(other).rglob("*"))
    forged.storage.write_restore_record(
        RestoreRecord(
            directory=other,
            mode=RestoreMode.CLAIM,
            checkpoint_id=1,
            kind="savepoint",
            token="a" * 32,
        )
    )
    recovered = Job(tmp_path / "forged", kind, how="recover")
    assert recovered.contents() == {k: "one" for k in range(30)}
    report = recovered.coordinator.recovery
    assert report is not None
    assert any("no claim marker" in s.reason for s in report.skipped), report.skipped
    recovered.put(range(3), "y")
    recovered.checkpoint()
    recovered.checkpoint()
    recovered.close()
    assert sorted(p.name for p in Path(other).rglob("*")) == before


def test_a_second_claim_of_a_snapshot_revokes_the_first(tmp_path: Path) -> None:
    """Two jobs CLAIM one savepoint: the second's marker replaces the first's,
    so the first job never deletes it and the second removes it whole."""
    first = Job(tmp_path / "first", "heap")
    first.put(range(30), "one")
    claimed = str(tmp_path / "savepoints" / "sp-1")
    first.coordinator.trigger_savepoint(claimed)
    first.close()
    earlier = Job(tmp_path / "earlier", "heap", how=(claimed, RestoreMode.CLAIM))
    later = Job(tmp_path / "later", "heap", how=(claimed, RestoreMode.CLAIM))
    assert later.coordinator.restored_from is not None
    markers = [p.name for p in Path(claimed).iterdir() if p.name.startswith(CLAIM_MARKER)]
    assert markers == [CLAIM_MARKER + later.coordinator.restored_from.token]
    earlier.checkpoint()
    earlier.checkpoint()  # subsumes the claimed savepoint: not its owner any more
    earlier.close()
    assert Path(claimed, METADATA_FILE).exists()
    assert earlier.coordinator.refused_deletions
    later.checkpoint()
    later.close()
    assert not Path(claimed).exists()


def test_a_lost_restore_record_is_taken_from_the_newest_checkpoint(tmp_path: Path) -> None:
    job, sp1, _sp2, expected = _started_from_a_savepoint(tmp_path, "heap")
    Path(job.storage.job_dir, "_restore").unlink()
    recovered = Job(tmp_path / "second", "heap", how="recover")
    assert recovered.contents() == expected
    record = recovered.coordinator.restored_from
    assert record is not None and (record.directory, record.mode) == (sp1, RestoreMode.NO_CLAIM)
    latest = recovered.coordinator.latest_checkpoint
    assert latest is not None and latest.metadata.restored_from == record
    recovered.close()


def test_a_restore_record_of_an_unreachable_file_system_is_a_clean_error(tmp_path: Path) -> None:
    """No checkpoint of its own: ``_restore`` is believed, and a server that
    refuses the connection is a cowstate error, nothing restored or deleted."""
    job = Job(tmp_path / "root", "heap")
    job.storage.write_restore_record(
        RestoreRecord(
            directory="ftp://127.0.0.1:1/x",
            mode=RestoreMode.NO_CLAIM,
            checkpoint_id=1,
            kind="savepoint",
        )
    )
    job.close()
    before = sorted(str(p) for p in (tmp_path / "root").rglob("*"))
    with pytest.raises(CorruptCheckpointError, match=r"StorageUnavailableError|reach"):
        Job(tmp_path / "root", "heap", how="recover")
    assert sorted(str(p) for p in (tmp_path / "root").rglob("*")) == before


def _savepoint_of(root: Path, directory: Path, value: str) -> None:
    """A heap savepoint in ``directory`` of keys 0..29, each holding ``value``."""
    job = Job(root, "heap")
    job.put(range(30), value)
    job.coordinator.trigger_savepoint(str(directory))
    job.close()


def test_a_restore_records_its_snapshot_by_its_real_path_never_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a restore from ``savepoints/sp-1`` recorded that relative
    name in ``_restore``, so recovery from another working directory read the
    snapshot found there (a decoy holding other state). Now the record holds
    the snapshot's real path (links resolved, P6), the CLAIM marker lies
    there, and recovery from anywhere restores the snapshot the job started from."""
    real = tmp_path / "real-savepoints"
    _savepoint_of(tmp_path / "first", real / "sp-1", "started from")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "savepoints").symlink_to(real)
    _savepoint_of(tmp_path / "decoy-job", tmp_path / "elsewhere" / "savepoints" / "sp-1", "decoy")
    monkeypatch.chdir(tmp_path / "cwd")
    job = Job(tmp_path / "root", "heap", how=("savepoints/sp-1", RestoreMode.CLAIM))
    job.close()
    record = job.storage.read_restore_record()
    assert record is not None and record.directory == str(real / "sp-1")
    assert job.coordinator.restored_from == record
    assert [p.name for p in (real / "sp-1").iterdir() if p.name.startswith(CLAIM_MARKER)] == [
        CLAIM_MARKER + record.token
    ]
    monkeypatch.chdir(tmp_path / "elsewhere")
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert recovered.contents() == {k: "started from" for k in range(30)}
    assert recovered.coordinator.recovery == RecoveryReport(restored_from=str(real / "sp-1"))
    recovered.close()


def _as_shown(name: str) -> str:
    """``name`` as a refusal shows it: quoted, its first 80 characters."""
    return repr(name[:80]) + (f" (of {len(name)} characters)" if len(name) > 80 else "")


#: A ``_restore`` (or a checkpoint's ``restored_from``) P6 refuses though it
#: names a savepoint (``<tmp>/savepoints/sp-1``, reached from the working
#: directory ``<tmp>``): how it names it, and the end of the refusal.
UNFOLLOWED_RESTORES: dict[str, tuple[Callable[[Path], str], Callable[[Path], str]]] = {
    "relative": (
        lambda _tmp: "savepoints/sp-1",
        lambda _tmp: (
            " to be absolute (a path from '/' or a URL), got 'savepoints/sp-1': it "
            "would be resolved against the working directory"
        ),
    ),
    "not normal": (
        lambda tmp: f"{tmp}/savepoints/../savepoints/sp-1",
        lambda tmp: (
            " to be normal (no empty, '.' or '..' name, no trailing '/'), got "
            + _as_shown(f"{tmp}/savepoints/../savepoints/sp-1")
        ),
    ),
    "linked": (
        lambda tmp: f"{tmp}/link/sp-1",
        lambda tmp: (
            f"expected _restore to name a snapshot by its real path, "
            f"{f'{tmp}/link/sp-1'!r} leads through a symbolic link to "
            f"{f'{tmp}/savepoints/sp-1'!r}: not followed"
        ),
    ),
}


@pytest.mark.parametrize("named", sorted(UNFOLLOWED_RESTORES))
def test_a_restore_record_p6_refuses_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opened: list[str], named: str
) -> None:
    """Regression: a ``_restore`` naming a restorable savepoint by a relative
    path (resolved against the working directory), through ``..`` or through
    a symbolic link was followed, and the job restored from it. Like a forged
    savepoint intent it is reported and never followed: the job has no
    checkpoint of its own, so it held the job's state and recovery refuses
    (R3), reading nothing past ``_restore`` and changing nothing."""
    how, refusal = (f(tmp_path) for f in UNFOLLOWED_RESTORES[named])
    _savepoint_of(tmp_path / "first", tmp_path / "savepoints" / "sp-1", "one")
    (tmp_path / "link").symlink_to(tmp_path / "savepoints")
    monkeypatch.chdir(tmp_path)
    job = Job(tmp_path / "root", "heap")
    job.close()
    job.storage.write_restore_record(
        RestoreRecord(directory=how, mode=RestoreMode.NO_CLAIM, checkpoint_id=1, kind="savepoint")
    )
    record = os.path.join(job.storage.job_dir, "_restore")
    message = f"expected the directory in {record!r}{refusal}" if named != "linked" else refusal
    where = record if named != "linked" else how
    before = tree(tmp_path)
    opened.clear()
    backends = fresh_backends("heap")
    with pytest.raises(CorruptCheckpointError) as caught:
        CheckpointCoordinator.recover(job.storage, backends)
    assert f"({where}: {message}); nothing was restored or deleted" in str(caught.value)
    assert tree(tmp_path) == before
    assert set(opened) <= {record, os.path.join(job.storage.job_dir, "_counter")}, opened
    assert all(list(b.entries("value")) == [] for b in backends)
    for backend in backends:
        backend.close()


@pytest.mark.parametrize("named", sorted(UNFOLLOWED_RESTORES))
def test_a_restored_from_p6_refuses_is_reported_and_the_job_recovers_its_own_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opened: list[str], named: str
) -> None:
    """Regression: a job restored from ``savepoints/sp-1`` by an earlier
    version recorded that relative name in ``_restore`` and in every
    checkpoint's ``restored_from``; recovery read whatever lay at that name
    from its working directory. (Likewise a name through ``..`` or a link,
    resealed.) Recovery reports both and never reads the savepoint, restores
    the job's own checkpoint, and records no snapshot the job started from."""
    how, refusal = (f(tmp_path) for f in UNFOLLOWED_RESTORES[named])
    _savepoint_of(tmp_path / "first", tmp_path / "savepoints" / "sp-1", "one")
    (tmp_path / "link").symlink_to(tmp_path / "savepoints")
    monkeypatch.chdir(tmp_path)
    job = Job(
        tmp_path / "root", "heap", how=(str(tmp_path / "savepoints" / "sp-1"), RestoreMode.NO_CLAIM)
    )
    job.put(range(5), "mine")
    directory = job.checkpoint()
    expected = job.contents()
    job.close()
    lineage = RestoreRecord(
        directory=how, mode=RestoreMode.NO_CLAIM, checkpoint_id=1, kind="savepoint"
    )
    job.storage.write_restore_record(lineage)  # as the earlier version wrote them
    reseal(directory, lambda document: document.update(restored_from=lineage.model_dump()))
    opened.clear()
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert recovered.contents() == expected
    record = os.path.join(job.storage.job_dir, "_restore")
    report = recovered.coordinator.recovery
    assert report is not None
    if named == "linked":  # _restore as the checkpoint says: one refusal, of both
        assert report.skipped == [Skipped(how, refusal)]
    else:  # _restore refused as it is read, the checkpoint's restored_from when followed
        assert report.skipped == [
            Skipped(record, f"expected the directory in {record!r}{refusal}"),
            Skipped(how, f"expected the directory the job was restored from{refusal}"),
        ]
    assert recovered.coordinator.restored_from is None
    assert not [p for p in opened if "savepoints" in p or "link" in p], opened
    recovered.close()


def test_a_savepoint_claimed_through_a_link_is_never_deleted_by_name(tmp_path: Path) -> None:
    """Regression: a savepoint CLAIMed through a symbolic link was recorded by
    the link's name, so ``delete_savepoint`` given its real path took it for
    a savepoint the job does not own and deleted the retained checkpoint.
    The claim records the real path; by either name it is refused."""
    _savepoint_of(tmp_path / "first", tmp_path / "savepoints" / "sp-1", "one")
    (tmp_path / "link").symlink_to(tmp_path / "savepoints")
    job = Job(tmp_path / "root", "heap", how=(str(tmp_path / "link" / "sp-1"), RestoreMode.CLAIM))
    for name in (tmp_path / "savepoints" / "sp-1", tmp_path / "link" / "sp-1"):
        with pytest.raises(InvalidArgumentError) as caught:
            job.coordinator.delete_savepoint(str(name))
        assert str(caught.value) == (
            f"expected a savepoint the job does not own, {str(name)!r} was restored in CLAIM "
            "mode and is retained as a checkpoint"
        )
    read_metadata(FileSystem(), str(tmp_path / "savepoints" / "sp-1"))
    job.close()


def test_a_restore_from_a_url_holding_a_parent_is_refused_before_anything_is_read(
    tmp_path: Path, opened: list[str]
) -> None:
    """The record holds the snapshot absolute and normal (P6): a URL with
    ``..`` (which a local path loses to its real path) is refused before its
    ``_metadata`` is read or anything is written; the job directory stays absent."""
    directory = f"memory://cowstate-{uuid.uuid4().hex}/savepoints/../sp-1"
    storage = CheckpointStorage(str(tmp_path / "root"), "job")
    backends = fresh_backends("heap")
    opened.clear()
    with pytest.raises(InvalidArgumentError) as caught:
        CheckpointCoordinator.restore(storage, backends, directory, RestoreMode.CLAIM)
    assert str(caught.value) == (
        f"expected a snapshot directory to be normal (no empty, '.' or '..' name, no trailing "
        f"'/'), got {directory!r}"
    )
    assert opened == [] and not (tmp_path / "root").exists()
    for backend in backends:
        backend.close()


def test_a_torn_counter_never_hands_out_an_id_twice(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap")
    job.checkpoint()
    job.checkpoint()
    job.close()
    Path(job.storage.job_dir, "_counter").write_text("")
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert re.search(r"chk-3$", recovered.checkpoint())
    recovered.close()


# --------------------------------------------- heap chains: I3, I4 (issue 29)


@pytest.fixture(scope="module")
def heap_chains(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str]]]:
    """Job ``job``'s checkpoints 1-3 over two subtasks (a base, a delta, a
    second delta: removals and changes in each) and job ``other``'s second
    checkpoint (a base and a delta), in one storage root; read-only (each test
    copies them)."""
    root = tmp_path_factory.mktemp("chains") / "root"
    job = Job(root, "heap-incremental", retained=3)
    other = Job(root, "heap-incremental")
    other.coordinator.close()
    other.storage = CheckpointStorage(str(root), "other", FileSystem())
    other.coordinator = CheckpointCoordinator(other.storage, other.backends)
    directories = []
    job.put(range(400), "base")
    for round_ in range(3):
        job.put(range(round_ * 10, round_ * 10 + 6), round_)
        for key in range(round_ * 10 + 6, round_ * 10 + 10):
            backend = next(b for b in job.backends if group_of(key) in b.key_group_range)
            backend.set_current_key(key)
            backend.get_state(VALUE).clear()
        directories.append(job.checkpoint())
    other.put(range(400), "other")
    other.checkpoint()
    other.put(range(10), "other again")
    directories.append(other.checkpoint())
    job.close()
    other.close()
    yield root, directories


def copied_chains(heap_chains: tuple[Path, list[str]], tmp_path: Path) -> tuple[Path, list[str]]:
    root, directories = heap_chains
    shutil.copytree(root, tmp_path / "root")
    return tmp_path / "root", [
        str(tmp_path / "root" / Path(d).relative_to(root)) for d in directories
    ]


def contents_of(directory: str, parallelism: int) -> dict[Any, Any]:
    """What ``directory`` restores to in ``parallelism`` fresh incremental heap subtasks."""
    backends = fresh_backends("heap-incremental", parallelism)
    try:
        metadata = read_metadata(FileSystem(), directory)
        for backend in backends:
            backend.restore_from(metadata.subtasks, SnapshotSource(FileSystem(), directory))
        return {k: s for b in backends for k, _, s in b.entries("value")}
    finally:
        for backend in backends:
            backend.close()


def test_a_heap_chain_restores_the_fold_of_its_deltas_at_any_parallelism(
    heap_chains: tuple[Path, list[str]],
) -> None:
    _, directories = heap_chains
    third = read_metadata(FileSystem(), directories[2])
    assert [len(h.files) for h in third.subtasks] == [5, 5]
    expected: dict[Any, Any] = {k: "base" for k in range(400)}
    for round_ in range(3):  # each round: six keys rewritten, four removed
        expected.update({k: round_ for k in range(round_ * 10, round_ * 10 + 6)})
        for key in range(round_ * 10 + 6, round_ * 10 + 10):
            del expected[key]
    for parallelism in (1, 2, 3):
        assert contents_of(directories[2], parallelism) == expected


#: One file's mappings of one key group, and a delta's removals there.
FOLD_PAIRS = st.tuples(st.integers(0, 12), st.sampled_from(["a", "b"]))


def restored_of(key_group: int, rows: list[tuple[tuple[int, str], int]]) -> RestoredSnapshot:
    restored = RestoredSnapshot(KeyGroupRange(0, 3), 4)
    restored.metas["s"] = cast(Any, "meta")
    block = DecodedBlock()
    for (key, namespace), state in rows:
        block.keys.append(key)
        block.namespaces.append(namespace)
        block.states.append(state)
    if block:
        restored.blocks["s"] = {key_group: block}
    return restored


@given(
    st.dictionaries(FOLD_PAIRS, st.integers(), max_size=12),
    st.lists(
        st.tuples(st.lists(FOLD_PAIRS, max_size=5), st.dictionaries(FOLD_PAIRS, st.integers())),
        max_size=4,
    ),
)
def test_heap_deltas_applied_to_the_base_are_each_delta_applied_to_a_dict_in_turn(
    base: dict[tuple[int, str], int],
    deltas: list[tuple[list[tuple[int, str]], dict[tuple[int, str], int]]],
) -> None:
    """I5 against a dict: per delta its removals, then its mappings (a mapping
    removed and put again, put and removed, removed twice, or never there)."""
    model = dict(base)
    chain: list[tuple[Removals, RestoredSnapshot]] = []
    for removed, put in deltas:
        for pair in removed:
            model.pop(pair, None)
        model.update(put)
        chain.append(({"s": {2: removed}} if removed else {}, restored_of(2, list(put.items()))))
    table: CopyOnWriteStateTable[Any, Any, Any] = CopyOnWriteStateTable(KeyGroupRange(0, 3), 4)
    for (key, namespace), state in base.items():
        table.put(key, namespace, state, key_group=2)
    for key_group in table.key_group_range:  # the other key groups: nothing to fold
        fold_deltas(chain, "s", key_group, table.state_map(key_group))
    snapshot = table.snapshot()
    assert {(k, n): s for k, n, s in snapshot.key_group_items(2)} == model
    assert [len(table.state_map(g)) for g in (0, 1, 3)] == [0, 0, 0]
    snapshot.release()


@pytest.mark.parametrize("at", ["first", "middle", "last"])
def test_a_delta_file_holding_a_mapping_twice_is_refused(at: str) -> None:
    """E4 in a delta's changes: a mapping twice, first, in the middle or last."""
    rows = [((k, "a"), k) for k in range(5)]
    twice = {"first": 0, "middle": 2, "last": 4}[at]
    rows.insert(twice + 1, ((twice, "a"), 99))
    table: CopyOnWriteStateTable[Any, Any, Any] = CopyOnWriteStateTable(KeyGroupRange(0, 3), 4)
    with pytest.raises(DuplicateMappingError, match=rf"\({twice}, 'a'\) twice in key group 2"):
        fold_deltas([({}, restored_of(2, rows))], "s", 2, table.state_map(2))


@pytest.mark.parametrize("at", ["first", "middle", "last"])
def test_a_delta_file_repeating_a_key_under_another_namespace_is_folded(at: str) -> None:
    """E4's check is over pairs, not keys: the same rows as above but the
    repeated key under another namespace (first, in the middle or last) are
    two mappings, folded. (With one namespace throughout, as above, the check
    compares the keys alone.)"""
    rows = [((k, "a"), k) for k in range(5)]
    twice = {"first": 0, "middle": 2, "last": 4}[at]
    rows.insert(twice + 1, ((twice, "b"), 99))
    table: CopyOnWriteStateTable[Any, Any, Any] = CopyOnWriteStateTable(KeyGroupRange(0, 3), 4)
    fold_deltas([({}, restored_of(2, rows))], "s", 2, table.state_map(2))
    snapshot = table.snapshot()
    assert {(k, n): s for k, n, s in snapshot.key_group_items(2)} == dict(rows)
    snapshot.release()


def _other_job_chain(directories: list[str], subtask: int) -> list[dict[str, Any]]:
    """Subtask ``subtask``'s chain in job ``other``'s checkpoint (a base, a delta)."""
    handle = read_metadata(FileSystem(), directories[3]).subtasks[subtask]
    return [f.model_dump() for f in handle.files]


def refuse_resealed_chain(
    heap_chains: tuple[Path, list[str]], tmp_path: Path, case: str, position: str
) -> tuple[list[str], set[str]]:
    """Reseal chk-3's handle of the first or last subtask with ``case``'s edit
    of CHAIN_EDITS and restore it: refused with the edit's message, nothing
    restored. The paths read, in order, and the other job's chain's paths."""
    _, directories = copied_chains(heap_chains, tmp_path)
    edit, message = CHAIN_EDITS[case]
    directory = directories[2]
    index = 0 if position == "first" else 1
    foreign = _other_job_chain(directories, index)

    def broken(document: Document) -> None:
        subtask = document["subtasks"][index]
        set_chain_files(subtask, edit(subtask["files"], foreign))

    reseal(directory, broken)
    read: list[str] = []
    real_read = SnapshotSource.read

    def recording(self: SnapshotSource, handle: Any) -> bytes:
        read.append(handle.path)
        return real_read(self, handle)

    target = fresh_backends("heap-incremental")
    storage = CheckpointStorage(str(tmp_path / "root"), "restored")
    try:
        with (
            pytest.MonkeyPatch.context() as patch,
            pytest.raises(SnapshotFormatError, match=re.escape(message)),
        ):
            patch.setattr(SnapshotSource, "read", recording)
            CheckpointCoordinator.restore(storage, target, directory, RestoreMode.NO_CLAIM)
        assert all(list(b.entries("value")) == [] for b in target)
    finally:
        for backend in target:
            backend.close()
    return read, {file["path"] for file in foreign}


@pytest.mark.parametrize("position", ["first", "last"])
@pytest.mark.parametrize("case", sorted(CHAIN_EDITS))
def test_a_resealed_heap_chain_out_of_order_incomplete_or_foreign_is_refused(
    heap_chains: tuple[Path, list[str]], tmp_path: Path, case: str, position: str
) -> None:
    refuse_resealed_chain(heap_chains, tmp_path, case, position)


@pytest.mark.parametrize("position", ["first", "last"])
@pytest.mark.parametrize(
    "case", ["another job's base", "another job's delta", "another job's chain"]
)
def test_a_heap_chain_naming_another_jobs_files_is_refused_before_any_file_is_read(
    heap_chains: tuple[Path, list[str]], tmp_path: Path, case: str, position: str
) -> None:
    """Regression (I4): the chain's files were all read, then refused for
    lying outside the job's own shared directory -- another job's files were
    opened and checksummed first. The handle's check now comes first."""
    read, foreign = refuse_resealed_chain(heap_chains, tmp_path, case, position)
    assert not foreign & set(read), read
    assert bool(read) == (position == "last")  # the first subtask's files, read and checked


#: A checkpoint's handle resealed to list a prefix of its chain: an older
#: checkpoint's chain, itself well formed (directory index, files kept).
CHAIN_PREFIXES = {
    "chk-3 without its last delta": (2, 3),
    "chk-3 as its base alone": (2, 1),
    "chk-2 as its base alone": (1, 1),
}


@pytest.mark.parametrize("position", ["first", "last"])
@pytest.mark.parametrize("cut", sorted(CHAIN_PREFIXES))
def test_a_resealed_heap_chain_cut_back_to_an_older_checkpoints_is_refused(
    heap_chains: tuple[Path, list[str]], tmp_path: Path, cut: str, position: str
) -> None:
    """Regression (I3): every link of the shorter chain holds, so only the
    checkpoint its last file was written for tells it is not the handle's --
    a restore restored the older checkpoint's state for that subtask."""
    _, directories = copied_chains(heap_chains, tmp_path)
    which, kept = CHAIN_PREFIXES[cut]
    directory = directories[which]
    index = 0 if position == "first" else 1

    def cut_back(document: Document) -> None:
        subtask = document["subtasks"][index]
        set_chain_files(subtask, subtask["files"][:kept])

    reseal(directory, cut_back)
    target = fresh_backends("heap-incremental")
    storage = CheckpointStorage(str(tmp_path / "root"), "restored")
    with pytest.raises(SnapshotFormatError, match="written for checkpoint"):
        CheckpointCoordinator.restore(storage, target, directory, RestoreMode.NO_CLAIM)
    assert all(list(b.entries("value")) == [] for b in target)
    for backend in target:
        backend.close()


def _removal_rows(key_group: int, bad: str, position: str) -> list[tuple[bytes, bytes, bytes]]:
    """Three removals of ``key_group`` (default serializers), the one at
    ``position`` broken as ``bad`` says."""
    ser = DefaultSerializer()
    keys = [k for k in range(2000) if assign_to_key_group(k, MAXP) == key_group][:3]
    rows = [(ser.serialize(VOID_NAMESPACE), ser.serialize(k), b"") for k in keys]
    at = {"first": 0, "middle": 1, "last": 2}[position]
    namespace, key, _ = rows[at]
    if bad == "a key of another key group":
        other = next(k for k in range(2000) if assign_to_key_group(k, MAXP) != key_group)
        rows[at] = (namespace, ser.serialize(other), b"")
    elif bad == "state bytes":
        rows[at] = (namespace, key, ser.serialize(1))
    elif bad == "a None key":
        rows[at] = (namespace, ser.serialize(None), b"")
    else:  # a key twice
        rows[at] = rows[(at + 1) % 3]
    return rows


REMOVAL_CASES = {
    "a key of another key group": (KeyGroupMismatchError, "to belong to it"),
    "state bytes": (SnapshotEntryError, "without state bytes"),
    "a None key": (SnapshotEntryError, "whose key is None"),
    "a key twice": (DuplicateMappingError, "twice in key group"),
}


@pytest.mark.parametrize("position", ["first", "middle", "last"])
@pytest.mark.parametrize("bad", sorted(REMOVAL_CASES))
def test_a_removal_the_checks_refuse_in_a_resealed_chain_is_refused(
    heap_chains: tuple[Path, list[str]], tmp_path: Path, bad: str, position: str
) -> None:
    """E1-E4 on a removals file: the chain's last file rewritten with a bad
    removal in key group 9 (its size and CRC32 resealed into ``_metadata``)."""
    root, directories = copied_chains(heap_chains, tmp_path)
    directory = directories[2]
    handle = read_metadata(FileSystem(), directory).subtasks[1]
    last = handle.files[-1]
    path = root / last.path
    reader = SnapshotReader(path.read_bytes())
    stream = io.BytesIO()
    writer = SnapshotWriter(stream, reader.metadata)
    writer.write_key_group(9, {0: _removal_rows(9, bad, position)})
    writer.finish()
    data = stream.getvalue()
    path.write_bytes(data)

    def rewritten(document: Document) -> None:
        subtask = document["subtasks"][1]
        subtask["files"][-1].update(size=len(data), crc32=zlib.crc32(data))
        set_chain_files(subtask, subtask["files"])

    reseal(directory, rewritten)
    error, message = REMOVAL_CASES[bad]
    target = fresh_backends("heap-incremental")
    storage = CheckpointStorage(str(tmp_path / "root"), "restored")
    with pytest.raises(error, match=re.escape(message)):
        CheckpointCoordinator.restore(storage, target, directory, RestoreMode.NO_CLAIM)
    assert all(list(b.entries("value")) == [] for b in target)
    for backend in target:
        backend.close()


@pytest.mark.parametrize("file", [1, 2, 4])
def test_a_changed_byte_in_any_delta_file_is_refused(
    heap_chains: tuple[Path, list[str]], tmp_path: Path, file: int
) -> None:
    root, directories = copied_chains(heap_chains, tmp_path)
    metadata = read_metadata(FileSystem(), directories[2])
    path = root / metadata.subtasks[1].files[file].path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    target = fresh_backends("heap-incremental")
    storage = CheckpointStorage(str(tmp_path / "root"), "restored")
    with pytest.raises(CorruptCheckpointError, match="CRC32"):
        CheckpointCoordinator.restore(storage, target, directories[2], RestoreMode.NO_CLAIM)
    assert all(list(b.entries("value")) == [] for b in target)
    for backend in target:
        backend.close()


# ---------------------------------------------------------------------- durability


def test_every_published_file_is_fsynced_before_its_rename_and_its_directory_after(
    tmp_path: Path,
) -> None:
    events: list[tuple[str, str]] = []

    def record(operation: str, path: str, _data: bytes | None) -> None:
        if operation != "write":
            events.append((operation, path))

    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem(hooks=record))
    backends = fresh_backends("heap")
    coordinator = CheckpointCoordinator(storage, backends)
    backends[0].set_current_key(1)
    backends[0].get_state(VALUE).update(1)
    coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
    renames = [i for i, (op, _) in enumerate(events) if op == "rename"]
    assert len(renames) >= 3  # counter, the subtasks' files, _metadata
    for i in renames:
        temp = events[i][1]
        assert ("fsync", temp) in events[:i], f"{temp} renamed before it was fsynced"
        final_dir = os.path.dirname(temp)
        assert ("fsync", final_dir) in events[i + 1 :], f"{final_dir} not fsynced after rename"


def test_metadata_of_the_current_format_round_trips(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "rocksdb")
    job.put(range(30), "a")
    directory = job.checkpoint()
    metadata = read_metadata(FileSystem(), directory)
    assert isinstance(metadata, CheckpointMetadata) and metadata.format_version == 2
    assert all(not f.path.startswith("/") for f in metadata.files)
    assert {f.path.split("/")[0] for f in metadata.files if f.scope == "shared"} == {"job"}
    job.close()
