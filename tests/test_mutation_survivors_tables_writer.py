"""Tests that kill mutants of the ``tables`` mutation scope in the snapshot
writer and restore modules (``cowstate.snapshot.writer``,
``cowstate.snapshot.restore``) that the scope's other killer tests let through
or never reach (``make mutate SCOPE=tables``).

Every file is real: written by :func:`write_snapshot` or :class:`SnapshotWriter`
into ``tmp_path`` (crafted ones with the writer's own building blocks, so every
CRC and the index are valid) and read back through the public API. Each test
is named after what it pins; the mutants it was written for are named in its
comment. They are part of the scope's killers (``scripts/mutation.py``) and of
the normal suite.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from restore_support import SER

from cowstate.errors import (
    DuplicateMappingError,
    InvalidArgumentError,
    KeyGroupMismatchError,
    KeyTypeMismatchError,
    MaxParallelismMismatchError,
    MixedKeyTypesError,
    SerializerMismatchError,
    SnapshotCancelledError,
    SnapshotEntryError,
    UnknownStateError,
)
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.serializers import IntSerializer, LongSerializer, StringSerializer
from cowstate.snapshot import (
    FORMAT_VERSION,
    MAGIC,
    RestoredSnapshot,
    SnapshotMetadata,
    SnapshotReader,
    SnapshotWriter,
    read_snapshot,
    restore_table,
    write_snapshot,
)
from cowstate.snapshot.checks import DecodedBlock
from cowstate.snapshot.format import RawEntry
from cowstate.state_meta import MAX_STATES, SnapshotFormat, StateKind, StateMetadata, StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable, StateTableSnapshot

#: Until these tests move beside the tests of what they pin.
pytestmark = [
    pytest.mark.kills(module="cowstate.snapshot.writer"),
    pytest.mark.kills(module="cowstate.snapshot.restore"),
]

MAXP = 8
FULL = KeyGroupRange(0, MAXP - 1)
INT = IntSerializer()
UTF8 = StringSerializer()
Table = CopyOnWriteStateTable[Any, Any, Any]
Snapshot = StateTableSnapshot[Any, Any, Any]


def group(key: int) -> int:
    return assign_to_key_group(key, MAXP, INT)


def value_table(
    name: str = "a",
    keys: Iterable[int] = range(10),
    *,
    key_group_range: KeyGroupRange = FULL,
    max_parallelism: int = MAXP,
    key_serializer: Any = INT,
) -> Table:
    """A value state ``name``: ``(k, "ns") -> f"{name}{k}"`` for the keys of its range."""
    meta = StateMetaInfo(name, StateKind.VALUE, UTF8, UTF8)
    table: Table = CopyOnWriteStateTable(
        key_group_range, max_parallelism, meta=meta, key_serializer=key_serializer
    )
    for key in keys:
        if assign_to_key_group(key, max_parallelism, key_serializer) in key_group_range:
            table.put(key, "ns", f"{name}{key}")
    return table


def written(
    tmp_path: Path,
    snapshots: Snapshot | Sequence[Snapshot],
    file_name: str = "snapshot.bin",
    **options: Any,
) -> bytes:
    """The bytes :func:`write_snapshot` wrote to a file under ``tmp_path``."""
    path = tmp_path / file_name
    with path.open("wb") as stream:
        write_snapshot(snapshots, stream, **options)
    return path.read_bytes()


def state_meta(
    state_id: int,
    name: str,
    *,
    kind: str = "value",
    namespace_serializer: str = "utf8",
    state_serializer: str = "utf8",
) -> StateMetadata:
    return StateMetadata(
        id=state_id,
        name=name,
        kind=kind,
        namespace_serializer=namespace_serializer,
        state_serializer=state_serializer,
    )


def file_metadata(
    *states: StateMetadata,
    key_group_range: KeyGroupRange = FULL,
    key_serializer: str = "int32",
    max_parallelism: int = MAXP,
) -> SnapshotMetadata:
    return SnapshotMetadata(
        format=SnapshotFormat.HEAP,
        max_parallelism=max_parallelism,
        key_group_range=(key_group_range.start_key_group, key_group_range.end_key_group),
        key_serializer=key_serializer,
        states=states,
    )


def crafted(
    tmp_path: Path,
    metadata: SnapshotMetadata,
    blocks: Mapping[int, Mapping[int, Sequence[RawEntry]]],
    file_name: str = "crafted.bin",
) -> bytes:
    """A file of ``metadata`` whose block of key group ``kg`` holds ``blocks[kg]``
    (raw entries per state id) as given, written by :class:`SnapshotWriter`."""
    path = tmp_path / file_name
    with path.open("wb") as stream:
        writer = SnapshotWriter(stream, metadata)
        for key_group in sorted(blocks):
            writer.write_key_group(key_group, blocks[key_group])
        writer.finish()
    return path.read_bytes()


def entry(key: int, namespace: str = "ns", state: str = "s") -> RawEntry:
    """A raw (namespace, key, state) entry of int32 keys and utf8 namespaces and states."""
    return (UTF8.serialize(namespace), INT.serialize(key), UTF8.serialize(state))


def contents(table: Table) -> dict[tuple[Any, Any], Any]:
    return {(e.key, e.namespace): e.state for e in table}


# ====================================================================== writer


def test_a_first_key_group_outside_the_range_is_refused_after_none_written(
    tmp_path: Path,
) -> None:
    # writer.SnapshotWriter.write_key_group 1, 2, 4; __init__ 9, 10, 11: the
    # message names the last key group written, -1 before the first.
    with (tmp_path / "f").open("wb") as stream:
        writer = SnapshotWriter(stream, file_metadata(key_group_range=KeyGroupRange(2, 5)))
        with pytest.raises(InvalidArgumentError) as excinfo:
            writer.write_key_group(6, {})
    assert str(excinfo.value) == (
        "expected key groups of KeyGroupRange(2, 5) in ascending order, got 6 after -1"
    )


def test_the_first_key_group_of_a_range_starting_at_zero_is_accepted(tmp_path: Path) -> None:
    # writer.SnapshotWriter.__init__ 10 (the last key group starts at +1: key
    # group 0 and 1 would be refused as not ascending).
    with (tmp_path / "f").open("wb") as stream:
        metadata = file_metadata(state_meta(0, "a"), key_group_range=KeyGroupRange(0, 1))
        writer = SnapshotWriter(stream, metadata)
        writer.write_key_group(0, {0: [entry(0)]})
        writer.write_key_group(1, {})
        info = writer.finish()
    assert info.entries == 1
    assert sorted(info.offsets) == [0, 1]


def test_the_same_key_group_twice_is_refused(tmp_path: Path) -> None:
    # writer.SnapshotWriter.write_key_group 3 (<= relaxed to <).
    with (tmp_path / "f").open("wb") as stream:
        writer = SnapshotWriter(stream, file_metadata(state_meta(0, "a")))
        writer.write_key_group(3, {0: [entry(3)]})
        with pytest.raises(InvalidArgumentError) as excinfo:
            writer.write_key_group(3, {0: [entry(3)]})
    assert str(excinfo.value) == (
        "expected key groups of KeyGroupRange(0, 7) in ascending order, got 3 after 3"
    )


def test_skipped_key_groups_get_empty_blocks_and_the_written_ones_keep_their_entries(
    tmp_path: Path,
) -> None:
    # writer.SnapshotWriter.write_key_group 5-18 and finish 1-16: the empty
    # blocks of the skipped key groups (3, 4 between two writes; 6, 7 after
    # the last) fill the gaps exactly once, never a written block again.
    metadata = file_metadata(state_meta(0, "a"), key_group_range=KeyGroupRange(2, 7))
    a = [entry(10, state="x"), entry(11, state="y")]
    b = [entry(12, state="z")]
    data = crafted(tmp_path, metadata, {2: {0: a}, 5: {0: b}})
    reader = SnapshotReader(data)
    assert {kg: reader.read_key_group(kg) for kg in range(2, 8)} == {
        2: {0: a},
        3: {},
        4: {},
        5: {0: b},
        6: {},
        7: {},
    }
    start = 16 + len(metadata.model_dump_json().encode()) + 4
    size_a = 12 + 6 + sum(12 + len(ns) + len(k) + len(s) for ns, k, s in a) + 4
    size_b = 12 + 6 + sum(12 + len(ns) + len(k) + len(s) for ns, k, s in b) + 4
    empty = 16
    assert reader.offsets == {
        2: start,
        3: start + size_a,
        4: start + size_a + empty,
        5: start + size_a + 2 * empty,
        6: start + size_a + 2 * empty + size_b,
        7: start + size_a + 3 * empty + size_b,
    }


def test_a_range_starting_past_zero_gets_blocks_from_its_own_start(tmp_path: Path) -> None:
    # writer.SnapshotWriter.write_key_group 5-12 and finish 1-8 (the start of
    # the range, not the last key group + 1, opens the first gap).
    metadata = file_metadata(state_meta(0, "a"), key_group_range=KeyGroupRange(3, 6))
    data = crafted(tmp_path, metadata, {5: {0: [entry(1)]}})
    reader = SnapshotReader(data)
    assert list(reader.offsets) == [3, 4, 5, 6]
    assert reader.read_key_group(5) == {0: [entry(1)]}


def test_an_unwritten_file_has_one_empty_block_per_key_group(tmp_path: Path) -> None:
    # writer.SnapshotWriter.finish 1-16 with nothing written (the last key group is -1).
    metadata = file_metadata(state_meta(0, "a"), key_group_range=KeyGroupRange(1, 3))
    data = crafted(tmp_path, metadata, {})
    reader = SnapshotReader(data)
    start = 16 + len(metadata.model_dump_json().encode()) + 4
    assert reader.offsets == {1: start, 2: start + 16, 3: start + 32}
    assert [reader.read_key_group(kg) for kg in (1, 2, 3)] == [{}, {}, {}]


def test_an_empty_state_section_before_a_full_one_is_left_out(tmp_path: Path) -> None:
    # writer.SnapshotWriter._write_block 7 (empty sections written, full ones
    # dropped) and 8 (the first empty section ends the block).
    metadata = file_metadata(state_meta(0, "a"), state_meta(1, "b"), state_meta(2, "c"))
    data = crafted(tmp_path, metadata, {4: {0: [], 1: [entry(1)], 2: [entry(2), entry(3)]}})
    assert SnapshotReader(data).read_key_group(4) == {1: [entry(1)], 2: [entry(2), entry(3)]}


def test_the_block_header_counts_the_entries_of_every_state(tmp_path: Path) -> None:
    # writer.SnapshotWriter._write_block 2, 3, 19, 20 (the block's entry
    # count, which the reader checks against its sections) and 42, 43,
    # __init__ 7, 8 (the file's entry count over all blocks).
    metadata = file_metadata(state_meta(0, "a"), state_meta(1, "b"))
    path = tmp_path / "f"
    with path.open("wb") as stream:
        writer = SnapshotWriter(stream, metadata)
        writer.write_key_group(1, {0: [entry(1), entry(2)], 1: [entry(3)]})
        writer.write_key_group(5, {1: [entry(4), entry(5)]})
        info = writer.finish()
    data = path.read_bytes()
    assert struct.unpack_from(">iII", data, info.offsets[1])[:2] == (1, 3)
    assert struct.unpack_from(">iII", data, info.offsets[5])[:2] == (5, 2)
    assert SnapshotReader(data).read_key_group(1) == {0: [entry(1), entry(2)], 1: [entry(3)]}
    assert info.entries == 5


def test_the_file_info_describes_the_file_written(tmp_path: Path) -> None:
    # writer.SnapshotWriter.finish 36-44 and _write 1-3, __init__ 5, 6
    # (offsets and size are positions in the stream, counted from 0).
    metadata = file_metadata(state_meta(0, "a"), key_group_range=KeyGroupRange(0, 2))
    path = tmp_path / "f"
    with path.open("wb") as stream:
        writer = SnapshotWriter(stream, metadata)
        writer.write_key_group(1, {0: [entry(7)]})
        info = writer.finish()
    data = path.read_bytes()
    assert info.metadata is metadata
    assert info.size == len(data)
    assert info.entries == 1
    assert info.offsets == SnapshotReader(data).offsets
    assert type(info.offsets) is dict
    start = 16 + len(metadata.model_dump_json().encode()) + 4
    assert info.offsets[0] == start
    index_at = struct.unpack(">Q", data[-16:-8])[0]
    assert index_at == len(data) - 16 - 4 - 4 - 3 * 12


def test_the_header_holds_magic_version_zero_flags_and_the_metadata(tmp_path: Path) -> None:
    # writer.SnapshotWriter.__init__ 12-30 (flags 1 is not read back by the
    # reader, so the header's bytes are compared).
    metadata = file_metadata(state_meta(0, "a"))
    data = crafted(tmp_path, metadata, {})
    meta = metadata.model_dump_json().encode("utf-8")
    assert data[:16] == MAGIC + struct.pack(">HHI", FORMAT_VERSION, 0, len(meta))
    assert data[16 : 16 + len(meta)] == meta


def test_write_snapshot_releases_the_snapshot_by_default_also_when_cancelled(
    tmp_path: Path,
) -> None:
    # writer.write_snapshot 1 (release defaults to False), 17-19 (cancel).
    snapshot = value_table().snapshot()
    cancel = threading.Event()
    cancel.set()
    path = tmp_path / "f"
    with path.open("wb") as stream, pytest.raises(SnapshotCancelledError) as excinfo:
        write_snapshot(snapshot, stream, cancel=cancel)
    assert str(excinfo.value) == "snapshot cancelled before key group 0 was written"
    assert snapshot.is_released


def test_an_unset_cancel_event_writes_the_whole_file(tmp_path: Path) -> None:
    # writer.write_snapshot 17, 18 (an event that is not set cancels nothing).
    table = value_table()
    data = written(tmp_path, table.snapshot(), cancel=threading.Event())
    restored = read_snapshot(data, FULL)
    assert restored.size("a") == 10


def test_without_release_every_key_group_is_still_released_once_written(
    tmp_path: Path,
) -> None:
    # writer.write_snapshot 32 (release_key_group(None)).
    snapshot = value_table().snapshot()
    written(tmp_path, snapshot, release=False)
    assert [snapshot.is_key_group_released(kg) for kg in FULL] == [True] * MAXP


def test_write_snapshot_round_trips_keys_namespaces_and_states(tmp_path: Path) -> None:
    # writer.write_snapshot 20-31 (each entry serialized with its own serializers,
    # every key group of every state written).
    a = value_table("a", range(12))
    b = value_table("b", range(5, 9))
    data = written(tmp_path, [a.snapshot(), b.snapshot()])
    restored = read_snapshot(data, FULL)
    assert sorted(restored.entries("a")) == sorted((group(k), k, "ns", f"a{k}") for k in range(12))
    assert sorted(restored.entries("b")) == sorted(
        (group(k), k, "ns", f"b{k}") for k in range(5, 9)
    )


def test_write_snapshot_records_the_metadata_of_its_tables(tmp_path: Path) -> None:
    # writer._metadata_of 23-36 (format, max parallelism, range, key
    # serializer and per state its id).
    tables = [value_table(name, key_group_range=KeyGroupRange(2, 5)) for name in "xyz"]
    data = written(
        tmp_path, [t.snapshot() for t in tables], snapshot_format=SnapshotFormat.CANONICAL
    )
    assert SnapshotReader(data).metadata == SnapshotMetadata(
        format=SnapshotFormat.CANONICAL,
        max_parallelism=MAXP,
        key_group_range=(2, 5),
        key_serializer="int32",
        states=(state_meta(0, "x"), state_meta(1, "y"), state_meta(2, "z")),
    )


def test_write_snapshot_of_no_table_is_refused(tmp_path: Path) -> None:
    # writer._metadata_of 1-4.
    with (tmp_path / "f").open("wb") as stream, pytest.raises(InvalidArgumentError) as excinfo:
        write_snapshot([], stream)
    assert str(excinfo.value) == "expected at least one table snapshot to write, got none"


def test_exactly_max_states_snapshots_pass_the_count_check(tmp_path: Path) -> None:
    # writer._metadata_of 5, 6: MAX_STATES states are allowed (the same
    # snapshot MAX_STATES times then fails the name check, which comes later).
    snapshot = value_table(keys=()).snapshot()
    with (tmp_path / "f").open("wb") as stream:
        with pytest.raises(InvalidArgumentError) as excinfo:
            write_snapshot([snapshot] * MAX_STATES, stream, release=False)
        assert str(excinfo.value).startswith("expected distinct state names, got ['a', 'a', ")
        with pytest.raises(InvalidArgumentError) as excinfo:
            write_snapshot([snapshot] * (MAX_STATES + 1), stream, release=False)
    assert str(excinfo.value) == (
        f"expected at most {MAX_STATES} states in one snapshot, got {MAX_STATES + 1}"
    )


def test_a_second_table_with_another_key_serializer_is_refused(tmp_path: Path) -> None:
    # writer._metadata_of 8-15 (the second of two tables is compared too).
    a = value_table("a")
    b = value_table("b", keys=(), key_serializer=LongSerializer())
    with (tmp_path / "f").open("wb") as stream, pytest.raises(InvalidArgumentError) as excinfo:
        write_snapshot([a.snapshot(), b.snapshot()], stream)
    assert str(excinfo.value) == (
        "expected every table snapshot to use the key serializer 'int32', got 'int64' for 'b'"
    )


def test_a_second_table_of_another_range_is_refused(tmp_path: Path) -> None:
    # writer._metadata_of 16, 17, 19 (the range alone differs).
    a = value_table("a")
    b = value_table("b", key_group_range=KeyGroupRange(0, 3))
    with (tmp_path / "f").open("wb") as stream, pytest.raises(InvalidArgumentError) as excinfo:
        write_snapshot([a.snapshot(), b.snapshot()], stream)
    assert str(excinfo.value) == (
        "expected every table snapshot to cover KeyGroupRange(0, 7) of 8, got "
        "KeyGroupRange(0, 3) of 8 for 'b'"
    )


def test_a_second_table_of_another_max_parallelism_is_refused(tmp_path: Path) -> None:
    # writer._metadata_of 16, 18, 19 (the max parallelism alone differs).
    a = value_table("a")
    b = value_table("b", keys=(), max_parallelism=16)
    with (tmp_path / "f").open("wb") as stream, pytest.raises(InvalidArgumentError) as excinfo:
        write_snapshot([a.snapshot(), b.snapshot()], stream)
    assert str(excinfo.value) == (
        "expected every table snapshot to cover KeyGroupRange(0, 7) of 8, got "
        "KeyGroupRange(0, 7) of 16 for 'b'"
    )


def test_two_tables_of_one_name_are_refused(tmp_path: Path) -> None:
    # writer._metadata_of 20-22.
    with (tmp_path / "f").open("wb") as stream, pytest.raises(InvalidArgumentError) as excinfo:
        write_snapshot([value_table("a").snapshot(), value_table("a").snapshot()], stream)
    assert str(excinfo.value) == "expected distinct state names, got ['a', 'a']"


# ================================================================ restore_table


def test_restore_table_refuses_a_mapping_given_twice_naming_state_and_key_group(
    tmp_path: Path,
) -> None:
    # restore.restore_table 44 (no E4 check), 47-51 (its message).
    key = 3
    kg = group(key)
    data = crafted(
        tmp_path,
        file_metadata(state_meta(0, "a")),
        {kg: {0: [entry(key, state="first"), entry(key, state="second")]}},
    )
    table = value_table("a", keys=(11,))
    before = contents(table)
    with pytest.raises(DuplicateMappingError) as excinfo:
        restore_table(table, data)
    assert str(excinfo.value) == (
        f"expected each (key, namespace) once per state, state 'a' holds (3, 'ns') twice in "
        f"key group {kg}"
    )
    assert contents(table) == before


def test_restore_table_refuses_keys_of_another_type_than_the_tables(tmp_path: Path) -> None:
    # restore.restore_table 52-54 (E6 against the table's key type, and its message).
    key = 2.5
    kg = assign_to_key_group(key, MAXP, SER)
    metadata = file_metadata(state_meta(0, "a"), key_serializer=SER.identifier)
    raw = (UTF8.serialize("ns"), SER.serialize(key), UTF8.serialize("s"))
    data = crafted(tmp_path, metadata, {kg: {0: [raw]}})
    table = value_table("a", keys=(1,), key_serializer=SER)
    with pytest.raises(MixedKeyTypesError) as excinfo:
        restore_table(table, data)
    assert str(excinfo.value).startswith(
        "expected the keys of a restore to be of one type, without NaN or -0.0, "
        f"state 'a', key group {kg} has float 2.5: "
    )
    assert contents(table) == {(1, "ns"): "a1"}


def test_restore_table_restores_every_file_and_counts_the_mappings(tmp_path: Path) -> None:
    # restore.restore_table 1-33, 37-39, 41, 61-65, 67-69, 72-74, 76-78, 80, 81
    # (two files as streams, one as bytes: every mapping put where it was).
    low = value_table("a", range(20), key_group_range=KeyGroupRange(0, 3))
    high = value_table("a", range(20), key_group_range=KeyGroupRange(4, 7))
    low_data = written(tmp_path, low.snapshot(), "low.bin")
    written(tmp_path, high.snapshot(), "high.bin")
    table = value_table("a", keys=())
    table.put(100, "other", "mine")
    with (tmp_path / "low.bin").open("rb") as first, (tmp_path / "high.bin").open("rb") as second:
        assert restore_table(table, [first, second]) == 20
    assert contents(table) == {(k, "ns"): f"a{k}" for k in range(20)} | {(100, "other"): "mine"}
    assert [table.get(k, "ns") for k in (0, 19)] == ["a0", "a19"]
    only_low = value_table("a", keys=(), key_group_range=KeyGroupRange(0, 3))
    assert restore_table(only_low, low_data) == len(low)
    assert contents(only_low) == contents(low)


def test_restore_table_reads_one_stream_with_its_own_meta_info_and_state_only(
    tmp_path: Path,
) -> None:
    # restore.restore_table 2-9 (one stream is one file, not an iterable of
    # lines), 23, 29, 30 (the table's meta info decodes: the tests' pickle is
    # no built-in serializer) and 25, 32 (the other state, which nothing
    # could decode, is skipped).
    def pickled(name: str) -> Table:
        meta = StateMetaInfo(name, StateKind.VALUE, SER, SER)
        table: Table = CopyOnWriteStateTable(FULL, MAXP, meta=meta, key_serializer=INT)
        for key in range(6):
            table.put(key, ("w", key), [name, key])
        return table

    other, mine = pickled("x"), pickled("a")
    written(tmp_path, [other.snapshot(), mine.snapshot()])
    meta = StateMetaInfo("a", StateKind.VALUE, SER, SER)
    table: Table = CopyOnWriteStateTable(FULL, MAXP, meta=meta, key_serializer=INT)
    with (tmp_path / "snapshot.bin").open("rb") as stream:
        assert restore_table(table, stream) == 6
    assert contents(table) == contents(mine)


def test_restore_table_refuses_a_file_of_another_max_parallelism(tmp_path: Path) -> None:
    # restore.restore_table 22 (the table's max parallelism is the one checked).
    data = written(tmp_path, value_table("a", range(4), max_parallelism=16).snapshot())
    table = value_table("a", keys=())
    with pytest.raises(MaxParallelismMismatchError) as excinfo:
        restore_table(table, [data])
    assert str(excinfo.value) == (
        "expected a snapshot of max parallelism 8, got one of 16: the number of key groups "
        "cannot change on restore"
    )


def test_restore_table_fixes_the_key_type_of_a_fresh_table(tmp_path: Path) -> None:
    # restore.restore_table 43, 55, 60 (the restored keys' type is adopted).
    data = written(tmp_path, value_table("a", range(4), key_serializer=SER).snapshot())
    table = value_table("a", keys=(), key_serializer=SER)
    assert restore_table(table, [data]) == 4
    with pytest.raises(KeyTypeMismatchError):
        table.put(1.5, "ns", "float key")
    assert len(table) == 4


def test_restore_table_of_a_state_the_files_do_not_hold_is_refused(tmp_path: Path) -> None:
    # restore.restore_table 34-36.
    data = written(tmp_path, value_table("a", range(4)).snapshot())
    table = value_table("b", keys=())
    with pytest.raises(UnknownStateError) as excinfo:
        restore_table(table, [data])
    assert str(excinfo.value) == "expected state 'b' in the snapshot files, got states ['a']"


def test_restore_table_of_something_that_is_not_files_is_refused() -> None:
    # restore.restore_table 1-13.
    with pytest.raises(InvalidArgumentError) as excinfo:
        restore_table(value_table(keys=()), 42)  # type: ignore[arg-type]
    assert str(excinfo.value) == (
        "expected snapshot files (bytes or binary streams, or an iterable of them), got int"
    )


# ============================================================== RestoredSnapshot


def test_entries_yields_key_group_key_namespace_state_by_key_group(tmp_path: Path) -> None:
    # restore.RestoredSnapshot.entries 1-8, 10-12; size 2-5 (a state not restored).
    data = written(tmp_path, [value_table("a", range(6)).snapshot()])
    restored = read_snapshot(data, FULL)
    expected = sorted((group(k), k, "ns", f"a{k}") for k in range(6))
    assert sorted(restored.entries("a")) == expected
    assert [e[0] for e in restored.entries("a")] == [e[0] for e in expected]
    assert list(restored.entries("missing")) == []
    assert (restored.size("a"), restored.size("missing")) == (6, 0)


# ================================================================= read_snapshot


def test_read_snapshot_refuses_what_is_not_a_key_group_range() -> None:
    # restore.read_snapshot 1-3.
    with pytest.raises(InvalidArgumentError) as excinfo:
        read_snapshot(b"", (0, 7))  # type: ignore[arg-type]
    assert str(excinfo.value) == "expected a KeyGroupRange, got tuple"


def test_read_snapshot_reads_through_a_given_reader_and_rewinds_it(tmp_path: Path) -> None:
    # restore.read_snapshot 4-7.
    data = written(tmp_path, value_table("a", range(4)).snapshot())
    with (tmp_path / "snapshot.bin").open("rb") as stream:
        reader = SnapshotReader(stream)
        restored = read_snapshot(reader, FULL)
        assert stream.tell() == 0
        assert restored.size("a") == 4
    assert read_snapshot(data, FULL).states == restored.states


def test_read_snapshot_decodes_with_the_meta_info_given_for_a_state(tmp_path: Path) -> None:
    # restore.read_snapshot 24 (metas dropped), _decode 42, 43 (the given
    # meta info is not looked up) and 52-68 (its serializers decode: the
    # tests' pickle is no built-in serializer).
    meta = StateMetaInfo("p", StateKind.VALUE, SER, SER)
    table: Table = CopyOnWriteStateTable(FULL, MAXP, meta=meta, key_serializer=INT)
    table.put(1, ("w", 1), {"x": [1]})
    data = written(tmp_path, table.snapshot())
    restored = read_snapshot(data, FULL, metas={"p": meta})
    assert restored.metas["p"] is meta
    assert list(restored.entries("p")) == [(group(1), 1, ("w", 1), {"x": [1]})]


def test_read_snapshot_without_meta_info_uses_the_built_in_serializers(tmp_path: Path) -> None:
    # restore._decode 88-97 (the meta info made from the file), 127-138 (what
    # is merged into the result), 9-12, 38, 47, 48 (no states, no max parallelism given).
    a = value_table("a", range(3))
    empty = value_table("empty", keys=())
    data = written(tmp_path, [a.snapshot(), empty.snapshot()])
    restored = read_snapshot(data, KeyGroupRange(0, 3))
    assert restored.key_group_range == KeyGroupRange(0, 3)
    assert restored.max_parallelism == MAXP
    assert restored.formats == {SnapshotFormat.HEAP}
    assert restored.key_serializer == "int32"
    assert restored.key_groups == {0, 1, 2, 3}
    assert restored.all_states == {"a", "empty"}
    assert sorted(restored.metas) == ["a", "empty"]
    for name in ("a", "empty"):
        meta = restored.metas[name]
        assert (meta.name, meta.kind) == (name, StateKind.VALUE)
        assert type(meta.namespace_serializer) is StringSerializer
        assert type(meta.state_serializer) is StringSerializer
    assert restored.blocks["empty"] == {}
    in_range = [k for k in range(3) if group(k) <= 3]
    assert restored.states["a"] == {
        kg: [(k, "ns", f"a{k}") for k in in_range if group(k) == kg]
        for kg in sorted({group(k) for k in in_range})
    }


def test_read_snapshot_decodes_only_the_states_asked_for(tmp_path: Path) -> None:
    # restore._decode 39, 40, 41 (the first state skipped ends the loop).
    tables = [value_table(name, range(4)) for name in ("x", "a", "y")]
    data = written(tmp_path, [t.snapshot() for t in tables])
    restored = read_snapshot(data, FULL, states={"a"})
    assert sorted(restored.metas) == ["a"]
    assert sorted(restored.blocks) == ["a"]
    assert restored.size("a") == 4
    assert restored.all_states == {"x", "a", "y"}


def test_a_max_parallelism_other_than_the_files_is_refused(tmp_path: Path) -> None:
    # restore._decode 2-5.
    data = written(tmp_path, value_table().snapshot())
    with pytest.raises(MaxParallelismMismatchError) as excinfo:
        read_snapshot(data, FULL, max_parallelism=16)
    assert str(excinfo.value) == (
        "expected a snapshot of max parallelism 16, got one of 8: the number of key groups "
        "cannot change on restore"
    )
    assert read_snapshot(data, FULL, max_parallelism=MAXP).size("a") == 10


def test_a_file_of_another_max_parallelism_than_the_accumulated_ones_is_refused(
    tmp_path: Path,
) -> None:
    # restore._decode 14, 15.
    data = written(tmp_path, value_table().snapshot())
    into = RestoredSnapshot(FULL, 16)
    with pytest.raises(MaxParallelismMismatchError) as excinfo:
        read_snapshot(data, FULL, into=into)
    assert str(excinfo.value) == "expected every file to have max parallelism 16, got 8"
    assert into.blocks == {}


def test_several_files_accumulate_into_one_result(tmp_path: Path) -> None:
    # restore._decode 6-8, 13 (into ignored or replaced), 139-142 (merging).
    low = value_table("a", range(20), key_group_range=KeyGroupRange(0, 3))
    high = value_table("a", range(20), key_group_range=KeyGroupRange(4, 7))
    low_data = written(tmp_path, low.snapshot(), "low.bin")
    high_data = written(tmp_path, high.snapshot(), "high.bin")
    into = RestoredSnapshot(FULL, MAXP)
    assert read_snapshot(low_data, FULL, into=into) is into
    assert read_snapshot(high_data, FULL, into=into) is into
    assert into.key_groups == set(FULL)
    assert sorted(into.entries("a")) == sorted((group(k), k, "ns", f"a{k}") for k in range(20))


def test_a_block_already_accumulated_for_a_key_group_is_extended(tmp_path: Path) -> None:
    # restore._decode 140, 141: blocks of an accumulator given with entries
    # of a key group no file was read for are extended, not replaced.
    key = 5
    kg = group(key)
    data = written(tmp_path, value_table("a", (key,)).snapshot())
    into = RestoredSnapshot(FULL, MAXP)
    into.blocks["a"] = {kg: DecodedBlock([13], ["ns"], ["old"])}
    read_snapshot(data, FULL, into=into)
    assert into.states["a"] == {kg: [(13, "ns", "old"), (key, "ns", f"a{key}")]}


def test_files_of_different_key_serializers_are_refused_together(tmp_path: Path) -> None:
    # restore._decode 25-27.
    ints = written(
        tmp_path, value_table("a", range(4), key_group_range=KeyGroupRange(0, 3)).snapshot(), "i"
    )
    longs = value_table(
        "a", range(4), key_group_range=KeyGroupRange(4, 7), key_serializer=LongSerializer()
    )
    longs_data = written(tmp_path, longs.snapshot(), "l")
    into = read_snapshot(ints, FULL)
    with pytest.raises(SerializerMismatchError) as excinfo:
        read_snapshot(longs_data, FULL, into=into)
    assert str(excinfo.value) == "expected every file to use key serializer 'int32', got 'int64'"


def test_a_key_group_in_two_files_is_refused_naming_the_first_five(tmp_path: Path) -> None:
    # restore._decode 28-34.
    first = written(tmp_path, value_table().snapshot(), "first")
    second = written(tmp_path, value_table().snapshot(), "second")
    into = read_snapshot(first, FULL)
    with pytest.raises(KeyGroupMismatchError) as excinfo:
        read_snapshot(second, FULL, into=into)
    assert str(excinfo.value) == (
        "expected every key group in one snapshot file only, got key groups [0, 1, 2, 3, 4] "
        "in two files"
    )


def test_a_state_of_another_kind_than_its_meta_info_is_refused(tmp_path: Path) -> None:
    # restore._decode 44, 45, 49, 50.
    data = written(tmp_path, value_table("a", range(3)).snapshot())
    meta = StateMetaInfo("a", StateKind.LIST, UTF8, SER)
    with pytest.raises(SerializerMismatchError) as excinfo:
        read_snapshot(data, FULL, metas={"a": meta})
    assert str(excinfo.value) == "expected state 'a' of kind 'list', the file holds kind 'value'"


def test_a_state_of_another_kind_than_the_accumulated_one_is_refused(tmp_path: Path) -> None:
    # restore._decode 46 (the accumulated meta info, not the given one, is compared).
    low = value_table("a", range(8), key_group_range=KeyGroupRange(0, 3))
    into = read_snapshot(written(tmp_path, low.snapshot(), "low"), FULL)
    metadata = file_metadata(
        state_meta(0, "a", kind="list", state_serializer="cowstate-value"),
        key_group_range=KeyGroupRange(4, 7),
    )
    data = crafted(tmp_path, metadata, {})
    with pytest.raises(SerializerMismatchError) as excinfo:
        read_snapshot(data, FULL, into=into)
    assert str(excinfo.value) == "expected state 'a' of kind 'value', the file holds kind 'list'"


def test_serializer_mismatches_name_the_serializer(tmp_path: Path) -> None:
    # restore._decode 17-24, 51-68 and _resolve 1-6: each role in its message.
    data = written(tmp_path, value_table("a", range(3)).snapshot())
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"key_serializer": LongSerializer()},
            "expected the key serializer to be 'int64', the file was written with 'int32'",
        ),
        (
            {"metas": {"a": StateMetaInfo("a", StateKind.VALUE, INT, UTF8)}},
            "expected the namespace serializer of 'a' to be 'int32', the file was written "
            "with 'utf8'",
        ),
        (
            {"metas": {"a": StateMetaInfo("a", StateKind.VALUE, UTF8, INT)}},
            "expected the state serializer of 'a' to be 'int32', the file was written with 'utf8'",
        ),
        (
            {"namespace_serializer": INT},
            "expected the namespace serializer of 'a' to be 'int32', the file was written "
            "with 'utf8'",
        ),
    ]
    for options, message in cases:
        with pytest.raises(SerializerMismatchError) as excinfo:
            read_snapshot(data, FULL, **options)
        assert str(excinfo.value) == message
    restored = read_snapshot(data, FULL, key_serializer=INT, namespace_serializer=UTF8)
    assert restored.size("a") == 3


def test_a_backends_namespace_serializer_decodes_states_without_meta_info(
    tmp_path: Path,
) -> None:
    # restore._decode 52, 55-61 (the namespace serializer of read_snapshot is used).
    metadata = file_metadata(state_meta(0, "a", namespace_serializer=SER.identifier))
    raw = (SER.serialize(("w", 2)), INT.serialize(4), UTF8.serialize("s"))
    data = crafted(tmp_path, metadata, {group(4): {0: [raw]}})
    restored = read_snapshot(data, FULL, namespace_serializer=SER)
    assert list(restored.entries("a")) == [(group(4), 4, ("w", 2), "s")]
    assert restored.metas["a"].namespace_serializer is SER


def test_states_of_different_namespace_serializers_decode_the_same_bytes_apart(
    tmp_path: Path,
) -> None:
    # restore._decode 74, 80, 82-86 (one namespace cache per namespace serializer).
    metadata = file_metadata(
        state_meta(0, "i", namespace_serializer="int32"),
        state_meta(1, "s", namespace_serializer="utf8"),
    )
    same = INT.serialize(65)  # b"\x00\x00\x00A"
    blocks = {
        group(1): {
            0: [(same, INT.serialize(1), UTF8.serialize("i"))],
            1: [(same, INT.serialize(1), UTF8.serialize("s"))],
        }
    }
    data = crafted(tmp_path, metadata, blocks)
    restored = read_snapshot(data, FULL)
    assert list(restored.entries("i")) == [(group(1), 1, 65, "i")]
    assert list(restored.entries("s")) == [(group(1), 1, "\x00\x00\x00A", "s")]


def test_a_list_state_holding_another_type_is_refused_naming_state_and_key_group(
    tmp_path: Path,
) -> None:
    # restore._decode 75, 81, 87, 116-121 (E5 and its message).
    metadata = file_metadata(state_meta(0, "l", kind="list"))
    kg = group(2)
    data = crafted(tmp_path, metadata, {kg: {0: [entry(2, state="not a list")]}})
    meta = StateMetaInfo("l", StateKind.LIST, UTF8, UTF8)
    with pytest.raises(SnapshotEntryError) as excinfo:
        read_snapshot(data, FULL, metas={"l": meta})
    assert str(excinfo.value) == (
        f"expected every state of 'l' in key group {kg} to be a list (what its kind holds), "
        "got a state of type str"
    )


def test_a_key_in_another_key_groups_block_is_refused_naming_the_state(tmp_path: Path) -> None:
    # restore._decode 70, 76, 105-115 (E3 and its message).
    key = 3
    wrong = (group(key) + 1) % MAXP
    data = crafted(tmp_path, file_metadata(state_meta(0, "a")), {wrong: {0: [entry(key)]}})
    with pytest.raises(KeyGroupMismatchError) as excinfo:
        read_snapshot(data, FULL)
    assert str(excinfo.value) == (
        f"expected every key in the block of key group {wrong} to belong to it, state 'a' "
        f"has key 3 there, whose key group is {group(key)}"
    )


def test_long_keys_are_checked_with_the_key_serializer_of_the_file(tmp_path: Path) -> None:
    # restore._decode 110 (E3 without the key serializer hashes -1 as an int32).
    longs = LongSerializer()
    table = value_table("a", (-1, -5, 3), key_serializer=longs)
    data = written(tmp_path, table.snapshot())
    restored = read_snapshot(data, FULL)
    assert sorted(restored.entries("a")) == sorted(
        (assign_to_key_group(k, MAXP, longs), k, "ns", f"a{k}") for k in (-1, -5, 3)
    )
