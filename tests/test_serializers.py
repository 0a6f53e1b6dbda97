"""Serializers: Java encodings, identifiers, duplication, and the copy rules
(a copy shares nothing mutable with the original, whatever path it takes);
their reprs, and what a file naming an unknown or a pickle serializer is told.
The tests marked ``kills`` were written to kill mutants of
``cowstate.serializers`` (``make mutate``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cowstate.serializers as serializers_module
from cowstate.descriptors import ValueStateDescriptor
from cowstate.errors import InvalidArgumentError, SerializerMismatchError, UntrustedSerializerError
from cowstate.nested_table import NestedMapsStateTable
from cowstate.serializers import (
    BytesSerializer,
    DefaultSerializer,
    ImmutableSerializer,
    IntSerializer,
    LongSerializer,
    PickleSerializer,
    StringSerializer,
    duplicate_serializer,
    is_state_serializer,
    serializer_for,
    serializer_identifier,
)
from cowstate.state_meta import StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable


@pytest.mark.parametrize(
    ("serializer", "value", "encoded"),
    [
        (IntSerializer(), -1, b"\xff\xff\xff\xff"),
        (IntSerializer(), 2**31 - 1, b"\x7f\xff\xff\xff"),
        (LongSerializer(), 1 << 32, b"\x00\x00\x00\x01\x00\x00\x00\x00"),
        (StringSerializer(), "é\U0001f600", "é\U0001f600".encode()),
        (StringSerializer(), "\ud800", b"\xed\xa0\x80"),  # a lone surrogate survives
        (BytesSerializer(), b"\x00raw", b"\x00raw"),
    ],
)
def test_java_encodings_round_trip(serializer: Any, value: Any, encoded: bytes) -> None:
    assert serializer.serialize(value) == encoded
    assert serializer.deserialize(encoded) == value
    assert serializer.copy(value) is value


@pytest.mark.parametrize(
    ("serializer", "value", "message"),
    [
        (IntSerializer(), 2**31, r"expected an int in \[-2\*\*31, 2\*\*31 - 1\] for int32, got "),
        (LongSerializer(), -(2**63) - 1, r"expected an int in \[-2\*\*63, 2\*\*63 - 1\] for int64"),
        (IntSerializer(), "1", "expected a int for int32, got str '1'"),
        (StringSerializer(), b"x", "expected a str for utf8, got bytes"),
        (BytesSerializer(), "x", "expected a bytes for bytes, got str"),
    ],
)
def test_wrong_values_are_refused(serializer: Any, value: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        serializer.serialize(value)


def test_identifiers_and_lookup() -> None:
    for cls in (
        DefaultSerializer,
        ImmutableSerializer,
        IntSerializer,
        LongSerializer,
        StringSerializer,
        BytesSerializer,
    ):
        serializer = cls()
        assert type(serializer_for(serializer_identifier(serializer))) is cls

    class Custom(DefaultSerializer):
        identifier = ""

    assert serializer_identifier(Custom()).endswith("test_identifiers_and_lookup.<locals>.Custom")
    with pytest.raises(SerializerMismatchError, match="register the state's descriptor"):
        serializer_for("no-such-serializer")


# It absorbed test_a_serializer_with_duplicate_is_duplicated (the same checks):
# serializers.duplicate_serializer, a stateful serializer's own duplicate().
@pytest.mark.kills(module="cowstate.serializers")
def test_duplicate_uses_duplicate_when_there_is_one() -> None:
    plain = DefaultSerializer()
    assert duplicate_serializer(plain) is plain

    class Stateful(DefaultSerializer):
        def duplicate(self) -> Stateful:
            return Stateful()

    original = Stateful()
    copy = duplicate_serializer(original)
    assert type(copy) is Stateful and copy is not original


mutable = st.recursive(
    st.one_of(st.integers(), st.text(max_size=3), st.none(), st.booleans()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=8,
)


def containers(value: Any) -> list[Any]:
    """Every list and dict inside ``value`` (itself included)."""
    if isinstance(value, list):
        return [value, *(c for v in value for c in containers(v))]
    if isinstance(value, dict):
        return [value, *(c for v in value.values() for c in containers(v))]
    return []


@given(mutable)
def test_default_copy_shares_nothing_mutable(state: Any) -> None:
    """Fast path (flat list/dict of scalars) or deepcopy: equal, no container shared."""
    copy = DefaultSerializer().copy(state)
    assert copy == state
    originals = {id(c) for c in containers(state)}
    assert not originals & {id(c) for c in containers(copy)}


@pytest.mark.parametrize(
    "cls", [CopyOnWriteStateTable, NestedMapsStateTable], ids=lambda c: c.__name__
)
def test_key_group_items_are_the_entries(cls: Any) -> None:
    """The writer's fast path yields exactly what iteration yields, transformer included."""

    def halve(state: int) -> int | None:
        return None if state % 3 == 0 else state // 2

    for meta in (StateMetaInfo("s"), StateMetaInfo("s", snapshot_transformer=halve)):
        table = cls(meta=meta)
        for i in range(500):
            table.put(i, i % 3, i)
        with table.snapshot() as snapshot:
            for kg in snapshot.key_group_range:
                assert sorted(snapshot.key_group_items(kg)) == sorted(
                    tuple(e) for e in snapshot.key_group_entries(kg)
                )


# ----------------------------------------- identifiers: names, reprs, refusals


@pytest.mark.kills(module="cowstate.serializers")
def test_serializers_repr_as_their_class() -> None:
    # serializers.PickleSerializer.__repr__, _FixedSerializer.__repr__.
    assert repr(PickleSerializer()) == "PickleSerializer()"
    assert repr(StringSerializer()) == "StringSerializer()"
    assert repr(IntSerializer()) == "IntSerializer()"


@pytest.mark.kills(module="cowstate.serializers")
def test_a_serializer_without_an_identifier_is_named_by_its_class() -> None:
    # serializers.serializer_identifier: no identifier attribute at all.
    class Plain(_ThreeMethods):
        pass

    assert serializer_identifier(Plain()) == (
        f"{__name__}.test_a_serializer_without_an_identifier_is_named_by_its_class.<locals>.Plain"
    )


_KNOWN = "bytes, cowstate-value, cowstate-value-immutable, int32, int64, utf8"


@pytest.mark.kills(module="cowstate.serializers")
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


@pytest.mark.kills(module="cowstate.serializers")
def test_an_unknown_serializer_identifier_lists_the_known_ones() -> None:
    # serializers.serializer_for: the SerializerMismatchError message.
    with pytest.raises(SerializerMismatchError) as caught:
        serializer_for("my.Serializer")
    assert str(caught.value) == (
        f"expected a built-in serializer identifier ({_KNOWN}), got 'my.Serializer'; "
        "register the state's descriptor before restoring"
    )


# ------------------------------------------- the serializer check, per type


class _ThreeMethods:
    def copy(self, state: Any) -> Any:
        return state

    def serialize(self, state: Any) -> bytes:
        return b""

    def deserialize(self, data: bytes) -> Any:
        return None


@pytest.mark.parametrize("missing", ["copy", "serialize", "deserialize"])
def test_the_serializer_check_refuses_a_type_missing_any_one_method(missing: str) -> None:
    lacking = type(
        f"Without_{missing}",
        (),
        {name: getattr(_ThreeMethods, name) for name in _METHODS if name != missing},
    )
    assert not is_state_serializer(lacking())
    assert not is_state_serializer(lacking())  # and again: nothing remembered
    assert lacking not in serializers_module._SERIALIZER_TYPES
    with pytest.raises(InvalidArgumentError, match="copy/serialize/deserialize"):
        ValueStateDescriptor("s", serializer=lacking())


def test_the_serializer_check_remembers_a_type_whose_class_has_the_methods() -> None:
    kind = type("Remembered", (_ThreeMethods,), {})
    assert is_state_serializer(kind()) and kind in serializers_module._SERIALIZER_TYPES
    assert is_state_serializer(kind())


def test_the_serializer_check_checks_an_instance_carrying_its_own_methods_every_time() -> None:
    class Bare:
        pass

    carrier = Bare()
    for name in _METHODS:
        setattr(carrier, name, getattr(_ThreeMethods(), name))
    assert is_state_serializer(carrier)
    assert Bare not in serializers_module._SERIALIZER_TYPES
    assert not is_state_serializer(Bare())  # the type itself was not remembered


_METHODS = ("copy", "serialize", "deserialize")


BUILT_IN_SERIALIZERS = [
    serializers_module.DefaultSerializer,
    serializers_module.ImmutableSerializer,
    serializers_module.PickleSerializer,
    serializers_module.ImmutablePickleSerializer,
    serializers_module.IntSerializer,
    serializers_module.LongSerializer,
    serializers_module.StringSerializer,
    serializers_module.BytesSerializer,
]
SCALAR_SAMPLES = [True, 2**70, -0.0, 1 + 2j, "é", b""]


def test_the_built_in_serializers_list_is_every_serializer_class_of_the_module() -> None:
    defined = {
        cls
        for cls in vars(serializers_module).values()
        if isinstance(cls, type)
        and cls.__module__ == serializers_module.__name__
        and not cls.__name__.startswith("_")
        and cls is not serializers_module.StateSerializer  # the protocol
        and serializers_module.is_state_serializer(cls())
    }
    assert defined == set(BUILT_IN_SERIALIZERS)


@pytest.mark.parametrize("cls", BUILT_IN_SERIALIZERS, ids=lambda c: c.__name__)
def test_a_built_in_serializer_declares_and_keeps_that_it_copies_scalars_as_they_are(
    cls: Any,
) -> None:
    assert {type(v) for v in SCALAR_SAMPLES} == serializers_module.SCALAR_STATES
    serializer = cls()
    assert serializers_module.copies_scalars_as_is(serializer)
    for value in SCALAR_SAMPLES:
        assert serializer.copy(value) is value


def test_a_serializer_declares_scalars_as_is_only_with_a_class_attribute_true() -> None:
    class Undeclared(_ThreeMethods):
        pass

    class Truthy(Undeclared):
        copies_scalars_as_is = 1  # truthy is not a declaration

    class Withdrawn(serializers_module.DefaultSerializer):
        copies_scalars_as_is = False

    on_instance = Undeclared()
    on_instance.copies_scalars_as_is = True  # type: ignore[attr-defined]
    for undeclared in (Undeclared(), Truthy(), Withdrawn(), on_instance):
        assert not serializers_module.copies_scalars_as_is(undeclared)
