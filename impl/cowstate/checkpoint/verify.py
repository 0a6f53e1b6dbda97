"""Verifying a ``_metadata`` document before anything acts on it.

:func:`parse_metadata` turns the bytes of a ``_metadata`` file into a
:class:`~cowstate.checkpoint.handles.CheckpointMetadata` that holds together,
or raises a :class:`~cowstate.errors.CorruptCheckpointError` subclass; no other
exception escapes it, whatever the bytes. The checks, in order (cited as M1-M9):

M1. The seal: format version and SHA-256 of the content
    (:mod:`~cowstate.checkpoint.sealed`).
M2. The schema: pydantic validation of the JSON body, unknown fields refused.
M3. Identity: a job id of letters, digits, ``.``, ``_``, ``-``; a checkpoint
    id >= 1; ``savepoint_format`` set exactly for savepoints.
M4. Key groups: every subtask has the document's max parallelism and a range
    inside ``[0, max parallelism - 1]``; the ranges are disjoint and together
    cover every key group (a job's subtasks own all of them); a subtask with
    an empty range lists no state and no file.
M5. Handles: every subtask's ``checkpoint_id`` is the document's, its state ids
    and names are distinct, a subtask that lists states lists files,
    ``full_size`` is the sum of its file sizes and ``checkpointed_size`` at
    most that.
M6. Paths and names: every file path is relative and confined
    (:mod:`~cowstate.checkpoint.paths`, P1-P2), every file's local name one
    plain name and the directory ``restored_from`` names a name a file
    system may be given (P5); a savepoint has no shared file.
M7. No file is listed twice (in one subtask or across subtasks).
M8. ``disowned`` names only shared files the document lists.
M9. One job, one schema: every subtask names the same key serializer, and a
    state listed by several subtasks has the same kind and serializers in
    each (a subtask restored alone would otherwise adopt a schema the others
    contradict).

What M1-M9 cannot know -- whether the files exist with the listed sizes and
CRCs, and what they hold -- is checked when they are read, before anything
is restored.
"""

from __future__ import annotations

import re

from cowstate.checkpoint.handles import METADATA_KIND, METADATA_VERSION, CheckpointMetadata
from cowstate.checkpoint.paths import (
    check_exclusive_path,
    check_file_name,
    check_name,
    check_shared_path,
)
from cowstate.checkpoint.sealed import unseal_model
from cowstate.errors import InconsistentMetadataError

__all__ = ["METADATA_KIND", "parse_metadata", "verify_metadata"]

_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def parse_metadata(data: bytes, where: str) -> CheckpointMetadata:
    """The verified document in ``data`` (M1-M9); ``where`` names it in errors."""
    metadata = unseal_model(  # M1, M2
        data,
        METADATA_KIND,
        METADATA_VERSION,
        CheckpointMetadata,
        "a valid _metadata document",
        where,
    )
    verify_metadata(metadata, where)
    return metadata


def verify_metadata(metadata: CheckpointMetadata, where: str) -> None:
    """M3-M9 over a parsed document, or one about to be written
    (:mod:`~cowstate.checkpoint.metadata`: the writer never writes what a
    reader would refuse)."""
    _check_identity(metadata, where)
    _check_key_groups(metadata, where)
    seen: set[tuple[str, str]] = set()
    shared: set[str] = set()
    for index, handle in enumerate(metadata.subtasks):
        if handle.checkpoint_id != metadata.checkpoint_id:  # M5
            raise InconsistentMetadataError(
                f"expected subtask {index} of {where} to belong to checkpoint "
                f"{metadata.checkpoint_id}, it says {handle.checkpoint_id}"
            )
        ids = [s.id for s in handle.states]
        names = [s.name for s in handle.states]
        if len(set(ids)) != len(ids) or len(set(names)) != len(names):
            raise InconsistentMetadataError(
                f"expected distinct state ids and names in subtask {index} of {where}, got "
                f"ids {ids} and names {names}"
            )
        if handle.states and not handle.files:
            raise InconsistentMetadataError(
                f"expected files in subtask {index} of {where}, which lists states "
                f"{names[:5]}, got none"
            )
        total = sum(f.size for f in handle.files)
        if handle.full_size != total or handle.checkpointed_size > total:
            raise InconsistentMetadataError(
                f"expected subtask {index} of {where} to have full_size = {total} (the sum of "
                f"its file sizes) >= checkpointed_size, got full_size {handle.full_size} and "
                f"checkpointed_size {handle.checkpointed_size}"
            )
        for f in handle.files:
            if f.scope == "shared":  # M6
                if metadata.kind == "savepoint":
                    raise InconsistentMetadataError(
                        f"expected only exclusive files in savepoint {where}, subtask {index} "
                        f"lists the shared file {f.path!r}"
                    )
                check_shared_path(f.path)
                shared.add(f.path)
            else:
                check_exclusive_path(f.path)
            if f.local_name is not None:  # M6, P5: a RocksDB restore downloads it under it
                check_file_name(
                    f.local_name, f"the local name of {f.scope} file {f.path!r} in {where}"
                )
            if (f.scope, f.path) in seen:  # M7
                raise InconsistentMetadataError(
                    f"expected every file once in {where}, {f.scope} file {f.path!r} is "
                    f"listed twice (again in subtask {index})"
                )
            seen.add((f.scope, f.path))
    if metadata.restored_from is not None:  # M6, P5: recovery may look there
        check_name(metadata.restored_from.directory, f"the directory of restored_from in {where}")
    _check_schema(metadata, where)  # M9
    stray = sorted(set(metadata.disowned) - shared)  # M8
    if stray:
        raise InconsistentMetadataError(
            f"expected 'disowned' in {where} to name shared files of the document, got {stray[:3]}"
        )


# ------------------------------------------------------------ private helpers


def _check_identity(metadata: CheckpointMetadata, where: str) -> None:
    """M3."""
    if not _JOB_ID.match(metadata.job_id):
        raise InconsistentMetadataError(
            f"expected a job id of letters, digits, '.', '_' and '-' in {where}, got "
            f"{metadata.job_id[:80]!r}"
        )
    if metadata.checkpoint_id < 1:
        raise InconsistentMetadataError(
            f"expected a checkpoint id >= 1 in {where}, got {metadata.checkpoint_id}"
        )
    if (metadata.kind == "savepoint") != (metadata.savepoint_format is not None):
        raise InconsistentMetadataError(
            f"expected a savepoint format exactly for a savepoint in {where}, got kind "
            f"{metadata.kind!r} with savepoint_format {metadata.savepoint_format!r}"
        )
    if not metadata.subtasks:
        raise InconsistentMetadataError(f"expected at least one subtask in {where}, got none")


def _check_schema(metadata: CheckpointMetadata, where: str) -> None:
    """M9."""
    key_serializers = {handle.key_serializer for handle in metadata.subtasks}
    if len(key_serializers) > 1:
        raise InconsistentMetadataError(
            f"expected one key serializer for every subtask of {where}, got "
            f"{sorted(key_serializers)}"
        )
    schemas: dict[str, tuple[str, str, str]] = {}
    for index, handle in enumerate(metadata.subtasks):
        for state in handle.states:
            schema = (str(state.kind), state.namespace_serializer, state.state_serializer)
            known = schemas.setdefault(state.name, schema)
            if known != schema:
                raise InconsistentMetadataError(
                    f"expected state {state.name!r} to have one kind and serializers in every "
                    f"subtask of {where}, subtask {index} has {schema}, another {known}"
                )


def _check_key_groups(metadata: CheckpointMetadata, where: str) -> None:
    """M4."""
    max_parallelism = metadata.max_parallelism
    ranges = []
    for index, handle in enumerate(metadata.subtasks):
        start, end = handle.key_group_range
        if handle.max_parallelism != max_parallelism:
            raise InconsistentMetadataError(
                f"expected subtask {index} of {where} to have max parallelism "
                f"{max_parallelism}, got {handle.max_parallelism}"
            )
        if not 0 <= start <= end + 1 <= max_parallelism:
            raise InconsistentMetadataError(
                f"expected subtask {index} of {where} to hold key groups inside "
                f"[0, {max_parallelism - 1}], got [{start}, {end}]"
            )
        if start <= end:
            ranges.append((start, end, index))
        elif handle.states or handle.files:
            raise InconsistentMetadataError(
                f"expected subtask {index} of {where}, which holds no key group, to hold no "
                f"state and no file, it lists {len(handle.states)} states and "
                f"{len(handle.files)} files"
            )
    ranges.sort()
    expected = 0
    for start, end, index in ranges:
        if start != expected:
            what = "overlaps" if start < expected else f"leaves key groups {expected}..{start - 1}"
            raise InconsistentMetadataError(
                f"expected the subtasks of {where} to split [0, {max_parallelism - 1}] into "
                f"disjoint ranges, subtask {index}'s [{start}, {end}] {what}"
            )
        expected = end + 1
    if expected != max_parallelism:
        raise InconsistentMetadataError(
            f"expected the subtasks of {where} to cover every key group up to "
            f"{max_parallelism - 1}, they end at {expected - 1}"
        )
