"""Pairs of functions CrossHair must prove equal (``crosshair diffbehavior``).

Each pair puts an optimized helper of ``cowstate.arithmetic`` or
``cowstate.key_groups`` (``fast_*``) beside its plain statement in
``cowstate_model.arithmetic`` or ``cowstate_model.key_groups`` (``plain_*``),
over the inputs the map can give it: both sides share one guard, which
returns ``None`` outside the domain (a capacity that is not a power of two,
a rehash index outside the table, a hash outside int32, a parallelism
outside ``1..32768``), so a difference can only come from the helpers
themselves. Keys are ints so that hashing stays symbolic.

:data:`PAIRS` lists them for ``cowstate_spec.symbolic``.
"""

from __future__ import annotations

import cowstate.arithmetic as fast
import cowstate.key_groups as fast_kg
import cowstate_model.arithmetic as plain
import cowstate_model.key_groups as plain_kg

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


def fast_open_snapshot_version(
    version: int, open_versions: frozenset[int]
) -> tuple[int, frozenset[int]] | None:
    if not (version >= 0 and all(0 < v <= version for v in open_versions)):
        return None
    return fast.open_snapshot_version(version, open_versions)


def plain_open_snapshot_version(
    version: int, open_versions: frozenset[int]
) -> tuple[int, frozenset[int]] | None:
    if not (version >= 0 and all(0 < v <= version for v in open_versions)):
        return None
    return plain.open_snapshot_version(version, open_versions)


def fast_release_snapshot_version(
    open_versions: frozenset[int], version: int
) -> frozenset[int] | None:
    return (
        fast.release_snapshot_version(open_versions, version) if version in open_versions else None
    )


def plain_release_snapshot_version(
    open_versions: frozenset[int], version: int
) -> frozenset[int] | None:
    return (
        plain.release_snapshot_version(open_versions, version) if version in open_versions else None
    )


def _layout_domain(primary: list[int], rehash: list[int] | None, r: int, size: int) -> bool:
    if size < 0:
        return False
    if rehash is None:
        return r == 0
    return len(rehash) == 2 * len(primary) and 0 <= r < len(primary)


def fast_snapshot_layout(
    primary: list[int], rehash: list[int] | None, r: int, size: int
) -> list[int | None] | None:
    if not _layout_domain(primary, rehash, r, size):
        return None
    return fast.snapshot_layout(primary, rehash, r, size)


def plain_snapshot_layout(
    primary: list[int], rehash: list[int] | None, r: int, size: int
) -> list[int | None] | None:
    if not _layout_domain(primary, rehash, r, size):
        return None
    return plain.snapshot_layout(primary, rehash, r, size)


# ------------------------------------------------------------------ key groups

#: The longest string ``java_string_hash`` is compared on: every code unit
#: costs CrossHair a nonlinear step, and the hash of a longer string is the
#: same polynomial again.
MAX_STRING_LENGTH = 4


def _is_int32(x: int) -> bool:
    return plain_kg.INT_MIN <= x <= plain_kg.INT_MAX


def _is_parallelism(max_parallelism: int, parallelism: int) -> bool:
    return 0 < parallelism <= max_parallelism <= plain_kg.UPPER_BOUND_MAX_PARALLELISM


def fast_bit_mix(x: int) -> int | None:
    return fast_kg.bit_mix(x) if _is_int32(x) else None


def plain_bit_mix(x: int) -> int | None:
    return plain_kg.bit_mix(x) if _is_int32(x) else None


def fast_murmur_hash(code: int) -> int | None:
    return fast_kg.murmur_hash(code) if _is_int32(code) else None


def plain_murmur_hash(code: int) -> int | None:
    return plain_kg.murmur_hash(code) if _is_int32(code) else None


def fast_java_string_hash(s: str) -> int | None:
    return fast_kg.java_string_hash(s) if len(s) <= MAX_STRING_LENGTH else None


def plain_java_string_hash(s: str) -> int | None:
    return plain_kg.java_string_hash(s) if len(s) <= MAX_STRING_LENGTH else None


def _is_key_group_domain(key: int, max_parallelism: int) -> bool:
    return (
        plain_kg.LONG_MIN <= key <= plain_kg.LONG_MAX
        and 0 < max_parallelism <= plain_kg.UPPER_BOUND_MAX_PARALLELISM
    )


def fast_assign_to_key_group(key: int, max_parallelism: int) -> int | None:
    if not _is_key_group_domain(key, max_parallelism):
        return None
    return fast_kg.assign_to_key_group(key, max_parallelism)


def plain_assign_to_key_group(key: int, max_parallelism: int) -> int | None:
    if not _is_key_group_domain(key, max_parallelism):
        return None
    return plain_kg.assign_to_key_group(key, max_parallelism)


def fast_compute_key_group_range_for_operator_index(
    max_parallelism: int, parallelism: int, operator_index: int
) -> tuple[int, int] | None:
    if not (_is_parallelism(max_parallelism, parallelism) and 0 <= operator_index < parallelism):
        return None
    kg_range = fast_kg.compute_key_group_range_for_operator_index(
        max_parallelism, parallelism, operator_index
    )
    return kg_range.start_key_group, kg_range.end_key_group


def plain_compute_key_group_range_for_operator_index(
    max_parallelism: int, parallelism: int, operator_index: int
) -> tuple[int, int] | None:
    if not (_is_parallelism(max_parallelism, parallelism) and 0 <= operator_index < parallelism):
        return None
    return plain_kg.compute_key_group_range_for_operator_index(
        max_parallelism, parallelism, operator_index
    )


def fast_compute_operator_index_for_key_group(
    max_parallelism: int, parallelism: int, key_group: int
) -> int | None:
    if not (_is_parallelism(max_parallelism, parallelism) and 0 <= key_group < max_parallelism):
        return None
    return fast_kg.compute_operator_index_for_key_group(max_parallelism, parallelism, key_group)


def plain_compute_operator_index_for_key_group(
    max_parallelism: int, parallelism: int, key_group: int
) -> int | None:
    if not (_is_parallelism(max_parallelism, parallelism) and 0 <= key_group < max_parallelism):
        return None
    return plain_kg.compute_operator_index_for_key_group(max_parallelism, parallelism, key_group)


#: (what is compared, fast function, plain function), by qualified name.
PAIRS: list[tuple[str, str, str]] = [
    (name, f"{__name__}.fast_{name}", f"{__name__}.plain_{name}")
    for name in (
        "spread_hash",
        "composite_hash",
        "bucket_index",
        "in_rehash_table",
        "rehash_destination",
        "clamp_capacity",
        "threshold_for",
        "highest_required_version",
        "open_snapshot_version",
        "release_snapshot_version",
        "snapshot_layout",
        "bit_mix",
        "murmur_hash",
        "java_string_hash",
        "assign_to_key_group",
        "compute_key_group_range_for_operator_index",
        "compute_operator_index_for_key_group",
    )
]
