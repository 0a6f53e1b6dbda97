"""Every implementation the specification checks.

Adding an implementation to the whole suite costs one line in
:data:`IMPLEMENTATIONS`: a name, a factory, and the structural checker for its
internals (or ``None`` when it has no internals worth checking).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from cowstate.key_groups import KeyGroupRange
from cowstate.maps import c_map_class
from cowstate.nested_table import NestedMapsStateTable
from cowstate.serializers import PickleSerializer
from cowstate.state_map import CopyOnWriteStateMap
from cowstate.state_table import CopyOnWriteStateTable, MapFactory, StateTable
from cowstate_model import ReferenceStateMap
from cowstate_model.state_table import ReferenceStateTable
from cowstate_spec.invariants import (
    SnapshotFingerprint,
    TableFingerprint,
    check_map,
    check_table,
    fingerprint,
    rehash_step_check,
    table_fingerprint,
)

Checker = Callable[[Any, Sequence[Any]], None]
Fingerprinter = Callable[..., SnapshotFingerprint | TableFingerprint]
#: Called before a keyed operation; what it returns is called after it succeeded.
StepChecker = Callable[[Any], Callable[[], None]]


@dataclass(frozen=True)
class Implementation:
    """How to make one implementation and how to check its internals.

    ``factory(**options)`` makes a fresh, empty instance; the only option is
    ``initial_capacity`` (implementations without one ignore it). ``model()``
    makes the reference it is compared with: the plain map, or for a state
    table the reference table of the same key groups (``table`` is then
    true and the state machine adds the key-group rules). ``check`` asserts
    the structural invariants, ``fingerprint`` records what an open snapshot
    reaches, ``step_check`` watches one keyed operation (rehash progress);
    each is ``None`` where the implementation has no such internals.
    """

    name: str
    factory: Callable[..., Any]
    check: Checker | None = None
    fingerprint: Fingerprinter | None = None
    step_check: StepChecker | None = None
    model: Callable[[], Any] = ReferenceStateMap
    table: bool = False

    def create(self, initial_capacity: int | None = None) -> Any:
        """A fresh instance, with ``initial_capacity`` if given."""
        if initial_capacity is None:
            return self.factory()
        return self.factory(initial_capacity=initial_capacity)

    def __repr__(self) -> str:
        return self.name


def _cow(name: str, capacity: int, cls: type[Any] = CopyOnWriteStateMap) -> Implementation:
    def factory(initial_capacity: int = capacity) -> Any:
        return cls(initial_capacity=initial_capacity)

    return Implementation(name, factory, check_map, fingerprint, rehash_step_check)


#: The C map (cowstate._cmap), or None where it was not built; a test fails
#: then unless COWSTATE_PURE_PYTHON=1 (tests/test_implementations.py).
C_MAP = c_map_class()


class PureMapsTable(CopyOnWriteStateTable[Any, Any, Any]):
    """A copy-on-write table over pure-Python maps, whatever the default is."""

    map_class = CopyOnWriteStateMap


class CMapsTable(CopyOnWriteStateTable[Any, Any, Any]):
    """A copy-on-write table over C maps (used only where C_MAP was built)."""

    map_class = cast(MapFactory, C_MAP if C_MAP is not None else CopyOnWriteStateMap)


#: The tables' key groups: 8 in all; the sub-range tables hold 1..6, so a
#: third of the spec's keys (2, 4, 8, HashKey(3, 0), ...) are refused.
TABLE_MAX_PARALLELISM = 8
SUB_RANGE = KeyGroupRange(1, 6)
#: The tables' key serializer: the spec's keys include ``HashKey``s, user
#: objects the default serializer refuses, so the tables hash them (and would
#: write them) with pickle -- in-process, trusted; the models hash the same bytes.
TABLE_KEY_SERIALIZER = PickleSerializer()


def _table(
    name: str, cls: type[StateTable[Any, Any, Any]], key_groups: KeyGroupRange | None, checked: bool
) -> Implementation:
    def factory(initial_capacity: int = 4) -> StateTable[Any, Any, Any]:
        return cls(
            key_groups,
            TABLE_MAX_PARALLELISM,
            initial_capacity=initial_capacity,
            key_serializer=TABLE_KEY_SERIALIZER,
        )

    def model() -> ReferenceStateTable:
        return ReferenceStateTable(
            key_groups, TABLE_MAX_PARALLELISM, key_serializer=TABLE_KEY_SERIALIZER.serialize
        )

    return Implementation(
        name, factory, check_table, table_fingerprint if checked else None, model=model, table=True
    )


IMPLEMENTATIONS: list[Implementation] = [
    _cow("cow-map", 4),  # tiny table: rehashes start while snapshots are open
    _cow("cow-map-128", 128),  # Flink's default capacity
    Implementation("reference-model", ReferenceStateMap),  # the model against itself
    _table("cow-table", PureMapsTable, None, checked=True),
    _table("cow-table-sub-range", PureMapsTable, SUB_RANGE, checked=True),
    _table("nested-table", NestedMapsStateTable, None, checked=False),
    _table("nested-table-sub-range", NestedMapsStateTable, SUB_RANGE, checked=False),
]
if C_MAP is not None:  # the C map and tables over it: the same spec, one line each
    IMPLEMENTATIONS += [
        _cow("c-map", 4, C_MAP),
        _cow("c-map-128", 128, C_MAP),
        _table("c-table", CMapsTable, None, checked=True),
        _table("c-table-sub-range", CMapsTable, SUB_RANGE, checked=True),
    ]


def by_name(name: str) -> Implementation:
    """The implementation called ``name``: one of :data:`IMPLEMENTATIONS`, or
    ``bad-<bug>`` for a deliberately broken map of
    :mod:`cowstate_spec.bad_implementations` (so executors can rebuild it)."""
    for implementation in IMPLEMENTATIONS:
        if implementation.name == name:
            return implementation
    from cowstate_spec.bad_implementations import BUGS, bad_implementation

    for bug in BUGS:
        if name == f"bad-{bug.name}":
            return bad_implementation(bug)
    known = ", ".join(i.name for i in IMPLEMENTATIONS)
    raise KeyError(f"expected one of {known} or bad-<bug>, got {name!r}")
