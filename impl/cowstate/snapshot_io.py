"""Snapshot files: keyed state written per key group, restorable by any key-group range.

Format version 1. All integers are big-endian and unsigned unless marked
``i32`` (two's complement); CRC32 is ``zlib.crc32``::

    offset      size  field
    ----------  ----  -------------------------------------------------------------
    0           8     magic b"\\x89CWSNAP\\n"
    8           2     format version = 1
    10          2     flags = 0 (reserved)
    12          4     metadata length M
    16          M     metadata, UTF-8 JSON (SnapshotMetadata): format name, max
                      parallelism, key-group range [start, end], key serializer
                      id, and per state: id, name, kind, namespace and state
                      serializer ids
    16+M        4     CRC32 of bytes [0, 16+M)
    then, for every key group of the range, ascending -- one block each:
                4     key group (i32)
                4     entry count E (all states of this key group)
                4     payload length P
                P     payload: per state with entries here, by id:
                        2  state id
                        4  entry count of this state
                        entries: (4 length + namespace bytes,
                                  4 length + key bytes,
                                  4 length + state bytes)
                4     CRC32 of the block's 12 header bytes and payload
    I           4     index: number of key groups C
                12*C  C x (key group i32, offset u64 of its block)
                4     CRC32 of the index
    end-16      8     I, the offset of the index
    end-8       8     end magic b"CWSNAPIX"

Namespace first, as in Flink's heap format. The index lets a reader seek
straight to the key groups it restores; a restore with another key-group
range (rescaling) reads only the intersection, and several files (scale
down) or one file into several backends (scale up) give each key group to
exactly one reader.

A reader trusts nothing: it checks both magics, the version, every CRC, that
every indexed key group lies in the file's range and that each block holds
the key group its index entry names, and that lengths stay inside the file.
Any failure raises a :class:`~cowstate.errors.SnapshotFormatError` subclass
naming the offset, and because :func:`read_snapshot` decodes everything
before returning and :func:`restore_table` writes only after every file was
read, a bad file restores nothing.
"""

from __future__ import annotations

import io
import struct
import threading
import zlib
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cowstate.errors import (
    BadMagicError,
    ChecksumMismatchError,
    InvalidArgumentError,
    KeyGroupMismatchError,
    MaxParallelismMismatchError,
    SerializerMismatchError,
    SnapshotCancelledError,
    SnapshotFormatError,
    TruncatedSnapshotError,
    UnknownStateError,
    UnsupportedVersionError,
)
from cowstate.key_groups import KeyGroupRange
from cowstate.serializers import StateSerializer, serializer_for, serializer_identifier
from cowstate.state_meta import MAX_STATES, SnapshotFormat, StateMetadata, StateMetaInfo
from cowstate.state_table import StateTable, StateTableSnapshot

__all__ = [
    "END_MAGIC",
    "FORMAT_VERSION",
    "MAGIC",
    "BinaryWriter",
    "RawEntry",
    "RestoredSnapshot",
    "SnapshotFileInfo",
    "SnapshotMetadata",
    "SnapshotReader",
    "SnapshotWriter",
    "StateMetadata",
    "read_snapshot",
    "restore_table",
    "write_snapshot",
]

MAGIC = b"\x89CWSNAP\n"
END_MAGIC = b"CWSNAPIX"
FORMAT_VERSION = 1

_HEADER = struct.Struct(">8sHHI")                # magic, version, flags, metadata length
_U32 = struct.Struct(">I")
_BLOCK = struct.Struct(">iII")                   # key group, entry count, payload length
_STATE = struct.Struct(">HI")                    # state id, entry count
_INDEX_ENTRY = struct.Struct(">iQ")
_FOOTER = struct.Struct(">Q8s")

#: One entry as bytes: (namespace, key, state).
RawEntry = tuple[bytes, bytes, bytes]


class BinaryWriter(Protocol):
    """Where a snapshot file is written: a binary stream, a checkpoint stream, ..."""

    def write(self, data: bytes, /) -> int | None: ...

    def flush(self) -> None: ...


class SnapshotMetadata(BaseModel):
    """The metadata block of a snapshot file."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    format: SnapshotFormat = Field(default=SnapshotFormat.HEAP, strict=False)
    max_parallelism: int = Field(ge=1, le=1 << 15)
    key_group_range: tuple[int, int]
    key_serializer: str
    states: tuple[StateMetadata, ...]

    @property
    def range(self) -> KeyGroupRange:
        return KeyGroupRange.of(*self.key_group_range)

    def state(self, name: str) -> StateMetadata | None:
        return next((s for s in self.states if s.name == name), None)


@dataclass(frozen=True)
class SnapshotFileInfo:
    """What a writer wrote: the key-group offsets (Flink's ``KeyGroupRangeOffsets``)."""

    metadata: SnapshotMetadata
    offsets: dict[int, int]
    size: int
    entries: int


@dataclass
class RestoredSnapshot:
    """Decoded contents of snapshot files for one key-group range.

    ``states[name][key_group]`` is the list of ``(key, namespace, state)``
    restored for that key group; ``metas[name]`` the state's meta info with
    the serializers that decoded it.
    """

    key_group_range: KeyGroupRange
    max_parallelism: int
    formats: set[SnapshotFormat] = field(default_factory=set)
    key_serializer: str = ""
    metas: dict[str, StateMetaInfo] = field(default_factory=dict)
    states: dict[str, dict[int, list[tuple[Any, Any, Any]]]] = field(default_factory=dict)
    #: Key groups read so far (each may come from one file only).
    key_groups: set[int] = field(default_factory=set)
    #: Every state name the files hold, decoded or not.
    all_states: set[str] = field(default_factory=set)

    def entries(self, name: str) -> Iterator[tuple[int, Any, Any, Any]]:
        """``(key_group, key, namespace, state)`` of state ``name``, by key group."""
        for key_group, entries in sorted(self.states.get(name, {}).items()):
            for key, namespace, state in entries:
                yield key_group, key, namespace, state

    def size(self, name: str) -> int:
        return sum(len(entries) for entries in self.states.get(name, {}).values())


# ----------------------------------------------------------------- writing


class SnapshotWriter:
    """Writes one snapshot file from raw bytes, key group by key group.

    ``write_key_group(kg, per_state)`` must be called in ascending key-group
    order for key groups of the metadata's range; key groups it skips get an
    empty block, so the file has one block for every key group of its range.
    ``finish()`` writes the index and footer and returns the
    :class:`SnapshotFileInfo`.
    """

    def __init__(self, stream: BinaryWriter, metadata: SnapshotMetadata) -> None:
        self._stream = stream
        self._metadata = metadata
        self._range = metadata.range
        self._offsets: dict[int, int] = {}
        self._position = 0
        self._entries = 0
        self._last = -1
        meta = metadata.model_dump_json().encode("utf-8")
        head = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(meta)) + meta
        self._write(head + _U32.pack(zlib.crc32(head)))

    def write_key_group(self, key_group: int,
                        per_state: Mapping[int, Sequence[RawEntry]]) -> None:
        """Write the block of ``key_group``: ``per_state[state_id]`` = its entries."""
        if key_group not in self._range or key_group <= self._last:
            raise InvalidArgumentError(
                f"expected key groups of {self._range!r} in ascending order, got {key_group} "
                f"after {self._last}")
        for skipped in range(max(self._last + 1, self._range.start_key_group), key_group):
            self._write_block(skipped, {})
        self._write_block(key_group, per_state)

    def _write_block(self, key_group: int, per_state: Mapping[int, Sequence[RawEntry]]) -> None:
        parts: list[bytes] = []
        count = 0
        pack_u32 = _U32.pack
        for state_id in sorted(per_state):
            entries = per_state[state_id]
            if not entries:
                continue
            parts.append(_STATE.pack(state_id, len(entries)))
            for namespace, key, state in entries:
                parts += (pack_u32(len(namespace)), namespace, pack_u32(len(key)), key,
                          pack_u32(len(state)), state)
            count += len(entries)
        payload = b"".join(parts)
        head = _BLOCK.pack(key_group, count, len(payload))
        crc = zlib.crc32(payload, zlib.crc32(head))
        self._offsets[key_group] = self._position
        self._write(head)
        self._write(payload)
        self._write(_U32.pack(crc))
        self._entries += count
        self._last = key_group

    def finish(self) -> SnapshotFileInfo:
        """Write the index and the footer; the stream is flushed, not closed."""
        for skipped in range(max(self._last + 1, self._range.start_key_group),
                             self._range.end_key_group + 1):
            self._write_block(skipped, {})
        index_at = self._position
        index = _U32.pack(len(self._offsets)) + b"".join(
            _INDEX_ENTRY.pack(kg, offset) for kg, offset in self._offsets.items())
        self._write(index + _U32.pack(zlib.crc32(index)))
        self._write(_FOOTER.pack(index_at, END_MAGIC))
        self._stream.flush()
        return SnapshotFileInfo(self._metadata, dict(self._offsets), self._position,
                                self._entries)

    def _write(self, data: bytes) -> None:
        self._stream.write(data)
        self._position += len(data)


def write_snapshot(snapshots: StateTableSnapshot[Any, Any, Any]
                   | Sequence[StateTableSnapshot[Any, Any, Any]],
                   stream: BinaryWriter, *,
                   format: SnapshotFormat = SnapshotFormat.HEAP,
                   cancel: threading.Event | None = None,
                   release: bool = True) -> SnapshotFileInfo:
    """Write table snapshots (one per state, same key-group range) to ``stream``.

    Each key group's map snapshots are released as soon as the key group is
    written, and, with ``release`` (the default), all of them in the end
    whatever happens. ``cancel`` is checked between key groups: once set,
    :class:`~cowstate.errors.SnapshotCancelledError` is raised.
    """
    tables = [snapshots] if isinstance(snapshots, StateTableSnapshot) else list(snapshots)
    try:
        metadata = _metadata_of(tables, format)
        writer = SnapshotWriter(stream, metadata)
        serializers = [(snap.key_serializer.serialize, snap.meta.namespace_serializer.serialize,
                        snap.meta.state_serializer.serialize) for snap in tables]
        for key_group in metadata.range:
            if cancel is not None and cancel.is_set():
                raise SnapshotCancelledError(
                    f"snapshot cancelled before key group {key_group} was written")
            per_state: dict[int, list[RawEntry]] = {}
            for state_id, snap in enumerate(tables):
                key_bytes, namespace_bytes, state_bytes = serializers[state_id]
                per_state[state_id] = [
                    (namespace_bytes(namespace), key_bytes(key), state_bytes(state))
                    for key, namespace, state in snap.key_group_items(key_group)]
            writer.write_key_group(key_group, per_state)
            for snap in tables:
                snap.release_key_group(key_group)
        return writer.finish()
    finally:
        if release:
            for snap in tables:
                snap.release()


# ----------------------------------------------------------------- reading


class SnapshotReader:
    """Reads a snapshot file: header, metadata and index at once, blocks on demand.

    A seekable stream is read in place; any other is read into memory first.
    """

    def __init__(self, stream: IO[bytes] | bytes) -> None:
        if isinstance(stream, bytes | bytearray | memoryview):
            stream = io.BytesIO(bytes(stream))
        elif not callable(getattr(stream, "read", None)):
            raise InvalidArgumentError(
                f"expected the bytes of a snapshot file or a binary stream, got "
                f"{type(stream).__name__} {stream!r:.60}")
        elif not _seekable(stream):
            stream = io.BytesIO(stream.read())
        self._stream = stream
        self._base = stream.tell()
        stream.seek(0, io.SEEK_END)
        self._size = stream.tell() - self._base
        self.metadata = self._read_metadata()
        self.offsets = self._read_index()

    @property
    def size(self) -> int:
        return self._size

    def rewind(self) -> None:
        """Put the stream back where the file starts."""
        self._stream.seek(self._base)

    def read_key_group(self, key_group: int) -> dict[int, list[RawEntry]]:
        """The raw entries of ``key_group`` per state id (empty if not in the file)."""
        offset = self.offsets.get(key_group)
        if offset is None:
            return {}
        head = self._read_at(offset, _BLOCK.size, f"the block header of key group {key_group}")
        written_group, count, length = _BLOCK.unpack(head)
        if written_group != key_group:
            raise KeyGroupMismatchError(
                f"expected the block at offset {offset} to hold key group {key_group} as the "
                f"index says, got key group {written_group}")
        payload = self._read_at(offset + _BLOCK.size, length,
                                f"the payload of key group {key_group}")
        (crc,) = _U32.unpack(self._read_at(offset + _BLOCK.size + length, 4,
                                           f"the CRC32 of key group {key_group}"))
        actual = zlib.crc32(payload, zlib.crc32(head))
        if crc != actual:
            raise ChecksumMismatchError(
                f"expected CRC32 {crc:#010x} for key group {key_group} at offset {offset}, "
                f"got {actual:#010x}: the block is corrupt")
        return self._parse_payload(key_group, payload, count)

    # ------------------------------------------------------ private helpers

    def _read_at(self, offset: int, length: int, what: str) -> bytes:
        if offset < 0 or offset + length > self._size:
            raise TruncatedSnapshotError(
                f"expected {length} bytes of {what} at offset {offset}, but the file has "
                f"{self._size} bytes")
        self._stream.seek(self._base + offset)
        data = self._stream.read(length)
        if len(data) != length:
            raise TruncatedSnapshotError(
                f"expected {length} bytes of {what} at offset {offset}, got {len(data)}")
        return data

    def _read_metadata(self) -> SnapshotMetadata:
        if self._size < _HEADER.size:
            raise TruncatedSnapshotError(
                f"expected a snapshot file of at least its {_HEADER.size}-byte header, got "
                f"{self._size} bytes")
        magic, version, _flags, length = _HEADER.unpack(self._read_at(0, _HEADER.size,
                                                                      "the header"))
        if magic != MAGIC:
            raise BadMagicError(f"expected the magic bytes {MAGIC!r}, got {magic!r}: "
                                "not a cowstate snapshot file")
        if version != FORMAT_VERSION:
            raise UnsupportedVersionError(
                f"expected snapshot format version {FORMAT_VERSION}, got {version}")
        raw = self._read_at(_HEADER.size, length, "the metadata")
        (crc,) = _U32.unpack(self._read_at(_HEADER.size + length, 4, "the metadata CRC32"))
        actual = zlib.crc32(raw, zlib.crc32(_HEADER.pack(magic, version, _flags, length)))
        if crc != actual:
            raise ChecksumMismatchError(
                f"expected metadata CRC32 {crc:#010x}, got {actual:#010x}: the header or "
                "metadata is corrupt")
        try:
            metadata = SnapshotMetadata.model_validate_json(raw)
        except ValidationError as exc:
            raise SnapshotFormatError(f"expected valid snapshot metadata, got: {exc}") from None
        start, end = metadata.key_group_range
        if not (start >= 0 and end < metadata.max_parallelism and start <= end + 1):
            raise KeyGroupMismatchError(
                f"expected a key-group range inside [0, {metadata.max_parallelism - 1}], got "
                f"[{start}, {end}]")
        ids = [s.id for s in metadata.states]
        if len(set(ids)) != len(ids) or len({s.name for s in metadata.states}) != len(ids):
            raise SnapshotFormatError(f"expected distinct state ids and names, got {ids}")
        self._data_start = _HEADER.size + length + 4
        return metadata

    def _read_index(self) -> dict[int, int]:
        if self._size < self._data_start + 8 + _FOOTER.size:
            raise TruncatedSnapshotError(
                f"expected an index and a footer after the metadata, but the file ends at "
                f"{self._size} bytes")
        index_at, end_magic = _FOOTER.unpack(self._read_at(self._size - _FOOTER.size,
                                                           _FOOTER.size, "the footer"))
        if end_magic != END_MAGIC:
            raise TruncatedSnapshotError(
                f"expected the end magic {END_MAGIC!r} in the last 8 bytes, got {end_magic!r}: "
                "the file is truncated or was not closed")
        end = self._size - _FOOTER.size
        (count,) = _U32.unpack(self._read_at(index_at, 4, "the index"))
        length = 4 + count * _INDEX_ENTRY.size
        if index_at < self._data_start or index_at + length + 4 != end:
            raise TruncatedSnapshotError(
                f"expected an index of {count} key groups between offset {index_at} and the "
                f"footer at {end}: the file is truncated or corrupt")
        raw = self._read_at(index_at, length, "the index")
        (crc,) = _U32.unpack(self._read_at(index_at + length, 4, "the index CRC32"))
        if crc != zlib.crc32(raw):
            raise ChecksumMismatchError(
                f"expected index CRC32 {crc:#010x}, got {zlib.crc32(raw):#010x}: the index "
                "is corrupt")
        offsets: dict[int, int] = {}
        file_range = self.metadata.range
        expected_groups = iter(file_range)
        for position in range(4, length, _INDEX_ENTRY.size):
            key_group, offset = _INDEX_ENTRY.unpack_from(raw, position)
            if key_group not in file_range:
                raise KeyGroupMismatchError(
                    f"expected key groups of the file's range {file_range!r}, the index holds "
                    f"key group {key_group}")
            expected = next(expected_groups, None)
            if key_group != expected:
                raise KeyGroupMismatchError(
                    f"expected the index to list every key group of {file_range!r} once, in "
                    f"order: key group {expected} at entry {(position - 4) // _INDEX_ENTRY.size}"
                    f", got key group {key_group}")
            if not self._data_start <= offset < index_at:
                raise TruncatedSnapshotError(
                    f"expected key group {key_group}'s block between offsets "
                    f"{self._data_start} and {index_at}, the index says {offset}")
            offsets[key_group] = offset
        if len(offsets) != len(file_range):
            raise KeyGroupMismatchError(
                f"expected an index of the {len(file_range)} key groups of {file_range!r}, "
                f"got {len(offsets)}")
        return offsets

    def _parse_payload(self, key_group: int, payload: bytes,
                       count: int) -> dict[int, list[RawEntry]]:
        out: dict[int, list[RawEntry]] = {}
        position = 0
        total = 0
        end = len(payload)
        known = {s.id for s in self.metadata.states}
        unpack = _U32.unpack_from
        try:
            while position < end:
                state_id, entries = _STATE.unpack_from(payload, position)
                position += _STATE.size
                if state_id not in known or state_id in out:
                    raise SnapshotFormatError(
                        f"expected one section per state id of {sorted(known)} in key group "
                        f"{key_group}, got state id {state_id}"
                        + (" twice" if state_id in out else ""))
                rows: list[RawEntry] = []
                append = rows.append
                for _ in range(entries):       # (namespace, key, state), unrolled: the hot loop
                    (length,) = unpack(payload, position)
                    start = position + 4
                    position = start + length
                    namespace = payload[start:position]
                    (length,) = unpack(payload, position)
                    start = position + 4
                    position = start + length
                    key = payload[start:position]
                    (length,) = unpack(payload, position)
                    start = position + 4
                    position = start + length
                    append((namespace, key, payload[start:position]))
                    if position > end:         # a slice past the end is silently short
                        raise struct.error("field past the end of the block")
                out[state_id] = rows
                total += entries
        except struct.error:
            raise TruncatedSnapshotError(
                f"expected {count} entries in key group {key_group}, its block ends early"
            ) from None
        if total != count:
            raise SnapshotFormatError(
                f"expected {count} entries in key group {key_group} as its header says, "
                f"got {total}")
        return out


def read_snapshot(stream: IO[bytes] | bytes, key_group_range: KeyGroupRange, *,
                  max_parallelism: int | None = None,
                  metas: Mapping[str, StateMetaInfo] | None = None,
                  key_serializer: StateSerializer | None = None,
                  states: Collection[str] | None = None,
                  into: RestoredSnapshot | None = None) -> RestoredSnapshot:
    """Decode the key groups of ``key_group_range`` from one snapshot file.

    ``max_parallelism``, when given, must equal the file's. ``metas`` (by
    state name) and ``key_serializer`` supply the serializers; a state without
    one is decoded with the built-in serializer its identifier names. A
    serializer whose identifier differs from the file's is refused.
    ``states`` limits decoding to those names. ``into`` accumulates several
    files (scale down); a key group found in two files is refused. Nothing is
    added unless the whole requested part of the file decoded; a stream is
    left where it started.
    """
    if not isinstance(key_group_range, KeyGroupRange):
        raise InvalidArgumentError(
            f"expected a KeyGroupRange, got {type(key_group_range).__name__}")
    reader = SnapshotReader(stream)
    try:
        return _decode(reader, key_group_range, max_parallelism, metas or {}, key_serializer,
                       states, into)
    finally:
        reader.rewind()


def restore_table(table: StateTable[Any, Any, Any],
                  streams: Iterable[IO[bytes] | bytes] | IO[bytes] | bytes) -> int:
    """Restore ``table``'s state (by its meta info's name) from snapshot files.

    ``streams`` is one file (bytes or a binary stream) or an iterable of them.
    Reads only the table's key-group range of each file; every file is
    decoded before the first ``put``, so a bad file leaves the table as it
    was. Returns the number of mappings restored.
    """
    files: Iterable[Any]
    if isinstance(streams, bytes | bytearray | memoryview) or callable(
            getattr(streams, "read", None)):
        files = [streams]
    elif isinstance(streams, Iterable):
        files = streams
    else:
        raise InvalidArgumentError(
            f"expected snapshot files (bytes or binary streams, or an iterable of them), got "
            f"{type(streams).__name__}")
    name = table.meta.name
    restored = RestoredSnapshot(table.key_group_range, table.max_parallelism)
    for stream in files:
        read_snapshot(stream, table.key_group_range, max_parallelism=table.max_parallelism,
                      metas={name: table.meta}, key_serializer=table.key_serializer,
                      states={name}, into=restored)
    if name not in restored.metas:
        raise UnknownStateError(
            f"expected state {name!r} in the snapshot files, got states "
            f"{sorted(restored.all_states)}")
    count = 0
    for key_group, key, namespace, state in restored.entries(name):
        table.put(key, namespace, state, key_group=key_group)
        count += 1
    return count


def _decode(reader: SnapshotReader, key_group_range: KeyGroupRange,
            max_parallelism: int | None, metas: Mapping[str, StateMetaInfo],
            key_serializer: StateSerializer | None, wanted: Collection[str] | None,
            into: RestoredSnapshot | None) -> RestoredSnapshot:
    meta = reader.metadata
    if max_parallelism is not None and meta.max_parallelism != max_parallelism:
        raise MaxParallelismMismatchError(
            f"expected a snapshot of max parallelism {max_parallelism}, got one of "
            f"{meta.max_parallelism}: the number of key groups cannot change on restore")
    result = RestoredSnapshot(key_group_range, meta.max_parallelism) if into is None else into
    if result.max_parallelism != meta.max_parallelism:
        raise MaxParallelismMismatchError(
            f"expected every file to have max parallelism {result.max_parallelism}, got "
            f"{meta.max_parallelism}")
    key_ser = _resolve(key_serializer, meta.key_serializer, "the key serializer")
    if result.key_serializer and result.key_serializer != meta.key_serializer:
        raise SerializerMismatchError(
            f"expected every file to use key serializer {result.key_serializer!r}, got "
            f"{meta.key_serializer!r}")
    overlap = result.key_groups & set(key_group_range.intersection(meta.range))
    if overlap:
        raise KeyGroupMismatchError(
            f"expected every key group in one snapshot file only, got key groups "
            f"{sorted(overlap)[:5]} in two files")
    decoders = {}
    state_metas = {}
    for state in meta.states:
        if wanted is not None and state.name not in wanted:
            continue
        given = metas.get(state.name)
        known = result.metas.get(state.name) or given
        if known is not None and known.kind != state.kind:
            raise SerializerMismatchError(
                f"expected state {state.name!r} of kind {known.kind!r}, the file holds kind "
                f"{state.kind!r}")
        namespace_ser = _resolve(given.namespace_serializer if given else None,
                                 state.namespace_serializer,
                                 f"the namespace serializer of {state.name!r}")
        state_ser = _resolve(given.state_serializer if given else None,
                             state.state_serializer, f"the state serializer of {state.name!r}")
        decoders[state.id] = (state.name, namespace_ser.deserialize, state_ser.deserialize)
        state_metas[state.name] = given or StateMetaInfo(
            state.name, state.kind, namespace_ser, state_ser)
    decoded: dict[str, dict[int, list[tuple[Any, Any, Any]]]] = {}
    key_decode = key_ser.deserialize
    read = key_group_range.intersection(meta.range)
    for key_group in read:
        for state_id, rows in reader.read_key_group(key_group).items():
            if state_id not in decoders:
                continue
            name, namespace_decode, state_decode = decoders[state_id]
            try:
                decoded.setdefault(name, {})[key_group] = [
                    (key_decode(key), namespace_decode(namespace), state_decode(state))
                    for namespace, key, state in rows]
            except Exception as exc:
                raise SnapshotFormatError(
                    f"expected entries of state {name!r} in key group {key_group} that its "
                    f"serializers can decode, got {type(exc).__name__}: {exc}") from exc
    # Everything decoded: now (and only now) merge into the result.
    result.formats.add(meta.format)
    result.key_serializer = meta.key_serializer
    result.key_groups.update(read)
    result.all_states.update(state.name for state in meta.states)
    for name, state_meta in state_metas.items():
        result.metas.setdefault(name, state_meta)
        result.states.setdefault(name, {})
    for name, groups in decoded.items():
        target = result.states[name]
        for key_group, entries in groups.items():
            target.setdefault(key_group, []).extend(entries)
    return result


# ---------------------------------------------------------- private helpers


def _metadata_of(tables: Sequence[StateTableSnapshot[Any, Any, Any]],
                 format: SnapshotFormat) -> SnapshotMetadata:
    if not tables:
        raise InvalidArgumentError("expected at least one table snapshot to write, got none")
    if len(tables) > MAX_STATES:
        raise InvalidArgumentError(
            f"expected at most {MAX_STATES} states in one snapshot, got {len(tables)}")
    first = tables[0]
    for snap in tables[1:]:
        if serializer_identifier(snap.key_serializer) != serializer_identifier(
                first.key_serializer):
            raise InvalidArgumentError(
                f"expected every table snapshot to use the key serializer "
                f"{serializer_identifier(first.key_serializer)!r}, got "
                f"{serializer_identifier(snap.key_serializer)!r} for {snap.meta.name!r}")
        if (snap.key_group_range != first.key_group_range
                or snap.max_parallelism != first.max_parallelism):
            raise InvalidArgumentError(
                f"expected every table snapshot to cover {first.key_group_range!r} of "
                f"{first.max_parallelism}, got {snap.key_group_range!r} of "
                f"{snap.max_parallelism} for {snap.meta.name!r}")
    names = [snap.meta.name for snap in tables]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"expected distinct state names, got {names}")
    return SnapshotMetadata(
        format=format, max_parallelism=first.max_parallelism,
        key_group_range=(first.key_group_range.start_key_group,
                         first.key_group_range.end_key_group),
        key_serializer=serializer_identifier(first.key_serializer),
        states=tuple(snap.meta.metadata(state_id) for state_id, snap in enumerate(tables)))


def _resolve(given: StateSerializer | None, identifier: str, role: str) -> StateSerializer:
    """The serializer to decode with: ``given`` if its identifier matches."""
    if given is None:
        return serializer_for(identifier)
    if serializer_identifier(given) != identifier:
        raise SerializerMismatchError(
            f"expected {role} to be {serializer_identifier(given)!r}, the file was written "
            f"with {identifier!r}")
    return given


def _seekable(stream: IO[bytes]) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, ValueError, OSError):
        return False
