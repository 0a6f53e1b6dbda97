"""Tests that kill mutants of the ``core`` mutation scope the other killer
tests let through or never reach (``make mutate``).

Each test is named after what it pins; the mutants it was written for are
named in its comment. They are part of the scope's killers
(``scripts/mutation.py``) and of the normal suite.
"""

from __future__ import annotations

from typing import Any

import pytest

from cowstate.errors import (
    ConcurrentModificationError,
    ForeignSnapshotError,
    KeyComparisonError,
    KeyHashError,
    SerializerMismatchError,
    SnapshotReleasedError,
    StateCopyError,
    StateTooDeepError,
    UnhashableKeyError,
    UnknownCheckpointError,
    UnknownStateError,
    UntrustedSerializerError,
)
from cowstate.introspection import describe
from cowstate.serializers import (
    DefaultSerializer,
    IntSerializer,
    PickleSerializer,
    StringSerializer,
    duplicate_serializer,
    serializer_for,
    serializer_identifier,
)
from cowstate.state_map import CopyOnWriteStateMap
from cowstate_spec.implementations import C_MAP

#: The pure map, and the C map when it is built: the same messages, word for word.
MAPS = [CopyOnWriteStateMap] + ([C_MAP] if C_MAP is not None else [])


class _RaisingHash:
    """A key whose ``hash()`` raises a ``ValueError`` (rule U: KeyHashError)."""

    def __hash__(self) -> int:
        raise ValueError("no hash today")

    def __repr__(self) -> str:
        return "RaisingHash()"


# -------------------------------------------------------------------- errors


def test_a_raising_key_hash_is_named_as_the_key() -> None:
    # errors.KeyHashError.raised_by_pair / raised_by: no map test hashed a
    # pair whose key raised with a message compared word for word.
    exc = ValueError("no hash today")
    error = KeyHashError.raised_by_pair(_RaisingHash(), "ns", exc)
    assert type(error) is KeyHashError
    assert str(error) == (
        "expected hash() of the key RaisingHash() to return an int, got "
        "ValueError: no hash today; the map is unchanged"
    )


def test_a_raising_namespace_hash_is_named_as_the_namespace() -> None:
    # errors.KeyHashError.raised_by_pair: the key hashes, so the namespace raised.
    exc = ValueError("no hash today")
    error = KeyHashError.raised_by_pair("k", _RaisingHash(), exc)
    assert str(error) == (
        "expected hash() of the namespace RaisingHash() to return an int, got "
        "ValueError: no hash today; the map is unchanged"
    )


def test_the_map_reports_a_raising_key_hash_with_its_cause() -> None:
    m: CopyOnWriteStateMap[Any, Any, Any] = CopyOnWriteStateMap()
    with pytest.raises(KeyHashError) as caught:
        m.put(_RaisingHash(), "ns", [1])
    assert "of the key RaisingHash()" in str(caught.value)
    assert isinstance(caught.value.__cause__, ValueError)
    assert len(m) == 0


def test_a_raising_key_comparison_names_the_pair_and_the_cause() -> None:
    # errors.KeyComparisonError.of: the message word for word.
    error = KeyComparisonError.of("k", 3, RuntimeError("eq broke"))
    assert type(error) is KeyComparisonError
    assert str(error) == (
        "expected comparing ('k', 3) with the mapped keys (__eq__) to return a bool, "
        "got RuntimeError: eq broke; the map is unchanged"
    )


def test_a_recursion_error_while_copying_is_a_state_too_deep_error() -> None:
    # errors.StateTooDeepError.of (through StateCopyError.of): type and message.
    error = StateCopyError.of("k", 3, RecursionError("maximum recursion depth exceeded"))
    assert type(error) is StateTooDeepError
    assert str(error) == (
        "expected a state the serializer can copy within Python's recursion limit for "
        "('k', 3), got one nested too deep (RecursionError: maximum recursion depth "
        "exceeded); the map is unchanged"
    )


@pytest.mark.parametrize("error_class", [UnknownStateError, UnknownCheckpointError])
def test_unknown_name_errors_read_as_their_message_unquoted(error_class: type[KeyError]) -> None:
    # errors.UnknownStateError.__str__ / UnknownCheckpointError.__str__: a
    # KeyError would quote the message; with no argument the text is empty.
    assert str(error_class("no state named 'x'")) == "no state named 'x'"
    assert str(error_class()) == ""


# ---------------------------------------------------------------- snapshots


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


def test_the_c_map_names_a_copy_that_changed_the_map() -> None:
    # state_map._reentrant_message, as the C map calls it (rule d of _cmap.c's
    # header), when serializer.copy changes the map it copies for; both maps
    # are held to it by tests/test_user_code_errors.py (rule R2).
    from cowstate import _cmap

    m: _cmap.CopyOnWriteStateMap[int, str, list[int]] = _cmap.CopyOnWriteStateMap()

    class ChangesTheMap:
        def copy(self, state: Any) -> Any:
            m.put(99, "ns", [0])
            return list(state)

        def serialize(self, state: Any) -> bytes:
            raise NotImplementedError

        def deserialize(self, data: bytes) -> Any:
            raise NotImplementedError

    m.put(1, "ns", [1])
    snapshot = m.snapshot()
    m.serializer = ChangesTheMap()
    with pytest.raises(ConcurrentModificationError) as caught:
        m.get(1, "ns")
    assert str(caught.value) == (
        "expected serializer.copy not to change the map it was called from, but the map "
        "changed; nothing was written"
    )
    m.release(snapshot)


# ------------------------------------------------------- rule U, per operation
#
# state_map.{get,put,put_and_get_old,remove_and_get_old,transform,_find,
# _hash_and_step,_remove_entry,_copy_state_for_caller}: the killers drew hostile
# user code only in test_user_code_errors.py (make strength), so each call's
# (key, namespace) arguments to the error constructors went unchecked.

OPERATIONS: dict[str, Any] = {
    "get": lambda m, k, n: m.get(k, n),
    "contains_key": lambda m, k, n: m.contains_key(k, n),
    "put": lambda m, k, n: m.put(k, n, [7]),
    "put_and_get_old": lambda m, k, n: m.put_and_get_old(k, n, [7]),
    "remove": lambda m, k, n: m.remove(k, n),
    "remove_and_get_old": lambda m, k, n: m.remove_and_get_old(k, n),
    "transform": lambda m, k, n: m.transform(k, n, 1, lambda s, v: [v]),
}
COPYING = ["get", "put_and_get_old", "remove_and_get_old", "transform"]


class _RaisingEq:
    """Instances share one hash and their ``__eq__`` raises."""

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq broke")

    def __repr__(self) -> str:
        return "RaisingEq()"


class _RaisingCopy(DefaultSerializer):
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def copy(self, state: Any) -> Any:
        raise self.exc


def _contents(m: Any) -> dict[tuple[Any, Any], Any]:
    return {(k, n): s for k, n, s in m}


@pytest.mark.parametrize("make", MAPS, ids=["pure", "c"][: len(MAPS)])
@pytest.mark.parametrize("operation", OPERATIONS)
def test_every_operation_names_the_key_or_namespace_whose_hash_raised(
    make: Any, operation: str
) -> None:
    m = make()
    m.put("k", "ns", [1])
    for key, namespace, role in ((_RaisingHash(), "ns", "key"), ("k", _RaisingHash(), "namespace")):
        with pytest.raises(KeyHashError) as caught:
            OPERATIONS[operation](m, key, namespace)
        assert str(caught.value) == (
            f"expected hash() of the {role} RaisingHash() to return an int, got "
            "ValueError: no hash today; the map is unchanged"
        )
        assert isinstance(caught.value.__cause__, ValueError)
    assert _contents(m) == {("k", "ns"): [1]}


@pytest.mark.parametrize("make", MAPS, ids=["pure", "c"][: len(MAPS)])
@pytest.mark.parametrize("operation", OPERATIONS)
def test_every_operation_names_the_pair_whose_comparison_raised(make: Any, operation: str) -> None:
    m = make()
    mapped = _RaisingEq()
    m.put(mapped, "ns", [1])
    with pytest.raises(KeyComparisonError) as caught:
        OPERATIONS[operation](m, _RaisingEq(), "ns")
    assert str(caught.value) == (
        "expected comparing (RaisingEq(), 'ns') with the mapped keys (__eq__) to return "
        "a bool, got RuntimeError: eq broke; the map is unchanged"
    )
    assert [(k is mapped, n, s) for k, n, s in m] == [(True, "ns", [1])]


@pytest.mark.parametrize("make", MAPS, ids=["pure", "c"][: len(MAPS)])
@pytest.mark.parametrize("operation", COPYING)
def test_every_copying_operation_names_the_pair_whose_copy_raised(
    make: Any, operation: str
) -> None:
    m = make()
    m.put("k", "ns", [1])
    snapshot = m.snapshot()
    m.serializer = _RaisingCopy(LookupError("no copy"))
    with pytest.raises(StateCopyError) as caught:
        OPERATIONS[operation](m, "k", "ns")
    assert type(caught.value) is StateCopyError
    assert str(caught.value) == (
        "expected the state serializer to copy the state of ('k', 'ns'), got "
        "LookupError: no copy; the map is unchanged"
    )
    m.serializer = _RaisingCopy(RecursionError("too deep"))
    with pytest.raises(StateTooDeepError) as deep:
        OPERATIONS[operation](m, "k", "ns")
    assert str(deep.value) == (
        "expected a state the serializer can copy within Python's recursion limit for "
        "('k', 'ns'), got one nested too deep (RecursionError: too deep); the map is unchanged"
    )
    assert _contents(m) == {("k", "ns"): [1]}
    m.release(snapshot)


# ---------------------------------------------------- messages of misuse


@pytest.mark.parametrize("make", MAPS, ids=["pure", "c"][: len(MAPS)])
def test_a_released_snapshot_says_its_version_when_read(make: Any) -> None:
    # StateMapSnapshot._check_open, __iter__: the released messages.
    m = make()
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


@pytest.mark.parametrize("make", MAPS, ids=["pure", "c"][: len(MAPS)])
def test_iteration_across_a_change_says_what_to_do_instead(make: Any) -> None:
    # CopyOnWriteStateMap._iterate: the message of ConcurrentModificationError.
    m = make()
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


@pytest.mark.parametrize("make", MAPS, ids=["pure", "c"][: len(MAPS)])
def test_a_foreign_snapshot_without_a_version_is_named_with_a_question_mark(
    make: Any,
) -> None:
    # state_map._foreign_message: the "?" of a StateMapSnapshot without a version.
    class StateMapSnapshot:
        pass

    with pytest.raises(ForeignSnapshotError) as caught:
        make().release(StateMapSnapshot())
    assert str(caught.value) == (
        "expected a snapshot taken from this map, got one of another map (version ?)"
    )


# ------------------------------------------------------- introspection, serializers


def test_describe_reads_the_c_maps_capacities_from_its_export() -> None:
    # introspection.describe: the capacity fields of the C map's structure export.
    if C_MAP is None:
        pytest.skip("the C map is not built (tests/test_implementations.py fails for that)")
    pure: CopyOnWriteStateMap[int, str, list[int]] = CopyOnWriteStateMap(initial_capacity=4)
    c = C_MAP(initial_capacity=4)
    for m in (pure, c):
        for k in range(5):  # past the threshold of 4 buckets: a rehash into 8
            m.put(k, "ns", [k])
    assert describe(c).capacity == describe(pure).capacity == 4
    assert describe(c).rehash_capacity == describe(pure).rehash_capacity == 8


def test_a_serializer_with_duplicate_is_duplicated() -> None:
    # serializers.duplicate_serializer: a stateful serializer's own duplicate().
    class Stateful(DefaultSerializer):
        def duplicate(self) -> Stateful:
            return Stateful()

    original = Stateful()
    copy = duplicate_serializer(original)
    assert type(copy) is Stateful and copy is not original
    plain = DefaultSerializer()
    assert duplicate_serializer(plain) is plain


@pytest.mark.parametrize("make", MAPS, ids=["pure", "c"][: len(MAPS)])
def test_iteration_ended_by_a_change_after_the_last_mapping_says_so_too(make: Any) -> None:
    # CopyOnWriteStateMap._iterate: the check after the last bucket (a change
    # made after the last mapping was handed out).
    m = make()
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


@pytest.mark.parametrize("make", MAPS, ids=["pure", "c"][: len(MAPS)])
def test_keys_of_a_namespace_whose_comparison_raises_names_the_key(make: Any) -> None:
    # state_map.keys_in: the KeyComparisonError of keys(namespace).
    m = make()
    m.put("k", "ns", [1])
    with pytest.raises(KeyComparisonError) as caught:
        list(m.keys(_RaisingEq()))
    assert str(caught.value) == (
        "expected comparing ('k', RaisingEq()) with the mapped keys (__eq__) to return "
        "a bool, got RuntimeError: eq broke; the map is unchanged"
    )
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_describe_reads_a_c_map_of_several_chunks() -> None:
    # introspection.describe: capacity is the directory's bucket count, not its
    # buckets per chunk (equal below 1024 buckets).
    if C_MAP is None:
        pytest.skip("the C map is not built (tests/test_implementations.py fails for that)")
    c = C_MAP(initial_capacity=2048)
    for k in range(1538):  # past 3/4 of 2048: a rehash into 4096
        c.put(k, "ns", [k])
    assert (describe(c).capacity, describe(c).rehash_capacity) == (2048, 4096)


# ------------------------------------------------------------- errors' helpers


def test_unhashable_check_names_the_role_and_the_value() -> None:
    # errors.UnhashableKeyError.check: the message, the role, chained from the
    # TypeError hash raised (issue 26), and a raising __hash__ as KeyHashError.
    with pytest.raises(UnhashableKeyError) as caught:
        UnhashableKeyError.check([1, 2])
    assert type(caught.value) is UnhashableKeyError
    assert str(caught.value) == "expected a hashable key, got list [1, 2]"
    cause = caught.value.__cause__
    assert type(cause) is TypeError and str(cause) == "unhashable type: 'list'"
    assert caught.value.__suppress_context__
    with pytest.raises(UnhashableKeyError) as namespace:
        UnhashableKeyError.check({"a": 1}, "namespace")
    assert str(namespace.value) == "expected a hashable namespace, got dict {'a': 1}"
    with pytest.raises(KeyHashError) as raising:
        UnhashableKeyError.check(_RaisingHash(), "namespace")
    assert str(raising.value) == (
        "expected hash() of the namespace RaisingHash() to return an int, got "
        "ValueError: no hash today; the map is unchanged"
    )
    assert isinstance(raising.value.__cause__, ValueError)
    UnhashableKeyError.check(("a", 1))  # hashable: nothing raised


class _RaisingRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_a_message_shortens_a_long_repr_and_survives_a_raising_one() -> None:
    # errors._describe: at most 200 characters (197 and "..."), and a repr
    # that raises is replaced by the type's name.
    long = "x" * 300
    error = KeyComparisonError.of(long, _RaisingRepr(), RuntimeError("eq"))
    shown = repr(long)[:197] + "..."
    assert str(error) == (
        f"expected comparing ({shown}, <_RaisingRepr object>) with the mapped keys "
        "(__eq__) to return a bool, got RuntimeError: eq; the map is unchanged"
    )
    exact = "y" * 198  # its repr is 200 characters: shown whole
    assert f"({exact!r}, 1)" in str(KeyComparisonError.of(exact, 1, RuntimeError("eq")))
    over = "y" * 199  # 201: shortened
    assert f"({repr(over)[:197]}..., 1)" in str(KeyComparisonError.of(over, 1, RuntimeError("eq")))


# ---------------------------------------------------------------- serializers


def test_serializers_repr_as_their_class() -> None:
    # serializers.PickleSerializer.__repr__, _FixedSerializer.__repr__.
    assert repr(PickleSerializer()) == "PickleSerializer()"
    assert repr(StringSerializer()) == "StringSerializer()"
    assert repr(IntSerializer()) == "IntSerializer()"


def test_a_serializer_without_an_identifier_is_named_by_its_class() -> None:
    # serializers.serializer_identifier: no identifier attribute at all.
    class Plain:
        def copy(self, state: Any) -> Any:
            return state

        def serialize(self, state: Any) -> bytes:
            return b""

        def deserialize(self, data: bytes) -> Any:
            return None

    assert serializer_identifier(Plain()) == (
        f"{__name__}.test_a_serializer_without_an_identifier_is_named_by_its_class.<locals>.Plain"
    )


_KNOWN = "bytes, cowstate-value, cowstate-value-immutable, int32, int64, utf8"


@pytest.mark.parametrize(
    ("identifier", "remedy"),
    [("pickle", "PickleSerializer()"), ("pickle-immutable", "ImmutablePickleSerializer()")],
)
def test_a_file_naming_a_pickle_serializer_is_told_the_remedy(identifier: str, remedy: str) -> None:
    # serializers.serializer_for: the UntrustedSerializerError message.
    with pytest.raises(UntrustedSerializerError) as caught:
        serializer_for(identifier)
    assert str(caught.value) == (
        f"expected a serializer identifier cowstate decodes without running code from "
        f"the file ({_KNOWN}), got {identifier!r}: unpickling runs whatever the file says; "
        "if you trust the file, register the state's descriptor (or give the backend a key "
        f"or namespace serializer) with {remedy} before restoring"
    )


def test_an_unknown_serializer_identifier_lists_the_known_ones() -> None:
    # serializers.serializer_for: the SerializerMismatchError message.
    with pytest.raises(SerializerMismatchError) as caught:
        serializer_for("my.Serializer")
    assert str(caught.value) == (
        f"expected a built-in serializer identifier ({_KNOWN}), got 'my.Serializer'; "
        "register the state's descriptor before restoring"
    )
