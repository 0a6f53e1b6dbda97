"""``ReferenceStateMap``: a dict, and snapshots that are deep copies of it.

Same public API as ``cowstate.CopyOnWriteStateMap``. The model raises plain
built-in exceptions; the specification only checks that the model and the
implementation agree on *whether* an operation fails and that a failed
operation changes nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple


class StateEntry(NamedTuple):
    key: Any
    namespace: Any
    state: Any


class ReferenceSnapshot:
    """An immutable deep copy of the map's dict, tagged with its version."""

    def __init__(
        self, owner: ReferenceStateMap, version: int, contents: dict[tuple[Any, Any], Any]
    ) -> None:
        self.owner = owner
        self.version = version
        self._contents: Mapping[tuple[Any, Any], Any] | None = MappingProxyType(contents)

    @property
    def is_released(self) -> bool:
        return self._contents is None

    @property
    def contents(self) -> Mapping[tuple[Any, Any], Any]:
        if self._contents is None:
            raise RuntimeError(f"snapshot {self.version} was released")
        return self._contents

    def __len__(self) -> int:
        return len(self.contents)

    def __iter__(self) -> Iterator[StateEntry]:
        return (StateEntry(k, n, s) for (k, n), s in self.contents.items())

    def release(self) -> None:
        if self._contents is None:
            raise RuntimeError(f"snapshot {self.version} was already released")
        self._contents = None

    def __enter__(self) -> ReferenceSnapshot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.is_released:
            self.release()


class ReferenceStateMap:
    """The meaning of a state map: a plain dict."""

    #: What the model raises when it refuses a call (the built-ins below).
    Error = (ValueError, TypeError, RuntimeError)

    def __init__(self, serializer: object = None, initial_capacity: int = 128) -> None:
        self._data: dict[tuple[Any, Any], Any] = {}
        self._version = 0

    def get(self, key: Hashable, namespace: Hashable) -> Any:
        return self._data.get((key, namespace))

    def contains_key(self, key: Hashable, namespace: Hashable) -> bool:
        return (key, namespace) in self._data

    def __len__(self) -> int:
        return len(self._data)

    def size_of_namespace(self, namespace: Hashable) -> int:
        return sum(1 for (_, n) in self._data if n == namespace)

    def keys(self, namespace: Hashable) -> Iterator[Any]:
        return iter([k for (k, n) in self._data if n == namespace])

    def __iter__(self) -> Iterator[StateEntry]:
        return iter([StateEntry(k, n, s) for (k, n), s in self._data.items()])

    def put(self, key: Hashable, namespace: Hashable, state: Any) -> bool:
        """True if the mapping is new."""
        if state is None:
            raise ValueError("None is not a state")
        inserted = (key, namespace) not in self._data
        self._data[(key, namespace)] = state
        return inserted

    def put_and_get_old(self, key: Hashable, namespace: Hashable, state: Any) -> Any:
        old = self.get(key, namespace)
        self.put(key, namespace, state)
        return old

    def remove(self, key: Hashable, namespace: Hashable) -> None:
        self._data.pop((key, namespace), None)

    def remove_and_get_old(self, key: Hashable, namespace: Hashable) -> Any:
        return self._data.pop((key, namespace), None)

    def transform(
        self, key: Hashable, namespace: Hashable, value: Any, fn: Callable[[Any, Any], Any]
    ) -> None:
        new = fn(self.get(key, namespace), value)
        self.put(key, namespace, new)

    def snapshot(self) -> ReferenceSnapshot:
        # Keys are immutable (hashable) by contract; every state is deep-copied.
        self._version += 1
        return ReferenceSnapshot(
            self, self._version, {k: deep_copy(s) for k, s in self._data.items()}
        )

    def release(self, snapshot: ReferenceSnapshot) -> None:
        if snapshot.owner is not self:
            raise ValueError("snapshot of another map")
        snapshot.release()


_ATOMS = frozenset({int, float, str, bytes, bool, type(None)})


def deep_copy(state: Any) -> Any:
    """``copy.deepcopy(state)``, with shortcuts for atoms and for flat lists and
    dicts of atoms (which it would copy the same way, only slower)."""
    kind = type(state)
    if kind in _ATOMS:
        return state
    if kind is list and _ATOMS.issuperset(map(type, state)):
        return list(state)
    if (
        kind is dict
        and _ATOMS.issuperset(map(type, state))
        and _ATOMS.issuperset(map(type, state.values()))
    ):
        return dict(state)
    return copy.deepcopy(state)
