"""Rule U: whatever user code raises comes out as a documented error, the map unchanged.

User code is a key's or namespace's ``__hash__`` and ``__eq__``, the
serializer's ``copy`` (a state's ``__deepcopy__``) and a transform function
(``cowstate.state_map``'s design docstring, rule U and the transform
contract). Here over both maps, every table and the heap backend's
aggregating state:

- the state machine with the rule of hostile user code
  (``machine_for(..., hostile=True)``) over every implementation;
- the deliberately broken maps of ``USER_CODE_BUGS`` that only that rule can
  see, each caught, each method's identity rewrite passing;
- the backend machine with an aggregate function that mutates, then raises;
- example-based checks of each error, its base classes, its chained cause,
  the map's contents, snapshots and structural invariants afterwards.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable
from typing import Any

import pytest
from conftest import MAPS, TABLES, Tables, table_types
from hypothesis import settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test
from leak_support import traced_growth

from cowstate import HeapKeyedStateBackend, KeyGroupRange
from cowstate.descriptors import AggregatingStateDescriptor, MapStateDescriptor
from cowstate.errors import (
    ConcurrentModificationError,
    CowStateError,
    KeyComparisonError,
    KeyHashError,
    StateCopyError,
    StateTooDeepError,
    TransformFunctionError,
    UnhashableKeyError,
)
from cowstate_spec.backend_machine import MAX_PARALLELISM, backend_machine_for
from cowstate_spec.backends import BACKENDS, BackendImplementation
from cowstate_spec.bad_implementations import USER_CODE_BUGS, Bug, bad_implementation
from cowstate_spec.contract import snapshot_contents
from cowstate_spec.hostile import (
    CopyTrapList,
    MutateThenRaise,
    TrapKey,
    Trapped,
    armed,
    deep_state,
)
from cowstate_spec.implementations import IMPLEMENTATIONS, Implementation
from cowstate_spec.invariants import check_map, fingerprint
from cowstate_spec.machine import machine_for
from cowstate_spec.profiles import control_examples, hunt, hunt_settings, strength

MAP_NAMES = list(MAPS)

#: The keyed operations and their arguments after (key, namespace).
CALLS: dict[str, tuple[Any, ...]] = {
    "get": (),
    "contains_key": (),
    "put": ([9],),
    "put_and_get_old": ([9],),
    "remove": (),
    "remove_and_get_old": (),
    "transform": (1, lambda old, value: [value]),
}
HANDING_OUT = ["get", "put_and_get_old", "remove_and_get_old", "transform"]


# ------------------------------------------------------------ the state machine


#: The hostile machines run 1/SHARE of the plain machines' examples: make
#: strength a quarter, make test (COWSTATE_STRENGTH=reduced) an eighth; the
#: planted user-code bugs below are hunted with the same budget in both.
SHARE = 4 if strength() == "full" else 8


@pytest.mark.parametrize(
    "implementation",
    [i for i in IMPLEMENTATIONS if i.name != "reference-model"],
    ids=repr,
)
def test_the_machine_with_hostile_user_code_agrees_with_the_model(
    implementation: Implementation,
) -> None:
    # A quarter of the plain machine's examples (an eighth in make test's
    # reduced form): the rule of hostile user code is one of its rules, the
    # others run as in tests/test_state_machine.py.
    current = settings()
    examples = max(4, round(current.max_examples * implementation.example_share / SHARE))
    run_state_machine_as_test(
        machine_for(implementation, hostile=True),
        settings=settings(current, max_examples=examples),
    )


@pytest.mark.parametrize("implementation", BACKENDS, ids=repr)
def test_the_backend_machine_with_hostile_user_code_agrees_with_the_model(
    implementation: BackendImplementation, forced_interleavings: None
) -> None:
    # As tests/test_backend_machine.py (every key group, twice the steps), with
    # a quarter of its examples (an eighth in make test's reduced form): of
    # RocksDB's half of the profile's, as the plain machine runs it.
    current = settings()
    examples = max(4, round(current.max_examples * implementation.example_share / SHARE))
    run_state_machine_as_test(
        backend_machine_for(implementation, KeyGroupRange(0, MAX_PARALLELISM - 1), hostile=True),
        settings=settings(
            current,
            max_examples=examples,
            stateful_step_count=2 * current.stateful_step_count,
        ),
    )


HUNT = hunt_settings(max_examples=400, stateful_step_count=50)


@pytest.mark.parametrize("bug", USER_CODE_BUGS, ids=lambda bug: bug.name)
def test_the_hostile_machine_catches(bug: Bug) -> None:
    caught_after(bug)


@pytest.mark.parametrize("bug", USER_CODE_BUGS, ids=lambda bug: bug.name)
def test_the_identity_rewrite_of_each_bug_passes(bug: Bug) -> None:
    # make test (COWSTATE_STRENGTH=reduced): as many examples as the hunt took
    control = Bug(f"identity-{bug.name}", bug.method, bug.old, bug.old, "control", bug.cls)
    machine = machine_for(bad_implementation(control), hostile=True)
    examples = control_examples(caught_after(bug), 40)
    run_state_machine_as_test(machine, settings=settings(HUNT, max_examples=examples))


def caught_after(bug: Bug) -> int:
    """The examples the hostile machine's hunt took to catch ``bug`` (once per
    process: the catch test and its control share it)."""
    if bug.name not in CAUGHT_AFTER:
        machine = machine_for(bad_implementation(bug), hostile=True)
        CAUGHT_AFTER[bug.name] = hunt(machine, HUNT, (AssertionError, Flaky))
    return CAUGHT_AFTER[bug.name]


CAUGHT_AFTER: dict[str, int] = {}


# ----------------------------------------------------------------- the maps


def loaded(map_name: str) -> tuple[Any, dict[tuple[Any, Any], Any]]:
    """A map of capacity 4 in a rehash, with colliding keys, and its contents."""
    m = MAPS[map_name](initial_capacity=4)
    for i in range(6):
        m.put(i, "ns", [i])
    m.put("a", "ns", {"p": 1})
    return m, snapshot_contents(m)


def refused(call: Callable[[], Any], error: type[Exception]) -> Exception:
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, CowStateError)
    assert isinstance(info.value.__cause__, Trapped | RecursionError), info.value.__cause__
    return info.value


@pytest.mark.parametrize("map_name", MAP_NAMES)
@pytest.mark.parametrize("op", sorted(CALLS))
@pytest.mark.parametrize("as_key", [True, False])
def test_a_raising_hash_is_key_hash_error_and_changes_nothing(
    map_name: str, op: str, as_key: bool
) -> None:
    m, before = loaded(map_name)
    snap = m.snapshot()
    fp = fingerprint(snap)
    probe = TrapKey("probe", 0, 0, "hash")
    args = (probe, "ns") if as_key else (3, probe)
    err = refused(lambda: getattr(m, op)(*args, *CALLS[op]), KeyHashError)
    assert isinstance(err, UnhashableKeyError) and isinstance(err, TypeError)
    assert f"the {'key' if as_key else 'namespace'} {probe!r}" in str(err)
    assert "the map is unchanged" in str(err)
    assert snapshot_contents(m) == before == snapshot_contents(snap)
    check_map(m, [fp])


class TypeErrorHash:
    """A key or namespace whose ``__hash__`` raises ``TypeError``; ``raised``
    holds each one, so a test can ask which the error was chained from."""

    def __init__(self) -> None:
        self.raised: list[TypeError] = []

    def __hash__(self) -> int:
        error = TypeError(f"no hash ({len(self.raised)})")
        self.raised.append(error)
        raise error

    def __repr__(self) -> str:
        return "TypeErrorHash()"


@pytest.mark.parametrize("map_name", MAP_NAMES)
@pytest.mark.parametrize("op", sorted(CALLS))
@pytest.mark.parametrize("as_key", [True, False])
def test_a_hash_raising_type_error_is_unhashable_key_error_chained_from_it(
    map_name: str, op: str, as_key: bool
) -> None:
    # Issue 26: the pure map raised it `from None`, the C map with no context.
    m, before = loaded(map_name)
    probe = TypeErrorHash()
    args = (probe, "ns") if as_key else (3, probe)
    with pytest.raises(UnhashableKeyError) as info:
        getattr(m, op)(*args, *CALLS[op])
    assert not isinstance(info.value, KeyHashError)
    assert info.value.__cause__ is probe.raised[0]
    assert snapshot_contents(m) == before


@pytest.mark.parametrize("map_name", MAP_NAMES)
@pytest.mark.parametrize("op", sorted(CALLS))
@pytest.mark.parametrize("as_key", [True, False])
def test_an_unhashable_builtin_is_chained_from_the_type_error_python_raised(
    map_name: str, op: str, as_key: bool
) -> None:
    m, before = loaded(map_name)
    args = (["k"], "ns") if as_key else (3, {"n": 1})
    with pytest.raises(UnhashableKeyError) as info:
        getattr(m, op)(*args, *CALLS[op])
    cause = info.value.__cause__
    assert type(cause) is TypeError and "unhashable type" in str(cause), repr(cause)
    assert snapshot_contents(m) == before


@pytest.mark.parametrize("map_name", MAP_NAMES)
@pytest.mark.parametrize("op", sorted(CALLS))
@pytest.mark.parametrize("as_key", [True, False])
@pytest.mark.parametrize("shared", [False, True])
def test_a_raising_equality_is_key_comparison_error_and_changes_nothing(
    map_name: str, op: str, as_key: bool, shared: bool
) -> None:
    # Key 3's chain: the probe hashes as (3, "ns"), so the map must compare it
    # with the entries of that hash, mid-chain, and the comparison raises. With
    # a snapshot open, the chain is shared: nothing may be half-copied.
    m, before = loaded(map_name)
    snaps = [m.snapshot()] if shared else []
    fps = [fingerprint(s) for s in snaps]
    key: Any = TrapKey("probe", 0, hash(3), "eq") if as_key else 3
    namespace: Any = "ns" if as_key else TrapKey("probe", 0, hash("ns"), "eq")
    err = refused(lambda: getattr(m, op)(key, namespace, *CALLS[op]), KeyComparisonError)
    assert isinstance(err, TypeError)
    assert "the map is unchanged" in str(err)
    assert snapshot_contents(m) == before
    for snap in snaps:
        assert snapshot_contents(snap) == before
    check_map(m, fps)
    m.put(3, "ns", [33])  # the map goes on working
    assert m.get(3, "ns") == [33]


@pytest.mark.parametrize("map_name", MAP_NAMES)
def test_keys_and_size_of_a_raising_namespace_are_key_comparison_errors(map_name: str) -> None:
    m, before = loaded(map_name)
    probe = TrapKey("probe", 0, 0, "eq")
    refused(lambda: list(m.keys(probe)), KeyComparisonError)
    refused(lambda: m.size_of_namespace(probe), KeyComparisonError)
    assert snapshot_contents(m) == before


@pytest.mark.parametrize("map_name", MAP_NAMES)
def test_keyboard_interrupt_in_equality_passes_as_it_is(map_name: str) -> None:
    class Interrupting:
        def __hash__(self) -> int:
            return hash(3)

        def __eq__(self, other: object) -> bool:
            raise KeyboardInterrupt

    m, before = loaded(map_name)
    with pytest.raises(KeyboardInterrupt):
        m.put(Interrupting(), "ns", 1)
    assert snapshot_contents(m) == before


@pytest.mark.parametrize("map_name", MAP_NAMES)
@pytest.mark.parametrize("op", HANDING_OUT)
def test_a_raising_state_copy_is_state_copy_error_and_changes_nothing(
    map_name: str, op: str
) -> None:
    m, _ = loaded(map_name)
    trap = CopyTrapList([1])
    m.put(4, "ns", trap)
    before = snapshot_contents(m)
    snap = m.snapshot()
    fp = fingerprint(snap)
    with armed():
        err = refused(lambda: getattr(m, op)(4, "ns", *CALLS[op]), StateCopyError)
    assert isinstance(err, TypeError) and not isinstance(err, StateTooDeepError)
    assert "(4, 'ns')" in str(err) and "the map is unchanged" in str(err)
    assert snapshot_contents(m) == before == snapshot_contents(snap)
    assert next(s for k, _, s in m if k == 4) is trap  # the same object, still shared
    check_map(m, [fp])
    assert m.get(4, "ns") == [1]  # disarmed: the copy works again
    snap.release()


@pytest.mark.parametrize("map_name", MAP_NAMES)
@pytest.mark.parametrize("op", HANDING_OUT)
def test_a_state_too_deep_to_copy_is_state_too_deep_error(map_name: str, op: str) -> None:
    m, _ = loaded(map_name)
    deep = deep_state()
    m.put(4, "ns", deep)
    assert m.get(4, "ns") is deep  # unshared: handed out as it is, never copied
    snap = m.snapshot()
    with pytest.raises(StateTooDeepError) as info:
        getattr(m, op)(4, "ns", *CALLS[op])
    assert isinstance(info.value, RecursionError) and isinstance(info.value, StateCopyError)
    assert isinstance(info.value.__cause__, RecursionError)
    assert "nested too deep" in str(info.value)
    assert next(s for k, _, s in m if k == 4) is deep
    assert len(m) == 7 and m.contains_key(4, "ns")
    check_map(m)  # (a fingerprint would deep-copy the deep state)
    snap.release()
    m.remove(4, "ns")  # storing and removing never recurse
    assert not m.contains_key(4, "ns")


@pytest.mark.parametrize("map_name", MAP_NAMES)
def test_a_very_deep_state_is_stored_read_and_dropped_without_recursion(map_name: str) -> None:
    # 100,000 levels: no operation but a copy may recurse into a state (the C
    # map must not crash; freeing it relies on CPython's trashcan).
    m = MAPS[map_name]()
    deep = deep_state(100_000)
    m.put(1, 0, deep)
    assert m.get(1, 0) is deep and m.contains_key(1, 0)
    assert [k for k, _, _ in m] == [1]
    with m.snapshot() as snap:
        assert len(snap.items()) == 1
    assert m.remove_and_get_old(1, 0) is deep
    del deep
    assert len(m) == 0


@pytest.mark.parametrize("map_name", MAP_NAMES)
def test_transform_mutating_then_raising_keeps_the_object_and_says_so(map_name: str) -> None:
    m, _ = loaded(map_name)
    state = m.get(2, "ns")
    fn = MutateThenRaise()
    with pytest.raises(TransformFunctionError) as info:
        m.transform(2, "ns", 7, fn)
    assert isinstance(info.value.__cause__, Trapped)
    assert "still maps the same state object" in str(info.value)
    assert "not undone" in str(info.value)
    # no snapshot open: the function got the mapped object, its change stays
    assert fn.received is state and m.get(2, "ns") is state and state == [2, 7]

    snap = m.snapshot()
    fp = fingerprint(snap)
    fn = MutateThenRaise()
    with pytest.raises(TransformFunctionError):
        m.transform(2, "ns", 8, fn)
    # shared: the function got a private copy; the mapping and the snapshot are as before
    assert fn.received is not state and fn.received == [2, 7, 8]
    assert next(s for k, _, s in m if k == 2) is state and state == [2, 7]
    assert dict(snapshot_contents(snap))[(2, "ns")] == [2, 7]
    check_map(m, [fp])
    snap.release()


# ------------------------------------------- re-entrant user code (rule R)


class SelfFillingKey:
    """The issue's key: a constant hash, and an ``__eq__`` that puts 40 int keys
    into ``target`` the first time any key of its ``fired`` list compares."""

    def __init__(self, name: str, target: Any, fired: list[bool]) -> None:
        self.name, self.target, self.fired = name, target, fired

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        if not self.fired[0]:
            self.fired[0] = True
            for i in range(40):
                self.target.put(i, "ns", i)
        return other is self

    def __repr__(self) -> str:
        return f"SelfFillingKey({self.name!r})"


@pytest.mark.parametrize("map_name", MAP_NAMES)
def test_a_key_whose_equality_fills_the_map_loses_no_mapping(map_name: str) -> None:
    # Issue 26: the pure map inserted b into the table it had searched before
    # a's __eq__ grew the map (len 42, iteration 41, get(b) None). Rule R1:
    # the search starts over on the map as the __eq__ left it.
    m = MAPS[map_name](initial_capacity=0)
    fired = [False]
    a, b = SelfFillingKey("a", m, fired), SelfFillingKey("b", m, fired)
    assert m.put(a, "ns", 1) is True
    assert m.put(b, "ns", 2) is True
    assert fired[0]
    assert len(m) == 42 == len(list(m))
    assert m.get(b, "ns") == 2 and m.get(a, "ns") == 1
    expected: dict[tuple[Any, str], int] = {(i, "ns"): i for i in range(40)}
    assert snapshot_contents(m) == {**expected, (a, "ns"): 1, (b, "ns"): 2}
    check_map(m)


@pytest.mark.parametrize("map_name", MAP_NAMES)
@pytest.mark.parametrize("op", sorted(CALLS))
@pytest.mark.parametrize("shared", [False, True])
def test_every_keyed_operation_searches_again_after_an_equality_that_changed_the_map(
    map_name: str, op: str, shared: bool
) -> None:
    # Rule R1 for each operation, in a rehash (loaded: capacity 4, 7 mappings):
    # the probe hashes as key 3, its __eq__ puts 20 more, each a rehash step.
    m, before = loaded(map_name)
    snaps = [m.snapshot()] if shared else []
    fps = [fingerprint(s) for s in snaps]
    fired = [False]
    probe = SelfFillingKey("probe", m, fired)
    m.put(probe, "ns", [0])  # hash 7: its own chain, found by identity below
    extra = {(i, "ns"): i for i in range(40)}
    other = SelfFillingKey("other", m, fired)  # compares with probe: fires once
    result = getattr(m, op)(other, "ns", *CALLS[op])
    assert fired[0]
    expected = {**before, **extra, (probe, "ns"): [0]}
    inserted = {"put": [9], "put_and_get_old": [9], "transform": [1]}
    if op in inserted:
        expected[(other, "ns")] = inserted[op]
    returns: dict[str, bool] = {"contains_key": False, "put": True}
    assert result == returns.get(op)
    assert snapshot_contents(m) == expected and len(m) == len(expected)
    for snap in snaps:
        assert snapshot_contents(snap) == before
    check_map(m, fps)


class SelfChangingSerializer:
    """A serializer whose ``copy`` puts ``(99, "ns")`` into ``target`` first."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def copy(self, state: Any) -> Any:
        self.target.put(99, "ns", [99])
        return copy.deepcopy(state)

    def serialize(self, state: Any) -> bytes:
        raise NotImplementedError

    def deserialize(self, data: bytes) -> Any:
        raise NotImplementedError


@pytest.mark.parametrize("map_name", MAP_NAMES)
@pytest.mark.parametrize("op", ["get", "put_and_get_old", "remove_and_get_old"])
def test_a_state_copy_that_changed_the_map_raises_and_writes_nothing(
    map_name: str, op: str
) -> None:
    # Rule R2: rule S's copy ran user code that put a mapping; the operation
    # raises before its own write, so only the copy's put shows.
    m, before = loaded(map_name)
    snap = m.snapshot()
    fp = fingerprint(snap)
    shared = next(s for k, _, s in m if k == 4)
    m.serializer = SelfChangingSerializer(m)
    with pytest.raises(ConcurrentModificationError) as info:
        getattr(m, op)(4, "ns", *CALLS[op])
    assert str(info.value) == (
        "expected serializer.copy not to change the map it was called from, but the map "
        "changed; nothing was written"
    )
    assert snapshot_contents(m) == {**before, (99, "ns"): [99]}
    assert next(s for k, _, s in m if k == 4) is shared
    assert snapshot_contents(snap) == before
    check_map(m, [fp])
    snap.release()


@pytest.mark.parametrize("map_name", MAP_NAMES)
def test_transform_searches_again_after_a_state_copy_that_changed_the_map(
    map_name: str,
) -> None:
    # transform looks its mapping up again after the function (rule R1), so a
    # copy that changed the map is no error there.
    m, before = loaded(map_name)
    snap = m.snapshot()
    m.serializer = SelfChangingSerializer(m)
    m.transform(4, "ns", 7, lambda old, value: [*old, value])
    assert snapshot_contents(m) == {**before, (99, "ns"): [99], (4, "ns"): [4, 7]}
    assert snapshot_contents(snap) == before
    check_map(m)
    snap.release()


@pytest.mark.parametrize("map_name", MAP_NAMES)
def test_a_snapshot_taken_by_a_state_copy_is_protected_from_the_write(map_name: str) -> None:
    # A copy that only snapshots changes no structure: put_and_get_old re-reads
    # H afterwards and copies the entry it writes (rule E), so the snapshot the
    # copy took keeps the state it saw.
    m, before = loaded(map_name)
    snap = m.snapshot()
    taken: list[Any] = []
    fps: list[Any] = []

    class Snapshotting(SelfChangingSerializer):
        def copy(self, state: Any) -> Any:
            taken.append(m.snapshot())
            fps.append(fingerprint(taken[0]))
            return copy.deepcopy(state)

    m.serializer = Snapshotting(m)
    old = m.put_and_get_old(4, "ns", [44])
    assert old == [4] and len(taken) == 1
    assert snapshot_contents(taken[0]) == before
    assert snapshot_contents(m) == {**before, (4, "ns"): [44]}
    check_map(m, fps)
    taken[0].release()
    snap.release()


# --------------------------------------------------------------- the tables


def table_with_state(tables: Tables) -> Any:
    table = tables(KeyGroupRange(0, 7), 8)
    for i in range(5):
        table.put(i, "ns", [i])
    return table


@pytest.mark.parametrize("table_type", TABLES, indirect=True, ids=repr)
@pytest.mark.parametrize("op", sorted(CALLS))
def test_tables_map_a_raising_hash_to_key_hash_error(table_type: Tables, op: str) -> None:
    table = table_with_state(table_type)
    before = snapshot_contents(table)
    probe = TrapKey("probe", 0, 0, "hash")
    refused(lambda: getattr(table, op)(3, probe, *CALLS[op]), KeyHashError)
    refused(lambda: getattr(table, op)(probe, "ns", *CALLS[op], key_group=0), KeyHashError)
    assert snapshot_contents(table) == before


@pytest.mark.parametrize("table_type", TABLES, indirect=True, ids=repr)
@pytest.mark.parametrize("op", sorted(CALLS))
@pytest.mark.parametrize("routed", [True, False])
def test_tables_chain_unhashable_key_error_from_the_hash_type_error(
    table_type: Tables, op: str, routed: bool
) -> None:
    # Routed by the table (the key's own group) or with the key group given.
    table = table_with_state(table_type)
    before = snapshot_contents(table)
    kwargs = {} if routed else {"key_group": 0}
    for role in ("key", "namespace"):
        probe = TypeErrorHash()
        args = (probe, "ns") if role == "key" else (3, probe)
        with pytest.raises(UnhashableKeyError) as info:
            getattr(table, op)(*args, *CALLS[op], **kwargs)
        assert not isinstance(info.value, KeyHashError)
        assert info.value.__cause__ is probe.raised[0], (role, info.value.__cause__)
        bad = ["k"] if role == "key" else {"n": 1}
        unhashable = (bad, "ns") if role == "key" else (3, bad)
        with pytest.raises(UnhashableKeyError) as info:
            getattr(table, op)(*unhashable, *CALLS[op], **kwargs)
        cause = info.value.__cause__
        assert type(cause) is TypeError and "unhashable type" in str(cause), (role, cause)
    assert snapshot_contents(table) == before


@pytest.mark.parametrize("backend_type", BACKENDS, ids=repr)
def test_backends_chain_unhashable_key_error_from_the_hash_type_error(
    backend_type: BackendImplementation,
) -> None:
    # The current key, the current namespace and a map state's user key.
    backend = backend_type.factory(KeyGroupRange(0, 7), 8)
    with backend:
        user_map = backend.get_state(MapStateDescriptor("m"))
        backend.set_current_key(1)
        for call in (
            backend.set_current_key,
            backend.set_current_namespace,
            lambda user_key: user_map.put(user_key, 1),
        ):
            probe = TypeErrorHash()
            with pytest.raises(UnhashableKeyError) as info:
                call(probe)
            assert info.value.__cause__ is probe.raised[0]
            with pytest.raises(UnhashableKeyError) as info:
                call(["k"])
            cause = info.value.__cause__
            assert type(cause) is TypeError and "unhashable type" in str(cause), cause
        assert backend.current_key == 1 and user_map.is_empty()


@pytest.mark.parametrize("table_type", table_types(snapshots=True), indirect=True, ids=repr)
@pytest.mark.parametrize("op", sorted(CALLS))
def test_heap_tables_map_a_raising_equality_to_key_comparison_error(
    table_type: Tables, op: str
) -> None:
    table = table_with_state(table_type)
    before = snapshot_contents(table)
    probe_ns = TrapKey("probe", 0, hash("ns"), "eq")
    refused(lambda: getattr(table, op)(3, probe_ns, *CALLS[op]), KeyComparisonError)
    refused(lambda: list(table.keys(probe_ns)), KeyComparisonError)
    assert snapshot_contents(table) == before


@pytest.mark.parametrize("table_type", table_types(snapshots=True), indirect=True, ids=repr)
def test_a_raising_copy_takes_no_table_snapshot_or_hands_nothing_out(table_type: Tables) -> None:
    table = table_with_state(table_type)
    table.put(3, "ns", CopyTrapList([3]))
    before = snapshot_contents(table)
    with armed():
        outcome: Exception | None = None
        try:
            snap = table.snapshot()  # the nested table copies here
        except StateCopyError as exc:
            outcome = exc
    if outcome is None:  # copy-on-write: the copy comes when a state is handed out
        with armed():
            refused(lambda: table.get(3, "ns"), StateCopyError)
            refused(lambda: table.remove_and_get_old(3, "ns"), StateCopyError)
        snap.release()
    else:
        assert isinstance(outcome.__cause__, Trapped)
    assert snapshot_contents(table) == before
    table.snapshot().release()  # disarmed: snapshots work again


@pytest.mark.parametrize("table_type", table_types(snapshots=True), indirect=True, ids=repr)
def test_a_state_too_deep_fails_a_nested_snapshot_or_a_shared_copy(table_type: Tables) -> None:
    table = table_with_state(table_type)
    deep = deep_state()
    table.put(3, "ns", deep)
    try:
        snap = table.snapshot()
    except StateTooDeepError as exc:  # the nested table copies every state here
        assert isinstance(exc.__cause__, RecursionError)
    else:
        with pytest.raises(StateTooDeepError):
            table.get(3, "ns")
        snap.release()
    assert next(s for k, _, s in table if k == 3) is deep
    table.remove(3, "ns")
    table.snapshot().release()


# --------------------------------------------------------------- the backend


class MutatingFunction:
    """An aggregate function whose ``add`` mutates the accumulator, then raises
    on a negative value."""

    def create_accumulator(self) -> list[int]:
        return [0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        accumulator.append(value)
        if value < 0:
            raise Trapped(f"refuses {value}")
        return accumulator

    def get_result(self, accumulator: list[int]) -> list[int]:
        return list(accumulator)

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return a + b


def test_aggregating_add_keeps_the_transform_contract() -> None:
    descriptor = AggregatingStateDescriptor("agg", aggregate_function=MutatingFunction())
    with HeapKeyedStateBackend(KeyGroupRange(0, 7), 8) as backend:
        state = backend.get_state(descriptor)
        backend.set_current_key(1)
        state.add(1)
        with pytest.raises(TransformFunctionError) as info:
            state.add(-1)
        assert isinstance(info.value.__cause__, Trapped)
        # no snapshot open: the function mutated the stored accumulator, which stays
        assert state.get() == [0, 1, -1]
        table = backend.table("agg")
        held = table.snapshot()  # the accumulator is shared now
        with pytest.raises(TransformFunctionError):
            state.add(-2)
        assert state.get() == [0, 1, -1]  # a private copy was mutated and dropped
        assert [s for _, _, s in held] == [[0, 1, -1]]
        held.release()


def test_the_deep_state_helper_is_deeper_than_a_copy_can_go() -> None:
    # The control of the deep-state checks: a shallow nesting copies, the
    # helper's does not (so the errors above come from the depth).
    shallow = deep_state(100)
    assert copy.deepcopy(shallow) == shallow
    with pytest.raises(RecursionError):
        copy.deepcopy(deep_state())
    assert functools.reduce(lambda s, _: s[0], range(99), shallow) == [0]


@pytest.mark.skipif("c" not in MAPS, reason="the C map was not built")
def test_the_c_map_error_paths_leak_nothing() -> None:
    # Every rule U path of the C map, many times: the objects it touched keep
    # their reference counts and the traced memory does not grow.
    states = [CopyTrapList([i]) for i in range(8)]
    eq_probe = TrapKey("probe", 0, hash(3), "eq")
    ns_probe = TrapKey("probe", 0, hash("ns"), "eq")
    hash_probe = TrapKey("probe", 0, 0, "hash")
    objects: list[Any] = [*states, eq_probe, ns_probe, hash_probe]
    baseline = [sys.getrefcount(o) for o in objects]

    def cycle() -> None:
        m = MAPS["c"](initial_capacity=4)
        for i, state in enumerate(states):
            m.put(i, "ns", state)
        snap = m.snapshot()
        for op in sorted(CALLS):
            for args in ((eq_probe, "ns"), (3, ns_probe), (hash_probe, "ns"), (3, hash_probe)):
                with pytest.raises(CowStateError):
                    getattr(m, op)(*args, *CALLS[op])
        with armed():
            for op in HANDING_OUT:
                with pytest.raises(StateCopyError):
                    getattr(m, op)(5, "ns", *CALLS[op])
        with pytest.raises(TransformFunctionError):
            m.transform(6, "ns", 1, MutateThenRaise())
        with pytest.raises(KeyComparisonError):
            list(m.keys(eq_probe))
        snap.release()

    growth = traced_growth(cycle, 100)
    assert [sys.getrefcount(o) for o in objects] == baseline
    assert growth < 64 * 1024, f"memory grew by {growth} bytes over 100 cycles"
