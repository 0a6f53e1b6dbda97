"""The value codec (``cowstate.value_codec``): exact round trips, the bytes its
docstring specifies (against the model's hand-written encoder), and hostile
input that never escapes as anything but ``UndecodableValueError`` nor builds
an object of a type outside the codec's table.
"""

from __future__ import annotations

import datetime
import enum
import json
import math
import os
import struct
import subprocess
import sys
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cowstate_model.value_codec as plain
from cowstate import VOID_NAMESPACE, value_codec
from cowstate.errors import (
    CowStateError,
    InvalidArgumentError,
    SnapshotFormatError,
    UndecodableValueError,
    UnsupportedValueError,
)
from cowstate.value_codec import MAX_CONTAINER_DEPTH, MAX_EXT_DEPTH, decode, encode

# ------------------------------------------------------------------ values

SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**200), 2**200),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]),
    st.floats(),
    st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan]),
    st.builds(
        lambda bits: struct.unpack(">d", struct.pack(">Q", bits))[0], st.integers(0, 2**64 - 1)
    ),
    st.text(),
    st.text(SURROGATES | st.characters(), max_size=8),
    st.binary(),
)
HASHABLES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(tuple),
        st.frozensets(inner, max_size=4),
    ),
    max_leaves=10,
)
VALUES = st.recursive(
    SCALARS | HASHABLES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(HASHABLES, inner, max_size=4),
        st.sets(HASHABLES, max_size=4),
        st.frozensets(HASHABLES, max_size=4),
    ),
    max_leaves=30,
)


def canon(value: Any) -> Any:
    """A comparable picture of ``value`` that tells every type apart and every
    float by its bits (NaN payloads, -0.0), keeps list, tuple and dict order,
    and orders set members -- two values are the same iff their pictures are
    equal."""
    kind = type(value)
    if kind is float:
        return ("float", struct.pack(">d", value))
    if kind in (list, tuple):
        return (kind.__name__, tuple(canon(item) for item in value))
    if kind is dict:
        return ("dict", tuple((canon(k), canon(v)) for k, v in value.items()))
    if kind in (set, frozenset):
        return (kind.__name__, tuple(sorted(canon(m) for m in value)))
    if value is None:
        return ("None",)
    if value is VOID_NAMESPACE:
        return ("VOID",)
    assert kind in (bool, int, str, bytes), f"canon of {kind}"
    return (kind.__name__, value)


def only_codec_types(value: Any) -> bool:
    """Whether ``value`` is made of the codec's exact types only."""
    kind = type(value)
    if kind in (list, tuple, set, frozenset):
        return all(only_codec_types(item) for item in value)
    if kind is dict:
        return all(only_codec_types(k) and only_codec_types(v) for k, v in value.items())
    return value is None or value is VOID_NAMESPACE or kind in (bool, int, float, str, bytes)


# ------------------------------------------------------------- round trips


@given(VALUES)
def test_round_trip_keeps_every_type_and_value(value: Any) -> None:
    data = encode(value)
    assert data[0] == value_codec.VERSION == 1
    back = decode(data)
    assert canon(back) == canon(value)
    assert decode(memoryview(data)) == back or canon(decode(memoryview(data))) == canon(value)


@given(VALUES)
def test_the_bytes_are_the_ones_the_docstring_specifies(value: Any) -> None:
    """The model writes each MessagePack byte by hand from the docstring's table."""
    assert encode(value) == plain.encode(value)


@pytest.mark.parametrize(
    "value",
    [
        0,
        127,
        128,
        255,
        256,
        2**16 - 1,
        2**16,
        2**32 - 1,
        2**32,
        2**64 - 1,
        2**64,
        -1,
        -32,
        -33,
        -128,
        -129,
        -(2**15),
        -(2**15) - 1,
        -(2**31) - 1,
        -(2**63),
        -(2**63) - 1,
        2**127,
        -(2**127),
        10**40,
        "a" * 31,
        "a" * 32,
        "a" * 255,
        "a" * 256,
        "a" * 2**16,
        b"",
        b"a" * 255,
        b"a" * 256,
        b"a" * 2**16,
        list(range(15)),
        list(range(16)),
        list(range(2**16)),
        dict.fromkeys(range(15)),
        dict.fromkeys(range(16)),
        dict.fromkeys(range(2**16)),
        tuple(range(2**16)),
        frozenset(range(20)),
    ],
    ids=lambda v: f"{type(v).__name__}-{len(v) if hasattr(v, '__len__') else v}",
)
def test_every_length_class_of_the_format(value: Any) -> None:
    data = encode(value)
    assert data == plain.encode(value)
    assert canon(decode(data)) == canon(value)


def test_exact_types_and_special_floats() -> None:
    for value, kind in [(True, bool), (1, int), (1.0, float), ((1,), tuple), ([1], list)]:
        assert type(decode(encode(value))) is kind
    assert decode(encode(1)) is not True and decode(encode(True)) is True
    assert math.copysign(1.0, decode(encode(-0.0))) == -1.0
    assert math.isnan(decode(encode(math.nan)))
    odd_nan = struct.unpack(">d", bytes.fromhex("7ff8000000c0ffee"))[0]
    assert struct.pack(">d", decode(encode(odd_nan))) == bytes.fromhex("7ff8000000c0ffee")
    assert decode(encode([math.inf, -math.inf])) == [math.inf, -math.inf]
    assert decode(encode("\ud800x\udfff")) == "\ud800x\udfff"
    nested = (frozenset({("\udc80", 1)}), ["\ud83d"])  # surrogates below ext levels
    assert canon(decode(encode(nested))) == canon(nested)
    assert decode(encode(VOID_NAMESPACE)) is VOID_NAMESPACE
    assert decode(encode({VOID_NAMESPACE: (VOID_NAMESPACE,)})) == {
        VOID_NAMESPACE: (VOID_NAMESPACE,)
    }


def test_sets_encode_the_same_whatever_their_history_or_hash_seed() -> None:
    words = [f"w{i}" for i in range(40)]
    forward, backward = set(words), set()
    for word in reversed(words):
        backward.add(word)
    assert encode(forward) == encode(backward) == encode(set(sorted(words, key=hash)))
    script = (
        "import json; from cowstate import value_codec\n"
        f"print(json.dumps(value_codec.encode(frozenset({words!r})).hex()))"
    )
    outputs = {
        json.loads(
            subprocess.run(
                [sys.executable, "-c", script],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
                env=dict(os.environ, PYTHONHASHSEED=seed),
            ).stdout
        )
        for seed in ("0", "1", "4242")
    }
    assert outputs == {encode(frozenset(words)).hex()}


def test_nesting_up_to_the_limits_round_trips() -> None:
    lists: Any = 0
    for _ in range(MAX_CONTAINER_DEPTH):
        lists = [lists]
    back = decode(encode(lists))
    for _ in range(MAX_CONTAINER_DEPTH):  # unwrapped by hand: == would recurse too deep
        assert type(back) is list and len(back) == 1
        back = back[0]
    assert back == 0
    tuples: Any = 0
    for _ in range(MAX_EXT_DEPTH):
        tuples = ([tuples],)
    assert canon(decode(encode(tuples))) == canon(tuples)


WORST_CASE_SCRIPT = """
import sys, threading
from cowstate.value_codec import MAX_CONTAINER_DEPTH, MAX_EXT_DEPTH, decode, encode

def deepest():
    value = 0
    for _ in range(MAX_EXT_DEPTH):
        for _ in range(MAX_CONTAINER_DEPTH - 1):
            value = [value]
        value = (value,)
    return value

def run():
    data = encode(deepest())
    back = decode(data)
    for _ in range(MAX_EXT_DEPTH):
        back = back[0]
        for _ in range(MAX_CONTAINER_DEPTH - 1):
            back = back[0]
    print("ok" if back == 0 else "wrong", len(data))

thread = threading.Thread(target=run)
thread.start()
thread.join()
"""


def test_the_deepest_value_allowed_fits_a_threads_stack() -> None:
    """The packer recurses in C per nested container: the limits keep the worst
    value (every ext level full of nested lists) inside a writer thread's stack
    (a subprocess, since an overflow is a crash)."""
    done = subprocess.run(
        [sys.executable, "-c", WORST_CASE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.startswith("ok ")


def test_threads_encode_and_decode_at_once() -> None:
    values = [
        ((i, (str(i), frozenset({i, -i}))), [{"k": (i,)}], "\udc80" * (i % 2)) for i in range(300)
    ]
    expected = [plain.encode(v) for v in values]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                for value, data in zip(values, expected, strict=True):
                    assert encode(value) == data
                    assert canon(decode(data)) == canon(value)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# -------------------------------------------------------- encoding refusals


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


class Color(enum.IntEnum):
    RED = 1


class MyStr(str):
    pass


@pytest.mark.parametrize(
    "value, type_name",
    [
        (Point(1), "Point"),
        ([1, {"a": Point(2)}], "Point"),
        ({(1, Point(3)): 1}, "Point"),
        (frozenset({Color.RED}), "Color"),
        (1j, "complex"),
        (datetime.date(2024, 1, 1), "date"),
        (MyStr("s"), "MyStr"),
        (range(3), "range"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_unsupported_types_are_refused_with_the_type_and_a_way_out(
    value: Any, type_name: str
) -> None:
    with pytest.raises(UnsupportedValueError) as info:
        encode(value)
    message = str(info.value)
    assert type_name in message
    assert "explicit serializer" in message and "PickleSerializer" in message
    assert isinstance(info.value, InvalidArgumentError) and isinstance(info.value, ValueError)
    # the packers recover: the next value encodes as it should
    assert encode([1, (2,)]) == plain.encode([1, (2,)])


def test_bytes_like_objects_come_back_as_bytes_as_documented() -> None:
    """MessagePack's packer takes bytearray and memoryview natively (module doc)."""
    for value in (bytearray(b"ab"), memoryview(b"ab")):
        assert type(decode(encode(value))) is bytes
        assert encode(value) == encode(b"ab")


def test_too_deep_values_are_refused_on_encoding() -> None:
    lists: Any = 0
    for _ in range(MAX_CONTAINER_DEPTH + 1):
        lists = [lists]
    with pytest.raises(UnsupportedValueError, match=f"at most {MAX_CONTAINER_DEPTH} lists"):
        encode(lists)
    tuples: Any = 0
    for _ in range(MAX_EXT_DEPTH + 1):
        tuples = (tuples,)
    with pytest.raises(UnsupportedValueError, match=f"at most {MAX_EXT_DEPTH} tuples"):
        encode(tuples)
    assert encode((1,)) == plain.encode((1,))  # the depth counter was restored


# -------------------------------------------------------- decoding refusals


def ext(code: int, payload: bytes) -> bytes:
    """An ext 8 object (any tag, including the reserved negative ones)."""
    assert len(payload) < 256
    return bytes([0xC7, len(payload), code & 0xFF]) + payload


def v1(obj_bytes: bytes) -> bytes:
    return b"\x01" + obj_bytes


def nested_tuple_exts(depth: int) -> bytes:
    """``depth`` tuples in one another: ``((...(),),)``."""
    data = ext(2, b"\x90")
    for _ in range(depth - 1):
        data = b"\xc8" + (len(data) + 1).to_bytes(2, "big") + b"\x02\x91" + data  # ext 16
    return v1(data)


BAD_INPUTS = {
    "empty": (b"", "got no bytes"),
    "version 0": (b"\x00\x01", "version byte 0x00"),
    "a pickle": (b"\x80\x05K\x01.", "version byte 0x80"),
    "version only": (b"\x01", "incomplete"),
    "truncated str": (v1(b"\xa5abc"), "incomplete"),
    "truncated array": (v1(b"\x93\x01\x02"), "incomplete"),
    "trailing bytes": (v1(b"\x01\x02"), "extra data"),
    "reserved byte": (v1(b"\xc1"), "starts no MessagePack object"),
    "unknown ext": (v1(ext(9, b"x")), "tag 9"),
    "unknown negative ext": (v1(ext(-5, b"x")), "tag -5"),
    "array claiming 2**32-1 items": (v1(b"\xdd\xff\xff\xff\xff"), ""),
    "map with a list key": (v1(b"\x81\x91\x01\x02"), "unhashable"),
    "map with a dict key": (v1(b"\x81\x80\x02"), "unhashable"),
    "set with a list member": (v1(ext(3, b"\x91\x91\x01")), "unhashable"),
    "set with a repeated member": (v1(ext(4, b"\x92\x01\x01")), "distinct"),
    "tuple payload not an array": (v1(ext(2, b"\x01")), "one array"),
    "tuple payload with trailing bytes": (v1(ext(2, b"\x90\x01")), "extra data"),
    "big int within 64 bits": (v1(ext(1, b"\x01")), "minimal length"),
    "big int not minimal": (v1(ext(1, b"\x00" + (2**64).to_bytes(9, "big"))), "minimal"),
    "empty big int": (v1(ext(1, b"")), "minimal length"),
    "void with payload": (v1(ext(5, b"x")), "empty VOID_NAMESPACE"),
    "invalid utf-8": (v1(b"\xa2\xff\xfe"), "decode"),
    "1025 nested arrays": (v1(b"\x91" * 1025 + b"\x01"), ""),
    "33 nested tuples": (nested_tuple_exts(MAX_EXT_DEPTH + 1), f"at most {MAX_EXT_DEPTH}"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_malformed_bytes_are_refused(name: str) -> None:
    data, fragment = BAD_INPUTS[name]
    with pytest.raises(UndecodableValueError) as info:
        decode(data)
    assert isinstance(info.value, SnapshotFormatError)
    assert fragment.lower() in str(info.value).lower(), str(info.value)


def test_the_limits_decode_exactly() -> None:
    assert decode(nested_tuple_exts(MAX_EXT_DEPTH)) is not None
    assert decode(v1(b"\x91" * 1024 + b"\x01")) is not None


def test_a_decoder_input_that_is_not_bytes_is_refused() -> None:
    with pytest.raises(UndecodableValueError, match="got int"):
        decode(5)  # type: ignore[arg-type]
    assert decode(bytearray(encode([1]))) == [1]


def hostile_check(data: bytes) -> None:
    try:
        value = decode(data)
    except UndecodableValueError:
        return
    assert only_codec_types(value), f"{data.hex()} decoded to {value!r}"


@settings(max_examples=max(500, settings().max_examples * 5))
@given(st.binary(max_size=64))
def test_random_bytes_never_escape(data: bytes) -> None:
    hostile_check(data)
    hostile_check(b"\x01" + data)


@st.composite
def mutated_encodings(draw: st.DrawFn) -> bytes:
    data = bytearray(encode(draw(VALUES)))
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if how == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif how == "delete" and data:
            del data[at]
        elif how == "truncate":
            del data[at:]
    return bytes(data)


@settings(max_examples=max(500, settings().max_examples * 5))
@given(mutated_encodings())
def test_mutated_encodings_never_escape(data: bytes) -> None:
    hostile_check(data)


def test_the_timestamp_extension_decodes_to_an_int_only() -> None:
    """MessagePack's reserved ext -1 is decoded by the library itself: as an int
    (documented), never as an object of another type."""
    value = decode(v1(b"\xd6\xff\x00\x00\x00\x01"))
    assert type(value) is int and value == 10**9


def test_decoding_errors_are_cowstate_errors() -> None:
    for data, _ in BAD_INPUTS.values():
        with pytest.raises(CowStateError):
            decode(data)
