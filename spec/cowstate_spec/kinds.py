"""The state kinds as the spec drives them: one row per kind, by the same names
as ``cowstate.kinds.KINDS`` (the library's registry) and
``cowstate_model.kinds.KINDS`` (the model's handles);
``tests/test_state_kinds.py`` requires the three to name the same kinds.

The columns (:class:`KindSpec`):

- *descriptor*: the state of the kind every backend under test registers,
  named after its kind (``cowstate_spec.backends.DESCRIPTORS``): the backend
  machine, the fuzzers' backends and the backend tests use it;
- *rules*: the backend machine's rules for the kind (:class:`MachineRule`:
  a function of a :class:`Driver` and the strategy of each argument;
  ``BackendMachine`` takes them as Hypothesis rules, its methods under the
  functions' names): each calls the kind's handle on the implementation and
  on the model alike (``on_state``), or mutates what a handle returned
  (``mutate``);
- *load*: what the machine's ``load`` does at each key it starts with;
- *fill*: what the fuzzers' ``fill`` does at each key and namespace
  (``cowstate_spec.fuzz.jobs``);
- *mutate_held*: how the owner mutates a state of the kind that a snapshot
  writer is about to serialize (``complete_snapshot_mutating_what_it_reads``);
  ``None`` for a kind whose states are not mutated in place.

A new kind is one row here (and its functions above it); the machines, the
fuzzers and the backend tests pick it up. Its rules' names must be new
(``<kind>_<operation>``): the machine's rules run in the order of their names,
so the existing ones keep their derandomized examples.

A strategy here is a function of the ``hypothesis.strategies`` module, called
when the machine is built: this module imports no Hypothesis, so
``cowstate_spec.backends`` and the fuzzers, which read the table, run without
the ``dev`` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from cowstate.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)

if TYPE_CHECKING:  # for the annotations only (see above)
    from hypothesis.strategies import SearchStrategy

__all__ = ["KINDS", "Driver", "KindSpec", "MachineRule", "SumCount", "add_ints", "small_ints"]

#: How to draw one argument of a rule: a function of ``hypothesis.strategies``.
Strategy = Callable[[ModuleType], Any]


class Driver(Protocol):
    """What a kind's rules call: the backend machine, driving the implementation
    and the model side by side."""

    #: Every kind's (implementation handle, model handle), by the state's name.
    states: dict[str, tuple[Any, Any]]

    def on_state(self, name: str, operation: str, *args: Any) -> tuple[Any, Any]:
        """``operation(*args)`` on both handles of state ``name``: the same result
        or refusal."""
        ...

    def mutate(self, pair: tuple[Any, Any], item: int) -> None:
        """The caller mutates what both handles returned (where it may)."""
        ...


class MachineRule:
    """One rule of the backend machine: ``run(machine, **arguments)``, each
    argument drawn from its :data:`Strategy` (``MachineRule(map_put,
    user_key=user_keys, value=values)`` is ``@rule(user_key=..., value=...)``
    on ``map_put``)."""

    __slots__ = ("arguments", "run")

    def __init__(self, run: Callable[..., None], **arguments: Strategy) -> None:
        self.run = run
        self.arguments = arguments

    @property
    def name(self) -> str:
        """The rule's name: its function's (the machine's method)."""
        return self.run.__name__

    def strategies(self, st: ModuleType) -> dict[str, SearchStrategy[Any]]:
        """Each argument's strategy, made of ``st`` (``hypothesis.strategies``)."""
        return {name: strategy(st) for name, strategy in self.arguments.items()}


@dataclass(frozen=True)
class KindSpec:
    """One row: how the spec registers, drives and fills one kind."""

    descriptor: StateDescriptor
    rules: tuple[MachineRule, ...]
    load: Callable[[Driver, Any], object]
    fill: Callable[[Any, int, int, Any], None]
    mutate_held: Callable[[Driver, Any, int], object] | None = None


def add_ints(a: int, b: int) -> int:
    """The reducing state's function."""
    return a + b


class SumCount:
    """An aggregate function whose accumulator ``[sum, count]`` is mutated in
    place by ``add``: the copy-on-write table must hand ``add`` a private copy
    whenever a snapshot still holds the stored one."""

    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        accumulator[0] += value
        accumulator[1] += 1
        return accumulator

    def get_result(self, accumulator: list[int]) -> tuple[int, int]:
        return accumulator[0], accumulator[1]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1]]

    def __repr__(self) -> str:
        return "SumCount()"


# ------------------------------------------------------------- strategies


def small_ints(st: ModuleType) -> Any:
    return st.integers(-5, 20)


def values(st: ModuleType) -> Any:
    return st.one_of(small_ints(st), st.lists(small_ints(st), max_size=3), st.none())


def elements(st: ModuleType) -> Any:
    return st.one_of(small_ints(st), st.text("xy", max_size=2))


def user_keys(st: ModuleType) -> Any:
    return st.sampled_from(["u", "v", 3])


def items(st: ModuleType) -> Any:
    """What a caller's mutation of a returned state adds (``contract.mutate_in_place``)."""
    return st.integers(0, 99)


# ------------------------------------------------------------------ value


def value_update(self: Driver, value: Any) -> None:
    self.on_state("value", "update", value)


def value_value_and_mutate(self: Driver, item: int) -> None:
    self.mutate(self.on_state("value", "value"), item)


def _fill_value(state: Any, round_: int, i: int, key: Any) -> None:
    if i % 5 != 1:
        state.update([round_, i, str(key)])


# ------------------------------------------------------------------- list


def list_add(self: Driver, element: Any) -> None:
    self.on_state("list", "add", element)


def list_add_all(self: Driver, elements: list[Any]) -> None:
    self.on_state("list", "add_all", elements)


def list_update(self: Driver, elements: list[Any]) -> None:
    self.on_state("list", "update", elements)


def list_get_and_mutate(self: Driver, item: int) -> None:
    self.mutate(self.on_state("list", "get"), item)


def _fill_list(state: Any, round_: int, i: int, key: Any) -> None:
    if i % 3 != 2:
        state.add((round_, i))


# -------------------------------------------------------------------- map


def map_put(self: Driver, user_key: Any, value: Any) -> None:
    self.on_state("map", "put", user_key, value)


def map_get_and_mutate(self: Driver, user_key: Any, item: int) -> None:
    self.mutate(self.on_state("map", "get", user_key), item)


def map_remove(self: Driver, user_key: Any) -> None:
    self.on_state("map", "remove", user_key)


def map_contains(self: Driver, user_key: Any) -> None:
    self.on_state("map", "contains", user_key)


def map_items(self: Driver) -> None:
    from cowstate_spec.machine import Outcome  # (it imports Hypothesis: this module does not)

    impl_state, model_state = self.states["map"]
    impl = Outcome(impl_state.items)
    model = Outcome(model_state.items)
    assert (impl.error is None) == (model.error is None)
    if impl.error is None:
        assert dict(impl.value) == dict(model.value)
        self.on_state("map", "is_empty")


def _mutate_held_map(self: Driver, reading: Any, item: int) -> None:
    listed = [k for k, v in reading.items() if isinstance(v, list)]
    if listed:  # the dict's own lists: a shallow copy would share them
        self.mutate(self.on_state("map", "get", listed[0]), item)
    else:
        self.on_state("map", "put", "v", item)


def _load_map(self: Driver, key: Any) -> None:
    self.on_state("map", "put", "u", key)
    # a list in every loaded map state: a shallow copy of the state would share it
    self.on_state("map", "put", "w", [1])


def _fill_map(state: Any, round_: int, i: int, key: Any) -> None:
    if i % 4 != 3:
        state.put(f"u{i % 3}", {round_: i})


# --------------------------------------------------------------- reducing


def reducing_add(self: Driver, value: Any) -> None:
    self.on_state("reducing", "add", value)


def reducing_get(self: Driver) -> None:
    self.on_state("reducing", "get")


def _fill_reducing(state: Any, round_: int, i: int, key: Any) -> None:
    if i % 2 == 0:
        state.add(round_ * 100 + i)


# ------------------------------------------------------------ aggregating


def aggregating_add(self: Driver, value: int) -> None:
    self.on_state("aggregating", "add", value)


def aggregating_get(self: Driver) -> None:
    self.on_state("aggregating", "get")


def _fill_aggregating(state: Any, round_: int, i: int, key: Any) -> None:
    if i % 3 == 0:
        state.add(i)


#: Every kind, by its name (the name of its state in :attr:`KindSpec.descriptor`).
KINDS: Mapping[str, KindSpec] = MappingProxyType(
    {
        spec.descriptor.kind: spec
        for spec in (
            KindSpec(
                ValueStateDescriptor("value", default=[]),
                rules=(
                    MachineRule(value_update, value=values),
                    MachineRule(value_value_and_mutate, item=items),
                ),
                load=lambda m, key: m.on_state("value", "update", [key]),
                fill=_fill_value,
                mutate_held=lambda m, _, item: m.mutate(m.on_state("value", "value"), item),
            ),
            KindSpec(
                ListStateDescriptor("list"),
                rules=(
                    MachineRule(list_add, element=elements),
                    MachineRule(
                        list_add_all,
                        elements=lambda st: st.lists(
                            st.one_of(elements(st), st.none()), max_size=3
                        ),
                    ),
                    MachineRule(
                        list_update, elements=lambda st: st.lists(elements(st), max_size=3)
                    ),
                    MachineRule(list_get_and_mutate, item=items),
                ),
                load=lambda m, key: m.on_state("list", "add_all", [key, key]),
                fill=_fill_list,
                mutate_held=lambda m, _, item: m.mutate(m.on_state("list", "get"), item),
            ),
            KindSpec(
                MapStateDescriptor("map"),
                rules=(
                    MachineRule(map_put, user_key=user_keys, value=values),
                    MachineRule(map_get_and_mutate, user_key=user_keys, item=items),
                    MachineRule(map_remove, user_key=user_keys),
                    MachineRule(
                        map_contains,
                        user_key=lambda st: st.one_of(user_keys(st), st.just(["unhashable"])),
                    ),
                    MachineRule(map_items),
                ),
                load=_load_map,
                fill=_fill_map,
                mutate_held=_mutate_held_map,
            ),
            KindSpec(
                ReducingStateDescriptor("reducing", reduce_function=add_ints),
                rules=(
                    MachineRule(
                        reducing_add, value=lambda st: st.one_of(small_ints(st), st.none())
                    ),
                    MachineRule(reducing_get),
                ),
                load=lambda m, key: m.on_state("reducing", "add", 1),
                fill=_fill_reducing,
            ),
            KindSpec(
                AggregatingStateDescriptor("aggregating", aggregate_function=SumCount()),
                rules=(
                    MachineRule(aggregating_add, value=small_ints),
                    MachineRule(aggregating_get),
                ),
                load=lambda m, key: m.on_state("aggregating", "add", 2),
                fill=_fill_aggregating,
                mutate_held=lambda m, _, item: m.on_state("aggregating", "add", item),
            ),
        )
    }
)
