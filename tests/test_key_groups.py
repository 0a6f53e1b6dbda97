"""Key groups (``cowstate.key_groups``) are Flink's, bit for bit.

Both the implementation and its plain statement (``cowstate_model.key_groups``)
are checked against numbers that come from outside Python: the vector table
of the reference (``flink-state-map.md`` section 2.4, copied literally) and
``tests/data/key_group_vectors.json``, printed by ``tests/java/KeyGroupVectors.java``
with the real ``java.lang`` hash codes; a test re-runs that program and
compares its output with the committed file. Hypothesis then checks that
implementation and model agree everywhere else, the range arithmetic's
partition laws, ``KeyGroupRange``, stability across ``PYTHONHASHSEED`` and the
error messages. Java's hash codes at their bounds (worked out by hand from the
Java definitions in the comments), ``KeyGroupRange``'s construction and the
error messages are also pinned case by case, word for word: those tests are
marked ``kills`` (written to kill mutants of the module, ``make mutate
SCOPE=tables``; their comments name them, ``key_groups.`` standing for the
mutants' prefix ``cowstate.key_groups.``). The module's equivalent mutants are
in ``docs/equivalent-mutants.md``.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cowstate.key_groups as fast
import cowstate_model.key_groups as plain
import cowstate_model.value_codec as plain_codec
from cowstate import value_codec
from cowstate.errors import InvalidArgumentError, KeyGroupOutOfRangeError, UnsupportedValueError
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
from cowstate.serializers import (
    DefaultSerializer,
    IntSerializer,
    LongSerializer,
    PickleSerializer,
)
from cowstate_spec.keys import HashKey

ROOT = Path(__file__).resolve().parent.parent
JAVA_PROGRAM = ROOT / "tests" / "java" / "KeyGroupVectors.java"
VECTORS_FILE = ROOT / "tests" / "data" / "key_group_vectors.json"
VECTORS: dict[str, list[dict[str, Any]]] = json.loads(VECTORS_FILE.read_text())

BOTH = pytest.mark.parametrize("kg", [fast, plain], ids=["impl", "model"])

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
MAX_PARALLELISMS = st.integers(1, 32768)


def _from_units(units: list[int]) -> str:
    """The Python string whose UTF-16 code units are ``units``."""
    return struct.pack(f">{len(units)}H", *units).decode("utf-16-be", "surrogatepass")


def key_of(vector: dict[str, Any]) -> Any:
    """The Python key a Java vector describes."""
    kind = vector["type"]
    if kind in ("int", "long"):
        return int(vector["value"])
    if kind == "string":
        return _from_units(vector["units"])
    if kind == "boolean":
        value: bool = vector["value"]
        return value
    if kind == "double":
        return struct.unpack(">d", struct.pack(">q", int(vector["bits"])))[0]
    if kind == "bytes":
        return bytes(b & 0xFF for b in vector["bytes"])
    if kind == "tuple2_int_string":
        f0 = None if vector["f0"] is None else int(vector["f0"])
        f1 = None if vector["f1"] is None else _from_units(vector["f1"]["units"])
        return (f0, f1)
    raise AssertionError(f"unknown vector type {kind!r}")


def _vector_id(vector: dict[str, Any]) -> str:
    return f"{vector['type']}-{vector['hash']}"


# -------------------------------------------- the reference's table, literally

#: key, bitMix(key), murmurHash(key), key group at 128, at 10, at 32768 (section 2.4)
REFERENCE_TABLE = [
    (0, 0, 593689054, 94, 4, 31198),
    (1, 1364076727, 68075478, 86, 8, 16342),
    (2, 821347078, 1085422463, 127, 3, 15231),
    (3, -2047822809, 847579505, 113, 5, 2417),
    (4, 614249093, 1889779975, 7, 5, 16647),
    (5, -871541811, 236698494, 126, 4, 15230),
    (7, 415870660, 1343918321, 113, 1, 4337),
    (42, 142593372, 1134849565, 29, 5, 28189),
    (100, -36807446, 616682048, 64, 8, 21056),
    (-1, -2114883783, 1982413648, 80, 8, 15184),
    (-2147483648, 1832674720, 1718298732, 108, 2, 10348),
    (2147483647, -104067416, 1653689534, 62, 4, 19646),
]

#: string, String.hashCode, murmurHash (None: not given), key group at 128
REFERENCE_STRINGS = [
    ("", 0, None, 94),
    ("a", 97, 1455541201, 81),
    ("hello", 99162322, 1715862179, 35),
    ("flink", 97520992, 1330823394, 98),
    ("key-1", 101943363, 23124534, 54),
]

REFERENCE_RANGES = {
    (128, 3): [(0, 42), (43, 85), (86, 127)],
    (128, 4): [(0, 31), (32, 63), (64, 95), (96, 127)],
    (10, 3): [(0, 3), (4, 6), (7, 9)],
    (32768, 7): [
        (0, 4681),
        (4682, 9362),
        (9363, 14043),
        (14044, 18724),
        (18725, 23405),
        (23406, 28086),
        (28087, 32767),
    ],
}


@BOTH
@pytest.mark.parametrize(("key", "mixed", "murmur", "at128", "at10", "at32768"), REFERENCE_TABLE)
def test_reference_int_vectors(
    kg: ModuleType, key: int, mixed: int, murmur: int, at128: int, at10: int, at32768: int
) -> None:
    assert kg.java_hash(key) == key
    assert kg.bit_mix(key) == mixed
    assert kg.murmur_hash(key) == murmur
    assert [kg.assign_to_key_group(key, p) for p in (128, 10, 32768)] == [at128, at10, at32768]


@pytest.mark.parametrize(
    ("key", "murmur", "at128"), [(row[0], row[2], row[3]) for row in REFERENCE_TABLE]
)
def test_reference_key_group_for_key_hash(key: int, murmur: int, at128: int) -> None:
    assert fast.compute_key_group_for_key_hash(key, 128) == at128 == murmur % 128


@BOTH
@pytest.mark.parametrize(("s", "java_hash", "murmur", "at128"), REFERENCE_STRINGS)
def test_reference_string_vectors(
    kg: ModuleType, s: str, java_hash: int, murmur: int | None, at128: int
) -> None:
    assert kg.java_string_hash(s) == kg.java_hash(s) == java_hash
    if murmur is not None:
        assert kg.murmur_hash(java_hash) == murmur
    assert kg.assign_to_key_group(s, 128) == at128


def test_reference_long_hashes() -> None:
    # Long.hashCode: 5L -> 5, -1L -> 0, (1L << 32) -> 1. A Python int in the int range
    # is an Integer (-1 hashes to -1), so only 1 << 32 reaches Long through java_hash.
    for long_hash in (fast._long_hash, plain.long_hash):
        assert [long_hash(v) for v in (5, -1, 1 << 32)] == [5, 0, 1]
    assert fast.java_hash(1 << 32) == plain.java_hash(1 << 32) == 1
    assert fast.java_hash(-1) == plain.java_hash(-1) == -1


@BOTH
def test_reference_composite_hashes(kg: ModuleType) -> None:
    # Section 2.3: a state map's composite hash is bitMix(key.hashCode() ^ ns.hashCode()).
    assert kg.bit_mix(1 ^ 1) == kg.bit_mix(0 ^ 0) == 0
    assert kg.bit_mix(2 ^ 1) == kg.bit_mix(1 ^ 2) == -2047822809
    assert kg.bit_mix(2 ^ 1) & 127 == 39
    assert kg.bit_mix(5 ^ 3) == 1558924552
    assert kg.bit_mix(5 ^ 3) & 127 == 8


@pytest.mark.parametrize(("max_parallelism", "parallelism"), sorted(REFERENCE_RANGES))
def test_reference_operator_ranges(max_parallelism: int, parallelism: int) -> None:
    want = REFERENCE_RANGES[max_parallelism, parallelism]
    got = [
        fast.compute_key_group_range_for_operator_index(max_parallelism, parallelism, i)
        for i in range(parallelism)
    ]
    assert got == [KeyGroupRange(start, end) for start, end in want]
    assert [
        plain.compute_key_group_range_for_operator_index(max_parallelism, parallelism, i)
        for i in range(parallelism)
    ] == want


@BOTH
def test_reference_operator_indices(kg: ModuleType) -> None:
    assert [kg.compute_operator_index_for_key_group(128, 3, g) for g in (42, 43, 85, 86)] == [
        0,
        1,
        1,
        2,
    ]


# ----------------------------------------------------- the vectors Java printed


@BOTH
@pytest.mark.parametrize("vector", VECTORS["keys"], ids=_vector_id)
def test_java_key_vectors(kg: ModuleType, vector: dict[str, Any]) -> None:
    key = key_of(vector)
    assert kg.java_hash(key) == vector["hash"]
    assert kg.bit_mix(vector["hash"]) == vector["bit_mix"]
    assert kg.murmur_hash(vector["hash"]) == vector["murmur"]
    got = {p: kg.assign_to_key_group(key, int(p)) for p in vector["key_groups"]}
    assert got == vector["key_groups"]


@pytest.mark.parametrize(
    "vector", [v for v in VECTORS["keys"] if v["type"] == "string"], ids=_vector_id
)
def test_java_string_encodings(vector: dict[str, Any]) -> None:
    # The JSON string Java escaped and the UTF-16 units Java listed are the same text,
    # and the model's UTF-16 split of it gives Java's units back.
    text = _from_units(vector["units"])
    assert vector["text"] == text
    assert plain.utf16_code_units(text) == vector["units"]
    assert fast.java_string_hash(text) == vector["hash"]


def test_java_vectors_cover_what_they_should() -> None:
    keys = [key_of(v) for v in VECTORS["keys"]]
    kinds = {v["type"] for v in VECTORS["keys"]}
    assert kinds == {"int", "long", "string", "boolean", "double", "bytes", "tuple2_int_string"}
    ints = {k for k in keys if type(k) is int}
    assert {
        0,
        1,
        -1,
        2**31 - 1,
        -(2**31),
        2**31,
        -(2**31) - 1,
        1 << 32,
        2**63 - 1,
        -(2**63),
    } <= ints
    assert {"", "\u00e9", "\u65e5\u672c\u8a9e", "\U0001f600"} <= {k for k in keys if type(k) is str}
    assert 0 in {v["murmur"] for v in VECTORS["keys"]}  # the Integer.MIN_VALUE case
    assert -(2**31) in {v["hash"] for v in VECTORS["keys"]}
    doubles = [k for k in keys if type(k) is float]
    assert any(d != d for d in doubles) and float("inf") in doubles
    assert any(d == 0.0 and str(d) == "-0.0" for d in doubles)


@pytest.mark.parametrize("vector", VECTORS["long_hashes"], ids=lambda v: v["value"])
def test_java_long_hashes(vector: dict[str, Any]) -> None:
    value = int(vector["value"])
    assert fast._long_hash(value) == plain.long_hash(value) == vector["hash"]


@BOTH
@pytest.mark.parametrize(
    "vector", VECTORS["operator_ranges"], ids=lambda v: f"{v['max_parallelism']}-{v['parallelism']}"
)
def test_java_operator_ranges(kg: ModuleType, vector: dict[str, Any]) -> None:
    max_parallelism, parallelism = vector["max_parallelism"], vector["parallelism"]
    for item in vector["ranges"]:
        got = kg.compute_key_group_range_for_operator_index(
            max_parallelism, parallelism, item["index"]
        )
        if isinstance(got, KeyGroupRange):
            got = (got.start_key_group, got.end_key_group)
        assert got == (item["start"], item["end"]), item
        for end in ("start", "end"):
            assert (
                kg.compute_operator_index_for_key_group(max_parallelism, parallelism, item[end])
                == item[f"{end}_operator"]
            )
    if "operator_of_key_group" in vector:
        assert [
            kg.compute_operator_index_for_key_group(max_parallelism, parallelism, g)
            for g in range(max_parallelism)
        ] == vector["operator_of_key_group"]


@BOTH
def test_java_default_max_parallelism(kg: ModuleType) -> None:
    vectors = VECTORS["default_max_parallelism"]
    assert len(vectors) > 10
    for vector in vectors:
        assert (
            kg.compute_default_max_parallelism(vector["parallelism"]) == vector["max_parallelism"]
        ), vector


@BOTH
def test_default_max_parallelism_by_the_formula(kg: ModuleType) -> None:
    # min(max(roundUpToPowerOfTwo(p + p / 2), 128), 32768), worked by hand:
    # 85 + 42 = 127 -> 128; 86 + 43 = 129 -> 256; 100 + 50 = 150 -> 256; 171 + 85 = 256;
    # 172 + 86 = 258 -> 512; 21845 + 10922 = 32767 -> 32768; 21846 + 10923 -> 65536 -> cap.
    expected = {
        1: 128,
        2: 128,
        85: 128,
        86: 256,
        100: 256,
        171: 256,
        172: 512,
        21845: 32768,
        21846: 32768,
        32768: 32768,
    }
    assert {p: kg.compute_default_max_parallelism(p) for p in expected} == expected


def test_java_program_prints_the_committed_vectors() -> None:
    java = shutil.which("java")
    if java is None:
        pytest.fail(
            "expected a `java` (17 or later) on PATH: it is a declared requirement "
            "of the project (PySpark needs it) and proves tests/data/"
            "key_group_vectors.json comes from Java; got none"
        )
    done = subprocess.run(
        [java, str(JAVA_PROGRAM.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == VECTORS
    assert done.stdout == VECTORS_FILE.read_text(), (
        "tests/data/key_group_vectors.json differs from the program's output: regenerate it "
        "with `java tests/java/KeyGroupVectors.java > tests/data/key_group_vectors.json`"
    )


# ---------------------------------- Java's hash codes at their bounds, by hand


def _double(bits: int) -> float:
    return float(struct.unpack(">d", struct.pack(">q", bits))[0])


@pytest.mark.kills(module="cowstate.key_groups")
def test_murmur_hash_maps_integer_min_value_to_zero() -> None:
    # key_groups.x_murmur_hash 38-40: -2089875627 is the one int32 whose murmur
    # round mixes to Integer.MIN_VALUE (found by inverting the round); Flink's
    # murmurHash returns 0 for it, where Math.abs would stay negative.
    assert murmur_hash(-2089875627) == 0
    assert compute_key_group_for_key_hash(-2089875627, 128) == 0
    assert murmur_hash(0) == 593689054  # Java vectors: negative and positive mixes
    assert murmur_hash(-1) == 1982413648


@pytest.mark.kills(module="cowstate.key_groups")
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


@pytest.mark.kills(module="cowstate.key_groups")
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


@pytest.mark.kills(module="cowstate.key_groups")
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


@pytest.mark.kills(module="cowstate.key_groups")
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


@pytest.mark.kills(module="cowstate.key_groups")
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


# ------------------------------------------------- implementation == model


KEYS_WITH_A_JAVA_COUNTERPART = st.one_of(
    INT64,
    st.booleans(),
    st.floats(),
    st.text(),
    st.binary(),
    st.text(st.characters(min_codepoint=0x10000)),
    st.tuples(INT64, st.text()),
    st.tuples(st.none() | st.integers(), st.none() | st.text(), st.none() | st.floats()),
)


@given(INT32)
def test_bit_mix_and_murmur_hash(code: int) -> None:
    assert fast.bit_mix(code) == plain.bit_mix(code)
    murmur = fast.murmur_hash(code)
    assert murmur == plain.murmur_hash(code)
    assert 0 <= murmur < 2**31


@given(KEYS_WITH_A_JAVA_COUNTERPART, MAX_PARALLELISMS)
def test_key_groups_of_java_keys(key: Any, max_parallelism: int) -> None:
    code = fast.java_hash(key)
    assert code == plain.java_hash(key)
    assert -(2**31) <= code < 2**31
    group = fast.assign_to_key_group(key, max_parallelism)
    assert group == plain.assign_to_key_group(key, max_parallelism)
    assert 0 <= group < max_parallelism
    assert group == fast.compute_key_group_for_key_hash(code, max_parallelism)


@given(st.text(st.integers(0xD800, 0xDFFF).map(chr) | st.characters()))
def test_string_hash_with_lone_surrogates(s: str) -> None:
    # Python strings may hold lone surrogates; each is one UTF-16 unit, as in Java.
    assert fast.java_string_hash(s) == plain.java_string_hash(s)
    assert plain.utf16_code_units(s) == list(
        struct.unpack(
            f">{len(s.encode('utf-16-be', 'surrogatepass')) // 2}H",
            s.encode("utf-16-be", "surrogatepass"),
        )
    )


@given(st.text())
def test_tuple_hash_is_flinks_tuple(s: str) -> None:
    # Tuple2(f0, f1).hashCode() == 31 * f0.hashCode() + f1.hashCode(), in 32 bits.
    for f0 in (0, 1, -1, 2**31 - 1):
        expected = plain.to_int32(31 * f0 + plain.java_string_hash(s))
        assert fast.java_hash((f0, s)) == plain.java_hash((f0, s)) == expected
    assert fast.java_hash((s,)) == fast.java_string_hash(s)
    assert fast.java_hash((None, s)) == fast.java_string_hash(s)


#: Keys without a Java hashCode that the default serializer (the value codec) encodes.
OTHER_KEYS = st.one_of(
    st.integers(min_value=2**63),
    st.integers(max_value=-(2**63) - 1),
    st.lists(st.integers(), max_size=4),
    st.lists(st.frozensets(st.text(max_size=3), max_size=4), max_size=2),
)
#: Keys the value codec refuses: they need an explicit serializer (here pickle).
USER_KEYS = st.one_of(
    st.builds(HashKey, st.text(max_size=4), st.integers(-5, 5)),
    st.tuples(st.integers(), st.builds(HashKey, st.integers(), st.integers())),
    st.complex_numbers(allow_nan=False),
)


@given(OTHER_KEYS, MAX_PARALLELISMS)
def test_key_groups_of_other_keys_hash_the_value_codecs_bytes(
    key: Any, max_parallelism: int
) -> None:
    code = fast.java_hash(key)
    assert code == plain.java_hash(key)
    assert code == plain.bytes_hash(value_codec.encode(key))
    assert code == plain.bytes_hash(plain_codec.encode(key))
    assert fast.assign_to_key_group(key, max_parallelism) == plain.assign_to_key_group(
        key, max_parallelism
    )


@given(USER_KEYS, MAX_PARALLELISMS)
def test_user_keys_need_an_explicit_key_serializer(key: Any, max_parallelism: int) -> None:
    with pytest.raises(UnsupportedValueError, match="explicit serializer"):
        fast.assign_to_key_group(key, max_parallelism)
    pickled = PickleSerializer()
    code = fast.java_hash(key, pickled)
    assert code == plain.java_hash(key, pickled.serialize)
    if type(key) is not tuple:
        assert code == plain.bytes_hash(pickle.dumps(key, protocol=pickle.HIGHEST_PROTOCOL))
    assert fast.assign_to_key_group(key, max_parallelism, pickled) == plain.assign_to_key_group(
        key, max_parallelism, pickled.serialize
    )


class _FixedBytes(DefaultSerializer):
    """A key serializer that writes every key as the same three bytes."""

    __slots__ = ()

    def serialize(self, state: Any) -> bytes:
        return b"abc"


@BOTH
def test_other_keys_hash_the_key_serializers_bytes(kg: ModuleType) -> None:
    key = 2**70
    if kg is fast:
        code = kg.java_hash(key, _FixedBytes())
        assert kg.assign_to_key_group(key, 128, _FixedBytes()) == kg.murmur_hash(code) % 128
    else:
        code = kg.java_hash(key, lambda k: b"abc")
    # Arrays.hashCode(new byte[] {97, 98, 99}) = ((31 + 97) * 31 + 98) * 31 + 99
    assert code == ((31 + 97) * 31 + 98) * 31 + 99 == kg.java_hash(b"abc")
    assert kg.java_hash(key) != code  # the default serializer is the value codec
    # Keys with a Java counterpart ignore the serializer.
    serializer: Any = _FixedBytes() if kg is fast else (lambda k: b"abc")
    assert kg.java_hash("flink", serializer) == 97520992


# ------------------------------------------------------------ operator ranges


@given(MAX_PARALLELISMS, st.data())
def test_operator_ranges_partition_the_key_groups(
    max_parallelism: int, data: st.DataObject
) -> None:
    parallelism = data.draw(st.integers(1, min(max_parallelism, 200)), label="parallelism")
    ranges = [
        fast.compute_key_group_range_for_operator_index(max_parallelism, parallelism, i)
        for i in range(parallelism)
    ]
    assert [(r.start_key_group, r.end_key_group) for r in ranges] == [
        plain.compute_key_group_range_for_operator_index(max_parallelism, parallelism, i)
        for i in range(parallelism)
    ]
    assert ranges[0].start_key_group == 0
    assert ranges[-1].end_key_group == max_parallelism - 1
    for before, after in itertools.pairwise(ranges):
        assert after.start_key_group == before.end_key_group + 1
    sizes = [len(r) for r in ranges]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert sum(sizes) == max_parallelism
    for i, r in enumerate(ranges):
        for group in {
            r.start_key_group,
            r.end_key_group,
            data.draw(st.integers(r.start_key_group, r.end_key_group)),
        }:
            assert (
                fast.compute_operator_index_for_key_group(max_parallelism, parallelism, group) == i
            )
            assert (
                plain.compute_operator_index_for_key_group(max_parallelism, parallelism, group) == i
            )


@given(st.integers(1, 300), st.data())
def test_every_key_group_maps_back_to_its_operator(
    max_parallelism: int, data: st.DataObject
) -> None:
    parallelism = data.draw(st.integers(1, max_parallelism), label="parallelism")
    for i in range(parallelism):
        for group in fast.compute_key_group_range_for_operator_index(
            max_parallelism, parallelism, i
        ):
            assert (
                fast.compute_operator_index_for_key_group(max_parallelism, parallelism, group) == i
            )


def test_full_parallelism_gives_one_key_group_per_operator() -> None:
    n = 32768
    assert all(
        fast.compute_key_group_range_for_operator_index(n, n, i) == KeyGroupRange(i, i)
        and fast.compute_operator_index_for_key_group(n, n, i) == i
        for i in range(n)
    )


@given(KEYS_WITH_A_JAVA_COUNTERPART, MAX_PARALLELISMS, st.data())
def test_assign_key_to_parallel_operator(
    key: Any, max_parallelism: int, data: st.DataObject
) -> None:
    parallelism = data.draw(st.integers(1, max_parallelism), label="parallelism")
    operator = fast.assign_key_to_parallel_operator(key, max_parallelism, parallelism)
    group = plain.assign_to_key_group(key, max_parallelism)
    assert operator == plain.compute_operator_index_for_key_group(
        max_parallelism, parallelism, group
    )
    assert group in fast.compute_key_group_range_for_operator_index(
        max_parallelism, parallelism, operator
    )


# ----------------------------------------------- operator ranges, case by case


@pytest.mark.kills(module="cowstate.key_groups")
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


@pytest.mark.kills(module="cowstate.key_groups")
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


# ------------------------------------------------------------- KeyGroupRange

BOUNDS = st.integers(0, 60)


@given(BOUNDS, st.integers(-1, 60))
def test_key_group_range_contents(start: int, end: int) -> None:
    r = KeyGroupRange.of(start, end)
    members = list(range(start, end + 1))
    assert list(r) == members
    assert len(r) == r.number_of_key_groups == len(members)
    if start > end:
        assert r is KeyGroupRange.EMPTY
        assert (r.start_key_group, r.end_key_group) == (0, -1)
    else:
        assert (r.start_key_group, r.end_key_group) == (start, end)
    for group in range(-2, 63):
        assert (group in r) == r.contains(group) == (group in members)
        if group in members:
            assert r.index_of(group) == members.index(group)
        else:
            with pytest.raises(KeyGroupOutOfRangeError, match=f"got key group {group};"):
                r.index_of(group)


@given(BOUNDS, st.integers(-1, 60), BOUNDS, st.integers(-1, 60))
def test_key_group_range_intersection(s1: int, e1: int, s2: int, e2: int) -> None:
    a, b = KeyGroupRange.of(s1, e1), KeyGroupRange.of(s2, e2)
    both = a.intersection(b)
    assert both == b.intersection(a)
    assert list(both) == sorted(set(a) & set(b))
    if not set(a) & set(b):
        assert both == KeyGroupRange.EMPTY and len(both) == 0


@given(BOUNDS, st.integers(-1, 60))
def test_key_group_range_value_semantics(start: int, end: int) -> None:
    r = KeyGroupRange.of(start, end)
    same = KeyGroupRange.of(start, end)
    assert r == same and hash(r) == hash(same)
    shifted = (
        KeyGroupRange(r.start_key_group + 1, r.end_key_group + 1)
        if len(r)
        else (KeyGroupRange(0, 0))
    )
    assert r != shifted
    assert not r == shifted  # noqa: SIM201 (__eq__ itself, not only __ne__)
    assert r != (r.start_key_group, r.end_key_group)
    assert eval(repr(r), {"KeyGroupRange": KeyGroupRange}) == r
    copy = pickle.loads(pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL))
    assert copy == r and hash(copy) == hash(r)
    if start > end:
        assert copy is KeyGroupRange.EMPTY


def test_key_group_range_examples() -> None:
    r = KeyGroupRange(3, 5)
    assert repr(r) == "KeyGroupRange(3, 5)" and repr(KeyGroupRange.EMPTY) == "KeyGroupRange.EMPTY"
    assert len(KeyGroupRange(7, 7)) == 1
    assert KeyGroupRange(0, 42).intersection(KeyGroupRange(43, 85)) is KeyGroupRange.EMPTY
    assert KeyGroupRange(0, 42).intersection(KeyGroupRange(40, 85)) == KeyGroupRange(40, 42)
    assert 4.0 not in r and "4" not in r and 4 in r


# --------------------------- KeyGroupRange: construction, membership, equality


@pytest.mark.kills(module="cowstate.key_groups")
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


@pytest.mark.kills(module="cowstate.key_groups")
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


@pytest.mark.kills(module="cowstate.key_groups")
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


@pytest.mark.kills(module="cowstate.key_groups")
def test_intersection_keeps_the_shared_groups() -> None:
    # key_groups.xǁKeyGroupRangeǁintersection 1-12.
    assert KeyGroupRange(0, 42).intersection(KeyGroupRange(40, 85)) == KeyGroupRange(40, 42)
    assert KeyGroupRange(40, 85).intersection(KeyGroupRange(0, 42)) == KeyGroupRange(40, 42)
    assert KeyGroupRange(2, 9).intersection(KeyGroupRange(4, 6)) == KeyGroupRange(4, 6)
    assert KeyGroupRange(0, 2).intersection(KeyGroupRange(3, 4)) is KeyGroupRange.EMPTY


@pytest.mark.kills(module="cowstate.key_groups")
def test_key_group_ranges_are_equal_by_both_bounds() -> None:
    # key_groups.xǁKeyGroupRangeǁ__eq__ 1-4.
    r = KeyGroupRange(3, 5)
    assert r == KeyGroupRange(3, 5)
    assert not r == KeyGroupRange(3, 6)  # noqa: SIM201 (__eq__ itself)
    assert not r == KeyGroupRange(2, 5)  # noqa: SIM201
    assert not r == KeyGroupRange(2, 6)  # noqa: SIM201
    assert r.__eq__((3, 5)) is NotImplemented


# ------------------------------------------------ stability across processes

STABLE_KEYS_SOURCE = (
    "['flink', '', '\\u65e5\\u672c\\u8a9e', ('a', 1), (1, ('b', None), 2.5), b'xyz', "
    "[{'x', 'y', 'z', 'w'}], (2 ** 64, ('y', 1), -7), 2 ** 70, [1, 'two'], 1.5, True, "
    "-(2 ** 40)]"
)
STABLE_SCRIPT = (
    "import json\n"
    "from cowstate.key_groups import assign_to_key_group\n"
    "from cowstate_spec.keys import HashKey\n"
    f"keys = {STABLE_KEYS_SOURCE}\n"
    "print(json.dumps({'groups': [assign_to_key_group(k, 32768) for k in keys],\n"
    "                  'python_hash': hash('flink')}))\n"
)


@pytest.mark.parametrize("seed", ["0", "12345"])
def test_key_groups_are_the_same_in_every_process(seed: str) -> None:
    keys = eval(STABLE_KEYS_SOURCE, {"HashKey": HashKey})
    expected = [fast.assign_to_key_group(k, 32768) for k in keys]
    assert expected == [plain.assign_to_key_group(k, 32768) for k in keys]
    done = subprocess.run(
        [sys.executable, "-c", STABLE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=dict(os.environ, PYTHONHASHSEED=seed),
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["groups"] == expected
    # The seed did change Python's own string hash, so the sameness above means something.
    other = subprocess.run(
        [sys.executable, "-c", "print(hash('flink'))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=dict(os.environ, PYTHONHASHSEED="777"),
    )
    assert int(other.stdout) != got["python_hash"]


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("bad", [0, -1, 32769, True, 1.5, "8"], ids=repr)
def test_bad_max_parallelism(bad: Any) -> None:
    calls: list[Callable[[], object]] = [
        lambda: fast.assign_to_key_group("k", bad),
        lambda: fast.compute_key_group_for_key_hash(0, bad),
        lambda: fast.compute_key_group_range_for_operator_index(bad, 1, 0),
        lambda: fast.compute_operator_index_for_key_group(bad, 1, 0),
        lambda: fast.assign_key_to_parallel_operator("k", bad, 1),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError) as caught:
            call()
        assert str(caught.value) == f"expected max_parallelism in 1..32768, got {bad!r}"
        assert isinstance(caught.value, ValueError)
    with pytest.raises(ValueError, match="max_parallelism"):
        plain.assign_to_key_group("k", bad)


def test_parallelism_above_max_parallelism() -> None:
    for call in (
        lambda: fast.compute_key_group_range_for_operator_index(4, 5, 0),
        lambda: fast.compute_operator_index_for_key_group(4, 5, 0),
        lambda: fast.assign_key_to_parallel_operator("k", 4, 5),
    ):
        with pytest.raises(InvalidArgumentError) as caught:
            call()
        message = str(caught.value)
        assert "expected parallelism <= max_parallelism 4" in message
        assert "got parallelism 5" in message


# It absorbed test_bad_parallelism_is_refused_word_for_word (the same calls, values
# and messages): key_groups.x__check_parallelism 2-9.
@pytest.mark.kills(module="cowstate.key_groups")
@pytest.mark.parametrize("bad", [0, -3, 32769, 2.0], ids=repr)
def test_bad_parallelism(bad: Any) -> None:
    for call in (
        lambda: fast.compute_key_group_range_for_operator_index(128, bad, 0),
        lambda: fast.compute_operator_index_for_key_group(128, bad, 0),
        lambda: fast.compute_default_max_parallelism(bad),
    ):
        with pytest.raises(InvalidArgumentError) as caught:
            call()
        assert str(caught.value) == f"expected parallelism in 1..32768, got {bad!r}"


@pytest.mark.parametrize("index", [-1, 3, 1.0], ids=repr)
def test_bad_operator_index(index: Any) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        fast.compute_key_group_range_for_operator_index(128, 3, index)
    assert str(caught.value) == f"expected operator_index in 0..2, got {index!r}"


@pytest.mark.parametrize("group", [-1, 128, None], ids=repr)
def test_bad_key_group(group: Any) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        fast.compute_operator_index_for_key_group(128, 3, group)
    assert str(caught.value) == f"expected key_group in 0..127, got {group!r}"


def test_none_key() -> None:
    call: Callable[[], object]
    for call in (
        lambda: fast.assign_to_key_group(None, 128),
        lambda: fast.assign_key_to_parallel_operator(None, 128, 2),
    ):
        with pytest.raises(InvalidArgumentError, match="expected a key, got None"):
            call()
    with pytest.raises(ValueError, match="got None"):
        plain.assign_to_key_group(None, 128)


@pytest.mark.parametrize(
    "key", [frozenset({1, 2}), {1, 2}, {"a": 1}, (1, frozenset({2}))], ids=repr
)
def test_keys_whose_bytes_follow_the_salted_hash_are_refused(key: Any) -> None:
    kind = type(key[1] if type(key) is tuple else key).__name__
    with pytest.raises(InvalidArgumentError) as caught:
        fast.assign_to_key_group(key, 128)
    message = str(caught.value)
    assert f"expected a key with a stable hash, got a {kind}" in message
    assert "sorted tuple" in message
    with pytest.raises(ValueError, match=f"got a {kind}"):
        plain.assign_to_key_group(key, 128)


# It absorbed test_key_group_range_constructor_messages_word_for_word: the
# messages whole (key_groups.xǁKeyGroupRangeǁ__init__ 1-4, 7, 8, 11, 18).
@pytest.mark.kills(module="cowstate.key_groups")
@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (-1, 3, "expected start_key_group >= 0, got -1"),
        (
            5,
            2,
            "expected start_key_group <= end_key_group, got [5, 2]; "
            "KeyGroupRange.of(start, end) gives the empty range",
        ),
        (1.0, 2, "expected an int start_key_group, got float 1.0"),
        (0, "3", "expected an int end_key_group, got str '3'"),
        (True, 2, "expected an int start_key_group, got bool True"),
    ],
    ids=repr,
)
def test_bad_key_group_range(start: Any, end: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        KeyGroupRange(start, end)
    assert str(caught.value) == message


# --------------------------------------------------- validation, word for word


NONE_KEY = "expected a key, got None; a key must not be None"


@pytest.mark.kills(module="cowstate.key_groups")
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


@pytest.mark.kills(module="cowstate.key_groups")
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


# ------------------------------------------------ key serializers and key types


def test_long_key_serializer_hashes_every_int_as_java_long() -> None:
    """A Flink job keyed by Long: with LongSerializer keys, -1 hashes as Long (0),
    not as Integer (-1); values above int32 are Longs either way."""
    longs = LongSerializer()
    # Long.hashCode: (int) (v ^ (v >>> 32)); -2**31 is 0xFFFFFFFF_80000000 -> 0x7FFFFFFF.
    for value, expected in [(-1, 0), (5, 5), (-5, 4), (1 << 32, 1), (-(1 << 31), 2**31 - 1)]:
        assert fast.java_hash(value, longs) == expected
    assert fast.java_hash(-1, IntSerializer()) == -1
    assert fast.java_hash(-1) == -1


def test_none_key_and_unchecked_key_hash_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="expected a key, got None"):
        fast.java_hash(None)
    with pytest.raises(InvalidArgumentError, match=r"expected a Java hashCode in \[-2\*\*31"):
        fast.compute_key_group_for_key_hash(1 << 31, 128)
    assert fast.compute_key_group_for_key_hash(0, 128) == 94  # the reference's vector


# It absorbed test_key_group_range_membership_takes_only_ints_at_both_ends
# (key_groups.xǁKeyGroupRangeǁ__contains__ 1-5, contains 1-5): both ends.
@pytest.mark.kills(module="cowstate.key_groups")
def test_contains_takes_only_ints() -> None:
    assert not KeyGroupRange(0, 9).contains(4.0)  # type: ignore[arg-type]
    assert KeyGroupRange(0, 9).contains(4) and 4 in KeyGroupRange(0, 9)
    assert 4.0 not in KeyGroupRange(0, 9)
    r = KeyGroupRange(3, 5)
    assert [g in r for g in (2, 3, 4, 5, 6)] == [False, True, True, True, False]
    assert [r.contains(g) for g in (2, 3, 4, 5, 6)] == [False, True, True, True, False]
    assert 4.0 not in r
    assert "4" not in r
    assert r.contains(4.0) is False  # type: ignore[arg-type]
