"""One keyed state in one RocksDB column family (Flink's ``RocksDB*State`` storage).

Every mapping ``(key, namespace) -> state`` of a state is one RocksDB entry
of the state's column family, stored as the serializers' bytes::

    RocksDB key   = key group (2 bytes, big-endian)      -- sorts by key group
                  + len(key bytes) (4 bytes, big-endian) -- frames the key
                  + key bytes         (key_serializer.serialize(key))
                  + namespace bytes   (namespace_serializer.serialize(namespace))
    RocksDB value = state bytes       (state_serializer.serialize(state))

so a key-group range ``[a, b]`` is the contiguous key range
``[a.to_bytes(2), (b + 1).to_bytes(2))``: a snapshot, a restore or a
rescaling works on whole key groups with one seek (or one ``delete_range``),
and within a key group the length frame lets the key and the namespace be
parsed back.

:class:`RocksDBStateTable` has the table API,
:class:`~cowstate.protocols.KeyedTable` of the same key, namespace and state
types (mypy proves it at the bottom of :mod:`cowstate.protocols`; properties
and argument checks come from :class:`~cowstate.table_base.TableBase`):
``get``, ``contains_key``,
``put``, ``put_and_get_old``, ``remove``, ``remove_and_get_old``,
``transform`` -- each with ``key_group=`` --, iteration in key-group order,
``keys(namespace)``, ``size_of_namespace``, ``len``, and refuses the same
arguments with the same errors. It differs where bytes differ from objects:

- every state it returns is freshly deserialized: mutating it changes
  nothing stored (``transform`` is how a state changes);
- a key or namespace is *its bytes*: two keys that are ``==`` but serialize
  differently (``1`` and ``True`` under pickle) are two mappings, as in
  Flink's RocksDB backend;
- iteration reads the column family in chunks (no native iterator stays open
  between chunks, so an abandoned iteration never keeps the database open);
  it is not fail-fast: a mapping added or removed behind the iteration point
  is simply seen or not, never an error; a corrupt block read on the way
  raises :class:`~cowstate.errors.CorruptStorageError` (:func:`scan` checks
  the iterator's status), it never ends the iteration early;
- ``len`` counts by scanning (RocksDB keeps no exact count).

No method keeps the column family in a local variable across a call that may
raise (a serializer, a transform function): an exception's traceback keeps
its frames' locals, and a column family kept alive keeps the whole database
open after the backend closed it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator, Iterator

from rocksdict import Rdict, RdictIter, ReadOptions, WriteOptions

from cowstate.errors import (
    BackendClosedError,
    CorruptStorageError,
    InvalidArgumentError,
    NoneStateError,
    UnhashableKeyError,
)
from cowstate.key_groups import (
    DEFAULT_LOWER_BOUND_MAX_PARALLELISM,
    KeyGroupRange,
    assign_to_key_group,
)
from cowstate.map_contract import StateEntry, apply_transform
from cowstate.serializers import StateSerializer
from cowstate.state_meta import StateMetaInfo
from cowstate.table_base import TableBase
from cowstate.type_vars import K, N, S, V

__all__ = [
    "KEY_GROUP_PREFIX_BYTES",
    "RocksDBStateTable",
    "check_status",
    "decode_rocks_key",
    "encode_rocks_key",
    "key_group_prefix",
    "scan",
    "write_options",
]


#: Bytes of the key-group prefix of every RocksDB key.
KEY_GROUP_PREFIX_BYTES = 2
_PREFIX_AND_LENGTH = struct.Struct(">HI")
_SCAN_CHUNK = 1024


def key_group_prefix(key_group: int) -> bytes:
    """The first bytes of every RocksDB key of ``key_group`` (also the lower bound
    of its key range; ``key_group_prefix(kg + 1)`` is the upper bound)."""
    return key_group.to_bytes(KEY_GROUP_PREFIX_BYTES, "big")


def encode_rocks_key(key_group: int, key_bytes: bytes, namespace_bytes: bytes) -> bytes:
    """The RocksDB key of one mapping (see the module doc)."""
    return _PREFIX_AND_LENGTH.pack(key_group, len(key_bytes)) + key_bytes + namespace_bytes


def decode_rocks_key(rocks_key: bytes) -> tuple[int, bytes, bytes]:
    """``(key_group, key bytes, namespace bytes)`` of a RocksDB key
    (:class:`CorruptStorageError` for bytes that are not one: shorter than the
    prefix and length, or a key length past the end)."""
    start = _PREFIX_AND_LENGTH.size
    if len(rocks_key) < start:
        raise CorruptStorageError(
            f"expected a RocksDB key of at least {start} bytes (key group, key length), got "
            f"{rocks_key.hex()}"
        )
    key_group, length = _PREFIX_AND_LENGTH.unpack_from(rocks_key)
    if start + length > len(rocks_key):
        raise CorruptStorageError(
            f"expected a RocksDB key holding the {length} key bytes its length frame says, "
            f"got {len(rocks_key) - start} bytes after the frame: {rocks_key[:40].hex()}"
        )
    return key_group, rocks_key[start : start + length], rocks_key[start + length :]


def write_options() -> WriteOptions:
    """Write options of every state write: no WAL (checkpoints give durability,
    as in Flink)."""
    options = WriteOptions()
    # A property in rocksdict 0.3.29; its .pyi declares a method.
    setattr(options, "disable_wal", True)  # noqa: B010
    return options


def scan(
    column: Rdict | Callable[[], Rdict],
    lower: bytes,
    upper: bytes | None,
    chunk: int = _SCAN_CHUNK,
) -> Generator[tuple[bytes, bytes], None, None]:
    """Every ``(key, value)`` of a column family in ``[lower, upper)`` (``upper``
    None: to the end), in key order.

    ``column`` is the column family, or a function returning it (asked again
    for every chunk, so a table detached meanwhile raises instead of reading
    a closed database). Reads ``chunk`` entries per native iterator and drops
    the iterator and the column family before yielding: a generator left
    unfinished keeps no reference that would hold the database open. Only
    the upper bound goes into ``ReadOptions``: rocksdict 0.3.29's
    ``set_iterate_lower_bound`` sets the upper bound, so the lower bound is a
    ``seek``.

    A RocksDB iterator that meets an error (a corrupt block: checksums are
    verified on every read) just becomes invalid, as at the end of the range;
    only its status tells the two apart. Every chunk checks it, so corruption
    raises :class:`~cowstate.errors.CorruptStorageError` instead of ending the
    scan early with fewer entries.
    """
    position = lower
    while True:
        read_options = ReadOptions()
        if upper is not None:
            read_options.set_iterate_upper_bound(upper)
        cf = column if isinstance(column, Rdict) else column()
        iterator = cf.iter(read_options)
        batch: list[tuple[bytes, bytes]] = []
        try:
            iterator.seek(position)
            while len(batch) < chunk and iterator.valid():
                key = iterator.key()
                if upper is not None and key >= upper:
                    break
                batch.append((key, iterator.value()))
                iterator.next()
            check_status(iterator, position if not batch else batch[-1][0], upper)
        finally:
            del iterator, cf
        yield from batch
        if len(batch) < chunk:
            return
        position = batch[-1][0] + b"\x00"


def check_status(iterator: RdictIter, last: bytes, upper: bytes | None) -> None:
    """Raise :class:`CorruptStorageError` if ``iterator`` stopped on an error
    (rocksdict's ``RdictIter.status()`` raises one)."""
    try:
        iterator.status()
    except Exception as exc:
        bound = "the end" if upper is None else upper.hex()
        raise CorruptStorageError(
            f"expected RocksDB to read every entry up to {bound}, it stopped after "
            f"{last.hex()}: {exc}"
        ) from exc


class RocksDBStateTable(TableBase[K, N, S]):
    """The mappings of one state in one column family (see the module doc).

    ``cf`` is the column family (an ``Rdict`` bound to it); the other
    arguments are the heap tables' (:class:`~cowstate.table_base.TableBase`
    checks them: by default all key groups of ``max_parallelism``, an
    unnamed value state, pickled keys). The backend detaches the table when
    it replaces or closes the database, after which every operation raises
    :class:`~cowstate.errors.BackendClosedError`.
    """

    def __init__(
        self,
        cf: Rdict,
        key_group_range: KeyGroupRange | None = None,
        max_parallelism: int = DEFAULT_LOWER_BOUND_MAX_PARALLELISM,
        *,
        meta: StateMetaInfo | None = None,
        key_serializer: StateSerializer | None = None,
    ) -> None:
        super().__init__(key_group_range, max_parallelism, meta=meta, key_serializer=key_serializer)
        self._cf: Rdict | None = cf
        self._write_options = write_options()
        self._lower = key_group_prefix(self._range.start_key_group)
        self._upper = key_group_prefix(self._range.end_key_group + 1)

    @property
    def is_attached(self) -> bool:
        """False once the backend replaced or closed the database under the table."""
        return self._cf is not None

    def detach(self) -> None:
        """Drop the column family (the backend is closing or replacing the database)."""
        self._cf = None

    # ---------------------------------------------------------------- reads

    def get(self, key: K, namespace: N, *, key_group: int | None = None) -> S | None:
        """A fresh copy of the state of ``(key, namespace)``, or ``None``."""
        data = self._read(self._rocks_key(key, namespace, key_group))
        return None if data is None else self._decode_state(data)

    def contains_key(self, key: K, namespace: N, *, key_group: int | None = None) -> bool:
        return self._read(self._rocks_key(key, namespace, key_group)) is not None

    def __len__(self) -> int:
        return sum(1 for _ in scan(self._column, self._lower, self._upper))

    def __iter__(self) -> Iterator[StateEntry[K, N, S]]:
        """Every mapping once, in key-group order, decoded (fresh objects)."""
        return self._entries(self._lower, self._upper)

    def entries_in_key_group(self, key_group: int) -> Iterator[StateEntry[K, N, S]]:
        """The mappings of one key group."""
        self._check_key_group(key_group)
        return self._entries(key_group_prefix(key_group), key_group_prefix(key_group + 1))

    def keys(self, namespace: N) -> Iterator[K]:
        """The keys mapped in ``namespace`` (compared by its bytes), in key-group order."""
        wanted = self._namespace_bytes(namespace)
        key_decode = self._key_serializer.deserialize
        return (key_decode(key) for key, ns in self._raw_keys() if ns == wanted)

    def size_of_namespace(self, namespace: N) -> int:
        wanted = self._namespace_bytes(namespace)
        return sum(1 for _, ns in self._raw_keys() if ns == wanted)

    def raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every raw ``(RocksDB key, value)`` of the column family, in key order,
        whatever the key -- also outside the table's key groups. For checkers:
        the key layout (the module doc) is an invariant of the table."""
        self._column()
        return scan(self._column, b"", None)

    # --------------------------------------------------------------- writes

    def put(self, key: K, namespace: N, state: S, *, key_group: int | None = None) -> None:
        """Map ``(key, namespace)`` to ``state`` (never ``None``). Returns ``None``, not
        whether the mapping is new as the heap tables do: that would cost a read."""
        rocks_key = self._rocks_key(key, namespace, key_group)
        self._check_state(key, namespace, state, "put")
        self._column().put(
            rocks_key, self._meta.state_serializer.serialize(state), self._write_options
        )
        self._stored_key(key)

    def put_and_get_old(
        self, key: K, namespace: N, state: S, *, key_group: int | None = None
    ) -> S | None:
        """Map ``(key, namespace)`` to ``state``; return the previous state or ``None``."""
        rocks_key = self._rocks_key(key, namespace, key_group)
        self._check_state(key, namespace, state, "put_and_get_old")
        data = self._meta.state_serializer.serialize(state)
        old = self._read(rocks_key)
        self._column().put(rocks_key, data, self._write_options)
        self._stored_key(key)
        return None if old is None else self._decode_state(old)

    def remove(self, key: K, namespace: N, *, key_group: int | None = None) -> None:
        """Unmap ``(key, namespace)``; absent mappings are ignored."""
        self._column().delete(self._rocks_key(key, namespace, key_group), self._write_options)

    def remove_and_get_old(self, key: K, namespace: N, *, key_group: int | None = None) -> S | None:
        """Unmap ``(key, namespace)``; return its state or ``None`` if absent."""
        rocks_key = self._rocks_key(key, namespace, key_group)
        old = self._read(rocks_key)
        if old is None:
            return None
        self._column().delete(rocks_key, self._write_options)
        return self._decode_state(old)

    def transform(
        self,
        key: K,
        namespace: N,
        value: V,
        fn: Callable[[S | None, V], S],
        *,
        key_group: int | None = None,
    ) -> None:
        """Map ``(key, namespace)`` to ``fn(old_or_None, value)``, atomically: if
        ``fn`` raises (:class:`TransformFunctionError`) or returns ``None``
        (:class:`NoneStateError`) nothing is written. ``fn`` gets a fresh copy."""
        rocks_key = self._rocks_key(key, namespace, key_group)
        data = self._read(rocks_key)
        old = None if data is None else self._decode_state(data)
        new = self._meta.state_serializer.serialize(apply_transform(fn, old, value, key, namespace))
        self._column().put(rocks_key, new, self._write_options)
        self._stored_key(key)

    def __repr__(self) -> str:
        state = "attached" if self._cf is not None else "detached"
        return (
            f"<{type(self).__name__} {self._meta.name!r} {self._range!r} of "
            f"{self._max_parallelism}, {state}>"
        )

    # ------------------------------------------------------ private helpers

    def _column(self) -> Rdict:
        cf = self._cf
        if cf is None:
            raise BackendClosedError(
                f"expected the table of state {self._meta.name!r} to be in use, got one whose "
                "database was closed or replaced by a restore; ask the backend for its table "
                "again"
            )
        return cf

    def _read(self, rocks_key: bytes) -> bytes | None:
        """The raw value under ``rocks_key`` (raw mode: bytes), or ``None``."""
        data: bytes | None = self._column().get(rocks_key)
        return data

    def _decode_state(self, data: bytes) -> S:
        """The state whose bytes are ``data`` (the serializer's contract: an ``S``)."""
        state: S = self._meta.state_serializer.deserialize(data)
        return state

    def _rocks_key(self, key: K, namespace: N, key_group: int | None) -> bytes:
        if key is None:
            raise InvalidArgumentError(
                "expected a key, got None; keyed state needs a key (no key set?)"
            )
        UnhashableKeyError.check(key)
        UnhashableKeyError.check(namespace, "namespace")
        self.key_types.check(key)  # K1, K3 of cowstate.key_types: as the heap tables
        if key_group is None:
            key_group = assign_to_key_group(key, self._max_parallelism, self._key_serializer)
        self._check_key_group(key_group)
        return encode_rocks_key(
            key_group,
            self._key_serializer.serialize(key),
            self._meta.namespace_serializer.serialize(namespace),
        )

    def _check_key_group(self, key_group: object) -> None:
        if type(key_group) is not int:
            raise InvalidArgumentError(
                f"expected an int key_group, got {type(key_group).__name__} {key_group!r}"
            )
        self._range.index_of(key_group)  # KeyGroupOutOfRangeError outside

    def _namespace_bytes(self, namespace: N) -> bytes:
        UnhashableKeyError.check(namespace, "namespace")
        return self._meta.namespace_serializer.serialize(namespace)

    @staticmethod
    def _check_state(key: object, namespace: object, state: object, op: str) -> None:
        if state is None:
            raise NoneStateError(
                f"expected a state for {op}({key!r}, {namespace!r}), got None; None means "
                "absent, use remove() to unmap"
            )

    def _raw_keys(self) -> Iterator[tuple[bytes, bytes]]:
        for rocks_key, _ in scan(self._column, self._lower, self._upper):
            _, key, namespace = decode_rocks_key(rocks_key)
            yield key, namespace

    def _entries(self, lower: bytes, upper: bytes) -> Iterator[StateEntry[K, N, S]]:
        self._column()  # BackendClosedError now, not at next()
        return self._decoded(lower, upper)

    def _decoded(self, lower: bytes, upper: bytes) -> Iterator[StateEntry[K, N, S]]:
        key_decode = self._key_serializer.deserialize
        namespace_decode = self._meta.namespace_serializer.deserialize
        state_decode = self._meta.state_serializer.deserialize
        for rocks_key, value in scan(self._column, lower, upper):
            _, key, namespace = decode_rocks_key(rocks_key)
            yield StateEntry(key_decode(key), namespace_decode(namespace), state_decode(value))
