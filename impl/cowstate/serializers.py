"""State serializers: how a state is copied and turned into bytes.

The copy-on-write map never mutates a state object a snapshot can still reach;
when it must hand such a state to a caller who may mutate it, it asks the
state's serializer for a *deep* copy (rule S in :mod:`cowstate.state_map`).
``serialize``/``deserialize`` are used when snapshots are written to files.

- :class:`DefaultSerializer` returns known-immutable states as they are and
  deep-copies everything else; it pickles for bytes.
- :class:`ImmutableSerializer` never copies: for users who promise their states
  are never mutated in place (the promise is theirs to keep).
"""

from __future__ import annotations

import copy as _copy
import pickle
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "DefaultSerializer",
    "ImmutableSerializer",
    "StateSerializer",
    "is_known_immutable",
]


@runtime_checkable
class StateSerializer(Protocol):
    """What the map needs from a state's type."""

    def copy(self, state: Any) -> Any:
        """Return a state equal to ``state`` that shares nothing mutable with it."""
        ...

    def serialize(self, state: Any) -> bytes:
        """Return the bytes of ``state``."""
        ...

    def deserialize(self, data: bytes) -> Any:
        """Return the state whose bytes are ``data``."""
        ...


_IMMUTABLE_SCALARS: frozenset[type] = frozenset(
    {int, float, complex, str, bytes, bool, type(None), range}
)


def is_known_immutable(state: object) -> bool:
    """True if ``state`` cannot be mutated in place: immutable scalars, and
    tuples/frozensets made only of known-immutable items."""
    kind = type(state)
    if kind in _IMMUTABLE_SCALARS:
        return True
    if kind is tuple or kind is frozenset:
        return all(is_known_immutable(item) for item in state)  # type: ignore[attr-defined]
    return False


class DefaultSerializer:
    """Deep-copies mutable states, returns immutable ones unchanged; pickles."""

    __slots__ = ()

    def copy(self, state: Any) -> Any:
        if type(state) in _IMMUTABLE_SCALARS or is_known_immutable(state):
            return state
        return _copy.deepcopy(state)

    def serialize(self, state: Any) -> bytes:
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    def deserialize(self, data: bytes) -> Any:
        return pickle.loads(data)

    def __repr__(self) -> str:
        return "DefaultSerializer()"


class ImmutableSerializer(DefaultSerializer):
    """Never copies: the caller promises states are never mutated in place."""

    __slots__ = ()

    def copy(self, state: Any) -> Any:
        return state

    def __repr__(self) -> str:
        return "ImmutableSerializer()"
