"""Key groups: which part of the keyed state a key belongs to, as in Flink.

Keyed state is split into ``max_parallelism`` *key groups* (Flink's
``KeyGroupRangeAssignment``). A key's group is fixed for the life of a job;
an operator instance holds a contiguous :class:`KeyGroupRange`, and rescaling
moves whole key groups between instances::

    key --java_hash--> int32 --murmur_hash--> [0, 2**31) --% max_parallelism--> key group
    key group kg --(kg * parallelism // max_parallelism)--> operator index
    operator index i --> KeyGroupRange(ceil(i * maxP / p), ((i + 1) * maxP - 1) // p)

The assignment is bit-compatible with Flink: a key lands in the same key group
as it would in a Flink job with the same max parallelism, because
:func:`java_hash` computes the Java ``hashCode()`` Flink would see:

=====================  ===================================================
Python key             Java ``hashCode()`` it reproduces
=====================  ===================================================
``bool``               ``Boolean``: 1231 for true, 1237 for false
``int`` in int32       ``Integer``: the value itself
``int`` in int64       ``Long``: ``(int) (v ^ (v >>> 32))``
``str``                ``String``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16
                       code units (a character outside the BMP is two units)
``float``              ``Double``: the ``long`` hash of ``doubleToLongBits``
``tuple``              Flink's ``TupleN``: ``h = 31 * h + hash(field)``
                       starting from the first field's hash, ``None`` fields 0
``bytes``              ``Arrays.hashCode(byte[])`` (signed bytes, seed 1)
anything else          ``Arrays.hashCode`` of the key serializer's bytes
=====================  ===================================================

The last row is cowstate's own documented stable hash for keys Java has no
counterpart for (ints beyond int64, lists, dataclasses with their own
serializer, ...): it is stable across processes as long as the serializer's
bytes are a function of the key's value. The default serializer's are (the
value codec sorts a set's members by their bytes); pickle's are not for
sets, whose pickles follow the salted iteration order. Set, frozenset and
dict keys are refused all the same, and with a pickle key serializer a set
*inside* another key is the caller's to avoid. Python's own ``hash()`` is
never used: ``hash(str)`` changes with ``PYTHONHASHSEED``.

With a :class:`~cowstate.serializers.LongSerializer` as key serializer, every
``int`` key hashes as ``java.lang.Long`` (a Flink job keyed by ``Long``);
otherwise ints in the int32 range hash as ``Integer``.

As in Java, keys of different types are different keys even where Python
calls them equal: ``1``, ``1.0`` and ``True`` (and ``0.0`` and ``-0.0``) have
different key groups. So that equal keys never meet under two key groups, a
backend holds one key type and a table one per domain, and NaN and ``-0.0``
are never keys (:mod:`cowstate.key_types`); the functions here still compute
Flink's key group of any value, NaN and ``-0.0`` included (the Java vectors
check them), and leave refusing keys to where keys enter.

All arithmetic is Java's 32-bit two's-complement arithmetic, emulated with
masks. Contracts are PEP 316 docstrings checked by CrossHair (``make
crosshair``); ``cowstate_model.key_groups`` states the same functions the
obvious way, and CrossHair proves each pair equal.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from cowstate.errors import InvalidArgumentError, KeyGroupOutOfRangeError
from cowstate.serializers import DefaultSerializer, StateSerializer

__all__ = [
    "DEFAULT_LOWER_BOUND_MAX_PARALLELISM",
    "UPPER_BOUND_MAX_PARALLELISM",
    "KeyGroupRange",
    "assign_key_to_parallel_operator",
    "assign_to_key_group",
    "bit_mix",
    "check_key_group_range",
    "compute_default_max_parallelism",
    "compute_key_group_for_key_hash",
    "compute_key_group_range_for_operator_index",
    "compute_operator_index_for_key_group",
    "java_hash",
    "java_string_hash",
    "murmur_hash",
]

DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 128
UPPER_BOUND_MAX_PARALLELISM = 1 << 15

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
_INT_MIN = -(1 << 31)
_INT_MAX = (1 << 31) - 1
_LONG_MIN = -(1 << 63)
_LONG_MAX = (1 << 63) - 1
_CANONICAL_NAN_BITS = 0x7FF8000000000000
_DEFAULT_KEY_SERIALIZER = DefaultSerializer()


# ------------------------------------------------------------------ public API


class KeyGroupRange:
    """The inclusive range ``[start_key_group, end_key_group]`` of key groups.

    ``KeyGroupRange.EMPTY`` holds none (Flink's ``EMPTY_KEY_GROUP_RANGE``,
    start 0, end -1); :meth:`of` returns it for ``start > end``. Ranges are
    immutable, hashable, iterable in ascending order, and support ``in``,
    ``len`` and :meth:`intersection`.
    """

    __slots__ = ("_end", "_start")
    EMPTY: KeyGroupRange

    def __init__(self, start_key_group: int, end_key_group: int) -> None:
        for name, value in (("start_key_group", start_key_group), ("end_key_group", end_key_group)):
            if type(value) is not int:
                raise InvalidArgumentError(
                    f"expected an int {name}, got {type(value).__name__} {value!r}"
                )
        if start_key_group < 0:
            raise InvalidArgumentError(f"expected start_key_group >= 0, got {start_key_group}")
        if end_key_group < start_key_group and (start_key_group, end_key_group) != (0, -1):
            raise InvalidArgumentError(
                f"expected start_key_group <= end_key_group, got [{start_key_group}, "
                f"{end_key_group}]; KeyGroupRange.of(start, end) gives the empty range"
            )
        self._start = start_key_group
        self._end = end_key_group

    @classmethod
    def of(cls, start_key_group: int, end_key_group: int) -> KeyGroupRange:
        """The range ``[start, end]``, or :attr:`EMPTY` when ``start > end``."""
        if start_key_group > end_key_group:
            return cls.EMPTY
        return cls(start_key_group, end_key_group)

    @property
    def start_key_group(self) -> int:
        return self._start

    @property
    def end_key_group(self) -> int:
        return self._end

    @property
    def number_of_key_groups(self) -> int:
        """``1 + end - start`` (0 for the empty range)."""
        return 1 + self._end - self._start

    def __len__(self) -> int:
        return 1 + self._end - self._start

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._start, self._end + 1))

    def contains(self, key_group: int) -> bool:
        """True if ``key_group`` is an int with ``start <= key_group <= end``."""
        return type(key_group) is int and self._start <= key_group <= self._end

    def __contains__(self, key_group: object) -> bool:
        return type(key_group) is int and self._start <= key_group <= self._end

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        """The key groups in both ranges (possibly :attr:`EMPTY`)."""
        return KeyGroupRange.of(max(self._start, other._start), min(self._end, other._end))

    def index_of(self, key_group: int) -> int:
        """The position of ``key_group`` in this range (``key_group - start``).

        Raises :class:`KeyGroupOutOfRangeError` outside the range, where a
        Python list index would silently wrap around.
        """
        if not self._start <= key_group <= self._end:
            raise KeyGroupOutOfRangeError(
                f"expected a key group in {self!r}, got key group {key_group}; unless you "
                "pass key groups yourself, this is most likely a key whose hash or equality "
                "is not deterministic"
            )
        return key_group - self._start

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyGroupRange):
            return NotImplemented
        return self._start == other._start and self._end == other._end

    def __hash__(self) -> int:
        return hash((KeyGroupRange, self._start, self._end))

    def __repr__(self) -> str:
        if self._end < self._start:
            return "KeyGroupRange.EMPTY"
        return f"KeyGroupRange({self._start}, {self._end})"

    def __reduce__(self) -> tuple[Any, tuple[int, int]]:
        return (KeyGroupRange.of, (self._start, self._end))


KeyGroupRange.EMPTY = KeyGroupRange(0, -1)


def assign_to_key_group(
    key: Any, max_parallelism: int, key_serializer: StateSerializer | None = None
) -> int:
    """The key group of ``key``: ``murmur_hash(java_hash(key)) % max_parallelism``.

    ``key_serializer`` supplies the bytes of keys without a Java counterpart
    (default: :class:`~cowstate.serializers.DefaultSerializer`, the value
    codec). Raises :class:`InvalidArgumentError` for a ``None`` key or a max
    parallelism outside ``1..32768``.
    """
    _check_max_parallelism(max_parallelism)
    if key is None:
        raise InvalidArgumentError("expected a key, got None; a key must not be None")
    return murmur_hash(java_hash(key, key_serializer)) % max_parallelism


def compute_key_group_for_key_hash(key_hash: int, max_parallelism: int) -> int:
    """The key group of a key whose Java ``hashCode()`` is ``key_hash`` (an int32)."""
    _check_max_parallelism(max_parallelism)
    if type(key_hash) is not int or not _INT_MIN <= key_hash <= _INT_MAX:
        raise InvalidArgumentError(
            f"expected a Java hashCode in [-2**31, 2**31 - 1], got {key_hash!r}"
        )
    return murmur_hash(key_hash) % max_parallelism


def compute_key_group_range_for_operator_index(
    max_parallelism: int, parallelism: int, operator_index: int
) -> KeyGroupRange:
    """The key groups of operator ``operator_index`` of ``parallelism`` instances.

    The ranges of indices ``0 .. parallelism - 1`` partition
    ``[0, max_parallelism)`` into contiguous ranges whose sizes differ by at
    most one.
    """
    _check_parallelism(max_parallelism, parallelism)
    _check_index("operator_index", operator_index, parallelism)
    start = (operator_index * max_parallelism + parallelism - 1) // parallelism
    end = ((operator_index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def compute_operator_index_for_key_group(
    max_parallelism: int, parallelism: int, key_group: int
) -> int:
    """The operator index that holds ``key_group``:
    ``key_group * parallelism // max_parallelism``."""
    _check_parallelism(max_parallelism, parallelism)
    _check_index("key_group", key_group, max_parallelism)
    return key_group * parallelism // max_parallelism


def assign_key_to_parallel_operator(
    key: Any, max_parallelism: int, parallelism: int, key_serializer: StateSerializer | None = None
) -> int:
    """The operator index that holds ``key``."""
    _check_parallelism(max_parallelism, parallelism)
    return compute_operator_index_for_key_group(
        max_parallelism, parallelism, assign_to_key_group(key, max_parallelism, key_serializer)
    )


def compute_default_max_parallelism(parallelism: int) -> int:
    """Flink's default: ``min(max(round_up_pow2(p + p // 2), 128), 32768)``."""
    _check_parallelism(UPPER_BOUND_MAX_PARALLELISM, parallelism)
    wanted = parallelism + parallelism // 2
    power = 1 << (wanted - 1).bit_length()
    return min(max(power, DEFAULT_LOWER_BOUND_MAX_PARALLELISM), UPPER_BOUND_MAX_PARALLELISM)


# ------------------------------------------------------------- Java hashing


def java_hash(key: Any, key_serializer: StateSerializer | None = None) -> int:
    """The Java ``hashCode()`` of ``key`` (see the module table), an int32."""
    kind = type(key)
    if kind is int:
        if _INT_MIN <= key <= _INT_MAX and not _is_long(key_serializer):
            hashed: int = key  # an int32 is its own hash
            return hashed
        if _LONG_MIN <= key <= _LONG_MAX:
            return _long_hash(key)
    elif kind is str:
        return java_string_hash(key)
    elif kind is bool:
        return 1231 if key else 1237
    elif kind is float:
        bits = _CANONICAL_NAN_BITS if key != key else struct.unpack(">q", struct.pack(">d", key))[0]
        return _long_hash(bits)
    elif kind is tuple:
        if not key:
            return 0
        h = 0
        for i, field in enumerate(key):
            code = 0 if field is None else java_hash(field, key_serializer)
            h = code if i == 0 else _to_int32(31 * h + code)
        return h
    elif kind is bytes:
        return _bytes_hash(key)
    elif key is None:
        raise InvalidArgumentError("expected a key, got None; a key must not be None")
    elif kind is frozenset or kind is set or kind is dict:
        raise InvalidArgumentError(
            f"expected a key with a stable hash, got a {kind.__name__}: its bytes follow "
            "Python's salted hash order; use a sorted tuple instead"
        )
    serializer = _DEFAULT_KEY_SERIALIZER if key_serializer is None else key_serializer
    return _bytes_hash(serializer.serialize(key))


def java_string_hash(s: str) -> int:
    """``java.lang.String.hashCode()`` of ``s``, over its UTF-16 code units.

    pre: len(s) < 100
    post: -2**31 <= __return__ < 2**31
    """
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & _MASK32
    return _to_int32(h)


def bit_mix(x: int) -> int:
    """Murmur3's 32-bit finalizer (Flink's ``MathUtils.bitMix``), signed result.

    pre: -2**31 <= x < 2**31
    post: -2**31 <= __return__ < 2**31
    post: (x == 0) == (__return__ == 0)
    """
    x &= _MASK32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & _MASK32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & _MASK32
    x ^= x >> 16
    return _to_int32(x)


def murmur_hash(code: int) -> int:
    """Flink's ``MathUtils.murmurHash(int)``: one murmur3 round, then made
    non-negative (``Integer.MIN_VALUE`` becomes 0).

    pre: -2**31 <= code < 2**31
    post: 0 <= __return__ < 2**31
    """
    c = (code & _MASK32) * 0xCC9E2D51 & _MASK32
    c = (c << 15 | c >> 17) & _MASK32
    c = c * 0x1B873593 & _MASK32
    c = (c << 13 | c >> 19) & _MASK32
    c = (c * 5 + 0xE6546B64) & _MASK32
    c ^= 4
    mixed = bit_mix(_to_int32(c))
    if mixed >= 0:
        return mixed
    if mixed != _INT_MIN:
        return -mixed
    return 0


# ---------------------------------------------------------- private helpers


def _to_int32(x: int) -> int:
    """The int32 whose two's-complement bits are the low 32 bits of ``x``.

    post: -2**31 <= __return__ < 2**31
    post: (__return__ - x) % 2**32 == 0
    """
    x &= _MASK32
    return x - (1 << 32) if x & 0x80000000 else x


def _long_hash(v: int) -> int:
    """``java.lang.Long.hashCode(v)``: ``(int) (v ^ (v >>> 32))``.

    pre: -2**63 <= v < 2**63
    post: -2**31 <= __return__ < 2**31
    """
    u = v & _MASK64
    return _to_int32(u ^ (u >> 32))


def _is_long(key_serializer: StateSerializer | None) -> bool:
    return getattr(key_serializer, "identifier", None) == "int64"


def _bytes_hash(data: bytes) -> int:
    """``java.util.Arrays.hashCode(byte[])``: seed 1, ``31 * h + b`` over signed bytes."""
    h = 1
    for b in data:
        h = (31 * h + (b - 256 if b > 127 else b)) & _MASK32
    return _to_int32(h)


def check_key_group_range(key_group_range: object, max_parallelism: int) -> KeyGroupRange:
    """``key_group_range`` if it is a :class:`KeyGroupRange` inside the key groups
    of a valid ``max_parallelism``; :class:`InvalidArgumentError` otherwise
    (the one check every table and backend constructor makes)."""
    _check_max_parallelism(max_parallelism)
    if not isinstance(key_group_range, KeyGroupRange):
        raise InvalidArgumentError(
            f"expected a KeyGroupRange, got {type(key_group_range).__name__}"
        )
    if key_group_range.end_key_group >= max_parallelism:
        raise InvalidArgumentError(
            f"expected a key-group range inside [0, {max_parallelism - 1}] for max "
            f"parallelism {max_parallelism}, got {key_group_range!r}"
        )
    return key_group_range


def _check_max_parallelism(max_parallelism: int) -> None:
    if type(max_parallelism) is not int or not (0 < max_parallelism <= UPPER_BOUND_MAX_PARALLELISM):
        raise InvalidArgumentError(
            f"expected max_parallelism in 1..{UPPER_BOUND_MAX_PARALLELISM}, got {max_parallelism!r}"
        )


def _check_parallelism(max_parallelism: int, parallelism: int) -> None:
    _check_max_parallelism(max_parallelism)
    if type(parallelism) is not int or not 0 < parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise InvalidArgumentError(
            f"expected parallelism in 1..{UPPER_BOUND_MAX_PARALLELISM}, got {parallelism!r}"
        )
    if parallelism > max_parallelism:
        raise InvalidArgumentError(
            f"expected parallelism <= max_parallelism {max_parallelism}, got parallelism "
            f"{parallelism}: the maximum parallelism must not be smaller than the parallelism"
        )


def _check_index(name: str, value: int, bound: int) -> None:
    if type(value) is not int or not 0 <= value < bound:
        raise InvalidArgumentError(f"expected {name} in 0..{bound - 1}, got {value!r}")
