"""The value codec: a safe, versioned encoding of the built-in values states,
keys and namespaces are made of (the bytes of :class:`~cowstate.serializers.
DefaultSerializer` and :class:`~cowstate.serializers.ImmutableSerializer`).

Why not pickle: unpickling runs whatever the bytes ask for (``__reduce__``),
so a snapshot file or a RocksDB value written by someone else could execute
code on restore. Decoding here never executes code and never builds an
object of a type outside the table below; it refuses malformed or hostile
bytes with :class:`~cowstate.errors.UndecodableValueError` (a
:class:`~cowstate.errors.SnapshotFormatError`).

Format, version 1
=================
One encoded value is::

    byte 0      the format version, 0x01
    bytes 1..   exactly one MessagePack object (the MessagePack specification,
                with the bin and str8 types), nothing after it

Python values map to MessagePack objects by their *exact* type (a subclass
of a supported type is refused, so nothing is silently turned into its base
type):

=====================  =========================================================
Python                 MessagePack
=====================  =========================================================
``None``               nil
``bool``               true, false
``int``                int (the smallest width) for ``-2**63 <= n < 2**64``;
                       beyond: ext 1 BIGINT, the two's-complement big-endian
                       bytes of the smallest length that holds the sign
``float``              float 64: the exact bits (NaN payloads, ``-0.0``, inf)
``str``                str, UTF-8; a lone surrogate (which Python strings may
                       hold) as its three-byte ``surrogatepass`` sequence
``bytes``              bin
``list``               array of the items
``dict``               map of the items, in the dict's order; keys are any
                       hashable value of this table
``tuple``              ext 2 TUPLE: payload = one MessagePack array of the items
``set``                ext 3 SET: payload = one MessagePack array of the
                       members' encodings (without version byte), sorted as
                       bytes -- so a set's bytes do not depend on insertion
                       history or ``PYTHONHASHSEED``
``frozenset``          ext 4 FROZENSET: the same
``VOID_NAMESPACE``     ext 5 VOID, empty payload (cowstate's namespace of
                       states without one, :data:`cowstate.VOID_NAMESPACE`)
=====================  =========================================================

Anything else (a user class, ``complex``, ``datetime``, ``range``, a
subclass such as an ``IntEnum``, ...) is refused on encoding with
:class:`~cowstate.errors.UnsupportedValueError` naming the type: such states
need an explicit serializer (one of the ``cowstate.serializers``, your own,
or :class:`~cowstate.serializers.PickleSerializer` for trusted files only).
One exception, because MessagePack's C packer takes them before cowstate
sees them: ``bytearray`` and ``memoryview`` are written as bin and read back
as ``bytes`` (and the ``msgpack`` package's own ``ExtType`` and
``Timestamp`` objects as their ext). Give a state holding them an explicit
serializer if its type must survive.

Limits (the same on both sides, so whatever encodes also decodes): at most
:data:`MAX_CONTAINER_DEPTH` (1,024) lists and dicts nested in one another
between two ext levels -- MessagePack's own limit -- and at most
:data:`MAX_EXT_DEPTH` (8) tuples, sets and frozensets nested in one another.
Each ext level is packed by a nested call of MessagePack's packer, which
recurses in C once per nested container, so the worst value allowed (8
levels of 1,024 nested lists) stays well inside a thread's default 8 MiB
stack (32 levels of 1,020 overflowed it); decoding is iterative within a
level.

Decoding refuses, with :class:`~cowstate.errors.UndecodableValueError`: an
empty input, another version byte, a truncated object, bytes after the
object, MessagePack's reserved byte 0xc1, an ext tag not in the table, an
ext payload that is not what its tag says (a TUPLE or SET payload that is not
one array, a BIGINT that is empty, not minimal or within the int range, a VOID
with a payload), nesting beyond the limits, invalid UTF-8 (other than
surrogates), an unhashable dict key or set member (a list, a dict, a set), a
set or frozenset that repeats a member, and a map or array that claims more
items than the input has bytes (so a hostile length cannot allocate memory).

Accepted though the encoder never writes them (none yields a type outside
the table): ints in a wider MessagePack width than needed, a map that repeats
a key (the last value wins, as in a dict display), a set's members in another
order, single-precision floats, and MessagePack's reserved timestamp
extension (ext -1), which the MessagePack library always interprets itself:
it decodes to an ``int`` (nanoseconds).

The encoding is MessagePack so that both directions run in C (the
``msgpack`` package); only ints beyond 64 bits, tuples, sets, frozensets and
``VOID_NAMESPACE`` call back into Python, once per such value (and a string
with a lone surrogate makes the whole value be encoded a second time, by
packers that let surrogates pass).
"""

from __future__ import annotations

import threading
from typing import Any, Final, Protocol

import msgpack

from cowstate.errors import (
    CowStateError,
    UndecodableValueError,
    UnsupportedValueError,
)
from cowstate.void_namespace import VOID_NAMESPACE

__all__ = [
    "MAX_CONTAINER_DEPTH",
    "MAX_EXT_DEPTH",
    "SUPPORTED_TYPES",
    "VERSION",
    "decode",
    "encode",
]

#: The format version, the first byte of every encoding.
VERSION: Final = 1
#: Lists and dicts nested in one another within one ext level (MessagePack's limit).
MAX_CONTAINER_DEPTH: Final = 1024
#: Tuples, sets and frozensets nested in one another (each level costs C stack).
MAX_EXT_DEPTH: Final = 8
#: The exact types the codec encodes (besides ``VOID_NAMESPACE``).
SUPPORTED_TYPES: Final = (
    type(None),
    bool,
    int,
    float,
    str,
    bytes,
    list,
    dict,
    tuple,
    set,
    frozenset,
)

# Ext tags (MessagePack application ext types 0..127).
_BIGINT: Final = 1
_TUPLE: Final = 2
_SET: Final = 3
_FROZENSET: Final = 4
_VOID: Final = 5

_VERSION_BYTE: Final = bytes([VERSION])
_VOID_EXT: Final = msgpack.ExtType(_VOID, b"")
_INT_MIN: Final = -(2**63)
_INT_LIMIT: Final = 2**64


def encode(value: Any) -> bytes:
    """The bytes of ``value`` (the version byte, then one MessagePack object).

    Raises :class:`~cowstate.errors.UnsupportedValueError` for a value of a
    type outside the module's table (anywhere inside ``value``) or nested
    beyond the limits.
    """
    local = _local
    try:
        return _VERSION_BYTE + local.packers[0].pack(value)
    except UnicodeEncodeError:
        pass  # a lone surrogate somewhere: again, with the surrogatepass packers
    except CowStateError:
        raise
    except (ValueError, TypeError) as exc:  # e.g. msgpack's "recursion limit exceeded"
        raise _refusal(value, exc) from None
    local.packers = local.surrogatepass
    try:
        return _VERSION_BYTE + local.packers[0].pack(value)
    except CowStateError:
        raise
    except (ValueError, TypeError) as exc:
        raise _refusal(value, exc) from None
    finally:
        local.packers = local.strict


def decode(data: bytes | bytearray | memoryview) -> Any:
    """The value whose encoding is ``data`` (bytes or another bytes-like object).

    Raises :class:`~cowstate.errors.UndecodableValueError` for anything
    :func:`encode` could not have written (see the module docstring).
    """
    if type(data) is not bytes:
        if not isinstance(data, bytearray | memoryview):
            raise UndecodableValueError(
                f"expected the bytes of an encoded value, got {type(data).__name__}"
            )
        data = bytes(data)
    if not data:
        raise UndecodableValueError(
            f"expected an encoded value (format version {VERSION}), got no bytes"
        )
    if data[0] != VERSION:
        raise UndecodableValueError(
            f"expected format version {VERSION} of the value codec, got version byte "
            f"{data[0]:#04x} (a value written by another serializer?)"
        )
    try:
        return msgpack.unpackb(
            data[1:],
            raw=False,
            strict_map_key=False,
            timestamp=2,
            unicode_errors="surrogatepass",
            ext_hook=_ext_hook,
        )
    except CowStateError:
        raise
    except Exception as exc:  # whatever msgpack or a hook raised: the bytes are bad
        raise UndecodableValueError(
            f"expected a valid encoding of format version {VERSION} ({len(data)} bytes), "
            f"got {type(exc).__name__}: {str(exc) or 'a byte that starts no MessagePack object'}"
        ) from None


# ------------------------------------------------------------------ private


class _Local(threading.local):
    """Per thread: the packers and the current ext depth. A packer is not
    reentrant, so each ext depth has its own: ``packers[d]`` packs the
    payloads of depth ``d`` (0: the value itself). ``packers`` is ``strict``,
    or ``surrogatepass`` while a value with a lone surrogate is encoded."""

    def __init__(self) -> None:
        self.depth = 0
        self.strict = [_packer(None) for _ in range(MAX_EXT_DEPTH + 1)]
        self.surrogatepass = [_packer("surrogatepass") for _ in range(MAX_EXT_DEPTH + 1)]
        self.packers = self.strict


class _Packer(Protocol):
    """What this module uses of ``msgpack.Packer`` (autoreset: each call returns bytes)."""

    def pack(self, obj: Any, /) -> bytes: ...

    def pack_array_header(self, n: int, /) -> bytes: ...


def _packer(unicode_errors: str | None) -> _Packer:
    packer: _Packer = msgpack.Packer(
        default=_default,
        use_bin_type=True,
        strict_types=True,
        unicode_errors=unicode_errors,
        buf_size=256,
    )
    return packer


_ExtType = msgpack.ExtType
_new_tuple = tuple.__new__


def _default(value: Any) -> msgpack.ExtType:
    """Called by the packer for every value it has no exact type for.

    Builds each ``ExtType`` with ``tuple.__new__``: its own ``__new__``
    re-checks in Python what is known here.
    """
    kind = type(value)
    if kind is tuple or kind is set or kind is frozenset:
        local = _local
        depth = local.depth + 1
        if depth > MAX_EXT_DEPTH:
            raise UnsupportedValueError(
                f"expected at most {MAX_EXT_DEPTH} tuples, sets and frozensets nested in "
                "one another, got more"
            )
        local.depth = depth
        try:
            packer = local.packers[depth]
            if kind is tuple:
                code, payload = _TUPLE, packer.pack(list(value))
            else:
                code, payload = (_SET if kind is set else _FROZENSET), _pack_set(packer, value)
        finally:
            local.depth = depth - 1
        return _new_tuple(_ExtType, (code, payload))
    if kind is int:  # beyond 64 bits
        length = (value + (value < 0)).bit_length() // 8 + 1
        payload = value.to_bytes(length, "big", signed=True)
        return _new_tuple(_ExtType, (_BIGINT, payload))
    if value is VOID_NAMESPACE:
        return _VOID_EXT
    raise UnsupportedValueError(
        f"expected a value of the built-in types the default serializer encodes "
        f"(None, bool, int, float, str, bytes, list, dict, tuple, set, frozenset, "
        f"VOID_NAMESPACE; exact types, nested), got {kind.__module__}.{kind.__qualname__}: "
        "give the state's descriptor (or the backend's key or namespace serializer) an "
        "explicit serializer, e.g. PickleSerializer() if only trusted processes will "
        "ever read the files"
    )


def _pack_set(packer: _Packer, members: set[Any] | frozenset[Any]) -> bytes:
    encoded = sorted(packer.pack(member) for member in members)
    return packer.pack_array_header(len(encoded)) + b"".join(encoded)


def _refusal(value: Any, exc: Exception) -> UnsupportedValueError:
    """The error for what the packer itself refused (too deep, too large)."""
    if "recursion" in str(exc):
        return UnsupportedValueError(
            f"expected at most {MAX_CONTAINER_DEPTH} lists and dicts nested in one another, "
            f"got a deeper {type(value).__name__}"
        )
    return UnsupportedValueError(
        f"expected a value the value codec can write, got {type(value).__name__} that "
        f"MessagePack refused: {type(exc).__name__}: {exc}"
    )


def _ext_hook(code: int, data: bytes) -> Any:
    """Called by the unpacker for every ext object."""
    if code == _TUPLE:
        return tuple(_unpack_array(data, "tuple"))
    if code in (_SET, _FROZENSET):
        members = _unpack_array(data, "set")
        result = set(members) if code == _SET else frozenset(members)
        if len(result) != len(members):
            raise UndecodableValueError(
                f"expected distinct set members, got {len(members)} members of which "
                f"{len(result)} are distinct"
            )
        return result
    if code == _BIGINT:
        value = int.from_bytes(data, "big", signed=True)
        if (
            not data
            or _INT_MIN <= value < _INT_LIMIT
            or len(data) != ((value + (value < 0)).bit_length() // 8 + 1)
        ):
            raise UndecodableValueError(
                f"expected a big int ext of the minimal length for an int beyond 64 bits, "
                f"got {len(data)} bytes {data[:16].hex()}"
            )
        return value
    if code == _VOID:
        if data:
            raise UndecodableValueError(
                f"expected an empty VOID_NAMESPACE ext, got {len(data)} bytes"
            )
        return VOID_NAMESPACE
    raise UndecodableValueError(
        f"expected an ext tag of the value codec (1 to 5), got tag {code} with {len(data)} bytes"
    )


def _unpack_array(data: bytes, what: str) -> list[Any]:
    """The array an ext payload holds, decoded one ext level deeper."""
    local = _local
    depth = local.depth + 1
    if depth > MAX_EXT_DEPTH:
        raise UndecodableValueError(
            f"expected at most {MAX_EXT_DEPTH} tuples, sets and frozensets nested in one "
            "another, got more"
        )
    local.depth = depth
    try:
        items = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            timestamp=2,
            unicode_errors="surrogatepass",
            ext_hook=_ext_hook,
        )
    finally:
        local.depth = depth - 1
    if type(items) is not list:
        raise UndecodableValueError(
            f"expected the payload of a {what} ext to be one array, got {type(items).__name__}"
        )
    return items


_local = _Local()
