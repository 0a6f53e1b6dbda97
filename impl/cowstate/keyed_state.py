"""The keyed states a backend hands out, and the key context they read.

A keyed state (``ValueState``, ``ListState``, ``MapState``,
``ReducingState``, ``AggregatingState``) is a handle: it holds no data, it
reads and writes the table of its name at the backend's *current key* and
*current namespace* (:class:`KeyContext`). ``set_current_key`` computes the
key's key group once, so state accesses route without hashing again, and
holds the backend to one key type (:mod:`cowstate.key_types`, K1): a key of
another type than the first, however equal (``True`` after ``1``), is
refused, never taken for the current key because it compares equal.

Handles change stored lists, dicts and accumulators through the table's
``transform`` (one lookup to read, one to store), so the same handles work on
a heap table, where ``transform`` hands the function a private copy whenever
a snapshot still holds the stored object, and on a table that stores bytes
(RocksDB), where it decodes, applies and encodes. On the heap, a state object
a handle returns (the list of ``ListState.get``, a mutable value) may also be
mutated in place until the next snapshot, as the map's caller contract says;
on RocksDB a returned object is a copy and such mutations are not stored.

``None`` means "absent" everywhere: ``ValueState.update(None)`` clears,
and ``None`` elements of a list state are refused.

A user function that raises (a reduce function, an aggregate function's
``add``) is a TransformFunctionError and follows the table's transform
contract (rule U of :mod:`cowstate.state_map`): the same accumulator stays
mapped, and an in-place change the function made to it before raising stays
in it on the heap when no snapshot held it (a private copy was changed and
dropped otherwise, and always on RocksDB).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from cowstate.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from cowstate.errors import (
    InvalidArgumentError,
    NoCurrentKeyError,
    NoneStateError,
    UnhashableKeyError,
)
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.key_types import KeyTypes
from cowstate.protocols import KeyedTable
from cowstate.serializers import StateSerializer

__all__ = [
    "VOID_NAMESPACE",
    "AggregatingState",
    "KeyContext",
    "KeyedState",
    "ListState",
    "MapState",
    "PythonVoidNamespace",
    "ReducingState",
    "StateHolder",
    "ValueState",
    "VoidNamespace",
]


class PythonVoidNamespace:
    """The namespace of state that has none (Flink's ``VoidNamespace``): a
    singleton, hash 99, equal to itself only, pickled by reference.

    The fallback of :class:`VoidNamespace` when ``cowstate._void`` is not built:
    the same contract, but as a class written in Python it is a type the
    garbage collector tracks, so every map entry holding it counts for a full
    collection (``_void.c`` says why that matters)."""

    _instance: PythonVoidNamespace | None = None

    def __new__(cls) -> PythonVoidNamespace:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __hash__(self) -> int:
        return 99  # VoidNamespace.hashCode() in Flink

    def __eq__(self, other: object) -> bool:
        return other is self

    def __repr__(self) -> str:
        return "VOID_NAMESPACE"

    def __reduce__(self) -> str:
        return "VOID_NAMESPACE"  # pickles by reference: one instance


#: The type of :data:`VOID_NAMESPACE`: cowstate._void's, which has no
#: ``Py_TPFLAGS_HAVE_GC`` (issue 28: a backend of int or str states then costs
#: a full collection nothing), or :class:`PythonVoidNamespace` when not built.
if TYPE_CHECKING:
    from cowstate._void import VoidNamespace
else:
    try:
        from cowstate._void import VoidNamespace
    except ImportError:  # no compiler at install time
        VoidNamespace = PythonVoidNamespace

VOID_NAMESPACE = VoidNamespace()

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


class ValueState(KeyedState):
    """One value per key and namespace."""

    __slots__ = ()

    def value(self) -> Any:
        """The value, or (a copy of) the descriptor's default when absent."""
        state = self._get()
        if state is None:
            descriptor = self._holder.descriptor
            assert isinstance(descriptor, ValueStateDescriptor)
            default = descriptor.default
            return None if default is None else descriptor.serializer.copy(default)
        return state

    def update(self, value: Any) -> None:
        """Set the value; ``None`` clears it."""
        if value is None:
            self.clear()
        else:
            self._put(value)


class ListState(KeyedState):
    """A list per key and namespace."""

    __slots__ = ()

    def get(self) -> list[Any]:
        """The stored list (mutable until the next snapshot), or a new empty list."""
        state = self._get()
        return [] if state is None else state

    def add(self, value: Any) -> None:
        """Append ``value`` (never ``None``)."""
        if value is None:
            raise NoneStateError(
                f"expected an element to add to list state {self.name!r}, got None"
            )
        self._transform([value], _extend)

    def add_all(self, values: Iterable[Any]) -> None:
        """Append every element of ``values`` (none may be ``None``)."""
        new = self._checked(values)
        if new:
            self._transform(new, _extend)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the list by ``values``; an empty one clears the state."""
        new = self._checked(values)
        if new:
            self._put(new)
        else:
            self.clear()

    def _checked(self, values: Iterable[Any]) -> list[Any]:
        new = list(values)
        if any(v is None for v in new):
            raise NoneStateError(
                f"expected elements for list state {self.name!r}, got None in {new!r}; "
                "nothing was added"
            )
        return new


class MapState(KeyedState):
    """A dict of user keys to user values per key and namespace."""

    __slots__ = ()

    def get(self, user_key: Hashable) -> Any:
        _check_user_key(user_key)
        stored = self._get()
        return None if stored is None else stored.get(user_key)

    def put(self, user_key: Hashable, value: Any) -> None:
        _check_user_key(user_key)
        self._transform({user_key: value}, _update)

    def put_all(self, mapping: Mapping[Any, Any]) -> None:
        if not isinstance(mapping, Mapping):  # a mapping's keys are hashable already
            raise InvalidArgumentError(
                f"expected a mapping of user keys to values, got {type(mapping).__name__}"
            )
        if mapping:
            self._transform(dict(mapping), _update)

    def remove(self, user_key: Hashable) -> None:
        """Remove ``user_key``; removing the last one clears the state."""
        _check_user_key(user_key)
        stored = self._get()
        if stored is not None and user_key in stored:
            if len(stored) == 1:
                self.clear()
            else:
                self._transform(user_key, _delete)

    def contains(self, user_key: Hashable) -> bool:
        _check_user_key(user_key)
        stored = self._get()
        return stored is not None and user_key in stored

    def keys(self) -> list[Any]:
        stored = self._get()
        return [] if stored is None else list(stored)

    def values(self) -> list[Any]:
        stored = self._get()
        return [] if stored is None else list(stored.values())

    def items(self) -> list[tuple[Any, Any]]:
        stored = self._get()
        return [] if stored is None else list(stored.items())

    def is_empty(self) -> bool:
        stored = self._get()
        return not stored


class ReducingState(KeyedState):
    """One value per key and namespace; ``add`` combines with the reduce function."""

    __slots__ = ()

    def get(self) -> Any:
        return self._get()

    def add(self, value: Any) -> None:
        if value is None:
            raise NoneStateError(
                f"expected a value to add to reducing state {self.name!r}, got None"
            )
        self._transform(value, self._reduce)

    def _reduce(self, old: Any, value: Any) -> Any:
        if old is None:
            return value
        descriptor = self._holder.descriptor
        assert isinstance(descriptor, ReducingStateDescriptor)
        assert descriptor.reduce_function is not None
        return descriptor.reduce_function(old, value)


class AggregatingState(KeyedState):
    """An accumulator per key and namespace, folded by the aggregate function."""

    __slots__ = ()

    def get(self) -> Any:
        """The aggregate's result, or ``None`` when nothing was added."""
        accumulator = self._get()
        return None if accumulator is None else self._function().get_result(accumulator)

    def add(self, value: Any) -> None:
        self._transform(value, self._fold)

    def _fold(self, accumulator: Any, value: Any) -> Any:
        function = self._function()
        if accumulator is None:
            accumulator = function.create_accumulator()
        return function.add(value, accumulator)

    def _function(self) -> AggregateFunction[Any, Any, Any]:
        descriptor = self._holder.descriptor
        assert isinstance(descriptor, AggregatingStateDescriptor)
        assert descriptor.aggregate_function is not None
        return descriptor.aggregate_function


#: The handle class of each descriptor kind.
HANDLES: dict[str, type[KeyedState]] = {
    ValueStateDescriptor.kind: ValueState,
    ListStateDescriptor.kind: ListState,
    MapStateDescriptor.kind: MapState,
    ReducingStateDescriptor.kind: ReducingState,
    AggregatingStateDescriptor.kind: AggregatingState,
}


def _extend(stored: list[Any] | None, new: list[Any]) -> list[Any]:
    if stored is None:
        return new
    stored.extend(new)
    return stored


def _update(stored: dict[Any, Any] | None, new: dict[Any, Any]) -> dict[Any, Any]:
    if stored is None:
        return new
    stored.update(new)
    return stored


def _delete(stored: dict[Any, Any], user_key: Any) -> dict[Any, Any]:
    del stored[user_key]
    return stored


def _check_user_key(user_key: object) -> None:
    try:
        hash(user_key)
    except TypeError as exc:  # chained: the user's TypeError, or CPython's "unhashable type"
        raise UnhashableKeyError(
            f"expected a hashable user key, got {type(user_key).__name__} {user_key!r}"
        ) from exc
