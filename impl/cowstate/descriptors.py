"""State descriptors: the name, kind and serializer of a keyed state (Flink's
``StateDescriptor``), and the functions of reducing and aggregating states.

A backend registers a state the first time a descriptor of its name is
used; later uses must describe the same state: the same kind and a
serializer with the same identifier, else
:class:`~cowstate.errors.StateRegistrationError`.

The serializer serializes the *whole* state object of one ``(key,
namespace)``: the value of a value state, the list of a list state, the dict
of a map state, the accumulator of an aggregating state. It also deep-copies
that object when a snapshot still holds it (rule S of ``state_map``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from cowstate.errors import InvalidArgumentError
from cowstate.serializers import DefaultSerializer, StateSerializer

__all__ = [
    "AggregateFunction",
    "AggregatingStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "ValueStateDescriptor",
]

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)
ACC = TypeVar("ACC")
R_co = TypeVar("R_co", covariant=True)


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

    kind: ClassVar[str] = ""
    name: str
    serializer: StateSerializer = field(default_factory=DefaultSerializer)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentError(f"expected a non-empty str state name, got {self.name!r}")
        if not isinstance(self.serializer, StateSerializer):
            raise InvalidArgumentError(
                f"expected a serializer with copy/serialize/deserialize for state "
                f"{self.name!r}, got {type(self.serializer).__name__}"
            )


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor, Generic[T]):
    """A single value per key and namespace; ``default`` is returned when absent."""

    kind: ClassVar[str] = "value"
    default: Any = None


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor):
    """A list of elements per key and namespace (``None`` elements are refused)."""

    kind: ClassVar[str] = "list"


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    """A dict of user keys to user values per key and namespace."""

    kind: ClassVar[str] = "map"


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """One value per key and namespace, combined with ``reduce_function(old, new)``."""

    kind: ClassVar[str] = "reducing"
    reduce_function: Callable[[Any, Any], Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.reduce_function):
            raise InvalidArgumentError(
                f"expected a callable reduce_function for reducing state {self.name!r}, got "
                f"{type(self.reduce_function).__name__}"
            )


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor):
    """An accumulator per key and namespace, folded by ``aggregate_function``."""

    kind: ClassVar[str] = "aggregating"
    aggregate_function: AggregateFunction[Any, Any, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.aggregate_function, AggregateFunction):
            raise InvalidArgumentError(
                f"expected an aggregate_function with create_accumulator/add/get_result/merge "
                f"for aggregating state {self.name!r}, got "
                f"{type(self.aggregate_function).__name__}"
            )
