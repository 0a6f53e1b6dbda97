"""The key context keyed states read, and what every keyed state handle shares.

A keyed state handle (the handles of each kind are in
:mod:`cowstate.descriptors`, beside their descriptors) holds no data: it reads
and writes the table of its name at the backend's *current key* and *current
namespace* (:class:`KeyContext`), through the :class:`StateHolder` of its
state. ``set_current_key`` computes the key's key group once, so state
accesses route without hashing again, and holds the backend to one key type
(:mod:`cowstate.key_types`, K1): a key of another type than the first,
however equal (``True`` after ``1``), is refused, never taken for the current
key because it compares equal.

:class:`KeyedState` is the base of every handle: ``clear`` and the three
table calls at the current key and namespace (``_get``, ``_put``,
``_transform``) the kinds' handles are written with.

At run time this module imports no table, no protocol and no descriptor (they
are named for the type checker only), so :mod:`cowstate.kinds` -- which the
snapshot checks read -- sits below the tables.

:data:`VOID_NAMESPACE`, the namespace of state without one, and its types
are defined in :mod:`cowstate.void_namespace` (the lowest layer, so the value
codec reads it) and re-exported here, their public home: pickle stores
``cowstate.keyed_state.VOID_NAMESPACE``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from cowstate.errors import InvalidArgumentError, NoCurrentKeyError, UnhashableKeyError
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.key_types import KeyTypes
from cowstate.serializers import StateSerializer
from cowstate.void_namespace import VOID_NAMESPACE, PythonVoidNamespace, VoidNamespace

if TYPE_CHECKING:  # for the annotations only: both import this module
    from cowstate.descriptors import StateDescriptor
    from cowstate.protocols import KeyedTable

__all__ = [
    "VOID_NAMESPACE",
    "KeyContext",
    "KeyedState",
    "PythonVoidNamespace",
    "StateHolder",
    "VoidNamespace",
]


_NO_KEY: Any = object()


class KeyContext:
    """The current key, its key group, and the current namespace of a backend."""

    __slots__ = (
        "key_group",
        "key_group_range",
        "key_serializer",
        "key_types",
        "max_parallelism",
        "namespace",
        "raw_key",
    )

    def __init__(
        self, key_group_range: KeyGroupRange, max_parallelism: int, key_serializer: StateSerializer
    ) -> None:
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.key_serializer = key_serializer
        #: The backend's key type (K1), shared with its tables.
        self.key_types = KeyTypes()
        self.raw_key: Any = _NO_KEY
        self.key_group = -1
        self.namespace: Any = VOID_NAMESPACE

    @property
    def key(self) -> Any:
        """The current key (:class:`NoCurrentKeyError` before the first ``set_key``)."""
        if self.raw_key is _NO_KEY:
            raise NoCurrentKeyError(
                "expected a current key, got none: call set_current_key(key) before "
                "using keyed state"
            )
        return self.raw_key

    def set_key(self, key: Any) -> None:
        """Make ``key`` current; it must belong to this backend's key groups and be
        of its key type (K1, K3 of :mod:`cowstate.key_types`). Every key is
        checked, also one equal to the current key: ``True`` after ``1`` is
        another key (or a refusal), never the same one."""
        UnhashableKeyError.check(key)
        if key is None:
            raise InvalidArgumentError("expected a key, got None; a key must not be None")
        key_group = assign_to_key_group(key, self.max_parallelism, self.key_serializer)
        self.key_group_range.index_of(key_group)  # KeyGroupOutOfRangeError outside
        self.key_types.admit(key)  # K1 (the first key fixes the type), K3: NaN, -0.0
        self.raw_key = key
        self.key_group = key_group

    def set_namespace(self, namespace: Any) -> None:
        if namespace is None:
            raise InvalidArgumentError(
                "expected a namespace, got None; use VOID_NAMESPACE for state without one"
            )
        UnhashableKeyError.check(namespace, "namespace")
        self.namespace = namespace


#: The table type a backend keeps (a heap table, a RocksDB table ...).
T_co = TypeVar("T_co", bound="KeyedTable[Any, Any, Any]", covariant=True)


class StateHolder(Generic[T_co]):
    """A registered state: its descriptor and its current table.

    ``descriptor`` is ``None`` for a state restored from a snapshot and not
    yet registered by a descriptor.

    A restore swaps the table; handles read it through the holder, so a
    handle taken before a restore keeps working after it.
    """

    __slots__ = ("descriptor", "table")

    def __init__(self, descriptor: StateDescriptor | None, table: T_co) -> None:
        self.descriptor = descriptor
        self.table = table


class KeyedState:
    """What every keyed state does: ``clear`` at the current key and namespace."""

    __slots__ = ("_context", "_holder")

    def __init__(self, context: KeyContext, holder: StateHolder[KeyedTable[Any, Any, Any]]) -> None:
        self._context = context
        self._holder = holder

    @property
    def name(self) -> str:
        return self._holder.table.meta.name

    def clear(self) -> None:
        """Remove the state of the current key and namespace."""
        c = self._context
        self._holder.table.remove(c.key, c.namespace, key_group=c.key_group)

    def _get(self) -> Any:
        c = self._context
        return self._holder.table.get(c.key, c.namespace, key_group=c.key_group)

    def _put(self, state: Any) -> None:
        c = self._context
        self._holder.table.put(c.key, c.namespace, state, key_group=c.key_group)

    def _transform(self, value: Any, fn: Callable[[Any, Any], Any]) -> None:
        c = self._context
        self._holder.table.transform(c.key, c.namespace, value, fn, key_group=c.key_group)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
