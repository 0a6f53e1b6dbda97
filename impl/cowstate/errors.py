"""The exceptions cowstate raises.

Every error the library raises on purpose is a :class:`CowStateError`. Each
class also derives from the built-in exception a Python programmer would
expect (``TypeError`` for an unhashable key, ``ValueError`` for a ``None``
state, ``RuntimeError`` for a concurrent modification), so ``except TypeError``
keeps working. Every message says what was expected and what came instead.

An operation that raises one of these errors has not changed the map: the
check happens before the first write.

User code
---------
A map runs code of its caller's: a key's or namespace's ``__hash__`` and
``__eq__``, the state serializer's ``copy`` (a state's ``__deepcopy__``) and
a transform function. Whatever that code raises (any ``Exception``; a
``KeyboardInterrupt`` or ``SystemExit`` passes as it is) comes out as one of
:class:`UnhashableKeyError` (``__hash__`` raised ``TypeError``),
:class:`KeyHashError` (it raised anything else), :class:`KeyComparisonError`,
:class:`StateCopyError`, :class:`StateTooDeepError` (the copy ran out of
recursion depth) or :class:`TransformFunctionError`, with the original
exception chained as ``__cause__``, and the map unchanged: the same mappings
(``(key, namespace) -> `` the same state objects) and its invariants. What
"unchanged" does not promise: a rehash step the operation took, and private
copies of entries it made (copy-on-write rule E) are internal and stay.
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
    "KeyComparisonError",
    "KeyGroupMismatchError",
    "KeyGroupOutOfRangeError",
    "KeyHashError",
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
    "StateCopyError",
    "StateRegistrationError",
    "StateTooDeepError",
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
        """Raise this error unless ``value`` (a ``role``: key, namespace) hashes;
        :class:`KeyHashError` if its ``__hash__`` raises anything but ``TypeError``."""
        try:
            hash(value)
        except TypeError as exc:  # chained: the user's TypeError, or CPython's "unhashable type"
            raise cls(f"expected a hashable {role}, got {type(value).__name__} {value!r}") from exc
        except Exception as exc:
            raise KeyHashError.raised_by(value, role, exc) from exc


class TransformFunctionError(CowStateError):
    """The function given to ``transform`` raised; the mapping was not changed:
    it maps the same state object as before. The function's argument is not
    restored: an in-place change the function made to it before raising stays
    in that object, which is the mapped state itself unless an open snapshot
    held it (then it was a private copy, dropped). See the transform contract
    in :mod:`cowstate.state_map`."""

    @classmethod
    def of(
        cls, fn: object, exc: BaseException, key: object, namespace: object
    ) -> TransformFunctionError:
        """``fn`` raised ``exc`` while transforming ``(key, namespace)``."""
        return cls(
            f"expected transform function {getattr(fn, '__name__', fn)!r} to return a "
            f"state, got {type(exc).__name__}: {exc}; ({_describe(key)}, "
            f"{_describe(namespace)}) still maps the same state object (an in-place "
            "change the function made to its argument is not undone)"
        )


class KeyHashError(UnhashableKeyError):
    """A key's or namespace's ``__hash__`` raised something other than
    ``TypeError`` (which is :class:`UnhashableKeyError`, this class's base):
    the key cannot address a mapping. The cause is chained; nothing changed."""

    @classmethod
    def raised_by(cls, value: object, role: str, exc: BaseException) -> KeyHashError:
        """``hash(value)``, a ``role`` (key, namespace), raised ``exc``."""
        return cls(
            f"expected hash() of the {role} {_describe(value)} to return an int, got "
            f"{type(exc).__name__}: {exc}; the map is unchanged"
        )

    @classmethod
    def raised_by_pair(cls, key: object, namespace: object, exc: BaseException) -> KeyHashError:
        """``hash(key)`` or ``hash(namespace)`` raised ``exc``: names the one that
        did when the other hashes (without calling the failing one again)."""
        try:
            hash(key)
        except Exception:
            return cls.raised_by(key, "key", exc)
        return cls.raised_by(namespace, "namespace", exc)


class KeyComparisonError(CowStateError, TypeError):
    """Comparing a key or namespace with a mapped one (``__eq__``) raised, so
    the mapping cannot be found or ruled out. The cause is chained; nothing
    changed."""

    @classmethod
    def of(cls, key: object, namespace: object, exc: BaseException) -> KeyComparisonError:
        """Looking ``(key, namespace)`` up raised ``exc`` in an ``__eq__``."""
        return cls(
            f"expected comparing ({_describe(key)}, {_describe(namespace)}) with the "
            f"mapped keys (__eq__) to return a bool, got {type(exc).__name__}: {exc}; "
            "the map is unchanged"
        )


class StateCopyError(CowStateError, TypeError):
    """The state serializer's ``copy`` (for the default serializer: the state's
    ``__deepcopy__``) raised while the map copied a state a snapshot holds
    (rule S), or while a synchronous snapshot copied every state. The cause is
    chained; nothing changed and no snapshot was taken."""

    @classmethod
    def of(cls, key: object, namespace: object, exc: BaseException) -> StateCopyError:
        """Copying the state of ``(key, namespace)`` raised ``exc``."""
        if isinstance(exc, RecursionError):
            return StateTooDeepError.of(key, namespace, exc)
        return cls(
            f"expected the state serializer to copy the state of ({_describe(key)}, "
            f"{_describe(namespace)}), got {type(exc).__name__}: {exc}; the map is unchanged"
        )


class StateTooDeepError(StateCopyError, RecursionError):
    """Copying a state ran out of Python's recursion depth (a state nested
    deeper than about ``sys.getrecursionlimit() / 2`` levels, for the default
    serializer's deep copy). Such a state may be stored, read while no
    snapshot holds it and removed; copying it (rule S, a synchronous
    snapshot) raises this. The ``RecursionError`` is chained; nothing changed."""

    @classmethod
    def of(cls, key: object, namespace: object, exc: BaseException) -> StateTooDeepError:
        return cls(
            f"expected a state the serializer can copy within Python's recursion limit "
            f"for ({_describe(key)}, {_describe(namespace)}), got one nested too deep "
            f"({type(exc).__name__}: {exc}); the map is unchanged"
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


# ------------------------------------------------------------------ helpers


def _describe(value: object) -> str:
    """``repr(value)`` for a message, shortened; a repr that raises (a hostile
    or too deep object) does not hide the error being reported."""
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__name__} object>"
    return text if len(text) <= 200 else text[:197] + "..."
