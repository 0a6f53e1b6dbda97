"""The state kinds: one table in the library, one in the model, one in the spec.

``cowstate.kinds.KINDS`` (descriptor, handle, what a restored state holds),
``cowstate_model.kinds.KINDS`` (the model's handles) and
``cowstate_spec.kinds.KINDS`` (the state the machines register, their rules)
must name the same kinds, and every ``StateKind`` member: a kind missing from
one fails here with the file to edit. The rest pins what the other modules
read from the library's table: ``get_state``'s handles and refusals, and the
public names of every kind.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest
from hypothesis.stateful import RuleBasedStateMachine, rule

import cowstate
import cowstate.kinds
import cowstate_model.kinds
import cowstate_spec.kinds
from cowstate.descriptors import ListState, StateDescriptor, StateKind
from cowstate.errors import InvalidArgumentError
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import KeyGroupRange
from cowstate.keyed_state import KeyedState
from cowstate_model.backend import ReferenceKeyedStateBackend
from cowstate_spec.backend_machine import BackendMachine, with_kind_rules
from cowstate_spec.backends import BACKENDS, DESCRIPTORS, BackendImplementation

ROOT = Path(__file__).resolve().parent.parent
KINDS = [kind.value for kind in StateKind]
#: A kind first, in the middle and last.
POSITIONS = pytest.mark.parametrize(
    "position", [0, len(KINDS) // 2, len(KINDS) - 1], ids=["first", "middle", "last"]
)


def path_of(module: ModuleType) -> str:
    """The file to edit for ``module``, from the repository's root."""
    assert module.__file__ is not None
    return Path(module.__file__).resolve().relative_to(ROOT).as_posix()


#: Each table's file, and the kinds it names.
TABLES: dict[str, list[str]] = {
    path_of(cowstate.kinds): list(cowstate.kinds.KINDS),
    path_of(cowstate_model.kinds): list(cowstate_model.kinds.KINDS),
    path_of(cowstate_spec.kinds): list(cowstate_spec.kinds.KINDS),
}


def kind_table_gaps(declared: Collection[str], tables: Mapping[str, Collection[str]]) -> list[str]:
    """Every kind that ``StateKind`` declares or a table names, missing from a
    table or from ``StateKind``: one message each, naming the file to edit."""
    gaps: list[str] = []
    named = [kind for kinds in tables.values() for kind in kinds]
    for kind in dict.fromkeys([*declared, *named]):
        if kind not in declared:
            gaps.append(
                f"kind {kind!r} is not a StateKind member: declare it in "
                f"{path_of(cowstate.descriptors)} with its descriptor and handle"
            )
        gaps.extend(
            f"kind {kind!r} has no row in {path} (CONTRIBUTING.md, 'Adding a state kind')"
            for path, kinds in tables.items()
            if kind not in kinds
        )
    return gaps


def test_the_library_model_and_spec_tables_name_every_kind() -> None:
    assert kind_table_gaps(KINDS, TABLES) == []
    assert KINDS[:5] == ["value", "list", "map", "reducing", "aggregating"]


@pytest.mark.parametrize("table", sorted(TABLES))
@POSITIONS
def test_a_kind_missing_from_one_table_names_that_file(table: str, position: int) -> None:
    missing = KINDS[position]
    tables = {
        path: [k for k in kinds if path != table or k != missing] for path, kinds in TABLES.items()
    }
    assert kind_table_gaps(KINDS, tables) == [
        f"kind {missing!r} has no row in {table} (CONTRIBUTING.md, 'Adding a state kind')"
    ]


@POSITIONS
def test_a_kind_missing_from_state_kind_names_the_descriptors_module(position: int) -> None:
    missing = KINDS[position]
    declared = [k for k in KINDS if k != missing]
    assert kind_table_gaps(declared, TABLES) == [
        f"kind {missing!r} is not a StateKind member: declare it in "
        "impl/cowstate/descriptors.py with its descriptor and handle"
    ]


def test_a_table_with_another_kind_instead_of_one_is_two_gaps() -> None:
    model = path_of(cowstate_model.kinds)
    tables = {**TABLES, model: [*KINDS[:2], "bag", *KINDS[3:]]}  # the same count
    assert kind_table_gaps(KINDS, tables) == [
        f"kind 'map' has no row in {model} (CONTRIBUTING.md, 'Adding a state kind')",
        "kind 'bag' is not a StateKind member: declare it in impl/cowstate/descriptors.py "
        "with its descriptor and handle",
        f"kind 'bag' has no row in {path_of(cowstate.kinds)} (CONTRIBUTING.md, "
        "'Adding a state kind')",
        f"kind 'bag' has no row in {path_of(cowstate_spec.kinds)} (CONTRIBUTING.md, "
        "'Adding a state kind')",
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_each_row_is_its_descriptors_kind_and_handle(kind: str) -> None:
    row = cowstate.kinds.KINDS[kind]
    assert row.kind is StateKind(kind)
    assert row.descriptor.kind == kind and type(row.descriptor.kind) is str
    assert row.handle is row.descriptor.handle
    assert issubclass(row.handle, KeyedState) and row.handle is not KeyedState
    spec = cowstate_spec.kinds.KINDS[kind]
    assert (spec.descriptor.name, spec.descriptor.kind) == (kind, kind)
    assert DESCRIPTORS[kind] is spec.descriptor


@pytest.mark.parametrize("kind", KINDS)
def test_each_kinds_descriptor_and_handle_are_public(kind: str) -> None:
    row = cowstate.kinds.KINDS[kind]
    for cls in (row.descriptor, row.handle):
        assert cls.__name__ in cowstate.__all__
        assert getattr(cowstate, cls.__name__) is cls


@pytest.mark.parametrize("implementation", BACKENDS, ids=lambda b: b.name)
def test_get_state_gives_the_handle_of_the_descriptors_row(
    implementation: BackendImplementation,
) -> None:
    backend = implementation.factory(KeyGroupRange(0, 7), 8)
    model = ReferenceKeyedStateBackend(range(8), 8)
    try:
        for kind, spec in cowstate_spec.kinds.KINDS.items():
            assert type(backend.get_state(spec.descriptor)) is cowstate.kinds.KINDS[kind].handle
            assert type(model.get_state(spec.descriptor)) is cowstate_model.kinds.KINDS[kind]
    finally:
        backend.close()


@dataclass(frozen=True)
class BagStateDescriptor(StateDescriptor):
    """A descriptor of a kind with no row in the table."""

    kind: ClassVar[str] = "bag"


@dataclass(frozen=True)
class PlainListDescriptor(StateDescriptor):
    """A descriptor of the list kind that names no handle class of its own."""

    kind: ClassVar[str] = "list"


@pytest.mark.parametrize(
    ("descriptor", "got"),
    [(StateDescriptor("s"), "StateDescriptor"), (BagStateDescriptor("s"), "BagStateDescriptor")],
)
def test_get_state_refuses_a_descriptor_whose_kind_has_no_row(
    descriptor: StateDescriptor, got: str
) -> None:
    with HeapKeyedStateBackend(KeyGroupRange(0, 7), 8) as backend:
        with pytest.raises(InvalidArgumentError) as refused:
            backend.get_state(descriptor)
        assert str(refused.value) == f"expected a state descriptor, got {got}"
        assert backend.state_names == []


def test_get_state_gives_the_rows_handle_for_a_descriptor_of_a_known_kind() -> None:
    with HeapKeyedStateBackend(KeyGroupRange(0, 7), 8) as backend:
        state: Any = backend.get_state(PlainListDescriptor("s"))
        assert type(state) is ListState
        backend.set_current_key(1)
        state.add(3)
        assert state.get() == [3]


def test_every_kinds_rules_are_backend_machine_rules_under_their_names() -> None:
    rules = {r.function.__name__: r for r in BackendMachine.setup_state().rules}
    for spec in cowstate_spec.kinds.KINDS.values():
        for kind_rule in spec.rules:
            assert rules[kind_rule.name].function is kind_rule.run
            assert set(rules[kind_rule.name].arguments) == set(kind_rule.arguments)


def test_a_kind_rule_named_like_a_machine_rule_is_refused() -> None:
    class Machine(RuleBasedStateMachine):
        @rule()
        def value_update(self) -> None:
            """Clashes with the value kind's rule of this name."""

    with pytest.raises(TypeError) as refused:
        with_kind_rules(Machine)
    assert str(refused.value) == (
        "expected a new rule name for the value kind's rule, got 'value_update', which "
        "Machine has already"
    )
