"""The table machine must catch broken RocksDB tables.

The RocksDB table runs the table machine with capabilities that turn rules
off or around (no snapshots, ``put`` returns ``None``, fresh copies), so a
run that passes could mean a machine with nothing left to check. Each bug
here rewrites one line of ``RocksDBStateTable`` (the mechanism of
``cowstate_spec.bad_implementations``): two the model comparison must see,
one only the key-layout checker can see. The control: each rewritten method,
rewritten with its line replaced by itself, passes the same hunt.
(``bad_implementations`` imports no RocksDB, so these live here.)
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from cowstate.rocksdb.table import RocksDBStateTable
from cowstate_spec.bad_implementations import Bug, broken_class
from cowstate_spec.implementations import (
    ROCKSDB,
    SUB_RANGE,
    Implementation,
    TableType,
    close_rocksdb_table,
    rocksdb_table,
    table_implementation,
)
from cowstate_spec.invariants import check_rocksdb_table
from cowstate_spec.machine import machine_for
from cowstate_spec.profiles import hunt_settings

HUNT = hunt_settings(max_examples=300, stateful_step_count=40)

ROCKSDB_BUGS = [
    Bug(
        "rocksdb-remove-and-get-old-keeps-the-mapping",
        "remove_and_get_old",
        "self._column().delete(rocks_key, self._write_options)",
        "self._column().get(rocks_key)",
        "remove_and_get_old returns the state and unmaps it",
        RocksDBStateTable,
    ),
    Bug(
        "rocksdb-keys-ignore-the-namespace",
        "keys",
        "for key, ns in self._raw_keys() if ns == wanted)",
        "for key, ns in self._raw_keys())",
        "keys(namespace) lists the keys of that namespace only",
        RocksDBStateTable,
    ),
    Bug(
        "rocksdb-pickles-keys-with-protocol-2",
        "_rocks_key",
        "self._key_serializer.serialize(key),",
        "__import__('pickle').dumps(key, protocol=2),",
        "a key's RocksDB bytes are its serializer's: reading it back finds the same "
        "mapping, but one key could live under two RocksDB keys (only the checker sees it)",
        RocksDBStateTable,
    ),
]


def rocksdb_implementation(bug: Bug) -> Implementation:
    """The RocksDB table with ``bug``, over the machine's sub-range."""
    make = functools.partial(rocksdb_table, table_class=broken_class(bug))
    table_type: TableType[RocksDBStateTable[object, object, object]] = TableType(
        f"bad-{bug.name}",
        make,
        check_rocksdb_table,
        capabilities=ROCKSDB,
        close=close_rocksdb_table,
    )
    return table_implementation(table_type, SUB_RANGE, table_type.name)


@pytest.mark.parametrize("bug", ROCKSDB_BUGS, ids=lambda bug: bug.name)
def test_table_machine_catches(bug: Bug) -> None:
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine_for(rocksdb_implementation(bug)), settings=HUNT)


CONTROLS = list(
    {
        bug.method: Bug(f"identity-{bug.method}", bug.method, bug.old, bug.old, "control", bug.cls)
        for bug in ROCKSDB_BUGS
    }.values()
)


@pytest.mark.parametrize("control", CONTROLS, ids=lambda bug: bug.name)
def test_the_identity_rewrite_passes(control: Bug) -> None:
    run_state_machine_as_test(
        machine_for(rocksdb_implementation(control)), settings=settings(HUNT, max_examples=40)
    )
