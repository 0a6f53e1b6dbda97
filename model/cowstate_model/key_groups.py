"""Key groups, said the obvious way.

Each function here means the same as its namesake in ``cowstate.key_groups``
but is written for the reader, not for speed: no masks and no shifts. A
hash over a sequence is its polynomial ``sum(x[i] * 31 ** (n - 1 - i))`` on
Python's unbounded ints, reduced to 32 bits once, at the end, by
:func:`to_int32` (a remainder); the Murmur3 steps reduce each product with a
remainder, ``x >>> n`` is a quotient and a rotation a product plus a
quotient; ranges are ceilings of fractions. ``crosshair diffbehavior`` proves the pairs equal
(``cowstate_spec.equivalences``) and ``tests/test_key_groups.py`` checks both
against vectors printed by Java (``tests/java/KeyGroupVectors.java``).

Standard library and the model's own value codec only: nothing of
cowstate's. Out-of-domain arguments raise ``ValueError`` (the
implementation's ``InvalidArgumentError`` is one).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

from cowstate_model import value_codec

__all__ = [
    "INT_MAX",
    "INT_MIN",
    "LONG_MAX",
    "LONG_MIN",
    "UPPER_BOUND_MAX_PARALLELISM",
    "assign_to_key_group",
    "bit_mix",
    "bytes_hash",
    "compute_default_max_parallelism",
    "compute_key_group_range_for_operator_index",
    "compute_operator_index_for_key_group",
    "double_hash",
    "java_hash",
    "java_string_hash",
    "long_hash",
    "murmur_hash",
    "to_int32",
    "utf16_code_units",
]

INT_MIN = -(2**31)
INT_MAX = 2**31 - 1
LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1
UPPER_BOUND_MAX_PARALLELISM = 2**15
DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 128

_TWO_32 = 2**32


def to_int32(x: int) -> int:
    """The int in ``[-2**31, 2**31)`` congruent to ``x`` modulo ``2**32``:
    what Java keeps of ``x`` in an ``int``."""
    return (x - INT_MIN) % _TWO_32 + INT_MIN


def _unsigned32(x: int) -> int:
    """The int in ``[0, 2**32)`` congruent to ``x`` modulo ``2**32``."""
    return x % _TWO_32


def _rotate_left_15(x: int) -> int:
    """``Integer.rotateLeft(x, 15)`` on an unsigned 32-bit ``x``: the low 17 bits
    move up by 15, the high 15 bits come round to the bottom."""
    return (x % 2**17) * 2**15 + x // 2**17


def _rotate_left_13(x: int) -> int:
    """``Integer.rotateLeft(x, 13)``: the low 19 bits move up by 13, the high 13
    bits come round to the bottom."""
    return (x % 2**19) * 2**13 + x // 2**19


# ------------------------------------------------------------- Java hashing


def long_hash(v: int) -> int:
    """``Long.hashCode(v)``: the high 32 bits XOR the low 32 bits of the
    64-bit two's complement of ``v``."""
    bits = v % 2**64
    high, low = divmod(bits, _TWO_32)
    return to_int32(high ^ low)


def double_hash(x: float) -> int:
    """``Double.hashCode(x)``: the long hash of the IEEE-754 bits, every NaN
    counted as the canonical NaN ``0x7ff8000000000000``."""
    if math.isnan(x):
        bits = 0x7FF8000000000000
    else:
        bits = int.from_bytes(struct.pack("<d", x), "little", signed=False)
    return long_hash(bits)


def utf16_code_units(s: str) -> list[int]:
    """The UTF-16 code units of ``s``: a character beyond U+FFFF becomes a
    high surrogate and a low surrogate; a lone surrogate stays itself."""
    units: list[int] = []
    for char in s:
        point = ord(char)
        if point < 0x10000:
            units.append(point)
        else:
            above = point - 0x10000
            units.append(0xD800 + above // 1024)
            units.append(0xDC00 + above % 1024)
    return units


def _polynomial_31(values: list[int]) -> int:
    """``values[0] * 31**(n-1) + ... + values[n-1] * 31**0``, unbounded."""
    n = len(values)
    return sum(value * 31 ** (n - 1 - i) for i, value in enumerate(values))


def java_string_hash(s: str) -> int:
    """``String.hashCode()``: the base-31 polynomial of the UTF-16 code units,
    kept to 32 bits."""
    return to_int32(_polynomial_31(utf16_code_units(s)))


def bytes_hash(data: bytes) -> int:
    """``Arrays.hashCode(byte[])``: ``31**n`` plus the base-31 polynomial of the
    bytes read as signed (-128..127), kept to 32 bits."""
    signed = [b if b < 128 else b - 256 for b in data]
    return to_int32(31 ** len(signed) + _polynomial_31(signed))


def java_hash(key: Any, serialize: Callable[[Any], bytes] | None = None) -> int:
    """The Java ``hashCode()`` of ``key``; keys Java has no counterpart for hash
    as the bytes ``serialize`` gives them (default: the value codec's, like
    ``cowstate.serializers.DefaultSerializer``; it has no bytes for other
    types, such as the spec's ``HashKey``: pass their serializer's)."""
    kind = type(key)
    if kind is bool:
        return 1231 if key else 1237
    if kind is int:
        if INT_MIN <= key <= INT_MAX:
            return int(key)
        if LONG_MIN <= key <= LONG_MAX:
            return long_hash(key)
    if kind is str:
        return java_string_hash(key)
    if kind is float:
        return double_hash(key)
    if kind is bytes:
        return bytes_hash(key)
    if kind is tuple:
        codes = [0 if field is None else java_hash(field, serialize) for field in key]
        if not codes:
            return 0
        # Flink's TupleN: h = hash(f0), then h = 31 * h + hash(fi) for every next field.
        return to_int32(_polynomial_31(codes))
    if kind in (set, frozenset, dict):
        raise ValueError(f"expected a key with a stable hash, got a {kind.__name__}")
    data = serialize(key) if serialize is not None else value_codec.encode(key)
    return bytes_hash(data)


# ------------------------------------------------------------ murmur mixing


def bit_mix(x: int) -> int:
    """Murmur3's 32-bit finalizer (``MathUtils.bitMix``) of the int32 ``x``."""
    # On the unsigned value, Java's x >>> n is the quotient by 2**n.
    h = _unsigned32(x)
    h = h ^ h // 2**16
    h = _unsigned32(h * 0x85EBCA6B)
    h = h ^ h // 2**13
    h = _unsigned32(h * 0xC2B2AE35)
    h = h ^ h // 2**16
    return to_int32(h)


def murmur_hash(code: int) -> int:
    """``MathUtils.murmurHash``: one Murmur3 round over the int32 ``code``, the
    finalizer, then the absolute value (``Integer.MIN_VALUE`` counts as 0)."""
    k = _unsigned32(code * 0xCC9E2D51)
    k = _rotate_left_15(k)
    k = _unsigned32(k * 0x1B873593)
    k = _rotate_left_13(k)
    k = _unsigned32(k * 5 + 0xE6546B64)
    k = k ^ 4
    mixed = bit_mix(to_int32(k))
    if mixed == INT_MIN:
        return 0
    return abs(mixed)


# -------------------------------------------------------------- key groups


def _require_max_parallelism(max_parallelism: int) -> None:
    if type(max_parallelism) is not int or not (
        1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM
    ):
        raise ValueError(
            f"expected max_parallelism in 1..{UPPER_BOUND_MAX_PARALLELISM}, got {max_parallelism!r}"
        )


def _require_parallelism(max_parallelism: int, parallelism: int) -> None:
    _require_max_parallelism(max_parallelism)
    if type(parallelism) is not int or not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"expected parallelism in 1..{max_parallelism}, got {parallelism!r}")


def assign_to_key_group(
    key: Any, max_parallelism: int, serialize: Callable[[Any], bytes] | None = None
) -> int:
    """The remainder of the key's murmur hash divided by the max parallelism
    (``serialize``: as for :func:`java_hash`)."""
    _require_max_parallelism(max_parallelism)
    if key is None:
        raise ValueError("expected a key, got None")
    return murmur_hash(java_hash(key, serialize)) % max_parallelism


def compute_key_group_range_for_operator_index(
    max_parallelism: int, parallelism: int, operator_index: int
) -> tuple[int, int]:
    """``(first, last)`` key group of operator ``operator_index``: operator ``i``
    owns the key groups from ``ceil(i * maxP / p)`` up to, not including,
    ``ceil((i + 1) * maxP / p)`` (where operator ``i + 1`` starts)."""
    _require_parallelism(max_parallelism, parallelism)
    if type(operator_index) is not int or not 0 <= operator_index < parallelism:
        raise ValueError(f"expected operator_index in 0..{parallelism - 1}, got {operator_index!r}")
    # Exact: the quotients are at most 2**15 and a non-integer one is at least
    # 1 / parallelism >= 2**-15 away from an integer, far above a double's rounding.
    first = math.ceil(operator_index * max_parallelism / parallelism)
    next_first = math.ceil((operator_index + 1) * max_parallelism / parallelism)
    return first, next_first - 1


def compute_operator_index_for_key_group(
    max_parallelism: int, parallelism: int, key_group: int
) -> int:
    """``floor(key_group * p / maxP)``: the operator whose share of
    ``[0, maxP)`` the key group falls in."""
    _require_parallelism(max_parallelism, parallelism)
    if type(key_group) is not int or not 0 <= key_group < max_parallelism:
        raise ValueError(f"expected key_group in 0..{max_parallelism - 1}, got {key_group!r}")
    return math.floor(key_group * parallelism / max_parallelism)


def compute_default_max_parallelism(parallelism: int) -> int:
    """The smallest power of two at least one and a half times ``parallelism``
    (rounded down), but no less than 128 and no more than 32768."""
    _require_parallelism(UPPER_BOUND_MAX_PARALLELISM, parallelism)
    wanted = parallelism + parallelism // 2
    power = 1
    while power < wanted:
        power *= 2
    return min(max(power, DEFAULT_LOWER_BOUND_MAX_PARALLELISM), UPPER_BOUND_MAX_PARALLELISM)
