"""What the restore tests share (tests/test_restore_*.py, test_all_or_nothing_restore.py):
backends with serializers the tests control, crafted snapshot files written with
the real writer's building blocks (so every CRC is valid), handles for them, and
a dump of a backend's contents; raw RocksDB databases, and ones with a flipped
byte for the corruption tests.

The crafted files use :class:`TrustedPickle` for keys, namespaces and states --
a serializer of these tests, registered on every backend they restore into --
so they can hold any object (``None``, a list as a key) whatever the library's
default serializer is.
"""

from __future__ import annotations

import copy
import io
import pickle
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import FileHandle, KeyedStateHandle
from cowstate.checkpoint.location import SnapshotSource
from cowstate.descriptors import ValueStateDescriptor
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.keyed_backend import AbstractKeyedStateBackend
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.rocksdb.table import encode_rocks_key
from cowstate.snapshot import SnapshotMetadata, SnapshotReader, SnapshotWriter
from cowstate.snapshot.format import RawEntry
from cowstate.state_meta import SnapshotFormat, StateMetadata

MAX_P = 16
FULL = KeyGroupRange(0, MAX_P - 1)


class TrustedPickle:
    """pickle, as a serializer these tests choose (files they wrote themselves)."""

    identifier = "tests.trusted-pickle"

    def copy(self, state: Any) -> Any:
        return copy.deepcopy(state)

    def serialize(self, state: Any) -> bytes:
        return pickle.dumps(state)

    def deserialize(self, data: bytes) -> Any:
        return pickle.loads(data)


SER = TrustedPickle()
VALUE: ValueStateDescriptor[Any] = ValueStateDescriptor("value", serializer=SER)
STATE_META = StateMetadata(
    id=0,
    name="value",
    kind="value",
    namespace_serializer=SER.identifier,
    state_serializer=SER.identifier,
)

Contents = dict[str, dict[tuple[Any, Any], Any]]
#: A crafted entry: (key, namespace, state) objects, pickled as they are.
Entry = tuple[Any, Any, Any]

#: Reads crafted handles by their absolute paths (:func:`handle_for` makes them
#: relative to /).
ABSOLUTE = SnapshotSource(FileSystem(), "/")
#: What the crafted canonical files of the restore tests hold.
RESTORED_ENTRIES: list[Entry] = [(k, "a", f"restored{k}") for k in range(20)]


def heap(key_group_range: KeyGroupRange = FULL) -> HeapKeyedStateBackend:
    backend = HeapKeyedStateBackend(
        key_group_range, MAX_P, key_serializer=SER, namespace_serializer=SER
    )
    backend.get_state(VALUE)
    return backend


def rocks(local: Path, key_group_range: KeyGroupRange = FULL) -> RocksDBKeyedStateBackend:
    backend = RocksDBKeyedStateBackend(
        key_group_range, MAX_P, local_dir=local, key_serializer=SER, namespace_serializer=SER
    )
    backend.get_state(VALUE)
    return backend


def fill(backend: AbstractKeyedStateBackend[Any], keys: Iterable[int], tag: str = "v") -> None:
    """``value[k] = f"{tag}{k}"`` in two namespaces for every key of this backend's."""
    table = backend.table("value")
    for key in keys:
        if assign_to_key_group(key, MAX_P) in backend.key_group_range:
            table.put(key, "a", f"{tag}{key}")
            table.put(key, "b", [key])


def dump(backend: AbstractKeyedStateBackend[Any]) -> Contents:
    return {
        name: {(e.key, e.namespace): e.state for e in backend.entries(name)}
        for name in backend.state_names
    }


def group_of(key: Any) -> int:
    return assign_to_key_group(key, MAX_P, SER)


def by_group(entries: Iterable[Entry]) -> dict[int, list[Entry]]:
    """Entries in the blocks of their own key groups (what a writer writes)."""
    out: dict[int, list[Entry]] = {}
    for entry in entries:
        out.setdefault(group_of(entry[0]), []).append(entry)
    return out


def crafted(
    blocks: Mapping[int, list[Entry]],
    *,
    key_group_range: KeyGroupRange = FULL,
    snapshot_format: SnapshotFormat = SnapshotFormat.CANONICAL,
) -> bytes:
    """A snapshot file of state ``value`` whose block of key group ``kg`` holds
    ``blocks[kg]`` as given -- whatever their keys' own key groups -- written
    by :class:`SnapshotWriter`: every CRC and the index are valid."""
    raw = {
        kg: [(pickle.dumps(ns), pickle.dumps(key), pickle.dumps(state)) for key, ns, state in rows]
        for kg, rows in blocks.items()
    }
    return crafted_raw(raw, key_group_range=key_group_range, snapshot_format=snapshot_format)


def crafted_raw(
    blocks: Mapping[int, list[tuple[bytes, bytes, bytes]]],
    *,
    key_group_range: KeyGroupRange = FULL,
    snapshot_format: SnapshotFormat = SnapshotFormat.CANONICAL,
    namespace_serializer: str = SER.identifier,
) -> bytes:
    """:func:`crafted` from raw ``(namespace, key, state)`` bytes."""
    metadata = metadata_of(key_group_range, snapshot_format)
    if namespace_serializer != SER.identifier:
        state = STATE_META.model_copy(update={"namespace_serializer": namespace_serializer})
        metadata = metadata.model_copy(update={"states": (state,)})
    return craft(metadata, {kg: {0: rows} for kg, rows in blocks.items()})


def craft(
    metadata: SnapshotMetadata, blocks: Mapping[int, Mapping[int, Sequence[RawEntry]]]
) -> bytes:
    """A snapshot file of ``metadata`` whose block of key group ``kg`` holds
    ``blocks[kg]`` -- raw entries per state id, as given -- written by
    :class:`SnapshotWriter` (the other key groups' blocks empty)."""
    stream = io.BytesIO()
    writer = SnapshotWriter(stream, metadata)
    for kg in sorted(blocks):
        writer.write_key_group(kg, blocks[kg])
    writer.finish()
    return stream.getvalue()


def metadata_of(
    key_group_range: KeyGroupRange = FULL,
    snapshot_format: SnapshotFormat = SnapshotFormat.CANONICAL,
) -> SnapshotMetadata:
    return SnapshotMetadata(
        format=snapshot_format,
        max_parallelism=MAX_P,
        key_group_range=(key_group_range.start_key_group, key_group_range.end_key_group),
        key_serializer=SER.identifier,
        states=(STATE_META,),
    )


def raw_blocks(data: bytes) -> dict[int, list[tuple[bytes, bytes, bytes]]]:
    """The raw entries of state id 0 of every key group of a file."""
    reader = SnapshotReader(data)
    return {kg: reader.read_key_group(kg).get(0, []) for kg in reader.metadata.range}


def handle_for(
    path: Path,
    data: bytes,
    *,
    key_group_range: KeyGroupRange = FULL,
    backend: Any = "heap",
    snapshot_format: SnapshotFormat = SnapshotFormat.CANONICAL,
) -> KeyedStateHandle:
    """A handle of the snapshot file ``data``, written to ``path`` here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return KeyedStateHandle(
        backend=backend,
        format=snapshot_format,
        key_group_range=(key_group_range.start_key_group, key_group_range.end_key_group),
        max_parallelism=MAX_P,
        checkpoint_id=1,
        key_serializer=SER.identifier,
        states=(STATE_META,),
        files=(
            FileHandle(
                path=str(path).lstrip("/"),  # relative: read through SnapshotSource(fs, "/")
                size=len(data),
                crc32=zlib.crc32(data),
                scope="exclusive",
                local_name=path.name,
            ),
        ),
        checkpointed_size=len(data),
        full_size=len(data),
    )


def flip(path: Path, at: float) -> None:
    """Flip one byte at fraction ``at`` of the file (in place: hard links see it)."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(data)


def corrupt_key(i: int) -> bytes:
    """The RocksDB key of entry ``i`` of :func:`corrupt_database`."""
    return encode_rocks_key(i % 16, i.to_bytes(4, "big"), b"")


def raw_database(path: Path) -> Rdict:
    """A raw-mode RocksDB database at ``path`` (made if missing): bytes in, bytes out."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return Rdict(str(path), options)


def corrupt_database(path: Path, entries: int) -> Rdict:
    """A raw-mode database at ``path`` of ``entries`` entries (``corrupt_key(i)``
    -> the 4 bytes of ``i`` ten times) in one SST with a data byte flipped 30%
    in, opened again: a read meets a checksum error there."""
    db = raw_database(path)
    for i in range(entries):
        db.put(corrupt_key(i), i.to_bytes(4, "big") * 10)
    db.flush()
    db.close()
    del db
    [sst] = path.glob("*.sst")
    flip(sst, 0.3)
    return raw_database(path)
