"""``ReferenceKeyedStateBackend``: the meaning of a keyed state backend.

A backend *is* a dict per state name from ``(key, namespace)`` to a state
object, plus a current key and namespace; keys whose key group is outside the
backend's range are refused, and so are keys of another type than the first
current key's (``cowstate_model.key_types``: ``True`` after ``1`` is
refused, not taken for ``1``). A snapshot *is* a deep copy of every dict taken
at the synchronous moment; its "asynchronous part" is already done. Restoring
keeps the mappings whose key group is in the restoring backend's range.

Same state API as ``cowstate.heap_backend.HeapKeyedStateBackend``; descriptors
are read by their attributes (``name``, ``kind``, ``serializer``,
``default``, ``reduce_function``, ``aggregate_function``), so the model needs
no import of the library. What each kind's handle does is in
:mod:`cowstate_model.kinds`. Refusals are built-in exceptions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from cowstate_model.key_groups import assign_to_key_group
from cowstate_model.key_types import key_type
from cowstate_model.kinds import KINDS
from cowstate_model.state_map import deep_copy

__all__ = ["ReferenceBackendSnapshot", "ReferenceKeyedStateBackend"]

_NO_KEY: Any = object()


@dataclass(frozen=True)
class ReferenceBackendSnapshot:
    """Deep copies of every state's dict at one moment."""

    checkpoint_id: int
    max_parallelism: int
    kinds: MappingProxyType[str, str]
    serializers: MappingProxyType[str, str]
    states: MappingProxyType[str, MappingProxyType[tuple[Any, Any], Any]]


class ReferenceKeyedStateBackend:
    """Dicts of keyed state for the key groups in ``key_group_range``."""

    Error = (ValueError, TypeError, RuntimeError, KeyError)

    def __init__(
        self,
        key_group_range: Collection[int],
        max_parallelism: int,
        *,
        default_namespace: Any = None,
    ) -> None:
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self._key: Any = _NO_KEY
        self._key_type: Any = None  # fixed by the first key
        self._namespace: Any = default_namespace
        self._data: dict[str, dict[tuple[Any, Any], Any]] = {}
        self._descriptors: dict[str, Any] = {}
        self._kinds: dict[str, str] = {}
        self._serializers: dict[str, str] = {}

    # ------------------------------------------------------------- context

    def set_current_key(self, key: Any) -> None:
        hash(key)
        kind = key_type(key)
        if self._key_type is not None and kind != self._key_type:
            raise TypeError(f"key {key!r} is not of this backend's key type {self._key_type}")
        if assign_to_key_group(key, self.max_parallelism) not in self.key_group_range:
            raise ValueError(f"key {key!r} is not in this backend's key groups")
        self._key_type = kind
        self._key = key

    @property
    def current_key(self) -> Any:
        if self._key is _NO_KEY:
            raise RuntimeError("no current key")
        return self._key

    def set_current_namespace(self, namespace: Any) -> None:
        if namespace is None:
            raise ValueError("a namespace must not be None")
        hash(namespace)
        self._namespace = namespace

    # -------------------------------------------------------------- states

    def get_state(self, descriptor: Any) -> Any:
        name, kind = descriptor.name, descriptor.kind
        serializer = _identifier(descriptor.serializer)
        if name in self._kinds:
            if self._kinds[name] != kind or self._serializers[name] != serializer:
                raise ValueError(f"state {name!r} is registered as another state")
        else:
            self._kinds[name] = kind
            self._serializers[name] = serializer
            self._data.setdefault(name, {})
        self._descriptors[name] = descriptor
        return KINDS[kind](self, name)

    @property
    def state_names(self) -> list[str]:
        return list(self._kinds)

    def contents(self, name: str) -> dict[tuple[Any, Any], Any]:
        """The mappings of state ``name`` (the live objects)."""
        return dict(self._data[name])

    def get_keys(self, name: str, namespace: Any) -> list[Any]:
        return [k for (k, n) in self._data[name] if n == namespace]

    def num_state_entries(self) -> int:
        return sum(len(d) for d in self._data.values())

    # ----------------------------------------------------------- snapshots

    def snapshot(
        self, checkpoint_id: int, stream_factory: Any = None
    ) -> Future[ReferenceBackendSnapshot]:
        snapshot = ReferenceBackendSnapshot(
            checkpoint_id,
            self.max_parallelism,
            MappingProxyType(dict(self._kinds)),
            MappingProxyType(dict(self._serializers)),
            MappingProxyType(
                {
                    name: MappingProxyType({kn: deep_copy(s) for kn, s in d.items()})
                    for name, d in self._data.items()
                }
            ),
        )
        future: Future[ReferenceBackendSnapshot] = Future()
        future.set_result(snapshot)
        return future

    def restore(self, snapshots: Iterable[ReferenceBackendSnapshot]) -> None:
        data: dict[str, dict[tuple[Any, Any], Any]] = {name: {} for name in self._kinds}
        kinds = dict(self._kinds)
        serializers = dict(self._serializers)
        kinds_of_keys: dict[str, Any] = {} if self._key_type is None else {"type": self._key_type}
        for snapshot in snapshots:
            if snapshot.max_parallelism != self.max_parallelism:
                raise ValueError("the max parallelism cannot change")
            for name, contents in snapshot.states.items():
                if (
                    kinds.setdefault(name, snapshot.kinds[name]) != snapshot.kinds[name]
                    or serializers.setdefault(name, snapshot.serializers[name])
                    != snapshot.serializers[name]
                ):
                    raise ValueError(f"state {name!r} is another state in the snapshot")
                target = data.setdefault(name, {})
                for (key, namespace), state in contents.items():
                    if assign_to_key_group(key, self.max_parallelism) in self.key_group_range:
                        kind = key_type(key)
                        if kinds_of_keys.setdefault("type", kind) != kind:
                            raise ValueError(f"key {key!r} is of another type than the others")
                        target[(key, namespace)] = deep_copy(state)
        self._key_type = kinds_of_keys.get("type", self._key_type)
        self._kinds = kinds
        self._serializers = serializers
        self._data = data

    # ------------------------------------------------------------- helpers

    def _at(self) -> tuple[Any, Any]:
        return self.current_key, self._namespace


def _identifier(serializer: Any) -> str:
    identifier = getattr(serializer, "identifier", None)
    if isinstance(identifier, str) and identifier:
        return identifier
    kind = type(serializer)
    return f"{kind.__module__}.{kind.__qualname__}"
