"""Benchmark: one keyed update through a backend's handle, against a dict keyed by
``(key, namespace)`` (issue 28, "a lighter keyed path").

Run::

    .venv/bin/python bench/bench_keyed_path.py             # 1,000,000 entries (~1 min)
    .venv/bin/python bench/bench_keyed_path.py --quick     # 100,000 entries
    .venv/bin/python bench/bench_keyed_path.py --entries N --ops M --repeats R

Competitors (columns)
=====================
``dict``          ``{(key, None): state}``: what a program without cowstate keeps;
                  the tuple is built in the loop, as a backend's caller has only
                  the key.
``backend (C)``   ``HeapKeyedStateBackend`` over C maps (``_impls.table_factory("c")``),
                  key groups 0-127 of 128, one ``ValueState`` of ints, the
                  namespace ``VOID_NAMESPACE``.
``backend (py)``  the same over pure-Python maps (for comparison; no target).
``C map``         the bare C map, ``m.get(key, None)`` / ``m.put(key, None, ...)``:
                  what the backend adds on top of it.

Rows
====
``keyed update``  per key: ``set_current_key(key); state.update(state.value() + 1)``
                  against ``t = (key, None); d[t] = d[t] + 1`` (and
                  ``m.put(key, None, m.get(key, None) + 1)``).
``keyed read``    per key: ``set_current_key(key); state.value()`` against
                  ``d[(key, None)]`` (and ``m.get(key, None)``).

Data: ``N`` entries (``--entries``, default 1,000,000; 100,000 with ``--quick``),
int keys ``0 .. N-1``, int states; every structure built with the same
mappings before timing. The timed keys: ``--ops`` (default 200,000) keys drawn
at random (seed 28) from the existing ones, the same list for every
competitor, so every operation updates an existing mapping.

Method
======
``_harness.measure_interleaved``: the competitors round-robin, 1 warm-up round
(discarded) then ``--repeats`` (default 5) rounds, a full ``gc.collect()``
before each run, the collector on during it. Each run times one loop over the
timed keys with ``perf_counter_ns``, every callable bound to a local first
(for every competitor alike). The table shows the median of the rounds in
thousands of operations per second; the ratio is the median of the per-round
ratios (``backend (C)`` / ``dict``, higher is better). Everything in one
process.

Target (issue 28): ``keyed update`` of ``backend (C)`` >= 0.8x ``dict``
(0.40x before the lighter path). Results go to ``bench/results/keyed_path.json``
(``keyed_path_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import random
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
    measure_interleaved,
    write_json,
)
from _impls import C_MAP, NOT_BUILT, table_factory

from cowstate import HeapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor

RESULTS = Path(__file__).resolve().parent / "results"
MAX_PARALLELISM = 128

DICT, BACKEND_C, BACKEND_PY, CMAP = "dict", "backend_c", "backend_py", "c_map"
COMPETITORS = (
    Competitor(DICT, "dict"),
    Competitor(BACKEND_C, "backend (C)"),
    Competitor(BACKEND_PY, "backend (py)"),
    Competitor(CMAP, "C map"),
)
TARGETS = [
    Target(
        "a keyed update >= 0.8x a dict keyed by (key, ns)",
        "update",
        BACKEND_C,
        DICT,
        ">=",
        0.8,
        "issue 28: set_current_key + value() + update() against the dict's get and set",
    ),
]

Loop = Callable[[list[int]], None]


def dict_update(d: dict[tuple[int, None], int]) -> Loop:
    def loop(keys: list[int]) -> None:
        for key in keys:
            t = (key, None)
            d[t] = d[t] + 1

    return loop


def dict_read(d: dict[tuple[int, None], int]) -> Loop:
    def loop(keys: list[int]) -> None:
        for key in keys:
            d[(key, None)]

    return loop


def backend_update(backend: HeapKeyedStateBackend, state: Any) -> Loop:
    def loop(keys: list[int]) -> None:
        set_key = backend.set_current_key
        value = state.value
        update = state.update
        for key in keys:
            set_key(key)
            update(value() + 1)

    return loop


def backend_read(backend: HeapKeyedStateBackend, state: Any) -> Loop:
    def loop(keys: list[int]) -> None:
        set_key = backend.set_current_key
        value = state.value
        for key in keys:
            set_key(key)
            value()

    return loop


def map_update(m: Any) -> Loop:
    def loop(keys: list[int]) -> None:
        get = m.get
        put = m.put
        for key in keys:
            put(key, None, get(key, None) + 1)

    return loop


def map_read(m: Any) -> Loop:
    def loop(keys: list[int]) -> None:
        get = m.get
        for key in keys:
            get(key, None)

    return loop


def build_backend(kind: str, n: int) -> tuple[HeapKeyedStateBackend, Any]:
    backend = HeapKeyedStateBackend(
        KeyGroupRange(0, MAX_PARALLELISM - 1), MAX_PARALLELISM, table_factory(kind)
    )
    state = backend.get_state(ValueStateDescriptor("bench_keyed_path"))
    for key in range(n):
        backend.set_current_key(key)
        state.update(key)
    return backend, state


def timed(loop: Loop, keys: list[int]) -> Callable[[], int]:
    def run() -> int:
        t0 = time.perf_counter_ns()
        loop(keys)
        return time.perf_counter_ns() - t0

    return run


def run(entries: int, ops: int, repeats: int, output: Path) -> int:
    print(f"entries: {entries:,}, ops: {ops:,}, repeats: {repeats}", flush=True)
    rng = random.Random(28)
    keys = [rng.randrange(entries) for _ in range(ops)]
    d = {(key, None): key for key in range(entries)}
    backends = {BACKEND_C: build_backend("c", entries) if C_MAP is not None else None}
    backends[BACKEND_PY] = build_backend("python", entries)
    cmap: Any = None
    if C_MAP is not None:
        cmap = C_MAP()
        for key in range(entries):
            cmap.put(key, None, key)
    rows = [
        Result("update", "keyed update", "k ops/s", paired=True),
        Result("read", "keyed read", "k ops/s", paired=True),
    ]
    loops: dict[str, dict[str, Loop]] = {
        "update": {DICT: dict_update(d)},
        "read": {DICT: dict_read(d)},
    }
    for key, built in backends.items():
        if built is None:
            for row in rows:
                row.missing[key] = NOT_BUILT
            continue
        loops["update"][key] = backend_update(*built)
        loops["read"][key] = backend_read(*built)
    if cmap is not None:
        loops["update"][CMAP] = map_update(cmap)
        loops["read"][CMAP] = map_read(cmap)
    else:
        for row in rows:
            row.missing[CMAP] = NOT_BUILT
    for row in rows:
        samples = measure_interleaved(
            {k: timed(loop, keys) for k, loop in loops[row.metric].items()}, repeats=repeats
        )
        for k, sample in samples.items():  # ns per loop -> thousands of operations per second
            row.set(k, Sample(tuple(ops / ns * 1e6 for ns in sample.values)))
        print(f"  {row.label}: done", flush=True)
    for built in backends.values():
        if built is not None:
            built[0].close()
    print()
    print(format_table(rows, COMPETITORS))
    outcomes = check_targets(TARGETS, rows)
    print("\nTARGET (issue 28):")
    labels = {c.key: c.label for c in COMPETITORS}
    print(format_targets(outcomes, values=True, labels=labels, missing=rows[0].missing))
    write_json(
        output,
        {
            "entries": entries,
            "ops": ops,
            "repeats": repeats,
            "results": [row.to_json() for row in rows],
            "targets": [o.to_json() for o in outcomes],
            "machine": machine_info(),
        },
    )
    print(f"\nresults written to {output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=None, help="entries (default 1,000,000)")
    p.add_argument("--ops", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="100,000 entries")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    entries = args.entries or (100_000 if args.quick else 1_000_000)
    name = "keyed_path_quick.json" if args.quick else "keyed_path.json"
    return run(entries, args.ops, args.repeats, args.output or RESULTS / name)


if __name__ == "__main__":
    sys.exit(main())
