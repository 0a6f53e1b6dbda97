"""Flink's ``CopyOnWriteStateMapTest`` scenarios ported to cowstate.

Sources: the project's Flink reference notes on the state map (kept outside
this repository): section 9.1 (Flink's tests in prose), the extra edge cases of
section 9.6 and the derived vectors of section 8.

cowstate differs from Flink on purpose (see the top of the reference and the
module docstring of ``cowstate.state_map``), and the ports follow cowstate:

* ``None`` is never a state: ``put(k, n, None)`` raises ``NoneStateError``.
* ``transform`` is atomic: a raising function gives ``TransformFunctionError``,
  a function returning ``None`` gives ``NoneStateError``; the map is unchanged.
* Releasing a snapshot twice raises ``SnapshotReleasedError``.
* The composite hash mixes the two Python hashes (``cowstate.arithmetic.
  composite_hash``); where a scenario needs a chosen layout it uses keys
  ``K(k)`` (``value_key``), whose composite hash with namespace 0 is ``k``, or
  ``ZeroHashInt`` pairs that all hash to 0. Flink's numbers that depend on its
  ``bitMix`` hash are recomputed from the rehash rules for this hash (each such
  place says so).
* There is no ``StateIncrementalVisitor``.

Internals read here: ``I(m)._primary``, ``I(m)._rehash``, ``I(m)._rehash_index``,
``m._version``, ``m._highest_required``, ``m._open_versions``, ``IS(snap)._data``
and the ``_Entry`` fields, plus ``cowstate.introspection.describe``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest
from conftest import bind_map_class

from cowstate import (
    ConcurrentModificationError,
    CopyOnWriteStateMap,
    ForeignSnapshotError,
    NoneStateError,
    SnapshotReleasedError,
    StateEntry,
    StateMapSnapshot,
    TransformFunctionError,
    VersionOverflowError,
)
from cowstate.introspection import describe
from cowstate.serializers import SCALAR_STATES, DefaultSerializer
from cowstate_spec.cmap_view import rehash_progress
from cowstate_spec.cmap_view import view_of as I
from cowstate_spec.cmap_view import view_of_snapshot as IS
from cowstate_spec.invariants import chain
from cowstate_spec.keys import HashKey, value_key

K = value_key  # with namespace 0, K(k) has composite hash k: bucket k & (n - 1)

# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _each_map(map_impl: str) -> None:
    """Every test here runs on the pure and the C map (tests/conftest.py)."""
    bind_map_class(globals(), map_impl)


def entries_of(buckets: Iterable[Any]) -> list[Any]:
    """Every entry reachable from a bucket list, walking every chain."""
    return [e for head in buckets if head is not None for e in chain(head)]


def snapshot_entries(snap: StateMapSnapshot[Any, Any, Any]) -> list[Any]:
    """Every entry reachable from the snapshot's bucket list (as Flink's test walks it)."""
    assert IS(snap)._data is not None
    return entries_of(IS(snap)._data)


def live_entries(m: CopyOnWriteStateMap[Any, Any, Any]) -> list[Any]:
    tables = [I(m)._primary] if I(m)._rehash is None else [I(m)._primary, I(m)._rehash]
    return [e for table in tables for e in entries_of(table)]


def as_dict(entries: Iterable[Any]) -> dict[tuple[Any, Any], Any]:
    """``{(key, namespace): state}``; asserts no composite key occurs twice."""
    entries = list(entries)
    out = {(e.key, e.namespace): e.state for e in entries}
    assert len(out) == len(entries), "a composite key is reachable twice"
    return out


def size_by_iteration(m: CopyOnWriteStateMap[Any, Any, Any]) -> int:
    """Flink's ``assertThat(map).hasSize(n)`` counts by iterating the map."""
    return sum(1 for _ in m)


def append_value(previous: list[int] | None, value: int) -> list[int]:
    """Flink's test transformation: append to the previous list (``[]`` if absent),
    return the SAME list object."""
    state = [] if previous is None else previous
    state.append(value)
    return state


# --------------------------------------------------------------------------
# 9.1.1 testPutGetRemoveContainsTransform (adapted to the None rules)
# --------------------------------------------------------------------------


def test_put_get_remove_contains_transform_follows_flink_sequence_with_none_rules() -> None:
    m: CopyOnWriteStateMap[int, int, list[int]] = CopyOnWriteStateMap()

    assert m.put_and_get_old(1, 1, [41]) is None
    assert m.get(1, 1) == [41]
    assert len(m) == size_by_iteration(m) == 1

    assert m.put_and_get_old(2, 1, [42]) is None
    assert m.get(2, 1) == [42]
    assert len(m) == size_by_iteration(m) == 2

    # same key, different namespace: a distinct mapping
    assert m.put_and_get_old(1, 2, [43]) is None
    assert m.get(1, 2) == [43]
    assert m.get(1, 1) == [41]
    assert len(m) == size_by_iteration(m) == 3
    assert m.size_of_namespace(1) == 2
    assert m.size_of_namespace(2) == 1
    assert sorted(m.keys(1)) == [1, 2]

    assert m.contains_key(2, 1)
    assert not m.contains_key(3, 1)
    assert not m.contains_key(2, 3)

    # Flink: put(2, 1, null) keeps the mapping with a null state. cowstate: None is
    # never a state, the call raises and the mapping keeps its old state.
    with pytest.raises(NoneStateError):
        m.put(2, 1, None)  # type: ignore[arg-type]
    with pytest.raises(NoneStateError):
        m.put_and_get_old(2, 1, None)  # type: ignore[arg-type]
    assert m.contains_key(2, 1)
    assert m.get(2, 1) == [42]
    assert len(m) == size_by_iteration(m) == 3
    # ... and a None put of an absent mapping creates nothing
    with pytest.raises(NoneStateError):
        m.put(9, 9, None)  # type: ignore[arg-type]
    assert not m.contains_key(9, 9)
    assert len(m) == 3

    m.put(2, 1, [42])
    assert len(m) == size_by_iteration(m) == 3

    assert m.remove_and_get_old(2, 1) == [42]
    assert not m.contains_key(2, 1)
    assert len(m) == size_by_iteration(m) == 2

    m.remove(1, 2)
    assert not m.contains_key(1, 2)
    assert len(m) == size_by_iteration(m) == 1

    # removing an absent mapping: None, nothing changes
    assert m.remove_and_get_old(4, 2) is None
    m.remove(4, 2)
    assert len(m) == size_by_iteration(m) == 1

    # transform on an existing mapping gets the stored list and may return it
    m.transform(1, 1, 4711, append_value)
    assert m.get(1, 1) == [41, 4711]
    assert len(m) == 1


def test_transform_is_atomic_when_function_raises_or_returns_none() -> None:
    m: CopyOnWriteStateMap[int, int, list[int]] = CopyOnWriteStateMap()
    m.put(1, 1, [41])
    before = live_entries(m)

    def boom(previous: list[int] | None, value: int) -> list[int]:
        raise KeyError("boom")

    with pytest.raises(TransformFunctionError) as info:
        m.transform(1, 1, 5, boom)
    assert isinstance(info.value.__cause__, KeyError)
    assert m.get(1, 1) == [41]
    assert live_entries(m) == before and all(
        a is b for a, b in zip(live_entries(m), before, strict=True)
    )

    # Flink would leave a new mapping with a null state; cowstate creates nothing.
    with pytest.raises(TransformFunctionError):
        m.transform(7, 1, 5, boom)
    assert not m.contains_key(7, 1)
    assert len(m) == size_by_iteration(m) == 1

    with pytest.raises(NoneStateError):
        m.transform(1, 1, 5, lambda previous, value: None)  # type: ignore[arg-type,return-value]
    assert m.get(1, 1) == [41]
    with pytest.raises(NoneStateError):
        m.transform(8, 1, 5, lambda previous, value: None)  # type: ignore[arg-type,return-value]
    assert not m.contains_key(8, 1)
    assert len(m) == 1

    # transform of an absent mapping passes None and creates the mapping
    seen: list[list[int] | None] = []

    def record(previous: list[int] | None, value: int) -> list[int]:
        seen.append(previous)
        return [value]

    m.transform(9, 1, 3, record)
    assert seen == [None]
    assert m.get(9, 1) == [3]
    assert len(m) == 2


# --------------------------------------------------------------------------
# 9.1.2 testIncrementalRehash and the section 8 vectors
# --------------------------------------------------------------------------


def test_incremental_rehash_with_interleaved_removes_keeps_size_and_membership() -> None:
    m: CopyOnWriteStateMap[HashKey, int, list[int]] = CopyOnWriteStateMap()
    insert = 0
    remove = 0

    def one_round() -> None:
        nonlocal insert, remove
        m.put(value_key(insert), 0, [])
        insert += 1
        if insert % 8 == 0:
            m.remove(value_key(remove), 0)
            remove += 1

    while I(m)._rehash is None:
        one_round()
    assert len(m) == insert - remove
    # Hash independent (section 8): the 111th insert starts the rehash, keys 0..12
    # are removed, 98 mappings.
    assert (insert, remove, len(m)) == (111, 13, 98)
    assert describe(m).rehash_index == 0

    while I(m)._rehash is not None:
        one_round()
        assert len(m) == insert - remove
    # Section 8 gives 133 inserts / 16 removes / size 117 for Flink's bitMix hash.
    # With keys value_key(k) (composite hash k), (k, 0) sits in bucket k, so every
    # step moves exactly four one-entry buckets (the empty buckets 0..12 are swept for free); an
    # independent model of the rules gives 136 / 17 / 119.
    assert (insert, remove, len(m), len(I(m)._primary)) == (136, 17, 119, 256)
    assert size_by_iteration(m) == len(m)

    for i in range(insert):
        assert m.contains_key(value_key(i), 0) == (i >= remove), i


def test_default_map_rehash_starts_at_98th_insert_and_25_contains_key_calls_finish_it() -> None:
    m: CopyOnWriteStateMap[HashKey, int, int] = CopyOnWriteStateMap()
    for k in range(97):
        m.put(value_key(k), 0, k)
        assert I(m)._rehash is None
    info = describe(m)
    assert (info.capacity, info.threshold, len(m)) == (128, 96, 97)

    m.put(value_key(97), 0, 97)  # size 97 > threshold 96 before this insert: the rehash starts
    info = describe(m)
    assert info.is_rehashing
    assert (info.rehash_capacity, info.threshold, info.rehash_index, len(m)) == (256, 192, 0, 98)
    assert (info.primary_size, info.rehash_size) == (98, 0)

    # Section 8 says "23 further containsKey complete it": that count comes from
    # Flink's bitMix hash, whose collisions let a step move more than four entries.
    # With keys value_key(k) (composite hash k), key k is alone in bucket k, so by
    # the rules ("move whole buckets until at least 4 entries moved") each step
    # moves exactly buckets 4n..4n+3; the 25th step moves keys 96 and 97 and sweeps the empty tail.
    for n in range(1, 25):
        assert m.contains_key(value_key(n), 0)
        info = describe(m)
        assert info.is_rehashing, n
        assert info.rehash_index == 4 * n
        assert (info.primary_size, info.rehash_size) == (98 - 4 * n, 4 * n)
    assert m.contains_key(value_key(0), 0)
    info = describe(m)
    assert not info.is_rehashing
    assert (info.capacity, info.threshold, info.rehash_index, len(m)) == (256, 192, 0, 98)
    assert (info.primary_size, info.rehash_size) == (98, 0)
    for k in range(98):
        assert [e.key for e in chain(I(m)._primary[k])] == [value_key(k)]
    assert I(m)._primary[98:] == [None] * (256 - 98)


# --------------------------------------------------------------------------
# 9.1.3 testRandomModificationsAndCopyOnWriteIsolation
# --------------------------------------------------------------------------


def _check_snapshot(
    snap: StateMapSnapshot[Any, Any, Any], size: int, expected: dict[tuple[int, int], list[int]]
) -> None:
    walked = snapshot_entries(snap)
    assert len(walked) == size == len(snap)
    assert as_dict(walked) == expected
    assert {(e.key, e.namespace): e.state for e in snap} == expected


def run_random_isolation(
    iterations: int, n_keys: int, n_namespaces: int, full_check_every: int
) -> dict[str, int]:
    """Flink's random test against a reference dict; returns rehash statistics.

    Flink draws ``op = nextInt(10)``; ops 7-9 drive the StateIncrementalVisitor,
    which cowstate does not have, so they are skipped: ``op`` is drawn from 0..6.
    """
    rng = random.Random(42)
    m: CopyOnWriteStateMap[int, int, list[int]] = CopyOnWriteStateMap()
    reference: dict[tuple[int, int], list[int]] = {}
    held: StateMapSnapshot[int, int, list[int]] | None = None
    held_size = 0
    held_reference: dict[tuple[int, int], list[int]] = {}
    snapshot_counter = 0
    mutation_counter = 0
    stats = {
        "rehash_ops_under_snapshot": 0,
        "rehashes_started": 0,
        "snapshots_during_rehash": 0,
        "max_capacity": 0,
    }

    for i in range(iterations):
        key = rng.randrange(n_keys)
        ns = rng.randrange(n_namespaces)
        op = rng.randrange(7)
        composite = (key, ns)
        was_rehashing = rehash_progress(m) is not None
        if was_rehashing and m._highest_required > 0:
            stats["rehash_ops_under_snapshot"] += 1

        state: list[int] | None = None
        ref_state: list[int] | None = None
        if op in (0, 1):
            state = m.get(key, ns)
            ref_state = reference.get(composite)
            assert state == ref_state
            if state is None:
                state = []
                m.put(key, ns, state)
                ref_state = []
                reference[composite] = ref_state
        elif op == 2:
            m.put(key, ns, [])
            reference[composite] = []
        elif op == 3:
            state = m.put_and_get_old(key, ns, [])
            ref_state = reference.get(composite)
            reference[composite] = []
            assert state == ref_state
        elif op == 4:
            m.remove(key, ns)
            reference.pop(composite, None)
        elif op == 5:
            state = m.remove_and_get_old(key, ns)
            ref_state = reference.pop(composite, None)
            assert state == ref_state
        else:
            value = rng.randrange(1000)
            m.transform(key, ns, value, append_value)
            reference[composite] = append_value(reference.get(composite), value)

        # rehash_progress, not I(m): a C map's view exports every bucket
        progress = rehash_progress(m)
        if not was_rehashing and progress is not None:
            stats["rehashes_started"] += 1
        if progress is not None:  # growing, the map rehashes into twice L
            stats["max_capacity"] = max(stats["max_capacity"], 2 * progress[1])

        assert len(m) == len(reference)
        if i % full_check_every == 0:
            assert size_by_iteration(m) == len(reference)
            assert as_dict(live_entries(m)) == reference

        # mutate the handed-out state in place (the caller may, until the next snapshot)
        if state is not None:
            assert ref_state is not None
            if rng.random() < 0.5 and state:
                state.pop()
                ref_state.pop()
            else:
                state.append(mutation_counter)
                ref_state.append(mutation_counter)
                mutation_counter += 1
            assert state == ref_state

        if i > 0 and i % 500 == 0:
            if held is not None:
                _check_snapshot(held, held_size, held_reference)
                if i % 1000 == 0:
                    extra = m.snapshot()
                    snapshot_counter += 1
                    assert extra.version == snapshot_counter
                    if rehash_progress(m) is not None:
                        stats["snapshots_during_rehash"] += 1
                    m.release(extra)
                if i % 5000 == 0:
                    m.release(held)
                    assert held.is_released
                    held = None
            else:
                held = m.snapshot()
                snapshot_counter += 1
                assert held.version == snapshot_counter
                if rehash_progress(m) is not None:
                    stats["snapshots_during_rehash"] += 1
                held_size = len(m)
                held_reference = {k: list(v) for k, v in reference.items()}

    stats["max_capacity"] = max(stats["max_capacity"], describe(m).capacity)
    if held is not None:
        _check_snapshot(held, held_size, held_reference)
        held.release()
    assert m._open_versions == set()
    assert m._highest_required == 0
    assert as_dict(live_entries(m)) == reference
    assert size_by_iteration(m) == len(m) == len(reference)
    return stats


def test_random_modifications_keep_snapshots_isolated_20_keys_4_namespaces() -> None:
    # Flink: 10,000,000 iterations; scaled down. 80 composite keys < 97: no rehash,
    # exactly as in Flink's test. The whole map against the reference every 4th
    # operation (its size after each one): a C map's every comparison walks its
    # view, and every operation cost 12 s of make test's CPU at 30,000.
    stats = run_random_isolation(30_000, n_keys=20, n_namespaces=4, full_check_every=4)
    assert stats["rehashes_started"] == 0
    assert stats["max_capacity"] == 128


def test_random_modifications_keep_snapshots_isolated_while_rehashing_400_keys() -> None:
    # 400 keys x 4 namespaces: the map grows past 97, 193, 385 ... mappings, so
    # incremental rehash steps run while snapshots are open.
    stats = run_random_isolation(30_000, n_keys=400, n_namespaces=4, full_check_every=250)
    assert stats["rehashes_started"] >= 3
    assert stats["max_capacity"] >= 1024
    assert stats["rehash_ops_under_snapshot"] > 0
    assert stats["snapshots_during_rehash"] >= 1


# --------------------------------------------------------------------------
# 9.1.4 testCopyOnWriteContracts
# --------------------------------------------------------------------------


def test_copy_on_write_contracts_identity_of_list_states_across_snapshots() -> None:
    m: CopyOnWriteStateMap[int, int, list[int]] = CopyOnWriteStateMap()
    o1, o2, o3, o4, o5 = [1], [2], [3], [4], [5]
    m.put(1, 1, o1)
    m.put(2, 1, o2)
    m.put(4, 1, o4)
    m.put(5, 1, o5)

    assert m.get(1, 1) is o1  # no snapshot: the stored object itself

    snapshot1 = m.snapshot()
    assert snapshot1.version == 1
    c = m.get(1, 1)
    assert c is not o1
    assert c == o1

    m.put(3, 1, o3)  # made after snapshot1
    assert m.get(1, 1) is c  # same copy until the next snapshot

    snapshot2 = m.snapshot()
    assert snapshot2.version == 2
    c2 = m.get(1, 1)
    assert c2 is not c
    assert c2 == c

    m.release(snapshot2)
    assert m._highest_required == 1
    assert m.get(3, 1) is o3  # version 1, not < 1
    o4_now = m.get(4, 1)
    assert o4_now is not o4  # version 0 < 1
    assert o4_now == o4

    m.release(snapshot1)
    assert m._highest_required == 0
    assert m.get(5, 1) is o5
    assert m._open_versions == set()


# Rule S's scalar exemption (cowstate.state_map: a scalar the serializer copies
# as itself is handed out as it is). One value of every SCALAR_STATES type:
SCALARS: list[Any] = [True, 12345678901234567890, 1.5, 2j, "state-é", b"\x00bytes"]


class IntSubclass(int):
    pass


class CountingSerializer(DefaultSerializer):
    """The default serializer's copy, counted; declares nothing about scalars
    (``copies_scalars_as_is`` False) unless a subclass does."""

    copies_scalars_as_is = False

    def __init__(self) -> None:
        self.copies = 0

    def copy(self, state: Any) -> Any:
        self.copies += 1
        return DefaultSerializer.copy(state)


class DeclaringCountingSerializer(CountingSerializer):
    copies_scalars_as_is = True


def live_entry(m: CopyOnWriteStateMap[Any, Any, Any], key: Any, namespace: Any) -> Any:
    (e,) = [e for e in live_entries(m) if (e.key, e.namespace) == (key, namespace)]
    return e


def test_the_scalar_samples_cover_every_scalar_state_type() -> None:
    assert {type(v) for v in SCALARS} == SCALAR_STATES


@pytest.mark.parametrize("scalar", SCALARS, ids=lambda v: type(v).__name__)
def test_get_hands_out_a_scalar_a_snapshot_holds_as_it_is_with_no_entry_copy(scalar: Any) -> None:
    m: CopyOnWriteStateMap[int, int, Any] = CopyOnWriteStateMap()
    m.put(1, 0, scalar)
    before = live_entry(m, 1, 0)
    snap = m.snapshot()
    got = m.get(1, 0)
    assert got is scalar
    after = live_entry(m, 1, 0)
    assert after.state_version < m._highest_required  # shared, and nothing was written
    assert after.entry_version == before.entry_version
    assert snapshot_entries(snap)[0].state is scalar
    m.put(1, 0, "changed")  # a put still copies the entry (rule E): the snapshot keeps it
    assert {(e.key, e.namespace): e.state for e in snap} == {(1, 0): scalar}
    snap.release()


@pytest.mark.parametrize(
    "state",
    [IntSubclass(7), (1, 2), frozenset({1}), [1]],
    ids=["int subclass", "tuple", "frozenset", "list"],
)
def test_get_copies_a_state_outside_the_scalar_types_as_before(state: Any) -> None:
    m: CopyOnWriteStateMap[int, int, Any] = CopyOnWriteStateMap()
    m.put(1, 0, state)
    snap = m.snapshot()
    m.get(1, 0)
    assert live_entry(m, 1, 0).state_version == m._version  # rule S ran: copied and marked
    snap.release()


def test_get_calls_copy_of_a_serializer_that_does_not_declare_scalars_as_is() -> None:
    serializer = CountingSerializer()
    m: CopyOnWriteStateMap[int, int, Any] = CopyOnWriteStateMap(serializer)
    m.put(1, 0, 5)
    snap = m.snapshot()
    assert m.get(1, 0) == 5
    assert serializer.copies == 1
    assert live_entry(m, 1, 0).state_version == m._version
    snap.release()


def test_get_skips_copy_of_a_serializer_that_declares_scalars_as_is() -> None:
    serializer = DeclaringCountingSerializer()
    m: CopyOnWriteStateMap[int, int, Any] = CopyOnWriteStateMap(serializer)
    m.put(1, 0, 5)
    m.put(2, 0, [5])
    snap = m.snapshot()
    assert m.get(1, 0) == 5
    assert serializer.copies == 0
    assert m.get(2, 0) == [5]  # a list is no scalar: copied
    assert serializer.copies == 1
    snap.release()


def test_setting_the_serializer_sets_whether_scalars_are_handed_out_as_they_are() -> None:
    m: CopyOnWriteStateMap[int, int, Any] = CopyOnWriteStateMap()
    m.put(1, 0, 5)
    serializer = CountingSerializer()
    m.serializer = serializer
    snap = m.snapshot()
    m.get(1, 0)
    assert serializer.copies == 1
    snap.release()
    m.serializer = DefaultSerializer()
    snap = m.snapshot()
    m.get(1, 0)
    assert live_entry(m, 1, 0).state_version < m._highest_required
    snap.release()


# --------------------------------------------------------------------------
# 9.1.5 testIteratingOverSnapshot
# --------------------------------------------------------------------------


def test_iterating_over_snapshot_yields_exactly_the_original_five_entries() -> None:
    m: CopyOnWriteStateMap[int, int, list[int]] = CopyOnWriteStateMap()
    originals = {i: [i] for i in range(1, 6)}
    for i, state in originals.items():
        m.put(i, 1, state)

    with m.snapshot() as snap:
        # change the live map in every way after the snapshot
        m.get(1, 1).append(99)  # type: ignore[union-attr]
        m.remove(2, 1)
        m.put(3, 1, [33])
        m.put(6, 1, [6])
        m.transform(4, 1, 44, append_value)
        assert m.put_and_get_old(5, 1, [55]) == [5]

        yielded = list(snap)
        assert len(snap) == 5
        assert all(isinstance(e, StateEntry) for e in yielded)
        assert sorted((e.key, e.namespace, e.state) for e in yielded) == [
            (i, 1, [i]) for i in range(1, 6)
        ]
        for e in yielded:  # the snapshot's own (original) objects
            assert e.state is originals[e.key]
    assert snap.is_released

    assert as_dict(live_entries(m)) == {
        (1, 1): [1, 99],
        (3, 1): [33],
        (4, 1): [4, 44],
        (5, 1): [55],
        (6, 1): [6],
    }


# --------------------------------------------------------------------------
# not Flink's: items(), the snapshot writer's fast path
# --------------------------------------------------------------------------


@pytest.mark.kills(module="cowstate.state_map")
def test_snapshot_items_lists_every_mapping_once_as_plain_tuples() -> None:
    # state_map.StateMapSnapshot.items: the writer's fast path, which the map
    # machines never call (they iterate the snapshot).
    m: CopyOnWriteStateMap[int, str, list[int]] = CopyOnWriteStateMap(initial_capacity=4)
    for k in range(10):  # past the threshold: items() spans a rehash
        m.put(k, "ns", [k])
    snapshot = m.snapshot()
    m.put(0, "ns", [99])  # after the snapshot: not in it
    m.remove(1, "ns")
    items = snapshot.items()
    assert type(items) is list and all(type(item) is tuple for item in items)
    assert sorted(items) == [(k, "ns", [k]) for k in range(10)]
    snapshot.release()


# --------------------------------------------------------------------------
# 9.1.7 testSnapshotRelease (adapted: a second release raises)
# --------------------------------------------------------------------------


def test_snapshot_release_clears_version_and_second_release_raises() -> None:
    m: CopyOnWriteStateMap[int, int, int] = CopyOnWriteStateMap()
    for i in range(10):
        m.put(i, i, i)
    snap = m.snapshot()
    assert not snap.is_released
    assert m._open_versions == {snap.version}
    assert m._highest_required == snap.version == 1

    snap.release()
    assert snap.is_released
    assert m._open_versions == set()
    assert m._highest_required == 0
    assert m._version == 1  # releasing never lowers the version

    # Flink's release is idempotent; cowstate's raises and changes nothing.
    with pytest.raises(SnapshotReleasedError):
        snap.release()
    with pytest.raises(SnapshotReleasedError):
        m.release(snap)
    with pytest.raises(SnapshotReleasedError):
        len(snap)
    with pytest.raises(SnapshotReleasedError):
        list(snap)
    assert m._open_versions == set()
    assert m._highest_required == 0

    # a snapshot of another map is refused and the other map keeps it open
    other: CopyOnWriteStateMap[int, int, int] = CopyOnWriteStateMap()
    foreign = other.snapshot()
    with pytest.raises(ForeignSnapshotError):
        m.release(foreign)
    assert other._open_versions == {1}
    assert not foreign.is_released

    # the context manager releases; the next version is 2
    with m.snapshot() as second:
        assert second.version == 2
        assert m._open_versions == {2}
    assert second.is_released
    assert m._open_versions == set()


# --------------------------------------------------------------------------
# 9.6 chain copy-on-write on the bucket-0 chain of (i, i)
# --------------------------------------------------------------------------


class ZeroHashInt(int):
    """An int that hashes to 0: ``(Z[i], Z[i])`` has composite hash 0 for every i.

    Flink's XOR made every ``(i, i)`` collide; cowstate's composite hash keeps
    them apart, so the scenario's one long chain is built from these keys."""

    def __hash__(self) -> int:
        return 0


Z = [ZeroHashInt(i) for i in range(10)]


def _chain_map() -> tuple[CopyOnWriteStateMap[int, int, list[int]], list[Any]]:
    """(Z[i], Z[i]) -> [i] for i = 0..9: composite hash 0, one chain in bucket 0,
    head 9 (new entries go to the head)."""
    m: CopyOnWriteStateMap[int, int, list[int]] = CopyOnWriteStateMap()
    for i in range(10):
        m.put(Z[i], Z[i], [i])
    original = chain(I(m)._primary[0])
    assert [e.key for e in original] == list(range(9, -1, -1))
    assert all(head is None for head in I(m)._primary[1:])
    return m, original


@pytest.mark.parametrize(
    ("op", "key", "copied"),
    [
        ("put", 5, {9, 8, 7, 6, 5}),
        ("put", 9, {9}),
        ("get", 5, {9, 8, 7, 6, 5}),
        ("get", 9, {9}),
        ("get", 0, set(range(10))),
        ("remove", 5, {9, 8, 7, 6}),
        ("remove", 0, {9, 8, 7, 6, 5, 4, 3, 2, 1}),
        ("remove", 9, set()),
    ],
)
def test_chain_copy_on_write_copies_only_the_prefix_up_to_the_changed_entry(
    op: str, key: int, copied: set[int]
) -> None:
    m, original = _chain_map()
    copied = {Z[k] for k in copied}  # ZeroHashInt members: they hash to 0
    by_key = {e.key: e for e in original}
    original_states = {e.key: e.state for e in original}
    snap = m.snapshot()

    result: Any = None
    if op == "put":
        m.put(Z[key], Z[key], [100 + key])
    elif op == "get":
        result = m.get(Z[key], Z[key])
    else:
        m.remove(Z[key], Z[key])

    live = chain(I(m)._primary[0])
    expected_keys = [k for k in range(9, -1, -1) if not (op == "remove" and k == key)]
    assert [e.key for e in live] == expected_keys
    for e in live:
        if e.key in copied:
            assert e is not by_key[e.key], e.key
            assert e.entry_version == 1
        else:  # entries after the changed one stay shared with the snapshot
            assert e is by_key[e.key], e.key
            assert e.entry_version == 0
    # copied predecessors keep the original (shared) state and state version
    for e in live:
        if e.key in copied and e.key != key:
            assert e.state is original_states[e.key]
            assert e.state_version == 0

    changed = [e for e in live if e.key == key]
    if op == "put":
        assert changed[0].state == [100 + key]
        assert changed[0].state_version == 1
    elif op == "get":
        assert result == [key]
        assert result is not original_states[Z[key]]
        assert changed[0].state is result
        assert changed[0].state_version == 1
        result.append(-1)  # the caller may mutate its copy
    else:
        assert not changed
        assert len(m) == 9

    # the snapshot still holds the ten original entries, objects, links and states
    walked = snapshot_entries(snap)
    assert walked == original and all(a is b for a, b in zip(walked, original, strict=True))
    assert [(e.key, e.namespace, e.state) for e in walked] == [
        (k, k, [k]) for k in range(9, -1, -1)
    ]
    for e in walked:
        assert e.state is original_states[e.key]
        assert e.entry_version == 0
    assert IS(snap)._data is not None
    assert all(head is None for head in IS(snap)._data[1:])
    snap.release()


# --------------------------------------------------------------------------
# 9.6 snapshot taken during a rehash
# --------------------------------------------------------------------------


def test_snapshot_during_rehash_of_keys_0_to_97_after_two_steps_is_136_slots_long() -> None:
    # Section 8, third bullet, with keys K(k) of composite hash k: section 8 gives rehashIndex 7
    # (Flink's bitMix); here every step moves four one-entry buckets, so r = 8.
    m: CopyOnWriteStateMap[HashKey, int, int] = CopyOnWriteStateMap()
    for k in range(98):
        m.put(K(k), 0, k)
    assert m.contains_key(K(0), 0)
    assert m.contains_key(K(1), 0)
    info = describe(m)
    assert (info.rehash_index, info.primary_size, info.rehash_size) == (8, 90, 8)
    assert I(m)._rehash is not None
    with m.snapshot() as snap:
        assert IS(snap)._data is not None
        assert len(IS(snap)._data) == max(8 + 128, 98) == 136
        assert IS(snap)._data[:120] == I(m)._primary[8:]
        assert IS(snap)._data[120:128] == I(m)._rehash[:8]
        assert IS(snap)._data[128:136] == I(m)._rehash[128:136] == [None] * 8
        assert len(snapshot_entries(snap)) == len(snap) == 98
        assert as_dict(snapshot_entries(snap)) == {(K(k), 0): k for k in range(98)}


def test_snapshot_during_rehash_has_three_region_layout_and_stays_isolated() -> None:
    # keys 0..89, then 128..135: buckets 0..7 of the 128-table hold two entries
    # (k + 128 -> k), so moved buckets fill BOTH halves of the rehash table and
    # the third region of the snapshot layout is not empty. The 98th insertion
    # (key 135) starts the rehash.
    m: CopyOnWriteStateMap[HashKey, int, list[int]] = CopyOnWriteStateMap()
    keys = [*range(90), *range(128, 136)]
    states = {k: [k] for k in keys}
    for k in keys:
        m.put(K(k), 0, states[k])
    assert I(m)._rehash is not None and I(m)._rehash_index == 0 and len(m) == 98

    for _ in range(3):  # each step moves two two-entry buckets
        m.contains_key(K(0), 0)
    r = I(m)._rehash_index
    assert r == 6
    assert (describe(m).primary_size, describe(m).rehash_size) == (86, 12)
    primary, rehash = I(m)._primary, I(m)._rehash
    assert rehash is not None

    snap = m.snapshot()
    data = IS(snap)._data
    assert data is not None
    assert len(data) == max(r + 128, len(m)) == 134
    assert data[: 128 - r] == primary[r:] and all(
        a is b for a, b in zip(data[: 128 - r], primary[r:], strict=True)
    )
    assert all(data[128 - r + j] is rehash[j] for j in range(r))
    assert all(data[128 + j] is rehash[128 + j] for j in range(r))
    assert [e.key.value for e in chain(data[128 - r])] == [0]  # rehash[0]
    assert [e.key.value for e in chain(data[128])] == [128]  # rehash[128]
    assert [e.key.value for e in chain(data[128 - r + 5])] == [5]  # rehash[5]
    assert [e.key.value for e in chain(data[133])] == [133]  # rehash[133]
    assert [e.key.value for e in chain(data[0])] == [134, 6]  # primary[6], unmoved
    frozen = list(data)
    frozen_entries = snapshot_entries(snap)
    assert len(frozen_entries) == len(snap) == 98

    # keep working: mutate states, insert, remove, finish the rehash
    m.get(K(50), 0).append(-50)  # type: ignore[union-attr]
    m.get(K(0), 0).append(-100)  # type: ignore[union-attr]
    m.remove(K(7), 0)
    m.remove(K(129), 0)
    for k in range(1000, 1010):
        m.put(K(k), 0, [k])
    while I(m)._rehash is not None:
        m.contains_key(K(1), 0)
    assert len(I(m)._primary) == 256
    assert len(m) == 98 - 2 + 10

    # the snapshot is unchanged: same slots, same entries, original states
    assert len(data) == 134 and all(a is b for a, b in zip(data, frozen, strict=True))
    walked = snapshot_entries(snap)
    assert all(a is b for a, b in zip(walked, frozen_entries, strict=True))
    assert as_dict(walked) == {(K(k), 0): [k] for k in keys}
    for e in walked:
        assert e.state is states[e.key.value]
    # entries moved after the snapshot were copied (rule E), earlier moves were not
    live = {e.key.value: e for e in live_entries(m)}
    snap_entries = {e.key.value: e for e in walked}
    assert live[60] is not snap_entries[60] and live[60].entry_version == 1
    assert live[5] is snap_entries[5]
    assert live[50].state == [50, -50] and live[0].state == [0, -100]
    snap.release()
    assert as_dict(live_entries(m)) == {
        **{(K(k), 0): [k] for k in keys if k not in (0, 7, 50, 129)},
        (K(0), 0): [0, -100],
        (K(50), 0): [50, -50],
        **{(K(k), 0): [k] for k in range(1000, 1010)},
    }


# --------------------------------------------------------------------------
# 9.6 overlapping snapshots released in both orders
# --------------------------------------------------------------------------


@pytest.mark.parametrize("older_first", [True, False], ids=["older-first", "newer-first"])
def test_overlapping_snapshots_released_in_either_order_keep_highest_required_and_copies(
    older_first: bool,
) -> None:
    m: CopyOnWriteStateMap[int, int, list[int]] = CopyOnWriteStateMap()
    o = [1]
    m.put(1, 0, o)
    s1 = m.snapshot()
    c1 = m.get(1, 0)  # copy made at version 1
    assert c1 is not o and c1 == [1]
    assert c1 is not None
    c1.append(2)
    s2 = m.snapshot()
    assert (s1.version, s2.version, m._highest_required) == (1, 2, 2)
    assert m._open_versions == {1, 2}

    first, second = (s1, s2) if older_first else (s2, s1)
    m.release(first)
    if older_first:
        assert m._highest_required == 2
        got = m.get(1, 0)  # c1 has state version 1 < 2: s2 can reach it
        assert got is not c1 and got == [1, 2]
    else:
        assert m._highest_required == 1
        got = m.get(1, 0)  # c1 was made after s1: no copy needed
        assert got is c1
    assert got is not None
    got.append(3)
    assert [(e.key, e.state) for e in second] == ([(1, [1, 2])] if older_first else [(1, [1])])

    m.release(second)
    assert m._highest_required == 0
    assert m._open_versions == set()
    assert m.get(1, 0) is got
    assert o == [1]
    assert c1 == ([1, 2] if older_first else [1, 2, 3])


# --------------------------------------------------------------------------
# 9.6 put_and_get_old / remove_and_get_old copies
# --------------------------------------------------------------------------


def test_put_and_get_old_and_remove_and_get_old_return_stored_object_without_snapshot() -> None:
    m: CopyOnWriteStateMap[int, int, list[int]] = CopyOnWriteStateMap()
    a, b = [1], [2]
    m.put(1, 0, a)
    m.put(2, 0, b)
    assert m.put_and_get_old(1, 0, [10]) is a
    assert m.remove_and_get_old(2, 0) is b


def test_put_and_get_old_and_remove_and_get_old_copy_states_a_snapshot_holds() -> None:
    m: CopyOnWriteStateMap[int, int, list[int]] = CopyOnWriteStateMap()
    a, b = [1], [2]
    m.put(1, 0, a)
    m.put(2, 0, b)
    snap = m.snapshot()
    new_state = [10]
    old_a = m.put_and_get_old(1, 0, new_state)
    old_b = m.remove_and_get_old(2, 0)
    assert old_a == [1] and old_a is not a
    assert old_b == [2] and old_b is not b
    assert old_a is not None and old_b is not None
    old_a.append(-1)
    old_b.append(-2)
    assert a == [1] and b == [2]
    assert as_dict(snapshot_entries(snap)) == {(1, 0): [1], (2, 0): [2]}
    assert {(e.key, e.namespace): e.state for e in snap} == {(1, 0): [1], (2, 0): [2]}

    # a state put after the snapshot is handed back as it is
    assert m.put_and_get_old(1, 0, [20]) is new_state
    m.put(3, 0, c := [3])
    assert m.remove_and_get_old(3, 0) is c
    snap.release()


# --------------------------------------------------------------------------
# 9.6 version overflow guard
# --------------------------------------------------------------------------


def test_second_snapshot_past_2_pow_31_minus_1_raises_version_overflow() -> None:
    m: CopyOnWriteStateMap[int, int, int] = CopyOnWriteStateMap()
    m.put(1, 0, 1)
    m._version = 2**31 - 2
    last = m.snapshot()
    assert last.version == 2**31 - 1
    with pytest.raises(VersionOverflowError):
        m.snapshot()
    # unlike Flink, the counter is not left past the limit and nothing else changes
    assert m._version == 2**31 - 1
    assert m._open_versions == {2**31 - 1}
    assert m._highest_required == 2**31 - 1
    assert [tuple(e) for e in last] == [(1, 0, 1)]
    last.release()
    assert m._open_versions == set() and m._highest_required == 0
    assert m.get(1, 0) == 1


# --------------------------------------------------------------------------
# 9.6 fail-fast iteration
# --------------------------------------------------------------------------


def _ten() -> CopyOnWriteStateMap[int, int, int]:
    m: CopyOnWriteStateMap[int, int, int] = CopyOnWriteStateMap()
    for k in range(10):
        m.put(k, 0, k)
    return m


def test_iterator_raises_when_a_mapping_is_inserted_during_iteration() -> None:
    m = _ten()
    it = iter(m)
    next(it)
    m.put(100, 0, 100)
    with pytest.raises(ConcurrentModificationError):
        next(it)


def test_iterator_raises_when_a_mapping_is_removed_during_iteration() -> None:
    m = _ten()
    it = iter(m)
    next(it)
    m.remove(5, 0)
    with pytest.raises(ConcurrentModificationError):
        next(it)


def test_iterator_raises_when_the_last_entry_was_yielded_before_an_insert() -> None:
    m = _ten()
    it = iter(m)
    for _ in range(10):
        next(it)
    m.put(100, 0, 100)
    with pytest.raises(ConcurrentModificationError):
        next(it)


def test_keys_iterator_raises_when_a_mapping_is_inserted_during_iteration() -> None:
    m = _ten()
    keys = m.keys(0)
    next(keys)
    m.put(100, 0, 100)
    with pytest.raises(ConcurrentModificationError):
        next(keys)


def test_iterator_created_before_an_insert_raises_on_first_next() -> None:
    # "an iterator raises ... when a mapping was added or removed ... since it was
    # created" (module docstring); Flink records expectedModCount in the iterator's
    # constructor. An insert between iter() and the first next() must be detected.
    m = _ten()
    it = iter(m)
    m.put(100, 0, 100)
    with pytest.raises(ConcurrentModificationError):
        next(it)


def test_iterator_created_before_a_remove_raises_on_first_next() -> None:
    m = _ten()
    it = iter(m)
    m.remove(3, 0)
    with pytest.raises(ConcurrentModificationError):
        next(it)


def add_to_previous(previous: int | None, value: int) -> int:
    assert previous is not None, "transform of a mapped key gets its state"
    return previous + value


@pytest.mark.parametrize("with_snapshot", [False, True], ids=["no-snapshot", "snapshot-open"])
def test_iterator_allows_value_updates_of_existing_keys_when_not_rehashing(
    with_snapshot: bool,
) -> None:
    m = _ten()
    snap = m.snapshot() if with_snapshot else None
    seen = []
    for entry in m:
        seen.append(entry.key)
        m.put(entry.key, 0, entry.state + 100)
        m.put((entry.key + 1) % 10, 0, -1)  # also an entry not yet visited
        m.transform(entry.key, 0, 1000, add_to_previous)
        assert m.get(entry.key, 0) == entry.state + 1100
    assert sorted(seen) == list(range(10))
    assert len(m) == 10
    if snap is not None:
        assert {(e.key, e.state) for e in snap} == {(k, k) for k in range(10)}
        snap.release()


def test_iterator_raises_when_a_rehash_step_runs_during_iteration() -> None:
    m: CopyOnWriteStateMap[int, int, int] = CopyOnWriteStateMap(initial_capacity=4)
    for k in range(5):  # the 5th insertion starts a rehash
        m.put(k, 0, k)
    assert I(m)._rehash is not None
    it = iter(m)
    next(it)
    m.get(0, 0)  # a keyed operation runs a rehash step
    with pytest.raises(ConcurrentModificationError):
        next(it)
