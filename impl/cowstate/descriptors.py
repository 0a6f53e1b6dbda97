"""The kinds of keyed state: their names (:class:`StateKind`), and for each
kind the descriptor a user registers a state with (Flink's
``StateDescriptor``) and the handle a backend gives for it (Flink's
``ValueState``, ``ListState``, ...), side by side as Flink's
``api.common.state`` keeps them. :mod:`cowstate.kinds` lists the kinds in
one table, the registry every other module reads; its docstring says how to
add a kind.

Descriptors
===========
A backend registers a state the first time a descriptor of its name is
used; later uses must describe the same state: the same kind and a
serializer with the same identifier, else
:class:`~cowstate.errors.StateRegistrationError`. A descriptor class names
its kind and its handle (``kind``, ``handle``): ``get_state`` is typed by
``handle`` (a ``ValueStateDescriptor`` gives a ``ValueState``).

The serializer serializes the *whole* state object of one ``(key,
namespace)``: the value of a value state, the list of a list state, the dict
of a map state, the accumulator of an aggregating state. It also deep-copies
that object when a snapshot still holds it (rule S of ``state_map``).

Handles
=======
A handle holds no data: it reads and writes the table of its name at the
backend's current key and namespace (:class:`~cowstate.keyed_state.KeyedState`,
the base of every handle, and the key context in :mod:`cowstate.keyed_state`). The
hottest operations (``ValueState.value``/``update``, ``ListState.get``/``add``,
``MapState.get``/``put``) call the current key group's map from their own
frame when the backend gives them a direct route (D3 there), and the
table otherwise.

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
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from cowstate.errors import InvalidArgumentError, NoneStateError, UnhashableKeyError
from cowstate.keyed_state import KeyedState
from cowstate.serializers import DefaultSerializer, StateSerializer, is_state_serializer

#: Every kind's descriptor and handle, and what they share: ``cowstate``
#: re-exports exactly these (a new kind's two classes join this list).
__all__ = [
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "ReducingState",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "ValueState",
    "ValueStateDescriptor",
]

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)
ACC = TypeVar("ACC")
R_co = TypeVar("R_co", covariant=True)
H_co = TypeVar("H_co", bound=KeyedState, covariant=True)


class StateKind(StrEnum):
    """The kind of a keyed state (what its handle does with the state object):
    the name snapshot files, checkpoint handles and messages record."""

    VALUE = "value"
    LIST = "list"
    MAP = "map"
    REDUCING = "reducing"
    AGGREGATING = "aggregating"

    def __repr__(self) -> str:
        return repr(self.value)  # messages and lists show 'value', as plain strings did


class Describes(Protocol[H_co]):
    """A descriptor, as ``get_state`` types it: the handle class it gives."""

    @property
    def handle(self) -> type[H_co]: ...


@runtime_checkable
class AggregateFunction(Protocol[T_contra, ACC, R_co]):
    """Flink's ``AggregateFunction``: folds values into an accumulator."""

    def create_accumulator(self) -> ACC: ...

    def add(self, value: T_contra, accumulator: ACC) -> ACC: ...

    def get_result(self, accumulator: ACC) -> R_co: ...

    def merge(self, a: ACC, b: ACC) -> ACC: ...


@dataclass(frozen=True)
class StateDescriptor:
    """What every descriptor has: a name and the state object's serializer."""

    #: The kind's name (a :class:`StateKind`; ``""`` here: no kind).
    kind: ClassVar[str] = ""
    #: The handle class a backend gives for this kind (what ``get_state`` returns).
    handle: ClassVar[type[KeyedState]]
    name: str
    serializer: StateSerializer = field(default_factory=DefaultSerializer)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentError(f"expected a non-empty str state name, got {self.name!r}")
        if not is_state_serializer(self.serializer):
            raise InvalidArgumentError(
                f"expected a serializer with copy/serialize/deserialize for state "
                f"{self.name!r}, got {type(self.serializer).__name__}"
            )


# ------------------------------------------------------------------ value


class ValueState(KeyedState):
    """One value per key and namespace."""

    __slots__ = ()

    def value(self) -> Any:
        """The value, or (a copy of) the descriptor's default when absent."""
        c = self._context
        m = self._holder.routes[c.index]  # the direct route (D3 of cowstate.keyed_state)
        state = self._get() if m is None else m.get(c.raw_key, c.namespace)
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
            return
        c = self._context
        m = self._holder.routes[c.index]  # D3
        if m is None:
            self._put(value)
        elif m.put(c.raw_key, c.namespace, value):
            self._holder.count_modification()


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor, Generic[T]):
    """A single value per key and namespace; ``default`` is returned when absent."""

    kind: ClassVar[str] = StateKind.VALUE.value
    handle: ClassVar[type[ValueState]] = ValueState
    default: Any = None


# ------------------------------------------------------------------- list


class ListState(KeyedState):
    """A list per key and namespace."""

    __slots__ = ()

    def get(self) -> list[Any]:
        """The stored list (mutable until the next snapshot), or a new empty list."""
        c = self._context
        m = self._holder.routes[c.index]  # D3
        state = self._get() if m is None else m.get(c.raw_key, c.namespace)
        return [] if state is None else state

    def add(self, value: Any) -> None:
        """Append ``value`` (never ``None``)."""
        if value is None:
            raise NoneStateError(
                f"expected an element to add to list state {self.name!r}, got None"
            )
        c = self._context
        m = self._holder.routes[c.index]  # D3
        if m is None:
            self._transform([value], _extend)
            return
        size = len(m)
        m.transform(c.raw_key, c.namespace, [value], _extend)
        if len(m) != size:
            self._holder.count_modification()

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


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor):
    """A list of elements per key and namespace (``None`` elements are refused)."""

    kind: ClassVar[str] = StateKind.LIST.value
    handle: ClassVar[type[ListState]] = ListState


# -------------------------------------------------------------------- map


class MapState(KeyedState):
    """A dict of user keys to user values per key and namespace."""

    __slots__ = ()

    def get(self, user_key: Hashable) -> Any:
        try:
            hash(user_key)
        except TypeError as exc:  # as _check_user_key, without its frame
            raise _unhashable_user_key(user_key) from exc
        c = self._context
        m = self._holder.routes[c.index]  # D3
        stored = self._get() if m is None else m.get(c.raw_key, c.namespace)
        return None if stored is None else stored.get(user_key)

    def put(self, user_key: Hashable, value: Any) -> None:
        try:
            hash(user_key)
        except TypeError as exc:  # as _check_user_key, without its frame
            raise _unhashable_user_key(user_key) from exc
        c = self._context
        m = self._holder.routes[c.index]  # D3
        if m is None:
            self._transform({user_key: value}, _update)
            return
        size = len(m)
        m.transform(c.raw_key, c.namespace, {user_key: value}, _update)
        if len(m) != size:
            self._holder.count_modification()

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


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    """A dict of user keys to user values per key and namespace."""

    kind: ClassVar[str] = StateKind.MAP.value
    handle: ClassVar[type[MapState]] = MapState


# --------------------------------------------------------------- reducing


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


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """One value per key and namespace, combined with ``reduce_function(old, new)``."""

    kind: ClassVar[str] = StateKind.REDUCING.value
    handle: ClassVar[type[ReducingState]] = ReducingState
    reduce_function: Callable[[Any, Any], Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.reduce_function):
            raise InvalidArgumentError(
                f"expected a callable reduce_function for reducing state {self.name!r}, got "
                f"{type(self.reduce_function).__name__}"
            )


# ------------------------------------------------------------ aggregating


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


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor):
    """An accumulator per key and namespace, folded by ``aggregate_function``."""

    kind: ClassVar[str] = StateKind.AGGREGATING.value
    handle: ClassVar[type[AggregatingState]] = AggregatingState
    aggregate_function: AggregateFunction[Any, Any, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.aggregate_function, AggregateFunction):
            raise InvalidArgumentError(
                f"expected an aggregate_function with create_accumulator/add/get_result/merge "
                f"for aggregating state {self.name!r}, got "
                f"{type(self.aggregate_function).__name__}"
            )


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
        raise _unhashable_user_key(user_key) from exc


def _unhashable_user_key(user_key: object) -> UnhashableKeyError:
    return UnhashableKeyError(
        f"expected a hashable user key, got {type(user_key).__name__} {user_key!r}"
    )
