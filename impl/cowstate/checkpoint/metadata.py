"""Writing ``_metadata``: how a checkpoint or savepoint becomes visible.

The coordinator writes a snapshot's ``_metadata`` last, once every subtask's
handle is in, and only through :func:`write_metadata`::

    CheckpointMetadata (handles.py)
      1. verify_metadata: M3-M9 (verify.py)   never write what a reader refuses
      2. JSON body, then the seal line:      format version and SHA-256
         kind "metadata" (sealed.py)         (what M1 and M2 check on reading)
      3. FileSystem.write_bytes               temporary name, fsync, rename,
         to <directory>/_metadata            fsync of the directory
         (filesystem.py)

The snapshot exists from the rename on; a crash before it leaves at most a
temporary file, which recovery deletes. Reading goes the other way:
:func:`~cowstate.checkpoint.storage.read_metadata` hands the bytes to
:func:`~cowstate.checkpoint.verify.parse_metadata` (M1-M9).
"""

from __future__ import annotations

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import (
    METADATA_FILE,
    METADATA_KIND,
    METADATA_VERSION,
    CheckpointMetadata,
)
from cowstate.checkpoint.sealed import seal
from cowstate.checkpoint.verify import verify_metadata

__all__ = ["render_metadata", "write_metadata"]


def write_metadata(filesystem: FileSystem, directory: str, metadata: CheckpointMetadata) -> str:
    """Write ``metadata`` as ``<directory>/_metadata``, atomically and durably:
    the snapshot becomes visible. Returns its path."""
    path = filesystem.join(directory, METADATA_FILE)
    filesystem.write_bytes(path, render_metadata(metadata))
    return path


def render_metadata(metadata: CheckpointMetadata) -> bytes:
    """The sealed bytes of ``metadata``, checked by M3-M9 first."""
    verify_metadata(metadata, "the _metadata to write")
    body = metadata.model_dump_json(indent=1).encode("utf-8")
    return seal(METADATA_KIND, METADATA_VERSION, body)
