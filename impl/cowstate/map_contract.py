"""What every map and table shares: the entry record, the transform and keys
contracts, the argument checks and the messages of misuse.

The pure map (:mod:`cowstate.state_map`), the C map (``_cmap.c``), the heap
tables, the nested table and the RocksDB table all say the same things the
same way; they say them through this module, so no layer above the maps
imports a map to share its words:

- :class:`StateEntry`: one mapping ``(key, namespace, state)`` as maps,
  tables, snapshots and backends yield it.
- :func:`apply_transform`: what ``transform`` means everywhere (the
  function's errors, ``None`` refused); :func:`keys_in`: ``keys(namespace)``
  everywhere (a raising namespace ``__eq__`` is a KeyComparisonError, rule U
  of :mod:`cowstate.state_map`).
- :func:`constructor_arguments`, :func:`checked_serializer`: a new map's
  arguments and a serializer set later, checked alike by both maps.
- ``*_message``: the text of each error a map raises on misuse, called by the
  pure map and by the C map, so both say the same words
  (``tests/test_error_messages.py`` pins them).

Imports: this module imports nothing of cowstate's but
:mod:`cowstate.errors`, :mod:`cowstate.arithmetic`,
:mod:`cowstate.serializers` and :mod:`cowstate.type_vars`, so every map and
table can import it without importing one another
(``tests/test_layering.py`` holds it to that, in the layer ``vocabulary``).

The C map imports the names of :data:`__all__` when it is imported
(``PyInit__cmap`` in ``_cmap.c``): they are a contract. Renaming or removing
one breaks ``import cowstate`` wherever the C map is built;
``tests/test_layering.py`` reads every name ``_cmap.c`` fetches from its
source and requires it here, so such a change fails a test first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, NamedTuple

from cowstate.arithmetic import (
    DEFAULT_CAPACITY,
    DEFAULT_REMOVAL_LIMIT,
    MAX_ARRAY_SIZE,
    MAX_VERSION,
    clamp_capacity,
)
from cowstate.errors import (
    InvalidArgumentError,
    KeyComparisonError,
    NoneStateError,
    TransformFunctionError,
)
from cowstate.serializers import (
    DefaultSerializer,
    StateSerializer,
    copies_scalars_as_is,
    is_state_serializer,
)
from cowstate.type_vars import K, N, S, V

# _cmap.c imports every name below (PyInit__cmap: lookup_attr(contract, ...)):
# renaming one is a change of the C map too (tests/test_layering.py).
__all__ = [
    "StateEntry",
    "apply_transform",
    "capacity_message",
    "checked_removal_limit",
    "checked_serializer",
    "checked_version",
    "constructor_arguments",
    "copies_scalars_as_is",
    "foreign_message",
    "keys_in",
    "modified_message",
    "none_message",
    "open_versions_message",
    "overflow_message",
    "pair_message",
    "reentrant_message",
    "released_message",
    "trim_message",
]


class StateEntry(NamedTuple, Generic[K, N, S]):
    """One mapping as iteration yields it."""

    key: K
    namespace: N
    state: S


def apply_transform(
    fn: Callable[[S | None, V], S], old: S | None, value: V, key: object, namespace: object
) -> S:
    """``fn(old, value)``, the new state of a ``transform``, with the contract's
    errors: :class:`TransformFunctionError` if ``fn`` raises,
    :class:`NoneStateError` if it returns ``None`` (the caller then writes
    nothing). Every map and table transforms through it."""
    try:
        new = fn(old, value)
    except Exception as exc:
        raise TransformFunctionError.of(fn, exc, key, namespace) from exc
    if new is None:
        raise NoneStateError.from_transform(key, namespace)
    return new


def keys_in(entries: Iterator[StateEntry[K, N, S]], namespace: N) -> Iterator[K]:
    """The keys of ``entries`` whose namespace equals ``namespace``; a namespace
    ``__eq__`` that raises ends it with :class:`KeyComparisonError` (rule U).
    Every map's and table's ``keys(namespace)`` filters through it."""
    for e in entries:
        try:
            same = bool(e.namespace == namespace)
        except Exception as exc:
            raise KeyComparisonError.of(e.key, namespace, exc) from exc
        if same:
            yield e.key


# --------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------


def constructor_arguments(
    serializer: object, initial_capacity: object = DEFAULT_CAPACITY
) -> tuple[StateSerializer, int]:
    """The checked serializer (default: :class:`DefaultSerializer`) and the
    clamped capacity of a new map; bad arguments raise InvalidArgumentError."""
    if type(initial_capacity) is not int:
        raise InvalidArgumentError(
            f"expected an int initial_capacity, got {type(initial_capacity).__name__} "
            f"{initial_capacity!r}"
        )
    if initial_capacity < 0:
        raise InvalidArgumentError(f"expected initial_capacity >= 0, got {initial_capacity}")
    checked = DefaultSerializer() if serializer is None else checked_serializer(serializer)
    return checked, clamp_capacity(initial_capacity)


def checked_serializer(serializer: object) -> StateSerializer:
    """``serializer`` if it has copy/serialize/deserialize, else InvalidArgumentError."""
    if not is_state_serializer(serializer):
        raise InvalidArgumentError(
            "expected a serializer with copy/serialize/deserialize, got "
            f"{type(serializer).__name__}"
        )
    return serializer


def checked_removal_limit(removal_limit: object = DEFAULT_REMOVAL_LIMIT) -> int:
    """``removal_limit`` of ``track_changes`` (rule D of :mod:`cowstate.state_map`),
    an int >= 1 (default :data:`~cowstate.arithmetic.DEFAULT_REMOVAL_LIMIT`),
    else InvalidArgumentError; the heap backend's ``IncrementalOptions`` too."""
    if type(removal_limit) is not int or removal_limit < 1:
        raise InvalidArgumentError(f"expected a removal limit >= 1, got {removal_limit!r}")
    return removal_limit


def checked_version(version: object, what: str = "version") -> int:
    """A base version of change tracking (``removals_since``, ``trim_removals``,
    ``changed_items``): an int, else InvalidArgumentError."""
    if type(version) is not int:
        raise InvalidArgumentError(
            f"expected an int {what}, got {type(version).__name__} {version!r}"
        )
    return version


# --------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------


def none_message(key: object, namespace: object, op: str) -> str:
    """NoneStateError: ``op`` (put, put_and_get_old) was given ``None``."""
    return (
        f"expected a state for {op}({key!r}, {namespace!r}), got None; None means "
        "absent, use remove() to unmap"
    )


def modified_message() -> str:
    """ConcurrentModificationError: the map changed under an iterator."""
    return (
        "expected no mapping added or removed and no rehash step while iterating "
        "the map; collect what you need first, e.g. list(m.keys(ns))"
    )


def pair_message(item: object) -> str:
    """InvalidArgumentError: ``item in m`` with something else than a pair."""
    return f"expected a (key, namespace) tuple, got {type(item).__name__} {item!r}"


def foreign_message(snapshot: object) -> str:
    """ForeignSnapshotError: ``m.release(snapshot)`` of another map's snapshot."""
    # Both maps' snapshot classes are called StateMapSnapshot and have a version.
    if type(snapshot).__name__ == "StateMapSnapshot":
        version = getattr(snapshot, "version", "?")
        return (
            f"expected a snapshot taken from this map, got one of another map (version {version})"
        )
    return f"expected a snapshot taken from this map, got {type(snapshot).__name__}"


def overflow_message(version: int) -> str:
    """VersionOverflowError: the next snapshot would be ``version``."""
    return (
        f"expected fewer than {MAX_VERSION} snapshots of one map, the next "
        f"would be version {version}; restart with a fresh map"
    )


def capacity_message(size: int, maximum_capacity: int) -> str:
    """MaximumCapacityError: the map of ``size`` entries is at its
    ``maximum_capacity`` and cannot grow."""
    return (
        f"expected at most {MAX_ARRAY_SIZE} entries at the maximum capacity "
        f"{maximum_capacity}, got {size}"
    )


def released_message(version: int, how: str) -> str:
    """SnapshotReleasedError. ``how``: "already" (a second release), "released"
    (read after release) or "while being read" (released during an iteration)."""
    if how == "while being read":
        return f"snapshot version {version} was released while being read"
    if how == "already":
        return (
            f"expected an open snapshot, got snapshot version {version} which was already released"
        )
    return f"expected an open snapshot, got snapshot version {version} which was released"


def open_versions_message(open_versions: tuple[int, ...], version: int) -> str:
    """SnapshotReleasedError: ``version`` is none of the map's open versions."""
    return f"expected an open snapshot version of this map {sorted(open_versions)}, got {version}"


def trim_message(version: int, newest: int) -> str:
    """InvalidArgumentError: ``trim_removals(version)`` past ``V + 1`` (``newest``),
    which would move ``tracking_since`` past it (invariant 13)."""
    return f"expected a version <= V + 1 = {newest} to trim the removal log to, got {version}"


def reentrant_message(what: str) -> str:
    """ConcurrentModificationError: user code (``what``) changed the map it was
    called from, before a write (rule R2 of :mod:`cowstate.state_map`)."""
    return (
        f"expected {what} not to change the map it was called from, but the map "
        "changed; nothing was written"
    )
