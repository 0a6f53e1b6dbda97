"""Incremental heap checkpoints: a full snapshot file, then deltas (FLIP-151).

Flink's heap backend writes every checkpoint in full; FLIP-151 proposed
tracking the changed keys through the state maps' versions and writing only
those plus a log of removals. This module is that design for
:class:`~cowstate.heap_backend.HeapKeyedStateBackend` (``incremental=``):
what a chain is, how its files are written and checked, and how a restore
folds it. The maps' side -- which mappings changed since a base snapshot,
which keys were removed, at what cost -- is rules T and D of
:mod:`cowstate.state_map` (both maps: the C map's ``_cmap.c`` follows the
same rules; a table whose maps do not track, the nested table, writes full
checkpoints).

The chain
=========
A heap incremental checkpoint's handle lists the files of its *chain*, base
first, every one a **shared** file in the job's ``shared/`` directory, so the
shared-state registry keeps and deletes them exactly as it does RocksDB's
SST files (retention, subsumption, CLAIM / NO_CLAIM: nothing in
:mod:`cowstate.checkpoint` changes)::

    files: [ base | changes 1 | removals 1 | changes 2 | removals 2 | ... ]
             heap   heap-delta  heap-removals

- the *base*: a full snapshot file (format ``heap``);
- a *delta* is two files: ``heap-delta`` holds, per key group, every mapping
  that changed since the previous checkpoint of the chain (the snapshot file
  format, written by :func:`~cowstate.snapshot.writer.write_snapshot`), and
  ``heap-removals`` the keys removed since it (the same format, every
  entry's state bytes empty).

A checkpoint's chain is its base's chain plus its own delta; a full
checkpoint's chain is its one file (a checkpoint of a backend without
incremental checkpoints writes that file exclusive, as before).

The rules (cited in the code)
=============================
I1. A delta is built against the last *confirmed* checkpoint only (the
    coordinator's rule 1), never a savepoint (savepoints are full and
    exclusive, written as without incremental checkpoints: rule 2).
I2. A full checkpoint is written when there is no confirmed base (the first
    checkpoint, after any restore -- so after NO_CLAIM too -- and after a
    forced full one), when a map cannot tell its removals since the base
    (its removal log overflowed: rule D), when a map does not track changes
    (the nested table's), when a state has a snapshot transformer (a transformer may
    drop an unchanged mapping), when a state of the base changed its
    serializers, and when the chain would pass ``max_deltas`` deltas or its
    deltas' bytes ``max_delta_ratio`` times the base's.
I3. Every file's metadata names its parent: ``(size, crc32)`` of the file
    before it in the chain (none for the base), and the checkpoint it was
    written for. A restore refuses a chain whose links do not match its
    handle's sizes and CRCs -- a delta written against another base,
    reordered or missing files -- and one whose checkpoints do not rise from
    the base to its handle's checkpoint (a delta's two files: one
    checkpoint): every link of an older checkpoint's chain holds, so only
    its last file's checkpoint tells a handle cut back to it (and a base
    listed alone, :func:`check_chain_base`).
I4. A restore checks the chain's shape (base, then pairs), that every file
    is shared and in the job's own ``shared/`` directory (a heap chain
    never reaches into another job's files: after a restore the first
    checkpoint is full), each file's range, max parallelism, key serializer
    and states against its handle (a delta's states extend its parent's),
    and every entry of every file (E1-E6 of :mod:`cowstate.snapshot.checks`;
    a removal's key and namespace like an entry's, its state bytes empty, no
    key twice in one file).
I5. A restore folds the chain in order, per state and key group: the base's
    mappings, then for each delta its removals first and its mappings
    second: a new table's map of a key group is filled with the base's
    block, then each delta's part of that key group is applied to it in turn
    (:func:`fold_deltas`), every file decoded and checked before and nothing
    installed until every map is filled and folded (all or nothing, as every
    restore).
I6. A delta's changes are *frozen* in its synchronous part: for each key
    group, the mappings it will write (rule M's marked buckets, state
    version at least the base's) are collected from the map snapshot into
    one flat sequence of their key, namespace and state objects (a
    ``FrozenChanges``, by the C writer's ``freeze_changes``), and that map
    snapshot is released at once, so the
    owner copies no entry and no chunk for the delta while it is written
    (rules E and C copy only for an open snapshot). Only values that can
    never change are frozen -- exactly None, bool, int, float, str, bytes,
    ``VOID_NAMESPACE`` and tuples of them (``cs_immutable`` of ``_codec.c``):
    a key group with any other changed key, namespace or state keeps its
    snapshot, and rule S copies such a state before the owner may change
    it. The delta's bytes are those of the unfrozen snapshot (the writer
    frames the entries in the walk's order). Without the C codec
    (``COWSTATE_PURE_PYTHON``), for maps of another kind, and with
    ``IncrementalOptions(freeze_changes=False)`` nothing is frozen. Cost:
    the synchronous part visits the changed mappings, O(changes) instead of
    the snapshot's O(directory) (at 10M int mappings, 1% changed: 26-30 ms
    instead of 10-12 ms, against 70-94 ms of the owner's time an open delta
    snapshot's copies and the writer cost it while the delta was written,
    9-18 ms frozen); memory: three references per changed mapping until the
    writer has written its key group.

What a chain costs: a delta's write visits only the buckets the C map's
chunks mark as changed since the base (rule M of ``_cmap.c``) -- the C
snapshot writer, without the GIL, framing the entries whose state version is
the base's or later -- about 4% of a full write's time at 1M int mappings,
1% changed (``bench/bench_heap_incremental.py``); a chunk changed after a
snapshot that was not the base is walked whole. A restore reads the base and
every delta, fills each key group's map with the base and folds its deltas
into it in turn: about 1.2x a full restore at 1M with 10 deltas. The
defaults -- ``max_deltas = 10``, ``max_delta_ratio = 1.0`` -- bound a
restore to about twice a full one's bytes and ten files per subtask.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cowstate.arithmetic import DEFAULT_REMOVAL_LIMIT
from cowstate.checkpoint.handles import FileHandle, KeyedStateHandle
from cowstate.errors import (
    InvalidArgumentError,
    SnapshotEntryError,
    SnapshotFormatError,
)
from cowstate.key_groups import KeyGroupRange
from cowstate.map_contract import checked_removal_limit
from cowstate.protocols import StateMap
from cowstate.serializers import BytesSerializer
from cowstate.snapshot import ccodec
from cowstate.snapshot.checks import (
    EntryDecoder,
    check_key_groups,
    duplicate_error,
    find_duplicate,
)
from cowstate.snapshot.format import (
    BinaryWriter,
    EncodedEntries,
    SnapshotFileInfo,
    SnapshotMetadata,
)
from cowstate.snapshot.reader import SnapshotReader
from cowstate.snapshot.restore import (
    RestoredSnapshot,
    resolve_namespace_serializer,
    resolve_serializer,
)
from cowstate.snapshot.writer import (
    DEFAULT_BUFFER_SIZE,
    Entries,
    SnapshotWriter,
    framed_section,
)
from cowstate.state_meta import SnapshotFormat, StateMetadata, StateMetaInfo

__all__ = [
    "DEFAULT_MAX_DELTAS",
    "DEFAULT_MAX_DELTA_RATIO",
    "Chain",
    "IncrementalOptions",
    "Removals",
    "check_chain",
    "check_chain_base",
    "check_chain_handle",
    "fold_deltas",
    "held_removals",
    "read_removals",
    "write_removals",
]

#: Deltas a chain may hold before the next checkpoint is full (I2).
DEFAULT_MAX_DELTAS = 10
#: A chain's deltas may hold this many times its base's bytes (I2).
DEFAULT_MAX_DELTA_RATIO = 1.0

#: Removed ``(key, namespace)`` pairs per state name and key group.
Removals = dict[str, dict[int, list[tuple[Any, Any]]]]


@dataclass(frozen=True)
class IncrementalOptions:
    """How a heap backend's incremental checkpoints are bounded (I2; rule D),
    and whether a delta's changes are frozen in its synchronous part (I6:
    ``freeze_changes``, the default; False keeps the map snapshots open while
    the delta is written -- a shorter synchronous part, and the owner's
    copies meanwhile)."""

    max_deltas: int = DEFAULT_MAX_DELTAS
    max_delta_ratio: float = DEFAULT_MAX_DELTA_RATIO
    removal_limit: int = DEFAULT_REMOVAL_LIMIT
    freeze_changes: bool = True

    def __post_init__(self) -> None:
        if type(self.freeze_changes) is not bool:
            raise InvalidArgumentError(
                f"expected freeze_changes True or False, got {self.freeze_changes!r}"
            )
        if type(self.max_deltas) is not int or self.max_deltas < 0:
            raise InvalidArgumentError(f"expected max_deltas >= 0, got {self.max_deltas!r}")
        if not isinstance(self.max_delta_ratio, int | float) or not self.max_delta_ratio >= 0:
            raise InvalidArgumentError(
                f"expected max_delta_ratio >= 0, got {self.max_delta_ratio!r}"
            )
        checked_removal_limit(self.removal_limit)


@dataclass(frozen=True)
class Chain:
    """A written checkpoint as the base of the next one: its chain's files, the
    map version of every state's key group at its snapshot, its states."""

    checkpoint_id: int
    files: tuple[FileHandle, ...]
    versions: Mapping[str, tuple[int, ...]]
    states: tuple[StateMetadata, ...]
    generation: int
    deltas: int = 0
    delta_bytes: int = 0

    @property
    def base_bytes(self) -> int:
        return self.files[0].size

    @property
    def parent(self) -> tuple[int, int]:
        """What the next file of the chain names as its parent (I3)."""
        last = self.files[-1]
        return (last.size, last.crc32)

    def extends(self, states: tuple[StateMetadata, ...]) -> bool:
        """True if ``states`` keep every state of this chain as it was (I2)."""
        return states[: len(self.states)] == self.states


def _check_written_for(
    handle: KeyedStateHandle, readers: Sequence[SnapshotReader], index: int, where: str
) -> None:
    """I3: file ``index`` of a chain names the checkpoint it was written for --
    the base any; a delta's changes one after its parent's; its removals its
    changes' one; the last file its handle's."""
    written = readers[index].metadata.checkpoint_id
    previous = None if index == 0 else readers[index - 1].metadata.checkpoint_id
    if index == 0:
        ok, wanted = written is not None, "a checkpoint"
    elif index % 2:
        ok = written is not None and previous is not None and written > previous
        wanted = f"a checkpoint after {previous} (its parent's)"
    elif index == len(readers) - 1:
        ok = written == previous == handle.checkpoint_id
        wanted = f"checkpoint {handle.checkpoint_id} (its handle's and its changes')"
    else:
        ok, wanted = written == previous, f"checkpoint {previous} (its changes')"
    if not ok:
        raise SnapshotFormatError(
            f"expected file {index} of the heap chain in {where} written for {wanted}, it was "
            f"written for checkpoint {written}: a chain cut back to an older checkpoint's, or "
            "files of other checkpoints"
        )


def write_removals(
    stream: BinaryWriter,
    metadata: SnapshotMetadata,
    removals: Sequence[Mapping[int, Sequence[Any]]],
    serializers: Sequence[tuple[Any, Any]],
) -> SnapshotFileInfo:
    """Write a ``heap-removals`` file: ``removals[state id][key group]`` are the
    removed (key, namespace) pairs -- or the same as the C codec's
    ``flat_removals`` holds them (:func:`held_removals`) -- serialized by
    ``serializers[state id]`` = (key serializer, namespace serializer); every
    entry's state bytes are empty. Framed by the C writer where the C codec
    is built (a state of a serializer it does not know through
    ``encode_section``, called once per value), byte for byte the Python
    loop's."""
    writer = SnapshotWriter(stream, metadata, buffer_size=DEFAULT_BUFFER_SIZE)  # one write
    codec = ccodec.CODEC
    frame = [_removal_framer(codec, *pair) for pair in serializers]
    first, last = metadata.key_group_range
    if codec is not None and first <= last:
        # the C writer frames every key group (no Python loop per key group,
        # the GIL released while it frames): each state's removals as frozen
        # changes of an empty state, a state of a Python serializer by ``frame``
        walked = [
            _removals_walked(codec, groups, first, last, *pair)
            for groups, pair in zip(removals, serializers, strict=True)
        ]
        if any(state is not None for state in walked):

            def section(state_id: int, key_group: int) -> tuple[int, bytes]:
                pairs = _pairs(removals[state_id].get(key_group, ()))
                return framed_section(state_id, frame[state_id](pairs) if pairs else [])

            writer.write_blocks_in_c(codec, walked, None, None, section)
            return writer.finish()
    for key_group in metadata.range:
        per_state: dict[int, Entries] = {}
        for state_id, groups in enumerate(removals):
            pairs = _pairs(groups.get(key_group, ()))
            if pairs:
                per_state[state_id] = frame[state_id](pairs)
        writer.write_key_group(key_group, per_state)
    return writer.finish()


def _has_duplicate(keys: Sequence[Any], namespaces: Sequence[Any]) -> bool:
    """Whether a (key, namespace) pair repeats: with one namespace throughout
    (equal to the first: ``VOID_NAMESPACE``, the common case) a set of the
    keys, no tuple each (pairs of equal namespaces are equal as their keys)."""
    if not keys:
        return False
    if namespaces.count(namespaces[0]) == len(namespaces):
        return len(set(keys)) != len(keys)
    return len(set(zip(keys, namespaces, strict=True))) != len(keys)


def _removals_walked(
    codec: ccodec.Codec,
    groups: Mapping[int, Sequence[Any]],
    first: int,
    last: int,
    key_ser: Any,
    namespace_ser: Any,
) -> ccodec.WalkedState | None:
    """One state's removals for the C writer: per key group the frozen form
    (``flat_removals``: key, namespace, ``b""``), or None when a serializer
    is not built into the C codec (the Python path frames that state)."""
    functions = (key_ser.serialize, namespace_ser.serialize, _NO_STATE.serialize)
    key_kind, namespace_kind, state_kind = (ccodec.encoder_kind(f) for f in functions)
    if ccodec.KIND_PYTHON in (key_kind, namespace_kind, state_kind):
        return None
    empty = codec.flat_removals([])
    frozen: list[Any] = []
    for key_group in range(first, last + 1):
        held = groups.get(key_group)
        if held is None:
            frozen.append(empty)
        elif type(held) is codec.FrozenChanges:
            frozen.append(held)
        else:
            frozen.append(_flat(codec, held))
    return (frozen, key_kind, namespace_kind, state_kind, *functions, None)


def held_removals(pairs: Sequence[tuple[Any, Any]]) -> Sequence[Any]:
    """How a delta holds one map's removed pairs from its synchronous part to
    its write: where the C codec is built, as its ``flat_removals`` (two
    references and an empty state per pair, no tuple each: the pairs' tuples,
    just made, die at once and in cache instead of on the writer's thread with
    the GIL once the file is written -- 25,000 of them took the owner 5-10 ms
    at 10M mappings); else the pairs."""
    codec = ccodec.CODEC
    return pairs if codec is None else _flat(codec, pairs)


def _flat(codec: ccodec.Codec, pairs: Sequence[tuple[Any, Any]]) -> Sequence[Any]:
    """``pairs`` as the C codec's ``flat_removals`` holds them."""
    held: Sequence[Any] = codec.flat_removals(pairs if type(pairs) is list else list(pairs))
    return held


def _pairs(held: Sequence[Any]) -> Sequence[tuple[Any, Any]]:
    """The (key, namespace) pairs :func:`held_removals` holds (the C codec as
    built: one in use when they were held, whether or not in use now)."""
    codec = ccodec.BUILT
    if codec is not None and type(held) is codec.FrozenChanges:
        return [(held[i], held[i + 1]) for i in range(0, len(held), 3)]
    return held


def _removal_framer(
    codec: ccodec.Codec | None, key_ser: Any, namespace_ser: Any
) -> Callable[[Sequence[tuple[Any, Any]]], Entries]:
    """How one state's removals of a key group become a section's entries
    (empty state bytes: the bytes serializer's of ``b""``)."""
    key_bytes, namespace_bytes, state_bytes = (
        key_ser.serialize,
        namespace_ser.serialize,
        _NO_STATE.serialize,
    )
    kinds = [ccodec.encoder_kind(f) for f in (key_bytes, namespace_bytes, state_bytes)]

    def entries(pairs: Sequence[tuple[Any, Any]]) -> Entries:
        if codec is not None:
            encoded = codec.encode_section(
                [(key, namespace, b"") for key, namespace in pairs],
                kinds[0],
                key_bytes,
                kinds[1],
                namespace_bytes,
                kinds[2],
                state_bytes,
            )
            if isinstance(encoded, bytes):
                return EncodedEntries(len(pairs), encoded)
            if encoded is not None:  # rows: a serializer returned other than bytes
                return encoded
        return [(namespace_bytes(n), key_bytes(k), b"") for k, n in pairs]

    return entries


#: A removal's state: no bytes (``serialize(b"") == b""``, built into the C codec).
_NO_STATE = BytesSerializer()


def read_removals(
    reader: SnapshotReader,
    key_group_range: KeyGroupRange,
    metas: Mapping[str, StateMetaInfo],
    key_serializer: Any,
    namespace_serializer: Any,
) -> Removals:
    """The removed pairs of ``key_group_range`` in a ``heap-removals`` file, every
    one checked (I4): decodable, no ``None``, hashable, in its key group, state
    bytes empty, no pair twice. Decoded as a snapshot's blocks are (the C
    codec's loop where it is built), each entry's state read as its length."""
    meta = reader.metadata
    key_ser = resolve_serializer(key_serializer, meta.key_serializer, "the key serializer")
    decoders: dict[int, EntryDecoder] = {}
    caches: dict[int, dict[bytes, Any]] = {}  # one namespace cache per serializer
    for state in meta.states:
        given = metas.get(state.name)
        namespace_ser = resolve_namespace_serializer(state, given, namespace_serializer)
        decoders[state.id] = EntryDecoder(
            state.name,
            key_ser.deserialize,
            namespace_ser.deserialize,
            len,  # a removal's state bytes must be empty: checked below
            caches.setdefault(id(namespace_ser), {}),
        )
    out: Removals = {}
    for key_group in key_group_range.intersection(meta.range):
        for state_id, block in reader.decode_key_group(key_group, decoders).items():
            name = decoders[state_id].name
            if any(block.states):  # a state's length, found only then
                extra = next(length for length in block.states if length)
                raise SnapshotEntryError(
                    f"expected removals without state bytes in state {name!r}, key group "
                    f"{key_group}, got {extra} bytes"
                )
            check_key_groups(name, key_group, block.keys, meta.max_parallelism, key_ser)
            pairs = list(zip(block.keys, block.namespaces, strict=True))
            if len(set(pairs)) != len(pairs):  # E4; which pair, only then
                duplicate = find_duplicate(block)
                assert duplicate is not None
                raise duplicate_error(name, key_group, *duplicate)
            out.setdefault(name, {})[key_group] = pairs
    return out


def check_chain_handle(handle: KeyedStateHandle, job: str, where: str) -> None:
    """I4's part a handle alone tells, checked before any file is read: the
    chain's shape (a base, then pairs) and every file shared in ``job``'s own
    ``shared/`` directory (a handle naming another job's files reads none)."""
    files = handle.files
    if len(files) < 3 or len(files) % 2 == 0:
        raise SnapshotFormatError(
            f"expected a heap chain of a base and pairs of delta files in {where}, got "
            f"{len(files)} files"
        )
    for file in files:
        if file.scope != "shared" or file.path.split("/")[0] != job:
            raise SnapshotFormatError(
                f"expected every file of the heap chain in {where} shared in job {job!r}'s "
                f"shared directory, got {file.scope} file {file.path!r}"
            )


def check_chain(
    handle: KeyedStateHandle, readers: Sequence[SnapshotReader], job: str, where: str
) -> None:
    """I3, I4 (the shape, the links, the files' metadata against the handle):
    ``readers[i]`` reads ``handle.files[i]``; ``job`` is the job whose
    checkpoint lists the handle; ``where`` names the handle in errors."""
    check_chain_handle(handle, job, where)
    files = handle.files
    for index, (file, reader) in enumerate(zip(files, readers, strict=True)):
        expected = (
            SnapshotFormat.HEAP
            if index == 0
            else (SnapshotFormat.HEAP_DELTA if index % 2 else SnapshotFormat.HEAP_REMOVALS)
        )
        meta = reader.metadata
        if meta.format is not expected:
            raise SnapshotFormatError(
                f"expected file {index} of the heap chain in {where} ({file.path!r}) in "
                f"format {expected}, got {meta.format}"
            )
        parent = None if index == 0 else (files[index - 1].size, files[index - 1].crc32)
        if meta.parent != parent:
            raise SnapshotFormatError(
                f"expected file {index} of the heap chain in {where} ({file.path!r}) to follow "
                f"the file of size and CRC32 {parent}, it names {meta.parent}: a delta of "
                "another base, or files out of order"
            )
        _check_written_for(handle, readers, index, f"{where} ({file.path!r})")
        shape = (tuple(meta.key_group_range), meta.max_parallelism, meta.key_serializer)
        own = (tuple(handle.key_group_range), handle.max_parallelism, handle.key_serializer)
        states = tuple(meta.states)
        last = index >= len(files) - 2
        if (
            shape != own
            or states != handle.states[: len(states)]
            or (last and states != handle.states)
        ):
            raise SnapshotFormatError(
                f"expected file {index} of the heap chain in {where} ({file.path!r}) to hold "
                f"key groups {list(own[0])} of max parallelism {own[1]}, key serializer "
                f"{own[2]!r} and the handle's states {[s.name for s in handle.states]}, got "
                f"{list(shape[0])}, {shape[1]}, {shape[2]!r}, {[s.name for s in states]}"
            )


def check_chain_base(handle: KeyedStateHandle, meta: SnapshotMetadata, path: str) -> None:
    """I3 for a handle of one heap file: a chain's base (a file that names the
    checkpoint it was written for) is the handle's own checkpoint's, never an
    older checkpoint's base listed alone."""
    if meta.checkpoint_id is not None and meta.checkpoint_id != handle.checkpoint_id:
        raise SnapshotFormatError(
            f"expected {path!r}, the one file of checkpoint {handle.checkpoint_id}'s handle of "
            f"key groups {list(handle.key_group_range)}, written for checkpoint "
            f"{handle.checkpoint_id}, it was written for checkpoint {meta.checkpoint_id}: "
            "the base of another checkpoint's chain"
        )


def fold_deltas(
    deltas: Sequence[tuple[Removals, RestoredSnapshot]],
    name: str,
    key_group: int,
    state_map: StateMap[Any, Any, Any],
) -> None:
    """I5 for one map: a chain's deltas, in order, each its removals of state
    ``name``'s ``key_group`` first and its mappings second, applied to
    ``state_map`` -- a new map a restore filled with the base's block, not
    installed yet (straight into it, as the base's fill). A restore folds each
    key group right after filling it, while its map is in the processor's
    cache: a delta's keys are spread over the whole table, and folded table
    by table each of them missed the cache (660 ns a put at 1M mappings,
    against 100 ns in the fill). Refuses a mapping given twice in one delta
    file (E4), so a refusal leaves only maps nobody sees."""
    for removals, delta in deltas:
        pairs = removals.get(name, {}).get(key_group)
        if pairs:  # each in order, as a loop would (an error stops it there)
            _drain(itertools.starmap(state_map.remove, pairs))
        block = delta.blocks.get(name, {}).get(key_group)
        if block is None:
            continue
        keys, namespaces = block.keys, block.namespaces
        if _has_duplicate(keys, namespaces):  # E4
            duplicate = find_duplicate(block)
            assert duplicate is not None
            raise duplicate_error(name, key_group, *duplicate)
        if not len(keys) == len(namespaces) == len(block.states):
            raise AssertionError("a decoded block's columns differ in length")
        _drain(map(state_map.put, keys, namespaces, block.states))


def _drain(calls: Iterator[object]) -> None:
    """Run ``calls`` to the end, in order, keeping nothing: the fold's loops
    without a Python frame step per mapping (a tenth of a 10M-mapping chain's
    fold was the loops' own)."""
    collections.deque(calls, maxlen=0)
