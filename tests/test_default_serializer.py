"""The default serializers are the value codec; pickle is an explicit choice
(``PickleSerializer``) that a file can never make; a restore checks every
serializer identifier before it decodes a byte; a value the default
serializer cannot write is refused clearly and loses nothing.
"""

from __future__ import annotations

import copy
import io
import pickle
from pathlib import Path
from typing import Any

import pytest

from cowstate import value_codec
from cowstate.descriptors import ListStateDescriptor, ValueStateDescriptor
from cowstate.errors import (
    SerializerMismatchError,
    SnapshotWriteError,
    UnsupportedValueError,
    UntrustedSerializerError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import KeyGroupRange
from cowstate.keyed_state import VOID_NAMESPACE
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.serializers import (
    BytesSerializer,
    DefaultSerializer,
    ImmutablePickleSerializer,
    ImmutableSerializer,
    IntSerializer,
    LongSerializer,
    PickleSerializer,
    StringSerializer,
    serializer_for,
    serializer_identifier,
)

FULL = KeyGroupRange(0, 15)
MAXP = 16


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


# ------------------------------------------------------------ identifiers


def test_identifiers_and_what_serializer_for_gives_back() -> None:
    assert serializer_identifier(DefaultSerializer()) == "cowstate-value"
    assert serializer_identifier(ImmutableSerializer()) == "cowstate-value-immutable"
    assert serializer_identifier(PickleSerializer()) == "pickle"
    assert serializer_identifier(ImmutablePickleSerializer()) == "pickle-immutable"
    for cls in (
        DefaultSerializer,
        ImmutableSerializer,
        IntSerializer,
        LongSerializer,
        StringSerializer,
        BytesSerializer,
    ):
        assert type(serializer_for(cls.identifier)) is cls


@pytest.mark.parametrize(
    "identifier, remedy",
    [("pickle", "PickleSerializer()"), ("pickle-immutable", "ImmutablePickleSerializer()")],
)
def test_serializer_for_never_returns_a_pickle_serializer(identifier: str, remedy: str) -> None:
    with pytest.raises(UntrustedSerializerError) as info:
        serializer_for(identifier)
    message = str(info.value)
    assert f"got {identifier!r}" in message and remedy in message
    assert "unpickling runs whatever the file says" in message
    assert isinstance(info.value, SerializerMismatchError)


def test_an_unknown_identifier_is_a_mismatch() -> None:
    with pytest.raises(SerializerMismatchError, match="register the state's descriptor"):
        serializer_for("my.Serializer")


# ---------------------------------------------------------------- behaviour


def test_default_serializers_write_the_value_codec() -> None:
    value = {"a": (1, 2.5, frozenset({"x"})), "b": [None, True, b"\x00"]}
    for serializer in (DefaultSerializer(), ImmutableSerializer()):
        data = serializer.serialize(value)
        assert data == value_codec.encode(value)
        assert serializer.deserialize(data) == value
    assert DefaultSerializer().serialize(VOID_NAMESPACE) == value_codec.encode(VOID_NAMESPACE)
    with pytest.raises(UnsupportedValueError, match="Point"):
        DefaultSerializer().serialize([Point(1)])


def test_pickle_serializers_pickle_anything() -> None:
    for serializer in (PickleSerializer(), ImmutablePickleSerializer()):
        data = serializer.serialize([Point(3)])
        assert data == pickle.dumps([Point(3)], protocol=pickle.HIGHEST_PROTOCOL)
        assert serializer.deserialize(data)[0].x == 3


@pytest.mark.parametrize("cls", [DefaultSerializer, PickleSerializer])
def test_copy_semantics_are_unchanged(cls: type[Any]) -> None:
    """Known-immutable states as they are, everything else an independent deep copy."""
    s = cls()
    immutable = (1, "a", (2.0, b"x"), frozenset({3}))
    assert s.copy(immutable) is immutable
    nested: list[Any] = [[1], {"a": [2]}, Point(4)]
    copied: Any = s.copy(nested)
    assert copied is not nested and copied[0] == [1] and copied[1] == {"a": [2]}
    assert copied[0] is not nested[0] and copied[1]["a"] is not nested[1]["a"]
    assert copied[2] is not nested[2] and copied[2].x == 4
    flat = [1, "x", None]
    assert s.copy(flat) == flat and s.copy(flat) is not flat
    for immutable_cls in (ImmutableSerializer, ImmutablePickleSerializer):
        assert immutable_cls().copy(nested) is nested


# ------------------------------------------------ refusals that lose nothing


def test_a_heap_snapshot_of_an_unsupported_state_fails_clearly_and_loses_nothing() -> None:
    with HeapKeyedStateBackend(FULL, MAXP) as backend:
        state = backend.get_state(ValueStateDescriptor("v"))
        backend.set_current_key(1)
        state.update(Point(7))
        backend.set_current_key(2)
        state.update([2])
        with pytest.raises(SnapshotWriteError) as info:
            backend.snapshot(1, io.BytesIO).result()
        cause = info.value.__cause__
        assert isinstance(cause, UnsupportedValueError)
        assert "Point" in str(cause) and "explicit serializer" in str(cause)
        backend.set_current_key(1)
        assert state.value().x == 7  # the state is still there
        state.update(7)
        result = backend.snapshot(2, io.BytesIO).result()
        assert result.info is not None and result.info.entries == 2


def test_rocksdb_refuses_an_unsupported_state_before_it_changes(tmp_path: Path) -> None:
    with RocksDBKeyedStateBackend(FULL, MAXP, local_dir=tmp_path) as backend:
        state = backend.get_state(ListStateDescriptor("l"))
        backend.set_current_key(1)
        state.update([1, 2])
        with pytest.raises(UnsupportedValueError, match="Point"):
            state.update([Point(1)])
        with pytest.raises(UnsupportedValueError, match="Point"):
            backend.set_current_key(Point(2))  # a key without a Java hash: its bytes
        backend.set_current_key(1)
        assert state.get() == [1, 2]


def test_an_unsupported_namespace_is_refused() -> None:
    with HeapKeyedStateBackend(FULL, MAXP) as backend:
        state = backend.get_state(ValueStateDescriptor("v"))
        backend.set_current_key(1)
        backend.set_current_namespace(Point(1))
        state.update(1)
        with pytest.raises(SnapshotWriteError) as info:
            backend.snapshot(1, io.BytesIO).result()
        assert isinstance(info.value.__cause__, UnsupportedValueError)


# ------------------------------------------- identifiers before any decoding


class Recorder:
    """Patches ``deserialize`` of serializer classes to record every call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *classes: type[Any]) -> None:
        self.calls: list[str] = []
        for cls in classes:
            original = cls.deserialize

            def spy(this: Any, data: bytes, _name: str = cls.__name__, _f: Any = original) -> Any:
                self.calls.append(_name)
                return _f(this, data)

            monkeypatch.setattr(cls, "deserialize", spy)


def utf8_namespace_file() -> bytes:
    with HeapKeyedStateBackend(
        FULL, MAXP, key_serializer=IntSerializer(), namespace_serializer=StringSerializer()
    ) as writer:
        state = writer.get_state(ValueStateDescriptor("v", serializer=IntSerializer()))
        for key in range(20):
            writer.set_current_key(key)
            writer.set_current_namespace(f"ns{key % 3}")
            state.update(key)
        data = writer.snapshot(1, io.BytesIO).result().handle.getvalue()
    assert isinstance(data, bytes)
    return data


@pytest.mark.parametrize("register", [True, False], ids=["registered", "unregistered"])
def test_a_namespace_serializer_mismatch_is_refused_before_decoding(
    monkeypatch: pytest.MonkeyPatch, register: bool
) -> None:
    """The heap restore used to decode the namespaces of an unregistered state
    with the file's serializer and only then compare it with the backend's."""
    data = utf8_namespace_file()
    recorder = Recorder(monkeypatch, StringSerializer, IntSerializer)
    with HeapKeyedStateBackend(FULL, MAXP, key_serializer=IntSerializer()) as target:
        if register:
            target.get_state(ValueStateDescriptor("v", serializer=IntSerializer()))
        target.set_current_key(3)
        target.get_state(ValueStateDescriptor("other")).update("kept")
        with pytest.raises(SerializerMismatchError, match=r"'cowstate-value'.*'utf8'"):
            target.restore([data])
        assert recorder.calls == []
        target.set_current_key(3)
        assert target.get_state(ValueStateDescriptor("other")).value() == "kept"
    # the control: with the file's serializers, the same spies see the namespaces
    # decoded (each distinct namespace once: the restore decodes by bytes) and
    # every entry restored
    with HeapKeyedStateBackend(
        FULL, MAXP, key_serializer=IntSerializer(), namespace_serializer=StringSerializer()
    ) as target:
        target.get_state(ValueStateDescriptor("v", serializer=IntSerializer()))
        target.restore([data])
        assert recorder.calls.count("StringSerializer") == 3  # ns0, ns1, ns2
        assert recorder.calls.count("IntSerializer") == 40  # 20 keys, 20 states
        assert target.num_state_entries() == 20


def test_a_state_serializer_mismatch_is_refused_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = utf8_namespace_file()
    recorder = Recorder(monkeypatch, StringSerializer, IntSerializer)
    with HeapKeyedStateBackend(
        FULL, MAXP, key_serializer=IntSerializer(), namespace_serializer=StringSerializer()
    ) as target:
        target.get_state(ValueStateDescriptor("v", serializer=LongSerializer()))
        with pytest.raises(SerializerMismatchError, match=r"'int64'.*'int32'"):
            target.restore([data])
    assert recorder.calls == []


def test_deep_copies_of_restored_values_stay_exact() -> None:
    """A restored state is the value codec's: exact types, and copies of it too."""
    value = {"t": (1, 2), "s": {1, 2}, "f": frozenset({"a"}), "l": [1.0, True]}
    with HeapKeyedStateBackend(FULL, MAXP) as writer:
        state = writer.get_state(ValueStateDescriptor("v"))
        writer.set_current_key("k")
        state.update(copy.deepcopy(value))
        data = writer.snapshot(1, io.BytesIO).result().handle.getvalue()
    with HeapKeyedStateBackend(FULL, MAXP) as target:
        target.restore([data])
        target.set_current_key("k")
        restored = target.get_state(ValueStateDescriptor("v")).value()
        assert restored == value
        assert {k: type(v) for k, v in restored.items()} == {k: type(v) for k, v in value.items()}
        assert [type(x) for x in restored["l"]] == [float, bool]
