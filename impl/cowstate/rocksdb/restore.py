"""Building a RocksDB backend's database from a snapshot, beside the live one.

:class:`Restorer` builds a new :class:`~cowstate.rocksdb.db.Database` in the
instance directory for the key groups of one backend:

- :meth:`Restorer.from_canonical`: the raw entries of canonical snapshot files
  (size and CRC32 checked, each file holding what its handle says), every
  entry decoded and checked (:mod:`cowstate.snapshot.checks`: E1-E3, E5, E6, and E4
  on the raw RocksDB keys of each key group) before it is written with
  ``WriteBatch`` into new column families: undecodable or ``None`` entries
  are refused here, never found at first read;
- :meth:`Restorer.from_native`: RocksDB files downloaded under their local
  names; one handle of the same range is the new database as it is (no entry
  is read), else the handle sharing most key groups is clipped to the range
  (``delete_range``) and the others' keys of the range are copied in, each
  copied entry decoded and checked (E1-E3, E5, E6; RocksDB keys are unique, so E4
  holds) on the way. Before any of it, every handle's database must hold what
  its handle says (:func:`check_native`), so a handle resealed with other
  states or another range is refused instead of restored short:

  N1. its column families are exactly those of the handle's states (a
      column family the handle does not name would be dropped unseen);
  N2. every key of every column family lies in the handle's key groups (the
      first and the last key of each: RocksDB keys sort by key group);
  N3. the database uses exactly the SST files the handle lists (a MANIFEST
      cut short opens as an older, smaller database without an error).

Reads check the iterator's status (:func:`~cowstate.rocksdb.table.scan`):
RocksDB files that fail to open or to read back whole are a
:class:`~cowstate.errors.CorruptCheckpointError`, never fewer entries.

Any failure deletes what was built; the backend swaps the result in only
when everything succeeded.
"""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rocksdict import Rdict, ReadOptions

from cowstate.checkpoint.handles import KeyedStateHandle
from cowstate.checkpoint.location import SnapshotSource
from cowstate.checkpoint.paths import check_file_name
from cowstate.errors import (
    CorruptCheckpointError,
    CorruptStorageError,
    CowStateError,
    KeyGroupMismatchError,
)
from cowstate.key_groups import KeyGroupRange
from cowstate.key_types import KeyTypes
from cowstate.rocksdb.db import (
    Batch,
    Database,
    InstanceDirectory,
    column_family_name,
    open_read_only,
    raw_options,
)
from cowstate.rocksdb.table import (
    check_status,
    decode_rocks_key,
    encode_rocks_key,
    key_group_prefix,
    scan,
    write_options,
)
from cowstate.serializers import StateSerializer
from cowstate.snapshot import (
    SnapshotMetadata,
    SnapshotReader,
)
from cowstate.snapshot.checks import (
    EntryDecoder,
    check_key_groups,
    check_key_types,
    decode_rows,
    duplicate_error,
    state_type_of,
    undecodable_error,
)
from cowstate.snapshot.compat import check_canonical_file_format
from cowstate.state_meta import StateMetaInfo

__all__ = ["Restorer", "check_native", "download"]

#: ``check_file(handle, path, metadata, metas)``: refuse a snapshot file (at
#: ``path``, of ``handle``) the backend cannot restore; add the meta info of
#: its states to ``metas``.
FileCheck = Callable[[KeyedStateHandle, str, SnapshotMetadata, dict[str, StateMetaInfo]], None]


class Restorer:
    """Builds databases for ``key_group_range`` of ``max_parallelism`` in
    ``instance``; ``key_serializer`` decodes keys for the checks."""

    def __init__(
        self,
        instance: InstanceDirectory,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        key_serializer: StateSerializer,
        key_types: KeyTypes | None = None,
    ) -> None:
        self.instance = instance
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.key_serializer = key_serializer
        #: The key type the restored keys must have or fix (E6), staged.
        self.key_types = KeyTypes() if key_types is None else key_types

    def from_canonical(
        self,
        handles: Sequence[KeyedStateHandle],
        source: SnapshotSource,
        metas: dict[str, StateMetaInfo],
        check_file: FileCheck,
    ) -> Database:
        """A new database with the raw entries of this backend's key groups, each
        checked (``check_file`` refuses a file the backend cannot restore)."""
        built = self.instance.open_fresh()
        try:
            handles_of: dict[str, Any] = {}
            write_opts = write_options()
            seen: set[int] = set()
            for handle in handles:
                for file in handle.files:
                    path = source.path(file)
                    reader = SnapshotReader(source.read(file))
                    meta = reader.metadata
                    check_canonical_file_format(meta.format, path)  # C6
                    check_file(handle, path, meta, metas)
                    names = {}
                    decoders = self._decoders(
                        {state.id: state.name for state in meta.states}, metas
                    )
                    for state in meta.states:
                        names[state.id] = column_family_name(state.name)
                        self.instance.ensure_column_family(built, names[state.id])
                    read = self.key_group_range.intersection(meta.range)
                    overlap = seen.intersection(read)
                    if overlap:
                        raise KeyGroupMismatchError(
                            f"expected every key group in one snapshot file only, got key "
                            f"groups {sorted(overlap)[:5]} in two files"
                        )
                    seen.update(read)
                    batch = Batch(built.db, write_opts)
                    for key_group in read:
                        for state_id, rows in reader.read_key_group(key_group).items():
                            cf_name = names[state_id]
                            cf = handles_of.get(cf_name)
                            if cf is None:
                                cf = handles_of[cf_name] = built.db.get_column_family_handle(
                                    cf_name
                                )
                            rocks_keys = self._checked(decoders[state_id], key_group, rows)
                            for rocks_key, (_, _, value) in zip(rocks_keys, rows, strict=True):
                                batch.put(rocks_key, value, cf)
                    batch.flush()
            for name in metas:
                self.instance.ensure_column_family(built, column_family_name(name))
            handles_of.clear()
            return built
        except BaseException:
            built.discard()
            raise

    def from_native(
        self,
        handles: Sequence[KeyedStateHandle],
        source: SnapshotSource,
        metas: dict[str, StateMetaInfo],
        same_range: bool,
    ) -> Database:
        """A new database from RocksDB files (one handle as is, or several clipped
        to this backend's key groups)."""
        if not handles:
            fresh = self.instance.open_fresh()
            try:
                for name in metas:
                    self.instance.ensure_column_family(fresh, column_family_name(name))
            except BaseException:
                fresh.discard()
                raise
            return fresh
        scratch = self.instance.root / f"restore-{uuid.uuid4().hex[:12]}"
        built: Database | None = None
        try:
            directories = []
            for index, handle in enumerate(handles):
                directory = scratch / str(index)
                directory.mkdir(parents=True)
                download(handle, source, directory)
                directories.append(directory)
            r = self.key_group_range
            first = (
                0
                if same_range
                else max(
                    range(len(handles)),
                    key=lambda i: len(
                        r.intersection(KeyGroupRange.of(*handles[i].key_group_range))
                    ),
                )
            )
            for handle, directory in zip(handles, directories, strict=True):
                check_native(directory, handle)
            path = self.instance.root / f"db-{uuid.uuid4().hex[:12]}"
            os.rename(directories[first], path)
            built = self.instance.open_existing(path)
            wanted = {column_family_name(name) for name in metas}
            # N1 held: the database holds exactly its handle's states, all of them
            # wanted; the states of the other handles get empty column families.
            for name in wanted - built.column_families:
                self.instance.ensure_column_family(built, name)
            if not same_range:
                self._clip(built)
                decoders = self._decoders({column_family_name(name): name for name in metas}, metas)
                for index, directory in enumerate(directories):
                    if index != first:
                        try:
                            self._copy_range(directory, built, wanted, decoders)
                        except CowStateError as exc:
                            if not isinstance(exc, CorruptStorageError):
                                raise
                            raise CorruptCheckpointError(
                                f"expected the RocksDB files of key groups "
                                f"{list(handles[index].key_group_range)} to read back whole, "
                                f"got: {exc}"
                            ) from exc
                        except Exception as exc:  # rocksdict's own errors (files, open)
                            raise CorruptCheckpointError(
                                f"expected the RocksDB files of key groups "
                                f"{list(handles[index].key_group_range)} to open and read, "
                                f"got {type(exc).__name__}: {exc}"
                            ) from exc
                        shutil.rmtree(directory, ignore_errors=True)
            self._check_first_keys(built)
            return built
        except BaseException:
            if built is not None:
                built.discard()
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _check_first_keys(self, built: Database) -> None:
        """E6 for the entries kept as the native files hold them (not decoded): the
        first key of each column family, in this backend's key groups."""
        lower = key_group_prefix(self.key_group_range.start_key_group)
        upper = key_group_prefix(self.key_group_range.end_key_group + 1)
        for name in sorted(built.column_families):
            entries = scan(built.db.get_column_family(name), lower, upper, chunk=1)
            try:
                first = next(entries, None)
            finally:
                entries.close()  # releases the column family
            if first is None:
                continue
            key_group, key_bytes, _ = decode_rocks_key(first[0])
            try:
                key = self.key_serializer.deserialize(key_bytes)
            except Exception as exc:
                raise undecodable_error(name, key_group, exc) from exc
            check_key_types(name, key_group, [key], self.key_types)

    def _clip(self, built: Database) -> None:
        """Drop every key outside this backend's key groups, in every column family."""
        r = self.key_group_range
        lower = key_group_prefix(r.start_key_group)
        upper = key_group_prefix(r.end_key_group + 1)
        write_opts = write_options()
        for name in sorted(built.column_families):
            cf = built.db.get_column_family(name)
            try:
                if r.start_key_group > 0:
                    cf.delete_range(key_group_prefix(0), lower, write_opts)
                cf.delete_range(upper, b"\xff\xff", write_opts)
            finally:
                del cf

    def _copy_range(
        self,
        directory: Path,
        built: Database,
        wanted: set[str],
        decoders: dict[str, EntryDecoder],
    ) -> None:
        """Copy this backend's key groups of the database in ``directory`` into
        ``built``, every entry checked (decoded with ``decoders``, by column family)."""
        r = self.key_group_range
        lower = key_group_prefix(r.start_key_group)
        upper = key_group_prefix(r.end_key_group + 1)
        other = open_read_only(directory)
        try:
            present = set(Rdict.list_cf(str(directory), raw_options())) - {"default"}
            batch = Batch(built.db, write_options())
            for name in sorted(present & wanted):
                self.instance.ensure_column_family(built, name)
                target = built.db.get_column_family_handle(name)
                entries = scan(other.get_column_family(name), lower, upper)
                try:
                    for key_group, rows in _by_key_group(entries):
                        self._check_stored(decoders[name], key_group, rows)
                        for key, value in rows:
                            batch.put(key, value, target)
                    batch.flush()
                finally:
                    entries.close()  # releases the column family
                    del target
        finally:
            other.close()

    def _decoders(
        self, names: dict[Any, str], metas: dict[str, StateMetaInfo]
    ) -> dict[Any, EntryDecoder]:
        """An entry decoder per key of ``names`` (state id or column family) for
        the state it names, with the serializers of ``metas``."""
        key_decode = self.key_serializer.deserialize
        caches: dict[int, dict[bytes, Any]] = {}
        out: dict[Any, EntryDecoder] = {}
        for key, name in names.items():
            meta = metas[name]
            out[key] = EntryDecoder(
                name,
                key_decode,
                meta.namespace_serializer.deserialize,
                meta.state_serializer.deserialize,
                caches.setdefault(id(meta.namespace_serializer), {}),
                state_type_of(meta.kind),
            )
        return out

    def _checked(
        self, decoder: EntryDecoder, key_group: int, rows: Sequence[tuple[bytes, bytes, bytes]]
    ) -> list[bytes]:
        """The RocksDB keys of one key group's raw ``(namespace, key, state)`` rows
        of a canonical file, after checks E1-E6."""
        decoded = decode_rows(decoder, key_group, rows)
        check_key_groups(
            decoder.name, key_group, decoded.keys, self.max_parallelism, self.key_serializer
        )
        check_key_types(decoder.name, key_group, decoded.keys, self.key_types)
        rocks_keys = [encode_rocks_key(key_group, key, namespace) for namespace, key, _ in rows]
        if len(set(rocks_keys)) != len(rocks_keys):
            seen: set[bytes] = set()
            pairs = zip(decoded.keys, decoded.namespaces, strict=True)
            for rocks_key, (key, namespace) in zip(rocks_keys, pairs, strict=True):
                if rocks_key in seen:
                    raise duplicate_error(decoder.name, key_group, key, namespace)
                seen.add(rocks_key)
        return rocks_keys

    def _check_stored(
        self, decoder: EntryDecoder, key_group: int, rows: Sequence[tuple[bytes, bytes]]
    ) -> None:
        """Checks E1-E3, E5 and E6 of one key group's ``(RocksDB key, value)`` rows read from
        a snapshot's database (a RocksDB key is unique: E4 holds)."""
        raw = []
        for rocks_key, value in rows:
            _, key, namespace = decode_rocks_key(rocks_key)
            raw.append((namespace, key, value))
        decoded = decode_rows(decoder, key_group, raw)
        check_key_groups(
            decoder.name, key_group, decoded.keys, self.max_parallelism, self.key_serializer
        )
        check_key_types(decoder.name, key_group, decoded.keys, self.key_types)


def check_native(directory: Path, handle: KeyedStateHandle) -> None:
    """N1-N3 (module doc) for the RocksDB files of ``handle`` in ``directory``,
    opened read-only; whatever RocksDB raises on them (a missing or corrupt
    file) is a :class:`~cowstate.errors.CorruptCheckpointError`."""
    where = f"the RocksDB files of key groups {list(handle.key_group_range)}"
    try:
        names = set(Rdict.list_cf(str(directory), raw_options())) - {"default"}
        db = open_read_only(directory)
    except Exception as exc:  # rocksdict's own errors
        raise CorruptCheckpointError(
            f"expected {where} to open, got {type(exc).__name__}: {exc}"
        ) from exc
    try:
        _check_native(db, handle, names, where)
    except CowStateError:
        raise
    except Exception as exc:  # rocksdict's own errors (a corrupt block)
        raise CorruptCheckpointError(
            f"expected {where} to read, got {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        db.close()


def _check_native(db: Rdict, handle: KeyedStateHandle, present: set[str], where: str) -> None:
    named = {column_family_name(state.name) for state in handle.states}
    if present != named:  # N1
        raise CorruptCheckpointError(
            f"expected {where} to hold the column families of its handle's states "
            f"{sorted(named)}, they hold {sorted(present)}"
        )
    live = {os.path.basename(f["name"]) for f in db.live_files()}
    listed = {
        f.local_name or os.path.basename(f.path) for f in handle.files if f.path.endswith(".sst")
    }
    if live != listed:  # N3
        raise CorruptCheckpointError(
            f"expected {where} to use exactly the {len(listed)} SST files its handle lists, "
            f"it uses {sorted(live)[:5]}, the handle lists {sorted(listed)[:5]}"
        )
    r = KeyGroupRange.of(*handle.key_group_range)
    for name in sorted(present):  # N2
        iterator = db.get_column_family(name).iter(ReadOptions())
        try:
            iterator.seek_to_first()
            if not iterator.valid():
                check_status(iterator, b"", None)
                continue
            first = iterator.key()
            iterator.seek_to_last()
            last = iterator.key() if iterator.valid() else first
            check_status(iterator, last, None)
        finally:
            del iterator
        groups = int.from_bytes(first[:2], "big"), int.from_bytes(last[:2], "big")
        if groups[0] not in r or groups[1] not in r:
            raise KeyGroupMismatchError(
                f"expected every key of {where} in those key groups, column family "
                f"{name!r} holds keys of key groups {groups[0]} to {groups[1]}"
            )


def _by_key_group(
    entries: Iterable[tuple[bytes, bytes]],
) -> Iterable[tuple[int, list[tuple[bytes, bytes]]]]:
    """``(key group, its rows)`` of ``(RocksDB key, value)`` rows in key order."""
    for prefix, rows in itertools.groupby(entries, key=lambda row: row[0][:2]):
        yield int.from_bytes(prefix, "big"), list(rows)


def download(handle: KeyedStateHandle, source: SnapshotSource, directory: Path) -> None:
    """Every file of ``handle`` into ``directory`` under its local name (checked)."""
    for file in handle.files:
        name = check_file_name(
            file.local_name, f"the local name of {file.scope} file {file.path!r}"
        )
        source.download(file, directory / name)  # P5 (also checked in _metadata, M6)
