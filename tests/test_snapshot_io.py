"""Snapshot files (``cowstate.snapshot``) against the model and against their own docs.

- round trips: what a file holds is the model's snapshot taken at the same
  moment, whatever the live table does between ``snapshot()`` and the write;
- the format: an independent decoder and encoder written here from the module
  docstring's byte table parse (and rebuild, byte for byte) what the writer wrote;
- seeking: a reader reads the header, the index and the blocks it restores;
- rescaling as in Flink's ``StateBackendTestBase.testKeyGroupSnapshotRestore``;
- snapshot transformers, per-key-group release (also on failure and cancel);
- corrupt input: the precise ``SnapshotFormatError`` subclass, and a table that
  already held mappings is exactly as it was (nothing restored).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from conftest import HEAP_TABLES as TABLES
from hypothesis import given
from hypothesis import strategies as st
from test_value_codec import VALUES as CODEC_VALUES
from test_value_codec import canon

from cowstate import VOID_NAMESPACE, value_codec
from cowstate.errors import (
    BadMagicError,
    ChecksumMismatchError,
    CowStateError,
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
from cowstate.introspection import describe
from cowstate.key_groups import (
    KeyGroupRange,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from cowstate.serializers import (
    BytesSerializer,
    DefaultSerializer,
    ImmutableSerializer,
    IntSerializer,
    LongSerializer,
    PickleSerializer,
    StateSerializer,
    StringSerializer,
)
from cowstate.snapshot import (
    END_MAGIC,
    FORMAT_VERSION,
    MAGIC,
    RestoredSnapshot,
    SnapshotReader,
    ccodec,
    read_snapshot,
    restore_table,
    write_snapshot,
)
from cowstate.state_meta import StateKind, StateMetaInfo
from cowstate.state_table import (
    CopyOnWriteStateTable,
    NestedMapsStateTable,
    StateTable,
    StateTableSnapshot,
)
from cowstate_model.key_groups import assign_to_key_group as model_key_group
from cowstate_model.state_table import ReferenceStateTable
from cowstate_spec.bad_codecs import CODEC_BUGS, build_codec
from cowstate_spec.contract import mutate_in_place
from cowstate_spec.profiles import hunt_settings

needs_codec = pytest.mark.skipif(
    ccodec.CODEC is None,
    reason="the C codec is not built or COWSTATE_PURE_PYTHON is set (test_c_codec.py)",
)


class SubInt(int):
    """An int subclass: the value codec refuses it, pickle writes it."""


Table = StateTable[Any, Any, Any]
TableClass = type[StateTable[Any, Any, Any]]
Contents = dict[tuple[Any, Any], Any]

# ============================================================ the documented layout
# Written from the module docstring of cowstate.snapshot.format, not from its code.

DOC_MAGIC = b"\x89CWSNAP\n"
DOC_END_MAGIC = b"CWSNAPIX"
Row = tuple[bytes, bytes, bytes]  # (namespace, key, state) bytes
Section = tuple[int, list[Row]]  # (state id, entries)


@dataclass
class Block:
    offset: int
    key_group: int
    count: int
    payload: bytes
    crc: int
    sections: list[Section]

    @property
    def size(self) -> int:
        return 12 + len(self.payload) + 4


@dataclass
class Layout:
    version: int
    flags: int
    metadata_raw: bytes
    metadata: Any
    blocks: list[Block]
    index_offset: int
    index: list[tuple[int, int]]
    size: int

    @property
    def data_start(self) -> int:
        return 16 + len(self.metadata_raw) + 4

    def block(self, key_group: int) -> Block:
        return next(b for b in self.blocks if b.key_group == key_group)

    def raw_blocks(self) -> list[tuple[int, int, bytes]]:
        return [(b.key_group, b.count, b.payload) for b in self.blocks]


def parse_payload(payload: bytes) -> list[Section]:
    """Per state: 2 state id, 4 entry count, entries of 3 x (4 length + bytes)."""
    sections: list[Section] = []
    position = 0
    while position < len(payload):
        state_id, count = struct.unpack_from(">HI", payload, position)
        position += 6
        rows: list[Row] = []
        for _ in range(count):
            fields: list[bytes] = []
            for _field in range(3):
                (length,) = struct.unpack_from(">I", payload, position)
                position += 4
                fields.append(payload[position : position + length])
                position += length
                assert position <= len(payload), "an entry runs past its payload"
            rows.append((fields[0], fields[1], fields[2]))
        sections.append((state_id, rows))
    assert position == len(payload)
    return sections


def decode_layout(data: bytes) -> Layout:
    """Parse a snapshot file exactly as the docstring's table lays it out."""
    assert data[:8] == DOC_MAGIC
    version, flags, metadata_length = struct.unpack_from(">HHI", data, 8)
    metadata_raw = data[16 : 16 + metadata_length]
    (metadata_crc,) = struct.unpack_from(">I", data, 16 + metadata_length)
    assert metadata_crc == zlib.crc32(data[: 16 + metadata_length]), (
        "the metadata CRC is not the CRC32 of bytes [0, 16+M)"
    )
    index_offset, end_magic = struct.unpack(">Q8s", data[-16:])
    assert end_magic == DOC_END_MAGIC
    blocks: list[Block] = []
    position = 16 + metadata_length + 4
    while position < index_offset:
        key_group, count, length = struct.unpack_from(">iII", data, position)
        payload = data[position + 12 : position + 12 + length]
        (crc,) = struct.unpack_from(">I", data, position + 12 + length)
        assert crc == zlib.crc32(data[position : position + 12 + length]), (
            "a block CRC is not the CRC32 of its 12 header bytes and payload"
        )
        blocks.append(Block(position, key_group, count, payload, crc, parse_payload(payload)))
        position += 12 + length + 4
    assert position == index_offset, "the index does not follow the last block"
    (count,) = struct.unpack_from(">I", data, index_offset)
    index = [struct.unpack_from(">iQ", data, index_offset + 4 + 12 * i) for i in range(count)]
    index_end = index_offset + 4 + 12 * count
    (index_crc,) = struct.unpack_from(">I", data, index_end)
    assert index_crc == zlib.crc32(data[index_offset:index_end])
    assert index_end + 4 == len(data) - 16, "the footer does not follow the index CRC"
    return Layout(
        version,
        flags,
        metadata_raw,
        json.loads(metadata_raw.decode("utf-8")),
        blocks,
        index_offset,
        [(kg, off) for kg, off in index],
        len(data),
    )


def encode_payload(sections: Sequence[Section]) -> bytes:
    parts: list[bytes] = []
    for state_id, rows in sections:
        parts.append(struct.pack(">HI", state_id, len(rows)))
        for row in rows:
            for part in row:
                parts += (struct.pack(">I", len(part)), part)
    return b"".join(parts)


def encode_file(
    metadata_raw: bytes,
    blocks: Sequence[tuple[int, int, bytes]],
    *,
    index: Sequence[tuple[int, int]] | None = None,
    version: int = 1,
    flags: int = 0,
    magic: bytes = DOC_MAGIC,
    end_magic: bytes = DOC_END_MAGIC,
) -> bytes:
    """A file from its parts, every CRC correct; ``index`` defaults to the real offsets."""
    head = magic + struct.pack(">HHI", version, flags, len(metadata_raw)) + metadata_raw
    out = bytearray(head + struct.pack(">I", zlib.crc32(head)))
    offsets: list[tuple[int, int]] = []
    for key_group, count, payload in blocks:
        offsets.append((key_group, len(out)))
        block_head = struct.pack(">iII", key_group, count, len(payload))
        out += block_head + payload + struct.pack(">I", zlib.crc32(block_head + payload))
    index_offset = len(out)
    entries = offsets if index is None else index
    raw = struct.pack(">I", len(entries)) + b"".join(
        struct.pack(">iQ", kg, offset) for kg, offset in entries
    )
    out += raw + struct.pack(">I", zlib.crc32(raw)) + struct.pack(">Q", index_offset) + end_magic
    return bytes(out)


def with_metadata(data: bytes, metadata: Any) -> bytes:
    """``data`` with other (JSON) metadata, every offset and CRC recomputed."""
    raw = metadata if isinstance(metadata, bytes) else json.dumps(metadata).encode()
    return encode_file(raw, decode_layout(data).raw_blocks())


def flip_bit(data: bytes, offset: int, bit: int = 0) -> bytes:
    out = bytearray(data)
    out[offset] ^= 1 << bit
    return bytes(out)


# ==================================================================== helpers


def contents(entries: Iterable[Any]) -> Contents:
    listed = [((key, namespace), state) for key, namespace, state in entries]
    result = dict(listed)
    assert len(result) == len(listed), "a mapping was yielded twice"
    return result


def restored_contents(restored: RestoredSnapshot, name: str = "state") -> Contents:
    """The decoded mappings of ``name``; each must sit in its key's key group."""
    listed: list[tuple[tuple[Any, Any], Any]] = []
    for key_group, key, namespace, state in restored.entries(name):
        assert key_group == model_key_group(key, restored.max_parallelism)
        assert key_group in restored.key_group_range
        listed.append(((key, namespace), state))
    result = dict(listed)
    assert len(result) == len(listed), "a mapping was decoded twice"
    return result


def make_pair(
    cls: TableClass, key_group_range: KeyGroupRange, max_parallelism: int, **kwargs: Any
) -> tuple[Table, ReferenceStateTable]:
    table = cls(key_group_range, max_parallelism, **kwargs)
    model = ReferenceStateTable(list(key_group_range), max_parallelism)
    return table, model


def fill(
    table: Table, model: ReferenceStateTable | None, entries: Iterable[tuple[Any, Any, Any]]
) -> None:
    for key, namespace, state in entries:
        table.put(key, namespace, state)
        if model is not None:
            model.put(key, namespace, copy.deepcopy(state))


def written(
    snapshots: StateTableSnapshot[Any, Any, Any] | Sequence[StateTableSnapshot[Any, Any, Any]],
) -> bytes:
    stream = io.BytesIO()
    info = write_snapshot(snapshots, stream)
    data = stream.getvalue()
    assert info.size == len(data)
    return data


SMALL_MAXP = 10
SMALL_RANGE = KeyGroupRange(0, SMALL_MAXP - 1)


def small_entries(count: int = 20) -> list[tuple[Any, Any, Any]]:
    return [(i, "ns" if i % 3 else "other", [i, f"v{i}"]) for i in range(count)]


def small_file(count: int = 20, cls: TableClass = CopyOnWriteStateTable) -> bytes:
    """A one-state file of max parallelism 10, all key groups, ``count`` int keys."""
    table = cls(SMALL_RANGE, SMALL_MAXP)
    fill(table, None, small_entries(count))
    return written(table.snapshot())


STANDARD = small_file()


class Prefilled:
    """A table that already holds mappings, beside a model with the same ones."""

    def __init__(
        self,
        cls: TableClass = CopyOnWriteStateTable,
        max_parallelism: int = SMALL_MAXP,
        **kwargs: Any,
    ) -> None:
        key_group_range = KeyGroupRange(0, max_parallelism - 1)
        self.table, self.model = make_pair(cls, key_group_range, max_parallelism, **kwargs)
        fill(
            self.table,
            self.model,
            [(1000 + i, "pre", [i, "old"]) for i in range(12)] + [(5, "ns", ["mine"])],
        )
        self.objects = {(k, n): s for k, n, s in self.table}

    def assert_unchanged(self) -> None:
        assert contents(self.table) == contents(self.model), "a failed restore changed the table"
        assert len(self.table) == len(self.model)
        for (key, namespace), state in self.objects.items():
            assert self.table.get(key, namespace) is state


def assert_restores_nothing(
    files: Sequence[Any],
    error: type[CowStateError],
    *fragments: str,
    target: Prefilled | None = None,
) -> CowStateError:
    """``restore_table`` raises exactly ``error`` (message with ``fragments``) and
    leaves a table that already held mappings as it was."""
    target = Prefilled() if target is None else target
    with pytest.raises(CowStateError) as excinfo:
        restore_table(target.table, files)
    assert type(excinfo.value) is error, f"expected {error.__name__}, got {excinfo.value!r}"
    target.assert_unchanged()
    message = str(excinfo.value)
    assert "expected" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return excinfo.value


def read_error(
    data: Any, key_group_range: KeyGroupRange = SMALL_RANGE, **kwargs: Any
) -> BaseException:
    with pytest.raises(Exception) as excinfo:  # the class is checked by callers
        read_snapshot(data, key_group_range, **kwargs)
    return excinfo.value


class RecordingStream(io.BytesIO):
    """A seekable stream that records every read as (offset, length)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads: list[tuple[int, int]] = []

    def read(self, size: int | None = -1, /) -> bytes:
        at = self.tell()
        chunk = super().read(size)
        self.reads.append((at, len(chunk)))
        return chunk

    @property
    def bytes_read(self) -> int:
        return sum(length for _, length in self.reads)


class NonSeekableStream(io.BytesIO):
    """A pipe-like stream: ``seekable()`` is False and seeking fails."""

    def seekable(self) -> bool:
        return False

    def seek(self, offset: int, whence: int = io.SEEK_SET, /) -> int:
        raise io.UnsupportedOperation("seek")

    def tell(self) -> int:
        raise io.UnsupportedOperation("tell")


# ================================================================ 1. round trip

KEYS = st.one_of(st.integers(-(2**40), 2**40), st.text(max_size=5))
NAMESPACES = st.sampled_from(["ns", "window-1", 0, 7, ("w", 3)])
STATES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.lists(st.integers(-9, 9), max_size=4),
    st.dictionaries(st.text(max_size=2), st.integers(-9, 9), max_size=3),
)
ENTRIES = st.lists(st.tuples(KEYS, NAMESPACES, STATES), max_size=30)
MUTATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("mutate"), st.integers(0, 10**6)),
        st.tuples(st.just("put"), KEYS, NAMESPACES, STATES),
        st.tuples(st.just("remove"), st.integers(0, 10**6)),
    ),
    max_size=12,
)


def apply_mutation(
    table: Table, model: ReferenceStateTable, op: tuple[Any, ...], item: int
) -> None:
    """One change to the live table and the model: in place via get(), put, remove."""
    if op[0] == "put":
        _, key, namespace, state = op
        table.put(key, namespace, state)
        model.put(key, namespace, copy.deepcopy(state))
        return
    mapped = sorted(contents(model), key=repr)
    if not mapped:
        return
    key, namespace = mapped[op[1] % len(mapped)]
    if op[0] == "remove":
        table.remove(key, namespace)
        model.remove(key, namespace)
        return
    live = table.get(key, namespace)
    if mutate_in_place(live, item):
        assert mutate_in_place(model.get(key, namespace), item)
    else:
        assert live is not None
        table.put(key, namespace, live + 1)
        model.put(key, namespace, model.get(key, namespace) + 1)


@given(
    cls=st.sampled_from(TABLES),
    max_parallelism=st.sampled_from([1, 3, 16, 128]),
    entries=ENTRIES,
    mutations=MUTATIONS,
    data=st.data(),
)
def test_round_trip_file_holds_the_snapshot_time_contents(
    cls: TableClass,
    max_parallelism: int,
    entries: list[tuple[Any, Any, Any]],
    mutations: list[tuple[Any, ...]],
    data: st.DataObject,
) -> None:
    full = KeyGroupRange(0, max_parallelism - 1)
    table, model = make_pair(cls, full, max_parallelism)
    fill(table, model, entries)
    snapshot = table.snapshot()
    expected = dict(model.snapshot().contents)  # the same moment
    for item, op in enumerate(mutations):
        apply_mutation(table, model, op, item)
    data_bytes = written(snapshot)

    restored = read_snapshot(data_bytes, full, max_parallelism=max_parallelism)
    assert restored_contents(restored) == expected
    assert contents(table) == contents(model), "the live table lost a change"

    start = data.draw(st.integers(0, max_parallelism - 1), label="start")
    end = data.draw(st.integers(start - 1, max_parallelism - 1), label="end")
    part = KeyGroupRange.of(start, end)
    partial = read_snapshot(data_bytes, part)
    assert restored_contents(partial) == {
        (k, n): s for (k, n), s in expected.items() if model_key_group(k, max_parallelism) in part
    }

    other = NestedMapsStateTable if cls is CopyOnWriteStateTable else CopyOnWriteStateTable
    fresh: Table = other(full, max_parallelism)
    assert restore_table(fresh, [data_bytes]) == len(expected)
    assert contents(fresh) == expected


@pytest.mark.parametrize("cls", TABLES)
def test_changes_after_snapshot_never_reach_the_file(cls: TableClass) -> None:
    table, model = make_pair(cls, SMALL_RANGE, SMALL_MAXP)
    fill(table, model, small_entries(30))
    snapshot = table.snapshot()
    expected = dict(model.snapshot().contents)
    for key in range(0, 30, 3):
        got = table.get(key, "other")
        assert got is not None
        got.append("changed")  # in place, through get()
    for key in range(1, 30, 3):
        table.put(key, "ns", ["replaced"])
    for key in range(2, 30, 3):
        table.remove(key, "ns")
    table.put(99, "new", ["added"])
    restored = read_snapshot(written(snapshot), SMALL_RANGE)
    assert restored_contents(restored) == expected
    assert (0, "other") in expected and expected[(0, "other")] == [0, "v0"]
    assert table.get(0, "other") == [0, "v0", "changed"]


def test_reading_from_a_stream_that_does_not_start_at_offset_zero() -> None:
    table: Table = CopyOnWriteStateTable(SMALL_RANGE, SMALL_MAXP)
    fill(table, None, small_entries())
    stream = io.BytesIO()
    stream.write(b"some other file's bytes" * 4)
    start = stream.tell()
    info = write_snapshot(table.snapshot(), stream)
    assert info.size == len(stream.getvalue()) - start
    # offsets count from the file's first byte, not from the stream's
    assert info.offsets == dict(decode_layout(stream.getvalue()[start:]).index)
    stream.seek(start)
    assert restored_contents(read_snapshot(stream, SMALL_RANGE)) == contents(small_entries())


class YieldingStream(io.BytesIO):
    """Gives other threads a chance at every write."""

    def write(self, data: Any, /) -> int:
        time.sleep(0)
        return super().write(data)


def test_writing_on_another_thread_while_the_table_keeps_changing() -> None:
    table, model = make_pair(CopyOnWriteStateTable, KeyGroupRange(0, 127), 128)
    fill(table, model, [(k, "ns", [k]) for k in range(2000)])
    snapshot = table.snapshot()
    expected = dict(model.snapshot().contents)
    stream = YieldingStream()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            write_snapshot(snapshot, stream)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    writer = threading.Thread(target=write)
    positions: set[int] = set()
    writer.start()
    for step in range(20000):
        if not writer.is_alive():
            break
        positions.add(stream.tell())
        k = step % 2500
        if step % 3 == 0:
            table.put(k, "ns", [k, "new"])
        elif step % 3 == 1 and (got := table.get(k, "ns")) is not None:
            got.append(step)
        else:
            table.remove((k * 7) % 2500, "ns")
        if step % 20 == 0:
            time.sleep(0)
    writer.join()
    assert failures == []
    assert len(positions) > 1, "the table never changed while the writer was writing"
    restored = read_snapshot(stream.getvalue(), KeyGroupRange(0, 127))
    assert restored_contents(restored) == expected
    assert_all_released(table, snapshot)


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview, io.BytesIO])
def test_any_bytes_like_or_binary_stream_is_read(wrap: Callable[[bytes], Any]) -> None:
    restored = read_snapshot(wrap(STANDARD), SMALL_RANGE)
    assert restored_contents(restored) == contents(small_entries())


# ================================================================== 2. the format


def test_module_constants_are_the_documented_ones() -> None:
    assert MAGIC == DOC_MAGIC
    assert END_MAGIC == DOC_END_MAGIC
    assert FORMAT_VERSION == 1


def multi_state_tables() -> tuple[list[Table], list[ReferenceStateTable]]:
    """Three states over [2, 7] of 10 with Java encodings: int32 keys, utf8 namespaces."""
    key_group_range = KeyGroupRange(2, 7)
    metas = [
        StateMetaInfo("counts", StateKind.VALUE, StringSerializer(), IntSerializer()),
        StateMetaInfo("lists", StateKind.LIST, StringSerializer(), DefaultSerializer()),
        StateMetaInfo("empty", StateKind.MAP, StringSerializer(), DefaultSerializer()),
    ]
    tables: list[Table] = []
    models: list[ReferenceStateTable] = []
    for number, meta in enumerate(metas):
        cls = TABLES[number % 2]
        table, model = make_pair(
            cls, key_group_range, SMALL_MAXP, meta=meta, key_serializer=IntSerializer()
        )
        tables.append(table)
        models.append(model)
    keys = [k for k in range(-60, 60) if assign_to_key_group(k, SMALL_MAXP) in key_group_range]
    fill(tables[0], models[0], [(k, f"w{k % 2}", k * 7) for k in keys])
    fill(tables[1], models[1], [(k, "w0", [k, -k]) for k in keys[::3]])
    return tables, models


def value_codec_v1(data: bytes) -> Any:
    """The value codec's bytes read as its docstring says: version 1, one MessagePack object."""
    assert data[0] == 1
    return msgpack.unpackb(data[1:])


def test_independent_decoder_agrees_with_the_docstring() -> None:
    tables, models = multi_state_tables()
    stream = io.BytesIO()
    info = write_snapshot([t.snapshot() for t in tables], stream)
    data = stream.getvalue()
    layout = decode_layout(data)

    assert (layout.version, layout.flags) == (1, 0)
    assert layout.metadata == {
        "format": "heap",
        "max_parallelism": 10,
        "key_group_range": [2, 7],
        "key_serializer": "int32",
        "states": [
            {
                "id": 0,
                "name": "counts",
                "kind": "value",
                "namespace_serializer": "utf8",
                "state_serializer": "int32",
            },
            {
                "id": 1,
                "name": "lists",
                "kind": "list",
                "namespace_serializer": "utf8",
                "state_serializer": "cowstate-value",
            },
            {
                "id": 2,
                "name": "empty",
                "kind": "map",
                "namespace_serializer": "utf8",
                "state_serializer": "cowstate-value",
            },
        ],
    }
    # one block per key group of the range, ascending, index pointing at each
    assert [b.key_group for b in layout.blocks] == list(range(2, 8))
    assert layout.index == [(b.key_group, b.offset) for b in layout.blocks]
    assert info.offsets == dict(layout.index)
    assert layout.blocks[0].offset == layout.data_start
    assert struct.unpack(">Q", data[-16:-8])[0] == layout.index_offset

    decoders: list[tuple[Callable[[bytes], Any], Callable[[bytes], Any]]] = [
        (lambda b: b.decode("utf-8"), lambda b: struct.unpack(">i", b)[0]),
        (lambda b: b.decode("utf-8"), value_codec_v1),
        (lambda b: b.decode("utf-8"), value_codec_v1),
    ]
    decoded: list[Contents] = [{}, {}, {}]
    total = 0
    for block in layout.blocks:
        ids = [state_id for state_id, _ in block.sections]
        assert ids == sorted(set(ids)), "sections are not one per state, by id"
        assert all(rows for _, rows in block.sections), "a state without entries has a section"
        assert block.count == sum(len(rows) for _, rows in block.sections)
        total += block.count
        for state_id, rows in block.sections:
            namespace_of, state_of = decoders[state_id]
            for namespace, key, state in rows:  # namespace first, as in Flink
                assert len(key) == 4
                (k,) = struct.unpack(">i", key)
                assert assign_to_key_group(k, SMALL_MAXP) == block.key_group
                decoded[state_id][(k, namespace_of(namespace))] = state_of(state)
    assert info.entries == total == sum(len(m) for m in models)
    for model, got in zip(models, decoded, strict=True):
        assert got == contents(model)
    assert decoded[2] == {}


def test_independent_encoder_rebuilds_the_file_byte_for_byte() -> None:
    tables, _ = multi_state_tables()
    data = written([t.snapshot() for t in tables])
    layout = decode_layout(data)
    rebuilt_blocks = [(b.key_group, b.count, encode_payload(b.sections)) for b in layout.blocks]
    assert encode_file(layout.metadata_raw, rebuilt_blocks) == data
    assert decode_layout(STANDARD).size == len(STANDARD)
    assert (
        encode_file(decode_layout(STANDARD).metadata_raw, decode_layout(STANDARD).raw_blocks())
        == STANDARD
    )


def test_a_crafted_file_in_the_documented_layout_is_read() -> None:
    """A file written only by this test's encoder restores: the doc is enough to write one."""
    metadata = {
        "format": "heap",
        "max_parallelism": 4,
        "key_group_range": [1, 2],
        "key_serializer": "utf8",
        "states": [
            {
                "id": 7,
                "name": "s",
                "kind": "value",
                "namespace_serializer": "utf8",
                "state_serializer": "int32",
            }
        ],
    }
    keys = {
        kg: [k for k in ("a", "b", "c", "d", "e", "f", "g", "h") if assign_to_key_group(k, 4) == kg]
        for kg in (1, 2)
    }
    blocks = [
        (
            kg,
            len(ks),
            encode_payload(
                [(7, [(b"n", k.encode(), struct.pack(">i", i)) for i, k in enumerate(ks)])]
            ),
        )
        for kg, ks in keys.items()
    ]
    data = encode_file(json.dumps(metadata).encode(), blocks)
    restored = read_snapshot(data, KeyGroupRange(0, 3))
    assert restored_contents(restored, "s") == {
        (k, "n"): i for ks in keys.values() for i, k in enumerate(ks)
    }
    table: Table = CopyOnWriteStateTable(
        KeyGroupRange(0, 3),
        4,
        meta=StateMetaInfo("s", StateKind.VALUE, StringSerializer(), IntSerializer()),
        key_serializer=StringSerializer(),
    )
    assert restore_table(table, [data]) == sum(len(ks) for ks in keys.values())


# ===================================================================== 3. seeking


def big_file() -> tuple[bytes, Contents]:
    table: Table = CopyOnWriteStateTable(KeyGroupRange(0, 999), 1000)
    entries = [(k, "ns", f"{k:06d}" * 10) for k in range(3000)]
    fill(table, None, entries)
    return written(table.snapshot()), contents(entries)


def test_restoring_one_key_group_reads_only_header_index_and_its_block() -> None:
    data, everything = big_file()
    layout = decode_layout(data)
    key_group = assign_to_key_group(0, 1000)
    block = layout.block(key_group)
    stream = RecordingStream(data)
    table = NestedMapsStateTable(KeyGroupRange(key_group, key_group), 1000)
    restored = restore_table(table, [stream])
    assert restored == block.count > 0
    assert contents(table) == {
        kn: s for kn, s in everything.items() if assign_to_key_group(kn[0], 1000) == key_group
    }

    allowed = [
        (0, layout.data_start),
        (layout.index_offset, len(data)),
        (block.offset, block.offset + block.size),
    ]
    for at, length in stream.reads:
        assert any(lo <= at and at + length <= hi for lo, hi in allowed), (
            f"read of {length} bytes at {at} is outside header, index and block"
        )
    assert any(at == block.offset for at, _ in stream.reads)
    assert stream.bytes_read < len(data) / 10, (stream.bytes_read, len(data))


def test_a_non_seekable_stream_is_read_correctly() -> None:
    restored = read_snapshot(NonSeekableStream(STANDARD), KeyGroupRange(3, 6))
    expected = {
        kn: s
        for kn, s in contents(small_entries()).items()
        if 3 <= assign_to_key_group(kn[0], SMALL_MAXP) <= 6
    }
    assert expected and restored_contents(restored) == expected
    table: Table = CopyOnWriteStateTable(SMALL_RANGE, SMALL_MAXP)
    assert restore_table(table, [NonSeekableStream(STANDARD)]) == 20
    assert contents(table) == contents(small_entries())


def test_reading_the_empty_range_reads_no_block() -> None:
    layout = decode_layout(STANDARD)
    stream = RecordingStream(STANDARD)
    restored = read_snapshot(stream, KeyGroupRange.EMPTY)
    assert restored.states == {"state": {}}
    assert all(at < layout.data_start or at >= layout.index_offset for at, _ in stream.reads)


# =================================================================== 4. rescaling

RESCALINGS = [(2, 5), (4, 3), (1, 3), (3, 1), (3, 7), (7, 2), (5, 5), (6, 4)]


@pytest.mark.parametrize("max_parallelism", [10, 128])
@pytest.mark.parametrize(("p_old", "p_new"), RESCALINGS)
def test_key_group_snapshot_restore_across_parallelism(
    max_parallelism: int, p_old: int, p_new: int
) -> None:
    keys: list[Any] = list(range(300)) + [f"key-{i}" for i in range(100)]
    everything: Contents = {}
    files: list[bytes] = []
    for index in range(p_old):
        key_group_range = compute_key_group_range_for_operator_index(max_parallelism, p_old, index)
        old = TABLES[index % 2](key_group_range, max_parallelism)
        mine = [
            (k, ns, [k, ns])
            for k in keys
            for ns in ("a", "b")
            if assign_to_key_group(k, max_parallelism) in key_group_range
        ]
        fill(old, None, mine)
        everything.update(contents(mine))
        files.append(written(old.snapshot()))
    assert len(everything) == 2 * len(keys)
    file_ranges = [KeyGroupRange(*decode_layout(f).metadata["key_group_range"]) for f in files]

    seen: Contents = {}
    for index in range(p_new):
        key_group_range = compute_key_group_range_for_operator_index(max_parallelism, p_new, index)
        new = TABLES[(index + 1) % 2](key_group_range, max_parallelism)
        streams = [RecordingStream(f) for f in files]
        count = restore_table(new, streams)
        got = contents(new)
        assert count == len(got)
        for key, _namespace in got:
            assert assign_to_key_group(key, max_parallelism) in key_group_range
            assert model_key_group(key, max_parallelism) in key_group_range
        assert not seen.keys() & got.keys(), "a mapping was restored into two tables"
        seen.update(got)
        # every file was read only where it meets the new range, each block once
        for data, stream, file_range in zip(files, streams, file_ranges, strict=True):
            layout = decode_layout(data)
            blocks_read = [
                b.key_group for b in layout.blocks for at, _ in stream.reads if at == b.offset
            ]
            assert blocks_read == list(file_range.intersection(key_group_range))
    assert seen == everything


def test_scale_down_accumulates_several_files_with_into() -> None:
    files = []
    everything: Contents = {}
    for index in range(3):
        key_group_range = compute_key_group_range_for_operator_index(SMALL_MAXP, 3, index)
        table: Table = CopyOnWriteStateTable(key_group_range, SMALL_MAXP)
        mine = [
            e for e in small_entries(40) if assign_to_key_group(e[0], SMALL_MAXP) in key_group_range
        ]
        fill(table, None, mine)
        everything.update(contents(mine))
        files.append(written(table.snapshot()))
    restored = read_snapshot(files[0], SMALL_RANGE)
    for data in files[1:]:
        assert read_snapshot(data, SMALL_RANGE, into=restored) is restored
    assert restored_contents(restored) == everything
    assert restored.formats == {"heap"} and restored.key_serializer == "cowstate-value"


# ================================================================ 5. transformers

NOW = 100


def ttl(state: list[Any]) -> Any:
    """TTL-like: drop expired, strip the timestamp, keep timeless states as they are."""
    value, timestamp = state
    if timestamp is None:
        return state
    if timestamp < NOW:
        return None
    return value


@pytest.mark.parametrize("cls", TABLES)
def test_snapshot_transformer_writes_transformed_entries_and_leaves_the_table(
    cls: TableClass,
) -> None:
    meta = StateMetaInfo("ttl", StateKind.VALUE, snapshot_transformer=ttl)
    table, model = make_pair(cls, SMALL_RANGE, SMALL_MAXP, meta=meta)
    entries: list[tuple[Any, Any, Any]] = []
    for k in range(60):
        timestamp = None if k % 5 == 0 else (NOW - 1 - k if k % 2 else NOW + k)
        entries.append((k, "ns", [{"v": k}, timestamp]))
    fill(table, model, entries)
    objects = {(k, n): s for k, n, s in table}
    before = copy.deepcopy(contents(table))

    snapshot = table.snapshot()
    expected = {kn: ttl(s) for kn, s in model.snapshot().contents.items() if ttl(s) is not None}
    # renewing an expired entry after the snapshot does not resurrect it in the file
    renewed = table.get(1, "ns")
    assert renewed is not None
    renewed[1] = NOW + 1000
    model.get(1, "ns")[1] = NOW + 1000
    stream = io.BytesIO()
    info = write_snapshot(snapshot, stream)
    assert (1, "ns") not in expected

    dropped = sum(1 for s in before.values() if ttl(s) is None)
    assert 0 < dropped < len(before)
    assert info.entries == len(expected) == len(before) - dropped
    restored = read_snapshot(stream.getvalue(), SMALL_RANGE)
    assert restored_contents(restored, "ttl") == expected
    assert restored_contents(restored, "ttl")[(2, "ns")] == {"v": 2}  # stripped
    assert restored_contents(restored, "ttl")[(5, "ns")] == [{"v": 5}, None]  # as is
    for block in decode_layout(stream.getvalue()).blocks:
        assert block.count == sum(
            1 for kn in expected if assign_to_key_group(kn[0], SMALL_MAXP) == block.key_group
        )

    # the live table: same objects, same contents (bar the renewal above)
    before[(1, "ns")][1] = NOW + 1000
    assert contents(table) == before == contents(model)
    for (key, namespace), state in objects.items():
        if (key, namespace) != (1, "ns"):  # renewed through get(): a copy-on-write copy
            assert table.get(key, namespace) is state


# ====================================================== 6. per-key-group release


def assert_all_released(table: Table, snapshot: StateTableSnapshot[Any, Any, Any]) -> None:
    assert snapshot.is_released
    for key_group in table.key_group_range:
        assert snapshot.is_key_group_released(key_group)
        if isinstance(table, CopyOnWriteStateTable):
            assert describe(table.state_map(key_group)).open_versions == frozenset()


def filled_table(cls: TableClass) -> Table:
    table = cls(SMALL_RANGE, SMALL_MAXP)
    fill(table, None, small_entries(40))
    return table


class ReleaseWatchingStream(io.BytesIO):
    """Records, at every write, which key groups of the watched snapshot were released."""

    def __init__(self, snapshot: StateTableSnapshot[Any, Any, Any], table: Table) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.table = table
        self.seen: list[tuple[int, ...]] = []

    def write(self, data: Any, /) -> int:
        released = tuple(
            kg for kg in self.table.key_group_range if self.snapshot.is_key_group_released(kg)
        )
        if isinstance(self.table, CopyOnWriteStateTable):
            versions = tuple(
                kg
                for kg in self.table.key_group_range
                if not describe(self.table.state_map(kg)).open_versions
            )
            assert versions == released
        self.seen.append(released)
        return super().write(data)


@pytest.mark.parametrize("cls", TABLES)
def test_every_key_group_is_released_as_soon_as_it_is_written(cls: TableClass) -> None:
    table = filled_table(cls)
    snapshot = table.snapshot()
    stream = ReleaseWatchingStream(snapshot, table)
    write_snapshot(snapshot, stream)
    n = len(table.key_group_range)
    expected = [()] + [tuple(range(j)) for j in range(n) for _ in range(3)]
    expected += [tuple(range(n))] * 2  # index, footer
    assert stream.seen == expected
    assert_all_released(table, snapshot)


class FailingStream(io.BytesIO):
    """Accepts ``limit`` bytes, then raises OSError."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.error = OSError(f"no space left after {limit} bytes")

    def write(self, data: Any, /) -> int:
        if self.tell() + len(data) > self.limit:
            super().write(bytes(data)[: self.limit - self.tell()])
            raise self.error
        return super().write(data)


@pytest.mark.parametrize("cls", TABLES)
def test_a_failing_stream_releases_everything_and_the_error_propagates(cls: TableClass) -> None:
    size = len(small_file(40, cls))
    for limit in [0, 5, 16, 100, size // 2, size - 30, size - 10, size - 1]:
        table = filled_table(cls)
        snapshot = table.snapshot()
        stream = FailingStream(limit)
        with pytest.raises(OSError) as excinfo:
            write_snapshot(snapshot, stream)
        assert excinfo.value is stream.error
        assert_all_released(table, snapshot)
        # the table is fine: a new snapshot writes the same contents in full
        again = read_snapshot(written(table.snapshot()), SMALL_RANGE)
        assert restored_contents(again) == contents(small_entries(40))


@pytest.mark.parametrize("cls", TABLES)
def test_a_failing_transformer_releases_everything(cls: TableClass) -> None:
    def boom(state: Any) -> Any:
        if state[0] == 17:
            raise ArithmeticError("transformer failed")
        return state

    table = cls(SMALL_RANGE, SMALL_MAXP, meta=StateMetaInfo(snapshot_transformer=boom))
    fill(table, None, small_entries(40))
    snapshot = table.snapshot()
    with pytest.raises(ArithmeticError, match="transformer failed"):
        write_snapshot(snapshot, io.BytesIO())
    assert_all_released(table, snapshot)


class CancellingStream(io.BytesIO):
    """Sets ``event`` once more than ``after`` bytes were written."""

    def __init__(self, event: threading.Event, after: int) -> None:
        super().__init__()
        self.event = event
        self.after = after

    def write(self, data: Any, /) -> int:
        written_now = super().write(data)
        if self.tell() > self.after:
            self.event.set()
        return written_now


@pytest.mark.parametrize("cls", TABLES)
def test_cancel_raises_snapshot_cancelled_and_releases_everything(cls: TableClass) -> None:
    layout = decode_layout(small_file(40, cls))
    # cancelled before the first key group
    table = filled_table(cls)
    snapshot = table.snapshot()
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(SnapshotCancelledError, match="before key group 0 was written"):
        write_snapshot(snapshot, io.BytesIO(), cancel=cancel)
    assert_all_released(table, snapshot)
    # cancelled while key group 4 is written: stops before key group 5
    table = filled_table(cls)
    snapshot = table.snapshot()
    cancel = threading.Event()
    stream = CancellingStream(cancel, layout.block(4).offset)
    with pytest.raises(SnapshotCancelledError) as excinfo:
        write_snapshot(snapshot, stream, cancel=cancel)
    assert isinstance(excinfo.value, CancelledError)
    assert "before key group 5 was written" in str(excinfo.value)
    assert len(stream.getvalue()) == layout.block(5).offset
    assert_all_released(table, snapshot)


def test_without_release_a_failed_write_leaves_the_rest_to_the_caller() -> None:
    table = filled_table(CopyOnWriteStateTable)
    layout = decode_layout(small_file(40))
    snapshot = table.snapshot()
    with pytest.raises(OSError):
        write_snapshot(snapshot, FailingStream(layout.block(3).offset + 5), release=False)
    assert [snapshot.is_key_group_released(kg) for kg in SMALL_RANGE] == [True] * 3 + [False] * 7
    assert describe(table.state_map(3)).open_versions
    snapshot.release()
    assert_all_released(table, snapshot)


# ================================================================ 7. corrupt input


def test_every_truncation_of_a_small_file_raises_truncated_and_restores_nothing() -> None:
    data = small_file(4)
    target = Prefilled()
    for cut in range(len(data)):
        with pytest.raises(CowStateError) as excinfo:
            restore_table(target.table, [data[:cut]])
        assert type(excinfo.value) is TruncatedSnapshotError, (cut, excinfo.value)
        assert "expected" in str(excinfo.value)
        if cut < 16:
            assert f"got {cut}" in str(excinfo.value)
    target.assert_unchanged()


def test_truncations_of_a_multi_state_file_never_succeed() -> None:
    tables, _ = multi_state_tables()
    data = written([t.snapshot() for t in tables])
    for cut in [*range(0, len(data), 7), len(data) - 1, len(data) - 8, len(data) - 9]:
        error = read_error(data[:cut], KeyGroupRange(0, 9))
        assert type(error) is TruncatedSnapshotError, (cut, error)


def test_messages_of_truncated_files_say_what_was_expected() -> None:
    error = assert_restores_nothing([STANDARD[:10]], TruncatedSnapshotError, "got 10")
    assert isinstance(error, SnapshotFormatError)
    assert_restores_nothing(
        [STANDARD[:-1]], TruncatedSnapshotError, "expected the end magic b'CWSNAPIX'", "truncated"
    )
    # the footer is intact but a block was cut out of the middle
    layout = decode_layout(STANDARD)
    block = layout.block(4)
    gutted = STANDARD[: block.offset + 20] + STANDARD[block.offset + block.size :]
    assert_restores_nothing([gutted], TruncatedSnapshotError)


def test_wrong_magic_raises_bad_magic() -> None:
    assert_restores_nothing(
        [b"X" + STANDARD[1:]],
        BadMagicError,
        "expected the magic bytes",
        "not a cowstate snapshot file",
    )
    assert_restores_nothing([b"PK\x03\x04" + b"\x00" * 200], BadMagicError, "got b'PK")
    text = b"just some text file, certainly not a snapshot of keyed state\n"
    assert type(read_error(text)) is BadMagicError


def test_wrong_end_magic_is_refused() -> None:
    bad = encode_file(
        decode_layout(STANDARD).metadata_raw,
        decode_layout(STANDARD).raw_blocks(),
        end_magic=b"CWSNAPXX",
    )
    # Behaviour: a file whose last 8 bytes are not the end magic is reported as
    # truncated (a cut file ends in arbitrary bytes), not as BadMagicError.
    assert_restores_nothing(
        [bad], TruncatedSnapshotError, "expected the end magic", "got b'CWSNAPXX'"
    )


@pytest.mark.parametrize("version", [0, 2, 65535])
def test_unknown_version_raises_unsupported_version(version: int) -> None:
    layout = decode_layout(STANDARD)
    bad = encode_file(layout.metadata_raw, layout.raw_blocks(), version=version)
    assert_restores_nothing(
        [bad], UnsupportedVersionError, "expected snapshot format version 1", f"got {version}"
    )
    patched = STANDARD[:8] + struct.pack(">H", version) + STANDARD[10:]  # CRC not fixed
    assert type(read_error(patched)) is UnsupportedVersionError


def region_of(layout: Layout, offset: int) -> str:
    if offset < 8:
        return "magic"
    if offset < 10:
        return "version"
    if offset < 12:
        return "flags"
    if offset < 16:
        return "metadata length"
    if offset < 16 + len(layout.metadata_raw):
        return "metadata"
    if offset < layout.data_start:
        return "metadata crc"
    for block in layout.blocks:
        relative = offset - block.offset
        if 0 <= relative < block.size:
            return (
                "block key group"
                if relative < 4
                else "block count"
                if relative < 8
                else "block length"
                if relative < 12
                else "block crc"
                if relative >= block.size - 4
                else "block payload"
            )
    if offset < layout.index_offset + 4:
        return "index count"
    if offset < layout.size - 20:
        return "index entries"
    if offset < layout.size - 16:
        return "index crc"
    return "footer offset" if offset < layout.size - 8 else "end magic"


EXPECTED_BY_REGION: dict[str, type[SnapshotFormatError]] = {
    "magic": BadMagicError,
    "version": UnsupportedVersionError,
    "flags": ChecksumMismatchError,
    "metadata": ChecksumMismatchError,
    "metadata crc": ChecksumMismatchError,
    "block key group": KeyGroupMismatchError,
    "block count": ChecksumMismatchError,
    "block payload": ChecksumMismatchError,
    "block crc": ChecksumMismatchError,
    "index count": TruncatedSnapshotError,
    "index entries": ChecksumMismatchError,
    "index crc": ChecksumMismatchError,
    "end magic": TruncatedSnapshotError,
}


def test_every_single_bit_flip_is_detected() -> None:
    data = small_file(3)
    layout = decode_layout(data)
    regions: set[str] = set()
    for offset in range(len(data)):
        region = region_of(layout, offset)
        regions.add(region)
        for bit in range(8):
            error = read_error(flip_bit(data, offset, bit))
            assert isinstance(error, SnapshotFormatError), (offset, bit, region, error)
            wanted = EXPECTED_BY_REGION.get(region, SnapshotFormatError)
            assert isinstance(error, wanted), (offset, bit, region, error)
    assert regions == set(EXPECTED_BY_REGION) | {"metadata length", "block length", "footer offset"}


def test_checksum_mismatches_name_the_corrupt_part() -> None:
    layout = decode_layout(STANDARD)
    assert_restores_nothing(
        [flip_bit(STANDARD, 16 + 5)], ChecksumMismatchError, "metadata CRC32", "corrupt"
    )
    block = layout.block(6)
    assert block.count > 0
    error = assert_restores_nothing(
        [flip_bit(STANDARD, block.offset + 12 + 9, 3)],
        ChecksumMismatchError,
        "for key group 6",
        f"at offset {block.offset}",
        "the block is corrupt",
    )
    assert isinstance(error, ValueError)
    assert_restores_nothing(
        [flip_bit(STANDARD, layout.index_offset + 4 + 12 * 3 + 11)],
        ChecksumMismatchError,
        "index CRC32",
        "the index is corrupt",
    )
    # a payload flip is found only by a reader of that key group
    flipped = flip_bit(STANDARD, block.offset + 12 + 9, 3)
    assert read_snapshot(flipped, KeyGroupRange(0, 5)).size("state") == sum(
        b.count for b in layout.blocks if b.key_group <= 5
    )


def test_index_entry_outside_the_file_range_raises_key_group_mismatch() -> None:
    table: Table = CopyOnWriteStateTable(KeyGroupRange(2, 5), SMALL_MAXP)
    fill(
        table, None, [e for e in small_entries() if 2 <= assign_to_key_group(e[0], SMALL_MAXP) <= 5]
    )
    layout = decode_layout(written(table.snapshot()))
    for bad_group in (6, 1, -1, 9):
        index = [*layout.index, (bad_group, layout.index[1][1])]
        crafted = encode_file(layout.metadata_raw, layout.raw_blocks(), index=index)
        assert_restores_nothing(
            [crafted], KeyGroupMismatchError, "KeyGroupRange(2, 5)", f"key group {bad_group}"
        )
        # refused even by a reader of a range that does not need the bad entry
        assert type(read_error(crafted, KeyGroupRange(2, 2))) is KeyGroupMismatchError


def test_index_offset_outside_the_blocks_is_refused() -> None:
    layout = decode_layout(STANDARD)
    for offset in (0, 16, layout.data_start - 1, layout.index_offset, layout.size + 100):
        index = list(layout.index)
        index[4] = (4, offset)
        crafted = encode_file(layout.metadata_raw, layout.raw_blocks(), index=index)
        assert_restores_nothing(
            [crafted],
            TruncatedSnapshotError,
            f"expected key group 4's block between offsets "
            f"{layout.data_start} and {layout.index_offset}",
            f"the index says {offset}",
        )


def test_block_holding_another_key_group_raises_key_group_mismatch() -> None:
    layout = decode_layout(STANDARD)
    index = list(layout.index)
    index[2] = (2, layout.index[3][1])  # key group 2 -> block of 3
    crafted = encode_file(layout.metadata_raw, layout.raw_blocks(), index=index)
    assert_restores_nothing(
        [crafted],
        KeyGroupMismatchError,
        "to hold key group 2",
        "got key group 3",
        f"offset {layout.index[3][1]}",
    )
    # the block itself says 3 where the index says 2 (CRC correct)
    blocks = layout.raw_blocks()
    blocks[2] = (3, blocks[2][1], blocks[2][2])
    crafted = encode_file(layout.metadata_raw, blocks, index=layout.index)
    assert_restores_nothing(
        [crafted], KeyGroupMismatchError, "to hold key group 2", "got key group 3"
    )


def test_other_max_parallelism_raises_max_parallelism_mismatch() -> None:
    error = read_error(STANDARD, max_parallelism=128)
    assert type(error) is MaxParallelismMismatchError
    assert "expected a snapshot of max parallelism 128, got one of 10" in str(error)
    assert_restores_nothing(
        [STANDARD],
        MaxParallelismMismatchError,
        "max parallelism 128",
        "got one of 10",
        target=Prefilled(max_parallelism=128),
    )
    other = small_file_of_max_parallelism(16)
    restored = read_snapshot(STANDARD, SMALL_RANGE)
    before = copy.deepcopy(restored.states)
    error = read_error(other, SMALL_RANGE, into=restored)
    assert type(error) is MaxParallelismMismatchError
    assert "expected every file to have max parallelism 10, got 16" in str(error)
    assert restored.states == before


def small_file_of_max_parallelism(max_parallelism: int) -> bytes:
    table: Table = CopyOnWriteStateTable(KeyGroupRange(0, max_parallelism - 1), max_parallelism)
    fill(table, None, small_entries())
    return written(table.snapshot())


def metadata_of(data: bytes) -> dict[str, Any]:
    metadata: dict[str, Any] = decode_layout(data).metadata
    return metadata


def patched_metadata(**changes: Any) -> dict[str, Any]:
    metadata = metadata_of(STANDARD)
    metadata.update(changes)
    return metadata


def patched_state(**changes: Any) -> dict[str, Any]:
    metadata = metadata_of(STANDARD)
    metadata["states"] = [dict(metadata["states"][0], **changes)]
    return metadata


BAD_METADATA: list[tuple[str, Any, type[SnapshotFormatError], str]] = [
    ("empty object", {}, SnapshotFormatError, "expected valid snapshot metadata"),
    ("null", None, SnapshotFormatError, "expected valid snapshot metadata"),
    ("a list", [1, 2], SnapshotFormatError, "expected valid snapshot metadata"),
    ("a string", "heap", SnapshotFormatError, "expected valid snapshot metadata"),
    ("not JSON", b"{heap: 1", SnapshotFormatError, "Invalid JSON"),
    ("not UTF-8", b"\xff\xfe{}", SnapshotFormatError, "Invalid JSON"),
    ("extra field", patched_metadata(compression="zstd"), SnapshotFormatError, "compression"),
    (
        "missing states",
        {k: v for k, v in metadata_of(STANDARD).items() if k != "states"},
        SnapshotFormatError,
        "states",
    ),
    (
        "max parallelism 0",
        patched_metadata(max_parallelism=0),
        SnapshotFormatError,
        "max_parallelism",
    ),
    (
        "max parallelism too big",
        patched_metadata(max_parallelism=1 << 16),
        SnapshotFormatError,
        "max_parallelism",
    ),
    (
        "range of three",
        patched_metadata(key_group_range=[0, 4, 9]),
        SnapshotFormatError,
        "key_group_range",
    ),
    ("format not a string", patched_metadata(format=7), SnapshotFormatError, "format"),
    ("state id negative", patched_state(id=-1), SnapshotFormatError, "id"),
    ("state id too big", patched_state(id=1 << 15), SnapshotFormatError, "id"),
    ("empty state name", patched_state(name=""), SnapshotFormatError, "name"),
    ("unknown state field", patched_state(ttl=3), SnapshotFormatError, "ttl"),
    (
        "duplicate state names",
        patched_metadata(
            states=[
                metadata_of(STANDARD)["states"][0],
                dict(metadata_of(STANDARD)["states"][0], id=1),
            ]
        ),
        SnapshotFormatError,
        "distinct state ids and names",
    ),
    (
        "range beyond max parallelism",
        patched_metadata(key_group_range=[0, 10]),
        KeyGroupMismatchError,
        "expected a key-group range inside [0, 9], got [0, 10]",
    ),
    (
        "reversed range",
        patched_metadata(key_group_range=[6, 2]),
        KeyGroupMismatchError,
        "got [6, 2]",
    ),
    (
        "no states but entries",
        patched_metadata(states=[]),
        SnapshotFormatError,
        "expected one section per state id of [] in key group",
    ),
]


@pytest.mark.parametrize(
    ("metadata", "error", "fragment"),
    [case[1:] for case in BAD_METADATA],
    ids=[case[0] for case in BAD_METADATA],
)
def test_valid_json_that_is_not_valid_metadata(
    metadata: Any, error: type[SnapshotFormatError], fragment: str
) -> None:
    crafted = with_metadata(STANDARD, metadata)
    got = read_error(crafted)
    assert type(got) is error, repr(got)
    assert "expected" in str(got) and fragment in str(got), str(got)
    assert_restores_nothing([crafted], error, fragment)


def test_unknown_state_kind_in_metadata_is_a_format_error() -> None:
    """BUG: a kind outside STATE_KINDS passes the metadata model (``kind: str``) and
    is refused later by ``StateMetaInfo`` with InvalidArgumentError, which is not
    a SnapshotFormatError, so ``except SnapshotFormatError`` misses a corrupt file."""
    crafted = with_metadata(STANDARD, patched_state(kind="bogus"))
    error = read_error(crafted)
    assert isinstance(error, SnapshotFormatError), repr(error)
    assert "bogus" in str(error)
    # the same when the bogus state is another state of the file than the restored one
    tables, _ = multi_state_tables()
    data = written([t.snapshot() for t in tables])
    metadata = metadata_of(data)
    metadata["states"][2]["kind"] = "bogus"
    target = Prefilled(
        key_serializer=IntSerializer(),
        meta=StateMetaInfo("counts", StateKind.VALUE, StringSerializer(), IntSerializer()),
    )
    with pytest.raises(CowStateError) as excinfo:
        restore_table(target.table, [with_metadata(data, metadata)])
    assert isinstance(excinfo.value, SnapshotFormatError), repr(excinfo.value)
    target.assert_unchanged()


def test_undecodable_entries_raise_format_error() -> None:
    layout = decode_layout(STANDARD)
    blocks = layout.raw_blocks()
    kg, count, payload = blocks[4]
    assert count > 0
    sections = parse_payload(payload)
    state_id, rows = sections[0]
    rows[0] = (rows[0][0], rows[0][1], b"\x80\x05 not a pickle")
    blocks[4] = (kg, count, encode_payload([(state_id, rows), *sections[1:]]))
    crafted = encode_file(layout.metadata_raw, blocks)
    assert_restores_nothing(
        [crafted], SnapshotFormatError, "key group 4", "that its serializers can decode"
    )


def test_entry_count_that_disagrees_with_the_payload() -> None:
    layout = decode_layout(STANDARD)
    blocks = layout.raw_blocks()
    kg, count, payload = blocks[4]
    blocks[4] = (kg, count + 1, payload)
    assert_restores_nothing(
        [encode_file(layout.metadata_raw, blocks)],
        SnapshotFormatError,
        f"expected {count + 1} entries in key group 4",
        f"got {count}",
    )
    blocks[4] = (kg, count, payload[:-3])  # an entry runs past the block
    assert_restores_nothing(
        [encode_file(layout.metadata_raw, blocks)],
        TruncatedSnapshotError,
        "key group 4",
        "ends early",
    )


def test_a_state_split_over_two_sections_of_one_block_loses_nothing() -> None:
    """BUG: a block whose payload holds two sections of the same state id (counts
    and CRC consistent) is accepted, and the first section's entries are dropped
    (``out[state_id] = rows`` in SnapshotReader._parse_payload): a malformed file
    silently restores less than its header says. Expected: SnapshotFormatError."""
    layout = decode_layout(STANDARD)
    block = max(layout.blocks, key=lambda b: b.count)
    assert block.count >= 2
    [(state_id, rows)] = block.sections
    split = encode_payload([(state_id, rows[:1]), (state_id, rows[1:])])
    blocks = [(b.key_group, b.count, split if b is block else b.payload) for b in layout.blocks]
    crafted = encode_file(layout.metadata_raw, blocks)
    try:
        restored = read_snapshot(crafted, SMALL_RANGE)
    except SnapshotFormatError:
        return
    assert len(restored.states["state"][block.key_group]) == block.count, (
        "entries of the block were silently dropped"
    )


def test_serializer_mismatch_is_refused() -> None:
    assert_restores_nothing(
        [STANDARD],
        SerializerMismatchError,
        "expected the key serializer to be 'int32'",
        "written with 'cowstate-value'",
        target=Prefilled(key_serializer=IntSerializer()),
    )
    assert_restores_nothing(
        [STANDARD],
        SerializerMismatchError,
        "namespace serializer of 'state' to be 'utf8'",
        target=Prefilled(meta=StateMetaInfo(namespace_serializer=StringSerializer())),
    )
    assert_restores_nothing(
        [STANDARD],
        SerializerMismatchError,
        "state serializer of 'state' to be 'int32'",
        target=Prefilled(meta=StateMetaInfo(state_serializer=IntSerializer())),
    )
    assert_restores_nothing(
        [STANDARD],
        SerializerMismatchError,
        "of kind 'list'",
        "holds kind 'value'",
        target=Prefilled(meta=StateMetaInfo(kind=StateKind.LIST)),
    )
    # a serializer the reader does not know, named in the file
    unknown = with_metadata(STANDARD, patched_state(state_serializer="my.Serializer"))
    error = read_error(unknown)
    assert type(error) is SerializerMismatchError
    assert "got 'my.Serializer'" in str(error)


def test_files_with_different_key_serializers_are_refused_together() -> None:
    int_keys: Table = CopyOnWriteStateTable(
        KeyGroupRange(0, 4), SMALL_MAXP, key_serializer=IntSerializer()
    )
    fill(int_keys, None, [e for e in small_entries() if assign_to_key_group(e[0], SMALL_MAXP) <= 4])
    restored = read_snapshot(STANDARD, KeyGroupRange(5, 9))
    before = copy.deepcopy(restored.states)
    error = read_error(written(int_keys.snapshot()), SMALL_RANGE, into=restored)
    assert type(error) is SerializerMismatchError
    assert "expected every file to use key serializer 'cowstate-value', got 'int32'" in str(error)
    assert restored.states == before


def test_a_multi_state_file_restores_an_unknown_name_nowhere() -> None:
    tables, _ = multi_state_tables()
    data = written([t.snapshot() for t in tables])
    target = Prefilled(
        key_serializer=IntSerializer(),
        meta=StateMetaInfo("absent", StateKind.VALUE, StringSerializer(), IntSerializer()),
    )
    with pytest.raises(UnknownStateError) as excinfo:
        restore_table(target.table, [data])
    assert "expected state 'absent'" in str(excinfo.value)
    assert "['counts', 'empty', 'lists']" in str(excinfo.value)
    target.assert_unchanged()


def operator_files(max_parallelism: int, parallelism: int) -> list[bytes]:
    files = []
    for index in range(parallelism):
        key_group_range = compute_key_group_range_for_operator_index(
            max_parallelism, parallelism, index
        )
        table: Table = CopyOnWriteStateTable(key_group_range, max_parallelism)
        fill(
            table,
            None,
            [
                e
                for e in small_entries(60)
                if assign_to_key_group(e[0], max_parallelism) in key_group_range
            ],
        )
        files.append(written(table.snapshot()))
    return files


def corrupt_last(data: bytes) -> dict[str, tuple[bytes, type[CowStateError]]]:
    layout = decode_layout(data)
    block = next(b for b in reversed(layout.blocks) if b.count)
    int_keys: Table = CopyOnWriteStateTable(
        KeyGroupRange(7, 9), SMALL_MAXP, key_serializer=IntSerializer()
    )
    return {
        "payload bit": (flip_bit(data, block.offset + 14), ChecksumMismatchError),
        "truncated": (data[:-20], TruncatedSnapshotError),
        "bad magic": (b"\0" + data[1:], BadMagicError),
        "version": (data[:8] + b"\x00\x09" + data[10:], UnsupportedVersionError),
        "max parallelism": (small_file_of_max_parallelism(16), MaxParallelismMismatchError),
        "key serializer": (written(int_keys.snapshot()), SerializerMismatchError),
    }


@pytest.mark.parametrize(
    "corruption",
    ["payload bit", "truncated", "bad magic", "version", "max parallelism", "key serializer"],
)
def test_only_the_last_of_several_files_is_corrupt(corruption: str) -> None:
    good = operator_files(SMALL_MAXP, 3)
    bad, error = corrupt_last(good[2])[corruption]
    assert_restores_nothing([good[0], good[1], bad], error)
    # the good files alone restore fine
    table: Table = CopyOnWriteStateTable(SMALL_RANGE, SMALL_MAXP)
    assert restore_table(table, good) == 60


NOT_FILES: list[Any] = [5, None, "a snapshot.bin", 3.5, object()]


@pytest.mark.parametrize("thing", NOT_FILES, ids=["int", "None", "str", "float", "object"])
def test_read_snapshot_of_something_that_is_not_a_file(thing: Any) -> None:
    """BUG (today): SnapshotReader calls ``thing.read()`` on anything that is not
    bytes-like and not seekable, so an int or None raises a bare AttributeError."""
    error = read_error(thing)
    assert isinstance(error, CowStateError), repr(error)
    assert isinstance(error, TypeError | ValueError)
    assert "expected" in str(error) and type(thing).__name__ in str(error)


@pytest.mark.parametrize(
    "streams",
    [5, None, [5], [None], [STANDARD, "file.bin"]],
    ids=["int", "None", "[int]", "[None]", "[file, str]"],
)
def test_restore_table_from_something_that_is_not_files(streams: Any) -> None:
    """BUG (today): ``restore_table(t, 5)`` raises a bare TypeError ('int' object is
    not iterable) and ``restore_table(t, [None])`` a bare AttributeError."""
    target = Prefilled()
    with pytest.raises(Exception) as excinfo:  # the class is checked below
        restore_table(target.table, streams)
    assert isinstance(excinfo.value, CowStateError), repr(excinfo.value)
    assert isinstance(excinfo.value, TypeError | ValueError)
    assert "expected" in str(excinfo.value)
    target.assert_unchanged()


def test_restore_table_given_one_file_instead_of_a_list() -> None:
    """BUG (today): ``restore_table(t, data)`` iterates the bytes and raises a bare
    AttributeError ('int' object has no attribute 'read'). Either refuse it with a
    CowStateError naming what was expected, or restore the one file."""
    target = Prefilled()
    try:
        count = restore_table(target.table, STANDARD)
    except Exception as error:  # the class is checked below
        assert isinstance(error, CowStateError), repr(error)
        assert "expected" in str(error)
        target.assert_unchanged()
        return
    assert count == 20
    assert contents(small_entries()).items() <= contents(target.table).items()


# ================================================================== 8. empty cases


@pytest.mark.parametrize("cls", TABLES)
def test_a_table_without_entries_writes_a_valid_file_that_restores_nothing(cls: TableClass) -> None:
    table = cls(SMALL_RANGE, SMALL_MAXP)
    stream = io.BytesIO()
    info = write_snapshot(table.snapshot(), stream)
    data = stream.getvalue()
    layout = decode_layout(data)
    assert info.entries == 0
    assert [(b.key_group, b.count, b.payload) for b in layout.blocks] == [
        (kg, 0, b"") for kg in SMALL_RANGE
    ]
    assert read_snapshot(data, SMALL_RANGE).states == {"state": {}}
    target = Prefilled()
    assert restore_table(target.table, [data]) == 0
    target.assert_unchanged()


@pytest.mark.parametrize("cls", TABLES)
def test_an_empty_key_group_range_writes_a_file_without_blocks(cls: TableClass) -> None:
    table = cls(KeyGroupRange.EMPTY, SMALL_MAXP)
    data = written(table.snapshot())
    layout = decode_layout(data)
    assert layout.metadata["key_group_range"] == [0, -1]
    assert layout.blocks == [] and layout.index == []
    assert layout.index_offset == layout.data_start
    reader = SnapshotReader(data)
    assert reader.offsets == {} and reader.metadata.range == KeyGroupRange.EMPTY
    assert read_snapshot(data, SMALL_RANGE).states == {"state": {}}
    assert read_snapshot(data, KeyGroupRange.EMPTY).states == {"state": {}}
    target = Prefilled()
    assert restore_table(target.table, [data]) == 0
    target.assert_unchanged()
    empty_target = cls(KeyGroupRange.EMPTY, SMALL_MAXP)
    assert restore_table(empty_target, [STANDARD]) == 0
    assert len(empty_target) == 0


def test_several_states_in_one_file_restore_each_by_name() -> None:
    tables, models = multi_state_tables()
    data = written([t.snapshot() for t in tables])
    restored = read_snapshot(data, SMALL_RANGE, key_serializer=IntSerializer())
    assert sorted(restored.states) == ["counts", "empty", "lists"]
    for table, model in zip(tables, models, strict=True):
        name = table.meta.name
        assert restored_contents(restored, name) == contents(model)
        assert restored.metas[name].kind == table.meta.kind
        fresh = TABLES[1](SMALL_RANGE, SMALL_MAXP, meta=table.meta, key_serializer=IntSerializer())
        assert restore_table(fresh, [data]) == len(model)
        assert contents(fresh) == contents(model)
    assert restored.states["empty"] == {}


def test_a_multi_state_file_must_share_one_range() -> None:
    a: Table = CopyOnWriteStateTable(KeyGroupRange(0, 4), SMALL_MAXP, meta=StateMetaInfo("a"))
    b: Table = CopyOnWriteStateTable(KeyGroupRange(0, 5), SMALL_MAXP, meta=StateMetaInfo("b"))
    snapshots = [a.snapshot(), b.snapshot()]
    with pytest.raises(InvalidArgumentError, match="expected every table snapshot to cover"):
        write_snapshot(snapshots, io.BytesIO())
    assert all(s.is_released for s in snapshots)


def test_a_multi_state_file_must_share_one_key_serializer() -> None:
    """BUG: write_snapshot records only the first table's key serializer
    (``_metadata_of``) but writes every state's keys with its own. A second state
    with utf8 keys is then decoded as int32: the key 'abcd' comes back as
    1633837924, silently. Expected: InvalidArgumentError when writing (as for
    differing ranges), or keys that read back as written."""
    a: Table = CopyOnWriteStateTable(
        SMALL_RANGE, SMALL_MAXP, meta=StateMetaInfo("a"), key_serializer=IntSerializer()
    )
    b: Table = CopyOnWriteStateTable(
        SMALL_RANGE, SMALL_MAXP, meta=StateMetaInfo("b"), key_serializer=StringSerializer()
    )
    a.put(1, "ns", 1)
    b.put("abcd", "ns", 2)
    stream = io.BytesIO()
    try:
        write_snapshot([a.snapshot(), b.snapshot()], stream)
    except InvalidArgumentError as error:
        assert "key serializer" in str(error)
        return
    restored = read_snapshot(stream.getvalue(), SMALL_RANGE)
    assert [(k, n, s) for _, k, n, s in restored.entries("b")] == [("abcd", "ns", 2)]


# ======================================================== the C codec's writer and reader
# cowstate.snapshot.ccodec.CODEC is the C codec when built; None runs the Python loops
# (the reference). Both write the same bytes and read the same entries, or fail alike.


class RowsSerializer(DefaultSerializer):
    """A user serializer (not built in) returning a bytearray: the writer frames rows."""

    __slots__ = ()
    identifier = "rows"

    def serialize(self, state: Any) -> Any:
        return bytearray(super().serialize(state))


class TextSerializer(DefaultSerializer):
    """A broken user serializer returning a str for some states."""

    __slots__ = ()
    identifier = "text"

    def serialize(self, state: Any) -> Any:
        return "not bytes" if state == 13 else super().serialize(state)


class ShoutingDeserializer(DefaultSerializer):
    """A user deserializer (the value codec's identifier, so files of the
    default serializer restore with it) refusing some bytes with its own error."""

    __slots__ = ()

    def deserialize(self, data: bytes | bytearray | memoryview) -> Any:
        value = super().deserialize(data)
        if value == 13:
            raise ValueError("thirteen")
        return value


CODEC_KEYS: dict[str, tuple[StateSerializer, st.SearchStrategy[Any]]] = {
    "default": (DefaultSerializer(), st.integers(-(2**70), 2**70) | st.text(max_size=6)),
    "int32": (IntSerializer(), st.integers(-(2**31), 2**31 - 1)),
    "int64": (LongSerializer(), st.integers(-(2**63), 2**63 - 1) | st.just(2**63)),
    "utf8": (StringSerializer(), st.text(st.integers(0xD800, 0xDFFF).map(chr) | st.characters())),
    "bytes": (BytesSerializer(), st.binary(max_size=8)),
    "pickle": (PickleSerializer(), st.integers()),
}
CODEC_NAMESPACES: dict[str, tuple[StateSerializer, st.SearchStrategy[Any]]] = {
    "default": (DefaultSerializer(), st.sampled_from([VOID_NAMESPACE, "w1", "é", 7, (1, "x")])),
    "utf8": (StringSerializer(), st.sampled_from(["", "w", "\ud800é😀"])),
    "rows": (RowsSerializer(), st.sampled_from(["a", VOID_NAMESPACE])),
}
CODEC_STATES: dict[str, tuple[StateSerializer, st.SearchStrategy[Any]]] = {
    "default": (DefaultSerializer(), CODEC_VALUES),
    "immutable": (ImmutableSerializer(), CODEC_VALUES),
    "default, falling back": (
        DefaultSerializer(),
        st.sampled_from([bytearray(b"x"), [bytearray(b"q")], (SubInt(1),), {"k": SubInt(2)}]),
    ),
    "pickle": (PickleSerializer(), CODEC_VALUES | st.builds(SubInt, st.integers())),
    "rows": (RowsSerializer(), CODEC_VALUES),
    "text": (TextSerializer(), st.integers(10, 15)),
    "shouting": (ShoutingDeserializer(), st.integers(10, 15)),
    "int32": (IntSerializer(), st.integers(-(2**31), 2**31 - 1) | st.just(True)),
    "bytes": (BytesSerializer(), st.binary(max_size=4)),
}


def outcome(run: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", result) or ("error", (class, message, cause class))."""
    try:
        return ("ok", run())
    except Exception as exc:
        cause = type(exc.__cause__) if exc.__cause__ is not None else None
        return ("error", (type(exc), str(exc), cause))


def both_ways(run: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """``run`` with the C codec, then with the Python loops."""
    with_c = outcome(run)
    with monkeypatch.context() as patch:
        patch.setattr(ccodec, "CODEC", None)
        with_python = outcome(run)
    return with_c, with_python


def canon_entries(restored: RestoredSnapshot) -> Any:
    return {
        name: sorted(
            (kg, repr(canon(k)), repr(canon(n)), repr(canon(s)))
            for kg, k, n, s in restored.entries(name)
        )
        for name in restored.blocks
    }


@st.composite
def codec_snapshots(draw: st.DrawFn) -> tuple[TableClass, str, str, str, list[Any]]:
    key_name = draw(st.sampled_from(list(CODEC_KEYS)))
    ns_name = draw(st.sampled_from(list(CODEC_NAMESPACES)))
    state_name = draw(st.sampled_from(list(CODEC_STATES)))
    entries = draw(
        st.lists(
            st.tuples(
                CODEC_KEYS[key_name][1], CODEC_NAMESPACES[ns_name][1], CODEC_STATES[state_name][1]
            ),
            max_size=40,
        )
    )
    return draw(st.sampled_from(TABLES)), key_name, ns_name, state_name, entries


@needs_codec
@given(codec_snapshots())
def test_the_c_codec_writes_and_reads_the_python_loops_bytes_and_entries(
    case: tuple[TableClass, str, str, str, list[Any]],
) -> None:
    check_codec_file(ccodec.CODEC, *case)


def check_codec_file(
    codec: Any, cls: TableClass, key_name: str, ns_name: str, state_name: str, entries: list[Any]
) -> None:
    """The differential check: one table, two snapshots, one written with ``codec``
    and one by the Python loops; the files are equal (or both writes fail alike),
    and the C reader and the Python reader read them alike."""
    key_ser = CODEC_KEYS[key_name][0]
    meta = StateMetaInfo(
        "state", StateKind.VALUE, CODEC_NAMESPACES[ns_name][0], CODEC_STATES[state_name][0]
    )
    table: Table = cls(SMALL_RANGE, SMALL_MAXP, meta=meta, key_serializer=key_ser)
    for key, namespace, state in entries:
        # refused: a key of another type than the first, or without a key group
        with contextlib.suppress(CowStateError):
            table.put(key, namespace, state)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ccodec, "CODEC", codec)
        first, second = table.snapshot(), table.snapshot()
        with_c = outcome(lambda: written(first))
        patch.setattr(ccodec, "CODEC", None)
        with_python = outcome(lambda: written(second))
        assert with_c == with_python
        if with_c[0] != "ok":
            return
        data = with_c[1]

        def read() -> Any:
            restored = read_snapshot(
                data, SMALL_RANGE, metas={"state": meta}, key_serializer=key_ser
            )
            return canon_entries(restored)

        by_python = outcome(read)
        patch.setattr(ccodec, "CODEC", codec)
        by_c = outcome(read)
        assert by_c == by_python


@needs_codec
@pytest.mark.parametrize("cls", TABLES)
def test_a_value_the_c_codec_hands_back_is_written_by_its_python_serializer(
    cls: TableClass,
) -> None:
    """In one file, beside C-encoded entries: a bytearray state (the value codec
    writes it as bin), a subclass under pickle, rows of a bytearray serializer."""
    for state_name, states in [
        ("default, falling back", [1, bytearray(b"x"), "é", [bytearray(b"ab")], (2,)]),
        ("pickle", [1, SubInt(2), "é"]),
        ("rows", [1, "é", (1, 2)]),
    ]:
        entries = [(i, VOID_NAMESPACE, s) for i, s in enumerate(states)]
        check_codec_file(ccodec.CODEC, cls, "default", "default", state_name, entries)
        # the same on the first, a middle and the last entry of a key group
        check_codec_file(ccodec.CODEC, cls, "int32", "utf8", state_name, entries[::-1])


class RecordingSerializer(DefaultSerializer):
    """Records every call (the role is the serializer's name)."""

    __slots__ = ("calls", "role")
    identifier = "recording"

    def __init__(self, role: str, calls: list[tuple[str, Any]]) -> None:
        self.role = role
        self.calls = calls

    def serialize(self, state: Any) -> bytes:
        self.calls.append((self.role, state))
        return super().serialize(state)


@needs_codec
def test_the_c_writer_calls_each_python_serializer_once_per_value_in_the_python_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, Any]] = []
    meta = StateMetaInfo(
        "state",
        StateKind.VALUE,
        RecordingSerializer("namespace", calls),
        RecordingSerializer("state", calls),
    )
    table: Table = CopyOnWriteStateTable(
        SMALL_RANGE, SMALL_MAXP, meta=meta, key_serializer=RecordingSerializer("key", calls)
    )
    fill(table, None, small_entries(30))

    def write() -> tuple[bytes, list[tuple[str, Any]]]:
        calls.clear()
        data = written(table.snapshot())
        return data, list(calls)

    with_c, with_python = both_ways(write, monkeypatch)
    assert with_c == with_python
    assert len(with_c[1][1]) == 3 * 30


@needs_codec
@pytest.mark.parametrize("at", ["first", "middle", "last"])
def test_a_serializers_error_propagates_from_the_c_writer_as_from_the_python_one(
    at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = [(i, VOID_NAMESPACE, 10 + i) for i in range(5)]
    bad = {"first": 0, "middle": 2, "last": 4}[at]
    cases: list[tuple[StateSerializer, tuple[int, Any, Any]]] = [
        (TextSerializer(), (bad, VOID_NAMESPACE, 13)),  # a str: b"".join fails
        (DefaultSerializer(), (bad, VOID_NAMESPACE, SubInt(13))),  # UnsupportedValueError
        (IntSerializer(), (bad, VOID_NAMESPACE, 2**40)),  # InvalidArgumentError
    ]
    for state_ser, refused in cases:
        entries[bad] = refused
        meta = StateMetaInfo("state", StateKind.VALUE, DefaultSerializer(), state_ser)
        table: Table = CopyOnWriteStateTable(KeyGroupRange(0, 0), 1, meta=meta)
        fill(table, None, entries)

        def write(table: Table = table) -> bytes:
            return written(table.snapshot())

        with_c, with_python = both_ways(write, monkeypatch)
        assert with_c == with_python
        assert with_c[0] == "error"


def crafted_state_file(states: list[bytes], *, keys: list[bytes] | None = None) -> bytes:
    """A one-state file of one key group (max parallelism 1) whose entries hold
    the given state bytes (int keys 0.. by default, namespace VOID_NAMESPACE)."""
    meta = StateMetaInfo("state", StateKind.VALUE, DefaultSerializer(), DefaultSerializer())
    table: Table = CopyOnWriteStateTable(KeyGroupRange(0, 0), 1, meta=meta)
    fill(table, None, [(i, VOID_NAMESPACE, i) for i in range(len(states))])
    layout = decode_layout(written(table.snapshot()))
    [block] = layout.blocks
    [(state_id, rows)] = block.sections
    by_key = {value_codec.decode(key): (ns, key) for ns, key, _ in rows}
    new_rows = [
        (by_key[i][0], keys[i] if keys else by_key[i][1], data) for i, data in enumerate(states)
    ]
    payload = encode_payload([(state_id, new_rows)])
    return encode_file(layout.metadata_raw, [(0, len(new_rows), payload)])


def good_state(i: int) -> bytes:
    return value_codec.encode(f"state {i}")


BROKEN_ENTRIES: dict[str, bytes] = {
    "undecodable state": b"\x01\xc1",
    "a version byte of another codec": b"\x80\x05K\x01.",
    "a None state (E1)": value_codec.encode(None),
    "a truncated map": b"\x01\x82\x01",
    "a timestamp the C decoder hands back": b"\x01\xd6\xff\x00\x00\x00\x01",  # decodes
    "thirteen, refused by a user deserializer": value_codec.encode(13),
}


@needs_codec
@pytest.mark.parametrize("at", ["first", "middle", "last"])
@pytest.mark.parametrize("broken", list(BROKEN_ENTRIES))
def test_the_c_reader_refuses_an_entry_as_the_python_reader_does(
    broken: str, at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    states = [good_state(i) for i in range(5)]
    states[{"first": 0, "middle": 2, "last": 4}[at]] = BROKEN_ENTRIES[broken]
    data = crafted_state_file(states)
    for state_ser in (DefaultSerializer(), ShoutingDeserializer()):
        meta = StateMetaInfo("state", StateKind.VALUE, DefaultSerializer(), state_ser)

        def read(meta: StateMetaInfo = meta) -> Any:
            restored = read_snapshot(data, KeyGroupRange(0, 0), metas={"state": meta})
            return canon_entries(restored)

        with_c, with_python = both_ways(read, monkeypatch)
        assert with_c == with_python
        refused = not broken.startswith(("a timestamp", "thirteen")) or (
            broken.startswith("thirteen") and type(state_ser) is ShoutingDeserializer
        )
        assert with_c[0] == ("error" if refused else "ok"), with_c


@needs_codec
@pytest.mark.parametrize("at", ["first", "middle", "last"])
def test_the_c_reader_stops_at_a_cut_entry_as_the_python_reader_does(
    at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    states = [good_state(i) for i in range(5)]
    data = crafted_state_file(states)
    layout = decode_layout(data)
    [block] = layout.blocks
    [(state_id, rows)] = block.sections
    cut = {"first": 0, "middle": 2, "last": 4}[at]
    payload = encode_payload([(state_id, rows)])
    framed = len(encode_payload([(state_id, rows[: cut + 1])]))
    for shortened in (payload[: framed - 2], payload[: framed - 5] + b"\xff\xff\xff\xff"):
        crafted = encode_file(layout.metadata_raw, [(0, 5, shortened)])

        def read(crafted: bytes = crafted) -> int:
            return read_snapshot(crafted, KeyGroupRange(0, 0)).size("state")

        with_c, with_python = both_ways(read, monkeypatch)
        assert with_c == with_python
        assert with_c[0] == "error"


@needs_codec
def test_a_keyboard_interrupt_in_a_deserializer_passes_the_c_reader_unwrapped() -> None:
    class Interrupting(DefaultSerializer):
        __slots__ = ()

        def deserialize(self, data: bytes | bytearray | memoryview) -> Any:
            raise KeyboardInterrupt

    data = crafted_state_file([good_state(0)])
    meta = StateMetaInfo("state", StateKind.VALUE, DefaultSerializer(), Interrupting())
    with pytest.raises(KeyboardInterrupt):
        read_snapshot(data, KeyGroupRange(0, 0), metas={"state": meta})


@needs_codec
@pytest.mark.parametrize("bug", CODEC_BUGS, ids=lambda bug: bug.name)
def test_the_file_differential_catches_the_planted_codec_bug(bug: Any) -> None:
    bad = build_codec(bug)

    @hunt_settings(max_examples=200, stateful_step_count=1)
    @given(codec_snapshots())
    def differential(case: tuple[TableClass, str, str, str, list[Any]]) -> None:
        check_codec_file(bad, *case)

    with pytest.raises(AssertionError):
        differential()
    check_codec_file(build_codec(), CopyOnWriteStateTable, "utf8", "utf8", "default", [])


@needs_codec
@pytest.mark.parametrize("ns_name", ["default", "utf8"])
def test_the_c_reader_reuses_a_namespace_only_for_the_same_bytes(
    ns_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of one namespace skip its parse; namespaces whose bytes have the same
    length (and the same length prefix) are not the same namespace."""
    ns_ser = CODEC_NAMESPACES[ns_name][0]
    meta = StateMetaInfo("state", StateKind.VALUE, ns_ser, DefaultSerializer())
    table: Table = CopyOnWriteStateTable(KeyGroupRange(0, 0), 1, meta=meta)
    fill(table, None, [(0, "a", "x")])
    layout = decode_layout(written(table.snapshot()))
    names = ["a", "b", "b", "a", "c", "c", "a"]
    entries = [(k, ns, f"{k}{ns}") for k, ns in enumerate(names)]
    rows = [
        (ns_ser.serialize(ns), value_codec.encode(k), value_codec.encode(s)) for k, ns, s in entries
    ]
    data = encode_file(layout.metadata_raw, [(0, len(rows), encode_payload([(0, rows)]))])

    def read() -> Any:
        restored = read_snapshot(data, KeyGroupRange(0, 0), metas={"state": meta})
        return restored_contents(restored)

    with_c, with_python = both_ways(read, monkeypatch)
    assert with_c == with_python == ("ok", contents(entries))


@needs_codec
@pytest.mark.parametrize("at", ["none", "first", "middle", "last"])
@pytest.mark.parametrize("needs", ["a list state", "a value handed back", "a big int"])
def test_a_long_section_framed_without_the_gil_is_the_python_loops_bytes(
    at: str, needs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One key group of 3,000 entries (the C writer releases the GIL from 1,024
    on): immutable states, and one that needs the GIL back (or, a big int, does
    not) first, in the middle or last."""
    entries: list[tuple[Any, Any, Any]] = [
        (i, VOID_NAMESPACE if i % 7 else "é", (i, f"s{i}é", b"x" * (i % 5), 0.5))
        for i in range(3000)
    ]
    if at != "none":
        where = {"first": 0, "middle": 1500, "last": 2999}[at]
        special = {"a list state": [1, 2], "a value handed back": bytearray(b"q")}
        entries[where] = (where, VOID_NAMESPACE, special.get(needs, 2**100))
    table: Table = CopyOnWriteStateTable(KeyGroupRange(0, 0), 1)
    fill(table, None, entries)

    def write() -> bytes:
        return written(table.snapshot())

    with_c, with_python = both_ways(write, monkeypatch)
    assert with_c == with_python
    assert with_c[0] == "ok"
    restored = read_snapshot(with_c[1], KeyGroupRange(0, 0))
    expected = [
        (k, n, bytes(s) if type(s) is bytearray else s) for k, n, s in entries
    ]  # the value codec writes a bytearray as bin: it comes back as bytes
    assert restored_contents(restored) == contents(expected)
