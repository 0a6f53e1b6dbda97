"""Confined paths: how a name read from a file becomes a path, and the only
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

Rules (cited as P1-P6):

P1. A component is a non-empty run of ``[A-Za-z0-9._-]`` other than ``.`` and
    ``..``; components are joined by ``/``; at most 8 components and 255
    characters. So no absolute path, no URL scheme (``:`` is not allowed), no
    ``..``, no empty component, no backslash, nothing but ASCII (no look-alike
    of ``/`` or ``.`` such as U+FF0F or U+2024).
P2. A shared path is exactly ``<job id>/shared/<name>``; only checkpoints have
    shared files (a savepoint's files are all exclusive), so a shared path in
    a savepoint is refused.
P3. On a local file system, the resolved path, with every symbolic link
    followed, must still lie under the real path of its root -- compared
    name by name, never as a string prefix (``/a/job-evil`` is not under
    ``/a/job``): a symlink that leaves the root is refused before the file
    is opened.
P4. Resolution uses the file system and protocol of the snapshot directory
    the caller named; a path cannot switch protocol (P1 has no ``:``).
P5. Every name read from a file passes one check, :func:`check_name`, before
    any file-system call uses it: the paths of ``_metadata`` (P1, P2), a
    file's ``local_name`` (the name a RocksDB restore downloads it under:
    one P1 component, :func:`check_file_name`), the directory a ``_restore``
    record or a checkpoint's ``restored_from`` names, and the directory of a
    ``_savepoint`` intent (P6). It must be a string of valid Unicode without
    NUL or any other control character (U+0000-U+001F, U+007F-U+009F), of
    at most :data:`MAX_PATH_BYTES` bytes in UTF-8, each name between ``/``
    at most :data:`MAX_NAME_BYTES`: what the operating system would refuse
    with a raw ``ValueError`` or ``OSError`` is refused here, naming what is
    wrong. (A name listed from a directory is used only when it is exactly
    a name the job writes: ``chk-<id>`` with a canonical decimal id.) A
    path, URL or name a caller gives an entry point (a storage root, a job
    id, a savepoint or snapshot directory) passes the same check,
    :func:`check_argument`, before anything is read or written: the
    caller's mistake is an :class:`~cowstate.errors.InvalidArgumentError`.
P6. A directory the job records to find again -- that of a ``_savepoint``
    intent and of a ``_restore`` record -- is absolute and normal: a local
    path starting with ``/`` or a URL ``<protocol>://...``, with no empty,
    ``.`` or ``..`` name and no trailing ``/``; it is never resolved against
    the working directory. An intent's token is 32 lowercase hex digits (so
    the marker it names is one file of the directory). A savepoint and a
    restore record their directory this way (a local one as its real path);
    recovery also requires a local one to be its own real path (no symbolic
    link at any level) before it looks inside (R1, R2 of
    :mod:`~cowstate.checkpoint.recovery`).

Violations raise :class:`~cowstate.errors.UnsafePathError` (a
:class:`~cowstate.errors.CorruptCheckpointError`) before any file is
opened; a caller's argument, :class:`~cowstate.errors.InvalidArgumentError`.
Deletion has its own, stricter rule, kept by the coordinator: it deletes
only inside the job's own directory, plus the listed files of a snapshot
restored in CLAIM mode, plus an interrupted savepoint's directory holding
the marker the savepoint wrote (R1), plus what a failed savepoint wrote.
"""

from __future__ import annotations

import os
import re

from cowstate.errors import InvalidArgumentError, UnsafePathError

__all__ = [
    "MAX_COMPONENTS",
    "MAX_LENGTH",
    "MAX_NAME_BYTES",
    "MAX_PATH_BYTES",
    "check_argument",
    "check_directory",
    "check_exclusive_path",
    "check_file_name",
    "check_name",
    "check_shared_path",
    "is_inside",
    "shared_path",
    "shown",
]

MAX_COMPONENTS = 8
MAX_LENGTH = 255
#: The longest name between ``/`` a name read from a file may hold, in UTF-8
#: bytes (P5): ``NAME_MAX`` of the common local file systems.
MAX_NAME_BYTES = 255
#: The longest name read from a file, in UTF-8 bytes (P5): ``PATH_MAX`` on Linux
#: less its terminating NUL (a path of 4096 bytes is ``ENAMETOOLONG`` there).
MAX_PATH_BYTES = 4095
_COMPONENT = re.compile(r"[A-Za-z0-9._-]+\Z")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: How much of a refused name a message shows.
_SHOWN = 80


def check_name(name: object, what: str) -> str:
    """``name`` if a file-system call may be given it (P5), else
    :class:`UnsafePathError` naming ``what`` and what is wrong. Every name
    read from a file passes here first (the other checks call it)."""
    if not isinstance(name, str):
        raise UnsafePathError(f"expected {what} as a string, got {name!r}")
    if not name:
        raise UnsafePathError(f"expected {what}, got an empty name")
    control = _CONTROL.search(name)
    if control is not None:
        raise UnsafePathError(
            f"expected {what} without NUL or other control characters, got "
            f"U+{ord(control.group()):04X} at {control.start()} in {shown(name)}"
        )
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise UnsafePathError(
            f"expected {what} of valid Unicode, got the lone surrogate "
            f"U+{ord(name[exc.start]):04X} at {exc.start} in {shown(name)}"
        ) from None
    if size > MAX_PATH_BYTES:
        raise UnsafePathError(
            f"expected {what} of at most {MAX_PATH_BYTES} bytes, got {size} bytes: {shown(name)}"
        )
    for part in name.split("/"):
        part_size = len(part.encode("utf-8"))
        if part_size > MAX_NAME_BYTES:
            raise UnsafePathError(
                f"expected {what} with every name between '/' of at most {MAX_NAME_BYTES} "
                f"bytes, got one of {part_size} bytes: {shown(part)}"
            )
    return name


def check_argument(name: object, what: str) -> str:
    """``name`` if a file-system call may be given it (P5), else
    :class:`InvalidArgumentError` naming ``what`` and what is wrong: a path,
    URL or name a caller gave (not read from a file)."""
    try:
        return check_name(name, what)
    except UnsafePathError as exc:
        raise InvalidArgumentError(str(exc)) from None


def check_file_name(name: object, what: str) -> str:
    """``name`` if it is one P1 component (P5 first), else :class:`UnsafePathError`:
    a name a file is stored or downloaded under (a RocksDB file's local name)."""
    check_name(name, what)
    assert isinstance(name, str)
    if name in (".", "..") or not _COMPONENT.match(name):
        raise UnsafePathError(
            f"expected {what} to be one name of letters, digits, '.', '_' and '-' (not '.' "
            f"or '..', no '/'), got {shown(name)}"
        )
    return name


def check_directory(name: object, what: str) -> str:
    """``name`` if it is an absolute, normal directory (P5, P6), else
    :class:`UnsafePathError`: a directory recovery may look into and delete."""
    check_name(name, what)
    assert isinstance(name, str)
    url = _URL.match(name)
    if url is None and not name.startswith("/"):
        raise UnsafePathError(
            f"expected {what} to be absolute (a path from '/' or a URL), got {shown(name)}: "
            "it would be resolved against the working directory"
        )
    rest = name[url.end() :] if url is not None else name
    parts = rest.removeprefix("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnsafePathError(
            f"expected {what} to be normal (no empty, '.' or '..' name, no trailing '/'), got "
            f"{shown(name)}"
        )
    return name


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


def shown(name: str) -> str:
    """``name`` as a message shows it: quoted, escaped, at most ``_SHOWN`` characters."""
    return repr(name[:_SHOWN]) + (f" (of {len(name)} characters)" if len(name) > _SHOWN else "")


# ------------------------------------------------------------ private helpers


def _components(path: object, what: str) -> list[str]:
    if not isinstance(path, str):
        raise UnsafePathError(f"expected the path of {what} as a string, got {path!r}")
    if not path or len(path) > MAX_LENGTH:
        raise UnsafePathError(
            f"expected the path of {what} of 1 to {MAX_LENGTH} characters, got {len(path)}"
        )
    check_name(path, f"the path of {what}")  # P5
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
