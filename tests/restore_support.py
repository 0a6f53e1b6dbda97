"""What the restore tests share (tests/test_restore_*.py, test_all_or_nothing_restore.py):
backends with serializers the tests control, crafted snapshot files written with
the real writer's building blocks (so every CRC is valid), handles for them, and
a dump of a backend's contents; RocksDB native snapshots with raw entries
planted, built once per process for the tests that restore them again and
again (:func:`built_once`); raw RocksDB databases, and ones with a flipped
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
import shutil
import uuid
import zlib
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rocksdict import Options, Rdict

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import FileHandle, KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.descriptors import ListStateDescriptor, ValueStateDescriptor
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.keyed_backend import AbstractKeyedStateBackend
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.rocksdb.table import encode_rocks_key
from cowstate.snapshot import SnapshotMetadata, SnapshotReader, SnapshotWriter
from cowstate.snapshot.format import RawEntry
from cowstate.state_meta import SnapshotFormat, StateMetadata

T = TypeVar("T")
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
#: A state a target registers before a restore.
Registered = ValueStateDescriptor[Any] | ListStateDescriptor
#: A crafted entry: (key, namespace, state) objects, pickled as they are.
Entry = tuple[Any, Any, Any]

#: Reads crafted handles by their absolute paths (:func:`handle_for` makes them
#: relative to /).
ABSOLUTE = SnapshotSource(FileSystem(), "/")
#: What the crafted canonical files of the restore tests hold.
RESTORED_ENTRIES: list[Entry] = [(k, "a", f"restored{k}") for k in range(20)]


def heap(
    key_group_range: KeyGroupRange = FULL,
    cls: type[HeapKeyedStateBackend] = HeapKeyedStateBackend,
) -> HeapKeyedStateBackend:
    """A heap backend (of ``cls``: a planted copy) of state ``value``, keys and
    namespaces by :data:`SER`."""
    backend = cls(key_group_range, MAX_P, key_serializer=SER, namespace_serializer=SER)
    backend.get_state(VALUE)
    return backend


def rocks(
    local: Path,
    key_group_range: KeyGroupRange = FULL,
    cls: type[RocksDBKeyedStateBackend] = RocksDBKeyedStateBackend,
) -> RocksDBKeyedStateBackend:
    """:func:`heap`'s RocksDB twin, its instance directory under ``local``."""
    backend = cls(
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
    state: StateMetadata = STATE_META,
) -> bytes:
    """A snapshot file of one state (``value``, or ``state``) whose block of key
    group ``kg`` holds ``blocks[kg]`` as given -- whatever their keys' own key
    groups -- written by :class:`SnapshotWriter`: every CRC and the index are valid."""
    raw = {
        kg: [(pickle.dumps(ns), pickle.dumps(key), pickle.dumps(s)) for key, ns, s in rows]
        for kg, rows in blocks.items()
    }
    return crafted_raw(
        raw, key_group_range=key_group_range, snapshot_format=snapshot_format, state=state
    )


def crafted_raw(
    blocks: Mapping[int, list[tuple[bytes, bytes, bytes]]],
    *,
    key_group_range: KeyGroupRange = FULL,
    snapshot_format: SnapshotFormat = SnapshotFormat.CANONICAL,
    namespace_serializer: str = SER.identifier,
    state: StateMetadata = STATE_META,
) -> bytes:
    """:func:`crafted` from raw ``(namespace, key, state)`` bytes."""
    if namespace_serializer != SER.identifier:
        state = state.model_copy(update={"namespace_serializer": namespace_serializer})
    metadata = metadata_of(key_group_range, snapshot_format, state)
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
    state: StateMetadata = STATE_META,
) -> SnapshotMetadata:
    return SnapshotMetadata(
        format=snapshot_format,
        max_parallelism=MAX_P,
        key_group_range=(key_group_range.start_key_group, key_group_range.end_key_group),
        key_serializer=SER.identifier,
        states=(state,),
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
    state: StateMetadata = STATE_META,
) -> KeyedStateHandle:
    """A handle of the snapshot file ``data`` (of one state, ``value`` or
    ``state``), written to ``path`` here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return KeyedStateHandle(
        backend=backend,
        format=snapshot_format,
        key_group_range=(key_group_range.start_key_group, key_group_range.end_key_group),
        max_parallelism=MAX_P,
        checkpoint_id=1,
        key_serializer=SER.identifier,
        states=(state,),
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


def native_snapshot(
    root: Path,
    key_group_range: KeyGroupRange = FULL,
    *,
    states: Sequence[str] = ("value",),
    keys: Iterable[Any] = range(40),
    plant: Callable[[RocksDBKeyedStateBackend], None] | None = None,
    beside: Path | None = None,
) -> tuple[KeyedStateHandle, SnapshotSource]:
    """A RocksDB backend's native checkpoint in ``root/job/chk-1`` (shared
    files in ``root/job/shared``) and the source its paths resolve from: value
    states ``states`` (by :data:`SER`) hold ``f"{state}{key}"`` for each of
    ``keys`` in the backend's key groups, namespace "a"; ``plant`` writes into
    the backend first (raw entries: ``table._column().put``); ``beside``, a job
    directory of another snapshot, is copied there first (its handles then
    resolve from the same source)."""
    if beside is not None:
        shutil.copytree(beside, root / "job")
    backend = rocks(root / "source", key_group_range)
    try:
        for name in states:
            backend.get_state(ValueStateDescriptor(name, serializer=SER))
            table = backend.table(name)
            for key in keys:
                if group_of(key) in key_group_range:
                    table.put(key, "a", f"{name}{key}")
        if plant is not None:
            plant(backend)
        directory = root / "job" / "chk-1"
        location = SnapshotLocation(FileSystem(), str(directory), str(root / "job" / "shared"))
        handle = backend.snapshot_to(1, location, SnapshotOptions()).result(30)
    finally:
        backend.close()
    return handle, SnapshotSource(FileSystem(), str(directory))


class Targets:
    """RocksDB backends that refusals restore into one after another (opening
    and closing a database for each of many refusals is most of their time),
    by key groups, class and registered states, each holding state of its own
    (``fill(..., tag="mine")``): a refusal leaves its target as it was; a
    target a restore changed (a failing test, a planted check) is closed and
    made again for the next."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[Hashable, tuple[RocksDBKeyedStateBackend, Path, Contents]] = {}

    def get(
        self,
        key_group_range: KeyGroupRange = FULL,
        cls: type[RocksDBKeyedStateBackend] = RocksDBKeyedStateBackend,
        states: Sequence[Registered] = (),
    ) -> tuple[RocksDBKeyedStateBackend, Path]:
        """A target (and its local directory) as it was made."""
        key = (key_group_range, cls, tuple((d.name, d.kind) for d in states))
        if key in self._made:
            backend, local, baseline = self._made.pop(key)
            if dump(backend) == baseline:
                self._made[key] = backend, local, baseline
                return backend, local
            backend.close()
        local = self.root / f"target-{len(self._made)}-{uuid.uuid4().hex[:8]}"
        backend = rocks(local, key_group_range, cls)
        for descriptor in states:
            backend.get_state(descriptor)
        fill(backend, range(100, 160), tag="mine")
        self._made[key] = backend, local, dump(backend)
        return backend, local

    def close(self) -> None:
        for backend, _, _ in self._made.values():
            backend.close()
        self._made.clear()


#: What :func:`built_once` built, by key.
_BUILT: dict[Hashable, Any] = {}


def built_once(key: Hashable, build: Callable[[], T]) -> T:
    """``build()`` the first time ``key`` is asked for in this process, the same
    result after: snapshot files that restores only read, under a tmp_path
    that outlives the test (the refusal tests of one snapshot at every
    position, and the planted checks that run them again)."""
    if key not in _BUILT:
        _BUILT[key] = build()
    built: T = _BUILT[key]
    return built


def staged_databases(local: Path) -> int:
    """Databases in the instance directories under ``local`` (live ones included)."""
    return sum(1 for p in local.glob("cowstate-rocksdb-*/db-*") if p.is_dir())


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
