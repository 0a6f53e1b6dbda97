"""Snapshot files (``cowstate.snapshot``) against the model and against their own docs.

- round trips: what a file holds is the model's snapshot taken at the same
  moment, whatever the live table does between ``snapshot()`` and the write;
- the format: an independent decoder and encoder written here from the module
  docstring's byte table parse (and rebuild, byte for byte) what the writer wrote;
- seeking: a reader reads the header, the index and the blocks it restores;
- rescaling as in Flink's ``StateBackendTestBase.testKeyGroupSnapshotRestore``;
- snapshot transformers, per-key-group release (also on failure and cancel);
- corrupt input: the precise ``SnapshotFormatError`` subclass, and a table that
  already held mappings is exactly as it was (nothing restored);
- the reader's checks, word for word (section 9): files crafted from the
  documented layout (so every CRC of a crafted block can be valid while its
  contents are not), cut or corrupted, and the decoding loop. Those tests are
  marked ``kills``: written to kill mutants of ``cowstate.snapshot.reader``
  (``make mutate SCOPE=tables``), named in their comments as ``<function>
  <n>``, short for ``cowstate.snapshot.reader.xǁSnapshotReaderǁ<function>__mutmut_<n>``
  (the methods) or ``cowstate.snapshot.reader.x_<function>__mutmut_<n>`` (the
  module's functions);
- the snapshot writer in C (``impl/cowstate/_writer.c``, the last section):
  its files against the Python loops' byte for byte (Hypothesis, chunk
  walks, rehashing maps), beside an owner changing the table and a contract
  breaker mutating list states in place, and its planted bugs;
- the writer, block by block, and ``read_snapshot`` / ``restore_table`` word
  for word (sections 10 and 11): files written by :func:`write_snapshot` or
  :class:`SnapshotWriter` (crafted ones with :func:`restore_support.craft`, so
  every CRC and the index are valid) and read back through the public API;
  those tests are marked ``kills`` for ``cowstate.snapshot.writer`` and
  ``cowstate.snapshot.restore``, their mutants named in their comments.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import gc
import io
import json
import os
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
from conftest import HEAP_TABLES as TABLES
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from restore_support import SER, craft
from test_value_codec import VALUES as CODEC_VALUES
from test_value_codec import canon

import cowstate
from cowstate import VOID_NAMESPACE, value_codec
from cowstate.errors import (
    BadMagicError,
    ChecksumMismatchError,
    CowStateError,
    DuplicateMappingError,
    InvalidArgumentError,
    KeyGroupMismatchError,
    KeyTypeMismatchError,
    MaxParallelismMismatchError,
    MixedKeyTypesError,
    SerializerMismatchError,
    SnapshotCancelledError,
    SnapshotEntryError,
    SnapshotFormatError,
    TruncatedSnapshotError,
    UnknownStateError,
    UnsupportedVersionError,
)
from cowstate.heap_incremental import IncrementalOptions, held_removals, write_removals
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
    SnapshotMetadata,
    SnapshotReader,
    SnapshotWriter,
    StateMetadata,
    ccodec,
    read_snapshot,
    restore_table,
    write_snapshot,
)
from cowstate.snapshot.checks import DecodedBlock, EntryDecoder
from cowstate.snapshot.format import RawEntry
from cowstate.state_meta import MAX_STATES, SnapshotFormat, StateKind, StateMetaInfo
from cowstate.state_table import (
    CopyOnWriteStateTable,
    CopyOnWriteStateTableSnapshot,
    NestedMapsStateTable,
    StateTable,
    StateTableSnapshot,
)
from cowstate_model.key_groups import assign_to_key_group as model_key_group
from cowstate_model.state_table import ReferenceStateTable
from cowstate_spec.bad_codecs import CODEC_BUGS, WRITER_BUGS, build_codec
from cowstate_spec.contract import mutate_in_place
from cowstate_spec.profiles import hunt_settings

needs_codec = pytest.mark.skipif(
    ccodec.CODEC is None,
    reason="the C codec is not built or COWSTATE_PURE_PYTHON is set (test_c_codec.py)",
)
#: The planted bugs of the encoder (the reader's: tests/test_spec_catches_bad_checks.py).
ENCODER_BUGS = [bug for bug in CODEC_BUGS if bug.part == "encoder"]


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


class OwnerPacedStream(io.BytesIO):
    """A stream whose every write first waits (at most 10 s) until the owner's
    ``progress()`` moved since the previous write."""

    def __init__(self, progress: Callable[[], int]) -> None:
        super().__init__()
        self._progress = progress
        self._last = progress()
        self.paced = 0

    def write(self, data: Any) -> int:
        deadline = time.monotonic() + 10
        while self._progress() == self._last and time.monotonic() < deadline:
            time.sleep(0.0002)
        self._last = self._progress()
        self.paced += 1
        return super().write(data)


@needs_codec
@pytest.mark.parametrize("breaks_contract", [False, True], ids=["owner", "contract-breaker"])
def test_the_c_writer_writes_the_snapshot_while_the_owner_changes_the_table(
    breaks_contract: bool,
) -> None:
    """The owner puts, removes and mutates what get() hands out while the C writer
    frames (mostly without the GIL): the file is the snapshot. A contract breaker
    also mutates, in place, list states it got before the snapshot (appends,
    clears, regrows): their entries may hold either contents, every other entry
    is the snapshot's, and the file reads back (make sanitize runs this under
    ASan: no read of freed memory either)."""
    table, model = make_pair(CopyOnWriteStateTable, KeyGroupRange(0, 15), 16)
    entries: list[tuple[Any, Any, Any]] = [
        (k, "ns" if k % 2 else VOID_NAMESPACE, ([k, "é"], (k, f"s{k}"), k, f"é{k}", b"b")[k % 5])
        for k in range(12000)
    ]
    fill(table, model, entries)
    kept: dict[int, list[Any]] = {}  # the live lists, got before the snapshot
    for k, ns, _ in entries[::5]:
        got = table.get(k, ns)
        assert isinstance(got, list)
        kept[k] = got
    snapshot = table.snapshot()
    expected = dict(model.snapshot().contents)
    progress = [0]  # the owner's steps so far
    # 16 KiB blocks, each written only once the owner made a step since the last:
    # the owner runs while the writer writes however loaded the machine is
    # (a writer scheduled alone once wrote the whole file before the owner's
    # first step, and the test failed at a load of 8).
    stream = OwnerPacedStream(lambda: progress[0])
    failures: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            write_snapshot(snapshot, stream, buffer_size=16 * 1024)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    steps = 0
    while not done.is_set():
        progress[0] = steps
        k = (steps * 7) % 12000
        ns = "ns" if k % 2 else VOID_NAMESPACE
        if steps % 4 == 0:
            table.put(k, ns, [k, "new"])
        elif steps % 4 == 1 and isinstance(got := table.get(k, ns), list):
            got.append(steps)  # a copy-on-write copy: the snapshot keeps its own
        elif steps % 4 == 2:
            table.remove(k + 1, "ns" if (k + 1) % 2 else VOID_NAMESPACE)
        if breaks_contract:
            broken = kept[(steps * 5) % 12000]
            if steps % 2:
                broken.extend(range(64))
            else:
                broken.clear()
        steps += 1
    writer.join()
    assert failures == []
    assert steps > 1, "the owner never ran while the writer wrote"
    assert stream.paced > 1, f"the writer wrote {stream.paced} block(s), expected several"
    restored = restored_contents(read_snapshot(stream.getvalue(), KeyGroupRange(0, 15)))
    assert restored.keys() == expected.keys()
    for (key, namespace), state in restored.items():
        if breaks_contract and key in kept:
            assert isinstance(state, list)  # the old, the new or a later contents
        else:
            assert state == expected[key, namespace], (key, namespace)


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
            write_snapshot(snapshot, stream, buffer_size=0)  # positions move block by block
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
        self.at: list[int] = []  # where each write started

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
        self.at.append(self.tell())
        return super().write(data)


@pytest.mark.parametrize("cls", TABLES)
def test_every_key_group_is_released_as_soon_as_it_is_written(cls: TableClass) -> None:
    check_release_order(cls, ccodec.CODEC)


def check_release_order(cls: TableClass, codec: Any) -> None:
    table = filled_table(cls)
    snapshot = table.snapshot()
    stream = ReleaseWatchingStream(snapshot, table)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ccodec, "CODEC", codec)
        write_snapshot(snapshot, stream, buffer_size=0)  # every block goes to the stream at once
    blocks = decode_layout(stream.getvalue()).blocks
    assert [b.key_group for b in blocks] == list(table.key_group_range)
    # at each write, exactly the key groups whose blocks were written before it
    # are released (the Python loops write a block in three writes, the C writer in one)
    expected = [tuple(b.key_group for b in blocks if b.offset + b.size <= at) for at in stream.at]
    assert stream.seen == expected
    assert stream.at[0] == 0 and {b.offset for b in blocks} <= set(stream.at)
    assert stream.seen[-1] == tuple(table.key_group_range)  # the footer
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
        write_snapshot(snapshot, stream, cancel=cancel, buffer_size=0)
    assert isinstance(excinfo.value, CancelledError)
    assert "before key group 5 was written" in str(excinfo.value)
    assert len(stream.getvalue()) == layout.block(5).offset
    assert_all_released(table, snapshot)


def test_without_release_a_failed_write_leaves_the_rest_to_the_caller() -> None:
    table = filled_table(CopyOnWriteStateTable)
    layout = decode_layout(small_file(40))
    snapshot = table.snapshot()
    with pytest.raises(OSError):
        write_snapshot(
            snapshot, FailingStream(layout.block(3).offset + 5), release=False, buffer_size=0
        )
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


# It absorbed test_files_of_different_key_serializers_are_refused_together
# (restore._decode 25-27): the message compared whole.
@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_files_with_different_key_serializers_are_refused_together() -> None:
    int_keys: Table = CopyOnWriteStateTable(
        KeyGroupRange(0, 4), SMALL_MAXP, key_serializer=IntSerializer()
    )
    fill(int_keys, None, [e for e in small_entries() if assign_to_key_group(e[0], SMALL_MAXP) <= 4])
    restored = read_snapshot(STANDARD, KeyGroupRange(5, 9))
    before = copy.deepcopy(restored.states)
    error = read_error(written(int_keys.snapshot()), SMALL_RANGE, into=restored)
    assert type(error) is SerializerMismatchError
    assert str(error) == "expected every file to use key serializer 'cowstate-value', got 'int32'"
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


# ==================================================== 9. the reader, word for word

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


def _footer(index_at: int, magic: bytes = END_MAGIC) -> bytes:
    return struct.pack(">Q8s", index_at, magic)


def _patch(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new) :]


#: A block as its header counts it, crafted: (entry count, payload).
BlockParts = tuple[int, bytes]


def _section(state_id: int, rows: Sequence[Row], count: int | None = None) -> bytes:
    """One state's section of a payload (:func:`encode_payload`), its entry
    count ``count`` if given instead of the rows'."""
    payload = encode_payload([(state_id, list(rows))])
    return payload if count is None else struct.pack(">HI", state_id, count) + payload[6:]


def _block(*sections: tuple[int, Sequence[Row]]) -> BlockParts:
    """A well-formed block of ``(state id, rows)`` sections."""
    return (
        sum(len(rows) for _, rows in sections),
        encode_payload([(state_id, list(rows)) for state_id, rows in sections]),
    )


def _encode(
    metadata: SnapshotMetadata,
    blocks: Mapping[int, BlockParts] | None = None,
    *,
    raw_metadata: bytes | None = None,
) -> bytes:
    """A snapshot file of ``metadata`` with ``blocks[kg]`` in the block of key
    group ``kg`` (an empty block for the others), every CRC valid
    (:func:`encode_file`, the documented layout)."""
    blocks = blocks or {}
    raw = metadata.model_dump_json().encode() if raw_metadata is None else raw_metadata
    start, end = metadata.key_group_range
    return encode_file(raw, [(kg, *blocks.get(kg, (0, b""))) for kg in range(start, end + 1)])


def _with_index(data: bytes, entries: Sequence[tuple[int, int]]) -> bytes:
    """``data`` with another index (valid CRC) in the place of its own."""
    layout = decode_layout(data)
    return encode_file(layout.metadata_raw, layout.raw_blocks(), index=entries)


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


BLOCKS: dict[int, BlockParts] = {
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


# ----------------------------------------------------- the reader: valid files


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_the_test_encoder_writes_what_the_writer_writes() -> None:
    # A sanity pin for the files below: _encode is the documented layout, and
    # SnapshotWriter writes the same bytes (so the reader tests read real files).
    stream = io.BytesIO()
    writer = SnapshotWriter(stream, _metadata())
    writer.write_key_group(1, {0: ROWS_1_COUNTS, 1: ROWS_1_NAMES})
    writer.write_key_group(2, {0: ROWS_2_COUNTS})
    writer.finish()
    assert stream.getvalue() == _encode(_metadata(), BLOCKS)


@pytest.mark.kills(module="cowstate.snapshot.reader")
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_bytes_bytearray_and_memoryview_read_alike(data: bytes, kind: type[Any]) -> None:
    # __init__ 1-3 (the bytes branch), 19-26, 28, 29; _read_at 2-5, 8-11;
    # _read_block, _read_metadata, _read_index: the arithmetic of a valid file.
    reader = SnapshotReader(kind(data))
    assert reader.size == len(data)
    assert reader.metadata == _metadata()
    assert reader.offsets == dict(decode_layout(data).index)
    assert list(reader.offsets) == [0, 1, 2, 3]
    assert reader.read_key_group(0) == {}
    assert reader.read_key_group(1) == {0: ROWS_1_COUNTS, 1: ROWS_1_NAMES}
    assert reader.read_key_group(2) == {0: ROWS_2_COUNTS}
    assert reader.read_key_group(3) == {}
    assert reader.read_key_group(4) == {}  # not in the file


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_stream_with_only_a_read_method_is_read_into_memory(data: bytes) -> None:
    # _seekable 2 (a stream without seekable() is not seekable).
    reader = SnapshotReader(_ReadOnly(data))  # type: ignore[arg-type]
    assert reader.read_key_group(1) == {0: ROWS_1_COUNTS, 1: ROWS_1_NAMES}


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


# ------------------------------------------------ the reader: header, metadata


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_file_shorter_than_its_header_names_its_size(data: bytes) -> None:
    # _read_metadata 2.
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(data[:5])
    assert (
        str(caught.value) == "expected a snapshot file of at least its 16-byte header, got 5 bytes"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_file_of_only_its_header_is_short_of_its_metadata(data: bytes) -> None:
    # _read_metadata 1 (a 16-byte file has its header), 21, 25, 26 (what the read names).
    length = decode_layout(data).data_start - 20
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(data[:16])
    assert str(caught.value) == (
        f"expected {length} bytes of the metadata at offset 16, but the file has 16 bytes"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_metadata_length_past_the_end_names_the_metadata(data: bytes) -> None:
    # _read_at 1, 4, 6 (the size check comes first), _read_metadata 21, 25, 26.
    corrupt = _patch(data, 12, _u32(0xFFFFFFFF))
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected 4294967295 bytes of the metadata at offset 16, but the file has "
        f"{len(data)} bytes"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_metadata_that_fills_the_file_leaves_no_room_for_its_crc(data: bytes) -> None:
    # _read_metadata 31, 37, 38, 39: the CRC32 read names "the metadata CRC32".
    corrupt = _patch(data, 12, _u32(len(data) - 16))
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected 4 bytes of the metadata CRC32 at offset {len(data)}, but the file has "
        f"{len(data)} bytes"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_wrong_magic_is_named(data: bytes) -> None:
    # _read_metadata 14, 15.
    with pytest.raises(BadMagicError) as caught:
        SnapshotReader(b"NOTASNAP" + data[8:])
    assert str(caught.value) == (
        "expected the magic bytes b'\\x89CWSNAP\\n', got b'NOTASNAP': not a cowstate snapshot file"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_an_unknown_version_is_named(data: bytes) -> None:
    # _read_metadata 16, 17.
    with pytest.raises(UnsupportedVersionError) as caught:
        SnapshotReader(_patch(data, 8, struct.pack(">H", 7)))
    assert str(caught.value) == "expected snapshot format version 1, got 7"


@pytest.mark.kills(module="cowstate.snapshot.reader")
@pytest.mark.parametrize("at", [10, 20], ids=["flags", "metadata"])
def test_a_corrupt_header_or_metadata_fails_the_metadata_crc(data: bytes, at: int) -> None:
    # _read_metadata 54-57 (and 44-48: the header, flags included, is in the CRC).
    corrupt = _patch(data, at, bytes([data[at] ^ 0x01]))
    end = decode_layout(data).data_start - 4
    (stored,) = struct.unpack_from(">I", data, end)
    actual = zlib.crc32(corrupt[:end])
    with pytest.raises(ChecksumMismatchError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected metadata CRC32 {stored:#010x}, got {actual:#010x}: the header or metadata "
        "is corrupt"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_metadata_that_is_not_a_snapshot_metadata_names_the_validation_error() -> None:
    # _read_metadata 58, 59, 60.
    raw = b'{"max_parallelism": 0}'
    with pytest.raises(ValidationError) as invalid:
        SnapshotMetadata.model_validate_json(raw)
    with pytest.raises(SnapshotFormatError) as caught:
        SnapshotReader(_encode(_metadata(), raw_metadata=raw))
    assert type(caught.value) is SnapshotFormatError
    assert str(caught.value) == f"expected valid snapshot metadata, got: {invalid.value}"


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_an_empty_key_group_range_is_a_file_without_blocks() -> None:
    # _read_metadata 68 (start == end + 1 is allowed); _read_index 1, 4 (the
    # smallest file: an empty index and the footer), 39 (an index at the data start).
    data = _encode(_metadata((3, 2)))
    reader = SnapshotReader(data)
    assert len(data) == decode_layout(data).data_start + 8 + 16
    assert decode_layout(data).index_offset == decode_layout(data).data_start
    assert reader.offsets == {}
    assert reader.read_key_group(3) == {}


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_single_key_group_range_is_read() -> None:
    # _read_metadata 69 (start == end is allowed).
    data = _encode(_metadata((2, 2)), {2: BLOCKS[2]})
    reader = SnapshotReader(data)
    assert reader.offsets == {2: decode_layout(data).data_start}
    assert reader.read_key_group(2) == {0: ROWS_2_COUNTS}


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


# ----------------------------------------------------------- the reader: index


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_file_that_ends_inside_its_index_names_its_size(data: bytes) -> None:
    # _read_index 2, 3, 5.
    size = decode_layout(data).data_start + 10
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(data[:size])
    assert str(caught.value) == (
        f"expected an index and a footer after the metadata, but the file ends at {size} bytes"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_wrong_end_magic_says_the_file_was_not_closed(data: bytes) -> None:
    # _read_index 17-20.
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(data[:-8] + b"NOTMAGIC")
    assert str(caught.value) == (
        "expected the end magic b'CWSNAPIX' in the last 8 bytes, got b'NOTMAGIC': the file "
        "is truncated or was not closed"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_an_index_offset_past_the_end_names_the_index(data: bytes) -> None:
    # _read_index 27, 32, 33.
    corrupt = data[:-16] + _footer(len(data) + 100)
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected 4 bytes of the index at offset {len(data) + 100}, but the file has "
        f"{len(data)} bytes"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_an_index_offset_on_a_block_names_the_count_it_read_there(data: bytes) -> None:
    # _read_index 44: the first block's key group (0) read as the index's count.
    start = decode_layout(data).data_start
    corrupt = data[:-16] + _footer(start)
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected an index of 0 key groups between offset {start} and the footer at "
        f"{len(data) - 16}: the file is truncated or corrupt"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_an_index_offset_inside_the_header_is_refused_even_when_its_length_fits(
    data: bytes,
) -> None:
    # _read_index 38: at offset 12 the "count" is the metadata length M; a file
    # of 36 + 12 M bytes makes that index end exactly at the footer.
    (length,) = struct.unpack_from(">I", data, 12)
    end = 20 + 12 * length
    corrupt = data[: decode_layout(data).data_start].ljust(end, b"\0") + _footer(12)
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected an index of {length} key groups between offset 12 and the footer at "
        f"{end}: the file is truncated or corrupt"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_corrupt_index_fails_its_crc(data: bytes) -> None:
    # _read_index 67-72.
    at = decode_layout(data).index_offset
    byte = at + 4 + 12 + 11  # the last byte of key group 1's offset
    corrupt = _patch(data, byte, bytes([data[byte] ^ 0x40]))
    raw = corrupt[at : at + 4 + 4 * 12]
    (stored,) = struct.unpack_from(">I", data, at + 4 + 4 * 12)
    with pytest.raises(ChecksumMismatchError) as caught:
        SnapshotReader(corrupt)
    assert str(caught.value) == (
        f"expected index CRC32 {stored:#010x}, got {zlib.crc32(raw):#010x}: the index is corrupt"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_an_index_entry_outside_the_range_is_named(data: bytes) -> None:
    # _read_index 89, 90.
    entries = decode_layout(data).index
    entries[2] = (9, entries[2][1])
    with pytest.raises(KeyGroupMismatchError) as caught:
        SnapshotReader(_with_index(data, entries))
    assert str(caught.value) == (
        "expected key groups of the file's range KeyGroupRange(0, 3), the index holds key group 9"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_an_index_out_of_order_names_the_entry(data: bytes) -> None:
    # _read_index 95-97, 99 (the entry's number is (position - 4) // 12).
    entries = decode_layout(data).index
    entries[1], entries[2] = entries[2], entries[1]
    with pytest.raises(KeyGroupMismatchError) as caught:
        SnapshotReader(_with_index(data, entries))
    assert str(caught.value) == (
        "expected the index to list every key group of KeyGroupRange(0, 3) once, in order: "
        "key group 1 at entry 1, got key group 2"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_an_index_with_an_entry_too_many_is_refused_as_out_of_order(data: bytes) -> None:
    # _read_index 94 (next() past the range gives None, not StopIteration).
    entries = decode_layout(data).index
    with pytest.raises(KeyGroupMismatchError) as caught:
        SnapshotReader(_with_index(data, [*entries, entries[-1]]))
    assert str(caught.value) == (
        "expected the index to list every key group of KeyGroupRange(0, 3) once, in order: "
        "key group None at entry 4, got key group 3"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_an_index_without_its_last_key_group_is_refused(data: bytes) -> None:
    # _read_index 105, 106.
    with pytest.raises(KeyGroupMismatchError) as caught:
        SnapshotReader(_with_index(data, decode_layout(data).index[:-1]))
    assert str(caught.value) == (
        "expected an index of the 4 key groups of KeyGroupRange(0, 3), got 3"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
@pytest.mark.parametrize("where", ["before-data", "at-index"])
def test_a_block_offset_outside_the_blocks_is_refused(data: bytes, where: str) -> None:
    # _read_index 102, 103 (an offset equal to the index's is outside);
    # _read_metadata 80, 81 (the blocks start after the metadata CRC32).
    start, index_at = decode_layout(data).data_start, decode_layout(data).index_offset
    offset = start - 1 if where == "before-data" else index_at
    entries = decode_layout(data).index
    entries[3] = (3, offset)
    with pytest.raises(TruncatedSnapshotError) as caught:
        SnapshotReader(_with_index(data, entries))
    assert str(caught.value) == (
        f"expected key group 3's block between offsets {start} and {index_at}, the index "
        f"says {offset}"
    )


# ---------------------------------------------------------- the reader: blocks


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_block_of_another_key_group_than_the_index_says_is_named(data: bytes) -> None:
    # _read_block 13, 14.
    entries = decode_layout(data).index
    (_, at_1), (_, at_2) = entries[1], entries[2]
    entries[1], entries[2] = (1, at_2), (2, at_1)
    reader = SnapshotReader(_with_index(data, entries))
    with pytest.raises(KeyGroupMismatchError) as caught:
        reader.read_key_group(1)
    assert str(caught.value) == (
        f"expected the block at offset {at_2} to hold key group 1 as the index says, got key "
        "group 2"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_payload_length_past_the_end_names_the_payload(data: bytes) -> None:
    # _read_block 18; _read_at 1, 4, 6 (the size check, before any read).
    at = dict(decode_layout(data).index)[2]
    reader = SnapshotReader(_patch(data, at + 8, _u32(0xFFFFFFFF)))
    with pytest.raises(TruncatedSnapshotError) as caught:
        reader.read_key_group(2)
    assert str(caught.value) == (
        f"expected 4294967295 bytes of the payload of key group 2 at offset {at + 12}, but "
        f"the file has {len(data)} bytes"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_payload_that_fills_the_file_leaves_no_room_for_its_crc(data: bytes) -> None:
    # _read_block 27: the CRC32 read names the key group.
    at = dict(decode_layout(data).index)[2]
    reader = SnapshotReader(_patch(data, at + 8, _u32(len(data) - at - 12)))
    with pytest.raises(TruncatedSnapshotError) as caught:
        reader.read_key_group(2)
    assert str(caught.value) == (
        f"expected 4 bytes of the CRC32 of key group 2 at offset {len(data)}, but the file "
        f"has {len(data)} bytes"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
@pytest.mark.parametrize("at_in_block", [4, 20], ids=["count", "payload"])
def test_a_corrupt_block_fails_its_crc(data: bytes, at_in_block: int) -> None:
    # _read_block 40, 41 (and 34-39: the CRC covers the block header and payload).
    at = dict(decode_layout(data).index)[1]
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


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_file_cut_after_it_was_opened_names_the_short_block_read(
    tmp_path: Path, data: bytes
) -> None:
    # _read_block 7; _read_at 11, 12: the size was measured when the reader was
    # made, the block header read then comes back short.
    at = dict(decode_layout(data).index)[2]
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


# -------------------------------------------------------- the reader: payloads


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_section_of_an_unknown_state_id_is_named_with_its_key_group() -> None:
    # _parse_payload 17, 20, 24, 28; read_key_group 4 (the key group in the message).
    data = _encode(_metadata(), {2: (1, _section(7, ROWS_2_COUNTS))})
    with pytest.raises(SnapshotFormatError) as caught:
        _read(data, 2)
    assert str(caught.value) == (
        "expected one section per state id of [0, 1] in key group 2, got state id 7"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_second_section_of_one_state_is_named_twice() -> None:
    # _parse_payload 19, 23, 25-27, 29.
    block = _block((0, ROWS_1_COUNTS), (0, ROWS_2_COUNTS))
    for read in (_read, _decode):
        with pytest.raises(SnapshotFormatError) as caught:
            read(_encode(_metadata(), {1: block}), 1)
        assert str(caught.value) == (
            "expected one section per state id of [0, 1] in key group 1, got state id 0 twice"
        )


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_block_header_count_that_is_not_its_entries_is_refused() -> None:
    # _parse_payload 64, 65 (two sections add up), 67, 68.
    count, payload = BLOCKS[1]
    assert count == 3
    data = _encode(_metadata(), {1: (5, payload)})
    with pytest.raises(SnapshotFormatError) as caught:
        _read(data, 1)
    assert str(caught.value) == "expected 5 entries in key group 1 as its header says, got 3"


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


# -------------------------------------------------------- the reader: decoding


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


@pytest.mark.kills(module="cowstate.snapshot.reader")
def test_a_namespace_its_serializer_cannot_decode_names_the_key_group() -> None:
    # _decoded_section 70 (decode_namespace is given the key group).
    data = _encode(_metadata(), {3: _block((0, [(b"bad", b"alice", b"3")]))})
    with pytest.raises(SnapshotFormatError) as caught:
        _decode(data, 3)
    assert str(caught.value) == (
        "expected entries of state 'counts' in key group 3 that its serializers can decode, "
        "got ValueError: no such window"
    )


@pytest.mark.kills(module="cowstate.snapshot.reader")
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


# ================================================== 10. the writer, block by block

MAXP = 8

FULL = KeyGroupRange(0, MAXP - 1)

INT = IntSerializer()

UTF8 = StringSerializer()

Snapshot = StateTableSnapshot[Any, Any, Any]


def group(key: int) -> int:
    return assign_to_key_group(key, MAXP, INT)


def value_table(
    name: str = "a",
    keys: Iterable[int] = range(10),
    *,
    key_group_range: KeyGroupRange = FULL,
    max_parallelism: int = MAXP,
    key_serializer: Any = INT,
) -> Table:
    """A value state ``name``: ``(k, "ns") -> f"{name}{k}"`` for the keys of its range."""
    meta = StateMetaInfo(name, StateKind.VALUE, UTF8, UTF8)
    table: Table = CopyOnWriteStateTable(
        key_group_range, max_parallelism, meta=meta, key_serializer=key_serializer
    )
    for key in keys:
        if assign_to_key_group(key, max_parallelism, key_serializer) in key_group_range:
            table.put(key, "ns", f"{name}{key}")
    return table


def written_file(
    tmp_path: Path,
    snapshots: Snapshot | Sequence[Snapshot],
    file_name: str = "snapshot.bin",
    **options: Any,
) -> bytes:
    """The bytes :func:`write_snapshot` wrote to a file under ``tmp_path`` (a
    real file: some tests read it back as a stream)."""
    path = tmp_path / file_name
    with path.open("wb") as stream:
        write_snapshot(snapshots, stream, **options)
    return path.read_bytes()


def state_meta(
    state_id: int,
    name: str,
    *,
    kind: str = "value",
    namespace_serializer: str = "utf8",
    state_serializer: str = "utf8",
) -> StateMetadata:
    return StateMetadata(
        id=state_id,
        name=name,
        kind=kind,
        namespace_serializer=namespace_serializer,
        state_serializer=state_serializer,
    )


def file_metadata(
    *states: StateMetadata,
    key_group_range: KeyGroupRange = FULL,
    key_serializer: str = "int32",
    max_parallelism: int = MAXP,
) -> SnapshotMetadata:
    return SnapshotMetadata(
        format=SnapshotFormat.HEAP,
        max_parallelism=max_parallelism,
        key_group_range=(key_group_range.start_key_group, key_group_range.end_key_group),
        key_serializer=key_serializer,
        states=states,
    )


def entry(key: int, namespace: str = "ns", state: str = "s") -> RawEntry:
    """A raw (namespace, key, state) entry of int32 keys and utf8 namespaces and states."""
    return (UTF8.serialize(namespace), INT.serialize(key), UTF8.serialize(state))


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_a_first_key_group_outside_the_range_is_refused_after_none_written(
    tmp_path: Path,
) -> None:
    # writer.SnapshotWriter.write_key_group 1, 2, 4; __init__ 9, 10, 11: the
    # message names the last key group written, -1 before the first.
    with (tmp_path / "f").open("wb") as stream:
        writer = SnapshotWriter(stream, file_metadata(key_group_range=KeyGroupRange(2, 5)))
        with pytest.raises(InvalidArgumentError) as excinfo:
            writer.write_key_group(6, {})
    assert str(excinfo.value) == (
        "expected key groups of KeyGroupRange(2, 5) in ascending order, got 6 after -1"
    )


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_the_first_key_group_of_a_range_starting_at_zero_is_accepted(tmp_path: Path) -> None:
    # writer.SnapshotWriter.__init__ 10 (the last key group starts at +1: key
    # group 0 and 1 would be refused as not ascending).
    with (tmp_path / "f").open("wb") as stream:
        metadata = file_metadata(state_meta(0, "a"), key_group_range=KeyGroupRange(0, 1))
        writer = SnapshotWriter(stream, metadata)
        writer.write_key_group(0, {0: [entry(0)]})
        writer.write_key_group(1, {})
        info = writer.finish()
    assert info.entries == 1
    assert sorted(info.offsets) == [0, 1]


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_the_same_key_group_twice_is_refused(tmp_path: Path) -> None:
    # writer.SnapshotWriter.write_key_group 3 (<= relaxed to <).
    with (tmp_path / "f").open("wb") as stream:
        writer = SnapshotWriter(stream, file_metadata(state_meta(0, "a")))
        writer.write_key_group(3, {0: [entry(3)]})
        with pytest.raises(InvalidArgumentError) as excinfo:
            writer.write_key_group(3, {0: [entry(3)]})
    assert str(excinfo.value) == (
        "expected key groups of KeyGroupRange(0, 7) in ascending order, got 3 after 3"
    )


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_skipped_key_groups_get_empty_blocks_and_the_written_ones_keep_their_entries(
    tmp_path: Path,
) -> None:
    # writer.SnapshotWriter.write_key_group 5-18 and finish 1-16: the empty
    # blocks of the skipped key groups (3, 4 between two writes; 6, 7 after
    # the last) fill the gaps exactly once, never a written block again.
    metadata = file_metadata(state_meta(0, "a"), key_group_range=KeyGroupRange(2, 7))
    a = [entry(10, state="x"), entry(11, state="y")]
    b = [entry(12, state="z")]
    data = craft(metadata, {2: {0: a}, 5: {0: b}})
    reader = SnapshotReader(data)
    assert {kg: reader.read_key_group(kg) for kg in range(2, 8)} == {
        2: {0: a},
        3: {},
        4: {},
        5: {0: b},
        6: {},
        7: {},
    }
    start = 16 + len(metadata.model_dump_json().encode()) + 4
    size_a = 12 + 6 + sum(12 + len(ns) + len(k) + len(s) for ns, k, s in a) + 4
    size_b = 12 + 6 + sum(12 + len(ns) + len(k) + len(s) for ns, k, s in b) + 4
    empty = 16
    assert reader.offsets == {
        2: start,
        3: start + size_a,
        4: start + size_a + empty,
        5: start + size_a + 2 * empty,
        6: start + size_a + 2 * empty + size_b,
        7: start + size_a + 3 * empty + size_b,
    }


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_a_range_starting_past_zero_gets_blocks_from_its_own_start(tmp_path: Path) -> None:
    # writer.SnapshotWriter.write_key_group 5-12 and finish 1-8 (the start of
    # the range, not the last key group + 1, opens the first gap).
    metadata = file_metadata(state_meta(0, "a"), key_group_range=KeyGroupRange(3, 6))
    data = craft(metadata, {5: {0: [entry(1)]}})
    reader = SnapshotReader(data)
    assert list(reader.offsets) == [3, 4, 5, 6]
    assert reader.read_key_group(5) == {0: [entry(1)]}


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_an_unwritten_file_has_one_empty_block_per_key_group(tmp_path: Path) -> None:
    # writer.SnapshotWriter.finish 1-16 with nothing written (the last key group is -1).
    metadata = file_metadata(state_meta(0, "a"), key_group_range=KeyGroupRange(1, 3))
    data = craft(metadata, {})
    reader = SnapshotReader(data)
    start = 16 + len(metadata.model_dump_json().encode()) + 4
    assert reader.offsets == {1: start, 2: start + 16, 3: start + 32}
    assert [reader.read_key_group(kg) for kg in (1, 2, 3)] == [{}, {}, {}]


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_an_empty_state_section_before_a_full_one_is_left_out(tmp_path: Path) -> None:
    # writer.SnapshotWriter._write_block 7 (empty sections written, full ones
    # dropped) and 8 (the first empty section ends the block).
    metadata = file_metadata(state_meta(0, "a"), state_meta(1, "b"), state_meta(2, "c"))
    data = craft(metadata, {4: {0: [], 1: [entry(1)], 2: [entry(2), entry(3)]}})
    assert SnapshotReader(data).read_key_group(4) == {1: [entry(1)], 2: [entry(2), entry(3)]}


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_the_block_header_counts_the_entries_of_every_state(tmp_path: Path) -> None:
    # writer.SnapshotWriter._write_block 2, 3, 19, 20 (the block's entry
    # count, which the reader checks against its sections) and 42, 43,
    # __init__ 7, 8 (the file's entry count over all blocks).
    metadata = file_metadata(state_meta(0, "a"), state_meta(1, "b"))
    path = tmp_path / "f"
    with path.open("wb") as stream:
        writer = SnapshotWriter(stream, metadata)
        writer.write_key_group(1, {0: [entry(1), entry(2)], 1: [entry(3)]})
        writer.write_key_group(5, {1: [entry(4), entry(5)]})
        info = writer.finish()
    data = path.read_bytes()
    assert struct.unpack_from(">iII", data, info.offsets[1])[:2] == (1, 3)
    assert struct.unpack_from(">iII", data, info.offsets[5])[:2] == (5, 2)
    assert SnapshotReader(data).read_key_group(1) == {0: [entry(1), entry(2)], 1: [entry(3)]}
    assert info.entries == 5


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_the_file_info_describes_the_file_written(tmp_path: Path) -> None:
    # writer.SnapshotWriter.finish 36-44 and _write 1-3, __init__ 5, 6
    # (offsets and size are positions in the stream, counted from 0).
    metadata = file_metadata(state_meta(0, "a"), key_group_range=KeyGroupRange(0, 2))
    path = tmp_path / "f"
    with path.open("wb") as stream:
        writer = SnapshotWriter(stream, metadata)
        writer.write_key_group(1, {0: [entry(7)]})
        info = writer.finish()
    data = path.read_bytes()
    assert info.metadata is metadata
    assert info.size == len(data)
    assert info.entries == 1
    assert info.offsets == SnapshotReader(data).offsets
    assert type(info.offsets) is dict
    start = 16 + len(metadata.model_dump_json().encode()) + 4
    assert info.offsets[0] == start
    index_at = struct.unpack(">Q", data[-16:-8])[0]
    assert index_at == len(data) - 16 - 4 - 4 - 3 * 12


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_the_header_holds_magic_version_zero_flags_and_the_metadata(tmp_path: Path) -> None:
    # writer.SnapshotWriter.__init__ 12-30 (flags 1 is not read back by the
    # reader, so the header's bytes are compared).
    metadata = file_metadata(state_meta(0, "a"))
    data = craft(metadata, {})
    meta = metadata.model_dump_json().encode("utf-8")
    assert data[:16] == MAGIC + struct.pack(">HHI", FORMAT_VERSION, 0, len(meta))
    assert data[16 : 16 + len(meta)] == meta


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_write_snapshot_releases_the_snapshot_by_default_also_when_cancelled(
    tmp_path: Path,
) -> None:
    # writer.write_snapshot 1 (release defaults to False), 17-19 (cancel).
    snapshot = value_table().snapshot()
    cancel = threading.Event()
    cancel.set()
    path = tmp_path / "f"
    with path.open("wb") as stream, pytest.raises(SnapshotCancelledError) as excinfo:
        write_snapshot(snapshot, stream, cancel=cancel)
    assert str(excinfo.value) == "snapshot cancelled before key group 0 was written"
    assert snapshot.is_released


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_an_unset_cancel_event_writes_the_whole_file(tmp_path: Path) -> None:
    # writer.write_snapshot 17, 18 (an event that is not set cancels nothing).
    table = value_table()
    data = written_file(tmp_path, table.snapshot(), cancel=threading.Event())
    restored = read_snapshot(data, FULL)
    assert restored.size("a") == 10


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_without_release_every_key_group_is_still_released_once_written(
    tmp_path: Path,
) -> None:
    # writer.write_snapshot 32 (release_key_group(None)).
    snapshot = value_table().snapshot()
    written_file(tmp_path, snapshot, release=False)
    assert [snapshot.is_key_group_released(kg) for kg in FULL] == [True] * MAXP


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_write_snapshot_round_trips_keys_namespaces_and_states(tmp_path: Path) -> None:
    # writer.write_snapshot 20-31 (each entry serialized with its own serializers,
    # every key group of every state written).
    a = value_table("a", range(12))
    b = value_table("b", range(5, 9))
    data = written_file(tmp_path, [a.snapshot(), b.snapshot()])
    restored = read_snapshot(data, FULL)
    assert sorted(restored.entries("a")) == sorted((group(k), k, "ns", f"a{k}") for k in range(12))
    assert sorted(restored.entries("b")) == sorted(
        (group(k), k, "ns", f"b{k}") for k in range(5, 9)
    )


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_write_snapshot_records_the_metadata_of_its_tables(tmp_path: Path) -> None:
    # writer._metadata_of 23-36 (format, max parallelism, range, key
    # serializer and per state its id).
    tables = [value_table(name, key_group_range=KeyGroupRange(2, 5)) for name in "xyz"]
    data = written_file(
        tmp_path, [t.snapshot() for t in tables], snapshot_format=SnapshotFormat.CANONICAL
    )
    assert SnapshotReader(data).metadata == SnapshotMetadata(
        format=SnapshotFormat.CANONICAL,
        max_parallelism=MAXP,
        key_group_range=(2, 5),
        key_serializer="int32",
        states=(state_meta(0, "x"), state_meta(1, "y"), state_meta(2, "z")),
    )


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_write_snapshot_of_no_table_is_refused(tmp_path: Path) -> None:
    # writer._metadata_of 1-4.
    with (tmp_path / "f").open("wb") as stream, pytest.raises(InvalidArgumentError) as excinfo:
        write_snapshot([], stream)
    assert str(excinfo.value) == "expected at least one table snapshot to write, got none"


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_exactly_max_states_snapshots_pass_the_count_check(tmp_path: Path) -> None:
    # writer._metadata_of 5, 6: MAX_STATES states are allowed (the same
    # snapshot MAX_STATES times then fails the name check, which comes later).
    snapshot = value_table(keys=()).snapshot()
    with (tmp_path / "f").open("wb") as stream:
        with pytest.raises(InvalidArgumentError) as excinfo:
            write_snapshot([snapshot] * MAX_STATES, stream, release=False)
        assert str(excinfo.value).startswith("expected distinct state names, got ['a', 'a', ")
        with pytest.raises(InvalidArgumentError) as excinfo:
            write_snapshot([snapshot] * (MAX_STATES + 1), stream, release=False)
    assert str(excinfo.value) == (
        f"expected at most {MAX_STATES} states in one snapshot, got {MAX_STATES + 1}"
    )


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_a_second_table_with_another_key_serializer_is_refused(tmp_path: Path) -> None:
    # writer._metadata_of 8-15 (the second of two tables is compared too).
    a = value_table("a")
    b = value_table("b", keys=(), key_serializer=LongSerializer())
    with (tmp_path / "f").open("wb") as stream, pytest.raises(InvalidArgumentError) as excinfo:
        write_snapshot([a.snapshot(), b.snapshot()], stream)
    assert str(excinfo.value) == (
        "expected every table snapshot to use the key serializer 'int32', got 'int64' for 'b'"
    )


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_a_second_table_of_another_range_is_refused(tmp_path: Path) -> None:
    # writer._metadata_of 16, 17, 19 (the range alone differs).
    a = value_table("a")
    b = value_table("b", key_group_range=KeyGroupRange(0, 3))
    with (tmp_path / "f").open("wb") as stream, pytest.raises(InvalidArgumentError) as excinfo:
        write_snapshot([a.snapshot(), b.snapshot()], stream)
    assert str(excinfo.value) == (
        "expected every table snapshot to cover KeyGroupRange(0, 7) of 8, got "
        "KeyGroupRange(0, 3) of 8 for 'b'"
    )


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_a_second_table_of_another_max_parallelism_is_refused(tmp_path: Path) -> None:
    # writer._metadata_of 16, 18, 19 (the max parallelism alone differs).
    a = value_table("a")
    b = value_table("b", keys=(), max_parallelism=16)
    with (tmp_path / "f").open("wb") as stream, pytest.raises(InvalidArgumentError) as excinfo:
        write_snapshot([a.snapshot(), b.snapshot()], stream)
    assert str(excinfo.value) == (
        "expected every table snapshot to cover KeyGroupRange(0, 7) of 8, got "
        "KeyGroupRange(0, 7) of 16 for 'b'"
    )


@pytest.mark.kills(module="cowstate.snapshot.writer")
def test_two_tables_of_one_name_are_refused(tmp_path: Path) -> None:
    # writer._metadata_of 20-22.
    with (tmp_path / "f").open("wb") as stream, pytest.raises(InvalidArgumentError) as excinfo:
        write_snapshot([value_table("a").snapshot(), value_table("a").snapshot()], stream)
    assert str(excinfo.value) == "expected distinct state names, got ['a', 'a']"


# ============================== 11. read_snapshot and restore_table, word for word


# --------------------------------------------------------------- restore_table


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_restore_table_refuses_a_mapping_given_twice_naming_state_and_key_group(
    tmp_path: Path,
) -> None:
    # restore.restore_table 44 (no E4 check), 47-51 (its message).
    key = 3
    kg = group(key)
    data = craft(
        file_metadata(state_meta(0, "a")),
        {kg: {0: [entry(key, state="first"), entry(key, state="second")]}},
    )
    table = value_table("a", keys=(11,))
    before = contents(table)
    with pytest.raises(DuplicateMappingError) as excinfo:
        restore_table(table, data)
    assert str(excinfo.value) == (
        f"expected each (key, namespace) once per state, state 'a' holds (3, 'ns') twice in "
        f"key group {kg}"
    )
    assert contents(table) == before


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_restore_table_refuses_keys_of_another_type_than_the_tables(tmp_path: Path) -> None:
    # restore.restore_table 52-54 (E6 against the table's key type, and its message).
    key = 2.5
    kg = assign_to_key_group(key, MAXP, SER)
    metadata = file_metadata(state_meta(0, "a"), key_serializer=SER.identifier)
    raw = (UTF8.serialize("ns"), SER.serialize(key), UTF8.serialize("s"))
    data = craft(metadata, {kg: {0: [raw]}})
    table = value_table("a", keys=(1,), key_serializer=SER)
    with pytest.raises(MixedKeyTypesError) as excinfo:
        restore_table(table, data)
    assert str(excinfo.value).startswith(
        "expected the keys of a restore to be of one type, without NaN or -0.0, "
        f"state 'a', key group {kg} has float 2.5: "
    )
    assert contents(table) == {(1, "ns"): "a1"}


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_restore_table_restores_every_file_and_counts_the_mappings(tmp_path: Path) -> None:
    # restore.restore_table 1-33, 37-39, 41, 61-65, 67-69, 72-74, 76-78, 80, 81
    # (two files as streams, one as bytes: every mapping put where it was).
    low = value_table("a", range(20), key_group_range=KeyGroupRange(0, 3))
    high = value_table("a", range(20), key_group_range=KeyGroupRange(4, 7))
    low_data = written_file(tmp_path, low.snapshot(), "low.bin")
    written_file(tmp_path, high.snapshot(), "high.bin")
    table = value_table("a", keys=())
    table.put(100, "other", "mine")
    with (tmp_path / "low.bin").open("rb") as first, (tmp_path / "high.bin").open("rb") as second:
        assert restore_table(table, [first, second]) == 20
    assert contents(table) == {(k, "ns"): f"a{k}" for k in range(20)} | {(100, "other"): "mine"}
    assert [table.get(k, "ns") for k in (0, 19)] == ["a0", "a19"]
    only_low = value_table("a", keys=(), key_group_range=KeyGroupRange(0, 3))
    assert restore_table(only_low, low_data) == len(low)
    assert contents(only_low) == contents(low)


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_restore_table_reads_one_stream_with_its_own_meta_info_and_state_only(
    tmp_path: Path,
) -> None:
    # restore.restore_table 2-9 (one stream is one file, not an iterable of
    # lines), 23, 29, 30 (the table's meta info decodes: the tests' pickle is
    # no built-in serializer) and 25, 32 (the other state, which nothing
    # could decode, is skipped).
    def pickled(name: str) -> Table:
        meta = StateMetaInfo(name, StateKind.VALUE, SER, SER)
        table: Table = CopyOnWriteStateTable(FULL, MAXP, meta=meta, key_serializer=INT)
        for key in range(6):
            table.put(key, ("w", key), [name, key])
        return table

    other, mine = pickled("x"), pickled("a")
    written_file(tmp_path, [other.snapshot(), mine.snapshot()])
    meta = StateMetaInfo("a", StateKind.VALUE, SER, SER)
    table: Table = CopyOnWriteStateTable(FULL, MAXP, meta=meta, key_serializer=INT)
    with (tmp_path / "snapshot.bin").open("rb") as stream:
        assert restore_table(table, stream) == 6
    assert contents(table) == contents(mine)


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_restore_table_refuses_a_file_of_another_max_parallelism(tmp_path: Path) -> None:
    # restore.restore_table 22 (the table's max parallelism is the one checked).
    data = written_file(tmp_path, value_table("a", range(4), max_parallelism=16).snapshot())
    table = value_table("a", keys=())
    with pytest.raises(MaxParallelismMismatchError) as excinfo:
        restore_table(table, [data])
    assert str(excinfo.value) == (
        "expected a snapshot of max parallelism 8, got one of 16: the number of key groups "
        "cannot change on restore"
    )


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_restore_table_fixes_the_key_type_of_a_fresh_table(tmp_path: Path) -> None:
    # restore.restore_table 43, 55, 60 (the restored keys' type is adopted).
    data = written_file(tmp_path, value_table("a", range(4), key_serializer=SER).snapshot())
    table = value_table("a", keys=(), key_serializer=SER)
    assert restore_table(table, [data]) == 4
    with pytest.raises(KeyTypeMismatchError):
        table.put(1.5, "ns", "float key")
    assert len(table) == 4


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_restore_table_of_a_state_the_files_do_not_hold_is_refused(tmp_path: Path) -> None:
    # restore.restore_table 34-36.
    data = written_file(tmp_path, value_table("a", range(4)).snapshot())
    table = value_table("b", keys=())
    with pytest.raises(UnknownStateError) as excinfo:
        restore_table(table, [data])
    assert str(excinfo.value) == "expected state 'b' in the snapshot files, got states ['a']"


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_restore_table_of_something_that_is_not_files_is_refused() -> None:
    # restore.restore_table 1-13.
    with pytest.raises(InvalidArgumentError) as excinfo:
        restore_table(value_table(keys=()), 42)  # type: ignore[arg-type]
    assert str(excinfo.value) == (
        "expected snapshot files (bytes or binary streams, or an iterable of them), got int"
    )


# ------------------------------------------------------------ RestoredSnapshot


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_entries_yields_key_group_key_namespace_state_by_key_group(tmp_path: Path) -> None:
    # restore.RestoredSnapshot.entries 1-8, 10-12; size 2-5 (a state not restored).
    data = written_file(tmp_path, [value_table("a", range(6)).snapshot()])
    restored = read_snapshot(data, FULL)
    expected = sorted((group(k), k, "ns", f"a{k}") for k in range(6))
    assert sorted(restored.entries("a")) == expected
    assert [e[0] for e in restored.entries("a")] == [e[0] for e in expected]
    assert list(restored.entries("missing")) == []
    assert (restored.size("a"), restored.size("missing")) == (6, 0)


# --------------------------------------------------------------- read_snapshot


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_read_snapshot_refuses_what_is_not_a_key_group_range() -> None:
    # restore.read_snapshot 1-3.
    with pytest.raises(InvalidArgumentError) as excinfo:
        read_snapshot(b"", (0, 7))  # type: ignore[arg-type]
    assert str(excinfo.value) == "expected a KeyGroupRange, got tuple"


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_read_snapshot_reads_through_a_given_reader_and_rewinds_it(tmp_path: Path) -> None:
    # restore.read_snapshot 4-7.
    data = written_file(tmp_path, value_table("a", range(4)).snapshot())
    with (tmp_path / "snapshot.bin").open("rb") as stream:
        reader = SnapshotReader(stream)
        restored = read_snapshot(reader, FULL)
        assert stream.tell() == 0
        assert restored.size("a") == 4
    assert read_snapshot(data, FULL).states == restored.states


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_read_snapshot_decodes_with_the_meta_info_given_for_a_state(tmp_path: Path) -> None:
    # restore.read_snapshot 24 (metas dropped), _decode 42, 43 (the given
    # meta info is not looked up) and 52-68 (its serializers decode: the
    # tests' pickle is no built-in serializer).
    meta = StateMetaInfo("p", StateKind.VALUE, SER, SER)
    table: Table = CopyOnWriteStateTable(FULL, MAXP, meta=meta, key_serializer=INT)
    table.put(1, ("w", 1), {"x": [1]})
    data = written_file(tmp_path, table.snapshot())
    restored = read_snapshot(data, FULL, metas={"p": meta})
    assert restored.metas["p"] is meta
    assert list(restored.entries("p")) == [(group(1), 1, ("w", 1), {"x": [1]})]


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_read_snapshot_without_meta_info_uses_the_built_in_serializers(tmp_path: Path) -> None:
    # restore._decode 88-97 (the meta info made from the file), 127-138 (what
    # is merged into the result), 9-12, 38, 47, 48 (no states, no max parallelism given).
    a = value_table("a", range(3))
    empty = value_table("empty", keys=())
    data = written_file(tmp_path, [a.snapshot(), empty.snapshot()])
    restored = read_snapshot(data, KeyGroupRange(0, 3))
    assert restored.key_group_range == KeyGroupRange(0, 3)
    assert restored.max_parallelism == MAXP
    assert restored.formats == {SnapshotFormat.HEAP}
    assert restored.key_serializer == "int32"
    assert restored.key_groups == {0, 1, 2, 3}
    assert restored.all_states == {"a", "empty"}
    assert sorted(restored.metas) == ["a", "empty"]
    for name in ("a", "empty"):
        meta = restored.metas[name]
        assert (meta.name, meta.kind) == (name, StateKind.VALUE)
        assert type(meta.namespace_serializer) is StringSerializer
        assert type(meta.state_serializer) is StringSerializer
    assert restored.blocks["empty"] == {}
    in_range = [k for k in range(3) if group(k) <= 3]
    assert restored.states["a"] == {
        kg: [(k, "ns", f"a{k}") for k in in_range if group(k) == kg]
        for kg in sorted({group(k) for k in in_range})
    }


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_read_snapshot_decodes_only_the_states_asked_for(tmp_path: Path) -> None:
    # restore._decode 39, 40, 41 (the first state skipped ends the loop).
    tables = [value_table(name, range(4)) for name in ("x", "a", "y")]
    data = written_file(tmp_path, [t.snapshot() for t in tables])
    restored = read_snapshot(data, FULL, states={"a"})
    assert sorted(restored.metas) == ["a"]
    assert sorted(restored.blocks) == ["a"]
    assert restored.size("a") == 4
    assert restored.all_states == {"x", "a", "y"}


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_a_max_parallelism_other_than_the_files_is_refused(tmp_path: Path) -> None:
    # restore._decode 2-5.
    data = written_file(tmp_path, value_table().snapshot())
    with pytest.raises(MaxParallelismMismatchError) as excinfo:
        read_snapshot(data, FULL, max_parallelism=16)
    assert str(excinfo.value) == (
        "expected a snapshot of max parallelism 16, got one of 8: the number of key groups "
        "cannot change on restore"
    )
    assert read_snapshot(data, FULL, max_parallelism=MAXP).size("a") == 10


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_a_file_of_another_max_parallelism_than_the_accumulated_ones_is_refused(
    tmp_path: Path,
) -> None:
    # restore._decode 14, 15.
    data = written_file(tmp_path, value_table().snapshot())
    into = RestoredSnapshot(FULL, 16)
    with pytest.raises(MaxParallelismMismatchError) as excinfo:
        read_snapshot(data, FULL, into=into)
    assert str(excinfo.value) == "expected every file to have max parallelism 16, got 8"
    assert into.blocks == {}


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_several_files_accumulate_into_one_result(tmp_path: Path) -> None:
    # restore._decode 6-8, 13 (into ignored or replaced), 139-142 (merging).
    low = value_table("a", range(20), key_group_range=KeyGroupRange(0, 3))
    high = value_table("a", range(20), key_group_range=KeyGroupRange(4, 7))
    low_data = written_file(tmp_path, low.snapshot(), "low.bin")
    high_data = written_file(tmp_path, high.snapshot(), "high.bin")
    into = RestoredSnapshot(FULL, MAXP)
    assert read_snapshot(low_data, FULL, into=into) is into
    assert read_snapshot(high_data, FULL, into=into) is into
    assert into.key_groups == set(FULL)
    assert sorted(into.entries("a")) == sorted((group(k), k, "ns", f"a{k}") for k in range(20))


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_a_block_already_accumulated_for_a_key_group_is_extended(tmp_path: Path) -> None:
    # restore._decode 140, 141: blocks of an accumulator given with entries
    # of a key group no file was read for are extended, not replaced.
    key = 5
    kg = group(key)
    data = written_file(tmp_path, value_table("a", (key,)).snapshot())
    into = RestoredSnapshot(FULL, MAXP)
    into.blocks["a"] = {kg: DecodedBlock([13], ["ns"], ["old"])}
    read_snapshot(data, FULL, into=into)
    assert into.states["a"] == {kg: [(13, "ns", "old"), (key, "ns", f"a{key}")]}


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_a_key_group_in_two_files_is_refused_naming_the_first_five(tmp_path: Path) -> None:
    # restore._decode 28-34.
    first = written_file(tmp_path, value_table().snapshot(), "first")
    second = written_file(tmp_path, value_table().snapshot(), "second")
    into = read_snapshot(first, FULL)
    with pytest.raises(KeyGroupMismatchError) as excinfo:
        read_snapshot(second, FULL, into=into)
    assert str(excinfo.value) == (
        "expected every key group in one snapshot file only, got key groups [0, 1, 2, 3, 4] "
        "in two files"
    )


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_a_state_of_another_kind_than_its_meta_info_is_refused(tmp_path: Path) -> None:
    # restore._decode 44, 45, 49, 50.
    data = written_file(tmp_path, value_table("a", range(3)).snapshot())
    meta = StateMetaInfo("a", StateKind.LIST, UTF8, SER)
    with pytest.raises(SerializerMismatchError) as excinfo:
        read_snapshot(data, FULL, metas={"a": meta})
    assert str(excinfo.value) == "expected state 'a' of kind 'list', the file holds kind 'value'"


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_a_state_of_another_kind_than_the_accumulated_one_is_refused(tmp_path: Path) -> None:
    # restore._decode 46 (the accumulated meta info, not the given one, is compared).
    low = value_table("a", range(8), key_group_range=KeyGroupRange(0, 3))
    into = read_snapshot(written_file(tmp_path, low.snapshot(), "low"), FULL)
    metadata = file_metadata(
        state_meta(0, "a", kind="list", state_serializer="cowstate-value"),
        key_group_range=KeyGroupRange(4, 7),
    )
    data = craft(metadata, {})
    with pytest.raises(SerializerMismatchError) as excinfo:
        read_snapshot(data, FULL, into=into)
    assert str(excinfo.value) == "expected state 'a' of kind 'value', the file holds kind 'list'"


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_serializer_mismatches_name_the_serializer(tmp_path: Path) -> None:
    # restore._decode 17-24, 51-68 and _resolve 1-6: each role in its message.
    data = written_file(tmp_path, value_table("a", range(3)).snapshot())
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"key_serializer": LongSerializer()},
            "expected the key serializer to be 'int64', the file was written with 'int32'",
        ),
        (
            {"metas": {"a": StateMetaInfo("a", StateKind.VALUE, INT, UTF8)}},
            "expected the namespace serializer of 'a' to be 'int32', the file was written "
            "with 'utf8'",
        ),
        (
            {"metas": {"a": StateMetaInfo("a", StateKind.VALUE, UTF8, INT)}},
            "expected the state serializer of 'a' to be 'int32', the file was written with 'utf8'",
        ),
        (
            {"namespace_serializer": INT},
            "expected the namespace serializer of 'a' to be 'int32', the file was written "
            "with 'utf8'",
        ),
    ]
    for options, message in cases:
        with pytest.raises(SerializerMismatchError) as excinfo:
            read_snapshot(data, FULL, **options)
        assert str(excinfo.value) == message
    restored = read_snapshot(data, FULL, key_serializer=INT, namespace_serializer=UTF8)
    assert restored.size("a") == 3


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_a_backends_namespace_serializer_decodes_states_without_meta_info(
    tmp_path: Path,
) -> None:
    # restore._decode 52, 55-61 (the namespace serializer of read_snapshot is used).
    metadata = file_metadata(state_meta(0, "a", namespace_serializer=SER.identifier))
    raw = (SER.serialize(("w", 2)), INT.serialize(4), UTF8.serialize("s"))
    data = craft(metadata, {group(4): {0: [raw]}})
    restored = read_snapshot(data, FULL, namespace_serializer=SER)
    assert list(restored.entries("a")) == [(group(4), 4, ("w", 2), "s")]
    assert restored.metas["a"].namespace_serializer is SER


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_states_of_different_namespace_serializers_decode_the_same_bytes_apart(
    tmp_path: Path,
) -> None:
    # restore._decode 74, 80, 82-86 (one namespace cache per namespace serializer).
    metadata = file_metadata(
        state_meta(0, "i", namespace_serializer="int32"),
        state_meta(1, "s", namespace_serializer="utf8"),
    )
    same = INT.serialize(65)  # b"\x00\x00\x00A"
    blocks = {
        group(1): {
            0: [(same, INT.serialize(1), UTF8.serialize("i"))],
            1: [(same, INT.serialize(1), UTF8.serialize("s"))],
        }
    }
    data = craft(metadata, blocks)
    restored = read_snapshot(data, FULL)
    assert list(restored.entries("i")) == [(group(1), 1, 65, "i")]
    assert list(restored.entries("s")) == [(group(1), 1, "\x00\x00\x00A", "s")]


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_a_list_state_holding_another_type_is_refused_naming_state_and_key_group(
    tmp_path: Path,
) -> None:
    # restore._decode 75, 81, 87, 116-121 (E5 and its message).
    metadata = file_metadata(state_meta(0, "l", kind="list"))
    kg = group(2)
    data = craft(metadata, {kg: {0: [entry(2, state="not a list")]}})
    meta = StateMetaInfo("l", StateKind.LIST, UTF8, UTF8)
    with pytest.raises(SnapshotEntryError) as excinfo:
        read_snapshot(data, FULL, metas={"l": meta})
    assert str(excinfo.value) == (
        f"expected every state of 'l' in key group {kg} to be a list (what its kind holds), "
        "got a state of type str"
    )


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_a_key_in_another_key_groups_block_is_refused_naming_the_state(tmp_path: Path) -> None:
    # restore._decode 70, 76, 105-115 (E3 and its message).
    key = 3
    wrong = (group(key) + 1) % MAXP
    data = craft(file_metadata(state_meta(0, "a")), {wrong: {0: [entry(key)]}})
    with pytest.raises(KeyGroupMismatchError) as excinfo:
        read_snapshot(data, FULL)
    assert str(excinfo.value) == (
        f"expected every key in the block of key group {wrong} to belong to it, state 'a' "
        f"has key 3 there, whose key group is {group(key)}"
    )


@pytest.mark.kills(module="cowstate.snapshot.restore")
def test_long_keys_are_checked_with_the_key_serializer_of_the_file(tmp_path: Path) -> None:
    # restore._decode 110 (E3 without the key serializer hashes -1 as an int32).
    longs = LongSerializer()
    table = value_table("a", (-1, -5, 3), key_serializer=longs)
    data = written_file(tmp_path, table.snapshot())
    restored = read_snapshot(data, FULL)
    assert sorted(restored.entries("a")) == sorted(
        (assign_to_key_group(k, MAXP, longs), k, "ns", f"a{k}") for k in (-1, -5, 3)
    )


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
@pytest.mark.parametrize("bug", ENCODER_BUGS, ids=lambda bug: bug.name)
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
@pytest.mark.parametrize(
    "cls", [CopyOnWriteStateTable, NestedMapsStateTable], ids=["c-writer", "encode-section"]
)
def test_a_long_section_framed_without_the_gil_is_the_python_loops_bytes(
    cls: TableClass, at: str, needs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One key group of 3,000 entries (the C writer, and the C codec's
    encode_section that the Python writer calls for other tables, release the
    GIL from 1,024 on): immutable states, and one that needs the GIL back (or,
    a big int, does not) first, in the middle or last."""
    entries: list[tuple[Any, Any, Any]] = [
        (i, VOID_NAMESPACE if i % 7 else "é", (i, f"s{i}é", b"x" * (i % 5), 0.5))
        for i in range(3000)
    ]
    if at != "none":
        where = {"first": 0, "middle": 1500, "last": 2999}[at]
        special = {"a list state": [1, 2], "a value handed back": bytearray(b"q")}
        entries[where] = (where, VOID_NAMESPACE, special.get(needs, 2**100))
    table: Table = cls(KeyGroupRange(0, 0), 1)
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


@needs_codec
@pytest.mark.parametrize("role", ["key", "namespace", "state"])
def test_a_long_section_with_a_serializer_c_does_not_run_is_the_python_loops_bytes(
    role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python writer's section of 3,000 entries through the C codec's
    encode_section (a nested table: no C walk) whose key, namespace or state
    serializer C does not run (pickle): framed with the GIL, the Python
    loop's bytes."""
    serializers: dict[str, StateSerializer] = {
        "key": DefaultSerializer(),
        "namespace": DefaultSerializer(),
        "state": DefaultSerializer(),
    }
    serializers[role] = PickleSerializer()
    meta = StateMetaInfo("state", StateKind.VALUE, serializers["namespace"], serializers["state"])
    table: Table = NestedMapsStateTable(
        KeyGroupRange(0, 0), 1, meta=meta, key_serializer=serializers["key"]
    )
    fill(table, None, [(i, "é" if i % 7 == 0 else "n", (i, f"s{i}")) for i in range(3000)])

    def write() -> bytes:
        return written(table.snapshot())

    with_c, with_python = both_ways(write, monkeypatch)
    assert with_c == with_python
    assert with_c[0] == "ok"


# ======================================== the snapshot writer in C (_writer.c)
# write_snapshot hands the blocks to the C writer when the codec is built: states
# of C map snapshots with built-in serializers and no transformer are walked from
# their chunks, every other state of the same block takes the Python path.

WRITER_MAXP = 2  # two key groups: a few thousand entries give maps of several chunks


def bulk_key(key_name: str, i: int) -> Any:
    if key_name == "utf8":
        return f"k{i}é"
    if key_name == "bytes":
        return i.to_bytes(4, "big")
    return i


def bulk_state(state_name: str, i: int) -> Any:
    if state_name == "int32":
        return i
    if state_name == "bytes":
        return str(i).encode()
    if state_name in ("text", "shouting"):
        return 10 + i % 6
    return ([i, "é"], (i, f"s{i}", 0.5), i, f"é{i}")[i % 4]


def drop_thirds(state: Any) -> Any:
    """A snapshot transformer: drops int states divisible by 3."""
    return None if type(state) is int and state % 3 == 0 else state


@dataclass(frozen=True)
class WriterState:
    cls: TableClass
    ns_name: str
    state_name: str
    transformer: bool
    entries: list[tuple[Any, Any, Any]]
    bulk: int


@st.composite
def writer_files(draw: st.DrawFn) -> tuple[str, list[WriterState]]:
    key_name = draw(st.sampled_from(list(CODEC_KEYS)))
    states = []
    for _ in range(draw(st.integers(1, 3))):
        ns_name = draw(st.sampled_from(list(CODEC_NAMESPACES)))
        state_name = draw(st.sampled_from(list(CODEC_STATES)))
        entries = draw(
            st.lists(
                st.tuples(
                    CODEC_KEYS[key_name][1],
                    CODEC_NAMESPACES[ns_name][1],
                    CODEC_STATES[state_name][1],
                ),
                max_size=20,
            )
        )
        # maps of one chunk, of two (2,400: 1,200 per key group) and rehashing
        # from one chunk to two (1,700: 850 per key group)
        bulk = draw(st.sampled_from([0, 0, 40, 1700, 2400, 2400]))
        # mostly what the C writer walks: C map snapshots without a transformer
        walked: list[TableClass] = [CopyOnWriteStateTable, CopyOnWriteStateTable]
        cls = draw(st.sampled_from([*walked, *TABLES]))
        transformer = draw(st.sampled_from([False, False, True]))
        states.append(WriterState(cls, ns_name, state_name, transformer, entries, bulk))
    return key_name, states


def writer_tables(key_name: str, states: list[WriterState]) -> list[Table]:
    key_ser = CODEC_KEYS[key_name][0]
    tables = []
    for state_id, state in enumerate(states):
        meta = StateMetaInfo(
            f"s{state_id}",
            StateKind.VALUE,
            CODEC_NAMESPACES[state.ns_name][0],
            CODEC_STATES[state.state_name][0],
            snapshot_transformer=drop_thirds if state.transformer else None,
        )
        table: Table = state.cls(
            KeyGroupRange(0, WRITER_MAXP - 1), WRITER_MAXP, meta=meta, key_serializer=key_ser
        )
        namespace = "a" if state.ns_name == "rows" else ("w" if state.ns_name == "utf8" else 7)
        bulk = [
            (bulk_key(key_name, i), namespace, bulk_state(state.state_name, i))
            for i in range(state.bulk)
        ]
        for key, ns, value in state.entries + bulk:
            with contextlib.suppress(CowStateError):  # a key of another type than the first
                table.put(key, ns, value)
        tables.append(table)
    return tables


def check_writer_file(codec: Any, key_name: str, states: list[WriterState]) -> None:
    """The C writer's file (``codec``) is the Python loops' byte for byte, or both
    writes fail alike."""
    tables = writer_tables(key_name, states)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ccodec, "CODEC", codec)
        first = [t.snapshot() for t in tables]
        second = [t.snapshot() for t in tables]
        with_c = outcome(lambda: written(first))
        patch.setattr(ccodec, "CODEC", None)
        with_python = outcome(lambda: written(second))
    assert with_c == with_python
    for snap in first + second:
        assert snap.is_released


@needs_codec
@given(writer_files())
def test_the_c_writer_writes_the_python_loops_bytes_for_every_state_shape(
    case: tuple[str, list[WriterState]],
) -> None:
    """Up to three states in one file: walked C map snapshots (one chunk, several,
    rehashing), beside pure-map, nested, transformed and Python-serializer states
    and values handed back, which take the Python path in the same blocks."""
    check_writer_file(ccodec.CODEC, *case)


#: Changes between a heap delta's base and its snapshot: (operation, which of the
#: state's mappings, which of its states is put).
DeltaChange = tuple[str, int, int]


@st.composite
def writer_deltas(draw: st.DrawFn) -> tuple[str, list[WriterState], list[DeltaChange]]:
    """A file's states as ``writer_files`` draws them, in C map tables that track
    changes (what a heap delta walks), and the changes made after the base."""
    key_name, states = draw(writer_files())
    # maps of one chunk here: check_a_delta_of_every_kind_of_change walks two
    states = [
        replace(s, cls=CopyOnWriteStateTable, transformer=False, bulk=min(s.bulk, 40))
        for s in states
    ]
    change = st.tuples(
        st.sampled_from(["put", "remove", "get", "get and mutate"]),
        st.integers(0, 60),
        st.integers(0, 60),
    )
    return key_name, states, draw(st.lists(change, max_size=40))


@st.composite
def writer_deltas_across_a_later_snapshot(
    draw: st.DrawFn,
) -> tuple[str, list[WriterState], list[DeltaChange], list[DeltaChange]]:
    """``writer_deltas``, and the changes made after a snapshot that is not the
    base."""
    key_name, states, changes = draw(writer_deltas())
    change = st.tuples(
        st.sampled_from(["put", "remove", "get", "get and mutate"]),
        st.integers(0, 60),
        st.integers(0, 60),
    )
    return key_name, states, changes, draw(st.lists(change, min_size=1, max_size=20))


def mappings_of(table: Table) -> list[tuple[Any, Any]]:
    """The table's (key, namespace) pairs (through a snapshot: take it before
    the base, so the changes are made at the base's version)."""
    present = table.snapshot()
    pairs = [
        (key, namespace)
        for key_group in present.key_group_range
        for key, namespace, _ in present.key_group_items(key_group)
    ]
    present.release()
    return pairs


def change_tables(
    tables: list[Table],
    mappings: list[list[tuple[Any, Any]]],
    states: list[WriterState],
    changes: list[DeltaChange],
    *,
    after_snapshot: bool = False,
) -> None:
    """Apply ``changes`` to every table: puts of another mapping's state,
    removals, gets, and gets whose list or dict state is then mutated in place
    (rule T must record those). ``after_snapshot``: the owner's writes while
    a snapshot is written, so no state of ImmutableSerializer (whose user
    promises never to mutate one in place) is mutated."""
    for table, pairs, state in zip(tables, mappings, states, strict=True):
        values = [value for _, _, value in state.entries] or [None]
        promised = isinstance(CODEC_STATES[state.state_name][0], ImmutableSerializer)
        for operation, which, value in changes:
            if not pairs:
                break
            key, namespace = pairs[which % len(pairs)]
            with contextlib.suppress(CowStateError):  # a key or state of another type
                if operation == "put" and values[value % len(values)] is not None:
                    table.put(key, namespace, copy.deepcopy(values[value % len(values)]))
                elif operation == "remove":
                    table.remove(key, namespace)
                else:
                    got = table.get(key, namespace)
                    if after_snapshot and promised:
                        continue
                    if operation == "get and mutate" and isinstance(got, list):
                        got.append(len(got))
                    elif operation == "get and mutate" and isinstance(got, dict):
                        got[len(got)] = "new"


def check_delta_file(
    codec: Any,
    key_name: str,
    states: list[WriterState],
    changes: list[DeltaChange],
    later: Sequence[DeltaChange] = (),
) -> None:
    """A heap delta's changes file (a snapshot read ``only_changed_since`` its
    base) by the C writer (``codec``) is the Python loops' byte for byte, or both
    writes fail alike. ``later``: changes made after a snapshot that is not the
    base (taken and released after ``changes``): the chunks they touch start
    their marks over after the base (rule M of _cmap.c), so the writer must walk
    those chunks whole. And frozen (I6 of cowstate.heap_incremental: the
    changes held apart by ``codec``'s freeze_changes, the map snapshots
    released) at the same moment, then ``changes`` made again -- puts,
    removals, lists mutated in place after a get --, the same file comes out
    of the C writer and of the Python loops: the owner's writes after the
    synchronous part reach none of it."""
    tables = writer_tables(key_name, states)
    for table in tables:
        for key_group in table.key_group_range:
            table.state_map(key_group).track_changes()  # type: ignore[attr-defined]
    mappings = [mappings_of(table) for table in tables]
    base = [table.snapshot() for table in tables]
    versions = [snap.map_versions() for snap in base]  # type: ignore[attr-defined]
    for snap in base:
        snap.release()
    change_tables(tables, mappings, states, changes)  # at the base's version, as a backend
    if later:
        for snap in [t.snapshot() for t in tables]:
            snap.release()
        change_tables(tables, mappings, states, list(later))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ccodec, "CODEC", codec)
        first = [t.snapshot() for t in tables]
        second = [t.snapshot() for t in tables]
        for snap, since in zip(first + second, versions + versions, strict=True):
            snap.only_changed_since(since)  # type: ignore[attr-defined]
        frozen = [frozen_delta(tables, versions, codec) for _ in ("C", "Python")]
        with_c = outcome(lambda: written(first))
        patch.setattr(ccodec, "CODEC", None)
        with_python = outcome(lambda: written(second))
        change_tables(tables, mappings, states, changes, after_snapshot=True)  # the owner goes on
        frozen_python = outcome(lambda: written(frozen[1]))
        patch.setattr(ccodec, "CODEC", codec)
        frozen_c = outcome(lambda: written(frozen[0]))
    assert with_c == with_python
    assert frozen_c == with_python
    assert frozen_python == with_python


def frozen_delta(
    tables: list[Table], versions: list[tuple[int, ...]], codec: Any
) -> list[StateTableSnapshot[Any, Any, Any]]:
    """Every table's snapshot read only_changed_since ``versions``, its changes
    frozen by ``codec`` (I6 of cowstate.heap_incremental)."""
    snaps = [t.snapshot() for t in tables]
    for snap, since in zip(snaps, versions, strict=True):
        assert isinstance(snap, CopyOnWriteStateTableSnapshot)
        snap.only_changed_since(since)
        snap.freeze_changes(codec.freeze_changes, codec.snapshot_type())
    return snaps


@needs_codec
@given(writer_deltas())
def test_the_c_writer_writes_the_python_loops_bytes_for_a_heap_delta(
    case: tuple[str, list[WriterState], list[DeltaChange]],
) -> None:
    """Only what changed since the base (rule T: put, replaced, handed out by a
    get, mutated in place): the C writer's walk filtered by state_version, the
    Python loops' changed_items, beside states of the Python path."""
    check_delta_file(ccodec.CODEC, *case)


@needs_codec
@given(writer_deltas_across_a_later_snapshot())
def test_the_c_writer_writes_the_python_loops_bytes_for_a_delta_across_a_later_snapshot(
    case: tuple[str, list[WriterState], list[DeltaChange], list[DeltaChange]],
) -> None:
    """A snapshot that is not the base (a savepoint, a failed checkpoint) taken
    between the base and the delta: the chunks changed after it are walked
    whole, not by their marks (rule M of _cmap.c)."""
    key_name, states, changes, later = case
    check_delta_file(ccodec.CODEC, key_name, states, changes, later)


@needs_codec
@given(
    st.sampled_from(sorted(CODEC_KEYS)),
    st.sampled_from(sorted(CODEC_NAMESPACES)),
    st.data(),
)
def test_the_c_codec_frames_a_removals_file_as_the_python_loop_does(
    key_name: str, namespace_name: str, data: st.DataObject
) -> None:
    """A heap delta's removals file (empty state bytes) by the C writer (and
    encode_section for a state of a serializer it does not know) is the
    Python loop's byte for byte, or both fail alike: built-in serializers and
    others (pickle, rows), two states; and so with the removals held as the
    synchronous part holds them (``held_removals``: the C codec's
    ``flat_removals``), through the C writer and through the Python loop."""
    key_ser, keys = CODEC_KEYS[key_name]
    namespace_ser, namespaces = CODEC_NAMESPACES[namespace_name]
    pairs = st.lists(st.tuples(keys, namespaces), min_size=1, max_size=4)
    removals = [data.draw(st.dictionaries(st.integers(0, 3), pairs, max_size=4)) for _ in (0, 1)]
    metadata = SnapshotMetadata(
        format=SnapshotFormat.HEAP_REMOVALS,
        max_parallelism=4,
        key_group_range=(0, 3),
        key_serializer=key_name,
        states=(COUNTS, NAMES),
    )
    serializers = [(key_ser, namespace_ser)] * 2

    def removals_file(held: Sequence[Mapping[int, Any]] = removals) -> bytes:
        stream = io.BytesIO()
        write_removals(stream, metadata, held, serializers)
        return stream.getvalue()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ccodec, "CODEC", ccodec.BUILT)
        with_c = outcome(removals_file)
        flat = [{kg: held_removals(p) for kg, p in groups.items()} for groups in removals]
        frozen_type = getattr(ccodec.BUILT, "FrozenChanges", None)
        assert all(type(h) is frozen_type for g in flat for h in g.values())
        held_c = outcome(lambda: removals_file(flat))
        patch.setattr(ccodec, "CODEC", None)
        with_python = outcome(removals_file)
        patch.setattr(ccodec, "CODEC", ccodec.BUILT)  # flat_removals' form, then no codec
        flat = [{kg: held_removals(p) for kg, p in groups.items()} for groups in removals]
        patch.setattr(ccodec, "CODEC", None)
        held_python = outcome(lambda: removals_file(flat))
    assert with_c == with_python
    assert held_c == with_python
    assert held_python == with_python


@needs_codec
def test_the_c_writer_writes_a_delta_of_every_kind_of_change_across_chunks() -> None:
    check_a_delta_of_every_kind_of_change(ccodec.CODEC)


@needs_codec
def test_the_c_writer_walks_whole_the_chunks_changed_after_a_later_snapshot() -> None:
    check_a_delta_across_a_later_snapshot(ccodec.CODEC)


def check_a_delta_of_every_kind_of_change(codec: Any) -> None:
    """One delta of a map of two chunks per key group: puts, removals, a get and
    a get mutated in place, each at the base's version (first, middle and last
    of the map's entries), beside a state with nothing changed."""
    entries = [(i, "n", [i]) for i in range(0, 3000, 7)]
    changed = WriterState(CopyOnWriteStateTable, "default", "default", False, entries, 2400)
    unchanged = WriterState(CopyOnWriteStateTable, "default", "default", False, [], 40)
    n = len(entries) + 2400
    operations = ("put", "remove", "get", "get and mutate")
    changes = [  # each on a mapping of its own: near the first, the middle and the last
        (operation, at + k if at < n - 1 else at - k, at + 1)
        for at in (0, n // 2, n - 1)
        for k, operation in enumerate(operations)
    ]
    check_delta_file(codec, "default", [changed, unchanged], changes)


def check_a_delta_across_a_later_snapshot(codec: Any) -> None:
    """Changes at the base's version near the first, middle and last mapping (in
    bucket order), then a snapshot that is not the base, then a put beside each
    of them: in the same chunk, whose marks then start after the base."""
    entries = [(i, "n", [i]) for i in range(0, 3000, 7)]
    changed = WriterState(CopyOnWriteStateTable, "default", "default", False, entries, 2400)
    n = len(entries) + 2400
    operations = ("put", "remove", "get and mutate")
    at = (0, n // 2, n - 8)
    changes = [(operation, a + k, a + 1) for a in at for k, operation in enumerate(operations)]
    later = [("put", a + 5, a + 2) for a in at]
    check_delta_file(codec, "default", [changed], changes, later)


CHUNK_SIZES = [700, 1540, 1700, 2100, 3500]  # 1540, 1700, 3500: while it rehashes
POSITIONS = ["first", "middle", "last"]


@needs_codec
@pytest.mark.parametrize("size", CHUNK_SIZES)
@pytest.mark.parametrize("at", POSITIONS)
def test_the_c_writer_walks_every_chunk_and_both_tables_of_a_rehashing_map(
    size: int, at: str
) -> None:
    """One key group of a map of one chunk, of several, and snapshotted while it
    rehashes (primary[r:L], rehash[0:r], rehash[L:L+r]); a list state (the GIL
    taken back) first, in the middle or last."""
    check_chunk_walk(ccodec.CODEC, size, at)


def check_chunk_walk(codec: Any, size: int, at: str) -> None:
    table: Table = CopyOnWriteStateTable(KeyGroupRange(0, 0), 1)
    entries: list[tuple[Any, Any, Any]] = [(i, VOID_NAMESPACE, f"é{i}") for i in range(size)]
    where = {"first": 0, "middle": size // 2, "last": size - 1}[at]
    entries[where] = (where, VOID_NAMESPACE, [where])
    fill(table, None, entries)
    rehashing = describe(table.state_map(0)).is_rehashing
    assert rehashing == (size in (1540, 1700, 3500)), "the sizes no longer hit a rehash"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ccodec, "CODEC", codec)
        c_file = written(table.snapshot())
        patch.setattr(ccodec, "CODEC", None)
        assert c_file == written(table.snapshot())
    restored = read_snapshot(c_file, KeyGroupRange(0, 0))
    assert restored_contents(restored) == contents(entries)


def hunt_writer_files(codec: Any) -> None:
    """The differential over ``writer_files()`` as a bug hunt (200 examples)."""

    @hunt_settings(max_examples=200, stateful_step_count=1)
    @given(writer_files())
    def differential(case: tuple[str, list[WriterState]]) -> None:
        check_writer_file(codec, *case)

    differential()


def walk_every_chunk(codec: Any) -> None:
    for size in CHUNK_SIZES:
        for at in POSITIONS:
            check_chunk_walk(codec, size, at)


#: The check of this section that must catch each planted writer bug: the hunt
#: reaches a key group's first bucket of a second chunk only now and then (the
#: chunk walks always do), and the release order is not in the bytes.
WRITER_BUG_CATCHERS: dict[str, Callable[[Any], None]] = {
    "writer-skips-an-entry-at-a-chunk-boundary": walk_every_chunk,
    "writer-crc-over-a-stale-buffer": hunt_writer_files,
    "writer-non-ascii-frame-off-by-one": hunt_writer_files,
    "writer-releases-a-key-group-before-encoding-it": lambda codec: check_release_order(
        CopyOnWriteStateTable, codec
    ),
    "writer-delta-misses-changes-at-the-base-version": check_a_delta_of_every_kind_of_change,
    "writer-trusts-marks-of-a-later-era": check_a_delta_across_a_later_snapshot,
    "writer-freezes-a-mutable-state": check_a_delta_of_every_kind_of_change,
}


@needs_codec
@pytest.mark.parametrize("bug", WRITER_BUGS, ids=lambda bug: bug.name)
def test_the_writer_checks_catch_the_planted_writer_bug(bug: Any) -> None:
    """Each planted writer bug fails its check of this section, which passes on the
    same build without it."""
    bad = build_codec(bug)
    assert bug.number == bad.WRITER_BUG
    catch = WRITER_BUG_CATCHERS[bug.name]
    with pytest.raises(AssertionError):
        catch(bad)
    control = build_codec()
    if catch is hunt_writer_files:  # one file the hunt's bad builds fail on, not 200
        walked = WriterState(CopyOnWriteStateTable, "utf8", "default", False, [], 2400)
        check_writer_file(control, "utf8", [walked])
        with pytest.raises(AssertionError):
            check_writer_file(bad, "utf8", [walked])
    else:
        catch(control)


@needs_codec
@pytest.mark.parametrize("buffer_size", [0, 1, 5000, 1 << 20])
def test_a_buffered_write_hands_whole_blocks_to_the_stream(
    buffer_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes hand over the header and whole blocks once ``buffer_size`` bytes
    wait, the rest (and the index and footer) at the end; the bytes are those
    of an unbuffered write, with the C writer and the Python loops."""

    class Recording(io.BytesIO):
        def __init__(self) -> None:
            super().__init__()
            self.sizes: list[int] = []

        def write(self, data: Any, /) -> int:
            self.sizes.append(len(data))
            return super().write(data)

    table: Table = CopyOnWriteStateTable(SMALL_RANGE, SMALL_MAXP)
    fill(table, None, [(i, VOID_NAMESPACE, f"é{i}" * 20) for i in range(600)])
    unbuffered = io.BytesIO()
    write_snapshot(table.snapshot(), unbuffered, buffer_size=0)

    def write() -> tuple[bytes, list[int]]:
        stream = Recording()
        write_snapshot(table.snapshot(), stream, buffer_size=buffer_size)
        return stream.getvalue(), stream.sizes

    with_c, with_python = both_ways(write, monkeypatch)
    for outcome_ in (with_c, with_python):
        data, sizes = outcome_[1]
        assert data == unbuffered.getvalue()
        layout = decode_layout(data)
        ends = {layout.data_start, len(data)} | {b.offset + b.size for b in layout.blocks}
        at, waited = 0, []
        for size in sizes:
            at += size
            assert at in ends, (at, sizes)  # whole blocks, the header, the index and footer
            if at != layout.data_start:  # the header may go alone, before the blocks
                waited.append(size)
        assert all(size >= buffer_size for size in waited[:-2]), sizes  # [-2:]: what was left
    if buffer_size == 1 << 20:
        assert len(with_c[1][1]) <= 3  # the header, the blocks, the index and footer


@pytest.mark.parametrize("buffer_size", [-1, True, 1.5, "8"])
def test_a_buffer_size_that_is_not_a_count_of_bytes_is_refused(buffer_size: Any) -> None:
    table: Table = CopyOnWriteStateTable(SMALL_RANGE, SMALL_MAXP)
    snapshot = table.snapshot()
    with pytest.raises(InvalidArgumentError, match="expected a buffer_size of 0 or more bytes"):
        write_snapshot(snapshot, io.BytesIO(), buffer_size=buffer_size)
    assert snapshot.is_released


@needs_codec
@pytest.mark.parametrize("walked_id", [0, 1])
@pytest.mark.parametrize("key_groups", [(1, 1), (0, 1), (1, 0)])
def test_the_c_writer_raises_the_error_the_python_loops_raise_first(
    walked_id: int, key_groups: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walked state refusing a value (a bool for IntSerializer) and a state of
    the Python path refusing one (a SubInt for the value codec), in the same key
    group or in either order: the C writer raises the error the Python loops
    meet first (key group by key group, state by state), where it raised the
    Python path's error of a later state or key group first."""
    walked_kg, python_kg = key_groups
    key_in = {kg: next(k for k in range(100) if model_key_group(k, 2) == kg) for kg in (0, 1)}
    walked = StateMetaInfo("walked", StateKind.VALUE, DefaultSerializer(), IntSerializer())
    python = StateMetaInfo("python", StateKind.VALUE, RowsSerializer(), DefaultSerializer())
    metas = [walked, python] if walked_id == 0 else [python, walked]
    tables: list[Table] = []
    for meta in metas:
        table: Table = CopyOnWriteStateTable(KeyGroupRange(0, 1), 2, meta=meta)
        fill(table, None, [(k, "a", 5) for k in range(40)])
        refused_kg, refused = (walked_kg, True) if meta is walked else (python_kg, SubInt(3))
        table.put(key_in[refused_kg], "a", refused)
        tables.append(table)

    def write() -> bytes:
        return written([t.snapshot() for t in tables])

    with_c, with_python = both_ways(write, monkeypatch)
    assert with_c == with_python
    assert with_c[0] == "error"


# ------------------------------------- checkpoint loops leak nothing (issue 28)


@pytest.mark.parametrize("incremental", [False, True], ids=["full", "heap-deltas"])
def test_checkpoint_loops_through_the_c_writer_and_c_reader_leak_no_reference_and_no_memory(
    tmp_path: Path, incremental: bool
) -> None:
    """A job's checkpoint loop -- the owner changes value, list and map
    states, the coordinator takes a checkpoint (the C writer walks the C
    maps' snapshots into files; with ``incremental``, mostly heap deltas: the
    value states' changes frozen (I6), the list and map states' refused, the
    removals held as flat_removals), retention deletes the older one, and a
    new backend restores the newest (the C reader; a chain: the base and its
    deltas) -- run 52 times: every key and
    state the owner holds is back at its reference count, the interpreter's
    memory grows by less than one object leaked per restored entry would add,
    and malloc's does not grow. Under ``make sanitize``, LeakSanitizer checks
    the C code's own allocations too, over 8 runs (``leak_support.cycles``)."""
    from leak_support import cycles, traced_growth
    from test_c_codec import malloc_in_use

    from cowstate import HeapKeyedStateBackend
    from cowstate.checkpoint import CheckpointCoordinator, CheckpointStorage
    from cowstate.checkpoint.location import SnapshotSource
    from cowstate.checkpoint.storage import read_metadata
    from cowstate.descriptors import (
        ListStateDescriptor,
        MapStateDescriptor,
        ValueStateDescriptor,
    )

    assert ccodec.CODEC is not None and cowstate.IMPLEMENTATION == "c", "the C writer and reader"
    value_d: ValueStateDescriptor[Any] = ValueStateDescriptor("value", default=None)
    list_d = ListStateDescriptor("list")
    map_d = MapStateDescriptor("map")
    descriptors = [value_d, list_d, map_d]
    keys = ["".join(list(f"key-é-{i}")) for i in range(100)]  # uninterned: counted alone
    # the map states' keys are interned, as the reader interns the dict keys it
    # decodes: decoding finds them, so restores add no interned strings (each
    # one that died would leave the interpreter's interned table a dummy, and
    # the table's reallocation, a megabyte at once, would land in a window)
    states = [(sys.intern(f"state-{i}"), 1000 + i * 7919, 2**70 + i) for i in range(100)]
    range_ = KeyGroupRange(0, 127)
    # every round changes every key: deltas as big as the base, four in a chain
    options = IncrementalOptions(max_deltas=4, max_delta_ratio=10.0) if incremental else None
    owner = HeapKeyedStateBackend(range_, 128, incremental=options or False)
    value, list_, map_ = owner.get_state(value_d), owner.get_state(list_d), owner.get_state(map_d)
    storage = CheckpointStorage(str(tmp_path), "job")
    coordinator = CheckpointCoordinator(storage, [owner], num_retained=1)

    def change(round_: int) -> None:
        for i, key in enumerate(keys):
            owner.set_current_key(key)
            if (i + round_) % 5 == 0:  # removed and put back, with a snapshot open or not
                value.clear()
                list_.clear()
                map_.clear()
            value.update(states[i])
            list_.update([states[i][0], states[i][1]])
            map_.put(states[i][0], states[i][2])

    def expected() -> dict[str, dict[Any, Any]]:
        return {d.name: {(k, n): s for k, n, s in owner.entries(d.name)} for d in descriptors}

    def logged() -> collections.Counter[int]:
        """Per key (by id): the records of the maps' removal logs that hold it
        (rule D: a delta's base keeps the removals since it)."""
        records: collections.Counter[int] = collections.Counter()
        for d in descriptors if incremental else ():
            table = owner.table(d.name)
            for key_group in range_:
                tracked = table.state_map(key_group)
                for removed, _ in tracked.removals_since(tracked.tracking_since) or ():  # type: ignore[attr-defined]
                    records[id(removed)] += 1
        return records

    def references() -> list[int]:
        """The reference counts of ``counted`` but the removal logs'."""
        records = logged()
        return [sys.getrefcount(o) - records[id(o)] for o in counted]

    rounds = iter(range(10**6))
    deltas: list[bool] = []

    def cycle() -> None:
        change(next(rounds))
        completed = coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
        metadata = read_metadata(storage.filesystem, completed.directory)
        if incremental:
            delta = len(metadata.subtasks[0].files) > 1
            deltas.append(delta)
        restored = HeapKeyedStateBackend(range_, 128, incremental=options or False)
        try:
            for d in descriptors:
                restored.get_state(d)
            restored.restore_from(
                metadata.subtasks, SnapshotSource(storage.filesystem, completed.directory)
            )
            got = {d.name: {(k, n): s for k, n, s in restored.entries(d.name)} for d in descriptors}
            assert got == expected()
        finally:
            restored.close()

    try:
        change(0)
        counted = [*keys, *(s for triple in states for s in triple)]
        baseline = references()
        cycle()  # the first checkpoint and restore fill caches
        # twice: what fills once (caches, a worker process's earlier tests'
        # leftovers) grows in the first window only, a leak in both
        count = cycles(25)  # make sanitize: 3
        first = traced_growth(cycle, count)
        before = malloc_in_use()
        grown = traced_growth(cycle, count)
        gc.collect()
        grown_malloc = malloc_in_use() - before
        assert references() == baseline
        # 25 checkpoints restore 7,500 entries: one object leaked per entry
        # restored would be 240 KB or more. (Under make sanitize -- the malloc
        # allocator, every block traced -- blocks the reader allocated grow by
        # about 3.8 KB a checkpoint while no reference of the owner's moves:
        # not explained yet, written down in issue 28's note.)
        assert grown < 160 * 1024, (
            f"traced memory grew by {grown} bytes over {count} checkpoints "
            f"({first} the {count} before)"
        )
        assert grown_malloc < 2 * 1024 * 1024, f"malloc'd memory grew by {grown_malloc} bytes"
        assert owner.pending_snapshots == 0
        if incremental:  # mostly deltas: every fifth checkpoint starts a chain
            assert sum(deltas) >= len(deltas) * 3 // 5, deltas
    finally:
        owner.close()
