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
from cowstate_spec.invariants import SnapshotFingerprint, check_map, fingerprint

Checker = Callable[[Any, Sequence[SnapshotFingerprint]], None]
Fingerprinter = Callable[[Any], SnapshotFingerprint]


@dataclass(frozen=True)
class Implementation:
    """How to make one implementation and how to check its internals."""

    name: str
    factory: Callable[[], Any]
    check: Checker | None = None
    fingerprint: Fingerprinter | None = None

    def __repr__(self) -> str:
        return self.name


def _cow(capacity: int) -> Implementation:
    return Implementation(f"cow-map-capacity-{capacity}",
                          lambda: CopyOnWriteStateMap(initial_capacity=capacity),
                          check_map, fingerprint)


IMPLEMENTATIONS: list[Implementation] = [
    _cow(4),          # tiny table: rehashes start while snapshots are open
    _cow(128),        # Flink's default capacity
    Implementation("reference-model", ReferenceStateMap),   # the model against itself
]


def by_name(name: str) -> Implementation:
    """The implementation called ``name`` (see :data:`IMPLEMENTATIONS`)."""
    for implementation in IMPLEMENTATIONS:
        if implementation.name == name:
            return implementation
    known = ", ".join(i.name for i in IMPLEMENTATIONS)
    raise KeyError(f"expected one of {known}, got {name!r}")
