"""Snapshot files: keyed state written per key group, restorable by any key-group range.

Modules:

- :mod:`cowstate.snapshot.format`: the file layout (docstring), its constants
  and the metadata models (:class:`SnapshotMetadata`, :class:`StateMetadata`);
- :mod:`cowstate.snapshot.writer`: :class:`SnapshotWriter` (raw bytes) and
  :func:`write_snapshot` (table snapshots);
- :mod:`cowstate.snapshot.reader`: :class:`SnapshotReader`, the checked
  reader of headers, index and key-group blocks (raw, or decoded in one pass);
- :mod:`cowstate.snapshot.checks`: what a restore refuses in the contents of
  a file whose checksums are valid (E1-E6: ``None`` parts, unhashable keys,
  keys in another key group's block, mappings given twice, a list or map
  state whose state is not a list or dict, keys of another type);
- :mod:`cowstate.snapshot.compat`: what a snapshot must agree on with whoever
  restores it (C1-C7: max parallelism, serializers, kinds, formats), for
  both backends, ``read_snapshot`` and the checkpoint coordinator;
- :mod:`cowstate.snapshot.restore`: :func:`read_snapshot` (decode files into
  a :class:`RestoredSnapshot`) and :func:`restore_table`.

Everything public is importable from ``cowstate.snapshot``.
"""

from cowstate.snapshot.format import (
    END_MAGIC,
    FORMAT_VERSION,
    MAGIC,
    BinaryWriter,
    RawEntry,
    SnapshotFileInfo,
    SnapshotMetadata,
    StateMetadata,
)
from cowstate.snapshot.reader import SnapshotReader
from cowstate.snapshot.restore import RestoredSnapshot, read_snapshot, restore_table
from cowstate.snapshot.writer import SnapshotWriter, write_snapshot

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
