"""The C codec (``cowstate._codec``; design: the header of ``impl/cowstate/_codec.c``)
against the Python serializers it stands in for:

- encoding: for every value, the C encoder writes the Python serializer's
  bytes or hands the value back (``None``), and it hands back nothing the
  Python serializer encodes among the types it supports -- the value codec
  (every int width both signs, big ints, float bits, strs of every kind,
  lengths, nesting at and beyond the limits, subclasses, ``VOID_NAMESPACE``)
  and each Java-encoding key serializer;
- decoding: what the C decoder returns is what the Python deserializer
  returns; it hands back (``FALLBACK``) whatever the Python deserializer
  refuses, so the refusal is the Python one, class and message (the known
  bad inputs, random and mutated bytes);
- CRC32 is ``zlib.crc32``, zlib's and the table-driven one;
- the encoder without the GIL (the test hook) while another thread hashes,
  interns, caches and references the same objects;
- a planted bug (``cowstate_spec.bad_codecs``) the differential tests catch;
- no reference or memory leaks.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import enum
import gc
import math
import os
import struct
import subprocess
import sys
import threading
import zlib
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from leak_support import cycles
from test_value_codec import BAD_INPUTS, VALUES, canon, ext, mutated_encodings, v1

import cowstate_model.value_codec as plain
from cowstate import VOID_NAMESPACE, value_codec
from cowstate.errors import (
    CowStateError,
    InvalidArgumentError,
    SnapshotFormatError,
    UndecodableValueError,
    UnsupportedValueError,
)
from cowstate.maps import FORCED_PURE, c_map_class
from cowstate.serializers import (
    BytesSerializer,
    DefaultSerializer,
    ImmutableSerializer,
    IntSerializer,
    LongSerializer,
    PickleSerializer,
    StateSerializer,
    StringSerializer,
)
from cowstate.snapshot import ccodec
from cowstate.snapshot.checks import DecodedBlock, EntryDecoder
from cowstate.value_codec import MAX_CONTAINER_DEPTH, MAX_EXT_DEPTH
from cowstate_spec.bad_codecs import CODEC_BUGS, build_codec
from cowstate_spec.profiles import hunt_settings

CODEC: Any = ccodec.BUILT  # the module as built, whatever COWSTATE_PURE_PYTHON says

needs_codec = pytest.mark.skipif(
    CODEC is None,
    reason="cowstate._codec is not built: test_the_c_codec_is_built_and_used fails for that",
)
#: The planted bugs of the encoder (the reader's: tests/test_spec_catches_bad_checks.py).
ENCODER_BUGS = [bug for bug in CODEC_BUGS if bug.part == "encoder"]
pytestmark = needs_codec

#: Sets are encoded in C before Python 3.13 (the set iteration API went private).
SETS_IN_C = sys.version_info < (3, 13)
KINDS: dict[str, tuple[int, StateSerializer]] = {
    "value": (1, DefaultSerializer()),
    "int32": (2, IntSerializer()),
    "int64": (3, LongSerializer()),
    "utf8": (4, StringSerializer()),
    "bytes": (5, BytesSerializer()),
}


def test_the_c_codec_is_built_and_used_unless_pure_python_is_forced() -> None:
    # Like the C map (test_implementations.py): CI builds it.
    if FORCED_PURE:
        assert ccodec.CODEC is None
        return
    assert ccodec.BUILD_ERROR is None, f"cowstate._codec did not build: {ccodec.BUILD_ERROR}"
    assert ccodec.CODEC is CODEC


def test_the_seam_names_the_modules_kinds() -> None:
    assert (CODEC.KIND_PYTHON, CODEC.KIND_VALUE, CODEC.KIND_INT32) == (0, 1, 2)
    assert (CODEC.KIND_INT64, CODEC.KIND_UTF8, CODEC.KIND_BYTES) == (3, 4, 5)
    assert ccodec.KIND_PYTHON == CODEC.KIND_PYTHON
    for name, (kind, serializer) in KINDS.items():
        assert ccodec.encoder_kind(serializer.serialize) == kind, name
        assert ccodec.decoder_kind(serializer.deserialize) == kind, name
    immutable = ImmutableSerializer()
    assert ccodec.encoder_kind(immutable.serialize) == CODEC.KIND_VALUE

    class MyInt(IntSerializer):
        def serialize(self, state: Any) -> bytes:
            return b"mine"

    class Inherits(IntSerializer):
        pass

    for other in (PickleSerializer(), MyInt(), Inherits()):
        assert ccodec.encoder_kind(other.serialize) == CODEC.KIND_PYTHON
        assert ccodec.decoder_kind(other.deserialize) == CODEC.KIND_PYTHON
    assert ccodec.decoder_kind(lambda data: data) == CODEC.KIND_PYTHON


def test_a_decoders_codec_kinds_follow_a_deserializer_put_in_its_place() -> None:
    """EntryDecoder.codec_kinds finds the kinds once per decoder (not per block)
    and again when a deserializer is replaced: the key first, then the state,
    then both back."""
    ints, strs = KINDS["int64"][1], KINDS["utf8"][1]
    decoder = EntryDecoder("s", ints.deserialize, strs.deserialize, strs.deserialize)
    assert decoder.codec_kinds() == (CODEC.KIND_INT64, CODEC.KIND_UTF8)
    decoder.key = lambda data: data
    assert decoder.codec_kinds() == (CODEC.KIND_PYTHON, CODEC.KIND_UTF8)
    decoder.state = ints.deserialize
    assert decoder.codec_kinds() == (CODEC.KIND_PYTHON, CODEC.KIND_INT64)
    decoder.key, decoder.state = ints.deserialize, strs.deserialize
    assert decoder.codec_kinds() == (CODEC.KIND_INT64, CODEC.KIND_UTF8)


# ================================================================= encoding


def python_bytes(serializer: StateSerializer, value: Any) -> bytes | None:
    """The Python serializer's bytes, or None when it refuses the value."""
    try:
        return serializer.serialize(value)
    except CowStateError:
        return None


def c_encodes(value: Any, depth: int = 0, ext_depth: int = 0) -> bool:
    """Whether the C value encoder must encode ``value`` itself (the types and
    limits of _codec.c's header); shallow values only (it recurses)."""
    if depth > MAX_CONTAINER_DEPTH:
        return False
    kind = type(value)
    if value is None or value is VOID_NAMESPACE or kind in (bool, int, float, str, bytes):
        return True
    if kind is list:
        return all(c_encodes(item, depth + 1, ext_depth) for item in value)
    if kind is dict:
        return all(
            c_encodes(k, depth + 1, ext_depth) and c_encodes(v, depth + 1, ext_depth)
            for k, v in value.items()
        )
    if kind is tuple:
        return ext_depth < MAX_EXT_DEPTH and all(c_encodes(i, 1, ext_depth + 1) for i in value)
    if kind in (set, frozenset):
        return (
            SETS_IN_C
            and ext_depth < MAX_EXT_DEPTH
            and all(c_encodes(m, 0, ext_depth + 1) for m in value)
        )
    return False


def check_value_encoding(module: ModuleType, value: Any, *, supported: bool | None = None) -> None:
    """The differential check: the C bytes are the Python codec's; a value the C
    codec supports is never handed back, anything else always is."""
    expected = python_bytes(DefaultSerializer(), value)
    got = module.encode(1, value)
    if supported is None:
        supported = c_encodes(value)
    if supported:
        assert expected is not None, f"the Python codec refused {value!r:.80}"
        assert got == expected, f"C {got!r:.120} != Python {expected!r:.120} for {value!r:.80}"
    else:
        assert got is None, f"C encoded {value!r:.80} that it must hand back: {got!r:.80}"


@given(VALUES)
def test_c_writes_the_value_codecs_bytes_for_every_value(value: Any) -> None:
    check_value_encoding(CODEC, value)


def float_of(bits: int) -> float:
    return float(struct.unpack(">d", struct.pack(">Q", bits))[0])


INT_BOUNDARIES = [
    v
    for b in (5, 7, 8, 15, 16, 31, 32, 63, 64, 65, 71, 72, 127, 128, 200)
    for v in (2**b - 1, 2**b, 2**b + 1, -(2**b) - 1, -(2**b), -(2**b) + 1)
] + [0, 1, -1, -32, -33, 10**40, -(10**40), 2**1000 + 12345, -(2**1000)]
FLOATS = [
    0.0,
    -0.0,
    math.inf,
    -math.inf,
    math.nan,
    -math.nan,
    float_of(0x7FF8000000C0FFEE),
    float_of(0xFFF0000000000001),  # a signalling NaN payload
    float_of(1),  # the smallest subnormal
    sys.float_info.max,
    1.5,
]
STRS = [
    "",
    "a",
    "a" * 31,
    "a" * 32,
    "a" * 255,
    "a" * 256,
    "a" * 65535,
    "a" * 65536,
    "é",  # one-byte kind, not ASCII
    "ÿ" * 16,
    "é" * 128,  # 256 bytes of UTF-8 from 128 characters
    "x" * 30 + "é",  # 32 bytes: a str8 from 31 characters
    "€",  # two-byte kind
    "\u07ff\u0800\uffff",
    "\x7f\x80",  # the UTF-8 length boundaries, each on its own
    "\u07ff",
    "\u0800",
    "\uffff",
    "\U00010000",
    "a\U00010000",
    "😀",  # four-byte kind
    "\U0010ffff" * 70,
    "\ud800",  # lone surrogates: surrogatepass
    "\udfff",
    "a\ud83d\ude00b",  # a surrogate pair as two code points: 6 bytes
    "😀\udc80é€a",
    "é" * 40000,  # str32 of 80,000 bytes
]
BYTES = [b"", b"a", b"\x00" * 255, b"\xff" * 256, b"b" * 65535, b"c" * 65536]


@pytest.mark.parametrize(
    "value",
    [None, True, False, VOID_NAMESPACE, *INT_BOUNDARIES, *FLOATS, *STRS, *BYTES],
    ids=lambda v: f"{type(v).__name__}-{v!r:.24}",
)
def test_c_writes_the_value_codecs_bytes_for_every_scalar_form(value: Any) -> None:
    check_value_encoding(CODEC, value, supported=True)
    if value is not VOID_NAMESPACE:  # and the model's hand-written bytes agree
        assert CODEC.encode(1, value) == plain.encode(value)


@pytest.mark.parametrize(
    "value",
    [
        [],
        list(range(15)),
        list(range(16)),
        list(range(65535)),
        list(range(65536)),
        {},
        dict.fromkeys(range(15)),
        dict.fromkeys(range(16)),
        dict.fromkeys(range(65536)),
        {"b": 1, "a": 2, 3: [4], (5,): "é", VOID_NAMESPACE: b"x"},  # in the dict's order
        (),
        (1,),
        tuple(range(16)),
        tuple(range(300)),  # an ext 16 payload
        tuple(range(70000)),  # an ext 32 payload
        (b"x" * 13,),  # a payload of 16 bytes: fixext 16
        ("abcdef",),  # 8 bytes: fixext 8
        ([[(1, "é")]], {"k": (None, 2.5)}),
        {(1, 2): [(VOID_NAMESPACE,)]},
        set(),
        frozenset(),
        {1, "a", (2, 3), 2**70, -1.5, b"b", None},
        frozenset({"é", "😀", "\ud800"}),
        (frozenset({(1, frozenset({2}))}), {3, 4}),
        [{1, 2}] * 3,
    ],
    ids=lambda v: f"{type(v).__name__}-{len(v)}",
)
def test_c_writes_the_value_codecs_bytes_for_every_container_form(value: Any) -> None:
    check_value_encoding(CODEC, value)
    if c_encodes(value):
        assert CODEC.encode(1, value) is not None


def nested_lists(levels: int, inner: Any) -> Any:
    for _ in range(levels):
        inner = [inner]
    return inner


def nested_dicts(levels: int, inner: Any) -> Any:
    for _ in range(levels):
        inner = {"k": inner}
    return inner


def nested_tuples(levels: int, inner: Any) -> Any:
    for _ in range(levels):
        inner = (inner,)
    return inner


def nested_sets(levels: int) -> Any:
    inner: Any = frozenset({1})
    for _ in range(levels - 1):
        inner = frozenset({inner})
    return inner


NESTINGS: dict[str, tuple[Any, bool]] = {
    # name: (value, whether the Python codec writes it)
    "1024 lists around 0": (nested_lists(1024, 0), True),
    "1025 lists around 0": (nested_lists(1025, 0), False),
    "1024 lists around []": (nested_lists(1024, []), True),  # the empty one at depth 1024
    "1025 lists around []": (nested_lists(1025, []), False),
    "1024 dicts around 0": (nested_dicts(1024, 0), True),
    "1025 dicts around 0": (nested_dicts(1025, 0), False),
    "a dict key at depth 1025": (nested_lists(1024, {(): 0}), False),
    "8 tuples": (nested_tuples(8, 0), True),
    "9 tuples": (nested_tuples(9, 0), False),
    "8 tuples around a big int": (nested_tuples(8, 2**100), True),
    "8 tuples around VOID_NAMESPACE": (nested_tuples(8, VOID_NAMESPACE), True),
    "8 tuples around []": (nested_tuples(8, []), True),
    "8 tuples around ()": (nested_tuples(8, ()), False),
    "a tuple at list depth 1024": (nested_lists(1024, (1, [2])), True),
    "1023 lists in a tuple": (nested_tuples(1, nested_lists(1023, 0)), True),
    "1024 lists in a tuple": (nested_tuples(1, nested_lists(1024, 0)), False),
    "8 frozensets": (nested_sets(8), True),
    "9 frozensets": (nested_sets(9), False),
    "7 tuples around a set of a tuple": (nested_tuples(7, {(1,)}), False),
    "6 tuples around a set of a tuple": (nested_tuples(6, {(1,)}), True),
    "every ext level full of lists": (
        nested_tuples(1, nested_lists(1023, nested_tuples(1, nested_lists(1023, 5)))),
        True,
    ),
}


@pytest.mark.parametrize("name", list(NESTINGS))
def test_nesting_is_refused_exactly_where_the_python_codec_refuses_it(name: str) -> None:
    value, written = NESTINGS[name]
    expected = python_bytes(DefaultSerializer(), value)
    assert (expected is not None) == written, "the Python codec's limits moved"
    got = CODEC.encode(1, value)
    has_sets = "frozensets" in name or "set" in name
    if written and (SETS_IN_C or not has_sets):
        assert got == expected
    else:
        assert got is None


DEEPEST_SCRIPT = """
import threading
from cowstate import _codec, value_codec
from cowstate.value_codec import MAX_CONTAINER_DEPTH, MAX_EXT_DEPTH

def run():
    value = 0
    for _ in range(MAX_EXT_DEPTH):
        for _ in range(MAX_CONTAINER_DEPTH - 1):
            value = [value]
        value = (value,)
    data = _codec.encode(1, value)
    back = _codec.decode(1, data)
    print("ok" if data == value_codec.encode(value) == value_codec.encode(back) else "wrong")

thread = threading.Thread(target=run)
thread.start()
thread.join()
"""


def test_the_deepest_value_allowed_fits_a_threads_stack_in_c() -> None:
    """The C encoder and decoder recurse once per nested container, as msgpack's
    do: the worst value the limits allow, in a writer thread (a subprocess,
    since an overflow is a crash)."""
    done = subprocess.run(
        [sys.executable, "-c", DEEPEST_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip() == "ok"


class MyInt(int):
    pass


class MyStr(str):
    pass


class MyTuple(tuple[Any, ...]):
    pass


class Color(enum.IntEnum):
    RED = 1


class Point:
    pass


@pytest.mark.parametrize(
    "value",
    [
        MyInt(1),
        MyStr("s"),
        MyTuple((1,)),
        Color.RED,
        collections.OrderedDict(a=1),
        collections.defaultdict(int),
        bytearray(b"ab"),  # the Python codec writes these as bin; C hands them back
        memoryview(b"ab"),
        1j,
        Point(),
        range(3),
        [1, MyInt(2)],
        {"a": Point()},
        {MyStr("k"): 1},
        (1, (2, MyStr("x"))),
        frozenset({Color.RED}),
        [Point(), "this value's beginning was already written"],
    ],
    ids=lambda v: type(v).__name__,
)
def test_other_types_and_subclasses_are_handed_back(value: Any) -> None:
    check_value_encoding(CODEC, value, supported=False)


# -------------------------------------------------------------- key serializers

KEY_VALUES: dict[str, Any] = {
    "int32": st.one_of(
        st.integers(-(2**31), 2**31 - 1),
        st.sampled_from([2**31, -(2**31) - 1, 2**63, 2**100, True, False, 1.0, "1", None]),
        st.builds(MyInt, st.integers(-5, 5)),
    ),
    "int64": st.one_of(
        st.integers(-(2**63), 2**63 - 1),
        st.integers(-(2**70), 2**70),
        st.sampled_from([2**63, -(2**63) - 1, 2**64, True, 1.5, b"1"]),
        st.builds(MyInt, st.integers(-5, 5)),
    ),
    "utf8": st.one_of(
        st.text(),
        st.text(st.integers(0xD800, 0xDFFF).map(chr) | st.characters()),
        st.sampled_from(STRS),
        st.builds(MyStr, st.text(max_size=3)),
        st.sampled_from([b"bytes", 1, None]),
    ),
    "bytes": st.one_of(
        st.binary(), st.sampled_from([bytearray(b"x"), memoryview(b"y"), "str", 1, None])
    ),
}


@pytest.mark.parametrize("name", list(KEY_VALUES))
def test_c_writes_each_key_serializers_bytes(name: str) -> None:
    kind, serializer = KINDS[name]

    @given(KEY_VALUES[name])
    def differential(value: Any) -> None:
        expected = python_bytes(serializer, value)
        assert CODEC.encode(kind, value) == expected, (name, value)

    differential()
    extreme = {"int32": 2**31 - 1, "int64": -(2**63), "utf8": "\udc80é😀", "bytes": b"\xff"}
    assert CODEC.encode(kind, extreme[name]) == serializer.serialize(extreme[name])


def test_a_refused_key_gets_the_python_serializers_error() -> None:
    """C hands the value back; the Python serializer's InvalidArgumentError is the error."""
    for name, value in [("int32", 2**31), ("int32", True), ("int64", 2**63), ("utf8", b"b")]:
        kind, serializer = KINDS[name]
        assert CODEC.encode(kind, value) is None
        with pytest.raises(InvalidArgumentError):
            serializer.serialize(value)


# ================================================================= decoding


def python_outcome(decode: Any, data: bytes) -> tuple[str, Any]:
    """What a deserializer does with ``data``: ("value", its picture) or
    ("error", (class, message))."""
    try:
        return ("value", canon(decode(data)))
    except Exception as exc:
        return ("error", (type(exc), str(exc)))


def check_value_decoding(module: ModuleType, data: bytes, *, must_decode: bool = False) -> None:
    """What C returns, Python returns; what C hands back, Python decides -- the
    reader's path (C, then Python on FALLBACK) is the Python decoder's outcome."""
    expected = python_outcome(value_codec.decode, data)
    got = module.decode(1, data)
    if got is module.FALLBACK:
        assert not must_decode, f"C handed back {data.hex()}, which Python decodes"
        return
    assert expected == ("value", canon(got)), f"{data.hex()}: C {got!r:.80}, Python {expected}"


@given(VALUES)
def test_c_decodes_every_encoding_to_the_same_value(value: Any) -> None:
    check_value_decoding(CODEC, value_codec.encode(value), must_decode=True)


@pytest.mark.parametrize(
    "value",
    [*INT_BOUNDARIES, *FLOATS, *STRS, *BYTES, VOID_NAMESPACE],
    ids=lambda v: f"{type(v).__name__}-{v!r:.20}",
)
def test_c_decodes_every_scalar_form_the_encoder_writes(value: Any) -> None:
    check_value_decoding(CODEC, value_codec.encode(value), must_decode=True)


@pytest.mark.parametrize("name", [name for name, (_, written) in NESTINGS.items() if written])
def test_c_decodes_nesting_up_to_the_python_decoders_limits(name: str) -> None:
    """Compared by their encodings (too deep for canon's recursion)."""
    data = value_codec.encode(NESTINGS[name][0])
    got = CODEC.decode(1, data)
    try:
        expected = value_codec.decode(data)
    except UndecodableValueError:
        # the encoder writes 1024 lists around an empty one, which msgpack's
        # unpacker refuses (its stack holds 1024 containers): C hands it back
        assert name == "1024 lists around []"
        assert got is CODEC.FALLBACK
        return
    assert got is not CODEC.FALLBACK
    assert value_codec.encode(got) == value_codec.encode(expected) == data


#: What the Python decoder accepts although cowstate never writes it.
ACCEPTED_FORMS = {
    "uint 64 for 1": v1(b"\xcf" + (1).to_bytes(8, "big")),
    "int 8 for 5": v1(b"\xd0\x05"),
    "int 64 for -1": v1(b"\xd3" + b"\xff" * 8),
    "uint 8 for 0": v1(b"\xcc\x00"),
    "float 32": v1(b"\xca" + struct.pack(">f", 1.25)),
    "float 32 NaN": v1(b"\xca\x7f\xc0\x00\x01"),
    "str 16 for a short str": v1(b"\xda\x00\x01a"),
    "bin 32": v1(b"\xc6\x00\x00\x00\x02ab"),
    "array 32": v1(b"\xdd\x00\x00\x00\x01\x01"),
    "map 16 repeating a key": v1(b"\xde\x00\x02\xa1k\x01\xa1k\x02"),
    "set members out of order": v1(ext(3, b"\x92\x02\x01")),
    "tuple ext 16": v1(b"\xc8\x00\x02\x02\x91\x01"),
    "void ext 8 empty": v1(b"\xc7\x00\x05"),
    "big int ext 8": v1(ext(1, b"\x01" + b"\x00" * 8)),
    "big int negative": v1(ext(1, b"\xfe" + b"\xff" * 8)),
}


@pytest.mark.parametrize("name", list(ACCEPTED_FORMS))
def test_c_decodes_what_the_python_decoder_accepts_beyond_what_it_writes(name: str) -> None:
    check_value_decoding(CODEC, ACCEPTED_FORMS[name], must_decode=True)


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_c_hands_back_every_input_the_python_decoder_refuses(name: str) -> None:
    data, _ = BAD_INPUTS[name]
    assert CODEC.decode(1, data) is CODEC.FALLBACK
    with pytest.raises(UndecodableValueError):
        value_codec.decode(data)


HANDED_BACK = {
    "timestamp ext (-1)": v1(b"\xd6\xff\x00\x00\x00\x01"),
    "big int at 2**63": v1(ext(1, b"\x00\x80" + b"\x00" * 7)),
    "big int of 8 bytes": v1(ext(1, b"\x7f" + b"\xff" * 7)),
    "big int with a redundant sign byte": v1(ext(1, b"\xff\xff" + b"\x00" * 8)),
    "set repeating a member": v1(ext(3, b"\x92\xa1a\xa1a")),
    "tuple payload holding two objects": v1(ext(2, b"\x91\x01\x01")),
    "map claiming more pairs than bytes": v1(b"\xdf\x00\x00\x10\x00\x01\x02"),
    "str with invalid utf-8 in a map key": v1(b"\x81\xa1\xff\x01"),
}


@pytest.mark.parametrize("name", list(HANDED_BACK))
def test_c_hands_back_inputs_it_does_not_decode_exactly(name: str) -> None:
    data = HANDED_BACK[name]
    assert CODEC.decode(1, data) is CODEC.FALLBACK
    check_value_decoding(CODEC, data)


@settings(max_examples=max(500, settings().max_examples * 5))
@given(st.binary(max_size=64))
def test_random_bytes_decode_in_c_only_as_python_decodes_them(data: bytes) -> None:
    check_value_decoding(CODEC, data)
    check_value_decoding(CODEC, b"\x01" + data)


@settings(max_examples=max(500, settings().max_examples * 5))
@given(mutated_encodings())
def test_mutated_encodings_decode_in_c_only_as_python_decodes_them(data: bytes) -> None:
    check_value_decoding(CODEC, data)


@pytest.mark.parametrize("name", [n for n in KINDS if n != "value"])
def test_c_decodes_each_key_serializers_bytes_as_python_does(name: str) -> None:
    kind, serializer = KINDS[name]

    encodings = KEY_VALUES[name].map(lambda v: python_bytes(serializer, v))

    @given(st.one_of(st.binary(max_size=12), encodings.filter(lambda b: b is not None)))
    def differential(data: bytes) -> None:
        expected = python_outcome(serializer.deserialize, data)
        got = CODEC.decode(kind, data)
        if got is CODEC.FALLBACK:
            assert expected[0] == "error", (name, data, expected)
        else:
            assert expected == ("value", canon(got)), (name, data)

    differential()
    valid = {"int32": b"\x80\0\0\0", "int64": b"\xff" * 8, "utf8": b"\xed\xa0\x80", "bytes": b""}
    assert CODEC.decode(kind, valid[name]) == serializer.deserialize(valid[name])


# ==================================================================== CRC32


@given(st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs(data: bytes, start: int) -> None:
    table = build_codec()
    assert table.CRC32_IS_ZLIB == 0
    assert CODEC.crc32(data, start) == zlib.crc32(data, start)
    assert table.crc32(data, start) == zlib.crc32(data, start)
    assert CODEC.crc32(data) == table.crc32(data) == zlib.crc32(data)


def test_crc32_of_a_large_buffer_and_of_every_bytes_like() -> None:
    data = os.urandom(3 * 1024 * 1024 + 7)  # the GIL is released above 64 KiB
    for module in (CODEC, build_codec()):
        assert module.crc32(data) == zlib.crc32(data)
        assert module.crc32(bytearray(data), 12345) == zlib.crc32(data, 12345)
        assert module.crc32(memoryview(data)[5:]) == zlib.crc32(data[5:])
        assert module.crc32(b"", 2**32 + 5) == zlib.crc32(b"", 2**32 + 5)


# ============================================================== without the GIL


def fresh_str(text: str) -> str:
    """``text`` as a new, uninterned, unhashed str object."""
    return "".join(list(text))


def immutable_values(count: int) -> list[Any]:
    values: list[Any] = []
    for i in range(count):
        values += [
            i * 7919,
            -(2**70) - i,
            i / 7,
            fresh_str(f"user-{i}"),
            fresh_str(f"é{i}€😀\ud800"),
            fresh_str("ÿ" * (i % 40)),
            bytes([i % 256]) * (i % 300),
            (i, fresh_str(f"t{i}"), (None, True, b"x")),
            VOID_NAMESPACE,
        ]
    return values


def mutable_values(count: int) -> list[Any]:
    values: list[Any] = []
    for i in range(count):
        values += [[i], {"i": i}, (i, [i]), {i}, frozenset({i}), (fresh_str("é"), {"k": i})]
    return values


def test_the_encoder_without_the_gil_writes_the_same_bytes_while_others_touch_them() -> None:
    """While encode_without_gil runs with the GIL released, another thread hashes
    and interns the same strs, fills their UTF-8 caches, hashes the bytes and
    tuples, takes and drops references to all of them and mutates the lists
    and dicts among them: every immutable value is encoded as the model writes
    it, every value holding a list, dict or set needs the GIL."""
    immutable = immutable_values(400)
    mutable = mutable_values(80)
    values = immutable + mutable
    expected: list[bytes | str] = [
        b"\x01\xc7\x00\x05" if v is VOID_NAMESPACE else plain.encode(v) for v in immutable
    ] + ["needs-gil"] * len(mutable)
    stop = threading.Event()
    touched = [0]
    hashable = {id(v) for v in immutable}
    errors: list[BaseException] = []

    def toucher() -> None:
        try:
            touch()
        except BaseException as exc:
            errors.append(exc)

    def touch() -> None:
        while not stop.is_set():
            for value in values:
                held = [value] * 8  # reference count writes
                if type(value) is str:
                    hash(value)  # the hash field
                    sys.intern(value)  # the state bits
                    # the UTF-8 cache, filled for an encoding name (surrogates have none)
                    with contextlib.suppress(LookupError, UnicodeEncodeError):
                        b"".decode(value)
                elif type(value) is bytes or (type(value) is tuple and id(value) in hashable):
                    hash(value)
                elif type(value) is list:
                    value.append(len(value))
                    value.pop()
                elif type(value) is dict:
                    value["x"] = 1
                    del value["x"]
                del held
            touched[0] += 1

    thread = threading.Thread(target=toucher)
    thread.start()
    try:
        rounds = 0
        while touched[0] < 3 and rounds < 200:  # until both ran side by side
            got = CODEC.encode_without_gil(1, values, 20)
            assert got == expected
            rounds += 1
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert touched[0] >= 3
    for name in ("int32", "int64", "utf8", "bytes"):
        kind, serializer = KINDS[name]
        keys = [v for v in immutable if python_bytes(serializer, v) is not None]
        assert keys
        assert CODEC.encode_without_gil(kind, keys, 2) == [serializer.serialize(k) for k in keys]
    assert CODEC.encode_without_gil(2, [2**40, "s", True], 1) == ["fallback"] * 3


# ================================================================ planted bug


@pytest.mark.parametrize("bug", ENCODER_BUGS, ids=lambda bug: bug.name)
def test_the_differential_tests_catch_the_planted_bug(bug: Any) -> None:
    bad = build_codec(bug)
    assert bug.number == bad.BUG

    @hunt_settings(max_examples=300, stateful_step_count=1)
    @given(VALUES)
    def differential(value: Any) -> None:
        check_value_encoding(bad, value)

    with pytest.raises(AssertionError):
        differential()


def test_the_same_hunt_passes_on_the_codec_built_the_same_way() -> None:
    control = build_codec()
    assert control.BUG == 0

    @hunt_settings(max_examples=300, stateful_step_count=1)
    @given(VALUES)
    def differential(value: Any) -> None:
        check_value_encoding(control, value)

    differential()


# ====================================================================== leaks


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_in_use() -> int:
    """Bytes malloc has handed out (glibc's mallinfo2; 0 where it is missing)."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return 0
    mallinfo2.restype = _MallInfo2
    return int(mallinfo2().uordblks)


def test_encoding_and_decoding_leak_no_reference_and_no_memory() -> None:
    encode, decode = value_codec.encode, value_codec.decode

    def bad_key(data: bytes) -> Any:
        raise ValueError("no key")

    def utf8_repr(value: Any) -> bytes:
        return repr(value).encode()

    # interned already: decoding interns dict keys as msgpack does, and interning
    # fresh strs every cycle churns (and resizes) the interpreter's interned dict
    objects = [sys.intern(fresh_str(f"é{i}")) for i in range(50)] + [2**80 + i for i in range(50)]
    values: list[Any] = [(o, [o, {o: o}], {o, (o,)}) for o in objects] + [
        Point(),
        [Point()],
        bytearray(b"x"),
    ]
    encoded = [value_codec.encode(v) for v in values[:-3]]
    bad = [b"\x01\x93\x01", b"\x01\x81\x91\x01\x02", v1(ext(3, b"\x92\x01\x01"))]
    items = [(o, VOID_NAMESPACE, v) for o, v in zip(objects + objects[:3], values, strict=True)]
    section = CODEC.encode_section(items[:-3], 1, encode, 1, encode, 1, encode)
    decoder = EntryDecoder("s", decode, decode, decode)
    # frozen changes (freeze_changes, flat_removals, FrozenChanges): a C map
    # of the objects, tracking, one snapshot frozen whole, one refused (a list)
    cmap = c_map_class()
    assert cmap is not None
    changed = cmap()
    changed.track_changes()
    base = changed.snapshot()
    since = base.version
    base.release()
    for o in objects:
        changed.put(o, VOID_NAMESPACE, o)
    frozen_snapshot = changed.snapshot()
    refused_map = cmap()
    refused_map.track_changes()
    refused_map.put(objects[0], VOID_NAMESPACE, [objects[0]])
    refused_snapshot = refused_map.snapshot()
    pairs = [(o, VOID_NAMESPACE) for o in objects]

    def cycle() -> None:
        for value in values:
            CODEC.encode(1, value)
        for data in encoded + bad:
            CODEC.decode(1, data)
        CODEC.encode_without_gil(1, values, 1)
        CODEC.encode_section(items, 1, value_codec.encode, 1, value_codec.encode, 1, repr)
        CODEC.encode_section(items, 1, value_codec.encode, 1, value_codec.encode, 0, utf8_repr)
        with pytest.raises(UnsupportedValueError):
            CODEC.encode_section(items, 1, value_codec.encode, 1, value_codec.encode, 1, encode)
        block = DecodedBlock()
        CODEC.decode_section(section, 0, len(items) - 3, 1, 1, decoder, 0, block)
        assert len(block) == len(items) - 3
        CODEC.decode_section(section[:-1], 0, len(items) - 3, 1, 1, decoder, 0, DecodedBlock())
        with pytest.raises(SnapshotFormatError):
            CODEC.decode_section(
                section, 0, 9, 0, 1, EntryDecoder("s", bad_key, decode, decode), 0, DecodedBlock()
            )
        frozen = CODEC.freeze_changes(frozen_snapshot, since)
        assert frozen is not None and len(frozen) == 3 * len(objects)
        assert {id(state) for state in list(frozen)[2::3]} == {id(o) for o in objects}
        assert CODEC.freeze_changes(refused_snapshot, 0) is None
        with pytest.raises(TypeError):
            CODEC.freeze_changes(pairs, since)
        assert len(CODEC.flat_removals(pairs)) == 3 * len(pairs)
        with pytest.raises(TypeError):
            CODEC.flat_removals([*pairs, (1,)])

    cycle()
    baseline = [sys.getrefcount(o) for o in objects]
    before = malloc_in_use()
    warming, counted = cycles(100), cycles(1000)  # make sanitize: 10 and 100
    for _ in range(warming):  # free lists and caches fill up first
        cycle()
    gc.collect()
    start = sys.getallocatedblocks()
    for _ in range(counted):
        cycle()
    gc.collect()
    blocks = sys.getallocatedblocks() - start
    grown = malloc_in_use() - before
    assert [sys.getrefcount(o) for o in objects] == baseline
    # a few hundred blocks fill free lists and caches whatever the count; a leak
    # of one object per cycle would be a thousand
    assert blocks < 500, f"{blocks} more Python memory blocks after {counted} cycles"
    assert grown < 1024 * 1024, (
        f"malloc'd memory grew by {grown} bytes over {warming + counted} cycles"
    )
