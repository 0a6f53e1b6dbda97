"""The semantic checks of snapshot contents: what a restore refuses although
every size and CRC32 matches.

Checksums say a file holds the bytes its writer wrote; they do not say the
entries make sense, and a file crafted with valid checksums (or written by a
buggy writer) may hold entries no table can keep. Every restore -- heap
snapshot files and canonical savepoints into either backend, and the RocksDB
files whose entries a rescaling restore reads -- checks every entry of a
state S found in the block of key group G, after decoding it:

E1. its key, namespace and state are not ``None`` (``None`` means "absent");
E2. its key and namespace hash (a table addresses a mapping by them);
E3. its key's key group, recomputed as
    :func:`~cowstate.key_groups.assign_to_key_group` does, is G: a key in
    another key group's block is never found by its own key;
E4. no ``(key, namespace)`` appears twice in S (the second would silently
    replace the first; two files never share a key group, so a duplicate can
    only be inside one block);
E5. its state is what S's kind holds (the *holds* column of
    :mod:`cowstate.kinds`): a ``list`` for a list state, a ``dict`` for a map
    state (a list state's handle appends to its state; an ``int`` there,
    decoded by an edited serializer id, would fail at the first ``add``
    instead of at restore).
E6. its key is of the restore's one key type, and no NaN or ``-0.0`` (K1, K3
    of :mod:`cowstate.key_types`): the backend's type if its first key fixed
    one, else the first restored key's (:func:`check_key_types`).

A failure raises :class:`~cowstate.errors.SnapshotEntryError` (E1, E2, E5, E6),
:class:`~cowstate.errors.KeyGroupMismatchError` (E3) or
:class:`~cowstate.errors.DuplicateMappingError` (E4), naming the state, the
key group, the entry and what was wrong; the restore then changes nothing.

Who checks what, and what it costs (a heap restore of 1M entries from a
canonical savepoint takes 1.5-2 s here; the checks must stay under 10% of
it, ``bench/bench_checkpoints.py`` measures the key-group check):

- E1 for keys and states is one identity test per entry in the decoding
  loops (:meth:`~cowstate.snapshot.reader.SnapshotReader.decode_key_group`,
  :func:`decode_rows`). Namespaces are decoded once per distinct namespace
  bytes (:class:`EntryDecoder` caches them, whatever the serializer: every
  entry of a window, or of ``VOID_NAMESPACE``, shares one object), so E1 and
  E2 for namespaces run once per distinct namespace.
- E3 and E2 for keys: :func:`check_key_groups`, in C
  (:mod:`cowstate._keygroups`, 15-25 ms for 1M int keys) for the key types with a
  Java hash (bool, int, str, float, bytes, tuples of them: all hashable), in
  Python for every other key (``hash(key)``, then ``assign_to_key_group``;
  microseconds a key). Without the C module everything goes the Python way.
- E4 costs nothing where a table is filled: the heap backend fills fresh
  tables and a map's ``put`` says whether the mapping was new
  (:func:`duplicate_error`). :func:`~cowstate.snapshot.restore.read_snapshot`
  alone does not check E4 (its result is columns); ``restore_table``, which
  merges into a live table, checks each block with :func:`find_duplicate`
  first; RocksDB compares the raw keys of each block.
- E5: :func:`check_state_types`, one ``set(map(type, states))`` per block of
  a list or map state (the loop runs in C; values of other kinds are not
  looked at).
- E6 is one ``set(map(type, keys))`` per block (C speed) when a block's keys
  are all ``int``, ``str``, ``bytes`` or ``bool``; float and tuple keys are
  walked in Python. A RocksDB restore that keeps native files as they are
  decodes no entry: it checks the first key of each column family.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cowstate.errors import (
    AmbiguousKeyError,
    CowStateError,
    DuplicateMappingError,
    KeyGroupMismatchError,
    KeyTypeMismatchError,
    MixedKeyTypesError,
    SnapshotEntryError,
    SnapshotFormatError,
)
from cowstate.key_groups import assign_to_key_group
from cowstate.key_types import KeyTypes
from cowstate.kinds import KINDS
from cowstate.serializers import StateSerializer

try:
    from cowstate import _keygroups
except ImportError:  # no compiler at install time: every key in Python
    _keygroups = None  # type: ignore[assignment]  # not built: the module name stays, bound to None

__all__ = [
    "NAMESPACE_CACHE_LIMIT",
    "DecodedBlock",
    "EntryDecoder",
    "check_key_groups",
    "check_key_types",
    "check_state_types",
    "decode_rows",
    "duplicate_error",
    "find_duplicate",
    "none_error",
    "state_type_of",
    "undecodable_error",
]

#: Distinct namespace bytes an :class:`EntryDecoder` keeps decoded; past it the
#: cache starts over (many distinct namespaces gain nothing from it).
NAMESPACE_CACHE_LIMIT = 1 << 16


@dataclass
class DecodedBlock:
    """The decoded entries of one state in one key group, as three columns.

    Columns, not ``(key, namespace, state)`` tuples: a million tuples are a
    million objects the garbage collector tracks and traverses again and
    again while a restore allocates (that doubled the time of a heap
    restore); three lists are three.
    """

    keys: list[Any] = field(default_factory=list)
    namespaces: list[Any] = field(default_factory=list)
    states: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.keys)

    def rows(self) -> list[tuple[Any, Any, Any]]:
        """The entries as ``(key, namespace, state)`` tuples."""
        return list(zip(self.keys, self.namespaces, self.states, strict=True))

    def extend(self, other: DecodedBlock) -> None:
        self.keys += other.keys
        self.namespaces += other.namespaces
        self.states += other.states


@dataclass
class EntryDecoder:
    """How the entries of one state decode: its name (for messages), the key,
    namespace and state deserializers, and the namespaces decoded so far by
    their bytes (share one dict between the states of one namespace
    serializer)."""

    name: str
    key: Callable[[bytes], Any]
    namespace: Callable[[bytes], Any]
    state: Callable[[bytes], Any]
    namespaces: dict[bytes, Any] = field(default_factory=dict)
    #: E5: the type every state must have (:func:`state_type_of` its kind), or None.
    holds: type | None = None
    #: The C codec's kinds of ``key`` and ``state``, for the callables they were
    #: found for (:meth:`codec_kinds`: found once per decoder, not per block).
    _kinds: tuple[Callable[[bytes], Any], Callable[[bytes], Any], int, int] | None = field(
        default=None, repr=False, compare=False
    )

    def codec_kinds(self) -> tuple[int, int]:
        """The C codec's kinds of the key and state deserializers
        (:func:`cowstate.snapshot.ccodec.decoder_kind`)."""
        kinds = self._kinds
        if kinds is None or kinds[0] is not self.key or kinds[1] is not self.state:
            from cowstate.snapshot.ccodec import decoder_kind

            kinds = (self.key, self.state, decoder_kind(self.key), decoder_kind(self.state))
            self._kinds = kinds
        return kinds[2], kinds[3]

    def decode_namespace(self, key_group: int, data: bytes) -> Any:
        """The namespace of ``data`` (E1, E2 checked once per distinct bytes)."""
        try:
            namespace = self.namespace(data)
        except Exception as exc:
            raise undecodable_error(self.name, key_group, exc) from exc
        if namespace is None:
            raise none_error(self.name, key_group, "namespace")
        try:
            hash(namespace)
        except Exception as exc:
            raise SnapshotEntryError(
                f"expected hashable namespaces in state {self.name!r}, key group {key_group}, "
                f"got {type(namespace).__name__} {namespace!r:.80} ({type(exc).__name__}: {exc})"
            ) from None
        if len(self.namespaces) >= NAMESPACE_CACHE_LIMIT:
            self.namespaces.clear()
        self.namespaces[data] = namespace
        return namespace


def decode_rows(
    decoder: EntryDecoder, key_group: int, rows: Sequence[tuple[bytes, bytes, bytes]]
) -> DecodedBlock:
    """The decoded entries of raw ``(namespace, key, state)`` rows (E1, and E2
    for namespaces; E3 is :func:`check_key_groups`)."""
    key_decode, state_decode = decoder.key, decoder.state
    namespaces = decoder.namespaces
    out = DecodedBlock()
    keys, namespace_column, states = out.keys, out.namespaces, out.states
    for namespace_bytes, key_bytes, state_bytes in rows:
        try:
            key = key_decode(key_bytes)
            state = state_decode(state_bytes)
        except Exception as exc:
            raise undecodable_error(decoder.name, key_group, exc) from exc
        namespace = namespaces.get(namespace_bytes)
        if namespace is None:
            namespace = decoder.decode_namespace(key_group, namespace_bytes)
        if key is None or state is None:
            raise none_error(decoder.name, key_group, "key" if key is None else "state")
        keys.append(key)
        namespace_column.append(namespace)
        states.append(state)
    check_state_types(decoder, key_group, states)
    return out


def state_type_of(kind: str) -> type | None:
    """E5: the type of every state of a state of ``kind`` (None: any): its
    ``holds`` in :data:`cowstate.kinds.KINDS`."""
    row = KINDS.get(kind)
    return None if row is None else row.holds


def check_state_types(decoder: EntryDecoder, key_group: int, states: Sequence[Any]) -> None:
    """E5: every state of ``states`` is a ``decoder.holds`` (if it names one)."""
    holds = decoder.holds
    if holds is None:
        return
    for kind in set(map(type, states)):
        if not issubclass(kind, holds):
            raise SnapshotEntryError(
                f"expected every state of {decoder.name!r} in key group {key_group} to be a "
                f"{holds.__name__} (what its kind holds), got a state of type {kind.__name__}"
            )


def check_key_groups(
    name: str,
    key_group: int,
    keys: Sequence[Any],
    max_parallelism: int,
    key_serializer: StateSerializer | None,
) -> None:
    """E3 (and E2 for keys): every key of ``keys`` belongs to ``key_group``."""
    accelerated = _keygroups
    long_keys = getattr(key_serializer, "identifier", None) == "int64"
    count = len(keys)
    index = 0
    if accelerated is not None:
        index = accelerated.first_not_in(keys, key_group, max_parallelism, long_keys, 0)
    while index < count:
        key = keys[index]
        try:
            hash(key)
        except Exception as exc:
            raise SnapshotEntryError(
                f"expected hashable keys in state {name!r}, key group {key_group}, got "
                f"{type(key).__name__} {key!r:.80} ({type(exc).__name__}: {exc})"
            ) from None
        try:
            actual = assign_to_key_group(key, max_parallelism, key_serializer)
        except CowStateError as exc:
            raise SnapshotEntryError(
                f"expected keys with a key group in state {name!r}, key group {key_group}, "
                f"got {type(key).__name__} {key!r:.80}: {exc}"
            ) from None
        if actual != key_group:
            raise KeyGroupMismatchError(
                f"expected every key in the block of key group {key_group} to belong to it, "
                f"state {name!r} has key {key!r:.80} there, whose key group is {actual}"
            )
        index += 1
        if accelerated is not None:
            index = accelerated.first_not_in(keys, key_group, max_parallelism, long_keys, index)


def check_key_types(name: str, key_group: int, keys: Sequence[Any], key_types: KeyTypes) -> None:
    """E6: every key of ``keys`` is of ``key_types``' type, which the first fixes if
    none is fixed yet (a restore checks on a copy of the backend's and commits it)."""
    if not keys:
        return
    kinds = set(map(type, keys))
    plain = len(kinds) == 1 and next(iter(kinds)) in _PLAIN_KEY_TYPES
    for key in keys[:1] if plain else keys:  # one plain type: its first key says all
        try:
            key_types.admit(key)
        except (KeyTypeMismatchError, AmbiguousKeyError) as exc:
            raise MixedKeyTypesError(
                f"expected the keys of a restore to be of one type, without NaN or -0.0, "
                f"state {name!r}, key group {key_group} has {type(key).__name__} {key!r:.80}: "
                f"{exc}"
            ) from None


#: The key types :func:`check_key_types` checks by type alone (no ambiguous values).
_PLAIN_KEY_TYPES = frozenset({int, str, bytes, bool})


def find_duplicate(block: DecodedBlock) -> tuple[Any, Any] | None:
    """The first ``(key, namespace)`` given twice in ``block``."""
    seen: set[tuple[Any, Any]] = set()
    for pair in zip(block.keys, block.namespaces, strict=True):
        if pair in seen:
            return pair
        seen.add(pair)
    return None


def duplicate_error(name: str, key_group: int, key: Any, namespace: Any) -> DuplicateMappingError:
    """E4: state ``name`` holds ``(key, namespace)`` twice in ``key_group``."""
    return DuplicateMappingError(
        f"expected each (key, namespace) once per state, state {name!r} holds "
        f"({key!r:.60}, {namespace!r:.60}) twice in key group {key_group}"
    )


def none_error(name: str, key_group: int, role: str) -> SnapshotEntryError:
    """E1: an entry of state ``name`` in ``key_group`` whose ``role`` is ``None``."""
    return SnapshotEntryError(
        f"expected a {role} in every entry of state {name!r}, key group {key_group}, got "
        f"an entry whose {role} is None"
    )


def undecodable_error(name: str, key_group: int, exc: BaseException) -> SnapshotFormatError:
    """An entry of state ``name`` in ``key_group`` its serializers cannot decode."""
    return SnapshotFormatError(
        f"expected entries of state {name!r} in key group {key_group} that its serializers "
        f"can decode, got {type(exc).__name__}: {exc}"
    )
