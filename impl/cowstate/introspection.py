"""Read-only introspection of a map's internals, for tests and benchmarks.

Not part of the state API: nothing here changes a map, and the numbers it
reports (capacity, rehash progress, versions) are implementation details.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cowstate.state_map import CopyOnWriteStateMap

__all__ = ["MapInternals", "describe"]


@dataclass(frozen=True)
class MapInternals:
    """A copy of a map's bookkeeping at one moment."""

    capacity: int
    rehash_capacity: int
    is_rehashing: bool
    rehash_index: int
    primary_size: int
    rehash_size: int
    threshold: int
    version: int
    highest_required_version: int
    open_versions: frozenset[int]


def describe(m: Any) -> MapInternals:
    """The bookkeeping of ``m``, a pure or C map (see the invariants in
    :mod:`cowstate.state_map`)."""
    if not isinstance(m, CopyOnWriteStateMap):  # the C map: its read-only bookkeeping
        st = m._bookkeeping()
        return MapInternals(
            capacity=st["capacity"],
            rehash_capacity=st["rehash_capacity"],
            is_rehashing=st["is_rehashing"],
            rehash_index=st["rehash_index"],
            primary_size=st["primary_size"],
            rehash_size=st["rehash_size"],
            threshold=st["threshold"],
            version=st["version"],
            highest_required_version=st["highest_required"],
            open_versions=frozenset(st["open_versions"]),
        )
    rehash = m._rehash
    return MapInternals(
        capacity=len(m._primary),
        rehash_capacity=0 if rehash is None else len(rehash),
        is_rehashing=rehash is not None,
        rehash_index=m._rehash_index,
        primary_size=m._primary_size,
        rehash_size=m._rehash_size,
        threshold=m._threshold,
        version=m._version,
        highest_required_version=m._highest_required,
        open_versions=frozenset(m._open_versions),
    )
