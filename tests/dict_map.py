"""Someone else's map, for the plug-in API's tests: a dict with deep-copied
snapshots that refuses bad input with built-in exceptions (ValueError for a
``None`` state, TypeError for an unhashable key) and whose iterators fail
fast with the dict's own RuntimeError. ``DictMap.cowstate_capabilities``
says so (``cowstate check --implementation dict_map:DictMap`` reads it).

Its relatives differ in one thing each: ``ShallowSnapshotMap`` shares the
states with its snapshots (a bug), ``NoSnapshotMap`` has no snapshots,
``SilentPutMap`` returns nothing from ``put``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from cowstate_spec.conformance import Capabilities

#: What DictMap offers: everything, with its own refusals and fail-fast error.
CAPABILITIES = Capabilities(refusals=(ValueError, TypeError), concurrent_modification=RuntimeError)


class DictSnapshot:
    def __init__(self, data: dict[tuple[Any, Any], Any], version: int) -> None:
        self.data = data
        self.version = version

    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]:
        return ((k, n, s) for (k, n), s in self.data.items())

    def __len__(self) -> int:
        return len(self.data)

    def release(self) -> None:
        self.data = {}


class DictMap:
    cowstate_capabilities = CAPABILITIES

    def __init__(self) -> None:
        self.data: dict[tuple[Any, Any], Any] = {}
        self.version = 0

    def put(self, key: Any, namespace: Any, state: Any) -> bool | None:
        if state is None:
            raise ValueError("None is not a state")
        new = (key, namespace) not in self.data
        self.data[(key, namespace)] = state
        return new

    def get(self, key: Any, namespace: Any) -> Any:
        return self.data.get((key, namespace))

    def contains_key(self, key: Any, namespace: Any) -> bool:
        return (key, namespace) in self.data

    def put_and_get_old(self, key: Any, namespace: Any, state: Any) -> Any:
        old = self.data.get((key, namespace))
        self.put(key, namespace, state)
        return old

    def remove(self, key: Any, namespace: Any) -> None:
        self.data.pop((key, namespace), None)

    def remove_and_get_old(self, key: Any, namespace: Any) -> Any:
        return self.data.pop((key, namespace), None)

    def transform(
        self, key: Any, namespace: Any, value: Any, fn: Callable[[Any, Any], Any]
    ) -> None:
        self.put(key, namespace, fn(self.data.get((key, namespace)), value))

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]:
        return ((k, n, s) for (k, n), s in self.data.items())

    def keys(self, namespace: Any) -> Iterator[Any]:
        return (k for (k, n) in self.data if n == namespace)

    def size_of_namespace(self, namespace: Any) -> int:
        return sum(1 for (_, n) in self.data if n == namespace)

    def snapshot(self) -> DictSnapshot:
        self.version += 1
        return DictSnapshot(copy.deepcopy(self.data), self.version)


class ShallowSnapshotMap(DictMap):
    """The bug: a snapshot shares the states, so a caller's mutation reaches it."""

    def snapshot(self) -> DictSnapshot:
        self.version += 1
        return DictSnapshot(dict(self.data), self.version)


class NoSnapshotMap(DictMap):
    """A map without snapshots."""

    snapshot = None  # type: ignore[assignment]


class SilentPutMap(DictMap):
    """``put`` says nothing about inserting."""

    def put(self, key: Any, namespace: Any, state: Any) -> None:
        super().put(key, namespace, state)
