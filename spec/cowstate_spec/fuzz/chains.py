"""Heap incremental chains (:mod:`cowstate.heap_incremental`) broken on purpose:
the edits a resealed ``_metadata`` can make to a handle's chain, and the
directory fuzzer's ``chain:*`` classes.

A chain's handle lists ``[base, changes 1, removals 1, changes 2, removals
2, ...]``, every one a shared file of the job naming its parent's size and
CRC32 (I3). Two kinds of damage, and what must refuse each:

- **resealed edits** (:data:`CHAIN_EDITS`): the handle's file list rewritten
  and ``_metadata`` sealed again (:func:`cowstate.checkpoint.sealed.seal`),
  so its own checksum passes and only the chain's checks can refuse it --
  files out of order, missing, of the wrong kind, of another job. Each edit
  is a function of the handle's files and another job's chain of the same
  shape (file dictionaries as ``_metadata`` holds them), with the words
  the restore's error must contain. ``tests/test_restore_trust.py`` runs
  every edit on either subtask; the fuzzer draws them;
- **damaged files** (:data:`CHAIN_CLASSES`, run by
  :mod:`~cowstate_spec.fuzz.dir_corruptions` on a fixture whose checkpoints
  are chains): a delta file torn, deleted, swapped with its pair or replaced
  by another job's file, on disk only (the handle's size and CRC32 refuse
  it) or with its size and CRC32 resealed (only the file's own CRCs and the
  links of I3 are left).

Every class picks the subtask and the file it damages from the case's
random generator; the target is a checkpoint whose chain has at least one
delta (``chain:reordered`` and ``chain:resealed``: two).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cowstate.checkpoint.handles import METADATA_FILE

if TYPE_CHECKING:  # dir_corruptions imports this module to register its classes
    from cowstate_spec.fuzz.dir_corruptions import DirCase

__all__ = ["CHAIN_CLASSES", "CHAIN_EDITS", "ChainEdit", "set_chain_files"]

#: A file of a handle as ``_metadata`` holds it (path, scope, size, crc32, ...).
FileDoc = dict[str, Any]
#: ``edit(files, foreign)``: a handle's new chain, from its chain and another
#: job's chain of the same shape.
ChainEdit = Callable[[list[FileDoc], list[FileDoc]], list[FileDoc]]

#: How a resealed ``_metadata`` breaks a chain of at least two deltas, and what
#: the restore's error says.
CHAIN_EDITS: dict[str, tuple[ChainEdit, str]] = {
    "deltas swapped": (lambda f, _: [*f[:-4], *f[-2:], *f[-4:-2]], "to follow the file"),
    "removals missing": (lambda f, _: [*f[:-3], *f[-2:]], "a base and pairs"),
    "a delta pair missing": (lambda f, _: [f[0], *f[3:]], "to follow the file"),
    "changes and removals swapped": (
        lambda f, _: [f[0], f[2], f[1], *f[3:]],
        "in format heap-delta",
    ),
    "a delta alone": (lambda f, _: [f[-2]], "in format heap of max parallelism"),
    "no base": (lambda f, _: f[1:], "a base and pairs"),
    "another job's base": (lambda f, o: [o[0], *f[1:]], "shared in job 'job'"),
    "another job's delta": (lambda f, o: [f[0], o[1], *f[2:]], "shared in job 'job'"),
    "another job's chain": (lambda f, o: o[: len(f)], "shared in job 'job'"),
}


def set_chain_files(subtask: dict[str, Any], files: list[FileDoc]) -> None:
    """Give a subtask of ``_metadata`` the chain ``files``, its sizes agreeing (M5)."""
    subtask["files"] = files
    subtask["full_size"] = sum(f["size"] for f in files)
    subtask["checkpointed_size"] = min(subtask["checkpointed_size"], subtask["full_size"])


# ------------------------------------------------------------ the fuzz classes


def _chain_reordered(case: DirCase) -> str:
    return _resealed_edit(case, ("deltas swapped", "a delta pair missing"))


def _chain_resealed(case: DirCase) -> str:
    return _resealed_edit(case, tuple(CHAIN_EDITS))


def _chain_torn(case: DirCase) -> str:
    """A delta file (changes or removals) cut short; half the time its size and
    CRC32 resealed."""
    document, subtask, index = _pick_delta(case)
    f = subtask["files"][index]
    path = _path(case, f)
    data = case.read(path)
    cut = case.rng.randrange(len(data))
    case.write(path, data[:cut])
    what = f"{_role(index)} {case.rel(path)} torn at {cut} of {len(data)} bytes"
    return what + _maybe_reseal(case, document, subtask, {index: data[:cut]})


def _chain_missing(case: DirCase) -> str:
    """A delta file deleted on disk, or dropped from the handle (resealed)."""
    document, subtask, index = _pick_delta(case)
    f = subtask["files"][index]
    if case.rng.random() < 0.5:
        os.unlink(_path(case, f))
        return f"{_role(index)} {f['path']!r} deleted"
    files = list(subtask["files"])
    dropped = files[index : index + 1] if case.rng.random() < 0.5 else _pair(files, index)
    set_chain_files(subtask, [g for g in files if g not in dropped])
    case.reseal(document)
    return f"{[g['path'] for g in dropped]!r} dropped from the handle (resealed)"


def _chain_removals_swapped(case: DirCase) -> str:
    """A delta's removals file and its changes file swapped: their contents on
    disk (sizes and CRC32s kept or resealed), or their places in the handle
    (resealed)."""
    document, subtask, index = _pick_delta(case)
    files = subtask["files"]
    changes = index if index % 2 else index - 1
    removals = changes + 1
    if case.rng.random() < 0.5:
        files[changes], files[removals] = files[removals], files[changes]
        set_chain_files(subtask, files)
        case.reseal(document)
        return f"delta {(changes + 1) // 2}'s changes and removals swapped in the handle (resealed)"
    one, two = _path(case, files[changes]), _path(case, files[removals])
    data_one, data_two = case.read(one), case.read(two)
    case.write(one, data_two)
    case.write(two, data_one)
    what = f"{case.rel(one)} and {case.rel(two)} (changes, removals) swapped contents"
    return what + _maybe_reseal(case, document, subtask, {changes: data_two, removals: data_one})


def _chain_foreign_delta(case: DirCase) -> str:
    """A delta file of the other job (same position, same shape, other contents):
    copied over ours (size and CRC32 kept or resealed), or copied into our
    ``shared/`` under a new name the handle lists (resealed)."""
    document, subtask, index = _pick_delta(case)
    position = document["subtasks"].index(subtask)
    foreign = _foreign_files(case, position)[index]
    data = case.read(os.path.join(case.storage_root, foreign["path"]))
    ours = subtask["files"][index]
    if case.rng.random() < 0.5:
        path = _path(case, ours)
        case.write(path, data)
        what = f"{_role(index)} {case.rel(path)} replaced by the other job's {foreign['path']!r}"
        return what + _maybe_reseal(case, document, subtask, {index: data})
    name = f"job/shared/from-other-{os.path.basename(foreign['path'])}"
    case.write(os.path.join(case.storage_root, name), data)
    subtask["files"][index] = dict(ours, path=name, size=len(data), crc32=zlib.crc32(data))
    set_chain_files(subtask, subtask["files"])
    case.reseal(document)
    return f"{_role(index)} {ours['path']!r} -> the other job's file copied to {name!r} (resealed)"


def _chain_foreign_chain(case: DirCase) -> str:
    """A subtask's whole chain taken from the other job's checkpoint of the same
    id and shape: its bytes copied over ours (sizes and CRC32s as they were),
    or the handle naming the other job's files where they are (resealed)."""
    document = case.document()
    position = case.rng.randrange(len(document["subtasks"]))
    subtask = document["subtasks"][position]
    foreign = _foreign_files(case, position)
    if case.rng.random() < 0.5:
        for ours, theirs in zip(subtask["files"], foreign, strict=True):
            data = case.read(os.path.join(case.storage_root, theirs["path"]))
            case.write(_path(case, ours), data)
        return f"subtask {position}'s chain overwritten by the other job's files"
    set_chain_files(subtask, [dict(f) for f in foreign])
    case.reseal(document)
    return f"subtask {position}'s handle names the other job's chain (resealed)"


# ---------------------------------------------------------------- helpers


def _resealed_edit(case: DirCase, names: tuple[str, ...]) -> str:
    document = case.document()
    position = case.rng.randrange(len(document["subtasks"]))
    subtask = document["subtasks"][position]
    name = case.rng.choice(names)
    edit, _message = CHAIN_EDITS[name]
    set_chain_files(subtask, edit(list(subtask["files"]), _foreign_files(case, position)))
    case.reseal(document)
    return f"subtask {position}'s chain: {name} (resealed)"


def _pick_delta(case: DirCase) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The document, a subtask of it and the index of one of its delta files."""
    document = case.document()
    subtask = case.rng.choice(document["subtasks"])
    return document, subtask, case.rng.randrange(1, len(subtask["files"]))


def _pair(files: list[FileDoc], index: int) -> list[FileDoc]:
    changes = index if index % 2 else index - 1
    return files[changes : changes + 2]


def _role(index: int) -> str:
    return f"delta {(index + 1) // 2}'s {'changes' if index % 2 else 'removals'}"


def _path(case: DirCase, f: FileDoc) -> str:
    return os.path.join(case.storage_root, f["path"])


def _foreign_files(case: DirCase, position: int) -> list[FileDoc]:
    """Subtask ``position``'s chain in the other job's checkpoint of the target's id."""
    other = os.path.join(case.storage_root, "other", os.path.basename(case.directory()))
    with open(os.path.join(other, METADATA_FILE), "rb") as f:
        data = f.read()
    document = json.loads(data[: data.rindex(b"#cowstate")])
    return [dict(f) for f in document["subtasks"][position]["files"]]


def _maybe_reseal(
    case: DirCase, document: dict[str, Any], subtask: dict[str, Any], written: dict[int, bytes]
) -> str:
    """Half the time: the handle's size and CRC32 of every file of ``written``
    (index -> its new bytes) resealed, so only the files' contents can tell."""
    if case.rng.random() < 0.5:
        return ""
    for index, data in written.items():
        subtask["files"][index].update(size=len(data), crc32=zlib.crc32(data))
    set_chain_files(subtask, subtask["files"])
    case.reseal(document)
    return ", its size and CRC32 resealed"


def _chain_classes() -> dict[str, Callable[[DirCase], str]]:
    return {
        "chain:torn": _chain_torn,
        "chain:reordered": _chain_reordered,
        "chain:missing": _chain_missing,
        "chain:removals-swapped": _chain_removals_swapped,
        "chain:foreign-delta": _chain_foreign_delta,
        "chain:foreign-chain": _chain_foreign_chain,
        "chain:resealed": _chain_resealed,
    }


#: The chain classes by name; ``(class, fewest deltas its target needs)``.
CHAIN_CLASSES: dict[str, tuple[Callable[[DirCase], str], int]] = {
    name: (corrupt, 2 if name in ("chain:reordered", "chain:resealed") else 1)
    for name, corrupt in _chain_classes().items()
}
