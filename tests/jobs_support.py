"""Small jobs of the coordinator and recovery tests (``test_checkpoint_rules.py``,
``test_checkpoint_recovery.py``): the subtasks and coordinators one test makes
over real storage in its ``tmp_path``, each job one subtask owning every key
group, all closed at its end (``with Jobs(tmp_path) as jobs:``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from restore_support import heap, rocks

from cowstate.checkpoint.coordinator import CheckpointCoordinator
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import RestoreMode
from cowstate.checkpoint.storage import CheckpointStorage
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend

__all__ = ["Crash", "Hook", "Jobs", "Subtask"]

#: The hooks of :class:`FileSystem`: ``(operation, path, data)``.
Hook = Callable[[str, str, Any], None]
Subtask = HeapKeyedStateBackend | RocksDBKeyedStateBackend


class Crash(BaseException):
    """A crash injected by a file-system hook (no ``except Exception`` stops it)."""


class Jobs:
    """Makes the subtasks and coordinators of one test, and closes them all at
    its end. Coordinators live in ``tmp_path / root``, ``root`` by default;
    a restored job in ``restore_root`` unless told."""

    def __init__(self, tmp_path: Path, *, restore_root: str = "restored") -> None:
        self.tmp_path = tmp_path
        self.restore_root = restore_root
        self._backends: list[Subtask] = []
        self._coordinators: list[CheckpointCoordinator] = []

    def heap(self) -> HeapKeyedStateBackend:
        backend = heap()
        self._backends.append(backend)
        return backend

    def rocks(self) -> RocksDBKeyedStateBackend:
        backend = rocks(self.tmp_path / "local" / str(len(self._backends)))
        self._backends.append(backend)
        return backend

    def storage(
        self, root: str = "root", job_id: str = "job", hooks: Hook | None = None
    ) -> CheckpointStorage:
        return CheckpointStorage(str(self.tmp_path / root), job_id, FileSystem(hooks))

    def keep_backend(self, backend: Subtask) -> Subtask:
        """Close ``backend`` (made by the test) at the end too."""
        self._backends.append(backend)
        return backend

    def keep(self, coordinator: CheckpointCoordinator) -> CheckpointCoordinator:
        self._coordinators.append(coordinator)
        return coordinator

    def new(
        self,
        backend: Subtask | None = None,
        root: str = "root",
        job_id: str = "job",
        *,
        hooks: Hook | None = None,
        **options: Any,
    ) -> CheckpointCoordinator:
        subtask = backend if backend is not None else self.heap()
        storage = self.storage(root, job_id, hooks)
        return self.keep(CheckpointCoordinator(storage, [subtask], **options))

    def restore(
        self,
        directory: str,
        mode: RestoreMode,
        backend: Subtask | None = None,
        root: str | None = None,
        job_id: str = "job",
        **options: Any,
    ) -> CheckpointCoordinator:
        subtask = backend if backend is not None else self.heap()
        storage = self.storage(self.restore_root if root is None else root, job_id)
        return self.keep(
            CheckpointCoordinator.restore(storage, [subtask], directory, mode, **options)
        )

    def recover(
        self,
        backend: Subtask | None = None,
        root: str = "root",
        job_id: str = "job",
        *,
        hooks: Hook | None = None,
        **options: Any,
    ) -> CheckpointCoordinator:
        subtask = backend if backend is not None else self.heap()
        return self.keep(
            CheckpointCoordinator.recover(self.storage(root, job_id, hooks), [subtask], **options)
        )

    def __enter__(self) -> Jobs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for coordinator in self._coordinators:
            coordinator.close()
        for backend in self._backends:
            backend.close()
