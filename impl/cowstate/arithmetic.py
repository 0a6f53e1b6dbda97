"""The pure arithmetic of the copy-on-write map, with checked contracts.

Every number the map computes about hashes, buckets, tables and versions is
defined once, here, as a small pure function. ``state_map`` calls these
functions; where a hot path inlines one (``h ^ (h >> 16)`` and ``h & mask`` in
``get``/``put``), the comment names the function and the structural checker
(``cowstate_spec.invariants``, invariant 1) recomputes the result from an
independent plain formulation after every step of the state machines.

Contracts are PEP 316 docstrings (``pre:`` / ``post:``; ``__return__`` is the
result), the style CrossHair reads: ``make crosshair`` (part of ``make test``)
searches symbolically for inputs that satisfy the preconditions and break a
postcondition. ``crosshair diffbehavior`` proves each function equal to the
plain version of it in ``cowstate_model.arithmetic`` (see CONTRIBUTING.md).
Contracts name invariants of the ``state_map`` module docstring.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_REMOVAL_LIMIT",
    "HASH_MASK",
    "HASH_MIX",
    "MAXIMUM_CAPACITY",
    "MAX_ARRAY_SIZE",
    "MAX_VERSION",
    "MINIMUM_CAPACITY",
    "MIN_TRANSFERRED_PER_INCREMENTAL_REHASH",
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

DEFAULT_CAPACITY = 128
MINIMUM_CAPACITY = 4
MAXIMUM_CAPACITY = 1 << 30
MIN_TRANSFERRED_PER_INCREMENTAL_REHASH = 4
#: Threshold at maximum capacity: the map stops growing and refuses entries past it.
MAX_ARRAY_SIZE = (1 << 31) - 1 - 8
#: Flink's versions are Java ints; the map refuses a snapshot past this one.
MAX_VERSION = (1 << 31) - 1
#: The removal log's default bound (rule D of :mod:`cowstate.state_map`):
#: records per map, i.e. per key group and state of a table. 4096 records are
#: about 0.5 MB with small keys; a key group that removes more between two
#: checkpoints gets a full one.
DEFAULT_REMOVAL_LIMIT = 4096
#: The odd 64-bit multiplier of :func:`composite_hash` (2**64 over the golden ratio).
HASH_MIX = 0x9E3779B97F4A7C15
#: Composite hashes are unsigned 64-bit numbers, as the C map computes them.
HASH_MASK = (1 << 64) - 1


# ----------------------------------------------------------------- hashing


def spread_hash(h: int) -> int:
    """Spread the high bits of ``h`` into the low ones, like ``java.util.HashMap``.

    Small non-negative hashes (``0 <= h < 2**16``) stay themselves, so a key
    whose hash is its value lands in bucket ``value & (n - 1)``. The result is
    never negative: ``h`` and ``h >> 16`` have the same sign.

    post: __return__ >= 0
    post: __return__ ^ (h >> 16) == h
    post: not (0 <= h < 65536) or __return__ == h
    """
    return h ^ (h >> 16)


def composite_hash(key: Hashable, namespace: Hashable) -> int:
    """The hash of a composite key ``(key, namespace)`` (invariant 1).

    ``hash(key) * HASH_MIX + hash(namespace)`` modulo ``2**64``, then spread.
    Flink XORs the two Java hash codes, which is 0 whenever key and namespace
    are equal and the same for a swapped pair, so every ``(x, x)`` mapping
    shared one chain; the odd multiplier keeps equal and swapped pairs apart
    (they collide only when the hashes differ by a multiple of ``2**62``).
    Key groups are unaffected: they hash the key alone. Raises ``TypeError``
    for an unhashable key or namespace.
    """
    return spread_hash((hash(key) * HASH_MIX + hash(namespace)) & HASH_MASK)


def bucket_index(h: int, capacity: int) -> int:
    """The bucket of hash ``h`` in a table of ``capacity`` buckets (invariant 1).

    pre: capacity > 0 and capacity & (capacity - 1) == 0
    post: 0 <= __return__ < capacity
    post: __return__ == h % capacity
    """
    return h & (capacity - 1)


# ----------------------------------------------------------------- rehash


def in_rehash_table(h: int, capacity: int, rehash_index: int) -> bool:
    """Active-table selection while rehashing at ``rehash_index`` (invariant 2).

    True when the mapping of hash ``h`` lives in the rehash table: its primary
    bucket was already moved. At index 0 nothing has moved.

    pre: capacity > 0 and capacity & (capacity - 1) == 0
    pre: 0 <= rehash_index <= capacity
    post: __return__ == (h % capacity < rehash_index)
    post: rehash_index != 0 or not __return__
    post: rehash_index != capacity or __return__
    """
    return bucket_index(h, capacity) < rehash_index


def rehash_destination(h: int, capacity: int) -> int:
    """The bucket of the rehash table (``2 * capacity`` buckets) that receives
    the entry of hash ``h`` from old bucket ``j``: ``j`` or ``j + capacity``.

    pre: capacity > 0 and capacity & (capacity - 1) == 0
    post: __return__ in (h % capacity, h % capacity + capacity)
    post: __return__ == bucket_index(h, 2 * capacity)
    """
    return h & (2 * capacity - 1)


# ----------------------------------------------------------------- sizing


def clamp_capacity(requested: int) -> int:
    """The capacity a map asked for ``requested`` buckets gets (invariant 9):
    the smallest power of two ``>= requested`` within
    ``[MINIMUM_CAPACITY, MAXIMUM_CAPACITY]``.

    post: MINIMUM_CAPACITY <= __return__ <= MAXIMUM_CAPACITY
    post: __return__ & (__return__ - 1) == 0
    post: requested > MAXIMUM_CAPACITY or __return__ >= requested
    post: requested <= MINIMUM_CAPACITY or __return__ < 2 * requested
    """
    if requested <= MINIMUM_CAPACITY:
        return MINIMUM_CAPACITY
    if requested >= MAXIMUM_CAPACITY:
        return MAXIMUM_CAPACITY
    return 1 << (requested - 1).bit_length()


def threshold_for(capacity: int) -> int:
    """Entries a table of ``capacity`` holds before it doubles: load factor
    3/4; at the maximum capacity the map stops growing (invariant 9).

    pre: MINIMUM_CAPACITY <= capacity <= MAXIMUM_CAPACITY
    pre: capacity & (capacity - 1) == 0
    post: capacity == MAXIMUM_CAPACITY or __return__ == capacity * 3 // 4
    post: capacity != MAXIMUM_CAPACITY or __return__ == MAX_ARRAY_SIZE
    post: capacity == MAXIMUM_CAPACITY or 0 < __return__ < capacity
    """
    if capacity >= MAXIMUM_CAPACITY:
        return MAX_ARRAY_SIZE
    return (capacity >> 1) + (capacity >> 2)


# ----------------------------------------------------------------- versions


def highest_required_version(open_versions: frozenset[int] | set[int]) -> int:
    """``H``: the highest open snapshot version, 0 when none is open (invariant 5).

    pre: all(v > 0 for v in open_versions)
    post: (__return__ == 0) == (len(open_versions) == 0)
    post: __return__ == 0 or __return__ in open_versions
    post: all(v <= __return__ for v in open_versions)
    """
    return max(open_versions) if open_versions else 0


def open_snapshot_version(
    version: int, open_versions: frozenset[int]
) -> tuple[int, frozenset[int]]:
    """The map version and open set after ``snapshot()`` (invariant 5): the new
    snapshot gets ``version + 1``, which becomes the highest required version.

    pre: version >= 0
    pre: all(0 < v <= version for v in open_versions)
    post: __return__[0] == version + 1
    post: __return__[1] == open_versions | {version + 1}
    post: highest_required_version(__return__[1]) == version + 1
    """
    new_version = version + 1
    return new_version, open_versions | {new_version}


def release_snapshot_version(open_versions: frozenset[int], version: int) -> frozenset[int]:
    """The open set after releasing snapshot ``version`` (invariant 5).

    pre: version in open_versions
    post: version not in __return__
    post: __return__ | {version} == open_versions
    post: highest_required_version(__return__) <= highest_required_version(open_versions)
    """
    return open_versions - {version}


# ----------------------------------------------------------------- snapshots


def snapshot_layout(
    primary: Sequence[V | None], rehash: Sequence[V | None] | None, r: int, size: int
) -> list[V | None]:
    """The snapshot's copy of the bucket list(s), in Flink's compact layout.

    Not rehashing: a copy of ``primary`` padded with ``None`` to ``size``.
    Rehashing at index ``r`` with ``L`` primary buckets: the unmoved primary
    buckets ``primary[r:L]``, then both halves of the moved part of the
    rehash table, ``rehash[0:r]`` and ``rehash[L:L+r]``, padded to
    ``max(r + L, size)`` slots. Every bucket that can hold an entry appears
    exactly once, as the same object (not a copy).

    pre: size >= 0
    pre: rehash is not None or r == 0
    pre: rehash is None or (len(rehash) == 2 * len(primary) and 0 <= r < len(primary))
    post: len(__return__) == max(len(primary) + r, size)
    post: all(x is None for x in __return__[len(primary) + r:])
    post: rehash is not None or __return__[:len(primary)] == list(primary)
    post: rehash is None or __return__[:len(primary) - r] == list(primary[r:])
    post: rehash is None or all(__return__[len(primary) - r + j] is rehash[j] for j in range(r))
    post: rehash is None or __return__[len(primary):][:r] == list(rehash[len(primary):][:r])
    """
    capacity = len(primary)
    if rehash is None:
        out: list[V | None] = list(primary)
    else:
        out = [*primary[r:], *rehash[:r], *rehash[capacity : capacity + r]]
    missing = size - len(out)
    if missing > 0:
        out.extend([None] * missing)
    return out
