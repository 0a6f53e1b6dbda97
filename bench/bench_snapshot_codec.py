"""Benchmark: the snapshot writer in C and the reader through the C codec
(``cowstate._codec``) against the same writer and reader in Python, against
``pickle`` of a dict of the same mappings, and the owner's updates while the
writer writes.

Run::

    .venv/bin/python bench/bench_snapshot_codec.py              # 1,000,000 entries (~5 min)
    .venv/bin/python bench/bench_snapshot_codec.py --quick      # 100,000 entries, 3 rounds
    .venv/bin/python bench/bench_snapshot_codec.py --shapes int --repeats 3 --no-gc

Competitors (columns)
=====================
``c``       ``write_snapshot`` / ``restore`` with the C codec
            (``cowstate.snapshot.ccodec.CODEC``, the default when built): the
            blocks by the snapshot writer in C (``impl/cowstate/_writer.c``).
``python``  the same with ``ccodec.CODEC = None``: the Python loops, calling the
            serializers per value (what cowstate did before the codec).
``pickle``  ``pickle.dumps`` / ``pickle.loads`` (highest protocol) of a dict
            ``{(key, VOID_NAMESPACE): state}`` holding the same mappings: the
            reference of issue 28.
``open``    (owner row) the owner's updates while a snapshot is open but its
            writer waits: what copy-on-write alone costs the owner.
``idle``    (owner row) the owner's updates with no snapshot open.

Data
====
Per shape, one ``HeapKeyedStateBackend`` over key groups ``[0, 127]`` of max
parallelism 128, default serializers (the value codec for key, namespace and
state), one ``ValueState`` with ``N`` entries (``--entries``, default
1,000,000): int keys ``0..N-1``, namespace ``VOID_NAMESPACE``, state ``i *
7919`` (``int``), ``f"user-{i}-clicked-home"`` (``str``) or ``[i, i + 1]``
(``list``: encoded with the GIL held), filled through the
handle, untimed. The C and Python files are checked to be identical, byte for
byte, before the rounds.

Method
======
``_harness.measure_interleaved``: 1 warm-up round, then ``--repeats`` rounds
(default 3), each running the three competitors once; a full ``gc.collect()``
before each run (untimed). The garbage collector stays on during the runs as a
user has it (``--no-gc`` disables it for the timed sections: with
``VOID_NAMESPACE`` a GC-tracked object, every map entry counts as a container
and the collections the writer's allocations trigger walk the whole map --
issue 28's separate GC item). Rows, in M entries/s:

1. ``write``: ``c`` and ``python`` time ``backend.snapshot(id, io.BytesIO)
   .result()`` from the call's return (the asynchronous part: reading the
   snapshot's entries, encoding, framing, CRC32, index); ``pickle`` times
   ``pickle.dumps(mappings)``.
2. ``write, owner busy``: the C writer's rate (from ``backend.snapshot``'s
   return to the future's end) while the main thread, the owner, updates
   random keys as fast as it can (``set_current_key``, ``value()``,
   ``update()``); ``pickle`` is row 1's.
3. ``owner updates``: the owner's updates/s in those same runs (``c``:
   from the snapshot's start to the write's end, charged for the owner's
   freeing afterwards of what the writer's releases left it -- rule G of
   ``_cmap.c``: the owner goes on until ``backend.pending_reclaim`` is 0, and
   the time those updates took beyond their idle time is added), for
   ``--owner-ops`` updates with a snapshot open and its writer waiting
   (``open``), and with none (``idle``); the three interleaved per round,
   ``--owner-rounds`` rounds (default 9: a round's ratio moves by +-0.1 with
   where the threads' GIL hand-overs fall). Rows 2 and 3 write a checkpoint
   file into a temporary directory, as a checkpoint does (``CheckpointFile``,
   a ``FileIO``: its ``write`` releases the GIL while the kernel copies the
   buffer, where ``io.BytesIO`` would hold it for every copy). The owner's
   keys: distinct keys in a fresh random order for every run
   (``owner_keys``, drawn untimed before it), so every update is a first
   touch of its key in that run, as in the fixed cycle below, but no run
   walks the keys in an order an earlier run laid out.
4. ``owner updates, key cycle``: row 3's ``c`` and ``idle`` again, in the
   same rounds, with the keys row 3 had until 2026-11-28: every run walks
   the same cycle, keys 7919, 15838, 23757, ... modulo N. It is reported,
   not a target: it measures where memory lies as much as what a checkpoint
   costs. An update that copies an entry (rule E) and stores a new state
   puts both in memory in the order it updates, so a run over the keys an
   earlier run just updated reads them nearly in address order (row 3's
   idle run used to start where the ``open`` run before it had copied, now
   this row's idle run where its writing run did): at 10M idle updates ran
   at 660-1,030 k/s so, against 440-630 k/s with random keys (540-590 right
   after the build), while the owner's rate during a write moved much less.
   The ratio falls from 0.87-0.97 (random keys) to 0.66-0.73 (the cycle),
   measured 2026-11-28 (bench/README.md).
5. ``restore``: a fresh backend with the descriptor registered (untimed), then
   ``backend.restore([data])``; ``pickle`` times ``pickle.loads``.

Targets (issue 28; the ratio is the median of the per-round ratios): the
write rate with the C writer >= pickle's (list states >= 0.5x), >= 0.5x
pickle's with the owner busy (int and str states, as the issue states it),
the owner's updates while the writer writes >= 0.7x idle (int states: the
issue's workload; ``OWNER_TARGET_SHAPES`` says why str and list are only
reported), the restore rate >= 0.5x pickle's (within 2x). On 2 cores the
writer thread and the owner share the machine with whatever else runs: the
load average before and after is printed (at a load above 2, the owner and
the writer compete for a core, not only for the GIL). The JSON goes to
``bench/results/snapshot_codec.json``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import io
import itertools
import os
import pickle
import random
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

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

from cowstate import VOID_NAMESPACE, HeapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor
from cowstate.snapshot import ccodec

RESULTS_PATH = Path(__file__).parent / "results" / "snapshot_codec.json"
C, PYTHON, PICKLE, OPEN, IDLE = "c", "python", "pickle", "open", "idle"
COMPETITORS = (
    Competitor(C, "C writer"),
    Competitor(PYTHON, "Python loops"),
    Competitor(PICKLE, "pickle dict"),
    Competitor(OPEN, "snap. open"),
    Competitor(IDLE, "owner idle"),
)
SHAPES: dict[str, Callable[[int], Any]] = {
    "int": lambda i: i * 7919,
    "str": lambda i: f"user-{i}-clicked-home",
    "list": lambda i: [i, i + 1],
}
OWNER_BATCH = 128  # owner updates between two looks at the writer's future
RANDOM_ORDER = "random"  # the owner's keys in a fresh random order for every run
CYCLE = "cycle"  # the owner's keys in one fixed cycle (the owner rows' second form)
CYCLE_STEP = 7919  # the cycle's step: keys 7919, 15838, ... modulo n
MAX_PARALLELISM = 128
clock = time.perf_counter_ns
T = TypeVar("T")


@dataclass(frozen=True)
class Config:
    entries: int
    repeats: int
    warmup: int
    shapes: tuple[str, ...]
    gc_enabled: bool
    owner_ops: int
    owner_rounds: int
    quick: bool
    output: str


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def new_backend() -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(KeyGroupRange(0, MAX_PARALLELISM - 1), MAX_PARALLELISM)


def descriptor() -> ValueStateDescriptor[Any]:
    return ValueStateDescriptor("bench_value")


def build(shape: str, n: int) -> HeapKeyedStateBackend:
    backend = new_backend()
    state = backend.get_state(descriptor())
    value_of = SHAPES[shape]
    set_key, update = backend.set_current_key, state.update
    for i in range(n):
        set_key(i)
        update(value_of(i))
    return backend


def with_codec(codec: Any, run: Callable[[], T]) -> Callable[[], T]:
    def timed() -> T:
        saved = ccodec.CODEC
        ccodec.CODEC = codec
        try:
            return run()
        finally:
            ccodec.CODEC = saved

    return timed


def run_write(backend: HeapKeyedStateBackend, ids: Iterator[int], n: int) -> int:
    future = backend.snapshot(next(ids), io.BytesIO)
    t0 = clock()
    result = future.result()
    elapsed = clock() - t0
    if result.info is None or result.info.entries != n:
        raise AssertionError(f"snapshot wrote {result.info}")
    return elapsed


def run_restore(data: bytes, n: int, check: tuple[int, Any]) -> int:
    with new_backend() as backend:
        backend.get_state(descriptor())
        t0 = clock()
        backend.restore([data])
        elapsed = clock() - t0
        if backend.num_state_entries() != n:
            raise AssertionError(f"restored {backend.num_state_entries()} entries")
        key, value = check
        backend.set_current_key(key)
        if backend.get_state(descriptor()).value() != value:
            raise AssertionError(f"restored the wrong state for {key}")
    return elapsed


class CheckpointFile(io.FileIO):
    """A checkpoint's file, as a checkpoint storage stream: ``FileIO`` releases
    the GIL while the kernel copies a buffer (``io.BytesIO`` holds it); the
    handle is the path."""

    def close_and_get_handle(self) -> str:
        self.close()
        return str(self.name)


@dataclass(frozen=True)
class OwnerRun:
    """One owner round: ``ops`` updates in ``elapsed_ns``; for WRITING also the
    updates and time after the write until the owner had freed what the
    writer's releases left it (``drain_ops``, ``drain_ns``: rule G of
    ``_cmap.c``), and the writer's M entries/s."""

    ops: int
    elapsed_ns: int
    drain_ops: int = 0
    drain_ns: int = 0
    writer_rate: float = 0.0

    @property
    def uncharged(self) -> float:
        """Updates/s over the round's own updates (OPEN, IDLE; WRITING without
        its drain)."""
        return self.ops / (self.elapsed_ns / 1e9)

    def rate(self, idle_rate: float) -> float:
        """Updates/s, charged for the drain: the time the drain's updates took
        beyond what they take idle (at ``idle_rate`` updates/s) is added to the
        write's time."""
        extra_ns = max(0.0, self.drain_ns - self.drain_ops / idle_rate * 1e9)
        return self.ops / ((self.elapsed_ns + extra_ns) / 1e9)


def owner_keys(n: int, mode: str, ops: int, order: str, seed: str) -> array[int] | None:
    """The keys of one owner run in the order the owner updates them. RANDOM_ORDER:
    distinct keys in a fresh random order for every run (``random.Random(seed)``;
    n/2 keys for a WRITING run -- more than a write and its drain take here at
    1M and 10M; past the end the order starts over --, ``ops`` for OPEN and
    IDLE). CYCLE: None, the fixed key cycle of ``run_owner``."""
    if order == CYCLE:
        return None
    count = n // 2 if mode == C else min(n, ops)
    return array("q", random.Random(seed).sample(range(n), count))


def run_owner(
    backend: HeapKeyedStateBackend,
    ids: Iterator[int],
    n: int,
    shape: str,
    mode: str,
    ops: int,
    directory: Path,
    keys: array[int] | None,
) -> OwnerRun:
    """The owner's updates (``set_current_key``, ``value()``, ``update()``) in
    ``mode``: WRITING -- while the snapshot's asynchronous part writes a
    checkpoint file into ``directory`` on the backend's writer thread, until it
    is done, then on until the owner's writes have freed every entry the
    writer's releases left them (``backend.pending_reclaim`` is 0); OPEN -- for
    ``ops`` updates while a snapshot is open but its writer waits
    (copy-on-write alone); IDLE -- for ``ops`` updates, no snapshot. OPEN and
    IDLE start with nothing left to free (``backend.reclaim()``, untimed).
    The keys are ``keys`` in order, or with None the fixed cycle: k *
    CYCLE_STEP modulo n for k = 1, 2, ..., from k = 1 again in every run."""
    state = backend.get_state(descriptor())
    set_key, value, update, value_of = (
        backend.set_current_key,
        state.value,
        state.update,
        SHAPES[shape],
    )
    go = threading.Event()

    def waiting_stream() -> io.BytesIO:
        go.wait()
        return io.BytesIO()

    def checkpoint_file() -> CheckpointFile:
        return CheckpointFile(directory / "checkpoint", "w")

    def cycle_batch(key: int) -> int:
        for _ in range(OWNER_BATCH):
            key = (key + CYCLE_STEP) % n
            set_key(key)
            value()
            update(value_of(key))
        return key

    def keys_batch(position: int) -> int:
        assert keys is not None
        if position >= len(keys):
            position = 0
        for key in keys[position : position + OWNER_BATCH]:
            set_key(key)
            value()
            update(value_of(key))
        return position + OWNER_BATCH

    batch = cycle_batch if keys is None else keys_batch

    if mode != C:
        backend.reclaim()
    future = None
    if mode != IDLE:
        future = backend.snapshot(next(ids), checkpoint_file if mode == C else waiting_stream)
    t0 = clock()
    done, key = 0, 0
    while (mode == C and future is not None and not future.done()) or (mode != C and done < ops):
        key = batch(key)
        done += OWNER_BATCH
    elapsed = clock() - t0
    drained, t1 = 0, clock()
    while mode == C and backend.pending_reclaim > 0:
        key = batch(key)
        drained += OWNER_BATCH
    drain_ns = clock() - t1 if drained else 0
    go.set()
    if future is not None:
        result = future.result()
        if result.info is None or result.info.entries != n:
            raise AssertionError(f"snapshot wrote {result.info}")
    return OwnerRun(done, elapsed, drained, drain_ns, n / (elapsed / 1e9) / 1e6)


def run_dumps(mappings: dict[Any, Any]) -> int:
    t0 = clock()
    pickle.dumps(mappings, protocol=pickle.HIGHEST_PROTOCOL)
    return clock() - t0


def run_loads(data: bytes, n: int) -> int:
    t0 = clock()
    back = pickle.loads(data)
    elapsed = clock() - t0
    if len(back) != n:
        raise AssertionError(f"unpickled {len(back)} mappings")
    return elapsed


def rate(times_ns: Sample, n: int) -> Sample:
    """M entries/s per round."""
    return Sample(tuple(n / (t / 1e9) / 1e6 for t in times_ns.values))


def phase(shape: str, cfg: Config, notes: dict[str, Any]) -> list[Result]:
    n = cfg.entries
    codec = ccodec.CODEC
    if codec is None:
        raise SystemExit("the C codec is not built (or COWSTATE_PURE_PYTHON is set)")
    write = Result(f"write_{shape}", f"{shape}: write", "M entries/s", paired=True)
    busy = Result(f"busy_{shape}", f"{shape}: write, owner busy", "M entries/s", paired=True)
    owner = Result(f"owner_{shape}", f"{shape}: owner updates", "k/s", paired=True)
    owner_cycle = Result(
        f"owner_cycle_{shape}", f"{shape}: owner updates, key cycle", "k/s", paired=True
    )
    restore = Result(f"restore_{shape}", f"{shape}: restore", "M entries/s", paired=True)
    log(f"{shape}: building {n:,} entries")
    backend = build(shape, n)
    mappings = {(i, VOID_NAMESPACE): SHAPES[shape](i) for i in range(n)}
    ids = itertools.count(1)
    data_c = _written(backend, ids, codec)
    data_python = _written(backend, ids, None)
    if data_c != data_python:
        raise AssertionError("the C codec's file differs from the Python loops' file")
    pickled = pickle.dumps(mappings, protocol=pickle.HIGHEST_PROTOCOL)
    notes.setdefault("bytes", {})[shape] = {"file": len(data_c), "pickle": len(pickled)}
    check = (n // 2, SHAPES[shape](n // 2))
    log(f"{shape}: write rounds")
    times = measure_interleaved(
        {
            C: with_codec(codec, lambda: run_write(backend, ids, n)),
            PYTHON: with_codec(None, lambda: run_write(backend, ids, n)),
            PICKLE: lambda: run_dumps(mappings),
        },
        warmup=cfg.warmup,
        repeats=cfg.repeats,
        gc_enabled=cfg.gc_enabled,
    )
    for key, sample in times.items():
        write.set(key, rate(sample, n))
    log(f"{shape}: owner rounds (the owner updating while the writer writes, and idle)")
    owner_rates: dict[str, list[float]] = {C: [], OPEN: [], IDLE: []}
    cycle_rates: dict[str, list[float]] = {C: [], IDLE: []}
    busy_rates: list[float] = []
    with tempfile.TemporaryDirectory(prefix="cowstate-bench-") as directory:
        for round_number in range(cfg.owner_rounds):
            for order, rates in ((RANDOM_ORDER, owner_rates), (CYCLE, cycle_rates)):
                runs: dict[str, OwnerRun] = {}
                for mode in rates:
                    keys = owner_keys(
                        n, mode, cfg.owner_ops, order, f"{shape}-{round_number}-{mode}"
                    )
                    gc.collect()
                    runs[mode] = with_codec(
                        codec,
                        lambda mode=mode, keys=keys: run_owner(
                            backend, ids, n, shape, mode, cfg.owner_ops, Path(directory), keys
                        ),
                    )()
                    del keys
                idle_rate = runs[IDLE].uncharged
                for mode, one in runs.items():
                    rates[mode].append(one.rate(idle_rate) / 1e3)
                if order == RANDOM_ORDER:
                    busy_rates.append(runs[C].writer_rate)
    for key, values in owner_rates.items():
        owner.set(key, Sample(tuple(values)))
    for key, values in cycle_rates.items():
        owner_cycle.set(key, Sample(tuple(values)))
    busy.set(C, Sample(tuple(busy_rates)))
    busy.set(PICKLE, write.samples[PICKLE])
    log(f"{shape}: restore rounds")
    times = measure_interleaved(
        {
            C: with_codec(codec, lambda: run_restore(data_c, n, check)),
            PYTHON: with_codec(None, lambda: run_restore(data_c, n, check)),
            PICKLE: lambda: run_loads(pickled, n),
        },
        warmup=cfg.warmup,
        repeats=cfg.repeats,
        gc_enabled=cfg.gc_enabled,
    )
    for key, sample in times.items():
        restore.set(key, rate(sample, n))
    backend.close()
    return [write, busy, owner, owner_cycle, restore]


def _written(backend: HeapKeyedStateBackend, ids: Iterator[int], codec: Any) -> bytes:
    saved = ccodec.CODEC
    ccodec.CODEC = codec
    try:
        data = backend.snapshot(next(ids), io.BytesIO).result().handle.getvalue()
    finally:
        ccodec.CODEC = saved
    assert isinstance(data, bytes)
    return data


#: The shapes issue 28's owner target is stated for: its measurement (int keys,
#: int ValueStates). The str and list rows are reported beside it, as targets
#: of no issue: a str state costs the owner 0.68-0.69x (its copy-on-write
#: alone 0.88-0.90x), a list state's copy-on-write alone 0.51x (rule S deep-copies
#: it on the first get after a snapshot, as Flink's copy does).
OWNER_TARGET_SHAPES = ("int",)
#: The shapes issue 28's "no more than 2x slower while the owner works beside
#: it" is stated for. A list state is encoded with the GIL held, given back
#: every millisecond; a busy owner keeps it for its switch interval (5 ms)
#: before it hands it over, so the writer gets at most a sixth of the time:
#: that row is reported, not a target.
BUSY_TARGET_SHAPES = ("int", "str")


def targets(shapes: tuple[str, ...]) -> list[Target]:
    out = []
    for shape in shapes:
        write_limit = 0.5 if shape == "list" else 1.0
        out.append(
            Target(
                f"{shape} write with the C writer >= {write_limit}x pickle.dumps",
                f"write_{shape}",
                C,
                PICKLE,
                ">=",
                write_limit,
                "issue 28: the asynchronous part at least as fast as pickling the mappings "
                "(list states: within 2x)",
            )
        )
        if shape in BUSY_TARGET_SHAPES:
            out.append(
                Target(
                    f"{shape} write, owner busy, >= 0.5x pickle.dumps",
                    f"busy_{shape}",
                    C,
                    PICKLE,
                    ">=",
                    0.5,
                    "issue 28: no more than 2x slower while the owner works at full speed "
                    "beside it",
                )
            )
        if shape in OWNER_TARGET_SHAPES:
            out.append(
                Target(
                    f"{shape} owner updates while the C writer writes >= 0.7x idle",
                    f"owner_{shape}",
                    C,
                    IDLE,
                    ">=",
                    0.7,
                    "issue 28: the owner is not stopped by the checkpoint's asynchronous part",
                )
            )
        out += [
            Target(
                f"{shape} restore with the C codec >= 0.5x pickle.loads",
                f"restore_{shape}",
                C,
                PICKLE,
                ">=",
                0.5,
                "issue 28: restore within 2x of unpickling the mappings",
            ),
        ]
    return out


def run(cfg: Config) -> dict[str, Any]:
    started = time.perf_counter()
    notes: dict[str, Any] = {"load_before": os.getloadavg()}
    results: list[Result] = []
    for shape in cfg.shapes:
        results += phase(shape, cfg, notes)
        gc.collect()
    outcomes = check_targets(targets(cfg.shapes), results)
    wall = time.perf_counter() - started
    print()
    print(
        f"Snapshot codec benchmark: heap backend, {cfg.entries:,} ValueState entries per "
        f"shape, int keys, VOID_NAMESPACE, key groups 0-127; median of {cfg.repeats} rounds "
        f"after {cfg.warmup} warm-up; garbage collector "
        f"{'on' if cfg.gc_enabled else 'off'} while timed; Python {sys.version.split()[0]}"
    )
    print(
        "bytes (file / pickle): "
        + ", ".join(f"{s} {b['file']:,} / {b['pickle']:,}" for s, b in notes["bytes"].items())
    )
    print()
    print(format_table(results, COMPETITORS))
    print()
    print("C writer / Python loops (median of per-round ratios):")
    for result in results:
        if PYTHON not in result.samples:
            continue
        ratios = [
            c / p
            for c, p in zip(result.samples[C].values, result.samples[PYTHON].values, strict=True)
        ]
        print(f"  {result.label}: {sorted(ratios)[len(ratios) // 2]:.1f}x")
    print()
    print(f"load average before: {notes['load_before']}, after: {os.getloadavg()}")
    print("TARGETS (median of per-round ratios)")
    print(format_targets(outcomes, values=True, labels={c.key: c.label for c in COMPETITORS}))
    print()
    print(f"wall time {wall:.1f}s")
    return {
        "benchmark": "snapshot_codec",
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
        description="Benchmark the snapshot writer and reader with the C codec, in Python, "
        "and pickle of the same mappings."
    )
    p.add_argument("--entries", type=int, default=1_000_000, help="entries per shape")
    p.add_argument("--quick", action="store_true", help="smoke test: 100,000 entries")
    p.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: int,str")
    p.add_argument(
        "--no-gc", dest="gc_enabled", action="store_false", help="collector off while timed"
    )
    p.add_argument("--owner-ops", type=int, default=200_000, help="owner updates of an idle round")
    p.add_argument(
        "--owner-rounds", type=int, default=9, help="owner rounds (default 9: the noisiest row)"
    )
    p.add_argument("--output", type=Path, default=None, help="JSON file")
    a = p.parse_args(argv)
    shapes = tuple(s.strip() for s in a.shapes.split(",") if s.strip())
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        p.error(f"unknown shapes {unknown}; choose from {', '.join(SHAPES)}")
    path = a.output or RESULTS_PATH.with_name(
        "snapshot_codec_quick.json" if a.quick else RESULTS_PATH.name
    )
    return Config(
        entries=100_000 if a.quick else a.entries,
        repeats=a.repeats,
        warmup=a.warmup,
        shapes=shapes,
        gc_enabled=a.gc_enabled,
        owner_ops=20_000 if a.quick else a.owner_ops,
        owner_rounds=a.repeats if a.quick else a.owner_rounds,
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
