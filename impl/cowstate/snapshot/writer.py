"""Writing snapshot files: :class:`SnapshotWriter` (raw bytes, key group by key
group, the layout of :mod:`cowstate.snapshot.format`) and :func:`write_snapshot`
(table snapshots, serialized and released key group by key group).

When the C codec is built (:mod:`cowstate.snapshot.ccodec`),
:func:`write_snapshot` hands the blocks to the snapshot writer in C
(``impl/cowstate/_writer.c``, whose header is the design): a state whose
table snapshot is one C map snapshot per key group, without a snapshot
transformer, with built-in key, namespace and state serializers, is encoded
straight from the snapshot's chunks, mostly without the GIL (for a heap
delta's changes, a table snapshot set to ``only_changed_since``, only the
entries changed since the base: rule T of ``_cmap.c``); every other
state of the same block goes through :func:`_state_section` -- the Python
path, which encodes each state's entries of a key group in one call of the
C codec's ``encode_section`` (built-in serializers in C, any other
serializer, and any value the C codec hands back, through its Python method,
once per value in the same order). The file is byte for byte the Python
loop's, which runs when the codec is absent (``COWSTATE_PURE_PYTHON=1``).

Output is buffered: whole blocks are handed to the stream once
``buffer_size`` bytes wait (0: each block at once), and at the end. A key
group is released once its block is handed over (to the stream, or into the
buffer); cancellation is checked before each key group.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cowstate.errors import (
    InvalidArgumentError,
    SnapshotCancelledError,
)
from cowstate.serializers import serializer_identifier
from cowstate.snapshot import ccodec
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
    BinaryWriter,
    EncodedEntries,
    RawEntry,
    SnapshotFileInfo,
    SnapshotMetadata,
)
from cowstate.state_meta import MAX_STATES, SnapshotFormat
from cowstate.state_table import CopyOnWriteStateTableSnapshot, StateTableSnapshot

__all__ = ["SnapshotWriter", "framed_section", "write_snapshot"]

#: One state's entries of a block: raw rows, or framed by the C codec.
Entries = Sequence[RawEntry] | EncodedEntries

#: How many bytes of whole blocks :func:`write_snapshot` buffers by default:
#: 8 MiB. Each ``stream.write`` of a file releases the GIL and takes it back,
#: and taking it back waits for the owner's switch interval and then stops the
#: owner while the writer finishes its turn: with 1 MiB, a 1M-entry checkpoint
#: made 16 such round trips and the owner ran at 0.63-0.74x of its idle rate
#: beside it; with 8 MiB, 2 round trips and 0.75x (bench_snapshot_codec.py).
DEFAULT_BUFFER_SIZE = 1 << 23


class SnapshotWriter:
    """Writes one snapshot file from raw bytes, key group by key group.

    ``write_key_group(kg, per_state)`` must be called in ascending key-group
    order for key groups of the metadata's range; key groups it skips get an
    empty block, so the file has one block for every key group of its range.
    A state's entries are raw ``(namespace, key, state)`` rows, or
    :class:`~cowstate.snapshot.format.EncodedEntries` framed already.
    ``finish()`` writes the index and footer and returns the
    :class:`SnapshotFileInfo`. The header and whole blocks are handed to the
    stream once ``buffer_size`` bytes wait (0: each at once), the rest by
    ``finish()``.
    """

    def __init__(
        self, stream: BinaryWriter, metadata: SnapshotMetadata, *, buffer_size: int = 0
    ) -> None:
        self._stream = stream
        self._metadata = metadata
        self._range = metadata.range
        self._offsets: dict[int, int] = {}
        self._position = 0
        self._entries = 0
        self._last = -1
        self._buffer_size = buffer_size
        self._pending: list[bytes] = []
        self._pending_size = 0
        meta = metadata.model_dump_json().encode("utf-8")
        head = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(meta)) + meta
        self._write(head + _U32.pack(zlib.crc32(head)))
        self._hand_over()

    def write_key_group(self, key_group: int, per_state: Mapping[int, Entries]) -> None:
        """Write the block of ``key_group``: ``per_state[state_id]`` = its entries."""
        if key_group not in self._range or key_group <= self._last:
            raise InvalidArgumentError(
                f"expected key groups of {self._range!r} in ascending order, got {key_group} "
                f"after {self._last}"
            )
        for skipped in range(max(self._last + 1, self._range.start_key_group), key_group):
            self._write_block(skipped, {})
        self._write_block(key_group, per_state)

    def _write_block(self, key_group: int, per_state: Mapping[int, Entries]) -> None:
        sections = [framed_section(state_id, per_state[state_id]) for state_id in sorted(per_state)]
        count = sum(section_count for section_count, _ in sections)
        payload = b"".join(data for _, data in sections)
        head = _BLOCK.pack(key_group, count, len(payload))
        crc = zlib.crc32(payload, zlib.crc32(head))
        self._offsets[key_group] = self._position
        self._write(head)
        self._write(payload)
        self._write(_U32.pack(crc))
        self._entries += count
        self._last = key_group
        self._hand_over()

    def write_blocks_in_c(
        self,
        codec: ccodec.Codec,
        states: list[ccodec.WalkedState | None],
        cancelled: Callable[[int], object] | None,
        written: Callable[[int], object] | None,
        python_section: Callable[[int, int], tuple[int, bytes]],
    ) -> None:
        """Every key group's block by the C writer (``codec.write_blocks``: its
        ``states`` walked or frozen, ``python_section(state_id, kg)`` framing
        the others), straight after the header; :meth:`finish` follows."""
        first, last = self._range.start_key_group, self._range.end_key_group
        self._flush()
        offsets, entries, position = codec.write_blocks(
            self._stream,
            self._position,
            first,
            last,
            states,
            cancelled,
            written,
            python_section,
            self._buffer_size,
        )
        self._blocks_written(first, offsets, entries, position)

    def _blocks_written(
        self, first: int, offsets: Sequence[int], entries: int, position: int
    ) -> None:
        """The C writer wrote the blocks of key groups ``first``.. to the stream
        (after :meth:`_flush`), the last one ending at ``position``."""
        for index, offset in enumerate(offsets):
            self._offsets[first + index] = offset
        self._entries += entries
        self._position = position
        self._last = first + len(offsets) - 1

    def finish(self) -> SnapshotFileInfo:
        """Write the index and the footer; the stream is flushed, not closed."""
        for skipped in range(
            max(self._last + 1, self._range.start_key_group), self._range.end_key_group + 1
        ):
            self._write_block(skipped, {})
        index_at = self._position
        index = _U32.pack(len(self._offsets)) + b"".join(
            _INDEX_ENTRY.pack(kg, offset) for kg, offset in self._offsets.items()
        )
        self._write(index + _U32.pack(zlib.crc32(index)))
        self._write(_FOOTER.pack(index_at, END_MAGIC))
        self._flush()
        self._stream.flush()
        return SnapshotFileInfo(self._metadata, dict(self._offsets), self._position, self._entries)

    def _write(self, data: bytes) -> None:
        self._position += len(data)
        self._pending.append(data)
        self._pending_size += len(data)

    def _hand_over(self) -> None:
        """After the header or a block: to the stream once ``buffer_size`` bytes wait."""
        if self._pending_size >= self._buffer_size:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            self._pending_size = 0
            self._stream.write(data)


def framed_section(state_id: int, entries: Entries) -> tuple[int, bytes]:
    """One state's section of a block: (entry count, bytes), (0, b"") if empty."""
    if isinstance(entries, EncodedEntries):
        if not entries.count:
            return 0, b""
        return entries.count, _STATE.pack(state_id, entries.count) + entries.data
    if not entries:
        return 0, b""
    pack_u32 = _U32.pack
    parts = [_STATE.pack(state_id, len(entries))]
    for namespace, key, state in entries:
        parts += (
            pack_u32(len(namespace)),
            namespace,
            pack_u32(len(key)),
            key,
            pack_u32(len(state)),
            state,
        )
    return len(entries), b"".join(parts)


def write_snapshot(
    snapshots: StateTableSnapshot[Any, Any, Any] | Sequence[StateTableSnapshot[Any, Any, Any]],
    stream: BinaryWriter,
    *,
    snapshot_format: SnapshotFormat = SnapshotFormat.HEAP,
    cancel: threading.Event | None = None,
    release: bool = True,
    buffer_size: int = DEFAULT_BUFFER_SIZE,
    parent: tuple[int, int] | None = None,
    checkpoint_id: int | None = None,
) -> SnapshotFileInfo:
    """Write table snapshots (one per state, same key-group range) to ``stream``.

    Each key group's map snapshots are released as soon as the key group's
    block is handed over (to the stream, or into the buffer of up to
    ``buffer_size`` bytes of whole blocks; 0: no buffer), and, with
    ``release`` (the default), all of them in the end whatever happens.
    ``cancel`` is checked before each key group: once set,
    :class:`~cowstate.errors.SnapshotCancelledError` is raised. ``parent``
    and ``checkpoint_id`` are recorded in the metadata (a file of a heap
    incremental chain).
    """
    tables = [snapshots] if isinstance(snapshots, StateTableSnapshot) else list(snapshots)
    try:
        metadata = _metadata_of(tables, snapshot_format, parent, checkpoint_id)
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 0:
            raise InvalidArgumentError(
                f"expected a buffer_size of 0 or more bytes, got {buffer_size!r}"
            )
        writer = SnapshotWriter(stream, metadata, buffer_size=buffer_size)
        sections = _Sections(tables, ccodec.CODEC)

        def cancelled(key_group: int) -> None:
            if cancel is not None and cancel.is_set():
                raise SnapshotCancelledError(
                    f"snapshot cancelled before key group {key_group} was written"
                )

        def written(key_group: int) -> None:
            for snap in tables:
                snap.release_key_group(key_group)

        first, last = metadata.key_group_range
        walked = sections.walked()
        if sections.codec is not None and first <= last and any(s is not None for s in walked):
            writer.write_blocks_in_c(
                sections.codec,
                walked,
                None if cancel is None else cancelled,
                written,
                sections.section,
            )
            return writer.finish()
        for key_group in range(first, last + 1):
            cancelled(key_group)
            per_state: dict[int, Entries] = {}
            for state_id, snap in enumerate(tables):
                items = snap.key_group_items(key_group)
                per_state[state_id] = sections.entries(state_id, items)
            writer.write_key_group(key_group, per_state)
            written(key_group)
        return writer.finish()
    finally:
        if release:
            for snap in tables:
                snap.release()


class _Sections:
    """The Python path of each state's entries of a key group, and which states
    the C writer walks itself (the module docstring)."""

    def __init__(
        self, tables: Sequence[StateTableSnapshot[Any, Any, Any]], codec: ccodec.Codec | None
    ) -> None:
        self.tables = tables
        self.codec = codec
        self.serializers = [
            (
                snap.key_serializer.serialize,
                snap.meta.namespace_serializer.serialize,
                snap.meta.state_serializer.serialize,
            )
            for snap in tables
        ]
        self.kinds = [
            (ccodec.encoder_kind(key), ccodec.encoder_kind(ns), ccodec.encoder_kind(state))
            for key, ns, state in self.serializers
        ]

    def walked(self) -> list[ccodec.WalkedState | None]:
        """Per state: what the C writer needs to walk its map snapshots, or None."""
        codec = self.codec
        snap_type = None if codec is None else codec.snapshot_type()
        frozen_type = None if codec is None else codec.FrozenChanges
        states: list[ccodec.WalkedState | None] = []
        for state_id, snap in enumerate(self.tables):
            maps = snap.map_snapshots() if isinstance(snap, CopyOnWriteStateTableSnapshot) else None
            kinds = self.kinds[state_id]
            if (
                snap_type is None
                or maps is None
                or snap.meta.snapshot_transformer is not None
                or ccodec.KIND_PYTHON in kinds
                or any(type(m) is not snap_type and type(m) is not frozen_type for m in maps)
            ):
                states.append(None)
                continue
            assert isinstance(snap, CopyOnWriteStateTableSnapshot)  # maps is not None
            # a heap delta: the walk frames only what changed since the base (rule T),
            # and a key group's frozen changes (I6 of cowstate.heap_incremental) as they are
            since = None if snap.changed_since is None else list(snap.changed_since)
            states.append((maps, *kinds, *self.serializers[state_id], since))
        return states

    def entries(self, state_id: int, items: Sequence[tuple[Any, Any, Any]]) -> Entries:
        """The Python path: one state's entries of a key group, as its table
        snapshot's ``key_group_items`` gave them."""
        key_bytes, namespace_bytes, state_bytes = self.serializers[state_id]
        if self.codec is not None:
            key_kind, namespace_kind, state_kind = self.kinds[state_id]
            encoded = self.codec.encode_section(
                items,
                key_kind,
                key_bytes,
                namespace_kind,
                namespace_bytes,
                state_kind,
                state_bytes,
            )
            if isinstance(encoded, bytes):
                return EncodedEntries(len(items), encoded)
            if encoded is not None:  # rows: a serializer returned other than bytes
                return encoded
        return [
            (namespace_bytes(namespace), key_bytes(key), state_bytes(state))
            for key, namespace, state in items
        ]

    def section(self, state_id: int, key_group: int) -> tuple[int, bytes]:
        """The Python path's framed section (the C writer's ``python_section``)."""
        items = self.tables[state_id].key_group_items(key_group)
        return framed_section(state_id, self.entries(state_id, items))


def _metadata_of(
    tables: Sequence[StateTableSnapshot[Any, Any, Any]],
    snapshot_format: SnapshotFormat,
    parent: tuple[int, int] | None = None,
    checkpoint_id: int | None = None,
) -> SnapshotMetadata:
    if not tables:
        raise InvalidArgumentError("expected at least one table snapshot to write, got none")
    if len(tables) > MAX_STATES:
        raise InvalidArgumentError(
            f"expected at most {MAX_STATES} states in one snapshot, got {len(tables)}"
        )
    first = tables[0]
    for snap in tables[1:]:
        if serializer_identifier(snap.key_serializer) != serializer_identifier(
            first.key_serializer
        ):
            raise InvalidArgumentError(
                f"expected every table snapshot to use the key serializer "
                f"{serializer_identifier(first.key_serializer)!r}, got "
                f"{serializer_identifier(snap.key_serializer)!r} for {snap.meta.name!r}"
            )
        if (
            snap.key_group_range != first.key_group_range
            or snap.max_parallelism != first.max_parallelism
        ):
            raise InvalidArgumentError(
                f"expected every table snapshot to cover {first.key_group_range!r} of "
                f"{first.max_parallelism}, got {snap.key_group_range!r} of "
                f"{snap.max_parallelism} for {snap.meta.name!r}"
            )
    names = [snap.meta.name for snap in tables]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"expected distinct state names, got {names}")
    return SnapshotMetadata(
        format=snapshot_format,
        max_parallelism=first.max_parallelism,
        key_group_range=(
            first.key_group_range.start_key_group,
            first.key_group_range.end_key_group,
        ),
        key_serializer=serializer_identifier(first.key_serializer),
        states=tuple(snap.meta.metadata(state_id) for state_id, snap in enumerate(tables)),
        parent=parent,
        checkpoint_id=checkpoint_id,
    )
