"""The C codec seam: whether the snapshot writer and reader run their entries
through :mod:`cowstate._codec` (the C library ``impl/cowstate/_codec.c``; its
header comment is the design), and which serializers it encodes and decodes
itself.

:data:`CODEC` is the module, or ``None`` when it did not build or
``COWSTATE_PURE_PYTHON=1`` forces pure Python (as for the map,
:mod:`cowstate.maps`). The writer and reader read it at each call, so a test
sets it to ``None`` to run the Python path in the same process.

A serializer is *built in* when its bytes are written by the C codec too:
:class:`~cowstate.serializers.DefaultSerializer` and
:class:`~cowstate.serializers.ImmutableSerializer` (and any serializer whose
``serialize``/``deserialize`` is the value codec's function itself), and
exact instances of :class:`~cowstate.serializers.IntSerializer`,
:class:`~cowstate.serializers.LongSerializer`,
:class:`~cowstate.serializers.StringSerializer` and
:class:`~cowstate.serializers.BytesSerializer`. A subclass, or any other
serializer, is ``KIND_PYTHON``: the C loops call its Python method for every
value. For built-in kinds the C codec still hands every value it does not
encode exactly (another type, a subclass, too deep, a set on Python 3.13+)
back to the Python serializer, one value at a time, and every input it does
not decode exactly back to the Python deserializer -- so files and errors
are the Python serializers' byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

from cowstate import value_codec
from cowstate.maps import FORCED_PURE
from cowstate.serializers import BytesSerializer, IntSerializer, LongSerializer, StringSerializer

__all__ = ["BUILD_ERROR", "BUILT", "CODEC", "KIND_PYTHON", "Codec", "decoder_kind", "encoder_kind"]

BUILD_ERROR: str | None
try:
    from cowstate import _codec
except ImportError as exc:  # no compiler at install time: the Python loops
    _codec = None  # type: ignore[assignment]  # not built: the module name stays, bound to None
    BUILD_ERROR = f"{type(exc).__name__}: {exc}"
else:
    BUILD_ERROR = None


#: What the C writer walks of one state (``write_blocks``' ``states``): its map
#: snapshots by key-group index, the key, namespace and state codec kinds, the
#: three serializers' ``serialize``, and for a heap delta the base's map version
#: by key-group index (only what changed since is written), or None.
WalkedState = tuple[list[Any], int, int, int, Any, Any, Any, "list[int] | None"]


class Codec(Protocol):
    """What the writer and reader call of :mod:`cowstate._codec` (its stub and
    ``_codecmodule.c``'s header say what each does)."""

    def encode_section(
        self,
        items: object,
        key_kind: int,
        key_serialize: Callable[[Any], Any],
        namespace_kind: int,
        namespace_serialize: Callable[[Any], Any],
        state_kind: int,
        state_serialize: Callable[[Any], Any],
        /,
    ) -> bytes | list[tuple[Any, Any, Any]] | None: ...

    def decode_section(
        self,
        payload: bytes,
        position: int,
        entries: int,
        key_kind: int,
        state_kind: int,
        decoder: Any,
        key_group: int,
        block: Any,
        /,
    ) -> tuple[int, int]: ...

    def write_blocks(
        self,
        stream: Any,
        position: int,
        first: int,
        last: int,
        states: list[WalkedState | None],
        cancelled: Callable[[int], object] | None,
        written: Callable[[int], object] | None,
        python_section: Callable[[int, int], tuple[int, bytes]],
        buffer_size: int,
        /,
    ) -> tuple[list[int], int, int]: ...

    @property
    def FrozenChanges(self) -> type: ...

    # FrozenChanges: a sequence (len, index) of key, namespace, state per entry
    def freeze_changes(self, snapshot: Any, since: int, /) -> Any: ...

    def flat_removals(self, pairs: list[tuple[Any, Any]], /) -> Any: ...

    def snapshot_type(self) -> type | None: ...


#: The C codec module as built (whether or not the writer and reader use it), or None.
BUILT: ModuleType | None = _codec
#: The C codec module the writer and reader use, or None (pure Python).
CODEC: Codec | None = None if FORCED_PURE else _codec

#: The kind of a serializer the C codec does not know (``_codec.KIND_PYTHON``).
KIND_PYTHON = 0

# The kinds (cowstate._codec.KIND_*, _codec.h's cs_kind) of the exact
# classes whose methods the C codec reproduces, with those methods as they are
# now: a method patched later (a test's spy) is the user's, KIND_PYTHON.
_KEY_KINDS: dict[type, int] = {
    IntSerializer: 2,
    LongSerializer: 3,
    StringSerializer: 4,
    BytesSerializer: 5,
}
_ORIGINALS: dict[tuple[type, str], Any] = {
    (cls, name): getattr(cls, name) for cls in _KEY_KINDS for name in ("serialize", "deserialize")
}
_VALUE = 1
_VALUE_FUNCTIONS = {"serialize": value_codec.encode, "deserialize": value_codec.decode}


def encoder_kind(serialize: Callable[[Any], bytes]) -> int:
    """The codec kind of a ``serializer.serialize``, KIND_PYTHON if not built in."""
    return _kind(serialize, "serialize")


def decoder_kind(deserialize: Callable[[bytes], Any]) -> int:
    """The codec kind of a ``serializer.deserialize``, KIND_PYTHON if not built in."""
    return _kind(deserialize, "deserialize")


def _kind(method: Callable[..., Any], name: str) -> int:
    if method is _VALUE_FUNCTIONS[name]:  # DefaultSerializer's staticmethod, as it is
        return _VALUE
    owner = type(getattr(method, "__self__", None))
    kind = _KEY_KINDS.get(owner)
    if kind is None or getattr(method, "__func__", None) is not _ORIGINALS[owner, name]:
        return KIND_PYTHON
    return kind
