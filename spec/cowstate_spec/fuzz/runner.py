"""Running fuzz cases: which case a number is, deterministically by seed, and
the scratch space the fixtures and cases live in.

Case ``i`` of a run over classes ``C`` is class ``C[i % len(C)]``, its
``k = i // len(C)``-th case; everything random in it comes from
``random.Random(f"{seed}/{suite}/{class}/{k}")``, so ``--case
suite/class/k`` replays it alone, whatever else the run did. A directory
case's entry point and fixture go round-robin with ``k`` too, so every class
meets every entry point and every fixture it applies to (a ``chain:*`` class:
the heap-chain fixture only).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType

from cowstate.errors import InvalidArgumentError
from cowstate_spec.fuzz.dir_corruptions import DIR_CLASSES
from cowstate_spec.fuzz.dirs import DirSuite, build_dir_fixture, run_dir_case
from cowstate_spec.fuzz.files import FILE_CLASSES, FileSuite, build_file_fixtures, run_file_case
from cowstate_spec.fuzz.outcomes import Watch
from cowstate_spec.fuzz.report import CaseResult

__all__ = ["DIR_KINDS", "SUITES", "Fuzzer", "scratch_base"]

SUITES = ("files", "dirs")
#: The directory fixtures' backends: heap, RocksDB (incremental), heap chains.
DIR_KINDS = ("heap", "rocksdb", "heap-incremental")
Progress = Callable[[str, int, int, float], None]


def scratch_base() -> str:
    """Where cases are written: ``/dev/shm`` when there is one (RocksDB and the
    checkpoint layer fsync; on tmpfs that costs nothing), else the temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


class Fuzzer:
    """The fuzzers of one seed; fixtures are built on first use, under a scratch
    directory removed by :meth:`close`."""

    def __init__(
        self, seed: int, scratch: str | None = None, rocks_share: float = 0.1, jobs: int = 1
    ) -> None:
        self.seed = seed
        self.rocks_share = rocks_share
        #: Worker processes (1: run in this process); each builds its own fixtures.
        self.jobs = jobs
        self.scratch = tempfile.mkdtemp(prefix="cowstate-fuzz-", dir=scratch or scratch_base())
        self._files: FileSuite | None = None
        self._dirs: DirSuite | None = None

    # ------------------------------------------------------------------ files

    @property
    def file_suite(self) -> FileSuite:
        if self._files is None:
            self._files = build_file_fixtures(os.path.join(self.scratch, "files"))
            self._files.rocks_share = self.rocks_share
        return self._files

    def run_file(self, cls: str, k: int) -> CaseResult:
        suite = self.file_suite
        rng = self._rng("files", cls, k)
        fixture = suite.fixtures[k % len(suite.fixtures)]
        mutation = FILE_CLASSES[cls](fixture, rng, suite.canary)
        verdict, where = run_file_case(suite, fixture, mutation, rng)
        description = f"{fixture.name}: {mutation.description}"
        return CaseResult("files", cls, k, f"restore into {where}", description, verdict)

    def run_files(
        self, count: int, classes: Sequence[str] | None = None, progress: Progress | None = None
    ) -> list[CaseResult]:
        chosen = _classes(classes, FILE_CLASSES, "snapshot-file")
        return self._run("files", count, chosen, self.run_file, progress)

    # ------------------------------------------------------------ directories

    @property
    def dir_suite(self) -> DirSuite:
        if self._dirs is None:
            scratch = os.path.join(self.scratch, "dirs")
            fixtures = [build_dir_fixture(scratch, kind) for kind in DIR_KINDS]
            self._dirs = DirSuite(scratch, fixtures, Watch())
        return self._dirs

    def run_dir(self, cls: str, k: int) -> CaseResult:
        suite = self.dir_suite
        rng = self._rng("dirs", cls, k)
        entries = DIR_CLASSES[cls].entries
        entry = entries[k % len(entries)]
        fixtures = [f for f in suite.fixtures if DIR_CLASSES[cls].targets(f.snapshots)]
        fixture = fixtures[(k // len(entries)) % len(fixtures)]
        verdict, description = run_dir_case(suite, fixture, cls, entry, rng)
        return CaseResult("dirs", cls, k, entry, description, verdict)

    def run_dirs(
        self, count: int, classes: Sequence[str] | None = None, progress: Progress | None = None
    ) -> list[CaseResult]:
        chosen = _classes(classes, DIR_CLASSES, "checkpoint-directory")
        return self._run("dirs", count, chosen, self.run_dir, progress)

    # ---------------------------------------------------------------- replays

    def run_case(self, case_id: str) -> CaseResult:
        """Replay ``suite/class/k`` (as a report prints it)."""
        suite, _, rest = case_id.partition("/")
        cls, _, number = rest.rpartition("/")
        known = FILE_CLASSES if suite == "files" else DIR_CLASSES if suite == "dirs" else {}
        if cls not in known or not number.isdigit():
            raise InvalidArgumentError(
                f"expected a case 'files/<class>/<k>' or 'dirs/<class>/<k>', got {case_id!r}"
            )
        if suite == "files":
            return self.run_file(cls, int(number))
        return self.run_dir(cls, int(number))

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> Fuzzer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -------------------------------------------------------- private helpers

    def _rng(self, suite: str, cls: str, k: int) -> random.Random:
        return random.Random(f"{self.seed}/{suite}/{cls}/{k}")

    def _run(
        self,
        suite: str,
        count: int,
        classes: list[str],
        one: Callable[[str, int], CaseResult],
        progress: Progress | None,
    ) -> list[CaseResult]:
        cases = [(suite, classes[i % len(classes)], i // len(classes)) for i in range(count)]
        if self.jobs > 1 and count > 1:
            # Spawned, not forked: RocksDB keeps background threads a fork would lose.
            context = multiprocessing.get_context("spawn")
            pool = context.Pool(
                self.jobs,
                initializer=_start_worker,
                initargs=(self.seed, self.scratch, self.rocks_share),
            )
            done: Iterable[CaseResult] = pool.imap(_work, cases, chunksize=32)
        else:
            pool = None
            done = (one(cls, k) for _suite, cls, k in cases)
        results = []
        started = time.perf_counter()
        step = max(1, count // 20)
        try:
            for result in done:
                results.append(result)
                if progress is not None and (len(results) % step == 0 or len(results) == count):
                    progress(suite, len(results), count, time.perf_counter() - started)
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
        return results


#: The fuzzer of a worker process (``jobs > 1``).
_WORKER: Fuzzer | None = None


def _start_worker(seed: int, scratch: str, rocks_share: float) -> None:
    global _WORKER
    _WORKER = Fuzzer(seed, scratch, rocks_share)


def _work(case: tuple[str, str, int]) -> CaseResult:
    assert _WORKER is not None
    suite, cls, k = case
    return _WORKER.run_file(cls, k) if suite == "files" else _WORKER.run_dir(cls, k)


def _classes(chosen: Sequence[str] | None, known: Mapping[str, object], what: str) -> list[str]:
    if chosen is None:
        return list(known)
    unknown = sorted(set(chosen) - set(known))
    if unknown or not chosen:
        raise InvalidArgumentError(
            f"expected {what} corruption classes of {sorted(known)}, got {list(chosen)!r}"
        )
    return list(chosen)
