"""The seams between the layers, as structural types (``typing.Protocol``)::

    backend --(one KeyedTable per state)--> table --(one StateMap per key group)--> map

- :class:`StateMap`: what a table needs of one key group's map -- the keyed
  operations, iteration, sizes and the state serializer. Every map satisfies
  it: :class:`~cowstate.state_map.CopyOnWriteStateMap`, the C map of the same
  API, :class:`~cowstate.nested_table.NestedStateMap`.
- :class:`SnapshottingStateMap`: a :class:`StateMap` whose ``snapshot()``
  returns a :class:`MapSnapshot` (what
  :class:`~cowstate.state_table.CopyOnWriteStateTable` is built from).
- :class:`KeyedTable`: what a backend and the keyed state handles need of the
  table of one state -- the keyed operations with an optional known
  ``key_group``, iteration, sizes, meta info. Every table satisfies it: the
  copy-on-write and nested heap tables, and
  :class:`~cowstate.rocksdb.table.RocksDBStateTable`.

mypy checks each implementation against these where the layers meet
(``StateTable.state_map``, ``StateHolder.table``, ``_new_table``), and, at
the bottom of this module, each one generically: a map or table of
``K, N, S`` is a :class:`StateMap` or :class:`KeyedTable` of the very same
``K, N, S`` (with ``Any`` arguments a wrong signature could still pass).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from cowstate.key_groups import KeyGroupRange
from cowstate.map_contract import StateEntry
from cowstate.serializers import StateSerializer
from cowstate.state_meta import StateMetaInfo
from cowstate.type_vars import K, N, S, V

__all__ = ["KeyedTable", "MapSnapshot", "SnapshottingStateMap", "StateMap", "TrackingMapSnapshot"]


@runtime_checkable
class StateMap(Protocol[K, N, S]):
    """One key group's mappings ``(key, namespace) -> state`` (the map API)."""

    @property
    def serializer(self) -> StateSerializer: ...

    @serializer.setter
    def serializer(self, serializer: StateSerializer) -> None: ...

    def get(self, key: K, namespace: N) -> S | None: ...

    def contains_key(self, key: K, namespace: N) -> bool: ...

    def put(self, key: K, namespace: N, state: S) -> bool:
        """Map (key, namespace) to state; True if the mapping is new."""
        ...

    def put_and_get_old(self, key: K, namespace: N, state: S) -> S | None: ...

    def remove(self, key: K, namespace: N) -> None: ...

    def remove_and_get_old(self, key: K, namespace: N) -> S | None: ...

    def transform(self, key: K, namespace: N, value: V, fn: Callable[[S | None, V], S]) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[StateEntry[K, N, S]]: ...

    def keys(self, namespace: N) -> Iterator[K]: ...

    def size_of_namespace(self, namespace: N) -> int: ...


@runtime_checkable
class MapSnapshot(Protocol[K, N, S]):
    """The mappings of one map at its snapshot's moment, until released."""

    @property
    def is_released(self) -> bool: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[StateEntry[K, N, S]]: ...

    @property
    def version(self) -> int: ...

    def items(self) -> list[tuple[K, N, S]]: ...

    def release(self) -> None: ...


@runtime_checkable
class TrackingMapSnapshot(MapSnapshot[K, N, S], Protocol[K, N, S]):
    """The snapshot of a map that tracks changes (the pure map: rule T of
    :mod:`cowstate.state_map`)."""

    def changed_items(self, since: int) -> list[tuple[K, N, S]]: ...


@runtime_checkable
class SnapshottingStateMap(StateMap[K, N, S], Protocol[K, N, S]):
    """A map with asynchronous snapshots (the copy-on-write maps)."""

    def snapshot(self) -> MapSnapshot[K, N, S]: ...


@runtime_checkable
class KeyedTable(Protocol[K, N, S]):
    """The mappings of one state over the key groups of a range (the table API)."""

    @property
    def key_group_range(self) -> KeyGroupRange: ...

    @property
    def max_parallelism(self) -> int: ...

    @property
    def meta(self) -> StateMetaInfo: ...

    @property
    def key_serializer(self) -> StateSerializer: ...

    @property
    def serializer(self) -> StateSerializer: ...

    @serializer.setter
    def serializer(self, serializer: StateSerializer) -> None: ...

    def set_meta_info(self, meta: StateMetaInfo) -> None: ...

    def key_group_of(self, key: K) -> int: ...

    def get(self, key: K, namespace: N, *, key_group: int | None = None) -> S | None: ...

    def contains_key(self, key: K, namespace: N, *, key_group: int | None = None) -> bool: ...

    def put(self, key: K, namespace: N, state: S, *, key_group: int | None = None) -> bool | None:
        """Map (key, namespace) to state. Heap tables return True if the mapping is
        new; the RocksDB table returns None (knowing would cost a read)."""
        ...

    def put_and_get_old(
        self, key: K, namespace: N, state: S, *, key_group: int | None = None
    ) -> S | None: ...

    def remove(self, key: K, namespace: N, *, key_group: int | None = None) -> None: ...

    def remove_and_get_old(
        self, key: K, namespace: N, *, key_group: int | None = None
    ) -> S | None: ...

    def transform(
        self,
        key: K,
        namespace: N,
        value: V,
        fn: Callable[[S | None, V], S],
        *,
        key_group: int | None = None,
    ) -> None: ...

    def __contains__(self, item: object) -> bool: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[StateEntry[K, N, S]]: ...

    def entries_in_key_group(self, key_group: int) -> Iterator[StateEntry[K, N, S]]: ...

    def keys(self, namespace: N) -> Iterator[K]: ...

    def size_of_namespace(self, namespace: N) -> int: ...


if TYPE_CHECKING:  # each implementation, proved by mypy; nothing runs
    from cowstate._cmap import CopyOnWriteStateMap as CMap
    from cowstate.nested_table import NestedStateMap
    from cowstate.rocksdb.table import RocksDBStateTable
    from cowstate.state_map import CopyOnWriteStateMap
    from cowstate.state_table import StateTable

    def _pure_map(m: CopyOnWriteStateMap[K, N, S]) -> SnapshottingStateMap[K, N, S]:
        return m

    def _c_map(m: CMap[K, N, S]) -> SnapshottingStateMap[K, N, S]:
        return m

    def _nested_map(m: NestedStateMap[K, N, S]) -> StateMap[K, N, S]:
        return m

    def _heap_table(table: StateTable[K, N, S]) -> KeyedTable[K, N, S]:
        return table

    def _rocksdb_table(table: RocksDBStateTable[K, N, S]) -> KeyedTable[K, N, S]:
        return table
