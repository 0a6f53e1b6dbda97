"""The RocksDB table on its own: what its structural checker catches, and that a
failed call keeps no column family alive.

``check_rocksdb_table`` runs after every step of the table machine; each test
here builds a healthy table, checks that the checker accepts it, writes one
bad raw entry into its column family, and requires the violation it names.

Then the table's own API, on tables sharing one column family: a table reads
only its own key groups (bounded scans), writes in the key group it is given
and never to the write-ahead log, names the key, namespace or call it refuses,
and decodes the key layout or says what is missing. The tests marked
``kills`` were written to kill mutants of ``cowstate.rocksdb.table`` (``make
mutate SCOPE=checkpoint``); their comments name the mutants. (Reading with
bounds and checking the iterator's status: ``test_rocksdb_scan.py``.)
"""

from __future__ import annotations

import pickle
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from cowstate import value_codec
from cowstate.errors import (
    BackendClosedError,
    CorruptStorageError,
    CowStateError,
    InvalidArgumentError,
    NoneStateError,
    TransformFunctionError,
    UnhashableKeyError,
)
from cowstate.key_groups import KeyGroupRange, assign_to_key_group, java_hash
from cowstate.rocksdb.table import (
    _PREFIX_AND_LENGTH,
    RocksDBStateTable,
    decode_rocks_key,
    encode_rocks_key,
    write_options,
)
from cowstate.serializers import DefaultSerializer, LongSerializer
from cowstate.state_meta import StateMetaInfo
from cowstate_spec.implementations import close_rocksdb_table, rocksdb_table
from cowstate_spec.invariants import InvariantViolation, check_rocksdb_table

MAXP = 16
RANGE = KeyGroupRange(4, 11)
FULL = KeyGroupRange(0, MAXP - 1)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Rdict]:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    database = Rdict(str(tmp_path / "db"), options)
    try:
        yield database.create_column_family("state", options)
    finally:
        database.close()


def keys_of_the_range(count: int) -> list[int]:
    return keys_in(RANGE, count)


@pytest.fixture
def table(db: Rdict) -> Iterator[RocksDBStateTable[Any, Any, Any]]:
    t: RocksDBStateTable[Any, Any, Any] = RocksDBStateTable(db, RANGE, MAXP)
    for key in keys_of_the_range(10):
        t.put(key, "ns", [key])
    check_rocksdb_table(t)
    yield t
    t.detach()


def raw(key_group: int, key: Any, namespace: Any, state: Any) -> tuple[bytes, bytes]:
    serializer = DefaultSerializer()
    return (
        encode_rocks_key(key_group, serializer.serialize(key), serializer.serialize(namespace)),
        serializer.serialize(state),
    )


def violation(
    db: Rdict, table: RocksDBStateTable[Any, Any, Any], entry: tuple[bytes, bytes], what: str
) -> str:
    db.put(entry[0], entry[1], write_options())
    with pytest.raises(InvariantViolation, match=what) as info:
        check_rocksdb_table(table)
    return str(info.value)


def test_an_entry_outside_the_key_groups_is_a_layout_violation(
    db: Rdict, table: RocksDBStateTable[Any, Any, Any]
) -> None:
    key = next(k for k in range(1000) if assign_to_key_group(k, MAXP) == 12)
    message = violation(db, table, raw(12, key, "ns", [1]), "RocksDB layout violated")
    assert "is in key group 12, outside KeyGroupRange(4, 11)" in message


def test_a_key_in_another_key_group_is_a_routing_violation(
    db: Rdict, table: RocksDBStateTable[Any, Any, Any]
) -> None:
    key = keys_of_the_range(1)[0]
    own = assign_to_key_group(key, MAXP)
    other = 4 if own != 4 else 5
    message = violation(db, table, raw(other, key, "other-ns", [1]), "RocksDB routing violated")
    assert f"stored in key group {other}, its key group is {own}" in message


def test_a_key_shorter_than_its_frame_is_a_layout_violation(
    db: Rdict, table: RocksDBStateTable[Any, Any, Any]
) -> None:
    entry = ((5).to_bytes(2, "big") + (99).to_bytes(4, "big") + b"abc", pickle.dumps(1))
    assert "frames a key of 99 bytes, 3 follow" in violation(
        db, table, entry, "RocksDB layout violated"
    )
    db.delete(entry[0])
    stub = ((5).to_bytes(2, "big") + b"\x00", pickle.dumps(1))
    assert "shorter than 6 bytes" in violation(db, table, stub, "RocksDB layout violated")


def test_bytes_that_are_not_the_serializers_are_a_layout_violation(
    db: Rdict, table: RocksDBStateTable[Any, Any, Any]
) -> None:
    """An int written as a 32-bit MessagePack integer decodes to the same key but
    is not the table's bytes for it (the codec writes the shortest form): the
    same mapping could then live under two RocksDB keys."""
    key = keys_of_the_range(1)[0]
    assert 0 <= key < 1 << 16  # so its canonical form is never the 32-bit one
    longhand = bytes([value_codec.VERSION, 0xCE]) + key.to_bytes(4, "big")
    assert value_codec.decode(longhand) == key and longhand != value_codec.encode(key)
    rocks_key = encode_rocks_key(assign_to_key_group(key, MAXP), longhand, value_codec.encode("x"))
    message = violation(db, table, (rocks_key, value_codec.encode(1)), "are not canonical")
    assert "the key bytes" in message


def test_a_stored_none_is_a_value_violation(
    db: Rdict, table: RocksDBStateTable[Any, Any, Any]
) -> None:
    key = keys_of_the_range(11)[-1]
    entry = raw(assign_to_key_group(key, MAXP), key, "ns", None)
    assert "holds None" in violation(db, table, entry, "RocksDB values violated")


# ------------------------------------------------- no column family held by an error


def frames_holding_a_column_family(error: BaseException) -> list[str]:
    """The frames of ``error``'s traceback with an ``Rdict`` among their locals."""
    found = []
    tb: types.TracebackType | None = error.__traceback__
    while tb is not None:
        if any(isinstance(v, Rdict) for v in tb.tb_frame.f_locals.values()):
            found.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return found


def explode(old: Any, value: Any) -> Any:
    raise ValueError("boom")


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.transform(1, "ns", 0, explode),
        lambda t: t.transform(1, "ns", 0, lambda old, value: None),
        lambda t: t.transform(1, "ns", 0, lambda old, value: lambda: 0),  # cannot be pickled
        lambda t: t.put_and_get_old(1, "ns", lambda: 0),
        lambda t: t.put(1, "ns", lambda: 0),
    ],
    ids=["transform-raises", "transform-none", "transform-unpicklable", "put-and-get-old", "put"],
)
def test_a_failed_call_keeps_no_column_family_alive(call: Any) -> None:
    """An exception keeps its traceback's frames, and a column family kept alive
    keeps the whole database open after its backend closed it (and makes
    the garbage collector wait for RocksDB's background work when it finally
    goes)."""
    table = rocksdb_table(None, MAXP, meta=None, key_serializer=None)
    try:
        table.put(1, "ns", [1])
        with pytest.raises(Exception) as info:
            call(table)
        assert frames_holding_a_column_family(info.value) == []
        assert table.get(1, "ns") == [1]
    finally:
        close_rocksdb_table(table)


def test_a_closed_table_refuses_work() -> None:
    table = rocksdb_table(None, MAXP, meta=None, key_serializer=None)
    close_rocksdb_table(table)
    assert not table.is_attached
    with pytest.raises(CowStateError, match="whose database was closed"):
        table.get(1, "ns")


# --------------------------- the table's API: tables sharing one column family

#: Two tables sharing one db family, each with half the key groups.
LOW = KeyGroupRange(0, 7)


HIGH = KeyGroupRange(8, MAXP - 1)


Table = RocksDBStateTable[Any, Any, Any]


def keys_in(key_group_range: KeyGroupRange, count: int) -> list[int]:
    """The first ``count`` int keys whose key groups are in ``key_group_range``."""
    return [k for k in range(1000) if assign_to_key_group(k, MAXP) in key_group_range][:count]


def wal_bytes(db_path: Path) -> int:
    """Bytes in the write-ahead log files (``*.log``) of the database at ``db_path``."""
    return sum(p.stat().st_size for p in db_path.iterdir() if p.suffix == ".log")


@pytest.fixture
def tables(db: Rdict) -> Iterator[tuple[Table, Table]]:
    """Tables of :data:`LOW` and :data:`HIGH` over the same db family, each
    holding 5 keys of its own key groups (``state [k]`` in namespace ``"ns"``)."""
    low: Table = RocksDBStateTable(db, LOW, MAXP)
    high: Table = RocksDBStateTable(db, HIGH, MAXP)
    for table, key_group_range in ((low, LOW), (high, HIGH)):
        for key in keys_in(key_group_range, 5):
            table.put(key, "ns", [key])
    try:
        yield low, high
    finally:
        low.detach()
        high.detach()


@pytest.fixture
def full(db: Rdict) -> Iterator[Table]:
    """A table of every key group over the db family."""
    table: Table = RocksDBStateTable(db, FULL, MAXP)
    try:
        yield table
    finally:
        table.detach()


# ------------------------------------- key groups: a table reads its own alone


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_table_counts_only_the_mappings_of_its_own_key_groups(
    tables: tuple[Table, Table],
) -> None:
    # table.__len__ 5 (no upper bound: counted the other table's mappings
    # stored after its key groups in the same db family).
    low, high = tables
    assert len(low) == 5
    assert len(high) == 5
    assert sum(1 for _ in low) == 5


@pytest.mark.kills(module="cowstate.rocksdb.table")
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


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_table_reads_nothing_of_the_key_group_right_after_its_own(
    db: Rdict,
) -> None:
    # table.__init__ 16 (the upper bound one key group too far: the low
    # table read the first key group of the high one).
    low: Table = RocksDBStateTable(db, LOW, MAXP)
    high: Table = RocksDBStateTable(db, HIGH, MAXP)
    try:
        [next_key] = [k for k in range(1000) if assign_to_key_group(k, MAXP) == 8][:1]
        [own_key] = keys_in(LOW, 1)
        high.put(next_key, "ns", "high")
        low.put(own_key, "ns", "low")
        assert len(low) == 1
        assert [e.key for e in low] == [own_key]
        assert list(low.keys("ns")) == [own_key]
    finally:
        low.detach()
        high.detach()


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_entries_in_key_group_give_that_key_group_alone(full: Table) -> None:
    # table.entries_in_key_group 3 (no upper bound: every later key group too)
    # and 9 (`key_group + 2`: the next key group too).
    keys = keys_in(FULL, 200)
    for key in keys:
        full.put(key, "ns", f"s{key}")
    for key_group in range(MAXP):
        own = {k for k in keys if assign_to_key_group(k, MAXP) == key_group}
        assert own  # every key group holds keys
        got = {(e.key, e.namespace, e.state) for e in full.entries_in_key_group(key_group)}
        assert got == {(k, "ns", f"s{k}") for k in own}


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_long_key_serializer_places_keys_in_their_long_key_groups(db: Rdict) -> None:
    # table._rocks_key 18, 21 (the key group computed without the table's key
    # serializer: an int key hashed as a Java Integer, not a Long).
    table: Table = RocksDBStateTable(db, FULL, MAXP, key_serializer=LongSerializer())
    try:
        keys = [k for k in range(-200, 0) if java_hash(k, LongSerializer()) != java_hash(k)]
        moved = [
            k
            for k in keys
            if assign_to_key_group(k, MAXP, LongSerializer()) != assign_to_key_group(k, MAXP)
        ]
        assert moved  # keys whose Long and Integer key groups differ
        for key in moved:
            table.put(key, "ns", [key])
        for key in moved:
            group = assign_to_key_group(key, MAXP, LongSerializer())
            assert (key, "ns", [key]) in [
                (e.key, e.namespace, e.state) for e in table.entries_in_key_group(group)
            ]
            assert table.get(key, "ns", key_group=group) == [key]
    finally:
        table.detach()


# ---------------------------- writes: in the key group given, never to the WAL


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_mapping_put_in_a_given_key_group_is_found_and_removed_there(full: Table) -> None:
    # table.contains_key 4, put_and_get_old 4, remove 7, remove_and_get_old 4
    # (`key_group=None`: the key's own key group instead of the one given).
    key = 7
    own = assign_to_key_group(key, MAXP)
    given = (own + 3) % MAXP
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


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_transform_in_a_given_key_group_reads_and_writes_there(full: Table) -> None:
    # table.transform 4 (`key_group=None`: the key's own key group instead of
    # the one given).
    key = 7
    given = (assign_to_key_group(key, MAXP) + 3) % MAXP
    full.put(key, "ns", "there", key_group=given)
    full.transform(key, "ns", "!", lambda old, value: f"{old}{value}", key_group=given)
    assert full.get(key, "ns", key_group=given) == "there!"
    assert full.get(key, "ns") is None


@pytest.mark.kills(module="cowstate.rocksdb.table")
@pytest.mark.parametrize(
    "call", ["put_and_get_old", "remove", "remove_and_get_old", "transform", "absent"]
)
def test_state_writes_skip_the_write_ahead_log(full: Table, tmp_path: Path, call: str) -> None:
    # table.put_and_get_old 24, 27, remove 2, 4, remove_and_get_old 12, 14,
    # transform 29, 32
    # (the writes' options dropped: the database's default options write the
    # WAL, which the module doc says state writes skip).
    full.put(1, "ns", "one")
    assert wal_bytes(tmp_path / "db") == 0
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
    assert wal_bytes(tmp_path / "db") == 0


# ---------------------------------------- what the table refuses, and its repr


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_failing_transform_names_its_key_and_namespace(full: Table) -> None:
    # table.transform 20, 21 (the key or the namespace the error names dropped).
    full.put(3, "ns", "kept")

    def fails(old: Any, value: Any) -> Any:
        raise ValueError("no")

    with pytest.raises(TransformFunctionError) as excinfo:
        full.transform(3, "ns", 1, fails)
    assert "(3, 'ns')" in str(excinfo.value)
    assert full.get(3, "ns") == "kept"


@pytest.mark.kills(module="cowstate.rocksdb.table")
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


@pytest.mark.kills(module="cowstate.rocksdb.table")
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


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_table_repr_names_its_state_key_groups_and_whether_attached(db: Rdict) -> None:
    # table.__repr__ 1-9 (no killer test took the repr of a RocksDB table).
    table: Table = RocksDBStateTable(db, LOW, MAXP, meta=StateMetaInfo("counts"))
    assert repr(table) == "<RocksDBStateTable 'counts' KeyGroupRange(0, 7) of 16, attached>"
    table.detach()
    assert repr(table) == "<RocksDBStateTable 'counts' KeyGroupRange(0, 7) of 16, detached>"


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_detached_table_and_a_none_key_are_refused_saying_what_to_do(db: Rdict) -> None:
    # table._column 6, 7 (the advice the closed table's message ends with),
    # table._rocks_key 3 (the message of a None key).
    table: Table = RocksDBStateTable(db, FULL, MAXP, meta=StateMetaInfo("counts"))
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


# -------------------------------------------------------------- the key layout


# table.decode_rocks_key 2, 3 (a key of exactly the frame taken as too short,
# the message dropped), 6, 8, 9 (a key length past the end taken, the
# message dropped or counting wrong).
@pytest.mark.kills(module="cowstate.rocksdb.table")
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


@pytest.mark.kills(module="cowstate.rocksdb.table")
def test_a_torn_rocks_key_is_shown_by_its_first_40_bytes() -> None:
    # table.decode_rocks_key 10 (the message showing 41 bytes of a long key).
    torn = _PREFIX_AND_LENGTH.pack(3, 100) + bytes(range(60))
    with pytest.raises(CorruptStorageError) as excinfo:
        decode_rocks_key(torn)
    shown = str(excinfo.value).rsplit(": ", 1)[1]
    assert bytes.fromhex(shown) == torn[:40]
