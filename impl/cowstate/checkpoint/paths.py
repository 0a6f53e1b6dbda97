"""Confined paths: how a file named in ``_metadata`` becomes a path, and the only
places it may be.

``_metadata`` is read back from storage and may be corrupt or hostile, so no
path in it is ever used as it is. Every path is *relative*, in one of two
forms, and resolves inside one of two roots:

=========  ==============================  ==========================================
scope      form in ``_metadata``           resolves to
=========  ==============================  ==========================================
exclusive  ``name`` or ``dir/name``        ``<snapshot directory>/<path>`` (the
                                           directory holding ``_metadata``)
shared     ``<job id>/shared/<name>``      ``<storage root>/<path>``, the storage root
                                           being the parent of the checkpoint's job
                                           directory (``<root>/<job>/chk-<id>``)
=========  ==============================  ==========================================

Rules (cited as P1-P4):

P1. A component is a non-empty run of ``[A-Za-z0-9._-]`` other than ``.`` and
    ``..``; components are joined by ``/``; at most 8 components and 255
    characters. So no absolute path, no URL scheme (``:`` is not allowed), no
    ``..``, no empty component, no backslash.
P2. A shared path is exactly ``<job id>/shared/<name>``; only checkpoints have
    shared files (a savepoint's files are all exclusive), so a shared path in
    a savepoint is refused.
P3. On a local file system, the resolved path, with every symbolic link
    followed, must still lie under the real path of its root: a symlink that
    leaves the root is refused before the file is opened.
P4. Resolution uses the file system and protocol of the snapshot directory
    the caller named; a path cannot switch protocol (P1 has no ``:``).

Violations raise :class:`~cowstate.errors.UnsafePathError` before any file
is opened. Deletion has its own, stricter rule, kept by the coordinator: it
deletes only inside the job's own directory, plus the listed files of a
snapshot restored in CLAIM mode.
"""

from __future__ import annotations

import os
import re

from cowstate.errors import UnsafePathError

__all__ = [
    "MAX_COMPONENTS",
    "MAX_LENGTH",
    "check_exclusive_path",
    "check_shared_path",
    "is_inside",
    "shared_path",
]

MAX_COMPONENTS = 8
MAX_LENGTH = 255
_COMPONENT = re.compile(r"[A-Za-z0-9._-]+\Z")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def check_exclusive_path(path: str) -> str:
    """``path`` if it is a valid exclusive path (P1), else :class:`UnsafePathError`."""
    _components(path, "an exclusive file")
    return path


def check_shared_path(path: str) -> str:
    """``path`` if it is ``<job id>/shared/<name>`` (P1, P2), else :class:`UnsafePathError`."""
    parts = _components(path, "a shared file")
    if len(parts) != 3 or parts[1] != "shared" or not _JOB_ID.match(parts[0]):
        raise UnsafePathError(
            f"expected a shared file path of the form '<job id>/shared/<name>', got {path!r}"
        )
    return path


def shared_path(job_id: str, name: str) -> str:
    """The ``_metadata`` path of shared file ``name`` of job ``job_id``."""
    return check_shared_path(f"{job_id}/shared/{name}")


def is_inside(path: str, real_root: str) -> bool:
    """True if the local ``path``, links followed, lies under ``real_root`` (P3).

    ``real_root`` is taken as it is: the caller builds it from a real path
    it trusts (the snapshot directory, the storage root), so a link *inside*
    the root -- a ``shared/`` that points elsewhere -- cannot move the root.
    """
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


# ------------------------------------------------------------ private helpers


def _components(path: object, what: str) -> list[str]:
    if not isinstance(path, str):
        raise UnsafePathError(f"expected the path of {what} as a string, got {path!r}")
    if not path or len(path) > MAX_LENGTH:
        raise UnsafePathError(
            f"expected the path of {what} of 1 to {MAX_LENGTH} characters, got {len(path)}"
        )
    parts = path.split("/")
    if len(parts) > MAX_COMPONENTS:
        raise UnsafePathError(
            f"expected the path of {what} of at most {MAX_COMPONENTS} components, got "
            f"{len(parts)} in {path[:80]!r}"
        )
    for part in parts:
        if part in (".", "..") or not _COMPONENT.match(part):
            raise UnsafePathError(
                f"expected a relative path of {what} inside the snapshot (letters, digits, "
                f"'.', '_', '-' between '/'; no '..', no scheme, not absolute), got {path!r}"
            )
    return parts
