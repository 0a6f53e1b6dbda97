"""Benchmark: the copy-on-write state map, in C and in Python, against dict and
persistent maps, at 1 million and 10 million entries (issue 13).

Run::

    .venv/bin/python bench/bench_state_map.py            # 1M and 10M entries, grow to 10M (~45 min)
    .venv/bin/python bench/bench_state_map.py --quick    # 100,000 entries, grow to 400,000,
                                                         # 3 rounds, 1 growth per structure
    .venv/bin/python bench/bench_state_map.py --entries 1000000 --entries 10000000
    .venv/bin/python bench/bench_state_map.py --sizes 1000000,2000000 --grow-to 2000000

Competitors (table columns)
===========================
``C map``          ``cowstate._cmap.CopyOnWriteStateMap(serializer=ImmutableSerializer())``,
                   the C extension. Printed as ``n/a (not built)`` when
                   ``cowstate._cmap`` cannot be imported; everything else
                   still runs. It is imported directly, so
                   ``COWSTATE_PURE_PYTHON=1`` does not hide it.
``CoW map (py)``   ``cowstate.state_map.CopyOnWriteStateMap(serializer=ImmutableSerializer())``,
                   the pure-Python map (the reference implementation).
                   States are ints, so the serializer never copies; the timed
                   paths below never call it anyway.
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
identical run (growth, memory, gc) print ``=dict``. Likewise ``imm.mutate``
shares the ``immutables.Map`` of ``imm.Map.set`` and prints ``=imm`` there.

Sizes and what is skipped at large sizes
========================================
Every size given (``--entries N``, repeatable, or ``--sizes N,M``; default
1,000,000 and 10,000,000; ``--quick``: 100,000) runs steps 1-4, 6 and 7 below
on its own structures; step 5 (growth) runs once, to ``--grow-to`` (default:
the largest size), and step 8 (owner under load) once, at ``--owner-entries``
(default: the smallest size). Above ``--full-peers-up-to`` entries (default
2,000,000) the competitors that cannot finish in reasonable time on a 2-core
machine are skipped, and their cells print ``skip >2M`` (the limit):

- ``pmap.set`` entirely (building a 10M ``pmap`` takes minutes and a
  ``pmap.set`` with GC on ~0.1-1 ms, see below);
- ``dict+deepcopy``'s snapshot pause and put-with-snapshot runs (one
  ``copy.deepcopy`` of a 10M dict takes tens of seconds, and each of these
  rows needs six);
- the pure map's growth (with the garbage collector on, each full collection
  walks every ``_Entry`` object: growing a pure map to 4M took minutes, to 10M
  it takes far longer) -- it is skipped when ``--grow-to`` exceeds the limit;
- the tracemalloc memory rows (step 7) of the pure map and ``pmap``
  (tracemalloc makes their 10M builds several times slower); the C map, the
  dict and ``immutables`` are traced at every size;
- the pure map's full ``gc.collect()`` is timed once, without warm-up (each
  takes seconds at 10M: ~1-2 s per million entries).

Data
====
``N`` entries: key ``i`` (an int, the same int object in every structure) for
``i`` in ``range(N)``, namespace ``NAMESPACES[i % 4]`` (four interned strings
``"ns0".."ns3"``), initial state ``i & 0x7F`` (a small cached int). Every
structure holds the same mappings. The keys are held in a tuple, which the
garbage collector untracks after its first collection (it holds only ints),
so the keys themselves cost no collection time in step 6. The maps are built
by ``put`` in key order, then driven (with ``contains_key``) until their
incremental rehash has finished, so every measurement sees the steady state.
Structures are built with the garbage collector disabled (building is never
timed).

The operation list is ``OPS = min(200,000, N / 5)`` *distinct* existing
``(key, namespace)`` pairs in random order (fixed seed), built before any
timing as a tuple of 2-tuples, the same for every competitor. One exception:
``pmap.set`` updates use the first ``max(1,000, OPS / 50)`` pairs of that
list, because with the garbage collector enabled a single ``pmap.set`` on a
large map can take ~0.1-1 ms (every young collection that finds a new
``PVector`` walks its whole C-level tree), which would otherwise dominate the
run time; its figure is still a per-op median.

Method
======
Everything runs side by side in ONE process on the SAME keys. Each row of
steps 1-4 is measured with ``_harness.measure_interleaved``: 1 warm-up round
(discarded), then 5 rounds (``--repeats``; 3 with ``--quick``); a round runs
every competitor once, in column order, so machine drift is spread over all
columns. A full ``gc.collect()`` precedes every run (untimed) and the garbage
collector stays enabled during the run, so the young collections that a
structure's own allocations trigger are part of its cost. *Full* (oldest
generation) collections are kept out of steps 1-4: the ``N``-entry structures
are built, collected and frozen (``gc.freeze()``, so the ``gc.collect()``
before each run is cheap), and the third gc threshold is raised so that no
full collection starts inside a timed loop. Otherwise, whichever competitor
happened to cross CPython's trigger would pay for traversing every
competitor's heap (and right after ``gc.freeze()`` the trigger fires far too
often). Full-collection pauses are what step 6 measures. The cell is the
**median** of the rounds. Times are ``time.perf_counter_ns`` around the timed
section only.

1. ``get`` (ns/op): one timed loop over ``OPS``. Timed, per op: the
   ``for k, ns in pairs`` iteration and unpacking, then ``m.get(k, ns)`` for
   the maps, ``d.get((k, ns))`` for the dicts and ``x.get((k, ns))`` for the
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
   entries and their chain predecessors; for the C map also the first write
   into each shared chunk of the bucket directory) is inside the timed loop.
   The snapshot is released / dropped after the timed loop (untimed). For the
   dict peers the update after their snapshot is a plain dict put.
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
   (``--grow-to``, default the largest size) one at a time with
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
   ``N``-entry structures of the other steps are freed before.
6. full collection, one structure at a time: with only the keys tuple and
   the operation list alive (both untracked by the collector), build one
   structure (GC off), ``gc.collect()``, then time ``gc.collect()`` (a full
   collection) 1 + 5 times (warm-up discarded, median) with that structure
   alive: ``full gc.collect()`` [ms]. The same collection with no structure
   built is printed as the baseline (what the interpreter's own objects
   cost); the dict is untracked by the collector (its keys and values are
   untracked), so its figure is about that baseline, and so must a map's be
   that holds no container. (The process's resident-set growth per build was
   tried as an allocator-independent memory figure and dropped: after the
   earlier steps free their structures, the allocators reuse memory they kept
   and a build grows the resident set by a fraction of what it allocates.)
7. memory (tracemalloc, bytes/entry): ``tracemalloc`` traces a fresh build of
   each structure from the already existing key ints, namespace strings and
   cached state ints, so the figure is what the structure itself allocates
   through Python's allocators (dict tables, key tuples, map entries and
   bucket lists, cached hashes, HAMT nodes) divided by ``N``, measured after
   the build (maps: after their rehash finished). Also reported: the peak
   while building, and the memory an open snapshot adds right after it is
   taken. The C map allocates its entries, chunks and directories with
   ``PyMem_*``, so tracemalloc sees all of it. The target uses this row.
8. owner under load (issue 13's last target; ``--owner-entries``, default the
   smallest size): ``bench_table_backend``'s update loop -- ``OPS`` updates
   through a ``ValueState`` handle of a ``HeapKeyedStateBackend`` over a
   ``CopyOnWriteStateTable`` of the C map or of the pure map (max parallelism
   128, ``N`` states ``[i]``), half puts of a new list, half in-place
   mutations -- once idle and once while the backend's writer thread writes a
   snapshot (``backend.snapshot(id, io.BytesIO)`` called right before the
   loop), in ns/op and kops/s, round-robin as above, with the process pinned
   to one CPU during this step (``--no-pin``; see ``bench_table_backend.py``
   for why). ``bench_table_backend.py`` measures the same loop with more
   columns.

Targets (issue 13), printed as MET / NOT MET with both numbers, for the C
map, per size; the same figures of the pure map follow for comparison. For
rows measured round-robin (steps 1-4, 8) the ratio checked is the median of
the per-round ratios (round ``i`` of the two competitors ran back to back, so
this cancels most machine drift); the ratio of the two medians is printed
next to it. Other rows use the ratio of the medians.

- get time <= 1.2x dict's; put time <= 1.5x dict's (dict keyed by the tuple)
- put with a snapshot open: ``imm.Map.set`` time / map time >= 5
- snapshot pause <= 1 ms (the issue asks it at 10M entries; checked at every size)
- full ``gc.collect()`` with the ``N`` entries alive <= 3x the dict's
- worst single insert while growing to ``M`` (GC enabled) <= 1/20 of dict's
- memory per entry (tracemalloc) <= 1.5x dict's
- owner update throughput while the writer writes >= 0.5x idle

Results are printed and written to ``bench/results/state_map.json``
(``state_map_quick.json`` with ``--quick``, so a smoke test never overwrites
a full run).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import ctypes.util
import datetime as _dt
import functools
import gc
import heapq
import itertools
import os
import random
import statistics
import sys
import time
import tracemalloc
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import bench_table_backend as tb  # bench/ is on sys.path when this file runs as a script
import immutables
from _harness import (
    Competitor,
    Result,
    Sample,
    Target,
    TargetOutcome,
    check_targets,
    format_table,
    format_targets,
    machine_info,
    measure,
    measure_interleaved,
    paired_ratio,
    percentile_from_top,
    time_ns,
    write_json,
)
from _impls import (
    C_MAP,
    NOT_BUILT,
    PURE_MAP,
    StateMapLike,
    implementation_summary,
    is_rehashing,
    settle,
)
from pyrsistent import PMap, pmap

from cowstate.introspection import describe
from cowstate.serializers import ImmutableSerializer
from cowstate.state_map import CopyOnWriteStateMap as PureStateMap

NAMESPACES: tuple[str, ...] = tuple(sys.intern(f"ns{i}") for i in range(4))
#: gc threshold2 during steps 1-4: no automatic full collection starts.
NO_FULL_COLLECTION = 1_000_000_000
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "state_map.json"
DEFAULT_SIZES = (1_000_000, 10_000_000)
QUICK_SIZE = 100_000
QUICK_GROW_TO = 400_000
DEFAULT_FULL_PEERS_UP_TO = 2_000_000

MAP_C = "c_map"
MAP = "cow_map"
DICT = "dict"
DICT_DEEPCOPY = "dict_deepcopy"
DICT_COPY = "dict_copy"
IMM = "immutables"
IMM_MUTATE = "immutables_mutate"
PMAP = "pmap"

COMPETITORS: tuple[Competitor, ...] = (
    Competitor(MAP_C, "C map"),
    Competitor(MAP, "CoW map (py)"),
    Competitor(DICT, "dict"),
    Competitor(DICT_DEEPCOPY, "dict+deepcopy"),
    Competitor(DICT_COPY, "dict.copy()"),
    Competitor(IMM, "imm.Map.set"),
    Competitor(IMM_MUTATE, "imm.mutate"),
    Competitor(PMAP, "pmap.set"),
)
LABELS: dict[str, str] = {c.key: c.label for c in COMPETITORS}
#: the map implementations: column -> class (None: not built)
MAP_CLASSES: dict[str, Callable[..., Any] | None] = {MAP_C: C_MAP, MAP: PURE_MAP}
MAP_IMPLS: dict[str, str] = {MAP_C: "c", MAP: "python"}
COL_WIDTH = 16

# step 8 columns
OWNER_C_IDLE = "c_idle"
OWNER_C_WRITER = "c_writer"
OWNER_PY_IDLE = "py_idle"
OWNER_PY_WRITER = "py_writer"
OWNER_COMPETITORS: tuple[Competitor, ...] = (
    Competitor(OWNER_C_IDLE, "C map idle"),
    Competitor(OWNER_C_WRITER, "C map+writer"),
    Competitor(OWNER_PY_IDLE, "py map idle"),
    Competitor(OWNER_PY_WRITER, "py map+writer"),
)
OWNER_COLUMNS: dict[str, tuple[str, str, str]] = {  # column -> (map column, table kind, mode)
    OWNER_C_IDLE: (MAP_C, tb.COW_C, "idle"),
    OWNER_C_WRITER: (MAP_C, tb.COW_C, "writer"),
    OWNER_PY_IDLE: (MAP, tb.COW, "idle"),
    OWNER_PY_WRITER: (MAP, tb.COW, "writer"),
}
OWNER_TARGET_COLUMNS: dict[str, tuple[str, str]] = {
    MAP_C: (OWNER_C_WRITER, OWNER_C_IDLE),
    MAP: (OWNER_PY_WRITER, OWNER_PY_IDLE),
}


def size_targets(m: str, n: int) -> tuple[Target, ...]:
    """Issue 13's per-size targets for the map column ``m`` at ``n`` entries."""
    at = f" [{n:,} entries]"
    name = LABELS[m]
    return (
        Target(
            f"get <= 1.2x dict{at}",
            "get",
            m,
            DICT,
            "<=",
            1.2,
            f"{name} get ns/op over dict.get((k, ns)) ns/op",
        ),
        Target(
            f"put <= 1.5x dict{at}",
            "put",
            m,
            DICT,
            "<=",
            1.5,
            f"{name} put ns/op over d[(k, ns)] = v ns/op",
        ),
        Target(
            f"put with a snapshot open >= 5x faster than immutables.Map.set{at}",
            "put_snapshot",
            IMM,
            m,
            ">=",
            5.0,
            f"immutables.Map.set ns/op over {name} put ns/op, a snapshot open for both",
        ),
        Target(
            f"snapshot() pause <= 1 ms{at}",
            "snapshot_pause",
            m,
            None,
            "<=",
            1.0,
            f"{name} m.snapshot() in ms (issue 13 asks it at 10M entries)",
        ),
        Target(
            f"full gc.collect() <= 3x dict's{at}",
            "gc_full",
            m,
            DICT,
            "<=",
            3.0,
            f"gc.collect() with the {name} alive over the same with the dict alive",
        ),
        Target(
            f"memory per entry <= 1.5x dict{at}",
            "memory",
            m,
            DICT,
            "<=",
            1.5,
            f"tracemalloc bytes per entry, {name} over dict",
        ),
    )


def growth_targets(m: str, grow_to: int) -> tuple[Target, ...]:
    return (
        Target(
            f"worst insert growing to {grow_to:,}, GC on, <= 1/20 of dict's",
            "grow_worst",
            m,
            DICT,
            "<=",
            1 / 20,
            f"median worst single insert, {LABELS[m]} over dict, GC enabled",
        ),
    )


def owner_targets(m: str, n: int) -> tuple[Target, ...]:
    writer, idle = OWNER_TARGET_COLUMNS[m]
    return (
        Target(
            f"owner update throughput while the writer writes >= 0.5x idle [{n:,} entries]",
            "owner_kops",
            writer,
            idle,
            ">=",
            0.5,
            f"owner updates/s while the backend writer writes a snapshot, over "
            f"updates/s with none ({LABELS[m]})",
        ),
    )


Pairs: TypeAlias = tuple[tuple[int, str], ...]
Keys: TypeAlias = Sequence[int]


@dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...]
    grow_to: int
    ops: int | None
    repeats: int
    warmup: int
    grow_repeats: int
    seed: int
    quick: bool
    full_peers_up_to: int
    owner_entries: int
    pin: bool
    skip_memory: bool
    skip_growth: bool
    skip_owner: bool
    output: str

    def ops_for(self, n: int) -> int:
        return self.ops if self.ops is not None else min(200_000, max(1, n // 5))

    def big(self, n: int) -> bool:
        """Whether the slow competitors are skipped at ``n`` entries."""
        return n > self.full_peers_up_to

    @property
    def skip_note(self) -> str:
        return f"skip >{self.full_peers_up_to / 1e6:g}M"


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


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages (other processes compete for the CPUs)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@contextlib.contextmanager
def gc_disabled() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# --------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------


def new_map(column: str) -> StateMapLike:
    cls = MAP_CLASSES[column]
    if cls is None:
        raise LookupError(f"{column} is not built")
    m: StateMapLike = cls(serializer=ImmutableSerializer())
    return m


def build_map(column: str, keys: Iterable[int]) -> StateMapLike:
    with gc_disabled():
        m = new_map(column)
        put = m.put
        nss = NAMESPACES
        for k in keys:
            put(k, nss[k & 3], k & 0x7F)
        settle(m, NAMESPACES[0])
    return m


def build_dict(keys: Iterable[int]) -> dict[tuple[int, str], int]:
    nss = NAMESPACES
    with gc_disabled():
        return {(k, nss[k & 3]): k & 0x7F for k in keys}


def build_immutables(keys: Iterable[int]) -> immutables.Map[tuple[int, str], int]:
    nss = NAMESPACES
    with gc_disabled():
        mm = immutables.Map[tuple[int, str], int]().mutate()
        for k in keys:
            mm[(k, nss[k & 3])] = k & 0x7F
        return mm.finish()


def build_pmap(keys: Iterable[int]) -> PMap[tuple[int, str], int]:
    nss = NAMESPACES
    with gc_disabled():
        ev: Any = pmap().evolver()
        for k in keys:
            ev[(k, nss[k & 3])] = k & 0x7F
        result: PMap[tuple[int, str], int] = ev.persistent()
    return result


def builder(kind: str, keys: Keys) -> Callable[[], Any]:
    if kind in MAP_CLASSES:
        return functools.partial(build_map, kind, keys)
    builders: dict[str, Callable[[], Any]] = {
        DICT: functools.partial(build_dict, keys),
        IMM: functools.partial(build_immutables, keys),
        PMAP: functools.partial(build_pmap, keys),
    }
    return builders[kind]


def built_maps() -> list[str]:
    """The map columns whose implementation is importable."""
    return [k for k, cls in MAP_CLASSES.items() if cls is not None]


def mark_not_built(rows: Iterable[Result]) -> None:
    for column, cls in MAP_CLASSES.items():
        if cls is None:
            for r in rows:
                r.missing[column] = NOT_BUILT


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


def run_get_map(m: StateMapLike, pairs: Pairs) -> int:
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


def run_put_map(m: StateMapLike, pairs: Pairs, v: int) -> int:
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


def run_put_map_snapshot(m: StateMapLike, pairs: Pairs, v: int) -> int:
    snap = m.snapshot()  # untimed: a fresh snapshot shares every entry
    elapsed = run_put_map(m, pairs, v)
    if len(snap) != len(m):
        raise AssertionError("snapshot size changed")
    snap.release()
    return elapsed


def run_put_dict_snapshot(
    d: dict[tuple[int, str], int],
    pairs: Pairs,
    v: int,
    take: Callable[[dict[tuple[int, str], int]], object],
) -> int:
    snap = take(d)  # untimed
    elapsed = run_put_dict(d, pairs, v)
    del snap
    return elapsed


def run_persistent_snapshot(
    box: Box, pairs: Pairs, v: int, update: Callable[[Box, Pairs, int], int]
) -> int:
    snap = box.value  # the snapshot: a reference
    elapsed = update(box, pairs, v)
    if snap is box.value:
        raise AssertionError("a persistent update returned the same map")
    del snap
    return elapsed


def pause_map(m: StateMapLike) -> int:
    t0 = clock()
    snap = m.snapshot()
    elapsed = clock() - t0
    snap.release()
    return elapsed


def pause_copy(
    d: dict[tuple[int, str], int], take: Callable[[dict[tuple[int, str], int]], object]
) -> int:
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
# Steps 1-4: operations on N-entry structures
# --------------------------------------------------------------------------


def slow_ops(ops: int) -> int:
    """Operations per timed loop for ``pmap.set`` (see the module doc)."""
    return min(ops, max(1_000, ops // 50))


@dataclass(frozen=True)
class Workload:
    """The keys every structure holds and the operation list every loop uses
    (tuples: untracked by the garbage collector once it has seen them)."""

    keys: tuple[int, ...]
    pairs: Pairs

    @classmethod
    def make(cls, n: int, ops: int, seed: int) -> Workload:
        rng = random.Random(seed)
        keys = tuple(range(n))
        pairs = tuple((k, NAMESPACES[k & 3]) for k in rng.sample(keys, ops))
        return cls(keys, pairs)


def _internals_json(m: Any) -> dict[str, Any]:
    if isinstance(m, PureStateMap):
        internals = describe(m)
        out: dict[str, Any] = asdict(internals)
        out["open_versions"] = sorted(internals.open_versions)
        return out
    return {"is_rehashing": is_rehashing(m), "type": type(m).__module__ + "." + type(m).__name__}


def phase_operations(cfg: Config, n: int, w: Workload, notes: dict[str, Any]) -> list[Result]:
    """Steps 1-4 on ``N``-entry structures; they are freed when this returns."""
    big = cfg.big(n)
    log(f"building {n:,} entries in every structure")
    maps: dict[str, StateMapLike] = {}
    for column in built_maps():
        t = time.perf_counter()
        maps[column] = build_map(column, w.keys)
        log(f"  {LABELS[column]} built and settled in {time.perf_counter() - t:.1f}s")
        notes[f"{column}_internals_at_start"] = _internals_json(maps[column])
    t = time.perf_counter()
    d = build_dict(w.keys)
    with gc_disabled():
        imm = Box(immutables.Map(d))
        pm = None if big else Box(pmap(d))
    log(f"  dict, immutables{'' if big else ', pmap'} built in {time.perf_counter() - t:.1f}s")

    def check_sizes() -> None:
        sizes = [(LABELS[c], len(m)) for c, m in maps.items()]
        sizes += [(DICT, len(d)), (IMM, len(imm.value))]
        if pm is not None:
            sizes.append((PMAP, len(pm.value)))
        for name, size in sizes:
            if size != n:
                raise AssertionError(f"{name} has {size} entries, expected {n}")

    check_sizes()
    # See the module doc: young collections run as usual, full ones are left to step 6.
    gc.collect()
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(thresholds[0], thresholds[1], NO_FULL_COLLECTION)
    try:
        rows = _operations(cfg, n, w, notes, maps, d, imm, pm)
        check_sizes()
        for column, m in maps.items():
            notes[f"{column}_internals_at_end"] = _internals_json(m)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    skipped = cfg.skip_note
    for r in rows:
        if pm is None:
            r.missing.setdefault(PMAP, skipped)
        if big and r.metric in ("put_snapshot", "snapshot_pause"):
            r.missing[DICT_DEEPCOPY] = skipped
    return rows


def _operations(
    cfg: Config,
    n: int,
    w: Workload,
    notes: dict[str, Any],
    maps: dict[str, StateMapLike],
    d: dict[tuple[int, str], int],
    imm: Box,
    pm: Box | None,
) -> list[Result]:
    ops, pairs = cfg.ops_for(n), w.pairs
    slow_pairs = pairs[: slow_ops(ops)]  # pmap updates: see the module doc
    values = ValueSource()
    big = cfg.big(n)

    def row(
        metric: str,
        label: str,
        unit: str,
        runs: dict[str, tuple[Callable[[], int], float]],
        missing: dict[str, str],
        gc_enabled: bool = True,
    ) -> Result:
        """Measure ``runs`` (competitor -> (run, scale)) round-robin into one row;
        each repetition's nanoseconds are multiplied by the scale. Runs of
        skipped competitors (``None`` structures) must not be in ``runs``."""
        samples = measure_interleaved(
            {k: fn for k, (fn, _) in runs.items()},
            warmup=cfg.warmup,
            repeats=cfg.repeats,
            gc_enabled=gc_enabled,
        )
        result = Result(metric, label, unit, missing=missing, paired=True)
        for key, (_, scale) in runs.items():
            result.set(key, samples[key].scaled(scale))
        return result

    per_op, per_slow_op, to_ms = 1 / ops, 1 / len(slow_pairs), 1e-6

    def map_runs(
        make: Callable[[StateMapLike], Callable[[], int]], scale: float
    ) -> dict[str, tuple[Callable[[], int], float]]:
        return {c: (make(m), scale) for c, m in maps.items()}

    def pmap_run(
        make: Callable[[Box], Callable[[], int]], scale: float
    ) -> dict[str, tuple[Callable[[], int], float]]:
        return {} if pm is None else {PMAP: (make(pm), scale)}

    def deepcopy_run(
        run: Callable[[], int], scale: float
    ) -> dict[str, tuple[Callable[[], int], float]]:
        return {} if big else {DICT_DEEPCOPY: (run, scale)}

    notes["perf_counter_ns_overhead_ns"] = statistics.median(
        timer_overhead() for _ in range(10_001)
    )
    notes["bare_loop_ns_per_op"] = (
        measure(lambda: run_loop_only(pairs), warmup=cfg.warmup, repeats=cfg.repeats).median
        * per_op
    )
    log(
        f"bare loop {notes['bare_loop_ns_per_op']:.1f} ns/op, perf_counter_ns overhead "
        f"{notes['perf_counter_ns_overhead_ns']:.0f} ns"
    )

    log(f"get: {ops:,} lookups x ({cfg.warmup} warm-up + {cfg.repeats} repetitions)")
    r_get = row(
        "get",
        "get (existing keys, random order)",
        "ns/op",
        {
            **map_runs(lambda m: lambda: run_get_map(m, pairs), per_op),
            DICT: (lambda: run_get_tuple_keyed(d.get, pairs), per_op),
            DICT_DEEPCOPY: (lambda: run_get_tuple_keyed(d.get, pairs), per_op),
            DICT_COPY: (lambda: run_get_tuple_keyed(d.get, pairs), per_op),
            IMM: (lambda: run_get_tuple_keyed(imm.value.get, pairs), per_op),
            **pmap_run(lambda b: lambda: run_get_tuple_keyed(b.value.get, pairs), per_op),
        },
        {IMM_MUTATE: "=imm"},
    )

    log("put: update existing keys, no snapshot")
    r_put = row(
        "put",
        "put (update existing, no snapshot)",
        "ns/op",
        {
            **map_runs(lambda m: lambda: run_put_map(m, pairs, values.next(id_of(m))), per_op),
            DICT: (lambda: run_put_dict(d, pairs, values.next(DICT)), per_op),
            DICT_DEEPCOPY: (lambda: run_put_dict(d, pairs, values.next(DICT)), per_op),
            DICT_COPY: (lambda: run_put_dict(d, pairs, values.next(DICT)), per_op),
            IMM: (lambda: run_set_persistent(imm, pairs, values.next(IMM)), per_op),
            IMM_MUTATE: (lambda: run_mutate_immutables(imm, pairs, values.next(IMM)), per_op),
            **pmap_run(
                lambda b: lambda: run_set_persistent(b, slow_pairs, values.next(PMAP)), per_slow_op
            ),
        },
        {},
    )

    log("put while a snapshot is open")
    r_sput = row(
        "put_snapshot",
        "put, snapshot open (CoW work)",
        "ns/op",
        {
            **map_runs(
                lambda m: lambda: run_put_map_snapshot(m, pairs, values.next(id_of(m))), per_op
            ),
            **deepcopy_run(
                lambda: run_put_dict_snapshot(d, pairs, values.next(DICT), copy.deepcopy), per_op
            ),
            DICT_COPY: (
                lambda: run_put_dict_snapshot(d, pairs, values.next(DICT), dict.copy),
                per_op,
            ),
            IMM: (
                lambda: run_persistent_snapshot(imm, pairs, values.next(IMM), run_set_persistent),
                per_op,
            ),
            IMM_MUTATE: (
                lambda: run_persistent_snapshot(
                    imm, pairs, values.next(IMM), run_mutate_immutables
                ),
                per_op,
            ),
            **pmap_run(
                lambda b: (
                    lambda: run_persistent_snapshot(
                        b, slow_pairs, values.next(PMAP), run_set_persistent
                    )
                ),
                per_slow_op,
            ),
        },
        {DICT: "n/a"},
    )

    log("put and put while a snapshot is open, GC disabled during the loop")
    r_put_off = row(
        "put_nogc",
        "put, GC off",
        "ns/op",
        {
            **map_runs(lambda m: lambda: run_put_map(m, pairs, values.next(id_of(m))), per_op),
            DICT: (lambda: run_put_dict(d, pairs, values.next(DICT)), per_op),
            IMM: (lambda: run_set_persistent(imm, pairs, values.next(IMM)), per_op),
            IMM_MUTATE: (lambda: run_mutate_immutables(imm, pairs, values.next(IMM)), per_op),
            **pmap_run(
                lambda b: lambda: run_set_persistent(b, slow_pairs, values.next(PMAP)), per_slow_op
            ),
        },
        {DICT_DEEPCOPY: "=dict", DICT_COPY: "=dict"},
        gc_enabled=False,
    )
    r_sput_off = row(
        "put_snapshot_nogc",
        "put, snapshot open, GC off",
        "ns/op",
        {
            **map_runs(
                lambda m: lambda: run_put_map_snapshot(m, pairs, values.next(id_of(m))), per_op
            ),
            DICT_COPY: (
                lambda: run_put_dict_snapshot(d, pairs, values.next(DICT), dict.copy),
                per_op,
            ),
            IMM: (
                lambda: run_persistent_snapshot(imm, pairs, values.next(IMM), run_set_persistent),
                per_op,
            ),
            IMM_MUTATE: (
                lambda: run_persistent_snapshot(
                    imm, pairs, values.next(IMM), run_mutate_immutables
                ),
                per_op,
            ),
            **pmap_run(
                lambda b: (
                    lambda: run_persistent_snapshot(
                        b, slow_pairs, values.next(PMAP), run_set_persistent
                    )
                ),
                per_slow_op,
            ),
        },
        {DICT: "n/a", DICT_DEEPCOPY: "=d.copy"},
        gc_enabled=False,
    )

    log("snapshot pause")
    r_pause = row(
        "snapshot_pause",
        "snapshot pause (synchronous part)",
        "ms",
        {
            **map_runs(lambda m: lambda: pause_map(m), to_ms),
            **deepcopy_run(lambda: pause_copy(d, copy.deepcopy), to_ms),
            DICT_COPY: (lambda: pause_copy(d, dict.copy), to_ms),
            IMM: (lambda: pause_reference(imm), to_ms),
            **pmap_run(lambda b: lambda: pause_reference(b), to_ms),
        },
        {DICT: "n/a", IMM_MUTATE: "=imm"},
    )

    return [r_get, r_put, r_sput, r_put_off, r_sput_off, r_pause]


def id_of(m: object) -> str:
    """The ``ValueSource`` key of a map (one value sequence per map object)."""
    return f"map-{id(m)}"


# --------------------------------------------------------------------------
# Step 5: growth latency
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
    if kind in MAP_CLASSES:
        m = new_map(kind)
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
    keep = n - max(1, -(-999 * n // 1000)) + 1  # values needed for p99.9
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


def phase_growth(cfg: Config, details: dict[str, Any]) -> list[Result]:
    """Step 5: per-insert latency while growing from empty, GC on and off."""
    r_worst = Result("grow_worst", f"worst insert, grow to {cfg.grow_to:,}", "us")
    r_p999 = Result("grow_p999", "p99.9 insert, growing", "us")
    r_mean = Result("grow_mean", "mean insert, growing", "ns/op")
    r_worst_off = Result("grow_worst_nogc", "worst insert, growing, GC off", "us")
    r_p999_off = Result("grow_p999_nogc", "p99.9 insert, growing, GC off", "us")
    rows = [r_worst, r_p999, r_mean, r_worst_off, r_p999_off]
    kinds = [*built_maps(), DICT, IMM_MUTATE]
    if cfg.big(cfg.grow_to):
        kinds.remove(MAP)
        for row in rows:
            row.missing[MAP] = cfg.skip_note
    for row in rows:
        row.missing.update({DICT_DEEPCOPY: "=dict", DICT_COPY: "=dict", IMM: "-", PMAP: "-"})
    for kind in kinds:
        grow(kind, min(cfg.grow_to, 50_000))  # warm-up growth, discarded
        for gc_on in (True, False):
            label = f"{kind}/gc_{'on' if gc_on else 'off'}"
            log(f"growth to {cfg.grow_to:,}: {label}, {cfg.grow_repeats} runs")
            runs = [growth_run(kind, cfg.grow_to, gc_on) for _ in range(cfg.grow_repeats)]
            details[label] = [asdict(r) for r in runs]
            for r in runs:
                log(
                    f"    worst {r.worst_us:,.0f} us at insert #{r.worst_at:,}, p99.9 "
                    f"{r.p999_us:.2f} us, mean {r.mean_ns:.0f} ns, {r.gc_collections} "
                    f"collections ({r.gc_full_collections} full), longest "
                    f"{r.gc_longest_us:,.0f} us"
                )
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


# --------------------------------------------------------------------------
# Step 6: full collections and resident memory, one structure at a time
# --------------------------------------------------------------------------


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return fn


_MALLOC_TRIM = _load_malloc_trim()


def release_memory() -> None:
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def phase_gc(cfg: Config, n: int, w: Workload, notes: dict[str, Any]) -> list[Result]:
    """Step 6: full-collection time, one structure alive at a time."""
    big = cfg.big(n)
    r_gc = Result("gc_full", "full gc.collect(), structure alive", "ms")
    rows = [r_gc]
    for row in rows:
        row.missing.update({DICT_DEEPCOPY: "=dict", DICT_COPY: "=dict", IMM_MUTATE: "=imm"})
    kinds = [*built_maps(), DICT, IMM]
    if big:
        for row in rows:
            row.missing[PMAP] = cfg.skip_note
    else:
        kinds.append(PMAP)

    def time_collections(warmup: int, repeats: int) -> Sample:
        return measure(
            functools.partial(time_ns, gc.collect), warmup=warmup, repeats=repeats, collect=False
        ).scaled(1e-6)

    release_memory()
    baseline = time_collections(cfg.warmup, cfg.repeats)
    notes["gc_full_baseline_ms"] = baseline.median
    log(f"full gc.collect() with no structure built: {baseline.median:.2f} ms")
    for kind in kinds:
        release_memory()
        t = time.perf_counter()
        obj = builder(kind, w.keys)()
        build_s = time.perf_counter() - t
        release_memory()
        slow = kind == MAP and big
        sample = time_collections(0 if slow else cfg.warmup, 1 if slow else cfg.repeats)
        r_gc.set(kind, sample)
        log(
            f"  {LABELS.get(kind, kind)}: built in {build_s:.1f}s; full gc.collect() "
            f"{sample.median:,.2f} ms" + (" (1 run: slow)" if slow else "")
        )
        del obj
    if big and MAP in kinds:
        r_gc.note = "pure map: 1 run, no warm-up"
    release_memory()
    return rows


# --------------------------------------------------------------------------
# Step 7: tracemalloc memory
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


def _identity(x: Any) -> Any:
    return x


def phase_memory(cfg: Config, n: int, w: Workload) -> list[Result]:
    """Step 7: tracemalloc bytes per entry of a fresh build of each structure."""
    big = cfg.big(n)
    r_mem = Result("memory", "memory per entry (tracemalloc)", "B/entry")
    r_peak = Result("memory_peak", "peak while building (tracem.)", "B/entry")
    r_snap = Result("snapshot_memory", "an open snapshot adds (tracem.)", "B/entry")
    rows = [r_mem, r_peak, r_snap]
    for row in (r_mem, r_peak):
        row.missing.update({DICT_DEEPCOPY: "=dict", DICT_COPY: "=dict", IMM_MUTATE: "=imm"})
    r_snap.missing.update({DICT: "n/a", IMM_MUTATE: "=imm"})
    kinds = [*built_maps(), DICT, IMM, PMAP]
    if big:
        kinds = [k for k in kinds if k not in (MAP, PMAP)]
        for row in rows:
            row.missing.update({MAP: cfg.skip_note, PMAP: cfg.skip_note})
        r_snap.missing[DICT_DEEPCOPY] = cfg.skip_note
    tracemalloc.start()
    try:
        for kind in kinds:
            t = time.perf_counter()
            obj, kept, peak = traced_build(builder(kind, w.keys))
            r_mem.set(kind, Sample.single(kept / n))
            r_peak.set(kind, Sample.single(peak / n))
            if kind in MAP_CLASSES:
                r_snap.set(kind, Sample.single(traced_snapshot(obj.snapshot) / n))
            elif kind == DICT:
                if not big:
                    r_snap.set(
                        DICT_DEEPCOPY,
                        Sample.single(traced_snapshot(functools.partial(copy.deepcopy, obj)) / n),
                    )
                r_snap.set(DICT_COPY, Sample.single(traced_snapshot(obj.copy) / n))
            else:
                r_snap.set(
                    kind, Sample.single(traced_snapshot(functools.partial(_identity, obj)) / n)
                )
            log(
                f"  {LABELS.get(kind, kind)}: {kept / n:.1f} B/entry, peak {peak / n:.1f} "
                f"({time.perf_counter() - t:.1f}s)"
            )
            del obj
    finally:
        tracemalloc.stop()
    return rows


# --------------------------------------------------------------------------
# Step 8: owner under load (bench_table_backend's loop, per implementation)
# --------------------------------------------------------------------------


def phase_owner(cfg: Config, notes: dict[str, Any]) -> list[Result]:
    n = cfg.owner_entries
    ops_n = cfg.ops_for(n)
    mp = 128
    rng = random.Random(cfg.seed)
    ops: tb.Ops = [(k, j % 2 == 1) for j, k in enumerate(rng.sample(range(n), ops_n))]
    ids = itertools.count(1)
    update_runs = itertools.count(1)
    columns = {col: spec for col, spec in OWNER_COLUMNS.items() if MAP_CLASSES[spec[0]] is not None}
    r_ns = Result("owner_ns", "owner update", "ns/op", paired=True)
    r_kops = Result("owner_kops", "owner updates", "kops/s", paired=True)
    rows = [r_ns, r_kops]
    for col, (map_col, _, _) in OWNER_COLUMNS.items():
        if col not in columns:
            for r in rows:
                r.missing[col] = NOT_BUILT if MAP_CLASSES[map_col] is None else "-"
    affinity = os.sched_getaffinity(0) if cfg.pin and hasattr(os, "sched_getaffinity") else None
    pinned = tb.pin_to_one_cpu() if cfg.pin else None
    notes["owner_pinned_cpu"] = pinned
    try:
        with contextlib.ExitStack() as stack:
            benches: dict[str, tb.Bench] = {}
            for kind in sorted({kind for _, kind, _ in columns.values()}):
                t = time.perf_counter()
                with gc_disabled():
                    benches[kind] = tb.build_backend(kind, n, mp, stack)
                log(
                    f"  {tb.LABELS[kind]} backend: {n:,} entries built in "
                    f"{time.perf_counter() - t:.1f}s"
                )
            with tb.frozen_heap():
                log(
                    f"owner under load: {ops_n:,} updates, idle and while the writer runs"
                    + ("" if pinned is None else f" (pinned to CPU {pinned})")
                )
                rec = tb.Recorder(cfg.warmup)
                samples = measure_interleaved(
                    {
                        col: functools.partial(
                            tb.run_updates, benches[kind], ops, update_runs, ids, mode, n, rec, col
                        )
                        for col, (_, kind, mode) in columns.items()
                    },
                    warmup=cfg.warmup,
                    repeats=cfg.repeats,
                )
            for col, s in samples.items():
                r_ns.set(col, s.scaled(1 / ops_n))
                r_kops.set(col, Sample(tuple(ops_n / (ns / 1e9) / 1e3 for ns in s.values)))
            notes["owner_writer_running_at_loop_end"] = {
                col: f"{int(sum(rec.series(col, 'running_at_end')))} of {cfg.repeats} runs"
                for col, (_, _, mode) in columns.items()
                if mode == "writer"
            }
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
    gc.collect()
    return rows


# --------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------


def ratio_rows(results: list[Result], base: str) -> list[Result]:
    """Per row: ``base`` / competitor -- the median of the per-round ratios for
    round-robin rows, else the ratio of the medians (as the targets do)."""
    rows = []
    for row in results:
        base_s = row.samples.get(base)
        ratio = Result(row.metric, row.label, "x", missing=dict(row.missing))
        for c in COMPETITORS:
            other = row.samples.get(c.key)
            if base_s is None or other is None:
                continue
            value = paired_ratio(base_s, other) if row.paired else None
            if value is None and other.median != 0:
                value = base_s.median / other.median
            if value is not None:
                ratio.set(c.key, Sample.single(value))
        rows.append(ratio)
    return rows


@dataclass
class SizeRun:
    entries: int
    ops: int
    results: list[Result]
    notes: dict[str, Any] = field(default_factory=dict)


def summary_rows(size_runs: list[SizeRun], growth: list[Result]) -> list[Result]:
    """Issue 13's table: the rows its targets use, one block per size."""
    wanted = ("get", "put", "put_snapshot", "snapshot_pause", "gc_full", "memory")
    out = []
    for sr in size_runs:
        by_metric = {r.metric: r for r in sr.results}
        for metric in wanted:
            r = by_metric.get(metric)
            if r is None or not r.samples:
                continue
            short = {
                "get": "get",
                "put": "put",
                "put_snapshot": "put, snapshot open",
                "snapshot_pause": "snapshot() pause",
                "gc_full": "full gc.collect()",
                "memory": "memory/entry",
            }[metric]
            out.append(
                Result(
                    f"{metric}@{sr.entries}",
                    f"{short} @{_short(sr.entries)}",
                    r.unit,
                    samples=dict(r.samples),
                    missing=dict(r.missing),
                    paired=r.paired,
                )
            )
    for r in growth:
        if r.metric in ("grow_worst", "grow_worst_nogc"):
            out.append(r)
    return out


def _short(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def print_targets(
    title: str, outcomes: list[TargetOutcome], labels: dict[str, str], missing: dict[str, str]
) -> None:
    print(title)
    print(format_targets(outcomes, values=True, labels=labels, missing=missing))


def run(cfg: Config) -> dict[str, Any]:
    started = time.perf_counter()
    log(implementation_summary())
    notes: dict[str, Any] = {
        "competitors": dict(LABELS),
        "implementations": implementation_summary(),
        "load_average_at_start": load_average(),
    }
    size_runs: list[SizeRun] = []
    for n in cfg.sizes:
        ops = cfg.ops_for(n)
        log(f"=== {n:,} entries ({ops:,} ops per timed loop)")
        w = Workload.make(n, ops, cfg.seed)
        sr = SizeRun(n, ops, [])
        sr.results += phase_operations(cfg, n, w, sr.notes)
        release_memory()
        log(f"full collections, one structure at a time ({n:,} entries)")
        sr.results += phase_gc(cfg, n, w, sr.notes)
        if not cfg.skip_memory:
            log(f"memory (tracemalloc, {n:,} entries)")
            sr.results += phase_memory(cfg, n, w)
        del w
        release_memory()
        mark_not_built(sr.results)
        size_runs.append(sr)

    growth_details: dict[str, Any] = {}
    growth: list[Result] = []
    if not cfg.skip_growth:
        growth = phase_growth(cfg, growth_details)
        mark_not_built(growth)
        release_memory()
    owner: list[Result] = []
    if not cfg.skip_owner:
        log(f"=== owner under load ({cfg.owner_entries:,} entries)")
        owner = phase_owner(cfg, notes)

    wall = time.perf_counter() - started
    notes["load_average_at_end"] = load_average()
    missing_reason = {c: NOT_BUILT for c, cls in MAP_CLASSES.items() if cls is None}
    owner_labels = {c.key: c.label for c in OWNER_COMPETITORS}
    base = MAP_C if C_MAP is not None else MAP
    outcomes: dict[str, list[TargetOutcome]] = {}
    for m in MAP_CLASSES:
        per_map: list[TargetOutcome] = []
        for sr in size_runs:
            per_map += check_targets(size_targets(m, sr.entries), sr.results)
        if growth:
            per_map += check_targets(growth_targets(m, cfg.grow_to), growth)
        if owner:
            per_map += check_targets(owner_targets(m, cfg.owner_entries), owner)
        outcomes[m] = per_map

    print()
    print(
        f"Copy-on-write state map benchmark (issue 13): sizes "
        f"{', '.join(f'{n:,}' for n in cfg.sizes)}; median of {cfg.repeats} rounds after "
        f"{cfg.warmup} warm-up; growth to {cfg.grow_to:,}: median of {cfg.grow_repeats}"
    )
    print(
        f"Python {sys.version.split()[0]}; {implementation_summary()}; load average "
        f"(1, 5, 15 min) at start {notes['load_average_at_start']}, at end "
        f"{notes['load_average_at_end']} (other processes share the CPUs)"
    )
    print(
        f"Competitors skipped above {cfg.full_peers_up_to:,} entries (cells "
        f"'{cfg.skip_note}'): "
        "pmap; dict+deepcopy's snapshot rows; the pure map's growth; tracemalloc rows. "
        "The pure map's full gc.collect() there: 1 run."
    )
    for sr in size_runs:
        print()
        print(
            f"--- {sr.entries:,} entries, {sr.ops:,} ops per timed loop; bare loop "
            f"{sr.notes['bare_loop_ns_per_op']:.1f} ns/op (included in get/put); full "
            f"gc.collect() with no structure built {sr.notes['gc_full_baseline_ms']:.2f} ms"
        )
        print(format_table(sr.results, COMPETITORS, col_width=COL_WIDTH))
    if growth:
        print()
        print(
            f"--- growth from empty to {cfg.grow_to:,} (perf_counter_ns around every insert, "
            f"overhead ~{size_runs[0].notes['perf_counter_ns_overhead_ns']:.0f} ns included)"
        )
        print(format_table(growth, COMPETITORS, col_width=COL_WIDTH))
    if owner:
        print()
        print(
            f"--- owner under load: {cfg.ops_for(cfg.owner_entries):,} updates through a "
            f"ValueState handle, HeapKeyedStateBackend over {cfg.owner_entries:,} entries, "
            f"idle and while the backend's writer thread writes a snapshot"
        )
        print(format_table(owner, OWNER_COMPETITORS, col_width=COL_WIDTH))
    summary = summary_rows(size_runs, growth)
    print()
    print(f"=== ISSUE 13 TABLE ({LABELS[base]} / competitor ratios below)")
    print(format_table(summary, COMPETITORS, col_width=COL_WIDTH))
    print()
    print(
        f"Ratios: {LABELS[base]} / competitor (< 1: the {LABELS[base]} is faster or smaller; "
        "round-robin rows: median of per-round ratios)"
    )
    print(format_table(ratio_rows(summary, base), COMPETITORS, col_width=COL_WIDTH))
    print()
    print_targets(
        "TARGETS (issue 13), C map:", outcomes[MAP_C], {**LABELS, **owner_labels}, missing_reason
    )
    print()
    print_targets(
        "The same for the pure map (reference implementation, for comparison):",
        outcomes[MAP],
        {**LABELS, **owner_labels},
        missing_reason,
    )
    print()
    print(f"wall time {wall:.1f}s")

    return {
        "benchmark": "state_map",
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "wall_time_s": wall,
        "config": asdict(cfg),
        "machine": machine_info(),
        "notes": notes,
        "sizes": [
            {
                "entries": sr.entries,
                "ops": sr.ops,
                "notes": sr.notes,
                "results": [r.to_json() for r in sr.results],
                "ratios_over_competitor": {
                    r.metric: {k: s.median for k, s in r.samples.items()}
                    for r in ratio_rows(sr.results, base)
                },
            }
            for sr in size_runs
        ],
        "ratio_base": base,
        "growth": [r.to_json() for r in growth],
        "growth_runs": growth_details,
        "owner_under_load": [r.to_json() for r in owner],
        "targets": {m: [o.to_json() for o in outs] for m, outs in outcomes.items()},
    }


def _size(text: str) -> int:
    value = int(text.replace("_", "").replace(",", ""))
    if value < 10:
        raise argparse.ArgumentTypeError(f"expected at least 10 entries, got {value}")
    return value


def _sizes(text: str) -> list[int]:
    return [_size(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        description="Benchmark the copy-on-write state maps (C and Python) against dict "
        "and persistent maps."
    )
    p.add_argument(
        "--entries",
        type=_size,
        action="append",
        default=None,
        metavar="N",
        help="a size to measure; repeat for several (default 1,000,000 and 10,000,000)",
    )
    p.add_argument(
        "--sizes",
        type=_sizes,
        default=None,
        metavar="N,M,...",
        help="sizes as one comma-separated list (added to --entries)",
    )
    p.add_argument(
        "--grow-to",
        type=_size,
        default=None,
        help="entries of the growth-latency test (default the largest size)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke test: {QUICK_SIZE:,} entries, grow to {QUICK_GROW_TO:,}, 3 rounds",
    )
    p.add_argument(
        "--ops",
        type=int,
        default=None,
        help="operations per timed loop (default min(200,000, entries / 5))",
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="timed rounds per row (default 5; 3 with --quick)"
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--grow-repeats",
        type=int,
        default=None,
        help="growths per structure and GC mode (default 3; 1 with --quick)",
    )
    p.add_argument(
        "--full-peers-up-to",
        type=_size,
        default=DEFAULT_FULL_PEERS_UP_TO,
        help="above this many entries skip the slow competitors (pmap, deepcopy "
        "snapshots, pure-map growth, tracemalloc rows; default 2,000,000)",
    )
    p.add_argument(
        "--owner-entries",
        type=_size,
        default=None,
        help="entries of the owner-under-load step (default the smallest size)",
    )
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="do not pin to one CPU during the owner-under-load step",
    )
    p.add_argument("--skip-memory", action="store_true", help="skip the tracemalloc step")
    p.add_argument("--skip-growth", action="store_true", help="skip the growth step")
    p.add_argument("--skip-owner", action="store_true", help="skip the owner-under-load step")
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"JSON file (default {RESULTS_PATH.name}; "
        f"{RESULTS_PATH.stem}_quick.json with --quick)",
    )
    a = p.parse_args(argv)
    given = [*(a.entries or []), *(a.sizes or [])]
    if a.quick:
        sizes: tuple[int, ...] = tuple(given) if given else (QUICK_SIZE,)
        grow_to = a.grow_to if a.grow_to is not None else QUICK_GROW_TO
    else:
        sizes = tuple(given) if given else DEFAULT_SIZES
        grow_to = a.grow_to if a.grow_to is not None else max(sizes)
    sizes = tuple(sorted(set(sizes)))
    output = (
        a.output
        if a.output is not None
        else (
            RESULTS_PATH.with_name(f"{RESULTS_PATH.stem}_quick.json") if a.quick else RESULTS_PATH
        )
    )
    repeats = a.repeats if a.repeats is not None else (3 if a.quick else 5)
    grow_repeats = a.grow_repeats if a.grow_repeats is not None else (1 if a.quick else 3)
    if a.ops is not None and not 0 < a.ops <= min(sizes):
        p.error(f"--ops must be in 1..smallest size, got {a.ops}")
    if repeats < 1 or grow_repeats < 1 or a.warmup < 0:
        p.error("--repeats and --grow-repeats must be >= 1, --warmup >= 0")
    owner_entries = a.owner_entries if a.owner_entries is not None else min(sizes)
    if a.ops is not None and a.ops > owner_entries:
        p.error(f"--ops must be at most --owner-entries, got {a.ops}")
    return Config(
        sizes=sizes,
        grow_to=grow_to,
        ops=a.ops,
        repeats=repeats,
        warmup=a.warmup,
        grow_repeats=grow_repeats,
        seed=a.seed,
        quick=a.quick,
        full_peers_up_to=a.full_peers_up_to,
        owner_entries=owner_entries,
        pin=a.pin,
        skip_memory=a.skip_memory,
        skip_growth=a.skip_growth,
        skip_owner=a.skip_owner,
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
