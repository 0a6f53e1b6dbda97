"""``ReferenceStateTable``: a state map that knows which key groups it holds.

The meaning of a state table is the meaning of a state map (a dict from
``(key, namespace)`` to a state) restricted to the keys whose key group --
``cowstate_model.key_groups.assign_to_key_group`` -- lies in the table's
key-group range; any other key is refused, and so is a key of another type
than the first key of its domain stored (``cowstate_model.key_types``: ``True``
after ``1``). A snapshot is a deep copy of the
dict, split by key group, whose key groups can be released one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from cowstate_model.key_groups import assign_to_key_group
from cowstate_model.key_types import key_domain, key_type
from cowstate_model.state_map import ReferenceStateMap, StateEntry, deep_copy

__all__ = ["ReferenceStateTable", "ReferenceTableSnapshot"]


class ReferenceTableSnapshot:
    """Deep copies of a table's mappings, one dict per key group."""

    def __init__(
        self,
        owner: ReferenceStateTable,
        version: int,
        by_key_group: dict[int, dict[tuple[Any, Any], Any]],
    ) -> None:
        self.owner = owner
        self.version = version
        self._groups: dict[int, Mapping[tuple[Any, Any], Any]] = {
            kg: MappingProxyType(contents) for kg, contents in by_key_group.items()
        }
        self._released: set[int] = set()

    @property
    def is_released(self) -> bool:
        return self._released.issuperset(self._groups)

    def is_key_group_released(self, key_group: int) -> bool:
        return key_group in self._released

    def key_group_contents(self, key_group: int) -> Mapping[tuple[Any, Any], Any]:
        if key_group in self._released:
            raise RuntimeError(f"key group {key_group} of snapshot {self.version} was released")
        return self._groups[key_group]

    @property
    def contents(self) -> Mapping[tuple[Any, Any], Any]:
        """Every mapping (all key groups must be open)."""
        merged: dict[tuple[Any, Any], Any] = {}
        for key_group in self._groups:
            merged.update(self.key_group_contents(key_group))
        return MappingProxyType(merged)

    def __len__(self) -> int:
        return len(self.contents)

    def __iter__(self) -> Iterator[StateEntry]:
        return (StateEntry(k, n, s) for (k, n), s in self.contents.items())

    def release_key_group(self, key_group: int) -> None:
        if key_group not in self._groups:
            raise ValueError(f"key group {key_group} is not in the snapshot")
        self._released.add(key_group)

    def release(self) -> None:
        self._released.update(self._groups)

    def __enter__(self) -> ReferenceTableSnapshot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class ReferenceStateTable(ReferenceStateMap):
    """A dict of the mappings whose key's key group is in ``key_group_range``.

    ``key_serializer`` gives the bytes of keys without a Java ``hashCode()``
    (default: the value codec's, as the tables' default key serializer).
    """

    def __init__(
        self,
        key_group_range: Collection[int] | None = None,
        max_parallelism: int = 128,
        serializer: object = None,
        initial_capacity: int = 128,
        *,
        key_serializer: Callable[[Any], bytes] | None = None,
    ) -> None:
        super().__init__()
        self.max_parallelism = max_parallelism
        self.key_groups: Collection[int] = (
            range(max_parallelism) if key_group_range is None else key_group_range
        )
        self.key_serializer = key_serializer
        self.key_types: dict[Any, Any] = {}  # domain -> the first stored key's type

    def key_group_of(self, key: Any) -> int:
        return assign_to_key_group(key, self.max_parallelism, self.key_serializer)

    def _owned(self, key: Any, key_group: int | None) -> None:
        """Refuse a key this table does not hold (or a key group that is not the key's)."""
        if key is None:
            raise ValueError("a key must not be None")
        kind = self.key_types.get(key_domain(key), key_type(key))
        if kind != key_type(key):
            raise TypeError(f"key {key!r} is not of the table's key type {kind}")
        actual = self.key_group_of(key)
        if key_group is not None and key_group != actual:
            raise ValueError(f"key {key!r} is in key group {actual}, not {key_group}")
        if actual not in self.key_groups:
            raise ValueError(f"key {key!r} is in key group {actual}, outside the table")

    def get(self, key: Hashable, namespace: Hashable, *, key_group: int | None = None) -> Any:
        self._owned(key, key_group)
        return super().get(key, namespace)

    def contains_key(
        self, key: Hashable, namespace: Hashable, *, key_group: int | None = None
    ) -> bool:
        self._owned(key, key_group)
        return super().contains_key(key, namespace)

    def put(
        self, key: Hashable, namespace: Hashable, state: Any, *, key_group: int | None = None
    ) -> bool:
        self._owned(key, key_group)
        inserted = super().put(key, namespace, state)
        self._stored(key)
        return inserted

    def put_and_get_old(
        self, key: Hashable, namespace: Hashable, state: Any, *, key_group: int | None = None
    ) -> Any:
        self._owned(key, key_group)
        old = super().put_and_get_old(key, namespace, state)
        self._stored(key)
        return old

    def remove(self, key: Hashable, namespace: Hashable, *, key_group: int | None = None) -> None:
        self._owned(key, key_group)
        super().remove(key, namespace)

    def remove_and_get_old(
        self, key: Hashable, namespace: Hashable, *, key_group: int | None = None
    ) -> Any:
        self._owned(key, key_group)
        return super().remove_and_get_old(key, namespace)

    def transform(
        self,
        key: Hashable,
        namespace: Hashable,
        value: Any,
        fn: Callable[[Any, Any], Any],
        *,
        key_group: int | None = None,
    ) -> None:
        self._owned(key, key_group)
        super().transform(key, namespace, value, fn)
        self._stored(key)

    def _stored(self, key: Any) -> None:
        self.key_types.setdefault(key_domain(key), key_type(key))

    def entries_in_key_group(self, key_group: int) -> Iterator[StateEntry]:
        if key_group not in self.key_groups:
            raise ValueError(f"key group {key_group} is outside the table")
        return iter(
            [
                StateEntry(k, n, s)
                for (k, n), s in self._data.items()
                if self.key_group_of(k) == key_group
            ]
        )

    def snapshot(self) -> ReferenceTableSnapshot:  # type: ignore[override]
        self._version += 1
        groups: dict[int, dict[tuple[Any, Any], Any]] = {kg: {} for kg in self.key_groups}
        for (k, n), s in self._data.items():
            groups[self.key_group_of(k)][(k, n)] = deep_copy(s)
        return ReferenceTableSnapshot(self, self._version, groups)

    def release(self, snapshot: Any) -> None:
        if snapshot.owner is not self:
            raise ValueError("snapshot of another table")
        snapshot.release()
