"""The checkpoint-directory fuzzer: real jobs' checkpoints and savepoints,
damaged (:mod:`~cowstate_spec.fuzz.dir_corruptions`), then read through every
entry point.

A fixture (:func:`build_dir_fixture`, heap, RocksDB and heap chains) is a
tree::

    root/job/chk-1, chk-2, shared/    two retained checkpoints of 2 subtasks
                                      (RocksDB: incremental, sharing SSTs;
                                      heap chains: chk-2, chk-3, a base and
                                      1 / 2 deltas with removals, in shared/)
    root/other/chk-2, chk-3, shared/  heap chains: another job's of the same
                                      shape, other values (``chain:*``)
    root/job/savepoints/sp-inside     a canonical savepoint inside the job directory
    savepoints/sp-canonical,          savepoints outside the storage root
    savepoints/sp-native
    canary/secret, canary/dir/file    what nothing may read or delete

A case copies the tree, damages the copy, and runs one entry point:

- ``claim`` / ``no-claim`` / ``legacy``: ``CheckpointCoordinator.restore``
  of the target snapshot into a new job (``root-b/job-b``), 1-3 fresh or
  state-holding subtasks of the fixture's backend (either backend for a
  canonical savepoint; a plain heap backend for a heap chain, at times); on
  success, new state and two checkpoints, so a CLAIMed snapshot is subsumed
  and deleted;
- ``recover``: ``CheckpointCoordinator.recover`` of ``root/job`` into two new
  subtasks (the newest checkpoint expected, the older a fallback), then one
  checkpoint;
- ``inspect``: ``inspect_snapshot`` of the target (with or without CRCs)
  and ``format_report``.

What may change: ``root-b/`` for a restore (plus, in CLAIM mode, the
claimed directory and, for a checkpoint, its job's ``shared/``); for
recovery what the job owns (``chk-<id>/``, ``shared/``, its ``_`` and ``.``
files; a savepoint marker anywhere); nothing for ``inspect``. Everything
else in the tree is protected (:func:`~cowstate_spec.fuzz.outcomes.manifest`),
and reads are allowed only in the target's directory and storage root
(and ``root-b/``) or, for recovery, in ``root/``.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cowstate.checkpoint.coordinator import SAVEPOINT_MARKER, CheckpointCoordinator
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import RestoreMode
from cowstate.checkpoint.inspect import format_report, inspect_snapshot
from cowstate.checkpoint.storage import CheckpointStorage, read_metadata
from cowstate.descriptors import ValueStateDescriptor
from cowstate.errors import CowStateError
from cowstate_model.key_groups import assign_to_key_group
from cowstate_spec.fuzz.dir_corruptions import DIR_CLASSES, DirCase, SnapshotInfo
from cowstate_spec.fuzz.jobs import (
    KEYS,
    MAX_PARALLELISM,
    STATES,
    expected_views,
    fill,
    new_backend,
    original_of,
    prefill,
    remove,
    subtask_ranges,
)
from cowstate_spec.fuzz.outcomes import (
    Outcome,
    Verdict,
    View,
    Watch,
    classify,
    manifest,
    manifest_changes,
    view_of,
    worst,
)

__all__ = ["DirFixture", "DirSuite", "build_dir_fixture", "run_dir_case"]

#: The state a job restored by a case writes before its next checkpoints.
CARRY_ON: ValueStateDescriptor[Any] = ValueStateDescriptor("carry-on")
_MODES = {
    "claim": RestoreMode.CLAIM,
    "no-claim": RestoreMode.NO_CLAIM,
    "legacy": RestoreMode.LEGACY,
}
_TIMEOUT = 60.0


@dataclass(frozen=True)
class DirFixture:
    """A job's tree of checkpoints and savepoints (module doc) and what each holds."""

    kind: str
    tree: str
    snapshots: dict[str, SnapshotInfo]


@dataclass
class DirSuite:
    """Everything the directory cases share."""

    scratch: str
    fixtures: list[DirFixture]
    watch: Watch

    @property
    def case_dir(self) -> str:
        return os.path.join(self.scratch, "case")

    @property
    def rocks_local(self) -> str:
        return os.path.join(self.scratch, "rocks-local")


def build_dir_fixture(scratch: str, kind: str) -> DirFixture:
    """Run a job of two ``kind`` subtasks and keep its tree (module doc)."""
    tree = os.path.join(scratch, f"fixture-{kind}")
    os.makedirs(os.path.join(tree, "canary", "dir"))
    for name, text in (("secret", "do not read"), ("dir/file", "do not delete")):
        with open(os.path.join(tree, "canary", name), "w") as f:
            f.write(text)
    if kind == "heap-incremental":  # another job of the same shape, other values
        _run_job(tree, scratch, kind, "other", 10)
    snapshots = _run_job(tree, scratch, kind, "job", 0)
    deltas = [s.deltas for s in snapshots.values()][:2]
    if kind == "heap-incremental" and deltas != [1, 2]:
        raise AssertionError(f"expected chains of 1 and 2 deltas, got {deltas}")
    return DirFixture(kind, tree, snapshots)


def run_dir_case(
    suite: DirSuite, fixture: DirFixture, cls: str, entry: str, rng: random.Random
) -> tuple[Verdict, str]:
    """Copy the fixture, damage it with ``cls``, run ``entry``; the verdict and
    what was done."""
    root = suite.case_dir
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(fixture.tree, root, symlinks=True)
    try:
        targets = DIR_CLASSES[cls].targets(fixture.snapshots)
        if entry == "recover":
            checkpoints = [t for t in targets if t.kind == "checkpoint"]
            newest, *older = sorted(checkpoints, key=lambda t: t.name, reverse=True)
            target = newest if rng.random() < 0.7 or not older else rng.choice(older)
        else:
            target = rng.choice(targets)
        case = DirCase(root, target, fixture.snapshots, rng)
        damage = DIR_CLASSES[cls].corrupt(case)
        runner = _Run(suite, fixture, case, entry)
        verdict = runner.run()
        return verdict, f"{fixture.kind} {target.name}: {damage}; {runner.how}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------ private helpers

#: Each checkpoint of a fixture's job: (keys given new values, keys removed).
#: The chain kind's three make a base and two deltas, with removals (one
#: re-inserted later, one changed and removed in the same delta).
_ROUNDS: dict[str, tuple[tuple[Sequence[Any], Sequence[Any]], ...]] = {
    "heap-incremental": ((KEYS, ()), (KEYS[::2], KEYS[1::4]), (KEYS[1::3], KEYS[::5])),
}
_DEFAULT_ROUNDS = ((KEYS, ()), (KEYS[::2], ()))


def _run_job(tree: str, scratch: str, kind: str, job: str, offset: int) -> dict[str, SnapshotInfo]:
    """Job ``job``'s checkpoints (the last two retained) and, for ``job``, its
    savepoints; ``offset`` shifts every value written."""
    storage = CheckpointStorage(os.path.join(tree, "root"), job, FileSystem())
    local = os.path.join(scratch, "rocks-local")
    backends = [new_backend(kind, r, local) for r in subtask_ranges(2)]
    coordinator = CheckpointCoordinator(storage, backends, num_retained=2, timeout=_TIMEOUT)
    snapshots = {}
    rounds = _ROUNDS.get(kind, _DEFAULT_ROUNDS)
    try:
        for round_, (keys, removed) in enumerate(rounds, 1):
            fill(backends, round_ + offset, keys)
            remove(backends, removed)
            completed = coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
            if round_ > len(rounds) - 2:
                name = f"chk-{round_}"
                snapshots[name] = SnapshotInfo(
                    name,
                    os.path.relpath(completed.directory, tree),
                    "checkpoint",
                    original_of(backends),
                    _deltas(completed.directory, kind),
                )
        if job != "job":
            return snapshots
        fill(backends, len(rounds) + 1, KEYS[1::3])
        savepoints: tuple[tuple[str, str, Literal["canonical", "native"]], ...] = (
            ("sp-inside", "root/job/savepoints/sp-inside", "canonical"),
            ("sp-canonical", "savepoints/sp-canonical", "canonical"),
            ("sp-native", "savepoints/sp-native", "native"),
        )
        for name, where, savepoint_format in savepoints:
            coordinator.trigger_savepoint(os.path.join(tree, where), savepoint_format)
            snapshots[name] = SnapshotInfo(name, where, "savepoint", original_of(backends))
    finally:
        coordinator.close()
        for backend in backends:
            backend.close()
    return snapshots


def _deltas(directory: str, kind: str) -> int:
    """The deltas of the checkpoint in ``directory``'s heap chains (0: none)."""
    if kind != "heap-incremental":
        return 0
    files = {len(h.files) for h in read_metadata(FileSystem(), directory).subtasks}
    if len(files) != 1:
        raise AssertionError(f"expected chains of one length in {directory}, got {files}")
    return (files.pop() - 1) // 2


class _Run:
    """One entry point over one damaged tree, and its verdict."""

    def __init__(self, suite: DirSuite, fixture: DirFixture, case: DirCase, entry: str) -> None:
        self.suite = suite
        self.fixture = fixture
        self.case = case
        self.entry = entry
        self.how = entry
        self.backends: list[Any] = []

    def run(self) -> Verdict:
        case = self.case
        protected = self._protected()
        before_files = manifest(case.root, protected)
        self.suite.watch.reset(case.root, self._readable())
        verdicts: list[Verdict] = []
        with self.suite.watch.installed():
            try:
                if self.entry == "inspect":
                    verdicts.append(self._inspect())
                elif self.entry == "recover":
                    verdicts.append(self._recover())
                else:
                    verdicts.append(self._restore())
            finally:
                verdicts.append(self._close())
        reads = list(self.suite.watch.reads)
        changes = manifest_changes(before_files, manifest(case.root, protected))
        if reads or changes:
            shown = [f"read {r}" for r in reads[:3]] + changes[:3]
            verdicts.append(Verdict(Outcome.OUTSIDE, "; ".join(shown)[:400]))
        return worst(verdicts)

    # ----------------------------------------------------------- entry points

    def _inspect(self) -> Verdict:
        verify = self.case.rng.random() < 0.5
        self.how = f"inspect_snapshot(verify={verify})"
        try:
            report = inspect_snapshot(self.case.directory(), verify=verify)
            format_report(report)
        except Exception as exc:
            return classify(exc, [], [], [[]])
        return Verdict(Outcome.EXACT, f"reported ({len(report.problems)} file problems)")

    def _restore(self) -> Verdict:
        rng = self.case.rng
        target = self.case.target
        kind = self.fixture.kind
        if target.name in ("sp-inside", "sp-canonical") and rng.random() < 0.5:
            kind = "heap" if kind == "rocksdb" else "rocksdb"
        elif kind == "heap-incremental" and rng.random() < 0.3:
            kind = "heap"  # a chain restores into any heap backend
        parallelism = rng.choice((1, 2, 2, 3))
        state = rng.choice(("fresh", "registered", "prefilled"))
        self.how = f"restore {self.entry} into {parallelism} {state} {kind} subtasks"
        ranges = subtask_ranges(parallelism)
        self.backends = self._new_backends(kind, ranges, state)
        before = [view_of(b) for b in self.backends]
        storage = CheckpointStorage(os.path.join(self.case.root, "root-b"), "job-b", FileSystem())
        error: BaseException | None = None
        coordinator: CheckpointCoordinator | None = None
        try:
            coordinator = CheckpointCoordinator.restore(
                storage,
                self.backends,
                self.case.directory(),
                _MODES[self.entry],
                num_retained=1,
                timeout=_TIMEOUT,
            )
        except Exception as exc:
            error = exc
        verdict = classify(
            error, before, _views(self.backends), [expected_views(target.original, ranges)]
        )
        if coordinator is not None and verdict.outcome is Outcome.EXACT:
            verdict = worst([verdict, _carry_on(coordinator, self.backends, checkpoints=2)])
        return verdict

    def _recover(self) -> Verdict:
        state = self.case.rng.choice(("fresh", "registered"))
        self.how = f"recover into 2 {state} {self.fixture.kind} subtasks"
        ranges = subtask_ranges(2)
        self.backends = self._new_backends(self.fixture.kind, ranges, state)
        before = [view_of(b) for b in self.backends]
        storage = CheckpointStorage(self.case.storage_root, "job", FileSystem())
        error: BaseException | None = None
        coordinator: CheckpointCoordinator | None = None
        try:
            coordinator = CheckpointCoordinator.recover(
                storage, self.backends, num_retained=2, timeout=_TIMEOUT
            )
        except Exception as exc:
            error = exc
        retained = [s for s in self.fixture.snapshots.values() if s.kind == "checkpoint"]
        retained.sort(key=lambda s: s.name, reverse=True)  # newest first
        expected = [expected_views(s.original, ranges) for s in retained]
        verdict = classify(error, before, _views(self.backends), expected)
        if coordinator is not None and verdict.outcome in (Outcome.EXACT, Outcome.FALLBACK):
            verdict = worst([verdict, _carry_on(coordinator, self.backends, checkpoints=1)])
        return verdict

    # ---------------------------------------------------------------- helpers

    def _new_backends(self, kind: str, ranges: Sequence[Any], state: str) -> list[Any]:
        backends = []
        for r in ranges:
            backend = new_backend(kind, r, self.suite.rocks_local)
            backends.append(backend)
            if state != "fresh":
                for descriptor in STATES:
                    backend.get_state(descriptor)
            if state == "prefilled":
                prefill(backend)
        return backends

    def _close(self) -> Verdict:
        problems = []
        for backend in self.backends:
            try:
                backend.close()
            except Exception as exc:
                if not isinstance(exc, CowStateError):
                    problems.append(repr(exc))
        if problems:
            return Verdict(Outcome.ESCAPED, f"close: {problems[0]}"[:200])
        return Verdict(Outcome.EXACT, "")

    def _readable(self) -> list[str]:
        case = self.case
        if self.entry == "recover":
            return [case.storage_root]
        allowed = [case.directory(), os.path.join(case.root, "root-b")]
        if case.target.kind == "checkpoint":
            allowed.append(case.storage_root)
        return allowed

    def _protected(self) -> Callable[[str], bool]:
        case = self.case
        mutable: list[str] = []
        if self.entry == "recover":
            job = case.job_dir
            owned = [os.path.join(job, n) for n in ("shared", "_counter", "_restore", "_savepoint")]

            def recoverable(path: str) -> bool:
                if os.path.basename(path) == SAVEPOINT_MARKER:
                    return False
                if path == job:
                    return False
                if path.startswith(job + "/"):
                    first = path[len(job) + 1 :].split("/")[0]
                    if first.startswith((".", "chk-")) or any(_under(path, o) for o in owned):
                        return False
                return True

            return recoverable
        if self.entry in _MODES:
            mutable.append(os.path.join(case.root, "root-b"))
        if self.entry == "claim":
            mutable.append(case.directory())
            if case.target.kind == "checkpoint":
                mutable.append(os.path.join(case.job_dir, "shared"))
        return lambda path: not any(_under(path, m) for m in mutable)


def _views(backends: Sequence[Any]) -> list[View] | BaseException:
    try:
        return [view_of(b) for b in backends]
    except Exception as exc:
        return exc


def _carry_on(coordinator: CheckpointCoordinator, backends: list[Any], checkpoints: int) -> Verdict:
    """New state and checkpoints after a good restore: subsumption runs (and, for
    a CLAIMed snapshot, deletes it). An error now means the restore accepted
    something it could not carry on from. (A state of its own: re-registering
    a restored one may rightly fail when a resealed handle named another kind
    or serializer for the same bytes -- not a wrong restore.)"""
    try:
        for i, key in enumerate(KEYS[:5]):
            backend = next(
                b
                for b in backends
                if assign_to_key_group(key, MAX_PARALLELISM) in b.key_group_range
            )
            backend.set_current_key(key)
            backend.get_state(CARRY_ON).update(i)
        for _ in range(checkpoints):
            coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
        coordinator.close()
    except CowStateError as exc:
        return Verdict(Outcome.WRONG, f"a checkpoint after the restore failed: {exc!r}"[:300])
    except Exception as exc:
        return Verdict(Outcome.ESCAPED, f"a checkpoint after the restore: {exc!r}"[:300])
    return Verdict(Outcome.EXACT, "")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
