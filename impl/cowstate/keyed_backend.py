"""What every keyed state backend shares: the key context, state registration,
and the state handles, over one table per state (Flink's
``AbstractKeyedStateBackend``).

A backend holds the key groups of one :class:`~cowstate.key_groups.KeyGroupRange`
of ``max_parallelism``. Each state registered through a descriptor gets a
table from ``_new_table``; keyed states read and write it at the current key
and namespace. A name registered again must describe the same state (same
kind, serializer of the same identifier). Subclasses decide what a table is
(objects on the heap, bytes in RocksDB) and how snapshots and restores work.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Generic, TypeVar, overload

from cowstate.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from cowstate.errors import (
    BackendClosedError,
    InvalidArgumentError,
    StateRegistrationError,
    UnknownStateError,
)
from cowstate.key_groups import KeyGroupRange, check_key_group_range
from cowstate.keyed_state import (
    HANDLES,
    AggregatingState,
    KeyContext,
    KeyedState,
    ListState,
    MapState,
    ReducingState,
    StateHolder,
    ValueState,
)
from cowstate.protocols import KeyedTable
from cowstate.serializers import DefaultSerializer, StateSerializer, serializer_identifier
from cowstate.state_meta import StateEntry, StateKind, StateMetaInfo

__all__ = ["AbstractKeyedStateBackend", "SnapshotFuture"]

T = TypeVar("T")
#: The table type of a backend.
TableT = TypeVar("TableT", bound="KeyedTable[Any, Any, Any]")


class SnapshotFuture(Future[T]):
    """The asynchronous part of a backend's snapshot.

    ``cancel()`` before the writer starts cancels it outright; while it runs,
    the writer stops at its next step (key group, file) and ``result()``
    raises :class:`~cowstate.errors.SnapshotCancelledError` (a
    ``CancelledError``). Either way the snapshot's resources are released.
    """

    def __init__(self, checkpoint_id: int, release: Callable[[], None]) -> None:
        super().__init__()
        self.checkpoint_id = checkpoint_id
        self.cancel_requested = threading.Event()
        self._release_resources = release

    def cancel(self) -> bool:
        self.cancel_requested.set()
        if super().cancel():
            self._release_resources()
            return True
        return not self.done()


class AbstractKeyedStateBackend(ABC, Generic[TableT]):
    """Keyed state for the key groups of ``key_group_range``; see the module doc."""

    def __init__(self, key_group_range: KeyGroupRange, max_parallelism: int, *,
                 key_serializer: StateSerializer | None = None,
                 namespace_serializer: StateSerializer | None = None) -> None:
        check_key_group_range(key_group_range, max_parallelism)
        self._key_serializer: StateSerializer = key_serializer or DefaultSerializer()
        self._namespace_serializer: StateSerializer = namespace_serializer or DefaultSerializer()
        self._context = KeyContext(key_group_range, max_parallelism, self._key_serializer)
        self._holders: dict[str, StateHolder[TableT]] = {}
        self._closed = False

    # ------------------------------------------------------------ key context

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self._context.key_group_range

    @property
    def max_parallelism(self) -> int:
        return self._context.max_parallelism

    @property
    def key_serializer(self) -> StateSerializer:
        return self._key_serializer

    @property
    def namespace_serializer(self) -> StateSerializer:
        return self._namespace_serializer

    def set_current_key(self, key: Any) -> None:
        """Make ``key`` current (its key group must be in this backend's range)."""
        self._context.set_key(key)

    @property
    def current_key(self) -> Any:
        return self._context.key

    @property
    def current_key_group(self) -> int:
        _ = self._context.key                         # NoCurrentKeyError before a key
        return self._context.key_group

    def set_current_namespace(self, namespace: Any) -> None:
        self._context.set_namespace(namespace)

    @property
    def current_namespace(self) -> Any:
        return self._context.namespace

    # ----------------------------------------------------------------- states

    @overload
    def get_state(self, descriptor: ValueStateDescriptor[Any]) -> ValueState: ...
    @overload
    def get_state(self, descriptor: ListStateDescriptor) -> ListState: ...
    @overload
    def get_state(self, descriptor: MapStateDescriptor) -> MapState: ...
    @overload
    def get_state(self, descriptor: ReducingStateDescriptor[Any]) -> ReducingState: ...
    @overload
    def get_state(self, descriptor: AggregatingStateDescriptor) -> AggregatingState: ...

    def get_state(self, descriptor: StateDescriptor) -> KeyedState:
        """The state ``descriptor`` names, registered on first use.

        Another descriptor of the same name must have the same kind and a
        serializer of the same identifier (:class:`StateRegistrationError`).
        """
        if not isinstance(descriptor, StateDescriptor) or descriptor.kind not in HANDLES:
            raise InvalidArgumentError(
                f"expected a state descriptor, got {type(descriptor).__name__}")
        holder = self._holders.get(descriptor.name)
        if holder is None:
            meta = self._meta_for(descriptor)
            holder = StateHolder(descriptor, self._new_table(meta))
            self._holders[descriptor.name] = holder
        else:
            self._check_same_state(holder, descriptor)
            if holder.descriptor is None:             # restored, registered only now
                holder.table.set_meta_info(self._meta_for(descriptor))
            holder.descriptor = descriptor
        return HANDLES[descriptor.kind](self._context, holder)

    @property
    def state_names(self) -> list[str]:
        """Registered and restored states, in registration order (their state ids)."""
        return list(self._holders)

    def table(self, name: str) -> TableT:
        """The table of state ``name`` (for inspection, restore and tests)."""
        return self._holder(name).table

    def get_keys(self, name: str, namespace: Any) -> list[Any]:
        """The keys with state ``name`` in ``namespace`` (a list: safe to change state
        while walking it)."""
        return list(self._holder(name).table.keys(namespace))

    def num_state_entries(self) -> int:
        """Mappings over all states."""
        return sum(len(h.table) for h in self._holders.values())

    def entries(self, name: str) -> Iterator[StateEntry[Any, Any, Any]]:
        """Every ``(key, namespace, state)`` of state ``name``, in key-group order."""
        return iter(self._holder(name).table)

    def close(self) -> None:
        """Release what the backend holds; idempotent."""
        self._closed = True

    def __enter__(self) -> AbstractKeyedStateBackend[TableT]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.key_group_range!r} of {self.max_parallelism}, "
                f"states {self.state_names}>")

    # -------------------------------------------------------- for subclasses

    @abstractmethod
    def _new_table(self, meta: StateMetaInfo) -> TableT:
        """A fresh, empty table for the state ``meta`` describes."""

    def _install_tables(self, tables: dict[str, TableT],
                        metas: dict[str, StateMetaInfo]) -> None:
        """Swap restored tables in: registered states absent from ``tables`` become
        empty, restored states not registered yet keep their restored meta info."""
        for name, holder in self._holders.items():
            new = tables.pop(name, None)
            holder.table = new if new is not None else self._new_table(
                metas.get(name, holder.table.meta))
        for name, table in tables.items():
            self._holders[name] = StateHolder(None, table)

    def _registered_metas(self) -> dict[str, StateMetaInfo]:
        """The meta info of every state registered by a descriptor."""
        return {name: self._meta_for(h.descriptor) for name, h in self._holders.items()
                if h.descriptor is not None}

    def _meta_for(self, descriptor: StateDescriptor | None) -> StateMetaInfo:
        assert descriptor is not None
        return StateMetaInfo(descriptor.name, StateKind(descriptor.kind),
                             self._namespace_serializer, descriptor.serializer)

    def _holder(self, name: str) -> StateHolder[TableT]:
        holder = self._holders.get(name)
        if holder is None:
            raise UnknownStateError(
                f"expected a registered state name ({', '.join(self._holders) or 'none'}), "
                f"got {name!r}")
        return holder

    def _check_same_state(self, holder: StateHolder[TableT],
                          descriptor: StateDescriptor) -> None:
        meta = holder.table.meta
        if meta.kind != descriptor.kind:
            raise StateRegistrationError(
                f"expected state {descriptor.name!r} to be registered again as a {meta.kind} "
                f"state, got a {descriptor.kind} state descriptor")
        ours, theirs = (serializer_identifier(meta.state_serializer),
                        serializer_identifier(descriptor.serializer))
        if ours != theirs:
            raise StateRegistrationError(
                f"expected state {descriptor.name!r} with serializer {ours!r}, got {theirs!r}")

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosedError("expected an open backend, got one that was closed")
