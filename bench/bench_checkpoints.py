"""Benchmark: RocksDB checkpoints and savepoints through the checkpoint coordinator --
incremental vs full checkpoint (bytes uploaded, time), native vs canonical
savepoint (time), and restoring each savepoint (time).

Run::

    .venv/bin/python bench/bench_checkpoints.py             # 1,000,000 entries (~2-3 min)
    .venv/bin/python bench/bench_checkpoints.py --quick     # 100,000 entries, 3 rounds (~10 s)
    .venv/bin/python bench/bench_checkpoints.py --entries N --repeats R --root DIR
    .venv/bin/python bench/bench_checkpoints.py --checkpoint-repeats 50   # more checkpoint rounds

Data
====
One ``RocksDBKeyedStateBackend`` over the full key-group range ``[0, 127]`` of
max parallelism 128 (``--max-parallelism``), with the backend's default
options (``rocksdict.Options(raw_mode=True)``: Snappy compression, 64 MiB
write buffer, level compaction, no write-ahead log). One ``ValueState``
(``ValueStateDescriptor("bench_value")``, ``DefaultSerializer`` = value codec for
key, namespace and value) holding ``N`` entries (``--entries``, default
1,000,000; 100,000 with ``--quick``): key ``i`` (an int) for ``i`` in
``range(N)``, namespace ``VOID_NAMESPACE``, value **16 random bytes** (a
``bytes`` object from ``random.Random(--seed).randbytes(16)``: incompressible,
so the SST files hold what the data really takes; 19 bytes encoded, beside
4 to 6 for the keys and 4 for ``VOID_NAMESPACE``; pickled, as before the
value codec, they were 31, 17 and 54). Loaded untimed through the
state's table, ``backend.table("bench_value").put(i, VOID_NAMESPACE, value)``
-- the RocksDB put the ``ValueState`` handle does, without a
``set_current_key`` per entry; a sample is read back through the handle.

"Changing 1% of keys" (``--changed``, default ``N // 100``: 10,000 at 1M)
means: ``changed`` distinct keys drawn at random (fresh keys every time) each
get a new 16-random-byte value, through the same ``table.put``; this is always
untimed.

Where the files go
==================
Everything lives in ONE temporary directory, ``tempfile.mkdtemp(prefix=
"cowstate-bench-ckpt-", dir=--root)`` (default: the system temporary
directory; the run prints which file system it is on), deleted at exit, also
on errors and Ctrl-C::

    local/         local_dir of every RocksDB backend: the live database, its
                   local (hard-linked) checkpoints, restore scratch
    checkpoints/   CheckpointStorage(root=<this>, job_id="bench"): chk-<id>/ and
                   shared/; the restore rows' jobs "restore-<n>" too
    savepoints/    one fresh directory per savepoint

Nothing is fsync'ed (the library does not): every "upload" is a copy into the
page cache through ``FileSystem`` (a temporary name, CRC32 of every chunk, an
atomic rename), and restores read files that are hot in the page cache. The
times are those of the code, not of a disk.

Rows
====
The coordinator is ``CheckpointCoordinator(CheckpointStorage(...), [backend])``
with ``num_retained=1``. Every row is one ``_harness.measure_interleaved``
call: 1 warm-up round (``--warmup``, discarded), then 5 rounds (``--repeats``;
3 with ``--quick``) -- 20 for the checkpoint row (``--checkpoint-repeats``; 10
with ``--quick``), which is cheap and whose upload varies with RocksDB's
background compactions (see row 1) -- each round running every column once,
in column order; the cell is the median of the rounds, and the targets use the
median of the per-round ratios.

1. Checkpoints -- columns ``full`` and ``incremental``, run in that order in
   each round, so every incremental checkpoint builds on the full checkpoint
   of its own round and the two are paired. Each run first changes 1% of the
   keys (untimed), then times::

       checkpoint_id = coordinator.trigger_checkpoint()
       coordinator.complete_checkpoint(checkpoint_id)

   ``full``: with ``coordinator.force_full = True`` (a checkpoint with no base:
   every file uploaded); ``incremental``: a regular checkpoint, whose base is
   the full checkpoint just confirmed (checked). The timed section holds the
   synchronous part (RocksDB flushes the memtable holding the changes --
   and whatever else it held -- and hard-links a local checkpoint), the writer
   thread's upload (every file not reused is copied into ``shared/`` (SSTs) or
   ``chk-<id>/`` (MANIFEST, CURRENT, OPTIONS, ...)), the wait for it,
   ``_metadata``, registering the shared files, subsuming the previous
   checkpoint (deleting its exclusive files and the shared files nobody uses
   any more) and the completion notice to the backend.

   - ``checkpoint time (trigger -> complete)`` [ms]: the section above;
   - ``checkpoint sync part`` [ms]: ``trigger_checkpoint()`` alone;
   - ``bytes uploaded`` [MB]: ``handle.checkpointed_size`` (bytes this
     checkpoint copied); ``checkpoint size`` [MB]: ``handle.full_size`` (bytes
     of every file it references, reused ones included);
   - ``SST files uploaded`` / ``SST files referenced``: counts of ``*.sst``
     handles.

   Every checkpoint's flush adds a small level-0 SST (the changed keys), so
   RocksDB's background compaction (4 level-0 files trigger it) regularly
   rewrites files -- sometimes the big ones -- between a full checkpoint and
   the incremental one after it; that incremental checkpoint then uploads
   the compaction's output too (more than one SST uploaded). This is how
   RocksDB incremental checkpoints behave (in Flink as well), not noise, so
   besides the medians the run prints, per round, the bytes the incremental
   checkpoint uploaded, and the minimum, mean (amortized) and maximum of
   ``incremental / full``, with the number of rounds that uploaded a
   compaction's output.

2. Savepoints -- columns ``native`` and ``canonical``; timed::

       coordinator.trigger_savepoint(fresh_directory, format)

   which returns once every file and ``_metadata`` are written. ``native``:
   RocksDB's local checkpoint, every file copied into the savepoint directory;
   ``canonical``: the local checkpoint opened read-only, every entry read in
   key order, and ONE canonical snapshot file written (raw key, namespace and
   value bytes, framed per key group with CRC32s). The directory is deleted
   untimed afterwards. ``savepoint size`` [MB]: ``full_size``.

3. Restores -- columns ``native`` (RocksDB from the native savepoint),
   ``canonical`` (RocksDB from the canonical savepoint), ``heap <-
   canonical`` (a ``HeapKeyedStateBackend``, copy-on-write tables, from the
   same canonical savepoint) and ``heap, no E3`` (the same heap restore with
   the key-group check of ``cowstate.snapshot.checks`` switched off --
   ``cowstate.snapshot.restore.check_key_groups`` replaced by a no-op for that
   run; informational: it runs right after the checked one, whose memory the
   allocator then reuses, so the difference of the two columns is not a fair
   measure of the check). The ``heap`` run also times every call of
   ``check_key_groups`` inside it (one per state and key group, a
   ``perf_counter_ns`` pair around each): rows ``key-group check, inside the
   restore`` [ms] and its ``share of the restore`` [%]. One savepoint of each
   format is taken (untimed) right after row 2, of the same state. Untimed
   before: a fresh backend (RocksDB ones in ``local/``) with the value state
   registered (``get_state``), and a ``CheckpointStorage`` for a new job
   ``restore-<n>``. Timed::

       CheckpointCoordinator.restore(storage, [backend], savepoint, RestoreMode.NO_CLAIM)

   (read ``_metadata``; ``backend.restore_from``: native -- copy every file
   into a scratch directory checking size and CRC32, open the database;
   canonical into RocksDB -- read the file, check it, decode and check every
   entry (E1-E4), and write every raw entry of every key group through
   ``WriteBatch``es into a fresh column family; canonical into the heap --
   parse and deserialize every key and value in one pass (each distinct
   namespace decoded once), check every entry, and put it into the key
   group's map of a new table sized for it; then swap, and write ``_counter``
   and ``_restore``).
   Untimed after: the backend holds ``N`` entries and 1,000 random keys read
   through the ``ValueState`` handle have their expected values; the backend
   is closed and the job directory deleted.

Targets, printed MET / NOT MET (from the issue):

- the incremental checkpoint uploads at most 10% of the full checkpoint's
  bytes (``incremental / full`` of ``bytes uploaded``, per round);
- the native savepoint is at least 3x faster than the canonical one
  (``canonical / native`` of the savepoint time);
- restoring the native savepoint is at least 3x faster than restoring the
  canonical one (RocksDB both; ``canonical / native`` of the restore time);
- (issue 15, with the heap column) the heap restore from the canonical
  savepoint takes at most 2 s per 1M entries (the limit scales with
  ``--entries``: 0.2 s with ``--quick``), every check on; and the key-group
  check costs at most 10% of it (the median over rounds of the time inside
  ``check_key_groups`` over the restore's time; the per-round shares are
  printed too).

The process pins itself to one CPU (``--no-pin`` to disable) before anything
runs, as ``bench_table_backend.py`` does; RocksDB's background threads,
started later, inherit the pinning. A full ``gc.collect()`` precedes every run
(untimed); the collector stays on. MB = 10**6 bytes.

Results are printed and written to ``bench/results/checkpoints.json``
(``checkpoints_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import functools
import itertools
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from _harness import (  # bench/ is on sys.path when this file runs as a script
    Competitor,
    Result,
    Sample,
    Target,
    check_targets,
    format_table,
    format_targets,
    machine_info,
    measure_interleaved,
    paired_ratio,
    write_json,
)

from cowstate.checkpoint.coordinator import CheckpointCoordinator
from cowstate.checkpoint.handles import KeyedStateHandle, RestoreMode
from cowstate.checkpoint.storage import CheckpointStorage
from cowstate.descriptors import ValueState, ValueStateDescriptor
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import KeyGroupRange
from cowstate.keyed_backend import AbstractKeyedStateBackend
from cowstate.keyed_state import VOID_NAMESPACE
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.snapshot import restore as snapshot_restore

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "checkpoints.json"
STATE_NAME = "bench_value"
DESCRIPTOR: ValueStateDescriptor[Any] = ValueStateDescriptor(STATE_NAME)
VALUE_BYTES = 16
VERIFY_KEYS = 1_000
JOB_ID = "bench"

FULL = "full"
INCREMENTAL = "incremental"
CHECKPOINT_COMPETITORS: tuple[Competitor, ...] = (
    Competitor(FULL, "full"),
    Competitor(INCREMENTAL, "incremental"),
)
NATIVE = "native"
CANONICAL = "canonical"
HEAP = "heap"
SAVEPOINT_COMPETITORS: tuple[Competitor, ...] = (
    Competitor(NATIVE, "native"),
    Competitor(CANONICAL, "canonical"),
)
HEAP_UNCHECKED = "heap-unchecked"
RESTORE_COMPETITORS: tuple[Competitor, ...] = (
    Competitor(NATIVE, "native"),
    Competitor(CANONICAL, "canonical"),
    Competitor(HEAP, "heap <- canon."),
    Competitor(HEAP_UNCHECKED, "heap, no E3"),
)
#: The heap restore of 1M entries from a canonical savepoint (issue 15), per entry.
HEAP_RESTORE_MS_PER_MILLION = 2000.0
#: The key-group check (E3) may cost at most this share of the heap restore.
KEY_GROUP_CHECK_SHARE = 0.10


def heap_targets(entries: int) -> tuple[Target, ...]:
    """The heap restore targets of issue 15 (the time limit scales with ``entries``)."""
    limit = HEAP_RESTORE_MS_PER_MILLION * entries / 1_000_000
    return (
        Target(
            f"heap restore from a canonical savepoint <= {limit / 1000:g} s "
            f"({HEAP_RESTORE_MS_PER_MILLION / 1000:g} s per 1M entries)",
            "restore_ms",
            HEAP,
            None,
            "<=",
            limit,
            "CheckpointCoordinator.restore(NO_CLAIM) time into a fresh HeapKeyedStateBackend "
            "(copy-on-write tables), every check on",
        ),
        Target(
            f"the key-group check costs <= {KEY_GROUP_CHECK_SHARE:.0%} of the heap restore",
            "restore_check_pct",
            HEAP,
            None,
            "<=",
            100 * KEY_GROUP_CHECK_SHARE,
            "time spent in check_key_groups during the heap restore over the restore's time, "
            "per round, median (the 'heap, no E3' column is the same restore without it)",
        ),
    )


TARGETS: tuple[Target, ...] = (
    Target(
        "incremental checkpoint uploads <= 10% of the full checkpoint's bytes",
        "ckpt_uploaded",
        INCREMENTAL,
        FULL,
        "<=",
        0.10,
        "handle.checkpointed_size after changing 1% of the keys, incremental over full "
        "(same round)",
    ),
    Target(
        "native savepoint >= 3x faster than canonical",
        "savepoint_ms",
        CANONICAL,
        NATIVE,
        ">=",
        3.0,
        "trigger_savepoint time, canonical over native",
    ),
    Target(
        "native restore >= 3x faster than canonical restore",
        "restore_ms",
        CANONICAL,
        NATIVE,
        ">=",
        3.0,
        "CheckpointCoordinator.restore(NO_CLAIM) time into a fresh RocksDB backend, "
        "canonical savepoint over native savepoint",
    ),
)

SavepointFormat: TypeAlias = Literal["native", "canonical"]
AnyBackend: TypeAlias = HeapKeyedStateBackend | RocksDBKeyedStateBackend

clock = time.perf_counter_ns


@dataclass(frozen=True)
class Config:
    entries: int
    changed: int
    repeats: int
    checkpoint_repeats: int
    warmup: int
    max_parallelism: int
    seed: int
    quick: bool
    pin: bool
    heap: bool
    root: str | None
    output: str


@dataclass
class Recorder:
    """Side values of the runs of one row, per competitor, in call order
    (warm-up calls included; :meth:`series` drops them)."""

    warmup: int
    values: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def add(self, competitor: str, **values: float) -> None:
        self.values.setdefault(competitor, []).append(values)

    def series(self, competitor: str, name: str) -> list[float]:
        return [v[name] for v in self.values[competitor][self.warmup :]]

    def sample(self, competitor: str, name: str, scale: float = 1.0) -> Sample:
        return Sample(tuple(v * scale for v in self.series(competitor, name)))


@dataclass
class Job:
    """The benchmarked backend, its state, the coordinator and the expected contents."""

    cfg: Config
    workdir: Path
    backend: RocksDBKeyedStateBackend
    state: ValueState
    coordinator: CheckpointCoordinator
    values: list[bytes]
    rng: random.Random
    put: Callable[..., None]
    savepoint_ids: Iterator[int] = field(default_factory=itertools.count)
    restore_ids: Iterator[int] = field(default_factory=itertools.count)
    last_full: int = -1

    @property
    def local_dir(self) -> Path:
        return self.workdir / "local"

    @property
    def checkpoints_dir(self) -> Path:
        return self.workdir / "checkpoints"

    @property
    def savepoints_dir(self) -> Path:
        return self.workdir / "savepoints"

    def change_keys(self) -> None:
        """Give ``changed`` random distinct keys a new value (untimed by callers)."""
        rng, put, values = self.rng, self.put, self.values
        for k in rng.sample(range(self.cfg.entries), self.cfg.changed):
            value = rng.randbytes(VALUE_BYTES)
            put(k, VOID_NAMESPACE, value)
            values[k] = value


def pin_to_one_cpu() -> int | None:
    """Restrict this process (and the threads it starts later) to its lowest
    allowed CPU; the CPU, or None where affinity cannot be set."""
    if not hasattr(os, "sched_getaffinity") or not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def mount_of(path: Path) -> dict[str, str]:
    """The mount point, device and file system type holding ``path`` (Linux)."""
    real = os.path.realpath(path)
    best = {"mount_point": "?", "device": "?", "fs_type": "?"}
    with contextlib.suppress(OSError), open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            device, mount_point, fs_type = parts[0], parts[1], parts[2]
            inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
            if inside and (
                best["mount_point"] == "?" or len(mount_point) >= len(best["mount_point"])
            ):
                best = {"mount_point": mount_point, "device": device, "fs_type": fs_type}
    return best


def mb(ns_or_bytes: float) -> float:
    return ns_or_bytes / 1e6


def sst_counts(handle: KeyedStateHandle, base_paths: set[str]) -> tuple[int, int]:
    """``(SST files uploaded, SST files referenced)`` of a RocksDB handle."""
    ssts = [f for f in handle.files if (f.local_name or "").endswith(".sst")]
    return sum(1 for f in ssts if f.path not in base_paths), len(ssts)


def verify(backend: AbstractKeyedStateBackend, state: ValueState, job: Job, what: str) -> None:
    """The backend holds exactly ``N`` entries, and a sample has the expected values."""
    count = backend.num_state_entries()
    if count != job.cfg.entries:
        raise AssertionError(f"{what}: expected {job.cfg.entries} entries, got {count}")
    rng = random.Random(job.cfg.seed + 1)
    for k in rng.sample(range(job.cfg.entries), min(VERIFY_KEYS, job.cfg.entries)):
        backend.set_current_key(k)
        got = state.value()
        if got != job.values[k]:
            raise AssertionError(f"{what}: key {k} holds {got!r}, expected {job.values[k]!r}")


# --------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------


def build_job(cfg: Config, workdir: Path, stack: contextlib.ExitStack) -> Job:
    for sub in ("local", "checkpoints", "savepoints"):
        (workdir / sub).mkdir()
    mp = cfg.max_parallelism
    backend = stack.enter_context(
        RocksDBKeyedStateBackend(KeyGroupRange(0, mp - 1), mp, local_dir=workdir / "local")
    )
    state = backend.get_state(DESCRIPTOR)
    rng = random.Random(cfg.seed)
    values = [rng.randbytes(VALUE_BYTES) for _ in range(cfg.entries)]
    put = backend.table(STATE_NAME).put
    t = time.perf_counter()
    for k, value in enumerate(values):
        put(k, VOID_NAMESPACE, value)
    log(f"  loaded {cfg.entries:,} entries in {time.perf_counter() - t:.1f}s")
    storage = CheckpointStorage(str(workdir / "checkpoints"), JOB_ID)
    coordinator = CheckpointCoordinator(storage, [backend], num_retained=1)
    stack.callback(coordinator.close)
    job = Job(cfg, workdir, backend, state, coordinator, values, rng, put)
    t = time.perf_counter()
    verify(backend, state, job, "the loaded backend")
    log(f"  verified in {time.perf_counter() - t:.1f}s")
    return job


# --------------------------------------------------------------------------
# Row 1: full vs incremental checkpoints
# --------------------------------------------------------------------------


def run_checkpoint(job: Job, full: bool, rec: Recorder, competitor: str) -> int:
    job.change_keys()
    coordinator, backend = job.coordinator, job.backend
    base_id = backend.last_completed_checkpoint_id
    base_paths = {f.path for f in backend.incremental_base.values()}
    if not full and (job.last_full < 0 or base_id != job.last_full):
        raise AssertionError(
            f"incremental checkpoint: expected the base to be the full "
            f"checkpoint {job.last_full}, the backend has {base_id}"
        )
    coordinator.force_full = full
    t0 = clock()
    checkpoint_id = coordinator.trigger_checkpoint()
    t1 = clock()
    completed = coordinator.complete_checkpoint(checkpoint_id)
    t2 = clock()
    handle = completed.metadata.subtasks[0]
    uploaded_ssts, ssts = sst_counts(handle, set() if full else base_paths)
    if full:
        if handle.checkpointed_size != handle.full_size:
            raise AssertionError(f"full checkpoint {checkpoint_id} reused files: {handle}")
        job.last_full = checkpoint_id
    rec.add(
        competitor,
        sync=t1 - t0,
        uploaded=handle.checkpointed_size,
        full_size=handle.full_size,
        uploaded_ssts=uploaded_ssts,
        ssts=ssts,
    )
    return t2 - t0


def phase_checkpoints(job: Job, notes: dict[str, Any]) -> list[Result]:
    cfg = job.cfg
    rec = Recorder(cfg.warmup)
    samples = measure_interleaved(
        {
            FULL: functools.partial(run_checkpoint, job, True, rec, FULL),
            INCREMENTAL: functools.partial(run_checkpoint, job, False, rec, INCREMENTAL),
        },
        warmup=cfg.warmup,
        repeats=cfg.checkpoint_repeats,
    )
    r_ms = Result("ckpt_ms", "checkpoint time (trigger -> complete)", "ms", paired=True)
    r_sync = Result("ckpt_sync_ms", "checkpoint sync part (trigger)", "ms", paired=True)
    r_up = Result("ckpt_uploaded", "bytes uploaded (checkpointed_size)", "MB", paired=True)
    r_full = Result("ckpt_full_size", "checkpoint size (full_size)", "MB", paired=True)
    r_up_n = Result("ckpt_uploaded_ssts", "SST files uploaded", "files", paired=True)
    r_n = Result("ckpt_ssts", "SST files referenced", "files", paired=True)
    for k, s in samples.items():
        r_ms.set(k, s.scaled(1e-6))
        r_sync.set(k, rec.sample(k, "sync", 1e-6))
        r_up.set(k, rec.sample(k, "uploaded", 1e-6))
        r_full.set(k, rec.sample(k, "full_size", 1e-6))
        r_up_n.set(k, rec.sample(k, "uploaded_ssts"))
        r_n.set(k, rec.sample(k, "ssts"))
    notes["checkpoint_rounds"] = {
        k: {
            name: rec.series(k, name) for name in ("uploaded", "full_size", "uploaded_ssts", "ssts")
        }
        for k in samples
    }
    ratios = [
        i / f
        for i, f in zip(
            rec.series(INCREMENTAL, "uploaded"), rec.series(FULL, "uploaded"), strict=True
        )
    ]
    notes["incremental_over_full_bytes"] = {
        "per_round": ratios,
        "min": min(ratios),
        "median": statistics.median(ratios),
        "mean": statistics.fmean(ratios),
        "max": max(ratios),
        "rounds_uploading_compaction_output": sum(
            1 for n in rec.series(INCREMENTAL, "uploaded_ssts") if n > 1
        ),
        "rounds": len(ratios),
    }
    return [r_ms, r_sync, r_up, r_full, r_up_n, r_n]


# --------------------------------------------------------------------------
# Row 2: native vs canonical savepoints
# --------------------------------------------------------------------------


def take_savepoint(job: Job, fmt: SavepointFormat) -> tuple[Path, int, int]:
    """A savepoint of format ``fmt`` into a fresh directory: (directory, elapsed ns, bytes)."""
    directory = job.savepoints_dir / f"{fmt}-{next(job.savepoint_ids)}"
    t0 = clock()
    metadata = job.coordinator.trigger_savepoint(str(directory), fmt)
    elapsed = clock() - t0
    return directory, elapsed, sum(h.full_size for h in metadata.subtasks)


def run_savepoint(job: Job, fmt: SavepointFormat, rec: Recorder) -> int:
    directory, elapsed, size = take_savepoint(job, fmt)
    files = sum(1 for p in directory.rglob("*") if p.is_file())
    shutil.rmtree(directory)
    rec.add(fmt, size=size, files=files)
    return elapsed


def phase_savepoints(job: Job, notes: dict[str, Any]) -> list[Result]:
    cfg = job.cfg
    rec = Recorder(cfg.warmup)
    formats: tuple[SavepointFormat, ...] = ("native", "canonical")
    samples = measure_interleaved(
        {fmt: functools.partial(run_savepoint, job, fmt, rec) for fmt in formats},
        warmup=cfg.warmup,
        repeats=cfg.repeats,
    )
    r_ms = Result("savepoint_ms", "savepoint time (trigger_savepoint)", "ms", paired=True)
    r_size = Result("savepoint_size", "savepoint size (full_size)", "MB", paired=True)
    r_rate = Result("savepoint_meps", "savepoint entries", "M/s", paired=True)
    for k, s in samples.items():
        r_ms.set(k, s.scaled(1e-6))
        r_size.set(k, rec.sample(k, "size", 1e-6))
        r_rate.set(k, Sample(tuple(cfg.entries / (ns / 1e9) / 1e6 for ns in s.values)))
    notes["savepoint_files"] = {k: statistics.median(rec.series(k, "files")) for k in samples}
    return [r_ms, r_size, r_rate]


# --------------------------------------------------------------------------
# Row 3: restores
# --------------------------------------------------------------------------


def run_restore(job: Job, kind: str, source: Path, rec: Recorder | None = None) -> int:
    cfg = job.cfg
    mp = cfg.max_parallelism
    key_groups = KeyGroupRange(0, mp - 1)
    backend: AnyBackend
    if kind in (HEAP, HEAP_UNCHECKED):
        backend = HeapKeyedStateBackend(key_groups, mp)
    else:
        backend = RocksDBKeyedStateBackend(key_groups, mp, local_dir=job.local_dir)
    job_id = f"restore-{next(job.restore_ids)}"
    storage = CheckpointStorage(str(job.checkpoints_dir), job_id)
    try:
        state = backend.get_state(DESCRIPTOR)
        with key_group_check(kind != HEAP_UNCHECKED) as spent:
            t0 = clock()
            coordinator = CheckpointCoordinator.restore(
                storage, [backend], str(source), RestoreMode.NO_CLAIM
            )
            elapsed = clock() - t0
        if rec is not None:
            rec.add(kind, check=spent[0], share=spent[0] / elapsed)
        verify(backend, state, job, f"{kind} restore of {source.name}")
        coordinator.close()
    finally:
        backend.close()
        shutil.rmtree(job.checkpoints_dir / job_id, ignore_errors=True)
    return elapsed


@contextlib.contextmanager
def key_group_check(on: bool) -> Iterator[list[int]]:
    """The key-group check of a restore (E3 of ``cowstate.snapshot.checks``,
    called once per state and key group): timed, its nanoseconds summed into
    the yielded list's one item; or (``on`` False) replaced by a no-op."""
    checked = snapshot_restore.check_key_groups
    spent = [0]

    def timed(*args: Any, **kwargs: Any) -> None:
        t0 = clock()
        try:
            checked(*args, **kwargs)
        finally:
            spent[0] += clock() - t0

    snapshot_restore.check_key_groups = timed if on else (lambda *args, **kwargs: None)
    try:
        yield spent
    finally:
        snapshot_restore.check_key_groups = checked


def phase_restores(job: Job, notes: dict[str, Any]) -> list[Result]:
    cfg = job.cfg
    native_dir, _, native_size = take_savepoint(job, "native")
    canonical_dir, _, canonical_size = take_savepoint(job, "canonical")
    notes["restore_sources"] = {NATIVE: native_size, CANONICAL: canonical_size}
    runs: dict[str, Callable[[], int]] = {
        NATIVE: functools.partial(run_restore, job, NATIVE, native_dir),
        CANONICAL: functools.partial(run_restore, job, CANONICAL, canonical_dir),
    }
    rec = Recorder(cfg.warmup)
    if cfg.heap:
        runs[HEAP] = functools.partial(run_restore, job, HEAP, canonical_dir, rec)
        runs[HEAP_UNCHECKED] = functools.partial(run_restore, job, HEAP_UNCHECKED, canonical_dir)
    samples = measure_interleaved(runs, warmup=cfg.warmup, repeats=cfg.repeats)
    r_ms = Result("restore_ms", "restore time (Coordinator.restore)", "ms", paired=True)
    r_rate = Result("restore_meps", "restored entries", "M/s", paired=True)
    r_check = Result("restore_check_ms", "key-group check, inside the restore", "ms")
    r_share = Result("restore_check_pct", "key-group check share of the restore", "%")
    for k in (NATIVE, CANONICAL, HEAP_UNCHECKED):
        r_check.missing[k] = r_share.missing[k] = "-"
    if not cfg.heap:
        for k in (HEAP, HEAP_UNCHECKED):
            r_ms.missing[k] = r_rate.missing[k] = "skipped"
        r_check.missing[HEAP] = r_share.missing[HEAP] = "skipped"
    for k, s in samples.items():
        r_ms.set(k, s.scaled(1e-6))
        r_rate.set(k, Sample(tuple(cfg.entries / (ns / 1e9) / 1e6 for ns in s.values)))
    if cfg.heap:
        r_check.set(HEAP, rec.sample(HEAP, "check", 1e-6))
        r_share.set(HEAP, rec.sample(HEAP, "share", 100.0))
    shutil.rmtree(native_dir)
    shutil.rmtree(canonical_dir)
    return [r_ms, r_rate, r_check, r_share]


# --------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------


def ratio_line(label: str, row: Result, num: str, den: str, *, percent: bool = False) -> str:
    n, d = row.samples.get(num), row.samples.get(den)
    if n is None or d is None:
        return f"  {label}: n/a"
    value = paired_ratio(n, d)
    of_medians = n.median / d.median if d.median else float("nan")
    if value is None:
        return f"  {label}: n/a"
    shown = f"{value * 100:.2f} %" if percent else f"{value:.3g}x"
    other = f"{of_medians * 100:.2f} %" if percent else f"{of_medians:.3g}x"
    return f"  {label} = {shown}  (median of per-round ratios; ratio of medians {other})"


def run(cfg: Config) -> dict[str, Any]:
    started = time.perf_counter()
    pinned = pin_to_one_cpu() if cfg.pin else None
    if cfg.pin:
        log("pinned to CPU " + ("(not supported here)" if pinned is None else str(pinned)))
    workdir = Path(tempfile.mkdtemp(prefix="cowstate-bench-ckpt-", dir=cfg.root)).absolute()
    mount = mount_of(workdir)
    log(
        f"working directory {workdir} (on {mount['mount_point']}: {mount['device']}, "
        f"{mount['fs_type']})"
    )
    notes: dict[str, Any] = {
        "pinned_cpu": pinned,
        "workdir": str(workdir),
        "mount": mount,
        "value": f"{VALUE_BYTES} random bytes (bytes, value codec)",
    }
    try:
        with contextlib.ExitStack() as stack:
            log(f"building: {cfg.entries:,} entries in a RocksDB ValueState")
            job = build_job(cfg, workdir, stack)
            log(f"checkpoints: full vs incremental after changing {cfg.changed:,} keys")
            ckpt_rows = phase_checkpoints(job, notes)
            log("savepoints: native vs canonical")
            sp_rows = phase_savepoints(job, notes)
            log(
                "restores: native vs canonical savepoint (RocksDB)"
                + (", canonical into the heap backend" if cfg.heap else "")
            )
            restore_rows = phase_restores(job, notes)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    left = workdir.exists()
    wall = time.perf_counter() - started
    results = [*ckpt_rows, *sp_rows, *restore_rows]
    targets = TARGETS + (heap_targets(cfg.entries) if cfg.heap else ())
    outcomes = check_targets(targets, results)
    by_metric = {r.metric: r for r in results}

    print()
    print(
        f"RocksDB checkpoint / savepoint benchmark: {cfg.entries:,} entries (int keys, "
        f"{VALUE_BYTES}-byte values) in one ValueState, max parallelism "
        f"{cfg.max_parallelism} (key groups 0-{cfg.max_parallelism - 1}); "
        f"{cfg.changed:,} keys changed before each checkpoint; median of {cfg.repeats} "
        f"rounds ({cfg.checkpoint_repeats} for checkpoints) after {cfg.warmup} warm-up"
    )
    print(
        f"Python {sys.version.split()[0]}; "
        + ("not pinned" if pinned is None else f"pinned to CPU {pinned}")
        + f"; files in {workdir} on {mount['mount_point']} ({mount['device']}, "
        f"{mount['fs_type']}), page cache, no fsync" + ("; NOT deleted" if left else "; deleted")
    )
    print()
    print(
        "Checkpoints (each round: change keys, full checkpoint; change keys, incremental "
        "on top of it)"
    )
    print(format_table(ckpt_rows, CHECKPOINT_COMPETITORS, col_width=16))
    rounds = notes["checkpoint_rounds"][INCREMENTAL]
    spread = notes["incremental_over_full_bytes"]
    print(
        "incremental, MB uploaded per round: "
        + ", ".join(f"{v / 1e6:.2f}" for v in rounds["uploaded"])
    )
    print(
        "incremental, SSTs uploaded per round: "
        + ", ".join(f"{v:g}" for v in rounds["uploaded_ssts"])
    )
    print(
        f"incremental/full bytes per round: min {spread['min']:.2%}, median "
        f"{spread['median']:.2%}, mean (amortized) {spread['mean']:.2%}, max "
        f"{spread['max']:.2%}; {spread['rounds_uploading_compaction_output']} of "
        f"{spread['rounds']} incremental checkpoints uploaded a compaction's output "
        "(> 1 SST)"
    )
    print()
    print("Savepoints (trigger_savepoint into a fresh directory)")
    print(format_table(sp_rows, SAVEPOINT_COMPETITORS, col_width=16))
    print()
    print("Restores (CheckpointCoordinator.restore, NO_CLAIM, into a fresh backend)")
    print(format_table(restore_rows, RESTORE_COMPETITORS, col_width=16))
    print()
    print("Ratios")
    print(
        ratio_line(
            "checkpoint bytes uploaded: incremental/full",
            by_metric["ckpt_uploaded"],
            INCREMENTAL,
            FULL,
            percent=True,
        )
    )
    print(ratio_line("checkpoint time: full/incremental", by_metric["ckpt_ms"], FULL, INCREMENTAL))
    print(
        ratio_line("savepoint time: canonical/native", by_metric["savepoint_ms"], CANONICAL, NATIVE)
    )
    print(ratio_line("restore time: canonical/native", by_metric["restore_ms"], CANONICAL, NATIVE))
    if cfg.heap:
        print(
            ratio_line(
                "restore time: heap <- canonical / RocksDB <- canonical",
                by_metric["restore_ms"],
                HEAP,
                CANONICAL,
            )
        )
        print(
            ratio_line(
                "restore time: heap <- canonical / RocksDB <- native",
                by_metric["restore_ms"],
                HEAP,
                NATIVE,
            )
        )
        print(
            ratio_line(
                "restore time: heap with / without the key-group check",
                by_metric["restore_ms"],
                HEAP,
                HEAP_UNCHECKED,
            )
        )
        shares = by_metric["restore_check_pct"].samples.get(HEAP)
        if shares is not None:
            print(
                "  key-group check share of the heap restore, timed inside it: median "
                f"{shares.median:.2f} % (per round: "
                + ", ".join(f"{v:.2f} %" for v in shares.values)
                + ")"
            )
    print()
    print("TARGETS")
    print(format_targets(outcomes))
    print()
    print(f"wall time {wall:.1f}s")

    return {
        "benchmark": "checkpoints",
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "wall_time_s": wall,
        "config": asdict(cfg),
        "machine": machine_info(),
        "notes": notes,
        "results": [r.to_json() for r in results],
        "targets": [o.to_json() for o in outcomes],
    }


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        description="Benchmark RocksDB checkpoints (incremental vs full), savepoints and "
        "restores (native vs canonical) through the checkpoint coordinator."
    )
    p.add_argument("--entries", type=int, default=1_000_000, help="entries (default 1,000,000)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 100,000 entries, 3 rounds (10 for checkpoints)",
    )
    p.add_argument(
        "--changed",
        type=int,
        default=None,
        help="keys changed before each checkpoint (default entries / 100)",
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="timed rounds per row (default 5; 3 with --quick)"
    )
    p.add_argument(
        "--checkpoint-repeats",
        type=int,
        default=None,
        help="timed rounds of the checkpoint row (default 20; 10 with --quick)",
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--max-parallelism",
        type=int,
        default=128,
        help="max parallelism; the backend holds all its key groups (default 128)",
    )
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument(
        "--root",
        default=None,
        help="directory to create the temporary working directory in (default: "
        "the system temporary directory)",
    )
    p.add_argument(
        "--no-pin", dest="pin", action="store_false", help="do not pin the process to one CPU"
    )
    p.add_argument(
        "--no-heap",
        dest="heap",
        action="store_false",
        help="skip the heap backend's canonical restore column",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"JSON file (default {RESULTS_PATH.name}; "
        f"{RESULTS_PATH.stem}_quick.json with --quick)",
    )
    a = p.parse_args(argv)
    entries = 100_000 if a.quick else a.entries
    if entries < 100:
        p.error(f"--entries must be at least 100, got {entries}")
    changed = a.changed if a.changed is not None else max(1, entries // 100)
    if not 0 < changed <= entries:
        p.error(f"--changed must be in 1..entries, got {changed}")
    repeats = a.repeats if a.repeats is not None else (3 if a.quick else 5)
    checkpoint_repeats = (
        a.checkpoint_repeats if a.checkpoint_repeats is not None else (10 if a.quick else 20)
    )
    if repeats < 1 or checkpoint_repeats < 1 or a.warmup < 0:
        p.error("--repeats and --checkpoint-repeats must be >= 1 and --warmup >= 0")
    if a.root is not None and not os.path.isdir(a.root):
        p.error(f"--root must be an existing directory, got {a.root!r}")
    output = (
        a.output
        if a.output is not None
        else (
            RESULTS_PATH.with_name(f"{RESULTS_PATH.stem}_quick.json") if a.quick else RESULTS_PATH
        )
    )
    return Config(
        entries=entries,
        changed=changed,
        repeats=repeats,
        checkpoint_repeats=checkpoint_repeats,
        warmup=a.warmup,
        max_parallelism=a.max_parallelism,
        seed=a.seed,
        quick=a.quick,
        pin=a.pin,
        heap=a.heap,
        root=a.root,
        output=str(output),
    )


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    payload = run(cfg)
    write_json(Path(cfg.output), payload)
    print(f"results written to {cfg.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
