"""Benchmark: the default serializer (the value codec) against pickle, in the
heap backend's asynchronous snapshot write and its restore.

Run::

    .venv/bin/python bench/bench_serializers.py            # 200,000 entries per shape (~3 min)
    .venv/bin/python bench/bench_serializers.py --quick    # 20,000 entries, 3 rounds (~15 s)
    .venv/bin/python bench/bench_serializers.py --entries N --repeats R --shapes int,tuple

Competitors (columns)
=====================
``codec``   ``DefaultSerializer()`` (identifier ``cowstate-value``: the value
            codec, :mod:`cowstate.value_codec`) as the backend's key and
            namespace serializer and the state's serializer -- the default.
``pickle``  ``PickleSerializer()`` in the same three places: what the default
            was before the value codec (``pickle.dumps`` at the highest
            protocol, ``pickle.loads``).

Data
====
Per state shape, one ``HeapKeyedStateBackend`` per competitor over the full
key-group range ``[0, 127]`` of max parallelism 128 (``--max-parallelism``),
with one ``ValueState`` holding ``N`` entries (``--entries``, default
200,000; 20,000 with ``--quick``): int keys ``0..N-1``, namespace
``VOID_NAMESPACE`` (the default), and for key ``i`` the state

============  =====================================================
shape         state of key ``i``
============  =====================================================
``int``       ``i * 7919``
``str``       ``f"user-{i}-clicked-home"``
``tuple``     ``(i, f"page-{i % 100}", i * 0.5)``
``list``      ``[i, i + 1, ..., i + 7]`` (8 ints)
``dict``      ``{"views": i, "clicks": i % 7, "carts": i % 3, "buys": 1}``
============  =====================================================

filled through the handle (``set_current_key(i); state.update(v)``), untimed.

Method
======
Everything runs side by side in ONE process, with
``_harness.measure_interleaved``: per shape and row, 1 warm-up round
(``--warmup``, discarded), then 5 rounds (``--repeats``; 3 with
``--quick``), each round running both competitors once (codec first). A full
``gc.collect()`` precedes each run (untimed), the garbage collector stays on
during it. The process pins itself to one CPU (``--no-pin`` to disable), so
the writer thread and the caller share one CPU as they share the GIL. Rows:

1. ``async write`` (M entries/s): one run is one checkpoint:
   ``future = backend.snapshot(id, io.BytesIO)`` (untimed), then timed from
   the call's return until ``future.result()`` is available: the writer
   thread's ``write_snapshot`` -- reading every entry of the copy-on-write
   snapshot, serializing key, namespace and state, building and writing each
   key group's block with its CRC32, the index and footer. ``N / time``.
2. ``restore`` (M entries/s): a fresh backend with the same serializers and
   the descriptor registered (untimed), then timed
   ``backend.restore([snapshot bytes])``: reading and checking the file,
   deserializing every key, namespace and state, filling the copy-on-write
   tables. The bytes are the competitor's own snapshot from row 1 (written
   once, untimed, before the rounds). ``N / time``.

The cell is the median of the rounds. The target (issue 15): the default
serializer's rate is at least 0.8x pickle's (a drop of at most 20 %) for
every shape and both rows, judged by the median of the per-round ratios
``codec / pickle`` (which cancels most machine drift). The JSON goes to
``bench/results/serializers.json`` (``serializers_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import io
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

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

from cowstate import (
    DefaultSerializer,
    HeapKeyedStateBackend,
    KeyGroupRange,
    PickleSerializer,
    StateSerializer,
    ValueStateDescriptor,
)

RESULTS_PATH = Path(__file__).parent / "results" / "serializers.json"
STATE_NAME = "bench_value"
CODEC, PICKLE = "codec", "pickle"
COMPETITORS = (
    Competitor(CODEC, "codec"),
    Competitor(PICKLE, "pickle"),
)
SERIALIZERS: dict[str, Callable[[], StateSerializer]] = {
    CODEC: DefaultSerializer,
    PICKLE: PickleSerializer,
}
SHAPES: dict[str, Callable[[int], Any]] = {
    "int": lambda i: i * 7919,
    "str": lambda i: f"user-{i}-clicked-home",
    "tuple": lambda i: (i, f"page-{i % 100}", i * 0.5),
    "list": lambda i: list(range(i, i + 8)),
    "dict": lambda i: {"views": i, "clicks": i % 7, "carts": i % 3, "buys": 1},
}
#: The issue's limit: rates may drop by at most 20 %.
LIMIT = 0.8
clock = time.perf_counter_ns


@dataclass(frozen=True)
class Config:
    entries: int
    repeats: int
    warmup: int
    max_parallelism: int
    shapes: tuple[str, ...]
    quick: bool
    pin: bool
    output: str


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pin_to_one_cpu() -> int | None:
    """Restrict this process (and its later threads) to its lowest allowed CPU."""
    if not hasattr(os, "sched_getaffinity") or not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def new_backend(competitor: str, max_parallelism: int) -> HeapKeyedStateBackend:
    make = SERIALIZERS[competitor]
    return HeapKeyedStateBackend(
        KeyGroupRange(0, max_parallelism - 1),
        max_parallelism,
        key_serializer=make(),
        namespace_serializer=make(),
    )


def descriptor(competitor: str) -> ValueStateDescriptor[Any]:
    return ValueStateDescriptor(STATE_NAME, serializer=SERIALIZERS[competitor]())


def build(competitor: str, shape: str, cfg: Config) -> HeapKeyedStateBackend:
    backend = new_backend(competitor, cfg.max_parallelism)
    state = backend.get_state(descriptor(competitor))
    value_of = SHAPES[shape]
    set_key, update = backend.set_current_key, state.update
    for i in range(cfg.entries):
        set_key(i)
        update(value_of(i))
    if backend.num_state_entries() != cfg.entries:
        raise AssertionError(f"{competitor} holds {backend.num_state_entries()} entries")
    return backend


def run_write(backend: HeapKeyedStateBackend, ids: Iterator[int], n: int) -> int:
    future = backend.snapshot(next(ids), io.BytesIO)
    t0 = clock()
    result = future.result()
    elapsed = clock() - t0
    if result.info is None or result.info.entries != n:
        raise AssertionError(f"snapshot wrote {result.info}")
    return elapsed


def run_restore(competitor: str, data: bytes, cfg: Config, check: Any) -> int:
    with new_backend(competitor, cfg.max_parallelism) as backend:
        backend.get_state(descriptor(competitor))
        t0 = clock()
        backend.restore([data])
        elapsed = clock() - t0
        if backend.num_state_entries() != cfg.entries:
            raise AssertionError(f"{competitor} restored {backend.num_state_entries()} entries")
        key, value = check
        backend.set_current_key(key)
        restored = backend.get_state(descriptor(competitor)).value()
        if restored != value or type(restored) is not type(value):
            raise AssertionError(f"{competitor} restored {restored!r} for {key}, not {value!r}")
    return elapsed


def rate(times_ns: Sample, n: int) -> Sample:
    """M entries/s per round."""
    return Sample(tuple(n / (t / 1e9) / 1e6 for t in times_ns.values))


def phase(shape: str, cfg: Config, notes: dict[str, Any]) -> list[Result]:
    write = Result(f"write_{shape}", f"{shape}: async write", "M entries/s", paired=True)
    restore = Result(f"restore_{shape}", f"{shape}: restore", "M entries/s", paired=True)
    ids = itertools.count(1)
    check = (cfg.entries // 2, SHAPES[shape](cfg.entries // 2))
    with contextlib.ExitStack() as stack:
        backends = {c.key: stack.enter_context(build(c.key, shape, cfg)) for c in COMPETITORS}
        files: dict[str, bytes] = {}
        for key, backend in backends.items():
            result = backend.snapshot(next(ids), io.BytesIO).result()
            files[key] = result.handle.getvalue()
        notes.setdefault("file_bytes", {})[shape] = {k: len(v) for k, v in files.items()}
        times = measure_interleaved(
            {
                key: (lambda b=backend: run_write(b, ids, cfg.entries))
                for key, backend in backends.items()
            },
            warmup=cfg.warmup,
            repeats=cfg.repeats,
        )
        for key, sample in times.items():
            write.set(key, rate(sample, cfg.entries))
        times = measure_interleaved(
            {key: (lambda k=key: run_restore(k, files[k], cfg, check)) for key in backends},
            warmup=cfg.warmup,
            repeats=cfg.repeats,
        )
        for key, sample in times.items():
            restore.set(key, rate(sample, cfg.entries))
    return [write, restore]


def targets(shapes: tuple[str, ...]) -> list[Target]:
    out = []
    for shape in shapes:
        for row, what in (("write", "async write"), ("restore", "restore")):
            out.append(
                Target(
                    f"{shape} {what} rate >= 0.8x pickle",
                    f"{row}_{shape}",
                    CODEC,
                    PICKLE,
                    ">=",
                    LIMIT,
                    "issue 15: the safe default may cost at most 20 % of pickle's rate",
                )
            )
    return out


def run(cfg: Config) -> dict[str, Any]:
    started = time.perf_counter()
    pinned = pin_to_one_cpu() if cfg.pin else None
    notes: dict[str, Any] = {"pinned_cpu": pinned}
    results: list[Result] = []
    for shape in cfg.shapes:
        log(f"{shape}: building {cfg.entries:,} entries per competitor")
        results += phase(shape, cfg, notes)
        gc.collect()
    outcomes = check_targets(targets(cfg.shapes), results)
    wall = time.perf_counter() - started
    print()
    print(
        f"Serializer benchmark: heap backend, {cfg.entries:,} entries per shape, int keys, "
        f"VOID_NAMESPACE, max parallelism {cfg.max_parallelism}; median of {cfg.repeats} "
        f"rounds after {cfg.warmup} warm-up; Python {sys.version.split()[0]}; "
        + ("not pinned" if pinned is None else f"pinned to CPU {pinned}")
    )
    print(
        "snapshot file bytes per entry (codec / pickle): "
        + ", ".join(
            f"{shape} {sizes[CODEC] / cfg.entries:.0f} / {sizes[PICKLE] / cfg.entries:.0f}"
            for shape, sizes in notes["file_bytes"].items()
        )
    )
    print()
    print(format_table(results, COMPETITORS))
    print()
    print("TARGETS (codec / pickle, median of per-round ratios)")
    print(format_targets(outcomes, values=True, labels={c.key: c.label for c in COMPETITORS}))
    print()
    print(f"wall time {wall:.1f}s")
    return {
        "benchmark": "serializers",
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
        description="Benchmark the default serializer (value codec) against pickle: heap "
        "backend asynchronous snapshot write and restore rates."
    )
    p.add_argument("--entries", type=int, default=200_000, help="entries per shape")
    p.add_argument("--quick", action="store_true", help="smoke test: 20,000 entries, 3 rounds")
    p.add_argument("--repeats", type=int, default=None, help="rounds (default 5; 3 with --quick)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-parallelism", type=int, default=128)
    p.add_argument(
        "--shapes",
        default=",".join(SHAPES),
        help=f"comma-separated subset of {', '.join(SHAPES)} (default all)",
    )
    p.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin to one CPU")
    p.add_argument("--output", type=Path, default=None, help="JSON file")
    a = p.parse_args(argv)
    entries = 20_000 if a.quick else a.entries
    repeats = a.repeats if a.repeats is not None else (3 if a.quick else 5)
    shapes = tuple(s.strip() for s in a.shapes.split(",") if s.strip())
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        p.error(f"--shapes: expected names of {', '.join(SHAPES)}, got {', '.join(unknown)}")
    if entries < 2 or repeats < 1 or a.warmup < 0:
        p.error("--entries must be >= 2, --repeats >= 1 and --warmup >= 0")
    output = a.output or (
        RESULTS_PATH.with_name(f"{RESULTS_PATH.stem}_quick.json") if a.quick else RESULTS_PATH
    )
    return Config(
        entries=entries,
        repeats=repeats,
        warmup=a.warmup,
        max_parallelism=a.max_parallelism,
        shapes=shapes,
        quick=a.quick,
        pin=a.pin,
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
