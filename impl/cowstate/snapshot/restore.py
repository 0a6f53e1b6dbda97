"""Restoring from snapshot files: :func:`read_snapshot` decodes the key groups of
a range from one or more files into a :class:`RestoredSnapshot`, checking max
parallelism, serializers and kinds (C1, C4, C5, C7 of
:mod:`cowstate.snapshot.compat`) and key-group overlaps first, and every entry
as it is decoded (E1-E3 of :mod:`cowstate.snapshot.checks`);
:func:`restore_table` fills one table (E4 checked first). A file is decoded
completely before anything is merged, so a bad file restores nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from cowstate.errors import (
    InvalidArgumentError,
    KeyGroupMismatchError,
    UnknownStateError,
)
from cowstate.key_groups import KeyGroupRange
from cowstate.serializers import StateSerializer, serializer_for, serializer_identifier
from cowstate.snapshot.checks import (
    DecodedBlock,
    EntryDecoder,
    check_key_groups,
    check_key_types,
    check_state_types,
    duplicate_error,
    find_duplicate,
    state_type_of,
)
from cowstate.snapshot.compat import (
    check_kind,
    check_max_parallelism,
    check_same_key_serializer,
    check_same_max_parallelism,
    check_serializer,
)
from cowstate.snapshot.reader import SnapshotReader
from cowstate.state_meta import SnapshotFormat, StateMetadata, StateMetaInfo
from cowstate.state_table import StateTable

__all__ = [
    "RestoredSnapshot",
    "read_snapshot",
    "resolve_namespace_serializer",
    "resolve_serializer",
    "restore_table",
]


@dataclass
class RestoredSnapshot:
    """Decoded contents of snapshot files for one key-group range.

    ``blocks[name][key_group]`` is the :class:`DecodedBlock` (keys, namespaces,
    states as columns) restored for that key group; ``states`` gives the same
    as lists of ``(key, namespace, state)``. ``metas[name]`` is the state's
    meta info with the serializers that decoded it.
    """

    key_group_range: KeyGroupRange
    max_parallelism: int
    formats: set[SnapshotFormat] = field(default_factory=set)
    key_serializer: str = ""
    metas: dict[str, StateMetaInfo] = field(default_factory=dict)
    blocks: dict[str, dict[int, DecodedBlock]] = field(default_factory=dict)
    #: Key groups read so far (each may come from one file only).
    key_groups: set[int] = field(default_factory=set)
    #: Every state name the files hold, decoded or not.
    all_states: set[str] = field(default_factory=set)

    @property
    def states(self) -> dict[str, dict[int, list[tuple[Any, Any, Any]]]]:
        """``states[name][key_group]``: the entries as ``(key, namespace, state)``
        lists (built on each access, from ``blocks``)."""
        return {
            name: {key_group: block.rows() for key_group, block in groups.items()}
            for name, groups in self.blocks.items()
        }

    def entries(self, name: str) -> Iterator[tuple[int, Any, Any, Any]]:
        """``(key_group, key, namespace, state)`` of state ``name``, by key group."""
        for key_group, block in sorted(self.blocks.get(name, {}).items()):
            for key, namespace, state in zip(
                block.keys, block.namespaces, block.states, strict=True
            ):
                yield key_group, key, namespace, state

    def size(self, name: str) -> int:
        return sum(len(block) for block in self.blocks.get(name, {}).values())


def read_snapshot(
    stream: IO[bytes] | bytes | SnapshotReader,
    key_group_range: KeyGroupRange,
    *,
    max_parallelism: int | None = None,
    metas: Mapping[str, StateMetaInfo] | None = None,
    key_serializer: StateSerializer | None = None,
    states: Collection[str] | None = None,
    into: RestoredSnapshot | None = None,
    namespace_serializer: StateSerializer | None = None,
) -> RestoredSnapshot:
    """Decode the key groups of ``key_group_range`` from one snapshot file (bytes,
    a binary stream, or a :class:`SnapshotReader` of it).

    ``max_parallelism``, when given, must equal the file's. ``metas`` (by
    state name) and ``key_serializer`` supply the serializers; a state without
    one is decoded with the built-in serializer its identifier names. A
    serializer whose identifier differs from the file's is refused.
    ``namespace_serializer`` (a backend's) decodes the namespaces of states
    without meta info, checked against the file like the others: every
    serializer is checked before a byte is decoded. ``states`` limits
    decoding to those names. ``into`` accumulates several files (scale
    down); a key group found in two files is refused. Every entry is checked
    (E1-E3 of :mod:`cowstate.snapshot.checks`; a mapping given twice, E4, is
    for whoever fills a table to refuse). Nothing is added unless the whole
    requested part of the file decoded; a stream is left where it started.
    """
    if not isinstance(key_group_range, KeyGroupRange):
        raise InvalidArgumentError(
            f"expected a KeyGroupRange, got {type(key_group_range).__name__}"
        )
    reader = stream if isinstance(stream, SnapshotReader) else SnapshotReader(stream)
    try:
        return _decode(
            reader,
            key_group_range,
            max_parallelism,
            metas or {},
            key_serializer,
            states,
            into,
            namespace_serializer,
        )
    finally:
        reader.rewind()


def restore_table(
    table: StateTable[Any, Any, Any], streams: Iterable[IO[bytes] | bytes] | IO[bytes] | bytes
) -> int:
    """Restore ``table``'s state (by its meta info's name) from snapshot files.

    ``streams`` is one file (bytes or a binary stream) or an iterable of them.
    Reads only the table's key-group range of each file; every file is
    decoded and checked (E1-E5 of :mod:`cowstate.snapshot.checks`) before the
    first ``put``, so a bad file leaves the table as it was. Returns the
    number of mappings restored.
    """
    files: Iterable[Any]
    if isinstance(streams, bytes | bytearray | memoryview) or callable(
        getattr(streams, "read", None)
    ):
        files = [streams]
    elif isinstance(streams, Iterable):
        files = streams
    else:
        raise InvalidArgumentError(
            f"expected snapshot files (bytes or binary streams, or an iterable of them), got "
            f"{type(streams).__name__}"
        )
    name = table.meta.name
    restored = RestoredSnapshot(table.key_group_range, table.max_parallelism)
    for stream in files:
        read_snapshot(
            stream,
            table.key_group_range,
            max_parallelism=table.max_parallelism,
            metas={name: table.meta},
            key_serializer=table.key_serializer,
            states={name},
            into=restored,
        )
    if name not in restored.metas:
        raise UnknownStateError(
            f"expected state {name!r} in the snapshot files, got states "
            f"{sorted(restored.all_states)}"
        )
    blocks = sorted(restored.blocks.get(name, {}).items())
    key_types = table.key_types.copy()
    for key_group, block in blocks:  # E4, E5 before the first put: the table is live
        duplicate = find_duplicate(block)
        if duplicate is not None:
            raise duplicate_error(name, key_group, *duplicate)
        check_key_types(name, key_group, block.keys, key_types)
    table.key_types.adopt(key_types)
    count = 0
    for key_group, block in blocks:
        for key, namespace, state in zip(block.keys, block.namespaces, block.states, strict=True):
            table.put(key, namespace, state, key_group=key_group)
        count += len(block)
    return count


def _decode(
    reader: SnapshotReader,
    key_group_range: KeyGroupRange,
    max_parallelism: int | None,
    metas: Mapping[str, StateMetaInfo],
    key_serializer: StateSerializer | None,
    wanted: Collection[str] | None,
    into: RestoredSnapshot | None,
    namespace_serializer: StateSerializer | None = None,
) -> RestoredSnapshot:
    meta = reader.metadata
    if max_parallelism is not None:
        check_max_parallelism(max_parallelism, meta.max_parallelism)  # C1
    result = RestoredSnapshot(key_group_range, meta.max_parallelism) if into is None else into
    check_same_max_parallelism(result.max_parallelism, meta.max_parallelism)  # C7
    key_ser = _resolve(key_serializer, meta.key_serializer, "the key serializer")  # C5
    check_same_key_serializer(result.key_serializer, meta.key_serializer)  # C7
    overlap = result.key_groups & set(key_group_range.intersection(meta.range))
    if overlap:
        raise KeyGroupMismatchError(
            f"expected every key group in one snapshot file only, got key groups "
            f"{sorted(overlap)[:5]} in two files"
        )
    decoders: dict[int, EntryDecoder] = {}
    state_metas = {}
    # One namespace cache per namespace serializer: decoded once per distinct bytes.
    namespace_caches: dict[int, dict[bytes, Any]] = {}
    for state in meta.states:
        if wanted is not None and state.name not in wanted:
            continue
        given = metas.get(state.name)
        known = result.metas.get(state.name) or given
        if known is not None:
            check_kind(state.name, known.kind, state.kind, "file")  # C4
        namespace_ser = resolve_namespace_serializer(state, given, namespace_serializer)  # C5
        state_ser = _resolve(  # C5
            given.state_serializer if given else None,
            state.state_serializer,
            f"the state serializer of {state.name!r}",
        )
        decoders[state.id] = EntryDecoder(
            state.name,
            key_ser.deserialize,
            namespace_ser.deserialize,
            state_ser.deserialize,
            namespace_caches.setdefault(id(namespace_ser), {}),
            state_type_of(state.kind),
        )
        state_metas[state.name] = given or StateMetaInfo(
            state.name, state.kind, namespace_ser, state_ser
        )
    decoded: dict[str, dict[int, DecodedBlock]] = {}
    read = key_group_range.intersection(meta.range)
    for key_group in read:
        for state_id, block in reader.decode_key_group(key_group, decoders).items():
            name = decoders[state_id].name
            check_key_groups(name, key_group, block.keys, meta.max_parallelism, key_ser)
            check_state_types(decoders[state_id], key_group, block.states)
            decoded.setdefault(name, {})[key_group] = block
    # Everything decoded: now (and only now) merge into the result.
    result.formats.add(meta.format)
    result.key_serializer = meta.key_serializer
    result.key_groups.update(read)
    result.all_states.update(state.name for state in meta.states)
    for name, state_meta in state_metas.items():
        result.metas.setdefault(name, state_meta)
        result.blocks.setdefault(name, {})
    for name, groups in decoded.items():
        target = result.blocks[name]
        for key_group, block in groups.items():
            if key_group in target:
                target[key_group].extend(block)
            else:
                target[key_group] = block
    return result


def resolve_serializer(
    given: StateSerializer | None, identifier: str, role: str
) -> StateSerializer:
    """The serializer to decode with: ``given`` if its identifier matches the
    file's, else the built-in one ``identifier`` names."""
    return _resolve(given, identifier, role)


def resolve_namespace_serializer(
    state: StateMetadata, given: StateMetaInfo | None, default: StateSerializer | None
) -> StateSerializer:
    """C5 for the namespaces of the file's ``state``: the registered state's
    serializer (``given``), else ``default``, if its identifier matches the
    file's, else the built-in one the file names."""
    return _resolve(
        given.namespace_serializer if given else default,
        state.namespace_serializer,
        f"the namespace serializer of {state.name!r}",
    )


def _resolve(given: StateSerializer | None, identifier: str, role: str) -> StateSerializer:
    """The serializer to decode with: ``given`` if its identifier matches (C5),
    else the built-in one ``identifier`` names."""
    if given is None:
        return serializer_for(identifier)
    check_serializer(role, serializer_identifier(given), identifier, "file")  # C5
    return given
