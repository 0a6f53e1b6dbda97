"""Benchmark: a full ``gc.collect()`` with a keyed backend alive, against a dict of
the same mappings (issue 28).

Run::

    .venv/bin/python bench/bench_backend_gc.py             # 2,000,000 entries (~1 min)
    .venv/bin/python bench/bench_backend_gc.py --quick     # 200,000 entries
    .venv/bin/python bench/bench_backend_gc.py --entries N --repeats R

Competitors (columns)
=====================
``dict``           ``{(key, None): state}``: what a program without cowstate keeps.
``backend (C)``    ``HeapKeyedStateBackend`` over C maps (``_impls.table_factory("c")``),
                   key groups 0-127 of 128, one ``ValueState`` of ints set through
                   the handle (``set_current_key(key); state.update(value)``), so
                   every entry's namespace is ``VOID_NAMESPACE``.
``C, GC ns``       the same backend with every entry in a namespace of a GC type:
                   an instance of ``PythonVoidNamespace`` (what ``VOID_NAMESPACE``
                   was before issue 28: a class written in Python), so every entry
                   counts as holding a container (the C map's invariant 12) and a
                   collection traverses them all.

Data: ``N`` entries (``--entries``, default 2,000,000; 200,000 with ``--quick``),
key ``i`` (an int) for ``i`` in ``range(N)``, state ``i & 0xFFFF`` + 1000 (ints,
most outside the small-int cache). Each structure holds its own objects.

Method
======
One structure alive at a time (with two alive, each collection would walk
both): build it with the collector off, ``gc.collect()`` twice (the first
untracks what CPython can untrack: tuples of ints, dicts of atomic values),
then ``_harness.measure`` times ``gc.collect()`` (a full collection) 1 + 5
times (``--repeats``), warm-up discarded, the median reported; the structure
is dropped before the next is built. ``nothing`` is the same collection with
no structure alive (the interpreter's own objects). The ratio is of medians
(the structures cannot run round-robin). Everything in one process.

Target (issue 28): ``backend (C)`` <= 1.5x ``dict``. The ``C, GC ns`` column
shows what the target was about (issue 28 measured 295 ms against 5.4 ms at
2M, 55x). Results go to ``bench/results/backend_gc.json``
(``backend_gc_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import (
    Competitor,
    Result,
    Sample,
    Target,
    check_targets,
    format_table,
    format_targets,
    machine_info,
    measure,
    write_json,
)
from _impls import C_MAP, NOT_BUILT, table_factory

from cowstate import HeapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor
from cowstate.keyed_state import PythonVoidNamespace

RESULTS = Path(__file__).resolve().parent / "results"
MAX_PARALLELISM = 128

NOTHING, DICT, BACKEND, GC_NAMESPACE = "nothing", "dict", "backend_c", "backend_c_gc_ns"
COMPETITORS = (
    Competitor(NOTHING, "nothing"),
    Competitor(DICT, "dict"),
    Competitor(BACKEND, "backend (C)"),
    Competitor(GC_NAMESPACE, "C, GC ns"),
)
TARGETS = [
    Target(
        "full gc.collect() with a keyed backend alive <= 1.5x a dict's of the same mappings",
        "gc",
        BACKEND,
        DICT,
        "<=",
        1.5,
        "issue 28: VOID_NAMESPACE must cost the collector nothing",
    ),
]


def state_of(key: int) -> int:
    return (key & 0xFFFF) + 1000


def build_dict(n: int) -> dict[tuple[int, None], int]:
    return {(key, None): state_of(key) for key in range(n)}


def build_backend(n: int, namespace: Any = None) -> HeapKeyedStateBackend:
    backend = HeapKeyedStateBackend(
        KeyGroupRange(0, MAX_PARALLELISM - 1), MAX_PARALLELISM, table_factory("c")
    )
    state = backend.get_state(ValueStateDescriptor("bench_gc"))
    if namespace is not None:
        backend.set_current_namespace(namespace)
    for key in range(n):
        backend.set_current_key(key)
        state.update(state_of(key))
    return backend


def full_collection() -> int:
    t0 = time.perf_counter_ns()
    gc.collect()
    return time.perf_counter_ns() - t0


def collect_with(build: Callable[[], object], repeats: int) -> tuple[Sample, float]:
    """The sample of full collections with ``build()``'s structure alive, and
    how long building it took (s)."""
    was_enabled = gc.isenabled()
    gc.disable()
    t0 = time.perf_counter()
    structure = build()
    built = time.perf_counter() - t0
    if was_enabled:
        gc.enable()
    gc.collect()
    gc.collect()
    sample = measure(full_collection, warmup=1, repeats=repeats, collect=False)
    close = getattr(structure, "close", None)
    if close is not None:
        close()
    del structure
    gc.collect()
    return sample, built


def run(entries: int, repeats: int, output: Path) -> int:
    print(f"entries: {entries:,}, repeats: {repeats}", flush=True)
    row = Result("gc", "full gc.collect()", "ms")
    builders: dict[str, Callable[[], object]] = {
        NOTHING: lambda: None,
        DICT: lambda: build_dict(entries),
    }
    if C_MAP is not None:
        builders[BACKEND] = lambda: build_backend(entries)
        builders[GC_NAMESPACE] = lambda: build_backend(entries, PythonVoidNamespace())
    else:
        row.missing[BACKEND] = row.missing[GC_NAMESPACE] = NOT_BUILT
    built: dict[str, float] = {}
    for key, build in builders.items():
        sample, built[key] = collect_with(build, repeats)
        row.set(key, sample.scaled(1e-6))
        print(f"  {key}: built in {built[key]:.1f} s, gc.collect() {row.value(key):.3g} ms")
    print()
    print(format_table([row], COMPETITORS))
    outcomes = check_targets(TARGETS, [row])
    print("\nTARGET (issue 28):")
    labels = {c.key: c.label for c in COMPETITORS}
    print(format_targets(outcomes, values=True, labels=labels, missing=row.missing))
    base = row.value(GC_NAMESPACE)
    dict_ms = row.value(DICT)
    if base is not None and dict_ms:
        print(
            f"  (with a namespace of a GC type, as before issue 28: {base / dict_ms:.3g}x the dict)"
        )
    write_json(
        output,
        {
            "entries": entries,
            "repeats": repeats,
            "build_seconds": built,
            "results": [row.to_json()],
            "targets": [o.to_json() for o in outcomes],
            "machine": machine_info(),
        },
    )
    print(f"\nresults written to {output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=None, help="entries (default 2,000,000)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="200,000 entries")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    entries = args.entries or (200_000 if args.quick else 2_000_000)
    name = "backend_gc_quick.json" if args.quick else "backend_gc.json"
    return run(entries, args.repeats, args.output or RESULTS / name)


if __name__ == "__main__":
    sys.exit(main())
