"""The compatibility rules of a restore: what a snapshot -- the ``_metadata`` of
a job, a keyed-state handle, a snapshot file's metadata -- must agree on with
whoever restores it, checked before a byte of an entry is decoded.

What the entries themselves may hold is E1-E6 of
:mod:`cowstate.snapshot.checks`; whether the bytes are the ones written is
the files' sizes and CRC32s, and whether a ``_metadata`` holds together is
M1-M9 of :mod:`cowstate.checkpoint.verify`. The rules here, cited as C1-C7
where they are checked:

C1. Max parallelism: a snapshot has the max parallelism of whoever restores
    it -- the number of key groups cannot change
    (:func:`check_max_parallelism`). A backend checks every handle and every
    file; :func:`~cowstate.snapshot.restore.read_snapshot` each file, when
    told the max parallelism; the coordinator the ``_metadata`` a job is
    restored from or recovers.
C2. Key serializer: a backend restores only handles and files written with
    its key serializer (:func:`check_key_serializer`).
C3. Namespace serializer: every state of a handle or file a backend restores
    was written with the backend's namespace serializer
    (:func:`check_namespace_serializer`).
C4. Kind: a state the restoring side knows -- registered by a descriptor,
    given to ``read_snapshot``, or read from an earlier handle or file of the
    same restore -- keeps its kind (:func:`check_kind`).
C5. Serializers decode what they wrote: a serializer the restoring side
    decodes with has the identifier the snapshot names -- a known state's
    state serializer (both backends), and every serializer given to
    ``read_snapshot`` (key, namespace, state) (:func:`check_serializer`).
C6. Formats: a backend restores handles of its own native format or of a
    canonical savepoint, one format per restore (:func:`check_handle_format`,
    :func:`check_one_format`); the heap reads heap and canonical snapshot
    files (:func:`check_heap_file_format`), a RocksDB restore of a canonical
    savepoint canonical ones (:func:`check_canonical_file_format`).
C7. One restore, one snapshot: the files ``read_snapshot`` accumulates into
    one result agree on max parallelism and key serializer
    (:func:`check_same_max_parallelism`, :func:`check_same_key_serializer`).

Each rule raises a :mod:`cowstate.errors` exception naming what was
expected and what came (C1, C7: :class:`~cowstate.errors.MaxParallelismMismatchError`
or :class:`~cowstate.errors.SerializerMismatchError`; C2-C5:
:class:`~cowstate.errors.SerializerMismatchError`; C6:
:class:`~cowstate.errors.IncompatibleSnapshotError`); the restore then
changes nothing. ``what`` in a message names what was read: ``"snapshot"``
(a handle) or ``"file"`` (a snapshot file's metadata).

Not here: each key group in one handle or file only (key-group ownership:
``AbstractKeyedStateBackend._handles_to_read``, ``read_snapshot``), each
file holding what its handle says (``_check_file_of``), and a state
registered between a restore's prepare and its commit
(``_check_registered_since``).
"""

from __future__ import annotations

from collections.abc import Sequence

from cowstate.errors import (
    IncompatibleSnapshotError,
    MaxParallelismMismatchError,
    SerializerMismatchError,
)
from cowstate.state_meta import SnapshotFormat, StateKind

__all__ = [
    "check_canonical_file_format",
    "check_handle_format",
    "check_heap_file_format",
    "check_key_serializer",
    "check_kind",
    "check_max_parallelism",
    "check_namespace_serializer",
    "check_one_format",
    "check_same_key_serializer",
    "check_same_max_parallelism",
    "check_serializer",
]


def check_max_parallelism(expected: int, got: int, *, of_job: bool = False) -> None:
    """C1: a snapshot of max parallelism ``got`` restored where ``expected`` is
    (``of_job``: the coordinator's words for a job's ``_metadata``)."""
    if got != expected:
        raise MaxParallelismMismatchError(
            f"expected a snapshot of max parallelism {expected}, got one of {got}: the number "
            f"of key groups cannot change{'' if of_job else ' on restore'}"
        )


def check_key_serializer(expected: str, got: str, what: str) -> None:
    """C2: a handle or file (``what``) written with key serializer ``got``,
    restored by a backend whose key serializer is ``expected``."""
    if got != expected:
        raise SerializerMismatchError(
            f"expected the key serializer {expected!r}, the {what} was written with {got!r}"
        )


def check_namespace_serializer(name: str, expected: str, got: str, what: str) -> None:
    """C3: state ``name`` of a handle or file (``what``) written with namespace
    serializer ``got``, restored by a backend whose namespace serializer is
    ``expected``."""
    if got != expected:
        raise SerializerMismatchError(
            f"expected state {name!r} with the backend's namespace serializer "
            f"{expected!r}, the {what} uses {got!r}"
        )


def check_kind(name: str, expected: StateKind, got: StateKind, what: str) -> None:
    """C4: state ``name``, known as a state of kind ``expected``, held as kind
    ``got`` by a handle or file (``what``)."""
    if got != expected:
        raise SerializerMismatchError(
            f"expected state {name!r} of kind {expected!r}, the {what} holds kind {got!r}"
        )


def check_serializer(role: str, expected: str, got: str, what: str) -> None:
    """C5: the serializer ``role`` names (``"the key serializer"``, ``"the state
    serializer of 'x'"``, ...), of identifier ``expected``, decoding what a
    handle or file (``what``) says was written with ``got``."""
    if got != expected:
        raise SerializerMismatchError(
            f"expected {role} to be {expected!r}, the {what} was written with {got!r}"
        )


def check_handle_format(
    snapshot_format: SnapshotFormat,
    backend: str,
    *,
    backend_name: str,
    native_format: SnapshotFormat,
) -> None:
    """C6: a handle in ``snapshot_format`` written by the ``backend`` backend,
    restored by the ``backend_name`` backend, whose own format is
    ``native_format`` (canonical handles restore everywhere)."""
    if snapshot_format is SnapshotFormat.CANONICAL:
        return
    if snapshot_format != native_format or backend != backend_name:
        raise IncompatibleSnapshotError(
            f"expected a {backend_name} snapshot or a canonical savepoint, got a "
            f"{snapshot_format} snapshot of the {backend} backend: the "
            f"{backend_name} backend cannot read the {backend} backend's "
            "own format; take a canonical savepoint of it to change backends"
        )


def check_one_format(formats: Sequence[SnapshotFormat]) -> None:
    """C6: the handles of one restore are of one format (``formats``: the
    distinct formats, sorted)."""
    if len(formats) > 1:
        raise IncompatibleSnapshotError(
            f"expected the handles of one snapshot (one format), got formats {list(formats)}"
        )


def check_heap_file_format(snapshot_format: SnapshotFormat) -> None:
    """C6: a snapshot file the heap backend restores is heap or canonical."""
    if snapshot_format not in _HEAP_RESTORES:
        raise IncompatibleSnapshotError(
            f"expected a heap or canonical snapshot, got format {snapshot_format!r}: "
            "a native snapshot of another backend; restore from a canonical savepoint"
        )


def check_canonical_file_format(snapshot_format: SnapshotFormat, path: str) -> None:
    """C6: a file of a canonical savepoint (at ``path``) is canonical."""
    if snapshot_format != SnapshotFormat.CANONICAL:
        raise IncompatibleSnapshotError(
            f"expected a canonical snapshot file, got format {snapshot_format!r} "
            f"in {path!r}: restore a canonical savepoint"
        )


def check_same_max_parallelism(expected: int, got: int) -> None:
    """C7: a file of max parallelism ``got`` read into a restore whose files so
    far have ``expected``."""
    if got != expected:
        raise MaxParallelismMismatchError(
            f"expected every file to have max parallelism {expected}, got {got}"
        )


def check_same_key_serializer(expected: str, got: str) -> None:
    """C7: a file written with key serializer ``got`` read into a restore whose
    files so far used ``expected`` (``""``: no file yet)."""
    if expected and got != expected:
        raise SerializerMismatchError(
            f"expected every file to use key serializer {expected!r}, got {got!r}"
        )


# The snapshot formats a heap restore reads (C6).
_HEAP_RESTORES = frozenset({SnapshotFormat.HEAP, SnapshotFormat.CANONICAL})
