"""The shared-state registry: which retained checkpoints use each shared file.

A shared file is known by its physical path (every upload gets a fresh
name, so two uploads of one local SST are two entries -- Flink's
FLINK-29913). The registry keeps, for every path, the *set* of retained
checkpoints that reference it:

    register(N, files)    N completed: it uses ``files`` (new uploads and reused ones)
    unregister(N)         N was subsumed: drop N from every set; the paths whose
                          set became empty are returned -- the caller deletes
                          them, unless they are not owned

so a file is deleted exactly when no retained checkpoint uses it: nothing
more, nothing less. (Flink's generation-2 registry approximates the same set
with "last used by" ids; the set says it directly.) Files of a snapshot the
job does not own -- restored in NO_CLAIM or LEGACY mode -- are marked with
:meth:`disown` and are never returned for deletion. Savepoints never enter
the registry: their files are exclusive to their directory.
"""

from __future__ import annotations

from collections.abc import Iterable

from cowstate.errors import InvalidArgumentError

__all__ = ["SharedStateRegistry"]


class SharedStateRegistry:
    """Reference sets of shared files, keyed by physical path."""

    def __init__(self) -> None:
        self._users: dict[str, set[int]] = {}
        self._not_owned: set[str] = set()
        self._registered: set[int] = set()

    def register(self, checkpoint_id: int, paths: Iterable[str]) -> None:
        """Checkpoint ``checkpoint_id`` completed and uses the shared ``paths``."""
        if checkpoint_id in self._registered:
            raise InvalidArgumentError(
                f"expected checkpoint {checkpoint_id} to be registered once, it already is"
            )
        self._registered.add(checkpoint_id)
        for path in paths:
            self._users.setdefault(path, set()).add(checkpoint_id)

    def unregister(self, checkpoint_id: int) -> list[str]:
        """Checkpoint ``checkpoint_id`` is no longer retained; return the owned
        paths no retained checkpoint uses any more (to delete)."""
        self._registered.discard(checkpoint_id)
        unused = []
        for path in list(self._users):
            users = self._users[path]
            users.discard(checkpoint_id)
            if not users:
                del self._users[path]
                if path not in self._not_owned:
                    unused.append(path)
        return sorted(unused)

    def disown(self, paths: Iterable[str]) -> None:
        """Never return ``paths`` for deletion (files of a snapshot the job does not own)."""
        self._not_owned.update(paths)

    def users(self, path: str) -> frozenset[int]:
        """The retained checkpoints that use ``path``."""
        return frozenset(self._users.get(path, ()))

    def is_owned(self, path: str) -> bool:
        return path not in self._not_owned

    @property
    def paths(self) -> frozenset[str]:
        """Every shared path some retained checkpoint uses."""
        return frozenset(self._users)

    @property
    def checkpoints(self) -> frozenset[int]:
        return frozenset(self._registered)

    def __repr__(self) -> str:
        return (
            f"<SharedStateRegistry {len(self._users)} files, checkpoints "
            f"{sorted(self._registered)}>"
        )
