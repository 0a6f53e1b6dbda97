"""Every implementation the specification checks.

Adding an implementation to the whole suite costs one line in
:data:`IMPLEMENTATIONS`: a name, a factory, and the structural checker for its
internals (or ``None`` when it has no internals worth checking).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cowstate import CopyOnWriteStateMap
from cowstate_model import ReferenceStateMap
from cowstate_spec.invariants import (
    SnapshotFingerprint,
    check_map,
    fingerprint,
    rehash_step_check,
)

Checker = Callable[[Any, Sequence[SnapshotFingerprint]], None]
Fingerprinter = Callable[..., SnapshotFingerprint]
#: Called before a keyed operation; what it returns is called after it succeeded.
StepChecker = Callable[[Any], Callable[[], None]]


@dataclass(frozen=True)
class Implementation:
    """How to make one implementation and how to check its internals.

    ``factory(**options)`` makes a fresh, empty instance; the only option is
    ``initial_capacity`` (implementations without one ignore it). ``check``
    asserts the structural invariants, ``fingerprint`` records what an open
    snapshot reaches, ``step_check`` watches one keyed operation (rehash
    progress); each is ``None`` where the implementation has no such internals.
    """

    name: str
    factory: Callable[..., Any]
    check: Checker | None = None
    fingerprint: Fingerprinter | None = None
    step_check: StepChecker | None = None

    def create(self, initial_capacity: int | None = None) -> Any:
        """A fresh instance, with ``initial_capacity`` if given."""
        if initial_capacity is None:
            return self.factory()
        return self.factory(initial_capacity=initial_capacity)

    def __repr__(self) -> str:
        return self.name


def _cow(name: str, capacity: int) -> Implementation:
    def factory(initial_capacity: int = capacity) -> CopyOnWriteStateMap[Any, Any, Any]:
        return CopyOnWriteStateMap(initial_capacity=initial_capacity)

    return Implementation(name, factory, check_map, fingerprint, rehash_step_check)


IMPLEMENTATIONS: list[Implementation] = [
    _cow("cow-map", 4),          # tiny table: rehashes start while snapshots are open
    _cow("cow-map-128", 128),    # Flink's default capacity
    Implementation("reference-model", ReferenceStateMap),   # the model against itself
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
