"""Defects planted on purpose, to prove the fuzzers can fail.

Each is a context manager that breaks one guarantee while it is active:

- ``reader-drops-bad-blocks``: a key-group block that fails its checks
  (CRC, lengths, ...) is read as empty instead of refused -- corrupt files
  restore with entries missing (the file fuzzer must say ``wrong``);
- ``paths-unconfined``: paths in ``_metadata`` are used as they are (no P1-P3)
  -- a resealed absolute or ``..`` path is opened (``outside``);
- ``restore-clears-first``: the heap backend empties its states before it
  restores -- a refused restore leaves a backend that held state empty
  (``partial``);
- ``no-key-group-check``: a restore skips E3 (every key in its own key
  group's block) -- a key moved into a block the backend reads is restored
  where its own key cannot find it (``wrong``: also what the file-claims
  oracle of crafted moves must say);
- ``deletes-unowned``: the job believes it owns everything under its
  directory -- recovery's cleanup deletes the savepoint inside it
  (``outside``);
- ``chain-checkpoints-unchecked``: a heap chain's files are not checked for
  the checkpoints they were written for (I3 of
  :mod:`cowstate.heap_incremental`) -- a handle resealed to list an older
  checkpoint's chain restores that checkpoint's state (``wrong``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from cowstate import heap_backend, heap_incremental
from cowstate.checkpoint import location, verify
from cowstate.checkpoint.storage import CheckpointStorage
from cowstate.errors import SnapshotFormatError
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.snapshot import SnapshotReader
from cowstate.snapshot import restore as snapshot_restore

__all__ = ["PLANTED"]


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def _reader_drops_bad_blocks() -> Iterator[None]:
    original = SnapshotReader.read_key_group

    def lenient(self: SnapshotReader, key_group: int) -> Any:
        try:
            return original(self, key_group)
        except SnapshotFormatError:
            return {}

    with _patched(SnapshotReader, "read_key_group", lenient):
        yield


@contextlib.contextmanager
def _paths_unconfined() -> Iterator[None]:
    def anything(path: Any) -> Any:
        return path

    with contextlib.ExitStack() as stack:
        for module in (location, verify):
            stack.enter_context(_patched(module, "check_exclusive_path", anything))
            stack.enter_context(_patched(module, "check_shared_path", anything))
        stack.enter_context(_patched(location, "is_inside", lambda path, root: True))
        yield


@contextlib.contextmanager
def _restore_clears_first() -> Iterator[None]:
    original = HeapKeyedStateBackend.restore

    def clearing(self: HeapKeyedStateBackend, snapshot_streams: Any) -> None:
        for name in self.state_names:
            table = self.table(name)
            for key, namespace, _state in list(table):
                table.remove(key, namespace)
        original(self, snapshot_streams)

    with _patched(HeapKeyedStateBackend, "restore", clearing):
        yield


@contextlib.contextmanager
def _no_key_group_check() -> Iterator[None]:
    def unchecked(*args: Any) -> None:
        return None

    with _patched(snapshot_restore, "check_key_groups", unchecked):
        yield


@contextlib.contextmanager
def _chain_checkpoints_unchecked() -> Iterator[None]:
    def unchecked(*args: Any) -> None:
        return None

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(heap_incremental, "_check_written_for", unchecked))
        stack.enter_context(_patched(heap_backend, "check_chain_base", unchecked))
        yield


@contextlib.contextmanager
def _deletes_unowned() -> Iterator[None]:
    def owns(self: CheckpointStorage, path: str) -> bool:
        return path.startswith(self.job_dir + "/")

    with _patched(CheckpointStorage, "owns", owns):
        yield


#: Every planted defect, by name.
PLANTED: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "reader-drops-bad-blocks": _reader_drops_bad_blocks,
    "paths-unconfined": _paths_unconfined,
    "restore-clears-first": _restore_clears_first,
    "no-key-group-check": _no_key_group_check,
    "deletes-unowned": _deletes_unowned,
    "chain-checkpoints-unchecked": _chain_checkpoints_unchecked,
}
