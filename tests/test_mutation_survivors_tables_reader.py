"""Tests that kill mutants of ``cowstate.snapshot.reader`` (the ``tables``
mutation scope, ``make mutate SCOPE=tables``) the scope's other killer tests
let through or never reach.

Each test is named after what it pins; the mutants it was written for are
named in its comment as ``<function> <n>``, short for
``cowstate.snapshot.reader.xǁSnapshotReaderǁ<function>__mutmut_<n>`` (the
methods) or ``cowstate.snapshot.reader.x_<function>__mutmut_<n>`` (the module's
functions). The files are built
here byte by byte from the layout documented in
:mod:`cowstate.snapshot.format` (so every CRC of a crafted block can be valid
while its contents are not), then cut or corrupted; the messages are compared
word for word.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cowstate.errors import (
    BadMagicError,
    ChecksumMismatchError,
    InvalidArgumentError,
    KeyGroupMismatchError,
    SnapshotEntryError,
    SnapshotFormatError,
    TruncatedSnapshotError,
    UnsupportedVersionError,
)
from cowstate.snapshot import (
    END_MAGIC,
    FORMAT_VERSION,
    MAGIC,
    SnapshotMetadata,
    SnapshotReader,
    SnapshotWriter,
    StateMetadata,
)
from cowstate.snapshot.checks import DecodedBlock, EntryDecoder

#: Until these tests move beside the tests of what they pin.
pytestmark = [
    pytest.mark.kills(module="cowstate.snapshot.reader"),
]

# ===================================================================== helpers

Row = tuple[bytes, bytes, bytes]  # (namespace, key, state) bytes
#: A block as its header counts it: (entry count, payload).
Block = tuple[int, bytes]

COUNTS = StateMetadata(
    id=0, name="counts", kind="value", namespace_serializer="window", state_serializer="int"
)
NAMES = StateMetadata(
    id=1, name="names", kind="value", namespace_serializer="window", state_serializer="text"
)


def _metadata(
    key_group_range: tuple[int, int] = (0, 3),
    max_parallelism: int = 4,
    states: tuple[StateMetadata, ...] = (COUNTS, NAMES),
) -> SnapshotMetadata:
    return SnapshotMetadata(
        max_parallelism=max_parallelism,
        key_group_range=key_group_range,
        key_serializer="text",
        states=states,
    )


def _u32(value: int) -> bytes:
    return struct.pack(">I", value)


def _section(state_id: int, rows: Sequence[Row], count: int | None = None) -> bytes:
    """One state's section of a payload: id, entry count, the framed entries."""
    out = struct.pack(">HI", state_id, len(rows) if count is None else count)
    for namespace, key, state in rows:
        out += _u32(len(namespace)) + namespace + _u32(len(key)) + key + _u32(len(state)) + state
    return out


def _block(*sections: tuple[int, Sequence[Row]]) -> Block:
    """A well-formed block of ``(state id, rows)`` sections."""
    return (
        sum(len(rows) for _, rows in sections),
        b"".join(_section(i, rows) for i, rows in sections),
    )


def _index(entries: Sequence[tuple[int, int]]) -> bytes:
    raw = _u32(len(entries)) + b"".join(struct.pack(">iQ", kg, at) for kg, at in entries)
    return raw + _u32(zlib.crc32(raw))


def _footer(index_at: int, magic: bytes = END_MAGIC) -> bytes:
    return struct.pack(">Q8s", index_at, magic)


def _encode(
    metadata: SnapshotMetadata,
    blocks: Mapping[int, Block] | None = None,
    *,
    raw_metadata: bytes | None = None,
) -> bytes:
    """A snapshot file of ``metadata`` with ``blocks[kg]`` in the block of key
    group ``kg`` (an empty block for the others), every CRC valid."""
    blocks = blocks or {}
    meta = metadata.model_dump_json().encode() if raw_metadata is None else raw_metadata
    head = struct.pack(">8sHHI", MAGIC, FORMAT_VERSION, 0, len(meta)) + meta
    out = head + _u32(zlib.crc32(head))
    start, end = metadata.key_group_range
    entries = []
    for kg in range(start, end + 1):
        count, payload = blocks.get(kg, (0, b""))
        entries.append((kg, len(out)))
        block_head = struct.pack(">iII", kg, count, len(payload))
        out += block_head + payload + _u32(zlib.crc32(payload, zlib.crc32(block_head)))
    return out + _index(entries) + _footer(len(out))


def _data_start(data: bytes) -> int:
    (length,) = struct.unpack_from(">I", data, 12)
    return 16 + int(length) + 4


def _index_at(data: bytes) -> int:
    (index_at,) = struct.unpack_from(">Q", data, len(data) - 16)
    return int(index_at)


def _offsets(data: bytes) -> list[tuple[int, int]]:
    """The (key group, offset) entries of a file's index, as written."""
    at = _index_at(data)
    (count,) = struct.unpack_from(">I", data, at)
    return [
        (int(kg), int(offset))
        for kg, offset in (struct.unpack_from(">iQ", data, at + 4 + 12 * i) for i in range(count))
    ]


def _with_index(data: bytes, entries: Sequence[tuple[int, int]]) -> bytes:
    """``data`` with another index (valid CRC) in the place of its own."""
    at = _index_at(data)
    return data[:at] + _index(entries) + _footer(at)


def _patch(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new) :]


def _key(data: bytes) -> Any:
    return None if data == b"null" else data.decode("ascii")


def _state(data: bytes) -> Any:
    return None if data == b"null" else int(data)


def _window(data: bytes) -> tuple[str, str]:
    """A namespace: a new tuple on every call (so a test can tell a cached
    namespace from one decoded again by identity)."""
    if data == b"bad":
        raise ValueError("no such window")
    return ("window", data.decode("ascii"))


def _text(data: bytes) -> str:
    return data.decode("ascii")


def _decoder(
    name: str = "counts",
    namespaces: dict[bytes, Any] | None = None,
    state: Callable[[bytes], Any] = _state,
) -> EntryDecoder:
    return EntryDecoder(
        name,
        key=_key,
        namespace=_window,
        state=state,
        namespaces={} if namespaces is None else namespaces,
    )


#: Group 1 holds two entries of ``counts`` and one of ``names``; group 2 one of ``counts``.
ROWS_1_COUNTS: list[Row] = [(b"w1", b"alice", b"3"), (b"w1", b"bob", b"4")]
ROWS_1_NAMES: list[Row] = [(b"w2", b"carol", b"x")]
ROWS_2_COUNTS: list[Row] = [(b"w1", b"dave", b"5")]
BLOCKS: dict[int, Block] = {
    1: _block((0, ROWS_1_COUNTS), (1, ROWS_1_NAMES)),
    2: _block((0, ROWS_2_COUNTS)),
}


@pytest.fixture
def data() -> bytes:
    return _encode(_metadata(), BLOCKS)


def _read(data: bytes, key_group: int = 1) -> dict[int, list[Row]]:
    return SnapshotReader(data).read_key_group(key_group)


def _decode(data: bytes, key_group: int = 1) -> dict[int, DecodedBlock]:
    return SnapshotReader(data).decode_key_group(key_group, {0: _decoder()})


# ============================================================= valid files


def test_the_test_encoder_writes_what_the_writer_writes() -> None:
    # A sanity pin for the files below: _encode is the documented layout, and
    # SnapshotWriter writes the same bytes (so the reader tests read real files).
    stream = io.BytesIO()
    writer = SnapshotWriter(stream, _metadata())
    writer.write_key_group(1, {0: ROWS_1_COUNTS, 1: ROWS_1_NAMES})
    writer.write_key_group(2, {0: ROWS_2_COUNTS})
    writer.finish()
    assert stream.getvalue() == _encode(_metadata(), BLOCKS)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_bytes_bytearray_and_memoryview_read_alike(data: bytes, kind: type[Any]) -> None:
    # __init__ 1-3 (the bytes branch), 19-26, 28, 29; _read_at 2-5, 8-11;
    # _read_block, _read_metadata, _read_index: the arithmetic of a valid file.
    reader = SnapshotReader(kind(data))
    assert reader.size == len(data)
    assert reader.metadata == _metadata()
    assert reader.offsets == dict(_offsets(data))
    assert list(reader.offsets) == [0, 1, 2, 3]
    assert reader.read_key_group(0) == {}
    assert reader.read_key_group(1) == {0: ROWS_1_COUNTS, 1: ROWS_1_NAMES}
    assert reader.read_key_group(2) == {0: ROWS_2_COUNTS}
    assert reader.read_key_group(3) == {}
    assert reader.read_key_group(4) == {}  # not in the file


def test_a_file_inside_a_larger_stream_is_read_from_where_the_stream_stood(
    tmp_path: Path, data: bytes
) -> None:
    # __init__ 15, 16, 20, 27 (size = end - base, not end + base),
    # rewind 1, _seekable 1: a seekable stream is read in place, from where it stood.
    prefix = b"some other file's bytes"
    path = tmp_path / "embedded.snap"
    path.write_bytes(prefix + data)
    with path.open("rb") as stream:
        stream.seek(len(prefix))
        reader = SnapshotReader(stream)
        assert reader.size == len(data)
        assert reader.read_key_group(1) == {0: ROWS_1_COUNTS, 1: ROWS_1_NAMES}
        reader.rewind()
        assert stream.tell() == len(prefix)


def test_a_stream_that_cannot_seek_is_read_into_memory(data: bytes) -> None:
    # __init__ 15, 17, 18: a pipe cannot tell() or seek(); its bytes are read once.
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "wb") as writer:
        writer.write(data)
    with os.fdopen(read_end, "rb") as stream:
        assert not stream.seekable()
        reader = SnapshotReader(stream)
        assert stream.read() == b""
    assert reader.size == len(data)
    assert reader.read_key_group(2) == {0: ROWS_2_COUNTS}


class _ReadOnly:
    """The least a binary stream can be: a ``read`` method, nothing else."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, size: int = -1) -> bytes:
        size = len(self._data) if size < 0 else size
        out, self._data = self._data[:size], self._data[size:]
        return out


def test_a_stream_with_only_a_read_method_is_read_into_memory(data: bytes) -> None:
    # _seekable 2 (a stream without seekable() is not seekable).
    reader = SnapshotReader(_ReadOnly(data))  # type: ignore[arg-type]
    assert reader.read_key_group(1) == {0: ROWS_1_COUNTS, 1: ROWS_1_NAMES}


@pytest.mark.parametrize(
    ("stream", "shown"),
    [(42, "int 42"), ("a" * 100, "str '" + "a" * 59)],
    ids=["int", "long-str"],
)
def test_a_non_stream_is_refused_naming_its_type_and_repr(stream: Any, shown: str) -> None:
    # __init__ 4-14: the read() test (no read attribute at all) and its message.
    with pytest.raises(InvalidArgumentError) as caught:
        SnapshotReader(stream)
    assert str(caught.value) == (
        f"expected the bytes of a snapshot file or a binary stream, got {shown}"
    )


# ============================================================= header, metadata


def test_a_file_shorter_than_its_header_names_its_size(data: bytes) -> None:
    # _read_metadata 2.
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(data[:5])
    assert (
        str(caught.value) == "expected a snapshot file of at least its 16-byte header, got 5 bytes"
    )


def test_a_file_of_only_its_header_is_short_of_its_metadata(data: bytes) -> None:
    # _read_metadata 1 (a 16-byte file has its header), 21, 25, 26 (what the read names).
    length = _data_start(data) - 20
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(data[:16])
    assert str(caught.value) == (
        f"expected {length} bytes of the metadata at offset 16, but the file has 16 bytes"
    )


def test_a_metadata_length_past_the_end_names_the_metadata(data: bytes) -> None:
    # _read_at 1, 4, 6 (the size check comes first), _read_metadata 21, 25, 26.
    corrupt = _patch(data, 12, _u32(0xFFFFFFFF))
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected 4294967295 bytes of the metadata at offset 16, but the file has "
        f"{len(data)} bytes"
    )


def test_a_metadata_that_fills_the_file_leaves_no_room_for_its_crc(data: bytes) -> None:
    # _read_metadata 31, 37, 38, 39: the CRC32 read names "the metadata CRC32".
    corrupt = _patch(data, 12, _u32(len(data) - 16))
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected 4 bytes of the metadata CRC32 at offset {len(data)}, but the file has "
        f"{len(data)} bytes"
    )


def test_a_wrong_magic_is_named(data: bytes) -> None:
    # _read_metadata 14, 15.
    with pytest.raises(BadMagicError) as caught:
        SnapshotReader(b"NOTASNAP" + data[8:])
    assert str(caught.value) == (
        "expected the magic bytes b'\\x89CWSNAP\\n', got b'NOTASNAP': not a cowstate snapshot file"
    )


def test_an_unknown_version_is_named(data: bytes) -> None:
    # _read_metadata 16, 17.
    with pytest.raises(UnsupportedVersionError) as caught:
        SnapshotReader(_patch(data, 8, struct.pack(">H", 7)))
    assert str(caught.value) == "expected snapshot format version 1, got 7"


@pytest.mark.parametrize("at", [10, 20], ids=["flags", "metadata"])
def test_a_corrupt_header_or_metadata_fails_the_metadata_crc(data: bytes, at: int) -> None:
    # _read_metadata 54-57 (and 44-48: the header, flags included, is in the CRC).
    corrupt = _patch(data, at, bytes([data[at] ^ 0x01]))
    end = _data_start(data) - 4
    (stored,) = struct.unpack_from(">I", data, end)
    actual = zlib.crc32(corrupt[:end])
    with pytest.raises(ChecksumMismatchError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected metadata CRC32 {stored:#010x}, got {actual:#010x}: the header or metadata "
        "is corrupt"
    )


def test_metadata_that_is_not_a_snapshot_metadata_names_the_validation_error() -> None:
    # _read_metadata 58, 59, 60.
    raw = b'{"max_parallelism": 0}'
    with pytest.raises(ValidationError) as invalid:
        SnapshotMetadata.model_validate_json(raw)
    with pytest.raises(SnapshotFormatError) as caught:
        SnapshotReader(_encode(_metadata(), raw_metadata=raw))
    assert type(caught.value) is SnapshotFormatError
    assert str(caught.value) == f"expected valid snapshot metadata, got: {invalid.value}"


@pytest.mark.parametrize(
    ("key_group_range", "max_parallelism"),
    [((0, 4), 4), ((-1, 2), 4), ((3, 1), 4), ((0, 8), 8)],
    ids=["end-past-max", "negative-start", "start-past-end+1", "end-at-max"],
)
def test_a_key_group_range_outside_the_max_parallelism_is_refused(
    key_group_range: tuple[int, int], max_parallelism: int
) -> None:
    # _read_metadata 62-64, 67 (end == max parallelism), 70 (start == end + 2),
    # 71-73 (the message's bound is max parallelism - 1).
    metadata = _metadata(key_group_range, max_parallelism)
    with pytest.raises(KeyGroupMismatchError) as caught:
        SnapshotReader(_encode(metadata))
    start, end = key_group_range
    assert str(caught.value) == (
        f"expected a key-group range inside [0, {max_parallelism - 1}], got [{start}, {end}]"
    )


def test_an_empty_key_group_range_is_a_file_without_blocks() -> None:
    # _read_metadata 68 (start == end + 1 is allowed); _read_index 1, 4 (the
    # smallest file: an empty index and the footer), 39 (an index at the data start).
    data = _encode(_metadata((3, 2)))
    reader = SnapshotReader(data)
    assert len(data) == _data_start(data) + 8 + 16
    assert _index_at(data) == _data_start(data)
    assert reader.offsets == {}
    assert reader.read_key_group(3) == {}


def test_a_single_key_group_range_is_read() -> None:
    # _read_metadata 69 (start == end is allowed).
    data = _encode(_metadata((2, 2)), {2: BLOCKS[2]})
    reader = SnapshotReader(data)
    assert reader.offsets == {2: _data_start(data)}
    assert reader.read_key_group(2) == {0: ROWS_2_COUNTS}


@pytest.mark.parametrize(
    ("states", "ids"),
    [
        ((COUNTS, NAMES.model_copy(update={"id": 0})), [0, 0]),
        ((COUNTS, NAMES.model_copy(update={"name": "counts"})), [0, 1]),
    ],
    ids=["same-id", "same-name"],
)
def test_two_states_with_one_id_or_name_are_refused(
    states: tuple[StateMetadata, ...], ids: list[int]
) -> None:
    # _read_metadata 75, 78.
    with pytest.raises(SnapshotFormatError) as caught:
        SnapshotReader(_encode(_metadata(states=states)))
    assert str(caught.value) == f"expected distinct state ids and names, got {ids}"


# ===================================================================== index


def test_a_file_that_ends_inside_its_index_names_its_size(data: bytes) -> None:
    # _read_index 2, 3, 5.
    size = _data_start(data) + 10
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(data[:size])
    assert str(caught.value) == (
        f"expected an index and a footer after the metadata, but the file ends at {size} bytes"
    )


def test_a_wrong_end_magic_says_the_file_was_not_closed(data: bytes) -> None:
    # _read_index 17-20.
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(data[:-8] + b"NOTMAGIC")
    assert str(caught.value) == (
        "expected the end magic b'CWSNAPIX' in the last 8 bytes, got b'NOTMAGIC': the file "
        "is truncated or was not closed"
    )


def test_an_index_offset_past_the_end_names_the_index(data: bytes) -> None:
    # _read_index 27, 32, 33.
    corrupt = data[:-16] + _footer(len(data) + 100)
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected 4 bytes of the index at offset {len(data) + 100}, but the file has "
        f"{len(data)} bytes"
    )


def test_an_index_offset_on_a_block_names_the_count_it_read_there(data: bytes) -> None:
    # _read_index 44: the first block's key group (0) read as the index's count.
    start = _data_start(data)
    corrupt = data[:-16] + _footer(start)
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected an index of 0 key groups between offset {start} and the footer at "
        f"{len(data) - 16}: the file is truncated or corrupt"
    )


def test_an_index_offset_inside_the_header_is_refused_even_when_its_length_fits(
    data: bytes,
) -> None:
    # _read_index 38: at offset 12 the "count" is the metadata length M; a file
    # of 36 + 12 M bytes makes that index end exactly at the footer.
    (length,) = struct.unpack_from(">I", data, 12)
    end = 20 + 12 * length
    corrupt = data[: _data_start(data)].ljust(end, b"\0") + _footer(12)
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected an index of {length} key groups between offset 12 and the footer at "
        f"{end}: the file is truncated or corrupt"
    )


def test_a_corrupt_index_fails_its_crc(data: bytes) -> None:
    # _read_index 67-72.
    at = _index_at(data)
    byte = at + 4 + 12 + 11  # the last byte of key group 1's offset
    corrupt = _patch(data, byte, bytes([data[byte] ^ 0x40]))
    raw = corrupt[at : at + 4 + 4 * 12]
    (stored,) = struct.unpack_from(">I", data, at + 4 + 4 * 12)
    with pytest.raises(ChecksumMismatchError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected index CRC32 {stored:#010x}, got {zlib.crc32(raw):#010x}: the index is corrupt"
    )


def test_an_index_entry_outside_the_range_is_named(data: bytes) -> None:
    # _read_index 89, 90.
    entries = _offsets(data)
    entries[2] = (9, entries[2][1])
    with pytest.raises(KeyGroupMismatchError) as caught:
        SnapshotReader(_with_index(data, entries))
    assert str(caught.value) == (
        "expected key groups of the file's range KeyGroupRange(0, 3), the index holds key group 9"
    )


def test_an_index_out_of_order_names_the_entry(data: bytes) -> None:
    # _read_index 95-97, 99 (the entry's number is (position - 4) // 12).
    entries = _offsets(data)
    entries[1], entries[2] = entries[2], entries[1]
    with pytest.raises(KeyGroupMismatchError) as caught:
        SnapshotReader(_with_index(data, entries))
    assert str(caught.value) == (
        "expected the index to list every key group of KeyGroupRange(0, 3) once, in order: "
        "key group 1 at entry 1, got key group 2"
    )


def test_an_index_with_an_entry_too_many_is_refused_as_out_of_order(data: bytes) -> None:
    # _read_index 94 (next() past the range gives None, not StopIteration).
    entries = _offsets(data)
    with pytest.raises(KeyGroupMismatchError) as caught:
        SnapshotReader(_with_index(data, [*entries, entries[-1]]))
    assert str(caught.value) == (
        "expected the index to list every key group of KeyGroupRange(0, 3) once, in order: "
        "key group None at entry 4, got key group 3"
    )


def test_an_index_without_its_last_key_group_is_refused(data: bytes) -> None:
    # _read_index 105, 106.
    with pytest.raises(KeyGroupMismatchError) as caught:
        SnapshotReader(_with_index(data, _offsets(data)[:-1]))
    assert str(caught.value) == (
        "expected an index of the 4 key groups of KeyGroupRange(0, 3), got 3"
    )


@pytest.mark.parametrize("where", ["before-data", "at-index"])
def test_a_block_offset_outside_the_blocks_is_refused(data: bytes, where: str) -> None:
    # _read_index 102, 103 (an offset equal to the index's is outside);
    # _read_metadata 80, 81 (the blocks start after the metadata CRC32).
    start, index_at = _data_start(data), _index_at(data)
    offset = start - 1 if where == "before-data" else index_at
    entries = _offsets(data)
    entries[3] = (3, offset)
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(_with_index(data, entries))
    assert str(caught.value) == (
        f"expected key group 3's block between offsets {start} and {index_at}, the index "
        f"says {offset}"
    )


# ==================================================================== blocks


def test_a_block_of_another_key_group_than_the_index_says_is_named(data: bytes) -> None:
    # _read_block 13, 14.
    entries = _offsets(data)
    (_, at_1), (_, at_2) = entries[1], entries[2]
    entries[1], entries[2] = (1, at_2), (2, at_1)
    reader = SnapshotReader(_with_index(data, entries))
    with pytest.raises(KeyGroupMismatchError) as caught:
        reader.read_key_group(1)
    assert str(caught.value) == (
        f"expected the block at offset {at_2} to hold key group 1 as the index says, got key "
        "group 2"
    )


def test_a_payload_length_past_the_end_names_the_payload(data: bytes) -> None:
    # _read_block 18; _read_at 1, 4, 6 (the size check, before any read).
    at = dict(_offsets(data))[2]
    reader = SnapshotReader(_patch(data, at + 8, _u32(0xFFFFFFFF)))
    with pytest.raises(TruncatedSnapshotError) as caught:
        reader.read_key_group(2)
    assert str(caught.value) == (
        f"expected 4294967295 bytes of the payload of key group 2 at offset {at + 12}, but "
        f"the file has {len(data)} bytes"
    )


def test_a_payload_that_fills_the_file_leaves_no_room_for_its_crc(data: bytes) -> None:
    # _read_block 27: the CRC32 read names the key group.
    at = dict(_offsets(data))[2]
    reader = SnapshotReader(_patch(data, at + 8, _u32(len(data) - at - 12)))
    with pytest.raises(TruncatedSnapshotError) as caught:
        reader.read_key_group(2)
    assert str(caught.value) == (
        f"expected 4 bytes of the CRC32 of key group 2 at offset {len(data)}, but the file "
        f"has {len(data)} bytes"
    )


@pytest.mark.parametrize("at_in_block", [4, 20], ids=["count", "payload"])
def test_a_corrupt_block_fails_its_crc(data: bytes, at_in_block: int) -> None:
    # _read_block 40, 41 (and 34-39: the CRC covers the block header and payload).
    at = dict(_offsets(data))[1]
    (_, _, length) = struct.unpack_from(">iII", data, at)
    corrupt = _patch(data, at + at_in_block, bytes([data[at + at_in_block] ^ 0x10]))
    (stored,) = struct.unpack_from(">I", data, at + 12 + length)
    actual = zlib.crc32(corrupt[at : at + 12 + length])
    reader = SnapshotReader(corrupt)
    with pytest.raises(ChecksumMismatchError) as caught:
        reader.read_key_group(1)
    assert str(caught.value) == (
        f"expected CRC32 {stored:#010x} for key group 1 at offset {at}, got {actual:#010x}: "
        "the block is corrupt"
    )


def test_a_file_cut_after_it_was_opened_names_the_short_block_read(
    tmp_path: Path, data: bytes
) -> None:
    # _read_block 7; _read_at 11, 12: the size was measured when the reader was
    # made, the block header read then comes back short.
    at = dict(_offsets(data))[2]
    path = tmp_path / "cut.snap"
    path.write_bytes(data)
    with path.open("rb", buffering=0) as stream:  # every read goes to the file
        reader = SnapshotReader(stream)
        os.truncate(path, at + 5)
        with pytest.raises(TruncatedSnapshotError) as caught:
            reader.read_key_group(2)
    assert str(caught.value) == (
        f"expected 12 bytes of the block header of key group 2 at offset {at}, got 5"
    )


# =================================================================== payloads


def test_a_section_of_an_unknown_state_id_is_named_with_its_key_group() -> None:
    # _parse_payload 17, 20, 24, 28; read_key_group 4 (the key group in the message).
    data = _encode(_metadata(), {2: (1, _section(7, ROWS_2_COUNTS))})
    with pytest.raises(SnapshotFormatError) as caught:
        _read(data, 2)
    assert str(caught.value) == (
        "expected one section per state id of [0, 1] in key group 2, got state id 7"
    )


def test_a_second_section_of_one_state_is_named_twice() -> None:
    # _parse_payload 19, 23, 25-27, 29.
    block = _block((0, ROWS_1_COUNTS), (0, ROWS_2_COUNTS))
    for read in (_read, _decode):
        with pytest.raises(SnapshotFormatError) as caught:
            read(_encode(_metadata(), {1: block}), 1)
        assert str(caught.value) == (
            "expected one section per state id of [0, 1] in key group 1, got state id 0 twice"
        )


def test_a_block_header_count_that_is_not_its_entries_is_refused() -> None:
    # _parse_payload 64, 65 (two sections add up), 67, 68.
    count, payload = BLOCKS[1]
    assert count == 3
    data = _encode(_metadata(), {1: (5, payload)})
    with pytest.raises(SnapshotFormatError) as caught:
        _read(data, 1)
    assert str(caught.value) == "expected 5 entries in key group 1 as its header says, got 3"


@pytest.mark.parametrize("read", [_read, _decode], ids=["raw", "decoded"])
@pytest.mark.parametrize(
    ("count", "payload"),
    [
        # a state length past the end of the block (its slice would be short)
        (1, struct.pack(">HI", 0, 1) + _u32(2) + b"w1" + _u32(5) + b"alice" + _u32(10) + b"3"),
        # the block ends inside the second entry's namespace length
        (2, _section(0, [(b"w1", b"alice", b"3")], count=2) + b"\0\0"),
        # the block ends inside a second section header
        (1, _section(0, [(b"w1", b"alice", b"3")]) + b"\0\0\0"),
    ],
    ids=["field-past-end", "inside-a-length", "inside-a-section-header"],
)
def test_a_block_that_ends_early_names_its_key_group(
    read: Callable[[bytes, int], Any], count: int, payload: bytes
) -> None:
    # _parse_payload 66; read_key_group 4, decode_key_group 4 (the key group in
    # the message).
    data = _encode(_metadata(), {3: (count, payload)})
    with pytest.raises(TruncatedSnapshotError) as caught:
        read(data, 3)
    assert str(caught.value) == f"expected {count} entries in key group 3, its block ends early"


# ================================================================= decoding


def test_decode_key_group_decodes_only_the_states_it_has_decoders_for(data: bytes) -> None:
    # decode_key_group 1-8; _parse_payload 30-32 (a state without a decoder is
    # skipped, not decoded: the int decoder would fail on "x"), 45 (nor
    # returned as rows), 47-63; _decoded_section 51 (a last field that ends at
    # the block's end is whole), 55-58, 94-96.
    reader = SnapshotReader(data)
    blocks = reader.decode_key_group(1, {0: _decoder()})
    assert list(blocks) == [0]
    assert type(blocks[0]) is DecodedBlock
    assert blocks[0].keys == ["alice", "bob"]
    assert blocks[0].namespaces == [("window", "w1"), ("window", "w1")]
    assert blocks[0].states == [3, 4]
    assert reader.decode_key_group(0, {0: _decoder()}) == {}
    assert reader.decode_key_group(2, {1: _decoder("names", state=_text)}) == {}
    both = reader.decode_key_group(1, {0: _decoder(), 1: _decoder("names", state=_text)})
    assert {i: block.rows() for i, block in both.items()} == {
        0: [("alice", ("window", "w1"), 3), ("bob", ("window", "w1"), 4)],
        1: [("carol", ("window", "w2"), "x")],
    }


def test_a_run_of_one_namespace_decodes_it_once_and_a_later_one_from_the_cache() -> None:
    # _decoded_section 16-29 (the namespace's frame is skipped in a run),
    # 65-69 (a namespace decoded once, then cached), 74-77 (the frame).
    rows = [
        (b"w1", b"a", b"1"),
        (b"w1", b"b", b"2"),
        (b"w22", b"c", b"3"),
        (b"w1", b"d", b"4"),
        (b"w1", b"e", b"5"),
    ]
    (block,) = _decode(_encode(_metadata(), {2: _block((0, rows))}), 2).values()
    assert block.rows() == [
        ("a", ("window", "w1"), 1),
        ("b", ("window", "w1"), 2),
        ("c", ("window", "w22"), 3),
        ("d", ("window", "w1"), 4),
        ("e", ("window", "w1"), 5),
    ]
    first = block.namespaces[0]
    assert [n is first for n in block.namespaces] == [True, True, False, True, True]


def test_an_entry_after_an_empty_namespace_is_parsed_at_its_own_position() -> None:
    # _decoded_section 13, 15: the previous frame (an empty namespace's is
    # b"\0\0\0\0") is looked for at the entry's position, not at the payload's
    # start (which is state id 0 and a count below 65536: b"\0\0\0\0" too).
    rows = [(b"", b"a", b"1"), (b"w1", b"b", b"2"), (b"", b"c", b"3")]
    (block,) = _decode(_encode(_metadata(), {1: _block((0, rows))}), 1).values()
    assert block.rows() == [
        ("a", ("window", ""), 1),
        ("b", ("window", "w1"), 2),
        ("c", ("window", ""), 3),
    ]


def test_decoders_that_share_a_namespace_cache_share_the_namespace_objects() -> None:
    # _decoded_section 66, 67: a namespace in the cache is not decoded again
    # (EntryDecoder: share one dict between the states of one namespace serializer).
    shared: dict[bytes, Any] = {}
    block = _block((0, [(b"w1", b"alice", b"3")]), (1, [(b"w1", b"bob", b"x")]))
    data = _encode(_metadata(), {1: block, 2: _block((0, [(b"w1", b"carol", b"5")]))})
    reader = SnapshotReader(data)
    decoders = {0: _decoder(namespaces=shared), 1: _decoder("names", shared, _text)}
    one = reader.decode_key_group(1, decoders)
    two = reader.decode_key_group(2, decoders)
    window = one[0].namespaces[0]
    assert window == ("window", "w1")
    assert shared == {b"w1": window}
    assert one[1].namespaces[0] is window
    assert two[0].namespaces[0] is window


@pytest.mark.parametrize(
    ("rows", "error"),
    [
        ([(b"w1", b"alice", b"three")], "invalid literal for int() with base 10: b'three'"),
        (
            [(b"w1", b"\xff", b"3")],
            "'ascii' codec can't decode byte 0xff in position 0: ordinal not in range(128)",
        ),
    ],
    ids=["state", "key"],
)
def test_an_entry_its_serializers_cannot_decode_names_the_state_and_key_group(
    rows: list[Row], error: str
) -> None:
    # _decoded_section 59-64.
    data = _encode(_metadata(), {2: _block((0, rows))})
    with pytest.raises(SnapshotFormatError) as caught:
        _decode(data, 2)
    assert type(caught.value) is SnapshotFormatError
    kind = "ValueError" if "int()" in error else "UnicodeDecodeError"
    assert str(caught.value) == (
        f"expected entries of state 'counts' in key group 2 that its serializers can decode, "
        f"got {kind}: {error}"
    )
    assert type(caught.value.__cause__).__name__ == kind


def test_a_namespace_its_serializer_cannot_decode_names_the_key_group() -> None:
    # _decoded_section 70 (decode_namespace is given the key group).
    data = _encode(_metadata(), {3: _block((0, [(b"bad", b"alice", b"3")]))})
    with pytest.raises(SnapshotFormatError) as caught:
        _decode(data, 3)
    assert str(caught.value) == (
        "expected entries of state 'counts' in key group 3 that its serializers can decode, "
        "got ValueError: no such window"
    )


@pytest.mark.parametrize(
    ("row", "role"),
    [((b"w1", b"null", b"3"), "key"), ((b"w1", b"alice", b"null"), "state")],
    ids=["key", "state"],
)
def test_an_entry_with_a_none_key_or_state_names_which(row: Row, role: str) -> None:
    # _decoded_section 78-93.
    data = _encode(_metadata(), {1: _block((0, [(b"w1", b"bob", b"4"), row]))})
    with pytest.raises(SnapshotEntryError) as caught:
        _decode(data, 1)
    assert str(caught.value) == (
        f"expected a {role} in every entry of state 'counts', key group 1, got an entry whose "
        f"{role} is None"
    )
