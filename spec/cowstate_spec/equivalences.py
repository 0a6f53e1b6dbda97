"""Pairs of functions CrossHair must prove equal (``crosshair diffbehavior``).

Each pair puts an optimized helper of ``cowstate.arithmetic`` (``fast_*``)
beside its plain statement in ``cowstate_model.arithmetic`` (``plain_*``),
over the inputs the map can give it: both sides share one guard, which
returns ``None`` outside the domain (a capacity that is not a power of two,
a rehash index outside the table), so a difference can only come from the
helpers themselves. Keys are ints so that hashing stays symbolic.

:data:`PAIRS` lists them for ``cowstate_spec.symbolic``.
"""

from __future__ import annotations

import cowstate.arithmetic as fast
import cowstate_model.arithmetic as plain

__all__ = ["PAIRS"]


def _is_capacity(capacity: int) -> bool:
    return 0 < capacity <= plain.MAXIMUM_CAPACITY and capacity & (capacity - 1) == 0


def fast_spread_hash(h: int) -> int:
    return fast.spread_hash(h)


def plain_spread_hash(h: int) -> int:
    return plain.spread_hash(h)


def fast_composite_hash(key: int, namespace: int) -> int:
    return fast.composite_hash(key, namespace)


def plain_composite_hash(key: int, namespace: int) -> int:
    return plain.composite_hash(key, namespace)


def fast_bucket_index(h: int, capacity: int) -> int | None:
    return fast.bucket_index(h, capacity) if _is_capacity(capacity) else None


def plain_bucket_index(h: int, capacity: int) -> int | None:
    return plain.bucket_index(h, capacity) if _is_capacity(capacity) else None


def fast_in_rehash_table(h: int, capacity: int, r: int) -> bool | None:
    if not (_is_capacity(capacity) and 0 <= r <= capacity):
        return None
    return fast.in_rehash_table(h, capacity, r)


def plain_in_rehash_table(h: int, capacity: int, r: int) -> bool | None:
    if not (_is_capacity(capacity) and 0 <= r <= capacity):
        return None
    return plain.in_rehash_table(h, capacity, r)


def fast_rehash_destination(h: int, capacity: int) -> int | None:
    return fast.rehash_destination(h, capacity) if _is_capacity(capacity) else None


def plain_rehash_destination(h: int, capacity: int) -> int | None:
    return plain.rehash_destination(h, capacity) if _is_capacity(capacity) else None


def fast_clamp_capacity(requested: int) -> int:
    return fast.clamp_capacity(requested)


def plain_clamp_capacity(requested: int) -> int:
    return plain.clamp_capacity(requested)


def fast_threshold_for(capacity: int) -> int | None:
    if not (_is_capacity(capacity) and capacity >= plain.MINIMUM_CAPACITY):
        return None
    return fast.threshold_for(capacity)


def plain_threshold_for(capacity: int) -> int | None:
    if not (_is_capacity(capacity) and capacity >= plain.MINIMUM_CAPACITY):
        return None
    return plain.threshold_for(capacity)


def fast_highest_required_version(open_versions: frozenset[int]) -> int | None:
    if not all(v > 0 for v in open_versions):
        return None
    return fast.highest_required_version(open_versions)


def plain_highest_required_version(open_versions: frozenset[int]) -> int | None:
    if not all(v > 0 for v in open_versions):
        return None
    return plain.highest_required_version(open_versions)


def fast_open_snapshot_version(version: int, open_versions: frozenset[int]
                               ) -> tuple[int, frozenset[int]] | None:
    if not (version >= 0 and all(0 < v <= version for v in open_versions)):
        return None
    return fast.open_snapshot_version(version, open_versions)


def plain_open_snapshot_version(version: int, open_versions: frozenset[int]
                                ) -> tuple[int, frozenset[int]] | None:
    if not (version >= 0 and all(0 < v <= version for v in open_versions)):
        return None
    return plain.open_snapshot_version(version, open_versions)


def fast_release_snapshot_version(open_versions: frozenset[int],
                                  version: int) -> frozenset[int] | None:
    return fast.release_snapshot_version(open_versions, version) \
        if version in open_versions else None


def plain_release_snapshot_version(open_versions: frozenset[int],
                                   version: int) -> frozenset[int] | None:
    return plain.release_snapshot_version(open_versions, version) \
        if version in open_versions else None


def _layout_domain(primary: list[int], rehash: list[int] | None, r: int,
                   size: int) -> bool:
    if size < 0:
        return False
    if rehash is None:
        return r == 0
    return len(rehash) == 2 * len(primary) and 0 <= r < len(primary)


def fast_snapshot_layout(primary: list[int], rehash: list[int] | None, r: int,
                         size: int) -> list[int | None] | None:
    if not _layout_domain(primary, rehash, r, size):
        return None
    return fast.snapshot_layout(primary, rehash, r, size)


def plain_snapshot_layout(primary: list[int], rehash: list[int] | None, r: int,
                          size: int) -> list[int | None] | None:
    if not _layout_domain(primary, rehash, r, size):
        return None
    return plain.snapshot_layout(primary, rehash, r, size)


#: (what is compared, fast function, plain function), by qualified name.
PAIRS: list[tuple[str, str, str]] = [
    (name, f"{__name__}.fast_{name}", f"{__name__}.plain_{name}")
    for name in ("spread_hash", "composite_hash", "bucket_index", "in_rehash_table",
                 "rehash_destination", "clamp_capacity", "threshold_for",
                 "highest_required_version", "open_snapshot_version",
                 "release_snapshot_version", "snapshot_layout")
]
