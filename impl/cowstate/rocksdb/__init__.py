"""The RocksDB keyed state backend (needs the ``rocksdb`` extra: ``rocksdict``).

Modules:

- :mod:`cowstate.rocksdb.backend`: :class:`RocksDBKeyedStateBackend` -- the
  state API over column families, the incremental-base bookkeeping, the
  synchronous part of snapshots, restores (the design is its docstring);
- :mod:`cowstate.rocksdb.snapshot`: the asynchronous part -- uploading a local
  checkpoint's files, writing a canonical savepoint;
- :mod:`cowstate.rocksdb.restore`: building a database from canonical files or
  RocksDB files, clipped to a key-group range;
- :mod:`cowstate.rocksdb.db`: the instance directory, opening databases,
  batches, column family names;
- :mod:`cowstate.rocksdb.table`: :class:`RocksDBStateTable`, one state in one
  column family, and the key layout.
"""

from cowstate.rocksdb.backend import (
    NATIVE_FORMAT,
    RocksDBKeyedStateBackend,
    RocksDBSnapshotFuture,
    column_family_name,
)
from cowstate.rocksdb.table import RocksDBStateTable

__all__ = [
    "NATIVE_FORMAT",
    "RocksDBKeyedStateBackend",
    "RocksDBSnapshotFuture",
    "RocksDBStateTable",
    "column_family_name",
]
