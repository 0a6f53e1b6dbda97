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
import json
import os
import re
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
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

from cowstate.checkpoint.coordinator import SAVEPOINT_MARKER, CheckpointCoordinator
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import (
    METADATA_FILE,
    CheckpointMetadata,
    KeyedStateHandle,
    RestoreMode,
    RestoreRecord,
)
from cowstate.checkpoint.inspect import inspect_snapshot
from cowstate.checkpoint.location import SnapshotSource
from cowstate.checkpoint.sealed import seal
from cowstate.checkpoint.storage import (
    CLAIM_MARKER,
    CheckpointStorage,
    SavepointIntent,
    read_metadata,
)
from cowstate.checkpoint.verify import METADATA_KIND
from cowstate.descriptors import ValueStateDescriptor
from cowstate.errors import (
    CorruptCheckpointError,
    CowStateError,
    InconsistentMetadataError,
    KeyGroupMismatchError,
    MetadataChecksumError,
    SnapshotFormatError,
    UnsafePathError,
    UnsupportedMetadataVersionError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import (
    KeyGroupRange,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.rocksdb.table import encode_rocks_key

MAXP = 16
VALUE: ValueStateDescriptor[Any] = ValueStateDescriptor("value")
BACKENDS = {"heap": HeapKeyedStateBackend, "rocksdb": RocksDBKeyedStateBackend}
EITHER = pytest.mark.parametrize("kind", sorted(BACKENDS))


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


def test_a_torn_counter_never_hands_out_an_id_twice(tmp_path: Path) -> None:
    job = Job(tmp_path / "root", "heap")
    job.checkpoint()
    job.checkpoint()
    job.close()
    Path(job.storage.job_dir, "_counter").write_text("")
    recovered = Job(tmp_path / "root", "heap", how="recover")
    assert re.search(r"chk-3$", recovered.checkpoint())
    recovered.close()


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
