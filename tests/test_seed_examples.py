"""The two worked examples of seed 000 of the project's design notes (Flink's
copy-on-write map in pictures; kept outside this repository), replayed
literally against cowstate.

The seed's pictures are not available (only their captions), so the setups
below are reconstructed from the captions; every choice the text leaves open is
explained where it is made.

Version numbering. The seed's map starts at version 0 and names a snapshot by
the version *before* the increment ("snapshot 0" leaves ``stateTableVersion =
highestRequired = 1``). cowstate names a snapshot by the version *after* the
increment. The map's own counters are therefore identical in both (after the
first snapshot V = H = 1, after the second V = H = 2, and every entry/state
version in the seed's captions is the one cowstate produces); only the snapshot
labels differ by one: the seed's snapshot 0 is our version 1, its snapshot 1 is
our version 2, and the seed's ``release(0)`` / ``release(1)`` release our
versions 1 / 2.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import bind_map_class

from cowstate import CopyOnWriteStateMap, StateMapSnapshot
from cowstate.introspection import describe
from cowstate_spec.cmap_view import view_of as I
from cowstate_spec.cmap_view import view_of_snapshot as IS
from cowstate_spec.invariants import chain
from cowstate_spec.keys import HashKey, value_key


@pytest.fixture(autouse=True)
def _each_map(map_impl: str) -> None:
    """Every seed example runs on the pure and the C map (tests/conftest.py)."""
    bind_map_class(globals(), map_impl)


P, R = "primary", "rehash"  # the two tables, as locate() names them
NS = 0  # hash(0) == 0: the composite hash of (HashKey(v, h), 0) is h


# ==========================================================================
# (a) copy-on-write: snapshot(), put(13, 2), get(23), get(42), release(0),
#     snapshot(), remove(23), release(1)
# ==========================================================================


# The seed's ``K:n`` is ``HashKey(n, slot)``: equal by label n, hashing to slot.
#
# The seed has K:42 and K:23 in ONE chain (K:42 at the head: get(23) copies
# "the previous entry", K:42, and remove(23) says "K:42 is the chain head").
# Under any power-of-two capacity 42 (even) and 23 (odd) land in different
# buckets, so K:23 is given the hash of K:42; both then sit in bucket
# 42 & 3 == 2 of a 4-bucket table. K:13 keeps its own hash, bucket 13 & 3 == 1:
# it cannot be in the K:42 chain, since a new entry goes to the head of its chain
# and the seed's remove(23) finds K:42 at the head after put(13, 2).


class Box:
    """A mutable state ``S:n``, so the seed's deep copies of S are observable."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Box) and other.value == self.value

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"S:{self.value}"


class BoxSerializer:
    """Copies a Box into a new Box (the seed's "deep copy of S") and records
    every copy as ``(original, copy)``."""

    def __init__(self) -> None:
        self.copies: list[tuple[Box, Box]] = []

    def copy(self, state: Box) -> Box:
        duplicate = Box(state.value)
        self.copies.append((state, duplicate))
        return duplicate

    def serialize(self, state: Box) -> bytes:
        return str(state.value).encode()

    def deserialize(self, data: bytes) -> Box:
        return Box(int(data))


K42 = HashKey(42, 42)
K23 = HashKey(23, 42)  # forced into K:42's chain, see above
K13 = HashKey(13, 13)
BUCKET_42 = 42 & 3  # == 2, the bucket of the K:42 -> K:23 chain
BUCKET_13 = 13 & 3  # == 1
K = value_key


def view(snap: StateMapSnapshot[Any, Any, Any]) -> dict[int, Box]:
    """label -> state object, through the public snapshot iterator."""
    out = {e.key.value: e.state for e in snap}
    assert len(out) == len(snap)
    return out


def test_seed_copy_on_write_sequence_copies_exactly_the_pictured_entries() -> None:
    ser = BoxSerializer()
    m: CopyOnWriteStateMap[HashKey, int, Box] = CopyOnWriteStateMap(
        serializer=ser, initial_capacity=4
    )
    s3, s7 = Box(3), Box(7)
    m.put(K23, NS, s3)
    m.put(K42, NS, s7)  # inserted second: the head of the chain

    # -- initial state: version 0, H 0; K:42 (S:7) -> K:23 (S:3)
    assert describe(m).capacity == 4
    assert (m._version, m._highest_required) == (0, 0)
    e42, e23 = chain(I(m)._primary[BUCKET_42])
    assert (e42.key, e23.key) == (K42, K23)
    assert e42.state is s7 and e23.state is s3
    assert (e42.entry_version, e42.state_version) == (0, 0)
    assert (e23.entry_version, e23.state_version) == (0, 0)
    assert [b for i, b in enumerate(I(m)._primary) if i != BUCKET_42] == [None] * 3

    # -- snapshot(): the seed's snapshot 0 is our version 1; V and H become 1
    snap1 = m.snapshot()
    assert snap1.version == 1
    assert (m._version, m._highest_required, m._open_versions) == (1, 1, frozenset({1}))
    d1 = IS(snap1)._data
    assert d1 is not None and d1 is not I(m)._primary and len(d1) == 4
    assert all(a is b for a, b in zip(d1, I(m)._primary, strict=True))  # shallow copy
    assert chain(d1[BUCKET_42])[0] is e42 and chain(d1[BUCKET_42])[1] is e23
    assert ser.copies == []

    # -- put(13, 2): K:13 is new, no contention; entry and state version 1
    s2 = Box(2)
    m.put(K13, NS, s2)
    (e13,) = chain(I(m)._primary[BUCKET_13])
    assert e13.key == K13 and e13.state is s2
    assert (e13.entry_version, e13.state_version) == (1, 1)
    assert d1[BUCKET_13] is None  # the snapshot does not see it
    assert I(m)._primary[BUCKET_42] is e42  # the chain was not touched
    assert ser.copies == []
    assert view(snap1) == {42: Box(7), 23: Box(3)}

    # -- get(23): rule 2 deep-copies S:3; rule 1 copies K:23's entry and, to
    #    redirect its next, the predecessor K:42's entry (both entry version 1)
    got23 = m.get(K23, NS)
    assert got23 == Box(3) and got23 is not s3
    assert len(ser.copies) == 1 and ser.copies[0][0] is s3 and ser.copies[0][1] is got23
    head, second = chain(I(m)._primary[BUCKET_42])
    assert head is not e42 and second is not e23
    assert (head.key, second.key) == (K42, K23)
    assert head.next is second
    assert second.next is None
    # K:23's copy: the copied state, entry and state version 1
    assert second.state is got23
    assert (second.entry_version, second.state_version) == (1, 1)
    # K:42's copy: the ORIGINAL state object, entry version 1. Its state version
    # stays 0 (Flink's copy constructor keeps it); the seed's caption says 1, but
    # its next step copies S:7 "because stateVersion < highestRequired", which
    # only holds with 0.
    assert head.state is s7
    assert (head.entry_version, head.state_version) == (1, 0)
    # the snapshot keeps the original entries, link and states
    assert chain(d1[BUCKET_42]) == [e42, e23]
    assert e42.next is e23 and e42.state is s7 and e23.state is s3
    assert (e42.entry_version, e23.entry_version) == (0, 0)
    got23.value = 33  # the caller may mutate what get returned ...
    assert s3.value == 3  # ... the snapshot's S:3 does not change
    assert view(snap1) == {42: Box(7), 23: Box(3)}
    assert view(snap1)[23] is s3

    # -- get(42): rule 2 deep-copies S:7; K:42's entry already has entry
    #    version 1 == H, so it is changed in place (no entry copy)
    got42 = m.get(K42, NS)
    assert got42 == Box(7) and got42 is not s7
    assert len(ser.copies) == 2 and ser.copies[1][0] is s7 and ser.copies[1][1] is got42
    assert I(m)._primary[BUCKET_42] is head and head.next is second
    assert head.state is got42
    assert (head.entry_version, head.state_version) == (1, 1)
    assert e42.state is s7
    assert view(snap1) == {42: Box(7), 23: Box(3)}
    assert view(snap1)[42] is s7

    # -- release(0): our version 1; H back to 0, the snapshot drops its table
    m.release(snap1)
    assert snap1.is_released and IS(snap1)._data is None
    assert (m._version, m._highest_required, m._open_versions) == (1, 0, frozenset())
    assert chain(I(m)._primary[BUCKET_42]) == [head, second]
    assert len(ser.copies) == 2

    # -- snapshot(): the seed's snapshot 1 is our version 2; V and H become 2
    snap2 = m.snapshot()
    assert snap2.version == 2
    assert (m._version, m._highest_required, m._open_versions) == (2, 2, frozenset({2}))
    d2 = IS(snap2)._data
    assert d2 is not None
    assert d2[BUCKET_42] is head and d2[BUCKET_13] is e13
    assert view(snap2) == {42: Box(7), 23: Box(33), 13: Box(2)}

    # -- remove(23): K:42 (entry version 1 < 2) precedes K:23, so rule 1 copies
    #    it (entry version 2, same key and state) and the copy's next becomes
    #    None; K:42 is the head, so only the live bucket points to the copy
    m.remove(K23, NS)
    (new_head,) = chain(I(m)._primary[BUCKET_42])
    assert new_head is not head
    assert new_head.key == K42 and new_head.state is got42  # shared, not deep-copied
    assert (new_head.entry_version, new_head.state_version) == (2, 1)
    assert new_head.next is None
    assert len(ser.copies) == 2  # remove hands no state out: no deep copy
    assert I(m)._primary[BUCKET_13] is e13  # untouched
    # snapshot 2 still sees K:42 -> K:23 through the old entries
    assert d2[BUCKET_42] is head and head.next is second
    assert view(snap2) == {42: Box(7), 23: Box(33), 13: Box(2)}
    assert view(snap2)[23] is got23 and view(snap2)[42] is got42
    assert not m.contains_key(K23, NS)
    assert len(m) == 2
    assert {e.key.value: e.state for e in m} == {42: Box(7), 13: Box(2)}

    # -- release(1): our version 2; no snapshot is open any more
    m.release(snap2)
    assert snap2.is_released
    assert (m._version, m._highest_required, m._open_versions) == (2, 0, frozenset())
    # with no snapshot open, get hands out the stored objects (no more copies)
    assert m.get(K42, NS) is got42
    assert m.get(K13, NS) is s2
    assert len(ser.copies) == 2


# ==========================================================================
# (b) incremental rehash: old capacity 4, new capacity 8;
#     get(0), put(3, 5), remove(1), get(5)
# ==========================================================================
#
# The seed's initial picture: old table 0:{K0}, 1:{K1, K5}, 2:{K2}, 3:{},
# a new table of 8 empty buckets, rehashIdx 0. Values named by the text:
# K0 -> V:2 (get(0) returns it), K5 -> V:7 (get(5)), K3 -> V:5 (put(3, 5)).
# The pictures giving K1's and K2's values are not available; we use 1 and 4.
#
# ``K(k)`` is ``value_key(k)``: with namespace 0 its composite hash is k, so a
# key's bucket is k & 3 in the old table and k & 7 in the new one, as pictured.
#
# Two differences from the seed, both from the rules in cowstate.state_map:
# 1. The pictured start (rehash in progress, rehash index 0, exactly these four
#    entries) cannot be reached: with capacity 4 (threshold 3) the rehash starts
#    only when an insertion finds len > 3, and that insertion adds a fifth entry;
#    every later keyed operation moves at least 4 entries first.
# 2. The seed moves ONE bucket per operation; cowstate (like Flink) moves whole
#    buckets until at least 4 ENTRIES have moved, so one step can move several
#    buckets (and sweeps empty ones).
# The first test keeps the seed's four entries and its operations in order:
# the rehash then starts at put(3, 5) and, as in the seed, K3 goes to the old
# table, remove(1) finds K1 in the new table with rehash index 3, and get(5)
# completes the rehash. The second test starts from the closest reachable copy
# of the initial picture (rehash running at index 0, K3 already present).


def insert_seed_entries(m: CopyOnWriteStateMap[HashKey, int, int]) -> None:
    m.put(K(0), NS, 2)
    m.put(K(5), NS, 7)
    m.put(K(1), NS, 1)  # inserted after K5: K1 -> K5 in old bucket 1, as pictured
    m.put(K(2), NS, 4)


def locate(m: CopyOnWriteStateMap[HashKey, int, int], key: int) -> tuple[str, int] | None:
    """``(table, bucket)`` of ``key``, by scanning every chain of both tables. While
    rehashing, "primary" is the seed's old table and "rehash" its new table."""
    found = []
    tables = (
        [(P, I(m)._primary)] if I(m)._rehash is None else [(P, I(m)._primary), (R, I(m)._rehash)]
    )
    for name, table in tables:
        for index, head in enumerate(table):
            found += [(name, index) for e in chain(head) if e.key.value == key]
    assert len(found) <= 1, found
    return found[0] if found else None


def layout(m: CopyOnWriteStateMap[HashKey, int, int]) -> dict[int, tuple[str, int] | None]:
    return {k: locate(m, k) for k in (0, 1, 2, 3, 5)}


def test_seed_rehash_sequence_in_seed_order_ends_with_the_pictured_new_table() -> None:
    m: CopyOnWriteStateMap[HashKey, int, int] = CopyOnWriteStateMap(initial_capacity=4)
    insert_seed_entries(m)
    info = describe(m)
    assert (info.capacity, info.threshold, info.is_rehashing, len(m)) == (4, 3, False, 4)
    assert [[e.key.value for e in chain(h)] for h in I(m)._primary] == [[0], [1, 5], [2], []]

    # get(0) -> V:2. Seed: moves bucket 0, rehashIdx 1. Here nothing runs yet:
    # 4 entries do not exceed threshold 3.
    assert m.get(K(0), NS) == 2
    assert I(m)._rehash is None
    assert layout(m) == {0: (P, 0), 1: (P, 1), 2: (P, 2), 3: None, 5: (P, 1)}

    # put(3, 5). Seed: moves bucket 1, rehashIdx 2, K3 inserted into the OLD table
    # (3 % 4 >= 2). Here this insertion finds len 4 > 3 and starts the rehash
    # (no step yet: the step runs before the insertion decides to grow); K3 goes
    # to the old table too, at the head of old bucket 3.
    m.put(K(3), NS, 5)
    info = describe(m)
    assert info.is_rehashing
    assert (info.rehash_capacity, info.threshold, info.rehash_index) == (8, 6, 0)
    assert (info.primary_size, info.rehash_size) == (5, 0)
    assert layout(m) == {0: (P, 0), 1: (P, 1), 2: (P, 2), 3: (P, 3), 5: (P, 1)}
    assert I(m)._rehash == [None] * 8

    # remove(1). Seed: moves bucket 2, rehashIdx 3, 1 % 4 < 3 so K1 is looked up
    # and removed in the NEW table. Here the step moves buckets 0 (K0), 1 (K1, K5)
    # and 2 (K2) -- four entries -- and stops at rehash index 3, the seed's value;
    # K1 is then removed from new bucket 1.
    m.remove(K(1), NS)
    info = describe(m)
    assert info.is_rehashing and info.rehash_index == 3
    assert (info.primary_size, info.rehash_size) == (1, 3)
    assert layout(m) == {0: (R, 0), 1: None, 2: (R, 2), 3: (P, 3), 5: (R, 5)}
    assert I(m)._primary[:3] == [None] * 3

    # get(5) -> V:7. Seed: moves bucket 3 (K3), rehashIdx 4 == oldCap, the rehash
    # is complete and the new table replaces the old. Same here: bucket 3 holds
    # one entry, and reaching index 4 ends the rehash.
    assert m.get(K(5), NS) == 7
    info = describe(m)
    assert not info.is_rehashing
    assert (info.capacity, info.rehash_index, info.threshold, len(m)) == (8, 0, 6, 4)
    assert (info.primary_size, info.rehash_size) == (4, 0)
    # the pictured final table: K0 -> 0, K2 -> 2, K3 -> 3, K5 -> 5 (K1 removed)
    assert [[e.key.value for e in chain(h)] for h in I(m)._primary] == [
        [0],
        [],
        [2],
        [3],
        [],
        [5],
        [],
        [],
    ]
    assert {(e.key.value, e.state) for e in m} == {(0, 2), (2, 4), (3, 5), (5, 7)}
    assert not m.contains_key(K(1), NS)


def test_seed_rehash_sequence_from_the_closest_reachable_initial_picture() -> None:
    # The closest reachable copy of the initial picture: the same four entries
    # plus K3 -> V:5, whose insertion (the 5th) starts the rehash at index 0.
    # The seed's put(3, 5) then overwrites it instead of inserting it.
    m: CopyOnWriteStateMap[HashKey, int, int] = CopyOnWriteStateMap(initial_capacity=4)
    insert_seed_entries(m)
    m.put(K(3), NS, 5)
    info = describe(m)
    assert info.is_rehashing
    assert (info.capacity, info.rehash_capacity, info.rehash_index) == (4, 8, 0)
    assert [[e.key.value for e in chain(h)] for h in I(m)._primary] == [[0], [1, 5], [2], [3]]
    assert I(m)._rehash == [None] * 8

    # get(0) -> V:2. Seed: moves bucket 0 only (rehashIdx 1). Here the step moves
    # buckets 0, 1, 2 (four entries) and stops at index 3; K0 is found in new 0.
    assert m.get(K(0), NS) == 2
    info = describe(m)
    assert info.is_rehashing and info.rehash_index == 3
    assert (info.primary_size, info.rehash_size) == (1, 4)
    assert layout(m) == {0: (R, 0), 1: (R, 1), 2: (R, 2), 3: (P, 3), 5: (R, 5)}
    assert I(m)._rehash is not None
    assert [[e.key.value for e in chain(h)] for h in I(m)._rehash] == [
        [0],
        [1],
        [2],
        [],
        [],
        [5],
        [],
        [],
    ]

    # put(3, 5). Seed: moves bucket 1 (rehashIdx 2) and inserts K3 into the old
    # table. Here the step moves bucket 3 (K3), reaches index 4 and completes the
    # rehash; K3 is found in the new primary table at 3 and gets V:5 again.
    m.put(K(3), NS, 5)
    info = describe(m)
    assert not info.is_rehashing
    assert (info.capacity, info.rehash_index, len(m)) == (8, 0, 5)
    # the new table as the pictures place it: K0 -> 0, K1 -> 1, K2 -> 2, K3 -> 3, K5 -> 5
    assert [[e.key.value for e in chain(h)] for h in I(m)._primary] == [
        [0],
        [1],
        [2],
        [3],
        [],
        [5],
        [],
        [],
    ]

    # remove(1): no rehash left to run; K1 leaves bucket 1
    m.remove(K(1), NS)
    assert layout(m) == {0: (P, 0), 1: None, 2: (P, 2), 3: (P, 3), 5: (P, 5)}

    # get(5) -> V:7; the final table equals the seed's final picture
    assert m.get(K(5), NS) == 7
    assert I(m)._rehash is None
    assert [[e.key.value for e in chain(h)] for h in I(m)._primary] == [
        [0],
        [],
        [2],
        [3],
        [],
        [5],
        [],
        [],
    ]
    assert {(e.key.value, e.state) for e in m} == {(0, 2), (2, 4), (3, 5), (5, 7)}
