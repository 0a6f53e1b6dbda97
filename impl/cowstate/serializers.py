"""State serializers: how a state is copied and turned into bytes.

The copy-on-write map never mutates a state object a snapshot can still reach;
when it must hand such a state to a caller who may mutate it, it asks the
state's serializer for a *deep* copy (rule S in :mod:`cowstate.state_map`).
``serialize``/``deserialize`` are used when snapshots are written to files,
for RocksDB's keys and values, and for the key-group hash of keys Java has no
counterpart for (:mod:`cowstate.key_groups`).

- :class:`DefaultSerializer` (identifier ``"cowstate-value"``; the default of
  every descriptor, table and backend) returns known-immutable states as they
  are and deep-copies everything else; its bytes are the value codec's
  (:mod:`cowstate.value_codec`): None, bool, int, float, str, bytes, list,
  dict, tuple, set, frozenset and ``VOID_NAMESPACE``, nested, exact types
  preserved. Decoding never executes code; other types are refused with
  :class:`~cowstate.errors.UnsupportedValueError` when they are written.
- :class:`ImmutableSerializer` (``"cowstate-value-immutable"``) never copies:
  for users who promise their states are never mutated in place (the
  promise is theirs to keep); the same bytes.
- :class:`PickleSerializer` (``"pickle"``) and
  :class:`ImmutablePickleSerializer` (``"pickle-immutable"``) pickle, so any
  picklable state works -- **for trusted files only**: unpickling runs code
  the bytes name, so whoever can write a snapshot file, checkpoint, savepoint
  or RocksDB directory that such a state is restored from can run code in
  your process. cowstate unpickles only for a state, key or namespace whose
  serializer the user set to one of these (the identifiers of files written
  by cowstate before the value codec existed).
- :class:`IntSerializer`, :class:`LongSerializer`, :class:`StringSerializer`
  and :class:`BytesSerializer` write Java's encodings of ints (4 and 8 bytes,
  big-endian), strings (UTF-8) and raw bytes, for keys and namespaces that
  other tools read.

Every serializer has an ``identifier``: snapshot files record it beside each
state, and a restore refuses a serializer whose identifier differs
(:class:`~cowstate.errors.SerializerMismatchError`) before it decodes a
byte. :func:`serializer_for` turns an identifier back into a serializer, for
states that are in a file but not registered on the restoring backend; it
never returns a pickle serializer
(:class:`~cowstate.errors.UntrustedSerializerError`: register the state's
descriptor with a pickle serializer if you trust the file). A serializer may
offer ``duplicate()``: a snapshot takes its serializers through
:func:`duplicate_serializer` in its synchronous part, so a stateful
serializer is never shared with the background writer (Flink's FLINK-6207).
The serializers here are stateless (the value codec keeps its buffers per
thread).
"""

from __future__ import annotations

import copy as _copy
import pickle
import struct
from collections.abc import Callable
from typing import Any, Protocol, TypeGuard, runtime_checkable

from cowstate import value_codec
from cowstate.errors import (
    InvalidArgumentError,
    SerializerMismatchError,
    UntrustedSerializerError,
)

__all__ = [
    "SCALAR_STATES",
    "BytesSerializer",
    "DefaultSerializer",
    "ImmutablePickleSerializer",
    "ImmutableSerializer",
    "IntSerializer",
    "LongSerializer",
    "PickleSerializer",
    "StateSerializer",
    "StringSerializer",
    "copies_scalars_as_is",
    "duplicate_serializer",
    "is_known_immutable",
    "is_state_serializer",
    "serializer_for",
    "serializer_identifier",
]


@runtime_checkable
class StateSerializer(Protocol):
    """What the map needs from a state's type."""

    def copy(self, state: Any) -> Any:
        """Return a state equal to ``state`` that shares nothing mutable with it."""
        ...

    def serialize(self, state: Any) -> bytes:
        """Return the bytes of ``state``."""
        ...

    def deserialize(self, data: bytes) -> Any:
        """Return the state whose bytes are ``data``."""
        ...


def is_state_serializer(obj: object) -> TypeGuard[StateSerializer]:
    """``isinstance(obj, StateSerializer)``, remembered per type.

    A runtime-checkable protocol's ``isinstance`` looks up every member on
    each call (about 0.2 ms on Python 3.11), and a restore builds a table per
    state and key group, each checking its serializers: a type whose class
    defines all three methods passes once for all its instances. Anything
    else (an instance that carries them itself) is checked each time."""
    kind = type(obj)
    if kind in _SERIALIZER_TYPES:
        return True
    if not isinstance(obj, StateSerializer):
        return False
    if all(callable(getattr(kind, name, None)) for name in _SERIALIZER_METHODS):
        _SERIALIZER_TYPES.add(kind)
    return True


_SERIALIZER_METHODS = ("copy", "serialize", "deserialize")
#: Types whose class defines the three methods (is_state_serializer).
_SERIALIZER_TYPES: set[type] = set()

_IMMUTABLE_SCALARS: frozenset[type] = frozenset(
    {int, float, complex, str, bytes, bool, type(None), range}
)


#: The exact types of the states a map hands out without a copy when its
#: serializer copies them as themselves (rule S of cowstate.state_map, the
#: scalar exemption): no caller can mutate such a state in place, so sharing it
#: with a snapshot is safe. The C map tests the same types (_cmap.c:
#: is_scalar_state); a subclass is not in the set.
SCALAR_STATES: frozenset[type] = frozenset({bool, int, float, complex, str, bytes})


def copies_scalars_as_is(serializer: object) -> bool:
    """True if ``serializer`` declares that its ``copy`` returns a state of a
    :data:`SCALAR_STATES` type as itself (its class attribute
    ``copies_scalars_as_is`` is ``True``: every serializer of this module).

    A map whose serializer declares it hands such states out without calling
    ``copy`` (rule S, the scalar exemption). A serializer that does not
    declare it -- any other, and a subclass that sets it to ``False`` because
    its ``copy`` changes scalars -- is called for every shared state as
    before."""
    return getattr(type(serializer), "copies_scalars_as_is", False) is True


def is_known_immutable(state: object) -> bool:
    """True if ``state`` cannot be mutated in place: immutable scalars, and
    tuples/frozensets made only of known-immutable items."""
    kind = type(state)
    if kind in _IMMUTABLE_SCALARS:
        return True
    # exact types; isinstance only tells the type checker they iterate
    if (kind is tuple or kind is frozenset) and isinstance(state, tuple | frozenset):
        return all(is_known_immutable(item) for item in state)
    return False


def _deep_copy(state: Any) -> Any:
    """Known-immutable states as they are, everything else deep-copied."""
    kind = type(state)
    if kind in _IMMUTABLE_SCALARS:
        return state
    # Flat lists and dicts of immutable scalars: what deepcopy would build, 10x faster.
    if kind is list and _IMMUTABLE_SCALARS.issuperset(map(type, state)):
        return list(state)
    if (
        kind is dict
        and _IMMUTABLE_SCALARS.issuperset(map(type, state))
        and _IMMUTABLE_SCALARS.issuperset(map(type, state.values()))
    ):
        return dict(state)
    if is_known_immutable(state):
        return state
    return _copy.deepcopy(state)


class DefaultSerializer:
    """Deep-copies mutable states, returns immutable ones unchanged; the value
    codec's bytes (:mod:`cowstate.value_codec`: built-in value types only)."""

    __slots__ = ()
    identifier = "cowstate-value"
    copies_scalars_as_is = True

    copy = staticmethod(_deep_copy)

    #: ``value_codec.encode``: raises UnsupportedValueError for other types.
    serialize = staticmethod(value_codec.encode)
    #: ``value_codec.decode``: raises UndecodableValueError for bad bytes.
    deserialize = staticmethod(value_codec.decode)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ImmutableSerializer(DefaultSerializer):
    """Never copies: the caller promises states are never mutated in place."""

    __slots__ = ()
    identifier = "cowstate-value-immutable"

    def copy(self, state: Any) -> Any:
        return state


class PickleSerializer:
    """Copies as :class:`DefaultSerializer` does; pickles. **Trusted files
    only**: unpickling a file's bytes runs whatever code they name."""

    __slots__ = ()
    identifier = "pickle"
    copies_scalars_as_is = True

    copy = staticmethod(_deep_copy)

    def serialize(self, state: Any) -> bytes:
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    def deserialize(self, data: bytes) -> Any:
        return pickle.loads(data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ImmutablePickleSerializer(PickleSerializer):
    """Never copies; pickles. **Trusted files only** (see :class:`PickleSerializer`)."""

    __slots__ = ()
    identifier = "pickle-immutable"

    def copy(self, state: Any) -> Any:
        return state


class _FixedSerializer:
    """Base of the serializers of immutable values with a fixed encoding."""

    __slots__ = ()
    identifier = ""
    kind: type = object
    copies_scalars_as_is = True

    def copy(self, state: Any) -> Any:
        return state

    def _check(self, value: Any) -> None:
        if type(value) is not self.kind:
            raise InvalidArgumentError(
                f"expected a {self.kind.__name__} for {self.identifier}, got "
                f"{type(value).__name__} {value!r}"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class IntSerializer(_FixedSerializer):
    """Java ``int``: 4 bytes, big-endian, two's complement (Flink's IntSerializer)."""

    __slots__ = ()
    identifier = "int32"
    kind = int
    _struct = struct.Struct(">i")
    _bits = 32

    def serialize(self, state: Any) -> bytes:
        self._check(state)
        try:
            return self._struct.pack(state)
        except struct.error:
            raise InvalidArgumentError(
                f"expected an int in [-2**{self._bits - 1}, 2**{self._bits - 1} - 1] for "
                f"{self.identifier}, got {state}"
            ) from None

    def deserialize(self, data: bytes) -> Any:
        return self._struct.unpack(data)[0]


class LongSerializer(IntSerializer):
    """Java ``long``: 8 bytes, big-endian, two's complement."""

    __slots__ = ()
    identifier = "int64"
    _struct = struct.Struct(">q")
    _bits = 64


class StringSerializer(_FixedSerializer):
    """A ``str`` as UTF-8 (lone surrogates kept, as Java strings may hold them)."""

    __slots__ = ()
    identifier = "utf8"
    kind = str

    def serialize(self, state: Any) -> bytes:
        self._check(state)
        data: bytes = state.encode("utf-8", "surrogatepass")
        return data

    def deserialize(self, data: bytes) -> Any:
        return data.decode("utf-8", "surrogatepass")


class BytesSerializer(_FixedSerializer):
    """``bytes`` as they are."""

    __slots__ = ()
    identifier = "bytes"
    kind = bytes

    def serialize(self, state: Any) -> bytes:
        self._check(state)
        data: bytes = state
        return data

    def deserialize(self, data: bytes) -> Any:
        return bytes(data)


_BY_IDENTIFIER: dict[str, Callable[[], StateSerializer]] = {
    cls.identifier: cls
    for cls in (
        DefaultSerializer,
        ImmutableSerializer,
        IntSerializer,
        LongSerializer,
        StringSerializer,
        BytesSerializer,
    )
}
#: Serializers that run code from the bytes: never chosen from a file's word.
_PICKLE_IDENTIFIERS = frozenset({PickleSerializer.identifier, ImmutablePickleSerializer.identifier})


def serializer_identifier(serializer: StateSerializer) -> str:
    """The name a snapshot file records for ``serializer``: its ``identifier``
    attribute, else its class's qualified name."""
    identifier = getattr(serializer, "identifier", None)
    if isinstance(identifier, str) and identifier:
        return identifier
    kind = type(serializer)
    return f"{kind.__module__}.{kind.__qualname__}"


def serializer_for(identifier: str) -> StateSerializer:
    """A fresh serializer of the built-in ``identifier``.

    Serializers of the user's own classes are not known here: a restore of
    such a state needs its descriptor (registered before restoring). Neither
    are the pickle serializers, whatever a file says: a file cannot make
    cowstate unpickle (:class:`~cowstate.errors.UntrustedSerializerError`).
    """
    if identifier in _PICKLE_IDENTIFIERS:
        remedy = "Immutable" * (identifier == "pickle-immutable") + "PickleSerializer()"
        raise UntrustedSerializerError(
            f"expected a serializer identifier cowstate decodes without running code from "
            f"the file ({', '.join(sorted(_BY_IDENTIFIER))}), got {identifier!r}: unpickling "
            "runs whatever the file says; if you trust the file, register the state's "
            "descriptor (or give the backend a key or namespace serializer) with "
            f"{remedy} before restoring"
        )
    try:
        return _BY_IDENTIFIER[identifier]()
    except KeyError:
        raise SerializerMismatchError(
            f"expected a built-in serializer identifier ({', '.join(sorted(_BY_IDENTIFIER))})"
            f", got {identifier!r}; register the state's descriptor before restoring"
        ) from None


def duplicate_serializer(serializer: StateSerializer) -> StateSerializer:
    """``serializer.duplicate()`` when it has one, else ``serializer`` itself
    (stateless serializers may be shared between threads)."""
    duplicate = getattr(serializer, "duplicate", None)
    if duplicate is None:
        return serializer
    duplicated: StateSerializer = duplicate()
    return duplicated
