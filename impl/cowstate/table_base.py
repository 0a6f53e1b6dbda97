"""What every state table holds and checks, heap or RocksDB.

:class:`TableBase` validates the constructor arguments once for every table
(the key-group range inside ``max_parallelism``, the meta info, the key
serializer) and provides what the tables share of the
:class:`~cowstate.protocols.KeyedTable` API: the properties, the state
serializer setter, ``set_meta_info``, ``key_group_of`` and ``in``. Each table
adds its storage and the keyed operations.

Every table holds its key types (K4 of :mod:`cowstate.key_types`):
``key_types``, one type per domain, fixed by the first key of that domain the
table stores and checked on every key of every keyed operation; a key of
another type of the same domain (``True`` where ``1`` was stored) raises
:class:`~cowstate.errors.KeyTypeMismatchError`. A backend gives its tables its
own ``KeyTypes`` (one type, K1).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Generic

from cowstate.errors import InvalidArgumentError
from cowstate.key_groups import KeyGroupRange, assign_to_key_group, check_key_group_range
from cowstate.key_types import KeyTypes
from cowstate.serializers import DefaultSerializer, StateSerializer, is_state_serializer
from cowstate.state_meta import StateMetaInfo
from cowstate.type_vars import K, N, S

__all__ = ["TableBase"]


class TableBase(ABC, Generic[K, N, S]):
    """The key groups, meta info and key serializer of one state's table."""

    def __init__(
        self,
        key_group_range: KeyGroupRange | None,
        max_parallelism: int,
        *,
        meta: StateMetaInfo | None,
        key_serializer: StateSerializer | None,
    ) -> None:
        if key_group_range is None and type(max_parallelism) is int and max_parallelism > 0:
            key_group_range = KeyGroupRange(0, max_parallelism - 1)
        key_group_range = check_key_group_range(key_group_range, max_parallelism)
        if meta is not None and not isinstance(meta, StateMetaInfo):
            raise InvalidArgumentError(f"expected a StateMetaInfo, got {type(meta).__name__}")
        if key_serializer is not None and not is_state_serializer(key_serializer):
            raise InvalidArgumentError(
                "expected a key_serializer with copy/serialize/deserialize, got "
                f"{type(key_serializer).__name__}"
            )
        self._range = key_group_range
        self._max_parallelism = max_parallelism
        self._meta = meta if meta is not None else StateMetaInfo()
        self._key_serializer: StateSerializer = (
            key_serializer if key_serializer is not None else DefaultSerializer()
        )
        #: The table's key types (K4); a backend replaces them by its own (K1).
        self.key_types = KeyTypes(per_domain=True)

    # ----------------------------------------------------------- properties

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self._range

    @property
    def max_parallelism(self) -> int:
        return self._max_parallelism

    @property
    def meta(self) -> StateMetaInfo:
        return self._meta

    @property
    def key_serializer(self) -> StateSerializer:
        return self._key_serializer

    @property
    def serializer(self) -> StateSerializer:
        """The state serializer (copies shared states, writes snapshots)."""
        return self._meta.state_serializer

    @serializer.setter
    def serializer(self, serializer: StateSerializer) -> None:
        self.set_meta_info(replace(self._meta, state_serializer=serializer))

    def set_meta_info(self, meta: StateMetaInfo) -> None:
        """Replace the meta info (the serializers states are copied, read and
        written with from now on; Flink's FLINK-26853)."""
        if not isinstance(meta, StateMetaInfo):
            raise InvalidArgumentError(f"expected a StateMetaInfo, got {type(meta).__name__}")
        self._apply_meta_info(meta)
        self._meta = meta

    def key_group_of(self, key: K) -> int:
        """The key group of ``key`` (Flink's assignment, this table's max parallelism)."""
        return assign_to_key_group(key, self._max_parallelism, self._key_serializer)

    @abstractmethod
    def contains_key(self, key: K, namespace: N, *, key_group: int | None = None) -> bool:
        """Is ``(key, namespace)`` mapped?"""

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidArgumentError(
                f"expected a (key, namespace) tuple, got {type(item).__name__} {item!r}"
            )
        return self.contains_key(item[0], item[1])

    # -------------------------------------------------------- for subclasses

    def _stored_key(self, key: K) -> None:
        """A key was stored (checked already): the first of a domain fixes its type."""
        self.key_types.admit(key)

    def _apply_meta_info(self, meta: StateMetaInfo) -> None:
        """Hand the new meta info to the storage (before it becomes ``meta``)."""
