"""The value codec's bytes said the obvious way.

``cowstate.value_codec`` encodes built-in values as a version byte and one
MessagePack object, through the ``msgpack`` package's C packer and a hook
for tuples, sets, frozensets and big ints. :func:`encode` here writes the
same bytes by hand, one MessagePack format byte at a time, from the
MessagePack specification and the table in ``cowstate.value_codec``'s
docstring -- no ``msgpack``, no hooks, no per-thread packers -- so a test can
compare the two on any value. It is the model's default key serializer for
keys without a Java ``hashCode()`` (:func:`cowstate_model.key_groups.java_hash`).

The nesting limits are not modelled, nor is ``VOID_NAMESPACE`` (a namespace,
never a key): :func:`encode` raises ``ValueError`` for any type outside
None, bool, int, float, str, bytes, list, dict, tuple, set and frozenset.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["VERSION", "encode"]

VERSION = 1
BIGINT, TUPLE, SET, FROZENSET = 1, 2, 3, 4


def encode(value: Any) -> bytes:
    """The version byte, then the MessagePack object of ``value``."""
    return bytes([VERSION]) + encode_object(value)


def encode_object(value: Any) -> bytes:
    """The MessagePack object of ``value`` (exact types only)."""
    kind = type(value)
    if value is None:
        return b"\xc0"
    if kind is bool:
        return b"\xc3" if value else b"\xc2"
    if kind is int:
        return _int(value)
    if kind is float:
        return b"\xcb" + struct.pack(">d", value)
    if kind is str:
        return _sized(value.encode("utf-8", "surrogatepass"), 0xA0, 32, (0xD9, 0xDA, 0xDB))
    if kind is bytes:
        return _sized(value, None, 0, (0xC4, 0xC5, 0xC6))
    if kind is list:
        return _header(len(value), 0x90, 16, (None, 0xDC, 0xDD)) + b"".join(
            encode_object(item) for item in value
        )
    if kind is dict:
        return _header(len(value), 0x80, 16, (None, 0xDE, 0xDF)) + b"".join(
            encode_object(k) + encode_object(v) for k, v in value.items()
        )
    if kind is tuple:
        return _ext(TUPLE, encode_object(list(value)))
    if kind is set or kind is frozenset:
        members = sorted(encode_object(member) for member in value)
        payload = _header(len(members), 0x90, 16, (None, 0xDC, 0xDD)) + b"".join(members)
        return _ext(SET if kind is set else FROZENSET, payload)
    raise ValueError(f"the value codec has no encoding for {kind.__name__}")


def _int(n: int) -> bytes:
    if 0 <= n < 2**7:
        return bytes([n])  # positive fixint
    if -(2**5) <= n < 0:
        return bytes([n + 256])  # negative fixint, 0xe0..0xff
    if 0 <= n < 2**64:  # uint 8/16/32/64
        for width, code in ((1, 0xCC), (2, 0xCD), (4, 0xCE), (8, 0xCF)):
            if n < 2 ** (8 * width):
                return bytes([code]) + n.to_bytes(width, "big")
    if -(2**63) <= n < 0:  # int 8/16/32/64
        for width, code in ((1, 0xD0), (2, 0xD1), (4, 0xD2), (8, 0xD3)):
            if n >= -(2 ** (8 * width - 1)):
                return bytes([code]) + n.to_bytes(width, "big", signed=True)
    # Beyond 64 bits: the fewest two's-complement bytes that keep the sign.
    length = 1
    while not -(2 ** (8 * length - 1)) <= n < 2 ** (8 * length - 1):
        length += 1
    return _ext(BIGINT, n.to_bytes(length, "big", signed=True))


def _header(n: int, fix: int | None, fix_limit: int, codes: tuple[int | None, ...]) -> bytes:
    """A length header: the fix form below ``fix_limit``, else 8/16/32-bit lengths."""
    if fix is not None and n < fix_limit:
        return bytes([fix | n])
    for code, width in zip(codes, (1, 2, 4), strict=True):
        if code is not None and n < 2 ** (8 * width):
            return bytes([code]) + n.to_bytes(width, "big")
    raise ValueError(f"{n} items or bytes do not fit a MessagePack length")


def _sized(data: bytes, fix: int | None, fix_limit: int, codes: tuple[int, ...]) -> bytes:
    return _header(len(data), fix, fix_limit, codes) + data


def _ext(code: int, data: bytes) -> bytes:
    fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
    if len(data) in fixed:
        return bytes([fixed[len(data)], code]) + data
    return _header(len(data), None, 0, (0xC7, 0xC8, 0xC9)) + bytes([code]) + data
