"""Bad input gets a precise cowstate.errors exception and changes nothing.

"Nothing" is checked strongly: the contents equal the model's (which refused
the same call), and the map's bookkeeping -- capacity, rehash progress,
versions, counters -- is identical before and after, even mid-rehash.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import bind_map_class

from cowstate import (
    ConcurrentModificationError,
    CopyOnWriteStateMap,
    CowStateError,
    ForeignSnapshotError,
    InvalidArgumentError,
    NoneStateError,
    SnapshotReleasedError,
    StateCopyError,
    TransformFunctionError,
    UnhashableKeyError,
)
from cowstate.introspection import MapInternals, describe
from cowstate_model import ReferenceStateMap
from cowstate_spec.contract import snapshot_contents

Map = CopyOnWriteStateMap[Any, Any, Any]


@pytest.fixture(autouse=True)
def _each_map(map_impl: str) -> None:
    """Every test here runs on the pure and the C map (tests/conftest.py)."""
    bind_map_class(globals(), map_impl)


def rehashing_pair() -> tuple[Map, ReferenceStateMap]:
    """A map in the middle of a rehash, with an open snapshot, and its model."""
    m: Map = CopyOnWriteStateMap(initial_capacity=4)
    model = ReferenceStateMap()
    for i in range(5):
        m.put(i, "ns", [i])
        model.put(i, "ns", [i])
    m.snapshot()
    assert describe(m).is_rehashing
    return m, model


def state_of(m: Map) -> tuple[dict[tuple[Any, Any], Any], MapInternals]:
    return snapshot_contents(m), describe(m)


def assert_refused(
    m: Map,
    model: ReferenceStateMap,
    call: Callable[[Any], Any],
    error: type[CowStateError],
    *fragments: str,
) -> CowStateError:
    before = state_of(m)
    with pytest.raises(error) as excinfo:
        call(m)
    with pytest.raises(Exception):  # noqa: B017 - the model refuses too, in its own words
        call(model)
    assert state_of(m) == before, "a refused call changed the map"
    assert snapshot_contents(m) == snapshot_contents(model)
    message = str(excinfo.value)
    assert "expected" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return excinfo.value


@pytest.mark.parametrize("op", ["put", "put_and_get_old"])
def test_none_state_is_refused(op: str) -> None:
    m, model = rehashing_pair()
    assert_refused(
        m, model, lambda t: getattr(t, op)(1, "ns", None), NoneStateError, "got None", "(1, 'ns')"
    )
    assert_refused(m, model, lambda t: getattr(t, op)(99, "ns", None), NoneStateError)
    assert isinstance(NoneStateError("x"), ValueError)


UNHASHABLE_CALLS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "get": lambda t, k, n: t.get(k, n),
    "contains_key": lambda t, k, n: t.contains_key(k, n),
    "put": lambda t, k, n: t.put(k, n, 1),
    "put_and_get_old": lambda t, k, n: t.put_and_get_old(k, n, 1),
    "remove": lambda t, k, n: t.remove(k, n),
    "remove_and_get_old": lambda t, k, n: t.remove_and_get_old(k, n),
    "transform": lambda t, k, n: t.transform(k, n, 1, lambda old, v: v),
}


@pytest.mark.parametrize("op", sorted(UNHASHABLE_CALLS))
@pytest.mark.parametrize("role", ["key", "namespace"])
def test_unhashable_key_or_namespace_is_refused_before_any_rehash_step(op: str, role: str) -> None:
    m, model = rehashing_pair()
    bad: list[int] = [1, 2]
    args = (bad, "ns") if role == "key" else (1, bad)
    error = assert_refused(
        m,
        model,
        lambda t: UNHASHABLE_CALLS[op](t, *args),
        UnhashableKeyError,
        f"hashable {role}",
        "list",
        "[1, 2]",
    )
    assert isinstance(error, TypeError)


def test_transform_function_that_raises_leaves_existing_and_absent_mappings_alone() -> None:
    m, model = rehashing_pair()

    def boom(old: Any, value: Any) -> Any:
        raise KeyError("boom")

    error = assert_refused(
        m,
        model,
        lambda t: t.transform(2, "ns", 7, boom),
        TransformFunctionError,
        "boom",
        "KeyError",
        "(2, 'ns')",
    )
    assert isinstance(error.__cause__, KeyError)
    assert_refused(m, model, lambda t: t.transform(42, "ns", 7, boom), TransformFunctionError)
    assert not m.contains_key(42, "ns")


def test_transform_function_that_returns_none_is_refused() -> None:
    m, model = rehashing_pair()
    assert_refused(
        m, model, lambda t: t.transform(2, "ns", 7, lambda old, v: None), NoneStateError, "got None"
    )
    assert_refused(
        m, model, lambda t: t.transform(42, "ns", 7, lambda old, v: None), NoneStateError
    )
    assert not m.contains_key(42, "ns")


def test_releasing_a_snapshot_twice_raises_and_keeps_the_other_open() -> None:
    m: Map = CopyOnWriteStateMap()
    m.put(1, 0, [1])
    first, second = m.snapshot(), m.snapshot()
    first.release()
    before = describe(m)
    with pytest.raises(SnapshotReleasedError, match="already released"):
        first.release()
    with pytest.raises(SnapshotReleasedError):
        m.release(first)
    assert describe(m) == before
    assert before.open_versions == {second.version}
    assert before.highest_required_version == second.version


def test_releasing_a_snapshot_of_another_map_is_refused() -> None:
    m: Map = CopyOnWriteStateMap()
    other: Map = CopyOnWriteStateMap()
    foreign = other.snapshot()
    with pytest.raises(ForeignSnapshotError, match="another map"):
        m.release(foreign)
    assert not foreign.is_released
    assert describe(other).open_versions == {foreign.version}
    with pytest.raises(ForeignSnapshotError, match="str"):
        m.release("version 1")  # type: ignore[arg-type]


def test_reading_a_released_snapshot_raises() -> None:
    m: Map = CopyOnWriteStateMap()
    for i in range(5):
        m.put(i, 0, i)
    snap = m.snapshot()
    snap.release()
    with pytest.raises(SnapshotReleasedError, match="was released"):
        len(snap)
    with pytest.raises(SnapshotReleasedError):
        list(snap)


def test_releasing_a_snapshot_while_reading_it_stops_the_reader() -> None:
    m: Map = CopyOnWriteStateMap()
    for i in range(5):
        m.put(i, 0, i)
    snap = m.snapshot()
    reader = iter(snap)
    next(reader)
    snap.release()
    with pytest.raises(SnapshotReleasedError, match="released while being read"):
        next(reader)


def test_changing_the_map_while_iterating_raises_and_keeps_the_change() -> None:
    m: Map = CopyOnWriteStateMap()
    for i in range(5):
        m.put(i, 0, i)
    entries = iter(m)
    next(entries)
    m.put(100, 0, 100)
    with pytest.raises(ConcurrentModificationError, match="while iterating"):
        next(entries)
    assert m.get(100, 0) == 100 and len(m) == 6


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"initial_capacity": -1}, "initial_capacity >= 0"),
        ({"initial_capacity": "8"}, "int initial_capacity"),
        ({"initial_capacity": 8.0}, "int initial_capacity"),
        ({"serializer": object()}, "copy/serialize/deserialize"),
    ],
)
def test_bad_constructor_arguments_are_refused(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidArgumentError, match=fragment):
        CopyOnWriteStateMap(**kwargs)


def test_membership_needs_a_key_namespace_pair() -> None:
    m: Map = CopyOnWriteStateMap()
    m.put(1, 0, 1)
    assert (1, 0) in m and (2, 0) not in m
    with pytest.raises(InvalidArgumentError, match="tuple"):
        _ = 1 in m


def test_every_error_class_belongs_to_the_hierarchy() -> None:
    import cowstate.errors as errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), CowStateError)


class FailingCopy:
    """A serializer whose copy raises: rule S cannot copy a shared state."""

    def copy(self, state: Any) -> Any:
        raise RuntimeError("copy failed")

    def serialize(self, state: Any) -> bytes:
        return b""

    def deserialize(self, data: bytes) -> Any:
        return None


@pytest.mark.parametrize("op", ["remove_and_get_old", "put_and_get_old", "get"])
def test_regression_a_failing_state_copy_loses_nothing(op: str) -> None:
    # remove_and_get_old used to unmap first and copy afterwards: a raising copy
    # lost the old state. Now every rule-S copy comes before any change.
    m: Map = CopyOnWriteStateMap(serializer=FailingCopy())
    state = [1]
    m.put(1, "ns", state)
    snap = m.snapshot()
    args: tuple[Any, ...] = (1, "ns", [2]) if op == "put_and_get_old" else (1, "ns")
    with pytest.raises(StateCopyError, match="copy failed") as info:
        getattr(m, op)(*args)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert len(m) == 1
    assert [tuple(e) for e in m] == [(1, "ns", state)]
    assert [tuple(e) for e in snap] == [(1, "ns", [1])]
    snap.release()


def test_transform_whose_function_mutates_then_raises_keeps_the_mutation_when_unshared() -> None:
    # The documented contract: transform hands a state no snapshot holds to the
    # function as it is, so an in-place change made before raising stays; the
    # mapping itself (which object is mapped) does not change.
    m: Map = CopyOnWriteStateMap()
    state = [1]
    m.put(1, "ns", state)

    def mutate_then_fail(old: Any, value: Any) -> Any:
        old.append(value)
        raise ValueError("late")

    with pytest.raises(TransformFunctionError):
        m.transform(1, "ns", 2, mutate_then_fail)
    assert m.get(1, "ns") is state and state == [1, 2]
    with m.snapshot() as snap:  # shared: the function gets a copy
        with pytest.raises(TransformFunctionError):
            m.transform(1, "ns", 3, mutate_then_fail)
        assert [tuple(e) for e in snap] == [(1, "ns", [1, 2])]
        assert [tuple(e) for e in m] == [(1, "ns", [1, 2])]
