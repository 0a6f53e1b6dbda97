"""The map's arithmetic (``cowstate.arithmetic``) equals its plain statement
(``cowstate_model.arithmetic``) and keeps its contracts, on random inputs.

CrossHair proves the same symbolically (``make crosshair``); these examples
run in every test run and in the mutation run.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import cowstate.arithmetic as fast
import cowstate_model.arithmetic as plain
from cowstate_spec.keys import HashKey, value_key

hashes = st.one_of(st.integers(-(2**63), 2**63), st.integers(-70_000, 70_000))
capacities = st.integers(2, 30).map(lambda k: 1 << k)
versions = st.frozensets(st.integers(1, 50), max_size=6)


@given(hashes)
def test_spread_hash(h: int) -> None:
    assert fast.spread_hash(h) == plain.spread_hash(h)
    assert fast.spread_hash(h) >= 0


@given(
    st.one_of(st.integers(), st.text(max_size=5), st.tuples(st.integers(), st.text())),
    st.one_of(st.integers(), st.text(max_size=5), st.none()),
)
def test_composite_hash(key: Any, namespace: Any) -> None:
    assert fast.composite_hash(key, namespace) == plain.composite_hash(key, namespace)


def test_small_hashes_stay_themselves() -> None:
    # value_key(k) lands in bucket k & (n - 1) with namespace 0: the seed's pictures.
    assert [fast.composite_hash(value_key(k), 0) for k in range(8)] == list(range(8))
    assert fast.spread_hash(65535) == 65535
    assert fast.spread_hash(65536) == 65537


@given(hashes, capacities)
def test_bucket_index(h: int, capacity: int) -> None:
    assert fast.bucket_index(h, capacity) == plain.bucket_index(h, capacity)


@given(hashes, capacities, st.data())
def test_in_rehash_table(h: int, capacity: int, data: st.DataObject) -> None:
    r = data.draw(st.integers(0, capacity))
    assert fast.in_rehash_table(h, capacity, r) == plain.in_rehash_table(h, capacity, r)


def test_in_rehash_table_boundaries() -> None:
    assert not fast.in_rehash_table(5, 8, 5)  # bucket 5 moves when the index passes it
    assert fast.in_rehash_table(5, 8, 6)
    assert not fast.in_rehash_table(0, 8, 0)


@given(hashes, capacities)
def test_rehash_destination(h: int, capacity: int) -> None:
    destination = fast.rehash_destination(h, capacity)
    assert destination == plain.rehash_destination(h, capacity)
    assert destination in (h % capacity, h % capacity + capacity)


@given(st.integers(-5, 2**31))
def test_clamp_capacity(requested: int) -> None:
    assert fast.clamp_capacity(requested) == plain.clamp_capacity(requested)


def test_clamp_capacity_edges() -> None:
    assert [fast.clamp_capacity(n) for n in (0, 4, 5, 8, 9, 128, 129)] == [4, 4, 8, 8, 16, 128, 256]
    assert fast.clamp_capacity(2**30 - 1) == 2**30 == fast.clamp_capacity(2**40)


@given(st.integers(2, 30))
def test_threshold_for(exponent: int) -> None:
    capacity = 1 << exponent
    assert fast.threshold_for(capacity) == plain.threshold_for(capacity)


def test_threshold_edges() -> None:
    assert [fast.threshold_for(c) for c in (4, 8, 128)] == [3, 6, 96]
    assert fast.threshold_for(2**30) == fast.MAX_ARRAY_SIZE == 2**31 - 9


@given(versions)
def test_highest_required_version(open_versions: frozenset[int]) -> None:
    assert fast.highest_required_version(open_versions) == plain.highest_required_version(
        open_versions
    )


@given(versions, st.integers(0, 10))
def test_open_snapshot_version(open_versions: frozenset[int], extra: int) -> None:
    version = max(open_versions, default=0) + extra
    assert fast.open_snapshot_version(version, open_versions) == plain.open_snapshot_version(
        version, open_versions
    )


@given(versions.filter(bool), st.data())
def test_release_snapshot_version(open_versions: frozenset[int], data: st.DataObject) -> None:
    version = data.draw(st.sampled_from(sorted(open_versions)))
    assert fast.release_snapshot_version(open_versions, version) == plain.release_snapshot_version(
        open_versions, version
    )


@given(st.integers(0, 5), st.data())
def test_snapshot_layout(exponent: int, data: st.DataObject) -> None:
    capacity = 1 << exponent
    slot = st.one_of(st.none(), st.integers(0, 9).map(lambda i: object()))
    primary = data.draw(st.lists(slot, min_size=capacity, max_size=capacity))
    rehashing = data.draw(st.booleans())
    rehash = data.draw(
        st.lists(slot, min_size=2 * capacity, max_size=2 * capacity) if rehashing else st.none()
    )
    r = data.draw(st.integers(0, capacity - 1)) if rehashing else 0
    size = data.draw(st.integers(0, 3 * capacity))
    got = fast.snapshot_layout(primary, rehash, r, size)
    want = plain.snapshot_layout(primary, rehash, r, size)
    assert len(got) == len(want) and all(a is b for a, b in zip(got, want, strict=True))


def test_composite_hash_keeps_equal_and_swapped_pairs_apart() -> None:
    equal = {fast.composite_hash(i, i) for i in range(4000)}
    assert len(equal) == 4000
    assert len({h & 4095 for h in equal}) > 2000  # spread over the buckets
    swapped = [
        (fast.composite_hash(a, b), fast.composite_hash(b, a))
        for a in range(50)
        for b in range(50)
        if a != b
    ]
    assert all(x != y for x, y in swapped)
    same = [fast.composite_hash(HashKey("a", 7), ns) for ns in ("x", "y", 0)]
    assert len(set(same)) == 3 and same[2] == 7


def test_composite_hash_is_an_unsigned_64_bit_number() -> None:
    for key, namespace in [(-1, -2), (2**62, -(2**62)), ("k", "n"), ((1, 2), None)]:
        assert 0 <= fast.composite_hash(key, namespace) < 2**64
