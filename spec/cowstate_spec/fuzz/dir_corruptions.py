"""How the checkpoint-directory fuzzer damages a copy of a job's directory.

Each corruption class is a function of a :class:`DirCase` (the copy, the
snapshot the entry point reads, a seeded random generator) that changes files
on disk and returns what it did. The classes (:data:`DIR_CLASSES`) and the
entry points each one is run through:

- ``file:*`` (every entry point): a file the snapshot lists truncated,
  bit-flipped, deleted, emptied, swapped with another, replaced by a
  directory, by a symlink out of the root or to another file inside, a
  directory of it replaced by a symlink to a copy outside; an extra file;
- ``meta:*`` (every entry point): ``_metadata`` torn, bit-flipped, deleted,
  garbage, of another version or unsealed;
- ``reseal:*`` (every entry point): ``_metadata`` edited and sealed again
  (:func:`cowstate.checkpoint.sealed.seal`: what someone who can write the
  directory produces) -- paths absolute, with ``..``, with a scheme, through a
  symlink, naming another confined file; key-group ranges, ids, sizes, CRCs,
  a file edited or truncated with its size and CRC resealed, files listed
  twice, swapped or dropped, kinds, formats, serializers, states, scopes, max
  parallelism, ``disowned``, subtasks, JSON junk, a random field set to a
  hostile value;
- ``job:*`` (``recover`` only): the job directory's own files -- ``_counter``
  junk, a forged ``_restore`` or ``_savepoint``, stray ``chk-<id>`` entries,
  a ``chk-<id>`` or ``shared`` that is a symlink to a copy outside the root;
- ``chain:*`` (every entry point; only checkpoints whose heap chain has a
  delta: :attr:`DirClass.min_deltas`): a delta file torn, deleted or dropped
  from the handle, deltas reordered, a changes file swapped with its removals
  file, a delta or a whole chain of another job, any resealed chain edit
  (:mod:`~cowstate_spec.fuzz.chains`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cowstate.checkpoint.coordinator import SAVEPOINT_MARKER
from cowstate.checkpoint.handles import METADATA_FILE, METADATA_VERSION
from cowstate.checkpoint.sealed import seal
from cowstate.checkpoint.verify import METADATA_KIND
from cowstate.state_meta import STATE_KINDS
from cowstate_spec.fuzz.chains import CHAIN_CLASSES
from cowstate_spec.fuzz.jobs import MAX_PARALLELISM, Original

__all__ = ["DIR_CLASSES", "ENTRIES", "DirCase", "DirClass", "SnapshotInfo"]

#: The entry points: the three restore modes, recovery, inspection.
ENTRIES = ("claim", "no-claim", "legacy", "recover", "inspect")


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot of a fixture: its directory relative to the case root, its
    kind, and what it holds (:data:`~cowstate_spec.fuzz.jobs.Original`)."""

    name: str
    path: str
    kind: str
    original: Original
    #: Deltas in the snapshot's heap chain (0: not a chain).
    deltas: int = 0


@dataclass
class DirCase:
    """A copy of a fixture's tree, about to be damaged and read."""

    root: str
    target: SnapshotInfo
    snapshots: dict[str, SnapshotInfo]
    rng: random.Random

    @property
    def canary(self) -> str:
        return os.path.join(self.root, "canary")

    @property
    def storage_root(self) -> str:
        return os.path.join(self.root, "root")

    @property
    def job_dir(self) -> str:
        return os.path.join(self.root, "root", "job")

    @property
    def newest(self) -> tuple[SnapshotInfo, int]:
        """The newest retained checkpoint and its id."""
        checkpoints = [s for s in self.snapshots.values() if s.kind == "checkpoint"]
        newest = max(checkpoints, key=lambda s: int(s.name.split("-")[1]))
        return newest, int(newest.name.split("-")[1])

    def directory(self, snapshot: SnapshotInfo | None = None) -> str:
        return os.path.join(self.root, (snapshot or self.target).path)

    def document(self, snapshot: SnapshotInfo | None = None) -> dict[str, Any]:
        """The JSON body of ``_metadata`` (the fixture's: valid)."""
        with open(os.path.join(self.directory(snapshot), METADATA_FILE), "rb") as f:
            data = f.read()
        return json.loads(data[: data.rindex(b"#cowstate")])  # type: ignore[no-any-return]

    def reseal(self, document: Any, snapshot: SnapshotInfo | None = None) -> None:
        body = json.dumps(document, indent=1).encode()
        self.write(os.path.join(self.directory(snapshot), METADATA_FILE), self.seal(body))

    @staticmethod
    def seal(body: bytes, kind: str = METADATA_KIND, version: int = METADATA_VERSION) -> bytes:
        return seal(kind, version, body)

    def listed(self, snapshot: SnapshotInfo | None = None) -> list[tuple[int, int, str]]:
        """(subtask, file position, absolute path) of every file ``_metadata`` lists."""
        document = self.document(snapshot)
        found = []
        for s, subtask in enumerate(document["subtasks"]):
            for n, f in enumerate(subtask["files"]):
                base = self.storage_root if f["scope"] == "shared" else self.directory(snapshot)
                found.append((s, n, os.path.join(base, f["path"])))
        return found

    def pick_listed(self, *, nonempty: bool = False) -> tuple[int, int, str]:
        """A random file the target lists (``nonempty``: one with bytes)."""
        listed = self.listed()
        if nonempty:
            listed = [x for x in listed if os.path.getsize(x[2]) > 0]
        return self.rng.choice(listed)

    @staticmethod
    def write(path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
        with open(path, "wb") as f:
            f.write(data)

    @staticmethod
    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def rel(self, path: str) -> str:
        """``path`` relative to the case root (a URL as it is)."""
        return path if "://" in path else os.path.relpath(path, self.root)


Corrupt = Callable[[DirCase], str]


@dataclass(frozen=True)
class DirClass:
    """A corruption class and the entry points it is run through."""

    corrupt: Corrupt
    entries: tuple[str, ...] = ENTRIES
    #: The fewest deltas a target's heap chain must have (0: any snapshot).
    min_deltas: int = 0

    def targets(self, snapshots: dict[str, SnapshotInfo]) -> list[SnapshotInfo]:
        """The snapshots this class can damage, by name."""
        return [snapshots[n] for n in sorted(snapshots) if snapshots[n].deltas >= self.min_deltas]


# ---------------------------------------------------------------- file damage


def _file_truncate(case: DirCase) -> str:
    _s, _n, path = case.pick_listed()
    data = case.read(path)
    cut = case.rng.randrange(max(1, len(data)))
    case.write(path, data[:cut])
    return f"{case.rel(path)} truncated to {cut} of {len(data)} bytes"


def _file_bitflip(case: DirCase) -> str:
    _s, _n, path = case.pick_listed(nonempty=True)
    data = bytearray(case.read(path))
    at, bit = case.rng.randrange(len(data)), case.rng.randrange(8)
    data[at] ^= 1 << bit
    case.write(path, bytes(data))
    return f"{case.rel(path)} byte {at} bit {bit} flipped"


def _file_delete(case: DirCase) -> str:
    _s, _n, path = case.pick_listed()
    os.unlink(path)
    return f"{case.rel(path)} deleted"


def _file_empty(case: DirCase) -> str:
    _s, _n, path = case.pick_listed()
    case.write(path, b"")
    return f"{case.rel(path)} emptied"


def _file_swap(case: DirCase) -> str:
    listed = case.listed()
    if len(listed) < 2:
        return _file_bitflip(case)
    (_a, _b, first), (_c, _d, second) = case.rng.sample(listed, 2)
    one, two = case.read(first), case.read(second)
    case.write(first, two)
    case.write(second, one)
    return f"{case.rel(first)} and {case.rel(second)} swapped contents"


def _file_extra(case: DirCase) -> str:
    name = case.rng.choice(
        (
            "keyed-state-0-7.bak",
            ".hidden",
            "_metadata.inprogress",
            "rocksdb-0-7/000099.sst",
            "x/y/z",
            "._metadata.0123.inprogress",
        )
    )
    where = case.directory()
    if case.target.kind == "checkpoint" and case.rng.random() < 0.3:
        where = os.path.join(case.job_dir, "shared")
    path = os.path.join(where, name)
    case.write(path, case.rng.randbytes(case.rng.randint(0, 64)))
    return f"extra file {case.rel(path)}"


def _file_replaced_by_dir(case: DirCase) -> str:
    _s, _n, path = case.pick_listed()
    os.unlink(path)
    os.makedirs(os.path.join(path, "inner"))
    return f"{case.rel(path)} replaced by a directory"


def _file_symlink_out(case: DirCase) -> str:
    _s, _n, path = case.pick_listed()
    os.unlink(path)
    secret = os.path.join(case.canary, "secret")
    os.symlink(secret, path)
    return f"{case.rel(path)} replaced by a symlink to the canary {case.rel(secret)}"


def _file_symlink_in(case: DirCase) -> str:
    _s, _n, path = case.pick_listed()
    others = [
        p
        for snapshot in case.snapshots.values()
        if snapshot.kind == "checkpoint"
        for _a, _b, p in case.listed(snapshot)
        if p != path
    ]
    other = case.rng.choice(others)
    os.unlink(path)
    os.symlink(other, path)
    return f"{case.rel(path)} replaced by a symlink to {case.rel(other)} (inside the root)"


def _dir_symlink_out(case: DirCase) -> str:
    """A directory holding listed files becomes a link to a copy of it in the canary."""
    _s, _n, path = case.pick_listed()
    directory = os.path.dirname(path)
    if os.path.realpath(directory) == os.path.realpath(case.directory()):
        return _file_symlink_out(case)  # the snapshot directory itself: the user named it
    copy = os.path.join(case.canary, "copy-" + os.path.basename(directory))
    shutil.copytree(directory, copy)
    shutil.rmtree(directory)
    os.symlink(copy, directory)
    return f"{case.rel(directory)} replaced by a symlink to a copy in the canary"


# ------------------------------------------------------------- _metadata damage


def _metadata_path(case: DirCase) -> str:
    return os.path.join(case.directory(), METADATA_FILE)


def _meta_torn(case: DirCase) -> str:
    path = _metadata_path(case)
    data = case.read(path)
    cut = case.rng.choice((0, case.rng.randrange(len(data)), len(data) - 1))
    case.write(path, data[:cut])
    return f"{case.rel(path)} torn at {cut} of {len(data)} bytes"


def _meta_bitflip(case: DirCase) -> str:
    path = _metadata_path(case)
    data = bytearray(case.read(path))
    at, bit = case.rng.randrange(len(data)), case.rng.randrange(8)
    data[at] ^= 1 << bit
    case.write(path, bytes(data))
    return f"{case.rel(path)} byte {at} bit {bit} flipped"


def _meta_delete(case: DirCase) -> str:
    path = _metadata_path(case)
    os.unlink(path)
    return f"{case.rel(path)} deleted"


def _meta_garbage(case: DirCase) -> str:
    path = _metadata_path(case)
    choice = case.rng.randrange(4)
    if choice == 0:
        data, what = case.rng.randbytes(case.rng.randint(1, 4096)), "random bytes"
    elif choice == 1:
        data, what = case.seal(b"")[-90:], "a seal line alone"
    elif choice == 2:
        data, what = case.rng.randbytes(1 << 20), "1 MiB of random bytes"
    else:
        data, what = b"\n" * 100, "newlines"
    case.write(path, data)
    return f"{case.rel(path)} replaced by {what}"


def _meta_version(case: DirCase) -> str:
    path = _metadata_path(case)
    body = json.dumps(case.document()).encode()
    kind, version = case.rng.choice(
        (("metadata", 1), ("metadata", 3), ("restore", 1), ("savepoint", 1), ("metadata", 999999))
    )
    case.write(path, case.seal(body, kind, version))
    return f"{case.rel(path)} sealed as {kind} v{version}"


def _meta_unsealed(case: DirCase) -> str:
    path = _metadata_path(case)
    document = case.document()
    if case.rng.random() < 0.5:  # a version-1 document: absolute paths, no seal
        for subtask in document["subtasks"]:
            for f in subtask["files"]:
                base = case.storage_root if f["scope"] == "shared" else case.directory()
                f["path"] = os.path.join(base, f["path"])
        document["format_version"] = 1
    case.write(path, json.dumps(document).encode())
    return f"{case.rel(path)} without its seal line"


# ---------------------------------------------------------- resealed documents


def _any_file(
    document: dict[str, Any], rng: random.Random, *, nonempty: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A random (subtask, file) of the document (``nonempty``: of size > 0)."""
    files = [
        (subtask, f)
        for subtask in document["subtasks"]
        for f in subtask["files"]
        if f["size"] > 0 or not nonempty
    ]
    return rng.choice(files)


def _reseal_path(hostile: Callable[[DirCase, dict[str, Any]], str]) -> Corrupt:
    def corrupt(case: DirCase) -> str:
        document = case.document()
        _subtask, f = _any_file(document, case.rng)
        old = f["path"]
        f["path"] = hostile(case, f)
        case.reseal(document)
        return f"path {old!r} -> {f['path']!r} (resealed)"

    return corrupt


def _absolute(case: DirCase, f: dict[str, Any]) -> str:
    base = case.storage_root if f["scope"] == "shared" else case.directory()
    return case.rng.choice(
        (
            os.path.join(case.canary, "secret"),
            os.path.join(base, f["path"]),  # the right file, spelled absolute
            "/etc/hostname",
        )
    )


def _dotdot(case: DirCase, f: dict[str, Any]) -> str:
    base = case.storage_root if f["scope"] == "shared" else case.directory()
    up = os.path.relpath(os.path.join(case.canary, "secret"), base)
    return case.rng.choice((up, "a/../../" + up, f"job/shared/../../{up}", "../" + f["path"]))


def _scheme(case: DirCase, f: dict[str, Any]) -> str:
    return case.rng.choice(
        (
            "file://" + os.path.join(case.canary, "secret"),
            "ftp://127.0.0.1:1/x",
            "memory://fuzz/x",
            "http://127.0.0.1:1/x",
            "job/shared/file:x",
        )
    )


def _reseal_symlink(case: DirCase) -> str:
    document = case.document()
    _subtask, f = _any_file(document, case.rng)
    secret = os.path.join(case.canary, "secret")
    link = os.path.join(case.directory(), "innocent-looking")
    os.symlink(secret, link)
    data = case.read(secret)
    f.update(path="innocent-looking", scope="exclusive", size=len(data), crc32=zlib.crc32(data))
    _fix_sizes(document)
    case.reseal(document)
    return "a file's path -> a symlink in the snapshot to the canary, its size and CRC (resealed)"


def _reseal_other_file(case: DirCase) -> str:
    """A file's entry names another confined file of the snapshot, with its size
    and CRC32: another subtask's file."""
    document = case.document()
    subtasks = [s for s in document["subtasks"] if s["files"]]
    if len(subtasks) < 2:
        return _reseal_swap_files(case)
    one, two = case.rng.sample(subtasks, 2)
    f = case.rng.choice(one["files"])
    other = case.rng.choice([g for g in two["files"] if g["scope"] == f["scope"]] or two["files"])
    old = f["path"]
    f.update({k: other[k] for k in ("path", "size", "crc32", "scope")})
    for subtask in document["subtasks"]:
        subtask["files"] = list({(g["scope"], g["path"]): g for g in subtask["files"]}.values())
    _fix_sizes(document)
    case.reseal(document)
    return f"{old!r} -> another subtask's file {other['path']!r} (size and CRC; resealed)"


def _reseal_range(case: DirCase) -> str:
    document = case.document()
    subtasks = document["subtasks"]
    first, second = subtasks[0]["key_group_range"], subtasks[-1]["key_group_range"]
    choice = case.rng.randrange(5)
    if choice == 0:
        subtasks[0]["key_group_range"], subtasks[-1]["key_group_range"] = second, first
        what = "the two subtasks' ranges swapped"
    elif choice == 1:
        last = MAX_PARALLELISM - 1
        cut = case.rng.choice([c for c in range(1, last + 1) if c != second[0]])
        subtasks[0]["key_group_range"], subtasks[-1]["key_group_range"] = [0, cut - 1], [cut, last]
        what = f"the boundary moved to {cut}"
    elif choice == 2:
        m = MAX_PARALLELISM
        subtasks[0]["key_group_range"], subtasks[-1]["key_group_range"] = [0, m - 1], [m, m - 1]
        what = "subtask 0 holds every key group, the other none"
    elif choice == 3:
        subtasks[0]["key_group_range"] = [first[0], first[1] + 1]
        what = "overlapping ranges"
    else:
        subtasks[0]["key_group_range"] = case.rng.choice(([-1, 7], [0, 6], [7, 0], [0], "0-7"))
        what = f"subtask 0's range {subtasks[0]['key_group_range']!r}"
    case.reseal(document)
    return f"{what} (resealed)"


def _reseal_ids(case: DirCase) -> str:
    document = case.document()
    value: Any = case.rng.choice((0, -1, 1, 2, 3, 999, 2**63, "2", None))
    where = case.rng.choice(("document", "subtask", "both", "job"))
    if where == "job":
        value = case.rng.choice(("job2", "../job", "", "job/x", "JOB", "j" * 300))
        document["job_id"] = value
    if where in ("document", "both"):
        document["checkpoint_id"] = value
    if where in ("subtask", "both"):
        case.rng.choice(document["subtasks"])["checkpoint_id"] = value
    case.reseal(document)
    return f"{where} id {value!r} (resealed)"


def _reseal_sizes(case: DirCase) -> str:
    document = case.document()
    subtask, f = _any_file(document, case.rng)
    choice = case.rng.randrange(5)
    if choice == 0:
        f["size"] += case.rng.choice((-1, 1, 1 << 40))
        _fix_sizes(document)
        what = f"{f['path']!r} size {f['size']} (totals adjusted)"
    elif choice == 1:
        f["crc32"] = (f["crc32"] + 1) % (1 << 32)
        what = f"{f['path']!r} CRC32 changed"
    elif choice == 2:
        subtask["full_size"] += 1
        what = "a full_size off by one"
    elif choice == 3:
        subtask["checkpointed_size"] = subtask["full_size"] + 1
        what = "checkpointed_size > full_size"
    else:
        f["size"], f["crc32"] = case.rng.choice(((-1, 0), (0, 0), (2**63, 0), (1, 2**32)))
        what = f"{f['path']!r} size {f['size']} CRC {f['crc32']}"
    case.reseal(document)
    return f"{what} (resealed)"


def _reseal_file_edited(truncate: bool) -> Corrupt:
    def corrupt(case: DirCase) -> str:
        document = case.document()
        _subtask, f = _any_file(document, case.rng, nonempty=True)
        base = case.storage_root if f["scope"] == "shared" else case.directory()
        path = os.path.join(base, f["path"])
        data = bytearray(case.read(path))
        if truncate:
            cut = case.rng.randrange(len(data))
            data = data[:cut]
            what = f"truncated to {cut} bytes"
        else:
            at, bit = case.rng.randrange(len(data)), case.rng.randrange(8)
            data[at] ^= 1 << bit
            what = f"byte {at} bit {bit} flipped"
        case.write(path, bytes(data))
        f["size"], f["crc32"] = len(data), zlib.crc32(data)
        _fix_sizes(document)
        case.reseal(document)
        return f"{case.rel(path)} {what}, its size and CRC32 resealed"

    return corrupt


def _reseal_duplicate(case: DirCase) -> str:
    document = case.document()
    subtask, f = _any_file(document, case.rng)
    into = case.rng.choice(document["subtasks"])
    into["files"].append(dict(f))
    _fix_sizes(document)
    case.reseal(document)
    same = "the same subtask" if into is subtask else "another subtask"
    return f"{f['path']!r} listed again in {same} (resealed)"


def _reseal_swap_files(case: DirCase) -> str:
    document = case.document()
    subtasks = document["subtasks"]
    subtasks[0]["files"], subtasks[-1]["files"] = subtasks[-1]["files"], subtasks[0]["files"]
    _fix_sizes(document)
    case.reseal(document)
    return "the first and last subtasks' files swapped, ranges kept (resealed)"


def _reseal_drop_file(case: DirCase) -> str:
    document = case.document()
    subtask, f = _any_file(document, case.rng)
    subtask["files"].remove(f)
    _fix_sizes(document)
    case.reseal(document)
    return f"{f['path']!r} no longer listed (sizes adjusted; resealed)"


def _reseal_kind(case: DirCase) -> str:
    document = case.document()
    choice = case.rng.randrange(4)
    if choice == 0:
        document["kind"] = "savepoint" if document["kind"] == "checkpoint" else "checkpoint"
        document["savepoint_format"] = "canonical" if document["kind"] == "savepoint" else None
        what = f"kind {document['kind']!r}"
    elif choice == 1:
        document["savepoint_format"] = case.rng.choice(("native", "canonical", "weird", None))
        what = f"savepoint_format {document['savepoint_format']!r}"
    elif choice == 2:
        document["kind"] = case.rng.choice(("weird", "", None, 1))
        what = f"kind {document['kind']!r}"
    else:
        document["format_version"] = case.rng.choice((1, 3, "2", None))
        what = f"format_version {document['format_version']!r}"
    case.reseal(document)
    return f"{what} (resealed)"


def _reseal_format(case: DirCase) -> str:
    document = case.document()
    subtask = case.rng.choice(document["subtasks"])
    if case.rng.random() < 0.5:
        subtask["format"] = case.rng.choice(("heap", "canonical", "rocksdb-native", "weird"))
        what = f"a subtask's format {subtask['format']!r}"
    else:
        subtask["backend"] = case.rng.choice(("heap", "rocksdb", "weird"))
        what = f"a subtask's backend {subtask['backend']!r}"
    case.reseal(document)
    return f"{what} (resealed)"


def _reseal_serializer(case: DirCase) -> str:
    document = case.document()
    subtask = case.rng.choice(document["subtasks"])
    # Never "bytes" for a state: it decodes anything, so the document would be
    # valid (states of another type), not corrupt.
    value = case.rng.choice(("int32", "utf8", "pickle-immutable", "builtins.eval", ""))
    choice = case.rng.randrange(4) if subtask["states"] else 0
    if choice == 0:
        subtask["key_serializer"] = value
        what = f"key serializer {value!r}"
    else:
        state = case.rng.choice(subtask["states"])
        field = ("state_serializer", "namespace_serializer", "kind")[choice - 1]
        if field == "kind":
            value = case.rng.choice(STATE_KINDS)
        state[field] = value
        what = f"{field} of {state['name']!r} {value!r}"
    case.reseal(document)
    return f"{what} (resealed)"


def _reseal_states(case: DirCase) -> str:
    document = case.document()
    subtask = case.rng.choice([s for s in document["subtasks"] if s["states"]])
    states = subtask["states"]
    choice = case.rng.randrange(4)
    if choice == 0:
        dropped = states.pop(case.rng.randrange(len(states)))
        what = f"state {dropped['name']!r} dropped from a subtask"
    elif choice == 1:
        states.append(dict(case.rng.choice(states)))
        what = "a state listed twice"
    elif choice == 2:
        state = case.rng.choice(states)
        state["name"] = state["name"] + "-renamed"
        what = f"state {state['name']!r} renamed in a subtask"
    else:
        subtask["states"] = []
        what = "a subtask lists no states"
    case.reseal(document)
    return f"{what} (resealed)"


def _reseal_scope(case: DirCase) -> str:
    document = case.document()
    _subtask, f = _any_file(document, case.rng)
    old = f["scope"]
    f["scope"] = "shared" if old == "exclusive" else "exclusive"
    if case.rng.random() < 0.5 and f["scope"] == "shared":
        f["path"] = f"job/shared/{os.path.basename(f['path'])}"
    case.reseal(document)
    return f"{f['path']!r} scope {old} -> {f['scope']} (resealed)"


def _reseal_max_parallelism(case: DirCase) -> str:
    document = case.document()
    value = case.rng.choice((8, 32, 1, 0, 2**15 + 1))
    document["max_parallelism"] = value
    if case.rng.random() < 0.5:
        for subtask in document["subtasks"]:
            subtask["max_parallelism"] = value
        what = f"max parallelism {value} everywhere"
    else:
        what = f"the document's max parallelism {value}"
    case.reseal(document)
    return f"{what} (resealed)"


def _reseal_disowned(case: DirCase) -> str:
    document = case.document()
    shared = [f["path"] for s in document["subtasks"] for f in s["files"] if f["scope"] == "shared"]
    value = case.rng.choice(
        (shared[:1], ["job/shared/none"], ["../../canary/secret"], shared * 2, [7])
        if shared
        else (["job/shared/none"], ["../../canary/secret"], [7])
    )
    document["disowned"] = value
    case.reseal(document)
    return f"disowned {value!r} (resealed)"


def _reseal_subtasks(case: DirCase) -> str:
    document = case.document()
    subtasks = document["subtasks"]
    choice = case.rng.randrange(4)
    if choice == 0:
        subtasks.reverse()
        what = "subtasks listed in reverse order"
    elif choice == 1:
        subtasks.pop(case.rng.randrange(len(subtasks)))
        what = "a subtask dropped"
    elif choice == 2:
        subtasks.append(json.loads(json.dumps(subtasks[0])))
        what = "subtask 0 listed twice"
    else:
        document["subtasks"] = []
        what = "no subtasks"
    case.reseal(document)
    return f"{what} (resealed)"


def _reseal_junk(case: DirCase) -> str:
    path = _metadata_path(case)
    choice = case.rng.randrange(6)
    if choice == 0:
        body, what = b"[]", "a JSON list"
    elif choice == 1:
        body, what = b"null", "JSON null"
    elif choice == 2:
        body, what = json.dumps(case.document()).encode()[:-2], "JSON cut short"
    elif choice == 3:
        body, what = b"[" * 100_000 + b"]" * 100_000, "deeply nested JSON"
    elif choice == 4:
        document = case.document()
        document["checkpoint_id"] = 10**400
        body, what = json.dumps(document).encode(), "a 400-digit checkpoint id"
    else:
        body, what = b"\xff\xfe{}", "not UTF-8"
    case.write(path, case.seal(body))
    return f"{case.rel(path)}: {what} (sealed)"


_HOSTILE: tuple[Any, ...] = (
    None,
    -1,
    0,
    2**63,
    1.5,
    "",
    "../../canary/secret",
    "/etc/hostname",
    "ftp://127.0.0.1:1/x",
    [],
    {},
    True,
    "x" * 1000,
)


def _reseal_random(case: DirCase) -> str:
    document = case.document()
    leaves: list[tuple[Any, Any, str]] = []

    def walk(node: Any, path: str) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, dict | list) and value:
                walk(value, f"{path}.{key}")
            else:
                leaves.append((node, key, f"{path}.{key}"))

    walk(document, "")
    node, key, where = case.rng.choice(leaves)
    value = case.rng.choice(_HOSTILE)
    node[key] = value
    case.reseal(document)
    return f"{where[1:]} = {value!r:.40} (resealed)"


# --------------------------------------------------------- the job's own files


def _job_counter(case: DirCase) -> str:
    value = case.rng.choice((b"", b"-1", b"abc", b"9" * 40, b"0", b"\xff", b"1\n2"))
    case.write(os.path.join(case.job_dir, "_counter"), value)
    return f"_counter = {value!r}"


def _job_restore_record(case: DirCase) -> str:
    outside = os.path.join(case.root, "savepoints", "sp-canonical")
    directory = case.rng.choice(
        (
            case.canary,
            os.path.join(case.canary, "dir"),
            outside,
            case.job_dir,
            case.storage_root,
            os.path.join(case.job_dir, "chk-1"),
            "ftp://127.0.0.1:1/x",
        )
    )
    mode = case.rng.choice(("claim", "no-claim", "legacy"))
    record = {"directory": directory, "mode": mode, "checkpoint_id": 1, "kind": "savepoint"}
    body = json.dumps(record).encode()
    data = case.seal(body, "restore", 1) if case.rng.random() < 0.8 else body
    case.write(os.path.join(case.job_dir, "_restore"), data)
    return f"_restore names {case.rel(directory)!r} in {mode} mode" + (
        "" if data is not body else " (unsealed)"
    )


def _job_savepoint_intent(case: DirCase) -> str:
    inside = os.path.join(case.job_dir, "savepoints", "sp-inside")
    directory = case.rng.choice(
        (
            case.canary,
            os.path.join(case.root, "savepoints", "sp-canonical"),
            inside,
            case.job_dir,
            case.storage_root,
            os.path.join(case.job_dir, "chk-2"),
            os.path.join(case.job_dir, "savepoints"),
        )
    )
    token = "f" * 32
    marker = ""
    if directory.startswith(case.job_dir + "/") and case.rng.random() < 0.5:
        case.write(os.path.join(directory, SAVEPOINT_MARKER), token.encode())
        marker = " with its marker planted"
    body = json.dumps({"directory": directory, "token": token}).encode()
    case.write(os.path.join(case.job_dir, "_savepoint"), case.seal(body, "savepoint", 1))
    return f"_savepoint names {case.rel(directory)!r}{marker}"


def _job_stray(case: DirCase) -> str:
    choice = case.rng.randrange(6)
    job = case.job_dir
    if choice == 0:
        os.makedirs(os.path.join(job, "chk-7"))
        what = "an empty chk-7"
    elif choice == 1:
        case.write(os.path.join(job, "chk-7", METADATA_FILE), b"junk")
        what = "chk-7 with a junk _metadata"
    elif choice == 2:
        _newest, n = case.newest
        shutil.copytree(os.path.join(job, f"chk-{n}"), os.path.join(job, f"chk-{n + 1}"))
        what = f"chk-{n + 1}, a copy of chk-{n} (its _metadata says {n})"
    elif choice == 3:
        case.write(os.path.join(job, "chk-x", "file"), b"x")
        what = "chk-x"
    elif choice == 4:
        case.write(os.path.join(job, "._counter.0123.inprogress"), b"5")
        what = "a temporary file"
    else:
        case.write(os.path.join(job, "shared", "stray.sst"), b"x" * 10)
        what = "an unreferenced shared/stray.sst"
    return f"stray {what} in the job directory"


def _job_symlink_out(case: DirCase) -> str:
    job = case.job_dir
    if case.rng.random() < 0.5 or not os.path.isdir(os.path.join(job, "shared")):
        newest, n = case.newest
        copy = os.path.join(case.canary, f"chk-{n + 1}")
        shutil.copytree(os.path.join(job, f"chk-{n}"), copy)
        document = case.document(newest)
        document["checkpoint_id"] = n + 1
        for subtask in document["subtasks"]:
            subtask["checkpoint_id"] = n + 1
        body = json.dumps(document, indent=1).encode()
        case.write(os.path.join(copy, METADATA_FILE), case.seal(body))
        os.symlink(copy, os.path.join(job, f"chk-{n + 1}"))
        return f"chk-{n + 1} is a symlink to a copy of chk-{n} (resealed as {n + 1}) in the canary"
    copy = os.path.join(case.canary, "shared")
    shutil.copytree(os.path.join(job, "shared"), copy)
    shutil.rmtree(os.path.join(job, "shared"))
    os.symlink(copy, os.path.join(job, "shared"))
    return "shared/ is a symlink to a copy of it in the canary"


def _fix_sizes(document: dict[str, Any]) -> None:
    """Make full_size and checkpointed_size agree with the files again (M5)."""
    for subtask in document["subtasks"]:
        total = sum(f["size"] for f in subtask["files"] if isinstance(f.get("size"), int))
        subtask["full_size"] = total
        subtask["checkpointed_size"] = min(subtask["checkpointed_size"], total)


def _dir_classes() -> dict[str, DirClass]:
    recover_only = ("recover",)
    return {
        "file:truncate": DirClass(_file_truncate),
        "file:bitflip": DirClass(_file_bitflip),
        "file:delete": DirClass(_file_delete),
        "file:empty": DirClass(_file_empty),
        "file:swap": DirClass(_file_swap),
        "file:extra": DirClass(_file_extra),
        "file:replaced-by-dir": DirClass(_file_replaced_by_dir),
        "file:symlink-out": DirClass(_file_symlink_out),
        "file:symlink-in": DirClass(_file_symlink_in),
        "file:dir-symlink-out": DirClass(_dir_symlink_out),
        "meta:torn": DirClass(_meta_torn),
        "meta:bitflip": DirClass(_meta_bitflip),
        "meta:delete": DirClass(_meta_delete),
        "meta:garbage": DirClass(_meta_garbage),
        "meta:version": DirClass(_meta_version),
        "meta:unsealed": DirClass(_meta_unsealed),
        "reseal:path-absolute": DirClass(_reseal_path(_absolute)),
        "reseal:path-dotdot": DirClass(_reseal_path(_dotdot)),
        "reseal:path-scheme": DirClass(_reseal_path(_scheme)),
        "reseal:path-symlink": DirClass(_reseal_symlink),
        "reseal:path-other-file": DirClass(_reseal_other_file),
        "reseal:range": DirClass(_reseal_range),
        "reseal:ids": DirClass(_reseal_ids),
        "reseal:sizes": DirClass(_reseal_sizes),
        "reseal:file-edited": DirClass(_reseal_file_edited(False)),
        "reseal:file-truncated": DirClass(_reseal_file_edited(True)),
        "reseal:duplicate-file": DirClass(_reseal_duplicate),
        "reseal:swap-files": DirClass(_reseal_swap_files),
        "reseal:drop-file": DirClass(_reseal_drop_file),
        "reseal:kind": DirClass(_reseal_kind),
        "reseal:format": DirClass(_reseal_format),
        "reseal:serializer": DirClass(_reseal_serializer),
        "reseal:states": DirClass(_reseal_states),
        "reseal:scope": DirClass(_reseal_scope),
        "reseal:max-parallelism": DirClass(_reseal_max_parallelism),
        "reseal:disowned": DirClass(_reseal_disowned),
        "reseal:subtasks": DirClass(_reseal_subtasks),
        "reseal:junk": DirClass(_reseal_junk),
        "reseal:random": DirClass(_reseal_random),
        "job:counter": DirClass(_job_counter, recover_only),
        "job:restore-record": DirClass(_job_restore_record, recover_only),
        "job:savepoint-intent": DirClass(_job_savepoint_intent, recover_only),
        "job:stray": DirClass(_job_stray, recover_only),
        "job:symlink-out": DirClass(_job_symlink_out, recover_only),
        **{
            name: DirClass(corrupt, min_deltas=deltas)
            for name, (corrupt, deltas) in CHAIN_CLASSES.items()
        },
    }


#: Every corruption class of checkpoint directories, by name.
DIR_CLASSES: dict[str, DirClass] = _dir_classes()
