"""State tables: one keyed state, split into one map per key group (Flink's ``StateTable``).

A table holds the mappings ``(key, namespace) -> state`` of one named state for
the key groups of its :class:`~cowstate.key_groups.KeyGroupRange`::

    table (range [2, 5] of max parallelism 8)
      key --assign_to_key_group--> kg --(kg - 2)--> maps[kg - 2] --(key, ns)--> state
      maps: [ map kg2 | map kg3 | map kg4 | map kg5 ]

Every keyed operation takes ``(key, namespace)`` and routes by the key's key
group, or by ``key_group=`` when the caller already knows it (a backend
computes the current key's group once; a restore trusts the file). Every key
must be of the table's key types (K1 in a backend, K4 on its own, of
:mod:`cowstate.key_types`): equal keys of other types are refused, never
mapped together. A key group outside the range raises
:class:`~cowstate.errors.KeyGroupOutOfRangeError` (never a wrapped list
index). A backend's handles route by themselves
(:meth:`StateTable.direct_route`, D1-D3 of :mod:`cowstate.keyed_state`):
their key context checked the key and computed its key group, so they call
the key group's map directly.

Two tables share this API (:class:`~cowstate.protocols.KeyedTable`, as does
:class:`~cowstate.rocksdb.table.RocksDBStateTable`):

- :class:`CopyOnWriteStateTable` keeps a :class:`~cowstate.CopyOnWriteStateMap`
  per key group. ``snapshot()`` snapshots every map (each bumps its own
  version, so versions are per key group) and costs one bucket-list copy per
  map; the snapshot may then be written on another thread while the table
  keeps changing. Each key group's map snapshot is released as soon as that
  key group is written (``release_key_group``), and ``release()`` releases
  whatever is left, after success, failure or cancellation (Flink's
  FLINK-13469): both are idempotent.
- :class:`~cowstate.nested_table.NestedMapsStateTable` (its own module)
  keeps nested dicts ``namespace -> key -> state`` per key group, and its
  ``snapshot()`` deep-copies every state at once (through the state
  serializer): the synchronous alternative, slow to snapshot, simple to trust.

A snapshot carries the state's :class:`StateMetaInfo` with *duplicated*
serializers taken at the synchronous moment (FLINK-6207), and applies the
meta info's snapshot transformer while it is read: ``transformer(state)``
returns ``None`` to drop the mapping from the snapshot, or the state to write
(the same object or a new one). It must not mutate its argument; the live
table never sees it. Iterating a table snapshot yields exactly what a writer
writes.

Iteration of a table is fail-fast like a map's: adding or removing a mapping
anywhere in the table while iterating raises
:class:`~cowstate.errors.ConcurrentModificationError`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Generic, Protocol, cast

from cowstate.arithmetic import DEFAULT_CAPACITY
from cowstate.errors import (
    ConcurrentModificationError,
    ForeignSnapshotError,
    InvalidArgumentError,
    SnapshotReleasedError,
    UnhashableKeyError,
)
from cowstate.key_groups import (
    DEFAULT_LOWER_BOUND_MAX_PARALLELISM,
    KeyGroupRange,
    assign_to_key_group,
)
from cowstate.map_contract import StateEntry, keys_in
from cowstate.maps import CopyOnWriteStateMap
from cowstate.protocols import MapSnapshot, SnapshottingStateMap, StateMap, TrackingMapSnapshot
from cowstate.serializers import (
    StateSerializer,
    duplicate_serializer,
)
from cowstate.state_meta import SnapshotTransformer, StateMetaInfo
from cowstate.table_base import TableBase
from cowstate.type_vars import K, N, S, V

__all__ = [
    "CopyOnWriteStateTable",
    "CopyOnWriteStateTableSnapshot",
    "MapFactory",
    "StateTable",
    "StateTableSnapshot",
    "TableFactory",
]


# ------------------------------------------------------------------ the tables


class StateTable(TableBase[K, N, S]):
    """Routing by key group over one map per key group (see the module doc)."""

    def __init__(
        self,
        key_group_range: KeyGroupRange | None = None,
        max_parallelism: int = DEFAULT_LOWER_BOUND_MAX_PARALLELISM,
        *,
        meta: StateMetaInfo | None = None,
        key_serializer: StateSerializer | None = None,
        initial_capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        super().__init__(key_group_range, max_parallelism, meta=meta, key_serializer=key_serializer)
        self._start = self._range.start_key_group
        self._initial_capacity = initial_capacity
        self._maps: Sequence[StateMap[K, N, S]] = [self._create_map() for _ in self._range]
        self._mod_count = 0
        self._snapshot_count = 0

    def _apply_meta_info(self, meta: StateMetaInfo) -> None:
        """Every per-key-group map copies with the new state serializer from now on."""
        for m in self._maps:
            m.serializer = meta.state_serializer

    @property
    def pending_reclaim(self) -> int:
        """Entries the snapshot writer's releases left for the maps to free
        (the C map's rule G; 0 for maps that free at the release)."""
        return sum(getattr(m, "pending_reclaim", 0) for m in self._maps)

    def reclaim(self) -> int:
        """Free what :attr:`pending_reclaim` counts now; the count freed."""
        return sum(m.reclaim() for m in self._maps if hasattr(m, "reclaim"))

    def state_map(self, key_group: int) -> StateMap[K, N, S]:
        """The map holding ``key_group`` (Flink's ``getMapForKeyGroup``)."""
        return self._maps[self._range.index_of(key_group)]

    def direct_route(self) -> tuple[Sequence[StateMap[K, N, S]], int] | None:
        """The maps by key group and the first key group (``maps[kg - first]`` holds
        ``kg``), for a caller that routes by itself: a backend's handles
        (:mod:`cowstate.keyed_state`, D1-D3). Such a caller has checked the key
        against this table's ``key_types`` and computed its key group in this
        table's range, which is all ``_route`` does, and calls
        :meth:`count_modification` after a write that added or removed a
        mapping, as the keyed operations do. ``None`` for a class that overrides
        a keyed operation: its own must run."""
        cls = type(self)
        if any(getattr(cls, name) is not getattr(StateTable, name) for name in _ROUTED):
            return None
        return self._maps, self._start

    def count_modification(self) -> None:
        """A mapping was added or removed by a caller of :meth:`direct_route`:
        iterators of the table fail fast from now on."""
        self._mod_count += 1

    # ---------------------------------------------------------------- reads

    def get(self, key: K, namespace: N, *, key_group: int | None = None) -> S | None:
        """The state of ``(key, namespace)`` or ``None``; see ``CopyOnWriteStateMap.get``."""
        return self._route(key, key_group).get(key, namespace)

    def contains_key(self, key: K, namespace: N, *, key_group: int | None = None) -> bool:
        return self._route(key, key_group).contains_key(key, namespace)

    def __len__(self) -> int:
        return sum(len(m) for m in self._maps)

    def __iter__(self) -> Iterator[StateEntry[K, N, S]]:
        """Every mapping once, in key-group order (fail-fast over the whole table)."""
        return self._iterate(self._maps, self._mod_count)

    def entries_in_key_group(self, key_group: int) -> Iterator[StateEntry[K, N, S]]:
        """The mappings of one key group (fail-fast)."""
        return self._iterate([self.state_map(key_group)], self._mod_count)

    def keys(self, namespace: N) -> Iterator[K]:
        """The keys mapped in ``namespace``, in key-group order (fail-fast)."""
        return keys_in(iter(self), namespace)

    def size_of_namespace(self, namespace: N) -> int:
        return sum(m.size_of_namespace(namespace) for m in self._maps)

    # --------------------------------------------------------------- writes

    def put(self, key: K, namespace: N, state: S, *, key_group: int | None = None) -> bool:
        """Map ``(key, namespace)`` to ``state``; True if the mapping is new."""
        m = self._route(key, key_group)
        inserted = m.put(key, namespace, state)
        if inserted:  # a new mapping: iterators fail fast
            self._mod_count += 1
        self._stored_key(key)
        return inserted

    def put_and_get_old(
        self, key: K, namespace: N, state: S, *, key_group: int | None = None
    ) -> S | None:
        m = self._route(key, key_group)
        old = m.put_and_get_old(key, namespace, state)
        if old is None:
            self._mod_count += 1
        self._stored_key(key)
        return old

    def remove(self, key: K, namespace: N, *, key_group: int | None = None) -> None:
        m = self._route(key, key_group)
        size = len(m)
        m.remove(key, namespace)
        if len(m) != size:
            self._mod_count += 1

    def remove_and_get_old(self, key: K, namespace: N, *, key_group: int | None = None) -> S | None:
        old = self._route(key, key_group).remove_and_get_old(key, namespace)
        if old is not None:
            self._mod_count += 1
        return old

    def transform(
        self,
        key: K,
        namespace: N,
        value: V,
        fn: Callable[[S | None, V], S],
        *,
        key_group: int | None = None,
    ) -> None:
        """Map ``(key, namespace)`` to ``fn(old_or_None, value)``, atomically."""
        m = self._route(key, key_group)
        size = len(m)
        m.transform(key, namespace, value, fn)
        if len(m) != size:
            self._mod_count += 1
        self._stored_key(key)

    # ------------------------------------------------------------ snapshots

    @abstractmethod
    def snapshot(self) -> StateTableSnapshot[K, N, S]:
        """The synchronous part of a checkpoint of this table."""

    def release(self, snapshot: StateTableSnapshot[Any, Any, Any]) -> None:
        """Release ``snapshot`` (every key group not yet released)."""
        if not isinstance(snapshot, StateTableSnapshot) or snapshot._owner is not self:
            raise ForeignSnapshotError(
                "expected a snapshot taken from this table, got "
                + (
                    "one of another table"
                    if isinstance(snapshot, StateTableSnapshot)
                    else type(snapshot).__name__
                )
            )
        snapshot.release()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self._meta.name!r} {self._range!r} of "
            f"{self._max_parallelism} size={len(self)}>"
        )

    # ------------------------------------------------------ private helpers

    @abstractmethod
    def _create_map(self) -> StateMap[K, N, S]:
        """A fresh, empty map for one key group."""

    def _route(self, key: K, key_group: int | None) -> StateMap[K, N, S]:
        """The map of ``key``'s key group (``key_group`` if given)."""
        if key is None:
            raise InvalidArgumentError(
                "expected a key, got None; keyed state needs a key (no key set?)"
            )
        try:
            self.key_types.check(key)  # K1, K3: before the hash
        except InvalidArgumentError:
            UnhashableKeyError.check(key)  # the same error as every table's
            raise
        if key_group is None:
            try:
                key_group = assign_to_key_group(key, self._max_parallelism, self._key_serializer)
            except InvalidArgumentError:
                UnhashableKeyError.check(key)  # the same error as every table's
                raise
        elif type(key_group) is not int:
            raise InvalidArgumentError(
                f"expected an int key_group, got {type(key_group).__name__} {key_group!r}"
            )
        index = key_group - self._start
        if 0 <= index < len(self._maps):
            return self._maps[index]
        # an unhashable key outside the range is refused as inside it (the map's rule U)
        UnhashableKeyError.check(key)
        return self._maps[self._range.index_of(key_group)]  # raises KeyGroupOutOfRangeError

    def _iterate(
        self, maps: Sequence[StateMap[K, N, S]], expected: int
    ) -> Iterator[StateEntry[K, N, S]]:
        for m in maps:
            for entry in m:
                if self._mod_count != expected:
                    raise ConcurrentModificationError(
                        "expected no mapping added or removed while iterating the table; "
                        "collect what you need first, e.g. list(table.keys(ns))"
                    )
                yield entry
        if self._mod_count != expected:
            raise ConcurrentModificationError(
                "expected no mapping added or removed while iterating the table"
            )

    def _next_snapshot_number(self) -> int:
        self._snapshot_count += 1
        return self._snapshot_count


#: What a caller of :meth:`StateTable.direct_route` does in place of the table:
#: a class that overrides any of these gets no direct route.
_ROUTED = ("get", "put", "remove", "transform", "_route", "_stored_key")


class MapFactory(Protocol):
    """What makes a table's per-key-group map: a map class, called with the
    state serializer and the initial capacity."""

    def __call__(
        self, serializer: StateSerializer, initial_capacity: int, /
    ) -> SnapshottingStateMap[Any, Any, Any]: ...


class CopyOnWriteStateTable(StateTable[K, N, S]):
    """A table of :class:`~cowstate.CopyOnWriteStateMap`: asynchronous snapshots."""

    _maps: Sequence[SnapshottingStateMap[K, N, S]]

    #: The map class of every key group: ``cowstate.CopyOnWriteStateMap`` (the C
    #: map when built); the specification also runs tables over the other one.
    map_class: ClassVar[MapFactory] = CopyOnWriteStateMap

    def state_map(self, key_group: int) -> SnapshottingStateMap[K, N, S]:
        """The copy-on-write map holding ``key_group``."""
        return self._maps[self._range.index_of(key_group)]

    def _create_map(self) -> SnapshottingStateMap[K, N, S]:
        return self.map_class(self._meta.state_serializer, self._initial_capacity)

    def snapshot(self) -> CopyOnWriteStateTableSnapshot[K, N, S]:
        """Snapshot every key group's map, in key-group order (one list copy each)."""
        taken: list[MapSnapshot[K, N, S]] = []
        try:
            for m in self._maps:
                taken.append(m.snapshot())
        except BaseException:
            for snap in taken:
                snap.release()
            raise
        return CopyOnWriteStateTableSnapshot(self, taken)


#: ``factory(key_group_range, max_parallelism, meta=..., key_serializer=...)``
TableFactory = Callable[..., StateTable[Any, Any, Any]]


# -------------------------------------------------------------- the snapshots


class StateTableSnapshot(ABC, Generic[K, N, S]):
    """One table's mappings at its synchronous moment, per key group.

    ``key_group_entries(kg)`` yields what a writer writes for ``kg`` (the
    transformer applied); ``release_key_group(kg)`` ends one key group,
    ``release()`` all that remain. Both are idempotent and may run on a
    background thread. Reading a released key group raises
    :class:`~cowstate.errors.SnapshotReleasedError`.
    """

    def __init__(self, owner: StateTable[K, N, S], count: int) -> None:
        self._owner = owner
        self.version = owner._next_snapshot_number()
        self.key_group_range = owner.key_group_range
        self.max_parallelism = owner.max_parallelism
        self.meta = owner.meta.duplicated()  # FLINK-6207
        self.key_serializer = duplicate_serializer(owner.key_serializer)
        self._open = [True] * count
        self._lock = threading.Lock()

    @property
    def is_released(self) -> bool:
        return not any(self._open)

    def is_key_group_released(self, key_group: int) -> bool:
        return not self._open[self.key_group_range.index_of(key_group)]

    def key_group_entries(self, key_group: int) -> Iterator[StateEntry[K, N, S]]:
        """The (transformed) mappings of ``key_group`` as of the snapshot."""
        index = self._open_index(key_group)
        transformer = self.meta.snapshot_transformer
        entries = self._entries(index)
        if transformer is None:
            return entries
        return _transformed(entries, transformer)

    def key_group_items(self, key_group: int) -> Sequence[tuple[K, N, S]]:
        """:meth:`key_group_entries` as tuples in one list (the writer's fast path)."""
        index = self._open_index(key_group)
        items = self._items(index)
        transformer = self.meta.snapshot_transformer
        if transformer is None:
            return items
        return [(k, n, new) for k, n, s in items if (new := transformer(s)) is not None]

    def size_of_key_group(self, key_group: int) -> int:
        """The number of mappings of ``key_group`` before any transformer."""
        return self._size(self._open_index(key_group))

    def __iter__(self) -> Iterator[StateEntry[K, N, S]]:
        for key_group in self.key_group_range:
            yield from self.key_group_entries(key_group)

    def __len__(self) -> int:
        """The number of mappings before any transformer (all key groups must be open)."""
        return sum(self.size_of_key_group(kg) for kg in self.key_group_range)

    def release_key_group(self, key_group: int) -> None:
        """Stop protecting ``key_group`` (once it is written); idempotent."""
        index = self.key_group_range.index_of(key_group)
        with self._lock:
            if self._open[index]:
                self._open[index] = False
                self._release(index)

    def release(self) -> None:
        """Release every key group not yet released; idempotent."""
        with self._lock:
            for index, is_open in enumerate(self._open):
                if is_open:
                    self._open[index] = False
                    self._release(index)

    def __enter__(self) -> StateTableSnapshot[K, N, S]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        open_count = sum(self._open)
        return (
            f"<{type(self).__name__} {self.meta.name!r} #{self.version} "
            f"{self.key_group_range!r}, {open_count} key groups open>"
        )

    # ------------------------------------------------------ private helpers

    def _open_index(self, key_group: int) -> int:
        index = self.key_group_range.index_of(key_group)
        if not self._open[index]:
            raise SnapshotReleasedError(
                f"expected an open key group, got key group {key_group} of snapshot "
                f"#{self.version} of {self.meta.name!r}, which was released"
            )
        return index

    @abstractmethod
    def _entries(self, index: int) -> Iterator[StateEntry[K, N, S]]: ...

    @abstractmethod
    def _items(self, index: int) -> Sequence[tuple[K, N, S]]: ...

    @abstractmethod
    def _size(self, index: int) -> int: ...

    @abstractmethod
    def _release(self, index: int) -> None: ...


class CopyOnWriteStateTableSnapshot(StateTableSnapshot[K, N, S]):
    """One map snapshot (:class:`~cowstate.StateMapSnapshot`) per key group."""

    def __init__(
        self, owner: CopyOnWriteStateTable[K, N, S], snapshots: list[MapSnapshot[K, N, S]]
    ) -> None:
        super().__init__(owner, len(snapshots))
        self._snapshots = snapshots
        self._since: Sequence[int] | None = None
        # key-group index -> the changes freeze_changes held apart (flat: key,
        # namespace, state per mapping); that map snapshot is released
        self._frozen: dict[int, Sequence[Any]] = {}

    def map_versions(self) -> tuple[int, ...]:
        """The version of every key group's map snapshot, in key-group order (the
        base versions of a heap incremental checkpoint)."""
        return tuple(snap.version for snap in self._snapshots)

    def only_changed_since(self, versions: Sequence[int]) -> None:
        """From now on read only the mappings each key group's map changed since
        its snapshot of ``versions[i]`` (``changed_items`` of a map that tracks
        changes: rule T of :mod:`cowstate.state_map`); what a heap delta writes."""
        if len(versions) != len(self._snapshots):
            raise InvalidArgumentError(
                f"expected a base version per key group ({len(self._snapshots)}), got "
                f"{len(versions)}"
            )
        self._since = tuple(versions)

    def freeze_changes(
        self,
        freeze: Callable[[Any, int], Sequence[Any] | None],
        snapshot_type: type,
    ) -> int:
        """Hold each key group's changes since the base apart from its map
        snapshot, and release that snapshot at once (a heap delta's synchronous
        part: the owner then copies nothing for the delta while it is written).
        ``freeze(map_snapshot, since)`` is the C writer's ``freeze_changes``:
        the mappings :meth:`only_changed_since` reads, as one flat sequence of
        key, namespace and state each, or None when one of those values could
        change (a list, a dict, a subclass: rule S must keep copying it, so
        that key group keeps its snapshot). Only maps whose snapshots are of
        ``snapshot_type`` are frozen. From then on a frozen key group reads
        as its changes (entries, items and size alike). Returns how many key
        groups were frozen."""
        if self._since is None:
            raise InvalidArgumentError(
                "expected a table snapshot set to only_changed_since before freezing its "
                "changes, got one that reads everything"
            )
        frozen = 0
        # The owner's thread, before a writer has the snapshot (no lock: a
        # release() that freeze or a finalizer runs may take it).
        for index, snapshot in enumerate(self._snapshots):
            if not self._open[index] or index in self._frozen:
                continue
            if type(snapshot) is not snapshot_type:
                continue
            changes = freeze(snapshot, self._since[index])
            if changes is None:
                continue
            self._frozen[index] = changes
            snapshot.release()
            frozen += 1
        return frozen

    @property
    def changed_since(self) -> tuple[int, ...] | None:
        """The base versions :meth:`only_changed_since` set (what the table
        reads, and the C snapshot writer walks, is only what changed since
        them), or None: everything."""
        return None if self._since is None else tuple(self._since)

    def map_snapshot(self, key_group: int) -> MapSnapshot[K, N, S]:
        """The map snapshot of ``key_group`` (Flink's ``getStateMapSnapshotForKeyGroup``)."""
        return self._snapshots[self._open_index(key_group)]

    def map_snapshots(self) -> list[MapSnapshot[K, N, S] | Sequence[Any]]:
        """Every key group's map snapshot, released or not, in key-group order
        (the C snapshot writer walks them; it checks each one's release), or
        for a key group :meth:`freeze_changes` froze, the changes it holds."""
        return [self._frozen.get(i, snap) for i, snap in enumerate(self._snapshots)]

    def _entries(self, index: int) -> Iterator[StateEntry[K, N, S]]:
        if index in self._frozen:
            return (StateEntry(k, n, s) for k, n, s in self._items(index))
        return iter(self._snapshots[index])

    def _items(self, index: int) -> list[tuple[K, N, S]]:
        changes = self._frozen.get(index)
        if changes is not None:
            flat = iter(changes)
            return list(zip(flat, flat, flat, strict=True))
        if self._since is not None:
            tracking = cast("TrackingMapSnapshot[K, N, S]", self._snapshots[index])
            return tracking.changed_items(self._since[index])
        return self._snapshots[index].items()

    def _size(self, index: int) -> int:
        changes = self._frozen.get(index)
        if changes is not None:
            return len(changes) // 3
        return len(self._snapshots[index])

    def _release(self, index: int) -> None:
        if self._frozen.pop(index, None) is not None:
            return  # its map snapshot was released when it was frozen
        # The snapshot writer releases key groups from its own thread: the C
        # map's hand_back leaves freeing what only the snapshot kept alive to
        # the owner's next writes (rule G of _cmap.c), so the owner is not
        # stopped for it. A map of another kind releases.
        snapshot = self._snapshots[index]
        hand_back = getattr(snapshot, "hand_back", None)
        if hand_back is None:
            snapshot.release()
        else:
            hand_back()


def _transformed(
    entries: Iterator[StateEntry[K, N, S]], transformer: SnapshotTransformer
) -> Iterator[StateEntry[K, N, S]]:
    for key, namespace, state in entries:
        new = transformer(state)
        if new is not None:
            yield StateEntry(key, namespace, new)


def __getattr__(name: str) -> Any:
    """The nested table's names, which lived here before :mod:`cowstate.nested_table`."""
    if name in ("NestedMapsStateTable", "NestedMapsStateTableSnapshot", "NestedStateMap"):
        from cowstate import nested_table

        return getattr(nested_table, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
