"""The RocksDB table on its own: what its structural checker catches, and that a
failed call keeps no column family alive.

``check_rocksdb_table`` runs after every step of the table machine; each test
here builds a healthy table, checks that the checker accepts it, writes one
bad raw entry into its column family, and requires the violation it names.
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
from cowstate.errors import CowStateError
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.rocksdb.table import RocksDBStateTable, encode_rocks_key, write_options
from cowstate.serializers import DefaultSerializer
from cowstate_spec.implementations import close_rocksdb_table, rocksdb_table
from cowstate_spec.invariants import InvariantViolation, check_rocksdb_table

MAXP = 16
RANGE = KeyGroupRange(4, 11)


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
    return [k for k in range(1000) if assign_to_key_group(k, MAXP) in RANGE][:count]


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
