"""Tests that kill mutants of the ``tables`` mutation scope (``make mutate
SCOPE=tables``) in ``cowstate.key_groups`` and ``cowstate.keyed_state`` that
the scope's other killer tests let through or never reach
(``cowstate.snapshot.format``, the third module of this part of the scope,
left no survivor: its four mutants, all in ``SnapshotMetadata.state``, die in
the other killer tests).

Each test is named after what it pins; the mutants it was written for are
named in its comment (``key_groups.`` / ``keyed_state.`` stand for the
module's mutant prefix ``cowstate.key_groups.`` / ``cowstate.keyed_state.``).
They are part of the scope's killers (``scripts/mutation.py --recheck``) and
of the normal suite. The expected hashes are Java's, from
``tests/data/key_group_vectors.json`` (printed by
``tests/java/KeyGroupVectors.java``) or worked out by hand from the Java
definitions in the comments. The equivalent mutants of these modules are
listed in ``docs/equivalent-mutants.md``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from cowstate.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from cowstate.errors import (
    InvalidArgumentError,
    KeyGroupOutOfRangeError,
    KeyTypeMismatchError,
    NoCurrentKeyError,
    NoneStateError,
    UnhashableKeyError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import (
    KeyGroupRange,
    assign_to_key_group,
    check_key_group_range,
    compute_key_group_for_key_hash,
    compute_key_group_range_for_operator_index,
    compute_operator_index_for_key_group,
    java_hash,
    java_string_hash,
    murmur_hash,
)
from cowstate.key_types import KeyTypes
from cowstate.keyed_state import (
    VOID_NAMESPACE,
    KeyContext,
    ListState,
    StateHolder,
    ValueState,
)
from cowstate.serializers import (
    DefaultSerializer,
    IntSerializer,
    LongSerializer,
    PickleSerializer,
)
from cowstate.state_meta import StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable
from cowstate_spec.backends import SumCount, add_ints

#: Until these tests move beside the tests of what they pin.
pytestmark = [
    pytest.mark.kills(module="cowstate.key_groups"),
    pytest.mark.kills(module="cowstate.keyed_state"),
]

FULL = KeyGroupRange(0, 127)
NONE_KEY = "expected a key, got None; a key must not be None"


@pytest.fixture
def backend() -> Iterator[HeapKeyedStateBackend]:
    b = HeapKeyedStateBackend(FULL, 128)
    yield b
    b.close()


def _double(bits: int) -> float:
    return float(struct.unpack(">d", struct.pack(">q", bits))[0])


# ================================================================ key_groups


def test_key_group_range_constructor_messages_word_for_word() -> None:
    # key_groups.xǁKeyGroupRangeǁ__init__ 1-4, 7, 8, 11, 18: names and messages.
    cases: list[tuple[Any, Any, str]] = [
        (1.0, 2, "expected an int start_key_group, got float 1.0"),
        (0, "3", "expected an int end_key_group, got str '3'"),
        (-1, 3, "expected start_key_group >= 0, got -1"),
        (
            5,
            2,
            "expected start_key_group <= end_key_group, got [5, 2]; "
            "KeyGroupRange.of(start, end) gives the empty range",
        ),
    ]
    for start, end, message in cases:
        with pytest.raises(InvalidArgumentError) as caught:
            KeyGroupRange(start, end)
        assert str(caught.value) == message


def test_the_constructor_takes_flinks_empty_range_and_no_other_inverted_pair() -> None:
    # key_groups.xǁKeyGroupRangeǁ__init__ 12-17: (0, -1) is EMPTY_KEY_GROUP_RANGE;
    # KeyGroupRange.EMPTY is built at import, so a mutant there only fails import.
    empty = KeyGroupRange(0, -1)
    assert empty == KeyGroupRange.EMPTY and len(empty) == 0 and list(empty) == []
    for start, end in ((1, -1), (0, -2), (1, 0)):
        with pytest.raises(InvalidArgumentError) as caught:
            KeyGroupRange(start, end)
        assert str(caught.value) == (
            f"expected start_key_group <= end_key_group, got [{start}, {end}]; "
            "KeyGroupRange.of(start, end) gives the empty range"
        )


def test_key_group_range_of_one_group_and_of_an_inverted_pair() -> None:
    # key_groups.xǁKeyGroupRangeǁ__init__ 9, 10, 13, of 1-5, __len__, __iter__,
    # __repr__ 1-4: a one-group range is a range, not EMPTY; start 0 is allowed.
    one = KeyGroupRange.of(3, 3)
    assert (one.start_key_group, one.end_key_group) == (3, 3)
    assert list(one) == [3] and len(one) == 1
    assert repr(one) == "KeyGroupRange(3, 3)"
    assert list(KeyGroupRange.of(0, 2)) == [0, 1, 2] and len(KeyGroupRange(0, 2)) == 3
    assert KeyGroupRange.of(4, 3) is KeyGroupRange.EMPTY
    assert repr(KeyGroupRange.EMPTY) == "KeyGroupRange.EMPTY"
    assert list(KeyGroupRange.EMPTY) == [] and len(KeyGroupRange.EMPTY) == 0
    assert list(KeyGroupRange(5, 9)) == [5, 6, 7, 8, 9] and len(KeyGroupRange(5, 9)) == 5


def test_key_group_range_membership_takes_only_ints_at_both_ends() -> None:
    # key_groups.xǁKeyGroupRangeǁ__contains__ 1-5, contains 1-5.
    r = KeyGroupRange(3, 5)
    assert [g in r for g in (2, 3, 4, 5, 6)] == [False, True, True, True, False]
    assert [r.contains(g) for g in (2, 3, 4, 5, 6)] == [False, True, True, True, False]
    assert 4.0 not in r
    assert "4" not in r
    assert r.contains(4.0) is False  # type: ignore[arg-type]


def test_index_of_is_the_offset_and_names_the_range_word_for_word() -> None:
    # key_groups.xǁKeyGroupRangeǁindex_of 1-9.
    r = KeyGroupRange(3, 5)
    assert [r.index_of(g) for g in (3, 4, 5)] == [0, 1, 2]
    for outside in (2, 6):
        with pytest.raises(KeyGroupOutOfRangeError) as caught:
            r.index_of(outside)
        assert str(caught.value) == (
            f"expected a key group in KeyGroupRange(3, 5), got key group {outside}; unless "
            "you pass key groups yourself, this is most likely a key whose hash or equality "
            "is not deterministic"
        )


def test_intersection_keeps_the_shared_groups() -> None:
    # key_groups.xǁKeyGroupRangeǁintersection 1-12.
    assert KeyGroupRange(0, 42).intersection(KeyGroupRange(40, 85)) == KeyGroupRange(40, 42)
    assert KeyGroupRange(40, 85).intersection(KeyGroupRange(0, 42)) == KeyGroupRange(40, 42)
    assert KeyGroupRange(2, 9).intersection(KeyGroupRange(4, 6)) == KeyGroupRange(4, 6)
    assert KeyGroupRange(0, 2).intersection(KeyGroupRange(3, 4)) is KeyGroupRange.EMPTY


def test_key_group_ranges_are_equal_by_both_bounds() -> None:
    # key_groups.xǁKeyGroupRangeǁ__eq__ 1-4.
    r = KeyGroupRange(3, 5)
    assert r == KeyGroupRange(3, 5)
    assert not r == KeyGroupRange(3, 6)  # noqa: SIM201 (__eq__ itself)
    assert not r == KeyGroupRange(2, 5)  # noqa: SIM201
    assert not r == KeyGroupRange(2, 6)  # noqa: SIM201
    assert r.__eq__((3, 5)) is NotImplemented


def test_check_key_group_range_messages_word_for_word() -> None:
    # key_groups.x_check_key_group_range 1-8: the end may be max_parallelism - 1,
    # not max_parallelism.
    r = KeyGroupRange(0, 127)
    assert check_key_group_range(r, 128) is r
    with pytest.raises(InvalidArgumentError) as caught:
        check_key_group_range(KeyGroupRange(0, 128), 128)
    assert str(caught.value) == (
        "expected a key-group range inside [0, 127] for max parallelism 128, "
        "got KeyGroupRange(0, 128)"
    )
    with pytest.raises(InvalidArgumentError) as caught:
        check_key_group_range((0, 127), 128)
    assert str(caught.value) == "expected a KeyGroupRange, got tuple"
    with pytest.raises(InvalidArgumentError) as caught:
        check_key_group_range(r, 0)
    assert str(caught.value) == "expected max_parallelism in 1..32768, got 0"


def test_parallelism_bounds_are_inclusive_at_one_and_32768() -> None:
    # key_groups.x__check_max_parallelism 5, 7; x__check_parallelism 6, 8, 10;
    # x__check_index 5-7; Java vectors: key 0 is in key group 31198 of 32768.
    assert assign_to_key_group(0, 32768) == 31198
    assert assign_to_key_group("a", 1) == 0
    assert compute_operator_index_for_key_group(32768, 32768, 5) == 5
    assert compute_operator_index_for_key_group(128, 1, 127) == 0
    assert compute_operator_index_for_key_group(7, 7, 0) == 0
    assert compute_key_group_range_for_operator_index(128, 128, 127) == KeyGroupRange(127, 127)
    with pytest.raises(InvalidArgumentError) as caught:
        compute_key_group_range_for_operator_index(128, 3, 3)
    assert str(caught.value) == "expected operator_index in 0..2, got 3"
    with pytest.raises(InvalidArgumentError) as caught:
        compute_key_group_range_for_operator_index(128, 3, "0")  # type: ignore[arg-type]
    assert str(caught.value) == "expected operator_index in 0..2, got '0'"
    with pytest.raises(InvalidArgumentError) as caught:
        compute_operator_index_for_key_group(4, 5, 0)
    assert str(caught.value) == (
        "expected parallelism <= max_parallelism 4, got parallelism 5: the maximum "
        "parallelism must not be smaller than the parallelism"
    )


def test_bad_parallelism_is_refused_word_for_word() -> None:
    # key_groups.x__check_parallelism 2-9: a parallelism must be an int in 1..32768.
    for bad in (0, -3, 32769, 2.0):
        with pytest.raises(InvalidArgumentError) as caught:
            compute_operator_index_for_key_group(128, bad, 0)  # type: ignore[arg-type]
        assert str(caught.value) == f"expected parallelism in 1..32768, got {bad!r}"
        with pytest.raises(InvalidArgumentError) as caught:
            compute_key_group_range_for_operator_index(128, bad, 0)  # type: ignore[arg-type]
        assert str(caught.value) == f"expected parallelism in 1..32768, got {bad!r}"


def test_operator_ranges_are_flinks() -> None:
    # key_groups.x_compute_key_group_range_for_operator_index 1-29 (Java vectors).
    expected = {
        (128, 3): [(0, 42), (43, 85), (86, 127)],
        (10, 3): [(0, 3), (4, 6), (7, 9)],
    }
    for (max_parallelism, parallelism), ranges in expected.items():
        got = [
            compute_key_group_range_for_operator_index(max_parallelism, parallelism, i)
            for i in range(parallelism)
        ]
        assert got == [KeyGroupRange(s, e) for s, e in ranges]


def test_none_and_salted_keys_are_refused_word_for_word() -> None:
    # key_groups.x_assign_to_key_group 2-6, x_java_hash 64-77.
    with pytest.raises(InvalidArgumentError) as caught:
        assign_to_key_group(None, 128)
    assert str(caught.value) == NONE_KEY
    with pytest.raises(InvalidArgumentError) as caught:
        java_hash(None)
    assert str(caught.value) == NONE_KEY
    for key, kind in ((frozenset({1}), "frozenset"), ({1}, "set"), ({"a": 1}, "dict")):
        with pytest.raises(InvalidArgumentError) as caught:
            java_hash(key)
        assert str(caught.value) == (
            f"expected a key with a stable hash, got a {kind}: its bytes follow Python's "
            "salted hash order; use a sorted tuple instead"
        )


def test_murmur_hash_maps_integer_min_value_to_zero() -> None:
    # key_groups.x_murmur_hash 38-40: -2089875627 is the one int32 whose murmur
    # round mixes to Integer.MIN_VALUE (found by inverting the round); Flink's
    # murmurHash returns 0 for it, where Math.abs would stay negative.
    assert murmur_hash(-2089875627) == 0
    assert compute_key_group_for_key_hash(-2089875627, 128) == 0
    assert murmur_hash(0) == 593689054  # Java vectors: negative and positive mixes
    assert murmur_hash(-1) == 1982413648


def test_java_hash_of_ints_and_longs_at_their_bounds() -> None:
    # key_groups.x_java_hash 3-5, 7-11, x__long_hash, x__to_int32, x__is_long 1-10 (Java
    # vectors; Long.hashCode(v) = (int) (v ^ (v >>> 32))).
    cases = {
        0: 0,
        7: 7,
        -1: -1,
        -(2**31): -(2**31),
        2**31 - 1: 2**31 - 1,
        2**31: -(2**31),
        -(2**31) - 1: -(2**31),
        5_000_000_000: 705032705,
        -5_000_000_000: 705032702,
        2**63 - 1: -(2**31),
        -(2**63): -(2**31),
        2**63 - 2: -(2**31) + 1,
    }
    for key, expected in cases.items():
        assert java_hash(key) == expected, key
    longs = LongSerializer()
    for key, expected in {-1: 0, 5: 5, -5: 4, -(2**31): 2**31 - 1, 2**32: 1}.items():
        assert java_hash(key, longs) == expected, key
    assert java_hash(-1, IntSerializer()) == -1


def test_java_hash_of_strings_over_utf16_units() -> None:
    # key_groups.x_java_hash 12, 13, x_java_string_hash 1-8, 10-30 (Java vectors; a lone
    # surrogate is one unit: 0xD800).
    cases = {
        "": 0,
        "a": 97,
        "hello": 99162322,
        "caf\u00e9": 3045921,
        "\u65e5\u672c\u8a9e": 25921943,
        "\U0001f600": 1772899,
        "a\U0001f600b": 57849694,
        "\uffff": 65535,
        "polygenelubricants": -(2**31),
        "a somewhat longer key that wraps the 32-bit hash": 896956095,
        "\ud800": 0xD800,
    }
    for key, expected in cases.items():
        assert java_string_hash(key) == expected, key
        assert java_hash(key) == expected, key


def test_java_hash_of_bools_doubles_and_bytes() -> None:
    # key_groups.x_java_hash 14-28, 30-37, 62, 63, x__bytes_hash 1-14 (Java vectors): NaN
    # hashes as the canonical NaN whatever its payload; bytes are signed.
    assert (java_hash(True), java_hash(False)) == (1231, 1237)
    doubles = [  # a list: 0.0 == -0.0 and NaN != NaN as dict keys
        (0.0, 0),
        (-0.0, -(2**31)),
        (1.0, 1072693248),
        (-1.0, -1074790400),
        (123456.789, -549432635),
        (_double(1), 1),
        (_double(0x7FF8000000000000), 2146959360),
        (_double(0x7FF0000000000001), 2146959360),
        (_double(-2251799813685248), 2146959360),
    ]
    for key, expected in doubles:
        assert java_hash(key) == expected, key.hex()
    byte_keys = {
        b"": 1,
        b"\x00": 31,
        b"\x01\x02\x03": 30817,
        b"\xff": 30,
        b"\x7f": 31 + 127,
        b"\x80": 31 - 128,
        bytes([0x80, 0x7F, 0x00, 0xFF]): -2767681,
        b"hello": 127791473,
    }
    for data, expected in byte_keys.items():
        assert java_hash(data) == expected, data


def test_java_hash_of_tuples_is_flinks_tuple_hash() -> None:
    # key_groups.x_java_hash 38-40, 43-53, 55-61 (Java vectors: Tuple2; the empty tuple is 0; a
    # None field counts 0; three fields: (1 * 31 + 2) * 31 + 3).
    cases: dict[tuple[Any, ...], int] = {
        (): 0,
        (1, "a"): 128,
        (0, ""): 0,
        (-1, "flink"): 97520961,
        (2**31 - 1, "\U0001f600"): -2145710780,
        (7, None): 217,
        (None, "b"): 98,
        (None, None): 0,
        (1, 2, 3): 1026,
        ("a",): 97,
    }
    for key, expected in cases.items():
        assert java_hash(key) == expected, key


def test_keys_without_a_java_counterpart_hash_the_key_serializers_bytes() -> None:
    # key_groups.x_java_hash 49-52, 78-83, x_assign_to_key_group 8-12: the key
    # serializer reaches the fallback, also for a field of a tuple.
    key = [1, "two"]
    default_bytes = DefaultSerializer().serialize(key)
    pickle_bytes = PickleSerializer().serialize(key)
    assert default_bytes != pickle_bytes
    assert java_hash(key) == java_hash(default_bytes)
    assert java_hash(key, DefaultSerializer()) == java_hash(default_bytes)
    assert java_hash(key, PickleSerializer()) == java_hash(pickle_bytes)
    assert java_hash(key, PickleSerializer()) != java_hash(key)
    assert java_hash((key,), PickleSerializer()) == java_hash(pickle_bytes)
    assert java_hash((5, key), PickleSerializer()) == java_hash(5 * 31 + java_hash(pickle_bytes))
    assert assign_to_key_group(key, 128, PickleSerializer()) == (
        murmur_hash(java_hash(pickle_bytes)) % 128
    )
    assert assign_to_key_group(-1, 128, LongSerializer()) == 94  # Long -1 hashes to 0
    assert assign_to_key_group(-1, 128) == 80
    assert type(assign_to_key_group(-1, 128)) is int


# ============================================================== keyed_state


def test_void_namespace_hashes_as_flinks_void_namespace() -> None:
    # keyed_state.xǁVoidNamespaceǁ__hash__ 1: VoidNamespace.hashCode() is 99.
    assert hash(VOID_NAMESPACE) == 99


def test_a_fresh_key_context_has_no_key_no_key_group_and_the_void_namespace() -> None:
    # keyed_state.xǁKeyContextǁ__init__ 1-9.
    serializer = DefaultSerializer()
    context = KeyContext(FULL, 128, serializer)
    assert context.key_group_range is FULL
    assert context.max_parallelism == 128
    assert context.key_serializer is serializer
    assert type(context.key_types) is KeyTypes
    assert context.key_group == -1
    assert context.namespace is VOID_NAMESPACE
    with pytest.raises(NoCurrentKeyError) as caught:
        _ = context.key
    assert str(caught.value) == (
        "expected a current key, got none: call set_current_key(key) before using keyed state"
    )


def test_set_key_hashes_with_the_contexts_key_serializer() -> None:
    # keyed_state.xǁKeyContextǁset_key 7-13, 16, 17, __init__ 3: with LongSerializer
    # keys, -1 is a Long (hash 0, key group 94), not an Integer (key group 80).
    context = KeyContext(FULL, 128, LongSerializer())
    context.set_key(-1)
    assert (context.key, context.key_group) == (-1, 94)
    b = HeapKeyedStateBackend(FULL, 128, key_serializer=LongSerializer())
    try:
        b.set_current_key(-1)
        assert (b.current_key, b.current_key_group) == (-1, 94)
        b.set_current_key(3)
        assert (b.current_key, b.current_key_group) == (3, 113)
    finally:
        b.close()


def test_set_key_refuses_none_and_unhashable_keys_and_keeps_no_key() -> None:
    # keyed_state.xǁKeyContextǁset_key 1-6.
    context = KeyContext(FULL, 128, DefaultSerializer())
    with pytest.raises(InvalidArgumentError) as caught:
        context.set_key(None)
    assert str(caught.value) == NONE_KEY
    with pytest.raises(UnhashableKeyError) as unhashable:
        context.set_key([1])
    assert str(unhashable.value) == "expected a hashable key, got list [1]"
    with pytest.raises(NoCurrentKeyError):
        _ = context.key
    context.set_key("k")
    assert context.key == "k"


def test_set_key_fixes_the_key_type_only_for_a_key_in_range() -> None:
    # keyed_state.xǁKeyContextǁset_key 14, 15: the range is checked first, and the
    # first key admitted fixes the type (True after 1 is refused).
    context = KeyContext(KeyGroupRange(0, 63), 128, DefaultSerializer())
    with pytest.raises(KeyGroupOutOfRangeError, match=re.escape("got key group 94;")):
        context.set_key(0)
    context.set_key("hello")  # key group 35: str is now the key type
    assert (context.key, context.key_group) == ("hello", 35)
    with pytest.raises(KeyTypeMismatchError) as caught:
        context.set_key(4)  # key group 7, in range, but an int
    assert str(caught.value) == "expected a key of type str (fixed by the first key), got int: 4"
    ints = KeyContext(FULL, 128, DefaultSerializer())
    ints.set_key(1)
    with pytest.raises(KeyTypeMismatchError) as caught:
        ints.set_key(True)
    assert str(caught.value) == (
        "expected a key of type int (fixed by the first key), got bool: True"
    )
    assert (ints.key, ints.key_group) == (1, 86)


def test_set_namespace_refuses_none_and_unhashable_namespaces_word_for_word() -> None:
    # keyed_state.xǁKeyContextǁset_namespace 1-12.
    context = KeyContext(FULL, 128, DefaultSerializer())
    context.set_namespace("window-1")
    assert context.namespace == "window-1"
    with pytest.raises(InvalidArgumentError) as caught:
        context.set_namespace(None)
    assert str(caught.value) == (
        "expected a namespace, got None; use VOID_NAMESPACE for state without one"
    )
    with pytest.raises(UnhashableKeyError) as unhashable:
        context.set_namespace(["n"])
    assert str(unhashable.value) == "expected a hashable namespace, got list ['n']"
    assert context.namespace == "window-1"
    context.set_namespace(VOID_NAMESPACE)
    assert context.namespace is VOID_NAMESPACE


def test_handles_route_by_the_contexts_key_group() -> None:
    # keyed_state.xǁKeyedStateǁclear 1-7, _get 1-7, _put 1-9, _transform 1-11,
    # xǁStateHolderǁ__init__ 1, 2: a handle passes the key group set_current_key
    # computed; the table does not hash again. Seen with a table that would hash
    # -1 as an Integer (key group 80) under a context hashing it as a Long (94).
    context = KeyContext(FULL, 128, LongSerializer())
    table: CopyOnWriteStateTable[Any, Any, Any] = CopyOnWriteStateTable(
        FULL, 128, meta=StateMetaInfo(name="v"), key_serializer=IntSerializer()
    )
    value = ValueState(context, StateHolder(ValueStateDescriptor("v"), table))
    items = ListState(context, StateHolder(ListStateDescriptor("v"), table))
    context.set_key(-1)
    context.set_namespace("ns")
    value.update("x")
    assert list(table.entries_in_key_group(94)) == [(-1, "ns", "x")]
    assert list(table.entries_in_key_group(80)) == []
    assert table.get(-1, "ns", key_group=94) == "x"
    assert value.value() == "x"
    value.clear()
    assert list(table.entries_in_key_group(94)) == []
    items.add("a")
    items.add("b")
    assert list(table.entries_in_key_group(94)) == [(-1, "ns", ["a", "b"])]
    assert items.get() == ["a", "b"]
    table.put(-1, "ns", ["c"], key_group=80)  # where the table itself would route -1
    assert items.get() == ["a", "b"]


def test_value_state_default_is_a_copy_and_none_clears(backend: HeapKeyedStateBackend) -> None:
    # keyed_state.xǁValueStateǁvalue 1-8, update 1, 2.
    descriptor: ValueStateDescriptor[list[int]] = ValueStateDescriptor("value", default=[1])
    state = backend.get_state(descriptor)
    backend.set_current_key("k")
    first = state.value()
    assert first == [1] and first is not descriptor.default
    first.append(2)
    assert state.value() == [1]
    assert descriptor.default == [1]
    state.update([7])
    assert state.value() == [7]
    assert backend.num_state_entries() == 1
    state.update(None)
    assert backend.num_state_entries() == 0
    assert state.value() == [1]
    plain = backend.get_state(ValueStateDescriptor("plain"))
    assert plain.value() is None


class _ListCopySerializer:
    """A user serializer of list states: ``copy`` takes only lists."""

    def copy(self, state: Any) -> Any:
        if type(state) is not list:
            raise TypeError(f"expected a list, got {type(state).__name__}")
        return list(state)

    def serialize(self, state: Any) -> bytes:
        return DefaultSerializer().serialize(state)

    def deserialize(self, data: bytes) -> Any:
        return DefaultSerializer().deserialize(data)


def test_an_absent_value_without_default_never_reaches_the_serializer(
    backend: HeapKeyedStateBackend,
) -> None:
    # keyed_state.xǁValueStateǁvalue 5: no default, so nothing to copy.
    state = backend.get_state(ValueStateDescriptor("v", serializer=_ListCopySerializer()))
    backend.set_current_key("k")
    assert state.value() is None


def test_list_state_get_add_add_all_and_update(backend: HeapKeyedStateBackend) -> None:
    # keyed_state.xǁListStateǁget 1-4, add 1-6, add_all 1-6, update 1-3,
    # _checked 1-7, x__extend 1, 2.
    state = backend.get_state(ListStateDescriptor("list"))
    backend.set_current_key("k")
    assert state.get() == [] and type(state.get()) is list
    state.add("a")
    state.add("b")
    assert state.get() == ["a", "b"]
    state.add_all(("c", "d"))
    assert state.get() == ["a", "b", "c", "d"]
    state.add_all([])
    assert state.get() == ["a", "b", "c", "d"]
    with pytest.raises(NoneStateError) as caught:
        state.add(None)
    assert str(caught.value) == "expected an element to add to list state 'list', got None"
    with pytest.raises(NoneStateError) as caught:
        state.add_all(["e", None])
    assert str(caught.value) == (
        "expected elements for list state 'list', got None in ['e', None]; nothing was added"
    )
    assert state.get() == ["a", "b", "c", "d"]
    state.update(iter(["x"]))
    assert state.get() == ["x"]
    state.update([])
    assert backend.num_state_entries() == 0
    state.add_all(["y", "z"])  # absent: the new list is stored
    assert state.get() == ["y", "z"]


def test_map_state_reads_writes_and_removes(backend: HeapKeyedStateBackend) -> None:
    # keyed_state.xǁMapStateǁget 1-6, put 1-5, remove 1-11, contains 1-5,
    # items 1-5, is_empty 1, 2, x__update 1, 2, x__check_user_key 1-3.
    state = backend.get_state(MapStateDescriptor("map"))
    backend.set_current_key("k")
    assert state.get("a") is None
    assert state.contains("a") is False
    assert state.items() == []
    assert state.is_empty() is True
    state.remove("a")  # absent: nothing to do
    state.put("a", 1)
    state.put("b", 2)
    assert (state.get("a"), state.get("b"), state.get("c")) == (1, 2, None)
    assert (state.contains("a"), state.contains("c")) == (True, False)
    assert state.items() == [("a", 1), ("b", 2)]
    assert state.is_empty() is False
    state.remove("c")  # not there: both stay
    assert state.items() == [("a", 1), ("b", 2)]
    state.remove("a")  # one of two: the other stays
    assert state.items() == [("b", 2)]
    assert backend.num_state_entries() == 1
    state.remove("b")  # the last one: the state is cleared
    assert backend.num_state_entries() == 0
    assert state.is_empty() is True
    unhashable: Any = ["u"]
    for call in (
        lambda: state.get(unhashable),
        lambda: state.put(unhashable, 1),
        lambda: state.remove(unhashable),
        lambda: state.contains(unhashable),
    ):
        with pytest.raises(UnhashableKeyError) as caught:
            call()
        assert str(caught.value) == "expected a hashable user key, got list ['u']"


def test_reducing_state_folds_and_refuses_none(backend: HeapKeyedStateBackend) -> None:
    # keyed_state.xǁReducingStateǁadd 1-6, _reduce 1-7.
    state = backend.get_state(ReducingStateDescriptor("reducing", reduce_function=add_ints))
    backend.set_current_key("k")
    assert state.get() is None
    state.add(2)
    assert state.get() == 2
    state.add(5)
    assert state.get() == 7
    with pytest.raises(NoneStateError) as caught:
        state.add(None)
    assert str(caught.value) == "expected a value to add to reducing state 'reducing', got None"
    assert state.get() == 7


def test_aggregating_state_folds_into_one_accumulator(backend: HeapKeyedStateBackend) -> None:
    # keyed_state.xǁAggregatingStateǁget 1-5, add 1-4, _fold 1-7, _function 1, 2.
    state = backend.get_state(
        AggregatingStateDescriptor("aggregating", aggregate_function=SumCount())
    )
    backend.set_current_key("k")
    assert state.get() is None
    state.add(3)
    assert state.get() == (3, 1)
    state.add(4)
    assert state.get() == (7, 2)
