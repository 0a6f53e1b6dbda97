"""Tests that kill mutants of the ``checkpoint`` mutation scope (``make mutate
SCOPE=checkpoint``) in its RocksDB modules, ``cowstate.rocksdb.backend`` and
``cowstate.rocksdb.table``, that the scope's other killer tests let through or
never reach.

Each test is named after what it pins; the mutants it was written for are
named in its comment. They run on real RocksDB databases (``rocksdict``, in
``tmp_path``) and real snapshot files (crafted with the real writer by
:mod:`restore_support`), and are part of the normal suite.
"""

from __future__ import annotations

import gc
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from restore_support import (
    ABSOLUTE,
    FULL,
    MAX_P,
    RESTORED_ENTRIES,
    SER,
    VALUE,
    by_group,
    corrupt_database,
    corrupt_key,
    crafted,
    dump,
    fill,
    handle_for,
    rocks,
)
from rocksdict import Checkpoint, Options, Rdict, ReadOptions

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.checkpoint.storage import CheckpointStorage
from cowstate.errors import (
    BackendClosedError,
    CorruptStorageError,
    IncompatibleSnapshotError,
    InvalidArgumentError,
    KeyTypeMismatchError,
    MixedKeyTypesError,
    NoneStateError,
    SnapshotFormatError,
    SnapshotWriteError,
    TransformFunctionError,
    UnhashableKeyError,
)
from cowstate.key_groups import KeyGroupRange, assign_to_key_group, java_hash
from cowstate.rocksdb import backend as rocks_backend
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.rocksdb.table import (
    _PREFIX_AND_LENGTH,
    RocksDBStateTable,
    check_status,
    decode_rocks_key,
    scan,
)
from cowstate.serializers import LongSerializer
from cowstate.state_meta import SnapshotFormat, StateMetaInfo

#: Until these tests move beside the tests of what they pin.
pytestmark = [
    pytest.mark.kills(module="cowstate.rocksdb.table"),
    pytest.mark.kills(module="cowstate.rocksdb.backend"),
]

ROOT = ABSOLUTE
ENTRIES = RESTORED_ENTRIES
#: Two tables sharing one column family, each with half the key groups.
LOW = KeyGroupRange(0, 7)
HIGH = KeyGroupRange(8, MAX_P - 1)

Table = RocksDBStateTable[Any, Any, Any]


def keys_in(key_group_range: KeyGroupRange, count: int) -> list[int]:
    """The first ``count`` int keys whose key groups are in ``key_group_range``."""
    return [k for k in range(1000) if assign_to_key_group(k, MAX_P) in key_group_range][:count]


def wal_bytes(db_path: Path) -> int:
    """Bytes in the write-ahead log files (``*.log``) of the database at ``db_path``."""
    return sum(p.stat().st_size for p in db_path.iterdir() if p.suffix == ".log")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "db"


@pytest.fixture
def column(db_path: Path) -> Iterator[Rdict]:
    """One column family of a fresh raw-mode database at ``db_path``."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    database = Rdict(str(db_path), options)
    try:
        yield database.create_column_family("state", options)
    finally:
        database.close()


@pytest.fixture
def tables(column: Rdict) -> Iterator[tuple[Table, Table]]:
    """Tables of :data:`LOW` and :data:`HIGH` over the same column family, each
    holding 5 keys of its own key groups (``state [k]`` in namespace ``"ns"``)."""
    low: Table = RocksDBStateTable(column, LOW, MAX_P)
    high: Table = RocksDBStateTable(column, HIGH, MAX_P)
    for table, key_group_range in ((low, LOW), (high, HIGH)):
        for key in keys_in(key_group_range, 5):
            table.put(key, "ns", [key])
    try:
        yield low, high
    finally:
        low.detach()
        high.detach()


@pytest.fixture
def full(column: Rdict) -> Iterator[Table]:
    """A table of every key group over the column family."""
    table: Table = RocksDBStateTable(column, FULL, MAX_P)
    try:
        yield table
    finally:
        table.detach()


# -------------------------------------------------------------- rocksdb.table


def test_a_table_counts_only_the_mappings_of_its_own_key_groups(
    tables: tuple[Table, Table],
) -> None:
    # table.__len__ 5 (no upper bound: counted the other table's mappings
    # stored after its key groups in the same column family).
    low, high = tables
    assert len(low) == 5
    assert len(high) == 5
    assert sum(1 for _ in low) == 5


def test_keys_and_namespace_sizes_see_only_the_tables_own_key_groups(
    tables: tuple[Table, Table],
) -> None:
    # table._raw_keys 3 (no upper bound: keys() and size_of_namespace() also
    # read the mappings of the key groups after the table's).
    low, high = tables
    assert sorted(low.keys("ns")) == sorted(keys_in(LOW, 5))
    assert low.size_of_namespace("ns") == 5
    assert sorted(high.keys("ns")) == sorted(keys_in(HIGH, 5))
    assert high.size_of_namespace("ns") == 5


def test_entries_in_key_group_give_that_key_group_alone(full: Table) -> None:
    # table.entries_in_key_group 3 (no upper bound: every later key group too)
    # and 9 (`key_group + 2`: the next key group too).
    keys = keys_in(FULL, 200)
    for key in keys:
        full.put(key, "ns", f"s{key}")
    for key_group in range(MAX_P):
        own = {k for k in keys if assign_to_key_group(k, MAX_P) == key_group}
        assert own  # every key group holds keys
        got = {(e.key, e.namespace, e.state) for e in full.entries_in_key_group(key_group)}
        assert got == {(k, "ns", f"s{k}") for k in own}


def test_a_mapping_put_in_a_given_key_group_is_found_and_removed_there(full: Table) -> None:
    # table.contains_key 4, put_and_get_old 4, remove 7, remove_and_get_old 4
    # (`key_group=None`: the key's own key group instead of the one given).
    key = 7
    own = assign_to_key_group(key, MAX_P)
    given = (own + 3) % MAX_P
    full.put(key, "ns", "first", key_group=given)
    assert full.contains_key(key, "ns", key_group=given)
    assert not full.contains_key(key, "ns")
    assert full.put_and_get_old(key, "ns", "second", key_group=given) == "first"
    assert full.get(key, "ns", key_group=given) == "second"
    assert full.get(key, "ns") is None
    assert full.remove_and_get_old(key, "ns", key_group=given) == "second"
    assert full.get(key, "ns", key_group=given) is None
    full.put(key, "ns", "third", key_group=given)
    full.put(key, "ns", "own")
    full.remove(key, "ns", key_group=given)
    assert full.get(key, "ns", key_group=given) is None
    assert full.get(key, "ns") == "own"
    assert len(full) == 1


def test_a_transform_in_a_given_key_group_reads_and_writes_there(full: Table) -> None:
    # table.transform 4 (`key_group=None`: the key's own key group instead of
    # the one given).
    key = 7
    given = (assign_to_key_group(key, MAX_P) + 3) % MAX_P
    full.put(key, "ns", "there", key_group=given)
    full.transform(key, "ns", "!", lambda old, value: f"{old}{value}", key_group=given)
    assert full.get(key, "ns", key_group=given) == "there!"
    assert full.get(key, "ns") is None


def test_a_failing_transform_names_its_key_and_namespace(full: Table) -> None:
    # table.transform 20, 21 (the key or the namespace the error names dropped).
    full.put(3, "ns", "kept")

    def fails(old: Any, value: Any) -> Any:
        raise ValueError("no")

    with pytest.raises(TransformFunctionError) as excinfo:
        full.transform(3, "ns", 1, fails)
    assert "(3, 'ns')" in str(excinfo.value)
    assert full.get(3, "ns") == "kept"


@pytest.mark.parametrize("call", ["put", "put_and_get_old"])
def test_a_write_of_none_is_refused_naming_the_call(full: Table, call: str) -> None:
    # table.put and table.put_and_get_old 8, 9, 11, 16, 17 (the message: the
    # operation, key and namespace it names).
    full.put(3, "ns", "kept")
    with pytest.raises(NoneStateError) as excinfo:
        getattr(full, call)(3, "ns", None)
    assert str(excinfo.value) == (
        f"expected a state for {call}(3, 'ns'), got None; None means absent, use remove() to unmap"
    )
    assert full.get(3, "ns") == "kept"


@pytest.mark.parametrize(
    "call", ["put_and_get_old", "remove", "remove_and_get_old", "transform", "absent"]
)
def test_state_writes_skip_the_write_ahead_log(full: Table, db_path: Path, call: str) -> None:
    # table.put_and_get_old 24, 27, remove 2, 4, remove_and_get_old 12, 14,
    # transform 29, 32
    # (the writes' options dropped: the database's default options write the
    # WAL, which the module doc says state writes skip).
    full.put(1, "ns", "one")
    assert wal_bytes(db_path) == 0
    if call == "put_and_get_old":
        assert full.put_and_get_old(1, "ns", "two") == "one"
        assert full.get(1, "ns") == "two"
    elif call == "remove":
        full.remove(1, "ns")
        assert full.get(1, "ns") is None
    elif call == "remove_and_get_old":
        assert full.remove_and_get_old(1, "ns") == "one"
        assert full.get(1, "ns") is None
    elif call == "transform":
        full.transform(1, "ns", "!", lambda old, value: f"{old}{value}")
        assert full.get(1, "ns") == "one!"
    else:
        full.remove(2, "ns")  # absent: a delete all the same
    assert wal_bytes(db_path) == 0


@pytest.mark.parametrize("call", ["keys", "size_of_namespace"])
def test_reading_by_an_unhashable_namespace_is_refused_naming_the_namespace(
    full: Table, call: str
) -> None:
    # table._namespace_bytes 1-6 (the namespace not checked, or the message
    # naming no role, the wrong role or a mangled one).
    full.put(1, "ns", "kept")
    with pytest.raises(UnhashableKeyError) as excinfo:
        getattr(full, call)([1])
    assert str(excinfo.value) == "expected a hashable namespace, got list [1]"


def test_a_table_repr_names_its_state_key_groups_and_whether_attached(column: Rdict) -> None:
    # table.__repr__ 1-9 (no killer test took the repr of a RocksDB table).
    table: Table = RocksDBStateTable(column, LOW, MAX_P, meta=StateMetaInfo("counts"))
    assert repr(table) == "<RocksDBStateTable 'counts' KeyGroupRange(0, 7) of 16, attached>"
    table.detach()
    assert repr(table) == "<RocksDBStateTable 'counts' KeyGroupRange(0, 7) of 16, detached>"


def test_a_detached_table_and_a_none_key_are_refused_saying_what_to_do(column: Rdict) -> None:
    # table._column 6, 7 (the advice the closed table's message ends with),
    # table._rocks_key 3 (the message of a None key).
    table: Table = RocksDBStateTable(column, FULL, MAX_P, meta=StateMetaInfo("counts"))
    with pytest.raises(InvalidArgumentError) as none_key:
        table.put(None, "ns", "state")
    assert str(none_key.value) == (
        "expected a key, got None; keyed state needs a key (no key set?)"
    )
    table.detach()
    with pytest.raises(BackendClosedError) as closed:
        table.get(1, "ns")
    assert str(closed.value) == (
        "expected the table of state 'counts' to be in use, got one whose database was "
        "closed or replaced by a restore; ask the backend for its table again"
    )


def test_a_long_key_serializer_places_keys_in_their_long_key_groups(column: Rdict) -> None:
    # table._rocks_key 18, 21 (the key group computed without the table's key
    # serializer: an int key hashed as a Java Integer, not a Long).
    table: Table = RocksDBStateTable(column, FULL, MAX_P, key_serializer=LongSerializer())
    try:
        keys = [k for k in range(-200, 0) if java_hash(k, LongSerializer()) != java_hash(k)]
        moved = [
            k
            for k in keys
            if assign_to_key_group(k, MAX_P, LongSerializer()) != assign_to_key_group(k, MAX_P)
        ]
        assert moved  # keys whose Long and Integer key groups differ
        for key in moved:
            table.put(key, "ns", [key])
        for key in moved:
            group = assign_to_key_group(key, MAX_P, LongSerializer())
            assert (key, "ns", [key]) in [
                (e.key, e.namespace, e.state) for e in table.entries_in_key_group(group)
            ]
            assert table.get(key, "ns", key_group=group) == [key]
    finally:
        table.detach()


def test_a_torn_rocks_key_is_shown_by_its_first_40_bytes() -> None:
    # table.decode_rocks_key 10 (the message showing 41 bytes of a long key).
    torn = _PREFIX_AND_LENGTH.pack(3, 100) + bytes(range(60))
    with pytest.raises(CorruptStorageError) as excinfo:
        decode_rocks_key(torn)
    shown = str(excinfo.value).rsplit(": ", 1)[1]
    assert bytes.fromhex(shown) == torn[:40]


class _Recording:
    """A column family whose iterators record the keys they hand out, one list
    per native iterator; ``honour_bounds=False`` drops the read options, as a
    binding that ignored the upper bound would."""

    def __init__(self, cf: Rdict, honour_bounds: bool = True) -> None:
        self.cf = cf
        self.honour_bounds = honour_bounds
        self.read: list[list[bytes]] = []

    def iter(self, read_options: ReadOptions) -> _RecordingIterator:
        keys: list[bytes] = []
        self.read.append(keys)
        inner = self.cf.iter(read_options if self.honour_bounds else ReadOptions())
        return _RecordingIterator(inner, keys)


class _RecordingIterator:
    def __init__(self, inner: Any, keys: list[bytes]) -> None:
        self.inner, self.keys = inner, keys

    def seek(self, key: bytes) -> None:
        self.inner.seek(key)

    def valid(self) -> bool:
        return bool(self.inner.valid())

    def key(self) -> bytes:
        key: bytes = self.inner.key()
        self.keys.append(key)
        return key

    def value(self) -> bytes:
        value: bytes = self.inner.value()
        return value

    def next(self) -> None:
        self.inner.next()

    def status(self) -> None:
        self.inner.status()


def scan_through(
    recording: _Recording, lower: bytes, upper: bytes | None, chunk: int
) -> list[tuple[bytes, bytes]]:
    """Everything ``scan`` reads through ``recording`` (a column family getter)."""
    return list(scan(lambda: recording, lower, upper, chunk))  # type: ignore[arg-type, return-value]


SCANNED = [b"a", b"a\x00", b"aB", b"b", b"c", b"c\x01", b"d", b"e"]


@pytest.fixture
def scanned(column: Rdict) -> Rdict:
    """The column family holding the keys :data:`SCANNED` (value: the key upper-cased)."""
    for key in SCANNED:
        column.put(key, key.upper())
    return column


def test_a_scan_stops_at_its_upper_bound_inside_rocksdb_chunk_by_chunk(scanned: Rdict) -> None:
    # table.scan 4, 5, 10 (the upper bound not given to RocksDB: the iterator
    # reads the first key past it), 14 (a native iterator reading chunk + 1
    # entries), 39 (the next chunk seeking past keys that extend the last one).
    recording = _Recording(scanned)
    read = scan_through(recording, b"a", b"d", chunk=2)
    assert read == [(k, k.upper()) for k in SCANNED if b"a" <= k < b"d"]
    assert [len(keys) for keys in recording.read] == [2, 2, 2, 0]
    assert all(key < b"d" for keys in recording.read for key in keys)
    to_the_end = _Recording(scanned)
    assert [k for k, _ in scan_through(to_the_end, b"c", None, chunk=1)] == [
        b"c",
        b"c\x01",
        b"d",
        b"e",
    ]
    assert [len(keys) for keys in to_the_end.read] == [1, 1, 1, 1, 0]


def test_a_scan_stops_at_its_upper_bound_where_rocksdb_does_not(scanned: Rdict) -> None:
    # table.scan 18 (the key equal to the upper bound taken), 19 (the chunk
    # dropped when a key past the bound ends it).
    for chunk in (2, 100):
        ignoring = _Recording(scanned, honour_bounds=False)
        read = scan_through(ignoring, b"a\x00", b"c\x01", chunk=chunk)
        assert [k for k, _ in read] == [b"a\x00", b"aB", b"b", b"c"]


def test_a_scan_stopped_by_corruption_names_its_bound_and_last_key(tmp_path: Path) -> None:
    # table.scan 23 (the bound the message names dropped), 28 (the start of
    # the chunk named instead of the last key read), 32 (the last value named).
    database = corrupt_database(tmp_path / "db", 20_000)
    keys = {corrupt_key(i) for i in range(20_000)}
    try:
        with pytest.raises(CorruptStorageError) as excinfo:
            list(scan(database, b"", b"\xff\xff", chunk=100_000))
    finally:
        database.close()
    message = str(excinfo.value)
    prefix = "expected RocksDB to read every entry up to ffff, it stopped after "
    assert message.startswith(prefix)
    last = bytes.fromhex(message.removeprefix(prefix).split(":", 1)[0])
    assert last in keys  # a key read before the corrupt block, not its value


# ------------------------------------------------------------ rocksdb.backend


def test_restore_refuses_a_single_handle_or_a_non_iterable_naming_its_type(
    tmp_path: Path,
) -> None:
    # backend.restore 1 (`and`: a lone handle iterated as its fields, an int
    # failing in list()), 3 (message None), 4 (`type(None)` named).
    handle = handle_for(tmp_path / "sp" / "file", crafted(by_group(ENTRIES)))
    backend = rocks(tmp_path / "local")
    try:
        fill(backend, range(100, 110), tag="mine")
        before = dump(backend)
        with pytest.raises(InvalidArgumentError) as excinfo:
            backend.restore(handle, ROOT)  # type: ignore[arg-type]
        assert str(excinfo.value) == (
            "expected an iterable of KeyedStateHandles, got KeyedStateHandle"
        )
        with pytest.raises(InvalidArgumentError) as excinfo:
            backend.restore(5, ROOT)  # type: ignore[arg-type]
        assert str(excinfo.value) == "expected an iterable of KeyedStateHandles, got int"
        assert dump(backend) == before
    finally:
        backend.close()


def test_restore_without_a_source_is_refused_saying_what_it_needs(tmp_path: Path) -> None:
    # backend.restore 14-20 (the message of a restore without a SnapshotSource).
    handle = handle_for(tmp_path / "sp" / "file", crafted(by_group(ENTRIES)))
    backend = rocks(tmp_path / "local")
    try:
        fill(backend, range(100, 110), tag="mine")
        before = dump(backend)
        with pytest.raises(InvalidArgumentError) as excinfo:
            backend.restore([handle])
        assert str(excinfo.value) == (
            "expected the SnapshotSource of the snapshot's directory (handles' paths are "
            "relative to it), got None"
        )
        assert dump(backend) == before
    finally:
        backend.close()


def test_a_canonical_file_of_other_key_groups_than_its_handle_is_refused_by_path(
    tmp_path: Path,
) -> None:
    # backend._check_file 2 (the file's path passed as None: the message named
    # None instead of the file).
    low = KeyGroupRange(0, 7)
    blocks = {kg: rows for kg, rows in by_group(ENTRIES).items() if kg in low}
    assert blocks  # the file holds entries
    file = tmp_path / "sp" / "file"
    handle = handle_for(file, crafted(blocks, key_group_range=low))  # says key groups 0-15
    backend = rocks(tmp_path / "local")
    try:
        fill(backend, range(100, 110), tag="mine")
        before = dump(backend)
        with pytest.raises(SnapshotFormatError) as excinfo:
            backend.restore([handle], ROOT)
        assert str(excinfo.value) == (
            f"expected {str(file)!r} to hold key groups [0, 15] in format canonical of max "
            f"parallelism {MAX_P} with key serializer 'tests.trusted-pickle' as its handle "
            f"says, the file holds key groups [0, 7] in format canonical of max parallelism "
            f"{MAX_P} with key serializer 'tests.trusted-pickle'"
        )
        assert dump(backend) == before
    finally:
        backend.close()


def _rocks_with(local: Path, executor: ThreadPoolExecutor) -> RocksDBKeyedStateBackend:
    backend = RocksDBKeyedStateBackend(
        FULL,
        MAX_P,
        local_dir=local,
        key_serializer=SER,
        namespace_serializer=SER,
        executor=executor,
    )
    backend.get_state(VALUE)
    return backend


def test_a_checkpoint_written_across_two_restores_never_becomes_the_base(tmp_path: Path) -> None:
    # backend._swap 15 (`_generation = 1`: the second restore left the
    # generation the first one set, so a checkpoint taken between them and
    # written after the second was recorded as a base of the new database),
    # 22, 23 (an unseeded restore's last confirmed checkpoint not -1).
    handle = handle_for(tmp_path / "sp" / "file", crafted(by_group(ENTRIES)))
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    executor = ThreadPoolExecutor(max_workers=1)
    backend = _rocks_with(tmp_path / "local", executor)
    try:
        backend.restore([handle], ROOT)
        assert backend.last_completed_checkpoint_id == -1
        release = threading.Event()
        executor.submit(release.wait, 10)  # the writer is busy elsewhere
        future = backend.snapshot_to(
            5, storage.checkpoint_location(5), SnapshotOptions(kind="checkpoint")
        )
        backend.restore([handle], ROOT)  # a new database under the queued writer
        release.set()
        future.result(timeout=30)
        backend.notify_checkpoint_complete(5)
        assert backend.last_completed_checkpoint_id == -1
        assert backend.incremental_base == {}
    finally:
        backend.close()
        executor.shutdown(wait=True)


def test_a_restore_survives_a_local_database_directory_already_gone(tmp_path: Path) -> None:
    # backend._swap 30, 32, 33 (`rmtree` of the replaced database's directory
    # without ignore_errors: the restore failed after it had swapped).
    handle = handle_for(tmp_path / "sp" / "file", crafted(by_group(ENTRIES)))
    backend = rocks(tmp_path / "local")
    try:
        old = Path(backend._db_path)
        fill(backend, range(100, 110), tag="mine")
        shutil.rmtree(old)  # an operator's clean-up of the working directory
        backend.restore([handle], ROOT)
        assert dump(backend)["value"] == {(k, n): s for k, n, s in ENTRIES}
    finally:
        backend.close()


def test_a_restore_fixes_the_key_type_of_a_fresh_backend(tmp_path: Path) -> None:
    # backend.RocksDBPreparedRestore.__init__ 2 (the restored key type not
    # passed: a fresh backend restored with int keys took a str key).
    handle = handle_for(tmp_path / "sp" / "file", crafted(by_group(ENTRIES)))
    backend = rocks(tmp_path / "local")
    try:
        backend.restore([handle], ROOT)
        with pytest.raises(KeyTypeMismatchError) as excinfo:
            backend.set_current_key("a")
        assert str(excinfo.value) == (
            "expected a key of type int (fixed by the first key), got str: 'a'"
        )
    finally:
        backend.close()


def test_checkpoint_zero_is_a_checkpoint(tmp_path: Path) -> None:
    # backend.snapshot_to 4 (`checkpoint_id <= 0` refused id 0, which the
    # handles allow).
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    backend = rocks(tmp_path / "local")
    try:
        fill(backend, range(5))
        handle = backend.snapshot_to(
            0, storage.checkpoint_location(0), SnapshotOptions(kind="checkpoint")
        ).result(timeout=30)
        assert handle.checkpoint_id == 0
    finally:
        backend.close()


def test_the_handles_of_two_formats_are_refused_naming_both(tmp_path: Path) -> None:
    # backend.prepare_restore 10, 11 (two formats taken, or the message dropped).
    low = KeyGroupRange(0, 7)
    blocks = {kg: rows for kg, rows in by_group(ENTRIES).items() if kg in low}
    handle = handle_for(tmp_path / "sp" / "file", crafted(blocks, key_group_range=low))
    handle = handle.model_copy(update={"key_group_range": (0, 7)})
    native = handle.model_copy(
        update={
            "format": SnapshotFormat.ROCKSDB_NATIVE,
            "backend": "rocksdb",
            "key_group_range": (8, 15),
        }
    )
    backend = rocks(tmp_path / "local")
    try:
        with pytest.raises(IncompatibleSnapshotError) as excinfo:
            backend.prepare_restore([handle, native], ROOT)
        formats = sorted({handle.format, native.format})
        assert str(excinfo.value) == (
            f"expected the handles of one snapshot (one format), got formats {formats}"
        )
    finally:
        backend.close()


def test_a_restore_of_keys_of_another_type_than_the_backends_is_refused(
    tmp_path: Path,
) -> None:
    # backend.prepare_restore 25, 30 (the backend's key type not given to the
    # restorer: str keys restored into a backend whose keys are ints).
    handle = handle_for(
        tmp_path / "sp" / "file", crafted(by_group([(f"k{k}", "a", k) for k in range(5)]))
    )
    backend = rocks(tmp_path / "local")
    try:
        fill(backend, range(3))  # fixes int keys
        before = dump(backend)
        with pytest.raises(MixedKeyTypesError, match="got str: 'k0'"):
            backend.restore([handle], ROOT)
        assert dump(backend) == before
    finally:
        backend.close()


def test_a_native_restore_is_no_incremental_base_unless_asked(tmp_path: Path) -> None:
    # backend.prepare_restore 1 (`incremental_base=True` by default: a restore
    # that did not ask took the snapshot's SSTs as its base).
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    source_backend = rocks(tmp_path / "source")
    backend = rocks(tmp_path / "local")
    try:
        fill(source_backend, range(20))
        location = storage.checkpoint_location(3)
        handle = source_backend.snapshot_to(3, location, SnapshotOptions(kind="checkpoint")).result(
            timeout=30
        )
        source = SnapshotSource(FileSystem(), location.directory)
        backend.prepare_restore([handle], source).commit()
        assert backend.last_completed_checkpoint_id == -1
        assert backend.incremental_base == {}
        assert dump(backend) == dump(source_backend)
        backend.prepare_restore([handle], source, incremental_base=True).commit()
        assert backend.last_completed_checkpoint_id == 3
    finally:
        source_backend.close()
        backend.close()


# table.decode_rocks_key 2, 3 (a key of exactly the frame taken as too short,
# the message dropped), 6, 8, 9 (a key length past the end taken, the
# message dropped or counting wrong).
def test_a_rocks_key_is_decoded_or_refused_saying_what_is_missing() -> None:
    frame = _PREFIX_AND_LENGTH.size
    assert decode_rocks_key(_PREFIX_AND_LENGTH.pack(3, 0)) == (3, b"", b"")
    assert decode_rocks_key(_PREFIX_AND_LENGTH.pack(3, 2) + b"kkns") == (3, b"kk", b"ns")
    with pytest.raises(CorruptStorageError) as excinfo:
        decode_rocks_key(b"\x00")
    assert str(excinfo.value) == (
        f"expected a RocksDB key of at least {frame} bytes (key group, key length), got 00"
    )
    torn = _PREFIX_AND_LENGTH.pack(3, 5) + b"kk"
    with pytest.raises(CorruptStorageError) as excinfo:
        decode_rocks_key(torn)
    assert str(excinfo.value) == (
        "expected a RocksDB key holding the 5 key bytes its length frame says, got 2 bytes "
        f"after the frame: {torn.hex()}"
    )


class _FailingIterator:
    def status(self) -> None:
        raise RuntimeError("Corruption: block checksum mismatch")


# table.check_status 1-6 (the bound the message names: "the end" without an
# upper bound, the bound's bytes with one).
def test_an_iterator_that_stopped_on_an_error_names_where_and_why() -> None:
    for upper, bound in ((None, "the end"), (b"\x00\x07", "0007")):
        with pytest.raises(CorruptStorageError) as excinfo:
            check_status(_FailingIterator(), b"\x00\x01", upper)  # type: ignore[arg-type]
        assert str(excinfo.value) == (
            f"expected RocksDB to read every entry up to {bound}, it stopped after 0001: "
            "Corruption: block checksum mismatch"
        )


# backend.snapshot_to 9, 11, 12 (the refusals of a location or options of
# another type), 17, 18, 20, 21 (a checkpoint into a location without a
# shared directory).
def test_a_snapshot_is_refused_a_location_or_options_it_cannot_use(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    location = storage.checkpoint_location(1)
    options = SnapshotOptions(kind="checkpoint")
    backend = rocks(tmp_path / "local")
    try:
        refused: list[tuple[Any, Any, str]] = [
            ("there", options, "expected a SnapshotLocation, got str"),
            (location, "full", "expected SnapshotOptions, got str"),
            (
                SnapshotLocation(FileSystem(), str(tmp_path / "sp")),
                options,
                "expected a checkpoint location with a shared directory for the SST files, "
                "got one without (a savepoint location?)",
            ),
        ]
        for where, how, message in refused:
            with pytest.raises(InvalidArgumentError) as excinfo:
                backend.snapshot_to(1, where, how)
            assert str(excinfo.value) == message
    finally:
        backend.close()


# backend.snapshot_to 23 (the local checkpoint directory not named after its
# checkpoint), 28 (its half-made ``.tmp`` left behind), 29-31 (the message).
def test_a_local_checkpoint_rocksdb_cannot_take_is_refused_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    backend = rocks(tmp_path / "local")
    fill(backend, range(50))
    checkpoints = Path(backend.local_checkpoints_path)
    checkpoints.mkdir(exist_ok=True)
    # A dangling link is no existing directory to the backend, but RocksDB's
    # final rename of ``chk-1.tmp`` onto it fails.
    (checkpoints / "chk-1").symlink_to(tmp_path / "nowhere" / "chk-1")
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    try:
        with pytest.raises(SnapshotWriteError) as excinfo:
            backend.snapshot_to(
                1, storage.checkpoint_location(1), SnapshotOptions(kind="checkpoint")
            )
        message = str(excinfo.value)
        where = checkpoints / "chk-1"
        assert message.startswith(
            f"expected RocksDB to take local checkpoint 1 in {str(where)!r}, got Exception: "
        )
        assert "Not a directory" in message
        assert sorted(p.name for p in checkpoints.iterdir()) == ["chk-1"]  # no chk-1.tmp
        assert backend.pending_snapshots == 0
        location = storage.checkpoint_location(2)
        handle = backend.snapshot_to(2, location, SnapshotOptions(kind="checkpoint")).result(30)
        restored = rocks(tmp_path / "restored")
        try:
            restored.restore([handle], SnapshotSource(FileSystem(), location.directory))
            assert dump(restored) == dump(backend)
        finally:
            restored.close()
    finally:
        backend.close()


# backend.snapshot_to 73 (the snapshot the failure names), 76, 91, 92 (what
# the failure says became of the local checkpoint).
def test_a_failed_upload_names_its_snapshot_and_the_deleted_local_checkpoint(
    tmp_path: Path,
) -> None:
    def disk_full(op: str, path: str, data: bytes | None) -> None:
        if op == "write" and "/shared/" in path:
            raise OSError("disk full")

    backend = rocks(tmp_path / "local")
    fill(backend, range(50))
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem(hooks=disk_full))
    try:
        future = backend.snapshot_to(
            7, storage.checkpoint_location(7), SnapshotOptions(kind="checkpoint")
        )
        with pytest.raises(SnapshotWriteError) as excinfo:
            future.result(30)
        assert str(excinfo.value) == (
            "expected snapshot 7 to be written, got OSError: disk full; its local "
            "checkpoint was deleted"
        )
        assert list(Path(backend.local_checkpoints_path).iterdir()) == []
    finally:
        backend.close()


# backend.__init__ 6, 12-14 (the writer thread's name).
def test_the_snapshot_writer_thread_is_named_for_rocksdb(tmp_path: Path) -> None:
    names: list[str] = []

    def record(op: str, path: str, data: bytes | None) -> None:
        names.append(threading.current_thread().name)

    backend = rocks(tmp_path / "local")
    fill(backend, range(50))
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem(hooks=record))
    try:
        backend.snapshot_to(
            1, storage.checkpoint_location(1), SnapshotOptions(kind="checkpoint")
        ).result(30)
    finally:
        backend.close()
    assert names
    assert {name.rsplit("_", 1)[0] for name in names} == {"cowstate-rocksdb-snapshot"}


# backend.__init__ 19 (the type the refusal of options names).
def test_options_of_another_type_are_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as excinfo:
        RocksDBKeyedStateBackend(FULL, MAX_P, local_dir=tmp_path / "local", options="raw")  # type: ignore[arg-type]
    assert str(excinfo.value) == "expected rocksdict.Options(raw_mode=True) or None, got str"
    assert not (tmp_path / "local").exists() or not any((tmp_path / "local").iterdir())


# backend._release_resources 1 (closing a database that cannot flush raises
# instead of the close going on to release the rest).
def test_a_backend_whose_local_directory_vanished_still_closes(tmp_path: Path) -> None:
    backend = rocks(tmp_path / "local")
    fill(backend, range(50))  # in the memtable: closing flushes it (writes skip the WAL)
    table = backend.table("value")
    shutil.rmtree(tmp_path / "local")
    backend.close()
    with pytest.raises(BackendClosedError):
        table.get(1, "a")
    assert not (tmp_path / "local").exists()


class _SyncFails:
    """RocksDB's checkpoint, failing after it renamed its directory into place:
    what a failed fsync of the new directory does (the one failure after which
    RocksDB leaves files behind; a disk this test cannot break)."""

    def __init__(self, db: Rdict) -> None:
        self._checkpoint = Checkpoint(db)

    def create_checkpoint(self, path: str) -> None:
        self._checkpoint.create_checkpoint(path)
        del self._checkpoint
        raise OSError("IO error: While fsync: a directory: Input/output error")


# backend.snapshot_to 28 (the local checkpoint left behind by a failure after
# RocksDB made it).
def test_a_local_checkpoint_that_fails_once_made_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = rocks(tmp_path / "local")
    fill(backend, range(50))
    storage = CheckpointStorage(str(tmp_path / "root"), "job", FileSystem())
    monkeypatch.setattr(rocks_backend, "Checkpoint", _SyncFails)
    try:
        with pytest.raises(SnapshotWriteError, match="got OSError: IO error: While fsync"):
            backend.snapshot_to(
                1, storage.checkpoint_location(1), SnapshotOptions(kind="checkpoint")
            )
        assert list(Path(backend.local_checkpoints_path).iterdir()) == []
    finally:
        backend.close()


def test_a_table_reads_nothing_of_the_key_group_right_after_its_own(
    column: Rdict,
) -> None:
    # table.__init__ 16 (the upper bound one key group too far: the low
    # table read the first key group of the high one).
    low: Table = RocksDBStateTable(column, LOW, MAX_P)
    high: Table = RocksDBStateTable(column, HIGH, MAX_P)
    try:
        [next_key] = [k for k in range(1000) if assign_to_key_group(k, MAX_P) == 8][:1]
        [own_key] = keys_in(LOW, 1)
        high.put(next_key, "ns", "high")
        low.put(own_key, "ns", "low")
        assert len(low) == 1
        assert [e.key for e in low] == [own_key]
        assert list(low.keys("ns")) == [own_key]
    finally:
        low.detach()
        high.detach()


# backend.__init__ 37-39 (the temporary directory's prefix), 44 (the
# instance directory's name).
def test_a_backend_without_a_local_dir_makes_a_named_temporary_one() -> None:
    backend = RocksDBKeyedStateBackend(FULL, MAX_P)
    try:
        instance = backend.instance_path
        assert instance.parent.parent == Path(tempfile.gettempdir()).absolute()
        assert instance.parent.name.startswith("cowstate-rocksdb-")
        assert re.fullmatch(r"cowstate-rocksdb-[0-9a-f]{12}", instance.name)
    finally:
        backend.close()
    assert not instance.parent.exists()


# backend.__init__ 53 (the first confirmed id before any: -1 says none).
def test_a_fresh_backend_has_no_confirmed_checkpoint(tmp_path: Path) -> None:
    backend = rocks(tmp_path / "local")
    try:
        assert backend.last_completed_checkpoint_id == -1
        assert backend.incremental_base == {}
    finally:
        backend.close()


# backend.__init__ 72, 76 (the finalizer of a backend dropped without close()
# given no instance directory to remove).
def test_a_backend_dropped_without_close_leaves_no_directory(tmp_path: Path) -> None:
    local = tmp_path / "local"
    backend = rocks(local)
    fill(backend, range(20))
    instance = backend.instance_path
    assert instance.is_dir()
    del backend
    gc.collect()
    assert not instance.exists()
    assert local.is_dir()  # the caller's directory stays
