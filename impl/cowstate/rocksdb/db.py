"""The RocksDB side of the backend: the instance directory and its databases,
opened in raw mode through ``rocksdict``.

:class:`InstanceDirectory` is ``<local_dir>/cowstate-rocksdb-<uuid>/``: live and
restored databases (``db-<uuid>``), local checkpoints (``checkpoints/``) and
restore scratch. :class:`Database` is one open database with its column
families; :class:`Batch` writes raw entries in bounded ``WriteBatch``es.
rocksdict keeps a database open while any column family, iterator or
checkpoint object of it lives: every helper drops them before returning.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocksdict import AccessType, Options, Rdict, WriteBatch

from cowstate.errors import (
    CorruptCheckpointError,
    InvalidArgumentError,
)

__all__ = [
    "Batch",
    "Database",
    "InstanceDirectory",
    "check_raw_mode",
    "column_family_name",
    "open_read_only",
    "raw_options",
    "remove_local_checkpoint",
    "remove_trees",
]

_SAFE_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
BATCH_ENTRIES = 10_000
CONFIG_FILE = "rocksdict-config.json"


def column_family_name(state_name: str) -> str:
    """The column family of state ``state_name`` (never ``default``)."""
    if _SAFE_NAME.fullmatch(state_name):
        return f"state.{state_name}"
    return f"state-hex.{state_name.encode('utf-8', 'surrogatepass').hex()}"


def raw_options() -> Options:
    """Options for opening a snapshot's database read-only (no user tuning needed)."""
    options = Options(raw_mode=True)
    options.create_if_missing(False)
    options.set_keep_log_file_num(1)
    return options


@dataclass
class Database:
    """A database a restore built beside the live one."""

    db: Rdict
    path: Path
    column_families: set[str]

    def discard(self) -> None:
        with contextlib.suppress(Exception):
            self.db.close()
        shutil.rmtree(self.path, ignore_errors=True)


class InstanceDirectory:
    """A backend's instance directory; ``options`` open every database in it."""

    def __init__(self, root: Path, options: Options) -> None:
        self.root = root
        self.options = options

    @property
    def checkpoints(self) -> Path:
        """Where the synchronous part puts local checkpoints."""
        return self.root / "checkpoints"

    def open_fresh(self) -> Database:
        path = self.root / f"db-{uuid.uuid4().hex[:12]}"
        db = Rdict(str(path), self.options)
        return Database(db, path, set())

    def open_existing(self, path: Path) -> Database:
        """Open restored files read-write (never creating an empty database:
        RocksDB would delete the SSTs it does not know)."""
        try:
            names = [n for n in Rdict.list_cf(str(path), raw_options()) if n != "default"]
            self.options.create_if_missing(False)
            try:
                db = Rdict(
                    str(path), self.options, column_families={n: self.options for n in names}
                )
            finally:
                self.options.create_if_missing(True)
        except Exception as exc:
            raise CorruptCheckpointError(
                f"expected the RocksDB files of a snapshot to open as a database, got "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return Database(db, path, set(names))

    def ensure_column_family(self, built: Database, name: str) -> None:
        if name not in built.column_families:
            cf = built.db.create_column_family(name, self.options)
            del cf
            built.column_families.add(name)

    def new_local_checkpoint_dir(self, checkpoint_id: int) -> Path:
        parent = self.checkpoints
        parent.mkdir(exist_ok=True)
        path = parent / f"chk-{checkpoint_id}"
        attempt = 1
        while path.exists() or Path(f"{path}.tmp").exists():
            attempt += 1
            path = parent / f"chk-{checkpoint_id}-{attempt}"
        return path


class Batch:
    """Raw puts written in ``WriteBatch``es of at most ``BATCH_ENTRIES``."""

    def __init__(self, db: Rdict, options: Any) -> None:
        self._db = db
        self._options = options
        self._batch = WriteBatch(raw_mode=True)
        self._count = 0

    def put(self, key: bytes, value: bytes, column_family: Any) -> None:
        self._batch.put(key, value, column_family)
        self._count += 1
        if self._count >= BATCH_ENTRIES:
            self.flush()

    def flush(self) -> None:
        if self._count:
            self._db.write(self._batch, self._options)
            self._batch = WriteBatch(raw_mode=True)
            self._count = 0


def open_read_only(path: Path) -> Rdict:
    """A snapshot's database, read-only, with every column family."""
    names = [n for n in Rdict.list_cf(str(path), raw_options()) if n != "default"]
    return Rdict(
        str(path),
        raw_options(),
        column_families={n: raw_options() for n in names},
        access_type=AccessType.read_only(),
    )


def remove_trees(*paths: Path | None) -> None:
    for path in paths:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


def remove_local_checkpoint(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(f"{path}.tmp", ignore_errors=True)


def check_raw_mode(built: Database) -> None:
    """rocksdict writes the mode it opened with into its config file."""
    try:
        config = json.loads((built.path / CONFIG_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        config = {"raw_mode": True}  # absent: rocksdict's default is raw
    if config.get("raw_mode") is not True:
        built.discard()
        raise InvalidArgumentError(
            "expected rocksdict.Options(raw_mode=True), got options without raw mode: the "
            "backend stores the serializers' bytes as they are"
        )
