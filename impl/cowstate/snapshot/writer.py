"""Writing snapshot files: :class:`SnapshotWriter` (raw bytes, key group by key
group, the layout of :mod:`cowstate.snapshot.format`) and :func:`write_snapshot`
(table snapshots, serialized and released key group by key group).

:func:`write_snapshot` encodes each state's entries of a key group in one call
of the C codec when it is built (:mod:`cowstate.snapshot.ccodec`): built-in
serializers in C, any other serializer (and any value the C codec hands
back) through its Python method, once per value in the same order -- the
file is byte for byte the Python loop's, which runs when the codec is absent.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Mapping, Sequence
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
from cowstate.state_table import StateTableSnapshot

__all__ = ["SnapshotWriter", "write_snapshot"]

#: One state's entries of a block: raw rows, or framed by the C codec.
Entries = Sequence[RawEntry] | EncodedEntries


class SnapshotWriter:
    """Writes one snapshot file from raw bytes, key group by key group.

    ``write_key_group(kg, per_state)`` must be called in ascending key-group
    order for key groups of the metadata's range; key groups it skips get an
    empty block, so the file has one block for every key group of its range.
    A state's entries are raw ``(namespace, key, state)`` rows, or
    :class:`~cowstate.snapshot.format.EncodedEntries` framed already.
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
        parts: list[bytes] = []
        count = 0
        pack_u32 = _U32.pack
        for state_id in sorted(per_state):
            entries = per_state[state_id]
            if isinstance(entries, EncodedEntries):
                if entries.count:
                    parts += (_STATE.pack(state_id, entries.count), entries.data)
                    count += entries.count
                continue
            if not entries:
                continue
            parts.append(_STATE.pack(state_id, len(entries)))
            for namespace, key, state in entries:
                parts += (
                    pack_u32(len(namespace)),
                    namespace,
                    pack_u32(len(key)),
                    key,
                    pack_u32(len(state)),
                    state,
                )
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
        self._stream.flush()
        return SnapshotFileInfo(self._metadata, dict(self._offsets), self._position, self._entries)

    def _write(self, data: bytes) -> None:
        self._stream.write(data)
        self._position += len(data)


def write_snapshot(
    snapshots: StateTableSnapshot[Any, Any, Any] | Sequence[StateTableSnapshot[Any, Any, Any]],
    stream: BinaryWriter,
    *,
    snapshot_format: SnapshotFormat = SnapshotFormat.HEAP,
    cancel: threading.Event | None = None,
    release: bool = True,
    parent: tuple[int, int] | None = None,
) -> SnapshotFileInfo:
    """Write table snapshots (one per state, same key-group range) to ``stream``.

    Each key group's map snapshots are released as soon as the key group is
    written, and, with ``release`` (the default), all of them in the end
    whatever happens. ``cancel`` is checked between key groups: once set,
    :class:`~cowstate.errors.SnapshotCancelledError` is raised. ``parent``
    is recorded in the metadata (a file of a heap incremental chain).
    """
    tables = [snapshots] if isinstance(snapshots, StateTableSnapshot) else list(snapshots)
    try:
        metadata = _metadata_of(tables, snapshot_format, parent)
        writer = SnapshotWriter(stream, metadata)
        serializers = [
            (
                snap.key_serializer.serialize,
                snap.meta.namespace_serializer.serialize,
                snap.meta.state_serializer.serialize,
            )
            for snap in tables
        ]
        codec = ccodec.CODEC
        kinds = [
            (ccodec.encoder_kind(key), ccodec.encoder_kind(ns), ccodec.encoder_kind(state))
            for key, ns, state in serializers
        ]
        for key_group in metadata.range:
            if cancel is not None and cancel.is_set():
                raise SnapshotCancelledError(
                    f"snapshot cancelled before key group {key_group} was written"
                )
            per_state: dict[int, Entries] = {}
            for state_id, snap in enumerate(tables):
                key_bytes, namespace_bytes, state_bytes = serializers[state_id]
                items = snap.key_group_items(key_group)
                if codec is not None:
                    key_kind, namespace_kind, state_kind = kinds[state_id]
                    encoded = codec.encode_section(
                        items,
                        key_kind,
                        key_bytes,
                        namespace_kind,
                        namespace_bytes,
                        state_kind,
                        state_bytes,
                    )
                    if isinstance(encoded, bytes):
                        per_state[state_id] = EncodedEntries(len(items), encoded)
                        continue
                    if encoded is not None:  # rows: a serializer returned other than bytes
                        per_state[state_id] = encoded
                        continue
                per_state[state_id] = [
                    (namespace_bytes(namespace), key_bytes(key), state_bytes(state))
                    for key, namespace, state in items
                ]
            writer.write_key_group(key_group, per_state)
            for snap in tables:
                snap.release_key_group(key_group)
        return writer.finish()
    finally:
        if release:
            for snap in tables:
                snap.release()


def _metadata_of(
    tables: Sequence[StateTableSnapshot[Any, Any, Any]],
    snapshot_format: SnapshotFormat,
    parent: tuple[int, int] | None = None,
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
    )
