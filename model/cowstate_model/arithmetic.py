"""The map's arithmetic, said the obvious way.

Each function here means the same as its namesake in ``cowstate.arithmetic``
but is written for the reader, not for speed: division and remainder instead
of shifts and masks, loops instead of slicing. ``crosshair diffbehavior``
proves each pair equal (``cowstate_spec.symbolic``), and the structural
checker (``cowstate_spec.invariants``) judges the map with these, so a wrong
helper in the implementation cannot also blind the checker.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

__all__ = [
    "HASH_MIX",
    "MAXIMUM_CAPACITY",
    "MAX_ARRAY_SIZE",
    "MINIMUM_CAPACITY",
    "bucket_index",
    "clamp_capacity",
    "composite_hash",
    "highest_required_version",
    "in_rehash_table",
    "open_snapshot_version",
    "rehash_destination",
    "release_snapshot_version",
    "snapshot_layout",
    "spread_hash",
    "threshold_for",
]

V = TypeVar("V")

MINIMUM_CAPACITY = 4
#: The golden-ratio multiplier of composite hashes: the closest odd number to 2**64 / phi.
HASH_MIX = 11400714819323198485
MAXIMUM_CAPACITY = 2**30
MAX_ARRAY_SIZE = 2**31 - 1 - 8


def spread_hash(h: int) -> int:
    """``h`` XOR ``h`` divided by 2**16, rounded down."""
    return h ^ (h // 65536)


def composite_hash(key: Hashable, namespace: Hashable) -> int:
    """The key's hash times the golden-ratio constant plus the namespace's hash,
    as an unsigned 64-bit number (the remainder modulo 2**64), spread."""
    return spread_hash((hash(key) * HASH_MIX + hash(namespace)) % 2**64)


def bucket_index(h: int, capacity: int) -> int:
    """The remainder of ``h`` divided by the capacity."""
    return h % capacity


def in_rehash_table(h: int, capacity: int, rehash_index: int) -> bool:
    """True when the old bucket of ``h`` comes before the rehash index."""
    return bucket_index(h, capacity) < rehash_index


def rehash_destination(h: int, capacity: int) -> int:
    """The bucket of ``h`` in the table twice as large."""
    return bucket_index(h, 2 * capacity)


def clamp_capacity(requested: int) -> int:
    """Double from the minimum capacity until ``requested`` fits or the maximum is reached."""
    capacity = MINIMUM_CAPACITY
    while capacity < requested and capacity < MAXIMUM_CAPACITY:
        capacity *= 2
    return capacity


def threshold_for(capacity: int) -> int:
    """Three quarters of the capacity; at the maximum capacity, the array limit."""
    if capacity >= MAXIMUM_CAPACITY:
        return MAX_ARRAY_SIZE
    return capacity * 3 // 4


def highest_required_version(open_versions: frozenset[int] | set[int]) -> int:
    """The largest open version, or 0."""
    highest = 0
    for v in open_versions:
        if v > highest:
            highest = v
    return highest


def open_snapshot_version(
    version: int, open_versions: frozenset[int]
) -> tuple[int, frozenset[int]]:
    """The next version, added to the open ones."""
    return version + 1, frozenset([*open_versions, version + 1])


def release_snapshot_version(open_versions: frozenset[int], version: int) -> frozenset[int]:
    """The open versions without ``version``."""
    return frozenset(v for v in open_versions if v != version)


def snapshot_layout(
    primary: Sequence[V | None], rehash: Sequence[V | None] | None, r: int, size: int
) -> list[V | None]:
    """Collect the buckets that can hold entries, one by one, then pad with None."""
    out: list[V | None] = []
    if rehash is None:
        for bucket in primary:
            out.append(bucket)
    else:
        capacity = len(primary)
        for j in range(r, capacity):  # old buckets not yet moved
            out.append(primary[j])
        for j in range(r):  # moved: the low half of their destinations
            out.append(rehash[j])
        for j in range(r):  # moved: the high half
            out.append(rehash[capacity + j])
    while len(out) < size:
        out.append(None)
    return out
