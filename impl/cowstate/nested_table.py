"""The nested-dict state table: synchronous snapshots that deep-copy
(Flink's ``NestedMapsStateTable``).

:class:`NestedMapsStateTable` has the routing, fail-fast iteration and
snapshot life cycle of every heap table (:class:`~cowstate.state_table.StateTable`)
over one :class:`NestedStateMap` per key group: plain dicts
``namespace -> key -> state``, no versions, no copy-on-write. Its
``snapshot()`` deep-copies every state at once (through the state
serializer), so callers may mutate states in place at any time: the
synchronous alternative to :class:`~cowstate.state_table.CopyOnWriteStateTable`,
slow to snapshot, simple to trust.

User code (rule U of :mod:`cowstate.state_map`) gets the maps' errors: a key's
or namespace's ``__hash__`` raising is an UnhashableKeyError (TypeError) or a
KeyHashError, its ``__eq__`` raising (the dicts compare colliding keys) a
KeyComparisonError, a state copy raising in ``snapshot()`` a StateCopyError
or StateTooDeepError with no snapshot taken; each leaves the dicts as they
were (no empty namespace dict is left behind).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Generic

from cowstate.errors import (
    ConcurrentModificationError,
    InvalidArgumentError,
    KeyComparisonError,
    KeyHashError,
    NoneStateError,
    StateCopyError,
    UnhashableKeyError,
)
from cowstate.map_contract import StateEntry, apply_transform, keys_in
from cowstate.serializers import DefaultSerializer, StateSerializer, is_state_serializer
from cowstate.state_table import StateTable, StateTableSnapshot
from cowstate.type_vars import K, N, S, V

__all__ = ["NestedMapsStateTable", "NestedMapsStateTableSnapshot", "NestedStateMap"]


class NestedMapsStateTable(StateTable[K, N, S]):
    """A table of nested dicts whose snapshot deep-copies: synchronous snapshots."""

    _maps: Sequence[NestedStateMap[K, N, S]]

    def _create_map(self) -> NestedStateMap[K, N, S]:
        return NestedStateMap(self._meta.state_serializer)

    def snapshot(self) -> NestedMapsStateTableSnapshot[K, N, S]:
        """Deep-copy every state now; the snapshot owns its copies."""
        return NestedMapsStateTableSnapshot(self, [m.copy_entries() for m in self._maps])


class NestedMapsStateTableSnapshot(StateTableSnapshot[K, N, S]):
    """Deep copies of every key group's mappings, made at the synchronous moment."""

    def __init__(
        self, owner: NestedMapsStateTable[K, N, S], copies: list[list[StateEntry[K, N, S]]]
    ) -> None:
        super().__init__(owner, len(copies))
        self._copies: list[list[StateEntry[K, N, S]] | None] = list(copies)

    def _entries(self, index: int) -> Iterator[StateEntry[K, N, S]]:
        entries = self._copies[index]
        assert entries is not None
        return iter(entries)

    def _items(self, index: int) -> Sequence[tuple[K, N, S]]:
        entries = self._copies[index]
        assert entries is not None
        return entries  # StateEntry is a tuple

    def _size(self, index: int) -> int:
        entries = self._copies[index]
        assert entries is not None
        return len(entries)

    def _release(self, index: int) -> None:
        self._copies[index] = None


class NestedStateMap(Generic[K, N, S]):
    """``namespace -> key -> state`` dicts with the state-map API, no versions.

    ``get`` returns the stored object; a snapshot of the table deep-copies
    (:meth:`copy_entries`), so callers may mutate states in place at any time.
    """

    __slots__ = ("_mod_count", "_namespaces", "_serializer", "_size")

    def __init__(self, serializer: StateSerializer | None = None) -> None:
        self._serializer: StateSerializer = (
            serializer if serializer is not None else DefaultSerializer()
        )
        self._namespaces: dict[N, dict[K, S]] = {}
        self._size = 0
        self._mod_count = 0

    @property
    def serializer(self) -> StateSerializer:
        return self._serializer

    @serializer.setter
    def serializer(self, serializer: StateSerializer) -> None:
        if not is_state_serializer(serializer):
            raise InvalidArgumentError(
                "expected a serializer with copy/serialize/deserialize, got "
                f"{type(serializer).__name__}"
            )
        self._serializer = serializer

    def get(self, key: K, namespace: N) -> S | None:
        _check_hashable(key, namespace)
        try:
            inner = self._namespaces.get(namespace)
            return None if inner is None else inner.get(key)
        except Exception as exc:  # rule U: a dict compared with __eq__
            raise KeyComparisonError.of(key, namespace, exc) from exc

    def contains_key(self, key: K, namespace: N) -> bool:
        _check_hashable(key, namespace)
        try:
            inner = self._namespaces.get(namespace)
            return inner is not None and key in inner
        except Exception as exc:  # rule U
            raise KeyComparisonError.of(key, namespace, exc) from exc

    def __len__(self) -> int:
        return self._size

    def size_of_namespace(self, namespace: N) -> int:
        try:
            inner = self._namespaces.get(namespace)
        except Exception as exc:  # rule U: hash or __eq__ of a namespace
            raise KeyComparisonError.of(None, namespace, exc) from exc
        return 0 if inner is None else len(inner)

    def keys(self, namespace: N) -> Iterator[K]:
        return keys_in(iter(self), namespace)

    def __iter__(self) -> Iterator[StateEntry[K, N, S]]:
        return self._iterate(self._mod_count)

    def _iterate(self, expected: int) -> Iterator[StateEntry[K, N, S]]:
        if self._mod_count != expected:
            raise ConcurrentModificationError(
                "expected no mapping added or removed while iterating the map"
            )
        for namespace, inner in self._namespaces.items():
            for key, state in inner.items():
                yield StateEntry(key, namespace, state)
                if self._mod_count != expected:
                    raise ConcurrentModificationError(
                        "expected no mapping added or removed while iterating the map"
                    )

    def put(self, key: K, namespace: N, state: S) -> bool:
        return self.put_and_get_old(key, namespace, state) is None

    def put_and_get_old(self, key: K, namespace: N, state: S) -> S | None:
        if state is None:
            raise NoneStateError(
                f"expected a state for put({key!r}, {namespace!r}), got None; None means "
                "absent, use remove() to unmap"
            )
        _check_hashable(key, namespace)
        created = False
        try:  # rule U: every lookup before the first write
            inner = self._namespaces.get(namespace)
            old = None if inner is None else inner.get(key)
            if inner is None:
                inner = self._namespaces[namespace] = {}
                created = True
            inner[key] = state  # a dict that raises while comparing stores nothing
        except Exception as exc:
            if created:
                del self._namespaces[namespace]
            raise KeyComparisonError.of(key, namespace, exc) from exc
        if old is None:
            self._size += 1
            self._mod_count += 1
        return old

    def remove(self, key: K, namespace: N) -> None:
        self.remove_and_get_old(key, namespace)

    def remove_and_get_old(self, key: K, namespace: N) -> S | None:
        _check_hashable(key, namespace)
        try:  # rule U
            inner = self._namespaces.get(namespace)
            if inner is None or key not in inner:
                return None
            old = inner.pop(key)  # a dict that raises while comparing removes nothing
        except Exception as exc:
            raise KeyComparisonError.of(key, namespace, exc) from exc
        if not inner:
            try:
                del self._namespaces[namespace]
            except Exception as exc:  # rule U: put it back (an empty dict compares nothing)
                inner[key] = old
                raise KeyComparisonError.of(key, namespace, exc) from exc
        self._size -= 1
        self._mod_count += 1
        return old

    def transform(self, key: K, namespace: N, value: V, fn: Callable[[S | None, V], S]) -> None:
        old = self.get(key, namespace)
        self.put(key, namespace, apply_transform(fn, old, value, key, namespace))

    def copy_entries(self) -> list[StateEntry[K, N, S]]:
        """Every mapping with a deep copy of its state (the synchronous snapshot);
        a copy that raises is a StateCopyError (StateTooDeepError for a
        RecursionError), with nothing copied kept."""
        copy = self._serializer.copy
        out: list[StateEntry[K, N, S]] = []
        for namespace, inner in self._namespaces.items():
            for key, state in inner.items():
                try:
                    out.append(StateEntry(key, namespace, copy(state)))
                except Exception as exc:  # rule U
                    raise StateCopyError.of(key, namespace, exc) from exc
        return out

    def __repr__(self) -> str:
        return f"<NestedStateMap size={self._size}>"


def _check_hashable(key: object, namespace: object) -> None:
    try:
        hash(key)
        hash(namespace)
    except TypeError as exc:  # rule U: chained
        raise UnhashableKeyError.of(key, namespace) from exc
    except Exception as exc:  # rule U
        raise KeyHashError.raised_by_pair(key, namespace, exc) from exc
