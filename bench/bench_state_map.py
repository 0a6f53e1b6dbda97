"""Benchmark: ``CopyOnWriteStateMap`` against dict and persistent maps.

Run::

    .venv/bin/python bench/bench_state_map.py            # 1,000,000 entries, grow to 4,000,000
    .venv/bin/python bench/bench_state_map.py --quick    # 100,000 entries, grow to 400,000,
                                                         # 3 rounds, 1 growth per structure
    .venv/bin/python bench/bench_state_map.py --entries N --grow-to M

Competitors (table columns)
===========================
``CoW map``        ``CopyOnWriteStateMap(serializer=ImmutableSerializer())``
                   (states are ints, so the serializer never copies; the
                   timed paths below never call it anyway).
``dict``           a plain dict keyed by the tuple ``(key, namespace)``; it has
                   no snapshot.
``dict+deepcopy``  the same kind of dict, snapshot = ``copy.deepcopy(d)``.
``dict.copy()``    the same kind of dict, snapshot = ``d.copy()`` (shallow:
                   correct only because the states are immutable).
``imm.Map.set``    ``immutables.Map`` keyed by the tuple, updated with
                   ``m = m.set(k, v)``; snapshot = keeping a reference.
``imm.mutate``     the same ``immutables.Map``, updated inside one mutation
                   context per timed loop: ``mm = m.mutate(); mm[k] = v ...;
                   m = mm.finish()`` (``mutate()`` and ``finish()`` are timed).
``pmap.set``       ``pyrsistent.pmap`` keyed by the tuple, ``p = p.set(k, v)``;
                   snapshot = keeping a reference.

The three dict columns are built the same way; their get/put cells are
separate timed runs (on one shared dict), and rows that would repeat the
identical run (growth, memory) print ``=dict``. Likewise ``imm.mutate``
shares the ``immutables.Map`` of ``imm.Map.set`` and prints ``=imm`` there.

Data
====
``N`` entries (``--entries``, default 1,000,000): key ``i`` (an int, the same
int object in every structure) for ``i`` in ``range(N)``, namespace
``NAMESPACES[i % 4]`` (four interned strings ``"ns0".."ns3"``), initial state
``i & 0x7F`` (a small cached int). Every structure holds the same mappings.
The map is built by ``put`` in key order, then driven (with ``contains_key``)
until its incremental rehash has finished, so every measurement sees the
steady state (``cowstate.introspection.describe`` reports it).

The operation list is ``OPS = min(200,000, N / 5)`` *distinct* existing
``(key, namespace)`` pairs in random order (fixed seed), built before any
timing as a list of 2-tuples, the same list for every competitor. One
exception: ``pmap.set`` updates use the first ``max(1,000, OPS / 50)`` pairs
of that list, because with the garbage collector enabled a single
``pmap.set`` on a large map can take ~0.1-1 ms (every young collection that
finds a new ``PVector`` walks its whole C-level tree), which would otherwise
dominate the run time; its figure is still a per-op median.

Method
======
Everything runs side by side in ONE process on the SAME keys. Each row is
measured with ``_harness.measure_interleaved``: 1 warm-up round (discarded),
then 5 rounds (``--repeats``; 3 with ``--quick``); a round runs every
competitor once, in column order, so machine drift is spread over all
columns. A full ``gc.collect()`` precedes every run (untimed) and the garbage
collector stays enabled during the run, so the young collections that a
structure's own allocations trigger are part of its cost. *Full* (oldest
generation) collections are kept out of steps 1-4: the ``N``-entry structures
are built, collected and frozen (``gc.freeze()``, so the ``gc.collect()``
before each run is cheap), and the third gc threshold is raised so that no
full collection starts inside a timed loop. Otherwise, whichever competitor
happened to cross CPython's trigger would pay for traversing every
competitor's heap (and right after ``gc.freeze()`` the trigger fires far too
often). Full-collection pauses are what step 5 measures. The cell is the
**median** of the rounds. Times are ``time.perf_counter_ns`` around the timed
section only.

1. ``get`` (ns/op): one timed loop over ``OPS``. Timed, per op: the
   ``for k, ns in pairs`` iteration and unpacking, then ``m.get(k, ns)`` for
   the map, ``d.get((k, ns))`` for the dicts and ``x.get((k, ns))`` for the
   persistent maps -- i.e. the tuple the dict needs is built inside the timed
   loop, just as the map receives two arguments. Bound methods are looked up
   once, outside the loop. The bare loop cost (``for k, ns in pairs: pass``)
   is printed separately and is *included* in every get/put figure.
2. ``put`` (ns/op): update every pair of ``OPS`` to a new small int (each run
   writes a value different from the key's current one, so no structure can
   skip the write): ``m.put(k, ns, v)``, ``d[(k, ns)] = v``,
   ``x = x.set((k, ns), v)``, or the mutation context described above.
   No snapshot is open.
3. ``put, snapshot open`` (ns/op): same loop, but first (untimed) take a
   snapshot: ``m.snapshot()``, ``copy.deepcopy(d)``, ``d.copy()``, or keep a
   reference to the persistent map. Every run takes a fresh snapshot, so every
   updated entry is shared with it and the map's copy-on-write work (copying
   entries and their chain predecessors) is inside the timed loop. The snapshot
   is released / dropped after the timed loop (untimed). For the dict peers the
   update after their snapshot is a plain dict put.
   Rows 2-3 are repeated with the garbage collector *disabled* during the
   timed loop (``put, GC off`` and ``put, snapshot open, GC off``; the
   ``dict+deepcopy`` column is skipped there, its update after the snapshot
   is the ``dict.copy()`` one). They show the operations' own cost: the young
   collections that allocations trigger -- copy-on-write entries, HAMT path
   nodes, and the traversal of every new large container such as a
   snapshot's bucket list -- are left out. The targets use the GC-on rows.
4. ``snapshot pause`` (ms): the synchronous part of taking a snapshot of the
   ``N``-entry structure: ``m.snapshot()`` (its ``release()`` is untimed),
   ``copy.deepcopy(d)``, ``d.copy()`` (freeing the copy is untimed), and for
   the persistent maps the time to bind a reference (zero work; what remains is
   the timer's own overhead).
5. growth latency (us): from an empty structure, insert keys ``0..M-1``
   (``--grow-to``, default 4,000,000) one at a time with
   ``perf_counter_ns`` around every single insert (``m.put(k, ns, s)``,
   ``d[(k, ns)] = s`` -- the tuple is built inside the timed region --, or
   ``mm[(k, ns)] = s`` in one mutation context of ``immutables.Map``). Reported:
   the worst single insert and the nearest-rank p99.9, each the median over
   ``--grow-repeats`` (default 3, 1 with ``--quick``) growths after one
   short warm-up growth (to 50,000 entries); once
   with the garbage collector enabled (the default, what a program sees; the
   target uses this row) and once with ``gc.disable()`` (isolates the
   structure's own pauses: table doubling / dict resize). The mean insert
   time is reported too. Only one structure exists during a growth; all
   ``N``-entry structures of steps 1-4 are freed before.
6. memory (bytes/entry): ``tracemalloc`` traces a fresh build of each
   structure from the already existing key ints, namespace strings and cached
   state ints, so the figure is what the structure itself allocates (dict
   tables, key tuples, map entries and bucket lists, cached hashes, HAMT
   nodes) divided by ``N``, measured after the build (map: after its rehash
   finished). Also reported: the peak while building, and the memory an open
   snapshot adds right after it is taken.

Targets, printed as MET / NOT MET. For rows measured round-robin (steps 1-4)
the ratio checked is the median of the per-round ratios (round ``i`` of the
two competitors ran back to back, so this cancels most machine drift); the
ratio of the two medians is printed next to it. Other rows use the ratio of
the medians.

- get time <= 1.5x dict's
- put time <= 8x dict's
- put with a snapshot open: ``imm.Map.set`` time / map time >= 3
- snapshot pause <= 1/50 of the deep-copy snapshot's
- worst single insert while growing to ``M`` (GC enabled) <= 1/5 of dict's
- memory per entry <= 3x dict's

Results are printed and written to ``bench/results/state_map.json``
(``state_map_quick.json`` with ``--quick``, so a smoke test never overwrites
a full run).
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import functools
import gc
import heapq
import random
import statistics
import sys
import time
import tracemalloc
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeAlias

import immutables
from _harness import (  # bench/ is on sys.path when this file runs as a script
    Competitor,
    Result,
    Sample,
    Target,
    check_targets,
    format_table,
    format_targets,
    machine_info,
    measure,
    measure_interleaved,
    paired_ratio,
    percentile_from_top,
    write_json,
)
from pyrsistent import PMap, pmap

from cowstate import CopyOnWriteStateMap
from cowstate.introspection import describe
from cowstate.serializers import ImmutableSerializer

NAMESPACES: tuple[str, ...] = tuple(sys.intern(f"ns{i}") for i in range(4))
#: gc threshold2 during steps 1-4: no automatic full collection starts.
NO_FULL_COLLECTION = 1_000_000_000
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "state_map.json"

MAP = "cow_map"
DICT = "dict"
DICT_DEEPCOPY = "dict_deepcopy"
DICT_COPY = "dict_copy"
IMM = "immutables"
IMM_MUTATE = "immutables_mutate"
PMAP = "pmap"

COMPETITORS: tuple[Competitor, ...] = (
    Competitor(MAP, "CoW map"),
    Competitor(DICT, "dict"),
    Competitor(DICT_DEEPCOPY, "dict+deepcopy"),
    Competitor(DICT_COPY, "dict.copy()"),
    Competitor(IMM, "imm.Map.set"),
    Competitor(IMM_MUTATE, "imm.mutate"),
    Competitor(PMAP, "pmap.set"),
)

TARGETS: tuple[Target, ...] = (
    Target("get time <= 1.5x dict", "get", MAP, DICT, "<=", 1.5,
           "CoW map get ns/op over dict.get((k, ns)) ns/op"),
    Target("put time <= 8x dict", "put", MAP, DICT, "<=", 8.0,
           "CoW map put ns/op over d[(k, ns)] = v ns/op"),
    Target("put with snapshot open >= 3x faster than immutables.Map.set", "put_snapshot",
           IMM, MAP, ">=", 3.0,
           "immutables.Map.set ns/op over CoW map put ns/op, a snapshot open for both"),
    Target("snapshot pause <= 1/50 of deepcopy", "snapshot_pause", MAP, DICT_DEEPCOPY,
           "<=", 1 / 50, "m.snapshot() over copy.deepcopy(d)"),
    Target("worst insert while growing <= 1/5 of dict (GC on)", "grow_worst", MAP, DICT,
           "<=", 1 / 5, "median worst single insert, map over dict, GC enabled"),
    Target("memory per entry <= 3x dict", "memory", MAP, DICT, "<=", 3.0,
           "tracemalloc bytes per entry, map over dict"),
)

StateMap: TypeAlias = CopyOnWriteStateMap[int, str, int]
Pairs: TypeAlias = list[tuple[int, str]]


@dataclass(frozen=True)
class Config:
    entries: int
    grow_to: int
    ops: int
    repeats: int
    warmup: int
    grow_repeats: int
    seed: int
    quick: bool
    skip_memory: bool
    output: str


class Box:
    """Holds the current version of a persistent map (its updates return new maps)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class ValueSource:
    """A new small int per timed run of a structure, never equal to the key's
    current state: initial states are ``< 128``, run values cycle ``128..255``."""

    def __init__(self) -> None:
        self._runs: dict[str, int] = {}

    def next(self, structure: str) -> int:
        n = self._runs.get(structure, -1) + 1
        self._runs[structure] = n
        return 128 + n % 128


# --------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------


def settle(m: StateMap) -> None:
    """Drive the map's incremental rehash to its end (contains_key steps it)."""
    probe = NAMESPACES[0]
    while describe(m).is_rehashing:
        for _ in range(1024):
            m.contains_key(-1, probe)


def build_map(keys: list[int]) -> StateMap:
    m: StateMap = CopyOnWriteStateMap(serializer=ImmutableSerializer())
    put = m.put
    nss = NAMESPACES
    for k in keys:
        put(k, nss[k & 3], k & 0x7F)
    settle(m)
    return m


def build_dict(keys: list[int]) -> dict[tuple[int, str], int]:
    nss = NAMESPACES
    return {(k, nss[k & 3]): k & 0x7F for k in keys}


def build_immutables(keys: list[int]) -> immutables.Map[tuple[int, str], int]:
    nss = NAMESPACES
    mm = immutables.Map[tuple[int, str], int]().mutate()
    for k in keys:
        mm[(k, nss[k & 3])] = k & 0x7F
    return mm.finish()


def build_pmap(keys: list[int]) -> PMap[tuple[int, str], int]:
    nss = NAMESPACES
    ev: Any = pmap().evolver()
    for k in keys:
        ev[(k, nss[k & 3])] = k & 0x7F
    result: PMap[tuple[int, str], int] = ev.persistent()
    return result


# --------------------------------------------------------------------------
# Timed runs (each returns the nanoseconds of its timed section)
# --------------------------------------------------------------------------

clock = time.perf_counter_ns


def timer_overhead() -> int:
    """Nanoseconds between two back-to-back ``perf_counter_ns`` calls."""
    t0 = clock()
    return clock() - t0


def run_loop_only(pairs: Pairs) -> int:
    t0 = clock()
    for _k, _ns in pairs:
        pass
    return clock() - t0


def run_get_map(m: StateMap, pairs: Pairs) -> int:
    get = m.get
    t0 = clock()
    for k, ns in pairs:
        get(k, ns)
    return clock() - t0


def run_get_tuple_keyed(getter: Callable[[tuple[int, str]], object], pairs: Pairs) -> int:
    get = getter
    t0 = clock()
    for k, ns in pairs:
        get((k, ns))
    return clock() - t0


def run_put_map(m: StateMap, pairs: Pairs, v: int) -> int:
    put = m.put
    t0 = clock()
    for k, ns in pairs:
        put(k, ns, v)
    return clock() - t0


def run_put_dict(d: dict[tuple[int, str], int], pairs: Pairs, v: int) -> int:
    t0 = clock()
    for k, ns in pairs:
        d[(k, ns)] = v
    return clock() - t0


def run_set_persistent(box: Box, pairs: Pairs, v: int) -> int:
    x = box.value
    t0 = clock()
    for k, ns in pairs:
        x = x.set((k, ns), v)
    elapsed = clock() - t0
    box.value = x
    return elapsed


def run_mutate_immutables(box: Box, pairs: Pairs, v: int) -> int:
    t0 = clock()
    mm = box.value.mutate()
    for k, ns in pairs:
        mm[(k, ns)] = v
    x = mm.finish()
    elapsed = clock() - t0
    box.value = x
    return elapsed


def run_put_map_snapshot(m: StateMap, pairs: Pairs, v: int) -> int:
    snap = m.snapshot()                       # untimed: a fresh snapshot shares every entry
    elapsed = run_put_map(m, pairs, v)
    if len(snap) != len(m):
        raise AssertionError("snapshot size changed")
    snap.release()
    return elapsed


def run_put_dict_snapshot(d: dict[tuple[int, str], int], pairs: Pairs, v: int,
                          take: Callable[[dict[tuple[int, str], int]], object]) -> int:
    snap = take(d)                            # untimed
    elapsed = run_put_dict(d, pairs, v)
    del snap
    return elapsed


def run_persistent_snapshot(box: Box, pairs: Pairs, v: int,
                            update: Callable[[Box, Pairs, int], int]) -> int:
    snap = box.value                          # the snapshot: a reference
    elapsed = update(box, pairs, v)
    if snap is box.value:
        raise AssertionError("a persistent update returned the same map")
    del snap
    return elapsed


def pause_map(m: StateMap) -> int:
    t0 = clock()
    snap = m.snapshot()
    elapsed = clock() - t0
    snap.release()
    return elapsed


def pause_copy(d: dict[tuple[int, str], int],
               take: Callable[[dict[tuple[int, str], int]], object]) -> int:
    t0 = clock()
    snap = take(d)
    elapsed = clock() - t0
    del snap
    return elapsed


def pause_reference(box: Box) -> int:
    t0 = clock()
    snap = box.value
    elapsed = clock() - t0
    del snap
    return elapsed


# --------------------------------------------------------------------------
# Growth latency
# --------------------------------------------------------------------------


class GcWatch:
    """gc.callbacks hook: duration of every collection, by generation."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, int]] = []
        self._t0 = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = clock()
        else:
            self.pauses.append((info["generation"], clock() - self._t0))


def grow(kind: str, n: int) -> array[int]:
    """Insert keys ``0..n-1`` into an empty structure, timing every insert."""
    lat = array("q", bytes(8 * n))
    nss = NAMESPACES
    if kind == MAP:
        m: StateMap = CopyOnWriteStateMap(serializer=ImmutableSerializer())
        put = m.put
        for k in range(n):
            ns = nss[k & 3]
            s = k & 0x7F
            t0 = clock()
            put(k, ns, s)
            lat[k] = clock() - t0
        if len(m) != n:
            raise AssertionError("map lost entries")
    elif kind == DICT:
        d: dict[tuple[int, str], int] = {}
        for k in range(n):
            ns = nss[k & 3]
            s = k & 0x7F
            t0 = clock()
            d[(k, ns)] = s
            lat[k] = clock() - t0
        if len(d) != n:
            raise AssertionError("dict lost entries")
    elif kind == IMM_MUTATE:
        mm = immutables.Map[tuple[int, str], int]().mutate()
        for k in range(n):
            ns = nss[k & 3]
            s = k & 0x7F
            t0 = clock()
            mm[(k, ns)] = s
            lat[k] = clock() - t0
        if len(mm.finish()) != n:
            raise AssertionError("immutables lost entries")
    else:
        raise ValueError(kind)
    return lat


@dataclass(frozen=True)
class GrowthRun:
    worst_us: float
    worst_at: int
    p999_us: float
    mean_ns: float
    gc_collections: int
    gc_full_collections: int
    gc_longest_us: float


def growth_run(kind: str, n: int, gc_enabled: bool) -> GrowthRun:
    gc.collect()
    watch = GcWatch()
    gc.callbacks.append(watch)
    was_enabled = gc.isenabled()
    try:
        if not gc_enabled:
            gc.disable()
        lat = grow(kind, n)
    finally:
        if was_enabled:
            gc.enable()
        gc.callbacks.remove(watch)
    keep = n - max(1, -(-999 * n // 1000)) + 1                # values needed for p99.9
    top_values = heapq.nlargest(keep, lat)
    return GrowthRun(
        worst_us=top_values[0] / 1e3,
        worst_at=lat.index(top_values[0]),
        p999_us=percentile_from_top(top_values, n, 0.999) / 1e3,
        mean_ns=sum(lat) / n,
        gc_collections=len(watch.pauses),
        gc_full_collections=sum(1 for g, _ in watch.pauses if g == 2),
        gc_longest_us=max((p for _, p in watch.pauses), default=0) / 1e3,
    )


# --------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------


def traced_build(build: Callable[[], Any]) -> tuple[Any, int, int]:
    """``(structure, bytes allocated and kept, peak bytes)`` of ``build()``;
    tracemalloc must be tracing."""
    gc.collect()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    obj = build()
    current, peak = tracemalloc.get_traced_memory()
    return obj, current - before, peak - before


def traced_snapshot(take: Callable[[], Any]) -> int:
    """Bytes an open snapshot keeps allocated right after ``take()``."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    snap = take()
    after = tracemalloc.get_traced_memory()[0]
    release = getattr(snap, "release", None)
    if callable(release):
        release()
    del snap
    return after - before


# --------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------


def slow_ops(ops: int) -> int:
    """Operations per timed loop for ``pmap.set`` (see the module doc)."""
    return min(ops, max(1_000, ops // 50))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass(frozen=True)
class Workload:
    """The keys every structure holds and the operation list every loop uses."""

    keys: list[int]
    pairs: Pairs

    @classmethod
    def make(cls, cfg: Config) -> Workload:
        rng = random.Random(cfg.seed)
        keys = list(range(cfg.entries))
        pairs = [(k, NAMESPACES[k & 3]) for k in rng.sample(keys, cfg.ops)]
        return cls(keys, pairs)


def phase_operations(cfg: Config, w: Workload, notes: dict[str, Any]) -> list[Result]:
    """Steps 1-4 on ``N``-entry structures; they are freed when this returns."""
    n = cfg.entries
    log(f"building {n:,} entries in every structure")
    t = time.perf_counter()
    cow = build_map(w.keys)
    internals = describe(cow)
    log(f"  CoW map built and settled in {time.perf_counter() - t:.1f}s: capacity "
        f"{internals.capacity:,}, rehashing={internals.is_rehashing}")
    d = build_dict(w.keys)
    imm = Box(immutables.Map(d))
    pm = Box(pmap(d))

    def check_sizes() -> None:
        for name, size in ((MAP, len(cow)), (DICT, len(d)), (IMM, len(imm.value)),
                           (PMAP, len(pm.value))):
            if size != n:
                raise AssertionError(f"{name} has {size} entries, expected {n}")

    check_sizes()
    notes["map_internals_at_start"] = _internals_json(internals)
    # See the module doc: young collections run as usual, full ones are left to step 5.
    gc.collect()
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(thresholds[0], thresholds[1], NO_FULL_COLLECTION)
    try:
        return _operations(cfg, w, notes, cow, d, imm, pm, check_sizes)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _operations(cfg: Config, w: Workload, notes: dict[str, Any], cow: StateMap,
                d: dict[tuple[int, str], int], imm: Box, pm: Box,
                check_sizes: Callable[[], None]) -> list[Result]:
    ops, pairs = cfg.ops, w.pairs
    slow_pairs = pairs[:slow_ops(ops)]          # pmap updates: see the module doc
    values = ValueSource()

    def row(metric: str, label: str, unit: str,
            runs: dict[str, tuple[Callable[[], int], float]],
            missing: dict[str, str], gc_enabled: bool = True) -> Result:
        """Measure ``runs`` (competitor -> (run, scale)) round-robin into one row;
        each repetition's nanoseconds are multiplied by the scale."""
        samples = measure_interleaved({k: fn for k, (fn, _) in runs.items()},
                                      warmup=cfg.warmup, repeats=cfg.repeats,
                                      gc_enabled=gc_enabled)
        result = Result(metric, label, unit, missing=missing, paired=True)
        for key, (_, scale) in runs.items():
            result.set(key, samples[key].scaled(scale))
        return result

    per_op, per_slow_op, to_ms = 1 / ops, 1 / len(slow_pairs), 1e-6

    notes["perf_counter_ns_overhead_ns"] = statistics.median(
        timer_overhead() for _ in range(10_001))
    notes["bare_loop_ns_per_op"] = measure(
        lambda: run_loop_only(pairs), warmup=cfg.warmup, repeats=cfg.repeats).median * per_op
    log(f"bare loop {notes['bare_loop_ns_per_op']:.1f} ns/op, perf_counter_ns overhead "
        f"{notes['perf_counter_ns_overhead_ns']:.0f} ns")

    log(f"get: {ops:,} lookups x ({cfg.warmup} warm-up + {cfg.repeats} repetitions)")
    r_get = row("get", "get (existing keys, random order)", "ns/op", {
        MAP: (lambda: run_get_map(cow, pairs), per_op),
        DICT: (lambda: run_get_tuple_keyed(d.get, pairs), per_op),
        DICT_DEEPCOPY: (lambda: run_get_tuple_keyed(d.get, pairs), per_op),
        DICT_COPY: (lambda: run_get_tuple_keyed(d.get, pairs), per_op),
        IMM: (lambda: run_get_tuple_keyed(imm.value.get, pairs), per_op),
        PMAP: (lambda: run_get_tuple_keyed(pm.value.get, pairs), per_op),
    }, {IMM_MUTATE: "=imm"})

    log("put: update existing keys, no snapshot")
    r_put = row("put", "put (update existing, no snapshot)", "ns/op", {
        MAP: (lambda: run_put_map(cow, pairs, values.next(MAP)), per_op),
        DICT: (lambda: run_put_dict(d, pairs, values.next(DICT)), per_op),
        DICT_DEEPCOPY: (lambda: run_put_dict(d, pairs, values.next(DICT)), per_op),
        DICT_COPY: (lambda: run_put_dict(d, pairs, values.next(DICT)), per_op),
        IMM: (lambda: run_set_persistent(imm, pairs, values.next(IMM)), per_op),
        IMM_MUTATE: (lambda: run_mutate_immutables(imm, pairs, values.next(IMM)), per_op),
        PMAP: (lambda: run_set_persistent(pm, slow_pairs, values.next(PMAP)), per_slow_op),
    }, {})

    log("put while a snapshot is open")
    r_sput = row("put_snapshot", "put, snapshot open (CoW work)", "ns/op", {
        MAP: (lambda: run_put_map_snapshot(cow, pairs, values.next(MAP)), per_op),
        DICT_DEEPCOPY: (lambda: run_put_dict_snapshot(
            d, pairs, values.next(DICT), copy.deepcopy), per_op),
        DICT_COPY: (lambda: run_put_dict_snapshot(
            d, pairs, values.next(DICT), dict.copy), per_op),
        IMM: (lambda: run_persistent_snapshot(
            imm, pairs, values.next(IMM), run_set_persistent), per_op),
        IMM_MUTATE: (lambda: run_persistent_snapshot(
            imm, pairs, values.next(IMM), run_mutate_immutables), per_op),
        PMAP: (lambda: run_persistent_snapshot(
            pm, slow_pairs, values.next(PMAP), run_set_persistent), per_slow_op),
    }, {DICT: "n/a"})

    log("put and put while a snapshot is open, GC disabled during the loop")
    r_put_off = row("put_nogc", "put, GC off", "ns/op", {
        MAP: (lambda: run_put_map(cow, pairs, values.next(MAP)), per_op),
        DICT: (lambda: run_put_dict(d, pairs, values.next(DICT)), per_op),
        IMM: (lambda: run_set_persistent(imm, pairs, values.next(IMM)), per_op),
        IMM_MUTATE: (lambda: run_mutate_immutables(imm, pairs, values.next(IMM)), per_op),
        PMAP: (lambda: run_set_persistent(pm, slow_pairs, values.next(PMAP)), per_slow_op),
    }, {DICT_DEEPCOPY: "=dict", DICT_COPY: "=dict"}, gc_enabled=False)
    r_sput_off = row("put_snapshot_nogc", "put, snapshot open, GC off", "ns/op", {
        MAP: (lambda: run_put_map_snapshot(cow, pairs, values.next(MAP)), per_op),
        DICT_COPY: (lambda: run_put_dict_snapshot(
            d, pairs, values.next(DICT), dict.copy), per_op),
        IMM: (lambda: run_persistent_snapshot(
            imm, pairs, values.next(IMM), run_set_persistent), per_op),
        IMM_MUTATE: (lambda: run_persistent_snapshot(
            imm, pairs, values.next(IMM), run_mutate_immutables), per_op),
        PMAP: (lambda: run_persistent_snapshot(
            pm, slow_pairs, values.next(PMAP), run_set_persistent), per_slow_op),
    }, {DICT: "n/a", DICT_DEEPCOPY: "=d.copy"}, gc_enabled=False)

    log("snapshot pause")
    r_pause = row("snapshot_pause", "snapshot pause (synchronous part)", "ms", {
        MAP: (lambda: pause_map(cow), to_ms),
        DICT_DEEPCOPY: (lambda: pause_copy(d, copy.deepcopy), to_ms),
        DICT_COPY: (lambda: pause_copy(d, dict.copy), to_ms),
        IMM: (lambda: pause_reference(imm), to_ms),
        PMAP: (lambda: pause_reference(pm), to_ms),
    }, {DICT: "n/a", IMM_MUTATE: "=imm"})

    check_sizes()
    notes["map_internals_at_end"] = _internals_json(describe(cow))
    return [r_get, r_put, r_sput, r_put_off, r_sput_off, r_pause]


def _internals_json(internals: Any) -> dict[str, Any]:
    out: dict[str, Any] = asdict(internals)
    out["open_versions"] = sorted(internals.open_versions)
    return out


def phase_growth(cfg: Config, details: dict[str, Any]) -> list[Result]:
    """Step 5: per-insert latency while growing from empty, GC on and off."""
    r_worst = Result("grow_worst", f"worst insert, grow to {cfg.grow_to:,}", "us")
    r_p999 = Result("grow_p999", "p99.9 insert, growing", "us")
    r_mean = Result("grow_mean", "mean insert, growing", "ns/op")
    r_worst_off = Result("grow_worst_nogc", "worst insert, growing, GC off", "us")
    r_p999_off = Result("grow_p999_nogc", "p99.9 insert, growing, GC off", "us")
    rows = [r_worst, r_p999, r_mean, r_worst_off, r_p999_off]
    for row in rows:
        row.missing.update({DICT_DEEPCOPY: "=dict", DICT_COPY: "=dict", IMM: "-", PMAP: "-"})
    for kind in (MAP, DICT, IMM_MUTATE):
        grow(kind, min(cfg.grow_to, 50_000))              # warm-up growth, discarded
        for gc_on in (True, False):
            label = f"{kind}/gc_{'on' if gc_on else 'off'}"
            log(f"growth to {cfg.grow_to:,}: {label}, {cfg.grow_repeats} runs")
            runs = [growth_run(kind, cfg.grow_to, gc_on) for _ in range(cfg.grow_repeats)]
            details[label] = [asdict(r) for r in runs]
            for r in runs:
                log(f"    worst {r.worst_us:,.0f} us at insert #{r.worst_at:,}, p99.9 "
                    f"{r.p999_us:.2f} us, mean {r.mean_ns:.0f} ns, {r.gc_collections} "
                    f"collections ({r.gc_full_collections} full), longest "
                    f"{r.gc_longest_us:,.0f} us")
            worst = Sample(tuple(r.worst_us for r in runs))
            p999 = Sample(tuple(r.p999_us for r in runs))
            if gc_on:
                r_worst.set(kind, worst)
                r_p999.set(kind, p999)
                r_mean.set(kind, Sample(tuple(r.mean_ns for r in runs)))
            else:
                r_worst_off.set(kind, worst)
                r_p999_off.set(kind, p999)
    return rows


def phase_memory(cfg: Config, w: Workload) -> list[Result]:
    """Step 6: tracemalloc bytes per entry of a fresh build of each structure."""
    n = cfg.entries
    r_mem = Result("memory", "memory per entry", "B/entry")
    r_peak = Result("memory_peak", "peak while building", "B/entry")
    r_snap = Result("snapshot_memory", "an open snapshot adds", "B/entry")
    for row in (r_mem, r_peak):
        row.missing.update({DICT_DEEPCOPY: "=dict", DICT_COPY: "=dict", IMM_MUTATE: "=imm"})
    r_snap.missing.update({DICT: "n/a", IMM_MUTATE: "=imm"})
    builders: tuple[tuple[str, Callable[[], Any]], ...] = (
        (MAP, lambda: build_map(w.keys)),
        (DICT, lambda: build_dict(w.keys)),
        (IMM, lambda: build_immutables(w.keys)),
        (PMAP, lambda: build_pmap(w.keys)),
    )
    tracemalloc.start()
    try:
        for kind, build in builders:
            t = time.perf_counter()
            obj, kept, peak = traced_build(build)
            r_mem.set(kind, Sample.single(kept / n))
            r_peak.set(kind, Sample.single(peak / n))
            if kind == MAP:
                r_snap.set(MAP, Sample.single(traced_snapshot(obj.snapshot) / n))
            elif kind == DICT:
                r_snap.set(DICT_DEEPCOPY, Sample.single(
                    traced_snapshot(functools.partial(copy.deepcopy, obj)) / n))
                r_snap.set(DICT_COPY, Sample.single(traced_snapshot(obj.copy) / n))
            else:
                r_snap.set(kind, Sample.single(
                    traced_snapshot(functools.partial(_identity, obj)) / n))
            log(f"  {kind}: {kept / n:.1f} B/entry, peak {peak / n:.1f} "
                f"({time.perf_counter() - t:.1f}s)")
            del obj
    finally:
        tracemalloc.stop()
    return [r_mem, r_peak, r_snap]


def _identity(x: Any) -> Any:
    return x


def ratio_rows(results: list[Result]) -> list[Result]:
    """Per row: CoW map / competitor -- the median of the per-round ratios for
    round-robin rows, else the ratio of the medians (as the targets do)."""
    rows = []
    for row in results:
        base = row.samples.get(MAP)
        ratio = Result(row.metric, row.label, "x", missing=dict(row.missing))
        for c in COMPETITORS:
            other = row.samples.get(c.key)
            if base is None or other is None:
                continue
            value = paired_ratio(base, other) if row.paired else None
            if value is None and other.median != 0:
                value = base.median / other.median
            if value is not None:
                ratio.set(c.key, Sample.single(value))
        rows.append(ratio)
    return rows


def run(cfg: Config) -> dict[str, Any]:
    started = time.perf_counter()
    w = Workload.make(cfg)
    notes: dict[str, Any] = {"competitors": {c.key: c.label for c in COMPETITORS}}
    growth_details: dict[str, Any] = {}

    results = phase_operations(cfg, w, notes)
    gc.collect()
    results += phase_growth(cfg, growth_details)
    if not cfg.skip_memory:
        log("memory (tracemalloc)")
        results += phase_memory(cfg, w)

    wall = time.perf_counter() - started
    outcomes = check_targets(TARGETS, results)
    ratios = ratio_rows(results)

    print()
    print(f"CopyOnWriteStateMap benchmark: {cfg.entries:,} entries, {cfg.ops:,} ops per timed "
          f"loop, median of {cfg.repeats} repetitions after {cfg.warmup} warm-up; growth to "
          f"{cfg.grow_to:,}: median of {cfg.grow_repeats}")
    print(f"Python {sys.version.split()[0]}; bare loop {notes['bare_loop_ns_per_op']:.1f} ns/op "
          f"(included in get/put); perf_counter_ns overhead "
          f"{notes['perf_counter_ns_overhead_ns']:.0f} ns (included in insert latencies)")
    print()
    print(format_table(results, COMPETITORS))
    print()
    print("Ratios: CoW map / competitor (< 1: the map is faster or smaller; round-robin rows: "
          "median of per-round ratios)")
    print(format_table(ratios, COMPETITORS))
    print()
    print("TARGETS")
    print(format_targets(outcomes))
    print()
    print(f"wall time {wall:.1f}s")

    return {
        "benchmark": "state_map",
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "wall_time_s": wall,
        "config": asdict(cfg),
        "machine": machine_info(),
        "notes": notes,
        "results": [r.to_json() for r in results],
        "ratios_map_over_competitor": {
            r.metric: {k: s.median for k, s in r.samples.items()} for r in ratios},
        "targets": [o.to_json() for o in outcomes],
        "growth_runs": growth_details,
    }


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(description="Benchmark CopyOnWriteStateMap against its peers.")
    p.add_argument("--entries", type=int, default=1_000_000, help="entries (default 1,000,000)")
    p.add_argument("--grow-to", type=int, default=4_000_000,
                   help="entries of the growth-latency test (default 4,000,000)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 100,000 entries, grow to 400,000")
    p.add_argument("--ops", type=int, default=None,
                   help="operations per timed loop (default min(200,000, entries / 5))")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed rounds per row (default 5; 3 with --quick)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--grow-repeats", type=int, default=None,
                   help="growths per structure and GC mode (default 3; 1 with --quick)")
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--skip-memory", action="store_true", help="skip the tracemalloc step")
    p.add_argument("--output", type=Path, default=None,
                   help=f"JSON file (default {RESULTS_PATH.name}; "
                        f"{RESULTS_PATH.stem}_quick.json with --quick)")
    a = p.parse_args(argv)
    entries, grow_to = (100_000, 400_000) if a.quick else (a.entries, a.grow_to)
    output = a.output if a.output is not None else (
        RESULTS_PATH.with_name(f"{RESULTS_PATH.stem}_quick.json") if a.quick else RESULTS_PATH)
    repeats = a.repeats if a.repeats is not None else (3 if a.quick else 5)
    grow_repeats = a.grow_repeats if a.grow_repeats is not None else (1 if a.quick else 3)
    ops = a.ops if a.ops is not None else min(200_000, max(1, entries // 5))
    if not 0 < ops <= entries:
        p.error(f"--ops must be in 1..entries, got {ops}")
    return Config(entries=entries, grow_to=grow_to, ops=ops, repeats=repeats,
                  warmup=a.warmup, grow_repeats=grow_repeats, seed=a.seed, quick=a.quick,
                  skip_memory=a.skip_memory, output=str(output))


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    payload = run(cfg)
    write_json(Path(cfg.output), payload)
    print(f"results written to {cfg.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
