"""What the checkpoint coordinator needs from a keyed state backend.

A backend takes a snapshot into a :class:`~cowstate.checkpoint.location.SnapshotLocation`
(``snapshot_to``): the synchronous part at once, the rest on its own writer
thread, the result a :class:`~cowstate.checkpoint.handles.KeyedStateHandle`.
It hears which checkpoints completed or were aborted (an incremental backend
reuses files of the last *confirmed* checkpoint only), and restores from the
handles of a completed snapshot, reading through a
:class:`~cowstate.checkpoint.location.SnapshotSource`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar, runtime_checkable

from cowstate.checkpoint.handles import KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.key_groups import KeyGroupRange

__all__ = ["CheckpointingBackend", "map_future", "overlapping"]

T = TypeVar("T")
R = TypeVar("R")


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

    def restore_from(
        self,
        handles: Sequence[KeyedStateHandle],
        source: SnapshotSource,
        *,
        incremental_base: bool = False,
    ) -> None:
        """Rebuild the backend's key groups from ``handles`` of one snapshot.

        With ``incremental_base`` the backend may build later checkpoints on
        the restored files (restore modes CLAIM and LEGACY, no rescaling).
        """
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


def map_future(inner: Future[T], fn: Callable[[T], R]) -> Future[R]:
    """A future of ``fn(inner.result())``; cancelling it cancels ``inner``."""
    outer: _Mapped[R] = _Mapped(inner)

    def done(finished: Future[T]) -> None:
        if outer.cancelled():
            return
        if finished.cancelled():
            outer.cancel()
            return
        error = finished.exception()
        if error is not None:
            outer.set_exception(error)
            return
        try:
            outer.set_result(fn(finished.result()))
        except Exception as exc:
            outer.set_exception(exc)

    inner.add_done_callback(done)
    return outer


class _Mapped(Future[R]):
    def __init__(self, inner: Future[Any]) -> None:
        super().__init__()
        self._inner = inner

    def cancel(self) -> bool:
        cancelled = self._inner.cancel()
        if self._inner.cancelled():
            super().cancel()
        return cancelled
