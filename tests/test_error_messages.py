"""Every error says what was expected and what came -- word for word.

The standards ask for precise messages; these tests pin them (and the reprs
and the introspection record), so a change to a message is a decision, not
an accident. They also kill the mutation run's message mutants (the tests
marked ``kills``). Every test runs on both maps; the errors' constructors, and
the key or namespace each operation names when user code raises (rule U), are
in ``test_errors.py``.
"""

from __future__ import annotations

import functools
import pickle
from typing import Any

import pytest
from conftest import bind_map_class

from cowstate import CopyOnWriteStateMap, state_map, value_codec
from cowstate.arithmetic import MAX_VERSION, MINIMUM_CAPACITY
from cowstate.errors import (
    ConcurrentModificationError,
    ForeignSnapshotError,
    InvalidArgumentError,
    MaximumCapacityError,
    NoneStateError,
    SnapshotReleasedError,
    TransformFunctionError,
    UnhashableKeyError,
    VersionOverflowError,
)
from cowstate.introspection import MapInternals, describe
from cowstate.serializers import (
    DefaultSerializer,
    ImmutableSerializer,
    PickleSerializer,
    is_known_immutable,
)
from cowstate_spec.keys import value_key

Map = CopyOnWriteStateMap[Any, Any, Any]

try:
    from cowstate._cmap import CHUNK_BUCKETS
except ImportError:  # not built (test_implementations.py fails): the pure map has no chunks
    CHUNK_BUCKETS = MINIMUM_CAPACITY


@pytest.fixture(autouse=True)
def _each_map(map_impl: str) -> None:
    """Every test here runs on the pure and the C map (tests/conftest.py)."""
    bind_map_class(globals(), map_impl)


def message(exc_type: type[Exception], call: Any) -> str:
    with pytest.raises(exc_type) as info:
        call()
    return str(info.value)


def failing(old: Any, value: Any) -> Any:
    raise ValueError("boom")


def test_none_state_messages() -> None:
    m: Map = CopyOnWriteStateMap()
    assert message(NoneStateError, lambda: m.put(1, "ns", None)) == (
        "expected a state for put(1, 'ns'), got None; None means absent, use remove() to unmap"
    )
    assert message(NoneStateError, lambda: m.put_and_get_old(1, "ns", None)) == (
        "expected a state for put_and_get_old(1, 'ns'), got None; None means absent, "
        "use remove() to unmap"
    )
    assert message(NoneStateError, lambda: m.transform(1, "ns", 0, lambda o, v: None)) == (
        "expected the transform function to return a state, got None for (1, 'ns'); "
        "the mapping is unchanged"
    )


def test_unhashable_messages() -> None:
    m: Map = CopyOnWriteStateMap()
    assert message(UnhashableKeyError, lambda: m.get([1], "ns")) == (
        "expected a hashable key, got list [1]"
    )
    assert message(UnhashableKeyError, lambda: m.put(1, {}, 1)) == (
        "expected a hashable namespace, got dict {}"
    )


def test_argument_messages() -> None:
    not_an_int: Any = "x"
    not_a_serializer: Any = 3
    assert message(
        InvalidArgumentError, lambda: CopyOnWriteStateMap(initial_capacity=not_an_int)
    ) == ("expected an int initial_capacity, got str 'x'")
    assert message(InvalidArgumentError, lambda: CopyOnWriteStateMap(initial_capacity=-1)) == (
        "expected initial_capacity >= 0, got -1"
    )
    assert message(
        InvalidArgumentError, lambda: CopyOnWriteStateMap(serializer=not_a_serializer)
    ) == ("expected a serializer with copy/serialize/deserialize, got int")
    m: Map = CopyOnWriteStateMap()
    assert message(InvalidArgumentError, lambda: (1,) in m) == (
        "expected a (key, namespace) tuple, got tuple (1,)"
    )


def test_change_tracking_messages() -> None:
    m: Map = CopyOnWriteStateMap()
    not_an_int: Any = "8"
    assert message(InvalidArgumentError, lambda: m.track_changes(0)) == (
        "expected a removal limit >= 1, got 0"
    )
    assert message(InvalidArgumentError, lambda: m.track_changes(not_an_int)) == (
        "expected a removal limit >= 1, got '8'"
    )
    assert message(InvalidArgumentError, lambda: m.removals_since(not_an_int)) == (
        "expected an int version, got str '8'"
    )
    snapshot = m.snapshot()
    nothing: Any = None
    assert message(InvalidArgumentError, lambda: snapshot.changed_items(nothing)) == (
        "expected an int since, got NoneType None"
    )
    assert message(InvalidArgumentError, lambda: m.trim_removals(3)) == (
        "expected a version <= V + 1 = 2 to trim the removal log to, got 3"
    )
    snapshot.release()


def test_transform_function_messages() -> None:
    m: Map = CopyOnWriteStateMap()
    assert message(TransformFunctionError, lambda: m.transform(1, "ns", 0, failing)) == (
        "expected transform function 'failing' to return a state, got ValueError: boom; "
        "(1, 'ns') still maps the same state object (an in-place change the function made "
        "to its argument is not undone)"
    )
    nameless = functools.partial(failing)
    assert message(TransformFunctionError, lambda: m.transform(1, "ns", 0, nameless)) == (
        f"expected transform function {nameless!r} to return a state, got ValueError: boom; "
        "(1, 'ns') still maps the same state object (an in-place change the function made "
        "to its argument is not undone)"
    )


def test_snapshot_messages() -> None:
    m: Map = CopyOnWriteStateMap()
    other: Map = CopyOnWriteStateMap()
    foreign = other.snapshot()
    assert message(ForeignSnapshotError, lambda: m.release(foreign)) == (
        "expected a snapshot taken from this map, got one of another map (version 1)"
    )
    assert message(ForeignSnapshotError, lambda: m.release(3)) == (  # type: ignore[arg-type]
        "expected a snapshot taken from this map, got int"
    )
    snap = m.snapshot()
    snap.release()
    assert message(SnapshotReleasedError, snap.release) == (
        "expected an open snapshot, got snapshot version 1 which was already released"
    )
    assert message(SnapshotReleasedError, lambda: len(snap)) == (
        "expected an open snapshot, got snapshot version 1 which was released"
    )
    kept = m.snapshot()
    assert message(SnapshotReleasedError, lambda: m._release_version(9)) == (
        "expected an open snapshot version of this map [2], got 9"
    )
    kept.release()
    foreign.release()


def test_iteration_message() -> None:
    m: Map = CopyOnWriteStateMap()
    m.put(1, "ns", 1)
    it = iter(m)
    m.put(2, "ns", 2)
    assert message(ConcurrentModificationError, lambda: list(it)) == (
        "expected no mapping added or removed and no rehash step while iterating the map; "
        "collect what you need first, e.g. list(m.keys(ns))"
    )


def test_version_overflow_message_and_nothing_changes() -> None:
    m: Map = CopyOnWriteStateMap()
    m._version = MAX_VERSION
    assert message(VersionOverflowError, m.snapshot) == (
        f"expected fewer than {MAX_VERSION} snapshots of one map, the next would be version "
        f"{MAX_VERSION + 1}; restart with a fresh map"
    )
    assert m._version == MAX_VERSION and not m._open_versions and m._highest_required == 0


@pytest.mark.pure_map_internals  # patches the pure module's constants; the C cap is compiled in
def test_maximum_capacity_is_a_documented_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real cap (2**30 buckets) needs 8 GiB per table: lower it for this map.
    monkeypatch.setattr(state_map, "MAXIMUM_CAPACITY", 8)
    m: Map = CopyOnWriteStateMap(initial_capacity=8)
    assert message(MaximumCapacityError, m._double_capacity) == (
        f"expected at most {2**31 - 9} entries at the maximum capacity 8, got 0"
    )
    assert m._rehash is None and len(m._primary) == 8


def test_reprs() -> None:
    m: Map = CopyOnWriteStateMap(initial_capacity=4)
    assert repr(m) == "<CopyOnWriteStateMap size=0 capacity=4 version=0 open=[]>"
    for i in range(5):  # the 5th insert starts the rehash to 8
        m.put(i, "ns", i)
    snap = m.snapshot()
    assert repr(m) == "<CopyOnWriteStateMap size=5 capacity=4 rehashing version=1 open=[1]>"
    assert repr(snap) == "<StateMapSnapshot version=1 size=5>"
    assert snap.is_released is False
    snap.release()
    assert repr(snap) == "<StateMapSnapshot version=1 released>"
    assert snap.is_released is True
    assert repr(DefaultSerializer()) == "DefaultSerializer()"
    assert repr(ImmutableSerializer()) == "ImmutableSerializer()"


def test_describe_reports_every_field() -> None:
    m: Map = CopyOnWriteStateMap(initial_capacity=4)
    assert describe(m) == MapInternals(
        capacity=4,
        rehash_capacity=0,
        is_rehashing=False,
        rehash_index=0,
        primary_size=0,
        rehash_size=0,
        threshold=3,
        version=0,
        highest_required_version=0,
        open_versions=frozenset(),
    )
    m = CopyOnWriteStateMap(initial_capacity=8)
    for i in range(8):  # the 8th insert starts the rehash to 16
        m.put(value_key(i), 0, i)
    m.get(value_key(0), 0)  # one step: buckets 0-3, four entries
    snap = m.snapshot()
    assert describe(m) == MapInternals(
        capacity=8,
        rehash_capacity=16,
        is_rehashing=True,
        rehash_index=4,
        primary_size=4,
        rehash_size=4,
        threshold=12,
        version=1,
        highest_required_version=1,
        open_versions=frozenset({1}),
    )
    snap.release()


def test_default_serializer() -> None:
    s = DefaultSerializer()
    t = (1, "a", (2.0, b"x"), frozenset({3}))
    assert s.copy(t) is t and s.copy("abc") is not None
    nested: list[Any] = [[1], {"a": [2]}]
    copy = s.copy(nested)
    assert copy == nested and copy is not nested
    assert copy[0] is not nested[0] and copy[1]["a"] is not nested[1]["a"]
    assert not is_known_immutable((1, [2])) and is_known_immutable((1, (2, "x")))
    data = s.serialize(nested)
    assert data == value_codec.encode(nested) and data[0] == value_codec.VERSION
    assert s.deserialize(data) == nested
    pickled = PickleSerializer().serialize(nested)
    assert pickled == pickle.dumps(nested, protocol=pickle.HIGHEST_PROTOCOL)
    assert PickleSerializer().deserialize(pickled) == nested
    assert ImmutableSerializer().copy(nested) is nested


class FlakyHash:
    """Unhashable on the first call only: ``of`` then finds both parts hashable."""

    def __init__(self) -> None:
        self.calls = 0

    def __hash__(self) -> int:
        self.calls += 1
        if self.calls == 1:
            raise TypeError("not yet")
        return 7

    def __repr__(self) -> str:
        return "FlakyHash()"


def test_unhashable_message_when_the_hash_fails_only_once() -> None:
    m: Map = CopyOnWriteStateMap()
    assert message(UnhashableKeyError, lambda: m.get(FlakyHash(), "ns")) == (
        "expected a hashable key and namespace, got FlakyHash() and 'ns'"
    )
    assert len(m) == 0


def test_a_change_after_the_last_entry_is_detected_at_the_end() -> None:
    m: Map = CopyOnWriteStateMap()
    m.put(1, "ns", 1)
    it = iter(m)
    assert next(it) == (1, "ns", 1)
    m.put(2, "ns", 2)
    assert message(ConcurrentModificationError, lambda: next(it)) == (
        "expected no mapping added or removed and no rehash step while iterating the map; "
        "collect what you need first, e.g. list(m.keys(ns))"
    )


# ----------------------------- snapshots and iteration: the messages of misuse


@pytest.mark.kills(module="cowstate.state_map")
@pytest.mark.kills(module="cowstate.map_contract")
def test_a_released_snapshot_says_its_version_when_read() -> None:
    # StateMapSnapshot._check_open, __iter__: the released messages
    # (map_contract.released_message).
    m: Map = CopyOnWriteStateMap()
    m.put("k", "ns", [1])
    m.put("j", "ns", [2])
    first, second = m.snapshot(), m.snapshot()
    first.release()
    with pytest.raises(SnapshotReleasedError) as caught:
        len(first)
    assert str(caught.value) == (
        "expected an open snapshot, got snapshot version 1 which was released"
    )
    reading = iter(second)
    next(reading)
    second.release()
    with pytest.raises(SnapshotReleasedError) as during:
        next(reading)
    assert str(during.value) == "snapshot version 2 was released while being read"


@pytest.mark.kills(module="cowstate.state_map")
@pytest.mark.kills(module="cowstate.map_contract")
def test_iteration_across_a_change_says_what_to_do_instead() -> None:
    # CopyOnWriteStateMap._iterate: the message of ConcurrentModificationError
    # (map_contract.modified_message).
    m: Map = CopyOnWriteStateMap()
    m.put("k", "ns", [1])
    m.put("j", "ns", [2])
    iterator = iter(m)
    next(iterator)
    m.put("i", "ns", [3])
    with pytest.raises(ConcurrentModificationError) as caught:
        next(iterator)
    assert str(caught.value) == (
        "expected no mapping added or removed and no rehash step while iterating "
        "the map; collect what you need first, e.g. list(m.keys(ns))"
    )


@pytest.mark.kills(module="cowstate.state_map")
def test_iteration_ended_by_a_change_after_the_last_mapping_says_so_too() -> None:
    # CopyOnWriteStateMap._iterate: the check after the last bucket (a change
    # made after the last mapping was handed out).
    m: Map = CopyOnWriteStateMap()
    m.put("k", "ns", [1])
    iterator = iter(m)
    next(iterator)
    m.remove("k", "ns")  # no mapping left to reach: only the final check sees it
    with pytest.raises(ConcurrentModificationError) as caught:
        next(iterator)
    assert str(caught.value).startswith("expected no mapping added or removed")
    # ... and the check before the first mapping (a change between iter and next)
    unstarted = iter(m)
    m.put("j", "ns", [2])
    with pytest.raises(ConcurrentModificationError) as before:
        next(unstarted)
    assert str(before.value) == str(caught.value)


@pytest.mark.kills(module="cowstate.map_contract")
def test_a_foreign_snapshot_without_a_version_is_named_with_a_question_mark() -> None:
    # map_contract.foreign_message: the "?" of a StateMapSnapshot without a version.
    class StateMapSnapshot:
        pass

    foreign: Any = StateMapSnapshot()
    with pytest.raises(ForeignSnapshotError) as caught:
        CopyOnWriteStateMap().release(foreign)
    assert str(caught.value) == (
        "expected a snapshot taken from this map, got one of another map (version ?)"
    )


# -------------------------------------------- describe: capacities (the C map's from its export)


@pytest.mark.kills(module="cowstate.introspection")
def test_describe_reads_both_capacities_during_a_rehash() -> None:
    # introspection.describe: the capacity fields of the C map's structure export
    # (written for the C map, as test_describe_reads_the_c_maps_capacities_from_its_export).
    m: Map = CopyOnWriteStateMap(initial_capacity=4)
    for k in range(5):  # past the threshold of 4 buckets: a rehash into 8
        m.put(k, "ns", [k])
    assert describe(m).capacity == 4
    assert describe(m).rehash_capacity == 8


@pytest.mark.kills(module="cowstate.introspection")
def test_describe_reads_the_capacity_of_a_map_of_several_c_chunks() -> None:
    # introspection.describe: capacity is the directory's bucket count, not its
    # buckets per chunk (equal within one chunk).
    capacity = 2 * CHUNK_BUCKETS
    c: Map = CopyOnWriteStateMap(initial_capacity=capacity)
    for k in range(capacity * 3 // 4 + 2):  # past 3/4 of the capacity: a rehash into twice it
        c.put(k, "ns", [k])
    assert (describe(c).capacity, describe(c).rehash_capacity) == (capacity, 2 * capacity)
