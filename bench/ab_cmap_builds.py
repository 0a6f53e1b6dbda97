"""Benchmark: two builds of the C map side by side in one process -- a change
to ``_cmap.c`` against the build before it, on the owner's hot path.

Run::

    .venv/bin/python bench/ab_cmap_builds.py --old /tmp/old/_cmap.cpython-311-x86_64-linux-gnu.so
    .venv/bin/python bench/ab_cmap_builds.py --old OLD.so --new NEW.so --entries 10000000
    .venv/bin/python bench/ab_cmap_builds.py --old OLD.so --untracked   # maps not tracking

``--new`` defaults to the ``cowstate._cmap`` this checkout built. A build of
another commit (the recipe of ``bench_heap_incremental.py``'s docstring)::

    git show REV:impl/cowstate/_cmap.c > /tmp/old/_cmap.c
    git show REV:impl/cowstate/_cmap.h > /tmp/old/_cmap.h
    gcc -O2 -std=c11 -shared -fPIC -I$INC /tmp/old/_cmap.c -o /tmp/old/_cmap$SUF

Method
======
Each build is loaded under a private name (its init function is found by the
name's last part, ``_cmap``). Per build, 128 maps (one per key group of max
parallelism 128) hold ``--entries`` int keys ``k`` in map ``k % 128`` with
state ``k``; with tracking (the default) every map ``track_changes()`` first,
as a heap backend with incremental checkpoints does. The maps are built
**twice per build, in the orders new-old and old-new**: a map built later in
the process lies elsewhere in memory, and that alone moved an identical
build's time by 0.93-1.11x here -- a change is credited only with what holds
in both orders.

A run is ``get`` then ``put`` of the same key for 300,000 random keys
(``--seed``), straight on the maps (no backend frames), with no snapshot
open or with one snapshot of every map open (taken before, released and
its garbage reclaimed after, untimed). ``--rounds`` rounds (default 7), each
running every (order, build) once, the builds' order alternating; the
garbage collector off while timed. Printed per order and snapshot state: the
median ns per get + put of each build and the median of the per-round
ratios new / old.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from typing import Any

from _impls import load_cmap_build

from cowstate import _cmap
from cowstate.void_namespace import VOID_NAMESPACE

GROUPS = 128
KEYS = 300_000


def build(cls: Any, entries: int, tracked: bool) -> list[Any]:
    maps = [cls() for _ in range(GROUPS)]
    if tracked:
        for state_map in maps:
            state_map.track_changes()
    for key in range(entries):
        maps[key % GROUPS].put(key, VOID_NAMESPACE, key)
    return maps


def run(maps: list[Any], keys: list[int], snapshot: bool) -> float:
    """ns per get + put of ``keys`` on ``maps``."""
    snaps = [m.snapshot() for m in maps] if snapshot else []
    t0 = time.perf_counter_ns()
    for i, key in enumerate(keys):
        state_map = maps[key % GROUPS]
        state_map.get(key, VOID_NAMESPACE)
        state_map.put(key, VOID_NAMESPACE, i)
    elapsed = time.perf_counter_ns() - t0
    for snap in snaps:
        snap.release()
    for state_map in maps:
        state_map.reclaim()
    return elapsed / len(keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the _cmap build to compare against")
    parser.add_argument("--new", default=_cmap.__file__, help="default: this checkout's build")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--untracked", action="store_true", help="maps that do not track")
    args = parser.parse_args(argv)
    classes = {
        which: load_cmap_build(getattr(args, which), f"ab_{which}") for which in ("new", "old")
    }
    tracked = not args.untracked
    maps: dict[tuple[str, str], list[Any]] = {}
    for order in ("new-old", "old-new"):
        for which in order.split("-"):
            maps[(order, which)] = build(classes[which], args.entries, tracked)
    rng = random.Random(args.seed)
    keys = [rng.randrange(args.entries) for _ in range(KEYS)]
    times: dict[tuple[str, str, bool], list[float]] = {
        (order, which, snap): [] for order, which in maps for snap in (False, True)
    }
    gc.disable()
    try:
        for round_ in range(1 + args.rounds):  # the first round warms up
            for snap in (False, True):
                for order in ("new-old", "old-new"):
                    for which in ("new", "old") if round_ % 2 else ("old", "new"):
                        elapsed = run(maps[(order, which)], keys, snap)
                        if round_:
                            times[(order, which, snap)].append(elapsed)
    finally:
        gc.enable()
    print(
        f"get + put of {KEYS:,} random keys over {GROUPS} C maps of {args.entries:,} int "
        f"mappings ({'tracking' if tracked else 'not tracking'}), {args.rounds} rounds"
    )
    for snap in (False, True):
        for order in ("new-old", "old-new"):
            new, old = times[(order, "new", snap)], times[(order, "old", snap)]
            ratios = [n / o for n, o in zip(new, old, strict=True)]
            print(
                f"  snapshot {'open' if snap else 'none'}, built {order}: "
                f"old {statistics.median(old):.0f} ns, new {statistics.median(new):.0f} ns, "
                f"new/old {statistics.median(ratios):.3f} (median of per-round ratios)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
