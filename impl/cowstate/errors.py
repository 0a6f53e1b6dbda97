"""The exceptions cowstate raises.

Every error the library raises on purpose is a :class:`CowStateError`. Each
class also derives from the built-in exception a Python programmer would
expect (``TypeError`` for an unhashable key, ``ValueError`` for a ``None``
state, ``RuntimeError`` for a concurrent modification), so ``except TypeError``
keeps working. Every message says what was expected and what came instead.

An operation that raises one of these errors has not changed the map: the
check happens before the first write.
"""

from __future__ import annotations

from concurrent.futures import CancelledError

__all__ = [
    "AmbiguousKeyError",
    "BackendClosedError",
    "BadMagicError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ChecksumMismatchError",
    "ConcurrentModificationError",
    "CorruptCheckpointError",
    "CorruptStorageError",
    "CowStateError",
    "DuplicateMappingError",
    "ForeignSnapshotError",
    "IncompatibleSnapshotError",
    "InconsistentMetadataError",
    "InvalidArgumentError",
    "KeyGroupMismatchError",
    "KeyGroupOutOfRangeError",
    "KeyTypeMismatchError",
    "MaxParallelismMismatchError",
    "MaximumCapacityError",
    "MetadataChecksumError",
    "MixedKeyTypesError",
    "NoCurrentKeyError",
    "NoneStateError",
    "SerializerMismatchError",
    "SnapshotCancelledError",
    "SnapshotEntryError",
    "SnapshotFormatError",
    "SnapshotReleasedError",
    "SnapshotWriteError",
    "StateRegistrationError",
    "StorageUnavailableError",
    "TransformFunctionError",
    "TruncatedSnapshotError",
    "UndecodableValueError",
    "UnhashableKeyError",
    "UnknownCheckpointError",
    "UnknownStateError",
    "UnsafePathError",
    "UnsupportedMetadataVersionError",
    "UnsupportedValueError",
    "UnsupportedVersionError",
    "UntrustedSerializerError",
    "VersionOverflowError",
]


class CowStateError(Exception):
    """Base class of every error raised by cowstate on purpose."""


class InvalidArgumentError(CowStateError, ValueError):
    """An argument has the wrong type or is out of range (a capacity, a serializer)."""


class NoneStateError(CowStateError, ValueError):
    """``None`` was given (or returned by a transform function) as a state.

    ``None`` means "absent" in cowstate, so it is never a valid state.
    """

    @classmethod
    def from_transform(cls, key: object, namespace: object) -> NoneStateError:
        """A transform function returned ``None`` for ``(key, namespace)``."""
        return cls(
            f"expected the transform function to return a state, got None for "
            f"({key!r}, {namespace!r}); the mapping is unchanged"
        )


class UnhashableKeyError(CowStateError, TypeError):
    """A key or namespace cannot be hashed, so it cannot address a mapping."""

    @classmethod
    def of(cls, key: object, namespace: object) -> UnhashableKeyError:
        for role, value in (("key", key), ("namespace", namespace)):
            try:
                hash(value)
            except TypeError:
                return cls(f"expected a hashable {role}, got {type(value).__name__} {value!r}")
        return cls(f"expected a hashable key and namespace, got {key!r} and {namespace!r}")

    @classmethod
    def check(cls, value: object, role: str = "key") -> None:
        """Raise this error unless ``value`` (a ``role``: key, namespace) hashes."""
        try:
            hash(value)
        except TypeError:
            raise cls(f"expected a hashable {role}, got {type(value).__name__} {value!r}") from None


class TransformFunctionError(CowStateError):
    """The function given to ``transform`` raised; the mapping was not changed."""

    @classmethod
    def of(
        cls, fn: object, exc: BaseException, key: object, namespace: object
    ) -> TransformFunctionError:
        """``fn`` raised ``exc`` while transforming ``(key, namespace)``."""
        return cls(
            f"expected transform function {getattr(fn, '__name__', fn)!r} to return a "
            f"state, got {type(exc).__name__}: {exc}; ({key!r}, {namespace!r}) is "
            "unchanged"
        )


class SnapshotReleasedError(CowStateError, RuntimeError):
    """A snapshot was read or released after it had been released."""


class ForeignSnapshotError(CowStateError, ValueError):
    """A snapshot was handed to a map that did not take it."""


class ConcurrentModificationError(CowStateError, RuntimeError):
    """The map changed structure while an iterator over it was in use."""


class VersionOverflowError(CowStateError, OverflowError):
    """The map's snapshot version counter passed the 32-bit limit Flink uses."""


class MaximumCapacityError(CowStateError, MemoryError):
    """The map is at its maximum capacity and holds more entries than it can address."""


# ------------------------------------------------------------------ key groups


class KeyGroupOutOfRangeError(CowStateError, ValueError):
    """A key group outside the range a table or backend holds.

    Unless low-level state access passes a wrong key group, this is most
    likely a key whose hash or equality is not deterministic.
    """


# --------------------------------------------------------------- snapshot files


class SnapshotFormatError(CowStateError, ValueError):
    """A snapshot file cannot be read; nothing was restored from it."""


class TruncatedSnapshotError(SnapshotFormatError):
    """The snapshot file ends before its structure says it should."""


class BadMagicError(SnapshotFormatError):
    """The stream does not start with the snapshot file's magic bytes (a missing
    end magic means a truncated file: :class:`TruncatedSnapshotError`)."""


class UnsupportedVersionError(SnapshotFormatError):
    """The snapshot file has a format version this reader does not know."""


class ChecksumMismatchError(SnapshotFormatError):
    """A block's CRC32 does not match its bytes: the file is corrupt."""


class KeyGroupMismatchError(SnapshotFormatError):
    """A key group in the file lies outside the file's own key-group range, a
    block holds another key group than its index entry says, or a key lies in
    the block of another key group than its own (recomputed on restore)."""


class SnapshotEntryError(SnapshotFormatError):
    """An entry of a snapshot is not a mapping a table can hold: a ``None`` key,
    namespace or state, or an unhashable key or namespace. The message names
    the state, the key group and what was wrong; nothing was restored."""


class DuplicateMappingError(SnapshotEntryError):
    """A snapshot gives one state the same ``(key, namespace)`` twice."""


class IncompatibleSnapshotError(SnapshotFormatError):
    """A snapshot in a format this backend cannot restore (another backend's
    native checkpoint or savepoint); restore a canonical savepoint instead."""


class MaxParallelismMismatchError(SnapshotFormatError):
    """The file was written with another max parallelism (number of key groups)."""


class SerializerMismatchError(SnapshotFormatError):
    """A snapshot's serializer identifiers (key, namespace or state serializer)
    differ from the restoring backend's or table's, or name no serializer
    cowstate knows; nothing was restored. (Re-registering a state with another
    serializer is a :class:`StateRegistrationError`.)"""


class UntrustedSerializerError(SerializerMismatchError):
    """A file names the pickle serializer for a state, key or namespace that was
    not registered with it: cowstate never unpickles a file unless the user
    chose :class:`~cowstate.serializers.PickleSerializer` for it (pickle runs
    code from the file)."""


class UndecodableValueError(SnapshotFormatError):
    """Bytes that the value codec (:mod:`cowstate.value_codec`) cannot have
    written: truncated, trailing bytes, an unknown tag, too deep, an unhashable
    dict key or set member, another version. Nothing was built from them."""


class UnsupportedValueError(InvalidArgumentError):
    """A value the default serializer cannot encode (a user class, a subclass of
    a built-in type, ...): give its state an explicit serializer."""


# ---------------------------------------------------------------- the backend


class StateRegistrationError(CowStateError, ValueError):
    """A state name was registered again with another kind or serializer."""


class UnknownStateError(CowStateError, KeyError):
    """A state name that no descriptor registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class NoCurrentKeyError(CowStateError, RuntimeError):
    """A keyed state was used before ``set_current_key``."""


class BackendClosedError(CowStateError, RuntimeError):
    """The backend was closed; it takes no more snapshots or restores."""


class SnapshotCancelledError(CowStateError, CancelledError):
    """An asynchronous snapshot was cancelled; its map snapshots were released."""


class SnapshotWriteError(CowStateError, OSError):
    """The asynchronous part of a snapshot failed; the cause is chained."""


class CorruptStorageError(CowStateError, OSError):
    """The storage under a backend (a RocksDB database, live or opened from a
    snapshot) reported corruption while it was read: the read stopped with this
    error instead of returning fewer entries. A restore reports it as a
    :class:`CorruptCheckpointError` with this error chained."""


# ------------------------------------------------ checkpoints and savepoints


class CheckpointError(CowStateError):
    """A checkpoint or savepoint could not be taken, completed or restored."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No completed checkpoint or savepoint (no ``_metadata``) where one was expected."""


class StorageUnavailableError(CheckpointError, OSError):
    """The file system a path names could not be reached (a refused connection,
    an unknown protocol's server): nothing was read or written there."""


class CorruptCheckpointError(CheckpointError, ValueError):
    """A checkpoint's ``_metadata`` is invalid, or a file it lists is missing, has
    another size or fails its CRC32."""


class UnknownCheckpointError(CheckpointError, KeyError):
    """A checkpoint id the coordinator has no pending checkpoint of."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MetadataChecksumError(CorruptCheckpointError):
    """A ``_metadata`` (or another sealed document of a job directory) does not
    match its own checksum, or has no checksum line: torn, truncated or edited."""


class UnsupportedMetadataVersionError(CorruptCheckpointError):
    """A ``_metadata`` of a format version this reader does not know."""


class InconsistentMetadataError(CorruptCheckpointError):
    """A ``_metadata`` that is well-formed but contradicts itself: overlapping or
    missing key-group ranges, a file listed twice, sizes or ids out of range."""


class UnsafePathError(CorruptCheckpointError):
    """A path in a ``_metadata`` (or a directory the job was asked to use) that
    would leave the snapshot's root: absolute, ``..``, another scheme, a link
    out of the root, or a directory the job does not own."""


class KeyTypeMismatchError(InvalidArgumentError):
    """A key of another type than the one the first key fixed for a backend or
    table (:mod:`cowstate.key_types`): ``1``, ``1.0`` and ``True`` are equal in
    Python but different keys in Flink, with different key groups and bytes.
    Nothing changed."""


class AmbiguousKeyError(InvalidArgumentError):
    """A key Python's equality cannot keep apart from another key the way Flink
    does: a float NaN (``nan != nan``: never found again) or ``-0.0`` (equal to
    ``0.0`` but another key group and other bytes), also inside a tuple
    (:mod:`cowstate.key_types`). Nothing changed."""


class MixedKeyTypesError(SnapshotEntryError):
    """A restore whose keys are not all of one key type (the backend's, when its
    first key fixed one), or holds a key :class:`AmbiguousKeyError` refuses.
    Nothing was restored."""
