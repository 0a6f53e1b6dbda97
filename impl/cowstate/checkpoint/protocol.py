"""What the checkpoint coordinator needs from a keyed state backend: the one
checkpoint surface every backend offers (declared by
:class:`~cowstate.keyed_backend.AbstractKeyedStateBackend`, checked here as
the :class:`CheckpointingBackend` protocol).

A backend takes a snapshot into a :class:`~cowstate.checkpoint.location.SnapshotLocation`
(``snapshot_to(checkpoint_id, location, options)``): the synchronous part at
once, the rest on its own writer thread, which makes the
:class:`~cowstate.checkpoint.handles.KeyedStateHandle` the returned future
gives (a :class:`~cowstate.keyed_backend.SnapshotFuture`: ``cancel()``
stops the writer at its next step). It hears which checkpoints completed or
were aborted (an incremental backend reuses files of the last *confirmed*
checkpoint only), and restores from the handles of a completed snapshot,
reading through a :class:`~cowstate.checkpoint.location.SnapshotSource`.

Besides, for callers without a checkpoint directory: the heap backend writes
the same snapshot file into a stream of the caller's
(``snapshot(checkpoint_id, stream_factory)``), and each backend's
``restore`` is ``prepare_restore`` and ``commit`` in one call (the heap's
from files the caller holds, RocksDB's from handles and a source).

Restores are two-phase, so that a job of several subtasks restores all of
them or none (the coordinator's ``_restore_backends``):

1. ``prepare_restore(handles, source)`` reads and verifies everything -- the
   files' sizes and CRC32s, formats, max parallelism, serializer ids and
   kinds (C1-C7 of :mod:`cowstate.snapshot.compat`), key-group ranges (each
   key group in one handle only, each file holding its handle's range and
   states) and the contents (E1-E6 of :mod:`cowstate.snapshot.checks`) --
   and decodes or stages it beside the
   live state, without changing the backend. Any problem raises a
   :mod:`cowstate.errors` exception and leaves nothing behind. No handles at
   all is refused (:class:`~cowstate.errors.InvalidArgumentError`); key
   groups no handle holds restore empty. (The coordinator never asks a
   backend holding no key group to snapshot or restore: its rule 10.)
2. :meth:`PreparedRestore.commit` swaps the staged state in. It does only
   cheap in-memory steps on data already checked (heap: install the tables
   built in step 1; RocksDB: switch to the database built in step 1), so it
   does not fail on prepared data. :meth:`PreparedRestore.discard` drops the
   staging instead (RocksDB: closes and deletes the staged database).

A prepared restore is used once (``commit`` or ``discard``; ``discard``
after either is a no-op) by the owner's thread, and nothing may use the
backend between ``prepare_restore`` and ``commit``. ``restore_from`` is
``prepare_restore`` then ``commit``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol, runtime_checkable

from cowstate.checkpoint.handles import KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.key_groups import KeyGroupRange

__all__ = ["CheckpointingBackend", "PreparedRestore", "overlapping"]


@runtime_checkable
class PreparedRestore(Protocol):
    """A restore read, verified and staged by ``prepare_restore``, not yet applied."""

    def commit(self) -> None:
        """Swap the staged state in (cheap, in memory; see the module doc)."""
        ...

    def discard(self) -> None:
        """Drop the staged state; the backend stays as it was (no-op once used)."""
        ...


@runtime_checkable
class CheckpointingBackend(Protocol):
    """A keyed state backend the coordinator can checkpoint and restore."""

    @property
    def key_group_range(self) -> KeyGroupRange: ...

    @property
    def max_parallelism(self) -> int: ...

    def snapshot_to(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        """Take a snapshot into ``location``; the future gives its handle."""
        ...

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is confirmed (unknown ids are ignored)."""
        ...

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete."""
        ...

    def prepare_restore(
        self,
        handles: Sequence[KeyedStateHandle],
        source: SnapshotSource,
        *,
        incremental_base: bool = False,
    ) -> PreparedRestore:
        """Read, verify and stage a restore from ``handles`` of one snapshot,
        changing nothing (see the module doc); ``commit()`` applies it.

        With ``incremental_base`` the backend may build later checkpoints on
        the restored files (restore modes CLAIM and LEGACY, no rescaling).
        """
        ...

    def restore_from(
        self,
        handles: Sequence[KeyedStateHandle],
        source: SnapshotSource,
        *,
        incremental_base: bool = False,
    ) -> None:
        """Rebuild the backend's key groups from ``handles`` of one snapshot:
        ``prepare_restore(...).commit()``."""
        ...

    def close(self) -> None: ...


def overlapping(
    handles: Sequence[KeyedStateHandle], key_group_range: KeyGroupRange
) -> list[KeyedStateHandle]:
    """The handles whose key groups meet ``key_group_range`` (what a subtask reads)."""
    return [
        h
        for h in handles
        if len(key_group_range.intersection(KeyGroupRange.of(*h.key_group_range)))
    ]
