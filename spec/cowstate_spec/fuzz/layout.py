"""Snapshot files taken apart and put back together, for crafting corrupt ones.

An independent reading of the layout in the docstring of
:mod:`cowstate.snapshot.format` (format version 1): :func:`parse` turns a
valid file into a :class:`FileImage` and its :class:`Region` map;
:meth:`FileImage.encode` writes an image back with every CRC32 recomputed,
whatever was edited -- so a crafted file passes every checksum and only the
reader's other checks (and the restore's) stand between it and the state.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

__all__ = ["REGION_NAMES", "Block", "FileImage", "Region", "Section", "parse"]

_HEADER = struct.Struct(">8sHHI")  # magic, version, flags, metadata length
_U32 = struct.Struct(">I")
_BLOCK = struct.Struct(">iII")  # key group, entry count, payload length
_STATE = struct.Struct(">HI")  # state id, entry count
_INDEX_ENTRY = struct.Struct(">iQ")
_FOOTER = struct.Struct(">Q8s")

#: The regions of a file, in file order (blocks repeat).
REGION_NAMES = (
    "header",
    "metadata",
    "metadata-crc",
    "block-header",
    "payload",
    "block-crc",
    "index",
    "index-crc",
    "footer",
)

#: (namespace, key, state) bytes.
RawEntry = tuple[bytes, bytes, bytes]


@dataclass(frozen=True)
class Region:
    """Bytes ``[start, end)`` of a file: a ``name`` of :data:`REGION_NAMES`
    (with the key group, for a block's regions)."""

    name: str
    start: int
    end: int
    key_group: int | None = None

    def describe(self) -> str:
        where = "" if self.key_group is None else f" of key group {self.key_group}"
        return f"{self.name}{where} [{self.start}, {self.end})"


@dataclass
class Section:
    """The entries of one state in one block; ``count`` overrides the written count."""

    state_id: int
    entries: list[RawEntry]
    count: int | None = None


@dataclass
class Block:
    """One key group's block; ``count`` overrides the written entry count."""

    key_group: int
    sections: list[Section]
    count: int | None = None

    def entry_count(self) -> int:
        return sum(len(s.entries) for s in self.sections)


@dataclass
class FileImage:
    """A snapshot file as parts. ``index`` (None: one entry per block, in order)
    lists ``(key group, position of the block it points at)``; ``metadata``
    is the JSON bytes."""

    metadata: bytes
    blocks: list[Block]
    magic: bytes = b"\x89CWSNAP\n"
    version: int = 1
    flags: int = 0
    end_magic: bytes = b"CWSNAPIX"
    index: list[tuple[int, int]] | None = field(default=None)

    def encode(self) -> bytes:
        """The file's bytes, every CRC32 valid."""
        head = _HEADER.pack(self.magic, self.version, self.flags, len(self.metadata))
        head += self.metadata
        parts = [head, _U32.pack(zlib.crc32(head))]
        position = len(head) + 4
        offsets = []
        for block in self.blocks:
            payload = b"".join(_section(s) for s in block.sections)
            count = block.entry_count() if block.count is None else block.count
            header = _BLOCK.pack(block.key_group, count, len(payload))
            crc = zlib.crc32(payload, zlib.crc32(header))
            parts += [header, payload, _U32.pack(crc)]
            offsets.append(position)
            position += len(header) + len(payload) + 4
        index = self.index
        if index is None:
            index = [(b.key_group, i) for i, b in enumerate(self.blocks)]
        raw = _U32.pack(len(index)) + b"".join(_INDEX_ENTRY.pack(kg, offsets[i]) for kg, i in index)
        parts += [raw, _U32.pack(zlib.crc32(raw)), _FOOTER.pack(position, self.end_magic)]
        return b"".join(parts)

    def copy(self) -> FileImage:
        """A deep copy to edit."""
        return FileImage(
            self.metadata,
            [
                Block(
                    b.key_group,
                    [Section(s.state_id, list(s.entries), s.count) for s in b.sections],
                    b.count,
                )
                for b in self.blocks
            ],
            self.magic,
            self.version,
            self.flags,
            self.end_magic,
            None if self.index is None else list(self.index),
        )


def parse(data: bytes) -> tuple[FileImage, list[Region]]:
    """A valid file's image and its regions (``struct.error`` on an invalid one)."""
    regions = [Region("header", 0, _HEADER.size)]
    magic, version, flags, length = _HEADER.unpack_from(data, 0)
    metadata = data[_HEADER.size : _HEADER.size + length]
    at = _HEADER.size + length
    regions += [Region("metadata", _HEADER.size, at), Region("metadata-crc", at, at + 4)]
    at += 4
    index_at, end_magic = _FOOTER.unpack_from(data, len(data) - _FOOTER.size)
    blocks = []
    while at < index_at:
        key_group, count, length = _BLOCK.unpack_from(data, at)
        payload = data[at + _BLOCK.size : at + _BLOCK.size + length]
        regions += [
            Region("block-header", at, at + _BLOCK.size, key_group),
            Region("payload", at + _BLOCK.size, at + _BLOCK.size + length, key_group),
            Region(
                "block-crc", at + _BLOCK.size + length, at + _BLOCK.size + length + 4, key_group
            ),
        ]
        blocks.append(Block(key_group, _sections(payload)))
        at += _BLOCK.size + length + 4
    (count,) = _U32.unpack_from(data, index_at)
    index_end = index_at + 4 + count * _INDEX_ENTRY.size
    regions += [
        Region("index", index_at, index_end),
        Region("index-crc", index_end, index_end + 4),
        Region("footer", len(data) - _FOOTER.size, len(data)),
    ]
    image = FileImage(metadata, blocks, magic, version, flags, end_magic)
    if image.encode() != data:
        raise struct.error("the file does not re-encode to itself: not a valid snapshot file")
    return image, regions


# ------------------------------------------------------------ private helpers


def _section(section: Section) -> bytes:
    count = len(section.entries) if section.count is None else section.count
    parts = [_STATE.pack(section.state_id, count)]
    for entry in section.entries:
        for part in entry:
            parts += [_U32.pack(len(part)), part]
    return b"".join(parts)


def _sections(payload: bytes) -> list[Section]:
    sections = []
    at = 0
    while at < len(payload):
        state_id, count = _STATE.unpack_from(payload, at)
        at += _STATE.size
        entries = []
        for _ in range(count):
            fields = []
            for _ in range(3):
                (length,) = _U32.unpack_from(payload, at)
                fields.append(payload[at + 4 : at + 4 + length])
                at += 4 + length
            entries.append((fields[0], fields[1], fields[2]))
        sections.append(Section(state_id, entries))
    return sections
