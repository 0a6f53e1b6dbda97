"""What each kind of keyed state means: the model's handles, one table.

A handle of the reference backend reads and writes the dict of its state at
the backend's current key and namespace, with the plain Python meaning of the
operation (``append``, ``dict.update``, the reduce function...). Refusals are
built-in exceptions, as everywhere in the model.

:data:`KINDS` maps each kind's name (a descriptor's ``kind``) to its handle:
the same names as ``cowstate.kinds.KINDS`` and ``cowstate_spec.kinds.KINDS``
(``tests/test_state_kinds.py`` requires it). A new kind's meaning is one class
and one row here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the backend imports this module
    from cowstate_model.backend import ReferenceKeyedStateBackend

__all__ = ["KINDS"]


class _State:
    def __init__(self, backend: ReferenceKeyedStateBackend, name: str) -> None:
        self._backend = backend
        self._name = name

    @property
    def _dict(self) -> dict[tuple[Any, Any], Any]:
        return self._backend._data[self._name]

    @property
    def _descriptor(self) -> Any:
        return self._backend._descriptors[self._name]

    def clear(self) -> None:
        self._dict.pop(self._backend._at(), None)


class _Value(_State):
    def value(self) -> Any:
        at = self._backend._at()
        if at in self._dict:
            return self._dict[at]
        return copy.deepcopy(self._descriptor.default)

    def update(self, value: Any) -> None:
        at = self._backend._at()
        if value is None:
            self._dict.pop(at, None)
        else:
            self._dict[at] = value


class _List(_State):
    def get(self) -> list[Any]:
        return self._dict.get(self._backend._at(), [])  # type: ignore[no-any-return]

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("None is not an element")
        self._dict.setdefault(self._backend._at(), []).append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        new = list(values)
        if None in new:
            raise ValueError("None is not an element")
        if new:
            self._dict.setdefault(self._backend._at(), []).extend(new)

    def update(self, values: Iterable[Any]) -> None:
        new = list(values)
        if None in new:
            raise ValueError("None is not an element")
        at = self._backend._at()
        if new:
            self._dict[at] = new
        else:
            self._dict.pop(at, None)


class _Map(_State):
    def _stored(self) -> dict[Any, Any]:
        return self._dict.get(self._backend._at(), {})  # type: ignore[no-any-return]

    def get(self, user_key: Any) -> Any:
        hash(user_key)
        return self._stored().get(user_key)

    def put(self, user_key: Any, value: Any) -> None:
        hash(user_key)
        self._dict.setdefault(self._backend._at(), {})[user_key] = value

    def put_all(self, mapping: dict[Any, Any]) -> None:
        for user_key in mapping:
            hash(user_key)
        if mapping:
            self._dict.setdefault(self._backend._at(), {}).update(mapping)

    def remove(self, user_key: Any) -> None:
        hash(user_key)
        at = self._backend._at()
        stored = self._dict.get(at)
        if stored is not None:
            stored.pop(user_key, None)
            if not stored:
                del self._dict[at]

    def contains(self, user_key: Any) -> bool:
        hash(user_key)
        return user_key in self._stored()

    def keys(self) -> list[Any]:
        return list(self._stored())

    def values(self) -> list[Any]:
        return list(self._stored().values())

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._stored().items())

    def is_empty(self) -> bool:
        return not self._stored()


class _Reducing(_State):
    def get(self) -> Any:
        return self._dict.get(self._backend._at())

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("None is not a value")
        at = self._backend._at()
        old = self._dict.get(at)
        new = value if old is None else self._descriptor.reduce_function(old, value)
        if new is None:
            raise ValueError("the reduce function returned None")
        self._dict[at] = new


class _Aggregating(_State):
    def get(self) -> Any:
        at = self._backend._at()
        if at not in self._dict:
            return None
        return self._descriptor.aggregate_function.get_result(self._dict[at])

    def add(self, value: Any) -> None:
        function = self._descriptor.aggregate_function
        at = self._backend._at()
        accumulator = self._dict.get(at)
        if accumulator is None:
            accumulator = function.create_accumulator()
        new = function.add(value, accumulator)
        if new is None:
            raise ValueError("the aggregate function returned None")
        self._dict[at] = new


#: Every kind's handle, by the kind's name.
KINDS: dict[str, type[_State]] = {
    "value": _Value,
    "list": _List,
    "map": _Map,
    "reducing": _Reducing,
    "aggregating": _Aggregating,
}
