"""The snapshot file format: layout, constants, the metadata models.

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
                      serializer ids; a file of a heap incremental chain also
                      ``parent``: [size, crc32] of the file before it, and
                      ``checkpoint_id``: the checkpoint it was written for
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
A restore then checks what the bytes decode to (:mod:`cowstate.snapshot.checks`):
every key in the block of its own key group, no ``None`` key, namespace or
state, hashable keys and namespaces, no mapping twice.
Any failure raises a :class:`~cowstate.errors.SnapshotFormatError` subclass
naming the offset, and because :func:`~cowstate.snapshot.restore.read_snapshot` decodes everything
before returning and :func:`~cowstate.snapshot.restore.restore_table` writes
only after every file was read, a bad file restores nothing.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from cowstate.key_groups import KeyGroupRange
from cowstate.state_meta import SnapshotFormat, StateMetadata

__all__ = [
    "END_MAGIC",
    "FORMAT_VERSION",
    "MAGIC",
    "BinaryWriter",
    "EncodedEntries",
    "RawEntry",
    "SnapshotFileInfo",
    "SnapshotMetadata",
    "StateMetadata",
]

MAGIC = b"\x89CWSNAP\n"
END_MAGIC = b"CWSNAPIX"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">8sHHI")  # magic, version, flags, metadata length
_U32 = struct.Struct(">I")
_BLOCK = struct.Struct(">iII")  # key group, entry count, payload length
_STATE = struct.Struct(">HI")  # state id, entry count
_INDEX_ENTRY = struct.Struct(">iQ")
_FOOTER = struct.Struct(">Q8s")
#: One entry as bytes: (namespace, key, state).
RawEntry = tuple[bytes, bytes, bytes]


@dataclass(frozen=True)
class EncodedEntries:
    """The entries of one state in one block, already framed: ``count`` entries
    as ``data`` = (4 length + namespace bytes, 4 length + key bytes, 4 length +
    state bytes) each -- what the C codec's ``encode_section`` returns."""

    count: int
    data: bytes


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
    #: A file of a heap incremental chain: ``(size, crc32)`` of the file before
    #: it in the chain (None, and absent from the JSON, for every other file).
    parent: tuple[int, int] | None = None
    #: A file of a heap incremental chain: the checkpoint it was written for
    #: (None, and absent from the JSON, for every other file).
    checkpoint_id: int | None = Field(default=None, ge=0)

    @model_serializer(mode="wrap")
    def _without_absent_parent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Every other file's metadata serializes as before ``parent`` and
        ``checkpoint_id`` existed."""
        data: dict[str, Any] = handler(self)
        for name in ("parent", "checkpoint_id"):
            if data.get(name) is None:
                data.pop(name, None)
        return data

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
