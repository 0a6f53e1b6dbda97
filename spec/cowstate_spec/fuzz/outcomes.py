"""What a fuzz case's outcome is, and the instruments that tell: backend
contents in a comparable form, the watch on reads outside the allowed roots,
and the manifest of files nobody may delete.

The outcomes (worst first, as :data:`SEVERITY` orders them):

- ``outside``: a file outside what the entry point may touch was opened
  (:class:`Watch`), or a protected file was deleted, changed or created
  (:func:`manifest`);
- ``escaped``: an exception outside :mod:`cowstate.errors` left the entry
  point (or came out of closing the backends, or reading what was restored);
- ``partial``: a :class:`~cowstate.errors.CowStateError`, but some backend's
  contents changed;
- ``wrong``: no error, but the contents differ from the snapshot's (or an entry
  is not found by a lookup of its own key: stored under another key group);
- ``clean``: a :class:`~cowstate.errors.CowStateError` and every backend as
  it was;
- ``fallback``: ``recover()`` restored an older retained checkpoint exactly
  (the newer one did not verify): what recovery promises;
- ``exact``: no error and the contents equal the snapshot's.

``clean``, ``fallback`` and ``exact`` are acceptable; the others (:data:`BAD`)
fail a run.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.errors import CowStateError

__all__ = [
    "ACCEPTABLE",
    "BAD",
    "SEVERITY",
    "Entry",
    "Outcome",
    "Verdict",
    "View",
    "Watch",
    "canon",
    "classify",
    "manifest",
    "manifest_changes",
    "view_of",
    "worst",
]


class Outcome(StrEnum):
    """The class of one case's result (module doc)."""

    OUTSIDE = "outside"
    ESCAPED = "escaped"
    PARTIAL = "partial"
    WRONG = "wrong"
    CLEAN = "clean"
    FALLBACK = "fallback"
    EXACT = "exact"


#: Worst first.
SEVERITY: tuple[Outcome, ...] = tuple(Outcome)
BAD = frozenset({Outcome.OUTSIDE, Outcome.ESCAPED, Outcome.PARTIAL, Outcome.WRONG})
ACCEPTABLE = frozenset(Outcome) - BAD

#: One mapping as comparable text: (state name, key, namespace, state).
Entry = tuple[str, str, str, str]
#: The contents of one backend: its entries, sorted (states without entries drop out).
View = tuple[Entry, ...]


@dataclass(frozen=True)
class Verdict:
    """An outcome and what shows it (an error's type and message, a difference)."""

    outcome: Outcome
    detail: str


def worst(verdicts: Sequence[Verdict]) -> Verdict:
    """The most severe of ``verdicts``."""
    return min(verdicts, key=lambda v: SEVERITY.index(v.outcome))


def classify(
    error: BaseException | None,
    before: Sequence[View],
    after: Sequence[View] | BaseException,
    expected: Sequence[Sequence[View]],
) -> Verdict:
    """The outcome of one restore into backends.

    ``error``: what the entry point raised (None: it returned). ``before`` /
    ``after``: every backend's view before and after (``after`` an exception
    if reading the backends failed). ``expected``: the views a correct restore
    may produce -- the snapshot's, then (recovery) older retained ones, each
    one view per backend; none: only a refusal is right.
    """
    if isinstance(after, BaseException):
        if not isinstance(after, CowStateError):
            return Verdict(Outcome.ESCAPED, f"reading the restored state: {_error(after)}")
        return Verdict(Outcome.WRONG, f"the restored state cannot be read: {_error(after)}")
    if error is not None:
        if not isinstance(error, CowStateError):
            return Verdict(Outcome.ESCAPED, _error(error))
        if list(after) != list(before):
            return Verdict(Outcome.PARTIAL, f"{_error(error)}; but {_difference(before, after)}")
        return Verdict(Outcome.CLEAN, _error(error))
    for position, views in enumerate(expected):
        if list(after) == list(views):
            if position == 0:
                return Verdict(Outcome.EXACT, "restored the snapshot's contents")
            return Verdict(Outcome.FALLBACK, f"restored retained snapshot {position} older")
    if not expected:
        return Verdict(Outcome.WRONG, "restored, but only a refusal is right")
    return Verdict(Outcome.WRONG, _difference(expected[0], after))


# --------------------------------------------------------------------- contents


def canon(value: object, depth: int = 0) -> str:
    """``value`` as text that is equal exactly for equal values of the same
    types, whatever the order of sets and dicts (never raises)."""
    try:
        return _canon(value, depth)
    except Exception as exc:  # a hostile __repr__ or __eq__
        return f"<{type(value).__name__}: {type(exc).__name__}>"


def view_of(backend: Any) -> View:
    """Every mapping of every state of ``backend``, each checked by a lookup of
    its own key: an entry the lookup does not find (stored under another key
    group, an unhashable key) is marked ``[not found by its key]``. A
    non-cowstate exception propagates."""
    entries: list[Entry] = []
    for name in backend.state_names:
        table = backend.table(name)
        for entry in backend.entries(name):
            key, namespace, state = entry
            mark = ""
            try:
                found = table.get(key, namespace)
            except CowStateError as exc:
                mark = f" [lookup failed: {type(exc).__name__}]"
            else:
                if found is not state and canon(found) != canon(state):
                    mark = " [not found by its key]"
            entries.append((name, canon(key), canon(namespace), canon(state) + mark))
    return tuple(sorted(entries))


# ---------------------------------------------------------------- the read watch


class Watch:
    """Records files opened outside the allowed roots while :meth:`installed`.

    Two seams: :meth:`FileSystem.open` (every read of the checkpoint layer:
    any path outside ``allowed``, links followed, or on another protocol is
    recorded) and :func:`builtins.open` (a path inside ``zone`` but outside
    ``allowed``: the canary, whoever opens it -- a pickle payload too).
    """

    def __init__(self) -> None:
        self.zone = "/nonexistent-zone"
        self.allowed: tuple[str, ...] = ()
        self.reads: list[str] = []

    def reset(self, zone: str, allowed: Sequence[str]) -> None:
        """Start a case: ``zone`` is watched for plain opens; ``allowed`` may be read."""
        self.zone = os.path.realpath(zone)
        self.allowed = tuple(os.path.realpath(a) for a in allowed)
        self.reads = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[Watch]:
        original_fs_open = FileSystem.open
        original_open = builtins.open
        watch = self

        def fs_open(filesystem: FileSystem, path: str) -> Any:
            watch._check(path, everywhere=True)
            return original_fs_open(filesystem, path)

        def plain_open(file: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, str | os.PathLike):
                watch._check(os.fspath(file), everywhere=False)
            return original_open(file, *args, **kwargs)

        FileSystem.open = fs_open  # type: ignore[method-assign, assignment]
        builtins.open = plain_open
        try:
            yield self
        finally:
            FileSystem.open = original_fs_open  # type: ignore[method-assign]
            builtins.open = original_open

    def _check(self, path: str | bytes, *, everywhere: bool) -> None:
        if isinstance(path, bytes):
            path = path.decode("utf-8", "replace")
        local = path[len("file://") :] if path.startswith("file://") else path
        if "://" in local or not local.startswith("/"):
            if everywhere:
                self.reads.append(path)
            return
        real = os.path.realpath(local)
        if not everywhere and not _under(real, self.zone):
            return
        if not any(_under(real, root) for root in self.allowed):
            self.reads.append(path if real == path else f"{path} -> {real}")


# ----------------------------------------------------------------- the manifest

#: path -> what is there: ("file", size, crc32), ("link", target) or ("dir",).
Manifest = dict[str, tuple[Any, ...]]


def manifest(root: str, protected: Callable[[str], bool]) -> Manifest:
    """Every file, link and directory under ``root`` that ``protected(path)``
    says nobody may touch (links are not followed)."""
    found: Manifest = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            if not protected(path):
                continue
            if os.path.islink(path):
                found[path] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                found[path] = ("dir",)
            else:
                with _ORIGINAL_OPEN(path, "rb") as stream:
                    data = stream.read()
                found[path] = ("file", len(data), zlib.crc32(data))
    return found


def manifest_changes(before: Manifest, after: Manifest) -> list[str]:
    """What happened to protected paths: deleted, changed or created."""
    changes = [f"deleted {p}" for p in sorted(before.keys() - after.keys())]
    changes += [
        f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]
    ]
    changes += [f"created {p}" for p in sorted(after.keys() - before.keys())]
    return changes


# ------------------------------------------------------------ private helpers

_ORIGINAL_OPEN = builtins.open


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _error(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ")
    return f"{type(exc).__name__}: {text[:160]}"


_SCALARS = frozenset({bool, int, float, complex, str, bytes, type(None)})


def _canon(value: object, depth: int) -> str:
    kind = type(value)
    if kind in _SCALARS:
        return f"{kind.__name__}:{value!r}"
    if depth > 40:
        return "<deep>"
    if kind in (tuple, list):
        return f"{kind.__name__}[{', '.join(_canon(v, depth + 1) for v in value)}]"  # type: ignore[attr-defined]
    if kind in (set, frozenset):
        return f"{kind.__name__}{{{', '.join(sorted(_canon(v, depth + 1) for v in value))}}}"  # type: ignore[attr-defined]
    if kind is dict:
        items = sorted(
            f"{_canon(k, depth + 1)}: {_canon(v, depth + 1)}"
            for k, v in value.items()  # type: ignore[attr-defined]
        )
        return f"dict{{{', '.join(items)}}}"
    return f"{kind.__qualname__}:{value!r}"


def _difference(expected: Sequence[View], actual: Sequence[View]) -> str:
    parts = []
    for index, (want, got) in enumerate(zip(expected, actual, strict=False)):
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        if missing or extra:
            sample = (extra or missing)[0]
            parts.append(
                f"backend {index}: {len(missing)} missing, {len(extra)} unexpected "
                f"(e.g. {'+' if extra else '-'}{sample[0]} {sample[1][:40]} {sample[2][:30]} "
                f"{sample[3][:60]})"
            )
    if len(expected) != len(actual):
        parts.append(f"{len(actual)} backends, expected {len(expected)}")
    return "; ".join(parts) or "the same entries in another order"
