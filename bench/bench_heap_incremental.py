"""Benchmark: heap incremental checkpoints (issue 29) against full ones and
beside the RocksDB backend's incremental checkpoints, through the checkpoint
coordinator, in one process.

Run::

    .venv/bin/python bench/bench_heap_incremental.py                      # 1,000,000 entries, C map
    .venv/bin/python bench/bench_heap_incremental.py --quick              # 100,000 entries
    .venv/bin/python bench/bench_heap_incremental.py --entries 10000000   # the issue's 10M
    .venv/bin/python bench/bench_heap_incremental.py --map pure --deltas 5 --no-rocksdb

Data
====
One ``HeapKeyedStateBackend`` over key groups ``[0, 127]`` of max parallelism
128 with incremental checkpoints (``IncrementalOptions(max_deltas=--deltas,
max_delta_ratio=10.0)``), its tables over the map ``--map`` chooses: ``c``
(the default: ``CopyOnWriteStateTable`` as it is, the C map, whose snapshots
the C writer walks) or ``pure`` (the pure map, ``state_map.CopyOnWriteStateMap``;
its snapshots go through the writer's Python path). One ``ValueState`` of
``N`` int keys ``0..N-1`` mapped to ints (default serializers), loaded
untimed through the table. A ``CheckpointCoordinator`` (``num_retained=2``)
over a ``CheckpointStorage`` in one temporary directory, deleted at exit;
nothing is fsync'ed (the library does not), so a write is a copy into the
page cache and a restore reads hot files.

A *round* changes 1% of the live keys (``N // 100``), untimed: half get a new
value, a quarter are new keys (never used before), a quarter are removed;
the keys are drawn at random (``--seed``) among the live ones. The RocksDB
side runs the same rounds (the same seed) on a ``RocksDBKeyedStateBackend``
(default options) with the same state, after the heap side is closed.

A map that does not track changes makes every checkpoint full (I2 of
``cowstate.heap_incremental``): the bench checks every delta's handle and
stops with a message rather than print full checkpoints as deltas.

Rows (what each times)
======================
A checkpoint is ``trigger_checkpoint()`` (the *sync part*: the snapshot of
every table, for a delta also the maps' removals) then ``acknowledge`` and
``complete_checkpoint``. Its *write time* is its **asynchronous part**: wall
time (``perf_counter_ns``) from the backend's ``snapshot_to`` returning to
the writer thread finishing the future (a done-callback); ``write CPU`` is
the process's CPU time (``process_time_ns``) over the same interval -- the
owner thread waits meanwhile, so it is the writer's (and, for RocksDB, its
background threads'). Bytes are ``handle.checkpointed_size`` (what this
checkpoint wrote).

1. ``write`` rounds: 1 warm-up round, then ``--repeats`` (default 5; 3 with
   ``--quick``); each round takes a full checkpoint (``force_full``), applies
   a round of changes, and takes a delta against that full one (checked: the
   handle's chain is the full file plus the delta's two; for RocksDB, the
   incremental checkpoint after it). A full ``gc.collect()`` before each
   checkpoint, untimed. Rows: bytes [MB], write (async part) [ms], write CPU
   [ms], sync part [ms]; columns ``full`` and ``delta`` (heap), ``RocksDB
   full`` and ``RocksDB incr.``.
2. ``restore``: a full checkpoint, then ``--deltas`` rounds each followed by
   a delta (its chain: the base and ``--deltas`` deltas), then a full
   checkpoint of the same contents (``force_full``). Timed (wall), 1 warm-up
   then ``--repeats`` rounds, the two interleaved::

       CheckpointCoordinator.restore(storage of a new job, [fresh backend], chk-<id>, NO_CLAIM)

   into a fresh backend of the same kind with the state registered
   (untimed), checked afterwards to hold the live keys' count. The
   ``delta`` column restores the chain, ``full`` the full checkpoint;
   RocksDB's columns: its incremental checkpoint after the same ``--deltas``
   rounds, and a full one.
3. ``owner updates`` [k/s]: the owner (main thread) updating keys
   (``set_current_key``, ``value()``, ``update()``, batches of 128) while a
   delta's asynchronous part runs on the backend's writer thread, against
   the same updates with no checkpoint running (``idle``). A delta write is
   short, so a round holds ``--owner-writes`` deltas (default 5): for each,
   a round of changes (untimed), ``trigger_checkpoint`` (its wall time is
   the delta's *sync part*), then the owner updates until the writer's
   future is done (timed), then on until the owner freed what the writer's
   releases left it (``pending_reclaim`` is 0: rule G of ``_cmap.c``; the
   time those updates took beyond their idle time is charged, as
   ``bench_snapshot_codec.py`` does), then ``complete_checkpoint``
   (untimed), then -- the *idle* block -- as many updates again, timed, the
   writer done. Each delta's idle block follows it (on the 2-vCPU VM the
   owner's rate drifts 2x within seconds; until 2026-11-28 the idle updates
   ran after the round's five deltas). The round's rates are its updates
   over its summed windows and over its summed idle blocks. The owner
   updates, cycling, the keys the next round updates (its half of the 1%),
   so every delta still holds 1% of the keys. ``--owner-rounds`` rounds
   (default 9; 3 with ``--quick``) *each way*, alternating: ``owner
   updates (changes frozen: I6)`` with the backend's default
   ``IncrementalOptions(freeze_changes=True)`` (I6 of
   ``cowstate.heap_incremental``: the changes held apart in the sync part,
   the map snapshots released), and ``(snapshots kept open)`` with
   ``freeze_changes=False`` on the same backend. Two more rows, per delta:
   ``owner stopped: sync part`` [ms] and ``owner slowed: time lost while
   written`` [ms] (the windows' and drains' time beyond their updates' idle
   time) -- what the owner pays each way. The ratio is the median of the
   per-round ratios of the frozen rounds (the default).
4. ``put`` [ns/op]: ``put`` of existing keys to a new int, straight on the
   maps of a table of ``N // 10`` entries (each key's key-group map, in
   shuffled order), in 101 rounds after 1 warm-up: a round times one block
   of 20,000 puts per column (the next 20,000 of the shuffled keys, cycled),
   the columns' order rotating from round to round. Short blocks, many
   rounds: on the 2-vCPU VM the time of adjacent 20,000-put blocks swings
   2x, and 7 rounds of 1M puts each gave per-round ratios from 0.63 to 1.79
   at 10M; 101 rounds of blocks give the same median within about 1% from
   run to run (its ratio is a few percent). The columns:
   ``off`` -- a backend without incremental checkpoints (no incremental
   checkpoint configured: its maps never track); ``on`` -- a backend with
   incremental checkpoints (its maps tracking, between checkpoints);
   ``base`` (only with ``--map c --baseline-cmap PATH``) -- the same as
   ``off`` over a C map built from a commit before the C map tracked
   changes (a ``_cmap*.so``, loaded under a private name): the put without
   any tracking code. Every column's backend took one confirmed checkpoint
   first (untimed): it turns ``on``'s tracking on, and a snapshot leaves a
   C map's memory laid out otherwise than a fresh build (puts into a map
   that was snapshotted ran 2x faster at 10,000 entries), so the columns
   differ in tracking only. A baseline build, e.g. of main before the C
   map's tracking::

       mkdir /tmp/base && git show REV:impl/cowstate/_cmap.c > /tmp/base/_cmap.c
       git show REV:impl/cowstate/_cmap.h > /tmp/base/_cmap.h
       PY=.venv/bin/python
       INC=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
       SUF=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
       gcc -O2 -std=c11 -shared -fPIC -I$INC /tmp/base/_cmap.c -o /tmp/base/_cmap$SUF

Targets (issue 29; paired rows use the median of per-round ratios)
==================================================================
- delta bytes / full bytes <= 2%;
- delta write (async part, wall) / full write <= 5% (the issue: with the C
  writer -- ``--map c``; ``--map pure`` writes through the Python path);
- restore of base + ``--deltas`` deltas / full restore <= 1.5x;
- owner updates/s while a delta is written / idle >= 0.9x;
- put, tracking on / off <= 1.15x;
- put, off / base <= 1.03x (only with ``--baseline-cmap``: without a build
  that has no tracking code there is nothing to compare ``off`` with in one
  process).

The RocksDB columns have no target: they are printed beside the heap's.
The JSON goes to ``bench/results/heap_incremental.json``
(``heap_incremental_quick.json`` with ``--quick``; ``--output``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    Competitor,
    Result,
    Sample,
    Target,
    check_targets,
    format_table,
    format_targets,
    machine_info,
    measure_interleaved,
    write_json,
)
from _impls import load_cmap_build

from cowstate.checkpoint import CheckpointCoordinator, CheckpointStorage, RestoreMode
from cowstate.checkpoint.handles import KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation
from cowstate.descriptors import ValueStateDescriptor
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.heap_incremental import IncrementalOptions
from cowstate.key_groups import KeyGroupRange
from cowstate.keyed_backend import AbstractKeyedStateBackend
from cowstate.keyed_state import VOID_NAMESPACE
from cowstate.snapshot import ccodec
from cowstate.state_map import CopyOnWriteStateMap
from cowstate.state_table import CopyOnWriteStateTable

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "heap_incremental.json"
MAXP = 128
VALUE: ValueStateDescriptor[Any] = ValueStateDescriptor("bench_value")
OWNER_BATCH = 128
PUT_BLOCK = 20_000  # puts per timed block (a slice of the shuffled keys, cycled)
PUT_ROUNDS = 101  # rounds of one block per column: the row's ratio is a few percent
clock = time.perf_counter_ns

FULL, DELTA, ROCKS_FULL, ROCKS_INCR = "full", "delta", "rocks_full", "rocks_incr"
CHECKPOINT_COLUMNS = (
    Competitor(FULL, "heap full"),
    Competitor(DELTA, "heap delta"),
    Competitor(ROCKS_FULL, "RocksDB full"),
    Competitor(ROCKS_INCR, "RocksDB incr."),
)
WRITING, IDLE = "writing", "idle"
OWNER_COLUMNS = (Competitor(WRITING, "delta written"), Competitor(IDLE, "idle"))
FROZEN, KEPT_OPEN = "frozen", "kept_open"
STALL_COLUMNS = (Competitor(FROZEN, "frozen"), Competitor(KEPT_OPEN, "kept open"))
BASE, OFF, ON = "base", "off", "on"
PUT_COLUMNS = (
    Competitor(BASE, "no tracking code"),
    Competitor(OFF, "tracking off"),
    Competitor(ON, "tracking on"),
)


class PureTable(CopyOnWriteStateTable[Any, Any, Any]):
    map_class = CopyOnWriteStateMap


@dataclass(frozen=True)
class Config:
    entries: int
    map: str
    deltas: int
    repeats: int
    warmup: int
    owner_rounds: int
    owner_writes: int
    put_entries: int
    rocksdb: bool
    baseline_cmap: str | None
    seed: int
    quick: bool
    output: str


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------ workload


@dataclass(frozen=True)
class Round:
    """One round's changes: keys to update, keys to remove, new keys."""

    updates: list[int]
    removals: list[int]
    inserts: list[int]


class Workload:
    """Rounds of 1% of the live keys: half updated, a quarter inserted (fresh
    keys), a quarter removed. Removed keys never come back, so the live keys
    are ``0..next_key-1`` minus ``removed`` and a draw needs no list of them."""

    def __init__(self, n: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.next_key = n
        self.removed: set[int] = set()
        self.changed = max(4, n // 100)
        self.stamp = 0

    @property
    def live(self) -> int:
        return self.next_key - len(self.removed)

    def draw(self) -> Round:
        """The next round (to be applied before the next one is drawn)."""
        half, quarter = self.changed // 2, self.changed // 4
        picked: dict[int, None] = {}
        while len(picked) < half + quarter:
            key = self.rng.randrange(self.next_key)
            if key not in self.removed:
                picked[key] = None
        keys = list(picked)
        inserts = list(range(self.next_key, self.next_key + quarter))
        self.next_key += quarter
        self.removed.update(keys[half:])
        return Round(keys[:half], keys[half:], inserts)

    def apply(self, table: Any, changes: Round) -> None:
        self.stamp += 1
        put, remove = table.put, table.remove
        for key in changes.updates:
            put(key, VOID_NAMESPACE, -key - self.stamp)
        for key in changes.removals:
            remove(key, VOID_NAMESPACE)
        for key in changes.inserts:
            put(key, VOID_NAMESPACE, key)


# ------------------------------------------------------- checkpoints, timed


class WriteTimer:
    """Times the asynchronous part of every snapshot a backend starts: its
    ``snapshot_to`` is wrapped (an instance attribute), and a done-callback on
    the writer thread notes the end."""

    def __init__(self, backend: AbstractKeyedStateBackend[Any]) -> None:
        self._inner = backend.snapshot_to
        backend.snapshot_to = self._snapshot_to  # type: ignore[method-assign]
        self.future: Future[KeyedStateHandle] | None = None
        self._ended = threading.Event()
        self._times = (0, 0, 0, 0)

    def _snapshot_to(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        future = self._inner(checkpoint_id, location, options)
        self._ended.clear()
        self._times = (clock(), time.process_time_ns(), 0, 0)
        self.future = future
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: Future[KeyedStateHandle]) -> None:
        self._times = (*self._times[:2], clock(), time.process_time_ns())
        self._ended.set()

    def last(self) -> tuple[int, int]:
        """Wall and CPU nanoseconds of the last snapshot's asynchronous part."""
        self._ended.wait()
        start, cpu_start, end, cpu_end = self._times
        return end - start, cpu_end - cpu_start


@dataclass(frozen=True)
class Written:
    checkpoint_id: int
    handle: KeyedStateHandle
    sync_ns: int
    write_ns: int
    write_cpu_ns: int


@dataclass
class Job:
    """One backend, its coordinator and workload, in ``root``."""

    kind: str  # "heap" or "rocksdb"
    cfg: Config
    root: str
    backend: AbstractKeyedStateBackend[Any]
    coordinator: CheckpointCoordinator
    workload: Workload
    timer: WriteTimer
    made: Callable[[], AbstractKeyedStateBackend[Any]]
    restores: int = 0

    def checkpoint(self, full: bool) -> Written:
        gc.collect()
        self.coordinator.force_full = full
        t0 = clock()
        checkpoint_id = self.coordinator.trigger_checkpoint()
        sync = clock() - t0
        self.coordinator.acknowledge(checkpoint_id)
        wall, cpu = self.timer.last()
        done = self.coordinator.complete_checkpoint(checkpoint_id)
        handle = done.metadata.subtasks[0]
        self.check(handle, full)
        return Written(checkpoint_id, handle, sync, wall, cpu)

    def check(self, handle: KeyedStateHandle, full: bool) -> None:
        if self.kind != "heap":
            return
        files = len(handle.files)
        if full and files != 1:
            raise AssertionError(f"expected a full heap checkpoint (one file), got {files}")
        if not full and files == 1:
            raise SystemExit(
                f"the heap backend over the {self.cfg.map} map wrote a full checkpoint where a "
                "delta was due: its maps do not track changes (I2 of cowstate.heap_incremental)"
                " -- with --map c, the C map's change tracking has not landed; use --map pure"
            )
        if not full and (files - 1) % 2:
            raise AssertionError(f"expected a base and pairs of delta files, got {files} files")

    def change(self) -> None:
        self.workload.apply(self.table, self.workload.draw())

    @property
    def table(self) -> Any:
        return self.backend.table(VALUE.name)

    def restore(self, directory: str) -> int:
        """Wall nanoseconds of restoring ``directory`` into a fresh backend."""
        target = self.made()
        target.get_state(VALUE)
        self.restores += 1
        job_id = f"restore-{self.kind}-{self.restores}"
        try:
            gc.collect()
            t0 = clock()
            restored = CheckpointCoordinator.restore(
                CheckpointStorage(self.root, job_id), [target], directory, RestoreMode.NO_CLAIM
            )
            elapsed = clock() - t0
            if target.num_state_entries() != self.workload.live:
                raise AssertionError(
                    f"restored {target.num_state_entries()} entries, expected {self.workload.live}"
                )
            restored.close()
        finally:
            target.close()
            shutil.rmtree(os.path.join(self.root, job_id), ignore_errors=True)
        return elapsed

    def directory(self, written: Written) -> str:
        return self.coordinator.storage.checkpoint_dir(written.checkpoint_id)

    def close(self) -> None:
        self.coordinator.close()
        self.backend.close()


def heap_backend(cfg: Config, incremental: bool) -> HeapKeyedStateBackend:
    table = PureTable if cfg.map == "pure" else CopyOnWriteStateTable
    options = IncrementalOptions(max_deltas=max(cfg.deltas, cfg.owner_writes), max_delta_ratio=10.0)
    made = HeapKeyedStateBackend(
        KeyGroupRange(0, MAXP - 1), MAXP, table, incremental=options if incremental else False
    )
    made.get_state(VALUE)
    return made


def rocksdb_backend(local: str) -> AbstractKeyedStateBackend[Any]:
    from cowstate.rocksdb.backend import RocksDBKeyedStateBackend

    made = RocksDBKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP, local_dir=local)
    made.get_state(VALUE)
    return made


def build(kind: str, cfg: Config, root: str) -> Job:
    n = cfg.entries
    local = os.path.join(root, "rocksdb-local")

    def made() -> AbstractKeyedStateBackend[Any]:
        if kind == "heap":
            return heap_backend(cfg, incremental=True)
        os.makedirs(local, exist_ok=True)
        return rocksdb_backend(local)

    backend = made()
    log(f"{kind}: building {n:,} entries")
    put = backend.table(VALUE.name).put
    for i in range(n):
        put(i, VOID_NAMESPACE, i)
    coordinator = CheckpointCoordinator(
        CheckpointStorage(root, f"bench-{kind}"), [backend], num_retained=2
    )
    return Job(
        kind, cfg, root, backend, coordinator, Workload(n, cfg.seed), WriteTimer(backend), made
    )


# ------------------------------------------------------------------- phases


@dataclass
class Rows:
    """The checkpoint rows, filled by both backends' phases."""

    bytes: Result = field(
        default_factory=lambda: Result("bytes", "bytes (checkpointed_size)", "MB", paired=True)
    )
    write: Result = field(
        default_factory=lambda: Result("write", "write (async part, wall)", "ms", paired=True)
    )
    cpu: Result = field(
        default_factory=lambda: Result("write_cpu", "write (async part, CPU)", "ms", paired=True)
    )
    sync: Result = field(
        default_factory=lambda: Result("sync", "sync part (trigger)", "ms", paired=True)
    )
    restore: Result = field(
        default_factory=lambda: Result(
            "restore", "restore (delta: base + deltas)", "ms", paired=True
        )
    )

    def all(self) -> list[Result]:
        return [self.bytes, self.write, self.cpu, self.sync, self.restore]


def phase_writes(job: Job, full_key: str, delta_key: str, rows: Rows) -> None:
    cfg = job.cfg
    got: dict[str, list[Written]] = {full_key: [], delta_key: []}
    for i in range(cfg.warmup + cfg.repeats):
        full = job.checkpoint(full=True)
        job.change()
        delta = job.checkpoint(full=False)
        if i >= cfg.warmup:
            got[full_key].append(full)
            got[delta_key].append(delta)
    for key, runs in got.items():
        rows.bytes.set(key, Sample(tuple(w.handle.checkpointed_size / 1e6 for w in runs)))
        rows.write.set(key, Sample(tuple(w.write_ns / 1e6 for w in runs)))
        rows.cpu.set(key, Sample(tuple(w.write_cpu_ns / 1e6 for w in runs)))
        rows.sync.set(key, Sample(tuple(w.sync_ns / 1e6 for w in runs)))


def phase_restore(
    job: Job, full_key: str, delta_key: str, rows: Rows, notes: dict[str, Any]
) -> None:
    cfg = job.cfg
    job.checkpoint(full=True)
    for _ in range(cfg.deltas):
        job.change()
        chained = job.checkpoint(full=False)
    if job.kind == "heap" and len(chained.handle.files) != 1 + 2 * cfg.deltas:
        raise AssertionError(
            f"expected a chain of a base and {cfg.deltas} deltas, got {chained.handle.files}"
        )
    full = job.checkpoint(full=True)
    notes[f"{job.kind}_chain"] = {
        "files": len(chained.handle.files),
        "full_size": chained.handle.full_size,
        "full_checkpoint_size": full.handle.full_size,
    }
    times = measure_interleaved(
        {
            delta_key: lambda: job.restore(job.directory(chained)),
            full_key: lambda: job.restore(job.directory(full)),
        },
        warmup=cfg.warmup,
        repeats=cfg.repeats,
    )
    for key, sample in times.items():
        rows.restore.set(key, sample.scaled(1e-6))


@dataclass(frozen=True)
class OwnerRound:
    """One round's sums over its deltas: updates and ns while each delta was
    written, the drain after it, the idle block right after it, and the
    synchronous parts (``trigger_checkpoint``)."""

    ops: int
    ns: int
    drain_ops: int
    drain_ns: int
    idle_ops: int
    idle_ns: int
    sync_ns: int
    writes: int

    @property
    def idle_rate(self) -> float:
        return self.idle_ops / (self.idle_ns / 1e9)

    @property
    def writing_rate(self) -> float:
        """Updates/s while the deltas were written, charged for the drain (the
        time its updates took beyond their idle time)."""
        extra = max(0.0, self.drain_ns - self.drain_ops / self.idle_rate * 1e9)
        return self.ops / ((self.ns + extra) / 1e9)

    @property
    def lost_ms(self) -> float:
        """Per delta: the owner's time while it was written (and drained) beyond
        what the same updates take idle."""
        spent = self.ns + self.drain_ns
        return (spent - (self.ops + self.drain_ops) / self.idle_rate * 1e9) / 1e6 / self.writes

    @property
    def sync_ms(self) -> float:
        return self.sync_ns / 1e6 / self.writes


def set_freezing(backend: HeapKeyedStateBackend, freeze: bool) -> None:
    """Switch I6 (``IncrementalOptions.freeze_changes``) of the bench's backend:
    the bench compares both ways on one backend's maps (a user chooses at
    construction; the bench sets the private option, read at each checkpoint)."""
    options = backend.incremental
    assert options is not None
    backend._incremental = replace(options, freeze_changes=freeze)


def owner_round(job: Job, freeze: bool) -> OwnerRound:
    cfg = job.cfg
    backend, coordinator, workload = job.backend, job.coordinator, job.workload
    assert isinstance(backend, HeapKeyedStateBackend)
    set_freezing(backend, freeze)
    state = backend.get_state(VALUE)
    set_key, value, update = backend.set_current_key, state.value, state.update
    base = backend.base_chain
    options = backend.incremental
    assert options is not None
    if base is None or base.deltas + cfg.owner_writes > options.max_deltas:
        job.checkpoint(full=True)  # room for the round's deltas in the chain (I2)
    at = 0

    def batch(keys: Sequence[int]) -> None:
        nonlocal at
        for _ in range(OWNER_BATCH):
            key = keys[at % len(keys)]
            at += 1
            set_key(key)
            value()
            update(key + at)

    ops = ns = drain_ops = drain_ns = idle_ops = idle_ns = sync_ns = 0
    upcoming = workload.draw()
    for _ in range(cfg.owner_writes):
        workload.apply(job.table, upcoming)
        upcoming = workload.draw()  # the owner updates its keys while this delta is written
        gc.collect()
        t = clock()
        checkpoint_id = coordinator.trigger_checkpoint()
        sync_ns += clock() - t
        future = job.timer.future
        assert future is not None
        t0, done_ops = clock(), 0
        while not future.done():
            batch(upcoming.updates)
            done_ops += OWNER_BATCH
        ns += clock() - t0
        ops += done_ops
        t1, drained = clock(), 0
        while backend.pending_reclaim > 0:
            batch(upcoming.updates)
            drained += OWNER_BATCH
        if drained:
            drain_ns += clock() - t1
            drain_ops += drained
        done = coordinator.complete_checkpoint(checkpoint_id)
        job.check(done.metadata.subtasks[0], full=False)
        # idle: as many updates right after, the writer done (adjacent blocks:
        # on the 2-vCPU VM the owner's rate drifts 2x within seconds)
        blocks = max(1, (done_ops + drained) // OWNER_BATCH)
        t2 = clock()
        for _ in range(blocks):
            batch(upcoming.updates)
        idle_ns += clock() - t2
        idle_ops += blocks * OWNER_BATCH
    workload.apply(job.table, upcoming)
    backend.reclaim()
    return OwnerRound(ops, ns, drain_ops, drain_ns, idle_ops, idle_ns, sync_ns, cfg.owner_writes)


def phase_owner(job: Job) -> tuple[Result, Result, Result, Result]:
    """The owner beside delta writes, rounds alternating I6 on (frozen, the
    default) and off (snapshots kept open while written)."""
    assert isinstance(job.backend, HeapKeyedStateBackend)
    frozen: list[OwnerRound] = []
    kept: list[OwnerRound] = []
    for _ in range(job.cfg.owner_rounds):
        frozen.append(owner_round(job, freeze=True))
        kept.append(owner_round(job, freeze=False))
    set_freezing(job.backend, True)
    owner = Result("owner", "owner updates (changes frozen: I6)", "k/s", paired=True)
    owner.set(WRITING, Sample(tuple(r.writing_rate / 1e3 for r in frozen)))
    owner.set(IDLE, Sample(tuple(r.idle_rate / 1e3 for r in frozen)))
    owner_open = Result("owner_open", "owner updates (snapshots kept open)", "k/s", paired=True)
    owner_open.set(WRITING, Sample(tuple(r.writing_rate / 1e3 for r in kept)))
    owner_open.set(IDLE, Sample(tuple(r.idle_rate / 1e3 for r in kept)))
    sync = Result("owner_sync", "owner stopped: sync part per delta", "ms", paired=True)
    sync.set(FROZEN, Sample(tuple(r.sync_ms for r in frozen)))
    sync.set(KEPT_OPEN, Sample(tuple(r.sync_ms for r in kept)))
    lost = Result("owner_lost", "owner slowed: time lost while written", "ms", paired=True)
    lost.set(FROZEN, Sample(tuple(r.lost_ms for r in frozen)))
    lost.set(KEPT_OPEN, Sample(tuple(r.lost_ms for r in kept)))
    return owner, owner_open, sync, lost


def load_baseline_map(path: str) -> Any:
    """The C map of a ``_cmap`` build at ``path``, loaded under a private name,
    refused if it is this checkout's own."""
    found = load_cmap_build(path, "cowstate_bench_baseline")
    from cowstate import _cmap

    if not isinstance(found, type) or found is _cmap.CopyOnWriteStateMap:
        raise SystemExit(f"expected {path} to be another build of the C map than cowstate._cmap")
    return found


def put_table(cfg: Config, column: str, root: str) -> tuple[list[tuple[Any, int]], tuple[Any, ...]]:
    """(map put, key) pairs over a table of ``put_entries`` entries, shuffled,
    and what keeps the backend alive."""
    n = cfg.put_entries
    if column == BASE:
        assert cfg.baseline_cmap is not None
        baseline = load_baseline_map(cfg.baseline_cmap)

        class BaselineTable(CopyOnWriteStateTable[Any, Any, Any]):
            map_class = baseline

        backend = HeapKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP, BaselineTable)
        backend.get_state(VALUE)
    else:
        backend = heap_backend(cfg, incremental=column == ON)
    table = backend.table(VALUE.name)
    for i in range(n):
        table.put(i, VOID_NAMESPACE, i)
    # One checkpoint in every column: it turns tracking on (ON), and a snapshot
    # leaves a map's memory laid out otherwise than a fresh build -- the
    # columns differ in tracking only.
    coordinator = CheckpointCoordinator(CheckpointStorage(root, f"bench-put-{column}"), [backend])
    coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
    keep = (coordinator, backend)
    pairs = []
    assert isinstance(table, CopyOnWriteStateTable)
    for key_group in range(MAXP):
        state_map = table.state_map(key_group)
        pairs += [(state_map.put, entry.key) for entry in state_map]
    random.Random(cfg.seed).shuffle(pairs)
    if len(pairs) != n:
        raise AssertionError(f"expected {n} mappings, got {len(pairs)}")
    return pairs, keep


def phase_put(cfg: Config, root: str) -> Result:
    put = Result("put", "put (existing key, map)", "ns/op", paired=True)
    columns = [OFF, ON] if cfg.baseline_cmap is None else [BASE, OFF, ON]
    made = {column: put_table(cfg, column, root) for column in columns}

    values: dict[str, list[float]] = {column: [] for column in columns}
    for round_ in range(1 + PUT_ROUNDS):  # the first round warms up
        start = round_ * PUT_BLOCK
        turn = round_ % len(columns)  # the order rotates: no column always first
        for column in columns[turn:] + columns[:turn]:
            pairs = made[column][0]
            block = [pairs[(start + i) % len(pairs)] for i in range(PUT_BLOCK)]
            t0 = clock()
            for map_put, key in block:
                map_put(key, VOID_NAMESPACE, round_)
            if round_:
                values[column].append((clock() - t0) / PUT_BLOCK)
    for column, got in values.items():
        put.set(column, Sample(tuple(got)))
    for column in columns:
        for closing in made[column][1]:
            closing.close()
    if cfg.baseline_cmap is None:
        put.missing[BASE] = "n/a"
    return put


# ------------------------------------------------------------------ targets


def targets(cfg: Config) -> list[Target]:
    out = [
        Target(
            "delta bytes <= 2% of a full checkpoint's",
            "bytes",
            DELTA,
            FULL,
            "<=",
            0.02,
            "issue 29: a delta holds what changed (1% of the keys)",
        ),
        Target(
            "delta write time <= 5% of a full write's",
            "write",
            DELTA,
            FULL,
            "<=",
            0.05,
            "issue 29: the asynchronous part of a delta, with the C writer "
            f"(measured over the {cfg.map} map)",
        ),
        Target(
            f"restore of a base + {cfg.deltas} deltas <= 1.5x a full restore",
            "restore",
            DELTA,
            FULL,
            "<=",
            1.5,
            "issue 29: a chain costs a restore little more than its base",
        ),
        Target(
            "owner updates while a delta is written >= 0.9x idle",
            "owner",
            WRITING,
            IDLE,
            ">=",
            0.9,
            "issue 29: the owner is not slowed by a delta's write",
        ),
        Target(
            "put with tracking on <= 1.15x off",
            "put",
            ON,
            OFF,
            "<=",
            1.15,
            "issue 29: the tracking's cost on put",
        ),
    ]
    if cfg.baseline_cmap is not None:
        out.append(
            Target(
                "put with tracking off <= 1.03x a map without tracking code",
                "put",
                OFF,
                BASE,
                "<=",
                1.03,
                "issue 29: no measurable cost with no incremental checkpoint configured",
            )
        )
    return out


# ---------------------------------------------------------------------- run


def writer_of(cfg: Config) -> str:
    if ccodec.CODEC is None:
        return "Python (the C codec is not built)"
    return "C" if cfg.map == "c" else "Python path (pure-map snapshots)"


def run(cfg: Config) -> dict[str, Any]:
    started = time.perf_counter()
    notes: dict[str, Any] = {"load_before": os.getloadavg(), "writer": writer_of(cfg)}
    rows = Rows()
    root = tempfile.mkdtemp(prefix="cowstate-bench-heap-incr-")
    try:
        job = build("heap", cfg, root)
        try:
            log("heap: full and delta checkpoints")
            phase_writes(job, FULL, DELTA, rows)
            log(f"heap: restore of a base + {cfg.deltas} deltas and of a full checkpoint")
            phase_restore(job, FULL, DELTA, rows, notes)
            log("heap: the owner's updates while deltas are written, and idle")
            owner, owner_open, stall_sync, stall_lost = phase_owner(job)
        finally:
            job.close()
        del job
        gc.collect()
        if cfg.rocksdb:
            job = build("rocksdb", cfg, root)
            try:
                log("rocksdb: full and incremental checkpoints")
                phase_writes(job, ROCKS_FULL, ROCKS_INCR, rows)
                log(
                    f"rocksdb: restore after {cfg.deltas} incremental checkpoints and of a full one"
                )
                phase_restore(job, ROCKS_FULL, ROCKS_INCR, rows, notes)
            finally:
                job.close()
            del job
            gc.collect()
        log(f"put: {cfg.put_entries:,} entries, tracking off and on")
        put = phase_put(cfg, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not cfg.rocksdb:
        for row in rows.all():
            row.missing.update({ROCKS_FULL: "skipped", ROCKS_INCR: "skipped"})
    results = [*rows.all(), owner, owner_open, stall_sync, stall_lost, put]
    outcomes = check_targets(targets(cfg), results)
    wall = time.perf_counter() - started
    print()
    print(
        f"Heap incremental checkpoints: {cfg.entries:,} int mappings (int keys, VOID_NAMESPACE, "
        f"key groups 0-127), {cfg.map} map, writer: {notes['writer']}; 1% of the keys changed per "
        f"round (half updated, a quarter inserted, a quarter removed); median of {cfg.repeats} "
        f"rounds after {cfg.warmup} warm-up; Python {sys.version.split()[0]}"
    )
    print()
    print(format_table(rows.all(), CHECKPOINT_COLUMNS))
    print()
    print(format_table([owner, owner_open], OWNER_COLUMNS))
    print()
    print(format_table([stall_sync, stall_lost], STALL_COLUMNS))
    print()
    print(format_table([put], PUT_COLUMNS))
    print()
    print("Side by side (median of per-round ratios):")
    for row in rows.all():
        print(
            f"  {row.label}: {ratio_line(row, DELTA, FULL)} heap delta / full;  "
            f"{ratio_line(row, ROCKS_INCR, ROCKS_FULL)} RocksDB incr. / full;  "
            f"{ratio_line(row, DELTA, ROCKS_INCR)} heap delta / RocksDB incr."
        )
    if cfg.baseline_cmap is None:
        print(
            "  put: no --baseline-cmap, so the <= 3% target (tracking off against a map "
            "without tracking code) is not measured"
        )
    print()
    print(f"load average before: {notes['load_before']}, after: {os.getloadavg()}")
    print("TARGETS (median of per-round ratios)")
    labels = {
        c.key: c.label for c in (*CHECKPOINT_COLUMNS, *OWNER_COLUMNS, *STALL_COLUMNS, *PUT_COLUMNS)
    }
    print(format_targets(outcomes, values=True, labels=labels))
    print()
    print(f"wall time {wall:.1f}s")
    return {
        "benchmark": "heap_incremental",
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "wall_time_s": wall,
        "config": asdict(cfg),
        "machine": machine_info(),
        "notes": notes,
        "results": [r.to_json() for r in results],
        "targets": [o.to_json() for o in outcomes],
    }


def ratio_line(row: Result, num: str, den: str) -> str:
    a, b = row.samples.get(num), row.samples.get(den)
    if a is None or b is None:
        return "n/a"
    ratios = sorted(x / y for x, y in zip(a.values, b.values, strict=True) if y)
    return "n/a" if not ratios else f"{ratios[len(ratios) // 2]:.4g}x"


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=1_000_000, help="int mappings (default 1M)")
    p.add_argument("--quick", action="store_true", help="smoke test: 100,000 entries, 3 rounds")
    p.add_argument("--map", choices=("c", "pure"), default="c", help="the heap tables' map")
    p.add_argument("--deltas", type=int, default=10, help="deltas of the restored chain")
    p.add_argument("--repeats", type=int, default=5, help="rounds (default 5; 3 with --quick)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--owner-rounds", type=int, default=9, help="owner rounds (default 9)")
    p.add_argument("--owner-writes", type=int, default=5, help="delta writes per owner round")
    p.add_argument("--put-entries", type=int, default=None, help="default entries // 10")
    p.add_argument("--no-rocksdb", dest="rocksdb", action="store_false")
    p.add_argument(
        "--baseline-cmap",
        default=None,
        help="a _cmap*.so built before the C map tracked changes: the put row's baseline",
    )
    p.add_argument("--seed", type=int, default=29)
    p.add_argument("--output", type=Path, default=None, help="JSON file")
    a = p.parse_args(argv)
    entries = 100_000 if a.quick else a.entries
    if a.baseline_cmap is not None and a.map != "c":
        p.error("--baseline-cmap is the C map's baseline: it needs --map c")
    if entries < 1000 or a.deltas < 1 or a.repeats < 1 or a.owner_rounds < 1 or a.owner_writes < 1:
        p.error("expected --entries >= 1000 and --deltas, --repeats, --owner-* >= 1")
    path = a.output or RESULTS_PATH.with_name(
        "heap_incremental_quick.json" if a.quick else RESULTS_PATH.name
    )
    return Config(
        entries=entries,
        map=a.map,
        deltas=a.deltas,
        repeats=3 if a.quick else a.repeats,
        warmup=a.warmup,
        owner_rounds=3 if a.quick else a.owner_rounds,
        owner_writes=a.owner_writes,
        put_entries=a.put_entries or max(1000, entries // 10),
        rocksdb=a.rocksdb,
        baseline_cmap=a.baseline_cmap,
        seed=a.seed,
        quick=a.quick,
        output=str(path),
    )


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    report = run(cfg)
    write_json(Path(cfg.output), report)
    print(f"wrote {cfg.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
