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

__all__ = [
    "ConcurrentModificationError",
    "CowStateError",
    "ForeignSnapshotError",
    "InvalidArgumentError",
    "MaximumCapacityError",
    "NoneStateError",
    "SnapshotReleasedError",
    "TransformFunctionError",
    "UnhashableKeyError",
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


class UnhashableKeyError(CowStateError, TypeError):
    """A key or namespace cannot be hashed, so it cannot address a mapping."""

    @classmethod
    def of(cls, key: object, namespace: object) -> UnhashableKeyError:
        for role, value in (("key", key), ("namespace", namespace)):
            try:
                hash(value)
            except TypeError:
                return cls(
                    f"expected a hashable {role}, got {type(value).__name__} {value!r}"
                )
        return cls(f"expected a hashable key and namespace, got {key!r} and {namespace!r}")


class TransformFunctionError(CowStateError):
    """The function given to ``transform`` raised; the mapping was not changed."""


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
