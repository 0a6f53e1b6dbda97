"""Reading snapshot files: :class:`SnapshotReader` checks the header, metadata
and index at once and reads (CRC-checked) key-group blocks on demand: as raw
bytes (:meth:`SnapshotReader.read_key_group`), or parsed and decoded in one
pass by the deserializers it is given (:meth:`SnapshotReader.decode_key_group`,
the heap restore's hot loop; which serializers to trust is decided in
:mod:`cowstate.snapshot.restore`).

The decoding loop runs in C when the C codec is built
(:mod:`cowstate.snapshot.ccodec`): built-in deserializers in C, the others
called from it; it hands an entry it cannot finish (a field past the end, bytes
its C decoder does not take, a ``None``) back to the Python loop, which goes on
from that entry and raises the errors below itself.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Mapping
from typing import IO, Any

from pydantic import ValidationError

from cowstate.errors import (
    BadMagicError,
    ChecksumMismatchError,
    InvalidArgumentError,
    KeyGroupMismatchError,
    SnapshotFormatError,
    TruncatedSnapshotError,
    UnsupportedVersionError,
)
from cowstate.snapshot import ccodec
from cowstate.snapshot.checks import DecodedBlock, EntryDecoder, none_error, undecodable_error
from cowstate.snapshot.format import (
    _BLOCK,
    _FOOTER,
    _HEADER,
    _INDEX_ENTRY,
    _STATE,
    _U32,
    END_MAGIC,
    FORMAT_VERSION,
    MAGIC,
    RawEntry,
    SnapshotMetadata,
)

__all__ = ["SnapshotReader"]


class SnapshotReader:
    """Reads a snapshot file: header, metadata and index at once, blocks on demand.

    A seekable stream is read in place; any other is read into memory first.
    """

    def __init__(self, stream: IO[bytes] | bytes) -> None:
        #: The file's bytes when it was given as bytes (or read whole from a
        #: stream that cannot seek): reads are slices of them then, with no seek
        #: and read per field (a delta's many small blocks). A stream given is
        #: read where it stands, on demand.
        self._data: bytes | None = None
        if isinstance(stream, bytes | bytearray | memoryview):
            self._data = bytes(stream)
            stream = io.BytesIO(self._data)
        elif not callable(getattr(stream, "read", None)):
            raise InvalidArgumentError(
                f"expected the bytes of a snapshot file or a binary stream, got "
                f"{type(stream).__name__} {stream!r:.60}"
            )
        elif not _seekable(stream):
            self._data = bytes(stream.read())
            stream = io.BytesIO(self._data)
        self._stream = stream
        self._base = stream.tell()
        stream.seek(0, io.SEEK_END)
        self._size = stream.tell() - self._base
        self.metadata = self._read_metadata()
        self.offsets = self._read_index()
        self._state_ids = frozenset(s.id for s in self.metadata.states)

    @property
    def size(self) -> int:
        return self._size

    def rewind(self) -> None:
        """Put the stream back where the file starts."""
        self._stream.seek(self._base)

    def read_key_group(self, key_group: int) -> dict[int, list[RawEntry]]:
        """The raw entries of ``key_group`` per state id (empty if not in the file)."""
        block = self._read_block(key_group)
        if block is None:
            return {}
        return self._parse_payload(key_group, *block, None)

    def decode_key_group(
        self, key_group: int, decoders: Mapping[int, EntryDecoder]
    ) -> dict[int, DecodedBlock]:
        """The decoded entries of ``key_group`` per state id, for the state ids of
        ``decoders`` (the others are skipped).

        One pass parses and decodes (the hot loop of a heap restore) and checks
        E1 and, per distinct namespace, E2 of :mod:`cowstate.snapshot.checks`;
        a deserializer's error becomes a :class:`SnapshotFormatError`.
        """
        block = self._read_block(key_group)
        if block is None:
            return {}
        return self._parse_payload(key_group, *block, decoders)

        # ------------------------------------------------------ private helpers

    def _read_at(self, offset: int, length: int, what: str) -> bytes:
        if offset < 0 or offset + length > self._size:
            raise TruncatedSnapshotError(
                f"expected {length} bytes of {what} at offset {offset}, but the file has "
                f"{self._size} bytes"
            )
        if self._data is not None:  # in memory (its bounds checked above)
            return self._data[offset : offset + length]
        self._stream.seek(self._base + offset)
        data = self._stream.read(length)
        while len(data) < length:  # a raw stream may return fewer bytes than it holds
            more = self._stream.read(length - len(data))
            if not more:  # the end of the stream: the file was cut since its size was taken
                break
            data += more
        if len(data) != length:
            raise TruncatedSnapshotError(
                f"expected {length} bytes of {what} at offset {offset}, got {len(data)}"
            )
        return data

    def _read_block(self, key_group: int) -> tuple[bytes, int] | None:
        """The CRC-checked payload and entry count of ``key_group``'s block."""
        offset = self.offsets.get(key_group)
        if offset is None:
            return None
        head = self._read_at(offset, _BLOCK.size, f"the block header of key group {key_group}")
        written_group, count, length = _BLOCK.unpack(head)
        if written_group != key_group:
            raise KeyGroupMismatchError(
                f"expected the block at offset {offset} to hold key group {key_group} as the "
                f"index says, got key group {written_group}"
            )
        payload = self._read_at(
            offset + _BLOCK.size, length, f"the payload of key group {key_group}"
        )
        (crc,) = _U32.unpack(
            self._read_at(offset + _BLOCK.size + length, 4, f"the CRC32 of key group {key_group}")
        )
        actual = zlib.crc32(payload, zlib.crc32(head))
        if crc != actual:
            raise ChecksumMismatchError(
                f"expected CRC32 {crc:#010x} for key group {key_group} at offset {offset}, "
                f"got {actual:#010x}: the block is corrupt"
            )
        return payload, count

    def _read_metadata(self) -> SnapshotMetadata:
        if self._size < _HEADER.size:
            raise TruncatedSnapshotError(
                f"expected a snapshot file of at least its {_HEADER.size}-byte header, got "
                f"{self._size} bytes"
            )
        magic, version, _flags, length = _HEADER.unpack(
            self._read_at(0, _HEADER.size, "the header")
        )
        if magic != MAGIC:
            raise BadMagicError(
                f"expected the magic bytes {MAGIC!r}, got {magic!r}: not a cowstate snapshot file"
            )
        if version != FORMAT_VERSION:
            raise UnsupportedVersionError(
                f"expected snapshot format version {FORMAT_VERSION}, got {version}"
            )
        raw = self._read_at(_HEADER.size, length, "the metadata")
        (crc,) = _U32.unpack(self._read_at(_HEADER.size + length, 4, "the metadata CRC32"))
        actual = zlib.crc32(raw, zlib.crc32(_HEADER.pack(magic, version, _flags, length)))
        if crc != actual:
            raise ChecksumMismatchError(
                f"expected metadata CRC32 {crc:#010x}, got {actual:#010x}: the header or "
                "metadata is corrupt"
            )
        try:
            metadata = SnapshotMetadata.model_validate_json(raw)
        except ValidationError as exc:
            raise SnapshotFormatError(f"expected valid snapshot metadata, got: {exc}") from None
        start, end = metadata.key_group_range
        if not (start >= 0 and end < metadata.max_parallelism and start <= end + 1):
            raise KeyGroupMismatchError(
                f"expected a key-group range inside [0, {metadata.max_parallelism - 1}], got "
                f"[{start}, {end}]"
            )
        ids = [s.id for s in metadata.states]
        if len(set(ids)) != len(ids) or len({s.name for s in metadata.states}) != len(ids):
            raise SnapshotFormatError(f"expected distinct state ids and names, got {ids}")
        self._data_start = _HEADER.size + length + 4
        return metadata

    def _read_index(self) -> dict[int, int]:
        if self._size < self._data_start + 8 + _FOOTER.size:
            raise TruncatedSnapshotError(
                f"expected an index and a footer after the metadata, but the file ends at "
                f"{self._size} bytes"
            )
        index_at, end_magic = _FOOTER.unpack(
            self._read_at(self._size - _FOOTER.size, _FOOTER.size, "the footer")
        )
        if end_magic != END_MAGIC:
            raise TruncatedSnapshotError(
                f"expected the end magic {END_MAGIC!r} in the last 8 bytes, got {end_magic!r}: "
                "the file is truncated or was not closed"
            )
        end = self._size - _FOOTER.size
        (count,) = _U32.unpack(self._read_at(index_at, 4, "the index"))
        length = 4 + count * _INDEX_ENTRY.size
        if index_at < self._data_start or index_at + length + 4 != end:
            raise TruncatedSnapshotError(
                f"expected an index of {count} key groups between offset {index_at} and the "
                f"footer at {end}: the file is truncated or corrupt"
            )
        raw = self._read_at(index_at, length, "the index")
        (crc,) = _U32.unpack(self._read_at(index_at + length, 4, "the index CRC32"))
        if crc != zlib.crc32(raw):
            raise ChecksumMismatchError(
                f"expected index CRC32 {crc:#010x}, got {zlib.crc32(raw):#010x}: the index "
                "is corrupt"
            )
        offsets: dict[int, int] = {}
        file_range = self.metadata.range
        expected_groups = iter(file_range)
        for position in range(4, length, _INDEX_ENTRY.size):
            key_group, offset = _INDEX_ENTRY.unpack_from(raw, position)
            if key_group not in file_range:
                raise KeyGroupMismatchError(
                    f"expected key groups of the file's range {file_range!r}, the index holds "
                    f"key group {key_group}"
                )
            expected = next(expected_groups, None)
            if key_group != expected:
                raise KeyGroupMismatchError(
                    f"expected the index to list every key group of {file_range!r} once, in "
                    f"order: key group {expected} at entry {(position - 4) // _INDEX_ENTRY.size}"
                    f", got key group {key_group}"
                )
            if not self._data_start <= offset < index_at:
                raise TruncatedSnapshotError(
                    f"expected key group {key_group}'s block between offsets "
                    f"{self._data_start} and {index_at}, the index says {offset}"
                )
            offsets[key_group] = offset
        if len(offsets) != len(file_range):
            raise KeyGroupMismatchError(
                f"expected an index of the {len(file_range)} key groups of {file_range!r}, "
                f"got {len(offsets)}"
            )
        return offsets

    def _parse_payload(
        self,
        key_group: int,
        payload: bytes,
        count: int,
        decoders: Mapping[int, EntryDecoder] | None,
    ) -> dict[int, Any]:
        """The sections of a block: raw rows (``decoders`` None) or the decoded
        blocks of the states ``decoders`` names; the framing is checked either way."""
        out: dict[int, Any] = {}
        seen: set[int] = set()
        position = 0
        total = 0
        end = len(payload)
        known = self._state_ids
        try:
            while position < end:
                state_id, entries = _STATE.unpack_from(payload, position)
                position += _STATE.size
                if state_id not in known or state_id in seen:
                    raise SnapshotFormatError(
                        f"expected one section per state id of {sorted(known)} in key group "
                        f"{key_group}, got state id {state_id}"
                        + (" twice" if state_id in seen else "")
                    )
                seen.add(state_id)
                if decoders is None or state_id not in decoders:
                    rows: list[RawEntry] = []
                    position = _raw_section(payload, position, entries, end, rows)
                    if decoders is None:
                        out[state_id] = rows
                else:
                    block = DecodedBlock()
                    position = _decoded_section(
                        decoders[state_id], key_group, payload, position, entries, end, block
                    )
                    out[state_id] = block
                total += entries
        except struct.error:
            raise TruncatedSnapshotError(
                f"expected {count} entries in key group {key_group}, its block ends early"
            ) from None
        if total != count:
            raise SnapshotFormatError(
                f"expected {count} entries in key group {key_group} as its header says, got {total}"
            )
        return out


def _raw_section(
    payload: bytes, position: int, entries: int, end: int, rows: list[RawEntry]
) -> int:
    """Append the ``(namespace, key, state)`` bytes of one section's ``entries`` to
    ``rows``; the position after them (``struct.error`` past the block's end)."""
    unpack = _U32.unpack_from
    append = rows.append
    for _ in range(entries):  # (namespace, key, state), unrolled: the hot loop
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
        if position > end:  # a slice past the end is silently short
            raise struct.error("field past the end of the block")
    return position


def _decoded_section(
    decoder: EntryDecoder,
    key_group: int,
    payload: bytes,
    position: int,
    entries: int,
    end: int,
    block: DecodedBlock,
) -> int:
    """:func:`_raw_section`, decoding each entry as it goes into ``block`` (E1;
    namespaces through the decoder's cache, E1 and E2 once each).

    Runs of entries of one namespace (every entry of ``VOID_NAMESPACE``, a
    window's entries) skip the namespace's parse: when the bytes at the
    position are the previous entry's namespace frame (length and bytes), it
    is the same namespace object.

    With the C codec, its ``decode_section`` decodes the entries first and
    returns where it stopped; this loop does the rest (usually nothing).
    """
    codec = ccodec.CODEC
    if codec is not None and type(payload) is bytes:
        key_kind, state_kind = decoder.codec_kinds()
        position, done = codec.decode_section(
            payload,
            position,
            entries,
            key_kind,
            state_kind,
            decoder,
            key_group,
            block,
        )
        if done == entries:  # the usual case: nothing left for the loop below
            return int(position)
        entries -= done
    unpack = _U32.unpack_from
    # list.append called as a method of a local list: the interpreter's fast path
    keys, namespace_column, states = block.keys, block.namespaces, block.states
    key_decode, state_decode = decoder.key, decoder.state
    namespaces = decoder.namespaces
    frame: bytes | None = None  # the previous namespace's length and bytes
    frame_length = 0
    namespace: Any = None
    for _ in range(entries):  # the hot loop of a heap restore
        if frame is not None and payload.startswith(frame, position):
            position += frame_length
            namespace_bytes = None
        else:
            (length,) = unpack(payload, position)
            start = position + 4
            position = start + length
            namespace_bytes = payload[start:position]
        (length,) = unpack(payload, position)
        start = position + 4
        position = start + length
        key_bytes = payload[start:position]
        (length,) = unpack(payload, position)
        start = position + 4
        position = start + length
        if position > end:  # a slice past the end is silently short
            raise struct.error("field past the end of the block")
        try:
            key = key_decode(key_bytes)
            state = state_decode(payload[start:position])
        except Exception as exc:
            raise undecodable_error(decoder.name, key_group, exc) from exc
        if namespace_bytes is not None:
            namespace = namespaces.get(namespace_bytes)
            if namespace is None:
                namespace = decoder.decode_namespace(key_group, namespace_bytes)
            frame = _U32.pack(len(namespace_bytes)) + namespace_bytes
            frame_length = len(frame)
        if key is None or state is None:
            raise none_error(decoder.name, key_group, "key" if key is None else "state")
        keys.append(key)
        namespace_column.append(namespace)
        states.append(state)
    return position


def _seekable(stream: IO[bytes]) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, ValueError, OSError):
        return False
